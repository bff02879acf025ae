//! The queue of [`ThreadTimer`](super::ThreadTimer)'s sleeps: an
//! eight-ary min-heap of deadlines over a slab of wakers, which the
//! timer thread drains in bounded batches.

use core::mem;
use core::task::Waker;
use core::time::Duration;
use std::time::Instant;

/// The most wakers the timer thread takes from the queue under one lock, so
/// a burst of expiring sleeps never holds up sleeps being registered.
pub(super) const MAX_BATCH: usize = 256;

/// The longest the timer thread parks in one go. It re-checks the queue
/// after that, which costs nothing and keeps huge timeouts away from the
/// platform's parking primitive; a sleep due later than that need not
/// unpark it.
const MAX_PARK: Duration = Duration::from_secs(60 * 60);

/// What the timer thread does after a round of [`Queue::expire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// More sleeps are due: go again without parking.
    Now,
    /// Park until this instant (or until a sleep due before it unparks the
    /// thread).
    At(Instant),
    /// Nothing is pending: park until a sleep unparks the thread.
    Never,
}

/// How many children an entry of the heap has. Eight rather than two: a
/// third as many levels (five for 10,000 sleeps), so fewer entries moved
/// and slots told when an entry goes down, and the children read side by
/// side in memory. Taking the earliest of 10,000 entries costs about 1.5x
/// a `BTreeMap`'s `pop_first` this way, 2.5x with two children; the
/// heap's storage is not as local as the map's leaves.
const ARITY: usize = 8;

/// The position of the parent of the heap entry at `at` (not the root).
#[inline]
fn parent(at: usize) -> usize {
    (at - 1) / ARITY
}

/// Marks the end of the free list, and a slot index that is never used.
const NO_SLOT: u32 = u32::MAX;

/// The pending sleeps, ordered by deadline: a min-heap of entries with
/// [`ARITY`] children each, every entry naming the slot of its sleep in a
/// slab.
///
/// # Invariants
///
/// - `heap` is a min-heap in [`Queue::before`] order (by deadline, then by
///   the slot's id): no entry comes before its parent
///   (`heap[(i - 1) / ARITY]`). No two entries tie, since ids are unique.
/// - Every entry's slot is taken, and the slot's `link` is that entry's
///   position in `heap`: the two name each other. A taken slot is named by
///   exactly one entry, so `heap.len()` is the number of taken slots.
/// - The free slots form one list from `free` through their `link`s,
///   ending in [`NO_SLOT`].
/// - While the timer thread is parked (or about to park), every entry's
///   deadline is at or after `wake_at`, or the thread has been unparked.
///
/// `slots` never shrinks, and neither vector gives back capacity: once they
/// have held as many sleeps as are pending, registering one allocates
/// nothing, and neither does taking one out.
pub(super) struct Queue {
    /// The pending entries, earliest at the root.
    heap: Vec<Entry>,
    /// One per sleep ever pending at once: taken by a registered sleep
    /// (which holds its index and id) or free.
    slots: Vec<Slot>,
    /// The first free slot, or [`NO_SLOT`].
    free: u32,
    /// The id for the next registration.
    next_id: u64,
    /// When the timer thread looks at the queue next, at the latest:
    /// `None` while it is parked with no timeout (or not started). A
    /// registration due before it unparks the thread and brings it forward.
    wake_at: Option<Instant>,
}

/// A pending sleep in [`Queue::heap`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    deadline: Instant,
    /// Its slot in [`Queue::slots`], whose id breaks ties between equal
    /// deadlines (kept there rather than here: 24 bytes an entry, not 32,
    /// for a heap read faster).
    slot: u32,
}

/// A place in [`Queue::slots`].
#[derive(Debug)]
pub(super) struct Slot {
    /// The id of the sleep registered here (of the last one, if free): it
    /// tells a sleep whether the slot is still its own, and orders equal
    /// deadlines by registration.
    id: u64,
    /// The sleep's waker while the slot is taken; `None` while it is free.
    waker: Option<Waker>,
    /// Taken: the position of the slot's entry in the heap. Free: the next
    /// free slot, or [`NO_SLOT`].
    link: u32,
}

/// Where a registered sleep's entry is found: its slot and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) slot: u32,
    pub(super) id: u64,
}

impl Queue {
    pub(super) const fn new() -> Queue {
        Queue {
            heap: Vec::new(),
            slots: Vec::new(),
            free: NO_SLOT,
            next_id: 0,
            wake_at: None,
        }
    }

    /// How many sleeps are pending.
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The slot under `key`, if it is still that sleep's: the timer thread
    /// has not taken its entry out.
    #[inline]
    fn slot(&self, key: Key) -> Option<&Slot> {
        self.slots
            .get(key.slot as usize)
            .filter(|slot| slot.id == key.id && slot.waker.is_some())
    }

    /// The waker registered under `key`, if the sleep is still pending.
    #[inline]
    pub(super) fn waker(&self, key: Key) -> Option<&Waker> {
        self.slot(key)?.waker.as_ref()
    }

    /// Adds an entry. Returns its key, and whether the timer thread must be
    /// unparked: when the entry is due before the thread looks again.
    pub(super) fn insert(&mut self, deadline: Instant, waker: Waker) -> (Key, bool) {
        let id = self.next_id;
        // 2^64 sleeps take centuries to make; should it ever wrap, an id is
        // long free again.
        self.next_id = self.next_id.wrapping_add(1);
        let at = self.heap.len() as u32;
        let slot = if self.free != NO_SLOT {
            let slot = self.free;
            let free = &mut self.slots[slot as usize];
            self.free = free.link;
            *free = Slot {
                id,
                waker: Some(waker),
                link: at,
            };
            slot
        } else {
            // Checked before anything changes; 2^32 pending sleeps would
            // need hundreds of gigabytes first.
            let slot = u32::try_from(self.slots.len())
                .ok()
                .filter(|&slot| slot != NO_SLOT)
                .expect("too many sleeps pending");
            self.slots.push(Slot {
                id,
                waker: Some(waker),
                link: at,
            });
            slot
        };
        self.heap.push(Entry { deadline, slot });
        self.sift_up(at as usize);
        let unpark = self.wake_at.is_none_or(|wake_at| deadline < wake_at);
        if unpark {
            self.wake_at = Some(deadline);
        }
        (Key { slot, id }, unpark)
    }

    /// Puts `waker` in the entry under `key`. Returns whether the entry was
    /// there (the sleep is still pending) and the waker for the caller to
    /// drop once the lock is released: the one replaced, or `waker` itself
    /// if the entry is gone.
    pub(super) fn replace_waker(&mut self, key: Key, waker: Waker) -> (bool, Waker) {
        if self.slot(key).is_none() {
            return (false, waker);
        }
        match &mut self.slots[key.slot as usize].waker {
            Some(registered) => (true, mem::replace(registered, waker)),
            None => (false, waker),
        }
    }

    /// Takes out the entry under `key`, if the sleep is still pending, and
    /// returns its waker for the caller to drop once the lock is released.
    pub(super) fn remove(&mut self, key: Key) -> Option<Waker> {
        let at = self.slot(key)?.link;
        self.remove_at(at as usize)
    }

    /// Moves the wakers of the sleeps due at `now` into `due` (at most
    /// [`MAX_BATCH`] in all), earliest first, and says when to look again.
    pub(super) fn expire(&mut self, now: Instant, due: &mut Vec<Waker>) -> Next {
        let next = loop {
            let Some(first) = self.heap.first() else {
                break Next::Never;
            };
            if first.deadline > now {
                break Next::At(first.deadline);
            }
            if due.len() >= MAX_BATCH {
                break Next::Now;
            }
            due.extend(self.remove_at(0));
        };
        // The thread looks again at the earliest deadline, or at an earlier
        // one it was unparked for whose sleep has gone since: keeping that
        // costs one wake-up at most, and spares it one per sleep registered
        // meanwhile (they are usually later). Never more than `MAX_PARK`
        // away, which also keeps huge timeouts from the platform's parking.
        let promised = self.wake_at.filter(|&wake_at| wake_at > now);
        let next = match (next, promised) {
            (Next::Now, _) => Next::Now,
            (Next::At(deadline), Some(promised)) => Next::At(deadline.min(promised)),
            (Next::At(at), None) | (Next::Never, Some(at)) => Next::At(at),
            (Next::Never, None) => Next::Never,
        };
        let next = match (next, now.checked_add(MAX_PARK)) {
            (Next::At(at), Some(latest)) => Next::At(at.min(latest)),
            (next, _) => next,
        };
        self.wake_at = match next {
            // Going again at once: what is registered meanwhile is seen.
            Next::Now => Some(now),
            Next::At(at) => Some(at),
            Next::Never => None,
        };
        next
    }

    /// Takes the entry at `at` out of the heap and frees its slot; returns
    /// its waker.
    fn remove_at(&mut self, at: usize) -> Option<Waker> {
        let entry = self.heap.swap_remove(at);
        if at < self.heap.len() {
            // The last entry fills the hole: move it up or down into place.
            if at > 0 && self.before(self.heap[at], self.heap[parent(at)]) {
                self.sift_up(at);
            } else {
                self.sift_down(at);
            }
        }
        let slot = &mut self.slots[entry.slot as usize];
        slot.link = self.free;
        self.free = entry.slot;
        slot.waker.take()
    }

    /// Moves the entry at `at` towards the root until its parent is
    /// earlier, keeping each moved entry's slot pointing at it.
    fn sift_up(&mut self, at: usize) {
        let entry = self.heap[at];
        self.rise(at, entry, 0);
    }

    /// Puts `entry` in the hole at `at`, or above it but no higher than
    /// `top`: the first place whose parent is earlier.
    fn rise(&mut self, mut at: usize, entry: Entry, top: usize) {
        while at > top {
            let parent = parent(at);
            if self.before(self.heap[parent], entry) {
                break;
            }
            self.put(at, self.heap[parent]);
            at = parent;
        }
        self.put(at, entry);
    }

    /// Moves the entry at `at`, which is not before its parent, into place
    /// below, keeping each moved entry's slot pointing at it.
    ///
    /// Bottom-up (Floyd's): the hole goes all the way down along the
    /// earliest children, without comparing them with the entry, which is
    /// then put in the hole and moved up, a step or none. The entry is most
    /// often the heap's last, so among the latest, and belongs near the
    /// bottom: this saves a comparison per level on the way.
    fn sift_down(&mut self, start: usize) {
        let entry = self.heap[start];
        let len = self.heap.len();
        let mut at = start;
        loop {
            let first = ARITY * at + 1;
            if first >= len {
                break;
            }
            let mut child = first;
            for other in first + 1..(first + ARITY).min(len) {
                if self.before(self.heap[other], self.heap[child]) {
                    child = other;
                }
            }
            self.put(at, self.heap[child]);
            at = child;
        }
        // The entry rises no higher than `start`: every entry above it is
        // earlier.
        self.rise(at, entry, start);
    }

    /// Whether `a` comes before `b`: by deadline, then by registration.
    #[inline]
    fn before(&self, a: Entry, b: Entry) -> bool {
        a.deadline < b.deadline
            || (a.deadline == b.deadline
                && self.slots[a.slot as usize].id < self.slots[b.slot as usize].id)
    }

    /// Stores `entry` at `at` in the heap and tells its slot.
    #[inline]
    fn put(&mut self, at: usize, entry: Entry) {
        self.heap[at] = entry;
        self.slots[entry.slot as usize].link = at as u32;
    }

    /// Checks every invariant but the last (see [`Queue`]), panicking with
    /// the first one broken.
    #[cfg(test)]
    fn assert_valid(&self) {
        for (at, entry) in self.heap.iter().enumerate() {
            if at > 0 {
                let parent = &self.heap[parent(at)];
                assert!(
                    self.before(*parent, *entry),
                    "an entry is before its parent"
                );
            }
            let slot = &self.slots[entry.slot as usize];
            assert!(slot.waker.is_some(), "an entry's slot must be taken");
            assert_eq!(slot.link as usize, at, "a slot must know its entry");
        }
        let mut free = 0;
        let mut next = self.free;
        while next != NO_SLOT {
            let slot = &self.slots[next as usize];
            assert!(slot.waker.is_none(), "a free slot must hold no waker");
            free += 1;
            assert!(free <= self.slots.len(), "the free list must not loop");
            next = slot.link;
        }
        assert_eq!(
            self.heap.len() + free,
            self.slots.len(),
            "every slot is taken by one entry or free"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Arc;

    use crate::test_util::{Count, counted};

    #[test]
    fn queue_expires_in_deadline_order_then_id_order() {
        let mut queue = Queue::new();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let (late, late_waker) = counted();
        let (early, early_waker) = counted();
        let (tie, tie_waker) = counted();

        assert!(queue.insert(at(20), late_waker).1);
        assert!(queue.insert(at(10), early_waker).1);
        assert!(!queue.insert(at(10), tie_waker).1);
        queue.assert_valid();

        let mut due = Vec::new();
        assert_eq!(queue.expire(at(5), &mut due), Next::At(at(10)));
        assert!(due.is_empty());
        assert_eq!(queue.expire(at(10), &mut due), Next::At(at(20)));
        assert_eq!(due.len(), 2);
        queue.assert_valid();
        let wakes = || [&early, &tie, &late].map(|c| c.get());
        due.remove(0).wake();
        assert_eq!(wakes(), [1, 0, 0], "the earliest deadline comes first");
        due.remove(0).wake();
        assert_eq!(wakes(), [1, 1, 0], "equal deadlines come in id order");
        assert_eq!(queue.expire(at(30), &mut due), Next::Never);
        due.drain(..).for_each(Waker::wake);
        assert_eq!(wakes(), [1, 1, 1]);
        assert_eq!(queue.len(), 0);
        queue.assert_valid();
    }

    #[test]
    fn queue_expires_in_bounded_batches() {
        let mut queue = Queue::new();
        let now = Instant::now();
        for _ in 0..MAX_BATCH + 1 {
            queue.insert(now, Waker::noop().clone());
        }
        let mut due = Vec::new();
        assert_eq!(queue.expire(now, &mut due), Next::Now);
        assert_eq!(due.len(), MAX_BATCH);
        due.clear();
        assert_eq!(queue.expire(now, &mut due), Next::Never);
        assert_eq!(due.len(), 1);
        queue.assert_valid();
    }

    #[test]
    fn replace_waker_hands_back_the_waker_to_drop() {
        let mut queue = Queue::new();
        let deadline = Instant::now();
        let (first, first_waker) = counted();
        let (second, second_waker) = counted();
        let (key, _) = queue.insert(deadline, first_waker);

        let (pending, old) = queue.replace_waker(key, second_waker.clone());
        assert!(pending);
        old.wake();
        assert_eq!(first.get(), 1, "the replaced waker");
        let gone = Key {
            id: key.id + 1,
            ..key
        };
        let (pending, unused) = queue.replace_waker(gone, second_waker);
        assert!(!pending);
        unused.wake();
        assert_eq!(second.get(), 1, "the unused waker");
        assert_eq!(Arc::strong_count(&second), 2, "one waker left in the queue");
    }

    /// A slot freed and taken again does not answer to the key of the
    /// sleep that had it: the sleep has fired.
    #[test]
    fn a_reused_slot_does_not_answer_to_an_old_key() {
        let mut queue = Queue::new();
        let now = Instant::now();
        let (old, _) = queue.insert(now, Waker::noop().clone());
        let mut due = Vec::new();
        queue.expire(now, &mut due);
        let (new, _) = queue.insert(now + Duration::from_secs(1), Waker::noop().clone());
        assert_eq!(new.slot, old.slot, "the slot is reused");
        assert!(queue.waker(old).is_none());
        assert!(queue.remove(old).is_none());
        assert!(!queue.replace_waker(old, Waker::noop().clone()).0);
        assert_eq!(queue.len(), 1, "the new sleep is left alone");
        assert!(queue.remove(new).is_some());
        assert!(queue.remove(new).is_none(), "removed once");
        queue.assert_valid();
    }

    /// The thread is unparked only for a sleep due before it would look at
    /// the queue anyway; a deadline it was unparked for is kept after its
    /// sleep is dropped (one stale wake-up), so later sleeps do not unpark
    /// it again.
    #[test]
    fn only_a_sleep_due_before_the_thread_looks_unparks_it() {
        let mut queue = Queue::new();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let noop = || Waker::noop().clone();
        let mut due = Vec::new();

        assert!(queue.insert(at(20), noop()).1, "the thread parked for good");
        assert!(!queue.insert(at(30), noop()).1, "later than the first");
        assert!(!queue.insert(at(20), noop()).1, "as late as the first");
        assert_eq!(queue.expire(t0, &mut due), Next::At(at(20)));
        let (earlier, unpark) = queue.insert(at(10), noop());
        assert!(unpark, "due before the thread looks");
        assert!(!queue.insert(at(15), noop()).1, "the thread looks at 10");
        assert!(queue.remove(earlier).is_some());
        assert_eq!(
            queue.expire(at(1), &mut due),
            Next::At(at(10)),
            "the deadline it was unparked for is kept"
        );
        assert!(!queue.insert(at(12), noop()).1);
        assert_eq!(queue.expire(at(10), &mut due), Next::At(at(12)));
        assert!(due.is_empty(), "the stale wake-up finds nothing due");
        assert_eq!(queue.expire(at(40), &mut due), Next::Never);
        assert_eq!(due.len(), 5);
        assert!(queue.insert(at(50), noop()).1, "the thread parked for good");

        // Parked for at most `MAX_PARK`: a sleep due after that need not
        // unpark the thread.
        let mut queue = Queue::new();
        assert!(queue.insert(t0 + 2 * MAX_PARK, noop()).1);
        assert_eq!(queue.expire(t0, &mut due), Next::At(t0 + MAX_PARK));
        assert!(!queue.insert(t0 + MAX_PARK * 3 / 2, noop()).1);
        assert!(queue.insert(t0 + MAX_PARK / 2, noop()).1);
    }

    /// Random inserts, removals, waker swaps and expiries against an
    /// ordered map: the heap wakes exactly the due sleeps, earliest first,
    /// keeps its invariants, and never answers to the key of a sleep gone.
    #[test]
    fn the_heap_matches_an_ordered_map() {
        let mut queue = Queue::new();
        let mut model: BTreeMap<(Instant, u64), (Key, Arc<Count>)> = BTreeMap::new();
        let mut gone: VecDeque<Key> = VecDeque::new();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut now = t0;
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut random = |n: usize| {
            // xorshift64
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let rounds = if cfg!(miri) { 300 } else { 20_000 };
        for _ in 0..rounds {
            match random(10) {
                0..=4 => {
                    let deadline = now + ms(random(200) as u64);
                    let (count, waker) = counted();
                    let (key, _) = queue.insert(deadline, waker);
                    model.insert((deadline, key.id), (key, count));
                }
                5 | 6 if !model.is_empty() => {
                    let nth = random(model.len());
                    let (&at, &(key, _)) = model.iter().nth(nth).unwrap();
                    model.remove(&at);
                    assert!(queue.remove(key).is_some(), "a pending sleep");
                    gone.push_back(key);
                }
                7 if !model.is_empty() => {
                    let nth = random(model.len());
                    let (key, count) = model.values_mut().nth(nth).unwrap();
                    let (new, waker) = counted();
                    let (pending, old) = queue.replace_waker(*key, waker);
                    assert!(pending);
                    assert_eq!(old.data(), Arc::as_ptr(count).cast(), "its own waker");
                    *count = new;
                }
                _ => {
                    now += ms(random(50) as u64);
                    let mut due = Vec::new();
                    let next = queue.expire(now, &mut due);
                    let mut expected = Vec::new();
                    while expected.len() < MAX_BATCH {
                        match model.first_entry() {
                            Some(first) if first.key().0 <= now => {
                                let (key, count) = first.remove();
                                expected.push(Arc::as_ptr(&count).cast::<()>());
                                gone.push_back(key);
                            }
                            _ => break,
                        }
                    }
                    let woken: Vec<*const ()> = due.iter().map(Waker::data).collect();
                    assert_eq!(woken, expected, "the due sleeps, earliest first");
                    match model.first_key_value() {
                        Some((first, _)) if first.0 <= now => assert_eq!(next, Next::Now),
                        Some((first, _)) => assert!(
                            matches!(next, Next::At(at) if now < at && at <= first.0),
                            "looks again by the next deadline"
                        ),
                        None => assert!(matches!(next, Next::Never | Next::At(_))),
                    }
                }
            }
            while gone.len() > 64 {
                gone.pop_front();
            }
            for &key in &gone {
                assert!(queue.waker(key).is_none(), "a sleep gone is gone");
            }
            queue.assert_valid();
            assert_eq!(queue.len(), model.len());
        }
    }
}
