//! The settings of a [`LeasedBulkhead`], checked once by `build`.

use std::sync::Arc;
use std::time::Duration;

use super::LeasedBulkhead;
use super::handoff::LocalLine;
use super::store::LeaseStore;
use crate::bulkhead::observer::Observer;
use crate::timer::Timer;
use crate::{BuildError, BuildErrorKind, BulkheadBuilder};

/// Configures a [`LeasedBulkhead`]: the settings of [`BulkheadBuilder`]
/// that apply to a shared limit.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LeasedBulkheadBuilder<S: LeaseStore> {
    sem: S,
    policy: BulkheadBuilder,
    classes: Option<usize>,
}

impl<S: LeaseStore> LeasedBulkheadBuilder<S> {
    pub(super) fn new(sem: S) -> Self {
        Self {
            sem,
            policy: BulkheadBuilder::new(),
            classes: None,
        }
    }

    /// As [`BulkheadBuilder::max_wait`]: `Duration::ZERO` fails fast after
    /// one call to the store.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.policy = self.policy.max_wait(max_wait);
        self
    }

    /// As [`BulkheadBuilder::max_queue`], counted per process.
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.policy = self.policy.max_queue(max_queue);
        self
    }

    /// As [`BulkheadBuilder::queue_delay`], on this process's line:
    /// while the waiters of this process have all waited at least
    /// `target` for an `interval`, a waiter that has waited `target` is
    /// rejected with [`RejectReason::QueueDelay`](crate::RejectReason::QueueDelay) (at its own sleep, or at
    /// its next look at the store, whichever comes first). The line in the
    /// store keeps its arrival order.
    pub fn queue_delay(mut self, target: Duration, interval: Duration) -> Self {
        self.policy = self.policy.queue_delay(target, interval);
        self
    }

    /// Priority classes on this process's line: `classes` classes, 0 the
    /// most important, named by [`CallOptions::class`](crate::CallOptions::class) (a class past the
    /// last, or none, is the least important). A lease the store grants to
    /// one of this process's waiters goes to the first to arrive of the
    /// most important class waiting here; a waiter that hands its lease on
    /// goes back to the end of the store's line, within its own limits
    /// (`max_wait`, a deadline). The store's line keeps its arrival order,
    /// so other processes are served as without classes, and no permit is
    /// set aside for a class: the limit is shared with every process.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn doc(sem: watertight::redis::RedisSemaphore) {
    /// use std::time::Duration;
    /// use watertight::CallOptions;
    /// use watertight::redis::RedisBulkhead;
    ///
    /// let bh = RedisBulkhead::builder(sem)
    ///     .max_wait(Duration::from_secs(1))
    ///     .priority_classes(2)
    ///     .build()
    ///     .unwrap();
    /// // Served before this process's callers of class 1 that wait too.
    /// let urgent = bh.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(()) });
    /// # urgent.await.unwrap();
    /// # }
    /// ```
    pub fn priority_classes(mut self, classes: usize) -> Self {
        self.classes = Some(classes);
        self
    }

    /// As [`BulkheadBuilder::adaptive_lifo`], on this process's line
    /// (needs [`queue_delay`](Self::queue_delay)): while it stands, a
    /// lease granted to one of this process's waiters goes to its newest
    /// waiter (of the most important class), and the one it was granted
    /// to goes back to the end of the store's line. The store's line keeps
    /// its arrival order.
    pub fn adaptive_lifo(mut self, on: bool) -> Self {
        self.policy = self.policy.adaptive_lifo(on);
        self
    }

    /// As [`BulkheadBuilder::call_timeout`].
    pub fn call_timeout(mut self, call_timeout: Duration) -> Self {
        self.policy = self.policy.call_timeout(call_timeout);
        self
    }

    /// As [`BulkheadBuilder::timer`].
    pub fn timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.policy = self.policy.timer(timer);
        self
    }

    /// As [`BulkheadBuilder::observer`].
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.policy = self.policy.observer(observer);
        self
    }

    /// As [`BulkheadBuilder::leak_threshold`].
    pub fn leak_threshold(mut self, threshold: Duration) -> Self {
        self.policy = self.policy.leak_threshold(threshold);
        self
    }

    /// As [`BulkheadBuilder::exporters`].
    pub fn exporters(mut self, enabled: bool) -> Self {
        self.policy = self.policy.exporters(enabled);
        self
    }

    /// As [`BulkheadBuilder::export_metrics`].
    pub fn export_metrics(mut self, enabled: bool) -> Self {
        self.policy = self.policy.export_metrics(enabled);
        self
    }

    /// As [`BulkheadBuilder::export_tracing`].
    pub fn export_tracing(mut self, enabled: bool) -> Self {
        self.policy = self.policy.export_tracing(enabled);
        self
    }

    /// As [`BulkheadBuilder::trace_levels`].
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn trace_levels(mut self, levels: crate::observer::TraceLevels) -> Self {
        self.policy = self.policy.trace_levels(levels);
        self
    }

    /// Makes the bulkhead; it takes its name from the semaphore.
    ///
    /// # Errors
    ///
    /// As [`BulkheadBuilder::build`], for the settings above, and
    /// [`BuildErrorKind::NoPriorityClass`](crate::BuildErrorKind::NoPriorityClass)
    /// for `priority_classes(0)`.
    pub fn build(self) -> Result<LeasedBulkhead<S>, BuildError> {
        let local = match (self.classes, self.policy.adaptive_lifo) {
            (Some(0), _) => return Err(BuildError::new(BuildErrorKind::NoPriorityClass)),
            (Some(classes), _) => Some(LocalLine::new(classes)),
            (None, true) => Some(LocalLine::new(1)),
            (None, false) => None,
        };
        let name = self.sem.local().name().to_owned();
        // The permits free are the fleet's, which only the store knows.
        #[cfg_attr(not(feature = "metrics"), allow(unused_mut))]
        let mut policy = self.policy;
        #[cfg(feature = "metrics")]
        {
            let exporter = crate::bulkhead::export::MetricsExporter::without_available(&name);
            policy.metrics_series = Some(Arc::new(exporter));
        }
        let policy = policy.into_policy(Some(name), self.sem.local().limit_seen())?;
        Ok(LeasedBulkhead::new(policy, self.sem, local))
    }
}
