//! Single-call paths of `Bulkhead` run a given number of times, for
//! callgrind (`benches/call_instructions.py`): instructions per call are
//! deterministic where the times on a shared machine are not.
//!
//! ```text
//! call_instructions PATH CALLS
//! ```
//!
//! `PATH` is one of:
//!
//! - `call`: `Bulkhead::call` of a ready future, admitted at once, with
//!   `max_wait` and `call_timeout` of 10 s (the `uncontended` cell of
//!   `benches/layer.rs`);
//! - `call_by`: the same through `Bulkhead::call_by` with a deadline a
//!   minute away;
//! - `call_queue_delay`: `call` on a bulkhead with controlled delay on;
//! - `reject_full`: `call` on a full bulkhead that fails fast;
//! - `try_acquire`: `Bulkhead::try_acquire` and drop;
//! - `keyed_call`: `KeyedBulkhead::call` on a tracked `u64` key (no global
//!   limit, no timed setting);
//! - `keyed_call_timed`: the same with a global limit, `max_wait` and
//!   `call_timeout` of 10 s;
//! - `keyed_call_queue_delay`: `keyed_call_timed` with controlled delay on;
//! - `keyed_call_fair`: `keyed_call_timed` with fair shares on (nobody
//!   waiting, so every call is admitted at once);
//! - `keyed_call_by`: `KeyedBulkhead::call_by` on `keyed_call`'s bulkhead
//!   with a deadline a minute away;
//! - `contended`, `contended_max_wait`: 64 tasks on a current-thread tokio
//!   runtime share 8 permits, each call's work yields once (the
//!   `contended/ct` and `contended/ct_max_wait` cells of
//!   `benches/layer.rs`); `CALLS` is the total, the runtime included.
//!
//! The single-call paths' futures are polled once by hand with
//! `Waker::noop()`, so no executor is counted. Without arguments (as under a plain `cargo bench`) it prints
//! this usage and exits.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use watertight::CallOptions;

use watertight::keyed::KeyedBulkhead;
use watertight::{Bulkhead, BulkheadBuilder};

#[inline]
fn poll<F: Future>(fut: F) -> Poll<F::Output> {
    pin!(fut).poll(&mut Context::from_waker(Waker::noop()))
}

fn builder() -> BulkheadBuilder {
    Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .max_wait(Duration::from_secs(10))
        .call_timeout(Duration::from_secs(10))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, calls) = match args.as_slice() {
        [path, calls] => match calls.parse::<u64>() {
            Ok(n) => (path.as_str(), n),
            Err(_) => return usage(),
        },
        _ => return usage(),
    };
    // Each path in a function of its own, so that adding one does not
    // change the code of the others.
    match path {
        "call" => call(calls),
        "call_by" => call_by(calls),
        "call_queue_delay" => call_queue_delay(calls),
        "reject_full" => reject_full(calls),
        "try_acquire" => try_acquire(calls),
        "keyed_call" => keyed_call(calls, false),
        "keyed_call_timed" => keyed_call(calls, true),
        "keyed_call_queue_delay" => keyed_call_queue_delay(calls),
        "keyed_call_fair" => keyed_call_fair(calls),
        "keyed_call_by" => keyed_call_by(calls),
        "contended" => contended(calls, None),
        "contended_max_wait" => contended(calls, Some(Duration::from_secs(10))),
        _ => usage(),
    }
}

#[inline(never)]
fn call(calls: u64) {
    let bh = builder().build().unwrap();
    for _ in 0..calls {
        let out = poll(bh.call(async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn call_by(calls: u64) {
    let bh = builder().build().unwrap();
    let by = Instant::now() + Duration::from_secs(60);
    for _ in 0..calls {
        let out = poll(bh.call_with(CallOptions::new().deadline(by), async {
            Ok::<_, ()>(black_box(1u32))
        }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn call_queue_delay(calls: u64) {
    let bh = builder()
        .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
        .build()
        .unwrap();
    for _ in 0..calls {
        let out = poll(bh.call(async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

/// A keyed bulkhead with 1,000 tracked `u64` keys, with (`timed`) or
/// without a global limit, `max_wait` and `call_timeout`.
fn keyed(timed: bool) -> watertight::keyed::KeyedBulkheadBuilder<u64> {
    let builder = KeyedBulkhead::<u64>::builder()
        .name("bench")
        .max_concurrent_calls(8);
    match timed {
        false => builder,
        true => builder
            .global_limit(64)
            .max_wait(Duration::from_secs(10))
            .call_timeout(Duration::from_secs(10)),
    }
}

fn track(kb: &KeyedBulkhead<u64>) {
    for key in 0..1_000u64 {
        drop(kb.try_acquire(&key).unwrap());
    }
}

#[inline(never)]
fn keyed_call(calls: u64, timed: bool) {
    let kb = keyed(timed).build().unwrap();
    track(&kb);
    for _ in 0..calls {
        let out = poll(kb.call(black_box(&417u64), async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn keyed_call_queue_delay(calls: u64) {
    let kb = keyed(true)
        .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
        .build()
        .unwrap();
    track(&kb);
    for _ in 0..calls {
        let out = poll(kb.call(black_box(&417u64), async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn keyed_call_fair(calls: u64) {
    let kb = keyed(true).fair_shares().build().unwrap();
    track(&kb);
    for _ in 0..calls {
        let out = poll(kb.call(black_box(&417u64), async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn keyed_call_by(calls: u64) {
    let kb = keyed(false).build().unwrap();
    track(&kb);
    let by = Instant::now() + Duration::from_secs(60);
    for _ in 0..calls {
        let call = kb.call_with(black_box(&417u64), CallOptions::new().deadline(by), async {
            Ok::<_, ()>(black_box(1u32))
        });
        assert!(matches!(black_box(poll(call)), Poll::Ready(Ok(1))));
    }
}

#[inline(never)]
fn reject_full(calls: u64) {
    let bh = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let _held = bh.try_acquire().unwrap();
    for _ in 0..calls {
        let out = poll(bh.call(async { Ok::<_, ()>(black_box(1u32)) }));
        assert!(matches!(black_box(out), Poll::Ready(Err(_))));
    }
}

#[inline(never)]
fn try_acquire(calls: u64) {
    let bh = builder().build().unwrap();
    for _ in 0..calls {
        drop(black_box(bh.try_acquire().unwrap()));
    }
}

#[inline(never)]
fn contended(calls: u64, max_wait: Option<Duration>) {
    const TASKS: u64 = 64;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut builder = Bulkhead::builder().name("bench").max_concurrent_calls(8);
        if let Some(max_wait) = max_wait {
            builder = builder.max_wait(max_wait);
        }
        let bh = builder.build().unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let bh = bh.clone();
                tokio::spawn(async move {
                    for _ in 0..calls / TASKS {
                        let out = bh
                            .call(async {
                                tokio::task::yield_now().await;
                                Ok::<_, ()>(black_box(1u32))
                            })
                            .await;
                        assert_eq!(out, Ok(1));
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

fn usage() {
    println!("usage: call_instructions PATH CALLS; see the source for the paths");
}
