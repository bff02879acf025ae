//! Tests of `watertight::Semaphore`'s public API: fairness, the unfair mode,
//! cancellation, permits, the Java-style negative balance, overflow, close,
//! visibility, lost wake-ups, blocking acquirers, wakers that panic and
//! trait promises. (The randomized model-based test lives in
//! `tests/model.rs`.)
//!
//! Most tests poll the futures by hand with counting wakers, so the order
//! of events and the number of wake-ups are exact. The stress tests are
//! bounded in count and run under a watchdog, so a lost wake-up fails them
//! instead of hanging.

#![cfg(not(loom))]

mod common;

use std::cell::UnsafeCell;
use std::error::Error;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::thread;

use common::{Counted, PATIENCE, WATCHDOG, assert_state, poll_noop, scaled, spin_until};
use futures::executor::block_on;
use futures::future::FusedFuture;
use watertight::futures::{Acquire, AcquireOwned};
use watertight::{AcquireError, OwnedPermit, Permit, Semaphore, TryAcquireError};

const MAX: usize = Semaphore::MAX_PERMITS;

fn semaphore(fair: bool, permits: usize) -> Semaphore {
    if fair {
        Semaphore::new(permits)
    } else {
        Semaphore::new_unfair(permits)
    }
}

/// The text of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else {
        "<non-string panic>"
    }
}

/// Runs `f`, expecting it to panic with a message containing `expected`.
#[track_caller]
fn assert_panics(expected: &str, f: impl FnOnce()) {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("should have panicked");
    let msg = panic_message(&*err);
    assert!(
        msg.contains(expected),
        "panic message {msg:?} should contain {expected:?}"
    );
}

/// A waker that runs an action when woken: a stand-in for another thread
/// acting at exactly that moment.
struct OnWake<F>(F);

impl<F: Fn() + Send + Sync + 'static> Wake for OnWake<F> {
    fn wake(self: Arc<Self>) {
        (self.0)()
    }
}

// ---------------------------------------------------------------------------
// 1. Fair mode is strict FIFO
// ---------------------------------------------------------------------------

/// Fair mode serves waiters in the order they first polled (not the order
/// the futures were created), waking exactly the one served.
#[test]
fn fair_waiters_are_served_in_arrival_order() {
    let sem = Semaphore::new(0);
    let mut futs: Vec<_> = (0..5).map(|_| Box::pin(sem.acquire())).collect();
    let wakers: Vec<Counted> = (0..5).map(|_| Counted::new()).collect();
    let arrival = [3, 1, 4, 0, 2];
    for &i in &arrival {
        wakers[i].assert_pending(futs[i].as_mut());
    }
    assert_state(&sem, 0, 5);

    let mut held = Vec::new();
    for (served, &i) in arrival.iter().enumerate() {
        sem.add_permits(1);
        let wakes: Vec<usize> = wakers.iter().map(Counted::wakes).collect();
        let expected: Vec<usize> = (0..5)
            .map(|j| usize::from(arrival[..=served].contains(&j)))
            .collect();
        assert_eq!(wakes, expected, "after {} releases", served + 1);
        for &later in &arrival[served + 1..] {
            wakers[later].assert_pending(futs[later].as_mut());
        }
        held.push(wakers[i].ready(futs[i].as_mut()).expect("served"));
        assert_state(&sem, 0, 4 - served);
    }
    drop(held);
    assert_state(&sem, 5, 0);
}

/// Fair mode: while anyone is queued, `try_acquire*` fails with `NoPermits`
/// and a newcomer's `acquire` queues; released permits go to the head
/// waiter, never to the balance.
#[test]
fn fair_try_acquire_cannot_overtake_a_queued_waiter() {
    let sem = Arc::new(Semaphore::new(1));
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = pin!(sem.acquire_many(3));
    wa.assert_pending(a.as_mut());
    assert_state(&sem, 0, 1); // the one permit went to A at once

    sem.add_permits(1);
    assert_state(&sem, 0, 1); // and so did this one
    assert_eq!(wa.wakes(), 0, "A is not served yet");
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::NoPermits);
    assert_eq!(
        sem.try_acquire_many(1).unwrap_err(),
        TryAcquireError::NoPermits
    );
    assert_eq!(
        sem.try_acquire_owned().unwrap_err(),
        TryAcquireError::NoPermits
    );
    assert_eq!(
        sem.try_acquire_many_owned(1).unwrap_err(),
        TryAcquireError::NoPermits
    );

    let mut b = pin!(sem.acquire());
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 2);

    sem.add_permits(1);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 0));
    let pa = wa.ready(a.as_mut()).expect("A is served");
    assert_eq!(pa.num_permits(), 3);
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 1);

    sem.add_permits(1);
    assert_eq!(wb.wakes(), 1);
    let pb = wb.ready(b.as_mut()).expect("B is served");
    assert_state(&sem, 0, 0);
    drop((pa, pb));
    assert_state(&sem, 4, 0);
    // With the line empty the fast path is open again.
    drop(sem.try_acquire_many(4).expect("no one waits"));
}

/// Fair mode: even while a release is still waking the waiters it served
/// (in batches of 32, with the lock released in between), a newcomer's
/// `try_acquire` cannot take permits ahead of a waiter still in line.
#[test]
fn fair_try_acquire_cannot_overtake_waiters_between_wake_up_batches() {
    let sem = Arc::new(Semaphore::new(0));
    let tried = Arc::new(Mutex::new(Vec::new()));
    // The first waiter's wake-up is the moment a newcomer tries its luck.
    let (s, t) = (sem.clone(), tried.clone());
    let newcomer = Waker::from(Arc::new(OnWake(move || {
        t.lock().unwrap().push(s.try_acquire_owned());
    })));
    let last = Counted::new();
    let mut futs: Vec<_> = (0..33).map(|_| Box::pin(sem.acquire())).collect();
    let first = futs[0].as_mut().poll(&mut Context::from_waker(&newcomer));
    assert!(first.is_pending());
    for fut in &mut futs[1..32] {
        assert!(poll_noop(fut.as_mut()).is_pending());
    }
    last.assert_pending(futs[32].as_mut());
    assert_state(&sem, 0, 33);

    sem.add_permits(34); // one per waiter and one spare
    let tried: Vec<_> = tried.lock().unwrap().drain(..).collect();
    assert_eq!(tried.len(), 1, "the first waiter was woken once");
    assert_eq!(
        tried[0].as_ref().unwrap_err(),
        &TryAcquireError::NoPermits,
        "the newcomer overtook the 33rd waiter"
    );
    assert_eq!(last.wakes(), 1);
    assert_state(&sem, 1, 0);
    for fut in &mut futs {
        assert!(matches!(poll_noop(fut.as_mut()), Poll::Ready(Ok(_))));
    }
}

/// Fair mode: a large request at the head collects permits as they come
/// back and holds smaller requests behind it until it is served in full.
#[test]
fn fair_large_request_at_head_collects_partially_and_holds_back_smaller_ones() {
    let sem = Semaphore::new(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = pin!(sem.acquire_many(5));
    let mut b = pin!(sem.acquire_many(1));
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 2);

    sem.add_permits(3);
    assert_eq!((wa.wakes(), wb.wakes()), (0, 0));
    wb.assert_pending(b.as_mut());
    wa.assert_pending(a.as_mut());
    assert_state(&sem, 0, 2); // A holds 3 of its 5

    sem.add_permits(2);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 0));
    let pa = wa.ready(a.as_mut()).expect("A is served");
    assert_eq!(pa.num_permits(), 5);
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 1);

    sem.add_permits(1);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 1));
    let pb = wb.ready(b.as_mut()).expect("B is served");
    assert_state(&sem, 0, 0);
    drop(pa);
    assert_state(&sem, 5, 0);
    drop(pb);
    assert_state(&sem, 6, 0);
}

/// Serving the newest first: each release goes to the waiter that joined
/// last if it covers all that waiter still needs, else to the head, in
/// part; only the head ever holds permits handed in part, and switching
/// back serves the oldest first again. Waiters keep their places.
#[test]
fn serving_the_newest_first_serves_the_tail_in_full_and_only_the_head_in_part() {
    let sem = Semaphore::new(0);
    sem.set_serve_newest(true);
    assert!(sem.serves_newest());
    let (wa, wb, wc, wd) = (
        Counted::new(),
        Counted::new(),
        Counted::new(),
        Counted::new(),
    );
    let mut a = pin!(sem.acquire_many(1));
    let mut b = pin!(sem.acquire_many(1));
    let mut c = pin!(sem.acquire_many(3));
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    wc.assert_pending(c.as_mut());
    // One permit does not cover the newest (`c`, 3): the head `a` gets it.
    sem.add_permits(1);
    assert_eq!((wa.wakes(), wb.wakes(), wc.wakes()), (1, 0, 0));
    let pa = wa.ready(a.as_mut()).expect("the head is served");
    // Two do not cover `c` either: the head `b` is served, and the second
    // goes to `b`'s successor at the head, `c`, in part.
    sem.add_permits(2);
    assert_eq!((wb.wakes(), wc.wakes()), (1, 0));
    let pb = wb.ready(b.as_mut()).expect("the head is served");
    wc.assert_pending(c.as_mut());
    assert_state(&sem, 0, 1); // `c` holds 1 of its 3
    // A newcomer behind `c`, the head holding permits in part: two
    // permits back serve the newcomer, the newest, in full first.
    let mut d = pin!(sem.acquire_many(1));
    wd.assert_pending(d.as_mut());
    drop(pa);
    assert_eq!((wc.wakes(), wd.wakes()), (0, 1));
    let pd = wd.ready(d.as_mut()).expect("the newest is served");
    wc.assert_pending(c.as_mut());
    assert_state(&sem, 0, 1);
    // The only waiter left is both ends: served as it always was.
    drop(pb);
    drop(pd);
    let pc = wc
        .ready(c.as_mut())
        .expect("the last waiter collects the rest");
    assert_eq!(pc.num_permits(), 3);
    assert_state(&sem, 0, 0);
    drop(pc);

    // Switched back: the oldest first again.
    sem.set_serve_newest(false);
    let mut held = sem.try_acquire_many(3).unwrap();
    let (we, wf) = (Counted::new(), Counted::new());
    let mut e = pin!(sem.acquire());
    let mut f = pin!(sem.acquire());
    we.assert_pending(e.as_mut());
    wf.assert_pending(f.as_mut());
    drop(held.split(1));
    assert_eq!((we.wakes(), wf.wakes()), (1, 0));
    drop(held);
    assert_eq!(wf.wakes(), 1);
    assert!(we.ready(e.as_mut()).is_ok() && wf.ready(f.as_mut()).is_ok());
}

/// Newest first changes nothing on an unfair semaphore: a release wakes
/// the oldest waiter to compete, as before.
#[test]
fn serving_the_newest_first_changes_nothing_when_unfair() {
    let sem = Semaphore::new_unfair(0);
    sem.set_serve_newest(true);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = pin!(sem.acquire());
    let mut b = pin!(sem.acquire());
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(1);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 0));
    assert!(wa.ready(a.as_mut()).is_ok());
}

/// A waiter polled again with a different waker is woken through the new
/// one.
#[test]
fn waiter_is_woken_through_its_latest_waker() {
    let sem = Semaphore::new(0);
    let (first, second) = (Counted::new(), Counted::new());
    let mut a = pin!(sem.acquire());
    first.assert_pending(a.as_mut());
    second.assert_pending(a.as_mut());
    sem.add_permits(1);
    assert_eq!(second.wakes(), 1);
    drop(second.ready(a.as_mut()).expect("served"));
    assert_state(&sem, 1, 0);
}

/// One release serves and wakes every waiter it covers, even more than fit
/// in one wake-up batch (the crate wakes in batches of 32).
#[test]
fn one_release_serves_more_than_a_batch_of_waiters() {
    let n = scaled(100, 40);
    let sem = Semaphore::new(0);
    let mut futs: Vec<_> = (0..n).map(|_| Box::pin(sem.acquire())).collect();
    let wakers: Vec<Counted> = (0..n).map(|_| Counted::new()).collect();
    for (fut, w) in futs.iter_mut().zip(&wakers) {
        w.assert_pending(fut.as_mut());
    }
    assert_state(&sem, 0, n);

    sem.add_permits(n - 1);
    assert_state(&sem, 0, 1);
    let mut held = Vec::new();
    for (fut, w) in futs.iter_mut().zip(&wakers).take(n - 1) {
        assert_eq!(w.wakes(), 1);
        held.push(w.ready(fut.as_mut()).expect("served"));
    }
    assert_eq!(
        wakers[n - 1].wakes(),
        0,
        "the last waiter is not served yet"
    );
    wakers[n - 1].assert_pending(futs[n - 1].as_mut());

    sem.add_permits(1);
    assert_eq!(wakers[n - 1].wakes(), 1);
    held.push(wakers[n - 1].ready(futs[n - 1].as_mut()).expect("served"));
    assert_state(&sem, 0, 0);
    drop(held);
    assert_state(&sem, n as isize, 0);
}

/// A returned permit serves more waiters than fit in one wake-up batch (fair:
/// handed over, the rest through the balance; unfair: woken to take them),
/// and in fair mode a newcomer still cannot overtake the waiters left
/// between batches.
#[test]
fn one_returned_permit_serves_more_than_a_batch_of_waiters() {
    for fair in [true, false] {
        let n = 40;
        let sem = Arc::new(semaphore(fair, n + 1));
        let all = sem.try_acquire_many(n + 1).unwrap();
        let tried = Arc::new(Mutex::new(Vec::new()));
        let (s, t) = (sem.clone(), tried.clone());
        let newcomer = Waker::from(Arc::new(OnWake(move || {
            t.lock().unwrap().push(s.try_acquire_owned().is_ok());
        })));
        let mut futs: Vec<_> = (0..n).map(|_| Box::pin(sem.acquire())).collect();
        let wakers: Vec<Counted> = (0..n).map(|_| Counted::new()).collect();
        assert!(
            futs[0]
                .as_mut()
                .poll(&mut Context::from_waker(&newcomer))
                .is_pending()
        );
        for (fut, w) in futs.iter_mut().zip(&wakers).skip(1) {
            w.assert_pending(fut.as_mut());
        }
        assert_state(&sem, 0, n);

        drop(all);
        let tried: Vec<bool> = tried.lock().unwrap().drain(..).collect();
        // Fair: the newcomer, woken with the first batch, finds the line
        // still occupied. Unfair: it may barge (and gives the permit back).
        assert_eq!(tried, [!fair], "fair: {fair}");
        assert!(wakers[1..].iter().all(|w| w.wakes() == 1), "fair: {fair}");
        // Fair: all but the spare handed over; unfair: all in the balance
        // until the woken waiters run.
        assert_state(&sem, if fair { 1 } else { n as isize + 1 }, 0);
        let mut held = Vec::new();
        for fut in &mut futs {
            match poll_noop(fut.as_mut()) {
                Poll::Ready(p) => held.push(p.expect("served")),
                Poll::Pending => panic!("a woken waiter must get its permit (fair: {fair})"),
            }
        }
        assert_state(&sem, 1, 0);
        drop(held);
        assert_state(&sem, n as isize + 1, 0);
    }
}

/// `acquire_many(0)` and `try_acquire_many(0)` succeed at once even while
/// others wait or the balance is negative, and fail once the semaphore is
/// closed.
#[test]
fn acquiring_zero_permits_resolves_at_once_unless_closed() {
    let sem = Semaphore::new(0);
    let mut a = pin!(sem.acquire());
    assert!(poll_noop(a.as_mut()).is_pending());
    let zero = block_on(sem.acquire_many(0)).expect("zero permits");
    assert_eq!(zero.num_permits(), 0);
    drop(zero);
    let zero = sem
        .acquire_many_blocking(0)
        .expect("zero permits, blocking");
    assert_eq!(zero.num_permits(), 0);
    drop(zero);
    assert_eq!(sem.try_acquire_many(0).map(|p| p.num_permits()), Ok(0));
    sem.reduce_permits(2);
    assert_eq!(sem.try_acquire_many(0).map(|p| p.num_permits()), Ok(0));
    sem.add_permits(2);
    assert_state(&sem, 0, 1);
    sem.close();
    assert!(block_on(sem.acquire_many(0)).is_err());
    assert!(sem.acquire_many_blocking(0).is_err());
    assert_eq!(
        sem.try_acquire_many(0).unwrap_err(),
        TryAcquireError::Closed
    );
}

/// Polling an acquire future again after it returned `Ready` panics, as
/// documented.
#[test]
#[should_panic(expected = "polled after completion")]
fn polling_a_completed_acquire_panics() {
    let sem = Semaphore::new(1);
    let mut a = pin!(sem.acquire());
    let _permit = match poll_noop(a.as_mut()) {
        Poll::Ready(p) => p,
        Poll::Pending => unreachable!("a permit is available"),
    };
    let _ = poll_noop(a.as_mut());
}

/// The acquire futures are fused: `is_terminated` turns true once they
/// have returned, whether with permits or with an error.
#[test]
fn acquire_futures_report_termination() {
    let sem = Arc::new(Semaphore::new(1));
    let mut a = pin!(sem.acquire());
    assert!(!a.is_terminated());
    let permit = block_on(a.as_mut()).expect("free permit");
    assert!(a.is_terminated());

    let mut b = pin!(sem.acquire_owned());
    assert!(poll_noop(b.as_mut()).is_pending());
    assert!(!b.is_terminated());
    sem.close();
    assert!(block_on(b.as_mut()).is_err());
    assert!(b.is_terminated());
    drop(permit);
}

// ---------------------------------------------------------------------------
// 2. Unfair mode
// ---------------------------------------------------------------------------

/// Unfair mode: a newcomer takes available permits while a larger waiter is
/// queued; the waiter is woken once the balance covers it.
#[test]
fn unfair_newcomer_barges_past_a_larger_waiter() {
    let sem = Semaphore::new_unfair(0);
    let wa = Counted::new();
    let mut a = pin!(sem.acquire_many(3));
    wa.assert_pending(a.as_mut());
    assert_state(&sem, 0, 1);

    sem.add_permits(2);
    assert_state(&sem, 2, 1); // not handed to A in part
    assert_eq!(wa.wakes(), 0);

    let p1 = sem.try_acquire().expect("a newcomer may barge");
    assert_state(&sem, 1, 1);
    assert_eq!(
        sem.try_acquire_many(2).unwrap_err(),
        TryAcquireError::NoPermits
    );
    let mut c = pin!(sem.acquire());
    let pc = match poll_noop(c.as_mut()) {
        Poll::Ready(p) => p.expect("an async newcomer may barge too"),
        Poll::Pending => panic!("the newcomer should not queue"),
    };
    assert_state(&sem, 0, 1);

    drop(p1);
    drop(pc);
    assert_state(&sem, 2, 1);
    assert_eq!(wa.wakes(), 0, "2 permits do not serve a request for 3");
    wa.assert_pending(a.as_mut());

    sem.add_permits(1);
    assert_eq!(wa.wakes(), 1);
    // Woken, out of line, but the permits stay in the balance until A runs.
    assert_state(&sem, 3, 0);
    let pa = wa.ready(a.as_mut()).expect("A takes them");
    assert_eq!(pa.num_permits(), 3);
    assert_state(&sem, 0, 0);
}

/// Unfair mode: a release hands nothing over. It wakes the head waiter, and
/// the permit stays in the balance, where a running task can take it first
/// (the releasing task itself, typically). The waiter that lost the race
/// goes back to the front of the line, ahead of later waiters, and is woken
/// again by the next release.
#[test]
fn unfair_release_wakes_the_head_and_a_newcomer_may_take_the_permit_first() {
    let sem = Semaphore::new_unfair(1);
    let held = sem.try_acquire().unwrap();
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = pin!(sem.acquire());
    wa.assert_pending(a.as_mut());
    assert_state(&sem, 0, 1);

    drop(held);
    assert_eq!(wa.wakes(), 1, "the release wakes the head");
    assert_state(&sem, 1, 0);
    let again = sem.try_acquire().expect("the releasing task takes it back");
    let mut b = pin!(sem.acquire());
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 1);

    wa.assert_pending(a.as_mut()); // lost the race: back in line, first
    assert_state(&sem, 0, 2);
    drop(again);
    assert_eq!((wa.wakes(), wb.wakes()), (2, 0), "A is first again");
    let pa = wa.ready(a.as_mut()).expect("A takes it this time");
    assert_state(&sem, 0, 1);
    drop(pa);
    assert_eq!(wb.wakes(), 1);
    drop(wb.ready(b.as_mut()).expect("then B"));
    assert_state(&sem, 1, 0);
}

/// Unfair mode: one permit wakes one waiter. A second release while the
/// first woken waiter has not run yet wakes the next one, not nobody and
/// not everybody.
#[test]
fn unfair_each_release_wakes_as_many_waiters_as_it_has_permits_for() {
    let sem = Semaphore::new_unfair(0);
    let w: Vec<Counted> = (0..4).map(|_| Counted::new()).collect();
    let mut futs: Vec<_> = (0..4).map(|_| Box::pin(sem.acquire())).collect();
    for (w, f) in w.iter().zip(&mut futs) {
        w.assert_pending(f.as_mut());
    }
    let wakes = |w: &[Counted]| w.iter().map(Counted::wakes).collect::<Vec<_>>();

    sem.add_permits(1);
    assert_eq!(wakes(&w), [1, 0, 0, 0]);
    sem.add_permits(1);
    assert_eq!(wakes(&w), [1, 1, 0, 0]);
    sem.add_permits(1);
    assert_eq!(wakes(&w), [1, 1, 1, 0]);
    assert_state(&sem, 3, 1);

    // A woken waiter dropped without running passes its wake-up on.
    let second = futs.remove(1);
    drop(second);
    assert_eq!(wakes(&w), [1, 1, 1, 1]);
    assert_state(&sem, 3, 0);
    let got: Vec<_> = [0, 2, 3]
        .iter()
        .zip(&mut futs)
        .map(|(&i, f)| w[i].ready(f.as_mut()).expect("served"))
        .collect();
    assert_eq!(got.len(), 3);
    assert_state(&sem, 0, 0);
}

/// Unfair mode: queued waiters are still woken in arrival order, each only
/// when the balance covers its whole request, and each woken once.
#[test]
fn unfair_waiters_are_served_in_order_and_in_full() {
    let sem = Semaphore::new_unfair(0);
    let w: Vec<Counted> = (0..3).map(|_| Counted::new()).collect();
    let mut a = pin!(sem.acquire_many(2));
    let mut b = pin!(sem.acquire());
    let mut c = pin!(sem.acquire());
    w[0].assert_pending(a.as_mut());
    w[1].assert_pending(b.as_mut());
    w[2].assert_pending(c.as_mut());

    sem.add_permits(1);
    assert_state(&sem, 1, 3); // B does not jump ahead of A
    assert_eq!(w.iter().map(Counted::wakes).collect::<Vec<_>>(), [0, 0, 0]);

    sem.add_permits(1);
    assert_state(&sem, 2, 2);
    assert_eq!(w.iter().map(Counted::wakes).collect::<Vec<_>>(), [1, 0, 0]);

    sem.add_permits(2);
    assert_state(&sem, 4, 0);
    assert_eq!(w.iter().map(Counted::wakes).collect::<Vec<_>>(), [1, 1, 1]);
    let held = [
        w[0].ready(a.as_mut()).expect("A"),
        w[1].ready(b.as_mut()).expect("B"),
        w[2].ready(c.as_mut()).expect("C"),
    ];
    assert_eq!(
        held.iter().map(Permit::num_permits).collect::<Vec<_>>(),
        [2, 1, 1]
    );
    assert_state(&sem, 0, 0);
}

/// Unfair mode: a waiter is not lost when a newcomer takes the permit it
/// was waiting for; it is woken when the newcomer gives it back.
#[test]
fn unfair_waiter_is_woken_after_a_newcomer_returns_permits() {
    let sem = Semaphore::new_unfair(0);
    let wa = Counted::new();
    let mut a = pin!(sem.acquire_many(2));
    wa.assert_pending(a.as_mut());
    sem.add_permits(1);
    let barger = sem.try_acquire().expect("barge");
    sem.add_permits(1);
    assert_state(&sem, 1, 1);
    assert_eq!(wa.wakes(), 0);
    drop(barger);
    assert_eq!(wa.wakes(), 1);
    assert_state(&sem, 2, 0);
    assert_eq!(wa.ready(a.as_mut()).expect("served").num_permits(), 2);
}

/// Unfair mode: dropping the head waiter lets the permits it was blocking
/// reach the next waiter.
#[test]
fn unfair_dropping_the_head_serves_the_next_waiter() {
    let sem = Semaphore::new_unfair(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(3));
    let mut b = pin!(sem.acquire());
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(2);
    assert_state(&sem, 2, 2);
    assert_eq!(wb.wakes(), 0);

    drop(a);
    assert_eq!((wa.wakes(), wb.wakes()), (0, 1));
    assert_state(&sem, 2, 0);
    drop(wb.ready(b.as_mut()).expect("B is served"));
    assert_state(&sem, 2, 0);
}

/// Unfair mode: a woken waiter that finds the semaphore closed when it runs
/// fails, and leaves the balance alone.
#[test]
fn unfair_woken_waiter_sees_a_close_that_came_before_it_ran() {
    let sem = Semaphore::new_unfair(0);
    let wa = Counted::new();
    let mut a = pin!(sem.acquire());
    wa.assert_pending(a.as_mut());
    sem.add_permits(1);
    assert_eq!(wa.wakes(), 1);
    sem.close();
    assert!(wa.ready(a.as_mut()).is_err(), "closed");
    assert_state(&sem, 1, 0);
}

// ---------------------------------------------------------------------------
// 3. Cancellation
// ---------------------------------------------------------------------------

/// Dropping an acquire that was never polled changes nothing.
#[test]
fn dropping_an_unpolled_acquire_changes_nothing() {
    let sem = Arc::new(Semaphore::new(1));
    drop(sem.acquire());
    drop(sem.acquire_many(5));
    drop(sem.acquire_owned());
    drop(sem.acquire_many_owned(5));
    assert_state(&sem, 1, 0);
    assert_eq!(
        Arc::strong_count(&sem),
        1,
        "owned futures released their Arc"
    );

    // Nor does it disturb a queued waiter.
    let wa = Counted::new();
    let mut a = pin!(sem.acquire_many(2));
    wa.assert_pending(a.as_mut());
    drop(sem.acquire());
    drop(sem.acquire_many_owned(1));
    assert_state(&sem, 0, 1);
    sem.add_permits(1);
    assert_eq!(wa.wakes(), 1);
    drop(wa.ready(a.as_mut()).expect("served"));
    assert_state(&sem, 2, 0);
}

/// Dropping a queued acquire (head, middle or tail) removes it from the
/// line; the others keep their order, and nobody dropped is woken.
#[test]
fn dropping_a_queued_acquire_leaves_the_line() {
    let sem = Semaphore::new(0);
    let w: Vec<Counted> = (0..4).map(|_| Counted::new()).collect();
    let mut futs: Vec<Option<Pin<Box<Acquire<'_>>>>> =
        (0..4).map(|_| Some(Box::pin(sem.acquire()))).collect();
    for (fut, w) in futs.iter_mut().zip(&w) {
        w.assert_pending(fut.as_mut().unwrap().as_mut());
    }
    assert_state(&sem, 0, 4);

    futs[2] = None; // middle
    assert_state(&sem, 0, 3);
    futs[0] = None; // head
    assert_state(&sem, 0, 2);

    sem.add_permits(1);
    assert_eq!(
        w.iter().map(Counted::wakes).collect::<Vec<_>>(),
        [0, 1, 0, 0]
    );
    let p1 = w[1].ready(futs[1].as_mut().unwrap().as_mut()).expect("B");
    w[3].assert_pending(futs[3].as_mut().unwrap().as_mut());
    assert_state(&sem, 0, 1);

    futs[3] = None; // tail, now alone
    assert_state(&sem, 0, 0);
    drop(p1);
    assert_state(&sem, 1, 0);
    assert_eq!(
        w.iter().map(Counted::wakes).collect::<Vec<_>>(),
        [0, 1, 0, 0]
    );
    drop(sem.try_acquire().expect("the line is empty"));
}

/// A dropped queued acquire lets go of the waker it stored, wherever it was
/// in line (head, middle, tail) and whether or not its drop served anyone:
/// no task is kept alive by a future that is gone.
#[test]
fn dropping_a_queued_acquire_releases_its_waker() {
    struct Task;
    impl Wake for Task {
        fn wake(self: Arc<Self>) {}
    }
    for fair in [true, false] {
        for victim in 0..3 {
            let sem = Arc::new(semaphore(fair, 0));
            let task = Arc::new(Task);
            let waker = Waker::from(task.clone());
            let mut cx = Context::from_waker(&waker);
            let mut futs: Vec<Option<Pin<Box<AcquireOwned>>>> = (0..3)
                .map(|_| Some(Box::pin(sem.clone().acquire_owned())))
                .collect();
            for fut in futs.iter_mut().flatten() {
                assert!(fut.as_mut().poll(&mut cx).is_pending());
            }
            // Ours, the one in `waker`, and one stored per queued acquire.
            assert_eq!(Arc::strong_count(&task), 5);
            futs[victim] = None;
            assert_eq!(
                Arc::strong_count(&task),
                4,
                "fair {fair}, acquire {victim} of 3 dropped its waker"
            );
            assert_eq!(sem.queue_len(), 2);
            drop(futs);
            assert_eq!(Arc::strong_count(&task), 2);
            assert_state(&sem, 0, 0);
        }
    }
}

/// A cancelled acquire in the middle of the line whose waker's drop panics:
/// the drop panics after it left the line, and the line is whole (the
/// others are served in order).
#[test]
fn dropping_a_queued_acquire_in_the_middle_whose_waker_drop_panics_leaves_the_line() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let (wa, own, wc) = (Counted::new(), Rogue::new(), Counted::new());
        let mut a = Box::pin(sem.acquire());
        let mut b = Box::pin(sem.acquire());
        let mut c = Box::pin(sem.acquire());
        wa.assert_pending(a.as_mut());
        assert!(own.poll(b.as_mut()).unwrap().is_pending());
        wc.assert_pending(c.as_mut());
        own.arm(ON_DROP);
        assert_eq!(panicked(move || drop(b)), rogue("drop"));
        own.disarm();
        assert_eq!(sem.queue_len(), 2, "fair {fair}");
        assert_eq!((wa.wakes(), wc.wakes()), (0, 0), "nobody is woken");
        sem.add_permits(1);
        assert_eq!((wa.wakes(), wc.wakes()), (1, 0), "the head first");
        drop(wa.ready(a.as_mut()).expect("the head is served"));
        assert_eq!(wc.wakes(), 1, "then the one behind the cancelled one");
        drop(wc.ready(c.as_mut()).expect("the tail is served"));
        assert_state(&sem, 1, 0);
        assert_eq!(sem.forget_permits(1), 1);
        assert_line_works(&sem);
    }
}

/// Fair mode: dropping a partly served head passes the permits it had
/// collected on to the next waiter, and the rest to the balance.
#[test]
fn dropping_a_partly_served_head_passes_its_permits_on() {
    let sem = Semaphore::new(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(5));
    let mut b = pin!(sem.acquire_many(2));
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(3);
    assert_state(&sem, 0, 2);

    drop(a);
    assert_eq!((wa.wakes(), wb.wakes()), (0, 1));
    assert_state(&sem, 1, 0); // 3 collected by A: 2 to B, 1 left over
    let pb = wb.ready(b.as_mut()).expect("B is served");
    assert_eq!(pb.num_permits(), 2);
    drop(pb);
    assert_state(&sem, 3, 0);
}

/// Fair mode: when the dropped head's permits do not cover the next waiter,
/// that waiter collects them in part and keeps waiting.
#[test]
fn dropping_a_partly_served_head_serves_the_next_one_partly() {
    let sem = Semaphore::new(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(5));
    let mut b = pin!(sem.acquire_many(4));
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(3);
    drop(a);
    assert_state(&sem, 0, 1); // B holds 3 of its 4
    assert_eq!(wb.wakes(), 0);
    wb.assert_pending(b.as_mut());

    sem.add_permits(1);
    assert_eq!(wb.wakes(), 1);
    drop(wb.ready(b.as_mut()).expect("B is served"));
    assert_state(&sem, 4, 0);
}

/// Fair mode: a partly served last waiter that is dropped returns its
/// permits to the balance, and the fast path opens again.
#[test]
fn dropping_a_partly_served_last_waiter_returns_permits_to_the_balance() {
    let sem = Semaphore::new(0);
    let mut a = Box::pin(sem.acquire_many(5));
    assert!(poll_noop(a.as_mut()).is_pending());
    sem.add_permits(3);
    assert_state(&sem, 0, 1);
    drop(a);
    assert_state(&sem, 3, 0);
    drop(sem.try_acquire_many(3).expect("no one waits any more"));
}

/// Dropping an acquire that was served but not yet polled gives its permits
/// back, to the next waiter if there is one.
#[test]
fn dropping_a_served_but_unpolled_acquire_returns_its_permits() {
    let sem = Semaphore::new(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(2));
    let mut b = Box::pin(sem.acquire_many(2));
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(2);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 0));
    assert_state(&sem, 0, 1);

    drop(a); // served, never polled again
    assert_eq!(wb.wakes(), 1);
    assert_state(&sem, 0, 0);
    drop(b); // likewise
    assert_state(&sem, 2, 0);
}

/// `AcquireOwned` keeps the same cancellation promises at every stage:
/// unpolled, queued, partly served, served but not polled.
#[test]
fn dropping_acquire_owned_at_every_stage() {
    let sem = Arc::new(Semaphore::new(0));
    drop(sem.acquire_many_owned(2));
    assert_state(&sem, 0, 0);

    let (wa, wb, wc) = (Counted::new(), Counted::new(), Counted::new());
    let mut a: Pin<Box<AcquireOwned>> = Box::pin(sem.acquire_many_owned(5));
    let mut b = Box::pin(sem.acquire_many_owned(2));
    let mut c = Box::pin(sem.acquire_owned());
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    wc.assert_pending(c.as_mut());
    assert_state(&sem, 0, 3);

    drop(c); // queued
    assert_state(&sem, 0, 2);
    sem.add_permits(3); // A collects 3 of 5
    assert_state(&sem, 0, 2);
    drop(a); // partly served: its 3 serve B, one is left
    assert_eq!((wa.wakes(), wb.wakes(), wc.wakes()), (0, 1, 0));
    assert_state(&sem, 1, 0);
    drop(b); // served, not polled
    assert_state(&sem, 3, 0);
    assert_eq!(Arc::strong_count(&sem), 1, "every future released its Arc");
}

/// A stress mix of acquires cancelled at random points by a racing future,
/// on a multi-thread runtime: no permit leaks, none is created, nobody is
/// left in line.
#[test]
#[cfg_attr(miri, ignore = "tokio's multi-thread runtime is too slow under Miri")]
fn cancelled_acquires_under_contention_leak_no_permits() {
    const PERMITS: usize = 4;
    common::with_watchdog("cancellation stress", WATCHDOG, || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let sem = Arc::new(Semaphore::new(PERMITS));
            let held = Arc::new(AtomicUsize::new(0));
            let max_held = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..8)
                .map(|task: usize| {
                    let (sem, held, max_held) = (sem.clone(), held.clone(), max_held.clone());
                    tokio::spawn(async move {
                        for round in 0..300usize {
                            let weight = 1 + (task + round) % 3;
                            let patience = (task * 7 + round) % 4;
                            let give_up = async {
                                for _ in 0..patience {
                                    common::yield_now().await;
                                }
                            };
                            let acquire = pin!(sem.acquire_many(weight));
                            let give_up = pin!(give_up);
                            if let futures::future::Either::Left((permit, _)) =
                                futures::future::select(acquire, give_up).await
                            {
                                let permit = permit.unwrap();
                                let now = held.fetch_add(weight, Ordering::SeqCst) + weight;
                                max_held.fetch_max(now, Ordering::SeqCst);
                                common::yield_now().await;
                                held.fetch_sub(weight, Ordering::SeqCst);
                                drop(permit);
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            assert!(max_held.load(Ordering::SeqCst) <= PERMITS);
            assert_state(&sem, PERMITS as isize, 0);
        });
    });
}

// ---------------------------------------------------------------------------
// 4. Permits: drop, forget, split, merge
// ---------------------------------------------------------------------------

/// Dropping a permit returns exactly its permits, once, for every way of
/// acquiring one.
#[test]
fn dropping_a_permit_returns_its_permits_exactly_once() {
    let sem = Arc::new(Semaphore::new(5));
    let p = sem.try_acquire_many(3).unwrap();
    assert_eq!(p.num_permits(), 3);
    assert!(std::ptr::eq(p.semaphore(), &*sem));
    assert_state(&sem, 2, 0);
    drop(p);
    assert_state(&sem, 5, 0);

    let p = block_on(sem.acquire_many(4)).unwrap();
    assert_state(&sem, 1, 0);
    drop(p);
    let p = sem.acquire_many_blocking(2).unwrap();
    assert_state(&sem, 3, 0);
    drop(p);
    assert_state(&sem, 5, 0);

    let owned = block_on(sem.acquire_many_owned(2)).unwrap();
    assert!(Arc::ptr_eq(owned.semaphore(), &sem));
    let other = sem.try_acquire_owned().unwrap();
    assert_state(&sem, 2, 0);
    thread::spawn(move || drop((owned, other))).join().unwrap();
    assert_state(&sem, 5, 0);
    assert_eq!(Arc::strong_count(&sem), 1);
}

/// `forget` drops a guard without returning its permits.
#[test]
fn forgetting_a_permit_returns_nothing() {
    let sem = Arc::new(Semaphore::new(4));
    sem.try_acquire_many(2).unwrap().forget();
    assert_state(&sem, 2, 0);
    sem.try_acquire_owned().unwrap().forget();
    assert_state(&sem, 1, 0);
    assert_eq!(
        Arc::strong_count(&sem),
        1,
        "a forgotten owned permit releases its Arc"
    );
}

/// A permit forgotten in one task is given back with `add_permits` from
/// another thread, which wakes the waiter (Java's ownerless release).
#[test]
fn forgotten_permit_is_given_back_from_another_thread() {
    let sem = Arc::new(Semaphore::new(1));
    block_on(async { sem.acquire().await.unwrap().forget() });
    assert_state(&sem, 0, 0);

    let wb = Counted::new();
    let mut b = pin!(sem.acquire());
    wb.assert_pending(b.as_mut());
    assert_state(&sem, 0, 1);
    let giver = sem.clone();
    thread::spawn(move || giver.add_permits(1)).join().unwrap();
    assert_eq!(wb.wakes(), 1);
    let pb = wb.ready(b.as_mut()).expect("served by the hand-off");
    assert_state(&sem, 0, 0);
    drop(pb);
    assert_state(&sem, 1, 0);
}

/// `split` moves permits into a new guard, each guard returns its own
/// share, and an oversized split changes nothing.
#[test]
fn split_divides_a_permit() {
    let sem = Arc::new(Semaphore::new(5));
    let mut p = sem.try_acquire_many(5).unwrap();
    let two = p.split(2).unwrap();
    assert_eq!((p.num_permits(), two.num_permits()), (3, 2));
    assert!(p.split(4).is_none());
    assert_eq!(p.num_permits(), 3);
    let zero = p.split(0).unwrap();
    drop(zero);
    assert_state(&sem, 0, 0);
    drop(two);
    assert_state(&sem, 2, 0);
    drop(p);
    assert_state(&sem, 5, 0);

    let mut o = sem.try_acquire_many_owned(5).unwrap();
    let one = o.split(1).unwrap();
    assert!(o.split(5).is_none());
    assert_eq!((o.num_permits(), one.num_permits()), (4, 1));
    drop(one);
    assert_state(&sem, 1, 0);
    drop(o);
    assert_state(&sem, 5, 0);
}

/// `merge` moves all permits into one guard, which returns them all, once.
#[test]
fn merge_combines_permits_of_one_semaphore() {
    let sem = Arc::new(Semaphore::new(6));
    let mut a = sem.try_acquire().unwrap();
    a.merge(sem.try_acquire_many(2).unwrap());
    assert_eq!(a.num_permits(), 3);
    assert_state(&sem, 3, 0);
    drop(a);
    assert_state(&sem, 6, 0);

    let mut o = sem.try_acquire_owned().unwrap();
    o.merge(sem.try_acquire_many_owned(4).unwrap());
    assert_eq!(o.num_permits(), 5);
    assert_state(&sem, 1, 0);
    drop(o);
    assert_state(&sem, 6, 0);
}

/// Merging permits of different semaphores panics.
#[test]
#[should_panic(expected = "different semaphores")]
fn merging_permits_of_different_semaphores_panics() {
    let (s1, s2) = (Semaphore::new(1), Semaphore::new(1));
    let mut a = s1.try_acquire().unwrap();
    a.merge(s2.try_acquire().unwrap());
}

/// Merging owned permits of different semaphores panics.
#[test]
#[should_panic(expected = "different semaphores")]
fn merging_owned_permits_of_different_semaphores_panics() {
    let (s1, s2) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
    let mut a = s1.try_acquire_owned().unwrap();
    a.merge(s2.try_acquire_owned().unwrap());
}

/// A failed merge (different semaphores) leaves both semaphores' balances
/// right: the rejected guard returns its permits, the receiver keeps its own.
#[test]
fn failed_merge_loses_no_permits() {
    let (s1, s2) = (Semaphore::new(2), Semaphore::new(2));
    let mut a = s1.try_acquire().unwrap();
    assert_panics("different semaphores", || {
        a.merge(s2.try_acquire().unwrap())
    });
    assert_eq!(a.num_permits(), 1);
    assert_state(&s2, 2, 0);
    drop(a);
    assert_state(&s1, 2, 0);
}

/// Merging guards whose sum would exceed `MAX_PERMITS` panics and leaves the
/// receiving guard as it was.
#[test]
fn merging_past_max_permits_panics() {
    let sem = Semaphore::new(MAX);
    let mut all = sem.try_acquire_many(MAX).unwrap();
    sem.add_permits(1);
    let one = sem.try_acquire().unwrap();
    assert_panics("MAX_PERMITS", || all.merge(one));
    assert_eq!(all.num_permits(), MAX);
    assert_state(&sem, 1, 0); // the rejected guard gave its permit back
    sem.reduce_permits(1);
    drop(all);
    assert_state(&sem, MAX as isize, 0);
}

// ---------------------------------------------------------------------------
// 5. Java's negative balance
// ---------------------------------------------------------------------------

/// `java.util.concurrent.Semaphore`'s `reducePermits` example: the balance
/// goes below zero and returning held permits repays the deficit.
#[test]
fn java_negative_balance_example() {
    let sem = Semaphore::new(8);
    sem.add_permits(2);
    let nine = block_on(sem.acquire_many(9)).unwrap();
    assert_state(&sem, 1, 0);
    sem.reduce_permits(7);
    assert_state(&sem, -6, 0);
    drop(nine);
    assert_state(&sem, 3, 0);
}

/// After a deficit of k, a waiter for n is served only once k + n permits
/// have been added (fair mode collects the last ones as they come).
#[test]
fn waiter_for_n_waits_until_the_balance_reaches_n() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        sem.reduce_permits(3);
        let wa = Counted::new();
        let mut a = pin!(sem.acquire_many(2));
        wa.assert_pending(a.as_mut());
        assert_state(&sem, -3, 1);
        let expected = if fair { [-2, -1, 0, 0] } else { [-2, -1, 0, 1] };
        for (step, balance) in expected.into_iter().enumerate() {
            sem.add_permits(1);
            assert_eq!(wa.wakes(), 0, "fair={fair}: woken after {} adds", step + 1);
            wa.assert_pending(a.as_mut());
            assert_state(&sem, balance, 1);
        }
        sem.add_permits(1);
        assert_eq!(wa.wakes(), 1, "fair={fair}");
        let pa = wa.ready(a.as_mut()).expect("served at k + n");
        assert_state(&sem, 0, 0);
        drop(pa);
        assert_state(&sem, 2, 0);
    }
}

/// `new(0)` followed by `reduce_permits(k)` acts as a negative initial
/// count: nothing can be taken until k + 1 permits have been added.
#[test]
fn reduce_on_a_new_semaphore_gives_a_negative_initial_count() {
    let sem = Semaphore::new(0);
    sem.reduce_permits(4);
    assert_state(&sem, -4, 0);
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::NoPermits);
    sem.add_permits(4);
    assert_state(&sem, 0, 0);
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::NoPermits);
    sem.add_permits(1);
    drop(sem.try_acquire().expect("balance is 1"));
    assert_state(&sem, 1, 0);
}

/// `reduce_permits` below `-MAX_PERMITS` panics and leaves the balance as
/// it was.
#[test]
fn reduce_permits_below_the_floor_panics_and_changes_nothing() {
    let sem = Semaphore::new(0);
    assert_panics("MAX_PERMITS", || sem.reduce_permits(MAX + 1));
    assert_state(&sem, 0, 0);
    sem.reduce_permits(MAX);
    assert_state(&sem, -(MAX as isize), 0);
    assert_panics("MAX_PERMITS", || sem.reduce_permits(1));
    assert_state(&sem, -(MAX as isize), 0);
    sem.add_permits(MAX);
    assert_state(&sem, 0, 0);
}

/// `forget_permits` and `drain_permits` take only what is available now; a
/// negative balance is left as it is.
#[test]
fn drain_and_forget_take_only_available_permits() {
    let sem = Semaphore::new(5);
    let held = sem.try_acquire().unwrap();
    assert_eq!(sem.forget_permits(3), 3);
    assert_eq!(sem.forget_permits(3), 1);
    assert_eq!(sem.drain_permits(), 0);
    assert_state(&sem, 0, 0);
    sem.add_permits(2);
    assert_eq!(sem.drain_permits(), 2);
    sem.reduce_permits(2);
    assert_eq!(sem.drain_permits(), 0);
    assert_eq!(sem.forget_permits(1), 0);
    assert_state(&sem, -2, 0);
    drop(held);
    assert_state(&sem, -1, 0);
}

/// Permits added with `add_permits` while two waiters for one wait repay
/// the deficit before they serve anyone, in both modes (fair mode hands a
/// permit straight to a head owed exactly that many, with others behind
/// it, only when there is no deficit).
#[test]
fn added_permits_repay_the_deficit_before_serving_waiters() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let (wa, wb) = (Counted::new(), Counted::new());
        let mut a = pin!(sem.acquire());
        wa.assert_pending(a.as_mut());
        let mut b = pin!(sem.acquire());
        wb.assert_pending(b.as_mut());
        sem.reduce_permits(2);
        assert_state(&sem, -2, 2);
        sem.add_permits(1);
        assert_state(&sem, -1, 2);
        sem.add_permits(1);
        assert_state(&sem, 0, 2);
        assert_eq!((wa.wakes(), wb.wakes()), (0, 0), "fair: {fair}");
        sem.add_permits(1);
        assert_eq!((wa.wakes(), wb.wakes()), (1, 0), "fair: {fair}");
        // Fair: handed over; unfair: in the balance until A runs.
        assert_state(&sem, if fair { 0 } else { 1 }, 1);
        drop(wa.ready(a.as_mut()).expect("served"));
        assert_eq!(wb.wakes(), 1, "fair: {fair}");
        drop(wb.ready(b.as_mut()).expect("served"));
        assert_state(&sem, 1, 0);
    }
}

/// A permit returned while others wait repays the deficit before it serves
/// anyone, in both modes, and the waiter is served by the return that
/// brings the balance up to its request.
#[test]
fn returned_permits_repay_the_deficit_before_serving_waiters() {
    for fair in [true, false] {
        let sem = semaphore(fair, 3);
        let held: Vec<_> = (0..3).map(|_| sem.try_acquire().unwrap()).collect();
        let wa = Counted::new();
        let mut a = pin!(sem.acquire());
        wa.assert_pending(a.as_mut());
        sem.reduce_permits(2);
        assert_state(&sem, -2, 1);
        let mut held = held.into_iter();
        drop(held.next());
        assert_state(&sem, -1, 1);
        drop(held.next());
        assert_state(&sem, 0, 1);
        assert_eq!(wa.wakes(), 0, "fair: {fair}");
        drop(held.next());
        assert_eq!(wa.wakes(), 1, "fair: {fair}");
        // Fair: handed over; unfair: in the balance until A runs.
        assert_state(&sem, if fair { 0 } else { 1 }, 0);
        drop(wa.ready(a.as_mut()).expect("served"));
        assert_state(&sem, 1, 0);
    }
}

// ---------------------------------------------------------------------------
// 6. Overflow
// ---------------------------------------------------------------------------

/// `add_permits` past `MAX_PERMITS` panics and leaves the balance as it
/// was; the semaphore keeps working.
#[test]
fn add_permits_past_max_panics_and_leaves_the_balance_unchanged() {
    let sem = Semaphore::new(MAX);
    assert_panics("MAX_PERMITS", || sem.add_permits(1));
    assert_state(&sem, MAX as isize, 0);

    let sem = Semaphore::new(5);
    assert_panics("MAX_PERMITS", || sem.add_permits(MAX - 4));
    assert_state(&sem, 5, 0);
    assert_panics("MAX_PERMITS", || sem.add_permits(MAX + 1));
    assert_state(&sem, 5, 0);
    assert_panics("MAX_PERMITS", || sem.add_permits(usize::MAX));
    assert_state(&sem, 5, 0);
    sem.add_permits(MAX - 5);
    assert_state(&sem, MAX as isize, 0);
    drop(
        sem.try_acquire_many(MAX)
            .expect("still usable after the panics"),
    );
    assert_state(&sem, MAX as isize, 0);
}

/// Dropping a permit that would take the balance past `MAX_PERMITS` (the
/// count was raised to the maximum while it was held) panics and leaves the
/// balance at the maximum, one below it is fine, and the semaphore keeps
/// working.
#[test]
fn a_release_past_max_panics_and_leaves_the_balance_unchanged() {
    for sem in [Semaphore::new(MAX), Semaphore::new_unfair(MAX)] {
        let held = sem.try_acquire_many(2).unwrap();
        let one = sem.try_acquire().unwrap();
        sem.add_permits(2);
        assert_state(&sem, MAX as isize - 1, 0);
        drop(one); // exactly the maximum
        assert_state(&sem, MAX as isize, 0);
        assert_panics("MAX_PERMITS", || drop(held));
        assert_state(&sem, MAX as isize, 0);
        drop(
            sem.try_acquire_many(MAX)
                .expect("still usable after the panic"),
        );
        assert_state(&sem, MAX as isize, 0);
    }
}

/// `add_permits` of more than `MAX_PERMITS` while someone waits (a fair
/// semaphore then adds under the lock, as the head is not owed exactly `n`)
/// panics the same way and leaves the balance and the line as they were;
/// the next calls serve the waiter, in parts.
#[test]
fn add_permits_past_max_with_a_waiter_panics_and_leaves_the_line() {
    let sem = Semaphore::new(0);
    let mut two = pin!(sem.acquire_many(2));
    assert!(poll_noop(two.as_mut()).is_pending());
    assert_panics("MAX_PERMITS", || sem.add_permits(MAX + 1));
    assert_state(&sem, 0, 1);
    assert_panics("MAX_PERMITS", || sem.add_permits(usize::MAX));
    assert_state(&sem, 0, 1);
    sem.add_permits(1);
    assert_state(&sem, 0, 1);
    assert!(poll_noop(two.as_mut()).is_pending(), "owed one more");
    sem.add_permits(1);
    assert_state(&sem, 0, 0);
    let Poll::Ready(Ok(permit)) = poll_noop(two.as_mut()) else {
        panic!("the waiter was not served");
    };
    assert_eq!(permit.num_permits(), 2);
}

/// A semaphore cannot be created with more than `MAX_PERMITS` permits.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn new_with_more_than_max_permits_panics() {
    let _ = Semaphore::new(MAX + 1);
}

/// Nor can an unfair one.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn new_unfair_with_more_than_max_permits_panics() {
    let _ = Semaphore::new_unfair(MAX + 1);
}

/// `acquire_many` of more than `MAX_PERMITS` panics.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn acquire_many_more_than_max_panics() {
    let sem = Semaphore::new(0);
    let _fut = sem.acquire_many(MAX + 1);
}

/// `acquire_many_owned` of more than `MAX_PERMITS` panics.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn acquire_many_owned_more_than_max_panics() {
    let sem = Arc::new(Semaphore::new(0));
    let _fut = sem.acquire_many_owned(MAX + 1);
}

/// `try_acquire_many` of more than `MAX_PERMITS` panics.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn try_acquire_many_more_than_max_panics() {
    let sem = Semaphore::new(MAX);
    let _ = sem.try_acquire_many(MAX + 1);
}

/// `try_acquire_many_owned` of more than `MAX_PERMITS` panics.
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn try_acquire_many_owned_more_than_max_panics() {
    let sem = Arc::new(Semaphore::new(MAX));
    let _ = sem.try_acquire_many_owned(MAX + 1);
}

/// `acquire_many_blocking` of more than `MAX_PERMITS` panics (instead of
/// blocking forever).
#[test]
#[should_panic(expected = "MAX_PERMITS")]
fn acquire_many_blocking_more_than_max_panics() {
    let sem = Semaphore::new(MAX);
    let _ = sem.acquire_many_blocking(MAX + 1);
}

/// Asking for more permits than the semaphore holds in total is legal and
/// completes once `add_permits` makes it possible, up to `MAX_PERMITS`.
#[test]
fn acquiring_more_than_the_total_completes_after_add_permits() {
    for fair in [true, false] {
        let sem = semaphore(fair, 2);
        let wa = Counted::new();
        let mut a = pin!(sem.acquire_many(5));
        wa.assert_pending(a.as_mut());
        sem.add_permits(3);
        assert_eq!(wa.wakes(), 1, "fair={fair}");
        assert_eq!(wa.ready(a.as_mut()).unwrap().num_permits(), 5);
        assert_state(&sem, 5, 0);

        let sem = semaphore(fair, 0);
        let wb = Counted::new();
        let mut b = pin!(sem.acquire_many(MAX));
        wb.assert_pending(b.as_mut());
        sem.add_permits(MAX);
        assert_eq!(wb.wakes(), 1, "fair={fair}");
        let pb = wb.ready(b.as_mut()).unwrap();
        assert_eq!(pb.num_permits(), MAX);
        assert_state(&sem, 0, 0);
        drop(pb);
        assert_state(&sem, MAX as isize, 0);
    }
}

// ---------------------------------------------------------------------------
// 7. Close
// ---------------------------------------------------------------------------

/// `close` fails every queued waiter, partly served ones included, and wakes
/// each exactly once; a closed waiter's partial permits return to the
/// balance when it is polled.
#[test]
fn close_fails_queued_waiters_and_returns_partial_permits() {
    let sem = Arc::new(Semaphore::new(0));
    let w: Vec<Counted> = (0..3).map(|_| Counted::new()).collect();
    let mut a = pin!(sem.acquire_many(3));
    let mut b = pin!(sem.acquire());
    let mut c = pin!(sem.acquire_many_owned(2));
    w[0].assert_pending(a.as_mut());
    w[1].assert_pending(b.as_mut());
    w[2].assert_pending(c.as_mut());
    sem.add_permits(2); // A holds 2 of 3
    assert_state(&sem, 0, 3);

    sem.close();
    assert!(sem.is_closed());
    assert_eq!(w.iter().map(Counted::wakes).collect::<Vec<_>>(), [1, 1, 1]);
    assert_eq!(sem.queue_len(), 0);
    assert_eq!(w[1].ready(b.as_mut()).unwrap_err(), closed_error());
    assert!(w[2].ready(c.as_mut()).is_err());
    assert!(w[0].ready(a.as_mut()).is_err());
    assert_state(&sem, 2, 0);
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::Closed);
}

/// A closed, partly served waiter that is dropped without being polled
/// also returns its partial permits.
#[test]
fn dropping_a_closed_partly_served_waiter_returns_its_permits() {
    let sem = Semaphore::new(0);
    let mut a = Box::pin(sem.acquire_many(3));
    assert!(poll_noop(a.as_mut()).is_pending());
    sem.add_permits(2);
    sem.close();
    assert_state(&sem, 0, 0);
    drop(a);
    assert_state(&sem, 2, 0);
}

/// After `close`, every way to acquire fails (`try_*` with `Closed`), and
/// the balance is untouched; closing twice is harmless.
#[test]
fn every_acquire_fails_after_close() {
    let sem = Arc::new(Semaphore::new(5));
    sem.close();
    sem.close();
    assert!(sem.is_closed());
    block_on(async {
        assert!(sem.acquire().await.is_err());
        assert!(sem.acquire_many(2).await.is_err());
        assert!(sem.acquire_owned().await.is_err());
        assert!(sem.acquire_many_owned(2).await.is_err());
    });
    assert!(sem.acquire_blocking().is_err());
    assert!(sem.acquire_many_blocking(2).is_err());
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::Closed);
    assert_eq!(
        sem.try_acquire_many(1).unwrap_err(),
        TryAcquireError::Closed
    );
    assert_eq!(
        sem.try_acquire_owned().unwrap_err(),
        TryAcquireError::Closed
    );
    assert_eq!(
        sem.try_acquire_many_owned(1).unwrap_err(),
        TryAcquireError::Closed
    );
    assert_state(&sem, 5, 0);
}

/// Permits held when the semaphore closes stay valid and are returned
/// normally when dropped.
#[test]
fn permits_held_across_close_stay_valid() {
    let sem = Arc::new(Semaphore::new(3));
    let mut p = sem.try_acquire_many(2).unwrap();
    let o = sem.try_acquire_owned().unwrap();
    sem.close();
    assert_eq!((p.num_permits(), o.num_permits()), (2, 1));
    let one = p.split(1).unwrap();
    drop(one);
    assert_state(&sem, 1, 0);
    drop(p);
    drop(o);
    assert_state(&sem, 3, 0);
}

/// `close` wakes more waiters than fit in one wake-up batch, each exactly
/// once.
#[test]
fn close_wakes_more_than_a_batch_of_waiters() {
    let n = scaled(100, 40);
    let sem = Semaphore::new(0);
    let mut futs: Vec<_> = (0..n).map(|_| Box::pin(sem.acquire())).collect();
    let wakers: Vec<Counted> = (0..n).map(|_| Counted::new()).collect();
    for (fut, w) in futs.iter_mut().zip(&wakers) {
        w.assert_pending(fut.as_mut());
    }
    sem.close();
    assert_state(&sem, 0, 0);
    for (fut, w) in futs.iter_mut().zip(&wakers) {
        assert_eq!(w.wakes(), 1);
        assert!(w.ready(fut.as_mut()).is_err());
    }
}

/// `close` wakes a thread blocked in `acquire_blocking` with an error.
#[test]
fn close_wakes_a_blocked_thread() {
    common::with_watchdog("close wakes a blocked thread", WATCHDOG, || {
        let sem = Semaphore::new(1);
        let held = sem.try_acquire().unwrap();
        thread::scope(|s| {
            let blocked = s.spawn(|| sem.acquire_many_blocking(2).map(|p| p.num_permits()));
            spin_until("the thread is queued", || sem.queue_len() == 1);
            sem.close();
            assert_eq!(blocked.join().unwrap(), Err(closed_error()));
        });
        drop(held);
        assert_state(&sem, 1, 0);
    });
}

/// `close` fails every waiter queued when it is called, even if permits come
/// back while it is still waking them (it wakes in batches of 32, with the
/// lock released between batches).
#[test]
fn close_fails_waiters_it_has_not_reached_when_permits_come_back() {
    let sem = Arc::new(Semaphore::new(0));
    // The first waiter's wake-up gives a permit back, as a task woken by
    // `close` on another thread may (a closed, partly served waiter returns
    // its permits; a holder drops its permit).
    let giver = sem.clone();
    let releasing = Waker::from(Arc::new(OnWake(move || giver.add_permits(1))));
    let mut futs: Vec<_> = (0..33).map(|_| Box::pin(sem.acquire())).collect();
    let first = futs[0].as_mut().poll(&mut Context::from_waker(&releasing));
    assert!(first.is_pending());
    for fut in &mut futs[1..] {
        assert!(poll_noop(fut.as_mut()).is_pending());
    }
    assert_state(&sem, 0, 33);

    sem.close();
    for (i, fut) in futs.iter_mut().enumerate() {
        match poll_noop(fut.as_mut()) {
            Poll::Ready(Err(_)) => {}
            other => panic!("waiter {i} was queued at close but got {other:?}"),
        }
    }
    assert_state(&sem, 1, 0); // the permit given back stays in the balance
}

/// An `AcquireError`, obtained the only public way.
fn closed_error() -> AcquireError {
    let sem = Semaphore::new(0);
    sem.close();
    block_on(sem.acquire()).unwrap_err()
}

// ---------------------------------------------------------------------------
// 8. Visibility
// ---------------------------------------------------------------------------

/// A cell guarded only by a semaphore with one permit.
struct Guarded(UnsafeCell<usize>);

// SAFETY: the test touches the cell only while holding the only permit of a
// one-permit semaphore. That the semaphore orders those accesses is exactly
// what the test checks; Miri's data-race detector reports it if it does not.
unsafe impl Sync for Guarded {}

impl Guarded {
    fn get(&self) -> *mut usize {
        self.0.get()
    }
}

/// Plain (non-atomic) writes made while holding a permit are visible to the
/// next holder: permit drop releases, acquire acquires. Natively a weak
/// check; under Miri the data-race detector makes it exact.
#[test]
fn writes_before_release_are_visible_to_the_next_acquirer() {
    let threads = scaled(4, 2);
    let rounds = scaled(500, 10);
    common::with_watchdog("visibility", WATCHDOG, move || {
        let sem = Semaphore::new(1);
        let cell = Guarded(UnsafeCell::new(0));
        thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..rounds {
                        let permit = sem.acquire_blocking().unwrap();
                        // SAFETY: we hold the semaphore's only permit, so no
                        // other thread touches the cell until we drop it.
                        unsafe { *cell.get() += 1 };
                        drop(permit);
                    }
                });
            }
        });
        assert_eq!(cell.0.into_inner(), threads * rounds);
        assert_state(&sem, 1, 0);
    });
}

// ---------------------------------------------------------------------------
// 9. No lost wake-ups: the JDK `RacingReleases` regression (bugs 6801020 and
//    6803402): two acquirers and two releasers race on a semaphore with no
//    permits, many times over.
// ---------------------------------------------------------------------------

const RACING_ROUNDS: usize = scaled(2000, 3);

fn racing_releases_on_threads(fair: bool) {
    common::with_watchdog("racing releases (threads)", WATCHDOG, move || {
        for _ in 0..RACING_ROUNDS {
            let sem = semaphore(fair, 0);
            thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| sem.acquire_blocking().unwrap().forget());
                }
                for _ in 0..2 {
                    s.spawn(|| sem.add_permits(1));
                }
            });
            assert_state(&sem, 0, 0);
        }
    });
}

fn racing_releases_on_tokio(fair: bool) {
    common::with_watchdog("racing releases (tokio)", WATCHDOG, move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..RACING_ROUNDS {
                let sem = Arc::new(semaphore(fair, 0));
                let mut tasks = Vec::new();
                for _ in 0..2 {
                    let sem = sem.clone();
                    tasks.push(tokio::spawn(async move {
                        sem.acquire().await.unwrap().forget()
                    }));
                }
                for _ in 0..2 {
                    let sem = sem.clone();
                    tasks.push(tokio::spawn(async move { sem.add_permits(1) }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
                assert_state(&sem, 0, 0);
            }
        });
    });
}

/// No lost wake-up when releases race acquires: fair, blocking threads.
#[test]
fn racing_releases_wake_every_blocked_thread_fair() {
    racing_releases_on_threads(true);
}

/// No lost wake-up when releases race acquires: unfair, blocking threads.
#[test]
fn racing_releases_wake_every_blocked_thread_unfair() {
    racing_releases_on_threads(false);
}

/// No lost wake-up when releases race acquires: fair, tokio multi-thread.
#[test]
#[cfg_attr(miri, ignore = "tokio's multi-thread runtime is too slow under Miri")]
fn racing_releases_wake_every_task_fair_tokio() {
    racing_releases_on_tokio(true);
}

/// No lost wake-up when releases race acquires: unfair, tokio multi-thread.
#[test]
#[cfg_attr(miri, ignore = "tokio's multi-thread runtime is too slow under Miri")]
fn racing_releases_wake_every_task_unfair_tokio() {
    racing_releases_on_tokio(false);
}

// ---------------------------------------------------------------------------
// 10. Blocking and async acquirers share one line
// ---------------------------------------------------------------------------

/// A blocked thread and an async waiter are served in the order they
/// queued, whichever came first.
#[test]
fn blocking_and_async_acquirers_share_one_fifo_queue() {
    common::with_watchdog("blocking and async share a line", WATCHDOG, || {
        for async_first in [true, false] {
            let sem = Semaphore::new(0);
            let wa = Counted::new();
            let mut a = pin!(sem.acquire());
            let (tx, rx) = mpsc::channel();
            thread::scope(|s| {
                if async_first {
                    wa.assert_pending(a.as_mut());
                }
                s.spawn(|| {
                    let permit = sem.acquire_blocking().unwrap();
                    tx.send(permit.num_permits()).unwrap();
                    permit.forget();
                });
                let queued = if async_first { 2 } else { 1 };
                spin_until("the thread is queued", || sem.queue_len() == queued);
                if !async_first {
                    wa.assert_pending(a.as_mut());
                }
                assert_state(&sem, 0, 2);

                // The thread may still be finishing its own enqueue and serve
                // A itself; A is then woken from that thread, a moment after
                // `add_permits` returns. Wait for the wake-up, then count it.
                sem.add_permits(1);
                if async_first {
                    spin_until("the async waiter is woken", || wa.wakes() > 0);
                    assert_eq!(wa.wakes(), 1);
                    assert_state(&sem, 0, 1); // the thread is still in line
                    assert_eq!(rx.try_recv(), Err(mpsc::TryRecvError::Empty));
                } else {
                    assert_eq!(rx.recv_timeout(PATIENCE), Ok(1));
                    assert_eq!(wa.wakes(), 0);
                    assert_state(&sem, 0, 1);
                }

                sem.add_permits(1);
                if async_first {
                    assert_eq!(rx.recv_timeout(PATIENCE), Ok(1));
                } else {
                    spin_until("the async waiter is woken", || wa.wakes() > 0);
                    assert_eq!(wa.wakes(), 1);
                }
                let pa = wa.ready(a.as_mut()).expect("the async waiter is served");
                assert_state(&sem, 0, 0);
                drop(pa);
            });
            assert_state(&sem, 1, 0); // the thread forgot its permit
        }
    });
}

/// A thread blocked in `acquire_many_blocking` collects permits in line and
/// returns only once it has all of them.
#[test]
fn blocking_acquire_many_waits_for_all_its_permits() {
    common::with_watchdog("blocking acquire_many", WATCHDOG, || {
        let sem = Semaphore::new(0);
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let permit = sem.acquire_many_blocking(3).unwrap();
                tx.send(permit.num_permits()).unwrap();
            });
            spin_until("the thread is queued", || sem.queue_len() == 1);
            sem.add_permits(2);
            assert_state(&sem, 0, 1);
            assert_eq!(rx.try_recv(), Err(mpsc::TryRecvError::Empty));
            sem.add_permits(1);
            assert_eq!(rx.recv_timeout(PATIENCE), Ok(3));
        });
        assert_state(&sem, 3, 0);
    });
}

// ---------------------------------------------------------------------------
// 11. Wakers that panic
//
// Any waker's `wake`, `clone` or `drop` may panic wherever the semaphore
// calls it. Afterwards no permit is lost or duplicated, the line is whole,
// every other waiter that was served or closed is still woken, and the
// panic reaches the caller whose call ran the waker.
// ---------------------------------------------------------------------------

/// [`Rogue`] panics in `wake` and `wake_by_ref`.
const ON_WAKE: u8 = 1;
/// [`Rogue`] panics in `clone`.
const ON_CLONE: u8 = 2;
/// [`Rogue`] panics in `drop`.
const ON_DROP: u8 = 4;
/// How every [`Rogue`] panic message starts.
const ROGUE: &str = "rogue waker";

/// A hand-made waker (a `RawWaker` over an `Arc`) standing for user code
/// that panics: while armed, its `wake`, `clone` or `drop` panics after
/// doing its job otherwise (a panicking wake still counts, a panicking drop
/// still frees), so the tests see the semaphore's behaviour and not a leak.
struct Rogue {
    state: Arc<RogueState>,
    waker: Waker,
}

#[derive(Default)]
struct RogueState {
    /// `ON_WAKE | ON_CLONE | ON_DROP`: what panics now.
    armed: AtomicU8,
    wakes: AtomicUsize,
    panics: AtomicUsize,
    /// Runs inside the next `clone`: another thread acting at exactly that
    /// moment.
    on_clone: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl RogueState {
    fn misbehave(&self, flag: u8, what: &str) {
        if self.armed.load(Ordering::SeqCst) & flag != 0 {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("{ROGUE}: {what}");
        }
    }
}

static ROGUE_VTABLE: RawWakerVTable =
    RawWakerVTable::new(rogue_clone, rogue_wake, rogue_wake_by_ref, rogue_drop);

/// Turns one strong count of `state` into a raw waker.
fn rogue_raw(state: Arc<RogueState>) -> RawWaker {
    RawWaker::new(Arc::into_raw(state).cast(), &ROGUE_VTABLE)
}

/// # Safety
///
/// `data` comes from [`rogue_raw`] and its count is still held.
unsafe fn rogue_clone(data: *const ()) -> RawWaker {
    // SAFETY: the waker being cloned holds a count, so the state is alive.
    let state = unsafe { &*data.cast::<RogueState>() };
    let hook = state.on_clone.lock().unwrap().take();
    if let Some(hook) = hook {
        hook();
    }
    state.misbehave(ON_CLONE, "clone");
    // SAFETY: as above; the new waker owns the new count.
    unsafe { Arc::increment_strong_count(data.cast::<RogueState>()) };
    RawWaker::new(data, &ROGUE_VTABLE)
}

/// # Safety
///
/// As [`rogue_clone`]; consumes the count.
unsafe fn rogue_wake(data: *const ()) {
    // SAFETY: the waker's count, which `wake` consumes; dropped (freed) on
    // the way out, panic or not.
    let state = unsafe { Arc::from_raw(data.cast::<RogueState>()) };
    state.wakes.fetch_add(1, Ordering::SeqCst);
    state.misbehave(ON_WAKE, "wake");
}

/// # Safety
///
/// As [`rogue_clone`].
unsafe fn rogue_wake_by_ref(data: *const ()) {
    // SAFETY: as in `rogue_clone`.
    let state = unsafe { &*data.cast::<RogueState>() };
    state.wakes.fetch_add(1, Ordering::SeqCst);
    state.misbehave(ON_WAKE, "wake_by_ref");
}

/// # Safety
///
/// As [`rogue_clone`]; consumes the count.
unsafe fn rogue_drop(data: *const ()) {
    // SAFETY: the waker's count, released here, panic or not.
    let state = unsafe { Arc::from_raw(data.cast::<RogueState>()) };
    state.misbehave(ON_DROP, "drop");
}

impl Rogue {
    fn new() -> Self {
        quiet_rogues();
        let state = Arc::new(RogueState::default());
        // SAFETY: the vtable keeps the `RawWaker` contract: each waker owns
        // one count of an `Arc` whose contents are `Send + Sync`.
        let waker = unsafe { Waker::from_raw(rogue_raw(state.clone())) };
        Self { state, waker }
    }

    /// Makes `flags` panic from now on.
    fn arm(&self, flags: u8) {
        self.state.armed.store(flags, Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.arm(0);
    }

    /// Runs `hook` inside the next clone of this waker.
    fn on_clone(&self, hook: impl FnOnce() + Send + 'static) {
        *self.state.on_clone.lock().unwrap() = Some(Box::new(hook));
    }

    fn wakes(&self) -> usize {
        self.state.wakes.load(Ordering::SeqCst)
    }

    fn panics(&self) -> usize {
        self.state.panics.load(Ordering::SeqCst)
    }

    /// Polls `fut` once with this waker; `Err` with the message if the poll
    /// panicked.
    fn poll<F: Future + ?Sized>(&self, fut: Pin<&mut F>) -> Result<Poll<F::Output>, String> {
        let mut cx = Context::from_waker(&self.waker);
        catch_unwind(AssertUnwindSafe(|| fut.poll(&mut cx)))
            .map_err(|payload| panic_message(&*payload).to_owned())
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        // Our own waker is dropped next: it must not panic.
        self.disarm();
    }
}

/// Keeps the expected `Rogue` panics out of the test output; every other
/// panic is reported as usual.
fn quiet_rogues() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !panic_message(info.payload()).starts_with(ROGUE) {
                report(info);
            }
        }));
    });
}

/// Runs `f` and returns the message it panicked with, if it did.
fn panicked(f: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(f))
        .err()
        .map(|payload| panic_message(&*payload).to_owned())
}

/// The message of a `Rogue` panic in `what`.
fn rogue(what: &str) -> Option<String> {
    Some(format!("{ROGUE}: {what}"))
}

/// Checks through the public API that the line is whole after a panic: two
/// new waiters queue one behind the other and are served in order, one
/// permit at a time, and the balance ends where it was.
#[track_caller]
fn assert_line_works(sem: &Semaphore) {
    assert_eq!(sem.queue_len(), 0, "nobody is left in line");
    let before = sem.available_permits();
    let all = sem
        .try_acquire_many(before.max(0) as usize)
        .expect("the balance is free");
    let (wx, wy) = (Counted::new(), Counted::new());
    let mut x = pin!(sem.acquire());
    let mut y = pin!(sem.acquire());
    wx.assert_pending(x.as_mut());
    wy.assert_pending(y.as_mut());
    assert_eq!(sem.queue_len(), 2);
    sem.add_permits(1);
    assert_eq!((wx.wakes(), wy.wakes()), (1, 0), "the head is woken first");
    drop(wx.ready(x.as_mut()).expect("the head is served"));
    assert_eq!(wy.wakes(), 1, "then the next");
    drop(wy.ready(y.as_mut()).expect("the next is served"));
    drop(all);
    assert_state(sem, before + 1, 0);
    assert_eq!(sem.forget_permits(1), 1);
}

/// Fault 1: a waker whose drop panics while its acquire queues. The clone
/// the semaphore makes gives a permit back (another thread at that moment),
/// so the acquire takes permits after all and drops the clone it no longer
/// needs. The panic propagates, and the future still owns the permit:
/// polled again it returns it, dropped it gives it back. (Unfair mode used
/// to keep the future marked queued with its node already unlinked: the
/// permit was lost, and the drop unlinked the node a second time.)
#[test]
fn acquire_whose_waker_drop_panics_as_it_queues_keeps_its_permit() {
    for fair in [true, false] {
        for repoll in [true, false] {
            let sem = Arc::new(semaphore(fair, 0));
            let waker = Rogue::new();
            let giver = sem.clone();
            waker.on_clone(move || giver.add_permits(1));
            waker.arm(ON_DROP);
            let mut a = Box::pin(sem.acquire());
            let first = waker.poll(a.as_mut());
            waker.disarm();
            assert_eq!(
                waker.panics(),
                usize::from(first.is_err()),
                "the panic propagates"
            );
            assert_state(&sem, 0, 0);
            match first {
                // The clone was woken, not dropped: nothing panicked.
                Ok(Poll::Ready(permit)) => drop(permit.unwrap()),
                Ok(Poll::Pending) => panic!("the permit was there (fair: {fair})"),
                Err(msg) => {
                    assert_eq!(Some(msg), rogue("drop"));
                    if repoll {
                        let permit = Counted::new().ready(a.as_mut());
                        assert_eq!(permit.unwrap().num_permits(), 1);
                    }
                    drop(a);
                }
            }
            assert_state(&sem, 1, 0);
            assert_line_works(&sem);
        }
    }
}

/// Fault 2: a waker that panics in a batch woken by `add_permits` does not
/// strand the rest of the batch: each was served (fair) or woken to compete
/// (unfair) and is woken; the panic reaches `add_permits`' caller.
#[test]
fn add_permits_wakes_the_whole_batch_when_one_waker_panics() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let waker = Rogue::new();
        let others = [Counted::new(), Counted::new()];
        let mut a = Box::pin(sem.acquire());
        let mut rest: Vec<_> = (0..2).map(|_| Box::pin(sem.acquire())).collect();
        assert!(waker.poll(a.as_mut()).unwrap().is_pending());
        for (fut, w) in rest.iter_mut().zip(&others) {
            w.assert_pending(fut.as_mut());
        }
        waker.arm(ON_WAKE);
        assert_eq!(panicked(|| sem.add_permits(3)), rogue("wake"));
        assert_eq!(waker.wakes(), 1);
        assert_eq!(
            others.each_ref().map(Counted::wakes),
            [1, 1],
            "the rest woken"
        );
        assert_state(&sem, if fair { 0 } else { 3 }, 0);
        let mut held = vec![Counted::new().ready(a.as_mut()).unwrap()];
        for (fut, w) in rest.iter_mut().zip(&others) {
            held.push(w.ready(fut.as_mut()).unwrap());
        }
        assert_state(&sem, 0, 0);
        drop(held);
        assert_state(&sem, 3, 0);
        assert_line_works(&sem);
    }
}

/// Fault 2 through a returned permit: the release that serves (fair) or
/// wakes (unfair) a batch wakes all of it although the first waker panics,
/// and the permit's drop panics with it.
#[test]
fn returned_permit_wakes_the_whole_batch_when_one_waker_panics() {
    for fair in [true, false] {
        let sem = semaphore(fair, 3);
        let hold = sem.try_acquire_many(3).unwrap();
        let waker = Rogue::new();
        let others = [Counted::new(), Counted::new()];
        let mut a = Box::pin(sem.acquire());
        let mut rest: Vec<_> = (0..2).map(|_| Box::pin(sem.acquire())).collect();
        assert!(waker.poll(a.as_mut()).unwrap().is_pending());
        for (fut, w) in rest.iter_mut().zip(&others) {
            w.assert_pending(fut.as_mut());
        }
        waker.arm(ON_WAKE);
        assert_eq!(panicked(move || drop(hold)), rogue("wake"));
        assert_eq!(waker.wakes(), 1);
        assert_eq!(
            others.each_ref().map(Counted::wakes),
            [1, 1],
            "the rest woken"
        );
        assert_state(&sem, if fair { 0 } else { 3 }, 0);
        let mut held = vec![Counted::new().ready(a.as_mut()).unwrap()];
        for (fut, w) in rest.iter_mut().zip(&others) {
            held.push(w.ready(fut.as_mut()).unwrap());
        }
        drop(held);
        assert_state(&sem, 3, 0);
        assert_line_works(&sem);
    }
}

/// A release that serves (fair) or wakes (unfair) only the head wakes it
/// directly; if that waker panics the permit's drop panics, the head still
/// gets the permit and the waiter behind it is still in line.
#[test]
fn returned_permit_that_wakes_one_panicking_waker_still_serves_it() {
    for fair in [true, false] {
        let sem = semaphore(fair, 1);
        let hold = sem.try_acquire().unwrap();
        let (waker, wb) = (Rogue::new(), Counted::new());
        let mut a = Box::pin(sem.acquire());
        let mut b = Box::pin(sem.acquire());
        assert!(waker.poll(a.as_mut()).unwrap().is_pending());
        wb.assert_pending(b.as_mut());
        waker.arm(ON_WAKE);
        assert_eq!(panicked(move || drop(hold)), rogue("wake"));
        assert_eq!((waker.wakes(), wb.wakes()), (1, 0));
        assert_state(&sem, if fair { 0 } else { 1 }, 1);
        let pa = Counted::new().ready(a.as_mut()).unwrap();
        assert_state(&sem, 0, 1);
        drop(pa);
        assert_eq!(
            wb.wakes(),
            1,
            "the next waiter is served when it comes back"
        );
        drop(wb.ready(b.as_mut()).unwrap());
        assert_state(&sem, 1, 0);
        assert_line_works(&sem);
    }
}

/// The same with a line of one: the release hands the permit to the last
/// waiter and empties the line before it wakes it, so when that waker
/// panics the waiter still has the permit, the line is empty (`WAITERS`
/// clear: a newcomer takes the next permit without waiting) and the
/// semaphore works on.
#[test]
fn returned_permit_to_a_lone_waiter_whose_waker_panics_still_serves_it() {
    for fair in [true, false] {
        let sem = semaphore(fair, 1);
        let hold = sem.try_acquire().unwrap();
        let waker = Rogue::new();
        let mut a = Box::pin(sem.acquire());
        assert!(waker.poll(a.as_mut()).unwrap().is_pending());
        waker.arm(ON_WAKE);
        assert_eq!(panicked(move || drop(hold)), rogue("wake"));
        assert_eq!(waker.wakes(), 1);
        assert_state(&sem, if fair { 0 } else { 1 }, 0);
        let pa = Counted::new().ready(a.as_mut()).unwrap();
        assert_state(&sem, 0, 0);
        drop(pa);
        drop(sem.try_acquire().expect("the line is empty"));
        assert_state(&sem, 1, 0);
        assert_line_works(&sem);
    }
}

/// Fault 2 through `close`: a panicking waker (two of them, one in each
/// batch) does not stop `close` from failing and waking every waiter,
/// including those past the first batch of 32.
#[test]
fn close_wakes_every_waiter_when_wakers_panic() {
    let n = 40;
    let rogues = [0, 35];
    let sem = Semaphore::new(0);
    let wakers: Vec<Rogue> = (0..n).map(|_| Rogue::new()).collect();
    let mut futs: Vec<_> = (0..n).map(|_| Box::pin(sem.acquire())).collect();
    for (fut, w) in futs.iter_mut().zip(&wakers) {
        assert!(w.poll(fut.as_mut()).unwrap().is_pending());
    }
    for i in rogues {
        wakers[i].arm(ON_WAKE);
    }
    assert_eq!(panicked(|| sem.close()), rogue("wake"));
    assert_state(&sem, 0, 0);
    for (i, (fut, w)) in futs.iter_mut().zip(&wakers).enumerate() {
        assert_eq!(w.wakes(), 1, "waiter {i} is woken once");
        w.disarm();
        assert!(matches!(w.poll(fut.as_mut()), Ok(Poll::Ready(Err(_)))));
    }
    assert!(sem.try_acquire().is_err());
}

/// Fault 2 through a cancelled acquire: a partly served head that is dropped
/// passes its permits to the waiters behind it, and wakes all of them
/// although the first one's waker panics; the drop panics with it.
#[test]
fn dropping_a_queued_acquire_wakes_everyone_it_serves_when_one_waker_panics() {
    let sem = Semaphore::new(0);
    let (wa, waker, wc) = (Counted::new(), Rogue::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(3));
    let mut b = Box::pin(sem.acquire());
    let mut c = Box::pin(sem.acquire());
    wa.assert_pending(a.as_mut());
    sem.add_permits(2); // A holds 2 of its 3
    assert!(waker.poll(b.as_mut()).unwrap().is_pending());
    wc.assert_pending(c.as_mut());
    assert_state(&sem, 0, 3);
    waker.arm(ON_WAKE);
    assert_eq!(panicked(move || drop(a)), rogue("wake"));
    assert_eq!((waker.wakes(), wc.wakes()), (1, 1), "both served are woken");
    assert_state(&sem, 0, 0);
    let pb = Counted::new().ready(b.as_mut()).unwrap();
    let pc = wc.ready(c.as_mut()).unwrap();
    drop((pb, pc));
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

/// A cancelled acquire drops its own waker after it has served the waiters
/// behind it; if that drop panics and so does one of their wakers, the
/// drop panics once (no abort), the others are woken and nothing is lost.
#[test]
fn dropping_a_queued_acquire_survives_its_own_and_another_panicking_waker() {
    let sem = Semaphore::new(0);
    let (own, waker, wc) = (Rogue::new(), Rogue::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(3));
    let mut b = Box::pin(sem.acquire());
    let mut c = Box::pin(sem.acquire());
    assert!(own.poll(a.as_mut()).unwrap().is_pending());
    sem.add_permits(2);
    assert!(waker.poll(b.as_mut()).unwrap().is_pending());
    wc.assert_pending(c.as_mut());
    own.arm(ON_DROP);
    waker.arm(ON_WAKE);
    let msg = panicked(move || drop(a)).expect("the drop panics");
    assert!(msg.starts_with(ROGUE), "{msg:?}");
    assert_eq!((own.panics(), waker.panics()), (1, 1), "both wakers ran");
    assert_eq!(wc.wakes(), 1);
    assert_state(&sem, 0, 0);
    let pb = Counted::new().ready(b.as_mut()).unwrap();
    drop((pb, wc.ready(c.as_mut()).unwrap()));
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

/// A cancelled acquire whose own waker's drop panics (and nothing else):
/// the drop panics, after it left the line and passed its permits on.
#[test]
fn dropping_a_queued_acquire_whose_waker_drop_panics_passes_its_permits_on() {
    let sem = Semaphore::new(0);
    let (own, wb) = (Rogue::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(2));
    let mut b = Box::pin(sem.acquire());
    assert!(own.poll(a.as_mut()).unwrap().is_pending());
    sem.add_permits(1);
    wb.assert_pending(b.as_mut());
    own.arm(ON_DROP);
    assert_eq!(panicked(move || drop(a)), rogue("drop"));
    assert_eq!(wb.wakes(), 1);
    assert_state(&sem, 0, 0);
    drop(wb.ready(b.as_mut()).unwrap());
    assert_state(&sem, 1, 0);
    assert_line_works(&sem);
}

/// Unfair mode: a woken waiter dropped before it runs passes its wake-up on
/// to the waiters behind it, and wakes all of them although one waker
/// panics.
#[test]
fn unfair_dropped_woken_waiter_passes_its_wake_up_on_when_a_waker_panics() {
    let sem = Semaphore::new_unfair(0);
    let (wa, waker, wc) = (Counted::new(), Rogue::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(2));
    let mut b = Box::pin(sem.acquire());
    let mut c = Box::pin(sem.acquire());
    wa.assert_pending(a.as_mut());
    assert!(waker.poll(b.as_mut()).unwrap().is_pending());
    wc.assert_pending(c.as_mut());
    sem.add_permits(2);
    assert_eq!(wa.wakes(), 1, "A is woken to take both");
    assert_state(&sem, 2, 2);
    waker.arm(ON_WAKE);
    assert_eq!(panicked(move || drop(a)), rogue("wake"));
    assert_eq!((waker.wakes(), wc.wakes()), (1, 1), "B and C are woken");
    assert_state(&sem, 2, 0);
    let pb = Counted::new().ready(b.as_mut()).unwrap();
    drop((pb, wc.ready(c.as_mut()).unwrap()));
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

/// A first poll whose waker's clone panics changes nothing: the future is
/// not queued, and polled again it queues as usual.
#[test]
fn first_poll_whose_waker_clone_panics_changes_nothing() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let waker = Rogue::new();
        waker.arm(ON_CLONE);
        let mut a = Box::pin(sem.acquire());
        assert_eq!(waker.poll(a.as_mut()).err(), rogue("clone"));
        assert_state(&sem, 0, 0);
        let wa = Counted::new();
        wa.assert_pending(a.as_mut());
        assert_state(&sem, 0, 1);
        sem.add_permits(1);
        assert_eq!(wa.wakes(), 1);
        drop(wa.ready(a.as_mut()).unwrap());
        assert_state(&sem, 1, 0);
        assert_line_works(&sem);
    }
}

/// A queued future polled with a new waker whose clone panics keeps its old
/// waker, its place and its permits.
#[test]
fn repoll_whose_new_waker_clone_panics_keeps_the_old_one() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let (old, new) = (Counted::new(), Rogue::new());
        let mut a = Box::pin(sem.acquire());
        old.assert_pending(a.as_mut());
        new.arm(ON_CLONE);
        assert_eq!(new.poll(a.as_mut()).err(), rogue("clone"));
        assert_state(&sem, 0, 1);
        sem.add_permits(1);
        assert_eq!(
            (old.wakes(), new.wakes()),
            (1, 0),
            "woken through the old waker"
        );
        drop(old.ready(a.as_mut()).unwrap());
        assert_state(&sem, 1, 0);
        assert_line_works(&sem);
    }
}

/// A queued future polled with a new waker whose predecessor panics when
/// the semaphore drops it: the poll panics, the new waker is in place.
#[test]
fn repoll_whose_old_waker_drop_panics_installs_the_new_one() {
    for fair in [true, false] {
        let sem = semaphore(fair, 0);
        let (old, new) = (Rogue::new(), Counted::new());
        let mut a = Box::pin(sem.acquire());
        assert!(old.poll(a.as_mut()).unwrap().is_pending());
        old.arm(ON_DROP);
        assert_eq!(panicked(|| drop(new.poll(a.as_mut()))), rogue("drop"));
        old.disarm();
        assert_state(&sem, 0, 1);
        sem.add_permits(1);
        assert_eq!(
            (old.wakes(), new.wakes()),
            (0, 1),
            "woken through the new waker"
        );
        drop(new.ready(a.as_mut()).unwrap());
        assert_state(&sem, 1, 0);
        assert_line_works(&sem);
    }
}

/// Unfair mode: a woken waiter that lost the race goes back into line and
/// clones its waker to do so; if that clone panics, the future is out of
/// line and its wake-up passes on to the waiter behind it, which the
/// permits left can serve.
#[test]
fn unfair_woken_waiter_whose_clone_panics_as_it_requeues_passes_its_wake_up_on() {
    let sem = Semaphore::new_unfair(0);
    let (wa, wb) = (Counted::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(2));
    let mut b = Box::pin(sem.acquire());
    wa.assert_pending(a.as_mut());
    wb.assert_pending(b.as_mut());
    sem.add_permits(2);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 0));
    let newcomer = sem.try_acquire().unwrap(); // barges: A cannot have 2 now
    let waker = Rogue::new();
    waker.arm(ON_CLONE);
    assert_eq!(waker.poll(a.as_mut()).err(), rogue("clone"));
    assert_eq!(wb.wakes(), 1, "B is woken for the permit left");
    assert_state(&sem, 1, 0);
    let pb = wb.ready(b.as_mut()).unwrap();
    drop(a);
    drop((pb, newcomer));
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

/// A permit dropped while its task unwinds from a panic of its own serves
/// (fair) or wakes (unfair) the next waiters as usual; a waker that panics
/// then must not abort the process (a panic during unwinding would): the
/// task's own panic is the one that propagates, and everyone is woken.
#[test]
fn permit_dropped_while_unwinding_survives_a_panicking_waker() {
    for fair in [true, false] {
        for permits in [1, 2] {
            let sem = semaphore(fair, permits);
            let hold = sem.try_acquire_many(permits).unwrap();
            let (waker, wb) = (Rogue::new(), Counted::new());
            let mut a = Box::pin(sem.acquire());
            let mut b = Box::pin(sem.acquire());
            assert!(waker.poll(a.as_mut()).unwrap().is_pending());
            wb.assert_pending(b.as_mut());
            waker.arm(ON_WAKE);
            let msg = panicked(move || {
                let _hold = hold;
                panic!("the task failed");
            });
            assert_eq!(msg.as_deref(), Some("the task failed"));
            assert_eq!((waker.wakes(), wb.wakes()), (1, permits - 1));
            let pa = Counted::new().ready(a.as_mut()).unwrap();
            drop(pa);
            assert_eq!(wb.wakes(), 1);
            drop(wb.ready(b.as_mut()).unwrap());
            assert_state(&sem, permits as isize, 0);
            assert_line_works(&sem);
        }
    }
}

/// An acquire dropped while its task unwinds passes its permits on as usual;
/// a waker of the waiters it serves that panics must not abort the process.
#[test]
fn acquire_dropped_while_unwinding_survives_a_panicking_waker() {
    let sem = Semaphore::new(0);
    let (wa, waker, wc) = (Counted::new(), Rogue::new(), Counted::new());
    let mut a = Box::pin(sem.acquire_many(3));
    let mut b = Box::pin(sem.acquire());
    let mut c = Box::pin(sem.acquire());
    wa.assert_pending(a.as_mut());
    sem.add_permits(2);
    assert!(waker.poll(b.as_mut()).unwrap().is_pending());
    wc.assert_pending(c.as_mut());
    waker.arm(ON_WAKE);
    let msg = panicked(move || {
        let _a = a;
        panic!("the task failed");
    });
    assert_eq!(msg.as_deref(), Some("the task failed"));
    assert_eq!((waker.wakes(), wc.wakes()), (1, 1));
    let pb = Counted::new().ready(b.as_mut()).unwrap();
    drop((pb, wc.ready(c.as_mut()).unwrap()));
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

/// A thread blocked in `acquire_blocking` behind an async waiter whose waker
/// panics is still woken by the release that serves them both.
#[test]
fn blocked_thread_behind_a_panicking_waker_is_woken() {
    let sem = Arc::new(Semaphore::new(0));
    let waker = Rogue::new();
    let mut a = Box::pin(sem.acquire());
    assert!(waker.poll(a.as_mut()).unwrap().is_pending());
    let (tx, rx) = mpsc::channel();
    let s = sem.clone();
    // Not scoped: if the thread is never woken, the test fails instead of
    // hanging on the join.
    let blocked = thread::spawn(move || {
        let permit = s.acquire_blocking().unwrap();
        tx.send(permit.num_permits()).unwrap();
    });
    spin_until("the thread is queued", || sem.queue_len() == 2);
    waker.arm(ON_WAKE);
    assert_eq!(panicked(|| sem.add_permits(2)), rogue("wake"));
    assert_eq!(rx.recv_timeout(PATIENCE), Ok(1), "the thread is woken");
    blocked.join().unwrap();
    drop(Counted::new().ready(a.as_mut()).unwrap());
    assert_state(&sem, 2, 0);
    assert_line_works(&sem);
}

// ---------------------------------------------------------------------------
// 12. Traits, errors, sizes
// ---------------------------------------------------------------------------

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}
fn is_static<T: 'static>() {}
fn is_unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}

/// The semaphore is `Send + Sync` and unwind-safe; permits and futures are
/// `Send`; the owned variants are `'static`; the errors are `Send + Sync`.
#[test]
fn public_types_have_the_promised_auto_traits() {
    is_send::<Semaphore>();
    is_sync::<Semaphore>();
    is_send::<Permit<'static>>();
    is_send::<OwnedPermit>();
    is_send::<Acquire<'static>>();
    is_send::<AcquireOwned>();
    is_static::<OwnedPermit>();
    is_static::<AcquireOwned>();
    is_send::<AcquireError>();
    is_sync::<AcquireError>();
    is_send::<TryAcquireError>();
    is_sync::<TryAcquireError>();
    // A `&Semaphore` can be used in `catch_unwind` without
    // `AssertUnwindSafe`: the queue's lock ignores poisoning, and the
    // semaphore leaves no broken state across a panic. A change of lock must
    // keep this.
    is_unwind_safe::<Semaphore>();
}

/// The errors print the documented messages and implement `Debug`, `Error`,
/// `Clone` and `PartialEq`; `AcquireError` converts to `Closed`.
#[test]
fn errors_display_and_implement_std_traits() {
    let closed = closed_error();
    assert_eq!(closed.to_string(), "semaphore closed");
    assert_eq!(closed.clone(), closed);
    assert!(format!("{closed:?}").contains("AcquireError"));
    assert!((&closed as &dyn Error).source().is_none());

    assert_eq!(
        TryAcquireError::NoPermits.to_string(),
        "no permits available"
    );
    assert_eq!(TryAcquireError::Closed.to_string(), "semaphore closed");
    assert_eq!(format!("{:?}", TryAcquireError::NoPermits), "NoPermits");
    assert_ne!(TryAcquireError::NoPermits, TryAcquireError::Closed);
    let copy = TryAcquireError::Closed;
    #[allow(clippy::clone_on_copy)]
    let cloned = copy.clone();
    assert_eq!(cloned, copy);
    assert_eq!(
        TryAcquireError::from(closed.clone()),
        TryAcquireError::Closed
    );

    let boxed: Box<dyn Error + Send + Sync> = Box::new(closed);
    assert_eq!(boxed.to_string(), "semaphore closed");
    let boxed: Box<dyn Error + Send + Sync> = Box::new(TryAcquireError::NoPermits);
    assert_eq!(boxed.to_string(), "no permits available");
}

/// The acquire future and the permit are no larger than tokio's
/// (88 and 16 bytes on 64-bit targets).
#[test]
fn future_and_permit_are_no_larger_than_tokios() {
    let acquire = size_of::<Acquire<'static>>();
    let permit = size_of::<Permit<'static>>();
    assert!(acquire <= 88, "Acquire is {acquire} bytes");
    assert!(permit <= 16, "Permit is {permit} bytes");
}

/// `Debug` shows the semaphore's state; guards and futures have non-empty
/// `Debug` output.
#[test]
fn debug_output_shows_state() {
    let sem = Arc::new(Semaphore::new_unfair(3));
    let permit = sem.try_acquire().unwrap();
    let text = format!("{sem:?}");
    for part in [
        "available_permits: 2",
        "queue_len: 0",
        "fair: false",
        "closed: false",
    ] {
        assert!(text.contains(part), "{text:?} should contain {part:?}");
    }
    assert!(format!("{permit:?}").contains("permits: 1"));
    let owned = sem.try_acquire_many_owned(2).unwrap();
    assert!(format!("{owned:?}").contains("permits: 2"));
    assert!(format!("{:?}", sem.acquire_many(4)).contains("permits: 4"));
    assert!(format!("{:?}", sem.acquire_many_owned(5)).contains("permits: 5"));
}

/// `Default` is a fair, open semaphore with no permits; `new` is `const`, so
/// a semaphore can be a `static` that hands out `Permit<'static>`.
#[test]
fn default_and_const_construction() {
    static LIMIT: Semaphore = Semaphore::new(2);
    let d = Semaphore::default();
    assert!(d.is_fair() && !d.is_closed());
    assert_state(&d, 0, 0);
    assert!(!Semaphore::new_unfair(0).is_fair());

    let permit: Permit<'static> = LIMIT.try_acquire().unwrap();
    is_static::<Permit<'static>>();
    assert_eq!(LIMIT.available_permits(), 1);
    drop(permit);
}
