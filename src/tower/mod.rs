//! A tower layer for bulkheads (feature `tower`): put a [`Bulkhead`](crate::Bulkhead) in
//! front of any [`tower_service::Service`], in hyper, tonic and axum stacks
//! alike.
//!
//! [`BulkheadLayer`] wraps a service in a [`BulkheadService`], which takes a
//! permit **per request, inside the response future**, under the
//! bulkhead's policy (wait, wait at most `max_wait` in a line of at most
//! `max_queue`, or fail fast), calls the inner service once admitted, and
//! holds the permit until the inner response future completes or is
//! dropped. `call_timeout`, metrics and [`Observer`](crate::Observer)
//! outcomes work exactly as with [`Bulkhead::call`](crate::Bulkhead::call): the request is a call.
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
//! [`Bulkhead::call_with`](crate::Bulkhead::call_with) admits a call with a deadline: give the layer a function that
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
//! # Every option of a call
//!
//! [`BulkheadLayer::options_from`] reads a request's whole
//! [`CallOptions`](crate::CallOptions): a deadline, a `max_wait` of its
//! own shorter than the bulkhead's, a class. `deadline_from` and
//! `priority_from` are its short forms.
//!
//! # Priority classes
//!
//! On a bulkhead with [`priorities`](crate::BulkheadBuilder::priorities),
//! [`BulkheadLayer::priority_from`] reads each request's class (a header,
//! an extension) and admits it as [`Bulkhead::call_with`](crate::Bulkhead::call_with) does a call with a class; without it,
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
//! assert_eq!(err.to_string(), r#"bulkhead "gpu" is full"#);
//! # Ok(())
//! # }
//! ```
//!
//! A hyper server that got an error from its service closes the
//! connection, and axum wants services that cannot fail. With the `http`
//! feature, [`BulkheadLayer::http_responses`] answers instead: `503` (with
//! `Retry-After`) for a rejection, `504` for a call timeout, and the inner
//! service's errors pass through unboxed (the service's `A` type
//! parameter, an [`Answer`], decides). See the
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
//! does what [`Bulkhead::call`](crate::Bulkhead::call) does, with nothing boxed: admission (a permit
//! taken at once, else the wait in the bounded line, raced against an
//! inline `max_wait` sleep), then the inner call under `call_timeout`, with
//! the permit's guard reporting to the observers. `Bulkhead::call` borrows
//! its bulkhead, which a `'static` future cannot do; this one owns a handle
//! of it instead, waits with the semaphore's owned acquire, and hands the
//! bulkhead's policy to the wait and the timed call at each poll rather
//! than storing a borrow of it. With the bundled timers a request
//! allocates nothing of its own on any path, apart from the boxed error of
//! one that fails.

mod answer;
mod deadline;
mod future;
mod layer;
mod request;
mod service;

/// The error a request cut off by `call_timeout` downcasts to.
pub use crate::CallTimeout;
pub use answer::{Answer, BoxErrors};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use answer::{HttpResponses, PlainResponses, Refusal, RefusalResponse};
pub use deadline::{
    Deadline, DeadlineExtension, Earliest, GrpcTimeout, GrpcTimeoutHeader, parse_grpc_timeout,
};
pub use future::ResponseFuture;
pub use layer::BulkheadLayer;
pub use request::{NoDeadline, NoPriority, OptionsFrom, RequestDeadline, RequestPriority};
pub use service::BulkheadService;

use std::error::Error;

/// A boxed error that can cross threads: the error type of
/// [`BulkheadService`]. The same type as `tower::BoxError`.
pub type BoxError = Box<dyn Error + Send + Sync>;
