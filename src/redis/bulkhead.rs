//! The bulkhead's policy over the Redis semaphore.

use core::fmt;
use core::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_listener::Event;

use super::{Attempt, LeaseError, LeasedPermit, Lost, LostReason, RedisSemaphore, ReleaseError};
use crate::bulkhead::observer::{CallOutcome, Observer};
use crate::bulkhead::policy::Policy;
use crate::timer::Timer;
use crate::{BuildError, BulkheadBuilder, BulkheadError, Metrics, RejectReason, Rejected};

/// A [`Bulkhead`](crate::Bulkhead) whose permits are leases in Redis,
/// shared by every process that uses the same [`RedisSemaphore`].
///
/// The policy is the in-process bulkhead's: wait for at most `max_wait`
/// (zero fails fast), a bounded waiting line, a `call_timeout`, typed
/// rejections, metrics and observers. What differs:
///
/// * **The limit** lives in Redis: [`set_max_concurrent_calls`](Self::set_max_concurrent_calls)
///   changes it for every client, and is async.
/// * **The waiting line** (`max_queue`) is per process: each process
///   bounds its own waiters.
/// * **Metrics** count this process's calls; `in_flight` is this process's
///   share. [`RedisSemaphore::holders`] lists every holder.
/// * **Redis out of reach** rejects with [`RejectReason::Unavailable`]
///   (fail closed).
/// * **A lost lease** does not stop a running [`call`](Self::call); use
///   [`acquire`](Self::acquire) and race the work against
///   [`RedisBulkheadPermit::lost`] where it must stop.
#[derive(Clone)]
pub struct RedisBulkhead {
    shared: Arc<Shared>,
}

struct Shared {
    policy: Policy,
    sem: RedisSemaphore,
    /// Calls of this process holding a lease now.
    in_flight: AtomicUsize,
    idle: Event,
}

/// Configures a [`RedisBulkhead`]: the settings of [`BulkheadBuilder`]
/// that apply to a shared limit.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisBulkheadBuilder {
    sem: RedisSemaphore,
    policy: BulkheadBuilder,
}

impl RedisBulkheadBuilder {
    /// As [`BulkheadBuilder::max_wait`]: `Duration::ZERO` fails fast after
    /// one script call.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.policy = self.policy.max_wait(max_wait);
        self
    }

    /// As [`BulkheadBuilder::max_queue`], counted per process.
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.policy = self.policy.max_queue(max_queue);
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

    /// Makes the bulkhead; it takes its name from the semaphore.
    ///
    /// # Errors
    ///
    /// As [`BulkheadBuilder::build`], for the settings above.
    pub fn build(self) -> Result<RedisBulkhead, BuildError> {
        let name = self.sem.name().to_owned();
        let policy = self.policy.into_policy(Some(name), self.sem.limit_seen())?;
        Ok(RedisBulkhead {
            shared: Arc::new(Shared {
                policy,
                sem: self.sem,
                in_flight: AtomicUsize::new(0),
                idle: Event::new(),
            }),
        })
    }
}

impl RedisBulkhead {
    /// Starts configuring a bulkhead over `sem`.
    pub fn builder(sem: RedisSemaphore) -> RedisBulkheadBuilder {
        RedisBulkheadBuilder {
            sem,
            policy: BulkheadBuilder::new(),
        }
    }

    /// The bulkhead's name: its semaphore's.
    pub fn name(&self) -> &str {
        &self.shared.policy.name
    }

    /// The semaphore underneath, for [`holders`](RedisSemaphore::holders)
    /// and the like.
    pub fn semaphore(&self) -> &RedisSemaphore {
        &self.shared.sem
    }

    /// Runs `call` once a lease is granted, then releases it. As
    /// [`Bulkhead::call`](crate::Bulkhead::call).
    ///
    /// # Errors
    ///
    /// [`BulkheadError::Rejected`] if not admitted (including
    /// [`RejectReason::Unavailable`]), [`BulkheadError::CallTimeout`],
    /// [`BulkheadError::Inner`].
    pub async fn call<F, T, E>(&self, call: F) -> Result<T, BulkheadError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        let mut permit = self.acquire_as(CallOutcome::Cancelled).await?;
        let policy = &self.shared.policy;
        let (result, outcome) = policy.run(policy.traced(call)).await;
        permit.outcome = outcome;
        drop(permit);
        result
    }

    /// Waits for a lease under the bulkhead's policy.
    ///
    /// # Errors
    ///
    /// [`Rejected`], with the [reason](Rejected::reason).
    pub async fn acquire(&self) -> Result<RedisBulkheadPermit, Rejected> {
        self.acquire_as(CallOutcome::Released).await
    }

    /// Takes a lease if one is free now: one script call, no waiting.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with [`RejectReason::Full`], [`RejectReason::Closed`]
    /// or [`RejectReason::Unavailable`].
    pub async fn try_acquire(&self) -> Result<RedisBulkheadPermit, Rejected> {
        let s = &self.shared;
        let first = s.sem.try_acquire().await;
        self.note_limit();
        match first {
            Ok(lease) => Ok(self.admitted(lease, Duration::ZERO, CallOutcome::Released)),
            Err(e) => Err(s.policy.reject(reason_of(&e), Duration::ZERO)),
        }
    }

    async fn acquire_as(&self, outcome: CallOutcome) -> Result<RedisBulkheadPermit, Rejected> {
        let s = &self.shared;
        if s.policy.max_wait == Some(Duration::ZERO) {
            // Fail fast: one script call, no outage tolerance.
            let first = s.sem.try_acquire().await;
            self.note_limit();
            return match first {
                Ok(lease) => Ok(self.admitted(lease, Duration::ZERO, outcome)),
                Err(e) => Err(s.policy.reject(reason_of(&e), Duration::ZERO)),
            };
        }
        let first = s.sem.first_attempt().await;
        self.note_limit();
        let (lease, waited) = match first {
            Ok(Attempt::Granted(lease)) => {
                return Ok(self.admitted(lease, Duration::ZERO, outcome));
            }
            // Busy, or Redis briefly out of reach: wait within the policy's
            // bounds, going on from this attempt (same id, a listener
            // registered before it) rather than asking Redis again at once.
            Ok(Attempt::Busy(busy)) => {
                let acquire = async { s.sem.wait_from(busy).await.map_err(|e| reason_of(&e)) };
                s.policy.wait_for(acquire).await?
            }
            Err(e) => return Err(s.policy.reject(reason_of(&e), Duration::ZERO)),
        };
        Ok(self.admitted(lease, waited, outcome))
    }

    /// Keeps the retry hint's limit in step with the limit in Redis.
    fn note_limit(&self) {
        let s = &self.shared;
        s.policy
            .hint_limit
            .store(s.sem.limit_seen(), Ordering::Relaxed);
    }

    fn admitted(
        &self,
        lease: LeasedPermit,
        waited: Duration,
        outcome: CallOutcome,
    ) -> RedisBulkheadPermit {
        let s = &self.shared;
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        let permit = RedisBulkheadPermit {
            shared: s.clone(),
            lease: Some(lease),
            since: s.policy.clock(true),
            outcome,
            watch: s.policy.watch(),
        };
        s.policy.permitted(waited);
        permit
    }

    /// A snapshot of this process's view: `max_concurrent_calls` is the
    /// limit as last read from Redis, `in_flight` this process's calls.
    pub fn metrics(&self) -> Metrics {
        let s = &*self.shared;
        let c = &s.policy.counters;
        let get = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        Metrics {
            name: s.policy.name.clone(),
            max_concurrent_calls: s.sem.limit_seen(),
            in_flight: s.in_flight.load(Ordering::SeqCst),
            queued: s.policy.queued(),
            max_queue: s.policy.max_queue,
            max_wait: s.policy.max_wait,
            closed: s.sem.is_closed(),
            permitted: get(&c.permitted),
            rejected_full: get(&c.rejected_full),
            rejected_timeout: get(&c.rejected_timeout),
            rejected_closed: get(&c.rejected_closed),
            rejected_unavailable: get(&c.rejected_unavailable),
            call_timeouts: get(&c.call_timeouts),
            leaks_suspected: get(&c.leaks_suspected),
        }
    }

    /// Changes the limit for every client (stored in Redis; waiters
    /// everywhere are woken when it grows).
    ///
    /// # Errors
    ///
    /// The Redis error if the change could not be made.
    pub async fn set_max_concurrent_calls(&self, limit: usize) -> Result<(), redis::RedisError> {
        self.shared.sem.set_limit(limit).await
    }

    /// Rejects this process's waiting and later calls with
    /// [`RejectReason::Closed`]; calls in flight finish.
    pub fn close(&self) {
        self.shared.sem.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.sem.is_closed()
    }

    /// Resolves once none of this process's calls is in flight.
    pub async fn wait_idle(&self) {
        let s = &*self.shared;
        loop {
            if s.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            let listener = s.idle.listen();
            if s.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            listener.await;
        }
    }
}

fn reason_of(e: &LeaseError) -> RejectReason {
    match e {
        LeaseError::NoPermits { .. } => RejectReason::Full,
        LeaseError::Closed => RejectReason::Closed,
        LeaseError::Unavailable(_) => RejectReason::Unavailable,
    }
}

impl fmt::Debug for RedisBulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBulkhead")
            .field("name", &self.shared.policy.name)
            .field("semaphore", &self.shared.sem)
            .field("in_flight", &self.shared.in_flight.load(Ordering::Relaxed))
            .field("queued", &self.shared.policy.queued())
            .finish()
    }
}

/// A lease held through a [`RedisBulkhead`]: the call counts as in flight
/// until it is dropped or [released](Self::release).
#[must_use = "dropping the permit ends the call it guards at once"]
pub struct RedisBulkheadPermit {
    shared: Arc<Shared>,
    lease: Option<LeasedPermit>,
    since: Option<Instant>,
    outcome: CallOutcome,
    /// The lease's leak watch in the policy (0: none).
    watch: u64,
}

impl RedisBulkheadPermit {
    fn lease(&self) -> &LeasedPermit {
        self.lease
            .as_ref()
            .expect("the lease is only taken on release")
    }

    /// The grant's fencing token (see [`LeasedPermit::fence`]).
    pub fn fence(&self) -> u64 {
        self.lease().fence()
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lease().is_lost()
    }

    /// Resolves when the lease is found lost.
    pub fn lost(&self) -> Lost {
        self.lease().lost()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease().lost_reason()
    }

    /// Marks how the guarded work ended, for the observer.
    pub fn set_outcome(&mut self, outcome: CallOutcome) {
        self.outcome = outcome;
    }

    /// Releases the lease now and reports whether it was still held.
    ///
    /// # Errors
    ///
    /// As [`LeasedPermit::release`].
    pub async fn release(mut self) -> Result<(), ReleaseError> {
        self.shared.policy.unwatch(core::mem::take(&mut self.watch));
        let lease = self.lease.take().expect("released once");
        let released = lease.release().await;
        self.finish();
        released
    }

    fn finish(&mut self) {
        self.shared.policy.unwatch(core::mem::take(&mut self.watch));
        let s = &*self.shared;
        if s.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            s.idle.notify(usize::MAX);
        }
        s.policy.finished(self.since, self.outcome);
    }
}

impl Drop for RedisBulkheadPermit {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            drop(lease);
            self.finish();
        }
    }
}

impl fmt::Debug for RedisBulkheadPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBulkheadPermit")
            .field("bulkhead", &self.shared.policy.name)
            .field("lease", &self.lease)
            .finish()
    }
}
