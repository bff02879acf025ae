//! Fair shares of the global limit among keys
//! ([`KeyedBulkheadBuilder::fair_shares`](super::KeyedBulkheadBuilder::fair_shares)):
//! the clock-free [`Drr`] of `src/overload/`, with the line of waiters it
//! decides about, under one lock.
//!
//! # Implementation notes
//!
//! The global bulkhead still counts the seats: its semaphore holds them,
//! its policy keeps the line's count, `max_queue`, each wait's limits and
//! controlled delay, its observers see every admission and rejection. What
//! changes is who may queue for its semaphore. A caller that is to wait
//! for a global seat first waits here for its *turn* ([`Turn`], the gate
//! of the global bulkhead's `After`): it joins its key's line (first come,
//! first served within the key), and [`Drr`] picks whose turn comes next,
//! key by key, by weight. Only callers on their turn queue for the
//! semaphore, so a freed seat goes to a caller the rotation chose: one
//! per seat free at the time the turns were given, plus one to wait for
//! the next seat to free (`on_turn <= free`), so that the rotation's
//! order is the semaphore's. Any release reaches a caller on its turn
//! through the semaphore (a permit given back, a limit raised, from any
//! path), and while anyone waits here at least one caller is on its
//! turn, so nobody is stranded here: a caller on its turn passes the turn
//! on when its wait ends, however it ends (a permit, a rejection, its
//! future dropped, an unwinding panic).
//!
//! | status | meaning |
//! |---|---|
//! | `Waiting` | in its key's line, counted by `Drr::waiting` |
//! | `Turn` | its turn came (counted in `on_turn`); it queues for a permit |
//! | `Lost` | its turn came but its waker panicked: not counted, so that another caller gets a turn in its place |
//!
//! While anyone waits here or is on its turn (`busy`), a newcomer does not
//! take a free seat at once: it joins its key's line (a free seat then is
//! one that a caller on its turn is about to take).
//!
//! The waiters are slots in a `Vec` reused through a free list, linked by
//! index into one line per key (no `unsafe`, O(1) removal of a waiter who
//! gives up; nothing allocated once the line has been as long once, and
//! the rotation's tables keep their storage). A slot belongs to its waiter
//! from its first poll until its drop. No user code runs under the lock:
//! wakers are cloned before it is taken, and woken and dropped after it
//! is released, each under `catch_unwind` (the first panic is resumed once
//! the bookkeeping is done, unless the thread is unwinding already).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use super::entry::Entry;
use crate::bulkhead::Bulkhead;
use crate::overload::Drr;

use crate::slots::{NONE, Slots};
/// The most turns given at once (their wakers are kept on the stack).
const BATCH: usize = 32;

/// The rotation of the keys whose callers wait for a global seat.
pub(super) struct FairLine {
    state: Mutex<State>,
    /// Callers waiting here or on their turn. Changed under the lock, read
    /// without it by newcomers (a stale read only decides whether a
    /// newcomer looks for a free seat first or joins the line).
    busy: AtomicUsize,
}

struct State {
    /// Keyed by the entry's address, which is stable while any of its
    /// callers is here (each holds the entry).
    drr: Drr<usize>,
    /// Per key with waiters: its oldest and newest waiter.
    lines: HashMap<usize, (u32, u32)>,
    /// Waiters' slots (`crate::slots`), linked by index into the lines.
    slots: Slots<Status>,
    /// Callers whose turn came and whose wait has not ended.
    on_turn: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Free,
    Waiting,
    Turn,
    /// Given its turn, but its waker panicked: it may never be polled
    /// again, so it no longer counts in `on_turn` (another caller gets a
    /// turn in its place); it is on its turn all the same if it is.
    Lost,
}

impl FairLine {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                drr: Drr::new(1),
                lines: HashMap::new(),
                slots: Slots::new(),
                on_turn: 0,
            }),
            busy: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing in here runs user code or can panic halfway through a
        // change, so a poisoned lock holds consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether anyone waits here or is on their turn: a newcomer then
    /// joins the line rather than take a free seat.
    #[inline]
    pub(super) fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed) != 0
    }

    /// The turn of a caller of `entry` that is to wait for a seat of
    /// `global`; it joins its key's line when first polled.
    pub(super) fn turn<'a>(&'a self, global: &'a Bulkhead, entry: &Entry) -> Turn<'a> {
        Turn {
            line: self,
            global,
            flow: core::ptr::from_ref(entry) as usize,
            weight: entry.weight,
            slot: NONE,
        }
    }

    /// Callers waiting for their turn, and on their turn (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        let waiting = state.slots.count(|s| s.status == Status::Waiting);
        (waiting, state.on_turn)
    }
}

/// A gate that is a caller's [`Turn`] where fair shares are on, and open
/// at once where they are off: one wait for both.
pub(super) struct TurnIf<'a>(pub(super) Option<Turn<'a>>);

impl Future for TurnIf<'_> {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().0 {
            None => Poll::Ready(()),
            Some(turn) => Pin::new(turn).poll(cx),
        }
    }
}

/// A caller's wait for its turn: resolves once its key's turn has come
/// and it is its key's oldest waiter; then, until dropped, it is on its
/// turn (it queues for a global permit). Dropped, it leaves its key's
/// line, or passes its turn on.
#[must_use = "a turn does nothing unless polled"]
pub(super) struct Turn<'a> {
    line: &'a FairLine,
    global: &'a Bulkhead,
    flow: usize,
    weight: u32,
    /// Its slot, from its first poll on (`NONE` before).
    slot: u32,
}

impl Future for Turn<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut wake = Wakes::new();
        let (on_turn, new_waker) = {
            let mut state = this.line.lock();
            if this.slot == NONE {
                this.slot = state.join(this.flow, this.weight);
                this.line.busy.fetch_add(1, Ordering::Relaxed);
                state.hand_out(this.global.seats_left(), &mut wake);
            }
            let s = &state.slots[this.slot as usize];
            match s.status {
                Status::Turn | Status::Lost => (true, false),
                Status::Waiting => {
                    let kept = s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
                    (false, !kept)
                }
                Status::Free => unreachable!("a turn polled a slot it no longer holds"),
            }
        };
        // Others' turns, given as this one joined: woken with no lock held.
        wake.wake_all(this.line, this.global);
        if on_turn || !new_waker {
            wake.resume_panic();
            return if on_turn {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        }
        // The waker, cloned with no lock held (user code).
        let waker = cx.waker().clone();
        let (on_turn, old) = {
            let mut state = this.line.lock();
            let s = &mut state.slots[this.slot as usize];
            match s.status {
                Status::Waiting => (false, s.waker.replace(waker)),
                // Its turn came meanwhile: the clone is not needed.
                Status::Turn | Status::Lost => (true, Some(waker)),
                Status::Free => unreachable!("a turn polled a slot it no longer holds"),
            }
        };
        wake.catch(|| drop(old));
        wake.resume_panic();
        if on_turn {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Turn<'_> {
    /// Leaves the key's line, or passes the turn on. A waker's panic here
    /// is dropped, not resumed: this runs as a wait ends, also after a
    /// permit was taken and before its guard owns it.
    fn drop(&mut self) {
        if self.slot == NONE {
            return;
        }
        let mut wake = Wakes::new();
        let old = {
            let mut state = self.line.lock();
            let old = state.leave(self.slot);
            self.line.busy.fetch_sub(1, Ordering::Relaxed);
            state.hand_out(self.global.seats_left(), &mut wake);
            old
        };
        wake.catch(|| drop(old));
        wake.wake_all(self.line, self.global);
    }
}

/// Turns given under the lock, whose callers are woken once it is
/// released.
struct Wakes {
    given: [(u32, Option<Waker>); BATCH],
    len: usize,
    /// The first panic of a waker (its `wake`, its `drop`).
    panic: Option<Box<dyn Any + Send>>,
}

impl Wakes {
    fn new() -> Self {
        Self {
            given: [const { (NONE, None) }; BATCH],
            len: 0,
            panic: None,
        }
    }

    fn can_push(&self) -> bool {
        self.len < BATCH
    }

    fn push(&mut self, slot: u32, waker: Waker) {
        self.given[self.len] = (slot, Some(waker));
        self.len += 1;
    }

    /// Runs `f`, user code (a waker's `wake` or drop), with no lock held;
    /// keeps its panic, the first one. Whether it returned.
    fn catch(&mut self, f: impl FnOnce()) -> bool {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(()) => true,
            Err(payload) => {
                self.panic.get_or_insert(payload);
                false
            }
        }
    }

    /// Wakes the callers given their turn, with no lock held. One whose
    /// waker panics may never be polled again: it is `Lost`, and its turn
    /// is given to the next caller as well, so that nobody waits behind it.
    fn wake_all(&mut self, line: &FairLine, global: &Bulkhead) {
        while self.len > 0 {
            self.len -= 1;
            let (slot, waker) = core::mem::replace(&mut self.given[self.len], (NONE, None));
            let Some(waker) = waker else { continue };
            if self.catch(|| waker.wake()) {
                continue;
            }
            let mut state = line.lock();
            let s = &mut state.slots[slot as usize];
            if s.status == Status::Turn {
                s.status = Status::Lost;
                state.on_turn -= 1;
                state.hand_out(global.seats_left(), self);
            }
        }
    }

    /// Resumes the first panic caught, unless the thread is unwinding
    /// already (a second panic would abort).
    fn resume_panic(&mut self) {
        if let Some(payload) = self.panic.take() {
            if !std::thread::panicking() {
                resume_unwind(payload);
            }
        }
    }
}

impl State {
    /// A waiter of `flow` joins the back of its key's line.
    fn join(&mut self, flow: usize, weight: u32) -> u32 {
        self.drr.join(flow, weight);
        let slot = self.alloc(flow);
        let ends = self.lines.entry(flow).or_insert((NONE, NONE));
        self.slots.push_back(ends, slot);
        slot
    }

    /// The waiter in `slot` leaves: out of its key's line, or off its
    /// turn. Its slot is freed; its waker is returned, to be dropped with
    /// no lock held.
    fn leave(&mut self, slot: u32) -> Option<Waker> {
        let s = &self.slots[slot as usize];
        match s.status {
            Status::Waiting => {
                let flow = s.line;
                self.unlink(slot);
                self.drr.leave(&flow);
            }
            Status::Turn => self.on_turn -= 1,
            Status::Lost => {}
            Status::Free => unreachable!("a turn left a slot it no longer holds"),
        }
        self.release_slot(slot)
    }

    /// Gives turns, by the rotation, while fewer callers are on their turn
    /// than `free` seats plus one (the caller to wait for the next seat);
    /// their wakers go into `wake`. While anyone waits, someone is on
    /// their turn after this.
    fn hand_out(&mut self, free: usize, wake: &mut Wakes) {
        while self.on_turn <= free && wake.can_push() {
            let Some(flow) = self.drr.next(|_| 1) else {
                return;
            };
            let head = self
                .lines
                .get(&flow)
                .expect("the rotation picked a key with no waiter")
                .0;
            self.unlink(head);
            self.on_turn += 1;
            let s = &mut self.slots[head as usize];
            s.status = Status::Turn;
            if let Some(waker) = s.waker.take() {
                wake.push(head, waker);
            }
        }
    }

    fn alloc(&mut self, flow: usize) -> u32 {
        self.slots.alloc(flow, Status::Waiting)
    }

    /// Frees `slot`, returning its waker.
    fn release_slot(&mut self, slot: u32) -> Option<Waker> {
        let s = &mut self.slots[slot as usize];
        debug_assert!(s.status != Status::Free, "a slot freed twice");
        s.status = Status::Free;
        let waker = s.waker.take();
        self.slots.free(slot);
        waker
    }

    /// Takes `slot` out of its key's line (dropping the line if it empties).
    fn unlink(&mut self, slot: u32) {
        let flow = self.slots[slot as usize].line;
        let ends = self
            .lines
            .get_mut(&flow)
            .expect("a waiting slot's key has a line");
        self.slots.unlink(ends, slot);
        if ends.0 == NONE {
            debug_assert!(ends.1 == NONE, "a line with a tail and no head");
            self.lines.remove(&flow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_keeps_its_counts_as_waiters_come_and_go() {
        let line = FairLine::new();
        let mut state = line.lock();
        let mut wake = Wakes::new();
        let a: Vec<u32> = (0..3).map(|_| state.join(1, 1)).collect();
        let b = state.join(2, 1);
        state.hand_out(0, &mut wake);
        // One on its turn (a's oldest), the rest waiting.
        assert_eq!(state.slots[a[0] as usize].status, Status::Turn);
        assert_eq!(state.on_turn, 1);
        // b leaves from the middle of the rotation; a's turn passes on.
        drop(state.leave(b));
        drop(state.leave(a[0]));
        state.hand_out(0, &mut wake);
        assert_eq!(state.slots[a[1] as usize].status, Status::Turn);
        drop(state.leave(a[2]));
        drop(state.leave(a[1]));
        state.hand_out(0, &mut wake);
        assert_eq!(state.on_turn, 0);
        assert!(state.lines.is_empty());
        drop(state);
        assert_eq!(line.counts(), (0, 0));
    }
}
