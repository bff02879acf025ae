//! The bulkhead layer under faults in user code and in its surroundings:
//! observers and timers that panic, cancelled hand-offs, runtimes without a
//! time driver or gone away. Each test is one fault that was reproduced
//! against an earlier version.
#![cfg(not(loom))]

use std::future::{Future, pending};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use watertight::Bulkhead;
use watertight::observer::{Finished, LeakSuspected, Observer, Permitted, Rejection};
use watertight::timer::{Sleep, Timer};
#[cfg(feature = "tokio")]
use watertight::{BulkheadError, RejectReason};

fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Panics in the hooks chosen by its flags; counts what it saw.
#[derive(Debug, Default)]
struct Panicky {
    on_permitted: bool,
    on_rejected: bool,
    on_finished: bool,
    on_leak: bool,
    permitted: AtomicU64,
    finished: AtomicU64,
    leaks: AtomicU64,
}

impl Observer for Panicky {
    fn on_permitted(&self, _: &Permitted<'_>) {
        self.permitted.fetch_add(1, Ordering::SeqCst);
        assert!(!self.on_permitted, "observer panics in on_permitted");
    }
    fn on_rejected(&self, _: &Rejection<'_>) {
        assert!(!self.on_rejected, "observer panics in on_rejected");
    }
    fn on_finished(&self, _: &Finished<'_>) {
        self.finished.fetch_add(1, Ordering::SeqCst);
        assert!(!self.on_finished, "observer panics in on_finished");
    }
    fn on_leak_suspected(&self, _: &LeakSuspected<'_>) {
        self.leaks.fetch_add(1, Ordering::SeqCst);
        assert!(!self.on_leak, "observer panics in on_leak_suspected");
    }
}

/// Counts calls in flight as an exporter would (the `metrics` gauge).
#[derive(Debug, Default)]
struct Gauge(AtomicUsize);

impl Observer for Gauge {
    fn on_permitted(&self, _: &Permitted<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn on_finished(&self, _: &Finished<'_>) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn with_observers(limit: usize, observers: &[Arc<dyn Observer>]) -> Bulkhead {
    let mut b = Bulkhead::builder().max_concurrent_calls(limit);
    for o in observers {
        b = b.observer(o.clone());
    }
    b.build().unwrap()
}

/// A guarded call that panics while an observer's `on_finished` panics too
/// used to abort the process (a panic in a destructor during unwinding).
/// Now the call's panic comes out, the permit is back, and the other
/// observers saw the end of the call.
#[test]
fn a_panicking_call_with_a_panicking_on_finished_does_not_abort() {
    let bad = Arc::new(Panicky {
        on_finished: true,
        ..Panicky::default()
    });
    let gauge = Arc::new(Gauge::default());
    let bh = with_observers(1, &[bad.clone(), gauge.clone()]);
    let out = catch_unwind(AssertUnwindSafe(|| {
        futures::executor::block_on(bh.call(async {
            panic!("the guarded call panics");
            #[allow(unreachable_code)]
            Ok::<(), ()>(())
        }))
    }));
    let payload = out.unwrap_err();
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"the guarded call panics")
    );
    assert_eq!(bh.metrics().in_flight(), 0);
    assert_eq!(bad.finished.load(Ordering::SeqCst), 1);
    assert_eq!(gauge.0.load(Ordering::SeqCst), 0);
    assert_eq!(bh.metrics().available(), 1);
}

/// An observer that panics in `on_permitted` used to leave an exporter's
/// in-flight gauge at +1 (it ran after the user's observer, or not at
/// all). Every observer now sees every event, whatever another does; the
/// panic comes out of `call` with the permit back.
#[test]
fn a_panicking_on_permitted_leaves_no_gauge_wrong_and_no_permit_lost() {
    for first in [true, false] {
        let bad: Arc<dyn Observer> = Arc::new(Panicky {
            on_permitted: true,
            ..Panicky::default()
        });
        let gauge = Arc::new(Gauge::default());
        let order: Vec<Arc<dyn Observer>> = if first {
            vec![bad, gauge.clone()]
        } else {
            vec![gauge.clone(), bad]
        };
        let bh = with_observers(2, &order);
        let out = catch_unwind(AssertUnwindSafe(|| {
            futures::executor::block_on(bh.call(async { Ok::<_, ()>(()) }))
        }));
        assert!(out.is_err(), "the observer's panic comes out of call");
        assert_eq!(
            gauge.0.load(Ordering::SeqCst),
            0,
            "bad observer first: {first}"
        );
        assert_eq!(bh.metrics().in_flight(), 0);
        assert_eq!(bh.metrics().permitted(), 1);

        // Through acquire too.
        let out = catch_unwind(AssertUnwindSafe(|| {
            futures::executor::block_on(bh.acquire())
        }));
        assert!(out.is_err());
        assert_eq!(gauge.0.load(Ordering::SeqCst), 0);
        assert_eq!(bh.metrics().in_flight(), 0);
    }
}

/// An observer that panics in `on_finished` used to leave the gauge at -1
/// or +1, depending on the order. The panic comes out of the drop, after
/// the permit is back and every other observer has run.
#[test]
fn a_panicking_on_finished_leaves_no_gauge_wrong_and_no_permit_lost() {
    for first in [true, false] {
        let bad: Arc<dyn Observer> = Arc::new(Panicky {
            on_finished: true,
            ..Panicky::default()
        });
        let gauge = Arc::new(Gauge::default());
        let order: Vec<Arc<dyn Observer>> = if first {
            vec![bad, gauge.clone()]
        } else {
            vec![gauge.clone(), bad]
        };
        let bh = with_observers(1, &order);
        let permit = bh.try_acquire().unwrap();
        assert_eq!(gauge.0.load(Ordering::SeqCst), 1);
        let out = catch_unwind(AssertUnwindSafe(|| drop(permit)));
        assert!(out.is_err(), "the observer's panic comes out of the drop");
        assert_eq!(
            gauge.0.load(Ordering::SeqCst),
            0,
            "bad observer first: {first}"
        );
        assert_eq!(bh.metrics().in_flight(), 0);
        assert_eq!(bh.metrics().available(), 1);
    }
}

/// A panicking `on_rejected` still counts the rejection, and the line
/// place is given back.
#[test]
fn a_panicking_on_rejected_keeps_the_counts() {
    let bad = Arc::new(Panicky {
        on_rejected: true,
        ..Panicky::default()
    });
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_queue(0)
        .observer(bad)
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let out = catch_unwind(AssertUnwindSafe(|| {
        futures::executor::block_on(bh.call(async { Ok::<_, ()>(()) }))
    }));
    assert!(out.is_err());
    let m = bh.metrics();
    assert_eq!((m.rejected_full(), m.queued(), m.in_flight()), (1, 0, 1));
    drop(held);
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A permit handed to a queued waiter that is then cancelled goes back
/// through the semaphore, not through a guard: `wait_idle` used to hang
/// forever with nothing in flight.
#[test]
fn wait_idle_wakes_after_a_granted_waiter_is_cancelled() {
    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let held = bh.try_acquire().unwrap();
    let mut idle = Box::pin(bh.wait_idle());
    assert!(poll_once(idle.as_mut()).is_pending());
    {
        let mut waiter = pin!(bh.call(async { Ok::<_, ()>(()) }));
        assert!(poll_once(waiter.as_mut()).is_pending());
        drop(held); // handed straight to the waiter...
        assert!(poll_once(idle.as_mut()).is_pending(), "the waiter holds it");
    } // ...which is dropped before it runs.
    assert_eq!(bh.metrics().in_flight(), 0);
    let done = futures::executor::block_on(async {
        futures::future::select(
            idle,
            Box::pin(watertight::timer::ThreadSleep::new(Duration::from_secs(5))),
        )
        .await
    });
    assert!(
        matches!(done, futures::future::Either::Left(_)),
        "wait_idle resolves"
    );
}

/// The same with `acquire`, in a shutdown that cancels its waiting tasks
/// and then awaits `wait_idle`.
#[cfg(feature = "tokio")]
#[tokio::test]
async fn a_shutdown_that_cancels_waiters_then_waits_idle_finishes() {
    let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    let held: Vec<_> = (0..2).map(|_| bh.try_acquire().unwrap()).collect();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let bh = bh.clone();
            tokio::spawn(async move { bh.acquire().await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    while bh.metrics().queued() < 4 {
        tokio::task::yield_now().await;
    }
    drop(held); // handed to two of the waiters, who have not run yet
    for w in &waiters {
        w.abort();
    }
    bh.close();
    tokio::time::timeout(Duration::from_secs(5), bh.wait_idle())
        .await
        .expect("wait_idle resolves once nothing is in flight");
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A timer whose sleeps panic.
#[derive(Debug)]
struct PanickingTimer;

impl Timer for PanickingTimer {
    fn sleep(&self, _: Duration) -> Sleep {
        panic!("this timer is broken")
    }
}

/// The leak watch used to run before the guard owned the permit: a timer
/// that panicked there lost the permit, and the bulkhead reported Full
/// forever. Now the panic comes out of the acquire with the permit back.
#[test]
fn a_timer_that_panics_in_the_leak_watch_loses_no_permit() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .leak_threshold(Duration::from_secs(1))
        .timer(Arc::new(PanickingTimer))
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(catch_unwind(AssertUnwindSafe(|| bh.try_acquire())).is_err());
        assert!(
            catch_unwind(AssertUnwindSafe(|| {
                futures::executor::block_on(bh.call(async { Ok::<_, ()>(()) }))
            }))
            .is_err()
        );
        let m = bh.metrics();
        assert_eq!((m.in_flight(), m.available()), (0, 1));
    }
}

/// A timer that panics when `max_wait` arms it: the waiter leaves the line
/// and takes nothing with it.
#[test]
fn a_timer_that_panics_while_waiting_strands_nothing() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .timer(Arc::new(PanickingTimer))
        .build()
        .unwrap();
    let held = bh.try_acquire().unwrap();
    let out = catch_unwind(AssertUnwindSafe(|| {
        let mut call = pin!(bh.call(async { Ok::<_, ()>(()) }));
        poll_once(call.as_mut())
    }));
    assert!(out.is_err());
    assert_eq!(bh.metrics().queued(), 0);
    drop(held);
    assert_eq!(bh.metrics().available(), 1);
}

/// A `TokioTimer` whose runtime is gone, with `leak_threshold` set: the
/// permit used to be lost in the watch. Now the watch is skipped, and a
/// wait that needs the timer is rejected as `Unavailable`, never a panic.
#[cfg(feature = "tokio")]
#[test]
fn a_tokio_timer_whose_runtime_is_gone_gives_typed_rejections() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let timer = Arc::new(watertight::timer::TokioTimer::new(rt.handle().clone()));
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .call_timeout(Duration::from_secs(1))
        .leak_threshold(Duration::from_millis(1))
        .timer(timer)
        .build()
        .unwrap();
    drop(rt);

    let permit = bh.try_acquire().expect("the leak watch is skipped");
    let mut waiting = pin!(bh.call(async { Ok::<_, ()>(()) }));
    match poll_once(waiting.as_mut()) {
        Poll::Ready(Err(BulkheadError::Rejected(r))) => {
            assert_eq!(r.reason(), RejectReason::Unavailable);
            assert!(r.to_string().ends_with("its timer is not running"), "{r}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    drop(permit);
    assert_eq!(bh.metrics().queued(), 0);

    // A call that must be timed cannot be: it is dropped, not left
    // running without its bound.
    let mut timed = pin!(bh.call(async {
        pending::<()>().await;
        Ok::<_, ()>(())
    }));
    match poll_once(timed.as_mut()) {
        Poll::Ready(Err(BulkheadError::Rejected(r))) => {
            assert_eq!(r.reason(), RejectReason::Unavailable)
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(bh.metrics().in_flight(), 0);
    assert_eq!(bh.metrics().rejected_unavailable(), 2);
}

/// A tokio runtime built without its time driver: `build()` says so, rather
/// than the first contended wait panicking.
#[cfg(feature = "tokio")]
#[test]
fn a_runtime_without_a_time_driver_fails_at_build() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let built = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(1))
            .build();
        assert_eq!(
            built.unwrap_err().kind(),
            watertight::BuildErrorKind::TimerUnavailable
        );
        let timer = Arc::new(watertight::timer::TokioTimer::try_current().unwrap());
        let built = Bulkhead::builder()
            .max_concurrent_calls(1)
            .call_timeout(Duration::from_secs(1))
            .timer(timer)
            .build();
        assert_eq!(
            built.unwrap_err().kind(),
            watertight::BuildErrorKind::TimerUnavailable
        );
        // Without a timer to need, it builds and works.
        let plain = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
        plain.call(async { Ok::<_, ()>(()) }).await.unwrap();
    });
}

/// A bulkhead built outside any runtime (a `static`, before `block_on`),
/// then waited on in a runtime without a time driver: a typed rejection.
#[cfg(feature = "tokio")]
#[test]
fn a_default_timer_in_a_runtime_without_a_time_driver_rejects() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let held = bh.try_acquire().unwrap();
        for _ in 0..2 {
            let err = bh.call(async { Ok::<_, ()>(()) }).await.unwrap_err();
            assert_eq!(err.rejected().unwrap().reason(), RejectReason::Unavailable);
        }
        drop(held);
        bh.call(async { Ok::<_, ()>(()) }).await.unwrap();
    });
}

/// A bulkhead that outlives the runtime it was built in (one per
/// `#[tokio::test]`, a `static` shared by tests): its default timer
/// follows the runtime that waits on it.
#[cfg(feature = "tokio")]
#[test]
fn a_default_timer_follows_the_runtime_that_waits() {
    let first = tokio::runtime::Runtime::new().unwrap();
    let bh = first.block_on(async {
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_millis(20))
            .build()
            .unwrap()
    });
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    second.block_on(async {
        let held = bh.try_acquire().unwrap();
        let start = tokio::time::Instant::now();
        let err = bh.call(async { Ok::<_, ()>(()) }).await.unwrap_err();
        assert_eq!(err.rejected().unwrap().reason(), RejectReason::Timeout);
        // On the second runtime's paused clock.
        assert_eq!(start.elapsed(), Duration::from_millis(20));
        drop(held);
    });
}

/// Leak detection used to compare a std `Instant` and never fire under
/// tokio's paused clock. It now runs on the timer's clock.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn leak_detection_fires_on_a_paused_tokio_clock() {
    let seen = Arc::new(Panicky::default());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .leak_threshold(Duration::from_secs(60))
        .observer(seen.clone())
        .build()
        .unwrap();
    let permit = bh.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(bh.metrics().leaks_suspected(), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(bh.metrics().leaks_suspected(), 1);
    assert_eq!(seen.leaks.load(Ordering::SeqCst), 1);
    drop(permit);
}

/// An observer that panics in `on_leak_suspected` runs on the timer's
/// thread: the panic is contained, the leak counted, the timer unharmed.
#[test]
fn a_panicking_leak_observer_harms_neither_the_timer_nor_the_permit() {
    let bad = Arc::new(Panicky {
        on_leak: true,
        ..Panicky::default()
    });
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .leak_threshold(Duration::from_millis(5))
        .timer(Arc::new(watertight::timer::ThreadTimer::new()))
        .observer(bad.clone())
        .build()
        .unwrap();
    let permit = bh.try_acquire().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while bh.metrics().leaks_suspected() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(bh.metrics().leaks_suspected(), 1);
    assert_eq!(bad.leaks.load(Ordering::SeqCst), 1);
    drop(permit);
    // The timer thread still serves sleeps.
    futures::executor::block_on(watertight::timer::ThreadSleep::new(Duration::from_millis(
        1,
    )));
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A timer whose sleeps panic when polled (made fine).
#[derive(Debug)]
struct PanicOnPollTimer;

impl Timer for PanicOnPollTimer {
    fn sleep(&self, _: Duration) -> Sleep {
        Box::pin(std::future::poll_fn(|_| -> Poll<()> {
            panic!("this timer's sleeps are broken")
        }))
    }
}

/// A custom timer whose sleep panics while it bounds a wait (`max_wait`)
/// or a call (`call_timeout`): the panic reaches the caller; a waiting
/// call leaves the line when it is dropped, a running one gives its permit
/// back as the panic unwinds.
#[test]
fn a_timer_that_panics_when_polled_loses_no_permit_and_no_place() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .call_timeout(Duration::from_secs(1))
        .timer(Arc::new(PanicOnPollTimer))
        .build()
        .unwrap();
    // The bound on a wait.
    let held = bh.try_acquire().unwrap();
    {
        let mut waiting = Box::pin(bh.call(async { Ok::<_, ()>(()) }));
        let panicked = catch_unwind(AssertUnwindSafe(|| poll_once(waiting.as_mut())));
        assert!(panicked.is_err(), "the timer's panic reaches the caller");
        assert_eq!(bh.metrics().queued(), 1, "still in line until dropped");
    }
    assert_eq!(bh.metrics().queued(), 0, "dropped: out of line");
    drop(held);
    assert_eq!(bh.metrics().in_flight(), 0);
    // The bound on a call.
    {
        let mut running = Box::pin(bh.call(pending::<Result<(), ()>>()));
        let panicked = catch_unwind(AssertUnwindSafe(|| poll_once(running.as_mut())));
        assert!(panicked.is_err());
        // As for a call that panics: the permit goes back as the panic
        // unwinds out of the poll.
        assert_eq!(bh.metrics().in_flight(), 0, "given back at the panic");
    }
    let m = bh.metrics();
    // The permit held while the first call waited, and the second call.
    assert_eq!((m.in_flight(), m.permitted(), m.finished()), (0, 2, 2));
    assert!(bh.try_acquire().is_ok(), "the permit came back");
}
