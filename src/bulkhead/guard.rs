//! The guard of an admitted call, whatever its permit is: a local
//! semaphore's, or a Redis lease (a keyed call holds two local ones).

use std::time::Instant;

use super::observer::CallOutcome;
use super::policy::Policy;

/// Where an admitted call's permit came from, and how it goes back.
pub(crate) trait Source {
    /// The policy that admitted the call.
    fn policy(&self) -> &Policy;

    /// Gives the permit back; called exactly once, before the observers
    /// hear that the call ended.
    fn give_back(&mut self);
}

/// One admitted call's hold on a permit. On drop (or [`finish`](Self::finish)):
/// the leak watch is disarmed, the permit goes back, and then the
/// observers are told how the call ended, in that order, so a panicking
/// observer finds the permit already returned.
pub(crate) struct Guard<S: Source> {
    source: S,
    /// When the permit was granted, if this call's hold time is measured.
    since: Option<Instant>,
    /// Reported to the observers at the end, unless a panic is unwinding.
    outcome: CallOutcome,
    /// The permit's leak watch in the policy (0: none).
    watch: u64,
    finished: bool,
}

impl<S: Source> Guard<S> {
    /// Takes over a permit that was just granted at `since` (if this call's
    /// hold time is measured: see `Policy::clock_in`).
    #[inline]
    pub(crate) fn new(source: S, since: Option<Instant>, outcome_if_dropped: CallOutcome) -> Self {
        let mut guard = Self {
            source,
            since,
            outcome: outcome_if_dropped,
            watch: 0,
            finished: false,
        };
        // Only once the guard owns the permit: a timer may panic here, and
        // the guard then gives the permit back.
        guard.watch = guard.source.policy().watch();
        guard
    }

    /// Records how the call ended, for the observers.
    #[inline]
    pub(crate) fn set_outcome(&mut self, outcome: CallOutcome) {
        self.outcome = outcome;
    }

    #[inline]
    pub(crate) fn source(&self) -> &S {
        &self.source
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Ends the call now: as dropping, but the guard stays (for a release
    /// that has more to do). Does nothing the second time.
    #[inline]
    pub(crate) fn finish(&mut self) {
        if core::mem::replace(&mut self.finished, true) {
            return;
        }
        let policy = self.source.policy();
        policy.unwatch(core::mem::take(&mut self.watch));
        self.source.give_back();
        self.source.policy().finished(self.since, self.outcome);
    }
}

impl<S: Source> Drop for Guard<S> {
    #[inline]
    fn drop(&mut self) {
        self.finish();
    }
}
