//! Snapshots of one key's bulkhead and of the keyed bulkhead as a whole.

use std::sync::Arc;

use crate::bulkhead::Metrics;
use crate::bulkhead::RejectReason;
use crate::bulkhead::reason::REASONS;

/// A snapshot of one tracked key, from
/// [`KeyedBulkhead::metrics_for`](super::KeyedBulkhead::metrics_for) or
/// [`KeyedBulkhead::snapshot`](super::KeyedBulkhead::snapshot).
///
/// A call goes through two stages: the key's own bulkhead, then the global
/// limit (if any). [`bulkhead`](Self::bulkhead) is the key's bulkhead's own
/// snapshot, which sees the first stage only: a call it admitted may still
/// be waiting for a global permit, or be turned away by the global limit.
/// The other methods combine both stages. Totals count since the key was
/// last created: an evicted key starts again from zero.
///
/// # Examples
///
/// ```
/// use watertight::keyed::KeyedBulkhead;
///
/// let tenants = KeyedBulkhead::<String>::builder()
///     .max_concurrent_calls(2)
///     .global_limit(1)
///     .max_wait(std::time::Duration::ZERO)
///     .build()
///     .unwrap();
/// let held = tenants.try_acquire("acme").unwrap();
/// assert!(tenants.try_acquire("globex").is_err()); // the global limit
///
/// let acme = tenants.metrics_for("acme").unwrap();
/// assert_eq!((acme.key().as_str(), acme.in_flight(), acme.admitted()), ("acme", 1, 1));
/// let globex = tenants.metrics_for("globex").unwrap();
/// assert_eq!((globex.in_flight(), globex.rejected_by_global()), (0, 1));
/// drop(held);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMetrics<K> {
    pub(crate) key: K,
    pub(crate) label: Option<Arc<str>>,
    pub(crate) bulkhead: Metrics,
    pub(crate) admitted: u64,
    /// Rejections by the global stage, by [`RejectReason::index`].
    pub(crate) rejected_global: [u64; REASONS],
    pub(crate) call_timeouts: u64,
    pub(crate) waiting_global: usize,
}

impl<K> KeyMetrics<K> {
    /// The key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The key's metric label, when the keyed bulkhead has a
    /// [`key_label`](super::KeyedBulkheadBuilder::key_label): the label
    /// the function gave, or `"other"` once `max_labels` distinct labels
    /// are in use.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The key's bulkhead's own snapshot: its name, limit, and what the
    /// first stage admitted and rejected.
    pub fn bulkhead(&self) -> &Metrics {
        &self.bulkhead
    }

    /// The key's limit now.
    pub fn max_concurrent_calls(&self) -> usize {
        self.bulkhead.max_concurrent_calls()
    }

    /// Calls of this key holding both their permits now.
    pub fn in_flight(&self) -> usize {
        self.bulkhead
            .in_flight()
            .saturating_sub(self.waiting_global)
    }

    /// Callers of this key waiting now: for one of the key's permits, or
    /// with one and waiting for a global permit.
    pub fn queued(&self) -> usize {
        self.bulkhead.queued() + self.waiting_global
    }

    /// Callers of this key that hold the key's permit and wait for a
    /// global one now.
    pub fn waiting_for_global(&self) -> usize {
        self.waiting_global
    }

    /// Calls admitted by both limits.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }

    /// Calls turned away by the key's own limit (full, timed out, closed,
    /// or for their deadline or controlled delay).
    pub fn rejected_by_key(&self) -> u64 {
        self.bulkhead.rejected()
    }

    /// Calls the key had room for but the global limit turned away (full,
    /// timed out, closed, or for their deadline or controlled delay).
    pub fn rejected_by_global(&self) -> u64 {
        self.rejected_global.iter().sum()
    }

    /// Calls with a [deadline](crate::CallOptions::deadline) turned away
    /// because they could not make their deadline, at either stage
    /// ([`KeyWontMakeDeadline`](super::KeyedRejectReason::KeyWontMakeDeadline)
    /// and [`GlobalWontMakeDeadline`](super::KeyedRejectReason::GlobalWontMakeDeadline)).
    pub fn rejected_deadline(&self) -> u64 {
        self.rejected_for(RejectReason::WontMakeDeadline)
    }

    /// Calls of this key cut by controlled delay
    /// ([`queue_delay`](super::KeyedBulkheadBuilder::queue_delay)), on
    /// the key's own line or on the global one
    /// ([`KeyQueueDelay`](super::KeyedRejectReason::KeyQueueDelay) and
    /// [`GlobalQueueDelay`](super::KeyedRejectReason::GlobalQueueDelay)).
    pub fn rejected_queue_delay(&self) -> u64 {
        self.rejected_for(RejectReason::QueueDelay)
    }

    /// All rejections of this key.
    pub fn rejected(&self) -> u64 {
        self.rejected_by_key() + self.rejected_by_global()
    }

    /// Calls of this key turned away for `reason`, at either stage: by the
    /// key's own bulkhead, or by the global one (a wait for a global
    /// permit that the keyed bulkhead's `max_wait` budget ended counts as
    /// [`Timeout`](RejectReason::Timeout)).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::RejectReason;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
    /// let _held = tenants.try_acquire("acme").unwrap();
    /// assert!(tenants.try_acquire("acme").is_err());
    /// let m = tenants.metrics_for("acme").unwrap();
    /// assert_eq!(m.rejected_for(RejectReason::Full), 1);
    /// ```
    pub fn rejected_for(&self, reason: RejectReason) -> u64 {
        self.bulkhead.rejected_for(reason) + self.rejected_global[reason.index()]
    }

    /// Admitted calls of [`KeyedBulkhead::call`](super::KeyedBulkhead::call)
    /// cut off by `call_timeout`.
    pub fn call_timeouts(&self) -> u64 {
        self.call_timeouts
    }
}

/// A snapshot of a keyed bulkhead as a whole, from
/// [`KeyedBulkhead::stats`](super::KeyedBulkhead::stats).
///
/// # Examples
///
/// ```
/// use watertight::keyed::KeyedBulkhead;
///
/// let hosts = KeyedBulkhead::<u32>::builder()
///     .name("hosts")
///     .max_concurrent_calls(1)
///     .max_keys(1)
///     .build()
///     .unwrap();
/// let held = hosts.try_acquire(&1).unwrap();
/// assert!(hosts.try_acquire(&2).is_err()); // key 1 is busy: no room for key 2
/// drop(held);
/// drop(hosts.try_acquire(&2).unwrap()); // key 1 is idle now: evicted for key 2
///
/// let s = hosts.stats();
/// assert_eq!((s.keys_tracked(), s.max_keys()), (1, 1));
/// assert_eq!((s.keys_created(), s.keys_evicted(), s.rejected_too_many_keys()), (2, 1, 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedStats {
    pub(crate) name: Arc<str>,
    pub(crate) keys_tracked: usize,
    pub(crate) max_keys: usize,
    pub(crate) labels_in_use: usize,
    pub(crate) max_labels: usize,
    pub(crate) closed: bool,
    pub(crate) keys_created: u64,
    pub(crate) keys_evicted: u64,
    pub(crate) rejected_too_many_keys: u64,
    pub(crate) rejected_closed: u64,
    pub(crate) rejected_global: u64,
}

impl KeyedStats {
    /// The keyed bulkhead's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Keys tracked now (each with its own bulkhead).
    pub fn keys_tracked(&self) -> usize {
        self.keys_tracked
    }

    /// The most keys tracked at once.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Distinct metric labels handed out so far (not counting `"other"`);
    /// never more than [`max_labels`](Self::max_labels). Zero without a
    /// [`key_label`](super::KeyedBulkheadBuilder::key_label).
    pub fn labels_in_use(&self) -> usize {
        self.labels_in_use
    }

    /// The most distinct metric labels before the rest are `"other"`.
    pub fn max_labels(&self) -> usize {
        self.max_labels
    }

    /// Whether the keyed bulkhead was closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Keys that started being tracked (a key evicted and seen again
    /// counts twice).
    pub fn keys_created(&self) -> u64 {
        self.keys_created
    }

    /// Idle keys evicted, to make room or because they were idle for
    /// `idle_timeout`, or by [`evict_idle`](super::KeyedBulkhead::evict_idle).
    pub fn keys_evicted(&self) -> u64 {
        self.keys_evicted
    }

    /// Calls for a new key turned away because `max_keys` keys were tracked
    /// and none was idle.
    pub fn rejected_too_many_keys(&self) -> u64 {
        self.rejected_too_many_keys
    }

    /// Calls turned away because the keyed bulkhead was closed before they
    /// reached a key's bulkhead (those rejected by a closed key's bulkhead
    /// count in its metrics).
    pub fn rejected_closed(&self) -> u64 {
        self.rejected_closed
    }

    /// Calls, over all keys ever tracked, that their key had room for but
    /// the global limit turned away, including those whose `max_wait` ran
    /// out while waiting for it (which the global bulkhead's own metrics do
    /// not see).
    pub fn rejected_by_global(&self) -> u64 {
        self.rejected_global
    }
}
