//! A minimal `block_on` for the blocking acquire and the blocking call:
//! polls the future on the calling thread and parks the thread between
//! polls, so blocking and async callers share one wait queue.
//!
//! The parking is `parking`'s (event-listener's own dependency, so it costs
//! nothing extra): its `Parker` keeps a token, so a wake-up that lands
//! between a pending poll and `park` is not lost, and `park` returns only
//! after a wake-up, never spuriously nor on a stray `Thread::unpark`.
//!
//! Each thread keeps one parker and the waker that unparks it, made on its
//! first blocking wait (the one allocation, the parker's shared state) and
//! reused by every later one, so a blocking wait allocates nothing after
//! the first. A token left by a wake-up that came after its wait had ended
//! only makes the next wait poll once more. A wait that starts while the
//! thread's parker is in use (user code polled inside a blocking wait, a
//! timer say, that blocks in turn) or while the thread's locals are being
//! torn down makes a parker of its own.

use core::cell::RefCell;
use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};

use parking::Parker;

thread_local! {
    /// This thread's parker and its waker, once made.
    static PARKER: RefCell<Option<(Parker, Waker)>> = const { RefCell::new(None) };
}

/// A parker and the waker that unparks it.
fn pair() -> (Parker, Waker) {
    let (parker, unparker) = parking::pair();
    (parker, Waker::from(unparker))
}

/// Runs `fut` to completion on this thread.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = Some(fut);
    let reused = PARKER.try_with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        let (parker, waker) = slot.get_or_insert_with(pair);
        let fut = fut.take().expect("not run yet");
        Some(run(fut, parker, waker))
    });
    match reused {
        Ok(Some(out)) => out,
        // In use, or the thread's locals are gone: a parker of its own.
        _ => {
            let (parker, waker) = pair();
            run(fut.take().expect("not run yet"), &parker, &waker)
        }
    }
}

/// Polls `fut` with `waker`, parking on `parker` while it is pending.
fn run<F: Future>(fut: F, parker: &Parker, waker: &Waker) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        parker.park();
    }
}

#[cfg(test)]
mod tests {
    use super::block_on;
    use core::future::poll_fn;
    use core::task::Poll;

    /// A blocking wait inside another one (user code polled by the outer
    /// wait that blocks in turn) gets a parker of its own, and both end.
    #[test]
    fn a_wait_inside_a_wait_gets_its_own_parker() {
        let outer = block_on(async { block_on(async { 2 }) + 1 });
        assert_eq!(outer, 3);
        // The thread's parker is free again afterwards.
        assert_eq!(block_on(async { 4 }), 4);
    }

    /// A future woken from another thread after it parked ends, again and
    /// again on the same parker; a wake-up left over from a finished wait
    /// only costs the next one an extra poll.
    #[test]
    fn wakeups_from_another_thread_end_each_wait() {
        for _ in 0..if cfg!(miri) { 3 } else { 100 } {
            let mut polls = 0;
            let out = block_on(poll_fn(|cx| {
                polls += 1;
                if polls == 1 {
                    let waker = cx.waker().clone();
                    std::thread::spawn(move || {
                        waker.wake_by_ref();
                        // A second, stray wake-up, after the wait may have
                        // ended.
                        waker.wake();
                    });
                    Poll::Pending
                } else {
                    Poll::Ready(polls)
                }
            }));
            assert!(out >= 2);
        }
    }
}
