//! Finding a leaked permit: a report generator keeps one permit of the
//! database bulkhead alive by mistake (stashed in a cache), and the
//! bulkhead's leak detector names it long before the pool runs dry.
//!
//! ```sh
//! cargo run --example leaks
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use watertight::observer::{LeakSuspected, Observer};
use watertight::{Bulkhead, BulkheadPermit};

/// Prints every suspected leak, as a pool's leak detector logs it.
#[derive(Debug)]
struct LeakLog {
    start: Instant,
    seen: Mutex<Vec<String>>,
}

impl Observer for LeakLog {
    fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
        let line = format!(
            "[{:>4} ms] bulkhead {:?}: a permit has been held for {} ms (threshold {} ms): \
             stuck call or leaked permit?",
            self.start.elapsed().as_millis(),
            e.name,
            e.held.as_millis(),
            e.threshold.as_millis()
        );
        println!("{line}");
        self.seen.lock().unwrap().push(line);
    }
}

/// Runs the scenario; returns the leak reports and the permits free at the
/// end.
fn run(threshold: Duration) -> (Vec<String>, usize) {
    let log = Arc::new(LeakLog {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    });
    let db = Bulkhead::builder()
        .name("orders-db")
        .max_concurrent_calls(4)
        .leak_threshold(threshold)
        .observer(log.clone())
        .build()
        .expect("a valid bulkhead");

    // The bug: a "cached" query result keeps the permit that fetched it.
    let mut cache: Vec<BulkheadPermit> = Vec::new();
    for query in 0..20 {
        let permit = db.try_acquire().expect("a free permit");
        std::thread::sleep(threshold / 10); // the query itself: well under the threshold
        if query == 3 {
            cache.push(permit); // leaked
        }
    }
    std::thread::sleep(threshold * 2);
    let free = db.metrics().available();
    println!(
        "{} leak(s) suspected; {free} of 4 permits free; {} suspected in the metrics",
        log.seen.lock().unwrap().len(),
        db.metrics().leaks_suspected()
    );
    drop(cache);
    let seen = log.seen.lock().unwrap().clone();
    (seen, free)
}

fn main() {
    run(Duration::from_millis(200));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exactly the leaked permit is reported, once, naming the bulkhead;
    /// the queries released in time are not.
    #[test]
    fn the_leaked_permit_is_reported_once() {
        let (seen, free) = run(Duration::from_millis(100));
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].contains("\"orders-db\""), "{}", seen[0]);
        assert_eq!(free, 3);
    }
}
