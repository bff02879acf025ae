//! Counters kept by a bulkhead and the snapshot users read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Totals since the bulkhead was created. Each is bumped with one relaxed
/// `fetch_add`; a snapshot reads them one by one, so counts taken while calls
/// run may be a step apart from each other.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) permitted: AtomicU64,
    pub(crate) rejected_full: AtomicU64,
    pub(crate) rejected_timeout: AtomicU64,
    pub(crate) rejected_closed: AtomicU64,
    pub(crate) rejected_unavailable: AtomicU64,
    pub(crate) call_timeouts: AtomicU64,
    /// Shared with the leak watches, which outlive a borrow of the policy.
    pub(crate) leaks_suspected: std::sync::Arc<AtomicU64>,
}

impl Counters {
    #[inline]
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A snapshot of a bulkhead's state and totals, from
/// [`Bulkhead::metrics`](crate::Bulkhead::metrics).
///
/// Gauges (`usize`) are the values at the moment of the snapshot; totals
/// (`u64`) count since the bulkhead was created.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use bulkhead::Bulkhead;
///
/// let bh = Bulkhead::builder()
///     .name("inventory")
///     .max_concurrent_calls(2)
///     .max_wait(Duration::ZERO)
///     .build()
///     .unwrap();
/// let a = bh.try_acquire().unwrap();
/// let _b = bh.try_acquire().unwrap();
/// assert!(bh.try_acquire().is_err());
/// drop(a);
///
/// let m = bh.metrics();
/// assert_eq!(m.name(), "inventory");
/// assert_eq!(m.max_concurrent_calls(), 2);
/// assert_eq!(m.in_flight(), 1);
/// assert_eq!((m.permitted(), m.rejected_full(), m.finished()), (2, 1, 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    pub(crate) name: std::sync::Arc<str>,
    pub(crate) max_concurrent_calls: usize,
    pub(crate) in_flight: usize,
    pub(crate) queued: usize,
    pub(crate) max_queue: Option<usize>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) closed: bool,
    pub(crate) permitted: u64,
    pub(crate) rejected_full: u64,
    pub(crate) rejected_timeout: u64,
    pub(crate) rejected_closed: u64,
    pub(crate) rejected_unavailable: u64,
    pub(crate) call_timeouts: u64,
    pub(crate) leaks_suspected: u64,
}

impl Metrics {
    /// The bulkhead's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configured limit on calls in flight.
    pub fn max_concurrent_calls(&self) -> usize {
        self.max_concurrent_calls
    }

    /// Calls holding a permit now. It can exceed
    /// [`max_concurrent_calls`](Self::max_concurrent_calls) for a while
    /// after the limit was lowered: calls in flight are never cut short.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Permits free now: how many more calls would be admitted at once
    /// (zero while over the limit).
    pub fn available(&self) -> usize {
        self.max_concurrent_calls.saturating_sub(self.in_flight)
    }

    /// Callers waiting for a permit now.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// The bound on the waiting line, if any.
    pub fn max_queue(&self) -> Option<usize> {
        self.max_queue
    }

    /// How long a caller may wait, if bounded.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// Whether the bulkhead was closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Calls admitted so far.
    pub fn permitted(&self) -> u64 {
        self.permitted
    }

    /// Calls rejected because no permit was free and there was no room or
    /// time to wait.
    pub fn rejected_full(&self) -> u64 {
        self.rejected_full
    }

    /// Calls rejected after waiting `max_wait`.
    pub fn rejected_timeout(&self) -> u64 {
        self.rejected_timeout
    }

    /// Calls rejected because the bulkhead was closed.
    pub fn rejected_closed(&self) -> u64 {
        self.rejected_closed
    }

    /// Calls rejected because the shared permits (the Redis backend) could
    /// not be reached. Always zero for an in-process bulkhead.
    pub fn rejected_unavailable(&self) -> u64 {
        self.rejected_unavailable
    }

    /// All rejections.
    pub fn rejected(&self) -> u64 {
        self.rejected_full
            + self.rejected_timeout
            + self.rejected_closed
            + self.rejected_unavailable
    }

    /// Admitted calls that have given their permit back
    /// (`permitted - in_flight`).
    pub fn finished(&self) -> u64 {
        self.permitted.saturating_sub(self.in_flight as u64)
    }

    /// Admitted calls cut off by `call_timeout`.
    pub fn call_timeouts(&self) -> u64 {
        self.call_timeouts
    }

    /// Permits held past the bulkhead's
    /// [`leak_threshold`](crate::BulkheadBuilder::leak_threshold).
    pub fn leaks_suspected(&self) -> u64 {
        self.leaks_suspected
    }
}
