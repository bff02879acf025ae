//! Per-key bulkheads: each key (a tenant, a downstream host, a user) gets
//! its own limit, optionally under one global limit, so that one noisy key
//! cannot take every permit.
//!
//! A [`KeyedBulkhead<K>`] keeps one [`Bulkhead`] per key it has seen, made
//! on first use from one template (limit, `max_wait`, `max_queue`,
//! fairness), with per-key limits from a function of the key
//! ([`limit_for`](KeyedBulkheadBuilder::limit_for)) or set at runtime
//! ([`set_limit_for`](KeyedBulkhead::set_limit_for)). With a global limit,
//! every call also takes a permit from one shared bulkhead, after its key's.
//!
//! It never grows without bound: it tracks at most
//! [`max_keys`](KeyedBulkheadBuilder::max_keys) keys. A key is *idle* when
//! no permit of it is held and nobody waits for one; idle keys are evicted
//! to make room for new ones (the one idle longest first), after
//! [`idle_timeout`](KeyedBulkheadBuilder::idle_timeout), or by
//! [`evict_idle`](KeyedBulkhead::evict_idle). A key in use is never
//! evicted, so its limit always holds; when every tracked key is in use, a
//! call for a new key is rejected with
//! [`TooManyKeys`](KeyedRejectReason::TooManyKeys). Metric labels are
//! bounded too: see [`key_label`](KeyedBulkheadBuilder::key_label).
//!
//! ```
//! use std::time::Duration;
//! use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedRejectReason};
//!
//! # futures::executor::block_on(async {
//! let tenants = KeyedBulkhead::<String>::builder()
//!     .name("tenants")
//!     .max_concurrent_calls(2) // each tenant: 2 calls at once
//!     .global_limit(8)         // all tenants together: 8
//!     .max_wait(Duration::ZERO)
//!     .max_keys(1_000)
//!     .idle_timeout(Duration::from_secs(60))
//!     .build()?;
//!
//! let report = tenants.call("acme", async { Ok::<_, std::io::Error>("report") }).await;
//! assert_eq!(report.unwrap(), "report");
//!
//! // acme is at its limit; globex is not affected.
//! let _a = tenants.try_acquire("acme").unwrap();
//! let _b = tenants.try_acquire("acme").unwrap();
//! let third = tenants.call("acme", async { Ok::<_, std::io::Error>(()) }).await;
//! assert!(matches!(
//!     third,
//!     Err(KeyedError::Rejected(r)) if r.reason() == KeyedRejectReason::KeyFull
//! ));
//! assert!(tenants.try_acquire("globex").is_ok());
//!
//! let acme = tenants.metrics_for("acme").unwrap();
//! assert_eq!((acme.in_flight(), acme.admitted(), acme.rejected()), (2, 3, 1));
//! # Ok::<(), watertight::BuildError>(())
//! # }).unwrap();
//! ```
//!
//! # Order of the two limits
//!
//! A call takes its key's permit first (waiting in its key's line if it
//! must), then a global one (waiting in the global line with what is left
//! of `max_wait`); if it gets no global permit it gives its key's permit
//! back. Nobody waits for a key's permit while holding a global one, so the
//! two cannot deadlock, and a noisy key's excess callers wait in their own
//! key's line holding nothing that others need: at most its limit of them
//! can be in the global line, which is FIFO, so every key gets its turn.
//! With [`fair_shares`](KeyedBulkheadBuilder::fair_shares), the global
//! line is served by key instead: the keys with callers waiting take turns
//! by weight ([`key_weight`](KeyedBulkheadBuilder::key_weight)), so a key
//! with a high limit cannot fill it either.
//!
//! # Overload options
//!
//! Controlled delay ([`queue_delay`](KeyedBulkheadBuilder::queue_delay))
//! runs on every key's line and on the global line, each judged on its
//! own: a tenant's standing line is cut to the target without touching
//! other tenants' lines. Deadline-aware admission (a call with a
//! [deadline](crate::CallOptions::deadline), through
//! [`call_with`](KeyedBulkhead::call_with) or
//! [`acquire_with`](KeyedBulkhead::acquire_with)) judges a call at both
//! stages, each with its own hold-time average. Both are off until used,
//! and reject with their own reasons
//! ([`KeyQueueDelay`](KeyedRejectReason::KeyQueueDelay),
//! [`GlobalWontMakeDeadline`](KeyedRejectReason::GlobalWontMakeDeadline),
//! and so on), counted per key and by the bulkhead that said no.
//!
//! # Costs
//!
//! A call for a tracked key takes no lock that all keys share: the keys are
//! spread over shards by hash, and finding one takes its shard's read lock
//! and an atomic increment; its permits are taken through the bulkheads'
//! own fast path, and its timers (`max_wait`, `call_timeout`) are armed
//! only once something waits, inline: no call on a tracked key allocates.
//! When a key's last call ends, the key moves to the back of its shard's
//! idle order (that shard's mutex; and a clock read with an `idle_timeout`
//! or from half of `max_keys` on), so that a new key at the `max_keys` cap
//! evicts the key idle longest in constant time, however many keys are
//! tracked. The first call for a key builds its bulkhead, with no lock
//! held. Keys are hashed with SipHash (std's `RandomState`), which resists
//! keys crafted by clients to collide and is about half of a tracked key's
//! cost over a plain bulkhead; [`KeyedBulkheadBuilder::hasher`] swaps it
//! for a faster one. The [keyed guide](crate::guide::keyed#costs) has the numbers.

mod builder;
mod engine;
mod entry;
mod error;
mod fair;
mod global;
mod idle;
mod key;
mod labels;
mod metrics;
mod permit;
mod registry;

pub use builder::KeyedBulkheadBuilder;
pub use error::{KeyedError, KeyedRejectReason, KeyedRejected};
pub use key::BorrowedKey;
pub use metrics::{KeyMetrics, KeyedStats};
pub use permit::KeyedPermit;

use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use std::hash::RandomState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::bulkhead::name::Name;
use crate::bulkhead::run::run_blocking;
use crate::bulkhead::{Bulkhead, BulkheadBuilder, CallOptions};
use crate::semaphore::Semaphore;
use crate::timer::Clock;
use fair::FairLine;
use labels::Labels;
use registry::Registry;

/// [`KeyedBulkheadBuilder::limit_for`].
type LimitFn<K> = Arc<dyn Fn(&K) -> usize + Send + Sync>;
/// [`KeyedBulkheadBuilder::key_label`].
type LabelFn<K> = Arc<dyn Fn(&K) -> String + Send + Sync>;
/// [`KeyedBulkheadBuilder::key_weight`].
type WeightFn<K> = Arc<dyn Fn(&K) -> u32 + Send + Sync>;

/// A bulkhead per key, optionally under a global limit, tracking a bounded
/// number of keys. See the [module documentation](self).
///
/// A `KeyedBulkhead` is cheap to clone; clones share one state. Keys are
/// looked up by any borrowed form (`&str` for `String` keys), and a key is
/// only cloned when it starts being tracked. `S` is the keys' hasher
/// (std's SipHash unless [`KeyedBulkheadBuilder::hasher`] says otherwise).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::keyed::KeyedBulkhead;
///
/// # futures::executor::block_on(async {
/// // At most 4 requests to any one host, 32 to all hosts together.
/// let hosts = KeyedBulkhead::<String>::builder()
///     .name("hosts")
///     .max_concurrent_calls(4)
///     .global_limit(32)
///     .max_wait(Duration::from_secs(1))
///     .call_timeout(Duration::from_secs(10))
///     .build()?;
///
/// let body = hosts
///     .call("api.example.com", async { Ok::<_, std::io::Error>("<html>") })
///     .await
///     .unwrap();
/// assert_eq!(body, "<html>");
/// assert_eq!(hosts.keys_tracked(), 1);
/// # Ok::<(), watertight::BuildError>(())
/// # }).unwrap();
/// ```
pub struct KeyedBulkhead<K, S = RandomState> {
    inner: Arc<Inner<K, S>>,
}

impl<K, S> Clone for KeyedBulkhead<K, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// What the builder decided.
struct Config<K, S> {
    name: Arc<str>,
    template: BulkheadBuilder,
    default_limit: usize,
    limit_for: Option<LimitFn<K>>,
    key_label: Option<LabelFn<K>>,
    max_labels: usize,
    max_wait: Option<Duration>,
    call_timeout: Option<Duration>,
    clock: Option<Clock>,
    global: Option<Bulkhead>,
    global_owned: bool,
    fair_shares: bool,
    key_weight: Option<WeightFn<K>>,
    max_keys: usize,
    idle_timeout: Option<Duration>,
    hasher: S,
}

/// The state every clone shares.
struct Inner<K, S> {
    name: Arc<str>,
    /// `name`, interned, for rejections (see [`KeyedRejected`]).
    interned: Name,
    /// Every key's bulkhead is built from this, with its name and limit.
    template: BulkheadBuilder,
    default_limit: usize,
    limit_for: Option<LimitFn<K>>,
    key_label: Option<LabelFn<K>>,
    labels: Labels,
    /// The metrics exporters of the keys, one per label.
    series: labels::KeySeries,
    /// The budget for both waits.
    max_wait: Option<Duration>,
    call_timeout: Option<Duration>,
    /// The timer of the budget's global stage and of `call_timeout`,
    /// resolved once by the builder: present whenever `max_wait` is
    /// non-zero, `call_timeout` or `leak_threshold` is set. (Each key's
    /// bulkhead resolves the same timer for its own wait.)
    clock: Option<Clock>,
    global: Option<Bulkhead>,
    /// Whether `global` was made by the builder (and is closed with us).
    global_owned: bool,
    /// Fair shares of `global` among keys, if on (`fair.rs`): callers that
    /// are to wait for a global seat wait here for their key's turn first.
    fair: Option<Box<FairLine>>,
    key_weight: Option<WeightFn<K>>,
    /// The tracked keys, in shards, with their eviction order. No lock of
    /// it is held across an await, nor while user code runs (`limit_for`,
    /// `key_label`, observers and metrics recorders, all called by a key's
    /// bulkhead's construction); only `K`'s own `Eq`, `Clone` and `Drop`
    /// run under one (keys are hashed before a shard is locked, and the
    /// tables rehash by the hashes they keep).
    registry: Registry<K, S>,
    /// Serialises `set_limit_for` and `clear_limit_for`, so the last one to
    /// record an override is the last one to apply it.
    limits: Mutex<()>,
    /// Set by `close` before it collects the entries to close (an insert
    /// checks it with its shard locked: see the registry's notes), then
    /// `closing` is closed.
    closed: AtomicBool,
    /// Wakes callers waiting for a global permit when we close (a shared
    /// global bulkhead is not closed with us): a semaphore with no permits,
    /// which such a caller waits on (an intrusive waiter, no allocation)
    /// until `close` closes it.
    closing: Semaphore,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    rejected_too_many_keys: AtomicU64,
    rejected_closed: AtomicU64,
    rejected_global: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<K> KeyedBulkhead<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Starts configuring a keyed bulkhead.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let hosts = KeyedBulkhead::<String>::builder()
    ///     .name("hosts")
    ///     .max_concurrent_calls(4)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(hosts.name(), "hosts");
    /// ```
    pub fn builder() -> KeyedBulkheadBuilder<K> {
        KeyedBulkheadBuilder::new()
    }
}

impl<K, S> KeyedBulkhead<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The keyed bulkhead's name, as given to the builder.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Runs `call` once its key and the global limit (if any) admit it,
    /// then gives both permits back.
    ///
    /// The future is not polled at all if the call is rejected. If
    /// `call_timeout` is set and the call runs longer, it is dropped and
    /// [`KeyedError::CallTimeout`] returned.
    ///
    /// # Errors
    ///
    /// [`KeyedError::Rejected`] if the call was not admitted (see
    /// [`KeyedRejectReason`]), [`KeyedError::CallTimeout`] if it ran out
    /// of time, [`KeyedError::Inner`] with the call's own error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future while it waits leaves the line it is in
    /// (giving back the key's permit if it was waiting for a global one);
    /// while the call runs, it drops the call and releases both permits.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(2).build().unwrap();
    /// let rows = tenants.call("acme", async { Ok::<_, std::io::Error>(vec![1, 2]) }).await;
    /// assert_eq!(rows.unwrap(), [1, 2]);
    /// # });
    /// ```
    pub fn call<Q, F, T, E>(
        &self,
        key: &Q,
        call: F,
    ) -> impl Future<Output = Result<T, KeyedError<E>>>
    where
        Q: BorrowedKey<K> + ?Sized,
        F: Future<Output = Result<T, E>>,
    {
        self.staged::<true, Q, F, T, E>(key, CallOptions::new(), call)
    }

    /// [`call`](Self::call) with [`CallOptions`], read at both stages.
    ///
    /// - A deadline: deadline-aware admission (as
    ///   [`Bulkhead::call_with`]'s) at each stage. Rejected at once if the
    ///   deadline has passed, or if the wait the key's line can expect
    ///   plus the key's average hold time does not fit in the time left
    ///   ([`KeyWontMakeDeadline`]); if it must wait for its key, it waits
    ///   at most until it could still finish. Then, holding its key's
    ///   permit, the global stage judges the same way with what is left
    ///   ([`GlobalWontMakeDeadline`]); a call turned away there gives its
    ///   key's permit back at once. Each stage judges with what it knows:
    ///   the key's stage does not see the global line, so a call may pass
    ///   its key and be turned away by the global stage.
    /// - A `max_wait` of its own, if shorter than the keyed bulkhead's:
    ///   the budget of both waits for this call.
    /// - A class: the priority class of the call at the global stage, if
    ///   the global bulkhead has [priority
    ///   classes](crate::BulkheadBuilder::priorities) (see
    ///   [`KeyedBulkheadBuilder::global`]); each key's line is served in
    ///   arrival order.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), and [`KeyedError::Rejected`] with
    /// [`KeyWontMakeDeadline`], [`GlobalWontMakeDeadline`] or
    /// [`GlobalDisplaced`](KeyedRejectReason::GlobalDisplaced).
    ///
    /// # Cancel safety
    ///
    /// As [`call`](Self::call).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::CallOptions;
    /// use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedRejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(2)
    ///     .global_limit(8)
    ///     .build()
    ///     .unwrap();
    /// let soon = CallOptions::new().deadline(Instant::now() + Duration::from_secs(5));
    /// let rows = tenants.call_with("acme", soon, async { Ok::<_, ()>(3) }).await;
    /// assert_eq!(rows.unwrap(), 3);
    ///
    /// let too_late = CallOptions::new().deadline(Instant::now() - Duration::from_millis(1));
    /// match tenants.call_with("acme", too_late, async { Ok::<_, ()>(4) }).await {
    ///     Err(KeyedError::Rejected(r)) => {
    ///         assert_eq!(r.reason(), KeyedRejectReason::KeyWontMakeDeadline)
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// assert_eq!(tenants.metrics_for("acme").unwrap().rejected_deadline(), 1);
    /// # });
    /// ```
    ///
    /// [`KeyWontMakeDeadline`]: KeyedRejectReason::KeyWontMakeDeadline
    /// [`GlobalWontMakeDeadline`]: KeyedRejectReason::GlobalWontMakeDeadline
    /// [`KeyedBulkheadBuilder::global`]: crate::keyed::KeyedBulkheadBuilder::global
    pub fn call_with<Q, F, T, E>(
        &self,
        key: &Q,
        options: CallOptions,
        call: F,
    ) -> impl Future<Output = Result<T, KeyedError<E>>>
    where
        Q: BorrowedKey<K> + ?Sized,
        F: Future<Output = Result<T, E>>,
    {
        self.staged::<false, Q, F, T, E>(key, options, call)
    }

    /// [`call`](Self::call) for a plain thread: blocks the thread until
    /// both stages admit the call (the key's, then the global one, under the
    /// same budget and lines as async callers), runs `call`, then gives the
    /// permits back. As with
    /// [`Bulkhead::call_blocking`](crate::Bulkhead::call_blocking),
    /// `call_timeout` cannot cut a closure short, a panic gives the permits
    /// back, and it must not be called inside an async task.
    ///
    /// # Errors
    ///
    /// [`KeyedError::Rejected`] if the call was not admitted,
    /// [`KeyedError::Inner`] with the call's own error.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let hosts = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let rows = hosts.call_blocking("db-1.internal", || Ok::<_, ()>(vec![1, 2]));
    /// assert_eq!(rows.unwrap(), [1, 2]);
    /// ```
    pub fn call_blocking<Q, T, E>(
        &self,
        key: &Q,
        call: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, KeyedError<E>>
    where
        Q: BorrowedKey<K> + ?Sized,
    {
        let mut permit = crate::blocking::block_on(self.acquire(key))?;
        run_blocking(call, |outcome| permit.set_outcome(outcome)).map_err(KeyedError::Inner)
    }

    /// Waits for a permit of `key` and then, with a global limit, a global
    /// permit, under the `max_wait` budget; for callers that manage the
    /// guarded work themselves. The call counts as in flight until the
    /// permit is dropped.
    ///
    /// # Errors
    ///
    /// [`KeyedRejected`], with the [reason](KeyedRejected::reason).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives up its place in line (and
    /// the key's permit, if it had one) and nothing else.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let hosts = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let permit = hosts.acquire("db-1.internal").await.unwrap();
    /// // ... the guarded work ...
    /// drop(permit);
    /// # });
    /// ```
    pub async fn acquire<Q: BorrowedKey<K> + ?Sized>(
        &self,
        key: &Q,
    ) -> Result<KeyedPermit, KeyedRejected> {
        let inner = &*self.inner;
        inner
            .acquire_with(inner.enter(key)?, CallOptions::new())
            .await
    }

    /// [`acquire`](Self::acquire) with [`CallOptions`]: admitted, rejected
    /// at once or bounded in its waits as [`call_with`](Self::call_with)
    /// says.
    ///
    /// # Errors
    ///
    /// [`KeyedRejected`], with the [reason](KeyedRejected::reason), among
    /// them [`KeyWontMakeDeadline`](KeyedRejectReason::KeyWontMakeDeadline)
    /// and [`GlobalWontMakeDeadline`](KeyedRejectReason::GlobalWontMakeDeadline).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives up its place in line (and
    /// the key's permit, if it had one) and nothing else.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::CallOptions;
    /// use watertight::keyed::{KeyedBulkhead, KeyedRejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let hosts = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let soon = CallOptions::new().deadline(Instant::now() + Duration::from_secs(1));
    /// let permit = hosts.acquire_with("db-1.internal", soon).await.unwrap();
    /// drop(permit);
    /// let passed = CallOptions::new().deadline(Instant::now() - Duration::from_secs(1));
    /// let rejected = hosts.acquire_with("db-1.internal", passed).await.unwrap_err();
    /// assert_eq!(rejected.reason(), KeyedRejectReason::KeyWontMakeDeadline);
    /// # });
    /// ```
    pub async fn acquire_with<Q: BorrowedKey<K> + ?Sized>(
        &self,
        key: &Q,
        options: CallOptions,
    ) -> Result<KeyedPermit, KeyedRejected> {
        let inner = &*self.inner;
        inner.acquire_with(inner.enter(key)?, options).await
    }

    /// Takes a permit of `key` and a global one only if both are free now;
    /// never waits, whatever `max_wait` says.
    ///
    /// # Errors
    ///
    /// [`KeyedRejected`] with [`KeyFull`](KeyedRejectReason::KeyFull),
    /// [`GlobalFull`](KeyedRejectReason::GlobalFull),
    /// [`TooManyKeys`](KeyedRejectReason::TooManyKeys) or
    /// [`Closed`](KeyedRejectReason::Closed).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::{KeyedBulkhead, KeyedRejectReason};
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(1)
    ///     .global_limit(1)
    ///     .build()
    ///     .unwrap();
    /// let _held = tenants.try_acquire("acme").unwrap();
    /// let acme = tenants.try_acquire("acme").unwrap_err();
    /// assert_eq!(acme.reason(), KeyedRejectReason::KeyFull);
    /// let globex = tenants.try_acquire("globex").unwrap_err();
    /// assert_eq!(globex.reason(), KeyedRejectReason::GlobalFull);
    /// ```
    pub fn try_acquire<Q: BorrowedKey<K> + ?Sized>(
        &self,
        key: &Q,
    ) -> Result<KeyedPermit, KeyedRejected> {
        self.try_acquire_with(key, CallOptions::new())
    }

    /// [`try_acquire`](Self::try_acquire) with [`CallOptions`]: with a
    /// deadline, deadline-aware admission at both stages first; with a
    /// class, a seat of that class at the global stage (see
    /// [`call_with`](Self::call_with)).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), and
    /// [`KeyWontMakeDeadline`](KeyedRejectReason::KeyWontMakeDeadline) or
    /// [`GlobalWontMakeDeadline`](KeyedRejectReason::GlobalWontMakeDeadline).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::CallOptions;
    /// use watertight::keyed::{KeyedBulkhead, KeyedRejectReason};
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let passed = CallOptions::new().deadline(Instant::now() - Duration::from_secs(1));
    /// let rejected = tenants.try_acquire_with("acme", passed).unwrap_err();
    /// assert_eq!(rejected.reason(), KeyedRejectReason::KeyWontMakeDeadline);
    /// ```
    pub fn try_acquire_with<Q: BorrowedKey<K> + ?Sized>(
        &self,
        key: &Q,
        options: CallOptions,
    ) -> Result<KeyedPermit, KeyedRejected> {
        let inner = &*self.inner;
        inner.try_acquire_with(inner.enter(key)?, options)
    }

    /// Sets `key`'s limit, at once if it is tracked (as
    /// [`Bulkhead::set_max_concurrent_calls`] does: growing admits waiters,
    /// shrinking lets calls in flight finish), and for whenever it is
    /// tracked again after an eviction: the override is kept until
    /// [`clear_limit_for`](Self::clear_limit_for), so keep their number
    /// bounded. `0` pauses the key.
    ///
    /// # Panics
    ///
    /// Panics if `limit` exceeds [`Semaphore::MAX_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(2).build().unwrap();
    /// tenants.set_limit_for("bigcorp", 10); // not tracked yet: applies when it is
    /// let _p = tenants.try_acquire("bigcorp").unwrap();
    /// assert_eq!(tenants.metrics_for("bigcorp").unwrap().max_concurrent_calls(), 10);
    /// ```
    pub fn set_limit_for<Q: BorrowedKey<K> + ?Sized>(&self, key: &Q, limit: usize) {
        assert!(
            limit <= Semaphore::MAX_PERMITS,
            "a key's limit must not exceed Semaphore::MAX_PERMITS"
        );
        let inner = &*self.inner;
        let _limits = inner.limits.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = inner.registry.set_override(key, Some(limit));
        // A key made after the override was recorded reads it; one made
        // before is found here.
        if let Some(entry) = entry {
            entry.bulkhead.set_max_concurrent_calls(limit);
        }
    }

    /// Forgets the override [`set_limit_for`](Self::set_limit_for) set for
    /// `key`: its limit goes back to what
    /// [`limit_for`](KeyedBulkheadBuilder::limit_for) or
    /// `max_concurrent_calls` give, at once if it is tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(2).build().unwrap();
    /// let _p = tenants.try_acquire("acme").unwrap();
    /// tenants.set_limit_for("acme", 0); // paused
    /// assert!(tenants.try_acquire("acme").is_err());
    /// tenants.clear_limit_for("acme");
    /// assert_eq!(tenants.metrics_for("acme").unwrap().max_concurrent_calls(), 2);
    /// ```
    pub fn clear_limit_for<Q: BorrowedKey<K> + ?Sized>(&self, key: &Q) {
        let inner = &*self.inner;
        // User code: before taking any lock.
        let fallback = inner.limit_of(&key.to_owned());
        let _limits = inner.limits.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = inner.registry.set_override(key, None);
        if let Some(entry) = entry {
            entry.bulkhead.set_max_concurrent_calls(fallback);
        }
    }

    /// How many keys are tracked now (a new key counts from the moment its
    /// place is taken, just before it is inserted); never more than
    /// [`max_keys`](KeyedBulkheadBuilder::max_keys).
    pub fn keys_tracked(&self) -> usize {
        self.inner.registry.len()
    }

    /// The keys tracked now, in no particular order. The keys are read a
    /// shard at a time, so while other threads add and evict keys the list
    /// is no single instant's picture.
    pub fn keys(&self) -> Vec<K> {
        self.inner.registry.keys()
    }

    /// A snapshot of `key`, if it is tracked. Looking does not track it,
    /// and does not keep it from being evicted.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(3).build().unwrap();
    /// assert!(tenants.metrics_for("acme").is_none());
    /// let _p = tenants.try_acquire("acme").unwrap();
    /// let m = tenants.metrics_for("acme").unwrap();
    /// assert_eq!((m.max_concurrent_calls(), m.in_flight()), (3, 1));
    /// ```
    pub fn metrics_for<Q: BorrowedKey<K> + ?Sized>(&self, key: &Q) -> Option<KeyMetrics<K>> {
        let (key, entry) = self.inner.registry.get(key)?;
        Some(entry.metrics(key, self.inner.global.is_some()))
    }

    /// A snapshot of every tracked key, in no particular order. Sort it to
    /// show the busiest keys:
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(3).build().unwrap();
    /// let _held = [tenants.try_acquire("acme").unwrap(), tenants.try_acquire("acme").unwrap()];
    /// let _other = tenants.try_acquire("globex").unwrap();
    ///
    /// let mut keys = tenants.snapshot();
    /// keys.sort_by_key(|k| std::cmp::Reverse(k.in_flight()));
    /// assert_eq!((keys[0].key().as_str(), keys[0].in_flight()), ("acme", 2));
    /// ```
    pub fn snapshot(&self) -> Vec<KeyMetrics<K>> {
        let entries = self.inner.registry.snapshot();
        let global = self.inner.global.is_some();
        entries
            .into_iter()
            .map(|(k, e)| e.metrics(k, global))
            .collect()
    }

    /// The global bulkhead, if there is a global limit: to read its
    /// metrics, or change its limit with
    /// [`set_max_concurrent_calls`](Bulkhead::set_max_concurrent_calls).
    pub fn global(&self) -> Option<&Bulkhead> {
        self.inner.global.as_ref()
    }

    /// A snapshot of the global bulkhead, if there is a global limit.
    /// Callers whose `max_wait` budget ran out while they waited for it are
    /// not among its rejections: see [`KeyedStats::rejected_by_global`].
    pub fn global_metrics(&self) -> Option<crate::Metrics> {
        self.inner.global.as_ref().map(Bulkhead::metrics)
    }

    /// Counts for the keyed bulkhead as a whole: keys tracked, created and
    /// evicted, and the rejections no single key's metrics hold.
    pub fn stats(&self) -> KeyedStats {
        let inner = &*self.inner;
        let registry = &inner.registry;
        let c = &inner.counters;
        KeyedStats {
            name: inner.name.clone(),
            keys_tracked: registry.len(),
            max_keys: registry.max_keys(),
            labels_in_use: inner.labels.in_use(),
            max_labels: inner.labels.max,
            closed: inner.closed.load(Ordering::SeqCst),
            keys_created: registry.keys_created(),
            keys_evicted: registry.keys_evicted(),
            rejected_too_many_keys: get(&c.rejected_too_many_keys),
            rejected_closed: get(&c.rejected_closed),
            rejected_global: get(&c.rejected_global),
        }
    }

    /// Evicts the idle keys (no permit held, nobody waiting): those idle
    /// for at least `idle_timeout`, or every idle key if there is none.
    /// Returns how many were evicted. Keys in use are never evicted. Call it
    /// from a maintenance task to free memory sooner than new keys would.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let hosts = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let busy = hosts.try_acquire("a.example").unwrap();
    /// drop(hosts.try_acquire("b.example").unwrap());
    /// assert_eq!(hosts.evict_idle(), 1); // b; a is in use
    /// assert_eq!(hosts.keys(), ["a.example"]);
    /// drop(busy);
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.inner.registry.evict_idle()
    }

    /// Rejects every waiting and every later call with
    /// [`Closed`](KeyedRejectReason::Closed), for every key, and closes the
    /// global bulkhead if the builder made it (a shared one, from
    /// [`global`](KeyedBulkheadBuilder::global), stays open; callers of this
    /// keyed bulkhead waiting for it are rejected all the same). Calls in
    /// flight run to the end; use [`wait_idle`](Self::wait_idle) to wait
    /// for them.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::{KeyedBulkhead, KeyedRejectReason};
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// tenants.close();
    /// let rejected = tenants.try_acquire("acme").unwrap_err();
    /// assert_eq!(rejected.reason(), KeyedRejectReason::Closed);
    /// ```
    pub fn close(&self) {
        let inner = &*self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        // After the flag: an insert either saw it or is collected here.
        let entries = inner.registry.entries();
        inner.closing.close();
        for entry in &entries {
            entry.bulkhead.close();
        }
        if inner.global_owned {
            if let Some(global) = &inner.global {
                global.close();
            }
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// After [`close`](Self::close), resolves once no call of any key is in
    /// flight. (Before `close`, keys tracked after it started are not
    /// waited for.)
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(2).build().unwrap();
    /// let permit = tenants.try_acquire("acme").unwrap();
    /// tenants.close();
    /// std::thread::spawn(move || drop(permit));
    /// tenants.wait_idle().await;
    /// assert_eq!(tenants.metrics_for("acme").unwrap().in_flight(), 0);
    /// # });
    /// ```
    ///
    /// # Cancel safety
    ///
    /// It holds nothing: dropping it only stops the wait.
    pub async fn wait_idle(&self) {
        let entries = self.inner.registry.entries();
        for entry in entries {
            entry.bulkhead.wait_idle().await;
        }
    }
}

impl<K, S> fmt::Debug for KeyedBulkhead<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("KeyedBulkhead")
            .field("name", &inner.name)
            .field("keys_tracked", &inner.registry.len())
            .field("max_keys", &inner.registry.max_keys())
            .field("global", &inner.global)
            .field("fair_shares", &inner.fair.is_some())
            .field("timer", &inner.clock)
            .field("closed", &inner.closed.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}
