//! Controlled delay on the waiting line, and the adaptive-LIFO switch that
//! rides on it (Facebook's "Fail at Scale").
//!
//! A line that holds a burst for a moment is doing its job; a line that
//! *stands* (nobody who joins it gets through quickly, for a long while)
//! only adds delay, and under a standing line the oldest waiters are the
//! ones whose callers have most likely given up. [`QueueDelay`] tells the
//! two apart the way CoDel does: it looks at how long each waiter waited
//! when it left the line, and calls the line *overloaded* once every such
//! wait has been at least `target` for a whole `interval`. While
//! overloaded:
//!
//! * the wait budget is `target` instead of `max_wait`
//!   (`QueueDelay::budget`): the line drains to what the seats
//!   can serve within the target, and the waiters already in it past the
//!   target are rejected (the owner of the line cuts them when
//!   [`sample`](QueueDelay::sample) returns [`Change::Overloaded`]);
//! * with adaptive LIFO on, the newest waiter is served first
//!   ([`serve_newest`](QueueDelay::serve_newest)): it is the one whose
//!   caller is surely still there. The oldest still wait at most `target`,
//!   so nobody starves (the fault of a plain stack, aspnetcore#29910).
//!
//! The line stops being overloaded when it empties
//! ([`emptied`](QueueDelay::emptied)): its delay has dropped to zero.
//! Not when one waiter gets through in less than the target, as CoDel's
//! exit test has it: while overloaded, the budget *is* the target, so
//! waits below it are what an overloaded line produces too, and with LIFO
//! the newest waiter gets through at once however long the line stands.
//! An empty line is evidence neither can fake. This is Fail at Scale's
//! own test ("the queue has not been empty in the last interval"), and
//! means the line stays in its overloaded mode as long as arrivals
//! outpace the seats, and leaves it at the first lull.
//!
//! Time is nanoseconds since any origin the owner picks (the line timer's
//! clock, or virtual time in the simulation), passed in: no clock is read
//! here.

/// What a [`QueueDelay`] event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing.
    None,
    /// The line has just become overloaded: cut the waiters that have
    /// waited `target` or more, and give the rest `target` in all.
    Overloaded,
    /// The line has just stopped being overloaded.
    Cleared,
}

/// Controlled delay over one waiting line (see the [module notes](self)).
#[derive(Debug, Clone)]
pub(crate) struct QueueDelay {
    /// A wait at or above this is a standing line's (ns).
    target: u64,
    /// How long waits must stand at or above `target` (ns).
    interval: u64,
    /// Serve the newest waiter first while overloaded.
    lifo: bool,
    /// When the run of waits at or above `target` began: the time of its
    /// first sample. `None` when the last sample was below the target, the
    /// line emptied since, or the line is overloaded already.
    above_since: Option<u64>,
    overloaded: bool,
}

impl QueueDelay {
    /// Controlled delay with a `target` wait and an `interval` it must
    /// stand for, in nanoseconds (Fail at Scale: 5 ms and 100 ms);
    /// adaptive LIFO off.
    pub(crate) fn new(target: u64, interval: u64) -> Self {
        Self {
            target,
            interval,
            lifo: false,
            above_since: None,
            overloaded: false,
        }
    }

    /// Serves the newest waiter first while the line is overloaded.
    pub(crate) fn adaptive_lifo(mut self, on: bool) -> Self {
        self.lifo = on;
        self
    }

    /// The target wait, in nanoseconds.
    #[inline]
    pub(crate) fn target(&self) -> u64 {
        self.target
    }

    /// Whether the line is overloaded now.
    #[inline]
    pub(crate) fn is_overloaded(&self) -> bool {
        self.overloaded
    }

    /// Whether the next free seat goes to the newest waiter rather than
    /// the oldest: adaptive LIFO is on and the line is overloaded.
    #[inline]
    pub(crate) fn serve_newest(&self) -> bool {
        self.lifo && self.overloaded
    }

    #[cfg(test)]
    /// How long a waiter may wait in all, given the bulkhead's `max_wait`
    /// (`None`: unbounded): the target while overloaded, if shorter.
    #[inline]
    pub(crate) fn budget(&self, max_wait: Option<u64>) -> Option<u64> {
        if self.overloaded {
            Some(max_wait.map_or(self.target, |max| max.min(self.target)))
        } else {
            max_wait
        }
    }

    /// A waiter left the line at `now` after waiting `waited`: it was
    /// served, or rejected when its budget ran out. (A caller that gave
    /// up is no sample: it says how patient the caller was, not how long
    /// the line is.) Returns [`Change::Overloaded`] when this sample
    /// completes a whole `interval` of waits at or above the target.
    pub(crate) fn sample(&mut self, now: u64, waited: u64) -> Change {
        if self.overloaded {
            return Change::None;
        }
        if waited < self.target {
            self.above_since = None;
            return Change::None;
        }
        let since = *self.above_since.get_or_insert(now);
        if now.saturating_sub(since) >= self.interval {
            self.above_since = None;
            self.overloaded = true;
            return Change::Overloaded;
        }
        Change::None
    }

    /// The line is empty (its last waiter left, however): its delay is
    /// zero, which ends a run of long waits and clears an overload.
    pub(crate) fn emptied(&mut self) -> Change {
        self.above_since = None;
        if core::mem::take(&mut self.overloaded) {
            Change::Cleared
        } else {
            Change::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn codel() -> QueueDelay {
        QueueDelay::new(5_000_000, 100_000_000)
    }

    /// Samples a wait of `waited` every millisecond from `from` to `to`
    /// (inclusive); returns the first change, with its time.
    fn stand(q: &mut QueueDelay, from: u64, to: u64, waited: u64) -> Option<(u64, Change)> {
        (from..=to)
            .step_by(MS as usize)
            .find_map(|t| match q.sample(t, waited) {
                Change::None => None,
                change => Some((t, change)),
            })
    }

    #[test]
    fn a_standing_line_is_cut_to_the_target_after_one_interval() {
        let mut q = codel();
        let max_wait = Some(500 * MS);
        assert_eq!(q.budget(max_wait), max_wait);
        // Waits of 20 ms from t = 1 s: not yet at 1.099 s...
        assert_eq!(stand(&mut q, 1000 * MS, 1099 * MS, 20 * MS), None);
        assert!(!q.is_overloaded());
        assert_eq!(q.budget(max_wait), max_wait);
        // ...overloaded at 1.1 s, a whole interval after the first.
        assert_eq!(q.sample(1100 * MS, 20 * MS), Change::Overloaded);
        assert!(q.is_overloaded());
        assert_eq!(q.budget(max_wait), Some(5 * MS));
        // Without max_wait too; and a max_wait under the target stays.
        assert_eq!(q.budget(None), Some(5 * MS));
        assert_eq!(q.budget(Some(MS)), Some(MS));
    }

    #[test]
    fn one_short_wait_restarts_the_interval() {
        let mut q = codel();
        assert_eq!(stand(&mut q, 0, 90 * MS, 20 * MS), None);
        assert_eq!(q.sample(91 * MS, 4 * MS), Change::None);
        // The interval counts again from the next long wait, at 92 ms.
        assert_eq!(
            stand(&mut q, 92 * MS, 300 * MS, 5 * MS),
            Some((192 * MS, Change::Overloaded))
        );
    }

    #[test]
    fn an_empty_line_clears_it_and_a_short_wait_does_not() {
        let mut q = codel().adaptive_lifo(true);
        assert!(!q.serve_newest());
        assert_eq!(
            stand(&mut q, 0, 200 * MS, 50 * MS),
            Some((100 * MS, Change::Overloaded))
        );
        assert!(q.serve_newest());
        // Waits under the target are what the cut line produces: no exit.
        assert_eq!(q.sample(201 * MS, 0), Change::None);
        assert!(q.is_overloaded() && q.serve_newest());
        assert_eq!(q.emptied(), Change::Cleared);
        assert!(!q.is_overloaded() && !q.serve_newest());
        assert_eq!(q.budget(Some(500 * MS)), Some(500 * MS));
        assert_eq!(q.emptied(), Change::None);
    }

    #[test]
    fn an_empty_line_restarts_the_interval() {
        let mut q = codel();
        assert_eq!(stand(&mut q, 0, 99 * MS, 20 * MS), None);
        q.emptied();
        assert_eq!(q.sample(100 * MS, 20 * MS), Change::None);
        assert_eq!(q.sample(199 * MS, 20 * MS), Change::None);
        assert_eq!(q.sample(200 * MS, 20 * MS), Change::Overloaded);
    }

    #[test]
    fn fifo_without_adaptive_lifo() {
        let mut q = codel();
        assert_eq!(
            stand(&mut q, 0, 100 * MS, 5 * MS),
            Some((100 * MS, Change::Overloaded))
        );
        assert!(q.is_overloaded());
        assert!(!q.serve_newest());
    }

    #[test]
    fn a_zero_interval_overloads_at_the_first_long_wait() {
        let mut q = QueueDelay::new(5_000_000, 0);
        assert_eq!(q.sample(7, 4 * MS), Change::None);
        assert_eq!(q.sample(8, 5 * MS), Change::Overloaded);
    }
}
