//! Not a criterion bench: where the time of a contended 2-worker cell goes
//! (issue 13's T = 4096, P = 8 cell). Runs `benches/interleaved.rs`'s
//! workload (the same `round`: `T` tasks spawned together, each looping
//! acquire, `yield_now`, release, `8192 / T` times) with every task's
//! future wrapped in a counter, and reports per acquisition: nanoseconds,
//! task polls, polls on a different worker thread than the task's previous
//! poll (migrations: the task's memory moves between the cores' caches),
//! and the acquire futures' own polls: how many acquisitions were ready at
//! their first poll (took the permit at once, barging in unfair mode), and
//! how many of the acquire futures' polls returned `Pending` after their
//! first (a wake-up that did not bring a permit: a waiter woken to compete
//! that lost, or a spurious poll), and how many times the runtime's workers
//! parked (each park of an idle worker is later an unpark: a wake-up of its
//! thread).
//!
//! Usage: `cargo bench -p watertight-benches --bench polls -- run [REPS] [T] [P] [CRATE...]`
//! (`INTERLEAVED_ENABLE_ALL=1` builds the runtime with its drivers). The
//! round joins its tasks as `benches/interleaved.rs`'s does: a countdown the
//! last task wakes the `block_on` thread with, or with `INTERLEAVED_JOIN=spawn`
//! the handles awaited in spawn order; the `main polls` column counts the
//! `block_on` future's polls per round (each one a wake-up of that thread
//! but the first).
//! `CRATE` is any of `bulkhead`, `bulkhead_unfair`, `tokio`, `async_lock`,
//! `fi_fair`, `fi_unfair`, `maitake`, `baseline`; without one, `bulkhead`, `tokio`,
//! `fi_fair` and `baseline`. With `POLLS_SAMPLES=1` it also prints every
//! sample's time and worker parks per acquisition on standard error.

#[path = "common/contended.rs"]
#[allow(dead_code, reason = "only the contenders and the join are used")]
mod contended;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use contended::{Baseline, Contender, Join, TOTAL_ACQUIRES, spawn_and_join};

thread_local! {
    /// A number for the worker thread, assigned on first use.
    static WORKER: Cell<u64> = const { Cell::new(0) };
}
static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

fn worker_id() -> u64 {
    WORKER.with(|w| {
        if w.get() == 0 {
            w.set(NEXT_WORKER.fetch_add(1, Ordering::Relaxed));
        }
        w.get()
    })
}

#[derive(Default)]
struct Counts {
    polls: AtomicU64,
    migrations: AtomicU64,
    /// Polls by worker number (the `block_on` thread and the two workers).
    by_worker: [AtomicU64; 8],
    /// Acquisitions whose future was ready at its first poll.
    at_once: AtomicU64,
    /// Polls of acquire futures after their first that returned `Pending`.
    lost: AtomicU64,
}

/// An acquire future that counts its polls into `Counts`.
struct CountedAcquire<'a, F> {
    inner: F,
    polls: u64,
    counts: &'a Counts,
}

impl<F: Future> Future for CountedAcquire<'_, F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: as in `Counted`: `inner` is structurally pinned, never
        // moved out, and the other fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        this.polls += 1;
        // SAFETY: see above.
        let out = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        match (&out, this.polls) {
            (Poll::Ready(_), 1) => {
                this.counts.at_once.fetch_add(1, Ordering::Relaxed);
            }
            (Poll::Pending, 2..) => {
                this.counts.lost.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        out
    }
}

/// A future that counts its polls and the polls that ran on another worker
/// than the one before.
struct Counted<F> {
    /// Inline, as the task's future is in `benches/interleaved.rs`.
    inner: F,
    last: u64,
    counts: Arc<Counts>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is never moved out of the pinned `Counted` (there
        // is no `Unpin` impl, and nothing else touches it), so it stays
        // pinned; the other fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        let me = worker_id();
        this.counts.polls.fetch_add(1, Ordering::Relaxed);
        this.counts.by_worker[(me as usize).min(7)].fetch_add(1, Ordering::Relaxed);
        if this.last != 0 && this.last != me {
            this.counts.migrations.fetch_add(1, Ordering::Relaxed);
        }
        this.last = me;
        // SAFETY: see above; `inner` is structurally pinned.
        unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx)
    }
}

async fn round<S: Contender>(
    sem: &Arc<S>,
    (tasks, per_task): (usize, usize),
    join: Join,
    counts: &Arc<Counts>,
) {
    let mut first = true;
    spawn_and_join(tasks, join, |finish| {
        let sem = sem.clone();
        let c = counts.clone();
        let fut = async move {
            let _finish = finish;
            for _ in 0..per_task {
                let permit = CountedAcquire {
                    inner: sem.acquire(),
                    polls: 0,
                    counts: &c,
                }
                .await;
                tokio::task::yield_now().await;
                drop(permit);
            }
        };
        if std::env::var_os("POLLS_SIZES").is_some() && first {
            eprintln!(
                "{}: task future {} bytes",
                std::any::type_name::<S>(),
                size_of_val(&fut)
            );
        }
        first = false;
        tokio::spawn(Counted {
            inner: fut,
            last: 0,
            counts: counts.clone(),
        })
    })
    .await;
}

/// Time, polls, migrations, the share of polls the busiest worker ran,
/// acquisitions ready at once, acquire polls pending after the first, how
/// many times the workers parked (tokio's `worker_park_count`, summed), and
/// the `block_on` future's polls.
type Sample = (Duration, u64, u64, f64, u64, u64, u64, u64);

/// Times the runtime's workers have parked so far, summed over workers.
fn parks(rt: &tokio::runtime::Runtime) -> u64 {
    let m = rt.metrics();
    (0..m.num_workers()).map(|w| m.worker_park_count(w)).sum()
}

fn sample<S: Contender>(
    rt: &tokio::runtime::Runtime,
    sem: &Arc<S>,
    tasks: usize,
    join: Join,
) -> Sample {
    let counts = Arc::new(Counts::default());
    let parked = parks(rt);
    // The `block_on` future's polls: the first, and one per wake-up of the
    // thread that joins the tasks.
    let main = Arc::new(Counts::default());
    let took = rt.block_on(async {
        let start = Instant::now();
        Counted {
            inner: round(sem, (tasks, TOTAL_ACQUIRES / tasks), join, &counts),
            last: 0,
            counts: main.clone(),
        }
        .await;
        start.elapsed()
    });
    let main_polls = main.polls.load(Ordering::Relaxed);
    if std::env::var_os("POLLS_SAMPLES").is_some() {
        eprintln!("main polls {main_polls}");
    }
    let parked = parks(rt) - parked;
    let polls = counts.polls.load(Ordering::Relaxed);
    let busiest = counts
        .by_worker
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    (
        took,
        polls,
        counts.migrations.load(Ordering::Relaxed),
        busiest as f64 / polls.max(1) as f64,
        counts.at_once.load(Ordering::Relaxed),
        counts.lost.load(Ordering::Relaxed),
        parked,
        main_polls,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(at) = args.iter().position(|a| a == "run") else {
        println!(
            "usage: cargo bench -p watertight-benches --bench polls -- run [REPS] [T] [P] [CRATE...]"
        );
        return;
    };
    let arg = |k: usize, d: usize| args.get(at + k).and_then(|n| n.parse().ok()).unwrap_or(d);
    let (reps, tasks, permits) = (arg(1, 15), arg(2, 4096), arg(3, 8));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2);
    if std::env::var_os("INTERLEAVED_ENABLE_ALL").is_some() {
        builder.enable_all();
    }
    let rt = builder.build().unwrap();
    let join = Join::from_env();
    type Run = Box<dyn Fn(&tokio::runtime::Runtime, usize, Join) -> Sample>;
    fn run<S: Contender>(sem: S) -> Run {
        let sem = Arc::new(sem);
        Box::new(move |rt, tasks, join| sample(rt, &sem, tasks, join))
    }
    let names: Vec<&str> = match args.get(at + 4..) {
        Some(rest) if !rest.is_empty() => rest.iter().map(String::as_str).collect(),
        _ => vec!["bulkhead", "tokio", "fi_fair", "baseline"],
    };
    let crates: Vec<(&str, Run)> = names
        .iter()
        .map(|&name| {
            let r = match name {
                "bulkhead" => run(watertight::Semaphore::new(permits)),
                "bulkhead_unfair" => run(watertight::Semaphore::new_unfair(permits)),
                "tokio" => run(tokio::sync::Semaphore::new(permits)),
                "async_lock" => run(async_lock::Semaphore::new(permits)),
                "fi_fair" => run(futures_intrusive::sync::Semaphore::new(true, permits)),
                "fi_unfair" => run(futures_intrusive::sync::Semaphore::new(false, permits)),
                "maitake" => run(maitake_sync::Semaphore::new(permits)),
                "baseline" => run(Baseline),
                other => {
                    eprintln!("unknown crate {other:?}");
                    std::process::exit(2);
                }
            };
            (name, r)
        })
        .collect();
    let mut results: Vec<Vec<Sample>> = vec![Vec::new(); crates.len()];
    for (_, f) in &crates {
        f(&rt, tasks, join);
    }
    for rep in 0..reps {
        for k in 0..crates.len() {
            let i = (rep + k) % crates.len();
            results[i].push((crates[i].1)(&rt, tasks, join));
        }
    }
    let per = TOTAL_ACQUIRES as f64;
    if std::env::var_os("POLLS_SAMPLES").is_some() {
        // Every sample: crate, ns and worker parks per acquisition.
        for (i, (name, _)) in crates.iter().enumerate() {
            for r in &results[i] {
                eprintln!(
                    "sample {name} {:.0} {:.4}",
                    r.0.as_nanos() as f64 / per,
                    r.6 as f64 / per
                );
            }
        }
    }
    println!(
        "T = {tasks}, P = {permits}, join `{}`, {reps} samples of {TOTAL_ACQUIRES} acquisitions \
         (medians per acquisition; main polls per round):\n",
        join.name()
    );
    println!(
        "| crate | ns | polls | migrations | busiest worker's share of polls | ready at once | lost wake-ups | worker parks | main polls |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, (name, _)) in crates.iter().enumerate() {
        let med = |f: &dyn Fn(&Sample) -> f64| {
            let mut v: Vec<f64> = results[i].iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "| {name} | {:.0} | {:.2} | {:.3} | {:.2} | {:.3} | {:.3} | {:.4} | {:.0} |",
            med(&|r| r.0.as_nanos() as f64 / per),
            med(&|r| r.1 as f64 / per),
            med(&|r| r.2 as f64 / per),
            med(&|r| r.3),
            med(&|r| r.4 as f64 / per),
            med(&|r| r.5 as f64 / per),
            med(&|r| r.6 as f64 / per),
            med(&|r| r.7 as f64),
        );
    }
}
