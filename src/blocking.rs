//! A minimal `block_on` for the blocking acquire: polls the acquire future
//! on the calling thread and parks the thread between polls, so blocking and
//! async acquirers share one wait queue.

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Wake;
use std::thread::{self, Thread};

/// Wakes a parked thread.
struct Unparker {
    thread: Thread,
    /// Set by `wake`, cleared by the parked thread; `park` may wake
    /// spuriously, so this says whether the wake-up was real.
    notified: AtomicBool,
}

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notified.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Runs `fut` to completion on this thread.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let unparker = Arc::new(Unparker {
        thread: thread::current(),
        notified: AtomicBool::new(false),
    });
    let waker = Waker::from(unparker.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        while !unparker.notified.swap(false, Ordering::Acquire) {
            thread::park();
        }
    }
}
