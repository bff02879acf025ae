//! Priority classes in `Bulkhead` (`BulkheadBuilder::priorities`): each
//! guarantee of the overload guide (`watertight::guide::overload`),
//! through the public API.
//! Waiters are futures polled by hand (a seat handed over is seen at the
//! next poll), so who gets which seat is deterministic.
#![cfg(not(loom))]

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use watertight::CallOptions;

use watertight::observer::{CallOutcome, Finished, Observer, Permitted, Rejection};
use watertight::{
    BuildErrorKind, Bulkhead, BulkheadError, BulkheadPermit, ClassSeats, RejectReason, Rejected,
};

type Waiter<'a> = Pin<Box<dyn Future<Output = Result<BulkheadPermit, Rejected>> + 'a>>;

fn poll<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

fn bulkhead(limit: usize, shares: &[u32]) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent_calls(limit)
        .priorities(shares)
        .build()
        .unwrap()
}

/// A caller of `class` that finds no seat and waits (polled once).
fn waiter(bh: &Bulkhead, class: usize) -> Waiter<'_> {
    let mut w: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(class)));
    assert!(poll(w.as_mut()).is_pending(), "class {class} should wait");
    w
}

/// Polls every waiter once; returns the permits granted, by waiter index.
fn granted(waiters: &mut [Option<Waiter<'_>>]) -> Vec<(usize, BulkheadPermit)> {
    let mut out = Vec::new();
    for (i, slot) in waiters.iter_mut().enumerate() {
        if let Some(w) = slot {
            if let Poll::Ready(r) = poll(w.as_mut()) {
                out.push((i, r.expect("granted")));
                *slot = None;
            }
        }
    }
    out
}

fn held(bh: &Bulkhead) -> Vec<usize> {
    bh.priority_seats().iter().map(|c| c.held).collect()
}

fn seats(bh: &Bulkhead) -> Vec<ClassSeats> {
    bh.priority_seats()
}

#[test]
fn idle_seats_are_lent_to_any_class() {
    let bh = bulkhead(4, &[3, 1]);
    let permits: Vec<_> = (0..4)
        .map(|_| bh.try_acquire_with(CallOptions::new().class(1)).unwrap())
        .collect();
    assert_eq!(held(&bh), [0, 4]);
    assert_eq!(bh.metrics().in_flight(), 4);
    assert_eq!(
        bh.try_acquire_with(CallOptions::new().class(0))
            .unwrap_err()
            .reason(),
        RejectReason::Full
    );
    drop(permits);
    assert_eq!(held(&bh), [0, 0]);
    assert_eq!(bh.metrics().in_flight(), 0);
}

#[test]
fn a_class_always_gets_its_reserved_share_when_it_asks() {
    // The low class borrowed every seat and 100 more of its callers wait;
    // the high class asks for its 6 reserved seats: each of the next 6
    // seats to free is its own.
    let bh = bulkhead(10, &[60, 40]);
    let mut low_held: Vec<_> = (0..10)
        .map(|_| bh.try_acquire_with(CallOptions::new().class(1)).unwrap())
        .collect();
    let mut low: Vec<_> = (0..100).map(|_| Some(waiter(&bh, 1))).collect();
    let mut high: Vec<_> = (0..6).map(|_| Some(waiter(&bh, 0))).collect();
    assert_eq!(bh.metrics().queued(), 106);
    let mut high_held = Vec::new();
    for got in 1..=6 {
        drop(low_held.pop());
        assert!(
            granted(&mut low).is_empty(),
            "a borrower got a seat owed to class 0"
        );
        let g = granted(&mut high);
        assert_eq!(g.len(), 1);
        high_held.extend(g);
        assert_eq!(held(&bh), [got, 10 - got]);
    }
    // Back at its share of 4, the low class gets the next seat.
    drop(low_held.pop());
    let g = granted(&mut low);
    assert_eq!(g.len(), 1);
    assert_eq!(held(&bh), [6, 4]);
    assert_eq!(bh.metrics().queued(), 99);
}

#[test]
fn borrowed_capacity_is_returned_as_soon_as_the_owner_asks() {
    // The high class borrowed every seat and 50 more of its callers wait;
    // the low class (4 reserved) asks: it gets the very next seat, and
    // the next ones until it holds its 4, then no more.
    let bh = bulkhead(10, &[60, 40]);
    let mut high_held: Vec<_> = (0..10)
        .map(|_| bh.try_acquire_with(CallOptions::new().class(0)).unwrap())
        .collect();
    let mut high: Vec<_> = (0..50).map(|_| Some(waiter(&bh, 0))).collect();
    let mut low: Vec<_> = (0..5).map(|_| Some(waiter(&bh, 1))).collect();
    let mut low_held = Vec::new();
    for got in 1..=4 {
        drop(high_held.pop());
        assert!(granted(&mut high).is_empty(), "the borrower kept the seat");
        low_held.extend(granted(&mut low));
        assert_eq!(held(&bh)[1], got);
    }
    drop(high_held.pop());
    assert_eq!(
        granted(&mut low).len(),
        0,
        "the low class borrows only what nobody more important waits for"
    );
    assert_eq!(granted(&mut high).len(), 1);
}

#[test]
fn a_higher_class_never_waits_behind_a_lower_one() {
    // Three classes of 2 seats each. Class 2 borrowed all 6; classes 1, 2
    // and 0 queue, in that order. Seats go to class 0 until it holds its
    // share, then to class 1 (though its callers came first), then class 2
    // takes back its own.
    let bh = bulkhead(6, &[1, 1, 1]);
    let mut c2_held: Vec<_> = (0..6)
        .map(|_| bh.try_acquire_with(CallOptions::new().class(2)).unwrap())
        .collect();
    let mut line: Vec<Option<Waiter<'_>>> = Vec::new();
    let classes = [1, 1, 1, 2, 2, 0, 0, 0];
    for &c in &classes {
        line.push(Some(waiter(&bh, c)));
    }
    let mut order = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..6 {
        drop(c2_held.pop());
        for (i, p) in granted(&mut line) {
            order.push(classes[i]);
            kept.push(p);
        }
    }
    assert_eq!(order, [0, 0, 1, 1, 2, 2]);
    assert_eq!(held(&bh), [2, 2, 2]);
    // Every class at its share; classes 1 and 0 still wait, and class 2
    // now too. A seat of class 2 frees: class 2 takes back its own, ahead
    // of class 0 (which would borrow). One of class 1 frees: class 1 takes
    // it back. Another of class 1 frees, with nobody of class 1 waiting:
    // class 0 borrows it.
    line.push(Some(waiter(&bh, 2)));
    let classes = [1, 1, 1, 2, 2, 0, 0, 0, 2];
    let mut served = Vec::new();
    for seat in [5, 3, 2] {
        drop(kept.remove(seat));
        for (i, p) in granted(&mut line) {
            served.push(classes[i]);
            kept.push(p);
        }
    }
    assert_eq!(served, [2, 1, 0]);
    assert_eq!(held(&bh), [3, 1, 2]);
}

#[test]
fn every_grant_keeps_the_guarantees() {
    // Random arrivals, cancellations and finished calls; before each grant
    // the seats per class are read, and every grant is checked against
    // the rules (the same as the `Seats` property test, through the
    // bulkhead). A seeded xorshift: every run is the same.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as usize
    };
    let bh = Bulkhead::builder()
        .max_concurrent_calls(6)
        .priorities(&[3, 2, 1])
        .max_queue(12)
        .build()
        .unwrap();
    let mut line: Vec<(usize, Waiter<'_>)> = Vec::new();
    let mut running: Vec<(usize, BulkheadPermit)> = Vec::new();
    let mut grants = 0;
    for step in 0..20_000 {
        match rand(10) {
            0..=4 => {
                let class = rand(3);
                let mut w: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(class)));
                match poll(w.as_mut()) {
                    Poll::Ready(Ok(p)) => running.push((class, p)),
                    Poll::Ready(Err(r)) => assert_eq!(r.reason(), RejectReason::Full),
                    Poll::Pending => line.push((class, w)),
                }
            }
            5 if !line.is_empty() => drop(line.remove(rand(line.len() as u64))),
            _ if !running.is_empty() => {
                let mut before = seats(&bh);
                let (released, permit) = running.swap_remove(rand(running.len() as u64));
                drop(permit);
                // The rules look at the seats once this one is back.
                before[released].held -= 1;
                let mut still = Vec::new();
                for (class, mut w) in line.drain(..) {
                    match poll(w.as_mut()) {
                        Poll::Pending => still.push((class, w)),
                        Poll::Ready(Err(r)) => assert_eq!(r.reason(), RejectReason::Displaced),
                        Poll::Ready(Ok(p)) => {
                            grants += 1;
                            let b = &before;
                            for h in 0..class {
                                assert!(
                                    b[h].waiting == 0
                                        || (b[h].held >= b[h].reserved
                                            && b[class].held < b[class].reserved),
                                    "step {step}: class {class} served before class {h}: {b:?}"
                                );
                            }
                            if b[class].held >= b[class].reserved {
                                assert!(
                                    b.iter().all(|o| o.waiting == 0 || o.held >= o.reserved),
                                    "step {step}: a borrower served before an owner: {b:?}"
                                );
                            }
                            running.push((class, p));
                        }
                    }
                }
                line = still;
            }
            _ => {}
        }
        let m = bh.metrics();
        assert_eq!(m.in_flight(), running.len(), "step {step}");
        let s = seats(&bh);
        assert_eq!(s.iter().map(|c| c.waiting).sum::<usize>(), m.queued());
        assert!(
            m.queued() == 0 || m.in_flight() >= 6,
            "step {step}: a seat idles while someone waits"
        );
    }
    assert!(grants > 1_000, "only {grants} grants from the line");
    drop(line);
    drop(running);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));
}

/// Every rejection the bulkhead reports, with its reason.
#[derive(Default)]
struct Seen {
    rejected: Mutex<Vec<RejectReason>>,
    finished: Mutex<Vec<CallOutcome>>,
}

impl Observer for Seen {
    fn on_rejected(&self, e: &Rejection<'_>) {
        self.rejected.lock().unwrap().push(e.reason);
    }
    fn on_finished(&self, e: &Finished<'_>) {
        self.finished.lock().unwrap().push(e.outcome);
    }
}

#[test]
fn the_least_important_are_shed_first() {
    let seen = Arc::new(Seen::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1, 1])
        .max_queue(3)
        .observer(seen.clone())
        .build()
        .unwrap();
    let _running = bh.try_acquire_with(CallOptions::new().class(2)).unwrap();
    let mut mid = waiter(&bh, 1);
    let mut low_old = waiter(&bh, 2);
    let mut low_new = waiter(&bh, 2);
    // Full: a class 0 newcomer displaces the newest class 2 waiter, then
    // the older one, then the class 1 one.
    let _a = waiter(&bh, 0);
    let displaced = poll(low_new.as_mut());
    match displaced {
        Poll::Ready(Err(r)) => {
            assert_eq!(r.reason(), RejectReason::Displaced);
            assert_eq!(r.reason().as_str(), "displaced");
        }
        other => panic!("the newest least important waiter was not displaced: {other:?}"),
    }
    assert!(poll(low_old.as_mut()).is_pending());
    assert!(poll(mid.as_mut()).is_pending());
    let _b = waiter(&bh, 0);
    assert!(matches!(poll(low_old.as_mut()), Poll::Ready(Err(_))));
    assert!(poll(mid.as_mut()).is_pending());
    let _c = waiter(&bh, 0);
    assert!(matches!(poll(mid.as_mut()), Poll::Ready(Err(_))));
    // Nobody less important left: the newcomer is rejected, `Full`.
    let mut d = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    assert_eq!(
        match poll(d.as_mut()) {
            Poll::Ready(Err(r)) => r.reason(),
            _ => panic!("a full line of class 0 took a class 0 newcomer"),
        },
        RejectReason::Full
    );
    let m = bh.metrics();
    assert_eq!(
        (m.rejected_displaced(), m.rejected_full(), m.queued()),
        (3, 1, 3)
    );
    assert_eq!(m.rejected(), 4);
    assert_eq!(
        *seen.rejected.lock().unwrap(),
        [
            RejectReason::Displaced,
            RejectReason::Displaced,
            RejectReason::Displaced,
            RejectReason::Full
        ]
    );
}

#[test]
fn a_displaced_waiter_dropped_before_it_looks_is_counted() {
    let seen = Arc::new(Seen::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_queue(1)
        .observer(seen.clone())
        .build()
        .unwrap();
    let _running = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let low = waiter(&bh, 1);
    let _high = waiter(&bh, 0);
    drop(low);
    assert_eq!(bh.metrics().rejected_displaced(), 1);
    assert_eq!(*seen.rejected.lock().unwrap(), [RejectReason::Displaced]);
    assert_eq!(bh.metrics().queued(), 1);
}

#[test]
fn limit_changes_recompute_the_reserved_seats() {
    let bh = bulkhead(4, &[1, 1]);
    assert_eq!(
        seats(&bh).iter().map(|c| c.reserved).collect::<Vec<_>>(),
        [2, 2]
    );
    let mut high_held: Vec<_> = (0..4)
        .map(|_| bh.try_acquire_with(CallOptions::new().class(0)).unwrap())
        .collect();
    let mut line: Vec<_> = [1, 1, 1, 0, 0]
        .iter()
        .map(|&c| Some(waiter(&bh, c)))
        .collect();
    // Raised to 8 (4 reserved each): the 4 new seats go to class 1, which
    // is owed 4 and holds none, before class 0 borrows more.
    bh.set_max_concurrent_calls(8);
    assert_eq!(
        seats(&bh).iter().map(|c| c.reserved).collect::<Vec<_>>(),
        [4, 4]
    );
    let g: Vec<usize> = granted(&mut line)
        .into_iter()
        .map(|(i, p)| {
            std::mem::forget(p);
            i
        })
        .collect();
    assert_eq!(
        g,
        [0, 1, 2, 3],
        "three class 1 waiters, then class 0 borrows the last"
    );
    assert_eq!(held(&bh), [5, 3]);
    // Lowered to 2: nobody is cut short, nobody served until under it.
    bh.set_max_concurrent_calls(2);
    assert_eq!(
        seats(&bh).iter().map(|c| c.reserved).collect::<Vec<_>>(),
        [1, 1]
    );
    for _ in 0..4 {
        drop(high_held.pop());
        assert!(granted(&mut line).is_empty());
    }
    assert_eq!(bh.metrics().in_flight(), 4); // the 4 forgotten ones
    assert_eq!(bh.metrics().max_concurrent_calls(), 2);
}

#[test]
fn a_plain_call_is_of_the_least_class_and_never_waits() {
    let bh = bulkhead(2, &[1, 1]);
    futures::executor::block_on(async {
        assert_eq!(bh.call(async { Ok::<_, ()>(1) }).await, Ok(1));
        let p = bh.acquire().await.unwrap();
        assert_eq!(held(&bh), [0, 1]);
        let _q = bh.try_acquire().unwrap();
        match bh.call(async { Ok::<_, ()>(2) }).await {
            Err(BulkheadError::Rejected(r)) => assert_eq!(r.reason(), RejectReason::Full),
            other => panic!("{other:?}"),
        }
        assert_eq!(bh.acquire().await.unwrap_err().reason(), RejectReason::Full);
        drop(p);
        assert_eq!(held(&bh), [0, 1]);
    });
    // A plain call does not take a seat while a classed caller waits.
    let p = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let q = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let mut w = waiter(&bh, 1);
    drop(p);
    assert!(bh.try_acquire().is_err());
    assert!(poll(w.as_mut()).is_ready());
    drop(q);
    assert_eq!(bh.metrics().permitted(), 6);
}

/// One rule for a class past the last, at every entry point (the tower
/// layer reads classes from requests, where a panic is no answer): it is
/// the least important class.
#[test]
fn a_class_past_the_last_is_the_least_important() {
    let bh = bulkhead(2, &[1, 1]);
    let p = bh.try_acquire_with(CallOptions::new().class(5)).unwrap();
    let seats = bh.priority_seats();
    assert_eq!((seats[0].held, seats[1].held), (0, 1));
    // The least important class's next caller borrows the idle seat, and
    // then waits in that class's line.
    let q = bh.try_acquire_with(CallOptions::new().class(2)).unwrap();
    assert_eq!(bh.priority_seats()[1].held, 2);
    let mut w = Box::pin(bh.acquire_with(CallOptions::new().class(usize::MAX)));
    assert!(poll(w.as_mut()).is_pending());
    assert_eq!(bh.priority_seats()[1].waiting, 1);
    drop(p);
    assert!(poll(w.as_mut()).is_ready());
    drop((q, w));
    assert_eq!(
        futures::executor::block_on(
            bh.call_with(CallOptions::new().class(7), async { Ok::<_, ()>(1) })
        ),
        Ok(1)
    );
    // Without classes there is one class, 0.
    let plain = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    assert!(plain.priority_seats().is_empty());
    assert_eq!(
        futures::executor::block_on(
            plain.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(3) })
        ),
        Ok(3)
    );
    drop(plain.try_acquire_with(CallOptions::new().class(0)).unwrap());
    drop(futures::executor::block_on(plain.acquire_with(CallOptions::new().class(1))).unwrap());
}

#[test]
fn bad_shares_are_build_errors() {
    let build = |shares: &[u32]| {
        Bulkhead::builder()
            .max_concurrent_calls(2)
            .priorities(shares)
            .build()
            .unwrap_err()
            .kind()
    };
    assert_eq!(build(&[]), BuildErrorKind::NoPriorityShare);
    assert_eq!(build(&[0, 0]), BuildErrorKind::NoPriorityShare);
    // A class with no share has no reserved seat but borrows.
    let bh = bulkhead(2, &[0, 1]);
    assert_eq!(seats(&bh)[0].reserved, 0);
    drop(bh.try_acquire_with(CallOptions::new().class(0)).unwrap());
}

#[test]
fn cancelled_waiters_lose_no_seat() {
    let bh = bulkhead(1, &[1, 1]);
    let running = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    // Dropped while queued: it leaves the line.
    let a = waiter(&bh, 0);
    let b = waiter(&bh, 0);
    assert_eq!(bh.metrics().queued(), 2);
    drop(a);
    assert_eq!(bh.metrics().queued(), 1);
    // Dropped after it was handed the seat but before it looked: the seat
    // goes to the next one.
    let mut c = waiter(&bh, 1);
    drop(running);
    assert_eq!(bh.metrics().queued(), 1);
    drop(b);
    assert_eq!(bh.metrics().in_flight(), 1);
    let p = match poll(c.as_mut()) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("the dropped waiter's seat did not move on: {other:?}"),
    };
    assert_eq!(held(&bh), [0, 1]);
    drop(p);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));
    // A seat granted to the last waiter, dropped: the bulkhead is idle.
    let p = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let w = waiter(&bh, 1);
    drop(p);
    drop(w);
    assert_eq!(held(&bh), [0, 0]);
    futures::executor::block_on(bh.wait_idle());
}

#[test]
fn a_running_classed_call_cancelled_or_panicking_gives_its_seat_back() {
    let seen = Arc::new(Seen::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .observer(seen.clone())
        .build()
        .unwrap();
    let mut call = Box::pin(bh.call_with(
        CallOptions::new().class(1),
        std::future::pending::<Result<(), ()>>(),
    ));
    assert!(poll(call.as_mut()).is_pending());
    assert_eq!(held(&bh), [0, 1]);
    let mut w = waiter(&bh, 0);
    drop(call);
    assert!(poll(w.as_mut()).is_ready());
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut call = Box::pin(bh.call_with(CallOptions::new().class(1), async {
            panic!("the guarded call panics");
            #[allow(unreachable_code)]
            Ok::<(), ()>(())
        }));
        let _ = poll(call.as_mut());
    }));
    assert!(panicked.is_err());
    assert_eq!(held(&bh), [0, 0]);
    assert_eq!(
        *seen.finished.lock().unwrap(),
        [
            CallOutcome::Cancelled,
            CallOutcome::Released,
            CallOutcome::Panicked
        ]
    );
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// An observer that panics when a call is admitted.
struct PanicsOnPermit;

impl Observer for PanicsOnPermit {
    fn on_permitted(&self, _: &Permitted<'_>) {
        panic!("observer panics");
    }
}

#[test]
fn a_panicking_observer_loses_no_seat() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .observer(Arc::new(PanicsOnPermit))
        .build()
        .unwrap();
    // Taken at once: the guard owns the seat before the observer runs.
    assert!(
        catch_unwind(AssertUnwindSafe(
            || bh.try_acquire_with(CallOptions::new().class(0))
        ))
        .is_err()
    );
    assert_eq!(bh.metrics().in_flight(), 0);
    // Handed over from the line: the panic comes out of the waiter's poll.
    bh.set_max_concurrent_calls(0);
    let mut w = Box::pin(bh.acquire_with(CallOptions::new().class(1)));
    assert!(poll(w.as_mut()).is_pending());
    bh.set_max_concurrent_calls(1);
    assert!(catch_unwind(AssertUnwindSafe(|| poll(w.as_mut()))).is_err());
    drop(w);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));
    // A classed call.
    let mut call = Box::pin(bh.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(()) }));
    assert!(catch_unwind(AssertUnwindSafe(|| poll(call.as_mut()))).is_err());
    drop(call);
    assert_eq!(bh.metrics().in_flight(), 0);
    assert_eq!(held(&bh), [0, 0]);
}

#[test]
fn close_rejects_every_classed_waiter() {
    let bh = bulkhead(1, &[1, 1]);
    let p = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let mut a = waiter(&bh, 0);
    let mut b = waiter(&bh, 1);
    bh.close();
    for w in [&mut a, &mut b] {
        match poll(w.as_mut()) {
            Poll::Ready(Err(r)) => assert_eq!(r.reason(), RejectReason::Closed),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(bh.metrics().queued(), 0);
    assert_eq!(
        bh.try_acquire_with(CallOptions::new().class(1))
            .unwrap_err()
            .reason(),
        RejectReason::Closed
    );
    assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Closed);
    drop(p);
    assert_eq!(bh.metrics().in_flight(), 0);
    futures::executor::block_on(bh.wait_idle());
}

// The paused clock moves the default timer only when that is tokio's.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn max_wait_bounds_a_classed_wait() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let p = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let start = tokio::time::Instant::now();
    let r = bh
        .acquire_with(CallOptions::new().class(1))
        .await
        .unwrap_err();
    assert_eq!(r.reason(), RejectReason::Timeout);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(bh.metrics().rejected_timeout(), 1);
    assert_eq!(bh.metrics().queued(), 0);
    // A waiter served in time is not rejected, and wakes without polling.
    let waiting = tokio::spawn({
        let bh = bh.clone();
        async move {
            bh.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(5) })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(bh.metrics().queued(), 1);
    drop(p);
    assert_eq!(waiting.await.unwrap(), Ok(5));
    assert_eq!(bh.metrics().in_flight(), 0);
}

#[test]
fn fail_fast_classes_never_wait() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let _p = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let r = futures::executor::block_on(bh.acquire_with(CallOptions::new().class(0))).unwrap_err();
    assert_eq!(r.reason(), RejectReason::Full);
    assert_eq!(bh.metrics().queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_lose_no_seat() {
    // Many tasks of three classes, some giving up early, on two threads:
    // the gauges come back to zero and the limit is never passed.
    let bh = Bulkhead::builder()
        .max_concurrent_calls(3)
        .priorities(&[2, 1, 1])
        .max_queue(8)
        .max_wait(Duration::from_millis(20))
        .build()
        .unwrap();
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let bh = bh.clone();
            let inside = inside.clone();
            tokio::spawn(async move {
                let call = bh.call_with(CallOptions::new().class(i % 3), async {
                    let n = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // Counted out on drop: the call may be cancelled.
                    let _out = Out(&inside);
                    assert!(n < 3, "more than the limit inside");
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    Ok::<_, ()>(())
                });
                let _ = tokio::time::timeout(Duration::from_millis(1 + (i % 5) as u64), call).await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
    assert_eq!(held(&bh), [0, 0, 0]);
    assert!(m.permitted() > 0);
}

struct Out<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn the_tower_layer_picks_the_class_per_request() {
    use tower::{Service, ServiceBuilder, ServiceExt};
    use watertight::tower::BulkheadLayer;

    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_queue(2)
        .build()
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (release, hold) = tokio::sync::oneshot::channel::<()>();
    let hold = Arc::new(Mutex::new(Some(hold)));
    // (class, name); the first request holds its seat until released. A
    // class past the last (7) is the least important one.
    let mut service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).priority_from(|r: &(usize, &'static str)| r.0))
        .service_fn({
            let order = order.clone();
            move |(_, name): (usize, &'static str)| {
                let order = order.clone();
                let hold = hold.lock().unwrap().take();
                async move {
                    if let Some(hold) = hold {
                        let _ = hold.await;
                    }
                    order.lock().unwrap().push(name);
                    Ok::<_, std::convert::Infallible>(name)
                }
            }
        });
    let first = tokio::spawn(service.ready().await.unwrap().call((1, "first")));
    while bh.metrics().in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let low = tokio::spawn(service.ready().await.unwrap().call((7, "low")));
    let lower = tokio::spawn(service.ready().await.unwrap().call((1, "lower")));
    while bh.metrics().queued() < 2 {
        tokio::task::yield_now().await;
    }
    // The line is full: a class 0 request displaces the newest class 1 one.
    let high = tokio::spawn(service.ready().await.unwrap().call((0, "high")));
    let displaced = lower.await.unwrap().unwrap_err();
    let rejected = displaced.downcast_ref::<Rejected>().expect("a rejection");
    assert_eq!(rejected.reason(), RejectReason::Displaced);
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), "first");
    assert_eq!(high.await.unwrap().unwrap(), "high");
    assert_eq!(low.await.unwrap().unwrap(), "low");
    // The class 0 request, though it came last, was served first.
    assert_eq!(*order.lock().unwrap(), ["first", "high", "low"]);
    assert_eq!(bh.metrics().rejected_displaced(), 1);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));

    // Without `priority_from`, a request is a plain call: it never waits.
    let plain = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()))
        .service_fn(|()| async { Ok::<_, std::convert::Infallible>(()) });
    let _held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let err = plain.oneshot(()).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejected>().unwrap().reason(),
        RejectReason::Full
    );
}

/// With `deadline_from` too, a classed request's expected wait counts the
/// waiters served before it (its class and the more important ones), not
/// the whole line: a critical request behind a long batch line is
/// admitted, and waits no longer than it could still finish.
/// Under tokio's paused clock, which is the bulkhead's (on a loaded
/// machine a real clock let the last wait overrun its deadline).
#[cfg(all(feature = "tower", feature = "tokio"))]
#[tokio::test(start_paused = true)]
async fn a_classed_deadline_counts_only_the_waiters_ahead() {
    use tokio::time::Instant;
    use tower::ServiceExt;
    use watertight::tower::BulkheadLayer;

    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .build()
        .unwrap();
    // Teach the bulkhead that a call holds its seat 20 ms, on the paused
    // clock, which hold times are measured on (enough calls for the
    // sample of timed grants to fill the average).
    for _ in 0..200 {
        let p = bh.acquire_with(CallOptions::new().class(0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(p);
    }
    // (class, deadline in ms from now)
    type Req = (usize, u64);
    let service = tower::ServiceBuilder::new()
        .layer(
            BulkheadLayer::new(bh.clone())
                .priority_from(|r: &Req| r.0)
                .deadline_from(|r: &Req| {
                    Some((Instant::now() + Duration::from_millis(r.1)).into_std())
                }),
        )
        .service_fn(|_: Req| async { Ok::<_, std::convert::Infallible>(()) });
    let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let batch: Vec<_> = (0..20).map(|_| waiter(&bh, 1)).collect();
    // A batch request with 300 ms: 20 ahead of it at ~20 ms each do not
    // fit; turned away at once.
    let start = Instant::now();
    let err = service.clone().oneshot((1, 300)).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejected>().unwrap().reason(),
        RejectReason::WontMakeDeadline
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    // A critical one with 300 ms: nobody ahead of it; it waits, and is
    // served when the seat frees.
    let critical = tokio::spawn(service.clone().oneshot((0, 300)));
    while bh.metrics().queued() < 21 {
        tokio::task::yield_now().await;
    }
    drop(held);
    critical.await.unwrap().unwrap();
    // (Its seat went on to a batch waiter.)
    drop(batch);
    // A critical one whose wait runs past its deadline: out of time,
    // `WontMakeDeadline`, well before a `max_wait` (none is set).
    let held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let start = Instant::now();
    let err = service.clone().oneshot((0, 120)).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejected>().unwrap().reason(),
        RejectReason::WontMakeDeadline
    );
    assert!(
        (Duration::from_millis(1)..Duration::from_millis(120)).contains(&start.elapsed()),
        "{:?}",
        start.elapsed()
    );
    drop(held);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));
}

/// `call_as_by` and `acquire_as_by`: a classed call's deadline counts
/// only the waiters served before its class, is rejected at once if they
/// leave it no time, and bounds its wait to when it could still finish.
/// Under tokio's paused clock, which is the bulkhead's.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn call_as_by_counts_only_the_waiters_served_before_it() {
    use tokio::time::Instant;
    let ms = Duration::from_millis;
    let at = |d: Duration| (Instant::now() + d).into_std();

    let seen = Arc::new(Seen::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .observer(seen.clone())
        .build()
        .unwrap();
    // A call holds its seat 20 ms, on the paused clock, which the hold
    // times are measured on.
    for _ in 0..8 {
        let held = async {
            tokio::time::sleep(ms(20)).await;
            Ok::<_, ()>(())
        };
        bh.call_with(CallOptions::new().class(0).deadline(at(ms(1000))), held)
            .await
            .unwrap();
    }
    let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let batch: Vec<_> = (0..20).map(|_| waiter(&bh, 1)).collect();
    // Batch work with 300 ms behind 20 batch waiters of ~20 ms: turned
    // away at once, not after waiting.
    let start = Instant::now();
    let r = bh
        .acquire_with(CallOptions::new().class(1).deadline(at(ms(300))))
        .await
        .unwrap_err();
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let r = bh
        .call_with(CallOptions::new().class(1).deadline(at(ms(300))), async {
            Ok::<_, ()>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(r, BulkheadError::Rejected(r) if r.reason() == RejectReason::WontMakeDeadline)
    );
    // A critical call with the same 300 ms has nobody ahead of it: it
    // waits, and takes the next seat.
    let critical = tokio::spawn({
        let bh = bh.clone();
        let by = at(ms(300));
        async move {
            bh.call_with(CallOptions::new().class(0).deadline(by), async {
                Ok::<_, ()>(9)
            })
            .await
        }
    });
    while bh.metrics().queued() < 21 {
        tokio::task::yield_now().await;
    }
    drop(held);
    assert_eq!(critical.await.unwrap(), Ok(9));
    drop(batch);
    // A critical call whose wait would run past the latest start that
    // still finishes (120 ms less the average hold, which the instant
    // critical call above brought under 20 ms): rejected then, on the
    // paused clock, before its deadline.
    let held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let start = Instant::now();
    let r = bh
        .acquire_with(CallOptions::new().class(0).deadline(at(ms(120))))
        .await
        .unwrap_err();
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    assert!(
        (ms(1)..ms(120)).contains(&start.elapsed()),
        "{:?}",
        start.elapsed()
    );
    drop(held);
    let m = bh.metrics();
    assert_eq!(
        (m.in_flight(), m.queued(), m.rejected_deadline()),
        (0, 0, 3)
    );
    assert_eq!(
        seen.rejected
            .lock()
            .unwrap()
            .iter()
            .filter(|r| **r == RejectReason::WontMakeDeadline)
            .count(),
        3
    );
    // `acquire_as_by` hands the caller a permit it manages: released, not
    // cancelled, when dropped.
    drop(
        bh.acquire_with(CallOptions::new().class(1).deadline(at(ms(1000))))
            .await
            .unwrap(),
    );
    assert_eq!(
        seen.finished.lock().unwrap().last(),
        Some(&CallOutcome::Released)
    );
}

#[test]
fn call_as_by_without_classes_is_call_by_whatever_its_class() {
    use std::time::Instant;
    let plain = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let by = Instant::now() + Duration::from_secs(5);
    let ok = futures::executor::block_on(
        plain.call_with(CallOptions::new().class(0).deadline(by), async {
            Ok::<_, ()>(4)
        }),
    );
    assert_eq!(ok, Ok(4));
    let ok = futures::executor::block_on(
        plain.call_with(CallOptions::new().class(3).deadline(by), async {
            Ok::<_, ()>(5)
        }),
    );
    assert_eq!(ok, Ok(5));
    let passed = Instant::now() - Duration::from_millis(1);
    let r = futures::executor::block_on(
        plain.acquire_with(CallOptions::new().class(0).deadline(passed)),
    )
    .unwrap_err();
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    // With classes, a class past the last is the least important.
    let bh = bulkhead(2, &[1, 1]);
    let held =
        futures::executor::block_on(bh.acquire_with(CallOptions::new().class(2).deadline(by)))
            .unwrap();
    assert_eq!(bh.priority_seats()[1].held, 1);
    drop(held);
}

#[test]
fn a_classed_call_by_cancelled_or_panicking_loses_no_seat() {
    use std::time::Instant;
    let by = Instant::now() + Duration::from_secs(60);
    let seen = Arc::new(Seen::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .observer(seen.clone())
        .build()
        .unwrap();
    // Dropped while it runs.
    let mut call = Box::pin(bh.call_with(
        CallOptions::new().class(1).deadline(by),
        std::future::pending::<Result<(), ()>>(),
    ));
    assert!(poll(call.as_mut()).is_pending());
    assert_eq!(held(&bh), [0, 1]);
    // Dropped while it waits, and after a seat was handed to it.
    let mut queued = Box::pin(
        bh.call_with(CallOptions::new().class(0).deadline(by), async {
            Ok::<_, ()>(())
        }),
    );
    assert!(poll(queued.as_mut()).is_pending());
    assert_eq!(bh.metrics().queued(), 1);
    let mut next = waiter(&bh, 1);
    drop(call);
    // The seat went to the critical waiter; dropped unpolled, it passes it on.
    drop(queued);
    assert!(poll(next.as_mut()).is_ready());
    assert_eq!(held(&bh), [0, 0]);
    // The guarded call panics.
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut call = Box::pin(
            bh.call_with(CallOptions::new().class(0).deadline(by), async {
                panic!("the guarded call panics");
                #[allow(unreachable_code)]
                Ok::<(), ()>(())
            }),
        );
        let _ = poll(call.as_mut());
    }));
    assert!(panicked.is_err());
    assert_eq!(
        *seen.finished.lock().unwrap(),
        [
            CallOutcome::Cancelled,
            CallOutcome::Released,
            CallOutcome::Panicked
        ]
    );
    // An observer that panics as the call is admitted.
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .observer(Arc::new(PanicsOnPermit))
        .build()
        .unwrap();
    let mut call = Box::pin(
        bh.call_with(CallOptions::new().class(1).deadline(by), async {
            Ok::<_, ()>(())
        }),
    );
    assert!(catch_unwind(AssertUnwindSafe(|| poll(call.as_mut()))).is_err());
    drop(call);
    bh.set_max_concurrent_calls(0);
    let mut w = Box::pin(bh.acquire_with(CallOptions::new().class(0).deadline(by)));
    assert!(poll(w.as_mut()).is_pending());
    bh.set_max_concurrent_calls(1);
    assert!(catch_unwind(AssertUnwindSafe(|| poll(w.as_mut()))).is_err());
    drop(w);
    assert_eq!((bh.metrics().in_flight(), bh.metrics().queued()), (0, 0));
    assert_eq!(held(&bh), [0, 0]);
}

/// Controlled delay with classes: each class's line has its own. A class
/// whose line stands is cut to the target; a class whose line empties
/// between its calls never is; and once the standing line empties, long
/// waits are served again. Under tokio's paused clock.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn controlled_delay_cuts_only_the_class_whose_line_stands() {
    use tokio::time::{Instant, sleep};
    let ms = Duration::from_millis;
    let bh = Bulkhead::builder()
        .max_concurrent_calls(2)
        .priorities(&[1, 1])
        .queue_delay(ms(10), ms(100))
        .max_wait(ms(1000))
        .build()
        .unwrap();
    type Outcome = (usize, Duration, Duration, Result<(), RejectReason>);
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let origin = Instant::now();
    let mut tasks = Vec::new();
    // Class 1: a call every 10 ms for 600 ms, each holding 50 ms (2 seats
    // serve 40 a second: its line stands). Class 0: one every 100 ms.
    for i in 0..60u64 {
        let class = if i % 10 == 5 { 0 } else { 1 };
        let (bh, outcomes) = (bh.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            sleep(ms(10 * i)).await;
            let arrived = origin.elapsed();
            let r = bh
                .acquire_with(CallOptions::new().class(class))
                .await
                .map(|permit| (permit, arrived))
                .map_err(|r| r.reason());
            let waited = origin.elapsed() - arrived;
            if r.is_ok() {
                sleep(ms(50)).await;
            }
            outcomes
                .lock()
                .unwrap()
                .push((class, arrived, waited, r.map(drop)));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();
    // Class 0's line empties between its calls: never cut.
    assert!(
        outcomes.iter().filter(|o| o.0 == 0).all(|o| o.3.is_ok()),
        "{outcomes:?}"
    );
    // Class 1's stands: cut, and nobody waits out max_wait.
    let cut = outcomes
        .iter()
        .filter(|o| o.3 == Err(RejectReason::QueueDelay))
        .count();
    assert!(cut > 10, "{cut} cut: {outcomes:?}");
    assert!(
        outcomes.iter().all(|o| o.3 != Err(RejectReason::Timeout)),
        "{outcomes:?}"
    );
    // A line stands for an interval (100 ms) before it is cut; cut, it
    // empties, which ends the overload, and may stand again. So no wait
    // is longer than the interval and the target (without controlled
    // delay they grow to max_wait), and nobody is cut before the target.
    for o in outcomes.iter().filter(|o| o.0 == 1) {
        assert!(o.2 <= ms(110), "{o:?} in {outcomes:?}");
        if o.3.is_err() {
            assert!(o.2 >= ms(10), "{o:?} in {outcomes:?}");
        }
    }
    let m = bh.metrics();
    assert_eq!(m.rejected_queue_delay(), cut as u64);
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
    // The line emptied: a long wait now is served, not cut.
    let held = [
        bh.try_acquire_with(CallOptions::new().class(1)).unwrap(),
        bh.try_acquire_with(CallOptions::new().class(1)).unwrap(),
    ];
    let waiter = tokio::spawn({
        let bh = bh.clone();
        async move {
            bh.acquire_with(CallOptions::new().class(1))
                .await
                .map(drop)
                .map_err(|r| r.reason())
        }
    });
    sleep(ms(30)).await;
    drop(held);
    assert_eq!(waiter.await.unwrap(), Ok(()));
}

/// An observer that panics on the first rejection it sees.
#[cfg(feature = "tokio")]
#[derive(Default)]
struct PanicsOnFirstRejection(std::sync::atomic::AtomicBool);

#[cfg(feature = "tokio")]
impl Observer for PanicsOnFirstRejection {
    fn on_rejected(&self, _: &Rejection<'_>) {
        if !self.0.swap(true, std::sync::atomic::Ordering::Relaxed) {
            panic!("observer panics");
        }
    }
}

/// The sample that finds a class's line standing cuts every waiter of
/// it past the target at once, one waking the next, even when the first
/// one's observer panics; a waiter that joins after the cut emptied the
/// line is not cut; nothing is lost.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_standing_class_line_is_cut_at_once_even_if_an_observer_panics() {
    use tokio::time::sleep;
    let ms = Duration::from_millis;
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .queue_delay(ms(10), ms(100))
        .observer(Arc::new(PanicsOnFirstRejection::default()))
        .build()
        .unwrap();
    let spawn_waiter = |at: u64, hold: u64| {
        let bh = bh.clone();
        tokio::spawn(async move {
            sleep(ms(at)).await;
            let r = bh
                .acquire_with(CallOptions::new().class(1))
                .await
                .map_err(|r| r.reason());
            if r.is_ok() {
                sleep(ms(hold)).await;
            }
            r.map(drop)
        })
    };
    let seat = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    // Served at 20 ms after 20 ms, holds to 130 ms.
    let first = spawn_waiter(0, 110);
    // Served at 130 ms after 110: the interval is full, the line stands.
    let second = spawn_waiter(20, 100);
    let cut: Vec<_> = (0..3).map(|i| spawn_waiter(21 + i, 0)).collect();
    sleep(ms(20)).await;
    drop(seat);
    sleep(ms(112)).await;
    // At 132 ms: the three behind it were cut as the second was served.
    assert_eq!(bh.metrics().queued(), 0);
    let late = spawn_waiter(0, 0);
    assert_eq!(first.await.unwrap(), Ok(()));
    assert_eq!(second.await.unwrap(), Ok(()));
    let mut outcomes = Vec::new();
    for t in cut {
        outcomes.push(match t.await {
            Ok(r) => format!("{r:?}"),
            Err(e) if e.is_panic() => "observer panicked".to_string(),
            Err(e) => panic!("{e}"),
        });
    }
    assert_eq!(
        outcomes,
        ["observer panicked", "Err(QueueDelay)", "Err(QueueDelay)"]
    );
    // It waited ~100 ms behind the second, past the target, on a line
    // that does not stand (it emptied): served.
    assert_eq!(late.await.unwrap(), Ok(()));
    let m = bh.metrics();
    assert_eq!(m.rejected_queue_delay(), 3);
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
    assert_eq!(held(&bh), [0, 0]);
}

/// Adaptive LIFO with classes: while a class's line stands, its seats go
/// to its newest waiter first; once the line empties, first come first
/// served again. Under tokio's paused clock.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn adaptive_lifo_serves_a_standing_class_newest_first() {
    use tokio::time::sleep;
    let ms = Duration::from_millis;
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .queue_delay(ms(10), ms(100))
        .adaptive_lifo(true)
        .build()
        .unwrap();
    let served: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let spawn_waiter = |name: &'static str, at: u64, hold: u64| {
        let (bh, served) = (bh.clone(), served.clone());
        tokio::spawn(async move {
            sleep(ms(at)).await;
            let permit = bh
                .acquire_with(CallOptions::new().class(1))
                .await
                .map_err(|r| r.reason())?;
            served.lock().unwrap().push(name);
            sleep(ms(hold)).await;
            drop(permit);
            Ok::<_, RejectReason>(())
        })
    };
    let seat = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    // Served at 20 ms after 20: the first long wait.
    let w1 = spawn_waiter("w1", 0, 105);
    // Served at 125 ms after 115: the interval is full, the line stands.
    let w2 = spawn_waiter("w2", 10, 1);
    // Waiting under the target when it does: not cut, served newest first.
    let a = spawn_waiter("a", 120, 1);
    let b = spawn_waiter("b", 122, 1);
    let c = spawn_waiter("c", 124, 1);
    sleep(ms(20)).await;
    drop(seat);
    for t in [w1, w2, a, b, c] {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(*served.lock().unwrap(), ["w1", "w2", "c", "b", "a"]);
    // The line emptied: first come, first served again.
    served.lock().unwrap().clear();
    let seat = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let tasks = [
        spawn_waiter("x", 0, 1),
        spawn_waiter("y", 1, 1),
        spawn_waiter("z", 2, 1),
    ];
    sleep(ms(5)).await;
    drop(seat);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(*served.lock().unwrap(), ["x", "y", "z"]);
    assert_eq!(bh.metrics().rejected_queue_delay(), 0);
}

/// A class whose share is too small for a seat at the limit is
/// guaranteed nothing, as a class of share 0 is: it borrows idle seats
/// only, and a seat that frees goes to a class it is owed to first.
#[test]
fn a_share_too_small_for_a_seat_borrows_only() {
    let bh = bulkhead(1, &[1, 1]);
    let reserved: Vec<_> = bh.priority_seats().iter().map(|c| c.reserved).collect();
    assert_eq!(reserved, [1, 0]);
    // Idle, the seat is lent to the seatless class.
    let borrowed = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    // Both classes wait for it; it goes to class 0, which it is owed to,
    // although class 1 asked first.
    let mut second = waiter(&bh, 1);
    let mut first = waiter(&bh, 0);
    drop(borrowed);
    let Poll::Ready(Ok(owed)) = poll(first.as_mut()) else {
        panic!("the freed seat did not go to the class it is owed to");
    };
    assert!(poll(second.as_mut()).is_pending());
    drop(owed);
    assert!(poll(second.as_mut()).is_ready());
    // The limit grows: the split is redone and the class gets its seat.
    bh.set_max_concurrent_calls(2);
    let reserved: Vec<_> = bh.priority_seats().iter().map(|c| c.reserved).collect();
    assert_eq!(reserved, [1, 1]);
}
