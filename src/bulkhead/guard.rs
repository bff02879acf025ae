//! The guard of an admitted call, whatever its permit is: a local
//! semaphore's, or a Redis lease (a keyed call holds two local ones).

use std::time::{Duration, Instant};

use super::observer::CallOutcome;
use super::policy::Policy;
use super::reason::RejectReason;

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
    /// The admission is not reported yet (a policy that reports later):
    /// until it is, `since` is when the wait began, and the end of the
    /// call is not reported either.
    unreported: bool,
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
            unreported: false,
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
        if !self.unreported {
            self.source.policy().finished(self.since, self.outcome);
        }
    }

    /// For a policy that reports later, right after the grant and before
    /// anything that may drop the guard: the admission is not reported
    /// yet ([`report_admitted`](Self::report_admitted) or
    /// [`report_refused`](Self::report_refused) will), nor, until then, is
    /// the end of the call. Does nothing otherwise.
    #[inline]
    pub(crate) fn defer_report(&mut self) {
        self.unreported = self.source.policy().reports_later();
    }

    /// For a policy that reports later: every stage admitted the call.
    /// Tells the observers, with the time waited since the wait began, and
    /// measures the hold from now. Does nothing otherwise.
    #[inline]
    pub(crate) fn report_admitted(&mut self) {
        if core::mem::take(&mut self.unreported) && self.source.policy().observed() {
            self.tell_admitted();
        }
    }

    #[inline(never)]
    fn tell_admitted(&mut self) {
        let waited = self.waited_until_now();
        self.source.policy().report_permitted(waited);
    }

    /// A later stage turned the call away for `reason`. For a policy that
    /// reports later, the permit goes back with no end reported, and the
    /// observers hear of a rejection for `reason` (a panicking one unwinds
    /// past it); otherwise the permit goes back as `Cancelled`.
    #[cold]
    pub(crate) fn report_refused(&mut self, reason: RejectReason) {
        if !self.unreported {
            self.set_outcome(CallOutcome::Cancelled);
            self.finish();
            return;
        }
        let waited = self.waited_until_now();
        self.finish();
        self.source.policy().report_refused(reason, waited);
    }

    /// How long since `since` (when the wait began, if an observer
    /// listens: see `permit::since_waited`), on the policy's clock; `since`
    /// then reads now. Zero if the hold is not measured.
    fn waited_until_now(&mut self) -> Duration {
        let Some(began) = self.since else {
            return Duration::ZERO;
        };
        let now = self.source.policy().line_now();
        self.since = Some(now);
        now.saturating_duration_since(began)
    }
}

impl<S: Source> Drop for Guard<S> {
    #[inline]
    fn drop(&mut self) {
        self.finish();
    }
}
