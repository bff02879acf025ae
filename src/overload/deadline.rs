//! Deadline-aware admission (the Google SRE book, "Addressing Cascading
//! Failures"): a call that carries its deadline is rejected at once when
//! the wait it can expect leaves no time to do the work, instead of
//! waiting and then timing out, or being served after its caller gave up.
//!
//! The expected wait is the retry hint's estimate
//! ([`Rejected::retry_after`](crate::Rejected::retry_after)): with every
//! seat busy, seats free up at about `limit / hold` a second, so the
//! caller behind `waiting` others gets one after about
//! `hold × (waiting + 1) / limit`, `hold` being a moving average of how long
//! seats are held (weight 1/4, as the policy keeps it). The expected
//! service time is the same average. A call is admitted if
//! `expected wait + hold <= remaining`; once admitted it may wait
//! `remaining - hold` at most (or `max_wait`, if shorter): past that, it
//! could no longer finish in time.
//!
//! Both are averages, so a caller whose deadline is barely met on average
//! is admitted and may still miss it; a margin is the caller's to add (by
//! passing a shorter remaining time). Before the first sample nothing is
//! known, and every call is admitted.

/// A moving average of how long seats are held, and the admission
/// decisions made from it (see the [module notes](self)).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HoldEstimate {
    /// The average in nanoseconds; 0 until the first sample.
    hold_ns: u64,
}

/// What [`HoldEstimate::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Admit the call (take a free seat, or wait for at most `budget`:
    /// `None` is unbounded).
    Admit {
        /// How long it may wait.
        budget: Option<u64>,
    },
    /// Reject it now: the expected wait plus the expected service time
    /// (`needed`, ns) exceeds the time it has left.
    Reject {
        /// The expected wait plus service time, in nanoseconds.
        needed: u64,
    },
}

impl HoldEstimate {
    #[cfg(test)]
    /// No sample yet.
    pub(crate) const fn new() -> Self {
        Self { hold_ns: 0 }
    }

    /// The estimate whose average is `hold_ns` nanoseconds (0: no sample
    /// yet): a snapshot of the average a policy keeps in an atomic.
    #[inline]
    pub(crate) const fn from_ns(hold_ns: u64) -> Self {
        Self { hold_ns }
    }

    /// The average in nanoseconds, 0 until the first sample: what
    /// [`from_ns`](Self::from_ns) takes back.
    #[inline]
    pub(crate) const fn ns(&self) -> u64 {
        self.hold_ns
    }

    /// Folds one hold time (ns) into the average, weight 1/4.
    pub(crate) fn record(&mut self, held: u64) {
        let held = held.max(1);
        self.hold_ns = if self.hold_ns == 0 {
            held
        } else {
            (self.hold_ns - self.hold_ns / 4)
                .saturating_add(held / 4)
                .max(1)
        };
    }

    #[cfg(test)]
    /// The average hold time in nanoseconds, once known.
    #[inline]
    pub(crate) fn hold(&self) -> Option<u64> {
        (self.hold_ns != 0).then_some(self.hold_ns)
    }

    /// How long a caller that arrives now can expect to wait for a seat,
    /// with `waiting` callers in line before it and `free` of `limit`
    /// seats free: zero if a seat is free and nobody waits, else the retry
    /// hint's `hold × (waiting + 1) / limit`, rounded up (zero while no
    /// hold time is known).
    pub(crate) fn expected_wait(&self, waiting: usize, free: usize, limit: usize) -> u64 {
        if free > 0 && waiting == 0 {
            return 0;
        }
        let ahead = u64::try_from(waiting).unwrap_or(u64::MAX).saturating_add(1);
        let limit = u64::try_from(limit).unwrap_or(u64::MAX).max(1);
        self.hold_ns.saturating_mul(ahead).div_ceil(limit)
    }

    /// Admits or rejects a caller that has `remaining` nanoseconds left
    /// before its deadline (see [`expected_wait`](Self::expected_wait) for
    /// the other arguments), and says how long it may wait: the least of
    /// `max_wait` and `remaining - hold`.
    pub(crate) fn admit(
        &self,
        remaining: u64,
        waiting: usize,
        free: usize,
        limit: usize,
        max_wait: Option<u64>,
    ) -> Verdict {
        let service = self.hold_ns;
        let needed = self
            .expected_wait(waiting, free, limit)
            .saturating_add(service);
        if needed > remaining {
            return Verdict::Reject { needed };
        }
        let left = remaining - service;
        Verdict::Admit {
            budget: Some(max_wait.map_or(left, |max| max.min(left))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn estimate(hold: u64) -> HoldEstimate {
        let mut e = HoldEstimate::new();
        e.record(hold);
        e
    }

    #[test]
    fn the_average_moves_by_a_quarter() {
        let mut e = HoldEstimate::new();
        assert_eq!(e.hold(), None);
        e.record(40 * MS);
        assert_eq!(e.hold(), Some(40 * MS));
        e.record(80 * MS);
        assert_eq!(e.hold(), Some(50 * MS));
        e.record(0);
        assert!(e.hold().is_some(), "a zero sample does not unlearn");
    }

    #[test]
    fn the_expected_wait_is_the_retry_hints() {
        let e = estimate(50 * MS);
        assert_eq!(e.expected_wait(0, 3, 10), 0);
        // All 10 seats busy, nobody waiting: the first of 10 frees.
        assert_eq!(e.expected_wait(0, 0, 10), 5 * MS);
        // 19 ahead: the 20th seat to free, two holds.
        assert_eq!(e.expected_wait(19, 0, 10), 100 * MS);
        // A free seat while others wait (a limit just raised): the line
        // is served first.
        assert_eq!(e.expected_wait(4, 2, 10), 25 * MS);
        // Rounded up.
        assert_eq!(estimate(10).expected_wait(0, 0, 3), 4);
    }

    #[test]
    fn a_call_that_cannot_finish_in_time_is_rejected_at_once() {
        let e = estimate(50 * MS);
        // 19 ahead, 10 seats: 100 ms of waiting and 50 of work.
        assert_eq!(
            e.admit(149 * MS, 19, 0, 10, None),
            Verdict::Reject { needed: 150 * MS }
        );
        assert_eq!(
            e.admit(150 * MS, 19, 0, 10, None),
            Verdict::Admit {
                budget: Some(100 * MS)
            }
        );
        // A free seat but no time for the work itself.
        assert_eq!(
            e.admit(49 * MS, 0, 1, 10, Some(500 * MS)),
            Verdict::Reject { needed: 50 * MS }
        );
        // The budget is max_wait when that is shorter.
        assert_eq!(
            e.admit(1000 * MS, 0, 0, 10, Some(200 * MS)),
            Verdict::Admit {
                budget: Some(200 * MS)
            }
        );
        // An expired deadline.
        assert!(matches!(e.admit(0, 0, 1, 10, None), Verdict::Reject { .. }));
    }

    #[test]
    fn nothing_known_admits_everyone() {
        let e = HoldEstimate::new();
        assert_eq!(
            e.admit(MS, 1000, 0, 1, Some(500 * MS)),
            Verdict::Admit { budget: Some(MS) }
        );
    }
}
