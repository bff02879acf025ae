//! The engine under [`Bulkhead`](super::Bulkhead): the decisions of
//! [`Shared`] that need no waiting (a permit now, a rejection, or a wait
//! to start), the wait in line for a borrowed bulkhead (`Queued`, and
//! `After` for a caller that first waits for its turn), the limit and the
//! idle check.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use pin_project_lite::pin_project;

use super::call;
use super::classes;
use super::error::{RejectReason, Rejected};
use super::options::CallOptions;
use super::permit::{self, Admitted};
use super::seating;
use super::wait::{Line, Wait};
use super::{CallOutcome, Shared};
use crate::error::TryAcquireError;
use crate::futures::Acquire;

impl Shared {
    #[inline]
    pub(crate) fn limit(&self) -> usize {
        self.limit_now.load(Ordering::Acquire)
    }

    /// A permit came back and the balance reached the limit: wake
    /// `wait_idle`, if anyone waits for it (it re-checks under the limit's
    /// lock, so a racing limit change is harmless).
    #[inline]
    pub(crate) fn became_idle(&self) {
        self.idle.notify();
    }

    /// An admitted call's permit, borrowed, as a guard whose outcome is
    /// `Cancelled` until it is set; the observers are told of the
    /// admission.
    #[inline]
    pub(super) fn hold(&self, admitted: Admitted) -> permit::SeatHeld<&Shared> {
        let held = permit::held_plain(self, admitted, CallOutcome::Cancelled);
        self.policy.permitted(admitted.waited());
        held
    }

    /// A waiter left the line for good (see [`Policy::left_line`](super::policy::Policy::left_line)). Unless
    /// it leaves holding the permit it was granted, a permit handed to it
    /// meanwhile went back through the semaphore, not a guard, and the
    /// bulkhead may be idle now: the one place that says so.
    #[inline]
    pub(crate) fn left_line(&self, holds_permit: bool) {
        self.policy.left_line();
        if !holds_permit {
            self.became_idle_maybe();
        }
    }

    /// A permit may have come back outside a guard (a granted waiter that
    /// was cancelled): wake `wait_idle` if the bulkhead is now empty.
    #[cold]
    pub(super) fn became_idle_maybe(&self) {
        if let Some(classes) = self.classes.as_deref() {
            if classes.in_use_and_queued().0 == 0 {
                self.became_idle();
            }
            return;
        }
        if self.sem.available_permits() >= self.limit() as isize {
            self.became_idle();
        }
    }

    /// The configured limit and the calls in flight, read consistently.
    pub(super) fn limit_and_in_flight(&self) -> (usize, usize) {
        let limit = self.limit.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(classes) = self.classes.as_deref() {
            return (*limit, classes.in_use_and_queued().0);
        }
        let in_flight = (*limit as isize - self.sem.available_permits()).max(0);
        (*limit, in_flight as usize)
    }

    /// The decision that needs no waiting: a permit taken at once
    /// (`Some(Ok)`), or a rejection (`Some(Err)`: closed, or full when the
    /// policy fails fast, or always when `may_wait` is false); `None` when
    /// the caller is to wait in line ([`admit_waiting_in`](Self::admit_waiting_in)).
    /// Nothing waiting-related is built on these paths, so they move
    /// nothing bigger than a pointer.
    #[inline]
    pub(super) fn admit_now(&self, may_wait: bool) -> Option<Result<Admitted, Rejected>> {
        let reason = match self.sem.try_take(1) {
            Ok(()) => return Some(Ok(Admitted::Now)),
            // With priority classes the semaphore is closed from the start
            // (the seats are the classes'): a plain call finds them here,
            // off the paths that find a permit or find none.
            Err(TryAcquireError::Closed) => return Some(self.closed_or_classed()),
            Err(TryAcquireError::NoPermits) if may_wait && !self.policy.fails_fast() => {
                return None;
            }
            Err(TryAcquireError::NoPermits) => RejectReason::Full,
        };
        Some(Err(self.policy.reject_now(reason)))
    }

    /// [`admit_now`](Self::admit_now) on a closed semaphore: closed, or
    /// the classes' seats.
    #[cold]
    #[inline(never)]
    pub(super) fn closed_or_classed(&self) -> Result<Admitted, Rejected> {
        if self.classes.is_some() {
            return self.admit_plain();
        }
        Err(self.policy.reject_now(RejectReason::Closed))
    }

    /// Whether the bulkhead was closed.
    pub(crate) fn is_closed(&self) -> bool {
        match self.classes.as_deref() {
            Some(classes) => classes.is_closed(),
            None => self.sem.is_closed(),
        }
    }

    /// [`admit_now`](Self::admit_now) with priority classes on: a plain
    /// call is of the least important class, and takes a seat only if one
    /// is free and nobody waits; it never waits.
    #[cold]
    #[inline(never)]
    pub(super) fn admit_plain(&self) -> Result<Admitted, Rejected> {
        match Shared::seat(self, self.plain_class(), false, None)? {
            seating::Seat::Now => Ok(Admitted::Now),
            seating::Seat::Wait(_) => unreachable!("a plain call never waits for a classed seat"),
        }
    }

    /// The class of a call that names none: the least important one.
    #[inline]
    pub(crate) fn plain_class(&self) -> usize {
        self.classes.as_deref().map_or(0, classes::Classes::least)
    }

    /// Seats free now (permits, without classes).
    pub(crate) fn seats_left(&self) -> usize {
        match self.classes.as_deref() {
            Some(classes) => self.limit().saturating_sub(classes.in_use_and_queued().0),
            None => usize::try_from(self.sem.available_permits()).unwrap_or(0),
        }
    }

    /// Permits free now, for deadline-aware admission's expected wait:
    /// with priority classes, the seats free (the semaphore then has none).
    #[inline]
    pub(super) fn free_now(&self) -> isize {
        match self.classes.as_deref() {
            Some(_) => isize::try_from(self.seats_left()).unwrap_or(isize::MAX),
            None => self.sem.available_permits(),
        }
    }

    /// Waits in line under the policy (the bounded line, `max_wait`, the
    /// limit `line` holds: see [`admit_now_with`](Self::admit_now_with));
    /// the waiting future and its timer live inline, so nothing is
    /// allocated. The caller wraps the permit in a guard, then reports it
    /// with `permitted`.
    pub(super) async fn admit_waiting_in(&self, line: Line) -> Result<Admitted, Rejected> {
        let ((), waited) = self.queue_in(line).await?;
        Ok(Admitted::Waited(waited))
    }

    /// The wait of [`admit_waiting_in`](Self::admit_waiting_in), as a
    /// future of its own for a caller that keeps it in a future it writes
    /// by hand (an `async fn` around it would keep `line` twice).
    #[inline]
    pub(super) fn queue_in(&self, line: Line) -> Wait<'_, Queued<'_>, impl Fn() -> RejectReason> {
        self.policy.wait_in(self.queued(), line)
    }

    /// [`queue_in`](Self::queue_in) for a caller that waits for `gate`
    /// before it queues (see [`After`]).
    #[inline]
    pub(super) fn queue_after<G: Future<Output = ()>>(
        &self,
        line: Line,
        gate: G,
    ) -> Wait<'_, After<'_, G>, impl Fn() -> RejectReason> {
        let after = After {
            queued: self.queued(),
            gate,
            through: false,
        };
        self.policy.wait_in(after, line)
    }

    #[inline]
    fn queued(&self) -> Queued<'_> {
        Queued {
            shared: self,
            acquire: Some(self.sem.acquire()),
        }
    }

    /// [`admit_now`](Self::admit_now) for a call with `options` (a
    /// deadline, a wait of its own): the policy reads them first
    /// ([`Policy::line_for`](super::policy::Policy::line_for)), which may reject the call at once and
    /// leaves in `line` how long it may wait.
    #[cold]
    pub(super) fn admit_now_with(
        &self,
        options: &CallOptions,
        line: &mut Line,
    ) -> Option<Result<Admitted, Rejected>> {
        let (free, ahead) = (self.free_now(), self.policy.queued());
        if let Err(rejected) = self.policy.judge_into(options, free, ahead, line) {
            return Some(Err(rejected));
        }
        self.admit_now(options.may_wait())
    }
}

pin_project! {
    /// The semaphore's acquire for a bulkhead: on drop, a permit it was
    /// handed but never delivered has gone back through the semaphore, so
    /// `wait_idle` looks again (the bulkhead may have emptied).
    pub(super) struct Queued<'a> {
        shared: &'a Shared,
        #[pin]
        acquire: Option<Acquire<'a>>,
    }

    impl PinnedDrop for Queued<'_> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.acquire.is_some() {
                this.acquire.set(None);
                this.shared.left_line(false);
            }
        }
    }
}

impl Future for Queued<'_> {
    type Output = Result<(), RejectReason>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(acquire) = this.acquire.as_mut().as_pin_mut() else {
            return Poll::Ready(Err(RejectReason::Closed));
        };
        let out = ready!(Pin::new(&mut call::Take { acquire }).poll(cx));
        // Done: nothing to hand back on drop.
        this.acquire.set(None);
        this.shared.left_line(out.is_ok());
        Poll::Ready(out)
    }
}

pin_project! {
    /// A wait for a permit that first waits for its turn: `gate` resolves
    /// when the caller may queue for the semaphore (the keyed bulkhead's
    /// fair shares), then `queued` is polled. The policy's line (its
    /// count, `max_queue`, the wait's limits and controlled delay) covers
    /// both. Dropped, `queued` goes first (a permit it was handed goes
    /// back through the semaphore), then `gate` (which passes the turn
    /// on).
    pub(super) struct After<'a, G> {
        #[pin]
        queued: Queued<'a>,
        #[pin]
        gate: G,
        through: bool,
    }
}

impl<G: Future<Output = ()>> Future for After<'_, G> {
    type Output = Result<(), RejectReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if !*this.through {
            ready!(this.gate.poll(cx));
            *this.through = true;
        }
        this.queued.poll(cx)
    }
}
