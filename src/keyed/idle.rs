//! The order in which a shard's keys went idle, so that eviction finds the
//! key idle longest in O(1).
//!
//! # Implementation notes
//!
//! An [`IdleList`] is a doubly linked list threaded by index through a slab
//! of links, one per key tracked in the shard: moving a key to the back and
//! taking one off the front are O(1), with no pointers and no `unsafe`. A
//! link holds the key's hash and the time it went idle, not the entry, so
//! the list makes no reference cycle with the entries that point at it
//! (each entry holds its shard's [`IdleOrder`] to link itself when it goes
//! idle).
//!
//! The list is kept lazily, so that only one transition costs a lock:
//!
//! - **Going idle** (a key's last user leaves) puts the key at the back,
//!   stamped with the time, under the list's mutex. The stamps never
//!   decrease from front to back (a stamp read before the lock is raised to
//!   the back's if a racing caller linked a later one first).
//! - **Going idle again early**: while the registry is less than half full
//!   and has no `idle_timeout` (see [`IdleClock`]), a key that goes idle
//!   while it is still linked with a stamp no earlier than the coarse
//!   clock's keeps its place, without the mutex (see `Entry::leave`): its
//!   stamp would not change, and within one tick of the coarse clock the
//!   order is not kept any finer than that.
//! - **Going busy** (a first user arrives) does nothing here: unlinking
//!   would cost every caller of an idle key this mutex. So a linked key may
//!   be busy. Whoever reads the list (eviction, sweeps) does it holding the
//!   shard's map lock, under which no user can arrive, checks the user
//!   count of every key it meets and unlinks a busy one; that key is linked
//!   again when it next goes idle. A key is unlinked at most once per time
//!   it was linked, so this cleaning is paid for by the transitions that
//!   linked it: O(1) amortised.
//!
//! So every idle key whose last user has finished leaving is linked, at the
//! place of the moment it went idle (or, early, of the coarse clock's
//! tick), and the front of the list is the shard's key idle longest once
//! busy keys are cleaned off it. The front's stamp is published in
//! [`IdleOrder::oldest`] (`u64::MAX` when the list is empty) for the
//! evictor to compare shards without locking them.
//!
//! # Stamps
//!
//! A stamp is nanoseconds since the registry's epoch, and never later than
//! the moment the key went idle. Reading the clock costs tens of
//! nanoseconds on some virtual machines (38 ns on this project's benchmark
//! machine: more than the rest of an uncontended call), so a key going
//! idle reads it only when the stamp can matter soon ([`IdleClock`]):
//! with an `idle_timeout`, which compares stamps with the time, or once
//! the registry is at least half full, where evicting at the cap compares
//! them across shards. Below that, a key is stamped with the *coarse*
//! clock: the time the registry last read (when a new key arrived, at a
//! sweep), which orders keys across shards by the new keys between them.
//! Those keys all went idle before any key stamped since the registry
//! passed half full, so the key idle longest is still evicted first; among
//! them, the order is kept to the granularity of new keys.
//!
//! # Invariants
//!
//! - A slot is *free* (on the free list), *unlinked* (its key tracked, not
//!   in the order) or *linked*.
//! - Linked slots form one chain from `head` to `tail`, `prev`/`next`
//!   consistent, `len` of them, with non-decreasing stamps.
//! - Free slots form one chain through `next` from `free`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// No slot: the end of a chain.
const NIL: u32 = u32::MAX;

/// How stale the coarse clock may get while keys going idle read the
/// clock anyway: they publish a reading at most this often.
const COARSE_TICK_NS: u64 = 1_000_000;

/// The time the stamps are taken from, shared by a registry's shards. See
/// the [module notes](self) on stamps.
#[derive(Debug)]
pub(super) struct IdleClock {
    /// The origin of the stamps.
    epoch: Instant,
    /// Whether a key going idle reads the clock: the registry has an
    /// `idle_timeout`, or is at least half full. Written by the registry
    /// when that changes (rarely); read by every key going idle.
    precise: AtomicBool,
    /// The latest reading the registry published (nanoseconds since the
    /// epoch): at new keys, sweeps, and at most once per
    /// [`COARSE_TICK_NS`] by keys going idle. Never later than now.
    coarse: AtomicU64,
}

impl IdleClock {
    pub(super) fn new(precise: bool) -> Self {
        Self {
            epoch: Instant::now(),
            precise: AtomicBool::new(precise),
            coarse: AtomicU64::new(0),
        }
    }

    /// Reads the clock, and publishes the reading as the coarse clock's.
    pub(super) fn now_ns(&self) -> u64 {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.coarse.fetch_max(now, Ordering::Relaxed);
        now
    }

    /// The stamp of a key going idle now: the clock's reading when it can
    /// matter soon, else the coarse clock's.
    #[inline]
    pub(super) fn stamp(&self) -> u64 {
        if !self.is_precise() {
            return self.coarse();
        }
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Published now and then, not each time: a write to a line that
        // every shard reads.
        if now.saturating_sub(self.coarse()) >= COARSE_TICK_NS {
            self.coarse.fetch_max(now, Ordering::Relaxed);
        }
        now
    }

    /// The coarse clock: the latest reading published.
    #[inline]
    pub(super) fn coarse(&self) -> u64 {
        self.coarse.load(Ordering::Relaxed)
    }

    /// Whether keys going idle read the clock.
    #[inline]
    pub(super) fn is_precise(&self) -> bool {
        self.precise.load(Ordering::Relaxed)
    }

    /// Sets whether keys going idle read the clock (the registry's fill
    /// crossed half, or it has an `idle_timeout`); writes only a change.
    pub(super) fn set_precise(&self, precise: bool) {
        if self.is_precise() != precise {
            self.precise.store(precise, Ordering::Relaxed);
        }
    }
}

/// One shard's idle order, shared by the shard and its entries.
pub(super) struct IdleOrder {
    /// Locked by a key going idle, and by eviction and sweeps (which hold
    /// the shard's map lock first: the map lock, then this, never the other
    /// way round).
    list: Mutex<IdleList>,
    /// The stamp of the list's front, or `u64::MAX` when it is empty.
    /// Written only with `list` locked (when the guard is released); read
    /// without it by the evictor choosing a shard, which then checks under
    /// the lock.
    oldest: AtomicU64,
    /// Where the stamps come from; the same for every shard of one
    /// registry.
    clock: Arc<IdleClock>,
}

impl IdleOrder {
    pub(super) fn new(clock: Arc<IdleClock>) -> Self {
        Self {
            list: Mutex::new(IdleList::new()),
            oldest: AtomicU64::new(u64::MAX),
            clock,
        }
    }

    /// The registry's stamp clock.
    #[inline]
    pub(super) fn clock(&self) -> &IdleClock {
        &self.clock
    }

    /// The stamp of the front as last published: when the shard's key idle
    /// longest went idle, or earlier if the front has gone busy since;
    /// `u64::MAX` for none.
    pub(super) fn oldest(&self) -> u64 {
        self.oldest.load(Ordering::Relaxed)
    }

    /// Locks the list; the front's stamp is published when the guard goes.
    pub(super) fn lock(&self) -> Locked<'_> {
        Locked {
            list: self.list.lock().unwrap_or_else(PoisonError::into_inner),
            oldest: &self.oldest,
        }
    }
}

/// The locked list of an [`IdleOrder`].
pub(super) struct Locked<'a> {
    list: MutexGuard<'a, IdleList>,
    oldest: &'a AtomicU64,
}

impl core::ops::Deref for Locked<'_> {
    type Target = IdleList;

    fn deref(&self) -> &IdleList {
        &self.list
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut IdleList {
        &mut self.list
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Still under the lock: the guard field is dropped after this.
        self.oldest.store(self.list.oldest(), Ordering::Relaxed);
    }
}

/// A key in the order, as the list knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Idle {
    pub(super) slot: u32,
    /// The key's hash, to find its entry in the shard's map.
    pub(super) hash: u64,
    /// When it went idle (nanoseconds since the epoch).
    pub(super) stamp: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Unlinked,
    Linked,
}

#[derive(Debug)]
struct Link {
    prev: u32,
    next: u32,
    hash: u64,
    stamp: u64,
    state: State,
}

/// The keys of one shard in the order they went idle. See the
/// [module notes](self).
#[derive(Debug)]
pub(super) struct IdleList {
    links: Vec<Link>,
    head: u32,
    tail: u32,
    /// The first free slot; the rest chain through `next`.
    free: u32,
    /// Linked slots.
    len: usize,
}

impl IdleList {
    fn new() -> Self {
        Self {
            links: Vec::new(),
            head: NIL,
            tail: NIL,
            free: NIL,
            len: 0,
        }
    }

    /// A slot for a newly tracked key, unlinked.
    pub(super) fn alloc(&mut self, hash: u64) -> u32 {
        let link = Link {
            prev: NIL,
            next: NIL,
            hash,
            stamp: 0,
            state: State::Unlinked,
        };
        if self.free != NIL {
            let slot = self.free;
            let free = &mut self.links[slot as usize];
            debug_assert_eq!(free.state, State::Free, "the free list holds free slots");
            self.free = free.next;
            *free = link;
            slot
        } else {
            let slot = u32::try_from(self.links.len())
                .ok()
                .filter(|&slot| slot != NIL)
                .expect("fewer than 2^32 - 1 keys in one shard");
            self.links.push(link);
            slot
        }
    }

    /// Gives back the slot of a key no longer tracked, unlinking it first.
    pub(super) fn release(&mut self, slot: u32) {
        self.unlink(slot);
        let link = &mut self.links[slot as usize];
        debug_assert_eq!(link.state, State::Unlinked, "a slot is released once");
        link.state = State::Free;
        link.next = self.free;
        self.free = slot;
    }

    /// Puts `slot` at the back, stamped `now` (or the back's stamp, if that
    /// is later: stamps never decrease along the list). Returns the stamp.
    pub(super) fn push_back(&mut self, slot: u32, now: u64) -> u64 {
        self.unlink(slot);
        let stamp = match self.tail {
            NIL => now,
            tail => now.max(self.links[tail as usize].stamp),
        };
        let tail = self.tail;
        let link = &mut self.links[slot as usize];
        debug_assert_eq!(link.state, State::Unlinked, "only a tracked key is linked");
        link.state = State::Linked;
        link.stamp = stamp;
        link.prev = tail;
        link.next = NIL;
        match tail {
            NIL => self.head = slot,
            tail => self.links[tail as usize].next = slot,
        }
        self.tail = slot;
        self.len += 1;
        stamp
    }

    /// Takes `slot` out of the order, if it is in it.
    pub(super) fn unlink(&mut self, slot: u32) {
        let link = &mut self.links[slot as usize];
        if link.state != State::Linked {
            return;
        }
        link.state = State::Unlinked;
        let (prev, next) = (link.prev, link.next);
        match prev {
            NIL => self.head = next,
            prev => self.links[prev as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            next => self.links[next as usize].prev = prev,
        }
        self.len -= 1;
    }

    /// The key idle longest (or linked longest ago, if it has gone busy).
    pub(super) fn front(&self) -> Option<Idle> {
        self.idle(self.head)
    }

    /// The key after `slot` in the order; `slot` must be linked.
    pub(super) fn next(&self, slot: u32) -> Option<Idle> {
        let link = &self.links[slot as usize];
        debug_assert_eq!(link.state, State::Linked, "next of a linked slot only");
        self.idle(link.next)
    }

    fn idle(&self, slot: u32) -> Option<Idle> {
        (slot != NIL).then(|| {
            let link = &self.links[slot as usize];
            Idle {
                slot,
                hash: link.hash,
                stamp: link.stamp,
            }
        })
    }

    /// The front's stamp, or `u64::MAX` if nothing is linked.
    fn oldest(&self) -> u64 {
        self.front().map_or(u64::MAX, |front| front.stamp)
    }

    /// Checks every invariant in the [module notes](self); panics with the
    /// one broken.
    #[cfg(test)]
    pub(super) fn assert_valid(&self) {
        let mut seen = 0;
        let (mut prev, mut at, mut stamp) = (NIL, self.head, 0);
        while at != NIL {
            let link = &self.links[at as usize];
            assert_eq!(link.state, State::Linked, "slot {at} is in the chain");
            assert_eq!(link.prev, prev, "slot {at} points back at its predecessor");
            assert!(link.stamp >= stamp, "stamps never decrease along the chain");
            assert_ne!(link.next, at, "a link must not point at itself");
            (prev, at, stamp) = (at, link.next, link.stamp);
            seen += 1;
            assert!(seen <= self.links.len(), "the chain has no cycle");
        }
        assert_eq!(self.tail, prev, "the tail ends the chain");
        assert_eq!(seen, self.len, "len counts the linked slots");
        let linked = self
            .links
            .iter()
            .filter(|l| l.state == State::Linked)
            .count();
        assert_eq!(linked, self.len, "every linked slot is in the chain");
        let mut free = 0;
        let mut at = self.free;
        while at != NIL {
            let link = &self.links[at as usize];
            assert_eq!(link.state, State::Free, "slot {at} is on the free list");
            at = link.next;
            free += 1;
            assert!(free <= self.links.len(), "the free list has no cycle");
        }
        let freed = self.links.iter().filter(|l| l.state == State::Free).count();
        assert_eq!(free, freed, "every free slot is on the free list");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(list: &IdleList) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = list.front();
        while let Some(idle) = at {
            out.push(idle.slot);
            at = list.next(idle.slot);
        }
        out
    }

    #[test]
    fn pushing_to_the_back_keeps_the_order_they_went_idle_in() {
        let mut list = IdleList::new();
        let slots: Vec<u32> = (0..4).map(|i| list.alloc(i)).collect();
        assert_eq!(list.front(), None);
        for (t, &slot) in slots.iter().enumerate() {
            list.push_back(slot, t as u64 * 10);
            list.assert_valid();
        }
        assert_eq!(order(&list), [0, 1, 2, 3]);
        list.push_back(1, 100); // used again
        list.push_back(0, 50); // stamped before the back: raised to it
        list.assert_valid();
        assert_eq!(order(&list), [2, 3, 1, 0]);
        assert_eq!(list.front().unwrap().stamp, 20);
        assert_eq!(list.links[0].stamp, 100);

        list.unlink(3);
        list.unlink(3); // not linked: nothing happens
        list.assert_valid();
        assert_eq!(order(&list), [2, 1, 0]);
        list.release(2); // the front
        list.release(0); // the back
        list.release(3); // not linked
        list.assert_valid();
        assert_eq!(order(&list), [1]);
        assert_eq!((list.head, list.tail, list.len), (1, 1, 1));

        // Freed slots are used again, the last freed first.
        assert_eq!(list.alloc(7), 3);
        assert_eq!(list.alloc(8), 0);
        assert_eq!(list.alloc(9), 2);
        assert_eq!(list.alloc(10), 4);
        list.assert_valid();
        list.push_back(3, 200);
        assert_eq!(order(&list), [1, 3]);
        assert_eq!(list.front().unwrap().hash, 1);
        assert_eq!(list.next(1).unwrap().hash, 7);
    }

    #[test]
    fn the_front_stamp_is_published_when_the_lock_is_released() {
        let order = IdleOrder::new(Arc::new(IdleClock::new(false)));
        assert_eq!(order.oldest(), u64::MAX);
        let (a, b) = {
            let mut list = order.lock();
            (list.alloc(1), list.alloc(2))
        };
        assert_eq!(order.oldest(), u64::MAX, "nothing linked");
        order.lock().push_back(a, 5);
        order.lock().push_back(b, 9);
        assert_eq!(order.oldest(), 5);
        order.lock().unlink(a);
        assert_eq!(order.oldest(), 9);
        order.lock().release(b);
        assert_eq!(order.oldest(), u64::MAX);
        order.lock().assert_valid();
    }

    #[test]
    fn a_churned_list_stays_valid() {
        let mut list = IdleList::new();
        let mut tracked: Vec<u32> = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for t in 0..2_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            match rng % 5 {
                0 | 1 => tracked.push(list.alloc(t)),
                2 if !tracked.is_empty() => {
                    let slot = tracked[(rng >> 8) as usize % tracked.len()];
                    list.push_back(slot, t);
                }
                3 if !tracked.is_empty() => {
                    let slot = tracked[(rng >> 8) as usize % tracked.len()];
                    list.unlink(slot);
                }
                4 if !tracked.is_empty() => {
                    let slot = tracked.swap_remove((rng >> 8) as usize % tracked.len());
                    list.release(slot);
                }
                _ => {}
            }
            list.assert_valid();
        }
    }
}
