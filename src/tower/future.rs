//! The response future: waits for a permit, then runs the inner
//! service's response future while holding it.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::{Answer, BoxErrors};
use crate::bulkhead::policy::Traced;
use crate::bulkhead::run::Running;
use crate::bulkhead::{Admission, AdmissionAs};
use crate::{BulkheadError, BulkheadPermit};

pin_project! {
    /// The response future of [`BulkheadService`]: waits for a permit under
    /// the bulkhead's policy, then calls the inner service and runs its
    /// response future while holding the permit.
    ///
    /// It is a named state machine with everything inline (no allocation
    /// of its own), `Send` and `'static` whenever the inner service, its
    /// future and the request are. It is not `Unpin`, since its place in
    /// the bulkhead's line lives inside it: pin it (`Box::pin`,
    /// `std::pin::pin!`) to poll it by hand.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use watertight::Bulkhead;
    /// use watertight::tower::{BulkheadService, ResponseFuture};
    /// use tower::{Service, service_fn};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let inc = service_fn(|n: u32| async move { Ok::<_, Infallible>(n + 1) });
    /// let mut service = BulkheadService::new(inc, bh);
    ///
    /// // A type that can be named: stored in a struct, returned from a
    /// // trait method.
    /// let response: ResponseFuture<_, u32> = service.call(1);
    /// assert_eq!(response.await.unwrap(), 2);
    /// # });
    /// ```
    ///
    /// # Panics
    ///
    /// Polling it again after it returned `Ready` panics.
    ///
    /// # Cancel safety
    ///
    /// Dropping it while it waits leaves the bulkhead's line, and the inner
    /// service is never called; dropping it while the inner call runs drops
    /// that call and releases the permit (the observer sees
    /// [`CallOutcome::Cancelled`](crate::CallOutcome::Cancelled)).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req, A = BoxErrors>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req, S::Future>,
        answer: A,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        /// Not admitted yet: the fast path on the first poll, else the wait
        /// under the policy. The ready instance and the request are kept
        /// for when the request is admitted.
        Admit {
            #[pin]
            admission: Admission,
            call: Option<(S, Req)>,
        },
        /// As `Admit`, for a request of a priority class.
        AdmitAs {
            #[pin]
            admission: AdmissionAs,
            call: Option<(S, Req)>,
        },
        /// Admitted: the inner call under `call_timeout`, then the permit
        /// (dropped in that order, as in `Bulkhead::call`).
        Run {
            #[pin]
            running: Running<Traced<F>>,
            permit: BulkheadPermit,
        },
        Done,
    }
}

impl<S: Service<Req>, Req, A> ResponseFuture<S, Req, A> {
    /// A plain request: its admission, then its call.
    #[inline]
    pub(super) fn admit(admission: Admission, call: Option<(S, Req)>, answer: A) -> Self {
        Self {
            state: State::Admit { admission, call },
            answer,
        }
    }

    /// A request of a priority class: its admission, then its call.
    #[inline]
    pub(super) fn admit_as(admission: AdmissionAs, call: Option<(S, Req)>, answer: A) -> Self {
        Self {
            state: State::AdmitAs { admission, call },
            answer,
        }
    }
}

impl<S, Req, A> Future for ResponseFuture<S, Req, A>
where
    S: Service<Req>,
    A: Answer<S::Response, S::Error>,
{
    type Output = Result<S::Response, A::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut state = this.state;
        let answer = &*this.answer;
        loop {
            let (admitted, call) = match state.as_mut().project() {
                StateProj::Admit { admission, call } => (ready!(admission.poll(cx)), call),
                StateProj::AdmitAs { admission, call } => (ready!(admission.poll(cx)), call),
                StateProj::Run { running, permit } => {
                    let (result, outcome) = ready!(running.poll_with(cx, permit.policy()));
                    permit.set_outcome(outcome);
                    let result = match result {
                        Ok(response) => Ok(response),
                        Err(BulkheadError::Inner(e)) => Err(answer.inner(e)),
                        Err(BulkheadError::Rejected(rejected)) => answer.rejected(rejected),
                        Err(BulkheadError::CallTimeout(timed_out)) => answer.timed_out(timed_out),
                        // A local permit is never lost; kept for the match.
                        Err(BulkheadError::LeaseLost(reason)) => answer.lost(reason),
                    };
                    // Drops the call, then gives the permit back.
                    state.set(State::Done);
                    return Poll::Ready(result);
                }
                StateProj::Done => panic!("`ResponseFuture` polled after completion"),
            };
            let permit = match admitted {
                Ok(permit) => permit,
                Err(rejected) => {
                    state.set(State::Done);
                    return Poll::Ready(answer.rejected(rejected));
                }
            };
            let (mut inner, request) = call.take().expect("called once, when admitted");
            // Only now, so the inner service's `call` (which may start the
            // work) is inside the bulkhead; the permit's guard owns the
            // permit already, should it panic.
            let response = permit.policy().traced_with(|| inner.call(request));
            drop(inner);
            state.set(State::Run {
                running: Running::new(response),
                permit,
            });
        }
    }
}

impl<S, Req, A> fmt::Debug for ResponseFuture<S, Req, A>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Admit { .. } | State::AdmitAs { .. } => "admitting",
            State::Run { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
