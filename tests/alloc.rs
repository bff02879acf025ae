//! No path of the in-process bulkhead allocates per call, with any bundled
//! timer: admitted at once, admitted after waiting, rejected because full
//! (failing fast, or the line is full), rejected after `max_wait`, and
//! timed out by `call_timeout`.
//!
//! A counting global allocator counts the allocations made on the test's
//! own thread while a call runs; each path runs a few times first (the
//! timer's thread and maps are set up once), then must allocate nothing.
//! What a runtime's own driver thread does is the runtime's business and not
//! counted (the tokio cases run on a current-thread runtime, where the
//! driver is this thread, so they are).
#![cfg(not(loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::{Future, pending};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bulkhead::timer::{ThreadTimer, Timer};
use bulkhead::{Bulkhead, BulkheadBuilder, BulkheadError, RejectReason};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping only touches const-initialised thread-locals, which never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|n| n.set(n.get() + 1));
        }
    });
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations on this thread while `f` runs.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNT.with(Cell::get)
}

/// Runs `path` five times to warm up, then asserts that twenty more
/// allocate nothing.
fn assert_no_allocation(what: &str, mut path: impl FnMut()) {
    for _ in 0..5 {
        path();
    }
    let n = allocations(|| {
        for _ in 0..20 {
            path();
        }
    });
    assert_eq!(n, 0, "{what}: {n} allocations in 20 calls");
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
        assert!(matches!(out, Some(Err(BulkheadError::CallTimeout))));
    });
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
    let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    every_path(
        "ThreadTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}

#[cfg(feature = "tokio")]
fn tokio_runtime() -> &'static tokio::runtime::Runtime {
    use std::sync::OnceLock;
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

#[cfg(feature = "tokio")]
#[test]
fn tokio_timer_paths_allocate_nothing() {
    let rt = tokio_runtime();
    let timer: Arc<dyn Timer> = Arc::new(bulkhead::timer::TokioTimer::new(rt.handle().clone()));
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
    let _entered = tokio_runtime().enter();
    every_path("default in tokio", &|b| b.build().unwrap(), |fut| {
        tokio_runtime().block_on(fut)
    });
}

#[cfg(feature = "async-io")]
#[test]
fn async_io_timer_paths_allocate_nothing() {
    let timer: Arc<dyn Timer> = Arc::new(bulkhead::timer::AsyncIoTimer::new());
    // Not `async_io::block_on`: it makes a parker (an allocation) per call.
    every_path(
        "AsyncIoTimer",
        &|b| b.timer(timer.clone()).build().unwrap(),
        |fut| futures::executor::block_on(fut),
    );
}
