//! [`RedisSemaphore`]: the handle and its public methods, the state its
//! clones share, and the release of a permit id.

use core::fmt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::attempt::Attempt;
use super::builder::RedisSemaphoreBuilder;
use super::conn::{Backend, Conn};
use super::error::LeaseError;
use super::id::IdSource;
use super::keeper::Signals;
use super::permit::{Lease, LeasedPermit};
use super::scripts::{Call, Scripts};
use super::spawn::Spawner;
use crate::semaphore::Semaphore;
use crate::timer::Timer;

/// A semaphore shared through Redis: each permit is a lease with a time to
/// live, renewed while held, and a fencing token.
///
/// Handles are cheap to clone; clones share one connection, one pub/sub
/// subscription and one lease keeper. Build one per semaphore per process.
#[derive(Clone)]
pub struct RedisSemaphore {
    pub(super) inner: Arc<Inner>,
}

/// The state behind every clone of one [`RedisSemaphore`].
pub(super) struct Inner {
    pub(super) name: Arc<str>,
    pub(super) keys: Keys,
    pub(super) conn: Conn,
    pub(super) scripts: Scripts,
    pub(super) ttl: Duration,
    /// The time to live less the drift margin: how long after sending a
    /// grant or renewal this process counts on the lease.
    pub(super) life: Duration,
    pub(super) renew_every: Duration,
    pub(super) max_poll: Duration,
    pub(super) label: String,
    pub(super) default_limit: usize,
    pub(super) retries: usize,
    pub(super) outage_tolerance: Duration,
    /// How long one call may go unanswered; also all that `try_acquire`
    /// spends on retries.
    pub(super) response_timeout: Duration,
    pub(super) timer: Arc<dyn Timer>,
    pub(super) spawner: Spawner,
    pub(super) signals: Arc<Signals>,
    /// The leases this process holds, for the keeper to renew.
    pub(super) leases: Mutex<HashMap<String, Arc<Lease>>>,
    pub(super) closed: AtomicBool,
    /// The limit in Redis, as of the last script that read it.
    pub(super) limit_seen: AtomicUsize,
    pub(super) ids: IdSource,
    /// The highest fence this process was granted: a server whose counter
    /// is below it lost writes (see the acquire script's quarantine).
    pub(super) fence_seen: AtomicU64,
    /// The quarantine after such a loss, in ms (0: off).
    pub(super) quarantine_ms: u64,
    /// The other signs of a loss, and `WAIT` on grants.
    pub(super) failover: super::failover::Failover,
    /// Whether a waiting acquire joins the fair line (see
    /// [`RedisSemaphoreBuilder::fair`]).
    pub(super) fair: bool,
    /// This handle's suffix of its own channel, `{channel}:{token}`, where
    /// its waiters' grants are announced (hex digits).
    pub(super) token: String,
}

/// The names of the semaphore's keys (see `scripts.rs`).
pub(super) struct Keys {
    pub(super) leases: String,
    pub(super) info: String,
    pub(super) fence: String,
    pub(super) limit: String,
    pub(super) channel: String,
    pub(super) quarantine: String,
    pub(super) epoch: String,
    pub(super) queue: String,
    pub(super) queue_beat: String,
    pub(super) queue_info: String,
    pub(super) queue_seq: String,
}

impl Keys {
    /// A call of `script` with the keys every script takes, `KEYS[1]` to
    /// `KEYS[5]` in the order `scripts.rs` gives (the quarantine script
    /// adds the quarantine key; the scripts that change leases take
    /// [`call_all`](Self::call_all)).
    pub(super) fn call<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(&self.leases)
            .key(&self.info)
            .key(&self.fence)
            .key(&self.limit)
            .key(&self.channel);
        call
    }

    /// A call of `script` with all ten keys (`KEYS[6]` the quarantine,
    /// `KEYS[7]` to `KEYS[10]` the fair line): for the scripts that change
    /// leases, since each of them serves the line.
    pub(super) fn call_all<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut call = self.call(script);
        call.key(&self.quarantine)
            .key(&self.queue)
            .key(&self.queue_beat)
            .key(&self.queue_info)
            .key(&self.queue_seq);
        call
    }

    /// The ten keys of [`call_all`](Self::call_all), in order, and the
    /// epoch marker: the acquire script's eleven keys are all of them, the
    /// release script's the first ten (see [`Call`](super::scripts::Call)).
    pub(super) fn all(&self) -> [&str; 11] {
        [
            &self.leases,
            &self.info,
            &self.fence,
            &self.limit,
            &self.channel,
            &self.quarantine,
            &self.queue,
            &self.queue_beat,
            &self.queue_info,
            &self.queue_seq,
            &self.epoch,
        ]
    }
}

/// What the release script found.
pub(super) enum ReleaseOutcome {
    /// The lease was unexpired and is now gone.
    InTime,
    /// The lease had expired this long ago (still in Redis, now removed).
    Late(Duration),
    /// Nothing was held under the id.
    Gone,
}

/// One lease holder, as listed by [`RedisSemaphore::holders`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The lease's id ([`LeasedPermit::id`]).
    pub id: String,
    /// The grant's fencing token.
    pub fence: u64,
    /// The holder's label (see [`RedisSemaphoreBuilder::label`]).
    pub label: String,
    /// How long ago the permit was granted, by Redis's clock.
    pub age: Duration,
    /// How long until the lease expires unless renewed, by Redis's clock.
    pub expires_in: Duration,
}

impl RedisSemaphore {
    /// Starts configuring the semaphore `name` on `backend`: a
    /// `redis::Client` for one server, a `redis::cluster::ClusterClient`
    /// (feature `redis-cluster`), or [`Backend::sentinel`] (feature
    /// `redis-sentinel`). Every process that uses the same name (and key
    /// prefix) on the same deployment shares its permits.
    pub fn builder(backend: impl Into<Backend>, name: impl Into<String>) -> RedisSemaphoreBuilder {
        RedisSemaphoreBuilder::new(backend.into(), name.into())
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The lease time to live.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The limit as of the last script call that read it (no round trip).
    pub fn limit_seen(&self) -> usize {
        self.inner.limit_seen.load(Ordering::Relaxed)
    }

    /// How many leases this process holds now.
    pub fn held_here(&self) -> usize {
        self.inner.lock_leases().len()
    }

    /// Waits for a permit: one script call per attempt, woken by pub/sub
    /// when a lease is released or expires, and by the earliest lease's
    /// deadline or `max_poll` otherwise. In fair mode (the default, see
    /// [`RedisSemaphoreBuilder::fair`]) a busy first attempt joins the line
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
        match self.first_attempt().await? {
            Attempt::Granted(permit) => Ok(permit),
            Attempt::Busy(busy) => self.wait_from(busy, &AtomicBool::new(false)).await,
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
    pub async fn try_acquire(&self) -> Result<LeasedPermit, LeaseError> {
        self.sole_attempt().await
    }

    /// Lists the unexpired leases, earliest deadline first, with their age,
    /// time left and fencing token: what an operator would otherwise read
    /// from a lock table.
    ///
    /// # Errors
    ///
    /// The Redis error, if the call failed.
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
            inner.limit_seen.store(limit, Ordering::Relaxed);
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
        inner.limit_seen.store(limit, Ordering::Relaxed);
        Ok(())
    }

    /// Fails this handle's waiting and later acquires with
    /// [`LeaseError::Closed`] (every clone shares the flag). Held permits
    /// stay valid and are still renewed.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.signals.wake.notify(usize::MAX);
        self.inner.signals.line.wake_all();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.inner.name)
            .field("leases", &self.inner.keys.leases)
            .field("lease_ttl", &self.inner.ttl)
            .field("limit_seen", &self.limit_seen())
            .field("held_here", &self.held_here())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The channel this process subscribes to: its own in fair mode, where
    /// its waiters' grants are announced, else the shared one.
    pub(super) fn channel(&self) -> String {
        match self.fair {
            true => format!("{}:{}", self.keys.channel, self.token),
            false => self.keys.channel.clone(),
        }
    }

    pub(super) fn lock_leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Lease>>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn forget_lease(&self, id: &str) {
        self.lock_leases().remove(id);
    }

    pub(super) async fn release_id(&self, id: &str) -> redis::RedisResult<ReleaseOutcome> {
        let mut call = Call::new(&self.scripts.release, &self.keys.all()[..10], 1);
        call.arg(id);
        let left: Option<i64> = call.invoke(&mut self.conn.clone()).await?;
        Ok(match left {
            None => ReleaseOutcome::Gone,
            Some(ms) if ms > 0 => ReleaseOutcome::InTime,
            Some(ms) => ReleaseOutcome::Late(millis(-ms)),
        })
    }

    /// Releases `id` without waiting for the answer: for dropped permits
    /// and abandoned grants. If Redis cannot be reached, the lease expires
    /// within its time to live.
    pub(super) fn release_in_background(self: &Arc<Self>, id: String) {
        let inner = self.clone();
        self.spawner.spawn(async move {
            let _ = inner.release_id(&id).await;
        });
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
