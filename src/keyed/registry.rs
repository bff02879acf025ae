//! The tracked keys: a sharded map from each key to its [`Entry`], the cap
//! on how many there are, and eviction.
//!
//! # Implementation notes
//!
//! The keys are spread over [`SHARDS`] shards by their hash. Each shard has
//! a map (`RwLock`: the keys and the limit overrides, in `hashbrown`
//! tables so the one hash computed picks the shard and finds the key) and
//! an [idle order](super::idle) (a `Mutex`). No lock covers the whole
//! registry:
//!
//! | path | locks |
//! |---|---|
//! | a call for a tracked key: find it, count a user | its shard's map, read |
//! | a user leaves | none; the last one: its shard's idle order, unless the key keeps its place (see [`idle`](super::idle)) |
//! | a new key | a victim's shard (map, write; then its order), then its own shard (map, write; then its order, for a slot) |
//! | `evict_idle`, the `idle_timeout` sweep | each shard's map (write) and order in turn |
//! | `set_limit_for`, `clear_limit_for` | the key's shard's map, write |
//! | `keys`, `snapshot`, `close`, ... | each shard's map in turn, read |
//!
//! Locks are taken in one order, a shard's map before its idle order, and
//! never two shards' at once, so they cannot deadlock. None is held across
//! an await or while user code runs: only `K`'s `Eq`, `Clone` and `Drop`.
//! `K`'s `Hash` and the hasher run before a shard is locked, and the
//! tables rehash as they grow by the hash each entry keeps, so a hasher
//! that panics cannot leave a table half rehashed. Evicted entries are
//! dropped after every lock is released.
//!
//! **Why eviction cannot take a key in use.** A caller becomes a user of
//! an entry with its shard's map lock held (read is enough: the count is
//! atomic). Eviction holds that lock for writing, so while it looks no user
//! can arrive, and it takes only an entry whose count it reads as zero
//! (`Acquire`, pairing with the `Release` of the last user's decrement,
//! made after the user's permits were returned). Once out of the map, no
//! caller can find the entry; a new one for the key is a new bulkhead.
//!
//! **The cap.** `len` counts the keys in the maps plus the places taken by
//! inserts under way, and never exceeds `max_keys`: an insert takes a place
//! if there is one (a compare-and-swap), or evicts a key and takes its
//! place, before it locks its own shard. The key idle longest is the
//! earliest front among the shards' idle orders: the evictor reads each
//! shard's published front stamp (no lock), locks the shard with the
//! earliest, cleans busy keys off its front, and evicts the front if it is
//! still no later than every other shard's; otherwise it tries again with
//! the new earliest. Each retry either cleans a busy key off a front (paid
//! for by the transition that linked it) or moves to a shard whose front
//! is earlier, so a new key at the cap costs O(`SHARDS`) plus O(1)
//! amortised, whatever `max_keys` is.
//!
//! **Closing.** `close` sets the keyed bulkhead's closed flag, then takes
//! each shard's map lock to collect its entries; an insert checks the flag
//! with its shard's map locked for writing. So an insert either sees the
//! flag or finishes before `close` looks at its shard, and every entry
//! `close` misses was refused.
//!
//! **Overrides** live in the shard of their key, so `set_limit_for` and an
//! insert of the same key are serialised by one lock: either the insert
//! reads the override, or `set_limit_for` finds the entry.

use core::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use super::BorrowedKey;
use super::entry::Entry;
use super::idle::{Idle, IdleClock, IdleList, IdleOrder};
use super::permit::User;
use crate::bulkhead::Bulkhead;

/// How many shards the keys are spread over: enough that callers on
/// different cores rarely meet on one lock, few enough that the evictor
/// reads every shard's front cheaply.
pub(super) const SHARDS: usize = 16;

/// A shard is picked by the hash's bits from here up (48 to 51 for 16
/// shards): a shard's table picks buckets by the low bits (it has fewer
/// than 2^48) and keeps the top 7 as tags, so the bits that every key in a
/// shard shares are bits that its table does not use.
const SHARD_SHIFT: u32 = 48;

/// An odd constant with its bits spread (2^64 over the golden ratio):
/// see [`Registry::hash`].
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// Why a new key was not tracked.
pub(super) enum Refused {
    Closed,
    TooManyKeys,
}

/// The tracked keys. See the [module notes](self).
pub(super) struct Registry<K, S> {
    hasher: S,
    shards: Box<[Shard<K>]>,
    max_keys: usize,
    /// Keys in the maps plus places taken by inserts under way; at most
    /// `max_keys`.
    len: AtomicUsize,
    idle_timeout_ns: Option<u64>,
    /// The stamps' clock, shared with every shard's idle order.
    clock: Arc<IdleClock>,
    /// When idle keys were last swept out (nanoseconds since the epoch).
    last_sweep_ns: AtomicU64,
    keys_created: AtomicU64,
    keys_evicted: AtomicU64,
}

/// One shard, on its own cache lines.
#[repr(align(128))]
struct Shard<K> {
    map: RwLock<Map<K>>,
    /// Shared with the shard's entries, which link themselves into it when
    /// they go idle.
    idle: Arc<IdleOrder>,
}

struct Map<K> {
    keys: HashTable<(K, Arc<Entry>)>,
    /// Limits from `set_limit_for`, which outlive an eviction. As many as
    /// the application set, not as many as keys were seen.
    /// Each with its key's hash, for the table's rehashing.
    overrides: HashTable<(K, usize, u64)>,
}

impl<K> Map<K> {
    /// The entry whose idle link is `idle`: it is in the map, since only
    /// tracked keys have a slot.
    fn entry_of(&self, idle: Idle) -> &Arc<Entry> {
        &self
            .keys
            .find(idle.hash, |(_, entry)| entry.slot == idle.slot)
            .expect("a key in the idle order is tracked")
            .1
    }

    /// Takes the (idle) entry at `idle` out of the map and the order.
    fn evict(&mut self, order: &mut IdleList, idle: Idle) -> Arc<Entry> {
        let Ok(found) = self
            .keys
            .find_entry(idle.hash, |(_, entry)| entry.slot == idle.slot)
        else {
            unreachable!("a key in the idle order is tracked");
        };
        let ((_key, entry), _) = found.remove();
        debug_assert!(entry.is_idle(), "only an idle key is evicted");
        entry.mark_evicted();
        order.release(idle.slot);
        entry
    }
}

impl<K, S> Registry<K, S> {
    pub(super) fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub(super) fn keys_created(&self) -> u64 {
        self.keys_created.load(Ordering::Relaxed)
    }

    pub(super) fn keys_evicted(&self) -> u64 {
        self.keys_evicted.load(Ordering::Relaxed)
    }

    /// How many keys are tracked now, counting those being inserted: never
    /// more than `max_keys`. (Adding up the shards' maps, one at a time,
    /// could count a key evicted from one shard and its replacement in
    /// another.)
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

impl<K, S> Registry<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    pub(super) fn new(max_keys: usize, idle_timeout_ns: Option<u64>, hasher: S) -> Self {
        let clock = Arc::new(IdleClock::new(precise(idle_timeout_ns, 0, max_keys)));
        Self {
            hasher,
            shards: (0..SHARDS)
                .map(|_| Shard {
                    map: RwLock::new(Map {
                        keys: HashTable::new(),
                        overrides: HashTable::new(),
                    }),
                    idle: Arc::new(IdleOrder::new(clock.clone())),
                })
                .collect(),
            max_keys,
            len: AtomicUsize::new(0),
            idle_timeout_ns,
            clock,
            last_sweep_ns: AtomicU64::new(0),
            keys_created: AtomicU64::new(0),
            keys_evicted: AtomicU64::new(0),
        }
    }

    /// The hash that picks `key`'s shard and finds it there: the hasher's,
    /// times an odd constant. That is a bijection (no new collisions) that
    /// carries the low bits up to the shard's bits and the tables' tags, so
    /// a hasher whose top bits are weak (an identity hash of small
    /// integers) still spreads keys over every shard. One multiplication.
    #[inline]
    pub(super) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key).wrapping_mul(SPREAD)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[(hash >> SHARD_SHIFT) as usize % SHARDS]
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// `len` changed: keys going idle read the clock from half full on
    /// (see the [idle order's notes](super::idle) on stamps).
    fn note_len(&self) {
        let len = self.len.load(Ordering::Relaxed);
        self.clock
            .set_precise(precise(self.idle_timeout_ns, len, self.max_keys));
    }

    /// Counts the caller as a user of `key`, if it is tracked.
    #[inline]
    pub(super) fn enter<Q: BorrowedKey<K> + ?Sized>(&self, hash: u64, key: &Q) -> Option<User> {
        let map = read(self.shard(hash));
        let (_, entry) = map.keys.find(hash, |(k, _)| Q::of(k) == key)?;
        Some(User::enter(entry))
    }

    /// Tracks `key` with `bulkhead`, built for it with no lock held from
    /// its `limit` before overrides, and counts the caller as its user; or,
    /// if a racing caller tracked it first, counts the caller as a user of
    /// that entry. Makes room first if `max_keys` keys are tracked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &self,
        hash: u64,
        key: K,
        bulkhead: Bulkhead,
        label: Option<Arc<str>>,
        weight: u32,
        limit: usize,
        closed: &AtomicBool,
    ) -> Result<User, Refused> {
        // Declared first, so dropped last: evicted keys' bulkheads (and
        // ours, a parameter, if unused) are dropped after every lock below
        // is released, whichever way this returns.
        let mut evicted: Vec<Arc<Entry>> = Vec::new();
        let evicted = &mut evicted;
        if closed.load(Ordering::SeqCst) {
            return Err(Refused::Closed);
        }
        self.sweep_if_due(evicted);
        if !self.take_place(evicted) {
            return Err(Refused::TooManyKeys);
        }
        // Given back unless the key is inserted in it, also if `K`'s `Eq`
        // (user code, run below with the shard locked) panics.
        let mut place = Place {
            len: &self.len,
            note: || self.note_len(),
            kept: false,
        };
        self.note_len();
        if !self.clock.is_precise() {
            // The coarse clock ticks with new keys.
            self.now_ns();
        }
        let shard = self.shard(hash);
        let mut map = write(shard);
        if closed.load(Ordering::SeqCst) {
            // The place is given back once the shard is unlocked.
            return Err(Refused::Closed);
        }
        if let Some((_, entry)) = map.keys.find(hash, |(k, _)| *k == key) {
            // A racing caller tracked it first; the place is not needed.
            return Ok(User::enter(entry));
        }
        // An override recorded before this point is applied here; one
        // recorded after finds the entry in the map.
        if let Some(&(_, limit_now, _)) = map.overrides.find(hash, |(k, ..)| *k == key) {
            if limit_now != limit {
                // Not shared yet: nobody waits on it.
                bulkhead.set_max_concurrent_calls(limit_now);
            }
        }
        let slot = shard.idle.lock().alloc(hash);
        let entry = Arc::new(Entry::new(
            bulkhead,
            label,
            weight,
            hash,
            slot,
            shard.idle.clone(),
        ));
        // Rehashing reads the hashes kept, so that no user code (the
        // hasher, `K`'s `Hash`) runs with the shard locked.
        map.keys
            .insert_unique(hash, (key, entry.clone()), |(_, entry)| entry.hash);
        place.kept = true;
        self.keys_created.fetch_add(1, Ordering::Relaxed);
        Ok(User::adopt(entry))
    }

    /// Takes a place under `max_keys` for a new key: a free one, or the
    /// place of the key idle longest, evicted into `evicted`. False if
    /// `max_keys` keys are tracked and none is idle.
    fn take_place(&self, evicted: &mut Vec<Arc<Entry>>) -> bool {
        let mut len = self.len.load(Ordering::Relaxed);
        while len < self.max_keys {
            match self
                .len
                .compare_exchange_weak(len, len + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => len = now,
            }
        }
        // The victim's place becomes ours: `len` stays as it is.
        self.evict_longest_idle(evicted)
    }

    /// Evicts the key idle longest into `evicted`, if any key is idle. See
    /// the [module notes](self) on the cost.
    #[cold]
    fn evict_longest_idle(&self, evicted: &mut Vec<Arc<Entry>>) -> bool {
        loop {
            let Some((index, _)) = self
                .shards
                .iter()
                .map(|shard| shard.idle.oldest())
                .enumerate()
                .filter(|&(_, oldest)| oldest != u64::MAX)
                .min_by_key(|&(_, oldest)| oldest)
            else {
                // No key is linked in any idle order: none is idle (but
                // those whose last user is leaving this very moment).
                return false;
            };
            let shard = &self.shards[index];
            let mut map = write(shard);
            let mut order = shard.idle.lock();
            // Busy keys off the front: they are linked again when they next
            // go idle.
            let front = loop {
                let Some(front) = order.front() else {
                    break None;
                };
                let entry = map.entry_of(front);
                if entry.is_idle() {
                    break Some(front);
                }
                entry.unlink_busy(&mut order);
            };
            let Some(front) = front else {
                continue;
            };
            // Cleaning the front may have made it later than another
            // shard's: then that one goes first.
            let earliest_elsewhere = self
                .shards
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != index)
                .map(|(_, shard)| shard.idle.oldest())
                .min()
                .unwrap_or(u64::MAX);
            if front.stamp > earliest_elsewhere {
                continue;
            }
            evicted.push(map.evict(&mut order, front));
            self.keys_evicted.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }

    /// When a new key arrives and `idle_timeout` has passed since the last
    /// sweep: evicts every key idle that long.
    fn sweep_if_due(&self, evicted: &mut Vec<Arc<Entry>>) {
        let Some(idle_timeout) = self.idle_timeout_ns else {
            return;
        };
        let last = self.last_sweep_ns.load(Ordering::Relaxed);
        let now = self.now_ns();
        if now.saturating_sub(last) < idle_timeout {
            return;
        }
        // One sweeper at a time; the others go on.
        if self
            .last_sweep_ns
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.evict_idle_for(now, idle_timeout, evicted);
        }
    }

    /// Evicts the keys idle for `idle_timeout` (every idle key, without
    /// one). Returns how many.
    pub(super) fn evict_idle(&self) -> usize {
        let mut evicted = Vec::new();
        let now = self.now_ns();
        self.evict_idle_for(now, self.idle_timeout_ns.unwrap_or(0), &mut evicted);
        self.last_sweep_ns.store(now, Ordering::Relaxed);
        // The evicted bulkheads are dropped here, with no lock held.
        evicted.len()
    }

    /// Moves every key idle for at least `min_idle_ns` at `now` into
    /// `evicted`: from each shard's front, up to the first key idle for
    /// less.
    fn evict_idle_for(&self, now: u64, min_idle_ns: u64, evicted: &mut Vec<Arc<Entry>>) {
        let Some(cutoff) = now.checked_sub(min_idle_ns) else {
            return;
        };
        let before = evicted.len();
        for shard in &*self.shards {
            if shard.idle.oldest() > cutoff {
                continue;
            }
            let mut map = write(shard);
            let mut order = shard.idle.lock();
            let mut at = order.front();
            while let Some(idle) = at.filter(|idle| idle.stamp <= cutoff) {
                at = order.next(idle.slot);
                let entry = map.entry_of(idle);
                if entry.is_idle() {
                    evicted.push(map.evict(&mut order, idle));
                } else {
                    entry.unlink_busy(&mut order);
                }
            }
        }
        let count = evicted.len() - before;
        self.len.fetch_sub(count, Ordering::Relaxed);
        self.note_len();
        self.keys_evicted.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Records (`Some`) or forgets (`None`) `key`'s limit override, and
    /// returns its entry if it is tracked, to apply the limit to.
    pub(super) fn set_override<Q: BorrowedKey<K> + ?Sized>(
        &self,
        key: &Q,
        limit: Option<usize>,
    ) -> Option<Arc<Entry>> {
        let hash = self.hash(key);
        let mut map = write(self.shard(hash));
        let found = map.overrides.find_entry(hash, |(k, ..)| Q::of(k) == key);
        match (found, limit) {
            (Ok(mut found), Some(limit)) => found.get_mut().1 = limit,
            (Ok(found), None) => drop(found.remove()),
            (Err(_), Some(limit)) => {
                // `to_owned` (`K`'s `Clone`) runs with the shard locked, as
                // the module notes say; the hasher does not.
                map.overrides.insert_unique(
                    hash,
                    (key.to_owned(), limit, hash),
                    |&(_, _, hash)| hash,
                );
            }
            (Err(_), None) => {}
        }
        let (_, entry) = map.keys.find(hash, |(k, _)| Q::of(k) == key)?;
        Some(entry.clone())
    }

    /// `key` and its entry, if it is tracked.
    pub(super) fn get<Q: BorrowedKey<K> + ?Sized>(&self, key: &Q) -> Option<(K, Arc<Entry>)> {
        let hash = self.hash(key);
        let map = read(self.shard(hash));
        let (key, entry) = map.keys.find(hash, |(k, _)| Q::of(k) == key)?;
        Some((key.clone(), entry.clone()))
    }

    /// Every tracked key and its entry, one shard at a time.
    pub(super) fn snapshot(&self) -> Vec<(K, Arc<Entry>)> {
        self.collect(|key, entry| (key.clone(), entry.clone()))
    }

    /// Every tracked key, one shard at a time.
    pub(super) fn keys(&self) -> Vec<K> {
        self.collect(|key, _| key.clone())
    }

    /// Every tracked entry, one shard at a time. Each shard's map is
    /// locked after the call begins: see the [module notes](self) on
    /// closing.
    pub(super) fn entries(&self) -> Vec<Arc<Entry>> {
        self.collect(|_, entry| entry.clone())
    }

    fn collect<T>(&self, mut each: impl FnMut(&K, &Arc<Entry>) -> T) -> Vec<T> {
        let mut out = Vec::new();
        for shard in &*self.shards {
            let map = read(shard);
            out.extend(map.keys.iter().map(|(key, entry)| each(key, entry)));
        }
        out
    }

    /// Checks each shard's idle order; panics at the first broken
    /// invariant.
    #[cfg(test)]
    fn assert_valid(&self) {
        for shard in &*self.shards {
            let map = read(shard);
            let order = shard.idle.lock();
            order.assert_valid();
            let mut at = order.front();
            while let Some(idle) = at {
                let _ = map.entry_of(idle);
                at = order.next(idle.slot);
            }
        }
    }
}

/// Whether keys going idle read the clock, with `len` of `max_keys`
/// tracked: with an `idle_timeout`, or from half full on.
fn precise(idle_timeout_ns: Option<u64>, len: usize, max_keys: usize) -> bool {
    idle_timeout_ns.is_some() || len >= max_keys / 2
}

/// A place under `max_keys` taken for a new key (counted in `len`), given
/// back when dropped unless `kept`: a key found tracked already, the
/// registry closed meanwhile, or a panic of `K`'s `Eq` on the way.
struct Place<'a, F: Fn()> {
    len: &'a AtomicUsize,
    /// `Registry::note_len`.
    note: F,
    kept: bool,
}

impl<F: Fn()> Drop for Place<'_, F> {
    fn drop(&mut self) {
        if !self.kept {
            self.len.fetch_sub(1, Ordering::Relaxed);
            (self.note)();
        }
    }
}

fn read<K>(shard: &Shard<K>) -> RwLockReadGuard<'_, Map<K>> {
    shard.map.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<K>(shard: &Shard<K>) -> RwLockWriteGuard<'_, Map<K>> {
    shard.map.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::hash::{BuildHasherDefault, Hasher, RandomState};

    fn registry(max_keys: usize) -> Registry<u32, RandomState> {
        Registry::new(max_keys, None, RandomState::new())
    }

    /// Hashes a `u32` to itself: all its bits are in the low 32.
    #[derive(Default)]
    struct Identity(u64);

    impl Hasher for Identity {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, _: &[u8]) {
            unreachable!("only u32 keys")
        }
        fn write_u32(&mut self, n: u32) {
            self.0 = u64::from(n);
        }
    }

    fn track<S: BuildHasher>(registry: &Registry<u32, S>, key: u32) -> Result<User, Refused> {
        let hash = registry.hash(&key);
        if let Some(user) = registry.enter(hash, &key) {
            return Ok(user);
        }
        let bulkhead = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        let closed = AtomicBool::new(false);
        registry.insert(hash, key, bulkhead, None, 1, 1, &closed)
    }

    fn sorted_keys<S: BuildHasher>(registry: &Registry<u32, S>) -> Vec<u32> {
        let mut keys = registry.keys();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn a_hasher_with_empty_top_bits_still_uses_every_shard() {
        let r = Registry::new(256, None, BuildHasherDefault::<Identity>::default());
        for key in 0..256 {
            drop(track(&r, key).ok().unwrap());
        }
        r.assert_valid();
        let sizes: Vec<usize> = r
            .shards
            .iter()
            .map(|shard| read(shard).keys.len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 256);
        // 16 each if spread perfectly; without the spreading, all in one.
        for (i, &n) in sizes.iter().enumerate() {
            assert!((4..=48).contains(&n), "shard {i} has {n} keys: {sizes:?}");
        }
    }

    #[test]
    fn keys_are_found_after_their_tables_grew_and_at_the_cap() {
        // The tables rehash as they grow, with the same hash as lookups
        // (an idle key found by its stored hash when it is evicted).
        let r = Registry::new(100, None, BuildHasherDefault::<Identity>::default());
        for key in 0..300 {
            drop(track(&r, key).ok().unwrap());
        }
        r.assert_valid();
        assert_eq!((r.len(), r.keys_evicted()), (100, 200));
        assert_eq!(sorted_keys(&r), (200..300).collect::<Vec<_>>());
        for key in 200..300 {
            assert!(r.get(&key).is_some(), "{key} is tracked");
        }
    }

    #[test]
    fn at_the_cap_the_key_idle_longest_goes_across_shards() {
        let r = registry(64);
        for key in 0..64 {
            drop(track(&r, key).ok().unwrap());
        }
        r.assert_valid();
        // Used again, in reverse: 63 is now the key idle longest, 0 the
        // most recent.
        for key in (0..64).rev() {
            drop(track(&r, key).ok().unwrap());
        }
        for (n, key) in (100..110).enumerate() {
            drop(track(&r, key).ok().unwrap());
            r.assert_valid();
            assert!(r.get(&(63 - n as u32)).is_none(), "{} evicted", 63 - n);
            assert_eq!(r.len(), 64);
        }
        assert_eq!((r.keys_created(), r.keys_evicted()), (74, 10));
    }

    #[test]
    fn busy_keys_are_cleaned_off_the_front_and_linked_again_when_idle() {
        let r = registry(3);
        let users: Vec<User> = (0..3).map(|key| track(&r, key).ok().unwrap()).collect();
        drop(users);
        // All three linked; now all busy again.
        let users: Vec<User> = (0..3).map(|key| track(&r, key).ok().unwrap()).collect();
        assert!(matches!(track(&r, 9), Err(Refused::TooManyKeys)));
        r.assert_valid();
        for shard in &*r.shards {
            assert_eq!(shard.idle.oldest(), u64::MAX, "busy keys unlinked");
        }
        let mut users = users;
        drop(users.remove(1)); // key 1 idle
        drop(track(&r, 9).ok().unwrap());
        assert_eq!(sorted_keys(&r), [0, 2, 9]);
        drop(users);
        r.assert_valid();
        assert_eq!(r.evict_idle(), 3);
        assert_eq!(r.len(), 0);
        assert!(r.keys().is_empty());
        r.assert_valid();
    }

    /// The race `Entry::leave` and `Entry::unlink_busy` settle: a cleaner
    /// sees a key busy, its last user leaves (keeping its place, without
    /// the order's lock, since stamps are coarse below half full), and then
    /// the cleaner unlinks it. The cleaner must link it again: an idle key
    /// left out of the order could never be evicted.
    #[test]
    fn a_key_whose_last_user_leaves_while_it_is_cleaned_is_linked_again() {
        let r = registry(64);
        drop(track(&r, 1).ok().unwrap());
        let user = track(&r, 1).ok().unwrap();
        let shard = r.shard(r.hash(&1));
        {
            let map = write(shard);
            let mut order = shard.idle.lock();
            let front = order.front().expect("linked when it first went idle");
            let entry = map.entry_of(front).clone();
            assert!(!entry.is_idle());
            // Takes no lock: the cleaner holds both.
            std::thread::spawn(move || drop(user)).join().unwrap();
            assert!(entry.is_idle());
            entry.unlink_busy(&mut order);
            assert_eq!(order.front().map(|f| f.slot), Some(entry.slot));
        }
        r.assert_valid();
        assert_eq!(r.evict_idle(), 1);
    }

    #[test]
    fn a_racing_insert_of_the_same_key_joins_the_first() {
        let r = registry(2);
        let first = track(&r, 7).ok().unwrap();
        let hash = r.hash(&7);
        let bulkhead = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        let closed = AtomicBool::new(false);
        let second = r
            .insert(hash, 7, bulkhead, None, 1, 1, &closed)
            .ok()
            .unwrap();
        assert!(Arc::ptr_eq(&first.entry, &second.entry));
        assert_eq!((r.len(), r.keys()), (1, vec![7]));
        closed.store(true, Ordering::SeqCst);
        let bulkhead = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        assert!(matches!(
            r.insert(r.hash(&8), 8, bulkhead, None, 1, 1, &closed),
            Err(Refused::Closed)
        ));
        assert_eq!((r.len(), r.keys()), (1, vec![7]));
    }
}
