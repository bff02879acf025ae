//! A tower layer for bulkheads (feature `tower`): put a [`Bulkhead`] in
//! front of any [`tower_service::Service`], in hyper, tonic and axum stacks
//! alike.
//!
//! [`BulkheadLayer`] wraps a service in a [`BulkheadService`], which takes a
//! permit **per request, inside the response future**, under the
//! bulkhead's policy (wait, wait at most `max_wait` in a line of at most
//! `max_queue`, or fail fast), calls the inner service once admitted, and
//! holds the permit until the inner response future completes or is
//! dropped. `call_timeout`, metrics and [`Observer`](crate::Observer)
//! outcomes work exactly as with [`Bulkhead::call`]: the request is a call.
//!
//! ```
//! use std::convert::Infallible;
//! use bulkhead::Bulkhead;
//! use bulkhead::tower::BulkheadLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let bh = Bulkhead::builder().name("inventory").max_concurrent_calls(10).build()?;
//! let service = ServiceBuilder::new()
//!     .layer(BulkheadLayer::new(bh.clone()))
//!     .service_fn(|sku: u32| async move { Ok::<_, Infallible>(sku * 2) });
//!
//! assert_eq!(service.oneshot(21).await?, 42);
//! assert_eq!(bh.metrics().permitted(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # No permit while idle
//!
//! [`BulkheadService::poll_ready`](tower_service::Service::poll_ready)
//! only asks the inner service whether it is ready; it never takes a
//! permit. tower's own `ConcurrencyLimit` takes its permit in `poll_ready`
//! and keeps it until the next `call`, so a service that was made ready and
//! then sits idle (a cloned client handle, a connection a server polled
//! ready but that sends no request) holds a slot that nobody uses; enough
//! idle clones starve everyone. A `BulkheadService` is always as ready as
//! its inner service, any number of clones can sit idle, and only requests
//! in flight count against the limit.
//!
//! The cost is that back-pressure does not come through `poll_ready`: a
//! request that finds the bulkhead full waits (or is rejected) in its
//! response future, as the bulkhead's policy says. Set `max_wait` and
//! `max_queue` as you would for any caller.
//!
//! # Errors
//!
//! The service's error is a [`BoxError`] (the same type as
//! `tower::BoxError`), and the reason stays typed inside it:
//!
//! | what happened | downcast to |
//! |---|---|
//! | the bulkhead turned the request away | [`Rejected`](crate::Rejected), with its [`reason()`](crate::Rejected::reason): `Full`, `Timeout`, `Closed` |
//! | the request ran past `call_timeout` and was dropped | [`CallTimeout`] |
//! | the inner service failed | the inner service's own error type, as its `Into<BoxError>` boxed it |
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use bulkhead::{Bulkhead, RejectReason, Rejected};
//! use bulkhead::tower::BulkheadLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let bh = Bulkhead::builder()
//!     .name("gpu")
//!     .max_concurrent_calls(1)
//!     .max_wait(Duration::ZERO) // fail fast
//!     .build()?;
//! let service = ServiceBuilder::new()
//!     .layer(BulkheadLayer::new(bh.clone()))
//!     .service_fn(|()| async { Ok::<_, Infallible>("done") });
//!
//! let _busy = bh.try_acquire()?; // someone else holds the only permit
//! let err = service.oneshot(()).await.unwrap_err();
//! let rejected = err.downcast_ref::<Rejected>().expect("a rejection");
//! assert_eq!(rejected.reason(), RejectReason::Full);
//! assert_eq!(err.to_string(), "bulkhead gpu is full");
//! # Ok(())
//! # }
//! ```
//!
//! A hyper server that got an error from its service closes the
//! connection; to answer `503 Service Unavailable` instead, turn the
//! rejection into a response in a layer above the bulkhead (tower's
//! `ServiceBuilder::map_result`, or axum's `HandleErrorLayer`). See
//! `examples/tower_service.rs` and the "In a tower stack" section of
//! `docs/bulkhead.md`.
//!
//! # Implementation notes
//!
//! `call` swaps a clone of the inner service in for the one that was polled
//! ready and moves the ready one into the response future (the
//! `std::mem::replace` idiom), so the service that said "ready" is the one
//! that is called, even when readiness belongs to one instance (tower's
//! `ConcurrencyLimit` and `Buffer` reserve a slot per instance). The inner
//! `call` runs inside [`Bulkhead::call`], after admission: a rejected
//! request never reaches the inner service, and the inner service's `call`
//! (where a hyper client already starts sending) counts against the limit.
//! The response future is boxed, because `Bulkhead::call` is an `async fn`;
//! that is one allocation per request.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::error::Error;

use tower_layer::Layer;
use tower_service::Service;

use crate::{Bulkhead, BulkheadError};

/// A boxed error that can cross threads: the error type of
/// [`BulkheadService`]. The same type as `tower::BoxError`.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Wraps services in a [`BulkheadService`] that admits each request through
/// one shared [`Bulkhead`].
///
/// Every service the layer makes, and every clone of them, shares the
/// bulkhead (its limit, line, metrics and observer): one layer, applied to
/// each connection a server accepts, caps the requests in flight across all
/// of them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use bulkhead::Bulkhead;
/// use bulkhead::tower::BulkheadLayer;
/// use tower::ServiceBuilder;
/// use tower::limit::ConcurrencyLimitLayer;
///
/// let bh = Bulkhead::builder()
///     .name("partner-api")
///     .max_concurrent_calls(5)
///     .max_wait(Duration::from_millis(500))
///     .max_queue(100)
///     .build()
///     .unwrap();
/// // In place of `ConcurrencyLimitLayer::new(5)`, which holds a permit in
/// // every idle service that was polled ready:
/// let _old = ServiceBuilder::new().layer(ConcurrencyLimitLayer::new(5));
/// let _new = ServiceBuilder::new().layer(BulkheadLayer::new(bh));
/// ```
#[derive(Clone, Debug)]
pub struct BulkheadLayer {
    bulkhead: Bulkhead,
}

impl BulkheadLayer {
    /// A layer that admits requests through `bulkhead`. The bulkhead is a
    /// handle: keep a clone to read its metrics, change its limit or close
    /// it while the stack runs.
    ///
    /// # Examples
    ///
    /// ```
    /// use bulkhead::Bulkhead;
    /// use bulkhead::tower::BulkheadLayer;
    ///
    /// let bh = Bulkhead::builder().name("db").max_concurrent_calls(10).build().unwrap();
    /// let layer = BulkheadLayer::new(bh.clone());
    /// assert_eq!(layer.bulkhead().name(), "db");
    /// ```
    pub fn new(bulkhead: Bulkhead) -> Self {
        Self { bulkhead }
    }

    /// The bulkhead the layer admits requests through.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl From<Bulkhead> for BulkheadLayer {
    fn from(bulkhead: Bulkhead) -> Self {
        Self::new(bulkhead)
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = BulkheadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService::new(inner, self.bulkhead.clone())
    }
}

/// A service that admits each request through a [`Bulkhead`] before
/// calling the inner service, and holds the permit until the response
/// future completes or is dropped.
///
/// It holds no permit while idle: `poll_ready` only asks the inner service
/// (see the [module documentation](self)). Requests wait, time out or are
/// rejected in the response future, under the bulkhead's policy; errors are
/// [`BoxError`]s that downcast to [`Rejected`](crate::Rejected),
/// [`CallTimeout`], or the inner service's error.
///
/// The inner service must be `Clone` (`call` moves the instance that was
/// polled ready into the response future and keeps a clone), and, with its
/// futures and the request, `Send + 'static`, as in any hyper, tonic or
/// axum stack.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use bulkhead::Bulkhead;
/// use bulkhead::tower::BulkheadService;
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
#[derive(Clone, Debug)]
pub struct BulkheadService<S> {
    inner: S,
    bulkhead: Bulkhead,
}

impl<S> BulkheadService<S> {
    /// Wraps `inner`, admitting each request through `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self { inner, bulkhead }
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

impl<S, Req> Service<Req> for BulkheadService<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    /// Ready when the inner service is; takes no permit.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // Call the instance that was polled ready; keep a fresh clone for
        // the next request (which will be polled ready in turn).
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        let bulkhead = self.bulkhead.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                let admitted = async move {
                    // Runs only once admitted, so the inner service's `call`
                    // (which may start the work) is inside the bulkhead.
                    let response = inner.call(request);
                    drop(inner);
                    response.await
                };
                match bulkhead.call(admitted).await {
                    Ok(response) => Ok(response),
                    Err(BulkheadError::Inner(e)) => Err(e.into()),
                    Err(BulkheadError::Rejected(rejected)) => Err(rejected.into()),
                    Err(BulkheadError::CallTimeout) => Err(CallTimeout {
                        name: bulkhead.name().into(),
                    }
                    .into()),
                }
            }),
        }
    }
}

/// The response future of [`BulkheadService`]: waits for a permit under
/// the bulkhead's policy, then runs the inner service's call while holding
/// it.
///
/// # Cancel safety
///
/// Dropping it while it waits leaves the bulkhead's line; dropping it while
/// the inner call runs drops that call and releases the permit (the
/// observer sees [`CallOutcome::Cancelled`](crate::CallOutcome::Cancelled)).
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send + 'static>>,
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// A request that was admitted but ran past the bulkhead's `call_timeout`:
/// the inner call was dropped and the permit released. The error of a
/// [`BulkheadService`] downcasts to it.
///
/// Whether the downstream did the work is unknown: the request may have
/// been sent before the time ran out.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use bulkhead::Bulkhead;
/// use bulkhead::tower::{BulkheadLayer, CallTimeout};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let bh = Bulkhead::builder()
///     .name("slow-partner")
///     .max_concurrent_calls(2)
///     .call_timeout(Duration::from_millis(10))
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(BulkheadLayer::new(bh.clone()))
///     .service_fn(|()| std::future::pending::<Result<(), tower::BoxError>>());
///
/// let err = service.oneshot(()).await.unwrap_err();
/// let timed_out = err.downcast_ref::<CallTimeout>().expect("a call timeout");
/// assert_eq!(timed_out.bulkhead_name(), "slow-partner");
/// assert_eq!(bh.metrics().call_timeouts(), 1);
/// assert_eq!(bh.metrics().in_flight(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTimeout {
    name: Box<str>,
}

impl CallTimeout {
    /// The name of the bulkhead whose `call_timeout` ran out.
    pub fn bulkhead_name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for CallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call timed out inside bulkhead {}", self.name)
    }
}

impl Error for CallTimeout {}
