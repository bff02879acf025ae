//! Waiters' slots for the lines kept under one mutex (the priority
//! classes' in `bulkhead/classes.rs`, the keyed bulkhead's fair line in
//! `keyed/fair.rs`): a `Vec` reused through a free list, so a wait
//! allocates nothing once the line has been as long once, and lines linked
//! by index through the slots, so a cancelled waiter leaves in O(1). No
//! `unsafe`: an index is never reused under a waiter that holds it, since
//! a slot is freed only by its own waiter.

use core::ops::{Index, IndexMut};
use core::task::Waker;

/// No slot: the end of a line, or of the free list.
pub(crate) const NONE: u32 = u32::MAX;

/// A waiter's slot: the line it waits in (a class, a key's flow: the
/// owner's index), what the owner says of it, the waiter's waker while it
/// waits, and its links to the previous and the next slot of its line
/// (while free, `next` links the free list).
pub(crate) struct Slot<S> {
    pub(crate) line: usize,
    pub(crate) status: S,
    pub(crate) waker: Option<Waker>,
    prev: u32,
    next: u32,
}

impl<S> Slot<S> {
    /// The slot after this one in its line (`NONE` at the end).
    pub(crate) fn next(&self) -> u32 {
        self.next
    }
}

/// The slots, and the head of the free list.
pub(crate) struct Slots<S> {
    slots: Vec<Slot<S>>,
    free: u32,
}

impl<S> Slots<S> {
    pub(crate) const fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: NONE,
        }
    }

    /// A slot of `line` with `status` and no waker, in no line yet (a
    /// free one or a new one): its index.
    pub(crate) fn alloc(&mut self, line: usize, status: S) -> u32 {
        let slot = Slot {
            line,
            status,
            waker: None,
            prev: NONE,
            next: NONE,
        };
        if self.free == NONE {
            let index = u32::try_from(self.slots.len())
                .ok()
                .filter(|&i| i != NONE)
                .expect("more than u32::MAX - 1 waiters in one line");
            self.slots.push(slot);
            index
        } else {
            let index = self.free;
            self.free = self.slots[index as usize].next;
            self.slots[index as usize] = slot;
            index
        }
    }

    /// Puts `index` on the free list (its owner is done with it, and it is
    /// in no line).
    pub(crate) fn free(&mut self, index: u32) {
        let free = self.free;
        self.slots[index as usize].next = free;
        self.free = index;
    }

    /// Appends `index` to the line whose first and last slots are `ends`.
    pub(crate) fn push_back(&mut self, ends: &mut (u32, u32), index: u32) {
        let tail = ends.1;
        self.slots[index as usize].prev = tail;
        self.slots[index as usize].next = NONE;
        if tail == NONE {
            debug_assert!(ends.0 == NONE, "a line with a head and no tail");
            *ends = (index, index);
        } else {
            self.slots[tail as usize].next = index;
            ends.1 = index;
        }
    }

    /// Takes `index` out of the line whose first and last slots are `ends`
    /// (both `NONE` if it empties).
    pub(crate) fn unlink(&mut self, ends: &mut (u32, u32), index: u32) {
        let (prev, next) = {
            let s = &self.slots[index as usize];
            (s.prev, s.next)
        };
        if prev == NONE {
            ends.0 = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NONE {
            ends.1 = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let s = &mut self.slots[index as usize];
        s.prev = NONE;
        s.next = NONE;
    }
}

impl<S> Slots<S> {
    /// How many slots, free or not, satisfy `f` (for tests).
    #[cfg(test)]
    pub(crate) fn count(&self, f: impl Fn(&Slot<S>) -> bool) -> usize {
        self.slots.iter().filter(|s| f(s)).count()
    }
}

impl<S> Index<usize> for Slots<S> {
    type Output = Slot<S>;

    fn index(&self, index: usize) -> &Slot<S> {
        &self.slots[index]
    }
}

impl<S> IndexMut<usize> for Slots<S> {
    fn index_mut(&mut self, index: usize) -> &mut Slot<S> {
        &mut self.slots[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(slots: &Slots<()>, ends: (u32, u32)) -> Vec<usize> {
        let mut out = Vec::new();
        let mut at = ends.0;
        while at != NONE {
            out.push(slots[at as usize].line);
            at = slots[at as usize].next;
        }
        out
    }

    #[test]
    fn slots_are_reused_and_lines_keep_their_order() {
        let mut slots = Slots::new();
        let mut ends = (NONE, NONE);
        let ix: Vec<u32> = (0..4).map(|i| slots.alloc(i, ())).collect();
        for &i in &ix {
            slots.push_back(&mut ends, i);
        }
        assert_eq!(line(&slots, ends), [0, 1, 2, 3]);
        // The middle, the head and the tail.
        slots.unlink(&mut ends, ix[1]);
        slots.unlink(&mut ends, ix[0]);
        slots.unlink(&mut ends, ix[3]);
        assert_eq!(line(&slots, ends), [2]);
        assert_eq!(ends, (ix[2], ix[2]));
        slots.unlink(&mut ends, ix[2]);
        assert_eq!(ends, (NONE, NONE));
        // Freed slots are reused, the last freed first; no new one.
        slots.free(ix[1]);
        slots.free(ix[3]);
        assert_eq!(slots.alloc(7, ()), ix[3]);
        assert_eq!(slots.alloc(8, ()), ix[1]);
        assert_eq!(slots.alloc(9, ()), 4);
    }
}
