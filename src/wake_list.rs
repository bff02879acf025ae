//! A fixed-size batch of wakers, collected under a lock and woken after it
//! is released, so no waker (user code) ever runs inside a critical section.

use core::mem::MaybeUninit;
use core::task::Waker;

/// How many wakers one batch holds before the lock is dropped to wake them.
const CAPACITY: usize = 32;

/// A stack-allocated list of up to [`CAPACITY`] wakers.
pub(crate) struct WakeList {
    /// Slots `..len` are initialised; the rest are not.
    wakers: [MaybeUninit<Waker>; CAPACITY],
    len: usize,
}

impl WakeList {
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            wakers: [const { MaybeUninit::uninit() }; CAPACITY],
            len: 0,
        }
    }

    /// Whether another waker fits.
    #[inline]
    pub(crate) fn can_push(&self) -> bool {
        self.len < CAPACITY
    }

    /// Adds a waker. The caller checks [`can_push`](Self::can_push) first.
    #[inline]
    pub(crate) fn push(&mut self, waker: Waker) {
        assert!(self.can_push(), "wake list must have room");
        self.wakers[self.len].write(waker);
        self.len += 1;
    }

    /// Wakes and empties the batch. Call it with no lock held.
    #[inline(always)]
    pub(crate) fn wake_all(&mut self) {
        // Take the count first: if a waker panics, the ones after it are
        // dropped by `Drop` instead of being read twice.
        let len = core::mem::replace(&mut self.len, 0);
        for i in 0..len {
            // SAFETY: slots `..len` were initialised by `push`, and `len` was
            // reset above, so each slot is read exactly once.
            let waker = unsafe { self.wakers[i].assume_init_read() };
            // If this panics, slots `i + 1..len` leak (a waker clone each);
            // they are never read again, so nothing is used twice.
            waker.wake();
        }
    }
}

impl Drop for WakeList {
    fn drop(&mut self) {
        for slot in &mut self.wakers[..self.len] {
            // SAFETY: slots `..len` are initialised and dropped only here.
            unsafe { slot.assume_init_drop() };
        }
    }
}

impl core::fmt::Debug for WakeList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WakeList").field("len", &self.len).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_each_once_and_drops_the_rest() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut list = WakeList::new();
        for _ in 0..CAPACITY {
            list.push(Waker::from(count.clone()));
        }
        assert!(!list.can_push());
        list.wake_all();
        assert_eq!(count.0.load(Ordering::SeqCst), CAPACITY);
        assert_eq!(Arc::strong_count(&count), 1, "every waker consumed");
        list.push(Waker::from(count.clone()));
        drop(list);
        assert_eq!(Arc::strong_count(&count), 1, "unwoken wakers dropped");
        assert_eq!(count.0.load(Ordering::SeqCst), CAPACITY);
    }
}
