//! One tracked key: its bulkhead, its users, and the counts its bulkhead
//! cannot see.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::idle::IdleOrder;
use super::metrics::KeyMetrics;
use crate::bulkhead::Bulkhead;

/// One tracked key. Shared by its shard's map and by its users; the map
/// lets go of it when it is evicted.
pub(super) struct Entry {
    pub(super) bulkhead: Bulkhead,
    pub(super) label: Option<Arc<str>>,
    /// Callers holding a permit of this key, or waiting for one: they hold
    /// a [`User`](super::permit::User). Only grows with the shard's map
    /// lock held (read or write); eviction, with it held for writing, takes
    /// only entries where it is zero. So an evicted entry has no permit out
    /// and nobody waiting, and never will again.
    users: AtomicUsize,
    /// The entry's place in its shard's idle order; fixed for its life.
    pub(super) slot: u32,
    /// Its shard's idle order, to link the key at the back when it goes
    /// idle.
    idle: Arc<IdleOrder>,
    /// Set with `idle` locked when the entry is evicted, after which its
    /// `slot` may belong to another key; read with `idle` locked.
    evicted: AtomicBool,
    pub(super) admitted: AtomicU64,
    pub(super) rejected_global: AtomicU64,
    pub(super) call_timeouts: AtomicU64,
    pub(super) waiting_global: AtomicUsize,
}

impl Entry {
    /// A new entry with one user: the caller inserting it.
    pub(super) fn new(
        bulkhead: Bulkhead,
        label: Option<Arc<str>>,
        slot: u32,
        idle: Arc<IdleOrder>,
    ) -> Self {
        Self {
            bulkhead,
            label,
            users: AtomicUsize::new(1),
            slot,
            idle,
            evicted: AtomicBool::new(false),
            admitted: AtomicU64::new(0),
            rejected_global: AtomicU64::new(0),
            call_timeouts: AtomicU64::new(0),
            waiting_global: AtomicUsize::new(0),
        }
    }

    /// One more user. With the shard's map lock held and the entry in the
    /// map. A key that goes busy stays where it is in the idle order (see
    /// the [idle order's notes](super::idle)).
    #[inline]
    pub(super) fn enter(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// One user fewer. After its permits (if any) are released: once the
    /// count is zero the entry may be evicted and the key made afresh.
    #[inline]
    pub(super) fn leave(&self) {
        // Release: the permits given back before an evictor (Acquire, with
        // the map lock held) sees zero.
        if self.users.fetch_sub(1, Ordering::Release) == 1 {
            self.went_idle();
        }
    }

    /// The last user left: the key goes to the back of its shard's idle
    /// order, stamped now.
    fn went_idle(&self) {
        let now = self.idle.now_ns();
        let mut order = self.idle.lock();
        // Evicted already (by someone who saw the count at zero before we
        // got here): the slot is not ours any more. Busy again: the user
        // who made it busy links it when it leaves.
        if self.evicted.load(Ordering::Relaxed) || self.users.load(Ordering::Relaxed) != 0 {
            return;
        }
        order.push_back(self.slot, now);
    }

    /// Whether nobody uses the entry. With the shard's map lock held for
    /// writing, so that nobody can start to.
    pub(super) fn is_idle(&self) -> bool {
        // Acquire: pairs with the Release in `leave`, so every permit of
        // an entry seen idle has been given back.
        self.users.load(Ordering::Acquire) == 0
    }

    /// Marks the entry evicted. With the shard's map lock held for writing
    /// and `idle` locked, after `is_idle` said yes.
    pub(super) fn mark_evicted(&self) {
        self.evicted.store(true, Ordering::Relaxed);
    }

    pub(super) fn metrics<K>(&self, key: K) -> KeyMetrics<K> {
        KeyMetrics {
            key,
            label: self.label.clone(),
            bulkhead: self.bulkhead.metrics(),
            admitted: self.admitted.load(Ordering::Relaxed),
            rejected_global: self.rejected_global.load(Ordering::Relaxed),
            call_timeouts: self.call_timeouts.load(Ordering::Relaxed),
            waiting_global: self.waiting_global.load(Ordering::Relaxed),
        }
    }
}
