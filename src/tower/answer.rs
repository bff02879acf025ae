//! What a [`BulkheadService`](super::BulkheadService) answers for a request
//! it did not run to the end: an error (the default), or with feature
//! `http` a `503` or `504` response.

use super::BoxError;
use crate::{CallTimeout, LostReason, Rejected};

/// How a [`BulkheadService`](super::BulkheadService) answers a request the
/// bulkhead turned away or cut off, and what its error type is. The
/// service's `A` type parameter; made by the layer's and the service's
/// methods, not by hand:
///
/// - [`BoxErrors`] (the default): every such request fails with a
///   [`BoxError`] that downcasts to [`Rejected`] or [`CallTimeout`], and
///   the inner service's error is boxed too.
/// - `HttpResponses` (feature `http`, from
///   [`http_responses`](super::BulkheadLayer::http_responses)): such a
///   request gets a `503` or `504` response, and the service's error is the
///   inner service's own, unboxed (`Infallible` for an axum router).
pub trait Answer<R, E> {
    /// The service's error type.
    type Error;

    /// The inner service's error, as the service returns it.
    fn inner(&self, error: E) -> Self::Error;

    /// The answer to a request the bulkhead turned away.
    fn rejected(&self, rejected: Rejected) -> Result<R, Self::Error>;

    /// The answer to a request cut off by `call_timeout`.
    fn timed_out(&self, timed_out: CallTimeout) -> Result<R, Self::Error>;

    /// The answer to a request whose permit was a lease that was lost (not
    /// for a local bulkhead's permit, which is never lost).
    fn lost(&self, reason: LostReason) -> Result<R, Self::Error>;
}

/// The default [`Answer`]: errors, boxed. See the
/// [module documentation](super#errors).
#[derive(Clone, Copy, Debug, Default)]
pub struct BoxErrors;

impl<R, E: Into<BoxError>> Answer<R, E> for BoxErrors {
    type Error = BoxError;

    #[inline]
    fn inner(&self, error: E) -> BoxError {
        error.into()
    }

    fn rejected(&self, rejected: Rejected) -> Result<R, BoxError> {
        Err(rejected.into())
    }

    fn timed_out(&self, timed_out: CallTimeout) -> Result<R, BoxError> {
        Err(timed_out.into())
    }

    fn lost(&self, reason: LostReason) -> Result<R, BoxError> {
        Err(reason.into())
    }
}

#[cfg(feature = "http")]
pub use self::http_answer::{HttpResponses, PlainResponses, Refusal, RefusalResponse};

#[cfg(feature = "http")]
mod http_answer {
    use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
    use http::{Response, StatusCode};

    use super::Answer;
    use crate::{CallTimeout, LostReason, Rejected};

    /// A request a [`BulkheadService`](crate::tower::BulkheadService) with
    /// [`http_responses`](crate::tower::BulkheadLayer::http_responses) did
    /// not run to the end, for the function that makes its response.
    #[derive(Debug, Clone, Copy)]
    #[non_exhaustive]
    pub enum Refusal<'a> {
        /// The bulkhead turned it away.
        Rejected(&'a Rejected),
        /// It ran past `call_timeout` and was dropped.
        TimedOut(&'a CallTimeout),
        /// Its permit was a lease that was lost.
        LeaseLost(&'a LostReason),
    }

    impl<'a> Refusal<'a> {
        /// What a [`BulkheadService`](crate::tower::BulkheadService)'s
        /// boxed error says, if the bulkhead stopped the request (`None`:
        /// the inner service's own error). For a client wrapped in the
        /// layer, whose errors the caller answers.
        ///
        /// # Examples
        ///
        /// ```
        /// use watertight::Bulkhead;
        /// use watertight::tower::{BoxError, Refusal};
        ///
        /// let bh = Bulkhead::builder().name("upstream").max_concurrent_calls(1).build().unwrap();
        /// let _busy = bh.try_acquire().unwrap();
        /// let error: BoxError = bh.try_acquire().unwrap_err().into();
        /// let refusal = Refusal::of(&*error).expect("the bulkhead's");
        /// assert_eq!(refusal.status(), 503);
        /// assert!(Refusal::of(&*BoxError::from("connection reset")).is_none());
        /// ```
        pub fn of(error: &'a (dyn std::error::Error + 'static)) -> Option<Refusal<'a>> {
            if let Some(rejected) = error.downcast_ref::<Rejected>() {
                Some(Refusal::Rejected(rejected))
            } else if let Some(timeout) = error.downcast_ref::<CallTimeout>() {
                Some(Refusal::TimedOut(timeout))
            } else {
                error.downcast_ref::<LostReason>().map(Refusal::LeaseLost)
            }
        }

        /// `504 Gateway Timeout` for a call cut off by `call_timeout`,
        /// `503 Service Unavailable` for everything else.
        pub fn status(&self) -> StatusCode {
            match self {
                Refusal::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
                Refusal::Rejected(_) | Refusal::LeaseLost(_) => StatusCode::SERVICE_UNAVAILABLE,
            }
        }

        /// The `Retry-After` value: a rejection's
        /// [`retry_after_secs`](Rejected::retry_after_secs), when the
        /// bulkhead has an estimate.
        pub fn retry_after_secs(&self) -> Option<u64> {
            match self {
                Refusal::Rejected(rejected) => rejected.retry_after_secs(),
                _ => None,
            }
        }

        /// The default response: [`status`](Self::status), a
        /// `Retry-After` header when there is an estimate, and the error's
        /// message as a `text/plain` body (`bulkhead "search" is full`).
        /// Build on it in a function of your own to add headers.
        pub fn response<B: From<String>>(&self) -> Response<B> {
            let text = match self {
                Refusal::Rejected(r) => r.to_string(),
                Refusal::TimedOut(t) => t.to_string(),
                Refusal::LeaseLost(reason) => reason.to_string(),
            };
            let mut response = Response::new(B::from(text));
            *response.status_mut() = self.status();
            let headers = response.headers_mut();
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Some(secs) = self.retry_after_secs() {
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
    }

    /// What makes the response to a [`Refusal`]: [`PlainResponses`] (the
    /// default), or a function `Fn(Refusal<'_>) -> http::Response<B>`.
    pub trait RefusalResponse<B> {
        /// The response to `refusal`.
        fn response(&self, refusal: Refusal<'_>) -> Response<B>;
    }

    /// The default responses: [`Refusal::response`].
    #[derive(Clone, Copy, Debug, Default)]
    pub struct PlainResponses;

    impl<B: From<String>> RefusalResponse<B> for PlainResponses {
        fn response(&self, refusal: Refusal<'_>) -> Response<B> {
            refusal.response()
        }
    }

    impl<B, F> RefusalResponse<B> for F
    where
        F: Fn(Refusal<'_>) -> Response<B>,
    {
        fn response(&self, refusal: Refusal<'_>) -> Response<B> {
            self(refusal)
        }
    }

    /// The [`Answer`] of
    /// [`http_responses`](crate::tower::BulkheadLayer::http_responses):
    /// a response for every request the bulkhead did not run to the end,
    /// made by `F`; the inner service's errors pass through unboxed.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HttpResponses<F = PlainResponses>(pub(crate) F);

    impl<B, E, F: RefusalResponse<B>> Answer<Response<B>, E> for HttpResponses<F> {
        type Error = E;

        #[inline]
        fn inner(&self, error: E) -> E {
            error
        }

        fn rejected(&self, rejected: Rejected) -> Result<Response<B>, E> {
            Ok(self.0.response(Refusal::Rejected(&rejected)))
        }

        fn timed_out(&self, timed_out: CallTimeout) -> Result<Response<B>, E> {
            Ok(self.0.response(Refusal::TimedOut(&timed_out)))
        }

        fn lost(&self, reason: LostReason) -> Result<Response<B>, E> {
            Ok(self.0.response(Refusal::LeaseLost(&reason)))
        }
    }
}
