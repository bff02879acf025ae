//! `call_blocking` on `Bulkhead` and `KeyedBulkhead`: plain threads wait in
//! the same line as async callers, under the same `max_wait`, and a panic
//! in the closure (or in an observer) loses no permit.

#![cfg(not(loom))]

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedRejectReason};
use watertight::observer::{Finished, Observer};
use watertight::{Bulkhead, BulkheadError, CallOutcome, RejectReason};

/// Records every finished call's outcome.
#[derive(Default)]
struct Outcomes(Mutex<Vec<CallOutcome>>);

impl Observer for Outcomes {
    fn on_finished(&self, e: &Finished<'_>) {
        self.0.lock().unwrap().push(e.outcome);
    }
}

impl Outcomes {
    fn seen(&self) -> Vec<CallOutcome> {
        self.0.lock().unwrap().clone()
    }
}

/// An observer that panics on every finished call.
struct Rude;

impl Observer for Rude {
    fn on_finished(&self, _: &Finished<'_>) {
        panic!("observer panics on finished");
    }
}

/// A blocking caller waits for a permit held elsewhere, in the bulkhead's
/// line (it is counted as waiting), and is served when the permit comes
/// back; its result and its outcome are the closure's.
#[test]
fn a_blocking_call_waits_in_line_and_runs_when_served() {
    common::with_watchdog("blocking call", Duration::from_secs(20), || {
        let outcomes = Arc::new(Outcomes::default());
        let bh = Bulkhead::builder()
            .max_concurrent_calls(1)
            .observer(outcomes.clone())
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        let waiter = {
            let bh = bh.clone();
            thread::spawn(move || bh.call_blocking(|| Err::<u32, _>("declined")))
        };
        common::spin_until("the blocking caller waits", || bh.metrics().queued() == 1);
        drop(held);
        let out = waiter.join().unwrap();
        assert_eq!(out, Err(BulkheadError::Inner("declined")));
        assert_eq!(bh.call_blocking(|| Ok::<_, ()>(5)), Ok(5));
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.queued()), (0, 0));
        // The held permit's `Released` and the waiter's `Failure` are
        // reported by two threads, in either order.
        let mut seen: Vec<&str> = outcomes.seen().iter().map(|o| o.as_str()).collect();
        seen.sort_unstable();
        assert_eq!(seen, ["failure", "released", "success"]);
    });
}

/// Async and blocking callers share one line, in arrival order: an async
/// waiter that came first is served first.
#[test]
fn blocking_and_async_callers_share_one_fifo_line() {
    common::with_watchdog("shared line", Duration::from_secs(20), || {
        let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = bh.try_acquire().unwrap();
        let first = {
            let (bh, order) = (bh.clone(), order.clone());
            thread::spawn(move || {
                futures::executor::block_on(bh.call(async {
                    order.lock().unwrap().push("async");
                    Ok::<_, ()>(())
                }))
            })
        };
        common::spin_until("the async caller waits", || bh.metrics().queued() == 1);
        let second = {
            let (bh, order) = (bh.clone(), order.clone());
            thread::spawn(move || {
                bh.call_blocking(|| {
                    order.lock().unwrap().push("blocking");
                    Ok::<_, ()>(())
                })
            })
        };
        common::spin_until("both wait", || bh.metrics().queued() == 2);
        drop(held);
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(*order.lock().unwrap(), ["async", "blocking"]);
    });
}

/// `max_wait` bounds a blocking caller's wait, on the bulkhead's timer
/// (the timer thread, on a plain thread), and fail-fast rejects at once.
#[test]
fn max_wait_bounds_a_blocking_wait() {
    let wait = Duration::from_millis(50);
    let bh = Bulkhead::builder()
        .name("scanner")
        .max_concurrent_calls(1)
        .max_wait(wait)
        .build()
        .unwrap();
    let _held = bh.try_acquire().unwrap();
    let before = Instant::now();
    let err = bh.call_blocking(|| Ok::<_, ()>(())).unwrap_err();
    let waited = before.elapsed();
    assert_eq!(err.reason(), Some(RejectReason::Timeout));
    assert!(waited >= wait, "rejected after {waited:?}");
    assert!(
        err.to_string()
            .starts_with(r#"bulkhead "scanner" had no free permit"#)
    );
    let m = bh.metrics();
    assert_eq!((m.rejected_timeout(), m.queued()), (1, 0));

    let fast = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let _held = fast.try_acquire().unwrap();
    let err = fast.call_blocking(|| Ok::<_, ()>(())).unwrap_err();
    assert_eq!(err.reason(), Some(RejectReason::Full));
}

/// Inside a tokio runtime, `spawn_blocking` is where a blocking call
/// belongs: its wait is bounded by the runtime's timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_in_spawn_blocking_keeps_max_wait() {
    let wait = Duration::from_millis(50);
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(wait)
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let before = Instant::now();
    let out = tokio::task::spawn_blocking({
        let bh = bh.clone();
        move || bh.call_blocking(|| Ok::<_, ()>(()))
    })
    .await
    .unwrap();
    let waited = before.elapsed();
    assert_eq!(out.unwrap_err().reason(), Some(RejectReason::Timeout));
    assert!(waited >= wait, "rejected after {waited:?}");
    drop(held);
    let ok = tokio::task::spawn_blocking(move || bh.call_blocking(|| Ok::<_, ()>(3)));
    assert_eq!(ok.await.unwrap(), Ok(3));
}

/// A closure cannot be stopped: past `call_timeout` it still runs to the
/// end, and its result is returned.
#[test]
fn call_timeout_does_not_cut_a_closure_short() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .call_timeout(Duration::from_millis(1))
        .build()
        .unwrap();
    let before = Instant::now();
    let out = bh.call_blocking(|| {
        thread::sleep(Duration::from_millis(20));
        Ok::<_, ()>("done")
    });
    assert!(before.elapsed() >= Duration::from_millis(20));
    assert_eq!(out, Ok("done"));
    assert_eq!(bh.metrics().call_timeouts(), 0);
}

/// A panic in the closure gives the permit back and is reported as
/// `Panicked`; a panicking observer loses nothing either.
#[test]
fn a_panic_in_the_closure_or_an_observer_loses_no_permit() {
    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .observer(outcomes.clone())
        .build()
        .unwrap();
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        bh.call_blocking(|| -> Result<(), ()> { panic!("the call panics") })
    }));
    assert!(panicked.is_err());
    assert_eq!(bh.metrics().in_flight(), 0);
    assert_eq!(outcomes.seen(), [CallOutcome::Panicked]);
    assert_eq!(bh.call_blocking(|| Ok::<_, ()>(1)), Ok(1));

    let rude = Bulkhead::builder()
        .max_concurrent_calls(1)
        .observer(Arc::new(Rude))
        .build()
        .unwrap();
    // The observer's panic reaches the caller, as it does from `call`,
    // once the permit is back.
    let out = catch_unwind(AssertUnwindSafe(|| rude.call_blocking(|| Ok::<_, ()>(2))));
    assert!(out.is_err(), "the observer's panic is passed on");
    assert_eq!(rude.metrics().in_flight(), 0);
    let again = rude.try_acquire();
    assert!(again.is_ok(), "the permit came back");
    let _ = catch_unwind(AssertUnwindSafe(move || drop(again)));
}

/// The keyed bulkhead's blocking call goes through both stages, is
/// rejected by either with its reason, and a panic gives both permits
/// back.
#[test]
fn a_keyed_blocking_call_takes_both_stages() {
    let global = Bulkhead::builder()
        .name("all")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let tenants = KeyedBulkhead::<String>::builder()
        .name("tenants")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .global(global.clone())
        .build()
        .unwrap();
    assert_eq!(tenants.call_blocking("acme", || Ok::<_, ()>(1)), Ok(1));

    let held = tenants.try_acquire("acme").unwrap();
    let err = tenants
        .call_blocking("acme", || Ok::<_, ()>(2))
        .unwrap_err();
    assert_eq!(err.reason(), Some(KeyedRejectReason::KeyFull));
    let err = tenants
        .call_blocking("globex", || Ok::<_, ()>(3))
        .unwrap_err();
    assert_eq!(err.reason(), Some(KeyedRejectReason::GlobalFull));
    drop(held);

    let failed = tenants.call_blocking("acme", || Err::<(), _>("no"));
    assert!(matches!(failed, Err(KeyedError::Inner("no"))));

    let panicked = catch_unwind(AssertUnwindSafe(|| {
        tenants.call_blocking("acme", || -> Result<(), ()> { panic!("the call panics") })
    }));
    assert!(panicked.is_err());
    assert_eq!(global.metrics().in_flight(), 0);
    let acme = tenants.metrics_for("acme").unwrap();
    assert_eq!(acme.in_flight(), 0);
    assert_eq!(tenants.call_blocking("acme", || Ok::<_, ()>(4)), Ok(4));
}
