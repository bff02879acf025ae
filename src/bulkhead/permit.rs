//! The guard that holds a bulkhead permit.

use core::fmt;
use core::ops::Deref;
use std::sync::Arc;

use super::Shared;
use super::guard::{Guard, Source};
use super::observer::CallOutcome;
use super::policy::Policy;
use super::wait::Waited;
use std::time::Duration;

/// A local bulkhead's permit, as a guard's [`Source`]: `S` is `&Shared`
/// inside `call` and `Arc<Shared>` in a [`BulkheadPermit`].
pub(crate) struct Local<S>(pub(crate) S);

impl<S: Deref<Target = Shared>> Source for Local<S> {
    #[inline]
    fn policy(&self) -> &Policy {
        &self.0.policy
    }

    #[inline]
    fn give_back(&mut self) {
        let shared = &*self.0;
        if shared.classes.is_some() {
            return shared.give_plain_seat_back();
        }
        let balance = shared.sem.release(1);
        if balance >= shared.limit() as isize {
            shared.became_idle();
        }
    }
}

/// A local permit that knows its priority class, as a guard's
/// [`Source`]: a [`BulkheadPermit`]'s, and a classed call's. Without
/// classes it is a [`Local`].
pub(crate) struct Seated<S> {
    shared: S,
    class: usize,
}

impl<S: Deref<Target = Shared>> Source for Seated<S> {
    #[inline]
    fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    #[inline]
    fn give_back(&mut self) {
        let shared = &*self.shared;
        if shared.classes.is_some() {
            if self.class == PLAIN {
                return shared.give_plain_seat_back();
            }
            return shared.give_seat_back(self.class);
        }
        let balance = shared.sem.release(1);
        if balance >= shared.limit() as isize {
            shared.became_idle();
        }
    }
}

/// The class of a [`Seated`] permit taken as a plain call's: on a bulkhead
/// with classes, the least important one, looked up only when the seat
/// goes back.
const PLAIN: usize = usize::MAX;

/// [`held`] for a seat of `class` (any class, without classes).
#[inline]
pub(crate) fn seated<S: Deref<Target = Shared>>(
    shared: S,
    class: usize,
    admitted: Admitted,
    outcome_if_dropped: CallOutcome,
) -> Guard<Seated<S>> {
    let since = match admitted {
        Admitted::Waited(w) => since_waited(&shared.policy, w),
        Admitted::Now => shared.policy.clock_in(shared.seats_left() == 0),
    };
    Guard::new(Seated { shared, class }, since, outcome_if_dropped)
}

/// One admitted call's hold on a local permit.
pub(crate) type Held<S> = Guard<Local<S>>;

/// [`Held`] that knows its class: the keyed bulkhead's stages, whose
/// global bulkhead may have classes.
pub(crate) type SeatHeld<S> = Guard<Seated<S>>;

/// [`held`] as a [`SeatHeld`] of a plain call (the keyed stages'): the
/// same work, and one guard type for a plain permit and a classed seat.
#[inline]
pub(crate) fn held_plain<S: Deref<Target = Shared>>(
    shared: S,
    admitted: Admitted,
    outcome_if_dropped: CallOutcome,
) -> SeatHeld<S> {
    let since = granted_at(&shared, admitted);
    let source = Seated {
        shared,
        class: PLAIN,
    };
    Guard::new(source, since, outcome_if_dropped)
}

/// Takes over a permit of `shared` that was just granted; `admitted` says
/// how (and whether the grant's time was read already).
#[inline]
pub(crate) fn held<S: Deref<Target = Shared>>(
    shared: S,
    admitted: Admitted,
    outcome_if_dropped: CallOutcome,
) -> Held<S> {
    let since = granted_at(&shared, admitted);
    Guard::new(Local(shared), since, outcome_if_dropped)
}

/// When a plain permit was granted, if its hold time is to be measured.
// Always: on `Bulkhead::call`'s path, and tiny.
#[inline(always)]
fn granted_at(shared: &Shared, admitted: Admitted) -> Option<std::time::Instant> {
    match admitted {
        Admitted::Waited(w) => since_waited(&shared.policy, w),
        // No permit left means the hold time matters for retry hints.
        Admitted::Now => shared.policy.clock_in(shared.sem.available_permits() <= 0),
    }
}

/// Where the hold time of a permit granted after waiting counts from:
/// the grant, or, while the admission is to be told later to observers,
/// when the wait began (see `Guard::report_admitted`).
#[inline(always)]
fn since_waited(policy: &Policy, w: Waited) -> Option<std::time::Instant> {
    match policy.reports_later() && policy.observed() {
        false => w.since,
        true => w.since.and_then(|t| t.checked_sub(w.waited)),
    }
}

/// How a local permit was granted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Admitted {
    /// At once.
    Now,
    /// After waiting.
    Waited(Waited),
}

impl Admitted {
    /// How long the caller waited, for the observers.
    #[inline]
    pub(crate) fn waited(self) -> Duration {
        match self {
            Admitted::Now => Duration::ZERO,
            Admitted::Waited(w) => w.waited,
        }
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
/// use watertight::Bulkhead;
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
    held: Guard<Seated<Arc<Shared>>>,
}

impl BulkheadPermit {
    /// The permit of a plain caller (on a bulkhead with classes, of the
    /// least important class), reported as permitted by the caller once it
    /// owns it.
    #[inline]
    pub(crate) fn new(shared: Arc<Shared>, admitted: Admitted) -> Self {
        Self {
            held: held_plain(shared, admitted, CallOutcome::Released),
        }
    }

    /// The permit of a caller of `class`, reported as permitted by the
    /// caller once it owns it.
    pub(crate) fn of_class(shared: Arc<Shared>, class: usize, admitted: Admitted) -> Self {
        Self {
            held: seated(shared, class, admitted, CallOutcome::Released),
        }
    }

    /// The permit of a call that [`Admission`](super::Admission) admitted:
    /// as `call`'s guard, its outcome is `Cancelled` until set, and it is
    /// reported as permitted here, once the guard owns it.
    #[inline]
    pub(crate) fn admitted(shared: Arc<Shared>, class: usize, admitted: Admitted) -> Self {
        let permit = Self {
            held: seated(shared, class, admitted, CallOutcome::Cancelled),
        };
        permit.policy().permitted(admitted.waited());
        permit
    }

    /// The permit's guard (the keyed stages report through it).
    #[inline]
    pub(crate) fn guard(&mut self) -> &mut Guard<Seated<Arc<Shared>>> {
        &mut self.held
    }

    /// The policy of the bulkhead the permit came from.
    #[inline]
    pub(crate) fn policy(&self) -> &Policy {
        &self.held.source().shared.policy
    }

    /// The name of the bulkhead the permit came from.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("gpu").max_concurrent_calls(1).build().unwrap();
    /// assert_eq!(bh.try_acquire().unwrap().bulkhead_name(), "gpu");
    /// ```
    pub fn bulkhead_name(&self) -> &str {
        self.held.source().shared.policy.name()
    }

    /// Marks how the guarded work ended, for the observer (the default is
    /// [`CallOutcome::Released`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, CallOutcome};
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
            .field("bulkhead", &self.held.source().shared.policy.name())
            .finish_non_exhaustive()
    }
}
