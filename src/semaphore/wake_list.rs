//! A fixed-size batch of wakers, collected under a lock and woken after it
//! is released, so no waker (user code) ever runs inside a critical section.
//!
//! A waker may panic in `wake` or `drop`. The batch wakes every waker even
//! so, keeps the first panic, and hands it back with
//! [`resume_panic`](WakeList::resume_panic) once the semaphore has finished
//! its bookkeeping (the rest of the batch, the next batches): the caller
//! whose call ran the waker sees the panic, and no other waiter is left
//! unwoken.

use core::mem::{ManuallyDrop, MaybeUninit};
use core::task::Waker;
use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

/// How many wakers one batch holds before the lock is dropped to wake them.
const CAPACITY: usize = 32;

/// A stack-allocated list of up to [`CAPACITY`] wakers, and the first panic
/// one of them raised.
pub(crate) struct WakeList {
    /// Slots `..len` are initialised; the rest are not.
    wakers: [MaybeUninit<Waker>; CAPACITY],
    len: usize,
    /// The first panic caught by [`catch`](Self::catch), to be resumed by
    /// [`resume_panic`](Self::resume_panic). `ManuallyDrop` (and dropped by
    /// our `Drop`) so that the list has no drop glue beyond a check that
    /// inlines: it is on the contended release path.
    panic: ManuallyDrop<Option<Box<dyn Any + Send>>>,
}

impl WakeList {
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            wakers: [const { MaybeUninit::uninit() }; CAPACITY],
            len: 0,
            panic: ManuallyDrop::new(None),
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

    /// Wakes and empties the batch. Call it with no lock held. A waker that
    /// panics does not stop the others: see [`catch`](Self::catch).
    #[inline(always)]
    pub(crate) fn wake_all(&mut self) {
        // Take the count first, so that each slot is read exactly once.
        let len = core::mem::replace(&mut self.len, 0);
        for i in 0..len {
            // SAFETY: slots `..len` were initialised by `push`, and `len` was
            // reset above, so each slot is read exactly once.
            let waker = unsafe { self.wakers[i].assume_init_read() };
            self.catch(|| waker.wake());
        }
    }

    /// Runs `f`, user code such as a waker's `wake` or `drop`, with no lock
    /// held. If it panics, keeps the panic (the first one only: a later one
    /// is dropped) and returns `None`.
    #[inline]
    pub(crate) fn catch<R>(&mut self, f: impl FnOnce() -> R) -> Option<R> {
        match panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(out) => Some(out),
            Err(payload) => {
                self.panic.get_or_insert(payload);
                None
            }
        }
    }

    /// Resumes the first panic caught, if any. Call it once the bookkeeping
    /// the panic interrupted is done.
    ///
    /// If the thread is already unwinding (a permit or an acquire future
    /// dropped during a panic), the caught panic is dropped instead: a
    /// second one would abort the process, and the first is on its way to
    /// the caller anyway.
    #[inline]
    pub(crate) fn resume_panic(&mut self) {
        // By reference, and the resume out of line: the list is half a
        // kilobyte, and the common case is one load and a branch.
        if self.panic.is_some() {
            self.resume_panic_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn resume_panic_slow(&mut self) {
        if let Some(payload) = self.panic.take() {
            if !std::thread::panicking() {
                panic::resume_unwind(payload);
            }
        }
    }
}

/// Wakes one waker, with no lock held. A panic in it propagates, unless the
/// thread is already unwinding, where a second panic would abort the
/// process: it is then dropped, as in [`WakeList::resume_panic`].
#[inline(always)]
pub(crate) fn wake(waker: Waker) {
    if std::thread::panicking() {
        wake_unwinding(waker);
    } else {
        waker.wake();
    }
}

#[cold]
#[inline(never)]
fn wake_unwinding(waker: Waker) {
    let _ = panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
}

impl Drop for WakeList {
    #[inline(always)]
    fn drop(&mut self) {
        // Usually woken and resumed already: nothing left to drop.
        if self.len != 0 || self.panic.is_some() {
            self.drop_slow();
        }
    }
}

impl WakeList {
    /// Drops the wakers never woken and a panic never resumed.
    #[cold]
    #[inline(never)]
    fn drop_slow(&mut self) {
        // Take the count first, so that each slot is dropped exactly once
        // even if a waker's drop panics (the rest then leak).
        let len = core::mem::replace(&mut self.len, 0);
        for slot in &mut self.wakers[..len] {
            // SAFETY: slots `..len` were initialised by `push`, and `len`
            // was reset above, so each is dropped exactly once.
            unsafe { slot.assume_init_drop() };
        }
        drop(self.panic.take());
    }
}

impl core::fmt::Debug for WakeList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WakeList")
            .field("len", &self.len)
            .field("panicked", &self.panic.is_some())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    use crate::test_util::Count;

    #[test]
    fn wakes_each_once_and_drops_the_rest() {
        let count = Arc::new(Count::default());
        let mut list = WakeList::new();
        for _ in 0..CAPACITY {
            list.push(Waker::from(count.clone()));
        }
        assert!(!list.can_push());
        list.wake_all();
        assert_eq!(count.get(), CAPACITY);
        assert_eq!(Arc::strong_count(&count), 1, "every waker consumed");
        list.push(Waker::from(count.clone()));
        drop(list);
        assert_eq!(Arc::strong_count(&count), 1, "unwoken wakers dropped");
        assert_eq!(count.get(), CAPACITY);
    }

    struct Rude;
    impl Wake for Rude {
        fn wake(self: Arc<Self>) {
            panic!("rude waker");
        }
    }

    #[test]
    fn a_panicking_waker_does_not_stop_the_batch() {
        let count = Arc::new(Count::default());
        let mut list = WakeList::new();
        list.push(Waker::from(Arc::new(Rude)));
        list.push(Waker::from(count.clone()));
        list.push(Waker::from(Arc::new(Rude)));
        list.push(Waker::from(count.clone()));
        list.wake_all();
        assert_eq!(count.get(), 2, "the others are woken");
        assert_eq!(Arc::strong_count(&count), 1, "every waker consumed");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| list.resume_panic()));
        let payload = caught.expect_err("the first panic is resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"rude waker"));

        let mut quiet = WakeList::new();
        quiet.push(Waker::from(count.clone()));
        quiet.wake_all();
        quiet.resume_panic(); // nothing caught: returns
        assert_eq!(count.get(), 3);
    }
}
