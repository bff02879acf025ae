//! Adaptive LIFO (`BulkheadBuilder::adaptive_lifo`, issue 14): while the
//! controlled-delay line stands, a freed permit goes to the newest waiter;
//! once the line has emptied, to the oldest again. All on tokio's paused
//! clock, with explicit orders of events: no assertion rests on a timing
//! margin of the machine.
#![cfg(all(not(loom), feature = "tokio"))]

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use watertight::observer::{Finished, Observer, Permitted, Rejection};
use watertight::{BuildErrorKind, Bulkhead, BulkheadBuilder, BulkheadPermit, Rejected};

const MS: Duration = Duration::from_millis(1);
/// The target wait; the interval is zero, so the line stands at the first
/// wait of the target or more.
const TARGET: Duration = Duration::from_millis(100);

fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// The two ways a line is timed: one timer for the whole line (with
/// `max_wait`) and a sleep per waiter (without `max_wait`, the line timer
/// has nothing to keep: each waiter's sleep fires at the target).
fn lines() -> [(&'static str, BulkheadBuilder); 2] {
    let base = || {
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .queue_delay(TARGET, Duration::ZERO)
            .adaptive_lifo(true)
    };
    [
        ("line timer", base().max_wait(Duration::from_secs(60))),
        ("own sleeps", base()),
    ]
}

/// Counts calls in flight as an exporter's gauge would, and panics once
/// in `on_permitted` or `on_rejected` when armed.
#[derive(Default)]
struct Hooks {
    in_flight: AtomicUsize,
    panic_on_permitted: AtomicBool,
    panic_on_rejected: AtomicBool,
}

impl Observer for Hooks {
    fn on_permitted(&self, _: &Permitted<'_>) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        assert!(
            !self.panic_on_permitted.swap(false, Ordering::SeqCst),
            "the observer panics in on_permitted"
        );
    }
    fn on_rejected(&self, _: &Rejection<'_>) {
        assert!(
            !self.panic_on_rejected.swap(false, Ordering::SeqCst),
            "the observer panics in on_rejected"
        );
    }
    fn on_finished(&self, _: &Finished<'_>) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An acquire future of a bulkhead, pinned.
type Waiting<'a> = Pin<Box<dyn Future<Output = Result<BulkheadPermit, Rejected>> + 'a>>;

/// With the line empty (not standing), two waiters behind a held permit
/// are served oldest first, as FIFO.
#[track_caller]
fn assert_oldest_first(bh: &Bulkhead, kind: &str) {
    let held = bh.try_acquire().unwrap();
    let (mut e, mut f) = (Box::pin(bh.acquire()), Box::pin(bh.acquire()));
    assert!(poll_once(e.as_mut()).is_pending(), "{kind}");
    assert!(poll_once(f.as_mut()).is_pending(), "{kind}");
    drop(held);
    assert!(poll_once(f.as_mut()).is_pending(), "{kind}: FIFO again");
    assert!(
        matches!(poll_once(e.as_mut()), Poll::Ready(Ok(_))),
        "{kind}"
    );
    drop(e);
    assert!(
        matches!(poll_once(f.as_mut()), Poll::Ready(Ok(_))),
        "{kind}"
    );
}

/// Makes the line stand: a waiter waits past the target and is served
/// (its permit is returned, to hold while others queue), with another
/// (`oldest`, returned, which joined just before) still in line, so that
/// the line does not empty.
async fn stand(bh: &Bulkhead) -> (BulkheadPermit, Waiting<'_>) {
    let held = bh.try_acquire().unwrap();
    let mut first = Box::pin(bh.acquire());
    assert!(poll_once(first.as_mut()).is_pending());
    tokio::time::advance(TARGET + 50 * MS).await;
    let mut oldest: Waiting<'_> = Box::pin(bh.acquire());
    assert!(poll_once(oldest.as_mut()).is_pending());
    drop(held);
    match poll_once(first.as_mut()) {
        Poll::Ready(Ok(permit)) => (permit, oldest),
        other => panic!("the first waiter is served: {other:?}"),
    }
}

/// While the line stands the newest waiter is served first, none of them
/// past the target; once it has emptied, arrival order again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_newest_waiter_is_served_first_while_the_line_stands_then_fifo_again() {
    for (kind, builder) in lines() {
        let bh = builder.build().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let call = |i: u32, hold: Duration| {
            let (bh, order) = (bh.clone(), order.clone());
            tokio::spawn(async move {
                bh.call(async move {
                    order.lock().unwrap().push(i);
                    tokio::time::sleep(hold).await;
                    Ok::<_, ()>(())
                })
                .await
            })
        };
        let held = bh.try_acquire().unwrap();
        let mut calls = vec![call(0, 50 * MS)];
        tokio::time::sleep(TARGET + 40 * MS).await;
        calls.push(call(1, 10 * MS));
        tokio::time::sleep(10 * MS).await;
        // `0` waited 150 ms: its grant finds the line standing (with `1`
        // in it).
        drop(held);
        tokio::time::sleep(10 * MS).await;
        for i in 2..=3 {
            calls.push(call(i, 10 * MS));
            tokio::time::sleep(MS).await;
        }
        for c in calls {
            assert_eq!(c.await.unwrap(), Ok(()), "{kind}");
        }
        // `3` joined last and was served first; `1`, the oldest, waited
        // 80 ms, under the target: nobody was cut.
        assert_eq!(*order.lock().unwrap(), [0, 3, 2, 1], "{kind}");
        let m = bh.metrics();
        assert_eq!(m.rejected_queue_delay(), 0, "{kind}");
        assert_eq!((m.in_flight(), m.queued()), (0, 0), "{kind}");

        // The line emptied: waits under the target, served in arrival order.
        order.lock().unwrap().clear();
        let held = bh.try_acquire().unwrap();
        let mut calls = Vec::new();
        for i in 4..=6 {
            calls.push(call(i, MS));
            tokio::time::sleep(MS).await;
        }
        tokio::time::sleep(10 * MS).await;
        drop(held);
        for c in calls {
            assert_eq!(c.await.unwrap(), Ok(()), "{kind}");
        }
        assert_eq!(*order.lock().unwrap(), [4, 5, 6], "{kind}: FIFO again");
    }
}

/// Cancellation at every await point with the line standing: a waiter
/// dropped before its first poll, one dropped just after it was handed a
/// permit (which moves on to the newest waiter left), one dropped while it
/// waits (which empties the line: arrival order again). No permit lost,
/// every count right.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiter_dropped_at_any_point_passes_its_permit_on_in_the_current_order() {
    for (kind, builder) in lines() {
        let hooks = Arc::new(Hooks::default());
        let bh = builder.observer(hooks.clone()).build().unwrap();
        let (p0, mut a) = stand(&bh).await;
        // Dropped before it was ever polled: never in line.
        drop(bh.acquire());
        let (mut b, mut c) = (Box::pin(bh.acquire()), Box::pin(bh.acquire()));
        for w in [&mut b, &mut c] {
            assert!(poll_once(w.as_mut()).is_pending(), "{kind}");
        }
        assert_eq!(bh.metrics().queued(), 3, "{kind}");
        // `c`, the newest, is handed the permit, and dropped before it
        // takes it: the permit goes to `b`, the newest left.
        drop(p0);
        drop(c);
        assert!(poll_once(a.as_mut()).is_pending(), "{kind}");
        let pb = match poll_once(b.as_mut()) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{kind}: the newest left is served: {other:?}"),
        };
        drop(b);
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.queued()), (1, 1), "{kind}");
        // A newcomer is newer than `a`: served next.
        let mut d = Box::pin(bh.acquire());
        assert!(poll_once(d.as_mut()).is_pending(), "{kind}");
        drop(pb);
        assert!(poll_once(a.as_mut()).is_pending(), "{kind}");
        let pd = match poll_once(d.as_mut()) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{kind}: the newcomer is served: {other:?}"),
        };
        drop(d);
        // `a` gives up while it waits: the line is empty.
        drop(a);
        assert_eq!(bh.metrics().queued(), 0, "{kind}");
        drop(pd);
        let m = bh.metrics();
        assert_eq!(
            (m.in_flight(), m.queued(), m.available()),
            (0, 0, 1),
            "{kind}"
        );
        assert_eq!(m.rejected(), 0, "{kind}");
        assert_eq!(hooks.in_flight.load(Ordering::SeqCst), 0, "{kind}");
        // The line emptied: the oldest is served first again.
        assert_oldest_first(&bh, kind);
    }
}

/// A call dropped while it runs, with the line standing: its permit goes
/// to the newest waiter.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_running_call_dropped_hands_its_permit_to_the_newest_waiter() {
    for (kind, builder) in lines() {
        let bh = builder.build().unwrap();
        let (p0, mut oldest) = stand(&bh).await;
        let mut running = Box::pin(bh.call(std::future::pending::<Result<(), ()>>()));
        let mut newest = Box::pin(bh.call(async { Ok::<_, ()>("newest") }));
        assert!(poll_once(running.as_mut()).is_pending(), "{kind}");
        assert!(poll_once(newest.as_mut()).is_pending(), "{kind}");
        // `newest` joined last: served first, it completes at once.
        drop(p0);
        assert_eq!(
            poll_once(newest.as_mut()),
            Poll::Ready(Ok("newest")),
            "{kind}"
        );
        // Its permit came back to `running`, the newest left, which now
        // runs; dropped mid-call, it gives the permit back, to the newest
        // waiter again.
        assert!(poll_once(running.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().in_flight(), 1, "{kind}");
        let mut last = Box::pin(bh.call(async { Ok::<_, ()>("last") }));
        assert!(poll_once(last.as_mut()).is_pending(), "{kind}");
        drop(running);
        assert!(poll_once(oldest.as_mut()).is_pending(), "{kind}");
        assert_eq!(poll_once(last.as_mut()), Poll::Ready(Ok("last")), "{kind}");
        assert!(
            matches!(poll_once(oldest.as_mut()), Poll::Ready(Ok(_))),
            "{kind}"
        );
        drop(oldest);
        let m = bh.metrics();
        assert_eq!(
            (m.in_flight(), m.queued(), m.available()),
            (0, 0, 1),
            "{kind}"
        );
    }
}

/// An observer that panics as the newest waiter is admitted, or as an old
/// one is cut: the panic comes out of that waiter's poll, its permit goes
/// on to the newest waiter left, the counts and the observer's gauge stay
/// right, and the line that emptied serves in arrival order again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_observer_that_panics_on_this_path_loses_no_permit() {
    for (kind, builder) in lines() {
        let hooks = Arc::new(Hooks::default());
        let bh = builder.observer(hooks.clone()).build().unwrap();
        let (p0, mut a) = stand(&bh).await;
        let (mut b, mut c) = (Box::pin(bh.acquire()), Box::pin(bh.acquire()));
        for w in [&mut b, &mut c] {
            assert!(poll_once(w.as_mut()).is_pending(), "{kind}");
        }
        hooks.panic_on_permitted.store(true, Ordering::SeqCst);
        drop(p0);
        let out = catch_unwind(AssertUnwindSafe(|| poll_once(c.as_mut())));
        assert!(out.is_err(), "{kind}: the panic comes out of the poll");
        drop(c);
        assert!(poll_once(a.as_mut()).is_pending(), "{kind}");
        let pb = match poll_once(b.as_mut()) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{kind}: the newest left is served: {other:?}"),
        };
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.queued()), (1, 1), "{kind}");
        assert_eq!(hooks.in_flight.load(Ordering::SeqCst), 1, "{kind}");
        // `a` waits past the target on the standing line: cut, and the
        // observer panics as it hears of it.
        hooks.panic_on_rejected.store(true, Ordering::SeqCst);
        tokio::time::advance(TARGET + 10 * MS).await;
        // Whether the line's timer or the waiter's own sleep woke it: the
        // poll finds it past the target.
        let out = catch_unwind(AssertUnwindSafe(|| poll_once(a.as_mut())));
        assert!(out.is_err(), "{kind}: the panic comes out of the poll");
        drop(a);
        drop(pb);
        let m = bh.metrics();
        assert_eq!(
            (m.in_flight(), m.queued(), m.available()),
            (0, 0, 1),
            "{kind}"
        );
        assert_eq!(m.rejected_queue_delay(), 1, "{kind}");
        assert_eq!(hooks.in_flight.load(Ordering::SeqCst), 0, "{kind}");
        // The line emptied: the oldest first again.
        assert_oldest_first(&bh, kind);
    }
}

#[test]
fn adaptive_lifo_needs_queue_delay_and_a_fair_bulkhead() {
    let err = Bulkhead::builder()
        .max_concurrent_calls(1)
        .adaptive_lifo(true)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::AdaptiveLifoWithoutQueueDelay);
    assert_eq!(
        err.to_string(),
        "adaptive_lifo needs queue_delay, which finds when the line stands"
    );
    let err = Bulkhead::builder()
        .max_concurrent_calls(1)
        .queue_delay(5 * MS, 100 * MS)
        .adaptive_lifo(true)
        .fair(false)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::AdaptiveLifoUnfair);
    // With priorities, each class's line has it (tests/priorities.rs).
    assert!(
        Bulkhead::builder()
            .max_concurrent_calls(2)
            .priorities(&[1, 1])
            .queue_delay(5 * MS, 100 * MS)
            .adaptive_lifo(true)
            .build()
            .is_ok()
    );
    // Off is off, and `false` needs nothing.
    assert!(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .adaptive_lifo(false)
            .build()
            .is_ok()
    );
    let builder = Bulkhead::builder().adaptive_lifo(true);
    assert!(format!("{builder:?}").contains("adaptive_lifo: true"));
}

/// Without `adaptive_lifo`, a standing line still serves its oldest
/// waiter first (the control for the tests above).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_adaptive_lifo_a_standing_line_stays_fifo() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(60))
        .queue_delay(TARGET, Duration::ZERO)
        .build()
        .unwrap();
    let (p0, mut a) = stand(&bh).await;
    let mut b = Box::pin(bh.acquire());
    assert!(poll_once(b.as_mut()).is_pending());
    drop(p0);
    assert!(poll_once(b.as_mut()).is_pending());
    assert!(matches!(poll_once(a.as_mut()), Poll::Ready(Ok(_))));
}
