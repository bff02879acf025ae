//! How late `max_wait` rejects, against `tokio::time::timeout` around a
//! tokio semaphore: the margin that the bulkhead guide (`watertight::guide::bulkhead`) quotes.
//!
//! 1,000 callers start over 20 ms (one every 20 µs) into a bulkhead whose
//! one permit is held, with `max_wait` 50 ms, on the default timer (so the
//! line shares one timer); in the same run, the same callers with
//! `tokio::time::timeout(50 ms, semaphore.acquire())`. Each caller measures
//! its own wait with `Instant` and the lateness is `waited - max_wait`; an
//! early rejection fails the run. Printed: min, median, p99 and max, on a
//! current-thread and a 2-worker runtime.
//!
//! Not a criterion bench (it measures a distribution, not a cost):
//!
//! ```sh
//! cargo bench -p watertight-benches --bench max_wait_margin --features tokio
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use watertight::Bulkhead;

const CALLERS: u64 = 1_000;
const MAX_WAIT: Duration = Duration::from_millis(50);
/// Callers start one every this long.
const SPREAD: Duration = Duration::from_micros(20);

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Bulkhead,
    Tokio,
}

/// Each caller's lateness past `MAX_WAIT`.
async fn run(contender: Contender) -> Vec<Duration> {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(MAX_WAIT)
        .build()
        .expect("the bench's bulkhead builds");
    let sem = Arc::new(tokio::sync::Semaphore::new(1));
    let _held = (
        bh.try_acquire().unwrap(),
        sem.clone().try_acquire_owned().unwrap(),
    );
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (bh, sem) = (bh.clone(), sem.clone());
            tokio::spawn(async move {
                tokio::time::sleep(SPREAD * i as u32).await;
                let start = Instant::now();
                let rejected = match contender {
                    Contender::Bulkhead => bh.acquire().await.is_err(),
                    Contender::Tokio => {
                        tokio::time::timeout(MAX_WAIT, sem.acquire()).await.is_err()
                    }
                };
                let waited = start.elapsed();
                assert!(rejected, "a caller was admitted into a held limit");
                assert!(waited >= MAX_WAIT, "rejected early, after {waited:?}");
                waited - MAX_WAIT
            })
        })
        .collect();
    let mut late = Vec::with_capacity(callers.len());
    for caller in callers {
        late.push(caller.await.expect("a caller panicked"));
    }
    if contender == Contender::Bulkhead {
        assert_eq!(bh.metrics().rejected_timeout(), CALLERS);
    }
    late
}

fn summary(mut late: Vec<Duration>) -> String {
    late.sort();
    let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "min {:.3} ms, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(late[0]),
        ms(at(0.5)),
        ms(at(0.99)),
        ms(late[late.len() - 1])
    )
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test
    // --benches`) runs nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!(
        "lateness past max_wait ({} ms), {CALLERS} callers starting over {} ms:",
        MAX_WAIT.as_millis(),
        (SPREAD * CALLERS as u32).as_millis()
    );
    for (name, rt) in [
        (
            "current-thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
        ),
        (
            "2 workers",
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build(),
        ),
    ] {
        let rt = rt.expect("a runtime");
        for (who, contender) in [
            ("bulkhead", Contender::Bulkhead),
            ("tokio timeout", Contender::Tokio),
        ] {
            let late = rt.block_on(run(contender));
            println!("  {name:>14}  {who:<13} {}", summary(late));
        }
    }
}
