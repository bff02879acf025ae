//! The future of [`Bulkhead::call`](crate::Bulkhead::call): admission and
//! the guarded call as one state machine, built in place and polled there.
//!
//! Written out rather than an `async fn` because the contended path is
//! where a bulkhead is measured against a hand-rolled one: an `async fn`
//! keeps a sleep slot for `max_wait` and another for `call_timeout`, moves
//! the call into the running stage and runs drop glue for each stage. Here
//! the call is pinned once, the semaphore's acquire lives inline (idle, and
//! free to build, until a wait needs it), and one [`Deadline`] serves
//! `max_wait` and then `call_timeout`.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use pin_project_lite::pin_project;

use super::Shared;
use super::error::{BulkheadError, RejectReason, Rejected};
use super::observer::CallOutcome;
use super::options::CallOptions;
use super::permit::{self, Admitted, Held};
use super::policy::Traced;
use super::run::poll_run;
use super::wait::{Line, poll_wait};
use crate::futures::Acquire;
use crate::timer::Deadline;

/// Where a [`Call`] is, with what that stage keeps: a place in line and a
/// permit are never kept at once, so they share their room.
enum Stage<'a> {
    /// Not polled yet (the line may hold the call's own limits).
    Start(Line),
    /// In line for a permit (`acquire` is live, `deadline` is for
    /// `max_wait`).
    Waiting(Line),
    /// Admitted: the guard owns the permit, `deadline` is for
    /// `call_timeout`.
    Running(Held<&'a Shared>),
    /// The output was returned.
    Done,
}

pin_project! {
    /// The future returned by [`Bulkhead::call`](crate::Bulkhead::call).
    ///
    /// Nothing is allocated, on any path; see the method for what it
    /// resolves to.
    ///
    /// # Cancel safety
    ///
    /// Dropping it while it waits gives up its place in line (a permit it
    /// was handed meanwhile moves on to the next waiter); while the call
    /// runs, it drops the call first, then gives the permit back.
    ///
    /// # Panics
    ///
    /// Polling it again after it returned `Ready` panics. A call that
    /// panics gives its permit back as the panic unwinds, and observers
    /// see [`CallOutcome::Panicked`].
    #[must_use = "futures do nothing unless polled; a call that is never polled is never admitted"]
    pub struct Call<'a, F> {
        shared: &'a Shared,
        // Declared before `held`: a call cancelled while it runs is dropped
        // before its permit goes back.
        #[pin]
        call: Traced<F>,
        #[pin]
        acquire: Acquire<'a>,
        #[pin]
        deadline: Deadline,
        stage: Stage<'a>,
    }

    impl<F> PinnedDrop for Call<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Stage::Waiting(line) = this.stage {
                leave_waiting(this.shared, line, this.acquire);
            }
        }
    }
}

/// A `Call` dropped while it waits leaves the line, out of line: the drop
/// of every other call stays a test of its stage.
#[cold]
#[inline(never)]
fn leave_waiting(shared: &Shared, line: &mut Line, acquire: Pin<&mut Acquire<'_>>) {
    line.leave(&shared.policy);
    // A permit handed to the acquire but never delivered goes back through
    // the semaphore: the bulkhead may be idle now.
    acquire.cancel();
    shared.left_line(false);
}

impl<'a, F> Call<'a, F> {
    #[inline]
    pub(crate) fn new(shared: &'a Shared, call: F) -> Self
    where
        F: Future,
    {
        Self {
            shared,
            call: shared.policy.traced(call),
            acquire: shared.sem.acquire(),
            deadline: Deadline::new(),
            stage: Stage::Start(Line::default()),
        }
    }

    /// The first look at a call with options (see
    /// [`CallOptions`](super::CallOptions)), before it is polled: admitted
    /// at once, rejected (returned), or left waiting with its limit in
    /// `line`; the next poll goes on from there.
    #[cold]
    fn start_with(self: Pin<&mut Self>, options: &CallOptions) -> Option<Rejected> {
        let this = self.project();
        let shared = *this.shared;
        let Stage::Start(line) = this.stage else {
            unreachable!("the options are looked at first");
        };
        match shared.admit_now_with(options, line) {
            Some(Ok(admitted)) => {
                admit(shared, this.stage, admitted);
                None
            }
            Some(Err(rejected)) => {
                this.stage.advance(Stage::Done);
                Some(rejected)
            }
            None => {
                let line = core::mem::take(line);
                this.stage.advance(Stage::Waiting(line));
                None
            }
        }
    }
}

impl<F, T, E> Future for Call<'_, F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, BulkheadError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared = *this.shared;
        if let Stage::Start(line) = this.stage {
            match shared.admit_now(true) {
                Some(Ok(admitted)) => admit(shared, this.stage, admitted),
                Some(Err(rejected)) => {
                    this.stage.advance(Stage::Done);
                    return Poll::Ready(Err(BulkheadError::Rejected(rejected)));
                }
                None => {
                    let line = core::mem::take(line);
                    this.stage.advance(Stage::Waiting(line));
                }
            }
        }
        if let Stage::Waiting(line) = this.stage {
            let mut take = Take {
                acquire: this.acquire.as_mut(),
            };
            match poll_wait(
                Pin::new(&mut take),
                this.deadline.as_mut(),
                line,
                &shared.policy,
                cx,
            ) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(((), waited))) => {
                    shared.left_line(true);
                    if this.deadline.is_armed() {
                        // From `max_wait` to `call_timeout`: the same slot.
                        this.deadline.set(Deadline::new());
                    }
                    admit(shared, this.stage, Admitted::Waited(waited));
                }
                Poll::Ready(Err(rejected)) => {
                    this.stage.advance(Stage::Done);
                    // Out of time (or closed): leave the semaphore's line
                    // too; a permit handed meanwhile moves on.
                    this.acquire.cancel();
                    shared.left_line(false);
                    return Poll::Ready(Err(BulkheadError::Rejected(rejected)));
                }
            }
        }
        assert!(
            matches!(this.stage, Stage::Running(_)),
            "`Bulkhead::call` polled after it completed"
        );
        // A call that panics ends here as the panic unwinds: the guard gives
        // the permit back and reports `Panicked` (it sees the unwinding).
        let unwinding = FinishOnUnwind(&mut *this.stage);
        let polled = poll_run(this.call, this.deadline, &shared.policy, cx);
        core::mem::forget(unwinding);
        let (result, outcome) = match polled {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(out) => out,
        };
        // The permit goes back once the result is in place, as this
        // function's last local is dropped: the result is written where it
        // is returned, not copied there past a release that may unwind (an
        // observer that panics).
        let _release = match core::mem::replace(this.stage, Stage::Done) {
            Stage::Running(mut held) => {
                held.set_outcome(outcome);
                Some(held)
            }
            _ => None,
        };
        Poll::Ready(result)
    }
}

pin_project! {
    /// The future of [`Bulkhead::call_with`](crate::Bulkhead::call_with)
    /// for a call without a class: a [`Call`] whose first poll reads the
    /// call's options.
    ///
    /// A future of its own, rather than a `Call` that remembers whether it
    /// has options: a plain call's every poll would test that.
    pub(super) struct CallWith<'a, F> {
        #[pin]
        call: Call<'a, F>,
        // The options, until the first poll has looked at them.
        options: Option<CallOptions>,
    }
}

impl<'a, F> CallWith<'a, F> {
    #[inline]
    pub(super) fn new(shared: &'a Shared, options: CallOptions, call: F) -> Self
    where
        F: Future,
    {
        Self {
            call: Call::new(shared, call),
            options: (!options.waits_plainly()).then_some(options),
        }
    }
}

impl<'a, F, T, E> Future for CallWith<'a, F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = <Call<'a, F> as Future>::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(options) = this.options.take() {
            if let Some(rejected) = this.call.as_mut().start_with(&options) {
                return Poll::Ready(Err(BulkheadError::Rejected(rejected)));
            }
        }
        this.call.poll(cx)
    }
}

pin_project! {
    /// One of two futures of the same output, built in place.
    #[project = EitherProj]
    pub(super) enum Either<A, B> {
        Left { #[pin] future: A },
        Right { #[pin] future: B },
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for Either<A, B> {
    type Output = A::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EitherProj::Left { future } => future.poll(cx),
            EitherProj::Right { future } => future.poll(cx),
        }
    }
}

impl<'a> Stage<'a> {
    /// Moves on from a stage that holds no permit (`Start`, `Waiting`,
    /// whose line its owner gives back): the old stage is forgotten, not
    /// dropped, so that no drop that could unwind stands between a
    /// rejection and the slot it is returned in.
    #[inline(always)]
    fn advance(&mut self, next: Stage<'a>) {
        debug_assert!(!matches!(self, Stage::Running(_)));
        core::mem::forget(core::mem::replace(self, next));
    }

    /// The stage's name, for `Debug`.
    fn name(&self) -> &'static str {
        match self {
            Self::Start(_) => "Start",
            Self::Waiting(_) => "Waiting",
            Self::Running(_) => "Running",
            Self::Done => "Done",
        }
    }
}

/// Takes over a permit just granted: the guard owns it before any user code
/// (the observers) runs, so a panicking hook cannot leak it.
#[inline(always)]
fn admit<'a>(shared: &'a Shared, stage: &mut Stage<'a>, admitted: Admitted) {
    stage.advance(Stage::Running(permit::held(
        shared,
        admitted,
        CallOutcome::Cancelled,
    )));
    shared.policy.permitted(admitted.waited());
}

/// Drops the guard if the call's poll unwinds; forgotten on every other
/// way out, so it costs nothing there.
struct FinishOnUnwind<'g, 'a>(&'g mut Stage<'a>);

impl Drop for FinishOnUnwind<'_, '_> {
    fn drop(&mut self) {
        *self.0 = Stage::Done;
    }
}

/// The semaphore's acquire as `poll_wait` wants it: the permit becomes the
/// call's (its guard gives it back), a closed semaphore a rejection. Also
/// the body of `Queued`'s poll (`mod.rs`).
pub(super) struct Take<'p, 'a> {
    pub(super) acquire: Pin<&'p mut Acquire<'a>>,
}

impl Future for Take<'_, '_> {
    type Output = Result<(), RejectReason>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.acquire.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(permit)) => {
                permit.forget();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_closed)) => Poll::Ready(Err(RejectReason::Closed)),
        }
    }
}

impl<F> fmt::Debug for Call<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("bulkhead", &self.shared.policy.name())
            .field("stage", &format_args!("{}", self.stage.name()))
            .finish_non_exhaustive()
    }
}
