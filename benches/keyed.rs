//! The costs of `KeyedBulkhead`'s key registry, uncontended.
//!
//! - `keyed_new_key_at_cap/<max_keys>`: `try_acquire` of a key never seen
//!   before, and the permit dropped, with `max_keys` idle keys tracked: each
//!   iteration evicts the key idle longest to make room (the key type is
//!   `u64`; the work is the lookup that misses, building the key's
//!   bulkhead, one eviction and one insert).
//! - `keyed_call/bulkhead`: `Bulkhead::call` of a ready future on a plain
//!   bulkhead (the baseline).
//! - `keyed_call/existing_u64`, `keyed_call/existing_str`: `KeyedBulkhead::call`
//!   of a ready future on a key that is tracked already, with 1,000 other
//!   keys tracked, for `u64` and `String` keys (looked up by `&str`). The
//!   difference from the baseline is the registry: the lookup, the user
//!   count, and the key's move to the back of its shard's idle list when
//!   the call ends.
//!
//! Every future is polled once by hand with `Waker::noop()`, so no executor
//! is measured. Run with `cargo bench --bench keyed`; the ratios of the
//! `keyed_call` lines to `keyed_call/bulkhead` are printed at the end.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bulkhead::Bulkhead;
use bulkhead::keyed::KeyedBulkhead;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// Polls a future that must be ready at once.
#[inline]
fn ready<F: Future>(fut: F) -> F::Output {
    let fut = pin!(fut);
    match fut.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("uncontended future was not ready"),
    }
}

fn new_key_at_cap(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_new_key_at_cap");
    for max_keys in [1_000usize, 10_000] {
        let kb = KeyedBulkhead::<u64>::builder()
            .name("bench")
            .max_concurrent_calls(8)
            .max_keys(max_keys)
            .build()
            .unwrap();
        for key in 0..max_keys as u64 {
            drop(kb.try_acquire(&key).unwrap());
        }
        assert_eq!(kb.keys_tracked(), max_keys);
        let mut next = max_keys as u64;
        g.bench_with_input(BenchmarkId::from_parameter(max_keys), &kb, |b, kb| {
            b.iter(|| {
                next += 1;
                drop(black_box(kb.try_acquire(&next).unwrap()));
            })
        });
        let stats = kb.stats();
        assert_eq!(stats.keys_tracked(), max_keys);
        assert_eq!(
            stats.keys_created() - stats.keys_evicted(),
            max_keys as u64,
            "every new key evicted one"
        );
    }
    g.finish();
}

/// A keyed call's work without the registry: `Bulkhead::acquire`, then the
/// call under the permit.
async fn acquire_then_call(bh: &Bulkhead) -> Result<u32, ()> {
    let permit = bh.acquire().await.map_err(drop)?;
    let out = async { Ok::<_, ()>(black_box(1u32)) }.await;
    drop(permit);
    out
}

fn call_on_existing_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_call");
    let bh = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    g.bench_function("bulkhead", |b| {
        b.iter(|| black_box(ready(bh.call(async { Ok::<_, ()>(black_box(1u32)) })).unwrap()))
    });
    // What a keyed call does besides the registry: the key's permit through
    // `Bulkhead::acquire`, the call, the permit dropped.
    g.bench_function("bulkhead_acquire", |b| {
        b.iter(|| black_box(ready(acquire_then_call(&bh)).unwrap()))
    });

    let by_id = KeyedBulkhead::<u64>::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    for key in 0..1_000u64 {
        drop(by_id.try_acquire(&key).unwrap());
    }
    let key = 417u64;
    g.bench_function("existing_u64", |b| {
        b.iter(|| {
            black_box(
                ready(by_id.call(black_box(&key), async { Ok::<_, ()>(black_box(1u32)) })).unwrap(),
            )
        })
    });

    let by_name = KeyedBulkhead::<String>::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    for key in 0..1_000u64 {
        drop(by_name.try_acquire(&format!("tenant-{key}")).unwrap());
    }
    let name = "tenant-417";
    g.bench_function("existing_str", |b| {
        b.iter(|| {
            black_box(
                ready(by_name.call(black_box(name), async { Ok::<_, ()>(black_box(1u32)) }))
                    .unwrap(),
            )
        })
    });
    g.finish();
}

/// Times the three `keyed_call` cases interleaved, a round of each in
/// turn, and prints the median of each and the ratios to the plain
/// bulkhead: the same machine state for all three, so the ratio holds
/// even while the machine's speed drifts.
fn paired_ratios(_: &mut Criterion) {
    const ROUNDS: usize = 101;
    const CALLS: u32 = 20_000;
    let bh = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    let by_id = KeyedBulkhead::<u64>::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    let by_name = KeyedBulkhead::<String>::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    for key in 0..1_000u64 {
        drop(by_id.try_acquire(&key).unwrap());
        drop(by_name.try_acquire(&format!("tenant-{key}")).unwrap());
    }
    let time = |f: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..CALLS {
            f();
        }
        start.elapsed() / CALLS
    };
    let plain = || {
        black_box(ready(bh.call(async { Ok::<_, ()>(black_box(1u32)) })).unwrap());
    };
    let id = || {
        black_box(
            ready(by_id.call(black_box(&417u64), async { Ok::<_, ()>(black_box(1u32)) })).unwrap(),
        );
    };
    let name = || {
        black_box(
            ready(by_name.call(black_box("tenant-417"), async {
                Ok::<_, ()>(black_box(1u32))
            }))
            .unwrap(),
        );
    };
    let mut samples: [Vec<Duration>; 3] = Default::default();
    let mut ratios: [Vec<f64>; 2] = Default::default();
    for _ in 0..ROUNDS {
        let p = time(&plain);
        let i = time(&id);
        let n = time(&name);
        ratios[0].push(i.as_secs_f64() / p.as_secs_f64());
        ratios[1].push(n.as_secs_f64() / p.as_secs_f64());
        for (s, d) in samples.iter_mut().zip([p, i, n]) {
            s.push(d);
        }
    }
    let median_d = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let median_f = |v: &mut Vec<f64>| {
        v.sort_unstable_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("keyed_call, interleaved, {ROUNDS} rounds of {CALLS} calls each (medians):");
    println!("  bulkhead       {:>8.1?}", median_d(&mut samples[0]));
    println!(
        "  existing_u64   {:>8.1?}   {:.2}x bulkhead",
        median_d(&mut samples[1]),
        median_f(&mut ratios[0])
    );
    println!(
        "  existing_str   {:>8.1?}   {:.2}x bulkhead",
        median_d(&mut samples[2]),
        median_f(&mut ratios[1])
    );
}

criterion_group!(benches, new_key_at_cap, call_on_existing_key, paired_ratios);
criterion_main!(benches);
