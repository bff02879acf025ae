//! Counters kept by a bulkhead and the snapshot users read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::reason::{REASONS, RejectReason};

/// Totals since the bulkhead was created. Each is bumped with one relaxed
/// `fetch_add`; a snapshot reads them one by one, so counts taken while calls
/// run may be a step apart from each other.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) permitted: AtomicU64,
    /// Rejections, by [`RejectReason::index`].
    pub(crate) rejected: [AtomicU64; REASONS],
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
/// use watertight::Bulkhead;
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
    pub(crate) name: &'static str,
    pub(crate) max_concurrent_calls: usize,
    pub(crate) in_flight: usize,
    pub(crate) queued: usize,
    pub(crate) max_queue: Option<usize>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) closed: bool,
    pub(crate) permitted: u64,
    /// Rejections, by [`RejectReason::index`].
    pub(crate) rejected: [u64; REASONS],
    pub(crate) call_timeouts: u64,
    pub(crate) leaks_suspected: u64,
}

impl Metrics {
    /// The bulkhead's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("billing").max_concurrent_calls(1).build().unwrap();
    /// assert_eq!(bh.metrics().name(), "billing");
    /// ```
    pub fn name(&self) -> &str {
        self.name
    }

    /// The configured limit on calls in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(4).build().unwrap();
    /// bh.set_max_concurrent_calls(6);
    /// assert_eq!(bh.metrics().max_concurrent_calls(), 6);
    /// ```
    pub fn max_concurrent_calls(&self) -> usize {
        self.max_concurrent_calls
    }

    /// Calls holding a permit now. It can exceed
    /// [`max_concurrent_calls`](Self::max_concurrent_calls) for a while
    /// after the limit was lowered: calls in flight are never cut short.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    /// let a = bh.try_acquire().unwrap();
    /// let b = bh.try_acquire().unwrap();
    /// bh.set_max_concurrent_calls(1);
    /// assert_eq!(bh.metrics().in_flight(), 2); // over the new limit, not cut short
    /// drop((a, b));
    /// assert_eq!(bh.metrics().in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Permits free now: how many more calls would be admitted at once
    /// (zero while over the limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(3).build().unwrap();
    /// let _p = bh.try_acquire().unwrap();
    /// assert_eq!(bh.metrics().available(), 2);
    /// bh.set_max_concurrent_calls(0);
    /// assert_eq!(bh.metrics().available(), 0);
    /// ```
    pub fn available(&self) -> usize {
        self.max_concurrent_calls.saturating_sub(self.in_flight)
    }

    /// Callers waiting for a permit now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// let mut waiting = pin!(bh.acquire());
    /// let _ = waiting.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    /// assert_eq!(bh.metrics().queued(), 1);
    /// ```
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// The bound on the waiting line, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).max_queue(50).build().unwrap();
    /// assert_eq!(bh.metrics().max_queue(), Some(50));
    /// ```
    pub fn max_queue(&self) -> Option<usize> {
        self.max_queue
    }

    /// How long a caller may wait, if bounded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::ZERO)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.metrics().max_wait(), Some(Duration::ZERO));
    /// ```
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// Whether the bulkhead was closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// assert!(!bh.metrics().is_closed());
    /// bh.close();
    /// assert!(bh.metrics().is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Calls admitted so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// drop(bh.try_acquire().unwrap());
    /// drop(bh.try_acquire().unwrap());
    /// assert_eq!(bh.metrics().permitted(), 2);
    /// ```
    pub fn permitted(&self) -> u64 {
        self.permitted
    }

    /// Calls rejected because no permit was free and there was no room or
    /// time to wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// assert!(bh.try_acquire().is_err());
    /// assert_eq!(bh.metrics().rejected_full(), 1);
    /// ```
    pub fn rejected_full(&self) -> u64 {
        self.rejected_for(RejectReason::Full)
    }

    /// Calls rejected after waiting `max_wait`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// assert!(bh.acquire().await.is_err());
    /// assert_eq!(bh.metrics().rejected_timeout(), 1);
    /// # });
    /// ```
    pub fn rejected_timeout(&self) -> u64 {
        self.rejected_for(RejectReason::Timeout)
    }

    /// Calls rejected because the bulkhead was closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// bh.close();
    /// assert!(bh.try_acquire().is_err());
    /// assert_eq!(bh.metrics().rejected_closed(), 1);
    /// ```
    pub fn rejected_closed(&self) -> u64 {
        self.rejected_for(RejectReason::Closed)
    }

    /// Calls rejected because the shared permits (the Redis backend) could
    /// not be reached. Always zero for an in-process bulkhead.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// assert_eq!(bh.metrics().rejected_unavailable(), 0); // in-process: never
    /// ```
    pub fn rejected_unavailable(&self) -> u64 {
        self.rejected_for(RejectReason::Unavailable)
    }

    /// Calls rejected because they could not make the deadline they
    /// carried ([`RejectReason::WontMakeDeadline`](crate::RejectReason::WontMakeDeadline)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::{Bulkhead, CallOptions};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let passed = CallOptions::new().deadline(Instant::now() - Duration::from_millis(1));
    /// assert!(bh.call_with(passed, async { Ok::<(), ()>(()) }).await.is_err());
    /// assert_eq!(bh.metrics().rejected_deadline(), 1);
    /// # });
    /// ```
    pub fn rejected_deadline(&self) -> u64 {
        self.rejected_for(RejectReason::WontMakeDeadline)
    }

    /// Waiting calls cut by controlled delay
    /// ([`RejectReason::QueueDelay`](crate::RejectReason::QueueDelay)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.metrics().rejected_queue_delay(), 0); // nobody waited
    /// ```
    pub fn rejected_queue_delay(&self) -> u64 {
        self.rejected_for(RejectReason::QueueDelay)
    }

    /// Waiting calls displaced from a full line by a more important class
    /// ([`RejectReason::Displaced`](crate::RejectReason::Displaced)).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(4)
    ///     .priorities(&[3, 1])
    ///     .max_queue(10)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.metrics().rejected_displaced(), 0); // nobody waited
    /// ```
    pub fn rejected_displaced(&self) -> u64 {
        self.rejected_for(RejectReason::Displaced)
    }

    /// All rejections.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let held = bh.try_acquire().unwrap();
    /// assert!(bh.try_acquire().is_err()); // full
    /// bh.close();
    /// assert!(bh.try_acquire().is_err()); // closed
    /// assert_eq!(bh.metrics().rejected(), 2);
    /// drop(held);
    /// ```
    pub fn rejected(&self) -> u64 {
        self.rejected.iter().sum()
    }

    /// Rejections for `reason`.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// assert!(bh.try_acquire().is_err());
    /// let m = bh.metrics();
    /// assert_eq!(m.rejected_for(RejectReason::Full), 1);
    /// assert_eq!(m.rejected_for(RejectReason::Timeout), 0);
    /// ```
    pub fn rejected_for(&self, reason: RejectReason) -> u64 {
        self.rejected[reason.index()]
    }

    /// Admitted calls that have given their permit back
    /// (`permitted - in_flight`).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    /// drop(bh.try_acquire().unwrap());
    /// let _running = bh.try_acquire().unwrap();
    /// let m = bh.metrics();
    /// assert_eq!((m.permitted(), m.in_flight(), m.finished()), (2, 1, 1));
    /// ```
    pub fn finished(&self) -> u64 {
        self.permitted.saturating_sub(self.in_flight as u64)
    }

    /// Admitted calls cut off by `call_timeout`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, BulkheadError};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .call_timeout(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap();
    /// let slow = bh.call(async {
    ///     std::future::pending::<()>().await;
    ///     Ok::<(), ()>(())
    /// });
    /// assert!(matches!(slow.await, Err(BulkheadError::CallTimeout(_))));
    /// assert_eq!(bh.metrics().call_timeouts(), 1);
    /// # });
    /// ```
    pub fn call_timeouts(&self) -> u64 {
        self.call_timeouts
    }

    /// Permits held past the bulkhead's
    /// [`leak_threshold`](crate::BulkheadBuilder::leak_threshold).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .leak_threshold(Duration::from_secs(60))
    ///     .build()
    ///     .unwrap();
    /// drop(bh.try_acquire().unwrap()); // released well within a minute
    /// assert_eq!(bh.metrics().leaks_suspected(), 0);
    /// ```
    pub fn leaks_suspected(&self) -> u64 {
        self.leaks_suspected
    }
}
