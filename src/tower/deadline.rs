//! Ready-made [`RequestDeadline`]s: gRPC's `grpc-timeout` header and a
//! [`Deadline`] request extension (feature `http`), the earliest of two
//! readers, and the `grpc-timeout` parser itself.

use std::time::{Duration, Instant};

use super::RequestDeadline;
use crate::timer::Clock;

/// The most digits a `grpc-timeout` value may have (gRPC's
/// "TimeoutValue → positive integer as ASCII string of at most 8 digits").
const GRPC_TIMEOUT_DIGITS: usize = 8;

/// Parses a `grpc-timeout` header value: 1 to 8 ASCII digits, then one
/// unit, `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds),
/// `u` (microseconds) or `n` (nanoseconds), as gRPC over HTTP/2 defines
/// it. Anything else (empty, no digits, more than 8, a sign, spaces, any
/// other unit or trailing bytes) is `None`, never a panic. `0` is
/// accepted: a timeout already spent, which deadline-aware admission
/// turns away at once.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::tower::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
/// assert_eq!(parse_grpc_timeout(b"123456789S"), None); // 9 digits
/// assert_eq!(parse_grpc_timeout(b"5s"), None); // `s` is no unit
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty()
        || digits.len() > GRPC_TIMEOUT_DIGITS
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    // At most 8 digits: below 10^8, no overflow in a u64.
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The deadline `timeout` from now on the clock a bulkhead with the
/// default timer reads (tokio's inside a tokio runtime, so a paused test
/// clock too; else the system's), or `None` if it is too far to
/// represent (as good as no deadline).
fn from_now(timeout: Duration) -> Option<Instant> {
    Clock::Auto.now().checked_add(timeout)
}

/// Reads gRPC's `grpc-timeout` request header (see
/// [`parse_grpc_timeout`]) as the deadline that much after the request
/// is read, for [`deadline_from`](super::BulkheadLayer::deadline_from).
/// A request without the header, or with a malformed one, carries no
/// deadline and is admitted as without the option.
///
/// The deadline is read on the clock a bulkhead with the default timer
/// uses: tokio's inside a tokio runtime (a paused test clock included),
/// else the system's. With a timer of your own whose clock differs,
/// write the reader yourself.
///
/// Implemented for [`http::Request`] (feature `http`) and for any
/// [`GrpcTimeoutHeader`], so a request type of your own can carry it too.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::{GrpcTimeout, RequestDeadline};
///
/// # #[cfg(feature = "http")] {
/// let request = http::Request::builder()
///     .header("grpc-timeout", "300m")
///     .body(())
///     .unwrap();
/// let by = GrpcTimeout.deadline(&request).unwrap();
/// assert!(by <= Instant::now() + Duration::from_millis(300));
///
/// let malformed = http::Request::builder().header("grpc-timeout", "soon").body(()).unwrap();
/// assert_eq!(GrpcTimeout.deadline(&malformed), None);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcTimeout;

/// A request that may carry a `grpc-timeout` value, for [`GrpcTimeout`]:
/// implement it for a request type of your own (with feature `http`,
/// [`http::Request`] has it).
///
/// # Examples
///
/// ```
/// use watertight::tower::{GrpcTimeout, GrpcTimeoutHeader, RequestDeadline};
///
/// struct Frame {
///     timeout: Option<String>,
/// }
///
/// impl GrpcTimeoutHeader for Frame {
///     fn grpc_timeout(&self) -> Option<&[u8]> {
///         self.timeout.as_deref().map(str::as_bytes)
///     }
/// }
///
/// assert!(GrpcTimeout.deadline(&Frame { timeout: Some("5S".into()) }).is_some());
/// assert!(GrpcTimeout.deadline(&Frame { timeout: None }).is_none());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no `grpc-timeout` header that watertight can read",
    label = "no `GrpcTimeoutHeader` for this request type",
    note = "for `http::Request`, enable the `http` feature of watertight",
    note = "for a request type of your own, implement `watertight::tower::GrpcTimeoutHeader` for it"
)]
pub trait GrpcTimeoutHeader {
    /// The raw `grpc-timeout` value, if the request has one.
    fn grpc_timeout(&self) -> Option<&[u8]>;
}

impl<Req: GrpcTimeoutHeader> RequestDeadline<Req> for GrpcTimeout {
    #[inline]
    fn deadline(&self, request: &Req) -> Option<Instant> {
        from_now(parse_grpc_timeout(request.grpc_timeout()?)?)
    }
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl<B> GrpcTimeoutHeader for http::Request<B> {
    #[inline]
    fn grpc_timeout(&self) -> Option<&[u8]> {
        Some(self.headers().get("grpc-timeout")?.as_bytes())
    }
}

/// A request extension that says when the request must be done: set by an
/// outer layer (one that read the caller's deadline from a header, a
/// token, a route's budget), read by [`DeadlineExtension`].
///
/// The instant is on the bulkhead's clock (see
/// [`CallOptions::deadline`](crate::CallOptions::deadline)).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::Deadline;
///
/// # #[cfg(feature = "http")] {
/// let mut request = http::Request::new(());
/// request
///     .extensions_mut()
///     .insert(Deadline(Instant::now() + Duration::from_secs(2)));
/// assert!(request.extensions().get::<Deadline>().is_some());
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(pub Instant);

/// Reads the [`Deadline`] extension of an [`http::Request`] (feature
/// `http`), for [`deadline_from`](super::BulkheadLayer::deadline_from). A
/// request without one carries no deadline.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::{Deadline, DeadlineExtension, RequestDeadline};
///
/// # #[cfg(feature = "http")] {
/// let by = Instant::now() + Duration::from_secs(2);
/// let mut request = http::Request::new(());
/// assert_eq!(DeadlineExtension.deadline(&request), None);
/// request.extensions_mut().insert(Deadline(by));
/// assert_eq!(DeadlineExtension.deadline(&request), Some(by));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadlineExtension;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl<B> RequestDeadline<http::Request<B>> for DeadlineExtension {
    #[inline]
    fn deadline(&self, request: &http::Request<B>) -> Option<Instant> {
        request.extensions().get::<Deadline>().map(|d| d.0)
    }
}

/// Two readers at once: a request's deadline is the earlier of the two
/// that carry one (for example a [`Deadline`] an outer layer set and the
/// client's `grpc-timeout`), `None` if neither does.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::{Earliest, RequestDeadline};
///
/// let soon = Instant::now() + Duration::from_millis(100);
/// let later = soon + Duration::from_secs(1);
/// let both = Earliest(move |_: &()| Some(later), move |_: &()| Some(soon));
/// assert_eq!(both.deadline(&()), Some(soon));
/// let one = Earliest(|_: &()| None, move |_: &()| Some(later));
/// assert_eq!(one.deadline(&()), Some(later));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Earliest<A, B>(pub A, pub B);

impl<Req, A, B> RequestDeadline<Req> for Earliest<A, B>
where
    A: RequestDeadline<Req>,
    B: RequestDeadline<Req>,
{
    #[inline]
    fn deadline(&self, request: &Req) -> Option<Instant> {
        match (self.0.deadline(request), self.1.deadline(request)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_too_far_to_represent_is_none() {
        // The largest timeout is about 11,400 years: representable on
        // common platforms; `from_now` saturates to `None` past `Instant`.
        let far = Duration::from_secs(u64::MAX);
        assert_eq!(from_now(far), None);
        assert!(from_now(Duration::from_secs(99_999_999 * 3_600)).is_some());
    }
}
