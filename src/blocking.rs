//! A minimal `block_on` for the blocking acquire: polls the acquire future
//! on the calling thread and parks the thread between polls, so blocking and
//! async acquirers share one wait queue.
//!
//! The parking is `parking`'s (event-listener's own dependency, so it costs
//! nothing extra): its `Parker` keeps a token, so a wake-up that lands
//! between a pending poll and `park` is not lost, and `park` returns only
//! after a wake-up, never spuriously nor on a stray `Thread::unpark`.

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};

/// Runs `fut` to completion on this thread.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let (parker, unparker) = parking::pair();
    // One allocation, the parker's shared state, which the waker points to.
    let waker = Waker::from(unparker);
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        parker.park();
    }
}
