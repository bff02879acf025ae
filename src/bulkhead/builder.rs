//! Configuring a bulkhead.

use core::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::idle::Idle;

use super::classes::Classes;
use super::error::{BuildError, BuildErrorKind};
use super::export::Exports;
use super::observer::Observer;
use super::policy::{Policy, Settings};
use super::{Bulkhead, Shared};
use crate::semaphore::Semaphore;
use crate::timer::{Clock, Timer};

/// Configures a [`Bulkhead`]; made by [`Bulkhead::builder`].
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `name` | `"bulkhead"` | shown in errors, metrics and events |
/// | `max_concurrent_calls` | required | calls in flight at once |
/// | `max_wait` | unbounded | how long a caller may wait; `Duration::ZERO` fails fast |
/// | `max_queue` | unbounded | how many callers may wait; past it, rejected at once |
/// | `call_timeout` | none | bound on the guarded call itself |
/// | `fair` | `true` | strict FIFO; `false` lets newcomers take a free permit ahead of waiters |
/// | `timer` | picked by [`default_timer`](crate::timer::default_timer) | where delays come from |
/// | `observer` | none | hooks that see every call (may be given several times) |
/// | `exporters` | `true` | publish to `metrics` / `tracing` when those features are on (each alone: `export_metrics`, `export_tracing`; levels: `trace_levels`) |
/// | `leak_threshold` | none | report permits held longer than this |
/// | `queue_delay` | off | controlled delay: cut a standing line's waits to a target |
/// | `adaptive_lifo` | off | with `queue_delay`: serve the newest waiter first while the line stands |
/// | `priorities` | off | priority classes with reserved, borrowable shares of the limit |
///
/// A call may also carry options of its own, a deadline, a shorter
/// `max_wait`, a priority class ([`CallOptions`](crate::CallOptions)): no
/// setting needed.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::{Bulkhead, BuildErrorKind};
///
/// let err = Bulkhead::builder().max_wait(Duration::from_secs(1)).build().unwrap_err();
/// assert_eq!(err.kind(), BuildErrorKind::MissingLimit);
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BulkheadBuilder {
    // The core that the keyed and Redis builders wrap: they read these.
    pub(crate) name: Option<String>,
    pub(crate) max_concurrent_calls: Option<usize>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) max_queue: Option<usize>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) timer: Option<Arc<dyn Timer>>,
    pub(crate) observers: Vec<Arc<dyn Observer>>,
    pub(crate) exports: Exports,
    /// The metrics exporter to install in place of a new one (see
    /// [`Exports::observers`]).
    pub(crate) metrics_series: Option<Arc<dyn Observer>>,
    /// See `Policy::reports_later`.
    pub(crate) reports_later: bool,
    pub(crate) leak_threshold: Option<Duration>,
    /// Controlled delay: the target wait and the interval.
    pub(crate) queue_delay: Option<(Duration, Duration)>,
    /// Adaptive LIFO on the controlled-delay line.
    pub(crate) adaptive_lifo: bool,
    /// Priority classes: their shares of the limit, class 0 first.
    pub(crate) priorities: Option<Vec<u32>>,
    /// Some of the line waits before the semaphore's queue (the keyed
    /// bulkhead's fair shares: callers wait for their key's turn, then for
    /// a permit), so the queue's length is not the line's: the policy
    /// counts the line itself.
    pub(crate) line_apart: bool,
}

/// What [`BulkheadBuilder::check`] resolved: the name and the timer.
pub(crate) struct Checked {
    pub(crate) name: String,
    pub(crate) clock: Option<Clock>,
}

/// A limit on permits in flight, checked: at least 1, at most
/// [`Semaphore::MAX_PERMITS`].
pub(crate) fn check_limit(limit: usize) -> Result<usize, BuildError> {
    match limit {
        0 => Err(BuildError::new(BuildErrorKind::ZeroLimit)),
        n if n > Semaphore::MAX_PERMITS => Err(BuildError::new(BuildErrorKind::LimitTooLarge)),
        n => Ok(n),
    }
}

impl BulkheadBuilder {
    pub(crate) fn new() -> Self {
        Self {
            name: None,
            max_concurrent_calls: None,
            max_wait: None,
            max_queue: None,
            call_timeout: None,
            fair: true,
            timer: None,
            observers: Vec::new(),
            exports: Exports::ALL,
            metrics_series: None,
            reports_later: false,
            leak_threshold: None,
            queue_delay: None,
            adaptive_lifo: false,
            priorities: None,
            line_apart: false,
        }
    }

    /// Names the bulkhead (the guarded dependency, usually).
    ///
    /// Names are interned: each distinct name is kept once for the life of
    /// the process, so that a rejection carries it without a reference
    /// count. Name bulkheads after what they guard, not per request.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("inventory-api").max_concurrent_calls(10).build().unwrap();
    /// assert_eq!(bh.name(), "inventory-api");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The most calls in flight at once. Required, at least 1; can be
    /// changed later with [`Bulkhead::set_max_concurrent_calls`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// // 200 requests a second at 50 ms each: 10 in flight (Little's law).
    /// let bh = Bulkhead::builder().max_concurrent_calls(10).build().unwrap();
    /// assert_eq!(bh.metrics().max_concurrent_calls(), 10);
    /// ```
    pub fn max_concurrent_calls(mut self, limit: usize) -> Self {
        self.max_concurrent_calls = Some(limit);
        self
    }

    /// How long a caller may wait for a permit before it is rejected with
    /// [`RejectReason::Timeout`](crate::RejectReason::Timeout).
    /// `Duration::ZERO` fails fast: no waiting at all. Not set: wait as long
    /// as it takes.
    ///
    /// A caller is never rejected before `max_wait` has passed on the
    /// timer's clock. With the default timer,
    /// [`ThreadTimer`](crate::timer::ThreadTimer) or
    /// `AsyncIoTimer` (in fair mode), the whole line shares one timer,
    /// armed for the oldest waiter's deadline, so a wait costs a clock
    /// reading instead of a timer of its own; a waiter is rejected when
    /// that timer fires (tokio rounds up to its 1 ms tick), plus one task
    /// wake-up per waiter ahead of it with the same deadline. See
    /// the [bulkhead guide](crate::guide::bulkhead#wait-time-out-or-fail-fast) for the measured margin.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// let fail_fast = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::ZERO)
    ///     .build()
    ///     .unwrap();
    /// let _held = fail_fast.try_acquire().unwrap();
    /// # futures::executor::block_on(async {
    /// let rejected = fail_fast.acquire().await.unwrap_err();
    /// assert_eq!(rejected.reason(), RejectReason::Full);
    /// # });
    /// ```
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The most callers that may wait at once; a caller that finds the line
    /// full is rejected at once with
    /// [`RejectReason::Full`](crate::RejectReason::Full). `0` means nobody
    /// waits. The bound counts callers of this bulkhead (all clones).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// // Nobody may wait: with every permit taken, callers are turned away at once.
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).max_queue(0).build().unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// # futures::executor::block_on(async {
    /// assert_eq!(bh.acquire().await.unwrap_err().reason(), RejectReason::Full);
    /// # });
    /// ```
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.max_queue = Some(max_queue);
        self
    }

    /// A bound on the guarded call in [`Bulkhead::call`]: past it the call
    /// is dropped, its permit released, and
    /// [`BulkheadError::CallTimeout`](crate::BulkheadError::CallTimeout)
    /// returned. Must be greater than zero.
    ///
    /// The timer is armed only when the call first waits (its first poll
    /// returns `Pending`), so a call that completes at once costs no timer;
    /// the bound counts from there, and synchronous work before the call's
    /// first `.await` (which no timer could interrupt) is not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, BulkheadError};
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .call_timeout(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap();
    /// # futures::executor::block_on(async {
    /// let hung = bh.call(std::future::pending::<Result<(), ()>>()).await;
    /// assert!(matches!(hung, Err(BulkheadError::CallTimeout(_))));
    /// assert_eq!(bh.metrics().in_flight(), 0); // the permit came back
    /// # });
    /// ```
    pub fn call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = Some(call_timeout);
        self
    }

    /// `true` (the default): callers are admitted strictly in arrival
    /// order. `false`: a caller that finds a free permit takes it even if
    /// others wait, and a permit coming back wakes the first waiter to
    /// compete for it rather than being handed to it
    /// ([`Semaphore::new_unfair`]): more throughput when callers return and
    /// ask again at once, no ordering promise.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let throughput_first = Bulkhead::builder().max_concurrent_calls(4).fair(false).build().unwrap();
    /// assert!(throughput_first.try_acquire().is_ok());
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// The timer for `max_wait`, `call_timeout` and `leak_threshold`,
    /// instead of the default.
    ///
    /// Without one, each wait runs on the timer of the tokio runtime it is
    /// made in (with the `tokio` feature), else on the fallback that
    /// [`default_timer`](crate::timer::default_timer) picks outside tokio
    /// (`AsyncIoTimer`, else [`ThreadTimer`](crate::timer::ThreadTimer)).
    /// So a bulkhead built in a `static` or in one runtime and used in
    /// another sleeps on the runtime that waits; `Debug` of the bulkhead
    /// shows which timer it has. The bundled timers' sleeps live inline in
    /// the waiting future; a timer of your own is asked for a boxed
    /// [`Sleep`](crate::timer::Sleep) per wait.
    ///
    /// [`build`](Self::build) fails with
    /// [`BuildErrorKind::TimerUnavailable`](crate::BuildErrorKind::TimerUnavailable)
    /// inside a tokio runtime without a time driver (for the default, or a
    /// `TokioTimer` of such a runtime). A wait whose timer stops working
    /// later (its tokio runtime shut down, or a runtime without a time
    /// driver waiting on the default timer) is rejected with
    /// [`RejectReason::Unavailable`](crate::RejectReason::Unavailable); a
    /// running call whose `call_timeout` cannot be armed is dropped with the
    /// same rejection, rather than left unbounded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    /// use watertight::timer::ThreadTimer;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::from_millis(50))
    ///     .timer(Arc::new(ThreadTimer::new()))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.metrics().max_wait(), Some(Duration::from_millis(50)));
    /// ```
    pub fn timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.timer = Some(timer);
        self
    }

    /// Adds hooks that see every call. May be called more than once; the
    /// observers run in the order they were added.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use watertight::Bulkhead;
    /// use watertight::observer::{Finished, Observer};
    ///
    /// #[derive(Default)]
    /// struct Finishes(AtomicU64);
    /// impl Observer for Finishes {
    ///     fn on_finished(&self, _: &Finished<'_>) {
    ///         self.0.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// }
    /// let seen = Arc::new(Finishes::default());
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).observer(seen.clone()).build().unwrap();
    /// drop(bh.try_acquire().unwrap());
    /// assert_eq!(seen.0.load(Ordering::Relaxed), 1);
    /// ```
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Whether to publish to the `metrics` facade and to `tracing` when the
    /// `metrics` / `tracing` features are on (default `true`). Without those
    /// features this does nothing.
    ///
    /// The `metrics` exporter registers its series at the bulkhead's first
    /// event (an admission, a rejection, a call's end) that finds a
    /// recorder in effect: the thread's local one, else the global one.
    /// So a bulkhead built, or even called, before the recorder is
    /// installed publishes from its first event after, as the `metrics`
    /// macros do; what happened before is not published (the gauges are
    /// right from then on: calls in flight are counted from the start).
    /// Once registered, the series stay with that recorder. (`tracing`
    /// has no such rule: each event goes to the subscriber of the moment.)
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// // A bulkhead used in a test: keep it out of the process's metrics.
    /// let quiet = Bulkhead::builder().max_concurrent_calls(1).exporters(false).build().unwrap();
    /// assert!(quiet.try_acquire().is_ok());
    /// ```
    ///
    /// With the `metrics` feature: build and call whenever, install the
    /// recorder, and the next call publishes.
    ///
    /// ```
    /// # #[cfg(feature = "metrics")] {
    /// use watertight::Bulkhead;
    /// use metrics_util::debugging::DebuggingRecorder;
    ///
    /// let inventory = Bulkhead::builder().name("inventory").max_concurrent_calls(10).build().unwrap();
    /// drop(inventory.try_acquire().unwrap()); // a warm-up call: no recorder yet
    ///
    /// // A service would install its exporter here (a Prometheus one, say).
    /// let recorder = DebuggingRecorder::new();
    /// let snapshotter = recorder.snapshotter();
    /// metrics::set_global_recorder(recorder).unwrap();
    ///
    /// drop(inventory.try_acquire().unwrap()); // the next event: the series are registered
    /// assert!(!snapshotter.snapshot().into_vec().is_empty());
    /// # }
    /// ```
    pub fn exporters(mut self, enabled: bool) -> Self {
        self.exports.metrics = enabled;
        self.exports.tracing = enabled;
        self
    }

    /// Whether to publish to the `metrics` facade (feature `metrics`;
    /// default `true`), whatever [`export_tracing`](Self::export_tracing)
    /// says. See [`exporters`](Self::exporters).
    pub fn export_metrics(mut self, enabled: bool) -> Self {
        self.exports.metrics = enabled;
        self
    }

    /// Whether to emit `tracing` events and the `bulkhead_call` span
    /// (feature `tracing`; default `true`), whatever
    /// [`export_metrics`](Self::export_metrics) says. See
    /// [`exporters`](Self::exporters), and
    /// [`trace_levels`](Self::trace_levels) for each event's level.
    pub fn export_tracing(mut self, enabled: bool) -> Self {
        self.exports.tracing = enabled;
        self
    }

    /// The level of each kind of `tracing` event (feature `tracing`):
    /// rejections at `DEBUG` by default, calls cut short and leaks at
    /// `WARN`; the table on [`TraceLevels`](crate::observer::TraceLevels)
    /// says each default and why.
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn trace_levels(mut self, levels: crate::observer::TraceLevels) -> Self {
        self.exports.levels = levels;
        self
    }

    /// Reports every permit held longer than `threshold`, as a connection
    /// pool's leak detector does: [`Observer::on_leak_suspected`] runs
    /// (once per permit, naming the bulkhead), the `tracing` exporter warns,
    /// and [`Metrics::leaks_suspected`](crate::Metrics::leaks_suspected)
    /// counts it. Each permit then carries a timer entry, so this costs a
    /// sleep registration per call; it is off by default. Must be greater
    /// than zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(2)
    ///     .leak_threshold(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// let forgotten = bh.try_acquire().unwrap();
    /// std::thread::sleep(Duration::from_millis(300));
    /// assert_eq!(bh.metrics().leaks_suspected(), 1);
    /// drop(forgotten);
    /// ```
    pub fn leak_threshold(mut self, threshold: Duration) -> Self {
        self.leak_threshold = Some(threshold);
        self
    }

    /// Controlled delay on the waiting line (Facebook's "Fail at Scale"),
    /// off by default: once every caller that left the line (served, or
    /// out of `max_wait`) for a whole `interval` had waited `target` or
    /// more, the line is *standing*, and until it next empties every
    /// waiter that has waited `target` is rejected with
    /// [`RejectReason::QueueDelay`](crate::RejectReason::QueueDelay): the
    /// line drains to what the permits serve within the target, instead
    /// of serving callers who have likely given up. A burst that the line
    /// absorbs and clears within the interval is untouched. Fail at Scale
    /// uses 5 ms and 100 ms. The target must be greater than zero.
    ///
    /// It works with every timer. With the default timer,
    /// [`ThreadTimer`](crate::timer::ThreadTimer) or `AsyncIoTimer` (in
    /// fair mode) the line's one timer keeps the cut; with another, each
    /// waiter's sleep first fires at the target (where it is cut if the
    /// line stands), then at `max_wait`. A caller admitted at once costs
    /// nothing more; a waiter reads the clock when it joins and when it
    /// leaves, and the ones that leave take a small lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(20)
    ///     .max_wait(Duration::from_millis(500)) // long enough for bursts
    ///     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.metrics().rejected_queue_delay(), 0);
    /// ```
    pub fn queue_delay(mut self, target: Duration, interval: Duration) -> Self {
        self.queue_delay = Some((target, interval));
        self
    }

    /// Adaptive LIFO (Facebook's "Fail at Scale"), with
    /// [`queue_delay`](Self::queue_delay), off by default: while controlled
    /// delay finds the line standing, a permit that frees goes to the
    /// *newest* waiter, the one whose caller is surely still there, rather
    /// than the oldest; once the line has emptied, waiters are served in
    /// arrival order again. Nobody starves: on a standing line every waiter
    /// is cut once it has waited the target, so the oldest wait at most
    /// that ([`RejectReason::QueueDelay`](crate::RejectReason::QueueDelay)),
    /// as without LIFO.
    ///
    /// It needs `queue_delay` (without it nothing says when the line
    /// stands) and a fair bulkhead (an unfair one hands permits to nobody:
    /// newcomers take them first anyway); otherwise [`build`](Self::build)
    /// fails with
    /// [`BuildErrorKind::AdaptiveLifoWithoutQueueDelay`](crate::BuildErrorKind::AdaptiveLifoWithoutQueueDelay)
    /// or
    /// [`BuildErrorKind::AdaptiveLifoUnfair`](crate::BuildErrorKind::AdaptiveLifoUnfair).
    /// It costs nothing while the line does not stand, and a caller
    /// admitted at once never sees it: the switch is
    /// [`Semaphore::set_serve_newest`], read only when a permit is handed
    /// to a waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, BuildErrorKind};
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(20)
    ///     .max_wait(Duration::from_millis(500))
    ///     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
    ///     .adaptive_lifo(true)
    ///     .build()
    ///     .unwrap();
    /// assert!(bh.try_acquire().is_ok());
    ///
    /// let err = Bulkhead::builder().max_concurrent_calls(1).adaptive_lifo(true).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::AdaptiveLifoWithoutQueueDelay);
    /// ```
    pub fn adaptive_lifo(mut self, on: bool) -> Self {
        self.adaptive_lifo = on;
        self
    }

    /// Priority classes with reserved, borrowable seats (Kubernetes API
    /// Priority and Fairness), off by default. `shares` are the classes'
    /// shares of `max_concurrent_calls`, class 0 first and most important:
    /// `&[50, 30, 20]` with 20 seats reserves 10, 6 and 4 (the split adds
    /// up to the limit exactly, largest remainders first, and is redone
    /// when the limit changes). A class whose share is too small for a
    /// seat at the limit (`&[1, 1]` with 1 seat reserves 1 and 0), like a
    /// class with a share of 0, is guaranteed nothing: it borrows idle
    /// seats only, until the limit grows. A call names its class with
    /// [`CallOptions::class`](crate::CallOptions::class), through
    /// [`Bulkhead::call_with`](crate::Bulkhead::call_with),
    /// [`acquire_with`](crate::Bulkhead::acquire_with) or
    /// [`try_acquire_with`](crate::Bulkhead::try_acquire_with); then:
    ///
    /// * **idle seats are lent**: a caller that finds a seat free and
    ///   nobody waiting takes it, whatever its class;
    /// * **a seat that frees goes to an owner first**: to the most
    ///   important class that waits and holds fewer seats than it is
    ///   guaranteed, else to the most important class that waits (which
    ///   borrows). Seats are held for a whole call, so borrowed seats come
    ///   back as calls end: once an owner waits, no borrower gets another;
    /// * **a class always gets its reserved seats when it asks**, after at
    ///   most that many calls end (plus the shortfalls of more important
    ///   classes), however many seats others borrowed;
    /// * **a more important class never waits behind a less important
    ///   one**, except while the less important one takes back its own
    ///   reserved seats;
    /// * **the least important are shed first**: when the line is full
    ///   (`max_queue`, all classes together), a newcomer displaces the
    ///   newest waiter of the least important class below its own, who is
    ///   rejected with [`RejectReason::Displaced`](crate::RejectReason::Displaced);
    ///   with nobody less important waiting, the newcomer is rejected
    ///   (`Full`).
    ///
    /// Within a class, waiters are served first come, first served, and
    /// `max_wait` bounds each wait (with a sleep per waiter: the line
    /// timer serves unclassed lines only). A **plain** call, one whose
    /// options name no class (`call`, `acquire`, `try_acquire`), on a
    /// bulkhead with classes is a call of the least important class that
    /// **never waits**: it takes a seat that is free with nobody waiting,
    /// or is rejected with `Full` (name a class to wait). The seats live with the classes
    /// then, so `fair(false)` changes nothing. With `queue_delay`, each
    /// class's line has controlled delay of its own: a class whose line
    /// stands is cut to the target, and no other class is. Every waiter and every seat
    /// that comes back takes the classes' lock, and a waiter reads the
    /// clock when it joins and when it leaves.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BuildErrorKind};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(20).priorities(&[50, 30, 20]).build().unwrap();
    /// assert_eq!(bh.priority_seats()[1].reserved, 6);
    ///
    /// let err = Bulkhead::builder().max_concurrent_calls(2).priorities(&[0, 0]).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::NoPriorityShare);
    /// ```
    pub fn priorities(mut self, shares: &[u32]) -> Self {
        self.priorities = Some(shares.to_vec());
        self
    }

    /// Checks the configuration and makes the bulkhead.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] whose [`kind`](BuildError::kind) says what is wrong:
    /// no or a zero `max_concurrent_calls`, one above
    /// [`Semaphore::MAX_PERMITS`], an empty name, a zero `call_timeout`, or a
    /// timed setting with no timer available.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BuildErrorKind};
    ///
    /// let err = Bulkhead::builder().max_concurrent_calls(0).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::ZeroLimit);
    /// assert_eq!(err.to_string(), "max_concurrent_calls must be at least 1");
    /// ```
    pub fn build(self) -> Result<Bulkhead, BuildError> {
        let limit = match self.max_concurrent_calls {
            None => return Err(BuildError::new(BuildErrorKind::MissingLimit)),
            Some(n) => check_limit(n)?,
        };
        let fair = self.fair;
        let line_apart = self.line_apart;
        let classes = match self.priorities.as_deref() {
            None => None,
            Some(shares) if !shares.iter().any(|&s| s > 0) => {
                return Err(BuildError::new(BuildErrorKind::NoPriorityShare));
            }
            // With controlled delay, each class's line has its own.
            Some(shares) => Some(Box::new(Classes::new(
                limit,
                shares,
                self.max_queue,
                self.queue_delay,
                self.adaptive_lifo,
            ))),
        };
        let mut policy = self.into_policy(None, limit)?;
        // With classes, the seats are theirs: the semaphore has none and is
        // closed, so a plain call's fast path fails into the branch for a
        // closed bulkhead, which goes to where they are.
        let permits = if classes.is_some() { 0 } else { limit };
        let sem = Arc::new(if fair {
            Semaphore::new(permits)
        } else {
            Semaphore::new_unfair(permits)
        });
        if classes.is_some() {
            sem.close();
            // The classes' lines are the only ones, and have the delay.
            policy.no_line_delay();
        } else {
            // A line that waits partly apart is counted by the policy, and
            // its waiters' deadlines are not in the queue's order: no line
            // timer either (each wait keeps its own sleep).
            if !line_apart {
                policy.line_of(&sem);
                policy.time_line(&sem);
            }
            policy.delay_line(&sem);
        }
        Ok(Bulkhead {
            shared: Arc::new(Shared {
                policy,
                sem,
                classes,
                limit: Mutex::new(limit),
                limit_now: AtomicUsize::new(limit),
                idle: Idle::default(),
            }),
        })
    }
}

impl BulkheadBuilder {
    /// The checks every builder shares (this one, the keyed and the Redis
    /// builders): the name (`name` overrides the builder's, else
    /// `default_name`), `call_timeout`, `leak_threshold`, and the timer,
    /// resolved once (a timed setting needs one that works here).
    pub(crate) fn check(
        &self,
        name: Option<String>,
        default_name: &str,
    ) -> Result<Checked, BuildError> {
        let fail = |kind| Err(BuildError::new(kind));
        let name = name
            .or_else(|| self.name.clone())
            .unwrap_or_else(|| default_name.to_owned());
        if name.is_empty() {
            return fail(BuildErrorKind::EmptyName);
        }
        if self.call_timeout == Some(Duration::ZERO) {
            return fail(BuildErrorKind::ZeroCallTimeout);
        }
        if self.leak_threshold == Some(Duration::ZERO) {
            return fail(BuildErrorKind::ZeroLeakThreshold);
        }
        if self.queue_delay.is_some_and(|(target, _)| target.is_zero()) {
            return fail(BuildErrorKind::ZeroQueueDelayTarget);
        }
        if let (Some((target, _)), Some(max_wait)) = (self.queue_delay, self.max_wait) {
            if target >= max_wait {
                return fail(BuildErrorKind::QueueDelayTargetNotBelowMaxWait);
            }
        }
        if self.adaptive_lifo && self.queue_delay.is_none() {
            return fail(BuildErrorKind::AdaptiveLifoWithoutQueueDelay);
        }
        if self.adaptive_lifo && !self.fair {
            return fail(BuildErrorKind::AdaptiveLifoUnfair);
        }
        let needs_timer = self.max_wait.is_some_and(|d| !d.is_zero())
            || self.call_timeout.is_some()
            || self.leak_threshold.is_some()
            || self.queue_delay.is_some();
        // Resolved once: the bundled timers' sleeps then live inline in the
        // waiting futures. Without a timer of the user's, every sleep runs
        // on the timer of the runtime it is made in.
        let clock = match &self.timer {
            Some(timer) => Some(Clock::of(timer.clone())),
            None if needs_timer => Some(Clock::Auto),
            None => None,
        };
        if let Some(clock) = &clock {
            // Where it can be known now: a runtime without a time driver,
            // or no timer at all.
            if clock.check().is_err() {
                return fail(match clock {
                    Clock::Auto if !in_tokio_runtime() => BuildErrorKind::NoTimer,
                    _ => BuildErrorKind::TimerUnavailable,
                });
            }
        }
        Ok(Checked { name, clock })
    }

    /// Everything but the permits: checks the name, `call_timeout` and the
    /// timer, and gathers the observers. `name` overrides the builder's
    /// (the Redis bulkhead takes its semaphore's).
    pub(crate) fn into_policy(
        self,
        name: Option<String>,
        limit: usize,
    ) -> Result<Policy, BuildError> {
        let Checked { name, clock } = self.check(name, "bulkhead")?;
        // The exporters first, so a user's panicking observer cannot keep
        // them from an event (and leave a gauge wrong).
        let mut observers = self.exports.observers(&name, self.metrics_series);
        observers.extend(self.observers);
        Ok(Policy::new(Settings {
            name: super::name::intern(&name),
            max_wait: self.max_wait,
            max_queue: self.max_queue,
            call_timeout: self.call_timeout,
            clock,
            observers,
            limit,
            leak_threshold: self.leak_threshold,
            queue_delay: self.queue_delay,
            adaptive_lifo: self.adaptive_lifo,
            reports_later: self.reports_later,
            #[cfg(feature = "tracing")]
            spans: self.exports.tracing,
        }))
    }
}

impl fmt::Debug for BulkheadBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadBuilder")
            .field("name", &self.name)
            .field("max_concurrent_calls", &self.max_concurrent_calls)
            .field("max_wait", &self.max_wait)
            .field("max_queue", &self.max_queue)
            .field("call_timeout", &self.call_timeout)
            .field("fair", &self.fair)
            .field("timer", &self.timer)
            .field("observers", &self.observers.len())
            .field("exports", &self.exports)
            .field("leak_threshold", &self.leak_threshold)
            .field("queue_delay", &self.queue_delay)
            .field("adaptive_lifo", &self.adaptive_lifo)
            .field("priorities", &self.priorities)
            .finish()
    }
}

/// Whether this runs inside a tokio runtime.
fn in_tokio_runtime() -> bool {
    #[cfg(feature = "tokio")]
    return ::tokio::runtime::Handle::try_current().is_ok();
    #[cfg(not(feature = "tokio"))]
    false
}
