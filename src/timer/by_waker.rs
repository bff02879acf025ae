//! A sleep polled by a waker of its own rather than by a task: the leak
//! watch's (one per watched permit) and the line timer's (one per
//! bulkhead). Its owner keeps it in a mutex and polls it from its waker,
//! which the timer calls from whatever thread fires it, perhaps from
//! inside the very poll that registered it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, TryLockError};

/// Runs `poll` on `slot` unless someone is already at it, in which case
/// they run it again when they are done: a wake-up that arrives while the
/// sleep is being polled (a timer that wakes from inside its poll) sets
/// `again` and returns at once, so a waker never blocks on its own lock.
/// `poll` returns `Some` once the sleep has completed (and then it empties
/// the slot), `None` while it is pending or the slot is empty; whatever
/// it returns is handed back with the lock released, for the caller to act
/// on (drop the sleep, tell an observer, wake a task) with no lock held.
pub(crate) fn poll_by_waker<S, T>(
    slot: &Mutex<S>,
    again: &AtomicBool,
    mut poll: impl FnMut(&mut S) -> Option<T>,
) -> Option<T> {
    loop {
        let mut guard = match slot.try_lock() {
            Ok(guard) => guard,
            // Nothing panics with the lock held (the sleep's poll is under
            // `catch_unwind`), but a poisoned slot must not stop the timer.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                again.store(true, Ordering::Release);
                return None;
            }
        };
        again.store(false, Ordering::Release);
        let out = poll(&mut guard);
        drop(guard);
        if out.is_some() {
            return out;
        }
        if !again.swap(false, Ordering::AcqRel) {
            return None;
        }
    }
}
