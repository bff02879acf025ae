//! A semaphore whose permits are leases in Redis, shared by every process
//! that names the same semaphore (feature `redis`, with `tokio` or `smol`).
//!
//! Use it when one quota is shared by many instances of a service: a
//! partner API that allows 5 connections in total, a job that must not
//! overlap across servers. [`RedisBulkhead`] puts the bulkhead's policy
//! (waiting with a time limit, failing fast, a bounded line, call timeouts,
//! metrics and observers) over it.
//!
//! # Guarantees
//!
//! * At most `limit` unexpired leases exist at any time *as the Redis
//!   primary sees it*. Every grant, renewal and release is one Lua script
//!   that reads the server's clock, so clients' clocks do not matter.
//! * A lease is renewed in the background while its permit is held. If a
//!   holder crashes, its permit comes back within one lease time to live.
//! * Every grant carries a fencing token that increases per semaphore. A
//!   holder that stalls past its lease loses it: the permit reports it, and
//!   the guarded resource can refuse the old token.
//! * This is a load-protection limit, not mutual exclusion: a Redis
//!   failover or restart without persistence can forget leases and admit
//!   more than `limit` for up to one time to live. Where correctness
//!   depends on exclusivity, check fencing tokens at the resource.
//!
//! See `docs/distributed.md` for the design, configuration and operations.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use bulkhead::redis::RedisSemaphore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let sem = RedisSemaphore::builder(client, "partner-api")
//!     .limit(5)
//!     .lease_ttl(Duration::from_secs(10))
//!     .build()
//!     .await?;
//! let permit = sem.acquire().await?;
//! // Tell the partner which grant this is; it can refuse older ones.
//! let fence = permit.fence();
//! # let _ = fence;
//! permit.release().await?;
//! # Ok(()) }
//! ```

#[cfg(not(any(feature = "tokio", feature = "smol")))]
compile_error!("the `redis` feature needs a runtime: enable `tokio` or `smol` as well");

mod bulkhead;
mod driver;
mod error;
mod permit;
mod scripts;

pub use bulkhead::{RedisBulkhead, RedisBulkheadBuilder, RedisBulkheadPermit};
pub use error::{ConfigError, LeaseError, LostReason, ReleaseError};
pub use permit::{LeasedPermit, Lost};

use core::fmt;
use core::future::Future;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use event_listener::EventListener;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::semaphore::Semaphore;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;
use permit::Lease;
use scripts::Scripts;

/// A semaphore shared through Redis: each permit is a lease with a time to
/// live, renewed while held, and a fencing token.
///
/// Handles are cheap to clone; clones share one connection, one pub/sub
/// subscription and one lease keeper. Build one per semaphore per process.
#[derive(Clone)]
pub struct RedisSemaphore {
    inner: Arc<Inner>,
}

/// Configures a [`RedisSemaphore`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RedisSemaphoreBuilder {
    client: redis::Client,
    name: String,
    limit: usize,
    lease_ttl: Duration,
    renew_every: Option<Duration>,
    max_poll: Duration,
    key_prefix: String,
    label: Option<String>,
    response_timeout: Duration,
    retries: usize,
    outage_tolerance: Duration,
    timer: Option<Arc<dyn Timer>>,
}

impl RedisSemaphoreBuilder {
    /// The limit to install if Redis holds none for this semaphore yet
    /// (default 1). Once stored, the limit in Redis wins, and
    /// [`RedisSemaphore::set_limit`] changes it for every client.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// How long a lease lives without renewal (default 30 s): a crashed
    /// holder's permit comes back after at most this long. At least 10 ms.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How often held leases are renewed (default: a third of the time to
    /// live). All of a process's leases are renewed in one script call.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// The longest a waiter sleeps between attempts when no wake-up comes
    /// through pub/sub (default 1 s): the safety net should a notification
    /// be lost.
    pub fn max_poll(mut self, every: Duration) -> Self {
        self.max_poll = every.max(Duration::from_millis(1));
        self
    }

    /// The prefix of every key (default `"bulkhead"`): the keys are
    /// `{prefix}:{{name}}:leases` and so on.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// A label stored with each lease and shown by
    /// [`RedisSemaphore::holders`] (default: host name and process id).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// How long to wait for any answer from Redis before giving up on it
    /// (default 2 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a grant whose outcome is unknown (a timeout or a
    /// dropped connection) is retried with the same permit id before the
    /// call fails with [`LeaseError::Unavailable`] (default 2).
    pub fn retries(mut self, retries: usize) -> Self {
        self.retries = retries;
        self
    }

    /// How long a *waiting* [`acquire`](RedisSemaphore::acquire) keeps
    /// trying while Redis is unreachable (a restart, a failover) before it
    /// fails with [`LeaseError::Unavailable`] (default 5 s). Zero fails at
    /// the first unanswered attempt. [`try_acquire`](RedisSemaphore::try_acquire)
    /// never waits: it fails once its `retries` are used up.
    pub fn outage_tolerance(mut self, tolerance: Duration) -> Self {
        self.outage_tolerance = tolerance;
        self
    }

    /// The timer for waits between attempts and for renewals (default:
    /// [`default_timer`](crate::timer::default_timer)).
    pub fn timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.timer = Some(timer);
        self
    }

    /// Connects, subscribes to wake-ups and starts the lease keeper on the
    /// current runtime (tokio if called inside one, else smol's global
    /// executor).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a setting that cannot work or a failed first
    /// connection.
    pub async fn build(self) -> Result<RedisSemaphore, ConfigError> {
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(ConfigError::BadName);
        }
        let ttl_ms = self.lease_ttl.as_millis();
        if !(10..=(1 << 50)).contains(&ttl_ms) {
            return Err(ConfigError::BadLeaseTtl);
        }
        let renew_every = self.renew_every.unwrap_or(self.lease_ttl / 3);
        if renew_every.is_zero() || renew_every >= self.lease_ttl {
            return Err(ConfigError::BadRenewInterval);
        }
        if self.limit > Semaphore::MAX_PERMITS {
            return Err(ConfigError::LimitTooLarge);
        }
        let timer = match self.timer {
            Some(t) => t,
            None => crate::timer::default_timer().ok_or(ConfigError::NoTimer)?,
        };
        let spawner = Spawner::current().ok_or(ConfigError::NoRuntime)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = self
            .client
            .get_connection_manager_with_config(config)
            .await
            .map_err(ConfigError::Connect)?;
        let base = format!("{}:{{{}}}", self.key_prefix, self.name);
        let label = self.label.unwrap_or_else(default_label);
        let signals = Arc::new(driver::Signals::default());
        let inner = Arc::new(Inner {
            name: self.name.into(),
            keys: Keys {
                leases: format!("{base}:leases"),
                info: format!("{base}:info"),
                fence: format!("{base}:fence"),
                limit: format!("{base}:limit"),
                channel: format!("{base}:wake"),
            },
            conn,
            scripts: Scripts::new(),
            ttl: self.lease_ttl,
            renew_every,
            max_poll: self.max_poll,
            label,
            default_limit: self.limit,
            retries: self.retries,
            outage_tolerance: self.outage_tolerance,
            timer,
            spawner,
            signals,
            leases: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            limit_seen: AtomicUsize::new(self.limit),
            ids: IdSource::new(),
        });
        driver::start(&inner, self.client);
        Ok(RedisSemaphore { inner })
    }
}

/// The state behind every clone of one [`RedisSemaphore`].
pub(crate) struct Inner {
    name: Arc<str>,
    keys: Keys,
    conn: ConnectionManager,
    scripts: Scripts,
    ttl: Duration,
    renew_every: Duration,
    max_poll: Duration,
    label: String,
    default_limit: usize,
    retries: usize,
    outage_tolerance: Duration,
    timer: Arc<dyn Timer>,
    spawner: Spawner,
    signals: Arc<driver::Signals>,
    /// The leases this process holds, for the keeper to renew.
    leases: Mutex<HashMap<String, Arc<Lease>>>,
    closed: AtomicBool,
    /// The limit in Redis, as of the last script that read it.
    limit_seen: AtomicUsize,
    ids: IdSource,
}

struct Keys {
    leases: String,
    info: String,
    fence: String,
    limit: String,
    channel: String,
}

/// What one acquire script call decided.
enum Grant {
    Granted(LeasedPermit),
    Busy {
        retry_after: Option<Duration>,
        limit: usize,
    },
}

/// What one attempt found: a grant, or what to wait on before the next.
enum Found {
    Granted(LeasedPermit),
    Wait {
        listener: EventListener,
        pause: Duration,
        down_since: Option<Instant>,
        retry_after: Option<Duration>,
        limit: usize,
    },
}

/// The outcome of [`RedisSemaphore::attempt`].
pub(crate) enum Attempt {
    Granted(LeasedPermit),
    Busy(Busy),
}

/// Where a waiting acquire goes on from (see [`RedisSemaphore::attempt`]).
pub(crate) struct Busy {
    pending: Pending,
    listener: EventListener,
    pause: Duration,
    down_since: Option<Instant>,
}

/// What the release script found.
pub(crate) enum ReleaseOutcome {
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
    /// Starts configuring the semaphore `name` on the Redis server that
    /// `client` points to. Every process that uses the same name (and key
    /// prefix) shares its permits.
    pub fn builder(client: redis::Client, name: impl Into<String>) -> RedisSemaphoreBuilder {
        RedisSemaphoreBuilder {
            client,
            name: name.into(),
            limit: 1,
            lease_ttl: Duration::from_secs(30),
            renew_every: None,
            max_poll: Duration::from_secs(1),
            key_prefix: "bulkhead".into(),
            label: None,
            response_timeout: Duration::from_secs(2),
            retries: 2,
            outage_tolerance: Duration::from_secs(5),
            timer: None,
        }
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
    /// deadline or `max_poll` otherwise.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unavailable`] if Redis stays unreachable for the
    /// builder's `outage_tolerance` (fails closed; a shorter outage, such as
    /// a restart, is ridden out with the same permit id),
    /// [`LeaseError::Closed`] after [`close`](Self::close).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point leaks no lease: a grant whose
    /// answer was not read is released in the background, and expires
    /// within its time to live if Redis cannot be reached.
    pub async fn acquire(&self) -> Result<LeasedPermit, LeaseError> {
        match self.first_attempt().await? {
            Attempt::Granted(permit) => Ok(permit),
            Attempt::Busy(busy) => self.wait_from(busy).await,
        }
    }

    /// One acquire attempt (one script call). Busy, or unreachable within
    /// `outage_tolerance`, it returns the
    /// state to go on waiting from: the same permit id, a listener
    /// registered *before* the script ran (so a release between the answer
    /// and the wait is not missed), and how long to sleep at most.
    pub(crate) async fn first_attempt(&self) -> Result<Attempt, LeaseError> {
        self.attempt(self.inner.pending(), None).await
    }

    /// See [`first_attempt`](Self::first_attempt); `down_since` is when an
    /// ongoing outage began.
    async fn attempt(
        &self,
        mut pending: Pending,
        down_since: Option<Instant>,
    ) -> Result<Attempt, LeaseError> {
        self.attempt_with(&mut pending, down_since, true)
            .await
            .map(|found| match found {
                Found::Granted(permit) => Attempt::Granted(permit),
                Found::Wait {
                    listener,
                    pause,
                    down_since,
                    ..
                } => Attempt::Busy(Busy {
                    pending,
                    listener,
                    pause,
                    down_since,
                }),
            })
    }

    async fn attempt_with(
        &self,
        pending: &mut Pending,
        down_since: Option<Instant>,
        tolerate: bool,
    ) -> Result<Found, LeaseError> {
        if self.is_closed() {
            return Err(LeaseError::Closed);
        }
        let listener = self.inner.signals.wake.listen();
        let attempt_start = Instant::now();
        match self.inner.grant(pending).await {
            Ok(Grant::Granted(permit)) => Ok(Found::Granted(permit)),
            Ok(Grant::Busy { retry_after, limit }) => Ok(Found::Wait {
                listener,
                pause: self.inner.pause(retry_after),
                down_since: None,
                retry_after,
                limit,
            }),
            Err(LeaseError::Unavailable(e)) if tolerate => {
                // `pending` keeps its id (a grant may have landed): the
                // next attempt returns that grant, or the id is released
                // when its owner ends. The outage began when the first
                // failed attempt did.
                let since = down_since.unwrap_or(attempt_start);
                if since.elapsed() >= self.inner.outage_tolerance {
                    return Err(LeaseError::Unavailable(e));
                }
                Ok(Found::Wait {
                    listener,
                    pause: self.inner.pause(Some(Duration::from_millis(100))),
                    down_since: Some(since),
                    retry_after: None,
                    limit: self.limit_seen(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Goes on waiting after a busy [`attempt`](Self::attempt), as
    /// [`acquire`](Self::acquire) does after its first one.
    pub(crate) async fn wait_from(&self, busy: Busy) -> Result<LeasedPermit, LeaseError> {
        let Busy {
            mut pending,
            mut listener,
            mut pause,
            mut down_since,
        } = busy;
        loop {
            let _ = Timeout::new(listener, self.inner.timer.sleep(pause)).await;
            match self.attempt_with(&mut pending, down_since, true).await? {
                Found::Granted(permit) => return Ok(permit),
                Found::Wait {
                    listener: next,
                    pause: next_pause,
                    down_since: since,
                    ..
                } => {
                    listener = next;
                    pause = next_pause;
                    down_since = since;
                }
            }
        }
    }

    /// Takes a permit if one is free now: one script call, no waiting.
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoPermits`] with a retry hint, or as for
    /// [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<LeasedPermit, LeaseError> {
        let mut pending = self.inner.pending();
        match self.attempt_with(&mut pending, None, false).await? {
            Found::Granted(permit) => Ok(permit),
            Found::Wait {
                retry_after, limit, ..
            } => Err(LeaseError::NoPermits { retry_after, limit }),
        }
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
            .scripts
            .holders
            .key(&inner.keys.leases)
            .key(&inner.keys.info)
            .key(&inner.keys.fence)
            .key(&inner.keys.limit)
            .key(&inner.keys.channel)
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
            .scripts
            .set_limit
            .key(&inner.keys.leases)
            .key(&inner.keys.info)
            .key(&inner.keys.fence)
            .key(&inner.keys.limit)
            .key(&inner.keys.channel)
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
    fn lock_leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Lease>>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn forget_lease(&self, id: &str) {
        self.lock_leases().remove(id);
    }

    pub(crate) fn pending(self: &Arc<Self>) -> Pending {
        Pending {
            inner: self.clone(),
            id: self.ids.next(),
            maybe_granted: false,
        }
    }

    /// How long a waiter sleeps before trying again, unless woken sooner:
    /// until the earliest lease expires, capped by `max_poll`, plus a little
    /// jitter so that waiters across processes do not retry in lockstep.
    fn pause(&self, retry_after: Option<Duration>) -> Duration {
        let base = retry_after.map_or(self.max_poll, |r| r.min(self.max_poll));
        let jitter_ms = self.ids.random() % (base.as_millis() as u64 / 10 + 1);
        base + Duration::from_millis(jitter_ms + 1)
    }

    /// Runs the acquire script for `pending`'s id, retrying an ambiguous
    /// failure with the same id (a retry of a grant that did happen returns
    /// that same grant).
    async fn grant(self: &Arc<Self>, pending: &mut Pending) -> Result<Grant, LeaseError> {
        let mut attempt = 0;
        loop {
            pending.maybe_granted = true;
            let sent = Instant::now();
            let answer: redis::RedisResult<(i64, u64, i64, i64, i64)> = self
                .scripts
                .acquire
                .key(&self.keys.leases)
                .key(&self.keys.info)
                .key(&self.keys.fence)
                .key(&self.keys.limit)
                .key(&self.keys.channel)
                .arg(&pending.id)
                .arg(self.ttl.as_millis() as u64)
                .arg(self.default_limit)
                .arg(&self.label)
                .invoke_async(&mut self.conn.clone())
                .await;
            match answer {
                Ok((granted, fence, ms, limit, _holders)) => {
                    let limit = usize::try_from(limit).unwrap_or(0);
                    self.limit_seen.store(limit, Ordering::Relaxed);
                    if granted == 0 {
                        pending.maybe_granted = false;
                        return Ok(Grant::Busy {
                            retry_after: u64::try_from(ms).ok().map(Duration::from_millis),
                            limit,
                        });
                    }
                    let lease = Arc::new(Lease::new(
                        core::mem::take(&mut pending.id),
                        fence,
                        sent,
                        self.ttl,
                    ));
                    pending.maybe_granted = false;
                    self.lock_leases().insert(lease.id.clone(), lease.clone());
                    return Ok(Grant::Granted(LeasedPermit {
                        inner: self.clone(),
                        lease,
                        done: false,
                    }));
                }
                Err(e) if attempt < self.retries && is_ambiguous(&e) => {
                    attempt += 1;
                    let backoff = Duration::from_millis(20 << attempt.min(6));
                    self.timer.sleep(backoff).await;
                }
                // `pending` is still marked: its drop releases the id.
                Err(e) => return Err(LeaseError::Unavailable(e)),
            }
        }
    }

    async fn release_id(&self, id: &str) -> redis::RedisResult<ReleaseOutcome> {
        let left: Option<i64> = self
            .scripts
            .release
            .key(&self.keys.leases)
            .key(&self.keys.info)
            .key(&self.keys.fence)
            .key(&self.keys.limit)
            .key(&self.keys.channel)
            .arg(id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match left {
            None => ReleaseOutcome::Gone,
            Some(ms) if ms > 0 => ReleaseOutcome::InTime,
            Some(ms) => ReleaseOutcome::Late(millis(-ms)),
        })
    }

    /// Releases `id` without waiting for the answer: for dropped permits
    /// and abandoned grants. If Redis cannot be reached, the lease expires
    /// within its time to live.
    fn release_in_background(self: &Arc<Self>, id: String) {
        let inner = self.clone();
        self.spawner.spawn(async move {
            let _ = inner.release_id(&id).await;
        });
    }
}

/// A permit id on its way to becoming a grant. If the future that owns it
/// is dropped while a grant may have happened (a script call in flight, or
/// failed ambiguously), the id is released in the background.
pub(crate) struct Pending {
    inner: Arc<Inner>,
    id: String,
    maybe_granted: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.maybe_granted {
            self.inner
                .release_in_background(core::mem::take(&mut self.id));
        }
    }
}

/// Whether a failed call may still have run on the server.
fn is_ambiguous(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_connection_dropped() || e.is_io_error() || e.is_unrecoverable_error()
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn default_label() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{host}/{}", std::process::id())
}

/// Permit ids: 128 bits from the process's random hasher keys, the process
/// id, the time and a counter, so ids never repeat across processes.
struct IdSource {
    hasher: RandomState,
    counter: AtomicU64,
    start: Instant,
}

impl IdSource {
    fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            counter: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    fn random(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.hasher
            .hash_one((n, std::process::id(), self.start.elapsed().as_nanos()))
    }

    fn next(&self) -> String {
        format!("{:016x}{:016x}", self.random(), self.random())
    }
}

/// Where background work (renewals, pub/sub, releases of dropped permits)
/// runs: the tokio runtime the semaphore was built in, or smol's global
/// executor.
#[derive(Clone)]
enum Spawner {
    #[cfg(feature = "tokio")]
    Tokio(tokio::runtime::Handle),
    #[cfg(feature = "smol")]
    Smol,
}

impl Spawner {
    fn current() -> Option<Self> {
        #[cfg(feature = "tokio")]
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return Some(Self::Tokio(handle));
        }
        #[cfg(feature = "smol")]
        return Some(Self::Smol);
        #[allow(unreachable_code)]
        None
    }

    fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        match self {
            #[cfg(feature = "tokio")]
            Self::Tokio(handle) => {
                // A runtime that has shut down drops the task: the lease
                // then expires by itself.
                drop(handle.spawn(fut));
            }
            #[cfg(feature = "smol")]
            Self::Smol => smol::spawn(fut).detach(),
        }
    }
}
