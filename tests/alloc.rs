//! No path of the in-process bulkhead allocates per call, with any bundled
//! timer: admitted at once, admitted after waiting, rejected because full
//! (failing fast, or the line is full), rejected after `max_wait`, and
//! timed out by `call_timeout`. Nor does the semaphore under it: its
//! uncontended acquire, hand-offs, unfair re-queue and cancellations.
//!
//! A counting global allocator counts the allocations made on the test's
//! own thread while a call runs; each path runs a few times first (the
//! timer's thread and queues are set up once), then must allocate nothing.
//! `ThreadTimer` is also held to it with many sleeps pending at once (64
//! calls in flight, a rolling window of 128 raw `ThreadSleep`s): its queue
//! keeps its storage as sleeps come and go.
//! What a runtime's own driver thread does is the runtime's business and not
//! counted (the tokio cases run on a current-thread runtime, where the
//! driver is this thread, so they are).
#![cfg(not(loom))]

use std::collections::VecDeque;
use std::future::{Future, pending};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use watertight::CallOptions;

use watertight::futures::Call;
use watertight::keyed::{KeyedBulkhead, KeyedBulkheadBuilder, KeyedError, KeyedRejectReason};
use watertight::timer::{ThreadSleep, ThreadTimer, Timer};
use watertight::{Bulkhead, BulkheadBuilder, BulkheadError, RejectReason};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{Counting, allocations};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests take turns. `ThreadTimer`s share one queue per process, so
/// one test's sleeps can make that queue grow inside another test's
/// counted call, on the other test's thread.
static TURNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    // A test that failed while holding the lock has already been reported.
    TURNS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `path` five times to warm up, then asserts that twenty more
/// allocate nothing.
fn assert_no_allocation(what: &str, path: impl FnMut()) {
    assert_allocations(what, 0, path);
}

/// Runs `path` five times to warm up, then asserts that twenty more
/// allocate `each` times each.
fn assert_allocations(what: &str, each: u64, mut path: impl FnMut()) {
    for _ in 0..5 {
        path();
    }
    let n = allocations(|| {
        for _ in 0..20 {
            path();
        }
    });
    assert_eq!(n, 20 * each, "{what}: {n} allocations in 20 calls");
}

fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(std::task::Waker::noop()))
}

/// Runs a future to completion on the executor under test.
type Drive = fn(Pin<&mut dyn Future<Output = ()>>);

/// Every path, on bulkheads made by `make` (which sets the timer) and
/// waits driven by `drive` (which must drive that timer).
fn every_path(timer: &str, make: &dyn Fn(BulkheadBuilder) -> Bulkhead, drive: Drive) {
    let bh = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_queue(1)
            .max_wait(Duration::from_secs(10))
            .call_timeout(Duration::from_secs(10)),
    );

    assert_no_allocation(&format!("{timer}: admitted at once"), || {
        let out = poll_once(pin!(bh.call(async { Ok::<_, ()>(1) })));
        assert_eq!(out, Poll::Ready(Ok(1)));
    });

    assert_no_allocation(&format!("{timer}: admitted after waiting"), || {
        let held = bh.try_acquire().unwrap();
        let mut call = pin!(bh.call(async { Ok::<_, ()>(2) }));
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert_eq!(poll_once(call.as_mut()), Poll::Ready(Ok(2)));
    });

    assert_no_allocation(&format!("{timer}: rejected, the line is full"), || {
        let held = bh.try_acquire().unwrap();
        let mut first = pin!(bh.call(async { Ok::<_, ()>(3) }));
        assert!(poll_once(first.as_mut()).is_pending());
        let out = poll_once(pin!(bh.call(async { Ok::<_, ()>(4) })));
        assert_rejected(out, RejectReason::Full);
        drop(held);
        assert_eq!(poll_once(first.as_mut()), Poll::Ready(Ok(3)));
    });

    let fail_fast = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .call_timeout(Duration::from_secs(10)),
    );
    let held = fail_fast.try_acquire().unwrap();
    assert_no_allocation(&format!("{timer}: rejected, failing fast"), || {
        let out = poll_once(pin!(fail_fast.call(async { Ok::<_, ()>(5) })));
        assert_rejected(out, RejectReason::Full);
    });
    drop(held);

    // Waits that end on the timer, on a real executor.
    let short = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_millis(1))
            .call_timeout(Duration::from_millis(1)),
    );
    let stuck = || async {
        pending::<()>().await;
        Ok::<_, ()>(())
    };
    let held = short.try_acquire().unwrap();
    assert_no_allocation(&format!("{timer}: rejected after max_wait"), || {
        let mut out = None;
        drive(pin!(async { out = Some(short.call(stuck()).await) }));
        assert_rejected(Poll::Ready(out.unwrap()), RejectReason::Timeout);
    });
    drop(held);
    assert_no_allocation(&format!("{timer}: call timed out"), || {
        let mut out = None;
        drive(pin!(async { out = Some(short.call(stuck()).await) }));
        assert!(matches!(out, Some(Err(BulkheadError::CallTimeout(_)))));
    });

    deadline_paths(timer, make, drive);
    queue_delay_paths(timer, make, drive);
}

/// The paths of a bulkhead with controlled delay: admitted after waiting
/// (a sample), rejected after `max_wait`, and cut on a standing line (the
/// line found standing, the waiters past the target woken and cut).
fn queue_delay_paths(timer: &str, make: &dyn Fn(BulkheadBuilder) -> Bulkhead, drive: Drive) {
    let bh = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(10))
            .queue_delay(Duration::from_secs(5), Duration::from_secs(60)),
    );
    assert_no_allocation(&format!("{timer}: queue_delay, after waiting"), || {
        let held = bh.try_acquire().unwrap();
        let mut call = pin!(bh.call(async { Ok::<_, ()>(1) }));
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert_eq!(poll_once(call.as_mut()), Poll::Ready(Ok(1)));
    });
    let short = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_millis(1))
            .queue_delay(Duration::from_micros(500), Duration::from_secs(60)),
    );
    let held = short.try_acquire().unwrap();
    assert_no_allocation(&format!("{timer}: queue_delay, after max_wait"), || {
        let mut out = None;
        drive(pin!(async {
            out = Some(short.call(async { Ok::<_, ()>(2) }).await)
        }));
        assert_rejected(Poll::Ready(out.unwrap()), RejectReason::Timeout);
    });
    drop(held);
    // Standing at the first wait of a millisecond or more.
    let standing = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(10))
            .queue_delay(Duration::from_millis(1), Duration::ZERO),
    );
    assert_no_allocation(&format!("{timer}: queue_delay, cut"), || {
        let held = standing.try_acquire().unwrap();
        let mut first = pin!(standing.call(async { Ok::<_, ()>(3) }));
        let mut second = pin!(standing.call(async { Ok::<_, ()>(4) }));
        assert!(poll_once(first.as_mut()).is_pending());
        assert!(poll_once(second.as_mut()).is_pending());
        std::thread::sleep(Duration::from_millis(2));
        drop(held);
        assert_eq!(poll_once(first.as_mut()), Poll::Ready(Ok(3)));
        let mut out = None;
        drive(pin!(async { out = Some(second.as_mut().await) }));
        assert_rejected(Poll::Ready(out.unwrap()), RejectReason::QueueDelay);
    });
    // Adaptive LIFO: the line found standing switches to the newest first,
    // a freed permit is handed to the tail, and the line that empties
    // switches back. (Whether the older waiters are served or cut by then
    // depends on the machine's speed against the 1 ms target; neither
    // allocates.)
    let lifo = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(10))
            .queue_delay(Duration::from_millis(1), Duration::ZERO)
            .adaptive_lifo(true),
    );
    assert_no_allocation(&format!("{timer}: adaptive_lifo, newest first"), || {
        let held = lifo.try_acquire().unwrap();
        let mut first = pin!(lifo.call(async { Ok::<_, ()>(5) }));
        let mut older = pin!(lifo.call(async { Ok::<_, ()>(6) }));
        assert!(poll_once(first.as_mut()).is_pending());
        assert!(poll_once(older.as_mut()).is_pending());
        std::thread::sleep(Duration::from_millis(2));
        drop(held);
        let mut running = pin!(lifo.call(async { Ok::<_, ()>(7) }));
        let mut newest = pin!(lifo.call(async { Ok::<_, ()>(8) }));
        assert!(poll_once(running.as_mut()).is_pending());
        assert!(poll_once(newest.as_mut()).is_pending());
        // `first`'s grant finds the line standing; its permit, back at
        // once, goes to `newest`.
        assert!(poll_once(first.as_mut()).is_ready());
        macro_rules! finish {
            ($call:expr) => {{
                let mut out = None;
                drive(pin!(async { out = Some($call.await) }));
                match out.unwrap() {
                    Ok(_) => {}
                    cut => assert_rejected(Poll::Ready(cut), RejectReason::QueueDelay),
                }
            }};
        }
        // `newest` holds the permit (served, or cut and passing it on to
        // `running`, the newest left); `older`, at the front, is woken to
        // be cut at the target; `running` holds the permit by then.
        finish!(newest.as_mut());
        finish!(older.as_mut());
        finish!(running.as_mut());
        assert_eq!(lifo.metrics().queued(), 0);
    });
}

/// The paths of a call that carries a deadline (`call_by`, `acquire_by`):
/// admitted at once, after waiting, rejected at once (a passed deadline, or
/// one the estimate cannot meet), and rejected after waiting as long as it
/// could still finish in time, on its own sleep.
fn deadline_paths(timer: &str, make: &dyn Fn(BulkheadBuilder) -> Bulkhead, drive: Drive) {
    // An observer, so that every hold time is measured (without one,
    // only a sample is), and the estimate below learns the 20 ms hold.
    struct Quiet;
    impl watertight::Observer for Quiet {}
    let bh = make(
        Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(10))
            .call_timeout(Duration::from_secs(10))
            .observer(Arc::new(Quiet)),
    );
    let soon = || std::time::Instant::now() + Duration::from_secs(5);
    assert_no_allocation(&format!("{timer}: call_by, admitted at once"), || {
        let out = poll_once(pin!(
            bh.call_with(CallOptions::new().deadline(soon()), async {
                Ok::<_, ()>(1)
            })
        ));
        assert_eq!(out, Poll::Ready(Ok(1)));
    });
    assert_no_allocation(&format!("{timer}: call_by, after waiting"), || {
        let held = bh.try_acquire().unwrap();
        let mut call = pin!(bh.call_with(CallOptions::new().deadline(soon()), async {
            Ok::<_, ()>(2)
        }));
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert_eq!(poll_once(call.as_mut()), Poll::Ready(Ok(2)));
    });
    assert_no_allocation(&format!("{timer}: call_by, a passed deadline"), || {
        let passed = std::time::Instant::now() - Duration::from_millis(1);
        let out = poll_once(pin!(
            bh.call_with(CallOptions::new().deadline(passed), async {
                Ok::<_, ()>(3)
            })
        ));
        assert_rejected(out, RejectReason::WontMakeDeadline);
    });
    assert_no_allocation(&format!("{timer}: acquire_by, after waiting"), || {
        let held = bh.try_acquire().unwrap();
        let mut acquire = pin!(bh.acquire_with(CallOptions::new().deadline(soon())));
        assert!(poll_once(acquire.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(acquire.as_mut()), Poll::Ready(Ok(_))));
    });
    // A hold time of some 20 ms is known from here on.
    let held = bh.try_acquire().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(held);
    let held = bh.try_acquire().unwrap();
    assert_no_allocation(&format!("{timer}: call_by, the estimate says no"), || {
        let by = std::time::Instant::now() + Duration::from_millis(2);
        let out =
            poll_once(pin!(bh.call_with(CallOptions::new().deadline(by), async {
                Ok::<_, ()>(4)
            })));
        assert_rejected(out, RejectReason::WontMakeDeadline);
    });
    assert_no_allocation(&format!("{timer}: a max_wait of its own, run out"), || {
        let own = CallOptions::new().max_wait(Duration::from_millis(20));
        let mut out = None;
        drive(pin!(async {
            out = Some(bh.call_with(own, async { Ok::<_, ()>(6) }).await)
        }));
        assert_rejected(Poll::Ready(out.unwrap()), RejectReason::Timeout);
    });
    assert_no_allocation(&format!("{timer}: call_by, out of time in line"), || {
        let by = std::time::Instant::now() + Duration::from_millis(60);
        let mut out = None;
        drive(pin!(async {
            out = Some(
                bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(5) })
                    .await,
            )
        }));
        assert_rejected(Poll::Ready(out.unwrap()), RejectReason::WontMakeDeadline);
    });
    drop(held);
}

fn assert_rejected<T: std::fmt::Debug>(
    out: Poll<Result<T, BulkheadError<()>>>,
    reason: RejectReason,
) {
    match out {
        Poll::Ready(Err(BulkheadError::Rejected(r))) => assert_eq!(r.reason(), reason),
        other => panic!("expected {reason:?}, got {other:?}"),
    }
}

#[test]
fn thread_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    every_path(
        "ThreadTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}

/// The work of a call that stays in flight until it is polled again:
/// pending on its first poll, done on its second.
struct TwoPolls(bool);

impl Future for TwoPolls {
    type Output = Result<(), ()>;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

/// The timer thread's queue is the process's, shared with the tests that
/// run in parallel: 1,024 sleeps registered at once first take its storage
/// past any number of sleeps those tests and this one have pending
/// together, so what a case counts is its own churn.
fn raise_thread_timer_peak() {
    let mut sleeps: Vec<ThreadSleep> = (0..1_024)
        .map(|_| ThreadSleep::new(Duration::from_secs(3_600)))
        .collect();
    for sleep in &mut sleeps {
        assert!(poll_once(Pin::new(sleep)).is_pending());
    }
}

/// A call kept in place, so that replacing it allocates nothing.
type Slot<'a> = Pin<Box<Option<Call<'a, TwoPolls>>>>;

/// Starts a call in `slot` (dropping the one there) and polls it once: it
/// is admitted and in flight, its `call_timeout` armed.
fn start_call<'a>(bh: &'a Bulkhead, slot: &mut Slot<'a>) {
    slot.set(Some(bh.call(TwoPolls(false))));
    let call = slot.as_mut().as_pin_mut().unwrap();
    assert!(poll_once(call).is_pending());
}

/// Many sleeps pending on the timer thread at once: 64 calls in flight on a
/// `ThreadTimer`, each with its `call_timeout` armed, and each in turn
/// finishing (or, one in eight, cancelled) as a new call starts in its
/// place, a full round per path.
#[test]
fn thread_timer_with_64_calls_in_flight_allocates_nothing() {
    let _turn = one_at_a_time();
    const CALLS: usize = 64;
    raise_thread_timer_peak();
    let bh = Bulkhead::builder()
        .max_concurrent_calls(CALLS)
        .call_timeout(Duration::from_secs(600))
        .timer(Arc::new(ThreadTimer::new()))
        .build()
        .unwrap();
    // Boxed once, here; a new call replaces the old one in place.
    let mut slots: Vec<Slot<'_>> = (0..CALLS).map(|_| Box::pin(None)).collect();
    for slot in &mut slots {
        start_call(&bh, slot);
    }
    assert_eq!(bh.metrics().in_flight(), CALLS);
    let mut round = 0;
    assert_no_allocation("ThreadTimer: 64 calls in flight, churning", || {
        for (i, slot) in slots.iter_mut().enumerate() {
            if (i + round) % 8 == 0 {
                slot.set(None);
            } else {
                let call = slot.as_mut().as_pin_mut().unwrap();
                assert_eq!(poll_once(call), Poll::Ready(Ok(())));
            }
            start_call(&bh, slot);
        }
        round += 1;
        assert_eq!(bh.metrics().in_flight(), CALLS);
    });
    drop(slots);
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A waker of another task, for re-polls that must replace the registered
/// waker.
struct OtherTask;

impl Wake for OtherTask {
    fn wake(self: Arc<Self>) {}
}

/// Raw `ThreadSleep`s in a rolling window of 128: deadlines out of order,
/// the oldest dropped (or, one step in five, one from the middle of the
/// window), a new one made and polled, and a sleep in the middle polled
/// again by another task.
#[test]
fn thread_sleeps_in_a_rolling_window_allocate_nothing() {
    let _turn = one_at_a_time();
    const WINDOW: usize = 128;
    raise_thread_timer_peak();
    let other = Waker::from(Arc::new(OtherTask));
    let mut window: VecDeque<ThreadSleep> = VecDeque::with_capacity(WINDOW);
    let mut n: u64 = 0;
    let mut step = || {
        n += 1;
        if window.len() == WINDOW {
            let victim = if n % 5 == 0 {
                window.remove(n as usize * 37 % WINDOW)
            } else {
                window.pop_front()
            };
            drop(victim.unwrap());
        }
        // 60 s plus up to a second, scattered.
        let jitter = Duration::from_millis(n.wrapping_mul(7_919) % 1_000);
        let mut sleep = ThreadSleep::new(Duration::from_secs(60) + jitter);
        assert!(poll_once(Pin::new(&mut sleep)).is_pending());
        window.push_back(sleep);
        let waker = if n % 2 == 0 { &other } else { Waker::noop() };
        let middle = window.len() / 2;
        let again = Pin::new(&mut window[middle]).poll(&mut Context::from_waker(waker));
        assert!(again.is_pending());
    };
    for _ in 0..WINDOW {
        step();
    }
    assert_no_allocation("ThreadSleep: a rolling window of 128", || {
        for _ in 0..WINDOW {
            step();
        }
    });
}

#[cfg(feature = "tokio")]
/// This test thread's own current-thread runtime (made once per thread and
/// kept): a runtime shared by tests on parallel threads lets one thread run
/// the other's timer work, and count its allocations.
fn tokio_runtime() -> &'static tokio::runtime::Runtime {
    thread_local! {
        static RT: &'static tokio::runtime::Runtime = Box::leak(Box::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        ));
    }
    RT.with(|rt| *rt)
}

#[cfg(feature = "tokio")]
#[test]
fn tokio_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let rt = tokio_runtime();
    let timer: Arc<dyn Timer> = Arc::new(watertight::timer::TokioTimer::new(rt.handle().clone()));
    every_path(
        "TokioTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| tokio_runtime().block_on(fut),
    );
}

/// The default timer, inside a tokio runtime: each sleep is a tokio sleep.
#[cfg(feature = "tokio")]
#[test]
fn default_timer_in_tokio_allocates_nothing() {
    let _turn = one_at_a_time();
    let _entered = tokio_runtime().enter();
    every_path("default in tokio", &|b| b.build().unwrap(), |fut| {
        tokio_runtime().block_on(fut)
    });
}

#[cfg(feature = "async-io")]
#[test]
fn async_io_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let timer: Arc<dyn Timer> = Arc::new(watertight::timer::AsyncIoTimer::new());
    // Not `async_io::block_on`: it makes a parker (an allocation) per call.
    every_path(
        "AsyncIoTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}

/// A request through the tower layer allocates nothing of its own: its
/// response future is a state machine with the wait inline. Admitted at
/// once or after waiting, nothing; rejected (failing fast, the line full,
/// after `max_wait`) or timed out, only its error, since the service's
/// error is a `BoxError`. The inner service is a `service_fn` of a closure (a clone allocates
/// nothing) whose future is `std::future::ready`; each request is driven as
/// a tower user does, `poll_ready` and then `call`.
#[cfg(feature = "tower")]
#[test]
fn tower_layer_allocates_nothing_per_request() {
    let _turn = one_at_a_time();
    use std::convert::Infallible;
    use std::future::ready;

    use watertight::tower::{BoxError, BulkheadService};

    let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    let double = tower::service_fn(|n: u32| ready(Ok::<_, Infallible>(n * 2)));

    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_queue(1)
        .max_wait(Duration::from_secs(10))
        .call_timeout(Duration::from_secs(10))
        .timer(timer.clone())
        .build()
        .unwrap();
    let mut service = BulkheadService::new(double, bh.clone());

    assert_no_allocation("tower: admitted at once", || {
        let out = poll_once(pin!(request(&mut service, 21)));
        assert!(matches!(out, Poll::Ready(Ok(42))));
    });

    assert_no_allocation("tower: admitted after waiting", || {
        let held = bh.try_acquire().unwrap();
        let mut waiting = pin!(request(&mut service, 1));
        assert!(poll_once(waiting.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(waiting), Poll::Ready(Ok(2))));
    });

    // What boxing the rejection costs, and nothing more. `black_box`: an
    // optimised build removes a box that is dropped unread, and the count
    // would read 0 where the layer's rejection (which the caller reads)
    // pays for one.
    let boxed = {
        let held = bh.try_acquire().unwrap();
        let rejected = bh.try_acquire().unwrap_err();
        drop(held);
        allocations(|| drop(std::hint::black_box(BoxError::from(rejected))))
    };
    assert_eq!(boxed, 1);

    assert_allocations("tower: rejected, the line is full", boxed, || {
        let held = bh.try_acquire().unwrap();
        let mut first = pin!(request(&mut service, 3));
        assert!(poll_once(first.as_mut()).is_pending());
        let out = poll_once(pin!(request(&mut service, 4)));
        assert_tower_rejected(out, RejectReason::Full);
        drop(held);
        assert!(matches!(poll_once(first), Poll::Ready(Ok(6))));
    });

    let fail_fast = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .timer(timer.clone())
        .build()
        .unwrap();
    let mut service = BulkheadService::new(double, fail_fast.clone());
    let held = fail_fast.try_acquire().unwrap();
    assert_allocations("tower: rejected, failing fast", boxed, || {
        let out = poll_once(pin!(request(&mut service, 5)));
        assert_tower_rejected(out, RejectReason::Full);
    });
    drop(held);

    // Waits that end on the timer: the error's box alone (a call timeout
    // names its bulkhead by the interned name, as a rejection does).
    let short = Bulkhead::builder()
        .name("short")
        .max_concurrent_calls(1)
        .max_wait(Duration::from_millis(1))
        .call_timeout(Duration::from_millis(1))
        .timer(timer)
        .build()
        .unwrap();
    let mut stuck = BulkheadService::new(
        tower::service_fn(|()| std::future::pending::<Result<(), Infallible>>()),
        short.clone(),
    );
    let held = short.try_acquire().unwrap();
    assert_allocations("tower: rejected after max_wait", boxed, || {
        let out = futures::executor::block_on(request(&mut stuck, ()));
        assert_tower_rejected(Poll::Ready(out), RejectReason::Timeout);
    });
    drop(held);
    assert_allocations("tower: call timed out", boxed, || {
        let out = futures::executor::block_on(request(&mut stuck, ()));
        let err = out.unwrap_err();
        assert!(err.is::<watertight::tower::CallTimeout>(), "{err}");
    });
    // A request's options (`options_from`): admitted after waiting, and
    // out of a `max_wait` of its own (the error's box only).
    let mut patient = BulkheadService::new(double, bh.clone()).options_from(|ms: &u32| {
        watertight::CallOptions::new().max_wait(Duration::from_millis(u64::from(*ms)))
    });
    assert_no_allocation("tower: options, admitted after waiting", || {
        let held = bh.try_acquire().unwrap();
        let mut waiting = pin!(request(&mut patient, 1_000));
        assert!(poll_once(waiting.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(waiting), Poll::Ready(Ok(2_000))));
    });
    let held = bh.try_acquire().unwrap();
    assert_allocations("tower: options, out of its own max_wait", boxed, || {
        let out = futures::executor::block_on(request(&mut patient, 1));
        assert_tower_rejected(Poll::Ready(out), RejectReason::Timeout);
    });
    drop(held);
    for b in [&bh, &fail_fast, &short] {
        assert_eq!(b.metrics().in_flight(), 0);
    }
}

/// With `http_responses`, an admitted request allocates nothing, and a
/// refused one what its response costs (its header map), and nothing
/// more: no box for the error.
#[cfg(all(feature = "tower", feature = "http"))]
#[test]
fn http_responses_allocate_only_the_refusals_response() {
    let _turn = one_at_a_time();
    use std::convert::Infallible;
    use std::future::ready;

    use watertight::tower::{BulkheadLayer, Refusal};

    let empty =
        tower::service_fn(|_: u32| ready(Ok::<_, Infallible>(http::Response::new(String::new()))));
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let mut service = tower::Layer::layer(&BulkheadLayer::new(bh.clone()).http_responses(), empty);

    assert_no_allocation("http_responses: admitted", || {
        let out = poll_once(pin!(request(&mut service, 1)));
        assert!(matches!(out, Poll::Ready(Ok(ref r)) if r.status() == 200));
    });

    let held = bh.try_acquire().unwrap();
    let response = {
        let rejected = bh.try_acquire().unwrap_err();
        allocations(|| {
            drop(std::hint::black_box(
                Refusal::Rejected(&rejected).response::<String>(),
            ))
        })
    };
    assert!(response > 0, "a response with headers allocates");
    assert_allocations("http_responses: rejected", response, || {
        let out = poll_once(pin!(request(&mut service, 2)));
        assert!(matches!(out, Poll::Ready(Ok(ref r)) if r.status() == 503));
    });
    drop(held);
}

/// `poll_ready` (which must be ready), then `call`, as a tower user does.
#[cfg(feature = "tower")]
fn request<S: tower::Service<R>, R>(service: &mut S, request: R) -> S::Future {
    let cx = &mut Context::from_waker(std::task::Waker::noop());
    assert!(matches!(service.poll_ready(cx), Poll::Ready(Ok(()))));
    service.call(request)
}

#[cfg(feature = "tower")]
fn assert_tower_rejected<T: std::fmt::Debug>(
    out: Poll<Result<T, watertight::tower::BoxError>>,
    reason: RejectReason,
) {
    match out {
        Poll::Ready(Err(e)) => {
            let rejected = e
                .downcast_ref::<watertight::Rejected>()
                .expect("a rejection");
            assert_eq!(rejected.reason(), reason);
        }
        other => panic!("expected {reason:?}, got {other:?}"),
    }
}

// `KeyedBulkhead`: no path of a call on a tracked key allocates, with any
// bundled timer. The first call of a key may allocate (tracking it builds
// its bulkhead); the warm-up runs take care of that.

/// The key every path calls; `OTHER` holds the global permit when a path
/// needs it held; `THIRD` meets a full global line.
const KEY: u64 = 7;
const OTHER: u64 = 8;
const THIRD: u64 = 9;

/// Every path of `KeyedBulkhead::call` on tracked keys, each key with a
/// limit of 1 under a global limit of 1, on keyed bulkheads made by `make`
/// (which sets the timer) and waits driven by `drive`.
fn keyed_every_path(
    timer: &str,
    make: &dyn Fn(KeyedBulkheadBuilder<u64>) -> KeyedBulkhead<u64>,
    drive: Drive,
) {
    let limits = || {
        KeyedBulkhead::<u64>::builder()
            .max_concurrent_calls(1)
            .global_limit(1)
    };
    let kb = make(
        limits()
            .max_queue(1)
            .global_max_queue(1)
            .max_wait(Duration::from_secs(10))
            .call_timeout(Duration::from_secs(10)),
    );
    let call = |key: &'static u64, n: u32| kb.call(key, async move { Ok::<_, ()>(n) });

    assert_no_allocation(&format!("{timer}: keyed, admitted at once"), || {
        assert_eq!(poll_once(pin!(call(&KEY, 1))), Poll::Ready(Ok(1)));
    });

    assert_no_allocation(
        &format!("{timer}: keyed, after waiting for the key"),
        || {
            let held = kb.try_acquire(&KEY).unwrap();
            let mut waiting = pin!(call(&KEY, 2));
            assert!(poll_once(waiting.as_mut()).is_pending());
            drop(held);
            assert_eq!(poll_once(waiting), Poll::Ready(Ok(2)));
        },
    );

    assert_no_allocation(
        &format!("{timer}: keyed, after waiting for the global"),
        || {
            let held = kb.try_acquire(&OTHER).unwrap();
            let mut waiting = pin!(call(&KEY, 3));
            assert!(poll_once(waiting.as_mut()).is_pending());
            drop(held);
            assert_eq!(poll_once(waiting), Poll::Ready(Ok(3)));
        },
    );

    assert_no_allocation(
        &format!("{timer}: keyed acquire, at once and after waiting for the global"),
        || {
            let permit = poll_once(pin!(kb.acquire(&KEY)));
            assert!(matches!(permit, Poll::Ready(Ok(_))));
            drop(permit);
            let held = kb.try_acquire(&OTHER).unwrap();
            let mut waiting = pin!(kb.acquire(&KEY));
            assert!(poll_once(waiting.as_mut()).is_pending());
            drop(held);
            assert!(matches!(poll_once(waiting), Poll::Ready(Ok(_))));
        },
    );

    assert_no_allocation(&format!("{timer}: keyed, the key's line is full"), || {
        let held = kb.try_acquire(&KEY).unwrap();
        let mut first = pin!(call(&KEY, 4));
        assert!(poll_once(first.as_mut()).is_pending());
        assert_keyed_rejected(poll_once(pin!(call(&KEY, 5))), KeyedRejectReason::KeyFull);
        drop(held);
        assert_eq!(poll_once(first), Poll::Ready(Ok(4)));
    });

    assert_no_allocation(&format!("{timer}: keyed, the global line is full"), || {
        let held = kb.try_acquire(&OTHER).unwrap();
        let mut first = pin!(call(&KEY, 6));
        assert!(poll_once(first.as_mut()).is_pending());
        let out = poll_once(pin!(call(&THIRD, 7)));
        assert_keyed_rejected(out, KeyedRejectReason::GlobalFull);
        drop(held);
        assert_eq!(poll_once(first), Poll::Ready(Ok(6)));
    });

    // Deadline-aware admission at both stages, and controlled delay on
    // every line: admitted at once, and after waiting for each stage.
    let by = Instant::now() + Duration::from_secs(60);
    let call_by = |key: &'static u64, n: u32| {
        kb.call_with(key, CallOptions::new().deadline(by), async move {
            Ok::<_, ()>(n)
        })
    };
    assert_no_allocation(&format!("{timer}: keyed call_by, admitted at once"), || {
        assert_eq!(poll_once(pin!(call_by(&KEY, 10))), Poll::Ready(Ok(10)));
    });
    for (held, n) in [(KEY, 11), (OTHER, 12)] {
        assert_no_allocation(
            &format!("{timer}: keyed call_by, after waiting ({held})"),
            || {
                let held = kb.try_acquire(&held).unwrap();
                let mut waiting = pin!(call_by(&KEY, n));
                assert!(poll_once(waiting.as_mut()).is_pending());
                drop(held);
                assert_eq!(poll_once(waiting), Poll::Ready(Ok(n)));
            },
        );
    }
    let delayed = make(
        limits()
            .max_wait(Duration::from_secs(10))
            .queue_delay(Duration::from_millis(5), Duration::from_millis(100)),
    );
    for (held, n) in [(KEY, 13), (OTHER, 14)] {
        assert_no_allocation(
            &format!("{timer}: keyed queue_delay, after waiting ({held})"),
            || {
                let held = delayed.try_acquire(&held).unwrap();
                let mut waiting = pin!(delayed.call(&KEY, async move { Ok::<_, ()>(n) }));
                assert!(poll_once(waiting.as_mut()).is_pending());
                drop(held);
                assert_eq!(poll_once(waiting), Poll::Ready(Ok(n)));
            },
        );
    }

    // Fair shares: callers wait for their key's turn (slots reused, the
    // rotation's tables keep their storage), one leaves on its turn, one
    // in its key's line, and the rest are served.
    let fair = make(limits().fair_shares().max_wait(Duration::from_secs(10)));
    assert_no_allocation(
        &format!("{timer}: keyed fair shares, waiting for a turn"),
        || {
            let held = fair.try_acquire(&OTHER).unwrap();
            let mut gone = pin!(Some(fair.call(&10, async { Ok::<_, ()>(0) })));
            let mut first = pin!(fair.call(&KEY, async { Ok::<_, ()>(15) }));
            let mut second = pin!(
                fair.call_with(&THIRD, CallOptions::new().deadline(by), async {
                    Ok::<_, ()>(16)
                })
            );
            let mut left = pin!(Some(fair.call(&11, async { Ok::<_, ()>(0) })));
            assert!(poll_once(gone.as_mut().as_pin_mut().unwrap()).is_pending());
            assert!(poll_once(first.as_mut()).is_pending());
            assert!(poll_once(second.as_mut()).is_pending());
            assert!(poll_once(left.as_mut().as_pin_mut().unwrap()).is_pending());
            drop(held);
            // On its turn, handed the seat: gone.
            gone.set(None);
            assert_eq!(poll_once(first), Poll::Ready(Ok(15)));
            left.set(None);
            assert_eq!(poll_once(second), Poll::Ready(Ok(16)));
        },
    );

    let fail_fast = make(limits().max_wait(Duration::ZERO));
    assert_no_allocation(&format!("{timer}: keyed, failing fast"), || {
        let held = fail_fast.try_acquire(&KEY).unwrap();
        let out = poll_once(pin!(fail_fast.call(&KEY, async { Ok::<_, ()>(8) })));
        assert_keyed_rejected(out, KeyedRejectReason::KeyFull);
        let out = poll_once(pin!(fail_fast.call(&OTHER, async { Ok::<_, ()>(9) })));
        assert_keyed_rejected(out, KeyedRejectReason::GlobalFull);
        drop(held);
    });

    // Waits that end on the timer, on a real executor.
    let short = make(
        limits()
            .max_wait(Duration::from_millis(1))
            .call_timeout(Duration::from_millis(1)),
    );
    let stuck = || async {
        pending::<()>().await;
        Ok::<_, ()>(())
    };
    let timed_out = |held: u64, reason: KeyedRejectReason| {
        let held = short.try_acquire(&held).unwrap();
        let mut out = None;
        drive(pin!(async { out = Some(short.call(&KEY, stuck()).await) }));
        assert_keyed_rejected(Poll::Ready(out.unwrap()), reason);
        drop(held);
    };
    assert_no_allocation(&format!("{timer}: keyed, max_wait for the key"), || {
        timed_out(KEY, KeyedRejectReason::KeyTimeout);
    });
    assert_no_allocation(&format!("{timer}: keyed, max_wait for the global"), || {
        timed_out(OTHER, KeyedRejectReason::GlobalTimeout);
    });
    assert_no_allocation(&format!("{timer}: keyed, call timed out"), || {
        let mut out = None;
        drive(pin!(async { out = Some(short.call(&KEY, stuck()).await) }));
        assert!(matches!(out, Some(Err(KeyedError::CallTimeout(_)))));
    });

    for kb in [&kb, &delayed, &fail_fast, &short] {
        assert_eq!(kb.global_metrics().unwrap().in_flight(), 0);
        assert_eq!(kb.metrics_for(&KEY).unwrap().in_flight(), 0);
    }
}

fn assert_keyed_rejected<T: std::fmt::Debug>(
    out: Poll<Result<T, KeyedError<()>>>,
    reason: KeyedRejectReason,
) {
    match out {
        Poll::Ready(Err(KeyedError::Rejected(r))) => assert_eq!(r.reason(), reason),
        other => panic!("expected {reason:?}, got {other:?}"),
    }
}

#[test]
fn keyed_thread_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    keyed_every_path(
        "ThreadTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}

// A current-thread runtime of the test's own thread: one shared with tests
// running in parallel sometimes has one test's thread do another's driver
// work (and its allocations) in `block_on`.
#[cfg(feature = "tokio")]
thread_local! {
    static OWN_RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
}

#[cfg(feature = "tokio")]
#[test]
fn keyed_tokio_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let handle = OWN_RUNTIME.with(|rt| rt.handle().clone());
    let timer: Arc<dyn Timer> = Arc::new(watertight::timer::TokioTimer::new(handle));
    keyed_every_path(
        "TokioTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| OWN_RUNTIME.with(|rt| rt.block_on(fut)),
    );
}

/// The default timer, inside a tokio runtime: the keyed bulkhead's sleeps
/// and its keys' are tokio sleeps.
#[cfg(feature = "tokio")]
#[test]
fn keyed_default_timer_in_tokio_allocates_nothing() {
    let _turn = one_at_a_time();
    let handle = OWN_RUNTIME.with(|rt| rt.handle().clone());
    let _entered = handle.enter();
    keyed_every_path("default in tokio", &|b| b.build().unwrap(), |fut| {
        OWN_RUNTIME.with(|rt| rt.block_on(fut))
    });
}

#[cfg(feature = "async-io")]
#[test]
fn keyed_async_io_timer_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let timer: Arc<dyn Timer> = Arc::new(watertight::timer::AsyncIoTimer::new());
    keyed_every_path(
        "AsyncIoTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}

/// Priority classes: a classed call admitted at once, one that waits and
/// is handed a seat, one displaced from a full line and one out of
/// `max_wait`, and with a deadline (`call_as_by`) allocate nothing once
/// the line's storage has grown.
#[test]
fn priority_class_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_queue(1)
        .max_wait(Duration::from_millis(2))
        .timer(timer)
        .build()
        .unwrap();
    assert_no_allocation("classed, at once", || {
        let mut call = pin!(bh.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(()) }));
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("classed, after waiting", || {
        let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
        let mut call = pin!(bh.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("classed, displaced", || {
        let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
        let mut low = pin!(bh.acquire_with(CallOptions::new().class(1)));
        assert!(poll_once(low.as_mut()).is_pending());
        let mut high = pin!(bh.acquire_with(CallOptions::new().class(0)));
        assert!(poll_once(high.as_mut()).is_pending());
        assert!(matches!(poll_once(low.as_mut()), Poll::Ready(Err(_))));
        drop(held);
        assert!(matches!(poll_once(high.as_mut()), Poll::Ready(Ok(_))));
    });
    assert_no_allocation("classed, out of max_wait", || {
        let _held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
        let r = futures::executor::block_on(bh.acquire_with(CallOptions::new().class(1)));
        assert_eq!(r.unwrap_err().reason(), RejectReason::Timeout);
    });
    let by = std::time::Instant::now() + Duration::from_secs(60);
    assert_no_allocation("classed with a deadline, at once", || {
        let mut call = pin!(
            bh.call_with(CallOptions::new().class(0).deadline(by), async {
                Ok::<_, ()>(())
            })
        );
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("classed with a deadline, after waiting", || {
        let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
        let mut call = pin!(
            bh.call_with(CallOptions::new().class(0).deadline(by), async {
                Ok::<_, ()>(())
            })
        );
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    let delayed = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .queue_delay(Duration::from_millis(1), Duration::from_millis(100))
        .max_wait(Duration::from_millis(2))
        .timer(Arc::new(ThreadTimer::new()))
        .build()
        .unwrap();
    assert_no_allocation("classed with controlled delay, after waiting", || {
        let held = delayed
            .try_acquire_with(CallOptions::new().class(1))
            .unwrap();
        let mut call =
            pin!(delayed.call_with(CallOptions::new().class(0), async { Ok::<_, ()>(()) }));
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("classed with controlled delay, past the target", || {
        let _held = delayed
            .try_acquire_with(CallOptions::new().class(0))
            .unwrap();
        let r = futures::executor::block_on(delayed.acquire_with(CallOptions::new().class(1)));
        assert_eq!(r.unwrap_err().reason(), RejectReason::Timeout);
    });
    assert_no_allocation("classed with a max_wait of its own, out of it", || {
        let _held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
        let own = CallOptions::new()
            .class(1)
            .max_wait(Duration::from_millis(1));
        let r = futures::executor::block_on(bh.acquire_with(own));
        assert_eq!(r.unwrap_err().reason(), RejectReason::Timeout);
    });
    // The keyed global stage on a classed global bulkhead.
    let keyed = watertight::KeyedBulkhead::<u64>::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_millis(50))
        .global(bh.clone())
        .build()
        .unwrap();
    assert_no_allocation("keyed, a classed global seat at once", || {
        let call = keyed.call_with(&1, CallOptions::new().class(0), async { Ok::<_, ()>(()) });
        assert!(matches!(poll_once(pin!(call)), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("keyed, a classed global seat after waiting", || {
        let held = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
        let call = keyed.call_with(&1, CallOptions::new().class(0), async { Ok::<_, ()>(()) });
        let mut call = pin!(call);
        assert!(poll_once(call.as_mut()).is_pending());
        drop(held);
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(()))));
    });
    assert_no_allocation("classed with a deadline, rejected", || {
        let passed = std::time::Instant::now() - Duration::from_millis(1);
        let r = futures::executor::block_on(
            bh.acquire_with(CallOptions::new().class(1).deadline(passed)),
        );
        assert_eq!(r.unwrap_err().reason(), RejectReason::WontMakeDeadline);
    });
}

/// Counts its wake-ups; cloning it (an `Arc` count) allocates nothing.
struct CountWakes(std::sync::atomic::AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The semaphore's own paths allocate nothing, fair and unfair: the
/// uncontended acquire, the hand-off to a lone waiter and to the head of a
/// longer line (the inline common cases of the release), the unfair race
/// a woken waiter loses and the re-queue at the front, `add_permits` to a
/// waiter, and cancelling a queued acquire at the head and behind it. The
/// waiters are polled with a real waker, which must be woken each time.
#[test]
fn semaphore_paths_allocate_nothing() {
    let _turn = one_at_a_time();
    use watertight::Semaphore;
    let count = Arc::new(CountWakes(std::sync::atomic::AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    let woken = || count.0.load(std::sync::atomic::Ordering::Relaxed);
    for fair in [true, false] {
        let make = || {
            if fair {
                Semaphore::new(1)
            } else {
                Semaphore::new_unfair(1)
            }
        };
        let mode = if fair { "fair" } else { "unfair" };
        let sem = make();
        assert_no_allocation(&format!("{mode}: uncontended acquire"), || {
            let mut a = pin!(sem.acquire());
            assert!(matches!(a.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        });
        assert_no_allocation(&format!("{mode}: try_acquire"), || {
            drop(sem.try_acquire().unwrap());
        });
        assert_no_allocation(&format!("{mode}: a release to a lone waiter"), || {
            let held = sem.try_acquire().unwrap();
            let before = woken();
            let mut a = pin!(sem.acquire());
            assert!(a.as_mut().poll(&mut cx).is_pending());
            drop(held);
            assert_eq!(woken(), before + 1, "the waiter is woken");
            assert!(matches!(a.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        });
        assert_no_allocation(&format!("{mode}: a release to the head of two"), || {
            let held = sem.try_acquire().unwrap();
            let mut a = pin!(sem.acquire());
            let mut b = pin!(sem.acquire());
            assert!(a.as_mut().poll(&mut cx).is_pending());
            assert!(b.as_mut().poll(&mut cx).is_pending());
            drop(held);
            let pa = match a.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(p)) => p,
                other => panic!("the head is served: {other:?}"),
            };
            assert!(b.as_mut().poll(&mut cx).is_pending());
            drop(pa);
            assert!(matches!(b.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        });
        assert_no_allocation(&format!("{mode}: add_permits to a waiter"), || {
            sem.try_acquire().unwrap().forget();
            let mut a = pin!(sem.acquire());
            assert!(a.as_mut().poll(&mut cx).is_pending());
            sem.add_permits(1);
            assert!(matches!(a.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        });
        assert_no_allocation(
            &format!("{mode}: cancelling at the head and behind it"),
            || {
                let held = sem.try_acquire().unwrap();
                // Dropped in place while queued: one behind the head (line a, c,
                // b), then the head.
                let mut a = pin!(Some(sem.acquire()));
                let mut b = pin!(sem.acquire());
                let mut c = pin!(Some(sem.acquire()));
                for fut in [a.as_mut(), c.as_mut()] {
                    assert!(fut.as_pin_mut().unwrap().poll(&mut cx).is_pending());
                }
                assert!(b.as_mut().poll(&mut cx).is_pending());
                assert_eq!(sem.queue_len(), 3);
                c.set(None); // behind the head
                a.set(None); // the head

                assert_eq!(sem.queue_len(), 1);
                drop(held);
                assert!(matches!(b.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
            },
        );
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(sem.queue_len(), 0);
    }
    let sem = Semaphore::new_unfair(1);
    assert_no_allocation(
        "unfair: a woken waiter loses the race and re-queues",
        || {
            let held = sem.try_acquire().unwrap();
            let mut a = pin!(sem.acquire());
            assert!(a.as_mut().poll(&mut cx).is_pending());
            drop(held);
            let barged = sem.try_acquire().expect("the releaser barges");
            assert!(a.as_mut().poll(&mut cx).is_pending(), "lost, back in line");
            assert_eq!(sem.queue_len(), 1);
            drop(barged);
            assert!(matches!(a.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        },
    );
}

/// Blocking waits allocate nothing after the thread's first: its parker is
/// made once and reused, whether the permit is free at once or handed over
/// by another thread while this one is parked.
#[test]
fn blocking_waits_allocate_nothing_after_the_first() {
    let _turn = one_at_a_time();
    use std::sync::atomic::{AtomicUsize, Ordering};
    use watertight::Semaphore;

    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let sem = Semaphore::new(1);
    assert_no_allocation("Semaphore::acquire_blocking, free", || {
        drop(sem.acquire_blocking().unwrap());
    });
    assert_no_allocation("Bulkhead::call_blocking, free", || {
        assert_eq!(bh.call_blocking(|| Ok::<_, ()>(1)), Ok(1));
    });

    // Handed over while parked: a helper thread holds the permit, waits
    // until this thread is in line, then releases it; `rounds` counts the
    // rounds this thread finished, so the helper takes the permit again
    // only after each.
    let rounds = Arc::new(AtomicUsize::new(0));
    let held_by_helper = Arc::new(AtomicUsize::new(0));
    let helper = {
        let (bh, rounds, held) = (bh.clone(), rounds.clone(), held_by_helper.clone());
        std::thread::spawn(move || {
            for round in 0..25 {
                while rounds.load(Ordering::SeqCst) < round {
                    std::thread::yield_now();
                }
                let permit = bh.try_acquire().unwrap();
                held.store(round + 1, Ordering::SeqCst);
                while bh.metrics().queued() == 0 {
                    std::thread::yield_now();
                }
                drop(permit);
            }
        })
    };
    let mut round = 0;
    assert_no_allocation("Bulkhead::call_blocking, handed over while parked", || {
        while held_by_helper.load(Ordering::SeqCst) <= round {
            std::thread::yield_now();
        }
        assert_eq!(bh.call_blocking(|| Ok::<_, ()>(2)), Ok(2));
        round += 1;
        rounds.store(round, Ordering::SeqCst);
    });
    helper.join().unwrap();
}
