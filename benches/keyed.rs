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
//!   of a ready future on a key that is tracked already, with 1,000 keys
//!   tracked of the default `max_keys` (10,000), for `u64` and `String` keys
//!   (looked up by `&str`). The difference from the baseline is the
//!   registry: the hash, the shard's read lock, the user count and the
//!   entry's reference count (below half full, a key going idle reads no
//!   clock and, linked already since the last new key, takes no lock).
//! - `keyed_call/existing_u64_half_full`: the same with `max_keys` 1,000:
//!   at the cap, a key going idle reads the clock and moves to the back of
//!   its shard's idle order (what an `idle_timeout` costs too).
//! - `keyed_call/bulkhead_timed`, `keyed_call/existing_u64_timed`: the
//!   configuration of the docs, `max_wait` and `call_timeout` set (and for
//!   the keyed bulkhead a global limit): neither arms a timer for a call
//!   that is admitted at once and finishes on its first poll.
//! - `keyed_call/existing_u64_queue_delay`: the timed configuration with
//!   controlled delay on (`queue_delay`, on each key's line and the global
//!   one), compared with `existing_u64_timed`: a call admitted at once
//!   never waits, so the option should cost it nothing.
//! - `keyed_call/existing_u64_call_by`: `KeyedBulkhead::call_by` with a
//!   deadline far ahead on `existing_u64`'s bulkhead: deadline-aware
//!   admission at the key's stage (a clock reading, the estimate).
//!
//! Every future is polled once by hand with `Waker::noop()`, so no executor
//! is measured. Run with `cargo bench -p watertight-benches --bench keyed`;
//! the ratios of the keyed lines to their plain bulkhead are printed at the
//! end.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use watertight::CallOptions;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use watertight::Bulkhead;
use watertight::keyed::KeyedBulkhead;

/// Polls a future that must be ready at once. Always inlined: a future
/// passed by value to a call is copied whole (hundreds of bytes), which
/// would be timed too.
#[inline(always)]
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

/// The keyed bulkheads and plain bulkheads the `keyed_call` cases run on.
struct Cases {
    plain: Bulkhead,
    plain_timed: Bulkhead,
    by_id: KeyedBulkhead<u64>,
    by_name: KeyedBulkhead<String>,
    /// The same two with foldhash (seeded per bulkhead) for SipHash.
    by_id_fold: KeyedBulkhead<u64, foldhash::fast::RandomState>,
    by_name_fold: KeyedBulkhead<String, foldhash::fast::RandomState>,
    half_full: KeyedBulkhead<u64>,
    timed: KeyedBulkhead<u64>,
    delayed: KeyedBulkhead<u64>,
}

impl Cases {
    fn new() -> Self {
        let budget = Duration::from_secs(1);
        let plain = || Bulkhead::builder().name("bench").max_concurrent_calls(8);
        let keyed = || {
            KeyedBulkhead::<u64>::builder()
                .name("bench")
                .max_concurrent_calls(8)
        };
        let cases = Self {
            plain: plain().build().unwrap(),
            plain_timed: plain()
                .max_wait(budget)
                .call_timeout(budget)
                .build()
                .unwrap(),
            by_id: keyed().build().unwrap(),
            by_name: KeyedBulkhead::<String>::builder()
                .name("bench")
                .max_concurrent_calls(8)
                .build()
                .unwrap(),
            by_id_fold: keyed()
                .hasher(foldhash::fast::RandomState::default())
                .build()
                .unwrap(),
            by_name_fold: KeyedBulkhead::<String>::builder()
                .name("bench")
                .max_concurrent_calls(8)
                .hasher(foldhash::fast::RandomState::default())
                .build()
                .unwrap(),
            half_full: keyed().max_keys(1_000).build().unwrap(),
            timed: keyed()
                .global_limit(64)
                .max_wait(budget)
                .call_timeout(budget)
                .build()
                .unwrap(),
            delayed: keyed()
                .global_limit(64)
                .max_wait(budget)
                .call_timeout(budget)
                .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
                .build()
                .unwrap(),
        };
        for key in 0..1_000u64 {
            for kb in [&cases.by_id, &cases.half_full, &cases.timed, &cases.delayed] {
                drop(kb.try_acquire(&key).unwrap());
            }
            drop(cases.by_id_fold.try_acquire(&key).unwrap());
            drop(cases.by_name.try_acquire(&format!("tenant-{key}")).unwrap());
            drop(
                cases
                    .by_name_fold
                    .try_acquire(&format!("tenant-{key}"))
                    .unwrap(),
            );
        }
        cases
    }
}

/// One call of a ready future through the bulkhead `$bh`. A macro, not a
/// function: each use is a future type of its own, polled from one place,
/// so that the compiler inlines every case alike (a future polled from
/// several places may not be, and then costs a third more).
macro_rules! plain_call {
    ($bh:expr) => {{
        black_box(ready($bh.call(async { Ok::<_, ()>(black_box(1u32)) })).unwrap());
    }};
}

/// One call of a ready future through the keyed bulkhead `$kb`, on `$key`
/// (tracked already), to be done by `$by`; a macro for the same reason.
macro_rules! keyed_call_by {
    ($kb:expr, $key:expr, $by:expr) => {{
        black_box(
            ready(
                $kb.call_with(black_box($key), CallOptions::new().deadline($by), async {
                    Ok::<_, ()>(black_box(1u32))
                }),
            )
            .unwrap(),
        );
    }};
}

/// One call of a ready future through the keyed bulkhead `$kb`, on `$key`
/// (tracked already); a macro for the same reason.
macro_rules! keyed_call {
    ($kb:expr, $key:expr) => {{
        black_box(
            ready($kb.call(black_box($key), async { Ok::<_, ()>(black_box(1u32)) })).unwrap(),
        );
    }};
}

fn call_on_existing_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_call");
    let cases = Cases::new();
    g.bench_function("bulkhead", |b| b.iter(|| plain_call!(&cases.plain)));
    // What a keyed call did besides the registry before it used the key's
    // bulkhead's own fast path: `Bulkhead::acquire`, the call, the permit
    // dropped.
    g.bench_function("bulkhead_acquire", |b| {
        b.iter(|| black_box(ready(acquire_then_call(&cases.plain)).unwrap()))
    });
    g.bench_function("existing_u64", |b| {
        b.iter(|| keyed_call!(&cases.by_id, &417u64))
    });
    g.bench_function("existing_str", |b| {
        b.iter(|| keyed_call!(&cases.by_name, "tenant-417"))
    });
    g.bench_function("existing_u64_foldhash", |b| {
        b.iter(|| keyed_call!(&cases.by_id_fold, &417u64))
    });
    g.bench_function("existing_str_foldhash", |b| {
        b.iter(|| keyed_call!(&cases.by_name_fold, "tenant-417"))
    });
    g.bench_function("existing_u64_half_full", |b| {
        b.iter(|| keyed_call!(&cases.half_full, &417u64))
    });
    g.bench_function("bulkhead_timed", |b| {
        b.iter(|| plain_call!(&cases.plain_timed))
    });
    g.bench_function("existing_u64_timed", |b| {
        b.iter(|| keyed_call!(&cases.timed, &417u64))
    });
    g.bench_function("existing_u64_queue_delay", |b| {
        b.iter(|| keyed_call!(&cases.delayed, &417u64))
    });
    let by = Instant::now() + Duration::from_secs(3_600);
    g.bench_function("existing_u64_call_by", |b| {
        b.iter(|| keyed_call_by!(&cases.by_id, &417u64, by))
    });
    g.finish();
}

/// Times the `keyed_call` cases interleaved, a round of each in turn, and
/// prints the median of each and its median ratio to its plain bulkhead:
/// the same machine state for all, so the ratio holds even while the
/// machine's speed drifts.
fn paired_ratios(_: &mut Criterion) {
    const ROUNDS: usize = 101;
    const CALLS: u32 = 20_000;
    let cases = Cases::new();
    let time = |f: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..CALLS {
            f();
        }
        start.elapsed() / CALLS
    };
    let by = Instant::now() + Duration::from_secs(3_600);
    // (name, the call, the index of the case it is compared with)
    let runs: [(&str, &dyn Fn(), usize); 10] = [
        ("bulkhead", &|| plain_call!(&cases.plain), 0),
        ("existing_u64", &|| keyed_call!(&cases.by_id, &417u64), 0),
        (
            "existing_str",
            &|| keyed_call!(&cases.by_name, "tenant-417"),
            0,
        ),
        (
            "existing_u64_foldhash",
            &|| keyed_call!(&cases.by_id_fold, &417u64),
            0,
        ),
        (
            "existing_str_foldhash",
            &|| keyed_call!(&cases.by_name_fold, "tenant-417"),
            0,
        ),
        (
            "existing_u64_half_full",
            &|| keyed_call!(&cases.half_full, &417u64),
            0,
        ),
        ("bulkhead_timed", &|| plain_call!(&cases.plain_timed), 6),
        (
            "existing_u64_timed",
            &|| keyed_call!(&cases.timed, &417u64),
            6,
        ),
        (
            "existing_u64_queue_delay",
            &|| keyed_call!(&cases.delayed, &417u64),
            7,
        ),
        (
            "existing_u64_call_by",
            &|| keyed_call_by!(&cases.by_id, &417u64, by),
            1,
        ),
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); runs.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for _ in 0..ROUNDS {
        let round: Vec<Duration> = runs.iter().map(|(_, f, _)| time(*f)).collect();
        for (i, &(_, _, base)) in runs.iter().enumerate() {
            samples[i].push(round[i]);
            ratios[i].push(round[i].as_secs_f64() / round[base].as_secs_f64());
        }
    }
    println!("keyed_call, interleaved, {ROUNDS} rounds of {CALLS} calls each (medians):");
    for (i, &(name, _, base)) in runs.iter().enumerate() {
        samples[i].sort_unstable();
        ratios[i].sort_unstable_by(f64::total_cmp);
        let median = samples[i][samples[i].len() / 2];
        if base == i {
            println!("  {name:<24}{median:>8.1?}");
        } else {
            let ratio = ratios[i][ratios[i].len() / 2];
            println!("  {name:<24}{median:>8.1?}   {ratio:.2}x {}", runs[base].0);
        }
    }
}

criterion_group!(benches, new_key_at_cap, call_on_existing_key, paired_ratios);
criterion_main!(benches);
