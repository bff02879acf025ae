//! The guard that holds a bulkhead permit.

use core::fmt;
use core::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use super::Shared;
use super::observer::CallOutcome;

/// One admitted call's hold on a permit: gives the permit back on drop,
/// tells the observer how the call ended, and wakes `wait_idle` when the
/// bulkhead empties. `S` is `&Shared` inside `call` and `Arc<Shared>` in a
/// [`BulkheadPermit`].
pub(crate) struct Held<S: Deref<Target = Shared>> {
    shared: S,
    /// When the permit was granted; only measured when an observer listens.
    since: Option<Instant>,
    /// Reported to the observer on drop, unless a panic is unwinding.
    outcome: CallOutcome,
    /// The permit's leak watch in the policy (0: none).
    watch: u64,
}

impl<S: Deref<Target = Shared>> Held<S> {
    #[inline]
    pub(crate) fn new(shared: S, outcome_if_dropped: CallOutcome) -> Self {
        // The permit was taken just now: no permit left means the hold time
        // matters for retry hints.
        let since = shared.policy.clock(shared.sem.available_permits() <= 0);
        let watch = shared.policy.watch();
        Self {
            shared,
            since,
            watch,
            outcome: outcome_if_dropped,
        }
    }

    /// Records how the call ended, for the observer.
    #[inline]
    pub(crate) fn set_outcome(&mut self, outcome: CallOutcome) {
        self.outcome = outcome;
    }
}

impl<S: Deref<Target = Shared>> Drop for Held<S> {
    #[inline]
    fn drop(&mut self) {
        // Disarm the leak watch before the permit goes back.
        self.shared.policy.unwatch(self.watch);
        let shared = &*self.shared;
        let balance = shared.sem.release(1);
        if balance >= shared.limit() as isize {
            shared.became_idle();
        }
        shared.policy.finished(self.since, self.outcome);
    }
}

/// A permit from [`Bulkhead::acquire`](crate::Bulkhead::acquire) or
/// [`Bulkhead::try_acquire`](crate::Bulkhead::try_acquire): the call it
/// guards counts as in flight until this is dropped. It holds an `Arc` of the
/// bulkhead's state, so it can move into spawned tasks.
///
/// # Examples
///
/// ```
/// use bulkhead::Bulkhead;
///
/// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
/// let permit = bh.try_acquire().unwrap();
/// assert_eq!(bh.metrics().in_flight(), 1);
/// drop(permit);
/// assert_eq!(bh.metrics().in_flight(), 0);
/// ```
#[must_use = "dropping the permit ends the call it guards at once"]
#[clippy::has_significant_drop]
pub struct BulkheadPermit {
    held: Held<Arc<Shared>>,
}

impl BulkheadPermit {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            held: Held::new(shared, CallOutcome::Released),
        }
    }

    ///
    /// # Examples
    ///
    /// ```
    /// use bulkhead::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("gpu").max_concurrent_calls(1).build().unwrap();
    /// assert_eq!(bh.try_acquire().unwrap().bulkhead_name(), "gpu");
    /// ```
    /// The name of the bulkhead the permit came from.
    pub fn bulkhead_name(&self) -> &str {
        &self.held.shared.policy.name
    }

    /// Marks how the guarded work ended, for the observer (the default is
    /// [`CallOutcome::Released`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use bulkhead::{Bulkhead, CallOutcome};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let mut permit = bh.try_acquire().unwrap();
    /// permit.set_outcome(CallOutcome::Success);
    /// ```
    pub fn set_outcome(&mut self, outcome: CallOutcome) {
        self.held.set_outcome(outcome);
    }
}

impl fmt::Debug for BulkheadPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadPermit")
            .field("bulkhead", &self.held.shared.policy.name)
            .finish_non_exhaustive()
    }
}
