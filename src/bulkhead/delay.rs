//! Controlled delay on one bulkhead's waiting line (`queue_delay`): the
//! clock-free [`QueueDelay`] of `src/overload/`, under a lock, with its
//! "overloaded" flag readable without one.
//!
//! The policy feeds it the wait of every waiter that leaves the line
//! served, or rejected when `max_wait` ran out, and tells it when the line
//! empties. While it says the line is overloaded, a waiter that has waited
//! the target or more is rejected ([`RejectReason::QueueDelay`]), and a
//! newcomer may wait the target at most. The moment the line becomes
//! overloaded, the waiters already past the target must hear of it:
//!
//! * with the line timer, the policy restarts it (`LineTimer::restart`):
//!   every deadline is now the waiter's arrival plus the target, still in
//!   arrival order, so the front waiter is woken, is cut if past its new
//!   deadline, and passes the look on as a timeout would;
//! * with a sleep per waiter (a timer whose clock cannot be read), the
//!   front waiter is woken ([`wake_front`](LineDelay::wake_front)); each
//!   waiter cut while the line is overloaded wakes the next one when it
//!   leaves, and the first that is not past the target stops the chain:
//!   its own sleep is armed for the target already (a waiter's first
//!   sleep is for the target when controlled delay is on, and at the
//!   target it is cut if the line is overloaded, else sleeps on for what
//!   is left of `max_wait`).
//!
//! With adaptive LIFO the line also switches the semaphore to serving its
//! newest waiter first ([`Semaphore::set_serve_newest`]) the moment it
//! becomes overloaded, and back to arrival order when it empties: both
//! under the state's lock, so the switch follows the state machine's own
//! order of events. The semaphore's list keeps arrival order either way,
//! so the front waiter is still the oldest, whose deadline (with the line
//! timer) passes first, and the two chains above are unchanged.
//!
//! [`RejectReason::QueueDelay`]: crate::RejectReason::QueueDelay

use core::fmt;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::error::nanos;
use crate::Semaphore;
use crate::overload::{Change, QueueDelay};

/// The controlled delay of a bulkhead's line (see the [module notes](self)).
pub(crate) struct LineDelay {
    /// Locked only by waiters that leave the line (a sample) or find it
    /// empty; never while a waker or any user code runs.
    state: Mutex<QueueDelay>,
    /// `state.is_overloaded()`, for the waiters' lock-free reads.
    overloaded: AtomicBool,
    target: Duration,
    interval: Duration,
    /// The semaphore whose waiters are the line, to wake its front waiter
    /// and (adaptive LIFO) switch its order (set by `Policy::delay_line`;
    /// `None` before).
    sem: Option<Arc<Semaphore>>,
    /// Adaptive LIFO: serve the newest waiter first while overloaded.
    lifo: bool,
}

impl LineDelay {
    pub(crate) fn new(target: Duration, interval: Duration, lifo: bool) -> Self {
        Self {
            state: Mutex::new(QueueDelay::new(nanos(target), nanos(interval)).adaptive_lifo(lifo)),
            overloaded: AtomicBool::new(false),
            target,
            interval,
            sem: None,
            lifo,
        }
    }

    /// The semaphore whose waiters are the line.
    pub(crate) fn set_line(&mut self, sem: &Arc<Semaphore>) {
        self.sem = Some(sem.clone());
    }

    /// The target wait.
    #[inline]
    pub(crate) fn target(&self) -> Duration {
        self.target
    }

    /// The target, while the line is overloaded: what a waiter may wait
    /// in all then.
    #[inline]
    pub(crate) fn cut(&self) -> Option<Duration> {
        self.overloaded
            .load(Ordering::Acquire)
            .then_some(self.target)
    }

    /// A waiter left the line at `now` (ns since any fixed origin) after
    /// waiting `waited` ns, served or out of `max_wait`: returns whether
    /// the line has just become overloaded.
    pub(crate) fn sample(&self, now: u64, waited: u64) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let change = state.sample(now, waited);
        if change == Change::Overloaded {
            self.overloaded.store(true, Ordering::Release);
            self.serve_newest(&state);
        }
        change == Change::Overloaded
    }

    /// The line is empty: an overload ends, and so does a run of long
    /// waits.
    pub(crate) fn emptied(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.emptied();
        self.overloaded.store(false, Ordering::Release);
        self.serve_newest(&state);
    }

    /// Adaptive LIFO: sets the line's order to what `state` says (the
    /// newest first while overloaded). With `state`'s lock held: one
    /// atomic store, no user code.
    #[inline]
    fn serve_newest(&self, state: &QueueDelay) {
        if let Some(sem) = self.sem.as_ref().filter(|_| self.lifo) {
            sem.set_serve_newest(state.serve_newest());
        }
    }

    /// Adaptive LIFO on a line with no semaphore of its own (a leased
    /// bulkhead's): whether the newest waiter is served first now.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    #[inline]
    pub(crate) fn serves_newest(&self) -> bool {
        self.lifo && self.overloaded.load(Ordering::Acquire)
    }

    /// Wakes the front waiter to look at its wait (see the
    /// [module notes](self)).
    #[inline]
    pub(crate) fn wake_front(&self) {
        if let Some(sem) = &self.sem {
            sem.wake_front();
        }
    }
}

impl fmt::Debug for LineDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LineDelay")
            .field("target", &self.target)
            .field("interval", &self.interval)
            .field("overloaded", &self.overloaded.load(Ordering::Relaxed))
            .field("adaptive_lifo", &self.lifo)
            .finish()
    }
}
