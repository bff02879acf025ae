//! What a caller that borrows a bulkhead and runs the call itself needs:
//! the keyed bulkhead's two stages (`hold_*`, `seat_*`, `judge`).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::error::{RejectReason, Rejected};
use super::options::CallOptions;
use super::permit::{self, Admitted, BulkheadPermit};
use super::seating;
use super::wait::{Line, Waited};
use super::{Bulkhead, CallOutcome, Shared};

/// Admission for a caller that borrows the bulkhead and runs the call
/// itself, as [`Bulkhead::call`] does: the keyed bulkhead's two stages.
/// The permit comes owned by its guard and already reported as permitted;
/// it goes back when the guard is dropped, as [`CallOutcome::Cancelled`]
/// unless the outcome is set. Nothing is allocated, and only the wait
/// borrows more than a pointer.
impl Bulkhead {
    /// The decision that needs no waiting (`admit_now`): `Some` with a
    /// permit or a rejection, `None` if the caller is to wait
    /// ([`hold_waiting_in`](Self::hold_waiting_in)). With `may_wait` false, a
    /// full bulkhead rejects, as [`try_acquire`](Self::try_acquire) does.
    // Always: returned through memory, its result costs a store-forwarding
    // stall on the keyed bulkhead's fast path (about 10 ns).
    #[inline(always)]
    pub(crate) fn hold_now(
        &self,
        may_wait: bool,
    ) -> Option<Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        match shared.admit_now(may_wait)? {
            Ok(admitted) => {
                let held = permit::held_plain(shared, admitted, CallOutcome::Cancelled);
                shared.policy.permitted(Duration::ZERO);
                Some(Ok(held))
            }
            Err(rejected) => Some(Err(rejected)),
        }
    }

    /// [`hold_now`](Self::hold_now) for a call with `options` (a deadline,
    /// a wait of its own): the policy reads them first, which may reject
    /// the call at once and leaves in `line` how long it may wait.
    #[cold]
    pub(crate) fn hold_now_with(
        &self,
        options: &CallOptions,
        line: &mut Line,
        may_wait: bool,
    ) -> Option<Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        let (free, ahead) = (shared.free_now(), shared.policy.queued());
        if let Err(rejected) = shared.policy.judge_into(options, free, ahead, line) {
            return Some(Err(rejected));
        }
        self.hold_now(may_wait && options.may_wait())
    }

    /// The wait in line under the policy, after [`hold_now`](Self::hold_now)
    /// or [`hold_now_with`](Self::hold_now_with) said `None`, from the
    /// `line` the latter left (else the default).
    #[inline]
    pub(crate) fn hold_waiting_in(
        &self,
        line: Line,
    ) -> impl Future<Output = Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        Holding {
            shared,
            wait: shared.queue_in(line),
        }
    }

    /// Ends the wait `line` is about to start after `left`, as its own
    /// `max_wait` would (see `Policy::limit_wait`): the rest of a keyed
    /// call's budget.
    #[inline]
    pub(crate) fn limit_wait(&self, line: &mut Line, left: Duration) {
        self.shared.policy.limit_wait(line, left);
    }

    /// [`hold_waiting_in`](Self::hold_waiting_in) for a caller that waits for
    /// `gate` (its turn) before it queues for a permit, within the same
    /// wait in line (see [`After`](super::engine::After)). The gate is
    /// dropped when the wait ends.
    #[inline]
    pub(crate) fn hold_waiting_after<G: Future<Output = ()>>(
        &self,
        line: Line,
        gate: G,
    ) -> impl Future<Output = Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        Holding {
            shared,
            wait: shared.queue_after(line, gate),
        }
    }

    /// [`acquire`](Self::acquire) (with `line`, the wait of
    /// [`acquire_with`](Self::acquire_with), which [`judge`](Self::judge)
    /// looked at) for a caller that waits for `gate` first, as
    /// [`hold_waiting_after`](Self::hold_waiting_after).
    pub(crate) async fn acquire_after<G: Future<Output = ()>>(
        &self,
        line: Line,
        gate: G,
    ) -> Result<BulkheadPermit, Rejected> {
        let ((), waited) = self.shared.queue_after(line, gate).await?;
        let admitted = Admitted::Waited(waited);
        let permit = BulkheadPermit::new(self.shared.clone(), admitted);
        self.shared.policy.permitted(admitted.waited());
        Ok(permit)
    }

    /// The policy's reading of a call's `options` alone (no permit
    /// taken), for a caller that is to wait anyway: `Err` if it is
    /// rejected at once, else the line it waits in.
    #[cold]
    pub(crate) fn judge(&self, options: &CallOptions) -> Result<Line, Rejected> {
        let shared = &*self.shared;
        shared
            .policy
            .line_for(options, shared.free_now(), shared.policy.queued())
    }

    /// The global stage of a keyed caller that names a class, on a
    /// bulkhead with priority classes (see [`classed`](Self::classed)): a
    /// seat now, already reported as permitted (`Ok(Ok)`), or the wait in
    /// its class's line for one (`Ok(Err)`).
    #[cold]
    #[allow(clippy::type_complexity)]
    pub(crate) fn seat_now<'a>(
        &'a self,
        class: usize,
        options: &CallOptions,
        may_wait: bool,
    ) -> Result<
        Result<
            permit::SeatHeld<&'a Shared>,
            impl Future<Output = Result<permit::SeatHeld<&'a Shared>, Rejected>> + use<'a>,
        >,
        Rejected,
    > {
        let shared = &*self.shared;
        Ok(match Shared::seat_with(shared, class, options, may_wait)? {
            seating::Seat::Now => Ok(self.seat_after(class, Admitted::Now)),
            seating::Seat::Wait(seating) => Err(Seated {
                bulkhead: self,
                class,
                seating,
            }),
        })
    }

    /// A seat of `class` just granted, in a guard whose outcome is
    /// `Cancelled` until set; the observers are told of the admission.
    pub(crate) fn seat_after(&self, class: usize, admitted: Admitted) -> permit::SeatHeld<&Shared> {
        let shared = &*self.shared;
        let held = permit::seated(shared, class, admitted, CallOutcome::Cancelled);
        shared.policy.permitted(admitted.waited());
        held
    }

    /// Seats free now.
    pub(crate) fn seats_left(&self) -> usize {
        self.shared.seats_left()
    }

    /// Rejects a caller at once for `reason` (counted and reported as the
    /// bulkhead's own rejections are), without looking for a permit.
    #[cold]
    pub(crate) fn reject_now(&self, reason: RejectReason) -> Rejected {
        self.shared.policy.reject_now(reason)
    }

    /// Rejects a caller that waited `waited` in this bulkhead's line and
    /// was ended for `reason` by a limit of its own (a keyed bulkhead's
    /// budget): counted and reported as the bulkhead's own rejections are.
    #[cold]
    pub(crate) fn reject_waited(&self, reason: RejectReason, waited: Duration) -> Rejected {
        self.shared.policy.reject(reason, waited)
    }

    /// While unwinding from one of this bulkhead's admissions: the reason
    /// of the rejection it counted, if its observers' panic is what
    /// unwinds (see `Policy::take_unwinding_rejection`). Taken once.
    #[cold]
    pub(crate) fn take_unwinding_rejection(&self) -> Option<RejectReason> {
        self.shared.policy.take_unwinding_rejection()
    }
}

pin_project! {
    /// A wait in line whose permit comes held by its guard, already
    /// reported as permitted ([`Bulkhead::hold_waiting_in`]): written by
    /// hand, so that the wait is kept once.
    struct Holding<'a, W> {
        shared: &'a Shared,
        #[pin]
        wait: W,
    }
}

impl<'a, W> Future for Holding<'a, W>
where
    W: Future<Output = Result<((), Waited), Rejected>>,
{
    type Output = Result<permit::SeatHeld<&'a Shared>, Rejected>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let ((), waited) = ready!(this.wait.poll(cx))?;
        Poll::Ready(Ok(this.shared.hold(Admitted::Waited(waited))))
    }
}

pin_project! {
    /// A classed caller's wait in its class's line, whose seat comes as
    /// [`Bulkhead::seat_after`] gives it ([`Bulkhead::seat_now`]).
    struct Seated<'a> {
        bulkhead: &'a Bulkhead,
        class: usize,
        #[pin]
        seating: seating::Seating<&'a Shared>,
    }
}

impl<'a> Future for Seated<'a> {
    type Output = Result<permit::SeatHeld<&'a Shared>, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let waited = ready!(this.seating.poll(cx))?;
        Poll::Ready(Ok(this
            .bulkhead
            .seat_after(*this.class, Admitted::Waited(waited))))
    }
}
