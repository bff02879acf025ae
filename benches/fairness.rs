//! How evenly a semaphore spreads its grants among equal tasks in a hot
//! loop: `TASKS` tokio tasks on a 2-worker runtime (built with
//! `enable_all`, as `#[tokio::main]` builds it), one permit, each task
//! looping acquire, count, release, and acquiring again at once. After
//! `WARM_UP`, the grants in the next `WINDOW` are counted, and the report is max/min over the tasks
//! (1.00 is perfectly even; a strict FIFO hand-off should give about 1.00).
//!
//! Usage: `cargo bench -p bulkhead-benches --bench fairness -- run [RUNS]`
//! (prints a markdown table; without `run` it prints this usage).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const TASKS: usize = 64;
const WINDOW: Duration = Duration::from_millis(200);
const WARM_UP: Duration = Duration::from_millis(50);

/// One permit's acquire, as each crate spells it.
trait Fair: Send + Sync + 'static {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_;
}

impl Fair for bulkhead::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire()
    }
}

impl Fair for tokio::sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire()
    }
}

impl Fair for futures_intrusive::sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire(1)
    }
}

impl Fair for maitake_sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire(1)
    }
}

/// Grants per task over one window.
fn counts<S: Fair>(rt: &tokio::runtime::Runtime, sem: S) -> Vec<u64> {
    let sem = Arc::new(sem);
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
    rt.block_on(async {
        let start = Arc::new(tokio::sync::Barrier::new(TASKS + 1));
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                let (sem, stop, counts, start) =
                    (sem.clone(), stop.clone(), counts.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    while !stop.load(Ordering::Relaxed) {
                        let permit = sem.grant().await;
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        drop(permit);
                    }
                })
            })
            .collect();
        start.wait().await;
        // Counted from when every task has had time to join the line: the
        // start (a task that runs before the others are polled takes the
        // free permit again and again) is not what is measured.
        tokio::time::sleep(WARM_UP).await;
        let before: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        tokio::time::sleep(WINDOW).await;
        let snapshot: Vec<u64> = counts
            .iter()
            .zip(before)
            .map(|(c, before)| c.load(Ordering::Relaxed) - before)
            .collect();
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            handle.await.expect("a task panicked");
        }
        snapshot
    })
}

fn spread(counts: &[u64]) -> (u64, u64, u64) {
    let max = *counts.iter().max().unwrap();
    let min = *counts.iter().min().unwrap();
    (max, min, counts.iter().sum())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(at) = args.iter().position(|a| a == "run") else {
        println!("usage: cargo bench -p bulkhead-benches --bench fairness -- run [RUNS]");
        return;
    };
    let runs: usize = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{TASKS} tasks, 1 permit, 2 workers, {WINDOW:?} per run: max/min grants per task (total grants)\n"
    );
    println!(
        "| crate | {} |",
        (1..=runs)
            .map(|r| format!("run {r}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(runs));
    type Case = (
        &'static str,
        Box<dyn Fn(&tokio::runtime::Runtime) -> Vec<u64>>,
    );
    let cases: Vec<Case> = vec![
        (
            "bulkhead (fair)",
            Box::new(|rt| counts(rt, bulkhead::Semaphore::new(1))),
        ),
        (
            "tokio",
            Box::new(|rt| counts(rt, tokio::sync::Semaphore::new(1))),
        ),
        (
            "futures-intrusive (fair)",
            Box::new(|rt| counts(rt, futures_intrusive::sync::Semaphore::new(true, 1))),
        ),
        (
            "maitake-sync",
            Box::new(|rt| counts(rt, maitake_sync::Semaphore::new(1))),
        ),
    ];
    let mut cells: Vec<Vec<String>> = vec![Vec::new(); cases.len()];
    for _ in 0..runs {
        for (i, (_, case)) in cases.iter().enumerate() {
            let got = case(&rt);
            if std::env::var_os("FAIRNESS_DUMP").is_some() {
                let mut sorted = got.clone();
                sorted.sort_unstable();
                eprintln!("{}: {sorted:?}", cases[i].0);
            }
            let (max, min, total) = spread(&got);
            let ratio = if min == 0 {
                f64::INFINITY
            } else {
                max as f64 / min as f64
            };
            cells[i].push(format!("{ratio:.2} ({total})"));
        }
    }
    for (i, (name, _)) in cases.iter().enumerate() {
        println!("| {name} | {} |", cells[i].join(" | "));
    }
}
