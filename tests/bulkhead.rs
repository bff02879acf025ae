//! The bulkhead policy: admission, waiting, rejection, timeouts, limits at
//! runtime, shutdown, metrics and observer hooks.
#![cfg(not(loom))]

use std::future::{Future, pending};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use watertight::CallOptions;

mod common;

use std::error::Error;

use futures::executor::block_on;
use watertight::observer::{Finished, Observer, Permitted, Rejection};
use watertight::{
    BuildErrorKind, Bulkhead, BulkheadError, CallOutcome, Metrics, RejectReason, Rejected,
};

fn poll_noop<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

fn bulkhead(limit: usize) -> Bulkhead {
    Bulkhead::builder()
        .name("test")
        .max_concurrent_calls(limit)
        .build()
        .unwrap()
}

/// Everything an observer saw, in order.
#[derive(Debug, Default)]
struct Recorder {
    events: Mutex<Vec<String>>,
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.events.lock().unwrap())
    }
}

impl Observer for Recorder {
    fn on_permitted(&self, e: &Permitted<'_>) {
        self.events
            .lock()
            .unwrap()
            .push(format!("permitted {}", e.name));
    }
    fn on_rejected(&self, e: &Rejection<'_>) {
        self.events
            .lock()
            .unwrap()
            .push(format!("rejected {} {}", e.name, e.reason));
    }
    fn on_finished(&self, e: &Finished<'_>) {
        self.events
            .lock()
            .unwrap()
            .push(format!("finished {} {}", e.name, e.outcome));
    }
}

fn observed(limit: usize) -> (Bulkhead, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let bh = Bulkhead::builder()
        .name("obs")
        .max_concurrent_calls(limit)
        .call_timeout(Duration::from_millis(50))
        .observer(rec.clone())
        .build()
        .unwrap();
    (bh, rec)
}

/// Bad configurations are errors with a kind and a message, not panics.
#[test]
fn bad_configurations_are_build_errors() {
    let kind = |b: watertight::BulkheadBuilder| b.build().unwrap_err().kind();
    assert_eq!(kind(Bulkhead::builder()), BuildErrorKind::MissingLimit);
    assert_eq!(
        kind(Bulkhead::builder().max_concurrent_calls(0)),
        BuildErrorKind::ZeroLimit
    );
    assert_eq!(
        kind(Bulkhead::builder().max_concurrent_calls(watertight::Semaphore::MAX_PERMITS + 1)),
        BuildErrorKind::LimitTooLarge
    );
    assert_eq!(
        kind(Bulkhead::builder().name("").max_concurrent_calls(1)),
        BuildErrorKind::EmptyName
    );
    assert_eq!(
        kind(
            Bulkhead::builder()
                .max_concurrent_calls(1)
                .call_timeout(Duration::ZERO)
        ),
        BuildErrorKind::ZeroCallTimeout
    );
    let err = Bulkhead::builder().build().unwrap_err();
    assert_eq!(err.to_string(), "max_concurrent_calls must be set");
}

/// `BulkheadError`'s `Display` names the bulkhead and says what happened:
/// a rejection and a call timeout display as themselves, the call's own
/// error is the source, and the chain goes on from there.
#[test]
fn a_call_error_returns_its_cause_from_source_without_repeating_it() {
    let bh = Bulkhead::builder()
        .name("ledger")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .call_timeout(Duration::from_millis(10))
        .build()
        .unwrap();

    let failed = block_on(bh.call(async { Err::<(), _>(common::Declined) })).unwrap_err();
    assert_eq!(
        common::error_chain(&failed, 1),
        [
            "the call guarded by a bulkhead failed",
            "the provider declined",
            "quota exceeded"
        ]
    );
    assert!(failed.source().unwrap().is::<common::Declined>());

    let held = bh.try_acquire().unwrap();
    let rejected = block_on(bh.call(async { Ok::<(), common::Declined>(()) })).unwrap_err();
    assert_eq!(
        common::error_chain(&rejected, 1),
        [r#"bulkhead "ledger" is full"#]
    );
    assert_eq!(rejected.reason(), Some(RejectReason::Full));
    assert!(rejected.source().is_none(), "the rejection is the message");
    drop(held);

    let timed_out = block_on(bh.call(async {
        pending::<()>().await;
        Ok::<(), common::Declined>(())
    }))
    .unwrap_err();
    let BulkheadError::CallTimeout(cut) = &timed_out else {
        panic!("{timed_out:?}")
    };
    assert_eq!(cut.bulkhead_name(), "ledger");
    assert_eq!(
        common::error_chain(&timed_out, 1),
        [format!(
            r#"call in bulkhead "ledger" timed out after {:?}"#,
            cut.timeout()
        )]
    );

    // An error that is only `Display` (no source to return) still shows
    // this level's message, and the variant still holds it.
    let plain = block_on(bh.call(async { Err::<(), _>("no") })).unwrap_err();
    assert_eq!(plain.to_string(), "the call guarded by a bulkhead failed");
    assert_eq!(plain.into_inner(), Some("no"));
}

/// `max_wait(ZERO)` fails fast with `Full` and never waits.
#[test]
fn fail_fast_rejects_at_once_with_full() {
    let bh = Bulkhead::builder()
        .name("invoice-provider")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let rejected = block_on(bh.acquire()).unwrap_err();
    assert_eq!(rejected.reason(), RejectReason::Full);
    assert_eq!(rejected.waited(), Duration::ZERO);
    assert_eq!(rejected.name(), "invoice-provider");
    assert_eq!(
        rejected.to_string(),
        r#"bulkhead "invoice-provider" is full"#
    );
    let called = AtomicUsize::new(0);
    let r = block_on(bh.call(async {
        called.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(())
    }));
    assert!(matches!(r, Err(BulkheadError::Rejected(ref r)) if r.reason() == RejectReason::Full));
    assert_eq!(
        called.load(Ordering::SeqCst),
        0,
        "a rejected call never runs"
    );
    drop(held);
    let m = bh.metrics();
    assert_eq!(
        (m.permitted(), m.rejected_full(), m.rejected(), m.finished()),
        (1, 2, 2, 1)
    );
}

/// The waiting line is bounded: past `max_queue`, callers are rejected at
/// once; a place is given back when a waiter leaves.
#[test]
fn max_queue_bounds_the_waiting_line() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_queue(2)
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let mut a = pin!(bh.acquire());
    let mut b = pin!(bh.acquire());
    assert!(poll_noop(a.as_mut()).is_pending());
    assert!(poll_noop(b.as_mut()).is_pending());
    assert_eq!(bh.metrics().queued(), 2);
    let third = block_on(bh.acquire()).unwrap_err();
    assert_eq!(third.reason(), RejectReason::Full);
    drop(held);
    // The first waiter got the permit; the line has room again.
    let Poll::Ready(Ok(first)) = poll_noop(a.as_mut()) else {
        panic!("first waiter not served")
    };
    assert_eq!(bh.metrics().queued(), 1);
    let mut c = pin!(bh.acquire());
    assert!(poll_noop(c.as_mut()).is_pending());
    assert_eq!(bh.metrics().queued(), 2);
    drop(first);
    assert!(matches!(poll_noop(b.as_mut()), Poll::Ready(Ok(_))));
    let m = bh.metrics();
    assert_eq!(
        (m.rejected_full(), m.queued(), m.max_queue()),
        (1, 1, Some(2))
    );
}

/// `max_queue(0)` means nobody waits.
#[test]
fn max_queue_zero_means_no_waiting() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_queue(0)
        .build()
        .unwrap();
    let _held = bh.try_acquire().unwrap();
    assert_eq!(
        block_on(bh.acquire()).unwrap_err().reason(),
        RejectReason::Full
    );
}

/// A caller that waits `max_wait` without a permit is rejected with
/// `Timeout`, never earlier, and leaves the line.
#[test]
fn max_wait_times_out_with_timeout() {
    let wait = Duration::from_millis(60);
    let bh = Bulkhead::builder()
        .name("ocr")
        .max_concurrent_calls(1)
        .max_wait(wait)
        .build()
        .unwrap();
    let _held = bh.try_acquire().unwrap();
    let start = Instant::now();
    let rejected = block_on(bh.acquire()).unwrap_err();
    assert!(start.elapsed() >= wait);
    assert_eq!(rejected.reason(), RejectReason::Timeout);
    assert!(rejected.waited() >= wait, "waited {:?}", rejected.waited());
    assert!(
        rejected
            .to_string()
            .starts_with(r#"bulkhead "ocr" had no free permit within"#)
    );
    let m = bh.metrics();
    assert_eq!((m.rejected_timeout(), m.queued(), m.in_flight()), (1, 0, 1));
}

/// A waiter whose permit arrives before `max_wait` is admitted.
#[test]
fn a_waiter_served_in_time_is_admitted() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let watcher = bh.clone();
    std::thread::spawn(move || {
        // Return the permit once the caller below is waiting for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while watcher.metrics().queued() == 0 {
            assert!(Instant::now() < deadline, "the caller never queued");
            std::thread::yield_now();
        }
        drop(held);
    });
    let permit = block_on(bh.acquire()).expect("admitted when the holder finished");
    assert_eq!(bh.metrics().in_flight(), 1);
    drop(permit);
    assert_eq!(bh.metrics().finished(), 2);
}

/// A call that runs past `call_timeout` is dropped, its permit released,
/// and `CallTimeout` returned; the observer sees `TimedOut`.
#[test]
fn call_timeout_drops_the_call_and_releases_the_permit() {
    let (bh, rec) = observed(1);
    struct DropFlag(Arc<AtomicUsize>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let flag = DropFlag(dropped.clone());
    let r: Result<(), BulkheadError<()>> = block_on(bh.call(async move {
        let _flag = flag;
        pending::<()>().await;
        Ok(())
    }));
    assert!(matches!(r, Err(BulkheadError::CallTimeout(_))), "{r:?}");
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the call was dropped");
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.call_timeouts(), m.finished()), (0, 1, 1));
    assert_eq!(rec.take(), ["permitted obs", "finished obs timed_out"]);
}

/// The observer sees success and failure of the guarded call.
#[test]
fn observer_sees_success_and_failure() {
    let (bh, rec) = observed(1);
    assert_eq!(block_on(bh.call(async { Ok::<_, &str>(7) })), Ok(7));
    assert_eq!(
        block_on(bh.call(async { Err::<(), _>("no") })),
        Err(BulkheadError::Inner("no"))
    );
    assert_eq!(
        rec.take(),
        [
            "permitted obs",
            "finished obs success",
            "permitted obs",
            "finished obs failure"
        ]
    );
}

/// A `call` dropped while it waits leaves the line; dropped while it runs,
/// it releases the permit and the observer sees `Cancelled`.
#[test]
fn cancelled_calls_release_everything() {
    let (bh, rec) = observed(1);
    {
        let mut running = pin!(bh.call(pending::<Result<(), ()>>()));
        assert!(poll_noop(running.as_mut()).is_pending());
        assert_eq!(bh.metrics().in_flight(), 1);
        {
            let mut waiting = pin!(bh.call(async { Ok::<_, ()>(()) }));
            assert!(poll_noop(waiting.as_mut()).is_pending());
            assert_eq!(bh.metrics().queued(), 1);
        }
        assert_eq!(bh.metrics().queued(), 0, "a dropped waiter leaves the line");
    }
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.permitted(), m.finished()), (0, 1, 1));
    assert_eq!(rec.take(), ["permitted obs", "finished obs cancelled"]);
}

/// A panic in the guarded call releases the permit; the observer sees
/// `Panicked`.
#[test]
fn a_panicking_call_releases_its_permit() {
    let (bh, rec) = observed(1);
    let caught = catch_unwind(AssertUnwindSafe(|| {
        block_on(bh.call(async {
            panic!("boom");
            #[allow(unreachable_code)]
            Ok::<(), ()>(())
        }))
    }));
    assert!(caught.is_err());
    assert_eq!(bh.metrics().in_flight(), 0);
    assert!(bh.try_acquire().is_ok(), "the permit came back");
    assert_eq!(rec.take()[..2], ["permitted obs", "finished obs panicked"]);
}

/// Shrinking never cuts calls short and never blocks; nobody new is admitted
/// until in-flight falls below the new limit. Growing admits waiters at once.
#[test]
fn limits_change_at_runtime() {
    let bh = bulkhead(3);
    let mut held: Vec<_> = (0..3).map(|_| bh.try_acquire().unwrap()).collect();
    bh.set_max_concurrent_calls(1);
    let m = bh.metrics();
    assert_eq!(
        (m.max_concurrent_calls(), m.in_flight(), m.available()),
        (1, 3, 0)
    );
    assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Full);
    held.pop();
    held.pop();
    assert_eq!(bh.metrics().in_flight(), 1);
    assert!(bh.try_acquire().is_err(), "in flight equals the new limit");
    held.pop();
    let again = bh.try_acquire().expect("below the limit again");

    let mut waiter = pin!(bh.acquire());
    assert!(poll_noop(waiter.as_mut()).is_pending());
    bh.set_max_concurrent_calls(2);
    let Poll::Ready(Ok(served)) = poll_noop(waiter.as_mut()) else {
        panic!("growing serves waiters at once")
    };
    assert_eq!(bh.metrics().in_flight(), 2);
    drop((again, served));
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// `close` rejects waiting and later calls with `Closed`; calls in flight
/// finish, and `wait_idle` resolves once they have.
#[test]
fn close_and_wait_idle() {
    let bh = bulkhead(1);
    let held = bh.try_acquire().unwrap();
    let mut waiter = pin!(bh.acquire());
    assert!(poll_noop(waiter.as_mut()).is_pending());
    bh.close();
    assert!(bh.is_closed());
    let Poll::Ready(Err(r)) = poll_noop(waiter.as_mut()) else {
        panic!("waiter not failed")
    };
    assert_eq!(r.reason(), RejectReason::Closed);
    assert_eq!(r.to_string(), r#"bulkhead "test" is closed"#);
    assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Closed);

    let mut idle = pin!(bh.wait_idle());
    assert!(
        poll_noop(idle.as_mut()).is_pending(),
        "a call is still in flight"
    );
    let holder = std::thread::spawn(move || drop(held));
    block_on(idle);
    holder.join().unwrap();
    let m = bh.metrics();
    assert!(m.is_closed());
    assert_eq!((m.in_flight(), m.rejected_closed()), (0, 2));
}

/// `wait_idle` on an idle bulkhead resolves at once.
#[test]
fn wait_idle_when_idle_is_immediate() {
    let bh = bulkhead(2);
    assert!(poll_noop(pin!(bh.wait_idle())).is_ready());
}

/// An observer that calls back into the same bulkhead from every hook does
/// not deadlock: hooks run with no lock held.
#[test]
fn observer_may_call_back_into_the_bulkhead() {
    #[derive(Default)]
    struct Reentrant {
        bh: OnceLock<Bulkhead>,
        seen: Mutex<Vec<Metrics>>,
    }
    impl Reentrant {
        fn poke(&self) {
            let bh = self.bh.get().unwrap();
            self.seen.lock().unwrap().push(bh.metrics());
            bh.set_max_concurrent_calls(bh.metrics().max_concurrent_calls());
        }
    }
    impl Observer for Reentrant {
        fn on_permitted(&self, _: &Permitted<'_>) {
            self.poke();
        }
        fn on_rejected(&self, _: &Rejection<'_>) {
            self.poke();
        }
        fn on_finished(&self, _: &Finished<'_>) {
            self.poke();
        }
    }
    let obs = Arc::new(Reentrant::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .observer(obs.clone())
        .build()
        .unwrap();
    obs.bh.set(bh.clone()).unwrap();
    let p = bh.try_acquire().unwrap();
    assert!(bh.try_acquire().is_err());
    drop(p);
    block_on(bh.call(async { Ok::<_, ()>(()) })).unwrap();
    let seen = obs.seen.lock().unwrap();
    assert_eq!(seen.len(), 5);
    assert_eq!(seen[0].in_flight(), 1, "on_permitted runs after admission");
    assert_eq!(
        seen[2].in_flight(),
        0,
        "on_finished runs after the permit is back"
    );
}

/// Under concurrent load on a multi-thread runtime the limit holds and the
/// totals add up: permitted + rejected = attempts, finished = permitted.
#[test]
fn totals_add_up_under_concurrent_load() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(4)
            .max_queue(8)
            .max_wait(Duration::from_millis(200))
            .build()
            .unwrap();
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..400)
            .map(|_| {
                let (bh, now, peak) = (bh.clone(), now.clone(), peak.clone());
                tokio::spawn(async move {
                    bh.call(async {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(n, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, ()>(())
                    })
                    .await
                })
            })
            .collect();
        let mut ok = 0u64;
        let mut rejected = 0u64;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => ok += 1,
                Err(BulkheadError::Rejected(_)) => rejected += 1,
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert!(peak.load(Ordering::SeqCst) <= 4);
        let m = bh.metrics();
        assert_eq!(m.permitted(), ok);
        assert_eq!(m.rejected(), rejected);
        assert_eq!(m.permitted() + m.rejected(), 400);
        assert_eq!(m.finished(), m.permitted());
        assert_eq!((m.in_flight(), m.queued()), (0, 0));
    });
}

/// The bulkhead and its errors have the traits users rely on.
#[test]
fn traits() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    send_sync_clone::<Bulkhead>();
    send_sync_clone::<Rejected>();
    send_sync_clone::<BulkheadError<std::io::ErrorKind>>();
    send_sync_clone::<watertight::BuildError>();
    fn send<T: Send + 'static>() {}
    send::<watertight::BulkheadPermit>();
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    error::<Rejected>();
    error::<watertight::BuildError>();
    error::<BulkheadError<std::io::Error>>();
    let bh = bulkhead(1);
    let fut = bh.call(async { Ok::<_, ()>(()) });
    fn is_send<T: Send>(_: &T) {}
    is_send(&fut);
    let by = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let fut: watertight::futures::Call<'_, _> = bh.call(async { Ok::<_, ()>(()) });
    assert!(format!("{fut:?}").starts_with("Call"));
    let options = CallOptions::new().deadline(by).class(1);
    is_send(&bh.call_with(options, async { Ok::<_, ()>(()) }));
    is_send(&bh.acquire_with(CallOptions::new().deadline(by)));
    assert_eq!(CallOutcome::Success.to_string(), "success");
}

/// A hook that panics does not leak the permit of the call it reports: the
/// permit is owned by the call's guard before any hook runs.
#[test]
fn a_panicking_hook_leaks_no_permit() {
    struct PanicOnPermit;
    impl Observer for PanicOnPermit {
        fn on_permitted(&self, _: &Permitted<'_>) {
            panic!("hook failed");
        }
    }
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .observer(Arc::new(PanicOnPermit))
        .build()
        .unwrap();
    for attempt in 0..3 {
        let call = catch_unwind(AssertUnwindSafe(|| {
            block_on(bh.call(async { Ok::<_, ()>(()) }))
        }));
        assert!(call.is_err(), "attempt {attempt}: the hook panicked");
        let acquire = catch_unwind(AssertUnwindSafe(|| block_on(bh.acquire())));
        assert!(acquire.is_err());
        let try_acquire = catch_unwind(AssertUnwindSafe(|| bh.try_acquire()));
        assert!(try_acquire.is_err());
        assert_eq!(
            bh.metrics().in_flight(),
            0,
            "attempt {attempt}: permit returned"
        );
    }
}

/// A rejection carries a retry hint from recent hold times, scaled by the
/// line ahead and the limit; none before any call finished, none when
/// closed.
#[test]
fn rejections_carry_a_retry_hint_from_hold_times() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(2)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let a = bh.try_acquire().unwrap();
    let b = bh.try_acquire().unwrap();
    assert_eq!(bh.try_acquire().unwrap_err().retry_after(), None);
    drop((a, b));
    // Without an observer (the `metrics` and `tracing` features install
    // one, and then every grant is timed), one grant in 16 of those that
    // leave no permit free is timed: hold both for about 20 ms each time,
    // until the average has caught up from its first, near-zero sample
    // (the first grant of all). hold x (0 waiting + 1) / 2 permits: about
    // 10 ms then; 4 ms takes two 20 ms samples, about 16 rounds.
    // The hint is read while both are held (a rejection is no grant, so
    // it does not shift which grants are timed).
    let mut hint = Duration::ZERO;
    for _ in 0..64 {
        let first = bh.try_acquire().unwrap();
        let busy = bh.try_acquire().unwrap();
        hint = bh.try_acquire().unwrap_err().retry_after().unwrap();
        if hint >= Duration::from_millis(4) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        drop((first, busy));
    }
    assert!(
        hint >= Duration::from_millis(4) && hint < Duration::from_millis(200),
        "{hint:?}"
    );
    bh.close();
    assert_eq!(bh.try_acquire().unwrap_err().retry_after(), None);
}

/// A permit held past `leak_threshold` is reported once, naming the
/// bulkhead; one released in time is not reported.
#[test]
fn leak_detection_reports_permits_held_too_long() {
    use std::sync::Mutex;
    use watertight::observer::{LeakSuspected, Observer};

    #[derive(Default)]
    struct Leaks(Mutex<Vec<(String, Duration)>>);
    impl Observer for Leaks {
        fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
            self.0.lock().unwrap().push((e.name.to_owned(), e.held));
        }
    }
    let leaks = Arc::new(Leaks::default());
    let bh = Bulkhead::builder()
        .name("pool")
        .max_concurrent_calls(4)
        .leak_threshold(Duration::from_millis(100))
        .observer(leaks.clone())
        .build()
        .unwrap();
    // Released in time: never reported, even after the threshold passes.
    // (Held for as long as this thread took between the two clock reads: a
    // thread descheduled for the threshold in between held it too long.)
    let taken = std::time::Instant::now();
    drop(bh.try_acquire().unwrap());
    let in_time = taken.elapsed() < Duration::from_millis(100);
    let leaked = bh.try_acquire().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while leaks.0.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let seen = leaks.0.lock().unwrap().clone();
    // The leaked permit once (and, only if it was held too long, the
    // first).
    let reports = if in_time { 1..=1 } else { 1..=2 };
    assert!(reports.contains(&seen.len()), "{seen:?}");
    assert!(seen.iter().all(|(name, _)| name == "pool"), "{seen:?}");
    assert!(
        seen.iter()
            .all(|&(_, held)| held >= Duration::from_millis(100))
    );
    assert_eq!(bh.metrics().leaks_suspected(), seen.len() as u64);
    drop(leaked);
    assert_eq!(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .leak_threshold(Duration::ZERO)
            .build()
            .unwrap_err()
            .kind(),
        watertight::BuildErrorKind::ZeroLeakThreshold
    );
}

/// A timer whose sleeps complete once `fire` is set (and are polled again),
/// and that counts the sleeps it made.
#[derive(Debug, Default)]
struct GateTimer {
    fire: Arc<std::sync::atomic::AtomicBool>,
    made: AtomicUsize,
}

impl watertight::timer::Timer for GateTimer {
    fn sleep(&self, _: Duration) -> watertight::timer::Sleep {
        self.made.fetch_add(1, Ordering::SeqCst);
        let fire = self.fire.clone();
        Box::pin(std::future::poll_fn(move |_| {
            if fire.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }))
    }
}

/// `call`'s future is a named type that can be stored, and is `Send` when
/// the call is.
#[test]
fn the_call_future_is_named_and_send() {
    fn send<T: Send>(_: &T) {}
    struct Stored<'a> {
        fut: watertight::futures::Call<'a, std::future::Ready<Result<u8, ()>>>,
    }
    let bh = bulkhead(1);
    let stored = Stored {
        fut: bh.call(std::future::ready(Ok(7))),
    };
    send(&stored.fut);
    assert!(format!("{:?}", stored.fut).contains("Start"));
    assert_eq!(block_on(stored.fut), Ok(7));
}

/// A call whose `max_wait` runs out leaves the semaphore's line when it
/// returns, not when it is dropped: the caller behind it is served by the
/// next release while the timed-out future is still alive.
#[test]
fn a_call_out_of_time_leaves_the_line_before_it_is_dropped() {
    let timer = Arc::new(GateTimer::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(60))
        .timer(timer.clone())
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let mut first = pin!(bh.call(async { Ok::<_, ()>("first") }));
    assert!(poll_noop(first.as_mut()).is_pending());
    let mut second = pin!(bh.acquire());
    assert!(poll_noop(second.as_mut()).is_pending());
    assert_eq!(bh.metrics().queued(), 2);
    // The first caller's wait runs out (the second's sleep, armed on the
    // same gate, is not polled until it is woken).
    timer.fire.store(true, Ordering::SeqCst);
    let Poll::Ready(Err(BulkheadError::Rejected(r))) = poll_noop(first.as_mut()) else {
        panic!("the first call is out of time")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    timer.fire.store(false, Ordering::SeqCst);
    assert_eq!(bh.metrics().queued(), 1, "the timed-out call left the line");
    drop(held);
    let Poll::Ready(Ok(served)) = poll_noop(second.as_mut()) else {
        panic!("the permit went to the caller behind the timed-out one")
    };
    assert_eq!(bh.metrics().in_flight(), 1);
    drop(served);
    assert_eq!(bh.metrics().in_flight(), 0);
    let m = bh.metrics();
    assert_eq!((m.rejected_timeout(), m.permitted()), (1, 2));
}

/// A call admitted after waiting gets its own `call_timeout`: the sleep
/// that bounded the wait is not reused half-spent.
#[test]
fn a_call_admitted_after_waiting_gets_a_fresh_call_timeout() {
    let timer = Arc::new(GateTimer::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(60))
        .call_timeout(Duration::from_secs(60))
        .timer(timer.clone())
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let mut call = pin!(bh.call(pending::<Result<(), ()>>()));
    assert!(poll_noop(call.as_mut()).is_pending(), "waits for a permit");
    assert_eq!(timer.made.load(Ordering::SeqCst), 1, "max_wait armed");
    drop(held);
    assert!(poll_noop(call.as_mut()).is_pending(), "admitted, runs");
    assert_eq!(bh.metrics().in_flight(), 1);
    assert_eq!(
        timer.made.load(Ordering::SeqCst),
        2,
        "call_timeout armed anew once the call runs"
    );
    timer.fire.store(true, Ordering::SeqCst);
    let out = poll_noop(call.as_mut());
    assert!(
        matches!(out, Poll::Ready(Err(BulkheadError::CallTimeout(_)))),
        "{out:?}"
    );
    assert_eq!(bh.metrics().in_flight(), 0, "the permit went back");
    assert_eq!(bh.metrics().call_timeouts(), 1);
}

/// Polling `call`'s future after it returned is a programmer error, said
/// so.
#[test]
#[should_panic(expected = "polled after it completed")]
fn polling_a_finished_call_panics() {
    let bh = bulkhead(1);
    let mut call = pin!(bh.call(async { Ok::<_, ()>(()) }));
    assert!(poll_noop(call.as_mut()).is_ready());
    let _ = poll_noop(call.as_mut());
}

/// With `max_queue`, the line is counted by the policy (the place is
/// reserved before queueing); without it, a fair bulkhead's line is its
/// semaphore's queue. Both report the same.
#[test]
fn the_line_reads_the_same_with_and_without_max_queue() {
    for max_queue in [None, Some(10)] {
        for fair in [true, false] {
            let mut b = Bulkhead::builder().max_concurrent_calls(1).fair(fair);
            if let Some(q) = max_queue {
                b = b.max_queue(q);
            }
            let bh = b.build().unwrap();
            let held = bh.try_acquire().unwrap();
            let mut a = Box::pin(bh.call(async { Ok::<_, ()>(()) }));
            let mut b = Box::pin(bh.acquire());
            assert!(poll_noop(a.as_mut()).is_pending());
            assert!(poll_noop(b.as_mut()).is_pending());
            assert_eq!(bh.metrics().queued(), 2, "{max_queue:?} fair {fair}");
            drop(a);
            assert_eq!(bh.metrics().queued(), 1, "{max_queue:?} fair {fair}");
            drop(held);
            assert!(poll_noop(b.as_mut()).is_ready());
            assert_eq!(bh.metrics().queued(), 0, "{max_queue:?} fair {fair}");
        }
    }
}

/// A waker that records that it was woken.
#[cfg(feature = "tokio")]
#[derive(Default)]
struct Flag(std::sync::atomic::AtomicBool);

#[cfg(feature = "tokio")]
impl std::task::Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[cfg(feature = "tokio")]
impl Flag {
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

#[cfg(feature = "tokio")]
fn poll_with<F: Future>(fut: std::pin::Pin<&mut F>, flag: &Arc<Flag>) -> Poll<F::Output> {
    let waker = Waker::from(flag.clone());
    fut.poll(&mut Context::from_waker(&waker))
}

/// A bulkhead of one permit, held, whose callers wait a second at most (on
/// the default timer: the line timer).
#[cfg(feature = "tokio")]
fn full_for_a_second() -> (Bulkhead, watertight::BulkheadPermit) {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    (bh, held)
}

/// The line's one timer (the default timer, a fair bulkhead) times each
/// waiter from its own start: rejected at its deadline, never earlier.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn the_line_timer_rejects_each_waiter_at_its_own_deadline() {
    use tokio::time::advance;
    let (bh, _held) = full_for_a_second();
    let (fa, fb) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
    let mut a = pin!(bh.acquire());
    assert!(poll_with(a.as_mut(), &fa).is_pending());
    advance(Duration::from_millis(500)).await;
    let mut b = pin!(bh.acquire());
    assert!(poll_with(b.as_mut(), &fb).is_pending());
    advance(Duration::from_millis(499)).await;
    assert!(!fa.take() && !fb.take(), "nobody's deadline has passed");
    advance(Duration::from_millis(1)).await;
    assert!(fa.take(), "the first waiter is woken at its deadline");
    assert!(!fb.take());
    let Poll::Ready(Err(r)) = poll_with(a.as_mut(), &fa) else {
        panic!("the first waiter times out")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    assert!(fb.take(), "the next waiter is told to look at its deadline");
    assert!(poll_with(b.as_mut(), &fb).is_pending(), "not due yet");
    advance(Duration::from_millis(499)).await;
    assert!(!fb.take());
    advance(Duration::from_millis(1)).await;
    assert!(fb.take(), "the second waiter is woken at its own deadline");
    let Poll::Ready(Err(r)) = poll_with(b.as_mut(), &fb) else {
        panic!("the second waiter times out")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    let m = bh.metrics();
    assert_eq!((m.rejected_timeout(), m.queued()), (2, 0));
}

/// The waiter the line timer woke is served instead of timing out: the
/// one behind it still gets its timeout (the line timer is re-armed for
/// it), rather than waiting forever.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_waiter_served_after_the_line_timer_woke_it_passes_the_timer_on() {
    use tokio::time::advance;
    let (bh, held) = full_for_a_second();
    let (fa, fb) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
    let mut a = pin!(bh.call(async { Ok::<_, ()>("a") }));
    assert!(poll_with(a.as_mut(), &fa).is_pending());
    advance(Duration::from_millis(500)).await;
    let mut b = pin!(bh.call(async { Ok::<_, ()>("b") }));
    assert!(poll_with(b.as_mut(), &fb).is_pending());
    advance(Duration::from_millis(500)).await;
    assert!(fa.take(), "the line timer woke the front waiter");
    // Its permit arrives before it looks.
    drop(held);
    assert_eq!(poll_with(a.as_mut(), &fa), Poll::Ready(Ok("a")));
    // `a` finished at once, and its permit went to `b`.
    assert!(fb.take(), "b is woken");
    assert_eq!(poll_with(b.as_mut(), &fb), Poll::Ready(Ok("b")));

    // Again, with the front waiter served while the next one still waits.
    let held = bh.try_acquire().unwrap();
    let (fc, fd) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
    let mut c = pin!(bh.acquire());
    assert!(poll_with(c.as_mut(), &fc).is_pending());
    advance(Duration::from_millis(500)).await;
    let mut d = pin!(bh.acquire());
    assert!(poll_with(d.as_mut(), &fd).is_pending());
    advance(Duration::from_millis(500)).await;
    assert!(fc.take(), "the line timer woke the front waiter");
    drop(held);
    let Poll::Ready(Ok(c_permit)) = poll_with(c.as_mut(), &fc) else {
        panic!("c is served")
    };
    assert!(fd.take(), "the served waiter passes the line timer on");
    assert!(poll_with(d.as_mut(), &fd).is_pending(), "d is not due yet");
    advance(Duration::from_millis(500)).await;
    assert!(fd.take(), "d is woken at its own deadline");
    let Poll::Ready(Err(r)) = poll_with(d.as_mut(), &fd) else {
        panic!("d times out")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    drop(c_permit);
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A waiter that joins while the front one has been woken to look must not
/// arm the line's sleep for its own, later deadline: if the front one is
/// then served, the waiter between them would be looked at only at the
/// newcomer's deadline, up to `max_wait` late.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_waiter_joining_while_the_front_one_looks_leaves_the_sleep_to_it() {
    use tokio::time::advance;
    let (bh, held) = full_for_a_second();
    let [fa, fb, fc]: [Arc<Flag>; 3] = Default::default();
    let mut a = pin!(bh.acquire());
    assert!(poll_with(a.as_mut(), &fa).is_pending());
    advance(Duration::from_millis(1)).await;
    let mut b = pin!(bh.acquire());
    assert!(poll_with(b.as_mut(), &fb).is_pending());
    advance(Duration::from_millis(999)).await;
    assert!(fa.take(), "the front waiter is woken at its deadline");
    // c joins before a has looked, and a's permit arrives meanwhile.
    let mut c = pin!(bh.acquire());
    assert!(poll_with(c.as_mut(), &fc).is_pending());
    drop(held);
    let Poll::Ready(Ok(a_permit)) = poll_with(a.as_mut(), &fa) else {
        panic!("a is served")
    };
    assert!(fb.take(), "b is told to look at its deadline");
    assert!(poll_with(b.as_mut(), &fb).is_pending(), "not due yet");
    advance(Duration::from_millis(1)).await;
    assert!(fb.take(), "b is woken at its own deadline, not at c's");
    let Poll::Ready(Err(r)) = poll_with(b.as_mut(), &fb) else {
        panic!("b times out")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    assert!(fc.take(), "c is told to look");
    assert!(poll_with(c.as_mut(), &fc).is_pending());
    advance(Duration::from_millis(999)).await;
    assert!(fc.take(), "c is woken at its deadline");
    assert!(matches!(poll_with(c.as_mut(), &fc), Poll::Ready(Err(_))));
    drop(a_permit);
}

/// A waiter behind the front one, polled for another reason while the
/// front one looks (as a `select!` polls it), arms the sleep for its own
/// deadline; the front one's timing out then still has the next one look
/// at its own, earlier deadline.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_waiter_polled_during_a_look_does_not_delay_the_one_ahead_of_it() {
    use tokio::time::advance;
    let (bh, _held) = full_for_a_second();
    let [fa, fb, fc]: [Arc<Flag>; 3] = Default::default();
    let mut a = pin!(bh.acquire());
    assert!(poll_with(a.as_mut(), &fa).is_pending());
    advance(Duration::from_millis(1)).await;
    let mut b = pin!(bh.acquire());
    assert!(poll_with(b.as_mut(), &fb).is_pending());
    advance(Duration::from_millis(1)).await;
    let mut c = pin!(bh.acquire());
    assert!(poll_with(c.as_mut(), &fc).is_pending());
    advance(Duration::from_millis(998)).await;
    assert!(fa.take(), "the front waiter is woken at its deadline");
    // c, polled again before a has looked.
    assert!(poll_with(c.as_mut(), &fc).is_pending());
    let Poll::Ready(Err(_)) = poll_with(a.as_mut(), &fa) else {
        panic!("a times out")
    };
    assert!(fb.take(), "b is told to look at its deadline");
    assert!(poll_with(b.as_mut(), &fb).is_pending(), "not due yet");
    advance(Duration::from_millis(1)).await;
    assert!(fb.take(), "b is woken at its own deadline, not at c's");
    let Poll::Ready(Err(r)) = poll_with(b.as_mut(), &fb) else {
        panic!("b times out")
    };
    assert_eq!(r.reason(), RejectReason::Timeout);
    advance(Duration::from_millis(1)).await;
    assert!(fc.take(), "c is woken at its deadline");
    assert!(matches!(poll_with(c.as_mut(), &fc), Poll::Ready(Err(_))));
}

/// Many waiters with the same deadline are all rejected at it, each waking
/// the next, in tasks as a service runs them.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn waiters_with_one_deadline_all_time_out_at_it() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let bh = bh.clone();
            tokio::spawn(async move {
                let r = bh.call(async { Ok::<_, ()>(()) }).await;
                (r, tokio::time::Instant::now())
            })
        })
        .collect();
    for task in tasks {
        let (r, at) = task.await.unwrap();
        let Err(BulkheadError::Rejected(r)) = r else {
            panic!("every waiter times out")
        };
        assert_eq!(r.reason(), RejectReason::Timeout);
        assert_eq!(at - start, Duration::from_secs(2), "at the deadline");
    }
    assert_eq!(bh.metrics().rejected_timeout(), 50);
    drop(held);
}

/// Waiters that are served and waiters that time out, racing on two
/// worker threads under the line timer: every call ends (none is left
/// waiting past its deadline for want of a timer), and the counts add up.
#[cfg(feature = "tokio")]
#[test]
fn the_line_timer_under_racing_grants_and_timeouts_strands_nobody() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(2)
            .max_wait(Duration::from_millis(3))
            .build()
            .unwrap();
        let calls = 400;
        let tasks: Vec<_> = (0..calls)
            .map(|i| {
                let bh = bh.clone();
                tokio::spawn(async move {
                    let work = Duration::from_micros(200 * (i % 7));
                    bh.call(async move {
                        tokio::time::sleep(work).await;
                        Ok::<_, ()>(())
                    })
                    .await
                })
            })
            .collect();
        let all = async {
            let mut ok = 0;
            for task in tasks {
                match task.await.unwrap() {
                    Ok(()) => ok += 1,
                    Err(BulkheadError::Rejected(r)) => {
                        assert_eq!(r.reason(), RejectReason::Timeout);
                        assert!(r.waited() >= Duration::from_millis(3) || r.waited().is_zero());
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            ok
        };
        let ok = tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("every call ends");
        let m = bh.metrics();
        assert_eq!(m.permitted(), ok);
        assert_eq!(m.permitted() + m.rejected_timeout(), calls);
        assert_eq!((m.in_flight(), m.queued()), (0, 0));
    });
}
