//! The overload options wired into `Bulkhead` (issue 14): deadline-aware
//! admission (`call_by`, `acquire_by`) and controlled delay
//! (`queue_delay`). Timing tests hold permits for known times on the real
//! clock (the hold-time average behind the estimate is measured on it)
//! and assert with margins that a loaded machine keeps.
#![cfg(not(loom))]

use std::future::{Future, pending};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use bulkhead::observer::{Observer, Rejection};
use bulkhead::timer::{Sleep, ThreadTimer, Timer};
use bulkhead::{Bulkhead, BulkheadBuilder, BulkheadError, RejectReason, Rejected};

const MS: Duration = Duration::from_millis(1);

fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Every rejection the bulkhead reports, with its reason.
#[derive(Default)]
struct Rejections(Mutex<Vec<RejectReason>>);

impl Observer for Rejections {
    fn on_rejected(&self, e: &Rejection<'_>) {
        self.0.lock().unwrap().push(e.reason);
    }
}

impl Rejections {
    fn seen(&self) -> Vec<RejectReason> {
        self.0.lock().unwrap().clone()
    }
}

/// A timer whose clock the bulkhead cannot read: every waiter gets a sleep
/// of its own (no line timer).
#[derive(Debug)]
struct OwnSleeps(ThreadTimer);

impl Timer for OwnSleeps {
    fn sleep(&self, duration: Duration) -> Sleep {
        self.0.sleep(duration)
    }
}

/// The two ways a bulkhead times its line: one timer for the whole line
/// (`ThreadTimer`, whose clock can be read) and a sleep per waiter.
fn timers() -> [(&'static str, Arc<dyn Timer>); 2] {
    [
        ("line timer", Arc::new(ThreadTimer::new())),
        ("own sleeps", Arc::new(OwnSleeps(ThreadTimer::new()))),
    ]
}

/// A bulkhead of one permit whose hold-time average is `hold`: one permit
/// held that long (an observer is installed, so every hold is timed).
fn held_for(builder: BulkheadBuilder, hold: Duration, seen: &Arc<Rejections>) -> Bulkhead {
    let bh = builder
        .max_concurrent_calls(1)
        .observer(seen.clone())
        .build()
        .unwrap();
    let permit = bh.try_acquire().unwrap();
    thread::sleep(hold);
    drop(permit);
    bh
}

fn rejected<T: std::fmt::Debug>(out: Result<T, BulkheadError<()>>) -> Rejected {
    match out {
        Err(BulkheadError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

// ---------------------------------------------------------------------------
// Deadline-aware admission
// ---------------------------------------------------------------------------

#[test]
fn a_passed_deadline_is_rejected_at_once_and_the_call_never_runs() {
    let seen = Arc::new(Rejections::default());
    let bh = Bulkhead::builder()
        .name("ledger")
        .max_concurrent_calls(4)
        .observer(seen.clone())
        .build()
        .unwrap();
    for by in [Instant::now() - MS, Instant::now()] {
        let ran = std::cell::Cell::new(false);
        let call = pin!(bh.call_by(by, async {
            ran.set(true);
            Ok::<_, ()>(())
        }));
        let r = match poll_once(call) {
            Poll::Ready(out) => rejected(out),
            Poll::Pending => panic!("a passed deadline must not wait"),
        };
        assert!(!ran.get(), "the call of a rejected deadline ran");
        assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
        assert_eq!(r.waited(), Duration::ZERO);
        assert_eq!(
            r.to_string(),
            "bulkhead ledger cannot serve the call before its deadline"
        );
    }
    let r = block_on(bh.acquire_by(Instant::now() - MS)).unwrap_err();
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    let m = bh.metrics();
    assert_eq!(
        (m.rejected_deadline(), m.rejected(), m.permitted()),
        (3, 3, 0)
    );
    assert_eq!(seen.seen(), [RejectReason::WontMakeDeadline; 3]);
    assert_eq!(RejectReason::WontMakeDeadline.as_str(), "deadline");
}

#[test]
fn nothing_known_admits_every_deadline_with_time_left() {
    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let by = Instant::now() + Duration::from_secs(5);
    assert_eq!(block_on(bh.call_by(by, async { Ok::<_, ()>(1) })), Ok(1));
    drop(block_on(bh.acquire_by(by)).unwrap());
    assert_eq!(bh.metrics().rejected_deadline(), 0);
}

#[test]
fn a_deadline_the_estimate_cannot_meet_is_rejected_at_once() {
    let seen = Arc::new(Rejections::default());
    let hold = 100 * MS;
    let bh = held_for(
        Bulkhead::builder().max_wait(Duration::from_secs(10)),
        hold,
        &seen,
    );
    // A free permit, but less time than one call takes.
    let started = Instant::now();
    let out = block_on(bh.call_by(started + 50 * MS, async { Ok::<_, ()>(()) }));
    assert_eq!(rejected(out).reason(), RejectReason::WontMakeDeadline);
    // A free permit and time enough: admitted.
    let by = Instant::now() + Duration::from_secs(5);
    assert_eq!(block_on(bh.call_by(by, async { Ok::<_, ()>(2) })), Ok(2));

    // The permit busy: a wait of about one hold, then one hold of work,
    // does not fit in 150 ms; rejected at once, not after waiting.
    let held = bh.try_acquire().unwrap();
    let started = Instant::now();
    let call = pin!(bh.call_by(started + 150 * MS, async { Ok::<_, ()>(()) }));
    let r = match poll_once(call) {
        Poll::Ready(out) => rejected(out),
        Poll::Pending => panic!("expected a rejection at once"),
    };
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    assert!(started.elapsed() < 50 * MS, "{:?}", started.elapsed());
    // With the same hint as any rejection would give (the average is
    // down to about 75 ms after the instant call above).
    let hint = r.retry_after().expect("a hold time is known");
    assert!(hint >= 60 * MS, "{hint:?}");
    let r = block_on(bh.acquire_by(Instant::now() + 150 * MS)).unwrap_err();
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    assert_eq!(bh.metrics().queued(), 0, "nobody waited");
    drop(held);
    assert_eq!(bh.metrics().rejected_deadline(), 3);
    assert_eq!(bh.metrics().in_flight(), 0);
}

#[test]
fn an_admitted_deadline_waits_at_most_until_it_could_still_finish() {
    for (kind, timer) in timers() {
        let seen = Arc::new(Rejections::default());
        let hold = 100 * MS;
        let bh = held_for(
            Bulkhead::builder()
                .max_wait(Duration::from_secs(10))
                .timer(timer),
            hold,
            &seen,
        );
        let held = bh.try_acquire().unwrap();
        // Expected: about 100 ms of waiting and 100 of work, in 500: it
        // waits, for at most 500 - 100 = 400 ms, though max_wait is 10 s.
        let started = Instant::now();
        let by = started + 500 * MS;
        let r = rejected(block_on(bh.call_by(by, async { Ok::<_, ()>(()) })));
        let waited = started.elapsed();
        assert_eq!(r.reason(), RejectReason::WontMakeDeadline, "{kind}");
        assert!(waited >= 390 * MS, "{kind}: rejected after {waited:?}");
        assert!(
            waited < 500 * MS,
            "{kind}: rejected after {waited:?}, past the deadline"
        );
        assert!(r.waited() >= 390 * MS, "{kind}: {:?}", r.waited());
        let r = block_on(bh.acquire_by(Instant::now() + 500 * MS)).unwrap_err();
        assert_eq!(r.reason(), RejectReason::WontMakeDeadline, "{kind}");
        drop(held);

        // Served in time: released after 50 ms, the call runs. (The
        // permits held above raised the average hold to some 400 ms.)
        let held = bh.try_acquire().unwrap();
        let releaser = thread::spawn(move || {
            thread::sleep(50 * MS);
            drop(held);
        });
        let by = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            block_on(bh.call_by(by, async { Ok::<_, ()>(3) })),
            Ok(3),
            "{kind}"
        );
        releaser.join().unwrap();
        let m = bh.metrics();
        assert_eq!(
            (m.rejected_deadline(), m.in_flight(), m.queued()),
            (2, 0, 0)
        );
    }
}

#[test]
fn max_wait_still_bounds_a_deadline_it_ends_sooner() {
    for (kind, timer) in timers() {
        let seen = Arc::new(Rejections::default());
        let bh = held_for(
            Bulkhead::builder().max_wait(50 * MS).timer(timer),
            10 * MS,
            &seen,
        );
        let held = bh.try_acquire().unwrap();
        let by = Instant::now() + Duration::from_secs(5);
        let started = Instant::now();
        let r = rejected(block_on(bh.call_by(by, async { Ok::<_, ()>(()) })));
        assert_eq!(r.reason(), RejectReason::Timeout, "{kind}");
        assert!(started.elapsed() < Duration::from_secs(1), "{kind}");
        drop(held);
        assert_eq!(bh.metrics().rejected_timeout(), 1, "{kind}");
    }
}

#[test]
fn a_deadline_without_max_wait_or_a_timer_of_its_own_still_ends() {
    // No setting needs a timer: the wait sleeps on the default one.
    let seen = Arc::new(Rejections::default());
    let bh = held_for(Bulkhead::builder(), 20 * MS, &seen);
    let held = bh.try_acquire().unwrap();
    let started = Instant::now();
    let r = rejected(block_on(
        bh.call_by(started + 200 * MS, async { Ok::<_, ()>(()) }),
    ));
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    let waited = started.elapsed();
    assert!(waited >= 170 * MS && waited < 200 * MS, "{waited:?}");
    drop(held);
}

/// Cancelled at every point where it can be pending: while it waits (on
/// the line timer or its own sleep, before and after the permit is handed
/// to it), and while the call runs.
#[test]
fn a_cancelled_deadline_call_leaves_the_counts_right() {
    for (kind, timer) in timers() {
        let seen = Arc::new(Rejections::default());
        let bh = held_for(
            Bulkhead::builder()
                .max_wait(Duration::from_secs(10))
                .timer(timer),
            10 * MS,
            &seen,
        );
        let by = || Instant::now() + Duration::from_secs(5);

        // Waiting, then dropped.
        let held = bh.try_acquire().unwrap();
        let mut call = Box::pin(bh.call_by(by(), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().queued(), 1, "{kind}");
        drop(call);
        assert_eq!(bh.metrics().queued(), 0, "{kind}");

        // Handed the permit while waiting, dropped before it saw it.
        let mut call = Box::pin(bh.call_by(by(), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        drop(held);
        drop(call);
        let m = bh.metrics();
        assert_eq!((m.queued(), m.in_flight()), (0, 0), "{kind}");

        // `acquire_by` waiting, then dropped.
        let held = bh.try_acquire().unwrap();
        let mut acquire = Box::pin(bh.acquire_by(by()));
        assert!(poll_once(acquire.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().queued(), 1, "{kind}");
        drop(acquire);
        drop(held);
        let m = bh.metrics();
        assert_eq!((m.queued(), m.in_flight()), (0, 0), "{kind}");

        // Running, then dropped.
        let mut call = Box::pin(bh.call_by(by(), async {
            pending::<()>().await;
            Ok::<_, ()>(())
        }));
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().in_flight(), 1, "{kind}");
        drop(call);
        let m = bh.metrics();
        assert_eq!((m.queued(), m.in_flight()), (0, 0), "{kind}");
        assert!(seen.seen().is_empty(), "{kind}: {:?}", seen.seen());
        // The line still works.
        assert_eq!(block_on(bh.call_by(by(), async { Ok::<_, ()>(4) })), Ok(4));
    }
}

/// Under tokio's paused clock, with the default timer, the deadline is
/// read on tokio's clock: a wait bounded by a deadline ends in virtual
/// time.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_deadline_on_the_paused_tokio_clock() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let started = tokio::time::Instant::now();
    let by = (started + Duration::from_secs(30)).into_std();
    let r = rejected(bh.call_by(by, async { Ok::<_, ()>(()) }).await);
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    // Nothing is known of hold times: it waited until the deadline.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    drop(held);
}
