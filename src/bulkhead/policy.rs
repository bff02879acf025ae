//! The bulkhead's policy, apart from where permits come from: fail fast or
//! wait in a bounded line for at most `max_wait`, bound each call's run
//! time, count everything and tell the observer. The in-process
//! [`Bulkhead`](crate::Bulkhead) and the Redis bulkhead share it.

use core::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::error::{BulkheadError, RejectReason, Rejected};
use super::metrics::Counters;
use super::observer::{CallOutcome, Finished, Observer, Permitted, Rejection};
use super::timeout::Timeout;
use crate::timer::Timer;

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
}

impl Policy {
    pub(crate) fn new(
        name: Arc<str>,
        max_wait: Option<Duration>,
        max_queue: Option<usize>,
        call_timeout: Option<Duration>,
        timer: Option<Arc<dyn Timer>>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        Self {
            name,
            max_wait,
            max_queue,
            call_timeout,
            timer,
            observer,
            counters: Counters::default(),
            waiting: AtomicUsize::new(0),
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
        Rejected::new(reason, waited, self.name.clone())
    }

    /// When a permit was granted, for the observer's hold time; only
    /// measured when an observer listens.
    #[inline]
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.observer.as_ref().map(|_| Instant::now())
    }

    /// Tells the observer that a call granted at `since` ended. Call it
    /// after the permit is given back, with no lock held.
    #[inline]
    pub(crate) fn finished(&self, since: Option<Instant>, outcome: CallOutcome) {
        if let Some(observer) = &self.observer {
            let outcome = if std::thread::panicking() {
                CallOutcome::Panicked
            } else {
                outcome
            };
            observer.on_finished(&Finished {
                name: &self.name,
                held: since.map_or(Duration::ZERO, |t| t.elapsed()),
                outcome,
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
