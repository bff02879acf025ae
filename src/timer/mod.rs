//! Timers: the one piece of a runtime that `max_wait` and `call_timeout`
//! need.
//!
//! A [`Timer`] makes [`Sleep`] futures, and that is all the crate asks of a
//! runtime. Three timers come with it:
//!
//! | Timer | Available | Driven by | Use it on |
//! | --- | --- | --- | --- |
//! | [`ThreadTimer`] | always | one background thread per process, `bulkhead-timer`, started on first use | any executor, including `futures::executor::block_on` |
//! | `TokioTimer` | feature `tokio` | the time driver of a tokio runtime (honours `tokio::time::pause`) | tokio |
//! | `AsyncIoTimer` | feature `async-io` | `async-io`'s reactor (its `async-io` thread when no one else drives it) | smol, async-std, any executor |
//!
//! [`default_timer`] picks one from the features that are on and the runtime
//! it is called in, so `max_wait` and `call_timeout` work out of the box.
//! To use another executor's timer, implement [`Timer`]: it is one method.
//!
//! # Examples
//!
//! Plugging in a timer of your own:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use watertight::timer::{Sleep, Timer};
//!
//! /// Hands sleeps to "my executor". Here: a thread per sleep, which keeps
//! /// the example short but is no way to build a real timer.
//! #[derive(Debug)]
//! struct MyTimer;
//!
//! impl Timer for MyTimer {
//!     fn sleep(&self, duration: Duration) -> Sleep {
//!         let (done, fired) = futures::channel::oneshot::channel::<()>();
//!         std::thread::spawn(move || {
//!             std::thread::sleep(duration);
//!             let _ = done.send(());
//!         });
//!         Box::pin(async move {
//!             let _ = fired.await;
//!         })
//!     }
//! }
//!
//! # futures::executor::block_on(async {
//! let start = Instant::now();
//! MyTimer.sleep(Duration::from_millis(10)).await;
//! assert!(start.elapsed() >= Duration::from_millis(10));
//! # });
//! ```
//!
//! # Implementation notes
//!
//! [`ThreadTimer`] keeps every pending sleep of the process in one queue
//! behind a mutex: a min-heap of deadlines (eight children per entry, so
//! five levels for 10,000 sleeps) over a slab of slots. A slot holds a
//! sleep's waker, an id unique per registration and the position of its
//! entry in the heap, and the entry names its slot back, so a sleep can
//! leave from the middle of the heap (the last entry fills its place and
//! moves up or down: O(log n)), with no cancelled entries left to purge.
//! The id orders equal deadlines by registration.
//!
//! A sleep takes a slot on its first poll (not when it is made, so an
//! unpolled sleep costs nothing) and keeps the slot's index and its id. It
//! replaces its waker there when polled with a different one, and frees the
//! slot when it is dropped, so the queue holds exactly the sleeps that are
//! polled and pending: a loop that makes, polls and drops sleeps leaves
//! nothing behind. A slot freed and taken again holds another id, so a
//! sleep whose slot no longer holds its id has fired: a sleep never
//! completes before its deadline, and one polled at or after its deadline
//! completes at once even if the thread is late. The heap and the slots are
//! vectors that keep their capacity, and free slots are linked through the
//! slots themselves: once the queue has held as many sleeps as are pending,
//! registering, dropping and expiring allocate nothing.
//!
//! The timer thread takes the due entries off the top of the heap, wakes
//! their wakers after releasing the lock, and parks until the next
//! deadline (an hour at most). The queue remembers that instant, and a
//! registration unparks the thread only if it is due before it, bringing
//! the instant forward. When the sleep the thread was unparked for is
//! dropped before it is due, the thread keeps that instant and wakes once
//! for nothing, rather than be unparked again by each sleep registered
//! meanwhile: a lone sleep made and dropped in a loop (a wait that ends
//! before its deadline, over and over) unparks the thread about once per
//! timeout instead of once per sleep.
//!
//! No waker is cloned for a sleep that is polled again by the same task,
//! and no waker is cloned, woken or dropped under the lock.

mod by_waker;
mod clock;
mod deadline;
mod queue;
mod thread;
// A race against a boxed `Sleep`, for the distributed backends' own waits.
#[cfg(any(
    all(feature = "redis", any(feature = "tokio", feature = "smol")),
    feature = "postgres"
))]
pub(crate) mod timeout;

#[cfg(feature = "async-io")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-io")))]
mod async_io;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
mod tokio;

pub(crate) use by_waker::poll_by_waker;
pub(crate) use clock::{Clock, ClockSleep, TimerGone};
pub(crate) use deadline::Deadline;
pub use thread::{ThreadSleep, ThreadTimer};

#[cfg(feature = "async-io")]
pub use self::async_io::AsyncIoTimer;
#[cfg(feature = "tokio")]
pub use self::tokio::TokioTimer;

use core::any::Any;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::time::Duration;
use std::sync::Arc;

/// A future that completes after a delay, as made by [`Timer::sleep`].
///
/// It is boxed so that [`Timer`] is object safe and a bulkhead can hold any
/// timer as an `Arc<dyn Timer>`.
///
/// # Cancel safety
///
/// Dropping a sleep cancels it. The timers in this module release
/// everything the sleep had registered when it is dropped.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::timer::{Sleep, ThreadTimer, Timer};
///
/// let timer = ThreadTimer::new();
/// let nap: Sleep = timer.sleep(Duration::from_millis(1));
/// futures::executor::block_on(nap);
/// ```
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of delays: the one piece of a runtime the bulkhead needs.
///
/// Implement it to drive `max_wait` and `call_timeout` with your executor's
/// own timer. The sleep must not complete before `duration` has passed, and
/// should complete soon after; a sleep that is dropped early must release
/// whatever it registered. A duration too large to represent as a deadline
/// should sleep forever (or as long as the timer can), never panic.
///
/// `Timer` is implemented for `Arc<T>` of any timer `T`, including
/// `Arc<dyn Timer>`, so the result of [`default_timer`] can be passed
/// wherever a timer is expected.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::{ThreadTimer, Timer};
///
/// # futures::executor::block_on(async {
/// let timer: &dyn Timer = &ThreadTimer::new();
/// let start = Instant::now();
/// timer.sleep(Duration::from_millis(5)).await;
/// assert!(start.elapsed() >= Duration::from_millis(5));
/// # });
/// ```
///
/// See the [module documentation](self) for implementing one.
pub trait Timer: Any + Send + Sync + fmt::Debug {
    /// A future that completes once `duration` has passed.
    ///
    /// The duration is measured from this call, not from the first poll.
    fn sleep(&self, duration: Duration) -> Sleep;
}

impl<T: Timer + ?Sized> Timer for Arc<T> {
    #[inline]
    fn sleep(&self, duration: Duration) -> Sleep {
        (**self).sleep(duration)
    }
}

/// The timer that suits the runtime this is called in, or `None` if no
/// enabled feature provides one.
///
/// Picks, in order:
///
/// 1. `TokioTimer` for the current runtime, if the `tokio` feature is on and
///    this is called inside a tokio runtime (including from a
///    `spawn_blocking` thread or under `Handle::enter`);
/// 2. `AsyncIoTimer`, if the `async-io` feature is on (what smol and
///    async-std use);
/// 3. [`ThreadTimer`], if the `thread-timer` feature is on (the default).
///
/// So with `default-features = false` and no runtime feature this returns
/// `None`, and a bulkhead that needs a timer reports a `BuildError` instead
/// of waiting forever. [`ThreadTimer`] itself stays available: pass it
/// explicitly to opt into the background thread case by case.
///
/// The choice is made when this is called: a `TokioTimer` picked inside a
/// runtime keeps using that runtime.
///
/// # Panics
///
/// Not here, but in the timer it returns: a `TokioTimer`'s sleeps panic
/// once its runtime has shut down, and, since tokio offers no way to ask
/// whether a runtime has its time driver, inside a runtime built without
/// `enable_time` (or `enable_all`, which `#[tokio::main]` uses) the
/// `TokioTimer` picked here panics when it makes a sleep, with tokio's
/// message saying so; pass another timer explicitly there.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::{Timer, default_timer};
///
/// # futures::executor::block_on(async {
/// // `None` only with `default-features = false` and no runtime feature.
/// if let Some(timer) = default_timer() {
///     let start = Instant::now();
///     timer.sleep(Duration::from_millis(5)).await;
///     assert!(start.elapsed() >= Duration::from_millis(5));
/// }
/// # });
/// ```
#[must_use]
pub fn default_timer() -> Option<Arc<dyn Timer>> {
    #[cfg(feature = "tokio")]
    if let Some(timer) = TokioTimer::try_current() {
        return Some(Arc::new(timer));
    }
    fallback_timer()
}

/// The runtime-independent choice of [`default_timer`].
#[cfg(feature = "async-io")]
fn fallback_timer() -> Option<Arc<dyn Timer>> {
    Some(Arc::new(AsyncIoTimer::new()))
}

/// The runtime-independent choice of [`default_timer`].
#[cfg(all(not(feature = "async-io"), feature = "thread-timer"))]
fn fallback_timer() -> Option<Arc<dyn Timer>> {
    Some(Arc::new(ThreadTimer::new()))
}

/// The runtime-independent choice of [`default_timer`]: none is enabled.
#[cfg(all(not(feature = "async-io"), not(feature = "thread-timer")))]
fn fallback_timer() -> Option<Arc<dyn Timer>> {
    None
}
