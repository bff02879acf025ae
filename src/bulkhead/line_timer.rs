//! One timer for a bulkhead's whole waiting line, instead of one per
//! waiting caller.
//!
//! Every caller of a bulkhead waits for at most the same `max_wait`, and
//! its fair semaphore serves them in arrival order, so deadlines grow from
//! the front of the line to the back: the only deadline that can pass next
//! is the front waiter's. A waiter therefore reads the clock once, when it
//! starts waiting, and keeps its deadline; the line's one sleep is armed
//! for a deadline no later than the front waiter's. When it fires, the
//! front waiter's task is woken (without serving it,
//! `Semaphore::wake_front`): past its deadline, it is rejected and wakes
//! the waiter behind it, who looks at its own; otherwise it arms the sleep
//! for its deadline again. A waiter that is served costs a clock reading
//! and a load, where a sleep of its own costs a timer registration and a
//! deregistration (two locks of the runtime's timer, about 110 ns of a
//! 260 ns contended call on tokio).
//!
//! The invariant: while anyone waits, either the sleep is armed for a
//! deadline no later than the front waiter's, or the front waiter's task
//! has been woken to look. It holds because
//!
//! * a waiter that starts waiting, first in line, makes sure the sleep is
//!   armed no later than its own deadline (`ensure`), after it joined the
//!   line; one that joins behind others arms nothing (their deadlines
//!   come first, and the sleep or a pending look covers them);
//! * a waiter rejected at its deadline, once it has left the line, wakes
//!   the next one to look, whatever the sleep is armed for (`pass_on`): a
//!   waiter polled for another reason during a look may have armed it for
//!   a later deadline;
//! * the sleep that fires marks itself idle *before* it wakes the front
//!   waiter, under the semaphore's lock, so a waiter that joins after that
//!   sees it idle and arms it;
//! * a waiter that leaves the line (served, rejected, dropped) while the
//!   sleep is idle wakes the new front waiter (`pass_on`): it may have been
//!   the one woken to look.
//!
//! Only for clocks that can be read where the sleeps are made
//! ([`Clock::readable`]: the default, the timer thread, async-io); other
//! bulkheads give each waiter a sleep of its own.

use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};
use std::time::Instant;

use crate::Semaphore;
use crate::timer::{Clock, ClockSleep, TimerGone, poll_by_waker};

/// `armed_at` when no sleep is armed.
const IDLE: u64 = u64::MAX;

/// The line timer of one bulkhead. Dropping it disarms the sleep.
pub(crate) struct LineTimer {
    inner: Arc<Inner>,
}

struct Inner {
    sem: Arc<Semaphore>,
    clock: Clock,
    /// Deadlines are nanoseconds since this (std time, or tokio's).
    base: Instant,
    /// The deadline the sleep is armed for, or [`IDLE`]. Written with
    /// `slot` locked; read without.
    armed_at: AtomicU64,
    /// The sleep, pinned in its box for the bulkhead's life (allocated
    /// once, at build: a wait allocates nothing). Polled only by whoever
    /// holds this lock, and no other lock is taken meanwhile; no waker is
    /// woken with it held.
    slot: Mutex<Pin<Box<Option<ClockSleep>>>>,
    /// Set by a wake-up that found the slot locked (see `poll_by_waker`).
    again: AtomicBool,
    /// Set by a waiter that found its deadline passed, for its leaving the
    /// line ([`LineTimer::pass_on`]) to wake the next one.
    timed_out: AtomicBool,
}

impl LineTimer {
    /// A line timer for `sem`'s waiters on `clock`, if that clock can be
    /// read (see the [module notes](self)).
    pub(crate) fn new(sem: &Arc<Semaphore>, clock: &Clock) -> Option<Self> {
        if !clock.readable() || !sem.is_fair() {
            return None;
        }
        Some(Self {
            inner: Arc::new(Inner {
                sem: sem.clone(),
                clock: clock.clone(),
                base: clock.now(),
                armed_at: AtomicU64::new(IDLE),
                slot: Mutex::new(Box::pin(None)),
                again: AtomicBool::new(false),
                timed_out: AtomicBool::new(false),
            }),
        })
    }

    /// A waiter still waits (its acquire is pending, and it is in line):
    /// sets its deadline, `limit` from now, the first time; returns whether
    /// it has passed, after making sure the sleep will wake the front of
    /// the line by then. `Err` if the timer cannot run here (its runtime is
    /// gone, or has no time driver).
    #[inline]
    pub(crate) fn expired(&self, deadline: &mut u64, limit: Duration) -> Result<bool, TimerGone> {
        let now = self.inner.now();
        if *deadline == 0 {
            let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
            // Never 0 (unset) nor IDLE.
            *deadline = now.saturating_add(limit).clamp(1, IDLE - 1);
            if self.inner.joined_behind() {
                return Ok(false);
            }
        } else if now >= *deadline {
            self.inner.timed_out.store(true, Ordering::Relaxed);
            return Ok(true);
        }
        self.inner.ensure(*deadline, now)?;
        Ok(false)
    }

    /// [`expired`](Self::expired) for a line under controlled delay: while
    /// it stands (`cut` is the target), a waiter's deadline is its arrival
    /// plus the target, if that comes first. Every waiter's deadline moves
    /// by the same amount, so they stay in arrival order; when the line
    /// starts to stand they move earlier at once, and the policy calls
    /// [`restart`](Self::restart).
    #[inline]
    pub(crate) fn expired_by(
        &self,
        deadline: &mut u64,
        limit: Duration,
        cut: Option<Duration>,
    ) -> Result<bool, TimerGone> {
        let now = self.inner.now();
        let joined = *deadline == 0;
        if joined {
            let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
            *deadline = now.saturating_add(limit).clamp(1, IDLE - 1);
        }
        let due = match cut {
            Some(cut) if cut < limit => {
                let earlier = u64::try_from((limit - cut).as_nanos()).unwrap_or(u64::MAX);
                deadline.saturating_sub(earlier).max(1)
            }
            _ => *deadline,
        };
        if now >= due {
            self.inner.timed_out.store(true, Ordering::Relaxed);
            return Ok(true);
        }
        if joined && self.inner.joined_behind() {
            return Ok(false);
        }
        self.inner.ensure(due, now)?;
        Ok(false)
    }

    /// The line's deadlines just moved earlier (controlled delay found it
    /// standing): disarms the sleep and wakes the front waiter, as a sleep
    /// that fires does. The front waiter looks at its new deadline, is
    /// rejected and passes the look on if it has passed, or arms the
    /// sleep for it.
    pub(crate) fn restart(&self) {
        let mut slot = self
            .inner
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A bundled timer's sleep (this timer runs on no other): dropping
        // it under the lock runs no user code.
        slot.as_mut().set(None);
        self.inner.armed_at.store(IDLE, Ordering::SeqCst);
        drop(slot);
        self.inner.sem.wake_front();
    }

    /// A waiter left the line (served, rejected or dropped, its acquire
    /// gone): if the sleep is idle, it may have been the one woken to look
    /// at its deadline, so the new front waiter looks.
    ///
    /// After a waiter was rejected at its deadline, the new front waiter
    /// looks whatever the sleep is armed for (`timed_out`): its deadline
    /// may have passed too, and a waiter polled for another reason while
    /// the front one was looking may have armed the sleep for its own,
    /// later deadline; the chain of looks puts the sleep back at the
    /// front's. A served waiter pays one load for it.
    #[inline]
    pub(crate) fn pass_on(&self) {
        let inner = &*self.inner;
        let timed_out = inner.timed_out.load(Ordering::Relaxed)
            && inner.timed_out.swap(false, Ordering::Relaxed);
        if (timed_out || inner.armed_at.load(Ordering::SeqCst) == IDLE)
            && inner.sem.queue_len() != 0
        {
            inner.sem.wake_front();
        }
    }
}

impl Drop for LineTimer {
    fn drop(&mut self) {
        // The armed sleep holds a waker of `inner`: drop it, so that the two
        // do not keep each other alive. A bundled timer's sleep: no user
        // code runs under the lock.
        self.inner
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .set(None);
    }
}

impl Inner {
    #[inline]
    fn now(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.base);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    /// A waiter that has just joined the line has others ahead of it:
    /// their deadlines are no later than its own, so the sleep armed for
    /// them, or the look the front one was woken for, covers it too. It
    /// must not arm the sleep itself: with the front waiter woken to look
    /// (the sleep idle), it would arm it for its own, later deadline, and
    /// the waiters between would be looked at only then.
    #[inline]
    fn joined_behind(&self) -> bool {
        self.sem.queue_len() > 1
    }

    /// Makes sure the sleep fires no later than `deadline` (`now` is the
    /// clock's reading a moment ago).
    #[inline]
    fn ensure(self: &Arc<Self>, deadline: u64, now: u64) -> Result<(), TimerGone> {
        if self.armed_at.load(Ordering::SeqCst) <= deadline {
            return Ok(());
        }
        self.arm(deadline, now)
    }

    #[cold]
    fn arm(self: &Arc<Self>, deadline: u64, now: u64) -> Result<(), TimerGone> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if self.armed_at.load(Ordering::SeqCst) <= deadline {
            return Ok(());
        }
        let sleep = self
            .clock
            .sleep(Duration::from_nanos(deadline.saturating_sub(now)))?;
        slot.as_mut().set(Some(sleep));
        self.armed_at.store(deadline, Ordering::SeqCst);
        drop(slot);
        // The first poll registers the sleep; one that is done already
        // wakes the front of the line at once.
        self.poll_sleep();
        Ok(())
    }

    /// Polls the sleep; once it fires (or its timer stops working), marks
    /// the line idle and wakes the front waiter, with no lock held.
    fn poll_sleep(self: &Arc<Self>) {
        let ended = poll_by_waker(&self.slot, &self.again, |slot| {
            let sleep = slot.as_mut().as_pin_mut()?;
            let waker = Waker::from(self.clone());
            let polled = catch_unwind(AssertUnwindSafe(|| {
                sleep.poll_sleep(&mut Context::from_waker(&waker))
            }));
            if let Ok(Poll::Pending) = polled {
                return None;
            }
            // Fired, or the timer is gone (or panicked). A bundled timer's
            // sleep, done: dropping it here runs no user code.
            slot.as_mut().set(None);
            self.armed_at.store(IDLE, Ordering::SeqCst);
            Some(())
        });
        if ended.is_some() {
            // The front waiter looks at its deadline, and re-arms the
            // sleep or finds it cannot.
            self.sem.wake_front();
        }
    }
}

impl Wake for Inner {
    fn wake(self: Arc<Self>) {
        self.poll_sleep();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.poll_sleep();
    }
}
