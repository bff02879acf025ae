//! The contended current-thread workload of `benches/semaphore.rs`, run once
//! per invocation so that `benches/instructions.py` can count its
//! instructions under callgrind.
//!
//! On a current-thread runtime the scheduling is deterministic, so the
//! instruction count of a run is the same every time, unlike its time on a
//! shared two-core machine. The script runs each scenario for one round and
//! for five and divides the difference by the acquisitions in between, which
//! cancels the start-up and runtime set-up.
//!
//! Usage (normally through the script):
//!
//! ```text
//! instructions CRATE TASKS PERMITS ROUNDS
//! instructions uncontended CRATE ITERATIONS
//! ```
//!
//! `CRATE` is one of `bulkhead`, `bulkhead_unfair`, `tokio`, `async_lock`,
//! `fi_fair`, `fi_unfair`, `baseline`. Each round spawns `TASKS` tasks that
//! between them do 8192 acquisitions, each `acquire().await`, then
//! `yield_now().await` while holding the permit, then drop, exactly as the
//! criterion bench's `contended_ct` group. The `uncontended` form runs
//! `ITERATIONS` times the loop body of the criterion bench's
//! `uncontended_acquire` group (`contended::acquire_ready`: create
//! `acquire()`, poll it once with a no-op waker, drop the permit), on one
//! permit, with no runtime; `CRATE` may also be `bare_cas` there
//! (`benches/instructions.py --uncontended`). Without arguments (as under a
//! plain `cargo bench`) it prints this usage and exits.

#[path = "common/contended.rs"]
#[allow(
    dead_code,
    reason = "try_acquire and the joins serve the other benches"
)]
mod contended;

use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Waker};

use contended::{BareCas, Baseline, Contender, TOTAL_ACQUIRES, acquire_ready, round};

fn run<S: Contender>(sem: S, tasks: usize, rounds: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let sem = Arc::new(sem);
    rt.block_on(async {
        for _ in 0..rounds {
            round(&sem, tasks, TOTAL_ACQUIRES / tasks).await;
        }
    });
}

/// `iterations` uncontended acquire/drop cycles on `sem`.
fn uncontended<S: Contender>(sem: S, iterations: u64) {
    let sem = black_box(sem);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..iterations {
        acquire_ready(&sem, &mut cx);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, krate, iterations] = args.as_slice() {
        if mode != "uncontended" {
            eprintln!("unknown mode {mode:?}; see the usage");
            std::process::exit(2);
        }
        let Ok(n) = iterations.parse::<u64>() else {
            eprintln!("ITERATIONS must be a number, not {iterations:?}");
            std::process::exit(2);
        };
        match krate.as_str() {
            "bulkhead" => uncontended(watertight::Semaphore::new(1), n),
            "bulkhead_unfair" => uncontended(watertight::Semaphore::new_unfair(1), n),
            "tokio" => uncontended(tokio::sync::Semaphore::new(1), n),
            "async_lock" => uncontended(async_lock::Semaphore::new(1), n),
            "fi_fair" => uncontended(futures_intrusive::sync::Semaphore::new(true, 1), n),
            "fi_unfair" => uncontended(futures_intrusive::sync::Semaphore::new(false, 1), n),
            "maitake" => uncontended(maitake_sync::Semaphore::new(1), n),
            "bare_cas" => uncontended(BareCas::new(1), n),
            "baseline" => uncontended(Baseline, n),
            other => {
                eprintln!("unknown crate {other:?}");
                std::process::exit(2);
            }
        }
        return;
    }
    let parsed = match args.as_slice() {
        [krate, tasks, permits, rounds] => match (tasks.parse(), permits.parse(), rounds.parse()) {
            (Ok(t), Ok(p), Ok(r)) if t > 0 && TOTAL_ACQUIRES % t == 0 => {
                Some((krate.as_str(), t, p, r))
            }
            _ => None,
        },
        _ => None,
    };
    let Some((krate, tasks, permits, rounds)) = parsed else {
        println!(
            "usage: instructions CRATE TASKS PERMITS ROUNDS \
             (TASKS divides {TOTAL_ACQUIRES}), or instructions uncontended CRATE ITERATIONS; \
             see benches/instructions.py"
        );
        return;
    };
    match krate {
        "bulkhead" => run(watertight::Semaphore::new(permits), tasks, rounds),
        "bulkhead_unfair" => run(watertight::Semaphore::new_unfair(permits), tasks, rounds),
        "tokio" => run(tokio::sync::Semaphore::new(permits), tasks, rounds),
        "async_lock" => run(async_lock::Semaphore::new(permits), tasks, rounds),
        "fi_fair" => run(
            futures_intrusive::sync::Semaphore::new(true, permits),
            tasks,
            rounds,
        ),
        "fi_unfair" => run(
            futures_intrusive::sync::Semaphore::new(false, permits),
            tasks,
            rounds,
        ),
        "baseline" => run(Baseline, tasks, rounds),
        other => {
            eprintln!("unknown crate {other:?}");
            std::process::exit(2);
        }
    }
}
