//! Every decision that measures time, on tokio's paused clock: a bulkhead
//! measures waits, hold times, deadlines, controlled delay and leaks on
//! the one clock its sleeps run on, so a paused runtime (where no real
//! time passes while virtual time does) sees the durations it made.
#![cfg(feature = "tokio")]

use std::sync::{Arc, Mutex};
use std::time::Duration;
use watertight::CallOptions;

use tokio::time::{Instant, sleep};
use watertight::observer::{LeakSuspected, Observer};
use watertight::{Bulkhead, BulkheadError, RejectReason};

const MS: Duration = Duration::from_millis(1);

/// An observer that only listens: with one installed, every grant's hold
/// time and every wait are measured.
#[derive(Default)]
struct Listening {
    leaks: Mutex<Vec<Duration>>,
}

impl Observer for Listening {
    fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
        self.leaks.lock().unwrap().push(e.held);
    }
}

/// Whether `d` is `expected`, to tokio's millisecond.
fn about(d: Duration, expected: Duration) -> bool {
    d >= expected && d <= expected + 2 * MS
}

/// A `max_wait` rejection says how long the caller waited, on the clock
/// the wait ran on, also when an observer measures every wait (a wait
/// timed on the system's clock reads a few microseconds here for 50 ms of
/// paused time).
#[tokio::test(start_paused = true)]
async fn a_timed_out_wait_reports_the_time_it_waited() {
    for observed in [false, true] {
        let mut builder = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(50 * MS);
        if observed {
            builder = builder.observer(Arc::new(Listening::default()));
        }
        let bh = builder.build().unwrap();
        let _held = bh.try_acquire().unwrap();
        let start = Instant::now();
        let rejected = bh.acquire().await.unwrap_err();
        assert_eq!(rejected.reason(), RejectReason::Timeout);
        assert!(about(start.elapsed(), 50 * MS), "{:?}", start.elapsed());
        assert!(
            about(rejected.waited(), 50 * MS),
            "observed: {observed}, waited {:?}",
            rejected.waited()
        );
    }
}

/// Calls that each hold their permit 100 ms, on a bulkhead of one permit.
async fn held_100ms_each(bh: &Bulkhead, calls: usize) {
    for _ in 0..calls {
        bh.call(async {
            sleep(100 * MS).await;
            Ok::<_, ()>(())
        })
        .await
        .unwrap();
    }
}

/// The hold-time average behind retry hints is timed on the bulkhead's
/// clock: calls that hold their permit 100 ms of paused time give a hint
/// of 100 ms per caller ahead (timed on the system's clock, it would read
/// a few microseconds).
#[tokio::test(start_paused = true)]
async fn the_retry_hint_counts_paused_hold_times() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .observer(Arc::new(Listening::default()))
        .build()
        .unwrap();
    held_100ms_each(&bh, 8).await;
    let _held = bh.try_acquire().unwrap();
    let hint = bh.try_acquire().unwrap_err().retry_after().unwrap();
    assert!(about(hint, 100 * MS), "{hint:?}");
}

/// The same without an observer, where only a sample of the grants is
/// timed: enough calls for the sample to fill the average.
#[tokio::test(start_paused = true)]
async fn the_sampled_hold_times_are_paused_ones_too() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    held_100ms_each(&bh, 400).await;
    let _held = bh.try_acquire().unwrap();
    let hint = bh.try_acquire().unwrap_err().retry_after().unwrap();
    assert!(about(hint, 100 * MS), "{hint:?}");
}

/// Deadline-aware admission judges by the paused hold times: with the one
/// permit held and calls known to hold it 100 ms, a call that has 50 ms
/// left is turned away at once, without waiting (with hold times read on
/// the system's clock it would be admitted into the line, and a paused
/// runtime would never reject a call for lack of time).
#[tokio::test(start_paused = true)]
async fn a_deadline_verdict_uses_the_paused_hold_average() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(10))
        .observer(Arc::new(Listening::default()))
        .build()
        .unwrap();
    held_100ms_each(&bh, 8).await;
    let _held = bh.try_acquire().unwrap();
    let start = Instant::now();
    let out = bh
        .call_with(
            CallOptions::new().deadline((start + 50 * MS).into_std()),
            async { Ok::<_, ()>(()) },
        )
        .await;
    match out {
        Err(BulkheadError::Rejected(r)) => {
            assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
            assert_eq!(r.waited(), Duration::ZERO);
        }
        other => panic!("expected a rejection for the deadline, got {other:?}"),
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "it waited");
    // A deadline that leaves room for the wait and the hold is admitted.
    drop(_held);
    let out = bh
        .call_with(
            CallOptions::new().deadline((Instant::now() + 500 * MS).into_std()),
            async { Ok::<_, ()>(()) },
        )
        .await;
    assert!(out.is_ok(), "{out:?}");
}

/// Controlled delay cuts a standing line by paused waits: with a target
/// of 20 ms, a line that stood an interval has its waiters cut once they
/// waited the target, measured on the paused clock.
/// A deadline given as a time budget starts on the bulkhead's clock, the
/// paused one here: the verdict uses the paused hold average as a deadline
/// does, and a budget that leaves room waits on paused time until it can
/// no longer make it (the wait measured on the paused clock, with no real
/// time passing for it).
#[tokio::test(start_paused = true)]
async fn a_budget_starts_on_the_paused_clock() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    held_100ms_each(&bh, 8).await;
    let held = bh.try_acquire().unwrap();
    let start = Instant::now();
    let short = CallOptions::new().within(50 * MS);
    let out = bh.call_with(short, async { Ok::<_, ()>(()) }).await;
    assert!(
        matches!(&out, Err(e) if e.reason() == Some(RejectReason::WontMakeDeadline)),
        "{out:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "it waited");

    let real = std::time::Instant::now();
    let start = Instant::now();
    let roomy = CallOptions::new().within(2_000 * MS);
    let out = bh.call_with(roomy, async { Ok::<_, ()>(()) }).await;
    let waited = start.elapsed();
    assert!(
        matches!(&out, Err(e) if e.reason() == Some(RejectReason::WontMakeDeadline)),
        "{out:?}"
    );
    // It waits until the budget less the hold average (about 100 ms).
    assert!(
        about(waited, 1_900 * MS),
        "waited {waited:?} of paused time"
    );
    assert!(
        real.elapsed() < Duration::from_secs(1),
        "the wait was paused time"
    );
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn controlled_delay_cuts_by_paused_waits() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(10))
        .queue_delay(20 * MS, 100 * MS)
        .observer(Arc::new(Listening::default()))
        .build()
        .unwrap();
    // One permit, held 50 ms a call, and a new caller every 10 ms: the
    // line stands well past the target for longer than an interval.
    let mut calls = Vec::new();
    for _ in 0..40 {
        let bh = bh.clone();
        calls.push(tokio::spawn(async move {
            let start = Instant::now();
            let out = bh
                .call(async {
                    sleep(50 * MS).await;
                    Ok::<_, ()>(())
                })
                .await;
            (start.elapsed(), out)
        }));
        sleep(10 * MS).await;
    }
    let mut cut = 0;
    for call in calls {
        let (elapsed, out) = call.await.unwrap();
        if let Err(BulkheadError::Rejected(r)) = out {
            assert_eq!(r.reason(), RejectReason::QueueDelay);
            // Cut once it waited the target (or on arrival, behind a
            // standing line), never after `max_wait`.
            assert!(r.waited() <= elapsed, "{:?} > {elapsed:?}", r.waited());
            assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
            cut += 1;
        }
    }
    assert!(cut > 0, "the standing line was never cut");
    assert_eq!(bh.metrics().rejected_queue_delay(), cut);
}

/// A leak watch runs and measures on the paused clock: a permit held past
/// the threshold of paused time is reported once, as held the threshold.
#[tokio::test(start_paused = true)]
async fn a_leak_is_reported_after_paused_time() {
    let listening = Arc::new(Listening::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .leak_threshold(200 * MS)
        .observer(listening.clone())
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    sleep(150 * MS).await;
    assert!(listening.leaks.lock().unwrap().is_empty());
    sleep(100 * MS).await;
    let leaks = listening.leaks.lock().unwrap().clone();
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert!(about(leaks[0], 200 * MS), "{leaks:?}");
    assert_eq!(bh.metrics().leaks_suspected(), 1);
    drop(held);
}
