//! [`RedisSemaphore`]: the handle and its public methods, the state its
//! clones share, and the release of a permit id.

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::LeasedPermit;
use super::attempt::{self, Attempt};
use super::error::LeaseError;
use super::inner::{Inner, millis};
use super::wakeups::Wakeups;
use crate::lease::Holder;
use crate::semaphore::Semaphore;

/// A semaphore shared through Redis: each permit is a lease with a time to
/// live, renewed while held, and a fencing token.
///
/// Handles are cheap to clone; clones share one connection, one pub/sub
/// subscription and one lease keeper. Build one per semaphore per process.
#[derive(Clone)]
pub struct RedisSemaphore {
    pub(super) inner: Arc<Inner>,
}

impl RedisSemaphore {
    /// A handle on `inner`, as the permits it grants keep one.
    pub(super) fn of(inner: &Arc<Inner>) -> Self {
        Self {
            inner: inner.clone(),
        }
    }

    /// The state behind the handle, for the attempts of the Redis
    /// bulkhead, which drives them itself.
    pub(super) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.local.name()
    }

    /// The lease time to live.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The limit as of the last script call that read it (no round trip).
    pub fn limit_seen(&self) -> usize {
        self.inner.local.limit_seen()
    }

    /// How many leases this process holds now.
    pub fn held_here(&self) -> usize {
        self.inner.local.held.len()
    }

    /// How this process's waiters are woken now: through pub/sub, or by
    /// polling every `max_poll` when no message can come (and until the
    /// subscription made at `build` delivered its first message, 3 ms
    /// later on loopback).
    ///
    /// The subscription is proved when it is made and after every 10 s
    /// of silence: a message published on its channel must come back
    /// within the `response_timeout`. Channel rights taken away after
    /// `build` (which the redis crate reports as a subscription made), a
    /// lost connection or a silent subscription turn it to
    /// [`Wakeups::Polling`] until a subscription delivers again (tried
    /// again after a pause that grows to 10 s). Each change is told through
    /// the `metrics` gauge `bulkhead_redis_pubsub_up` (1 or 0, labelled
    /// `semaphore`) and counter `bulkhead_redis_pubsub_lost_total`, and a
    /// `tracing` event (a warning when wake-ups stop, with the cause), with
    /// those features on. With [`pubsub(false)`](super::RedisSemaphoreBuilder::pubsub)
    /// it is always `Polling`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(sem: watertight::redis::RedisSemaphore) {
    /// use watertight::redis::Wakeups;
    ///
    /// if sem.wakeups() == Wakeups::Polling {
    ///     eprintln!("{}: a release elsewhere may take up to max_poll to reach a waiter", sem.name());
    /// }
    /// # }
    /// ```
    pub fn wakeups(&self) -> Wakeups {
        self.inner.signals.wakeups.get()
    }

    /// Waits for a permit: one script call per attempt, woken by pub/sub
    /// when a lease is released or expires, and by the earliest lease's
    /// deadline or `max_poll` otherwise. In fair mode (the default, see
    /// [`RedisSemaphoreBuilder::fair`](super::RedisSemaphoreBuilder::fair)) a busy first attempt joins the line
    /// in Redis, and the release that frees a permit grants it to the
    /// line's head and tells its process: the waiter takes it without
    /// another script call.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unavailable`] if Redis stays unreachable for the
    /// builder's `outage_tolerance` (fails closed; a shorter outage, such as
    /// a restart, is ridden out with the same permit id; no call runs past
    /// the tolerance, except the first one of an outage, which may take its
    /// whole `response_timeout`), [`LeaseError::Closed`] after
    /// [`close`](Self::close). [`LeaseError::Denied`], [`LeaseError::Auth`]
    /// and [`LeaseError::Script`] at once, without retrying: Redis
    /// answered, and asking again would not change its answer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point leaks no lease: a grant whose
    /// answer was not read, or an id waiting in the line (which a release
    /// may grant at any moment), is released in the background (leaving
    /// the line, and handing on a permit granted to it), and expires
    /// within its time to live if Redis cannot be reached.
    pub async fn acquire(&self) -> Result<LeasedPermit, LeaseError> {
        match attempt::first_attempt(&self.inner).await? {
            Attempt::Granted(permit) => Ok(permit),
            Attempt::Busy(busy) => {
                attempt::wait_from(&self.inner, busy, &attempt::Down::default()).await
            }
        }
    }

    /// Takes a permit if one is free now: one script call, no waiting.
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoPermits`] with a retry hint;
    /// [`LeaseError::Quarantined`] while Redis is quarantined after losing
    /// writes; [`LeaseError::Unavailable`] if Redis did not answer within
    /// one `response_timeout` (a call that failed fast, such as a dropped
    /// connection, is retried within it, up to `retries` times); otherwise
    /// as for [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping it before Redis answers releases the permit id in the
    /// background: a lease the script may have granted meanwhile goes back at
    /// once, or expires within its time to live if Redis cannot be reached.
    pub async fn try_acquire(&self) -> Result<LeasedPermit, LeaseError> {
        attempt::sole_attempt(&self.inner).await
    }

    /// Lists the unexpired leases, earliest deadline first, with their age,
    /// time left and fencing token: what an operator would otherwise read
    /// from a lock table.
    ///
    /// # Errors
    ///
    /// The Redis error, if the call failed.
    ///
    /// # Cancel safety
    ///
    /// It only reads: dropping it changes nothing.
    pub async fn holders(&self) -> Result<Vec<Holder>, redis::RedisError> {
        let inner = &*self.inner;
        let raw: Vec<redis::Value> = inner
            .keys
            .call(&inner.scripts.holders)
            .arg(inner.default_limit)
            .invoke_async(&mut inner.conn.clone())
            .await?;
        let mut fields = raw.into_iter();
        let next_i64 = |fields: &mut std::vec::IntoIter<redis::Value>| -> Option<i64> {
            redis::from_redis_value(fields.next()?).ok()
        };
        let now = next_i64(&mut fields).unwrap_or(0);
        let limit = next_i64(&mut fields).unwrap_or(-1);
        let _last_fence = next_i64(&mut fields);
        if let Ok(limit) = usize::try_from(limit) {
            inner.local.saw_limit(limit);
        }
        let mut out = Vec::new();
        while let Some(id) = fields.next() {
            let id: String = redis::from_redis_value(id)?;
            let deadline = next_i64(&mut fields).unwrap_or(now);
            let info: String = fields
                .next()
                .map(redis::from_redis_value)
                .transpose()?
                .unwrap_or_default();
            let mut parts = info.splitn(3, ':');
            let fence = parts.next().and_then(|f| f.parse().ok()).unwrap_or(0);
            let granted = parts.next().and_then(|t| t.parse().ok()).unwrap_or(now);
            let label = parts.next().unwrap_or("").to_owned();
            out.push(Holder {
                id,
                fence,
                label,
                weight: 1,
                age: millis(now - granted),
                expires_in: millis(deadline - now),
            });
        }
        Ok(out)
    }

    /// The limit stored in Redis (installing the builder's if none is).
    ///
    /// # Errors
    ///
    /// The Redis error, if the call failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping it changes nothing, except that a limit it was installing
    /// (none was stored) may or may not be stored.
    pub async fn limit(&self) -> Result<usize, redis::RedisError> {
        // `holders` reads the limit with the same consistency.
        self.holders().await?;
        Ok(self.limit_seen())
    }

    /// Changes the limit for every client of this semaphore. Growing wakes
    /// waiters everywhere; shrinking lets holders finish and admits nobody
    /// until the holders are under the new limit.
    ///
    /// # Errors
    ///
    /// The Redis error, if the call failed.
    ///
    /// # Panics
    ///
    /// If `limit` exceeds [`Semaphore::MAX_PERMITS`].
    ///
    /// # Cancel safety
    ///
    /// Dropping it before Redis answers may leave the limit changed or not,
    /// as one script call either ran or did not: read it back with
    /// [`limit`](Self::limit).
    pub async fn set_limit(&self, limit: usize) -> Result<(), redis::RedisError> {
        assert!(
            limit <= Semaphore::MAX_PERMITS,
            "the limit must not exceed Semaphore::MAX_PERMITS"
        );
        let inner = &*self.inner;
        let _old: i64 = inner
            .keys
            .call_all(&inner.scripts.set_limit)
            .arg(limit)
            .invoke_async(&mut inner.conn.clone())
            .await?;
        inner.local.saw_limit(limit);
        Ok(())
    }

    /// Fails this handle's waiting and later acquires with
    /// [`LeaseError::Closed`] (every clone shares the flag). Held permits
    /// stay valid and are still renewed.
    pub fn close(&self) {
        self.inner.local.mark_closed();
        self.inner.signals.wake.notify(usize::MAX);
        self.inner.signals.line.wake_all();
    }

    /// Resolves once every release this handle started in the background
    /// (for a dropped permit, or an acquire dropped while a grant may have
    /// been made) has been answered or has failed: before a process ends
    /// its runtime, so that no lease it gave up stays held until its time
    /// to live runs out. Each release is bounded by the response timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(sem: watertight::redis::RedisSemaphore, permit: watertight::redis::LeasedPermit) {
    /// // Shutting down:
    /// sem.close();
    /// drop(permit);
    /// sem.wait_released().await;
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// It holds nothing: dropping it only stops the wait.
    pub async fn wait_released(&self) {
        self.inner.local.held.background.settled().await;
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.local.is_closed()
    }
}

impl fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.inner.local.name())
            .field("leases", &self.inner.keys.leases)
            .field("lease_ttl", &self.inner.ttl)
            .field("limit_seen", &self.limit_seen())
            .field("held_here", &self.held_here())
            .finish_non_exhaustive()
    }
}
