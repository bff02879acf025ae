//! The layer: wraps services in a [`BulkheadService`] over one shared
//! bulkhead, with the readers of a request's deadline and class.

use core::fmt;

use tower_layer::Layer;

use super::{BoxErrors, BulkheadService, NoDeadline, NoPriority, OptionsFrom};
use crate::Bulkhead;
#[cfg(doc)]
use crate::CallOptions;

/// Wraps services in a [`BulkheadService`] that admits each request through
/// one shared [`Bulkhead`].
///
/// Every service the layer makes, and every clone of them, shares the
/// bulkhead (its limit, line, metrics and observer): one layer, applied to
/// each connection a server accepts, caps the requests in flight across all
/// of them.
///
/// With [`deadline_from`](Self::deadline_from), requests that carry a
/// deadline are admitted as [`Bulkhead::call_with`] admits a call with a
/// [deadline](crate::CallOptions::deadline): turned
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
pub struct BulkheadLayer<D = NoDeadline, P = NoPriority, A = BoxErrors> {
    bulkhead: Bulkhead,
    deadline: D,
    priority: P,
    answer: A,
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
            answer: BoxErrors,
        }
    }
}

impl<D, P, A> BulkheadLayer<D, P, A> {
    /// Admits each request by the deadline `deadline` reads from it
    /// (deadline-aware admission, as for a call with a
    /// [deadline](crate::CallOptions::deadline)): a request
    /// whose deadline has passed, or whose expected wait plus the expected
    /// time a call holds its permit does not fit in the time it has left,
    /// is rejected at once with
    /// [`RejectReason::WontMakeDeadline`](crate::RejectReason::WontMakeDeadline); one
    /// that is admitted waits at most until it could still finish in time
    /// (or `max_wait`, if sooner). A request it reads `None` from is
    /// admitted as without this option.
    ///
    /// `deadline` is anything that implements [`RequestDeadline`](super::RequestDeadline), most
    /// often a closure `Fn(&Req) -> Option<Instant>`; it runs in the
    /// service's `call`, before the request is admitted, so keep it cheap
    /// (read a header, an extension, a field). The crate does not depend
    /// on `http`: how a request says its deadline (a header such as gRPC's
    /// `grpc-timeout`, an extension set by a layer above) is yours to
    /// read. The deadline is read on the bulkhead's clock, as
    /// [`CallOptions::deadline`](crate::CallOptions::deadline) says.
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
    pub fn deadline_from<F>(self, deadline: F) -> BulkheadLayer<F, P, A> {
        BulkheadLayer {
            bulkhead: self.bulkhead,
            deadline,
            priority: self.priority,
            answer: self.answer,
        }
    }

    /// Admits each request with every [`CallOptions`] `options` reads from
    /// it: a deadline (as [`deadline_from`](Self::deadline_from)), a
    /// `max_wait` of its own shorter than the bulkhead's, a class (as
    /// [`priority_from`](Self::priority_from), which, if also given, names
    /// the class instead). Replaces an earlier `deadline_from`: the
    /// options' deadline is the request's.
    ///
    /// `options` is a closure `Fn(&Req) -> CallOptions`, run in the
    /// service's `call` before the request is admitted; keep it cheap.
    ///
    /// # Examples
    ///
    /// A request that says how long it may wait:
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, CallOptions, RejectReason, Rejected};
    /// use watertight::tower::BulkheadLayer;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).max_wait(Duration::from_secs(5)).build()?;
    /// let layer = BulkheadLayer::new(bh.clone())
    ///     .options_from(|ms: &u64| CallOptions::new().max_wait(Duration::from_millis(*ms)));
    /// let service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|ms: u64| async move { Ok::<_, Infallible>(ms) });
    ///
    /// let _held = bh.try_acquire()?;
    /// // Waits 10 ms of its own, not the bulkhead's 5 s.
    /// let err = service.oneshot(10).await.unwrap_err();
    /// let rejected = err.downcast_ref::<Rejected>().expect("a rejection");
    /// assert_eq!(rejected.reason(), RejectReason::Timeout);
    /// # Ok(())
    /// # }
    /// ```
    pub fn options_from<F>(self, options: F) -> BulkheadLayer<OptionsFrom<F>, P, A> {
        self.deadline_from(OptionsFrom(options))
    }

    /// Admits each request as a call of the priority class `priority`
    /// reads from it, as [`Bulkhead::call_with`] does with a
    /// [class](crate::CallOptions::class), on a bulkhead with
    /// [`priorities`](crate::BulkheadBuilder::priorities): it waits in its
    /// class's line, a seat that frees goes to the class it is owed to,
    /// and a full line sheds its least important waiters first
    /// ([`RejectReason::Displaced`](crate::RejectReason::Displaced)).
    ///
    /// `priority` is anything that implements [`RequestPriority`](super::RequestPriority), most
    /// often a closure `Fn(&Req) -> usize`; it runs in the service's
    /// `call`. A class past the last is the least important one, as for
    /// `call_with`, so a class a client sent can never make the service
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
    pub fn priority_from<F>(self, priority: F) -> BulkheadLayer<D, F, A> {
        BulkheadLayer {
            bulkhead: self.bulkhead,
            deadline: self.deadline,
            priority,
            answer: self.answer,
        }
    }

    /// Answers a request the bulkhead turns away or cuts off with an HTTP
    /// response instead of an error (feature `http`): `503 Service
    /// Unavailable` for a rejection, with a `Retry-After` header (whole
    /// seconds, rounded up, at least 1) when the bulkhead has an estimate,
    /// `504 Gateway Timeout` for a call cut off by `call_timeout`, each
    /// with the error's message as a `text/plain` body (see
    /// [`Refusal::response`](super::Refusal::response)). The inner
    /// service's own errors pass through unboxed, so over an axum router
    /// (whose error is `Infallible`) the layer needs no
    /// `HandleErrorLayer`. The inner service's response must be an
    /// `http::Response<B>` whose body `B` is `From<String>` (axum's `Body`,
    /// `Full<Bytes>`, `String`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    /// use watertight::tower::BulkheadLayer;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let bh = Bulkhead::builder().name("search").max_concurrent_calls(1).max_wait(Duration::ZERO).build().unwrap();
    /// let service = ServiceBuilder::new()
    ///     .layer(BulkheadLayer::new(bh.clone()).http_responses())
    ///     .service_fn(|_: http::Request<String>| async {
    ///         Ok::<_, Infallible>(http::Response::new(String::from("found")))
    ///     });
    /// let _busy = bh.try_acquire().unwrap();
    /// let response = service.oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(response.status(), 503);
    /// assert_eq!(response.body(), r#"bulkhead "search" is full"#);
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn http_responses(self) -> BulkheadLayer<D, P, super::HttpResponses> {
        self.answer_with(super::HttpResponses(super::PlainResponses))
    }

    /// [`http_responses`](Self::http_responses) with responses of your own:
    /// `respond` makes the response to each [`Refusal`](super::Refusal)
    /// (its [`response`](super::Refusal::response) is the default one, to
    /// build on).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use watertight::Bulkhead;
    /// use watertight::tower::{BulkheadLayer, Refusal};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).max_wait(std::time::Duration::ZERO).build().unwrap();
    /// let json = |refusal: Refusal<'_>| {
    ///     let mut response = refusal.response::<String>();
    ///     *response.body_mut() = format!(r#"{{"error":"{}"}}"#, response.status().as_u16());
    ///     response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    ///     response
    /// };
    /// let service = ServiceBuilder::new()
    ///     .layer(BulkheadLayer::new(bh.clone()).http_responses_with(json))
    ///     .service_fn(|_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(String::new())) });
    /// let _busy = bh.try_acquire().unwrap();
    /// let response = service.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(response.body(), r#"{"error":"503"}"#);
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn http_responses_with<F>(
        self,
        respond: F,
    ) -> BulkheadLayer<D, P, super::HttpResponses<F>> {
        self.answer_with(super::HttpResponses(respond))
    }

    #[cfg(feature = "http")]
    fn answer_with<B>(self, answer: B) -> BulkheadLayer<D, P, B> {
        BulkheadLayer {
            bulkhead: self.bulkhead,
            deadline: self.deadline,
            priority: self.priority,
            answer,
        }
    }

    /// The bulkhead the layer admits requests through.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }
}

impl<D, P, A> fmt::Debug for BulkheadLayer<D, P, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("bulkhead", &self.bulkhead)
            .field("deadline", &core::any::type_name::<D>())
            .field("priority", &core::any::type_name::<P>())
            .field("answer", &core::any::type_name::<A>())
            .finish()
    }
}

impl From<Bulkhead> for BulkheadLayer {
    fn from(bulkhead: Bulkhead) -> Self {
        Self::new(bulkhead)
    }
}

impl<S, D: Clone, P: Clone, A: Clone> Layer<S> for BulkheadLayer<D, P, A> {
    type Service = BulkheadService<S, D, P, A>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService {
            inner,
            bulkhead: self.bulkhead.clone(),
            deadline: self.deadline.clone(),
            priority: self.priority.clone(),
            answer: self.answer.clone(),
        }
    }
}
