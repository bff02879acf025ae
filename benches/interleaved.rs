//! The contended workload of `benches/semaphore.rs`, timed with the crates
//! interleaved: paired comparisons that the drift of a shared machine cannot
//! bias.
//!
//! Criterion measures one crate after another, a few seconds each, so when
//! the machine's load changes between two crates' turns (other tenants, CPU
//! frequency), the ratio of their times moves with it: the same contended
//! cell moved by 30 % between full criterion runs here. This runner instead
//! takes one sample of every crate in turn, in a rotating order, and repeats
//! that `REPS` times. Each repetition compares crates measured within a
//! fraction of a second of each other, and the report gives, per cell and
//! competitor, the median over repetitions of that paired ratio and in how
//! many repetitions `bulkhead` (and `bulkhead_unfair`) was the faster one.
//!
//! Usage:
//!
//! ```text
//! cargo bench -p watertight-benches --bench interleaved -- run [REPS] [CELL...]
//! ```
//!
//! `CELL` filters by name, e.g. `mt/t4096_p1` or `ct/t16_` (a substring of
//! `contended_mt/t4096_p1`; `t2_` picks the 2-task cells, `t2` would match
//! `t256` too); without one every cell runs. `REPS` defaults
//! to 15. Without `run` (as under a plain `cargo bench`) it prints this usage
//! and exits. It prints a markdown report on standard output. With
//! `INTERLEAVED_ENABLE_ALL=1` the runtimes have their I/O and time drivers,
//! as `#[tokio::main]` builds them.
//!
//! The round waits for its tasks with a shared countdown that the last task
//! to finish its loop brings to zero, waking the `block_on` thread once
//! (`contended::Join::Countdown`), so no crate is charged for the order its
//! tasks finish in. `INTERLEAVED_JOIN=spawn` awaits the handles in spawn
//! order instead (`for handle in handles { handle.await }`, the harness
//! before issue 13's fourth round), which wakes that thread once per task a
//! FIFO semaphore finishes in order. Every crate, the `baseline` too, runs
//! the same join; the report's first line names it.
//!
//! `python3 benches/interleaved_report.py REPORT.md...` sums up one or
//! several reports like for like (the fair semaphore against the fair
//! peers, the unfair one against the unfair ones). A whole grid at `run 21`
//! takes 30 to 60 seconds on two cores.

#[path = "common/contended.rs"]
#[allow(
    dead_code,
    reason = "try_acquire, BareCas and round serve the other benches"
)]
mod contended;

use std::sync::Arc;
use std::time::{Duration, Instant};

use contended::{Baseline, Contender, Join, TOTAL_ACQUIRES, round_joined};
use tokio::runtime::{Builder, Runtime};

const TASKS: [usize; 4] = [2, 16, 256, 4096];
const PERMITS: [usize; 3] = [1, 8, 64];
/// Rounds of `TOTAL_ACQUIRES` acquisitions in one sample.
const ROUNDS_PER_SAMPLE: usize = 3;
const DEFAULT_REPS: usize = 15;
/// The crates `bulkhead` and `bulkhead_unfair` are compared against.
const COMPETITORS: [&str; 5] = ["tokio", "async_lock", "fi_fair", "fi_unfair", "maitake"];

/// One sample of one crate's workload: `ROUNDS_PER_SAMPLE` rounds on `rt`.
type Sampler = Box<dyn Fn(&Runtime, usize, Join) -> Duration>;

fn sampler<S: Contender>(sem: S) -> Sampler {
    let sem = Arc::new(sem);
    Box::new(move |rt, tasks, join| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..ROUNDS_PER_SAMPLE {
                round_joined(&sem, tasks, TOTAL_ACQUIRES / tasks, join).await;
            }
            start.elapsed()
        })
    })
}

fn contenders(permits: usize) -> Vec<(&'static str, Sampler)> {
    vec![
        ("bulkhead", sampler(watertight::Semaphore::new(permits))),
        (
            "bulkhead_unfair",
            sampler(watertight::Semaphore::new_unfair(permits)),
        ),
        ("tokio", sampler(tokio::sync::Semaphore::new(permits))),
        ("async_lock", sampler(async_lock::Semaphore::new(permits))),
        (
            "fi_fair",
            sampler(futures_intrusive::sync::Semaphore::new(true, permits)),
        ),
        (
            "fi_unfair",
            sampler(futures_intrusive::sync::Semaphore::new(false, permits)),
        ),
        ("maitake", sampler(maitake_sync::Semaphore::new(permits))),
        ("baseline", sampler(Baseline)),
    ]
}

/// Every crate's sample times in one cell, indexed `[crate][repetition]`.
struct Cell {
    name: String,
    names: Vec<&'static str>,
    times: Vec<Vec<Duration>>,
}

fn measure(
    rt: &Runtime,
    name: String,
    (tasks, permits): (usize, usize),
    reps: usize,
    join: Join,
) -> Cell {
    let crates = contenders(permits);
    // Warm up every crate (allocator, runtime, caches) before measuring.
    for (_, sample) in &crates {
        sample(rt, tasks, join);
    }
    let mut times = vec![Vec::with_capacity(reps); crates.len()];
    for rep in 0..reps {
        // Rotate the order so that no crate always runs first or right after
        // the same neighbour.
        for k in 0..crates.len() {
            let i = (rep + k) % crates.len();
            times[i].push((crates[i].1)(rt, tasks, join));
        }
    }
    Cell {
        name,
        names: crates.iter().map(|(n, _)| *n).collect(),
        times,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

impl Cell {
    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| *n == name)
            .expect("every crate is measured")
    }

    /// Median nanoseconds per acquire/yield/release cycle.
    fn ns_per_cycle(&self, name: &str) -> f64 {
        let per = (ROUNDS_PER_SAMPLE * TOTAL_ACQUIRES) as f64;
        median(
            self.times[self.index(name)]
                .iter()
                .map(|t| t.as_nanos() as f64 / per)
                .collect(),
        )
    }

    /// The median over repetitions of `other`'s time / `ours`, and in how
    /// many repetitions `ours` was faster.
    fn paired(&self, ours: &str, other: &str) -> (f64, usize) {
        let (a, b) = (
            &self.times[self.index(ours)],
            &self.times[self.index(other)],
        );
        let ratios: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| y.as_secs_f64() / x.as_secs_f64())
            .collect();
        let wins = ratios.iter().filter(|r| **r > 1.0).count();
        (median(ratios), wins)
    }
}

/// Prints a markdown table: a row per cell, a column per name in `columns`,
/// each entry `value(cell, name)`.
fn table(cells: &[Cell], columns: &[&str], value: impl Fn(&Cell, &str) -> String) {
    let header: Vec<String> = columns.iter().map(|n| format!("`{n}`")).collect();
    println!("| scenario | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(columns.len()));
    for cell in cells {
        let row: Vec<String> = columns.iter().map(|n| value(cell, n)).collect();
        println!("| `{}` | {} |", cell.name, row.join(" | "));
    }
}

fn report(cells: &[Cell], reps: usize, join: Join, drivers: bool) {
    println!(
        "Join: `{}`; runtimes {} the I/O and time drivers.\n",
        join.name(),
        if drivers { "with" } else { "without" }
    );
    println!(
        "Median ns per acquire/yield/release cycle, {reps} interleaved repetitions of \
         {ROUNDS_PER_SAMPLE} rounds of {TOTAL_ACQUIRES} acquisitions per crate and cell:\n"
    );
    table(cells, &cells[0].names, |cell, name| {
        format!("{:.0}", cell.ns_per_cycle(name))
    });
    for ours in ["bulkhead", "bulkhead_unfair"] {
        println!(
            "\nPaired ratios for `{ours}`: the median over repetitions of (competitor's time / \
             `{ours}`'s time in the same repetition), >1 when `{ours}` is faster, and in how \
             many of the {reps} repetitions `{ours}` was faster:\n"
        );
        table(cells, &COMPETITORS, |cell, other| {
            let (ratio, wins) = cell.paired(ours, other);
            let mark = if wins * 2 < reps { " **lost**" } else { "" };
            format!("{ratio:.2} ({wins}/{reps}){mark}")
        });
        // The geometric mean of those medians per runtime.
        for group in ["contended_mt", "contended_ct"] {
            let group_cells: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.name.starts_with(&format!("{group}/")))
                .collect();
            if group_cells.is_empty() {
                continue;
            }
            let means: Vec<String> = COMPETITORS
                .iter()
                .map(|other| {
                    let logs: f64 = group_cells
                        .iter()
                        .map(|c| c.paired(ours, other).0.ln())
                        .sum();
                    format!("`{other}` {:.2}", (logs / group_cells.len() as f64).exp())
                })
                .collect();
            println!(
                "\nGeometric mean over the {} `{group}` cells: {}",
                group_cells.len(),
                means.join(", ")
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) != Some("run") {
        println!(
            "usage: cargo bench -p watertight-benches --bench interleaved -- run [REPS] [CELL...]"
        );
        return;
    }
    let mut rest = &args[1..];
    let mut reps = DEFAULT_REPS;
    if let Some(n) = rest.first().and_then(|a| a.parse::<usize>().ok()) {
        if n == 0 {
            eprintln!("REPS must be at least 1");
            std::process::exit(2);
        }
        reps = n;
        rest = &rest[1..];
    }
    let filters = rest;
    // `INTERLEAVED_ENABLE_ALL=1`: the runtimes as `#[tokio::main]` builds
    // them, with the I/O and time drivers, so that an idle worker parks on
    // the I/O driver and waking it is a system call (issue 13 measured
    // that way).
    let drivers = std::env::var_os("INTERLEAVED_ENABLE_ALL").is_some();
    let join = Join::from_env();
    let with_drivers = |b: &mut Builder| {
        if drivers {
            b.enable_all();
        }
    };
    let mut mt = Builder::new_multi_thread();
    mt.worker_threads(2);
    with_drivers(&mut mt);
    let mut ct = Builder::new_current_thread();
    with_drivers(&mut ct);
    let runtimes: [(&str, Runtime); 2] = [
        ("contended_mt", mt.build().expect("a multi-thread runtime")),
        (
            "contended_ct",
            ct.build().expect("a current-thread runtime"),
        ),
    ];
    let mut cells = Vec::new();
    for (group, rt) in &runtimes {
        for tasks in TASKS {
            for permits in PERMITS {
                let name = format!("{group}/t{tasks}_p{permits}");
                if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
                    continue;
                }
                eprintln!("measuring {name}");
                cells.push(measure(rt, name, (tasks, permits), reps, join));
            }
        }
    }
    if cells.is_empty() {
        eprintln!("no cell matches {filters:?}");
        std::process::exit(2);
    }
    report(&cells, reps, join, drivers);
}
