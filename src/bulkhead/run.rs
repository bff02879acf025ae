//! The run machine: an admitted call under `call_timeout`, for every kind
//! of bulkhead. [`poll_call`] polls the call and, once it is pending, its
//! deadline; [`Ran::settle`] turns how it ended into the kind's own error
//! and the [`CallOutcome`] its observers see. The permit's return and the
//! observers' report stay with whoever holds the permit (a guard, so that
//! a panic in the call gives the permit back too).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::error::BulkheadError;
use super::metrics::Counters;
use super::observer::CallOutcome;
use super::policy::Policy;
use crate::timer::{Clock, Deadline};

/// How an admitted call ended.
pub(crate) enum Ran<T, E> {
    /// It finished, with its own result.
    Done(Result<T, E>),
    /// `call_timeout` passed first; the call is to be dropped.
    TimedOut,
    /// The timer that keeps `call_timeout` cannot run (its runtime is
    /// gone): the call is dropped rather than left running unbounded.
    TimerGone,
}

impl<T, E> Ran<T, E> {
    /// The result in the kind's error type `X` (the call's own error
    /// wrapped by `inner`, the others made by `timed_out` and `gone`, which
    /// count them as the kind does), and the outcome for the observers.
    #[inline]
    pub(crate) fn settle<X>(
        self,
        inner: impl FnOnce(E) -> X,
        timed_out: impl FnOnce() -> X,
        gone: impl FnOnce() -> X,
    ) -> (Result<T, X>, CallOutcome) {
        match self {
            Ran::Done(Ok(value)) => (Ok(value), CallOutcome::Success),
            Ran::Done(Err(e)) => (Err(inner(e)), CallOutcome::Failure),
            Ran::TimedOut => (Err(timed_out()), CallOutcome::TimedOut),
            Ran::TimerGone => (Err(gone()), CallOutcome::Cancelled),
        }
    }
}

/// Runs a blocking call (`call_blocking`) and reports its outcome through
/// `outcome` (a permit's): success or failure by its result. No timer can
/// cut a closure short; a panic unwinds past `outcome`, and the permit,
/// dropped while unwinding, reports `Panicked`.
pub(crate) fn run_blocking<T, E>(
    call: impl FnOnce() -> Result<T, E>,
    outcome: impl FnOnce(CallOutcome),
) -> Result<T, E> {
    let out = call();
    outcome(match out {
        Ok(_) => CallOutcome::Success,
        Err(_) => CallOutcome::Failure,
    });
    out
}

/// Polls an admitted call, then (once it is pending) its deadline for
/// `limit` on `clock`: the deadline is armed only if the call is still
/// pending after its first poll, so a call that finishes at once makes no
/// timer entry, and `call_timeout` counts from there.
#[inline]
pub(crate) fn poll_call<F, T, E>(
    call: Pin<&mut F>,
    deadline: Pin<&mut Deadline>,
    limit: Option<Duration>,
    clock: Option<&Clock>,
    cx: &mut Context<'_>,
) -> Poll<Ran<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    if let Poll::Ready(out) = call.poll(cx) {
        return Poll::Ready(Ran::Done(out));
    }
    let Some(limit) = limit else {
        return Poll::Pending;
    };
    match deadline.poll_at(clock, limit, cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Ok(())) => Poll::Ready(Ran::TimedOut),
        Poll::Ready(Err(_gone)) => Poll::Ready(Ran::TimerGone),
    }
}

/// [`poll_call`] under a bulkhead's policy, settled in [`BulkheadError`]:
/// the body of [`Run`], [`Running`] and `Bulkhead::call`'s future.
#[inline]
pub(crate) fn poll_run<F, T, E>(
    call: Pin<&mut F>,
    deadline: Pin<&mut Deadline>,
    policy: &Policy,
    cx: &mut Context<'_>,
) -> Poll<(Result<T, BulkheadError<E>>, CallOutcome)>
where
    F: Future<Output = Result<T, E>>,
{
    let limit = policy.call_timeout();
    poll_call(call, deadline, limit, policy.clock(), cx).map(|ran| {
        ran.settle(
            BulkheadError::Inner,
            || {
                Counters::bump(&policy.counters().call_timeouts);
                BulkheadError::CallTimeout(policy.call_timed_out())
            },
            || BulkheadError::Rejected(policy.reject_timer_gone(Duration::ZERO)),
        )
    })
}

pin_project! {
    /// The future of [`Policy::run`]: [`Running`] with its policy. Its own
    /// fields rather than a `Running` in it, so that `run` builds it in
    /// place: a nested `Running` is built aside and copied, deadline and
    /// all, which costs `Bulkhead::call` about 8 ns (a store-forwarding
    /// stall).
    pub(crate) struct Run<'a, F> {
        policy: &'a Policy,
        #[pin]
        call: F,
        #[pin]
        deadline: Deadline,
    }
}

impl Policy {
    /// Runs an admitted call under `call_timeout`; resolves to its result
    /// and how it ended, for the observer. The timer is armed only if the
    /// call is still pending after its first poll, so `call_timeout`
    /// counts from there.
    #[inline]
    pub(crate) fn run<F>(&self, call: F) -> Run<'_, F> {
        Run {
            policy: self,
            call,
            deadline: Deadline::new(),
        }
    }
}

impl<F, T, E> Future for Run<'_, F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = (Result<T, BulkheadError<E>>, CallOutcome);

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        poll_run(this.call, this.deadline, this.policy, cx)
    }
}

#[cfg(feature = "tower")]
pin_project! {
    /// The state of a [`Run`] without its policy, which every poll passes
    /// in (see `Waiting`): the tower layer's response future keeps one.
    pub(crate) struct Running<F> {
        #[pin]
        call: F,
        #[pin]
        deadline: Deadline,
    }
}

#[cfg(feature = "tower")]
impl<F> Running<F> {
    /// Runs `call` (see [`Policy::run`]).
    #[inline]
    pub(crate) fn new(call: F) -> Self {
        Self {
            call,
            deadline: Deadline::new(),
        }
    }

    /// Polls the call under `policy`, which must be the same at every poll.
    #[inline]
    pub(crate) fn poll_with<T, E>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        policy: &Policy,
    ) -> Poll<(Result<T, BulkheadError<E>>, CallOutcome)>
    where
        F: Future<Output = Result<T, E>>,
    {
        let this = self.project();
        poll_run(this.call, this.deadline, policy, cx)
    }
}
