//! Configuring a keyed bulkhead.

use core::fmt;
use core::hash::{BuildHasher, Hash};
use std::hash::RandomState;
use std::sync::Arc;
use std::time::Duration;

use super::{Inner, KeyedBulkhead, LabelFn, LimitFn, WeightFn};
use crate::bulkhead::builder::{Checked, check_limit};
use crate::bulkhead::{BuildError, BuildErrorKind, Bulkhead, BulkheadBuilder, Observer};
#[cfg(doc)]
use crate::semaphore::Semaphore;
use crate::timer::Timer;

/// The default of [`KeyedBulkheadBuilder::max_keys`].
const DEFAULT_MAX_KEYS: usize = 10_000;
/// The default of [`KeyedBulkheadBuilder::max_labels`].
const DEFAULT_MAX_LABELS: usize = 100;

/// Configures a [`KeyedBulkhead`]; made by [`KeyedBulkhead::builder`].
///
/// Per key (each key gets a [`Bulkhead`] built from these):
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `max_concurrent_calls` | required, unless `limit_for` is set | each key's limit |
/// | `limit_for` | none | a function of the key that gives its limit, instead |
/// | `max_queue` | unbounded | how many callers of one key may wait |
/// | `fair` | `true` | strict FIFO within a key (and in the global line) |
/// | `leak_threshold` | none | report a key's permit held longer than this |
/// | `queue_delay` | off | controlled delay on each key's line (and on the global line) |
/// | `adaptive_lifo` | off | with `queue_delay`: serve a standing line's newest waiter first |
///
/// For every call:
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `max_wait` | unbounded | one budget for waiting on the key's limit and then the global one; `Duration::ZERO` fails fast |
/// | `call_timeout` | none | bound on the guarded call in [`KeyedBulkhead::call`] |
///
/// Shared:
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `name` | `"keyed"` | shown in errors, metrics and events |
/// | `global_limit` / `global` | none | a limit on all keys' calls together |
/// | `global_max_queue` | unbounded | how many callers may wait for a global permit (with `global_limit`) |
/// | `fair_shares` / `key_weight` | off | a contended global limit is served to the keys in turns, by weight (with `global_limit`) |
/// | `max_keys` | 10,000 | the most keys tracked at once |
/// | `idle_timeout` | none | keys idle this long are evicted as new keys arrive |
/// | `key_label` | none | a metric label per key, for the keys' bulkhead names |
/// | `max_labels` | 100 | distinct labels before the rest are `"other"` |
/// | `hasher` | std's `RandomState` (SipHash) | how keys are hashed; see [`hasher`](Self::hasher) |
/// | `timer` | the current runtime's, else [`default_timer`](crate::timer::default_timer)'s fallback | where delays come from |
/// | `observer` | none | hooks that see every call of every key (and of the built-in global bulkhead) |
/// | `exporters` | `true` | publish to `metrics` / `tracing` when those features are on |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::keyed::KeyedBulkhead;
///
/// let tenants = KeyedBulkhead::<String>::builder()
///     .name("tenants")
///     .max_concurrent_calls(4)
///     .limit_for(|tenant: &String| if tenant == "bigcorp" { 16 } else { 4 })
///     .global_limit(64)
///     .max_wait(Duration::from_millis(500))
///     .max_queue(32)
///     .max_keys(5_000)
///     .idle_timeout(Duration::from_secs(300))
///     .build()
///     .unwrap();
/// assert_eq!(tenants.name(), "tenants");
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedBulkheadBuilder<K, S = RandomState> {
    /// What every key's bulkhead is built from, and the settings it shares
    /// with the keyed bulkhead (name, the default limit, `max_wait`,
    /// `call_timeout`, the timer, observers...): one core, one validation.
    base: BulkheadBuilder,
    limit_for: Option<LimitFn<K>>,
    global: Global,
    global_max_queue: Option<usize>,
    fair_shares: bool,
    key_weight: Option<WeightFn<K>>,
    max_keys: usize,
    idle_timeout: Option<Duration>,
    key_label: Option<LabelFn<K>>,
    max_labels: usize,
    hasher: S,
}

/// Where the global limit comes from.
#[derive(Clone)]
enum Global {
    None,
    Limit(usize),
    Shared(Bulkhead),
}

impl<K, S: Clone> Clone for KeyedBulkheadBuilder<K, S> {
    fn clone(&self) -> Self {
        Self {
            base: self.base.clone(),
            limit_for: self.limit_for.clone(),
            global: self.global.clone(),
            global_max_queue: self.global_max_queue,
            fair_shares: self.fair_shares,
            key_weight: self.key_weight.clone(),
            max_keys: self.max_keys,
            idle_timeout: self.idle_timeout,
            key_label: self.key_label.clone(),
            max_labels: self.max_labels,
            hasher: self.hasher.clone(),
        }
    }
}

impl<K> KeyedBulkheadBuilder<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    pub(crate) fn new() -> Self {
        Self {
            base: Bulkhead::builder(),
            limit_for: None,
            global: Global::None,
            global_max_queue: None,
            fair_shares: false,
            key_weight: None,
            max_keys: DEFAULT_MAX_KEYS,
            idle_timeout: None,
            key_label: None,
            max_labels: DEFAULT_MAX_LABELS,
            hasher: RandomState::new(),
        }
    }
}

impl<K, S> KeyedBulkheadBuilder<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Names the keyed bulkhead (the guarded dependency, or the kind of
    /// key: `"tenants"`, `"hosts"`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.base.name = Some(name.into());
        self
    }

    /// Each key's limit on calls in flight at once, at least 1. Required
    /// unless [`limit_for`](Self::limit_for) is set. A key's limit can be
    /// changed later with [`KeyedBulkhead::set_limit_for`].
    pub fn max_concurrent_calls(mut self, limit: usize) -> Self {
        self.base.max_concurrent_calls = Some(limit);
        self
    }

    /// Gives each key its own limit: called once when a key starts being
    /// tracked (again after an eviction), with no lock held. Overrides
    /// [`max_concurrent_calls`](Self::max_concurrent_calls), and is
    /// overridden by [`KeyedBulkhead::set_limit_for`]. `0` pauses the key
    /// (its callers wait or are rejected); values above
    /// [`Semaphore::MAX_PERMITS`] are capped.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .limit_for(|tenant: &String| if tenant.starts_with("enterprise-") { 20 } else { 2 })
    ///     .build()
    ///     .unwrap();
    /// let _p = tenants.try_acquire("enterprise-acme").unwrap();
    /// assert_eq!(tenants.metrics_for("enterprise-acme").unwrap().max_concurrent_calls(), 20);
    /// ```
    pub fn limit_for(mut self, limit: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        self.limit_for = Some(Arc::new(limit));
        self
    }

    /// How long a call may wait, in all: first for one of its key's
    /// permits, then, with what is left, for a global one. Past it the call
    /// is rejected with
    /// [`KeyTimeout`](super::KeyedRejectReason::KeyTimeout) or
    /// [`GlobalTimeout`](super::KeyedRejectReason::GlobalTimeout).
    /// `Duration::ZERO` fails fast at both stages. Not set: wait as long as
    /// it takes.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.base.max_wait = Some(max_wait);
        self
    }

    /// The most callers of one key that may wait for its permits at once;
    /// past it, a caller is rejected at once with
    /// [`KeyFull`](super::KeyedRejectReason::KeyFull). `0` means nobody
    /// waits for a key.
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.base.max_queue = Some(max_queue);
        self
    }

    /// A bound on the guarded call in [`KeyedBulkhead::call`]: past it the
    /// call is dropped, its permits released, and
    /// [`KeyedError::CallTimeout`](super::KeyedError::CallTimeout)
    /// returned. Must be greater than zero.
    ///
    /// As with [`BulkheadBuilder::call_timeout`], the timer is armed only
    /// when the call first waits (its first poll returns `Pending`), so a
    /// call that completes at once costs no timer; the bound counts from
    /// there.
    pub fn call_timeout(mut self, call_timeout: Duration) -> Self {
        self.base.call_timeout = Some(call_timeout);
        self
    }

    /// `true` (the default): each key's callers, and the callers waiting
    /// for a global permit, are admitted strictly in arrival order.
    /// `false`: a caller that finds a free permit takes it even if others
    /// wait.
    pub fn fair(mut self, fair: bool) -> Self {
        self.base.fair = fair;
        self
    }

    /// Controlled delay (as [`BulkheadBuilder::queue_delay`]) on every
    /// waiting line: each key's own line, and the global line made by
    /// [`global_limit`](Self::global_limit). Off by default.
    ///
    /// Each line is judged on its own: once a key's waits have stood at or
    /// above `target` for a whole `interval`, that key's waiters who have
    /// waited `target` are cut
    /// ([`KeyQueueDelay`](super::KeyedRejectReason::KeyQueueDelay)) and
    /// its newcomers wait `target` at most, until its line empties; other
    /// keys' lines are not touched. The global line is cut the same way
    /// ([`GlobalQueueDelay`](super::KeyedRejectReason::GlobalQueueDelay)),
    /// from the waits of every key's callers in it; a caller cut there
    /// gives its key's permit back at once. The global line's samples are
    /// the waits that ended with a global permit (the keyed bulkhead's
    /// `max_wait` budget is each caller's own, not the line's). A global
    /// bulkhead shared with [`global`](Self::global) keeps its own
    /// setting. The target must be greater than zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(4)
    ///     .global_limit(32)
    ///     .max_wait(Duration::from_millis(500))
    ///     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// let _p = tenants.try_acquire("acme").unwrap();
    /// assert_eq!(tenants.metrics_for("acme").unwrap().rejected_queue_delay(), 0);
    /// ```
    pub fn queue_delay(mut self, target: Duration, interval: Duration) -> Self {
        self.base.queue_delay = Some((target, interval));
        self
    }

    /// Adaptive LIFO (as [`BulkheadBuilder::adaptive_lifo`]) on every line
    /// that has [`queue_delay`](Self::queue_delay): while a key's line
    /// stands, that key's permits go to its newest waiter first, and once
    /// its line empties to its oldest again; other keys' lines are not
    /// touched. The global line made by [`global_limit`](Self::global_limit)
    /// does the same with its own standing (with
    /// [`fair_shares`](Self::fair_shares), among the callers whose key's
    /// turn has come). Off by default; without `queue_delay`,
    /// [`build`](Self::build) fails with
    /// [`BuildErrorKind::AdaptiveLifoWithoutQueueDelay`](crate::BuildErrorKind::AdaptiveLifoWithoutQueueDelay),
    /// and on an unfair keyed bulkhead with
    /// [`BuildErrorKind::AdaptiveLifoUnfair`](crate::BuildErrorKind::AdaptiveLifoUnfair).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(4)
    ///     .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
    ///     .adaptive_lifo(true)
    ///     .build()
    ///     .unwrap();
    /// assert!(tenants.try_acquire("acme").is_ok());
    /// ```
    pub fn adaptive_lifo(mut self, on: bool) -> Self {
        self.base.adaptive_lifo = on;
        self
    }

    /// Reports every key's permit held longer than `threshold` (see
    /// [`BulkheadBuilder::leak_threshold`]). Must be greater than zero.
    pub fn leak_threshold(mut self, threshold: Duration) -> Self {
        self.base.leak_threshold = Some(threshold);
        self
    }

    /// The timer for `max_wait`, `call_timeout` and `leak_threshold`, for
    /// the keyed bulkhead and every key's bulkhead, instead of the default
    /// (as for [`BulkheadBuilder::timer`]: each sleep on the timer of the
    /// tokio runtime it is made in, else on the fallback that
    /// [`default_timer`](crate::timer::default_timer) picks outside tokio).
    /// The bundled timers' sleeps live inline in the waiting futures, so no
    /// call allocates for them; a timer of your own is asked for a boxed
    /// [`Sleep`](crate::timer::Sleep) per wait.
    ///
    /// [`build`](Self::build) fails with
    /// [`BuildErrorKind::TimerUnavailable`] inside a tokio runtime without
    /// a time driver (for the default, or a `TokioTimer` of such a runtime).
    /// A wait or a call whose timer stops working later is rejected with
    /// [`Unavailable`](super::KeyedRejectReason::Unavailable).
    pub fn timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.base.timer = Some(timer);
        self
    }

    /// Adds hooks that see every call of every key: each key's bulkhead
    /// reports to them under its own name (see
    /// [`key_label`](Self::key_label)), and so does the global bulkhead
    /// made by [`global_limit`](Self::global_limit), as `"<name>.global"`.
    /// Under a global limit, a key's bulkhead reports a call as permitted
    /// once both stages admitted it, and a call the global stage turned
    /// away as its rejection, for the global stage's reason. May be called
    /// more than once.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.base.observers.push(observer);
        self
    }

    /// Whether the keys' bulkheads (and the one made by `global_limit`)
    /// publish to the `metrics` facade and to `tracing` when those features
    /// are on (default `true`). Their labels are bounded: see
    /// [`key_label`](Self::key_label). The keys' series are registered
    /// once a recorder is in effect, as
    /// [`BulkheadBuilder::exporters`](crate::BulkheadBuilder::exporters)
    /// says.
    pub fn exporters(mut self, enabled: bool) -> Self {
        self.base = self.base.exporters(enabled);
        self
    }

    /// As [`BulkheadBuilder::export_metrics`](crate::BulkheadBuilder::export_metrics),
    /// for the keys' bulkheads and the one made by `global_limit`.
    pub fn export_metrics(mut self, enabled: bool) -> Self {
        self.base = self.base.export_metrics(enabled);
        self
    }

    /// As [`BulkheadBuilder::export_tracing`](crate::BulkheadBuilder::export_tracing),
    /// for the keys' bulkheads and the one made by `global_limit`.
    pub fn export_tracing(mut self, enabled: bool) -> Self {
        self.base = self.base.export_tracing(enabled);
        self
    }

    /// As [`BulkheadBuilder::trace_levels`](crate::BulkheadBuilder::trace_levels),
    /// for the keys' bulkheads and the one made by `global_limit`.
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn trace_levels(mut self, levels: crate::observer::TraceLevels) -> Self {
        self.base = self.base.trace_levels(levels);
        self
    }

    /// A limit on the calls of all keys together: a bulkhead named
    /// `"<name>.global"` that every call also takes a permit from, after
    /// its key's. Must be at least 1. Replaces an earlier
    /// [`global`](Self::global).
    pub fn global_limit(mut self, limit: usize) -> Self {
        self.global = Global::Limit(limit);
        self
    }

    /// With [`global_limit`](Self::global_limit): the most callers that may
    /// wait for a global permit at once; past it, a caller is rejected at
    /// once with [`GlobalFull`](super::KeyedRejectReason::GlobalFull).
    /// Each waiter already holds its key's permit, so this line never holds
    /// more than the sum of the keys' limits anyway.
    pub fn global_max_queue(mut self, max_queue: usize) -> Self {
        self.global_max_queue = Some(max_queue);
        self
    }

    /// Shares an existing bulkhead as the global limit: with other keyed
    /// bulkheads, or with code that calls it directly. Its own policy
    /// applies as well (its `max_wait` and `max_queue`, its observers); the
    /// keyed bulkhead's `max_wait` budget bounds the wait too.
    /// [`KeyedBulkhead::close`] does not close it. Replaces an earlier
    /// [`global_limit`](Self::global_limit).
    ///
    /// With [`priorities`](crate::BulkheadBuilder::priorities) on it, a
    /// call's [class](crate::CallOptions::class) orders the global stage
    /// (a call that names none is a plain call there, which never waits
    /// for a classed seat); each key's own line stays first come, first
    /// served.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// // One database pool of 20 connections, shared by reads and writes,
    /// // each limited per tenant.
    /// let pool = Bulkhead::builder().name("db").max_concurrent_calls(20).build().unwrap();
    /// let reads = KeyedBulkhead::<u64>::builder()
    ///     .name("reads")
    ///     .max_concurrent_calls(4)
    ///     .global(pool.clone())
    ///     .build()
    ///     .unwrap();
    /// let writes = KeyedBulkhead::<u64>::builder()
    ///     .name("writes")
    ///     .max_concurrent_calls(2)
    ///     .global(pool.clone())
    ///     .build()
    ///     .unwrap();
    /// let (_r, _w) = (reads.try_acquire(&7).unwrap(), writes.try_acquire(&7).unwrap());
    /// assert_eq!(pool.metrics().in_flight(), 2);
    /// ```
    pub fn global(mut self, global: Bulkhead) -> Self {
        self.global = Global::Shared(global);
        self
    }

    /// Fair shares of the global limit: while callers wait for a global
    /// seat, the keys are served in turns (deficit round robin), each key
    /// [`key_weight`](Self::key_weight) seats per turn (1 unless that is
    /// set), its own callers first come, first served. So a noisy key's
    /// waiters cannot fill the global line: a quiet key's caller is served
    /// within one round of the keys' turns, however many the noisy key
    /// has waiting. Needs [`global_limit`](Self::global_limit)
    /// ([`BuildErrorKind::FairSharesWithoutGlobalLimit`] otherwise). Off
    /// by default.
    ///
    /// While anyone waits for a global seat, a newcomer does not take a
    /// free one at once (nor does [`KeyedBulkhead::try_acquire`]): it
    /// joins its key's line, or is rejected with
    /// [`GlobalFull`](super::KeyedRejectReason::GlobalFull) if it may not
    /// wait. The global line's settings cover the whole wait, the time in
    /// its key's line included: `max_wait`'s budget,
    /// [`global_max_queue`](Self::global_max_queue) (the callers waiting
    /// in every key's line), a call's deadline
    /// ([`CallOptions::deadline`](crate::CallOptions::deadline)), and
    /// [`queue_delay`](Self::queue_delay) (each waiter's own check at the
    /// target; see the [keyed guide](crate::guide::keyed#fair-shares-of-the-global-limit) for how a cut reaches the waiters). The
    /// global bulkhead's `queued` counts them all, and each key's
    /// [`waiting_for_global`](super::KeyMetrics::waiting_for_global) its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(8)
    ///     .global_limit(16)
    ///     .fair_shares()
    ///     .build()
    ///     .unwrap();
    /// assert!(tenants.try_acquire("acme").is_ok());
    /// ```
    pub fn fair_shares(mut self) -> Self {
        self.fair_shares = true;
        self
    }

    /// Each key's weight in [`fair_shares`](Self::fair_shares) (and turns
    /// them on): the seats a key is served per turn while the global limit
    /// is contended, so that backlogged keys of weights 1 and 3 get one
    /// seat and three in every round. Called once when a key starts being
    /// tracked (again after an eviction), with no lock held; a weight of 0
    /// counts as 1. If it panics, the panic reaches the caller whose call
    /// would have tracked the key, and the key is not tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .max_concurrent_calls(8)
    ///     .global_limit(16)
    ///     .key_weight(|tenant: &String| if tenant.starts_with("paid-") { 3 } else { 1 })
    ///     .build()
    ///     .unwrap();
    /// assert!(tenants.try_acquire("paid-acme").is_ok());
    /// ```
    pub fn key_weight(mut self, weight: impl Fn(&K) -> u32 + Send + Sync + 'static) -> Self {
        self.fair_shares = true;
        self.key_weight = Some(Arc::new(weight));
        self
    }

    /// The most keys tracked at once (default 10,000). A call for a new key
    /// when this many are tracked evicts the key idle the longest (no
    /// permit held, nobody waiting); if none is idle, the call is rejected
    /// with [`TooManyKeys`](super::KeyedRejectReason::TooManyKeys).
    /// Must be at least 1 ([`BuildErrorKind::ZeroMaxKeys`] otherwise).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Evicts keys that have been idle (no permit held, nobody waiting) for
    /// at least `idle_timeout`: lazily, in a sweep at most once per
    /// `idle_timeout` when a new key arrives, and in
    /// [`KeyedBulkhead::evict_idle`]. Without it, idle keys stay until
    /// room is needed for a new key or `evict_idle` is called. Eviction
    /// needs no timer or background task.
    pub fn idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = Some(idle_timeout);
        self
    }

    /// A metric label for each key: the `metrics` exporter publishes the
    /// key's series labelled `bulkhead=<name>` and `key=<label>` (keys
    /// sharing a label share its series), and the key's bulkhead is named
    /// `"<name>[<label>]"`, which is what observers, `tracing` and errors
    /// see. At most [`max_labels`](Self::max_labels) distinct
    /// labels are ever handed out; keys whose label would be a new one past
    /// that are labelled `"other"`. A label, once handed out, stays (a
    /// metrics series outlives an evicted key), so the bulkhead never
    /// publishes more than `max_labels + 1` label values, however many keys
    /// come and go. Called once when a key starts being tracked, with no
    /// lock held.
    ///
    /// Without a `key_label`, every key's bulkhead is named `<name>`: the
    /// exporters publish the keys' sum (no `key` label), and per-key numbers are in
    /// [`KeyedBulkhead::metrics_for`] and [`KeyedBulkhead::snapshot`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder()
    ///     .name("tenants")
    ///     .max_concurrent_calls(2)
    ///     .key_label(|tenant: &String| tenant.clone())
    ///     .max_labels(1)
    ///     .build()
    ///     .unwrap();
    /// let a = tenants.try_acquire("acme").unwrap();
    /// let b = tenants.try_acquire("globex").unwrap();
    /// assert_eq!(a.bulkhead_name(), "tenants[acme]");
    /// assert_eq!(b.bulkhead_name(), "tenants[other]");
    /// ```
    pub fn key_label(mut self, label: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        self.key_label = Some(Arc::new(label));
        self
    }

    /// The most distinct labels [`key_label`](Self::key_label) may hand
    /// out (default 100); the rest are `"other"`. `0` labels every key
    /// `"other"`.
    pub fn max_labels(mut self, max_labels: usize) -> Self {
        self.max_labels = max_labels;
        self
    }

    /// Hashes the keys with `hasher` instead of the standard library's
    /// [`RandomState`] (SipHash-1-3, seeded per keyed bulkhead).
    ///
    /// The default is the one to keep when callers choose the keys (a
    /// tenant id or a host name from a request): it resists keys crafted
    /// to collide, which would make one shard's lookups linear. It is also
    /// most of what a call on a tracked key costs over a plain bulkhead's
    /// (about 12 ns of the 22 for a `u64` key: the [keyed guide](crate::guide::keyed#costs)). When the keys
    /// are not chosen by clients (a fixed set of backends, internal ids),
    /// or a seeded hasher built for hash tables is resistance enough (such
    /// as `foldhash::fast::RandomState` or `ahash::RandomState`), pass it
    /// here.
    ///
    /// Any hasher works: the registry spreads its output with a
    /// multiplication before taking the shard from the top bits, so even
    /// an identity hash of small integers uses every shard. Keys that hash
    /// alike still collide: the hasher decides how well they spread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::hash::{BuildHasherDefault, DefaultHasher};
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// // A fixed seed: the same hashes in every run (fine for keys that
    /// // clients do not choose).
    /// let shards = KeyedBulkhead::<u32>::builder()
    ///     .max_concurrent_calls(4)
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(shards.try_acquire(&7).is_ok());
    /// ```
    pub fn hasher<H: BuildHasher>(self, hasher: H) -> KeyedBulkheadBuilder<K, H> {
        KeyedBulkheadBuilder {
            base: self.base,
            limit_for: self.limit_for,
            global: self.global,
            global_max_queue: self.global_max_queue,
            fair_shares: self.fair_shares,
            key_weight: self.key_weight,
            max_keys: self.max_keys,
            idle_timeout: self.idle_timeout,
            key_label: self.key_label,
            max_labels: self.max_labels,
            hasher,
        }
    }

    /// Checks the configuration and makes the keyed bulkhead. No key's
    /// bulkhead is made until a key is first used.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] whose [`kind`](BuildError::kind) says what is wrong:
    /// neither `max_concurrent_calls` nor `limit_for`, a zero
    /// `max_concurrent_calls` or `global_limit`, `fair_shares` without
    /// `global_limit`, one above
    /// [`Semaphore::MAX_PERMITS`], an empty name, a zero `call_timeout` or
    /// `leak_threshold`, or a timed setting with no timer available.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::BuildErrorKind;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let err = KeyedBulkhead::<u32>::builder().global_limit(8).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::MissingLimit);
    /// ```
    pub fn build(self) -> Result<KeyedBulkhead<K, S>, BuildError> {
        let base = self.base;
        let default_limit = match (base.max_concurrent_calls, &self.limit_for) {
            (None, None) => return Err(BuildError::new(BuildErrorKind::MissingLimit)),
            (None, Some(_)) => 1,
            (Some(n), _) => check_limit(n)?,
        };
        if self.max_keys == 0 {
            return Err(BuildError::new(BuildErrorKind::ZeroMaxKeys));
        }
        if self.fair_shares && !matches!(self.global, Global::Limit(_)) {
            return Err(BuildError::new(
                BuildErrorKind::FairSharesWithoutGlobalLimit,
            ));
        }
        let Checked { name, clock } = base.check(None, "keyed")?;

        // Every key's bulkhead is built from this, with its name and limit;
        // the keyed bulkhead bounds the call itself (one `call_timeout`
        // over both permits).
        let mut template = base.clone();
        template.call_timeout = None;
        // Under a global limit, a key's admission is told once the global
        // stage admits the call too (or is told as a rejection if it
        // refuses it).
        template.reports_later = !matches!(self.global, Global::None);
        // Check it once now, so making a key's bulkhead later cannot fail.
        template
            .clone()
            .name(name.clone())
            .max_concurrent_calls(1)
            .exporters(false)
            .build()?;

        let (global, global_owned) = match self.global {
            Global::None => (None, false),
            Global::Shared(bulkhead) => (Some(bulkhead), false),
            Global::Limit(limit) => {
                // No `max_wait` of its own: what is left of each call's
                // budget is the wait's own, timed by the keyed bulkhead's
                // timer (as are its checkpoints under controlled delay).
                let mut builder = Bulkhead::builder()
                    .name(format!("{name}.global"))
                    .max_concurrent_calls(check_limit(limit)?)
                    .fair(base.fair);
                builder.exports = base.exports;
                if let Some(timer) = &base.timer {
                    builder = builder.timer(timer.clone());
                }
                if let Some(max_queue) = self.global_max_queue {
                    builder = builder.max_queue(max_queue);
                }
                // With fair shares, callers wait in their keys' lines
                // before they queue for its semaphore.
                builder.line_apart = self.fair_shares;
                if let Some((target, interval)) = base.queue_delay {
                    builder = builder
                        .queue_delay(target, interval)
                        .adaptive_lifo(base.adaptive_lifo);
                }
                for observer in &base.observers {
                    builder = builder.observer(observer.clone());
                }
                (Some(builder.build()?), true)
            }
        };

        Ok(KeyedBulkhead {
            inner: Arc::new(Inner::new(super::Config {
                name: name.into(),
                template,
                default_limit,
                limit_for: self.limit_for,
                key_label: self.key_label,
                max_labels: self.max_labels,
                max_wait: base.max_wait,
                call_timeout: base.call_timeout,
                clock,
                global,
                global_owned,
                fair_shares: self.fair_shares,
                key_weight: self.key_weight,
                max_keys: self.max_keys,
                idle_timeout: self.idle_timeout,
                hasher: self.hasher,
            })),
        })
    }
}

impl<K, S> fmt::Debug for KeyedBulkheadBuilder<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let global = match &self.global {
            Global::None => None,
            Global::Limit(n) => Some(format!("limit {n}")),
            Global::Shared(b) => Some(format!("shared {}", b.name())),
        };
        let b = &self.base;
        f.debug_struct("KeyedBulkheadBuilder")
            .field("name", &b.name)
            .field("max_concurrent_calls", &b.max_concurrent_calls)
            .field("limit_for", &self.limit_for.is_some())
            .field("max_wait", &b.max_wait)
            .field("max_queue", &b.max_queue)
            .field("call_timeout", &b.call_timeout)
            .field("fair", &b.fair)
            .field("queue_delay", &b.queue_delay)
            .field("adaptive_lifo", &b.adaptive_lifo)
            .field("timer", &b.timer)
            .field("observers", &b.observers.len())
            .field("exports", &b.exports)
            .field("global", &global)
            .field("global_max_queue", &self.global_max_queue)
            .field("fair_shares", &self.fair_shares)
            .field("key_weight", &self.key_weight.is_some())
            .field("max_keys", &self.max_keys)
            .field("idle_timeout", &self.idle_timeout)
            .field("key_label", &self.key_label.is_some())
            .field("max_labels", &self.max_labels)
            .field("hasher", &core::any::type_name::<S>())
            .finish()
    }
}
