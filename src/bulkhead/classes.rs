//! Priority classes on a bulkhead (`BulkheadBuilder::priorities`): the
//! clock-free [`Seats`] of `src/overload/`, with the line of waiters it
//! decides about, under one lock.
//!
//! # Implementation notes
//!
//! With classes on, the seats live here, not in the semaphore: the
//! bulkhead's semaphore is built with no permits and closed (so a plain
//! call's fast path, `try_take`, fails as closed, and the branch for a
//! closed bulkhead, off the fast and the contended paths, looks here). Every seat taken, waited for,
//! handed over or given back goes through `state`'s mutex, so there is no
//! lost wake-up to guard against: a releaser that finds nobody waiting and
//! a joiner that finds no seat free cannot both happen, since each decides
//! under the lock what the other left.
//!
//! The waiters are slots in a `Vec` (reused through a free list, so a
//! call allocates nothing once the line has been as long once), linked by
//! index into one FIFO line per class: no `unsafe`, O(1) removal of a
//! cancelled waiter. A slot belongs to its waiter from `join` until the
//! waiter itself frees it (when it sees its verdict, or is dropped); the
//! others only change its status (granted, displaced, closed) and take its
//! waker, so an index is never reused under a waiter that holds it.
//!
//! | status | seat | meaning |
//! |---|---|---|
//! | `Waiting` | none | in its class's line, counted by `Seats::waiting` |
//! | `Granted` | held, counted in `Seats::held` | handed a freed seat; its waiter has not seen it yet |
//! | `Displaced` | none | pushed out of a full line by a more important newcomer |
//! | `Closed` | none | the bulkhead was closed while it waited |
//!
//! A waiter dropped while `Granted` gives its seat back, and the seat goes
//! to whoever `Seats::pick` chooses next. Wakers run after the lock is
//! released, never one that panics left to stop the bookkeeping halfway:
//! [`wake_all`] wakes the rest before resuming a panic, [`wake`] drops it
//! while unwinding, and a classed wait keeps its verdict across it
//! (`seating.rs`).

use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::error::{RejectReason, nanos};
use super::policy::Policy;
use crate::overload::{Change, Join, QueueDelay, Seats};
use crate::slots::{Slot, Slots};

pub(crate) use crate::slots::NONE;

/// The seats of a bulkhead with priority classes, and its classed line.
pub(crate) struct Classes {
    state: Mutex<State>,
    /// The least important class: the class of plain calls.
    least: usize,
    /// Controlled delay's target, if each class's line has controlled
    /// delay (`queue_delay`).
    target: Option<Duration>,
}

struct State {
    seats: Seats,
    /// Waiters' slots (`crate::slots`), linked by index into the lines.
    slots: Slots<Status>,
    /// Per class, the first and last waiter (`NONE` if nobody waits).
    lines: Vec<(u32, u32)>,
    /// Per class, controlled delay on its line (empty without
    /// `queue_delay`): a class's standing line is cut, no other's.
    delays: Vec<QueueDelay>,
    closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Free,
    Waiting,
    Granted,
    Displaced,
    Closed,
}

/// What [`Classes::admit`] decided.
pub(crate) enum Admit {
    /// A seat, taken now.
    Seat,
    /// Waiting in line, in this slot.
    Queued(u32),
    /// Rejected at once, for this reason (`Full` or `Closed`).
    Rejected(RejectReason),
}

/// What [`Classes::give_up`] found.
pub(crate) enum GaveUp {
    /// The waiter left the line without a seat.
    Left,
    /// A seat had been handed to it meanwhile: it is its.
    Granted,
    /// It had been displaced or the bulkhead closed meanwhile.
    Rejected(RejectReason),
}

impl Classes {
    /// `limit` seats shared by `shares` (class 0 first), with a line of at
    /// most `max_queue` waiters.
    /// With `delay` (target, interval), each class's line has controlled
    /// delay of its own, and with `lifo` adaptive LIFO too: while a
    /// class's line stands, its newest waiter is served first.
    pub(crate) fn new(
        limit: usize,
        shares: &[u32],
        max_queue: Option<usize>,
        delay: Option<(Duration, Duration)>,
        lifo: bool,
    ) -> Self {
        let delays = match delay {
            Some((target, interval)) => {
                vec![
                    QueueDelay::new(nanos(target), nanos(interval)).adaptive_lifo(lifo);
                    shares.len()
                ]
            }
            None => Vec::new(),
        };
        Self {
            state: Mutex::new(State {
                seats: Seats::new(limit, shares, max_queue),
                slots: Slots::new(),
                lines: vec![(NONE, NONE); shares.len()],
                delays,
                closed: false,
            }),
            least: shares.len() - 1,
            target: delay.map(|(target, _)| target),
        }
    }

    /// Controlled delay's target, if the classes' lines have controlled
    /// delay.
    #[inline]
    pub(crate) fn target(&self) -> Option<Duration> {
        self.target
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing in here runs user code or can panic halfway through a
        // change, so a poisoned lock holds consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The least important class, which plain calls belong to.
    #[inline]
    pub(crate) fn least(&self) -> usize {
        self.least
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Seats held now, and callers waiting.
    pub(crate) fn in_use_and_queued(&self) -> (usize, usize) {
        let state = self.lock();
        (state.seats.in_use(), state.seats.queued())
    }

    /// The waiters served before a newcomer of `class` (those of its class
    /// and of the more important ones), and the seats free now.
    pub(crate) fn ahead_of(&self, class: usize) -> (usize, usize) {
        let state = self.lock();
        let s = &state.seats;
        let ahead = (0..=class).map(|c| s.waiting(c)).sum();
        (ahead, s.free())
    }

    /// Per class: its nominal seats, the seats it holds, its waiters.
    pub(crate) fn per_class(&self) -> Vec<(usize, usize, usize)> {
        let state = self.lock();
        let s = &state.seats;
        (0..s.classes())
            .map(|c| (s.nominal(c), s.held(c), s.waiting(c)))
            .collect()
    }

    /// A caller of `class` takes a free seat, or (if `may_wait`) joins its
    /// class's line, maybe displacing a less important waiter, whose waker
    /// is returned to be woken once the lock is released. `policy`'s
    /// queue gauge is kept, under the lock (as by every method here that
    /// changes the line).
    pub(crate) fn admit(
        &self,
        class: usize,
        may_wait: bool,
        policy: &Policy,
    ) -> (Admit, Option<Waker>) {
        let mut state = self.lock();
        let state = &mut *state;
        if state.closed {
            return (Admit::Rejected(RejectReason::Closed), None);
        }
        if state.seats.try_take(class) {
            return (Admit::Seat, None);
        }
        if !may_wait {
            return (Admit::Rejected(RejectReason::Full), None);
        }
        let displaced = match state.seats.join(class) {
            Join::Queued => None,
            Join::Displaced(victim) => {
                // The newest waiter of the victim class.
                let slot = state.lines[victim].1;
                debug_assert!(slot != NONE, "Seats displaced a waiter of an empty line");
                state.unlink(slot);
                let s = &mut state.slots[slot as usize];
                s.status = Status::Displaced;
                s.waker.take()
            }
            Join::Full => return (Admit::Rejected(RejectReason::Full), None),
        };
        let slot = state.alloc(class);
        state.push_back(slot);
        policy.set_queued(state.seats.queued());
        (Admit::Queued(slot), displaced)
    }

    /// The waiter in `slot` looks at its place: `Ready(Ok)` with a seat
    /// (its slot freed), `Ready(Err)` displaced or closed (its slot
    /// freed), else `Pending` with its waker kept.
    ///
    /// With controlled delay, `now` is the waiter's [`Sample`]: a waiter
    /// served is a sample of its class's line (the one that finds the line
    /// standing wakes the line's front waiter to look), and a waiter still
    /// waiting that has waited the target on a standing line is cut
    /// (`QueueDelay`), waking the next one to look in turn. The waker to
    /// wake, once the lock is released, comes back with the verdict.
    pub(crate) fn poll(
        &self,
        slot: u32,
        cx: &mut Context<'_>,
        now: Option<Sample>,
        policy: &Policy,
    ) -> (Poll<Result<(), RejectReason>>, Option<Waker>) {
        let mut state = self.lock();
        let state = &mut *state;
        let Slot {
            line: class,
            status,
            ..
        } = state.slots[slot as usize];
        let mut wake = None;
        let out = match status {
            Status::Waiting => {
                if now.is_some_and(|now| state.cuts(class, now.waited)) {
                    state.unlink(slot);
                    state.seats.leave(class);
                    policy.set_queued(state.seats.queued());
                    wake = state.front_to_look(class);
                    Err(RejectReason::QueueDelay)
                } else {
                    match &mut state.slots[slot as usize].waker {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        w => *w = Some(cx.waker().clone()),
                    }
                    return (Poll::Pending, None);
                }
            }
            Status::Granted => {
                if let Some(now) = now {
                    wake = state.sample(class, now);
                }
                Ok(())
            }
            Status::Displaced => Err(RejectReason::Displaced),
            Status::Closed => Err(RejectReason::Closed),
            Status::Free => unreachable!("a classed waiter polled a slot it no longer holds"),
        };
        state.release_slot(slot);
        (Poll::Ready(out), wake)
    }

    /// The waiter in `slot` gives up (its `max_wait` ran out, or its
    /// deadline's budget): it leaves the line, unless a verdict reached
    /// it first. Its slot is freed. With controlled delay, a wait out of
    /// `max_wait` is a sample of its class's line (`now`); and a waiter
    /// that leaves a standing line wakes the next one to look. The waker
    /// to wake comes back with the verdict.
    pub(crate) fn give_up(
        &self,
        slot: u32,
        now: Option<Sample>,
        policy: &Policy,
    ) -> (GaveUp, Option<Waker>) {
        let mut state = self.lock();
        let class = state.slots[slot as usize].line;
        let mut wake = None;
        let out = match state.slots[slot as usize].status {
            Status::Waiting => {
                state.unlink(slot);
                state.seats.leave(class);
                if let Some(now) = now {
                    wake = state.sample(class, now);
                }
                wake = wake.or_else(|| state.front_to_look(class));
                GaveUp::Left
            }
            Status::Granted => GaveUp::Granted,
            Status::Displaced => GaveUp::Rejected(RejectReason::Displaced),
            Status::Closed => GaveUp::Rejected(RejectReason::Closed),
            Status::Free => unreachable!("a classed waiter gave up a slot it no longer holds"),
        };
        state.release_slot(slot);
        policy.set_queued(state.seats.queued());
        (out, wake)
    }

    /// The waiter in `slot` is dropped before it saw its verdict: it
    /// leaves the line, or gives back the seat it was handed (to the next
    /// waiter `Seats::pick` chooses, whose waker is returned). Returns
    /// whether it had been displaced (a rejection still to count), the
    /// waker, and whether no seat is held now.
    pub(crate) fn drop_waiter(&self, slot: u32, policy: &Policy) -> Dropped {
        let mut state = self.lock();
        let mut dropped = Dropped::default();
        match state.slots[slot as usize].status {
            Status::Waiting => {
                let class = state.slots[slot as usize].line;
                state.unlink(slot);
                state.seats.leave(class);
                dropped.wake = state.front_to_look(class);
            }
            Status::Granted => {
                let class = state.slots[slot as usize].line;
                state.seats.release(class);
                dropped.wake = state.hand_out();
            }
            Status::Displaced => dropped.displaced = true,
            Status::Closed => {}
            Status::Free => unreachable!("a classed waiter dropped a slot it no longer holds"),
        }
        state.release_slot(slot);
        policy.set_queued(state.seats.queued());
        dropped.idle = state.seats.in_use() == 0;
        dropped
    }

    /// A seat of `class` is given back: it goes to the waiter
    /// `Seats::pick` chooses, if any (whose waker is returned). Also
    /// returns whether no seat is held now.
    pub(crate) fn release(&self, class: usize, policy: &Policy) -> (Option<Waker>, bool) {
        let mut state = self.lock();
        state.seats.release(class);
        let wake = state.hand_out();
        policy.set_queued(state.seats.queued());
        (wake, state.seats.in_use() == 0)
    }

    /// A new limit: the nominal seats are recomputed, and seats it frees
    /// are handed out (the wakers returned).
    pub(crate) fn set_limit(&self, limit: usize, policy: &Policy) -> Vec<Waker> {
        let mut state = self.lock();
        state.seats.set_limit(limit);
        let mut wakers = Vec::new();
        while let Some(w) = state.hand_out_one() {
            wakers.extend(w);
        }
        policy.set_queued(state.seats.queued());
        wakers
    }

    /// Closes: every waiter is rejected, every later caller too.
    pub(crate) fn close(&self, policy: &Policy) -> Vec<Waker> {
        let mut state = self.lock();
        let state = &mut *state;
        state.closed = true;
        let mut wakers = Vec::new();
        for class in 0..state.lines.len() {
            let mut slot = state.lines[class].0;
            while slot != NONE {
                let s = &mut state.slots[slot as usize];
                let next = s.next();
                s.status = Status::Closed;
                wakers.extend(s.waker.take());
                state.seats.leave(class);
                slot = next;
            }
            state.lines[class] = (NONE, NONE);
            if let Some(delay) = state.delays.get_mut(class) {
                delay.emptied();
            }
        }
        policy.set_queued(state.seats.queued());
        wakers
    }
}

/// Wakes `waker`, with no lock held. Its panic propagates, unless the
/// thread is unwinding already (a seat given back, or a wait dropped,
/// during a panic), where a second panic would abort: it is dropped then.
pub(crate) fn wake(waker: Waker) {
    if std::thread::panicking() {
        let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
    } else {
        waker.wake();
    }
}

/// Wakes `wakers`, with no lock held: one that panics does not keep the
/// others from their wake-up (each would be left holding a seat, or a
/// verdict, it never hears of). The first panic is resumed once all are
/// woken; dropped if the thread is unwinding already, where a second
/// panic would abort.
pub(crate) fn wake_all(wakers: impl IntoIterator<Item = Waker>) {
    let mut panic = None;
    for waker in wakers {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| waker.wake())) {
            panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = panic {
        if !std::thread::panicking() {
            resume_unwind(payload);
        }
    }
}

/// A classed waiter's look at the clock, for controlled delay: now and
/// how long it has waited, in nanoseconds (now since the policy's origin).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) now: u64,
    pub(crate) waited: u64,
}

/// What [`Classes::drop_waiter`] did.
#[derive(Default)]
pub(crate) struct Dropped {
    pub(crate) displaced: bool,
    pub(crate) wake: Option<Waker>,
    pub(crate) idle: bool,
}

impl State {
    fn alloc(&mut self, class: usize) -> u32 {
        self.slots.alloc(class, Status::Waiting)
    }

    /// Frees `slot` (its waiter is done with it), dropping any waker.
    fn release_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        debug_assert!(s.status != Status::Free, "a slot freed twice");
        s.status = Status::Free;
        s.waker = None;
        self.slots.free(slot);
    }

    fn push_back(&mut self, slot: u32) {
        let class = self.slots[slot as usize].line;
        self.slots.push_back(&mut self.lines[class], slot);
    }

    fn unlink(&mut self, slot: u32) {
        let class = self.slots[slot as usize].line;
        self.slots.unlink(&mut self.lines[class], slot);
        if self.lines[class].0 == NONE {
            // The class's line is empty: its delay is zero.
            if let Some(delay) = self.delays.get_mut(class) {
                delay.emptied();
            }
        }
    }

    /// Whether a waiter of `class` that has waited `waited` ns is cut:
    /// its class's line stands, and it has waited the target.
    fn cuts(&self, class: usize, waited: u64) -> bool {
        self.delays
            .get(class)
            .is_some_and(|d| d.is_overloaded() && waited >= d.target())
    }

    /// A wait of `class` ended at `now` (served, or out of `max_wait`):
    /// a sample of its line; the one that finds the line standing returns
    /// the front waiter's waker, for it to look at its wait. The waiter
    /// left the line before its sample (when it was handed its seat, or
    /// gave up): if nobody is left behind it, the line is empty, which
    /// ends the overload at once, as on a line without classes.
    fn sample(&mut self, class: usize, now: Sample) -> Option<Waker> {
        let delay = self.delays.get_mut(class)?;
        if delay.sample(now.now, now.waited) != Change::Overloaded {
            return None;
        }
        if self.lines[class].0 == NONE {
            delay.emptied();
            return None;
        }
        self.front_to_look(class)
    }

    /// While `class`'s line stands: its front waiter's waker (taken; the
    /// waiter leaves a new one when it polls), for it to look at how long
    /// it has waited and be cut if past the target, waking the next.
    fn front_to_look(&mut self, class: usize) -> Option<Waker> {
        if !self.delays.get(class)?.is_overloaded() {
            return None;
        }
        let front = self.lines[class].0;
        if front == NONE {
            return None;
        }
        self.slots[front as usize].waker.take()
    }

    /// Hands a free seat, if any, to the waiter `Seats::pick` chooses:
    /// its waker.
    fn hand_out(&mut self) -> Option<Waker> {
        self.hand_out_one().flatten()
    }

    /// [`hand_out`](Self::hand_out) that tells "nobody served" (`None`)
    /// from "served, with no waker yet" (`Some(None)`).
    fn hand_out_one(&mut self) -> Option<Option<Waker>> {
        let class = self.seats.pick()?;
        // The oldest waiter of the class; with adaptive LIFO, while its
        // line stands, the newest.
        let (oldest, newest) = self.lines[class];
        let lifo = self.delays.get(class).is_some_and(QueueDelay::serve_newest);
        let slot = if lifo { newest } else { oldest };
        debug_assert!(slot != NONE, "Seats picked a class nobody waits in");
        self.unlink(slot);
        let s = &mut self.slots[slot as usize];
        s.status = Status::Granted;
        Some(s.waker.take())
    }
}
