//! The semaphore depends on no runtime: the same scenarios (from
//! `tests/common`) run on tokio (multi-thread and current-thread),
//! async-std, smol and the `futures` executors.
//!
//! Each test runs under a watchdog, so a lost wake-up on some executor
//! fails the test instead of hanging.

#![cfg(not(loom))]

mod common;

use common::{Load, WATCHDOG, bounded_concurrency, close_wakes_waiters, with_watchdog};
use futures::future::BoxFuture;
use futures::task::SpawnExt;

/// Waiters the close scenario queues behind its partly served head: more
/// than one of the crate's wake-up batches (32) in all.
const CLOSE_WAITERS: usize = common::scaled(40, 4);

/// As many as `close` wakes in one batch (31 behind the head).
const ONE_BATCH_OF_WAITERS: usize = 31;

fn tokio_multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

fn tokio_current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// Spawns on the ambient tokio runtime; the handle resolves when the task
/// ends and passes on its panic.
fn tokio_spawn(task: BoxFuture<'static, ()>) -> impl Future<Output = ()> {
    let handle = tokio::spawn(task);
    async move { handle.await.unwrap() }
}

/// Tokio, two worker threads: in-flight permits never exceed K, every round
/// completes, and the balance is whole again.
#[test]
#[cfg_attr(miri, ignore = "tokio's multi-thread runtime is too slow under Miri")]
fn tokio_multi_thread_bounds_concurrency() {
    with_watchdog("tokio multi-thread", WATCHDOG, || {
        tokio_multi_thread().block_on(bounded_concurrency(Load::DEFAULT, tokio_spawn));
    });
}

/// Tokio, two worker threads: close wakes every queued task with an error
/// (as many waiters as `close` wakes in one batch).
#[test]
#[cfg_attr(miri, ignore = "tokio's multi-thread runtime is too slow under Miri")]
fn tokio_multi_thread_close_wakes_waiters() {
    with_watchdog("tokio multi-thread close", WATCHDOG, || {
        tokio_multi_thread().block_on(close_wakes_waiters(ONE_BATCH_OF_WAITERS, tokio_spawn));
    });
}

/// Tokio, two worker threads: close wakes every queued task with an error,
/// more than one wake-up batch of them.
#[test]
#[cfg_attr(miri, ignore = "multi-thread runtimes are too slow under Miri")]
fn tokio_multi_thread_close_wakes_more_than_a_batch_of_waiters() {
    with_watchdog("tokio multi-thread close", WATCHDOG, || {
        tokio_multi_thread().block_on(close_wakes_waiters(CLOSE_WAITERS, tokio_spawn));
    });
}

/// Tokio, current thread: in-flight permits reach K and never exceed it.
#[test]
fn tokio_current_thread_bounds_concurrency() {
    with_watchdog("tokio current-thread", WATCHDOG, || {
        let load = Load::DEFAULT;
        let max = tokio_current_thread().block_on(bounded_concurrency(load, tokio_spawn));
        assert_eq!(
            max, load.permits,
            "one thread interleaving tasks fills every permit"
        );
    });
}

/// Tokio, current thread: close wakes every queued task with an error.
#[test]
fn tokio_current_thread_close_wakes_waiters() {
    with_watchdog("tokio current-thread close", WATCHDOG, || {
        tokio_current_thread().block_on(close_wakes_waiters(CLOSE_WAITERS, tokio_spawn));
    });
}

/// async-std (its global thread pool): in-flight permits never exceed K.
#[test]
#[cfg_attr(miri, ignore = "async-std is not exercised under Miri")]
fn async_std_bounds_concurrency() {
    with_watchdog("async-std", WATCHDOG, || {
        async_std::task::block_on(bounded_concurrency(Load::DEFAULT, async_std::task::spawn));
    });
}

/// async-std: close wakes every queued task with an error (as many
/// waiters as `close` wakes in one batch).
#[test]
#[cfg_attr(miri, ignore = "async-std is not exercised under Miri")]
fn async_std_close_wakes_waiters() {
    with_watchdog("async-std close", WATCHDOG, || {
        let scenario = close_wakes_waiters(ONE_BATCH_OF_WAITERS, async_std::task::spawn);
        async_std::task::block_on(scenario);
    });
}

/// async-std: close wakes every queued task with an error, more than one
/// wake-up batch of them.
#[test]
#[cfg_attr(miri, ignore = "multi-thread runtimes are too slow under Miri")]
fn async_std_close_wakes_more_than_a_batch_of_waiters() {
    with_watchdog("async-std close", WATCHDOG, || {
        async_std::task::block_on(close_wakes_waiters(CLOSE_WAITERS, async_std::task::spawn));
    });
}

/// smol, one local executor driven by `smol::block_on`: in-flight permits
/// reach K and never exceed it.
#[test]
#[cfg_attr(miri, ignore = "smol is not exercised under Miri")]
fn smol_bounds_concurrency() {
    with_watchdog("smol", WATCHDOG, || {
        let ex = smol::Executor::new();
        let load = Load::DEFAULT;
        let max = smol::block_on(ex.run(bounded_concurrency(load, |task| ex.spawn(task))));
        assert_eq!(
            max, load.permits,
            "one thread interleaving tasks fills every permit"
        );
    });
}

/// smol: close wakes every queued task with an error.
#[test]
#[cfg_attr(miri, ignore = "smol is not exercised under Miri")]
fn smol_close_wakes_waiters() {
    with_watchdog("smol close", WATCHDOG, || {
        let ex = smol::Executor::new();
        smol::block_on(ex.run(close_wakes_waiters(CLOSE_WAITERS, |task| ex.spawn(task))));
    });
}

/// `futures::executor::block_on`, the tasks joined in place (`join_all`
/// style, no spawning): in-flight permits reach K and never exceed it.
#[test]
fn futures_block_on_join_bounds_concurrency() {
    with_watchdog("futures block_on", WATCHDOG, || {
        let load = Load::DEFAULT;
        let max = futures::executor::block_on(bounded_concurrency(load, |task| task));
        assert_eq!(
            max, load.permits,
            "one thread interleaving tasks fills every permit"
        );
    });
}

/// `futures::executor::LocalPool`: in-flight permits reach K and never
/// exceed it.
#[test]
fn futures_local_pool_bounds_concurrency() {
    with_watchdog("futures LocalPool", WATCHDOG, || {
        let mut pool = futures::executor::LocalPool::new();
        let spawner = pool.spawner();
        let load = Load::DEFAULT;
        let max = pool.run_until(bounded_concurrency(load, |task| {
            spawner
                .spawn_with_handle(task)
                .expect("the pool is running")
        }));
        assert_eq!(
            max, load.permits,
            "one thread interleaving tasks fills every permit"
        );
    });
}

/// `futures::executor::LocalPool`: close wakes every queued task with an
/// error.
#[test]
fn futures_local_pool_close_wakes_waiters() {
    with_watchdog("futures LocalPool close", WATCHDOG, || {
        let mut pool = futures::executor::LocalPool::new();
        let spawner = pool.spawner();
        pool.run_until(close_wakes_waiters(CLOSE_WAITERS, |task| {
            spawner
                .spawn_with_handle(task)
                .expect("the pool is running")
        }));
    });
}
