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
//! use watertight::Bulkhead;
//! use watertight::tower::BulkheadLayer;
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
//! # Deadlines
//!
//! A request that carries its deadline can be admitted as
//! [`Bulkhead::call_by`] admits a call: give the layer a function that
//! reads it, [`BulkheadLayer::deadline_from`]. A request that cannot make
//! its deadline (the wait it can expect plus the time a call holds its
//! permit does not fit in the time it has left) is turned away at once
//! with `WontMakeDeadline`, before it takes a seat in the line; one that
//! is admitted waits no longer than it could still finish in time. The
//! function runs in `call` (`poll_ready` has no request to read); a layer
//! without it reads nothing and pays nothing.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::{Duration, Instant};
//! use watertight::Bulkhead;
//! use watertight::tower::BulkheadLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// A request that says how long its caller waits for the answer.
//! struct Lookup {
//!     patience: Duration,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let bh = Bulkhead::builder()
//!     .name("catalog")
//!     .max_concurrent_calls(8)
//!     .max_wait(Duration::from_secs(1))
//!     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
//!     .build()?;
//! let service = ServiceBuilder::new()
//!     .layer(
//!         BulkheadLayer::new(bh.clone())
//!             .deadline_from(|r: &Lookup| Some(Instant::now() + r.patience)),
//!     )
//!     .service_fn(|_: Lookup| async { Ok::<_, Infallible>("found") });
//!
//! let found = service.oneshot(Lookup { patience: Duration::from_millis(300) }).await?;
//! assert_eq!(found, "found");
//! # Ok(())
//! # }
//! ```
//!
//! Readers for the common cases are ready-made: [`GrpcTimeout`] (gRPC's
//! `grpc-timeout` header, parsed by [`parse_grpc_timeout`]),
//! [`DeadlineExtension`] (a [`Deadline`] request extension an outer layer
//! set) and [`Earliest`] of two readers. With feature `http` they read
//! `http::Request`s (hyper's, tonic's, axum's):
//!
//! ```
//! # #[cfg(feature = "http")] {
//! use watertight::Bulkhead;
//! use watertight::tower::{BulkheadLayer, DeadlineExtension, Earliest, GrpcTimeout};
//!
//! let bh = Bulkhead::builder().name("search").max_concurrent_calls(8).build().unwrap();
//! let layer = BulkheadLayer::new(bh).deadline_from(Earliest(GrpcTimeout, DeadlineExtension));
//! # let _ = layer;
//! # }
//! ```
//!
//! `examples/overload_http.rs` reads the deadline from an HTTP header and
//! drives a hyper server past its capacity, with and without these
//! options; see the [overload guide](crate::guide::overload#measured-an-http-server).
//!
//! # Priority classes
//!
//! On a bulkhead with [`priorities`](crate::BulkheadBuilder::priorities),
//! [`BulkheadLayer::priority_from`] reads each request's class (a header,
//! an extension) and admits it as [`Bulkhead::call_as`] does; without it,
//! requests are plain calls, which on such a bulkhead never wait.
//!
//! # Errors
//!
//! The service's error is a [`BoxError`] (the same type as
//! `tower::BoxError`), and the reason stays typed inside it:
//!
//! | what happened | downcast to |
//! |---|---|
//! | the bulkhead turned the request away | [`Rejected`](crate::Rejected), with its [`reason()`](crate::Rejected::reason): `Full`, `Timeout`, `Closed`, `QueueDelay` (with `queue_delay`), `WontMakeDeadline` (with [`deadline_from`](BulkheadLayer::deadline_from)), `Displaced` (with [`priority_from`](BulkheadLayer::priority_from)) |
//! | the request ran past `call_timeout` and was dropped | [`CallTimeout`] |
//! | the inner service failed | the inner service's own error type, as its `Into<BoxError>` boxed it |
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use watertight::{Bulkhead, RejectReason, Rejected};
//! use watertight::tower::BulkheadLayer;
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
//! `examples/tower_service.rs` and the
//! [bulkhead guide](crate::guide::bulkhead#in-a-tower-stack).
//!
//! # Implementation notes
//!
//! `call` swaps a clone of the inner service in for the one that was polled
//! ready and moves the ready one into the response future (the
//! `std::mem::replace` idiom), so the service that said "ready" is the one
//! that is called, even when readiness belongs to one instance (tower's
//! `ConcurrencyLimit` and `Buffer` reserve a slot per instance). The inner
//! `call` is made only once the request is admitted: a rejected request
//! never reaches the inner service, and the inner service's `call` (where a
//! hyper client already starts sending) counts against the limit.
//!
//! The response future, [`ResponseFuture`], is a named state machine that
//! does what [`Bulkhead::call`] does, with nothing boxed: admission (a permit
//! taken at once, else the wait in the bounded line, raced against an
//! inline `max_wait` sleep), then the inner call under `call_timeout`, with
//! the permit's guard reporting to the observers. `Bulkhead::call` borrows
//! its bulkhead, which a `'static` future cannot do; this one owns a handle
//! of it instead, waits with the semaphore's owned acquire, and hands the
//! bulkhead's policy to the wait and the timed call at each poll rather
//! than storing a borrow of it. With the bundled timers a request
//! allocates nothing of its own on any path, apart from the boxed error of
//! one that fails.

mod deadline;

pub use deadline::{
    Deadline, DeadlineExtension, Earliest, GrpcTimeout, GrpcTimeoutHeader, parse_grpc_timeout,
};

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::error::Error;
use std::time::Instant;

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::bulkhead::policy::Traced;
use crate::bulkhead::run::Running;
use crate::bulkhead::{Admission, AdmissionAs};
use crate::{Bulkhead, BulkheadError, BulkheadPermit};

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
/// With [`deadline_from`](Self::deadline_from), requests that carry a
/// deadline are admitted as [`Bulkhead::call_by`] admits a call: turned
/// away at once if they cannot make it, and waiting no longer than they
/// still could. The type parameter `D` is what reads a request's deadline;
/// the default, [`NoDeadline`], reads none and costs nothing.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::Bulkhead;
/// use watertight::tower::BulkheadLayer;
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
#[derive(Clone)]
pub struct BulkheadLayer<D = NoDeadline, P = NoPriority> {
    bulkhead: Bulkhead,
    deadline: D,
    priority: P,
}

impl BulkheadLayer {
    /// A layer that admits requests through `bulkhead`. The bulkhead is a
    /// handle: keep a clone to read its metrics, change its limit or close
    /// it while the stack runs.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    /// use watertight::tower::BulkheadLayer;
    ///
    /// let bh = Bulkhead::builder().name("db").max_concurrent_calls(10).build().unwrap();
    /// let layer = BulkheadLayer::new(bh.clone());
    /// assert_eq!(layer.bulkhead().name(), "db");
    /// ```
    pub fn new(bulkhead: Bulkhead) -> Self {
        Self {
            bulkhead,
            deadline: NoDeadline,
            priority: NoPriority,
        }
    }
}

impl<D, P> BulkheadLayer<D, P> {
    /// Admits each request by the deadline `deadline` reads from it
    /// (deadline-aware admission, as [`Bulkhead::call_by`]): a request
    /// whose deadline has passed, or whose expected wait plus the expected
    /// time a call holds its permit does not fit in the time it has left,
    /// is rejected at once with
    /// [`RejectReason::WontMakeDeadline`](crate::RejectReason::WontMakeDeadline); one
    /// that is admitted waits at most until it could still finish in time
    /// (or `max_wait`, if sooner). A request it reads `None` from is
    /// admitted as without this option.
    ///
    /// `deadline` is anything that implements [`RequestDeadline`], most
    /// often a closure `Fn(&Req) -> Option<Instant>`; it runs in the
    /// service's `call`, before the request is admitted, so keep it cheap
    /// (read a header, an extension, a field). The crate does not depend
    /// on `http`: how a request says its deadline (a header such as gRPC's
    /// `grpc-timeout`, an extension set by a layer above) is yours to
    /// read. The deadline is read on the bulkhead's clock, as
    /// [`call_by`](Bulkhead::call_by)'s.
    ///
    /// Without this option the layer reads nothing: the default
    /// [`NoDeadline`] always answers `None` and the check is compiled out.
    ///
    /// # Examples
    ///
    /// A deadline carried as milliseconds from now in a header (here on a
    /// plain tuple standing for a request):
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::{Duration, Instant};
    /// use watertight::{Bulkhead, RejectReason, Rejected};
    /// use watertight::tower::BulkheadLayer;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// // (deadline in ms from now, body); an HTTP server would read a
    /// // header of an `http::Request` instead.
    /// type Req = (Option<u64>, &'static str);
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// let bh = Bulkhead::builder().name("search").max_concurrent_calls(4).build()?;
    /// let layer = BulkheadLayer::new(bh.clone()).deadline_from(|req: &Req| {
    ///     req.0.map(|ms| Instant::now() + Duration::from_millis(ms))
    /// });
    /// let service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|(_, q): Req| async move { Ok::<_, Infallible>(q.len()) });
    ///
    /// // Time to spare, or no deadline at all: admitted.
    /// assert_eq!(service.clone().oneshot((Some(500), "rust")).await?, 4);
    /// assert_eq!(service.clone().oneshot((None, "tower")).await?, 5);
    ///
    /// // No time left: turned away before it reaches the service.
    /// let err = service.oneshot((Some(0), "late")).await.unwrap_err();
    /// let rejected = err.downcast_ref::<Rejected>().expect("a rejection");
    /// assert_eq!(rejected.reason(), RejectReason::WontMakeDeadline);
    /// assert_eq!(bh.metrics().rejected_deadline(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn deadline_from<F>(self, deadline: F) -> BulkheadLayer<F, P> {
        BulkheadLayer {
            bulkhead: self.bulkhead,
            deadline,
            priority: self.priority,
        }
    }

    /// Admits each request as a call of the priority class `priority`
    /// reads from it, as [`Bulkhead::call_as`] does, on a bulkhead with
    /// [`priorities`](crate::BulkheadBuilder::priorities): it waits in its
    /// class's line, a seat that frees goes to the class it is owed to,
    /// and a full line sheds its least important waiters first
    /// ([`RejectReason::Displaced`](crate::RejectReason::Displaced)).
    ///
    /// `priority` is anything that implements [`RequestPriority`], most
    /// often a closure `Fn(&Req) -> usize`; it runs in the service's
    /// `call`. A class past the last is the least important one, as for
    /// `call_as`, so a class a client sent can never make the service
    /// panic. On a bulkhead without classes every request is a plain
    /// call and the class is ignored; without this option, a request is a
    /// plain call, which on a bulkhead with classes never waits (see
    /// [`priorities`](crate::BulkheadBuilder::priorities)). With
    /// [`deadline_from`](Self::deadline_from) too, a classed request's
    /// expected wait counts the waiters served before it (its class and
    /// the more important ones): it is rejected at once if it cannot make
    /// its deadline, and waits at most until it could still finish.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use watertight::Bulkhead;
    /// use watertight::tower::BulkheadLayer;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// // (class, body); an HTTP server would read a header instead.
    /// type Req = (usize, &'static str);
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// let bh = Bulkhead::builder().max_concurrent_calls(4).priorities(&[3, 1]).build()?;
    /// let layer = BulkheadLayer::new(bh.clone()).priority_from(|req: &Req| req.0);
    /// let service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|(_, q): Req| async move { Ok::<_, Infallible>(q.len()) });
    /// assert_eq!(service.oneshot((0, "checkout")).await?, 8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn priority_from<F>(self, priority: F) -> BulkheadLayer<D, F> {
        BulkheadLayer {
            bulkhead: self.bulkhead,
            deadline: self.deadline,
            priority,
        }
    }

    /// The bulkhead the layer admits requests through.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<D, P> fmt::Debug for BulkheadLayer<D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("bulkhead", &self.bulkhead)
            .field("deadline", &core::any::type_name::<D>())
            .field("priority", &core::any::type_name::<P>())
            .finish()
    }
}

impl From<Bulkhead> for BulkheadLayer {
    fn from(bulkhead: Bulkhead) -> Self {
        Self::new(bulkhead)
    }
}

impl<S, D: Clone, P: Clone> Layer<S> for BulkheadLayer<D, P> {
    type Service = BulkheadService<S, D, P>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService {
            inner,
            bulkhead: self.bulkhead.clone(),
            deadline: self.deadline.clone(),
            priority: self.priority.clone(),
        }
    }
}

/// Reads the priority class of a request, for a layer or service with
/// [`priority_from`](BulkheadLayer::priority_from).
///
/// Implemented by every `Fn(&Req) -> usize` and by [`NoPriority`].
///
/// # Examples
///
/// ```
/// use watertight::tower::RequestPriority;
///
/// #[derive(Clone)]
/// struct ByTier;
///
/// impl RequestPriority<&'static str> for ByTier {
///     fn priority(&self, tier: &&'static str) -> Option<usize> {
///         Some(if *tier == "paid" { 0 } else { 1 })
///     }
/// }
///
/// assert_eq!(ByTier.priority(&"paid"), Some(0));
/// ```
pub trait RequestPriority<Req> {
    /// The priority class of `request` (0 the most important), or `None`
    /// for a plain call.
    fn priority(&self, request: &Req) -> Option<usize>;
}

impl<Req, F> RequestPriority<Req> for F
where
    F: Fn(&Req) -> usize,
{
    #[inline]
    fn priority(&self, request: &Req) -> Option<usize> {
        Some(self(request))
    }
}

/// The [`RequestPriority`] of a layer without
/// [`priority_from`](BulkheadLayer::priority_from): every request is a
/// plain call, and nothing is read.
///
/// # Examples
///
/// ```
/// use watertight::tower::{NoPriority, RequestPriority};
///
/// assert_eq!(NoPriority.priority(&"any request"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoPriority;

impl<Req> RequestPriority<Req> for NoPriority {
    #[inline(always)]
    fn priority(&self, _request: &Req) -> Option<usize> {
        None
    }
}

/// Reads the deadline a request carries, for a layer or service with
/// [`deadline_from`](BulkheadLayer::deadline_from).
///
/// Implemented by every `Fn(&Req) -> Option<Instant>` and by
/// [`NoDeadline`]; implement it for a type of your own to name the
/// service's type (a closure cannot be named).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::RequestDeadline;
///
/// /// A job that says how long it may take in all.
/// struct Job {
///     budget: Duration,
/// }
///
/// #[derive(Clone)]
/// struct JobBudget;
///
/// impl RequestDeadline<Job> for JobBudget {
///     fn deadline(&self, job: &Job) -> Option<Instant> {
///         Some(Instant::now() + job.budget)
///     }
/// }
///
/// let by = JobBudget.deadline(&Job { budget: Duration::from_secs(1) });
/// assert!(by.is_some());
/// ```
pub trait RequestDeadline<Req> {
    /// The time by which `request` must be done, or `None` if it carries
    /// no deadline (it is admitted as without one).
    fn deadline(&self, request: &Req) -> Option<Instant>;
}

impl<Req, F> RequestDeadline<Req> for F
where
    F: Fn(&Req) -> Option<Instant>,
{
    #[inline]
    fn deadline(&self, request: &Req) -> Option<Instant> {
        self(request)
    }
}

/// The [`RequestDeadline`] of a layer without
/// [`deadline_from`](BulkheadLayer::deadline_from): no request carries a
/// deadline, and nothing is read.
///
/// # Examples
///
/// ```
/// use watertight::tower::{NoDeadline, RequestDeadline};
///
/// assert_eq!(NoDeadline.deadline(&"any request"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoDeadline;

impl<Req> RequestDeadline<Req> for NoDeadline {
    #[inline(always)]
    fn deadline(&self, _request: &Req) -> Option<Instant> {
        None
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
/// [`CallTimeout`], or the inner service's error. `D` reads each request's
/// deadline, if it has one (see [`BulkheadLayer::deadline_from`]).
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
pub struct BulkheadService<S, D = NoDeadline, P = NoPriority> {
    inner: S,
    bulkhead: Bulkhead,
    deadline: D,
    priority: P,
}

impl<S> BulkheadService<S> {
    /// Wraps `inner`, admitting each request through `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self {
            inner,
            bulkhead,
            deadline: NoDeadline,
            priority: NoPriority,
        }
    }
}

impl<S, D, P> BulkheadService<S, D, P> {
    /// Admits each request by the deadline `deadline` reads from it, as
    /// [`BulkheadLayer::deadline_from`] does.
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
    pub fn deadline_from<F>(self, deadline: F) -> BulkheadService<S, F, P> {
        BulkheadService {
            inner: self.inner,
            bulkhead: self.bulkhead,
            deadline,
            priority: self.priority,
        }
    }

    /// Admits each request as a call of the priority class `priority`
    /// reads from it, as [`BulkheadLayer::priority_from`] does.
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
    pub fn priority_from<F>(self, priority: F) -> BulkheadService<S, D, F> {
        BulkheadService {
            inner: self.inner,
            bulkhead: self.bulkhead,
            deadline: self.deadline,
            priority,
        }
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

impl<S: fmt::Debug, D, P> fmt::Debug for BulkheadService<S, D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadService")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .field("deadline", &core::any::type_name::<D>())
            .field("priority", &core::any::type_name::<P>())
            .finish()
    }
}

impl<S, D, P, Req> Service<Req> for BulkheadService<S, D, P>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    D: RequestDeadline<Req>,
    P: RequestPriority<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    /// Ready when the inner service is; takes no permit.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        // Read before the request moves into the future; `NoDeadline`
        // reads nothing.
        let by = self.deadline.deadline(&request);
        // `NoPriority` reads nothing, and the test is compiled out.
        let classed = self
            .priority
            .priority(&request)
            .and_then(|class| self.bulkhead.admission_as(class, by));
        // Call the instance that was polled ready; keep a fresh clone for
        // the next request (which will be polled ready in turn).
        let clone = self.inner.clone();
        let inner = core::mem::replace(&mut self.inner, clone);
        let call = Some((inner, request));
        ResponseFuture {
            state: match classed {
                None => State::Admit {
                    admission: self.bulkhead.admission(by),
                    call,
                },
                Some(admission) => State::AdmitAs { admission, call },
            },
        }
    }
}

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
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req, S::Future>,
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

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let (admitted, call) = match state.as_mut().project() {
                StateProj::Admit { admission, call } => (ready!(admission.poll(cx)), call),
                StateProj::AdmitAs { admission, call } => (ready!(admission.poll(cx)), call),
                StateProj::Run { running, permit } => {
                    let (result, outcome) = ready!(running.poll_with(cx, permit.policy()));
                    permit.set_outcome(outcome);
                    let result = result.map_err(|e| match e {
                        BulkheadError::Inner(e) => e.into(),
                        BulkheadError::Rejected(rejected) => rejected.into(),
                        BulkheadError::CallTimeout => CallTimeout {
                            name: permit.bulkhead_name().into(),
                        }
                        .into(),
                        // A local permit is never lost; kept for the match.
                        BulkheadError::LeaseLost(reason) => reason.into(),
                    });
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
                    return Poll::Ready(Err(rejected.into()));
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

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
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
/// use watertight::Bulkhead;
/// use watertight::tower::{BulkheadLayer, CallTimeout};
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
