//! Model checks of the semaphore's lock-free paths with loom.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom
//! ```
#![cfg(loom)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use loom::future::block_on;
use loom::thread;
use watertight::Semaphore;

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// The end of a model whose line has emptied: no waiter left, `permits`
/// in the balance, and `WAITERS` clear, which a fair `try_acquire` shows by
/// succeeding (it refuses while the flag is set). With no permit left, the
/// missing ones are added first, to look.
fn assert_idle(sem: &Semaphore, permits: isize) {
    assert_eq!(sem.queue_len(), 0);
    assert_eq!(sem.available_permits(), permits);
    if permits < 1 {
        sem.add_permits((1 - permits) as usize);
    }
    drop(
        sem.try_acquire()
            .expect("WAITERS is clear once the line is empty"),
    );
}

/// A permit added by one thread reaches a thread waiting for it.
#[test]
fn release_racing_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let waiter = thread::spawn(move || {
            let permit = block_on(s.acquire()).unwrap();
            assert_eq!(permit.num_permits(), 1);
        });
        sem.add_permits(1);
        waiter.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// A dropped permit reaches the lone waiter queueing for it, whether the
/// drop comes before, during or after the queueing (a waiter that finds the
/// balance empty as it publishes `WAITERS` leaves the hand-off to the
/// release, which then hands to a line of one and clears `WAITERS`), and the
/// line is empty afterwards: a newcomer takes the permit without the lock.
#[test]
fn a_dropped_permit_reaches_a_lone_waiter() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.try_acquire().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || {
            let permit = block_on(s.acquire()).unwrap();
            assert_eq!(permit.num_permits(), 1);
        });
        drop(held);
        waiter.join().unwrap();
        assert_idle(&sem, 1);
    });
}

/// A lone waiter queueing while a held permit is dropped and add_permits
/// adds one: the waiter is served, one permit is left, WAITERS is clear.
#[test]
fn lone_waiter_release_and_add_permits() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).unwrap().forget());
        let s = sem.clone();
        let adder = thread::spawn(move || s.add_permits(1));
        drop(held);
        adder.join().unwrap();
        waiter.join().unwrap();
        assert_idle(&sem, 1);
    });
}

/// A lone waiter queueing while reduce_permits opens a deficit and the
/// held permit comes back: afterwards one add_permits serves the waiter if
/// it still waits; the balance is exact and WAITERS clear.
#[test]
fn lone_waiter_reduce_and_release() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let mut fut = Box::pin(sem.clone().acquire_owned());
        let s = sem.clone();
        let releaser = thread::spawn(move || drop(held));
        let reducer = thread::spawn({
            let s = sem.clone();
            move || s.reduce_permits(1)
        });
        let first = poll_once(fut.as_mut());
        releaser.join().unwrap();
        reducer.join().unwrap();
        let got = match first {
            Poll::Ready(p) => Some(p.unwrap()),
            Poll::Pending => match poll_once(fut.as_mut()) {
                Poll::Ready(p) => Some(p.unwrap()),
                Poll::Pending => None,
            },
        };
        match got {
            Some(p) => {
                // Served before the reduce: balance -1 while held.
                assert_eq!(s.available_permits(), -1);
                p.forget();
            }
            None => {
                assert_eq!(s.available_permits(), 0);
                s.add_permits(1);
                let Poll::Ready(p) = poll_once(fut.as_mut()) else {
                    panic!("the lone waiter was stranded");
                };
                p.unwrap().forget();
            }
        }
        // The balance was checked in each branch.
        assert_idle(&s, s.available_permits());
    });
}

/// A lone waiter that was granted by a release (and WAITERS cleared) is
/// dropped unpolled while a second waiter queues: the permit reaches the
/// second waiter or the balance.
#[test]
fn granted_lone_waiter_dropped_while_another_queues() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let mut first = Box::pin(sem.clone().acquire_owned());
        assert!(poll_once(first.as_mut()).is_pending());
        let releaser = thread::spawn(move || drop(held));
        let s = sem.clone();
        let second = thread::spawn(move || block_on(s.acquire()).unwrap().forget());
        let leaver = thread::spawn(move || drop(first));
        releaser.join().unwrap();
        leaver.join().unwrap();
        second.join().unwrap();
        assert_idle(&sem, 0);
    });
}

/// close racing a lone waiter's queueing and a release.
#[test]
fn lone_waiter_close_and_release() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).map(|p| p.forget()).is_ok());
        let releaser = thread::spawn(move || drop(held));
        sem.close();
        releaser.join().unwrap();
        let ok = waiter.join().unwrap();
        assert_eq!(sem.queue_len(), 0);
        assert_eq!(sem.available_permits(), if ok { 0 } else { 1 });
    });
}

/// The JDK 6u17 regression: two acquirers and two releasers on a semaphore
/// with no permits; both acquirers must finish.
#[test]
fn two_acquirers_two_releasers() {
    racing_releases(Semaphore::new);
}

/// Two threads acquire one permit each from `make(0)` while two others add
/// one permit each.
fn racing_releases(make: fn(usize) -> Semaphore) {
    loom::model(move || {
        let sem = Arc::new(make(0));
        let acquirers: Vec<_> = (0..2)
            .map(|_| {
                let s = sem.clone();
                thread::spawn(move || block_on(s.acquire()).unwrap().forget())
            })
            .collect();
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(1));
        sem.add_permits(1);
        releaser.join().unwrap();
        for a in acquirers {
            a.join().unwrap();
        }
        assert_eq!(sem.available_permits(), 0);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// A queued acquire dropped while a permit is being handed to it passes the
/// permit back: nothing is lost or counted twice.
#[test]
fn drop_queued_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let t = thread::spawn(move || {
            let mut fut = pin!(s.acquire());
            if let Poll::Ready(permit) = poll_once(fut.as_mut()) {
                drop(permit.unwrap());
            }
            // `fut` is dropped here: queued, or served but not yet returned.
        });
        sem.add_permits(1);
        t.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// A queued acquire behind the head, dropped while a release serves the
/// head: it leaves by the short path (not the head, handed nothing: no
/// distribution pass), or, if the head was served first, as the new head
/// of a line it empties. Either way the head gets the permit, and the line
/// and the balance are whole.
#[test]
fn drop_queued_acquire_behind_the_head() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let mut head = Box::pin(sem.acquire());
        assert!(poll_once(head.as_mut()).is_pending(), "no permit is free");
        let s = sem.clone();
        let behind = thread::spawn(move || {
            let mut fut = pin!(s.acquire());
            // The one permit is the head's, whenever it comes.
            assert!(poll_once(fut.as_mut()).is_pending());
            // `fut` is dropped here, queued.
        });
        sem.add_permits(1);
        behind.join().unwrap();
        let Poll::Ready(permit) = poll_once(head.as_mut()) else {
            panic!("the head was not served");
        };
        drop(permit.unwrap());
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// A half-served acquire (fair mode: the head collects permits in parts)
/// dropped while another waiter queues behind it: its permits go on to the
/// next waiter.
#[test]
fn drop_half_served_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let s = sem.clone();
        let big = thread::spawn(move || {
            let mut fut = pin!(s.acquire_many(2));
            let first = poll_once(fut.as_mut());
            assert!(first.is_pending(), "only one permit exists");
            // Dropped half-served: it holds the one permit.
        });
        let s = sem.clone();
        let small = thread::spawn(move || {
            drop(block_on(s.acquire()).unwrap());
        });
        big.join().unwrap();
        small.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Closing wakes a waiter (it fails) or the waiter got in first (it
/// succeeds); either way it finishes and the balance is whole.
#[test]
fn close_racing_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).map(|p| p.num_permits()));
        let s = sem.clone();
        let releaser = thread::spawn(move || s.add_permits(1));
        sem.close();
        releaser.join().unwrap();
        let got = waiter.join().unwrap();
        assert!(matches!(got, Ok(1) | Err(_)));
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
        assert!(sem.try_acquire().is_err());
    });
}

/// `reduce_permits` racing the return of a held permit and a waiter: the
/// final balance is exact, and the waiter is served once the deficit is
/// repaid.
#[test]
fn reduce_racing_release() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(2));
        let held = sem.clone().try_acquire_many_owned(2).unwrap();
        let s = sem.clone();
        let releaser = thread::spawn(move || drop(held));
        let s2 = sem.clone();
        let waiter = thread::spawn(move || block_on(s2.acquire()).unwrap().forget());
        s.reduce_permits(1);
        releaser.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(sem.available_permits(), 0);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Fair mode: `add_permits` (which hands a permit straight to a head owed
/// exactly that, under the lock, as a release does) racing a permit's drop
/// and the cancellation of the second waiter: the head is served, and the
/// second permit reaches the second waiter or, once it has left, the
/// balance; nothing is lost or counted twice.
#[test]
fn add_permits_and_a_release_race_to_two_waiters() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let mut first = Box::pin(sem.clone().acquire_owned());
        assert!(poll_once(first.as_mut()).is_pending(), "no permit is free");
        let mut second = Box::pin(sem.clone().acquire_owned());
        assert!(poll_once(second.as_mut()).is_pending(), "no permit is free");
        let s = sem.clone();
        let adder = thread::spawn(move || s.add_permits(1));
        let releaser = thread::spawn(move || drop(held));
        // Dropped queued, or served but not yet polled.
        let leaver = thread::spawn(move || drop(second));
        adder.join().unwrap();
        releaser.join().unwrap();
        leaver.join().unwrap();
        let Poll::Ready(permit) = poll_once(first.as_mut()) else {
            panic!("the head was not served");
        };
        drop(permit.unwrap());
        assert_eq!(sem.available_permits(), 2);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Fair mode: `add_permits` racing `reduce_permits` while two waiters
/// queue. The permit goes straight to the head only if there is no
/// deficit to repay; either way the balance is exact, and both waiters are
/// served once two more permits come.
#[test]
fn add_permits_racing_reduce_with_two_waiters() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let mut first = Box::pin(sem.clone().acquire_owned());
        assert!(poll_once(first.as_mut()).is_pending(), "no permit is free");
        let mut second = Box::pin(sem.clone().acquire_owned());
        assert!(poll_once(second.as_mut()).is_pending(), "no permit is free");
        let s = sem.clone();
        let adder = thread::spawn(move || s.add_permits(1));
        sem.reduce_permits(1);
        adder.join().unwrap();
        // The head served with a deficit of one left, or nobody served and
        // no deficit.
        let served = sem.queue_len() == 1;
        assert_eq!(sem.available_permits(), if served { -1 } else { 0 });
        sem.add_permits(2);
        for fut in [&mut first, &mut second] {
            let Poll::Ready(permit) = poll_once(fut.as_mut()) else {
                panic!("a waiter was not served");
            };
            drop(permit.unwrap());
        }
        assert_eq!(sem.available_permits(), 2);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Unfair mode: a barging `try_acquire` may take the permit ahead of a
/// waiter, but the waiter is still woken once it comes back.
#[test]
fn unfair_barging_never_loses_a_waiter() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new_unfair(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).unwrap().num_permits());
        let s = sem.clone();
        let barger = thread::spawn(move || {
            if let Ok(p) = s.try_acquire() {
                drop(p);
            }
        });
        drop(held);
        barger.join().unwrap();
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// What a holder writes before dropping its permit is visible to the next
/// holder (loom's `UnsafeCell` reports any unsynchronised access).
#[test]
fn release_happens_before_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let data = Arc::new(loom::cell::UnsafeCell::new(0usize));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (sem, data) = (sem.clone(), data.clone());
                thread::spawn(move || {
                    let _permit = block_on(sem.acquire()).unwrap();
                    // SAFETY: the semaphore has one permit, so this is the
                    // only thread touching `data` now.
                    data.with_mut(|p| unsafe { *p += 1 });
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let _permit = sem.try_acquire().unwrap();
        // SAFETY: both writers have finished and returned their permits.
        assert_eq!(data.with(|p| unsafe { *p }), 2);
    });
}

/// Unfair mode, the JDK 6u17 regression: two acquirers and two releasers on
/// a semaphore with no permits. A release wakes a waiter without handing it
/// anything, and a woken waiter lowers the count of promised permits without
/// the lock: neither may leave a permit in the balance with nobody woken.
#[test]
fn unfair_two_acquirers_two_releasers() {
    racing_releases(Semaphore::new_unfair);
}

/// Unfair mode: a waiter woken by a release but dropped before it runs
/// passes the wake-up on to the next waiter.
#[test]
fn unfair_dropped_woken_waiter_passes_the_wake_up_on() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new_unfair(0));
        let s = sem.clone();
        let quitter = thread::spawn(move || {
            let mut fut = pin!(s.acquire());
            if let Poll::Ready(permit) = poll_once(fut.as_mut()) {
                drop(permit.unwrap());
            }
            // Dropped: queued, or woken but not yet run.
        });
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).unwrap().forget());
        sem.add_permits(1);
        quitter.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(sem.available_permits(), 0);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Unfair mode: the holder gives its permit back and takes it again at once
/// (barging past the waiter it just woke), then gives it back for good; the
/// woken waiter, back at the front of the line after losing the race, still
/// gets it.
#[test]
fn unfair_holder_retakes_its_permit_ahead_of_the_woken_waiter() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new_unfair(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).unwrap().num_permits());
        drop(held);
        if let Ok(again) = sem.try_acquire() {
            drop(again);
        }
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Unfair mode: a release to a lone waiter marks it notified and clears
/// `WAITERS` in the same critical section (`notify_head_alone`, the common
/// unfair hand-off with two tasks); a newcomer queueing meanwhile may take
/// the permit first, and the notified waiter, back at the front after
/// losing, is woken by the newcomer's release. Both acquires complete, the
/// line is empty and the permit is back in the balance.
#[test]
fn unfair_lone_waiter_notified_while_a_newcomer_queues() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new_unfair(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire()).unwrap().num_permits());
        let s = sem.clone();
        let newcomer = thread::spawn(move || block_on(s.acquire()).unwrap().num_permits());
        drop(held);
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!(newcomer.join().unwrap(), 1);
        assert_idle(&sem, 1);
    });
}

/// Fair mode: two permits returned at once by two threads go straight to a
/// waiter for both, in two parts, without passing through the balance.
#[test]
fn releases_hand_off_in_parts_to_one_waiter() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(2));
        let one = sem.clone().try_acquire_owned().unwrap();
        let two = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let waiter = thread::spawn(move || block_on(s.acquire_many(2)).unwrap().num_permits());
        let releaser = thread::spawn(move || drop(one));
        drop(two);
        releaser.join().unwrap();
        assert_eq!(waiter.join().unwrap(), 2);
        assert_eq!(sem.available_permits(), 2);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Fair mode: a permit dropped while two waiters queue goes to the first,
/// which is owed exactly that permit while the other still waits (the
/// release's one-waker path); the first passes it on when it is done.
#[test]
fn release_to_the_head_of_two_waiters() {
    release_to_two_waiters(Semaphore::new, false);
}

/// Unfair mode: as above, while the releasing thread tries to take the
/// permit back at once (barging): the release wakes the head alone, the
/// spare balance being exactly its request, and whoever wins, both waiters
/// finish and nothing is lost.
#[test]
fn unfair_release_to_the_head_of_two_waiters() {
    release_to_two_waiters(Semaphore::new_unfair, true);
}

/// Two threads wait for one permit each on `make(1)` while the main thread
/// holds it; then the main thread returns it and, if `barge`, tries to take
/// it back at once.
fn release_to_two_waiters(make: fn(usize) -> Semaphore, barge: bool) {
    loom::model(move || {
        let sem = Arc::new(make(1));
        let held = sem.clone().try_acquire_owned().unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let s = sem.clone();
                thread::spawn(move || block_on(s.acquire()).unwrap().num_permits())
            })
            .collect();
        drop(held);
        if barge {
            if let Ok(again) = sem.try_acquire() {
                drop(again);
            }
        }
        for w in waiters {
            assert_eq!(w.join().unwrap(), 1);
        }
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// A waker whose clones panic when dropped (the waker itself, a static
/// without a count, does not), standing for user code that panics.
fn drop_panicking_waker() -> Waker {
    use std::task::{RawWaker, RawWakerVTable};
    static ORIGINAL: u8 = 0;
    static CLONE: u8 = 0;
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, no_op, no_op, drop);
    fn raw(data: &'static u8) -> RawWaker {
        RawWaker::new(core::ptr::from_ref(data).cast(), &VTABLE)
    }
    unsafe fn clone(_: *const ()) -> RawWaker {
        raw(&CLONE)
    }
    unsafe fn no_op(_: *const ()) {}
    unsafe fn drop(data: *const ()) {
        if core::ptr::eq(data, core::ptr::from_ref(&CLONE).cast()) {
            panic!("rogue waker: drop");
        }
    }
    // SAFETY: the vtable's functions touch no data and are thread-safe.
    unsafe { Waker::from_raw(raw(&ORIGINAL)) }
}

/// Keeps the expected "rogue waker" panics out of the output of every
/// explored execution; any other panic is reported as usual.
fn quiet_rogues() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let rogue = info
                .payload()
                .downcast_ref::<&str>()
                .is_some_and(|m| m.starts_with("rogue waker"));
            if !rogue {
                report(info);
            }
        }));
    });
}

/// Unfair mode: an acquire whose waker's drop panics queues while a permit
/// comes back. Wherever the permit lands (before the first try, before the
/// try under the lock, or after the node is linked, where the acquire,
/// alone in line, takes it itself and drops its stored waker), a panic
/// loses nothing: the future owns the permit until it is dropped, and the
/// line stays whole.
#[test]
fn unfair_waker_drop_panics_while_the_acquire_queues() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    quiet_rogues();
    loom::model(|| {
        let sem = Arc::new(Semaphore::new_unfair(0));
        let s = sem.clone();
        let t = thread::spawn(move || {
            let waker = drop_panicking_waker();
            let mut fut = Box::pin(s.acquire());
            let mut cx = Context::from_waker(&waker);
            let first = catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)));
            if let Ok(Poll::Ready(permit)) = first {
                drop(permit.unwrap());
            }
            // Queued, woken, or holding the permit after a panic: dropping
            // it gives back whatever it holds (and may panic dropping the
            // stored waker, after doing so).
            let _ = catch_unwind(AssertUnwindSafe(move || drop(fut)));
        });
        sem.add_permits(1);
        t.join().unwrap();
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
        let again = sem.try_acquire().unwrap();
        drop(again);
    });
}

/// Serving the newest first, switched off by another thread while a
/// permit comes back to two waiters, one of which gives up after its first
/// poll (if it was handed the permit by then, it passes it on in the order
/// of the moment): the other is served, nothing is lost or left behind.
#[test]
fn serving_the_newest_first_racing_a_switch_and_a_cancellation() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        sem.set_serve_newest(true);
        let held = sem.clone().try_acquire_owned().unwrap();
        let s = sem.clone();
        let stays = thread::spawn(move || block_on(s.acquire()).unwrap().num_permits());
        let s = sem.clone();
        let leaves = thread::spawn(move || {
            let mut fut = pin!(s.acquire());
            if let Poll::Ready(permit) = poll_once(fut.as_mut()) {
                drop(permit.unwrap());
            }
            // Dropped: pending, or handed the permit since its poll.
        });
        let s = sem.clone();
        let switch = thread::spawn(move || s.set_serve_newest(false));
        drop(held);
        leaves.join().unwrap();
        switch.join().unwrap();
        assert_eq!(stays.join().unwrap(), 1);
        assert!(!sem.serves_newest());
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    });
}

/// Serving the newest first, the balance falls (`reduce_permits`) between
/// the hand-off's pick of the tail for a whole hand-off and its taking the
/// permits: the hand-off picks again, and the permits left go to the head
/// in part, never to the tail. (A tail handed one of its two would be
/// served by the one permit added after: it is not.)
#[test]
fn serving_the_newest_first_with_the_balance_falling_mid_hand_off() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        sem.set_serve_newest(true);
        let mut head = pin!(sem.acquire_many(3));
        let mut tail = pin!(sem.acquire_many(2));
        assert!(poll_once(head.as_mut()).is_pending());
        assert!(poll_once(tail.as_mut()).is_pending());
        let s = sem.clone();
        let reducer = thread::spawn(move || s.reduce_permits(1));
        sem.add_permits(2);
        reducer.join().unwrap();
        // Served in full before the reduction, or handed nothing.
        let mut served = Vec::new();
        let mut added = 2;
        let tail_done = match poll_once(tail.as_mut()) {
            Poll::Ready(p) => {
                served.push(p.unwrap());
                true
            }
            Poll::Pending => {
                sem.add_permits(1);
                added += 1;
                assert!(
                    poll_once(tail.as_mut()).is_pending(),
                    "the tail was served in part"
                );
                false
            }
        };
        sem.add_permits(4);
        added += 4;
        match poll_once(head.as_mut()) {
            Poll::Ready(p) => served.push(p.unwrap()),
            Poll::Pending => panic!("enough permits came back for the head"),
        }
        if !tail_done {
            match poll_once(tail.as_mut()) {
                Poll::Ready(p) => served.push(p.unwrap()),
                Poll::Pending => panic!("enough permits came back for the tail"),
            }
        }
        let got: usize = served.iter().map(|p| p.num_permits()).sum();
        assert_eq!(got, 5);
        drop(served);
        assert_eq!(sem.queue_len(), 0);
        assert_eq!(sem.available_permits(), added - 1);
    });
}
