//! Fetch 24 "files" from a mirror that allows 4 connections at once, and
//! let a plain OS thread (a backup job) wait in the same line.
//!
//! Run with `cargo run --example downloads`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use watertight::Semaphore;

/// What one run observed.
#[derive(Debug)]
struct Report {
    fetched: usize,
    peak_in_flight: usize,
    backup_waited: Duration,
}

async fn run(files: usize, connections: usize) -> Report {
    let limit = Arc::new(Semaphore::new(connections));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for file in 0..files {
        let (limit, in_flight, peak) = (limit.clone(), in_flight.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            // Waits in a fair line; the permit goes back when dropped.
            let _permit = limit.acquire().await.expect("never closed");
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5 + (file as u64 % 4) * 5)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
        }));
    }

    // A backup job on a plain thread needs two connections at once; it
    // queues behind the downloads that came before it.
    let backup = {
        let limit = limit.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let permit = limit.acquire_many_blocking(2).expect("never closed");
            let waited = start.elapsed();
            drop(permit);
            waited
        })
    };

    for task in tasks {
        task.await.expect("download task panicked");
    }
    let backup_waited =
        tokio::task::spawn_blocking(move || backup.join().expect("backup panicked"))
            .await
            .expect("join");

    Report {
        fetched: files,
        peak_in_flight: peak.load(Ordering::SeqCst),
        backup_waited,
    }
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let report = run(24, 4).await;
    println!("fetched {} files with 4 connections", report.fetched);
    println!("peak connections in use: {}", report.peak_in_flight);
    println!(
        "backup job waited {:?} for 2 connections",
        report.backup_waited
    );
    println!("total time: {:?}", started.elapsed());
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_exceeds_the_connection_limit() {
        let report = super::run(24, 4).await;
        assert_eq!(report.fetched, 24);
        assert!(report.peak_in_flight <= 4, "peak {}", report.peak_in_flight);
        assert!(report.peak_in_flight >= 1);
    }
}
