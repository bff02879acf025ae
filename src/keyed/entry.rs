//! One tracked key: its bulkhead, its users, and the counts its bulkhead
//! cannot see.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::idle::{IdleList, IdleOrder};
use super::metrics::KeyMetrics;
use crate::bulkhead::Bulkhead;
use crate::bulkhead::reason::REASONS;

/// [`Entry::link`] of an entry not in its shard's idle order.
const UNLINKED: u64 = u64::MAX;

/// One tracked key. Shared by its shard's map and by its users; the map
/// lets go of it when it is evicted.
pub(super) struct Entry {
    pub(super) bulkhead: Bulkhead,
    pub(super) label: Option<Arc<str>>,
    /// The key's weight in the rotation of fair shares (1 without them).
    pub(super) weight: u32,
    /// Callers holding a permit of this key, or waiting for one: they hold
    /// a [`User`](super::permit::User). Only grows with the shard's map
    /// lock held (read or write); eviction, with it held for writing, takes
    /// only entries where it is zero. So an evicted entry has no permit out
    /// and nobody waiting, and never will again.
    users: AtomicUsize,
    /// The stamp the entry is linked with in its shard's idle order, or
    /// [`UNLINKED`]: written with the order locked, read without the lock
    /// by its last user leaving, who may then keep its place (see
    /// [`leave`](Self::leave)).
    link: AtomicU64,
    /// The key's hash ([`Registry::hash`](super::registry::Registry::hash)),
    /// which the shard's table rehashes by as it grows.
    pub(super) hash: u64,
    /// The entry's place in its shard's idle order; fixed for its life.
    pub(super) slot: u32,
    /// Its shard's idle order, to link the key at the back when it goes
    /// idle.
    idle: Arc<IdleOrder>,
    /// Set with `idle` locked when the entry is evicted, after which its
    /// `slot` may belong to another key; read with `idle` locked.
    evicted: AtomicBool,
    /// Calls admitted by both stages, counted only with a global stage:
    /// without one, every permit of the key's bulkhead is an admission,
    /// which its own `permitted` counts (one atomic increment less per
    /// call).
    pub(super) admitted: AtomicU64,
    /// Rejections by the global stage, by the reason the global bulkhead
    /// (or the keyed bulkhead's own budget, as a timeout) gave; the key's
    /// own stage counts its rejections in its bulkhead's metrics.
    pub(super) rejected_global: [AtomicU64; REASONS],
    pub(super) call_timeouts: AtomicU64,
    pub(super) waiting_global: AtomicUsize,
}

impl Entry {
    /// A new entry with one user: the caller inserting it.
    pub(super) fn new(
        bulkhead: Bulkhead,
        label: Option<Arc<str>>,
        weight: u32,
        hash: u64,
        slot: u32,
        idle: Arc<IdleOrder>,
    ) -> Self {
        Self {
            bulkhead,
            label,
            weight,
            hash,
            users: AtomicUsize::new(1),
            link: AtomicU64::new(UNLINKED),
            slot,
            idle,
            evicted: AtomicBool::new(false),
            admitted: AtomicU64::new(0),
            rejected_global: Default::default(),
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
    ///
    /// The last user leaving moves the key to the back of the idle order,
    /// unless the key may keep its place: it is still linked, with a stamp
    /// no earlier than the coarse clock, and stamps are coarse (see the
    /// [idle order's notes](super::idle)). That is decided without the
    /// order's lock, against a cleaner that unlinks the key because it saw
    /// it busy: the decrement here and the cleaner's unlinking are
    /// `SeqCst`, each followed by a `SeqCst` read of the other's, so at
    /// least one of the two sees the other, and either this links the key
    /// or the cleaner, seeing it idle, links it again
    /// ([`unlink_busy`](Self::unlink_busy)).
    #[inline]
    pub(super) fn leave(&self) {
        // Release (within SeqCst): the permits given back before an evictor
        // (Acquire, with the map lock held) sees zero.
        if self.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            let clock = self.idle.clock();
            if !clock.is_precise() {
                let link = self.link.load(Ordering::SeqCst);
                if link != UNLINKED && link >= clock.coarse() {
                    return;
                }
            }
            self.went_idle();
        }
    }

    /// The last user left: the key goes to the back of its shard's idle
    /// order, stamped now.
    #[cold]
    fn went_idle(&self) {
        let stamp = self.idle.clock().stamp();
        let mut order = self.idle.lock();
        // Evicted already (by someone who saw the count at zero before we
        // got here): the slot is not ours any more. Busy again: the user
        // who made it busy links it when it leaves.
        if self.evicted.load(Ordering::Relaxed) || self.users.load(Ordering::Relaxed) != 0 {
            return;
        }
        self.link_back(&mut order, stamp);
    }

    /// Links the key at the back of `order`, which is its shard's, locked.
    fn link_back(&self, order: &mut IdleList, stamp: u64) {
        let stamp = order.push_back(self.slot, stamp);
        self.link.store(stamp, Ordering::Relaxed);
    }

    /// A cleaner (eviction, a sweep) found the key linked but busy: takes
    /// it out of the order; its last user links it again on leaving. With
    /// the shard's map lock held for writing (no user can arrive) and
    /// `order`, the shard's, locked.
    pub(super) fn unlink_busy(&self, order: &mut IdleList) {
        order.unlink(self.slot);
        self.link.store(UNLINKED, Ordering::SeqCst);
        // A last user who left just now, having seen the link before it
        // was cut, kept its place and did not link it: it is idle, and
        // goes to the back here (see `leave`).
        if self.users.load(Ordering::SeqCst) == 0 {
            self.link_back(order, self.idle.clock().stamp());
        }
    }

    /// Whether nobody uses the entry. With the shard's map lock held for
    /// writing, so that nobody can start to.
    pub(super) fn is_idle(&self) -> bool {
        // Acquire: pairs with the Release in `leave`, so every permit of
        // an entry seen idle has been given back.
        self.users.load(Ordering::Acquire) == 0
    }

    /// Marks the entry evicted (its slot is released). With the shard's
    /// map lock held for writing and `idle` locked, after `is_idle` said
    /// yes.
    pub(super) fn mark_evicted(&self) {
        self.evicted.store(true, Ordering::Relaxed);
        self.link.store(UNLINKED, Ordering::Relaxed);
    }

    /// A snapshot of the key; `global` says whether the keyed bulkhead has
    /// a global stage (see `admitted`).
    pub(super) fn metrics<K>(&self, key: K, global: bool) -> KeyMetrics<K> {
        let bulkhead = self.bulkhead.metrics();
        KeyMetrics {
            key,
            label: self.label.clone(),
            admitted: match global {
                true => self.admitted.load(Ordering::Relaxed),
                false => bulkhead.permitted(),
            },
            bulkhead,
            rejected_global: self
                .rejected_global
                .each_ref()
                .map(|c| c.load(Ordering::Relaxed)),
            call_timeouts: self.call_timeouts.load(Ordering::Relaxed),
            waiting_global: self.waiting_global.load(Ordering::Relaxed),
        }
    }
}
