//! The timer a policy runs on, resolved once to a known kind, so that the
//! sleeps of the bundled timers live inline in the waiting future instead of
//! behind a [`Sleep`](super::Sleep) box: a call that waits or is timed
//! allocates nothing.
//!
//! A timer handed to a builder as `Arc<dyn Timer>` is recognised by its type
//! (`Timer: Any`): a [`ThreadTimer`], `TokioTimer` or `AsyncIoTimer` gets its
//! own inline sleep; any other timer keeps its boxed [`Sleep`].
//!
//! Without a timer of its own, a policy uses [`Clock::Auto`]: every sleep
//! runs on the timer of the runtime it is made in (the current tokio
//! runtime), else on the fallback of [`default_timer`](super::default_timer).
//! So a bulkhead made in a `static`, before any runtime, or one that
//! outlives the runtime it was built in, sleeps on whatever runtime waits on
//! it.
//!
//! Tokio offers no way to ask whether a runtime has its time driver, or
//! whether it has shut down (tokio-rs/tokio#8361): making or polling a sleep
//! then panics. Tokio sleeps are therefore made and polled inside
//! `catch_unwind`, which costs nothing until it catches, and the failure is
//! reported as [`TimerGone`]; a runtime without a time driver is remembered,
//! so its panic message is printed once.

use core::any::Any;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use pin_project_lite::pin_project;

use super::{Sleep, ThreadSleep, ThreadTimer, Timer};

/// The timer could not make or run a sleep: its tokio runtime has no time
/// driver or has shut down, or no timer is available here at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerGone;

/// A policy's timer, by kind.
#[derive(Clone)]
pub(crate) enum Clock {
    /// No timer was given: each sleep picks one where it is made.
    Auto,
    /// The crate's timer thread.
    Thread,
    /// A tokio runtime's time driver.
    #[cfg(feature = "tokio")]
    Tokio(super::TokioTimer),
    /// `async-io`'s reactor.
    #[cfg(feature = "async-io")]
    AsyncIo,
    /// A timer of the user's: its sleeps are boxed.
    Custom(Arc<dyn Timer>),
}

impl Clock {
    /// The clock of `timer`, recognising the bundled timers.
    pub(crate) fn of(timer: Arc<dyn Timer>) -> Clock {
        let any: &dyn Any = &*timer;
        if any.is::<ThreadTimer>() {
            return Clock::Thread;
        }
        #[cfg(feature = "tokio")]
        if let Some(timer) = any.downcast_ref::<super::TokioTimer>() {
            return Clock::Tokio(timer.clone());
        }
        #[cfg(feature = "async-io")]
        if any.is::<super::AsyncIoTimer>() {
            return Clock::AsyncIo;
        }
        if let Some(inner) = any.downcast_ref::<Arc<dyn Timer>>() {
            return Clock::of(inner.clone());
        }
        Clock::Custom(timer)
    }

    /// Whether [`Clock::Auto`] can make a sleep here, now: inside a tokio
    /// runtime that has its time driver, or with a fallback timer. A tokio
    /// runtime without one is `Err`, whatever the fallback.
    pub(crate) fn auto_available() -> Result<(), TimerGone> {
        #[cfg(feature = "tokio")]
        if let Ok(handle) = ::tokio::runtime::Handle::try_current() {
            return tokio_sleep(&handle, Duration::ZERO).map(drop);
        }
        if FALLBACK { Ok(()) } else { Err(TimerGone) }
    }

    /// Checks that a sleep can be made at all (for `build()`): a tokio
    /// timer whose runtime has no time driver fails here rather than at
    /// the first wait.
    pub(crate) fn check(&self) -> Result<(), TimerGone> {
        match self {
            Clock::Auto => Clock::auto_available(),
            #[cfg(feature = "tokio")]
            Clock::Tokio(timer) => tokio_sleep(timer.handle(), Duration::ZERO).map(drop),
            _ => Ok(()),
        }
    }

    /// A sleep of `duration`, measured from now. Not registered with any
    /// driver until first polled.
    pub(crate) fn sleep(&self, duration: Duration) -> Result<ClockSleep, TimerGone> {
        match self {
            Clock::Auto => auto_sleep(duration),
            Clock::Thread => Ok(ClockSleep::thread(duration)),
            #[cfg(feature = "tokio")]
            Clock::Tokio(timer) => tokio_sleep(timer.handle(), duration),
            #[cfg(feature = "async-io")]
            Clock::AsyncIo => Ok(ClockSleep::async_io(duration)),
            Clock::Custom(timer) => Ok(ClockSleep::Custom {
                sleep: timer.sleep(duration),
            }),
        }
    }

    /// Whether [`now`](Self::now) reads the clock that this clock's sleeps
    /// run on wherever they are made: the default (tokio's clock inside a
    /// tokio runtime, which a paused runtime stops, else the system's), the
    /// timer thread and async-io. Not a `TokioTimer` of a given runtime,
    /// whose clock is only read inside that runtime, nor a custom timer,
    /// whose clock cannot be read at all.
    pub(crate) fn readable(&self) -> bool {
        match self {
            Clock::Auto | Clock::Thread => true,
            #[cfg(feature = "async-io")]
            Clock::AsyncIo => true,
            _ => false,
        }
    }

    /// The time now on the clock a sleep made here would run on (see
    /// [`readable`](Self::readable): only meaningful for those clocks).
    #[inline]
    pub(crate) fn now(&self) -> std::time::Instant {
        #[cfg(feature = "tokio")]
        if matches!(self, Clock::Auto) && in_tokio() {
            return ::tokio::time::Instant::now().into_std();
        }
        std::time::Instant::now()
    }

    /// The time now on `clock`, or on the default clock if none was set (a
    /// tokio runtime's, paused or not, else the system's).
    #[inline]
    pub(crate) fn now_on(clock: Option<&Clock>) -> std::time::Instant {
        match clock {
            Some(clock) => clock.now(),
            None => Clock::Auto.now(),
        }
    }

    /// What the builder's and the bulkhead's `Debug` show.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Clock::Auto => "default (the current tokio runtime's, else the fallback)",
            Clock::Thread => "ThreadTimer",
            #[cfg(feature = "tokio")]
            Clock::Tokio(_) => "TokioTimer",
            #[cfg(feature = "async-io")]
            Clock::AsyncIo => "AsyncIoTimer",
            Clock::Custom(_) => "custom",
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Clock::Custom(timer) => timer.fmt(f),
            other => f.write_str(other.describe()),
        }
    }
}

/// Whether [`Clock::Auto`] has a timer outside tokio.
const FALLBACK: bool = cfg!(any(feature = "async-io", feature = "thread-timer"));

fn auto_sleep(duration: Duration) -> Result<ClockSleep, TimerGone> {
    #[cfg(feature = "tokio")]
    if in_tokio() {
        return tokio_current_sleep(duration);
    }
    #[cfg(feature = "async-io")]
    return Ok(ClockSleep::async_io(duration));
    #[cfg(all(not(feature = "async-io"), feature = "thread-timer"))]
    return Ok(ClockSleep::thread(duration));
    #[cfg(all(not(feature = "async-io"), not(feature = "thread-timer")))]
    {
        let _ = duration;
        Err(TimerGone)
    }
}

#[cfg(feature = "tokio")]
mod tokio_probe {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use ::tokio::runtime::Id;

    /// Whether any runtime was found without a time driver (so that the
    /// common case never takes the lock below).
    static ANY: AtomicBool = AtomicBool::new(false);
    /// The runtimes found without a time driver.
    static RUNTIMES: Mutex<Vec<Id>> = Mutex::new(Vec::new());

    pub(super) fn any_timeless() -> bool {
        ANY.load(Ordering::Acquire)
    }

    pub(super) fn known_timeless(id: Id) -> bool {
        any_timeless()
            && RUNTIMES
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&id)
    }

    pub(super) fn remember_timeless(id: Id) {
        let mut runtimes = RUNTIMES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !runtimes.contains(&id) {
            runtimes.push(id);
        }
        ANY.store(true, Ordering::Release);
    }
}

/// Whether this runs inside a tokio runtime. Inside a tokio task (the
/// common case) that is a thread-local read; `Handle::try_current` (which
/// clones the runtime's handle: two atomic read-modify-writes) is only
/// asked outside one, as in `block_on`.
#[cfg(feature = "tokio")]
#[inline]
fn in_tokio() -> bool {
    ::tokio::task::try_id().is_some() || ::tokio::runtime::Handle::try_current().is_ok()
}

/// A tokio sleep on the current runtime (which exists), or `TimerGone` if
/// it has no time driver.
#[cfg(feature = "tokio")]
fn tokio_current_sleep(duration: Duration) -> Result<ClockSleep, TimerGone> {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let current = || ::tokio::runtime::Handle::try_current().map(|h| h.id());
    if tokio_probe::any_timeless() && current().is_ok_and(tokio_probe::known_timeless) {
        return Err(TimerGone);
    }
    match catch_unwind(AssertUnwindSafe(|| ::tokio::time::sleep(duration))) {
        Ok(sleep) => Ok(ClockSleep::Tokio { sleep }),
        Err(_) => {
            if let Ok(id) = current() {
                tokio_probe::remember_timeless(id);
            }
            Err(TimerGone)
        }
    }
}

/// A tokio sleep on `handle`'s runtime, or `TimerGone` if that runtime has
/// no time driver (tokio panics then; the panic is caught, and the runtime
/// remembered so that it panics once).
#[cfg(feature = "tokio")]
fn tokio_sleep(
    handle: &::tokio::runtime::Handle,
    duration: Duration,
) -> Result<ClockSleep, TimerGone> {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    if tokio_probe::known_timeless(handle.id()) {
        return Err(TimerGone);
    }
    let _entered = handle.enter();
    match catch_unwind(AssertUnwindSafe(|| ::tokio::time::sleep(duration))) {
        Ok(sleep) => Ok(ClockSleep::Tokio { sleep }),
        Err(_) => {
            tokio_probe::remember_timeless(handle.id());
            Err(TimerGone)
        }
    }
}

/// A future that never exists: the sleep type of a timer whose feature is
/// off.
#[allow(dead_code, unreachable_pub)]
pub(crate) enum Never {}

impl Future for Never {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        match *self {}
    }
}

#[cfg(feature = "tokio")]
type TokioSleep = ::tokio::time::Sleep;
#[cfg(not(feature = "tokio"))]
type TokioSleep = Never;

#[cfg(feature = "async-io")]
type AsyncIoSleep = ::async_io::Timer;
#[cfg(not(feature = "async-io"))]
type AsyncIoSleep = Never;

pin_project! {
    /// A sleep of a [`Clock`], inline for the bundled timers.
    #[project = ClockSleepProj]
    pub(crate) enum ClockSleep {
        Tokio { #[pin] sleep: TokioSleep },
        AsyncIo { sleep: AsyncIoSleep },
        Thread { sleep: ThreadSleep },
        Custom { sleep: Sleep },
        /// The sleep failed once (its runtime went away); it stays failed.
        Failed,
    }
}

impl ClockSleep {
    fn thread(duration: Duration) -> ClockSleep {
        ClockSleep::Thread {
            sleep: ThreadSleep::new(duration),
        }
    }

    #[cfg(feature = "async-io")]
    fn async_io(duration: Duration) -> ClockSleep {
        ClockSleep::AsyncIo {
            sleep: ::async_io::Timer::after(duration),
        }
    }

    /// Polls the sleep: `Ready(Ok)` once it has elapsed, `Ready(Err)` if
    /// its timer stopped working (a tokio runtime that shut down).
    ///
    /// A custom timer's panic propagates; a tokio sleep's is caught.
    pub(crate) fn poll_sleep(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), TimerGone>> {
        match self.as_mut().project() {
            ClockSleepProj::Tokio { sleep } => {
                use std::panic::{AssertUnwindSafe, catch_unwind};
                match catch_unwind(AssertUnwindSafe(|| sleep.poll(cx))) {
                    Ok(poll) => poll.map(Ok),
                    Err(_) => {
                        self.set(ClockSleep::Failed);
                        Poll::Ready(Err(TimerGone))
                    }
                }
            }
            ClockSleepProj::AsyncIo { sleep } => Pin::new(sleep).poll(cx).map(|_| Ok(())),
            ClockSleepProj::Thread { sleep } => Pin::new(sleep).poll(cx).map(Ok),
            ClockSleepProj::Custom { sleep } => sleep.as_mut().poll(cx).map(Ok),
            ClockSleepProj::Failed => Poll::Ready(Err(TimerGone)),
        }
    }
}
