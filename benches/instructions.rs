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
//! ```
//!
//! `CRATE` is one of `bulkhead`, `bulkhead_unfair`, `tokio`, `async_lock`,
//! `fi_fair`, `fi_unfair`, `baseline`. Each round spawns `TASKS` tasks that
//! between them do 8192 acquisitions, each `acquire().await`, then
//! `yield_now().await` while holding the permit, then drop, exactly as the
//! criterion bench's `contended_ct` group. Without arguments (as under a
//! plain `cargo bench`) it prints this usage and exits.

#[path = "common/contended.rs"]
#[allow(dead_code, reason = "try_acquire serves the criterion bench only")]
mod contended;

use std::sync::Arc;

use contended::{Baseline, Contender, TOTAL_ACQUIRES, round};

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
             (TASKS divides {TOTAL_ACQUIRES}); see benches/instructions.py"
        );
        return;
    };
    match krate {
        "bulkhead" => run(bulkhead::Semaphore::new(permits), tasks, rounds),
        "bulkhead_unfair" => run(bulkhead::Semaphore::new_unfair(permits), tasks, rounds),
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
