//! The error of a request cut off by `call_timeout`.

use core::fmt;
use std::error::Error;

/// A request that was admitted but ran past the bulkhead's `call_timeout`:
/// the inner call was dropped and the permit released. The error of a
/// [`BulkheadService`](super::BulkheadService) downcasts to it.
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
    pub(super) name: Box<str>,
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
