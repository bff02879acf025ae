//! A deterministic simulation of a bulkhead in front of a dependency that
//! queues past its capacity, for trying limit algorithms: the one behind
//! the adaptive guide (`watertight::guide::adaptive`),
//! `examples/adaptive_sim.rs` and `tests/adaptive.rs`.
//!
//! It drives the crate's public limit algorithms only. The example and
//! the tests include this file by path, so both run the very same code.
//!
//! # The model
//!
//! Discrete events in virtual time (seconds as `f64`), no threads, no
//! clock; a seeded xorshift generator draws every random number, with no
//! transcendental functions, so a run is the same on every machine.
//!
//! - **Arrivals** are open loop: calls keep coming at `arrival_rate` a
//!   second whatever happens to them (gaps drawn uniformly from 0 to twice
//!   the mean), as requests from users do.
//! - **The bulkhead** fails fast: a call that finds `limit` calls in flight
//!   is rejected. The limit is the algorithm's, updated after every call
//!   that ends; lowering it cuts no call short.
//! - **The dependency** has `capacity` workers (it may change over time,
//!   see [`Scenario::capacity`]) and shares them among the calls in flight
//!   (processor sharing): each call needs `base_latency` of work, give or
//!   take `jitter`, and with `n` calls in flight each progresses at
//!   `min(1, capacity / n)` of full speed. Up to the capacity a call takes
//!   its base latency; past it latency grows in proportion (`n / capacity`
//!   times the base), and throughput does not grow at all.
//! - **Timeouts**: a call still running after `timeout` fails, and the
//!   dependency stops working on it.
//!
//! Latency in the results is what the caller of an admitted call waited:
//! the time until the call ended or timed out. Rejected calls are counted
//! apart.

use std::time::Duration;

use watertight::adaptive::{Aimd, Gradient, LimitAlgorithm, Sample};

#[path = "rng.rs"]
mod rng;
use rng::Rng;

/// The downstream dependency and the traffic.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Virtual seconds to simulate.
    pub duration: f64,
    /// Calls arriving per second.
    pub arrival_rate: f64,
    /// Seconds of work per call, on average, at full speed.
    pub base_latency: f64,
    /// Work per call varies uniformly within `base_latency × (1 ± jitter)`.
    pub jitter: f64,
    /// Seconds after which a call fails.
    pub timeout: f64,
    /// The dependency's capacity (calls it serves at full speed) from a time
    /// on: `(start second, capacity)`, in order, the first at 0.
    pub capacity: Vec<(f64, usize)>,
    /// Width of the time buckets of [`Report::buckets`], in seconds.
    pub bucket: f64,
    /// Seed of the random numbers.
    pub seed: u64,
}

impl Scenario {
    /// The adaptive guide's scenario: a dependency serving 20 calls at
    /// once in 50 ms (400 calls a second), offered 500 a second. At 40 s it
    /// loses half its capacity for 30 s. Calls time out after 250 ms.
    pub fn standard() -> Self {
        Self {
            duration: 100.0,
            arrival_rate: 500.0,
            base_latency: 0.050,
            jitter: 0.25,
            timeout: 0.250,
            capacity: vec![(0.0, 20), (40.0, 10), (70.0, 20)],
            bucket: 0.5,
            seed: 0x5eed_cafe,
        }
    }

    /// The capacity at time `t`.
    pub fn capacity_at(&self, t: f64) -> usize {
        self.capacity
            .iter()
            .take_while(|(start, _)| *start <= t)
            .last()
            .map_or(1, |&(_, c)| c)
    }

    /// The time of the first capacity change after `t`, if any.
    fn next_change(&self, t: f64) -> f64 {
        self.capacity
            .iter()
            .map(|&(start, _)| start)
            .find(|&start| start > t)
            .unwrap_or(f64::INFINITY)
    }
}

/// The strategies the adaptive guide compares on [`Scenario::standard`]:
/// AIMD (with a latency threshold of 1.4 times the base latency), the
/// gradient with its defaults, both starting at 10, and fixed limits of 5
/// (too low), 20 (the capacity, before it drops) and 100 (too high).
pub fn standard_strategies() -> Vec<(&'static str, Box<dyn LimitAlgorithm>)> {
    vec![
        (
            "aimd",
            Box::new(
                Aimd::new()
                    .initial_limit(10)
                    .latency_threshold(Duration::from_millis(70)),
            ),
        ),
        ("gradient", Box::new(Gradient::new().initial_limit(10))),
        ("fixed 5", Box::new(Fixed(5))),
        ("fixed 20", Box::new(Fixed(20))),
        ("fixed 100", Box::new(Fixed(100))),
    ]
}

/// A limit that never changes: the baseline strategies.
#[derive(Debug, Clone, Copy)]
pub struct Fixed(pub usize);

impl LimitAlgorithm for Fixed {
    fn limit(&self) -> usize {
        self.0
    }

    fn update(&mut self, _sample: Sample) -> usize {
        self.0
    }
}

/// The totals of one run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Calls that arrived.
    pub arrived: u64,
    /// Calls rejected by the bulkhead.
    pub rejected: u64,
    /// Calls that completed in time.
    pub succeeded: u64,
    /// Calls that timed out.
    pub timed_out: u64,
    /// Succeeded calls per second.
    pub goodput: f64,
    /// Median latency of admitted calls, in seconds.
    pub p50: f64,
    /// 99th percentile latency of admitted calls, in seconds.
    pub p99: f64,
    /// Timed-out calls as a share of admitted ones.
    pub error_rate: f64,
    /// Rejected calls as a share of arrived ones.
    pub reject_rate: f64,
    /// The limit at the end.
    pub final_limit: usize,
    /// The time-weighted mean limit.
    pub mean_limit: f64,
}

/// One time bucket of a run.
#[derive(Debug, Clone, Default)]
pub struct Bucket {
    /// Start, in seconds.
    pub start: f64,
    /// The dependency's capacity at the start.
    pub capacity: usize,
    /// Time-weighted mean limit.
    pub limit: f64,
    /// Time-weighted mean of calls in flight.
    pub in_flight: f64,
    /// Mean latency of the calls that ended in the bucket, in seconds
    /// (`NaN` if none did).
    pub latency: f64,
    /// Calls that succeeded in the bucket, per second.
    pub goodput: f64,
    /// Calls that timed out in the bucket.
    pub timed_out: u64,
    /// Calls rejected in the bucket.
    pub rejected: u64,
    ended: u64,
    latency_sum: f64,
    succeeded: u64,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// The strategy's name.
    pub name: String,
    /// The totals.
    pub summary: Summary,
    /// The run, bucket by bucket.
    pub buckets: Vec<Bucket>,
}

impl Report {
    /// The median of the bucket limits from `from` to `to` seconds.
    pub fn median_limit(&self, from: f64, to: f64) -> f64 {
        let mut limits: Vec<f64> = self
            .buckets
            .iter()
            .filter(|b| b.start >= from && b.start < to)
            .map(|b| b.limit)
            .collect();
        limits.sort_by(f64::total_cmp);
        limits.get(limits.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

/// A call in the dependency.
#[derive(Debug, Clone, Copy)]
struct Job {
    start: f64,
    /// Seconds of work left at full speed.
    work: f64,
}

/// Runs `scenario` with the limit `algorithm` learns (`tests/adaptive.rs`
/// has a run of a fixed limit checked against its arithmetic).
pub fn run(scenario: &Scenario, name: &str, algorithm: &mut dyn LimitAlgorithm) -> Report {
    let s = scenario;
    let mut rng = Rng::new(s.seed);
    let mut jobs: Vec<Job> = Vec::new();
    let mut latencies: Vec<f64> = Vec::new();
    let mut summary = Summary::default();
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut bucket = Bucket {
        capacity: s.capacity_at(0.0),
        ..Bucket::default()
    };
    let mut limit = algorithm.limit();
    let mut limit_area = 0.0;
    let mut t = 0.0;
    let mut next_arrival = rng.next_f64() * 2.0 / s.arrival_rate;

    while t < s.duration {
        let capacity = s.capacity_at(t) as f64;
        let n = jobs.len() as f64;
        let speed = if n <= capacity { 1.0 } else { capacity / n };
        // The next event of each kind.
        let (mut done_at, mut done) = (f64::INFINITY, usize::MAX);
        let (mut timeout_at, mut timed_out) = (f64::INFINITY, usize::MAX);
        for (i, job) in jobs.iter().enumerate() {
            let at = t + job.work.max(0.0) / speed;
            if at < done_at {
                (done_at, done) = (at, i);
            }
            let at = job.start + s.timeout;
            if at < timeout_at {
                (timeout_at, timed_out) = (at, i);
            }
        }
        let bucket_end = bucket.start + s.bucket;
        let next = done_at
            .min(timeout_at)
            .min(next_arrival)
            .min(bucket_end)
            .min(s.next_change(t))
            .min(s.duration);

        // Everything progresses until then.
        let dt = next - t;
        for job in &mut jobs {
            job.work -= dt * speed;
        }
        bucket.limit += limit as f64 * dt;
        bucket.in_flight += n * dt;
        limit_area += limit as f64 * dt;
        t = next;

        // One event at a time; ties resolve in this order.
        if t == done_at || t == timeout_at {
            let failed = t != done_at;
            let in_flight = jobs.len();
            let job = jobs.swap_remove(if failed { timed_out } else { done });
            let latency = if failed { s.timeout } else { t - job.start };
            latencies.push(latency);
            bucket.ended += 1;
            bucket.latency_sum += latency;
            if failed {
                summary.timed_out += 1;
                bucket.timed_out += 1;
            } else {
                summary.succeeded += 1;
                bucket.succeeded += 1;
            }
            let latency = Duration::from_secs_f64(latency);
            limit = algorithm.update(if failed {
                Sample::failure(latency, in_flight)
            } else {
                Sample::success(latency, in_flight)
            });
        } else if t == next_arrival {
            summary.arrived += 1;
            if jobs.len() < limit {
                let work = s.base_latency * (1.0 - s.jitter + 2.0 * s.jitter * rng.next_f64());
                jobs.push(Job { start: t, work });
            } else {
                summary.rejected += 1;
                bucket.rejected += 1;
            }
            next_arrival = t + rng.next_f64() * 2.0 / s.arrival_rate;
        }
        if t >= bucket_end || t >= s.duration {
            let width = t - bucket.start;
            let start = t;
            let mut full = std::mem::replace(
                &mut bucket,
                Bucket {
                    start,
                    capacity: s.capacity_at(start),
                    ..Bucket::default()
                },
            );
            full.limit /= width;
            full.in_flight /= width;
            full.latency = if full.ended == 0 {
                f64::NAN
            } else {
                full.latency_sum / full.ended as f64
            };
            full.goodput = full.succeeded as f64 / width;
            buckets.push(full);
        }
    }

    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        if latencies.is_empty() {
            f64::NAN
        } else {
            latencies[((latencies.len() - 1) as f64 * p).round() as usize]
        }
    };
    let admitted = summary.arrived - summary.rejected;
    summary.goodput = summary.succeeded as f64 / s.duration;
    summary.p50 = percentile(0.50);
    summary.p99 = percentile(0.99);
    summary.error_rate = summary.timed_out as f64 / admitted.max(1) as f64;
    summary.reject_rate = summary.rejected as f64 / summary.arrived.max(1) as f64;
    summary.final_limit = limit;
    summary.mean_limit = limit_area / s.duration;
    Report {
        name: name.to_owned(),
        summary,
        buckets,
    }
}
