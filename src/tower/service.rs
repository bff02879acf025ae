//! The service: admits each request through the bulkhead.

use core::fmt;
use core::task::{Context, Poll};

use tower_service::Service;

use super::{
    Answer, BoxErrors, NoDeadline, NoPriority, OptionsFrom, RequestDeadline, RequestPriority,
    ResponseFuture,
};
use crate::Bulkhead;
use crate::bulkhead::Admissions;

/// A service that admits each request through a [`Bulkhead`] before
/// calling the inner service, and holds the permit until the response
/// future completes or is dropped.
///
/// It holds no permit while idle: `poll_ready` only asks the inner service
/// (see the [module documentation](super)). Requests wait, time out or are
/// rejected in the response future, under the bulkhead's policy; errors are
/// [`BoxError`](super::BoxError)s that downcast to [`Rejected`](crate::Rejected),
/// [`CallTimeout`](super::CallTimeout), or the inner service's error (with
/// [`BulkheadLayer::http_responses`](super::BulkheadLayer::http_responses),
/// rejections and timeouts are responses instead: `A` decides, see
/// [`Answer`]; build the service with that layer for it). `D` reads each request's
/// deadline, if it has one (see [`BulkheadLayer::deadline_from`](super::BulkheadLayer::deadline_from)).
///
/// The inner service must be `Clone` (`call` moves the instance that was
/// polled ready into the response future and keeps a clone). The response
/// future is `Send` and `'static` whenever the inner service, its future
/// and the request are, as in any hyper, tonic or axum stack.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use watertight::Bulkhead;
/// use watertight::tower::BulkheadService;
/// use tower::{Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let bh = Bulkhead::builder().max_concurrent_calls(1).build()?;
/// let echo = tower::service_fn(|s: String| async move { Ok::<_, Infallible>(s) });
/// let mut service = BulkheadService::new(echo, bh.clone());
///
/// // Ready, idle, and holding nothing.
/// service.ready().await?;
/// assert_eq!(bh.metrics().in_flight(), 0);
///
/// let reply = service.call("hello".to_owned()).await?;
/// assert_eq!(reply, "hello");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct BulkheadService<S, D = NoDeadline, P = NoPriority, A = BoxErrors> {
    pub(super) inner: S,
    pub(super) bulkhead: Bulkhead,
    pub(super) deadline: D,
    pub(super) priority: P,
    pub(super) answer: A,
}

impl<S> BulkheadService<S> {
    /// Wraps `inner`, admitting each request through `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self {
            inner,
            bulkhead,
            deadline: NoDeadline,
            priority: NoPriority,
            answer: BoxErrors,
        }
    }
}

impl<S, D, P, A> BulkheadService<S, D, P, A> {
    /// Admits each request by the deadline `deadline` reads from it, as
    /// [`BulkheadLayer::deadline_from`](super::BulkheadLayer::deadline_from) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Instant;
    /// use watertight::{Bulkhead, RejectReason, Rejected};
    /// use watertight::tower::BulkheadService;
    /// use tower::{ServiceExt, service_fn};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let echo = service_fn(|by: Instant| async move { Ok::<_, Infallible>(by) });
    /// // The request is its own deadline.
    /// let service = BulkheadService::new(echo, bh).deadline_from(|by: &Instant| Some(*by));
    ///
    /// let err = service.oneshot(Instant::now()).await.unwrap_err();
    /// let rejected = err.downcast_ref::<Rejected>().unwrap();
    /// assert_eq!(rejected.reason(), RejectReason::WontMakeDeadline);
    /// # });
    /// ```
    pub fn deadline_from<F>(self, deadline: F) -> BulkheadService<S, F, P, A> {
        BulkheadService {
            inner: self.inner,
            bulkhead: self.bulkhead,
            deadline,
            priority: self.priority,
            answer: self.answer,
        }
    }

    /// Admits each request as a call of the priority class `priority`
    /// reads from it, as [`BulkheadLayer::priority_from`](super::BulkheadLayer::priority_from) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use watertight::Bulkhead;
    /// use watertight::tower::BulkheadService;
    /// use tower::{ServiceExt, service_fn};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).priorities(&[1, 1]).build().unwrap();
    /// let echo = service_fn(|class: usize| async move { Ok::<_, Infallible>(class) });
    /// // The request is its own class.
    /// let service = BulkheadService::new(echo, bh).priority_from(|class: &usize| *class);
    /// assert_eq!(service.oneshot(1).await.unwrap(), 1);
    /// # });
    /// ```
    pub fn priority_from<F>(self, priority: F) -> BulkheadService<S, D, F, A> {
        BulkheadService {
            inner: self.inner,
            bulkhead: self.bulkhead,
            deadline: self.deadline,
            priority,
            answer: self.answer,
        }
    }

    /// Admits each request with the [`CallOptions`](crate::CallOptions) `options` reads from
    /// it, as [`BulkheadLayer::options_from`](super::BulkheadLayer::options_from) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, CallOptions};
    /// use watertight::tower::BulkheadService;
    /// use tower::{ServiceExt, service_fn};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let echo = service_fn(|ms: u64| async move { Ok::<_, Infallible>(ms) });
    /// // The request is how long it may wait, in milliseconds.
    /// let service = BulkheadService::new(echo, bh)
    ///     .options_from(|ms: &u64| CallOptions::new().max_wait(Duration::from_millis(*ms)));
    /// assert_eq!(service.oneshot(20).await.unwrap(), 20);
    /// # });
    /// ```
    pub fn options_from<F>(self, options: F) -> BulkheadService<S, OptionsFrom<F>, P, A> {
        self.deadline_from(OptionsFrom(options))
    }

    /// The bulkhead requests are admitted through.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, D, P, A> fmt::Debug for BulkheadService<S, D, P, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadService")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .field("deadline", &core::any::type_name::<D>())
            .field("priority", &core::any::type_name::<P>())
            .field("answer", &core::any::type_name::<A>())
            .finish()
    }
}

impl<S, D, P, A, Req> Service<Req> for BulkheadService<S, D, P, A>
where
    S: Service<Req> + Clone,
    D: RequestDeadline<Req>,
    P: RequestPriority<Req>,
    A: Answer<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = A::Error;
    type Future = ResponseFuture<S, Req, A>;

    /// Ready when the inner service is; takes no permit.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let answer = &self.answer;
        self.inner.poll_ready(cx).map_err(|e| answer.inner(e))
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        // Read before the request moves into the future; `NoDeadline`
        // reads nothing.
        let mut options = self.deadline.options(&request);
        // `NoPriority` reads nothing, and the test is compiled out.
        if let Some(class) = self.priority.priority(&request) {
            options = options.class(class);
        }
        let admission = self.bulkhead.admission(options);
        // Call the instance that was polled ready; keep a fresh clone for
        // the next request (which will be polled ready in turn).
        let clone = self.inner.clone();
        let inner = core::mem::replace(&mut self.inner, clone);
        let call = Some((inner, request));
        let answer = self.answer.clone();
        match admission {
            Admissions::Plain(admission) => ResponseFuture::admit(admission, call, answer),
            Admissions::Classed(classed) => ResponseFuture::admit_as(classed, call, answer),
        }
    }
}
