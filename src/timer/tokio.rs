//! [`TokioTimer`]: sleeps on a tokio runtime's time driver.

use core::time::Duration;

use ::tokio::runtime::Handle;

use super::{Sleep, Timer};

/// A timer driven by a tokio runtime's time driver.
///
/// Its sleeps are `tokio::time::sleep` futures made inside the runtime of
/// the [`Handle`] it holds, so they can be polled from any thread, inside or
/// outside that runtime, and they follow the runtime's clock: under
/// `tokio::time::pause` they complete as the paused clock advances.
///
/// Available with the `tokio` feature.
///
/// # Panics
///
/// [`sleep`](Timer::sleep) panics if the runtime was built without its time
/// driver (see `tokio::runtime::Builder::enable_time`), and a sleep panics
/// when polled after the runtime has shut down, as tokio's own sleeps do.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::{Timer, TokioTimer};
///
/// let runtime = tokio::runtime::Builder::new_multi_thread()
///     .enable_time()
///     .build()
///     .unwrap();
/// let timer = TokioTimer::new(runtime.handle().clone());
///
/// // Polled on a thread that is not the runtime's.
/// let start = Instant::now();
/// futures::executor::block_on(timer.sleep(Duration::from_millis(10)));
/// assert!(start.elapsed() >= Duration::from_millis(10));
/// ```
#[derive(Clone, Debug)]
pub struct TokioTimer {
    handle: Handle,
}

impl TokioTimer {
    /// A timer on the runtime of `handle`.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::timer::TokioTimer;
    ///
    /// # let runtime = tokio::runtime::Runtime::new().unwrap();
    /// let timer = TokioTimer::new(runtime.handle().clone());
    /// # drop(timer);
    /// ```
    #[must_use]
    pub fn new(handle: Handle) -> TokioTimer {
        TokioTimer { handle }
    }

    /// A timer on the runtime this is called in, or `None` outside a tokio
    /// runtime (see [`Handle::try_current`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::timer::TokioTimer;
    ///
    /// assert!(TokioTimer::try_current().is_none());
    /// # let runtime = tokio::runtime::Runtime::new().unwrap();
    /// runtime.block_on(async {
    ///     assert!(TokioTimer::try_current().is_some());
    /// });
    /// ```
    #[must_use]
    pub fn try_current() -> Option<TokioTimer> {
        Handle::try_current().ok().map(TokioTimer::new)
    }

    /// The handle of the runtime whose time driver runs the sleeps.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::timer::TokioTimer;
    ///
    /// # let runtime = tokio::runtime::Runtime::new().unwrap();
    /// let timer = TokioTimer::new(runtime.handle().clone());
    /// assert_eq!(timer.handle().id(), runtime.handle().id());
    /// ```
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Timer for TokioTimer {
    /// A `tokio::time::sleep`, registered with this timer's runtime.
    ///
    /// Durations too long for tokio sleep for about 30 years.
    fn sleep(&self, duration: Duration) -> Sleep {
        let _runtime = self.handle.enter();
        Box::pin(::tokio::time::sleep(duration))
    }
}
