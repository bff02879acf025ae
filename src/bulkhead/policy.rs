//! The bulkhead's policy, apart from where permits come from: fail fast or
//! wait in a bounded line for at most `max_wait`, bound each call's run
//! time, count everything and tell the observer. The in-process
//! [`Bulkhead`](crate::Bulkhead) and the Redis bulkhead share it.

use core::future::Future;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use super::error::{BulkheadError, RejectReason, Rejected};
use super::metrics::Counters;
use super::observer::{CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection};
use super::timeout::Timeout;
use crate::timer::{Sleep, Timer};

pub(crate) struct Policy {
    pub(crate) name: Arc<str>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) max_queue: Option<usize>,
    pub(crate) call_timeout: Option<Duration>,
    /// Present whenever `max_wait` is non-zero or `call_timeout` is set.
    pub(crate) timer: Option<Arc<dyn Timer>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) counters: Counters,
    /// Callers waiting for a permit now (the bounded line).
    pub(crate) waiting: AtomicUsize,
    /// Report permits held longer than this (needs `timer`).
    pub(crate) leak_threshold: Option<Duration>,
    /// The permits under watch for leaks, by id (only with a threshold).
    watches: Mutex<HashMap<u64, LeakWatch>>,
    /// The next watch id; 0 means "not watched".
    next_watch: AtomicU64,
    /// Run each admitted call of `call` inside a `bulkhead_call` span
    /// (the `tracing` exporter).
    #[cfg(feature = "tracing")]
    pub(crate) spans: bool,
    /// The limit, as last known, for retry hints.
    pub(crate) hint_limit: AtomicUsize,
    /// A moving average of hold times in nanoseconds (0: no sample yet),
    /// from the calls that `clock` times.
    hold_ns: AtomicU64,
}

/// The future of [`Policy::traced`].
#[cfg(feature = "tracing")]
pub(crate) type Traced<F> = tracing::instrument::Instrumented<F>;
/// The future of [`Policy::traced`].
#[cfg(not(feature = "tracing"))]
pub(crate) type Traced<F> = F;

/// What a builder decided, for `Policy::new`.
pub(crate) struct Settings {
    pub(crate) name: Arc<str>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) max_queue: Option<usize>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) timer: Option<Arc<dyn Timer>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// The limit at first, for retry hints.
    pub(crate) limit: usize,
    pub(crate) leak_threshold: Option<Duration>,
    /// See `Policy::spans`.
    #[cfg(feature = "tracing")]
    pub(crate) spans: bool,
}

/// One call in this many has its hold time measured for retry hints even
/// when permits are plentiful, so the uncontended path rarely reads the
/// clock (which costs tens of nanoseconds on some virtual machines).
const HOLD_SAMPLE: u64 = 64;

impl Policy {
    pub(crate) fn new(settings: Settings) -> Self {
        let Settings {
            name,
            max_wait,
            max_queue,
            call_timeout,
            timer,
            observer,
            limit,
            leak_threshold,
            #[cfg(feature = "tracing")]
            spans,
        } = settings;
        Self {
            name,
            max_wait,
            max_queue,
            call_timeout,
            timer,
            observer,
            counters: Counters::default(),
            waiting: AtomicUsize::new(0),
            leak_threshold,
            #[cfg(feature = "tracing")]
            spans,
            watches: Mutex::new(HashMap::new()),
            next_watch: AtomicU64::new(1),
            hint_limit: AtomicUsize::new(limit),
            hold_ns: AtomicU64::new(0),
        }
    }

    /// Callers in the waiting line now.
    pub(crate) fn queued(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The waiting part of admission, once no permit was free at once:
    /// fail fast if `max_wait` is zero, else take a place in the bounded
    /// line and wait for `acquire` for at most `max_wait`. Resolves to the
    /// permit and the time waited.
    pub(crate) async fn wait_for<P>(
        &self,
        acquire: impl Future<Output = Result<P, RejectReason>>,
    ) -> Result<(P, Duration), Rejected> {
        if self.max_wait == Some(Duration::ZERO) {
            return Err(self.reject(RejectReason::Full, Duration::ZERO));
        }
        let place = Place::take(&self.waiting);
        if self.max_queue.is_some_and(|max| place.ahead >= max) {
            drop(place);
            return Err(self.reject(RejectReason::Full, Duration::ZERO));
        }
        let start = Instant::now();
        let outcome = match (self.max_wait, &self.timer) {
            (Some(limit), Some(timer)) => match Timeout::new(acquire, timer.sleep(limit)).await {
                Ok(acquired) => acquired,
                Err(_elapsed) => Err(RejectReason::Timeout),
            },
            _ => acquire.await,
        };
        drop(place);
        let waited = start.elapsed();
        match outcome {
            Ok(permit) => Ok((permit, waited)),
            Err(reason) => Err(self.reject(reason, waited)),
        }
    }

    /// Runs an admitted call under `call_timeout`; returns its result and
    /// how it ended, for the observer.
    pub(crate) async fn run<F, T, E>(&self, call: F) -> (Result<T, BulkheadError<E>>, CallOutcome)
    where
        F: Future<Output = Result<T, E>>,
    {
        let result = match (self.call_timeout, &self.timer) {
            (Some(limit), Some(timer)) => match Timeout::new(call, timer.sleep(limit)).await {
                Ok(out) => out.map_err(BulkheadError::Inner),
                Err(_elapsed) => {
                    Counters::bump(&self.counters.call_timeouts);
                    Err(BulkheadError::CallTimeout)
                }
            },
            _ => call.await.map_err(BulkheadError::Inner),
        };
        let outcome = match &result {
            Ok(_) => CallOutcome::Success,
            Err(BulkheadError::CallTimeout) => CallOutcome::TimedOut,
            Err(_) => CallOutcome::Failure,
        };
        (result, outcome)
    }

    /// The admitted call, inside a `bulkhead_call` span naming the
    /// bulkhead when the `tracing` exporter is on (so the call's own events
    /// show which bulkhead admitted them); unchanged otherwise.
    #[inline]
    pub(crate) fn traced<F: Future>(&self, call: F) -> Traced<F> {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            let span = if self.spans {
                tracing::debug_span!(target: "bulkhead", "bulkhead_call", bulkhead = &*self.name)
            } else {
                tracing::Span::none()
            };
            call.instrument(span)
        }
        #[cfg(not(feature = "tracing"))]
        call
    }

    /// Counts an admitted call and tells the observer. Call it once the
    /// permit is owned by a guard.
    #[inline]
    pub(crate) fn permitted(&self, waited: Duration) {
        Counters::bump(&self.counters.permitted);
        if let Some(observer) = &self.observer {
            observer.on_permitted(&Permitted {
                name: &self.name,
                waited,
            });
        }
    }

    #[cold]
    pub(crate) fn reject(&self, reason: RejectReason, waited: Duration) -> Rejected {
        let c = &self.counters;
        Counters::bump(match reason {
            RejectReason::Full => &c.rejected_full,
            RejectReason::Timeout => &c.rejected_timeout,
            RejectReason::Closed => &c.rejected_closed,
            RejectReason::Unavailable => &c.rejected_unavailable,
        });
        if let Some(observer) = &self.observer {
            observer.on_rejected(&Rejection {
                name: &self.name,
                reason,
                waited,
            });
        }
        Rejected::new(reason, waited, self.name.clone(), self.retry_hint(reason))
    }

    /// How long until a rejected caller may find a free permit: see
    /// [`Rejected::retry_after`].
    fn retry_hint(&self, reason: RejectReason) -> Option<Duration> {
        if !matches!(reason, RejectReason::Full | RejectReason::Timeout) {
            return None;
        }
        let hold = self.hold_ns.load(Ordering::Relaxed);
        if hold == 0 {
            return None;
        }
        let ahead = self.queued() as u128 + 1;
        let limit = self.hint_limit.load(Ordering::Relaxed).max(1) as u128;
        let ns = (u128::from(hold) * ahead).div_ceil(limit);
        Some(Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }

    /// When a permit was granted, for the hold time: measured when an
    /// observer listens, when the grant left no permit free (the calls
    /// whose hold times decide when a rejected caller can come back), and
    /// for one call in `HOLD_SAMPLE` otherwise.
    #[inline]
    pub(crate) fn clock(&self, busy: bool) -> Option<Instant> {
        let sampled = self.counters.permitted.load(Ordering::Relaxed) % HOLD_SAMPLE == 0;
        (busy || sampled || self.observer.is_some()).then(Instant::now)
    }

    /// Folds one hold time into the moving average (weight 1/4). Racing
    /// updates may lose one sample; the average stays an average.
    fn record_hold(&self, held: Duration) {
        let held = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX).max(1);
        let old = self.hold_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            held
        } else {
            (old - old / 4).saturating_add(held / 4).max(1)
        };
        self.hold_ns.store(new, Ordering::Relaxed);
    }

    /// Tells the observer that a call granted at `since` ended. Call it
    /// after the permit is given back, with no lock held.
    #[inline]
    pub(crate) fn finished(&self, since: Option<Instant>, outcome: CallOutcome) {
        let held = since.map_or(Duration::ZERO, |t| t.elapsed());
        if since.is_some() {
            self.record_hold(held);
        }
        if let Some(observer) = &self.observer {
            let outcome = if std::thread::panicking() {
                CallOutcome::Panicked
            } else {
                outcome
            };
            observer.on_finished(&Finished {
                name: &self.name,
                held,
                outcome,
            });
        }
    }
}

impl Policy {
    /// Starts watching a newly granted permit for a leak, if a threshold
    /// is set: a sleep of the threshold, polled once with a waker that
    /// reports the leak when the timer fires. Returns the watch's id (0:
    /// none), for [`unwatch`](Self::unwatch) when the permit goes back. The
    /// watches live in the policy, so a permit's guard holds a plain
    /// number and needs no drop glue for them.
    #[inline]
    pub(crate) fn watch(&self) -> u64 {
        match self.leak_threshold {
            None => 0,
            Some(threshold) => self.start_watch(threshold),
        }
    }

    /// Cancels the watch `id` (the permit went back): disarms its report
    /// and drops its sleep, outside the watches' lock.
    #[inline]
    pub(crate) fn unwatch(&self, id: u64) {
        if id != 0 {
            self.stop_watch(id);
        }
    }

    #[cold]
    fn stop_watch(&self, id: u64) {
        let watch = self
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        drop(watch);
    }

    #[cold]
    fn start_watch(&self, threshold: Duration) -> u64 {
        let Some(timer) = self.timer.as_ref() else {
            return 0;
        };
        let check = Arc::new(LeakCheck {
            name: self.name.clone(),
            observer: self.observer.clone(),
            leaks: self.counters.leaks_suspected.clone(),
            since: Instant::now(),
            threshold,
            state: AtomicU8::new(ARMED),
        });
        let mut sleep = timer.sleep(threshold);
        let waker = Waker::from(check.clone());
        if sleep
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            waker.wake_by_ref();
        }
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                LeakWatch {
                    _sleep: sleep,
                    check,
                },
            );
        id
    }
}

/// A permit under watch for leaks; dropped when the permit goes back.
struct LeakWatch {
    _sleep: Sleep,
    check: Arc<LeakCheck>,
}

impl Drop for LeakWatch {
    fn drop(&mut self) {
        self.check.state.store(DISARMED, Ordering::Release);
    }
}

const ARMED: u8 = 0;
const DISARMED: u8 = 1;
const FIRED: u8 = 2;

/// The waker of a leak watch's sleep: when the timer wakes it, the permit
/// is still held unless the watch was dropped first.
struct LeakCheck {
    name: Arc<str>,
    observer: Option<Arc<dyn Observer>>,
    leaks: Arc<AtomicU64>,
    since: Instant,
    threshold: Duration,
    state: AtomicU8,
}

impl Wake for LeakCheck {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Spurious or repeated wake-ups report once, and only while held.
        if self
            .state
            .compare_exchange(ARMED, FIRED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let held = self.since.elapsed();
        if held < self.threshold {
            // Woken early (a timer may wake spuriously): not a leak yet.
            self.state.store(ARMED, Ordering::Release);
            return;
        }
        self.leaks.fetch_add(1, Ordering::Relaxed);
        if let Some(observer) = &self.observer {
            observer.on_leak_suspected(&LeakSuspected {
                name: &self.name,
                held,
                threshold: self.threshold,
            });
        }
    }
}

/// A place in the waiting line, given up on drop (also when the waiting
/// future is cancelled).
struct Place<'a> {
    waiting: &'a AtomicUsize,
    /// How many were waiting before this caller.
    ahead: usize,
}

impl<'a> Place<'a> {
    fn take(waiting: &'a AtomicUsize) -> Self {
        let ahead = waiting.fetch_add(1, Ordering::Relaxed);
        Self { waiting, ahead }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}
