//! Every reason a bulkhead turns a call away, declared once.
//!
//! One row per reason gives its variant and documentation, its label (for
//! metrics and logs), what a rejection for it says, whether it shows how
//! long the caller waited, and whether it carries a retry hint. The
//! counters, the snapshot in [`Metrics`](crate::Metrics), the `metrics`
//! and `tracing` exporters and the error messages all read these rows, so
//! a new reason is one row here (and, being a new variant, every
//! exhaustive `match` on the reason that needs a decision for it, such as
//! the keyed bulkhead's stage, fails to compile until it has one).

use core::fmt;

/// What the crate does with one reason, besides naming it.
pub(crate) struct Row {
    /// A short lowercase label, for metrics and logs.
    pub(crate) label: &'static str,
    /// What a rejection says, after "bulkhead NAME ".
    pub(crate) says: &'static str,
    /// Whether the message ends with how long the caller waited.
    pub(crate) shows_wait: bool,
    /// Whether trying again later can succeed, so that the rejection
    /// carries a retry hint (`Rejected::retry_after`).
    pub(crate) hint: bool,
}

macro_rules! reasons {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident {
            label: $label:literal,
            says: $says:literal,
            shows_wait: $shows_wait:literal,
            hint: $hint:literal $(,)?
        }
    ),* $(,)?) => {
        /// Why the bulkhead turned a call away.
        ///
        /// # Examples
        ///
        /// ```
        /// use watertight::{Bulkhead, RejectReason};
        ///
        /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        /// let _held = bh.try_acquire().unwrap();
        /// match bh.try_acquire().unwrap_err().reason() {
        ///     RejectReason::Full => println!("busy, try later"),
        ///     other => panic!("unexpected {other}"),
        /// }
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum RejectReason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl RejectReason {
            /// Every reason, in declaration order: `ALL[r.index()] == r`.
            pub(crate) const ALL: [RejectReason; [$(RejectReason::$variant),*].len()] =
                [$(RejectReason::$variant),*];

            /// This reason's row.
            #[inline]
            pub(crate) const fn row(self) -> &'static Row {
                match self {
                    $(RejectReason::$variant => &Row {
                        label: $label,
                        says: $says,
                        shows_wait: $shows_wait,
                        hint: $hint,
                    },)*
                }
            }
        }
    };
}

reasons! {
    /// No permit was free and there was no room or no time to wait: the
    /// bulkhead fails fast (`max_wait` is zero) or its waiting line is full
    /// (`max_queue`).
    Full { label: "full", says: "is full", shows_wait: false, hint: true },
    /// The caller waited `max_wait` without getting a permit.
    Timeout {
        label: "timeout",
        says: "had no free permit within",
        shows_wait: true,
        hint: true,
    },
    /// The bulkhead was closed.
    Closed { label: "closed", says: "is closed", shows_wait: false, hint: false },
    /// The permits live elsewhere (the Redis backend) and could not be
    /// reached: the bulkhead fails closed rather than admit uncounted calls.
    /// Also: the timer that bounds a wait or a call cannot run (its tokio
    /// runtime has shut down, or has no time driver), so the bound could
    /// not be kept.
    Unavailable {
        label: "unavailable",
        says: "cannot reach its shared permits",
        shows_wait: false,
        hint: false,
    },
    /// The call carried a [deadline](crate::CallOptions::deadline) that
    /// it could not make: the deadline had passed, the expected wait plus the
    /// expected hold time (the averages behind
    /// [`Rejected::retry_after`](crate::Rejected::retry_after)) did not fit
    /// in the time left, or it waited until it could no longer finish in
    /// time.
    WontMakeDeadline {
        label: "deadline",
        says: "cannot serve the call before its deadline",
        shows_wait: false,
        hint: true,
    },
    /// Controlled delay ([`BulkheadBuilder::queue_delay`](crate::BulkheadBuilder::queue_delay)):
    /// the waiting line had stood at or above its target wait for a whole
    /// interval, and this caller had waited the target (or, arriving while
    /// it stood, waited its target out) without a permit. The line is
    /// being drained to what the permits can serve within the target.
    QueueDelay {
        label: "queue_delay",
        says: "is overloaded: its waiting line stood past its target wait",
        shows_wait: false,
        hint: true,
    },
    /// Priority classes ([`BulkheadBuilder::priorities`](crate::BulkheadBuilder::priorities)):
    /// this caller waited in a full line (`max_queue`) and a caller of a
    /// more important class took its place; the least important waiters
    /// are shed first, the newest of them first.
    Displaced {
        label: "displaced",
        says: "gave this caller's place in its full line to a more important one",
        shows_wait: false,
        hint: true,
    },
}

/// How many reasons there are: the length of per-reason counter arrays.
pub(crate) const REASONS: usize = RejectReason::ALL.len();

impl RejectReason {
    /// A short lowercase label, for metrics and logs: `"full"`,
    /// `"timeout"`, `"closed"`, `"unavailable"`, `"deadline"`,
    /// `"queue_delay"` or `"displaced"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::RejectReason;
    ///
    /// assert_eq!(RejectReason::Timeout.as_str(), "timeout");
    /// ```
    pub fn as_str(self) -> &'static str {
        self.row().label
    }

    /// This reason's place in [`ALL`](Self::ALL), and in every array of
    /// per-reason counters.
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_sits_at_its_index_with_a_label_of_its_own() {
        for (i, reason) in RejectReason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
            let same_label = RejectReason::ALL
                .iter()
                .filter(|r| r.as_str() == reason.as_str())
                .count();
            assert_eq!(same_label, 1, "{reason:?}'s label is not unique");
            assert!(!reason.row().says.is_empty());
        }
    }
}
