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
use watertight::CallOptions;

use watertight::observer::{Observer, Rejection};
use watertight::timer::{Sleep, ThreadTimer, Timer};
use watertight::{Bulkhead, BulkheadBuilder, BulkheadError, RejectReason, Rejected};

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
        let call = pin!(bh.call_with(CallOptions::new().deadline(by), async {
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
            r#"bulkhead "ledger" cannot serve the call before its deadline"#
        );
    }
    let r =
        block_on(bh.acquire_with(CallOptions::new().deadline(Instant::now() - MS))).unwrap_err();
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
    assert_eq!(
        block_on(bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(1) })),
        Ok(1)
    );
    drop(block_on(bh.acquire_with(CallOptions::new().deadline(by))).unwrap());
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
    let out = block_on(
        bh.call_with(CallOptions::new().deadline(started + 50 * MS), async {
            Ok::<_, ()>(())
        }),
    );
    assert_eq!(rejected(out).reason(), RejectReason::WontMakeDeadline);
    // A free permit and time enough: admitted.
    let by = Instant::now() + Duration::from_secs(5);
    assert_eq!(
        block_on(bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(2) })),
        Ok(2)
    );

    // The permit busy: a wait of about one hold, then one hold of work,
    // does not fit in 150 ms; rejected at once, not after waiting.
    let held = bh.try_acquire().unwrap();
    let started = Instant::now();
    let call = pin!(
        bh.call_with(CallOptions::new().deadline(started + 150 * MS), async {
            Ok::<_, ()>(())
        })
    );
    let r = match poll_once(call) {
        Poll::Ready(out) => rejected(out),
        Poll::Pending => panic!("expected a rejection at once"),
    };
    // (Ready at the first poll is what "at once" means: no bound on the
    // time it took, which a descheduled thread would break.)
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    // With the same hint as any rejection would give (the average is
    // down to about 75 ms after the instant call above).
    let hint = r.retry_after().expect("a hold time is known");
    assert!(hint >= 60 * MS, "{hint:?}");
    let r = match poll_once(pin!(
        bh.acquire_with(CallOptions::new().deadline(Instant::now() + 150 * MS))
    )) {
        Poll::Ready(r) => r.unwrap_err(),
        Poll::Pending => panic!("expected acquire_by's rejection at once"),
    };
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
        let r = rejected(block_on(
            bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(()) }),
        ));
        let waited = started.elapsed();
        assert_eq!(r.reason(), RejectReason::WontMakeDeadline, "{kind}");
        // Until the deadline less the hold average the bulkhead judged by
        // (about 100 ms; more if the hold's sleep overran on a loaded
        // machine, which ends the wait sooner): the retry hint, with
        // nobody else waiting. Sooner only if rejected at once, rightly:
        // one hold of waiting and one of work did not fit in what was left
        // when it asked (an overrun of 150 ms or more, or this thread
        // descheduled before it asked).
        let judged = r.retry_after().expect("a hold time is known");
        assert!(judged >= hold, "{kind}: {judged:?}");
        let latest_start = (500 * MS).saturating_sub(judged);
        let at_once_fits = judged * 2 + waited >= 500 * MS;
        assert!(
            waited + 10 * MS >= latest_start || at_once_fits,
            "{kind}: rejected after {waited:?}, hold {judged:?}"
        );
        assert!(
            r.waited() + 10 * MS >= latest_start || at_once_fits,
            "{kind}: {:?}",
            r.waited()
        );
        assert!(
            waited < 500 * MS,
            "{kind}: rejected after {waited:?}, past the deadline"
        );
        let r = block_on(bh.acquire_with(CallOptions::new().deadline(Instant::now() + 500 * MS)))
            .unwrap_err();
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
            block_on(bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(3) })),
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
        let r = rejected(block_on(
            bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(()) }),
        ));
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
    // A hold of 100 ms: the wait ends about 100 ms before the deadline,
    // room enough for a late wake-up on a loaded machine (with 20 ms the
    // window was 20 ms). The lower bound allows for the hold's sleep
    // having overrun too.
    let bh = held_for(Bulkhead::builder(), 100 * MS, &seen);
    let held = bh.try_acquire().unwrap();
    let started = Instant::now();
    let r = rejected(block_on(
        bh.call_with(CallOptions::new().deadline(started + 500 * MS), async {
            Ok::<_, ()>(())
        }),
    ));
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    let waited = started.elapsed();
    // As in `an_admitted_deadline_waits_at_most_until_it_could_still_finish`:
    // until the deadline less the average the bulkhead judged by, sooner
    // only if rightly rejected at once.
    let judged = r.retry_after().expect("a hold time is known");
    let at_once_fits = judged * 2 + waited >= 500 * MS;
    assert!(
        waited + 10 * MS >= (500 * MS).saturating_sub(judged) || at_once_fits,
        "{waited:?}, hold {judged:?}"
    );
    assert!(waited < 500 * MS, "{waited:?}");
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
        let mut call =
            Box::pin(bh.call_with(CallOptions::new().deadline(by()), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().queued(), 1, "{kind}");
        drop(call);
        assert_eq!(bh.metrics().queued(), 0, "{kind}");

        // Handed the permit while waiting, dropped before it saw it.
        let mut call =
            Box::pin(bh.call_with(CallOptions::new().deadline(by()), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        drop(held);
        drop(call);
        let m = bh.metrics();
        assert_eq!((m.queued(), m.in_flight()), (0, 0), "{kind}");

        // `acquire_by` waiting, then dropped.
        let held = bh.try_acquire().unwrap();
        let mut acquire = Box::pin(bh.acquire_with(CallOptions::new().deadline(by())));
        assert!(poll_once(acquire.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().queued(), 1, "{kind}");
        drop(acquire);
        drop(held);
        let m = bh.metrics();
        assert_eq!((m.queued(), m.in_flight()), (0, 0), "{kind}");

        // Running, then dropped.
        let mut call = Box::pin(bh.call_with(CallOptions::new().deadline(by()), async {
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
        assert_eq!(
            block_on(bh.call_with(CallOptions::new().deadline(by()), async { Ok::<_, ()>(4) })),
            Ok(4)
        );
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
    let r = rejected(
        bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(()) })
            .await,
    );
    assert_eq!(r.reason(), RejectReason::WontMakeDeadline);
    // Nothing is known of hold times: it waited until the deadline.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    drop(held);
}

// ---------------------------------------------------------------------------
// Controlled delay
// ---------------------------------------------------------------------------

/// When controlled delay first cut a waiter.
#[derive(Default)]
struct FirstCut(Mutex<Option<tokio::time::Instant>>);

impl Observer for FirstCut {
    fn on_rejected(&self, e: &Rejection<'_>) {
        if e.reason == RejectReason::QueueDelay {
            let mut first = self.0.lock().unwrap();
            first.get_or_insert_with(tokio::time::Instant::now);
        }
    }
}

/// One call of the standing-line scenario: when it arrived, and when it
/// was admitted (its work began) and its work ended, or how it was
/// rejected.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    arrived: tokio::time::Instant,
    admitted: Option<tokio::time::Instant>,
    done: Option<tokio::time::Instant>,
    rejected: Option<RejectReason>,
}

/// The standing-line scenario, on the tokio runtime it runs in: one
/// permit, each call holding it `hold`, a call arriving every `gap` for
/// `span` (five times what the permit serves), `max_wait` far above the
/// target. Returns every call and the first cut.
async fn standing_line(
    builder: BulkheadBuilder,
    hold: Duration,
    gap: Duration,
    span: Duration,
) -> (Bulkhead, Vec<Arrival>, Option<tokio::time::Instant>) {
    let first_cut = Arc::new(FirstCut::default());
    let bh = builder
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(5))
        .observer(first_cut.clone())
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut calls = Vec::new();
    while start.elapsed() < span {
        let bh = bh.clone();
        calls.push(tokio::spawn(async move {
            let arrived = tokio::time::Instant::now();
            let out = bh
                .call(async {
                    let admitted = tokio::time::Instant::now();
                    tokio::time::sleep(hold).await;
                    Ok::<_, ()>((admitted, tokio::time::Instant::now()))
                })
                .await;
            match out {
                Ok((admitted, done)) => Arrival {
                    arrived,
                    admitted: Some(admitted),
                    done: Some(done),
                    rejected: None,
                },
                Err(e) => Arrival {
                    arrived,
                    admitted: None,
                    done: None,
                    rejected: Some(e.rejected().expect("a rejection").reason()),
                },
            }
        }));
        tokio::time::sleep(gap).await;
    }
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    let first = *first_cut.0.lock().unwrap();
    (bh, out, first)
}

/// The guarantees of controlled delay on a standing line: it is found
/// standing one interval after the first wait at or above the target (and
/// not before); from then on nobody is admitted having waited more than
/// the target (`slack` is the timer's margin); the cut waiters waited the
/// target; and once the line has emptied, a long wait is served again.
/// With adaptive LIFO (`lifo`), all the same, and while the line stands
/// the callers admitted are the newest: their median wait is a fraction
/// of the target.
///
/// `late`: how much later than the guarantees say a cut may come, on top
/// of `slack`: none on the paused clock, where they are checked exactly.
/// On the real clock a thread descheduled on a loaded machine makes it
/// later, and nothing can bracket that: the timer thread that cuts, or the
/// runtime's that finds the line standing, asleep past the target; or the
/// runtime's asleep so long that the timer cut every waiter, the line
/// emptied (no longer standing) and the next waits were rightly long.
async fn check_standing_line(
    kind: &str,
    timer: Option<Arc<dyn Timer>>,
    (fair, lifo): (bool, bool),
    target: Duration,
    interval: Duration,
    (slack, late): (Duration, Duration),
) {
    let hold = 10 * MS;
    let mut builder = Bulkhead::builder()
        .queue_delay(target, interval)
        .fair(fair)
        .adaptive_lifo(lifo);
    if let Some(timer) = timer {
        builder = builder.timer(timer);
    }
    let (bh, calls, first_cut) = standing_line(builder, hold, 2 * MS, 600 * MS).await;
    let first_cut = first_cut.unwrap_or_else(|| panic!("{kind}: the line was never cut"));
    let waited = |c: &Arrival| c.admitted.map(|at| at - c.arrived);
    // The first wait at or above the target ended when its call was
    // admitted: the interval counts from there.
    let first_long = calls
        .iter()
        .filter(|c| waited(c).is_some_and(|w| w >= target))
        .filter_map(|c| c.admitted)
        .min()
        .unwrap_or_else(|| panic!("{kind}: no wait reached the target"));
    let found = first_cut - first_long;
    assert!(
        found >= interval.saturating_sub(slack) && found <= interval + hold + slack + late,
        "{kind}: found standing {found:?} after the first long wait"
    );
    // Before the cut the line stood well past the target...
    let longest_before = calls
        .iter()
        .filter(|c| c.admitted.is_some_and(|at| at < first_cut))
        .filter_map(waited)
        .max()
        .unwrap();
    assert!(longest_before >= 3 * target, "{kind}: {longest_before:?}");
    // ...and from the cut on, nobody was admitted having waited more than
    // the target. (The grant whose wait found the line standing is made
    // at the cut; the next one a hold later.) Waited until it was handed
    // the permit: when the call admitted before it ended its work (the
    // permit is handed on as that call returns), not when its own work
    // began, which a task run late (a loaded machine, on the real clock)
    // puts later by as long as it was kept waiting for the thread.
    let mut by_admission: Vec<&Arrival> = calls.iter().filter(|c| c.admitted.is_some()).collect();
    by_admission.sort_by_key(|c| c.admitted);
    for pair in by_admission.windows(2) {
        let (before, c) = (pair[0], pair[1]);
        if c.admitted.unwrap() < first_cut + hold / 2 {
            continue;
        }
        let handed = before.done.unwrap().min(c.admitted.unwrap());
        let w = handed.saturating_duration_since(c.arrived);
        assert!(
            w <= target + slack + late,
            "{kind}: admitted after waiting {w:?} at {:?}",
            c.admitted.unwrap() - first_cut
        );
    }
    let cut = calls
        .iter()
        .filter(|c| c.rejected == Some(RejectReason::QueueDelay))
        .count();
    assert!(
        cut > calls.len() / 2,
        "{kind}: {cut} of {} cut",
        calls.len()
    );
    assert!(
        calls
            .iter()
            .all(|c| c.rejected.is_none() || c.rejected == Some(RejectReason::QueueDelay)),
        "{kind}: {calls:?}"
    );
    let m = bh.metrics();
    assert_eq!(m.rejected_queue_delay(), cut as u64, "{kind}");
    assert_eq!((m.in_flight(), m.queued()), (0, 0), "{kind}");
    // While the line stands (from a hold after the cut until arrivals
    // stop), adaptive LIFO serves whoever arrived last, a gap (2 ms) ago at
    // most; FIFO serves the oldest not yet cut, who has waited nearly the
    // target.
    if lifo {
        let last_arrival = calls.last().unwrap().arrived;
        let mut waits: Vec<_> = calls
            .iter()
            .filter(|c| {
                c.admitted
                    .is_some_and(|at| at >= first_cut + hold && at <= last_arrival)
            })
            .filter_map(waited)
            .collect();
        waits.sort();
        assert!(waits.len() > 10, "{kind}: {waits:?}");
        let median = waits[waits.len() / 2];
        assert!(
            median <= target / 4,
            "{kind}: the median wait on the standing line is {median:?}"
        );
    }

    // The line has emptied: a wait of three times the target is served.
    let held = bh.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let bh = bh.clone();
        async move { bh.call(async { Ok::<_, ()>(5) }).await }
    });
    tokio::time::sleep(3 * target).await;
    drop(held);
    assert_eq!(
        waiter.await.unwrap(),
        Ok(5),
        "{kind}: cut after the line emptied"
    );
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_line_is_cut_to_the_target_on_the_paused_clock() {
    // The default timer, on tokio's paused clock: the line timer, and
    // exact virtual times (tokio's timer rounds up to its 1 ms tick).
    check_standing_line(
        "paused",
        None,
        (true, false),
        20 * MS,
        100 * MS,
        (2 * MS, Duration::ZERO),
    )
    .await;
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_line_with_adaptive_lifo_is_cut_to_the_target_on_the_paused_clock() {
    // The newest first while the line stands, and still nobody admitted
    // having waited past the target.
    check_standing_line(
        "paused, lifo",
        None,
        (true, true),
        20 * MS,
        100 * MS,
        (2 * MS, Duration::ZERO),
    )
    .await;
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_line_is_cut_to_the_target_with_a_sleep_per_waiter_on_the_paused_clock() {
    // Unfair: no line timer, so each waiter sleeps on its own (the
    // default timer, on tokio's paused clock): cut at its target.
    check_standing_line(
        "paused, own sleeps",
        None,
        (false, false),
        20 * MS,
        100 * MS,
        (2 * MS, Duration::ZERO),
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_standing_line_is_cut_to_the_target() {
    for (kind, timer) in timers() {
        // 100 ms late at most: far under the waits of a line left standing
        // (hundreds of milliseconds by the end), which is what the real
        // clock's run is for; the bounds themselves are the paused runs'.
        check_standing_line(
            kind,
            Some(timer),
            (true, false),
            30 * MS,
            100 * MS,
            (25 * MS, 100 * MS),
        )
        .await;
    }
}

#[test]
fn a_burst_shorter_than_the_interval_is_left_alone() {
    for (kind, timer) in timers() {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(5))
            .queue_delay(5 * MS, Duration::from_secs(60))
            .timer(timer)
            .build()
            .unwrap();
        // Ten waiters, each waiting far past the target, all served: the
        // line never stood for an interval.
        let held = bh.try_acquire().unwrap();
        let mut calls: Vec<_> = (0..10)
            .map(|i| Box::pin(bh.call(async move { Ok::<_, ()>(i) })))
            .collect();
        for call in &mut calls {
            assert!(poll_once(call.as_mut()).is_pending(), "{kind}");
        }
        thread::sleep(30 * MS);
        drop(held);
        for (i, call) in calls.into_iter().enumerate() {
            thread::sleep(10 * MS);
            assert_eq!(block_on(call), Ok(i), "{kind}");
        }
        assert_eq!(bh.metrics().rejected_queue_delay(), 0, "{kind}");
    }
}

#[test]
fn a_zero_target_is_refused() {
    let err = Bulkhead::builder()
        .max_concurrent_calls(1)
        .queue_delay(Duration::ZERO, 100 * MS)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), watertight::BuildErrorKind::ZeroQueueDelayTarget);
    let builder = Bulkhead::builder().queue_delay(5 * MS, 100 * MS);
    assert!(format!("{builder:?}").contains("queue_delay: Some((5ms, 100ms))"));
    assert_eq!(RejectReason::QueueDelay.as_str(), "queue_delay");
}

/// Cancelled while it waits on a standing line, with either timer: the
/// counts stay right, and a line emptied by cancellations is no longer
/// standing.
#[test]
fn cancelled_waiters_on_a_standing_line_leave_the_counts_right() {
    for (kind, timer) in timers() {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(5))
            // Standing at the first wait of 2 ms or more.
            .queue_delay(2 * MS, Duration::ZERO)
            .timer(timer)
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        let mut first = Box::pin(bh.call(async { Ok::<_, ()>(1) }));
        let mut second = Box::pin(bh.call(async { Ok::<_, ()>(2) }));
        assert!(poll_once(first.as_mut()).is_pending(), "{kind}");
        assert!(poll_once(second.as_mut()).is_pending(), "{kind}");
        thread::sleep(5 * MS);
        // `first` waited past the target: its grant finds the line standing.
        drop(held);
        let mut third = Box::pin(bh.call(async {
            pending::<()>().await;
            Ok::<_, ()>(3)
        }));
        assert!(poll_once(third.as_mut()).is_pending(), "{kind}");
        assert_eq!(block_on(first.as_mut()), Ok(1), "{kind}");
        // `second` has waited past the target on a standing line: cut.
        let r = rejected(block_on(second.as_mut()));
        assert_eq!(r.reason(), RejectReason::QueueDelay, "{kind}");
        assert!(r.waited() >= 2 * MS, "{kind}: {:?}", r.waited());
        assert_eq!(
            r.to_string(),
            r#"bulkhead "bulkhead" is overloaded: its waiting line stood past its target wait"#
        );
        // `third` runs (it arrived after the grant, so found a free
        // permit or waited under the target); a fourth waits, cancelled.
        let m = bh.metrics();
        assert_eq!(m.in_flight(), 1, "{kind}");
        let mut fourth = Box::pin(bh.call(async { Ok::<_, ()>(4) }));
        assert!(poll_once(fourth.as_mut()).is_pending(), "{kind}");
        assert_eq!(bh.metrics().queued(), 1, "{kind}");
        drop(fourth);
        drop(third);
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.queued()), (0, 0), "{kind}");
        // The line emptied: a long wait is served again.
        let held = bh.try_acquire().unwrap();
        let mut fifth = Box::pin(bh.call(async { Ok::<_, ()>(5) }));
        assert!(poll_once(fifth.as_mut()).is_pending(), "{kind}");
        thread::sleep(10 * MS);
        let mut sixth = Box::pin(bh.call(async { Ok::<_, ()>(6) }));
        assert!(poll_once(sixth.as_mut()).is_pending(), "{kind}");
        drop(held);
        // `fifth` waited 10 ms: standing again (interval zero) at its
        // grant, which cuts `sixth` only once it has waited 2 ms.
        assert_eq!(block_on(fifth), Ok(5), "{kind}");
        let out = block_on(sixth);
        assert!(
            out == Ok(6) || rejected(out).reason() == RejectReason::QueueDelay,
            "{kind}"
        );
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.queued()), (0, 0), "{kind}");
    }
}

/// The moment the line is found standing, every waiter already past the
/// target is cut at once, not when a permit next frees (here a second
/// later) or its `max_wait` runs out: with the line timer, and with a
/// sleep per waiter (unfair: no line timer).
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_waiters_past_the_target_are_cut_as_the_line_is_found_standing() {
    for fair in [true, false] {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(60))
            // Standing at the first wait of 20 ms or more.
            .queue_delay(20 * MS, Duration::ZERO)
            .fair(fair)
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        let start = tokio::time::Instant::now();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let bh = bh.clone();
                tokio::spawn(async move {
                    let out = bh
                        .call(async {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            Ok::<_, ()>(())
                        })
                        .await;
                    (out, tokio::time::Instant::now())
                })
            })
            .collect();
        tokio::time::sleep(50 * MS).await;
        // The first waiter's grant (after 50 ms) finds the line standing.
        drop(held);
        let mut cut = 0;
        for waiter in waiters {
            let (out, at) = waiter.await.unwrap();
            match out {
                Ok(()) => assert!(at - start >= Duration::from_secs(1)),
                Err(e) => {
                    let reason = e.rejected().unwrap().reason();
                    assert_eq!(reason, RejectReason::QueueDelay, "fair {fair}");
                    let when = at - start;
                    assert!(when < 55 * MS, "fair {fair}: cut after {when:?}");
                    cut += 1;
                }
            }
        }
        assert_eq!(cut, 2, "fair {fair}");
    }
}

/// A line is standing only while someone stands in it: when the waiter
/// whose wait finds it standing was the last one, the line is empty, and
/// the next caller that waits past the target is served, not cut. The
/// same through `call` and `acquire` (whose acquire leaves the line
/// before the sample is taken, where `call`'s leaves after), with the
/// line timer and with a sleep per waiter.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_last_waiter_finding_the_line_standing_leaves_it_empty_not_standing() {
    for (timed, through_call) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut builder = Bulkhead::builder()
            .max_concurrent_calls(1)
            // Standing at the first wait of 20 ms or more.
            .queue_delay(20 * MS, Duration::ZERO);
        if timed {
            builder = builder.max_wait(Duration::from_secs(60));
        }
        let bh = builder.build().unwrap();
        let wait = |bh: &Bulkhead| {
            let bh = bh.clone();
            tokio::spawn(async move {
                let hold = || tokio::time::sleep(50 * MS);
                if through_call {
                    let call = async {
                        hold().await;
                        Ok::<_, ()>(())
                    };
                    bh.call(call)
                        .await
                        .map_err(|e| e.rejected().unwrap().reason())
                } else {
                    let permit = bh.acquire().await.map_err(|r| r.reason())?;
                    hold().await;
                    drop(permit);
                    Ok(())
                }
            })
        };
        let held = bh.try_acquire().unwrap();
        let first = wait(&bh);
        tokio::time::sleep(50 * MS).await;
        // Served after 50 ms, with nobody behind it.
        drop(held);
        tokio::task::yield_now().await;
        // Waits 50 ms behind it, past the target: served.
        let second = wait(&bh);
        let case = format!("line timer {timed}, call {through_call}");
        assert_eq!(first.await.unwrap(), Ok(()), "{case}");
        assert_eq!(second.await.unwrap(), Ok(()), "{case}");
        assert_eq!(bh.metrics().rejected_queue_delay(), 0, "{case}");
    }
}

/// A controlled-delay target at or above `max_wait` would never cut a
/// line (every wait ends first): refused at build, as is one on a
/// bulkhead that fails fast; one below `max_wait` is kept.
#[test]
fn a_queue_delay_target_must_be_below_max_wait() {
    let build = |max_wait: Duration, target: Duration| {
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(max_wait)
            .queue_delay(target, Duration::from_millis(100))
            .build()
    };
    let ms = Duration::from_millis;
    for (max_wait, target) in [(ms(50), ms(50)), (ms(50), ms(80)), (Duration::ZERO, ms(5))] {
        let err = build(max_wait, target).unwrap_err();
        assert_eq!(
            err.kind(),
            watertight::BuildErrorKind::QueueDelayTargetNotBelowMaxWait
        );
        assert_eq!(
            err.to_string(),
            "the target of queue_delay must be below max_wait"
        );
    }
    assert!(build(ms(51), ms(50)).is_ok());
    // Without `max_wait` a caller waits as long as it takes: any target.
    assert!(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .queue_delay(ms(500), ms(100))
            .build()
            .is_ok()
    );
}
