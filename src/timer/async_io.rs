//! [`AsyncIoTimer`]: sleeps on `async-io`'s timers.

use core::fmt;
use core::time::Duration;

use super::{Sleep, Timer};

/// A timer driven by `async-io`, the reactor under smol and async-std.
///
/// Its sleeps are `async_io::Timer`s. They work under any executor: while
/// no thread drives the reactor from `async_io::block_on`, its own
/// `async-io` thread does.
///
/// Available with the `async-io` feature.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::{AsyncIoTimer, Timer};
///
/// smol::block_on(async {
///     let start = Instant::now();
///     AsyncIoTimer::new().sleep(Duration::from_millis(10)).await;
///     assert!(start.elapsed() >= Duration::from_millis(10));
/// });
/// ```
#[derive(Clone, Copy, Default)]
pub struct AsyncIoTimer {
    _private: (),
}

impl AsyncIoTimer {
    /// The `async-io` timer. All of them are the same.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::timer::{AsyncIoTimer, Timer};
    ///
    /// let timer: Arc<dyn Timer> = Arc::new(AsyncIoTimer::new());
    /// # drop(timer);
    /// ```
    #[must_use]
    pub const fn new() -> AsyncIoTimer {
        AsyncIoTimer { _private: () }
    }
}

impl Timer for AsyncIoTimer {
    /// An `async_io::Timer::after(duration)`. A duration too large for a
    /// deadline never completes.
    fn sleep(&self, duration: Duration) -> Sleep {
        let timer = ::async_io::Timer::after(duration);
        Box::pin(async move {
            timer.await;
        })
    }
}

impl fmt::Debug for AsyncIoTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncIoTimer").finish_non_exhaustive()
    }
}
