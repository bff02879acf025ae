//! Adaptive limits: the algorithms on hand-made samples, the simulation
//! behind the adaptive guide (`watertight::guide::adaptive`), and the
//! limiter driving real bulkheads.
#![cfg(not(loom))]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use futures::executor::block_on;
use watertight::adaptive::{
    self, AdaptiveLimiter, Aimd, Gradient, LimitAlgorithm, Sample, Verdict,
};
use watertight::{Bulkhead, CallOutcome};

/// The example, for its plot: `src/guide/adaptive.svg` must be what it draws.
#[allow(dead_code)]
#[path = "../examples/adaptive_sim.rs"]
mod example;

use example::sim::{Fixed, Report, Scenario, run, standard_strategies};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Feeds `n` identical samples; returns the last limit.
fn feed(algorithm: &mut impl LimitAlgorithm, n: usize, sample: Sample) -> usize {
    let mut limit = algorithm.limit();
    for _ in 0..n {
        limit = algorithm.update(sample);
    }
    limit
}

/// Feeds `n` calls of `latency` from a busy bulkhead: each finds the
/// algorithm's current limit in flight. Returns the last limit.
fn drive(algorithm: &mut impl LimitAlgorithm, n: usize, latency: Duration) -> usize {
    let mut limit = algorithm.limit();
    for _ in 0..n {
        limit = algorithm.update(Sample::success(latency, limit));
    }
    limit
}

// --- AIMD ---

#[test]
fn aimd_grows_by_one_per_round_of_good_calls() {
    let mut aimd = Aimd::new().initial_limit(10);
    assert_eq!(feed(&mut aimd, 10, Sample::success(ms(10), 10)), 10); // 10.96
    assert_eq!(feed(&mut aimd, 1, Sample::success(ms(10), 10)), 11);
    let mut fast = Aimd::new().initial_limit(10).increase_by(5);
    assert_eq!(feed(&mut fast, 10, Sample::success(ms(10), 10)), 14);
}

#[test]
fn aimd_does_not_grow_while_the_limit_is_not_used() {
    let mut aimd = Aimd::new().initial_limit(10);
    assert_eq!(feed(&mut aimd, 1_000, Sample::success(ms(10), 4)), 10);
    // Half of it in flight counts as used.
    assert!(feed(&mut aimd, 100, Sample::success(ms(10), 5)) > 10);
}

#[test]
fn aimd_backs_off_on_failures_once_per_round() {
    let mut aimd = Aimd::new().initial_limit(20);
    assert_eq!(aimd.update(Sample::failure(ms(10), 20)), 18);
    // The calls in flight during the back-off carry no new news...
    assert_eq!(feed(&mut aimd, 17, Sample::failure(ms(10), 18)), 18);
    // ... but once a round has passed, a failure backs off again.
    assert_eq!(aimd.update(Sample::failure(ms(10), 18)), 16);

    let mut halve = Aimd::new().initial_limit(20).backoff_ratio(0.5);
    assert_eq!(halve.update(Sample::failure(ms(10), 20)), 10);
}

#[test]
fn aimd_latency_threshold_counts_slow_calls_as_overload() {
    let mut blind = Aimd::new().initial_limit(20);
    assert_eq!(
        blind.update(Sample::success(Duration::from_secs(60), 20)),
        20
    );

    let mut aimd = Aimd::new().initial_limit(20).latency_threshold(ms(100));
    assert_eq!(aimd.update(Sample::success(ms(100), 20)), 20); // not above it
    assert_eq!(aimd.update(Sample::success(ms(101), 20)), 18);
}

#[test]
fn aimd_stays_within_its_bounds() {
    let mut aimd = Aimd::new().initial_limit(500).bounds(3, 40);
    assert_eq!(aimd.limit(), 40);
    assert_eq!(feed(&mut aimd, 10_000, Sample::success(ms(1), 40)), 40);
    assert_eq!(feed(&mut aimd, 10_000, Sample::failure(ms(1), 40)), 3);
    assert_eq!(Aimd::new().bounds(3, 40).initial_limit(1).limit(), 3);
}

#[test]
#[should_panic(expected = "at least 1")]
fn aimd_refuses_a_lower_bound_of_zero() {
    let _ = Aimd::new().bounds(0, 10);
}

#[test]
#[should_panic(expected = "must not exceed the upper bound")]
fn aimd_refuses_crossed_bounds() {
    let _ = Aimd::new().bounds(10, 9);
}

#[test]
#[should_panic(expected = "between 0 and 1")]
fn aimd_refuses_a_backoff_ratio_of_one() {
    let _ = Aimd::new().backoff_ratio(1.0);
}

// --- Gradient ---

/// A gradient with a measured baseline of 50 ms at limit 20 (the first
/// window and its probe done).
fn settled_gradient() -> Gradient {
    let mut g = Gradient::new().initial_limit(20).probe_samples(10);
    feed(&mut g, 20, Sample::success(ms(50), 20));
    assert!(g.is_probing());
    feed(&mut g, 30, Sample::success(ms(50), 10));
    assert!(!g.is_probing());
    assert_eq!((g.baseline(), g.limit()), (Some(ms(50)), 20));
    g
}

#[test]
fn gradient_grows_without_queueing_and_shrinks_with_it() {
    let mut g = settled_gradient();
    let grown = drive(&mut g, 200, ms(50));
    assert!(grown > 25, "grew to {grown}");
    // Latency 3 times the baseline: most calls queue. Two windows' worth
    // (the first may have begun before).
    let before = g.limit();
    let after = drive(&mut g, 2 * before, ms(150));
    assert!(after < before * 8 / 10, "{before} -> {after}");
    // It keeps shrinking, by at most a quarter per window (the gradient's
    // floor of 0.5, half of it applied).
    let mut limit = after;
    for _ in 0..400 {
        let next = g.update(Sample::success(ms(150), limit));
        assert!(next * 4 + 4 >= limit * 3, "{limit} -> {next}");
        limit = next;
    }
    assert!(limit < 10, "still {limit}");
}

#[test]
fn gradient_backs_off_from_fast_failures() {
    let mut g = settled_gradient();
    // Half of the calls fail, fast: latency says nothing, failures do.
    let before = g.limit();
    for _ in 0..before {
        g.update(Sample::failure(ms(1), before));
        g.update(Sample::success(ms(50), before));
    }
    assert!(g.limit() < before, "{before} -> {}", g.limit());
}

#[test]
fn gradient_does_not_grow_while_the_limit_is_not_used() {
    let mut g = settled_gradient();
    assert_eq!(feed(&mut g, 2_000, Sample::success(ms(50), 3)), 20);
}

#[test]
fn gradient_stays_within_its_bounds_whatever_it_sees() {
    let mut g = Gradient::new().initial_limit(8).bounds(4, 30).window(5);
    let samples = [
        Sample::success(Duration::ZERO, 1),
        Sample::success(Duration::from_secs(3_600), 30),
        Sample::failure(Duration::ZERO, 30),
        Sample::success(ms(1), 1_000),
        Sample::failure(Duration::MAX, 2),
    ];
    let mut seen = (usize::MAX, 0);
    for i in 0..50_000 {
        let limit = g.update(samples[(i * 7 + i / 3) % samples.len()]);
        seen = (seen.0.min(limit), seen.1.max(limit));
        assert!((4..=30).contains(&limit), "limit {limit} after {i} samples");
    }
    // Pure growth, then pure overload: both bounds are reached.
    assert_eq!(drive(&mut g, 50_000, ms(5)), 30);
    let mut g = Gradient::new().bounds(4, 30);
    let mut low = g.limit();
    for _ in 0..50_000 {
        low = g.update(Sample::failure(ms(5), low));
    }
    assert_eq!(low, 4);
}

#[test]
fn gradient_probes_at_half_the_limit_and_comes_back() {
    let mut g = settled_gradient().probe_interval(3);
    let mut before = g.limit();
    while !g.is_probing() {
        before = g.limit();
        drive(&mut g, 1, ms(50));
    }
    // Three windows of 20 to 22 calls, then half the limit.
    assert!(before > 20 && before <= 22, "{before}");
    let limit = g.limit();
    assert!(
        (before / 2..=before / 2 + 1).contains(&limit),
        "{before} / 2 = {limit}"
    );
    // Draining: samples with more in flight than the probe allows are not
    // timed, however many.
    feed(&mut g, 1_000, Sample::success(ms(500), limit + 1));
    assert!(g.is_probing());
    // The first 2 × limit at low concurrency may have started before.
    feed(&mut g, 2 * limit, Sample::success(ms(500), limit));
    feed(&mut g, 32, Sample::success(ms(40), limit));
    assert!(!g.is_probing());
    assert_eq!(g.baseline(), Some(ms(40)));
    assert!(
        (before..=before + 1).contains(&g.limit()),
        "{before} -> {}",
        g.limit()
    );
}

#[test]
fn gradient_learns_a_dependency_that_got_slower_for_good() {
    // 50 ms, then 100 ms from some point on, whatever the concurrency: the
    // dependency got slower, not overloaded.
    let mut g = Gradient::new().initial_limit(20).probe_interval(50);
    drive(&mut g, 2_000, ms(50));
    while g.is_probing() {
        drive(&mut g, 1, ms(50));
    }
    let before = g.limit();
    let dip = drive(&mut g, 5 * before, ms(100));
    assert!(dip < before * 3 / 4, "{before} -> {dip}");
    // The next probe measures the new baseline; growth resumes.
    let after = drive(&mut g, 20_000, ms(100));
    assert_eq!(g.baseline(), Some(ms(100)));
    assert!(after > before, "{before} -> {dip} -> {after}");
}

#[test]
fn the_algorithms_are_deterministic() {
    let samples: Vec<Sample> = (0..5_000u64)
        .map(|i| {
            let latency = ms(20 + (i * 7919) % 80);
            let in_flight = 1 + (i * 31 % 40) as usize;
            if i % 97 == 0 {
                Sample::failure(latency, in_flight)
            } else {
                Sample::success(latency, in_flight)
            }
        })
        .collect();
    let trace = |mut a: Box<dyn LimitAlgorithm>| -> Vec<usize> {
        samples.iter().map(|&s| a.update(s)).collect()
    };
    let aimd = || Box::new(Aimd::new().latency_threshold(ms(70)));
    let gradient = || Box::new(Gradient::new());
    assert_eq!(trace(aimd()), trace(aimd()));
    assert_eq!(trace(gradient()), trace(gradient()));
}

// --- The simulation ---

fn standard_reports() -> Vec<Report> {
    let scenario = Scenario::standard();
    standard_strategies()
        .into_iter()
        .map(|(name, mut algorithm)| run(&scenario, name, algorithm.as_mut()))
        .collect()
}

fn report<'a>(reports: &'a [Report], name: &str) -> &'a Report {
    reports.iter().find(|r| r.name == name).unwrap()
}

#[test]
fn simulation_adaptive_limits_settle_near_the_capacity() {
    let scenario = Scenario::standard();
    let reports = standard_reports();
    // The second half of each phase: 20-40 s at 20, 55-70 s at 10,
    // 85-100 s at 20.
    let phases = [(20.0, 40.0, 20.0), (55.0, 70.0, 10.0), (85.0, 100.0, 20.0)];
    for name in ["aimd", "gradient"] {
        let r = report(&reports, name);
        for (from, to, capacity) in phases {
            assert_eq!(scenario.capacity_at(from) as f64, capacity);
            let limit = r.median_limit(from, to);
            assert!(
                (limit - capacity).abs() <= 0.25 * capacity,
                "{name}: median limit {limit:.1} from {from} s to {to} s, capacity {capacity}"
            );
        }
    }
}

#[test]
fn simulation_fixed_limits_waste_capacity_or_overload() {
    let reports = standard_reports();
    let fixed_low = &report(&reports, "fixed 5").summary;
    let fixed_right = &report(&reports, "fixed 20").summary;
    let fixed_high = &report(&reports, "fixed 100").summary;
    // At most 20 calls of 50 ms, 10 from 40 s to 70 s.
    let best = (40.0 * 400.0 + 30.0 * 200.0 + 30.0 * 400.0) / 100.0;
    for name in ["aimd", "gradient"] {
        let adaptive = &report(&reports, name).summary;
        assert!(adaptive.goodput > 0.95 * best, "{name}: {adaptive:?}");
        assert_eq!(adaptive.timed_out, 0, "{name}: {adaptive:?}");
        assert!(adaptive.p99 < 0.1, "{name}: {adaptive:?}");
        // Too low: a third of the throughput or less.
        assert!(fixed_low.goodput < adaptive.goodput / 3.0);
        // Too high: latency at the timeout, errors, and less throughput.
        assert!(fixed_high.p99 > 3.0 * adaptive.p99);
        assert!(fixed_high.error_rate > 0.3);
        assert!(fixed_high.goodput < 0.6 * adaptive.goodput);
        // Right until the capacity halves, then twice the latency.
        assert!(fixed_right.p99 > 1.5 * adaptive.p99);
        assert!(fixed_right.goodput < adaptive.goodput);
    }
}

#[test]
fn the_plot_in_the_docs_is_the_simulation() {
    let svg = example::to_svg(&Scenario::standard(), &standard_reports());
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/guide/adaptive.svg"
    ))
    .unwrap();
    assert!(
        svg == committed,
        "src/guide/adaptive.svg is out of date: \
         cargo run --release --example adaptive_sim -- --svg src/guide/adaptive.svg"
    );
}

/// What the adaptive guide says about noisy latency: with every call's work
/// within ±50 % of 50 ms, healthy calls take up to 75 ms, past AIMD's
/// threshold of 70 ms, and AIMD starves the dependency; the gradient allows
/// for the noise it measures, and settles higher instead.
#[test]
fn simulation_noisy_latency_needs_a_higher_aimd_threshold() {
    let scenario = Scenario {
        jitter: 0.5,
        ..Scenario::standard()
    };
    let reports: Vec<Report> = standard_strategies()
        .into_iter()
        .take(2)
        .map(|(name, mut algorithm)| run(&scenario, name, algorithm.as_mut()))
        .collect();
    let best = 340.0;
    let aimd = report(&reports, "aimd");
    let gradient = report(&reports, "gradient");
    assert!(aimd.summary.goodput < 0.8 * best, "{:?}", aimd.summary);
    assert!(aimd.median_limit(20.0, 40.0) < 16.0);
    assert!(
        gradient.summary.goodput > 0.95 * best,
        "{:?}",
        gradient.summary
    );
    for (from, to, capacity) in [(20.0, 40.0, 20.0), (55.0, 70.0, 10.0), (85.0, 100.0, 20.0)] {
        let limit = gradient.median_limit(from, to);
        assert!(
            (capacity..=1.45 * capacity).contains(&limit),
            "{limit} from {from} s, capacity {capacity}"
        );
    }
    // A threshold above the slowest healthy call puts AIMD back near the
    // capacity.
    let mut aimd = Aimd::new().initial_limit(10).latency_threshold(ms(90));
    let fixed = run(&scenario, "aimd 90 ms", &mut aimd);
    assert!(fixed.summary.goodput > 0.95 * best, "{:?}", fixed.summary);
}

#[test]
fn simulation_is_deterministic() {
    let mut scenario = Scenario::standard();
    scenario.duration = 20.0;
    let once = run(&scenario, "g", &mut Gradient::new());
    let again = run(&scenario, "g", &mut Gradient::new());
    assert_eq!(
        format!("{:?}", once.summary),
        format!("{:?}", again.summary)
    );
    assert_eq!(
        once.buckets.iter().map(|b| b.limit).collect::<Vec<_>>(),
        again.buckets.iter().map(|b| b.limit).collect::<Vec<_>>()
    );
    scenario.seed += 1;
    let other = run(&scenario, "g", &mut Gradient::new());
    assert_ne!(once.summary.succeeded, other.summary.succeeded);
}

#[test]
fn simulation_respects_the_bounds() {
    let scenario = Scenario {
        duration: 30.0,
        ..Scenario::standard()
    };
    let tight = run(
        &scenario,
        "aimd 12..=15",
        &mut Aimd::new().bounds(12, 15).latency_threshold(ms(70)),
    );
    let loose = run(
        &scenario,
        "gradient 2..=8",
        &mut Gradient::new().bounds(2, 8),
    );
    for (r, range) in [(&tight, 12.0..=15.0), (&loose, 2.0..=8.0)] {
        for b in &r.buckets {
            assert!(range.contains(&b.limit), "{}: {b:?}", r.name);
        }
    }
    // Bounded below the capacity, the gradient sits at its upper bound.
    assert_eq!(loose.summary.final_limit, 8);
}

#[test]
fn simulation_fixed_limit_serves_what_littles_law_says() {
    let scenario = Scenario {
        duration: 20.0,
        ..Scenario::standard()
    };
    // 10 calls of 50 ms at a time: 200 a second, at the base latency.
    let r = run(&scenario, "fixed 10", &mut Fixed(10));
    assert!(
        (190.0..=205.0).contains(&r.summary.goodput),
        "{:?}",
        r.summary
    );
    assert!((0.045..=0.055).contains(&r.summary.p50), "{:?}", r.summary);
}

// --- The limiter on real bulkheads ---

#[test]
fn limiter_sets_the_bulkhead_limit_from_finished_calls() {
    let builder = Bulkhead::builder().name("db").max_concurrent_calls(99);
    let (bh, limiter) = adaptive::build(builder, Aimd::new().initial_limit(10)).unwrap();
    assert_eq!(bh.metrics().max_concurrent_calls(), 10);

    let failed = block_on(bh.call(async { Err::<(), _>("503") }));
    assert!(failed.is_err());
    assert_eq!(limiter.limit(), 9);
    assert_eq!(bh.metrics().max_concurrent_calls(), 9);
    let sample = limiter.last_sample().unwrap();
    assert!(sample.failed);
    assert_eq!(sample.in_flight, 1);

    let change = limiter.history()[0];
    assert_eq!((change.sample_number, change.from, change.to), (1, 10, 9));
    assert_eq!(change.sample, sample);
    assert_eq!(limiter.samples(), 1);
    limiter.detach();
}

#[test]
fn limiter_reads_the_time_each_permit_was_held() {
    let (bh, limiter) = adaptive::build(Bulkhead::builder(), Gradient::new()).unwrap();
    let permit = bh.try_acquire().unwrap();
    thread::sleep(ms(20));
    drop(permit);
    let sample = limiter.last_sample().unwrap();
    assert!(sample.latency >= ms(20), "{sample:?}");
    assert!(!sample.failed); // `Released` counts as a success
    limiter.detach();
}

#[test]
fn limiter_counts_calls_in_flight_itself() {
    let (bh, limiter) = adaptive::build(Bulkhead::builder(), Aimd::new()).unwrap();
    let permits: Vec<_> = (0..5).map(|_| bh.try_acquire().unwrap()).collect();
    let mut in_flight = Vec::new();
    for permit in permits {
        drop(permit);
        in_flight.push(limiter.last_sample().unwrap().in_flight);
    }
    assert_eq!(in_flight, [5, 4, 3, 2, 1]);
    limiter.detach();
}

#[test]
fn limiter_ignores_cancelled_calls_and_follows_its_classifier() {
    let limiter = AdaptiveLimiter::builder(Aimd::new().initial_limit(10))
        .classify(|outcome| match outcome {
            CallOutcome::Failure => Verdict::Success, // "not found" is no overload
            other => Verdict::of(other),
        })
        .build();
    let bh = Bulkhead::builder()
        .max_concurrent_calls(limiter.limit())
        .observer(limiter.clone())
        .build()
        .unwrap();
    limiter.attach(&bh);

    let mut permit = bh.try_acquire().unwrap();
    permit.set_outcome(CallOutcome::Cancelled);
    drop(permit);
    assert_eq!(limiter.samples(), 0);

    let _ = block_on(bh.call(async { Err::<(), _>("not found") }));
    assert_eq!(limiter.samples(), 1);
    assert!(!limiter.last_sample().unwrap().failed);
    assert_eq!(limiter.limit(), 10);
    limiter.detach();
}

#[test]
fn detached_limiter_learns_but_leaves_the_bulkhead_alone() {
    let (bh, limiter) = adaptive::build(Bulkhead::builder(), Aimd::new().initial_limit(4)).unwrap();
    assert_eq!(Arc::strong_count(&limiter), 2); // the bulkhead holds it
    let detached = limiter.detach().unwrap();
    assert_eq!(detached.name(), bh.name());
    assert!(limiter.detach().is_none());

    let _ = block_on(bh.call(async { Err::<(), _>("503") }));
    assert_eq!(limiter.limit(), 3);
    assert_eq!(bh.metrics().max_concurrent_calls(), 4);
    limiter.attach(&bh);
    assert_eq!(bh.metrics().max_concurrent_calls(), 3);

    // Dropping the bulkhead frees it, and with it the bulkhead's hold on
    // the limiter.
    limiter.detach();
    drop((bh, detached));
    assert_eq!(Arc::strong_count(&limiter), 1);
}

/// The limiter holds its bulkhead weakly: an attached bulkhead that is
/// dropped is freed, and the limiter then drives nothing.
#[test]
fn an_attached_limiter_does_not_keep_its_bulkhead_alive() {
    let (bh, limiter) = adaptive::build(Bulkhead::builder(), Aimd::new().initial_limit(4)).unwrap();
    assert_eq!(Arc::strong_count(&limiter), 2); // the bulkhead holds it
    drop(bh);
    assert_eq!(Arc::strong_count(&limiter), 1);
    assert!(limiter.detach().is_none());
}

#[test]
fn limiter_never_sets_a_limit_of_zero() {
    #[derive(Debug)]
    struct Zero;
    impl LimitAlgorithm for Zero {
        fn limit(&self) -> usize {
            0
        }
        fn update(&mut self, _sample: Sample) -> usize {
            0
        }
    }
    let (bh, limiter) = adaptive::build(Bulkhead::builder(), Zero).unwrap();
    assert_eq!(limiter.limit(), 1);
    drop(bh.try_acquire().unwrap());
    assert_eq!(bh.metrics().max_concurrent_calls(), 1);
    limiter.detach();
}

#[test]
fn concurrent_calls_leave_the_bulkhead_at_the_limiter_limit() {
    let aimd = Aimd::new().initial_limit(16).bounds(2, 64);
    let (bh, limiter) = adaptive::build(Bulkhead::builder().name("shared"), aimd).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let bh = bh.clone();
            thread::spawn(move || {
                for i in 0..2_000 {
                    if let Ok(mut permit) = bh.try_acquire() {
                        if (i + t) % 7 == 0 {
                            permit.set_outcome(CallOutcome::Failure);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(limiter.history().len() > 10);
    assert_eq!(bh.metrics().max_concurrent_calls(), limiter.limit());
    assert_eq!(bh.metrics().in_flight(), 0);
    assert_eq!(limiter.samples(), bh.metrics().finished());
    limiter.detach();
}

/// The wiring end to end, on tokio's paused clock: spawned calls to a
/// dependency that serves 20 at once, gets slower past that, and sheds load
/// (answers "503") past 25. The limiter sees every call through the
/// bulkhead's observer hooks and moves the limit with
/// `set_max_concurrent_calls`.
///
/// The times the bulkhead measures are real time (`std::time::Instant`),
/// which tokio's paused clock does not move, so here the limiter learns
/// from the failures alone: AIMD without a latency threshold.
#[tokio::test(start_paused = true)]
async fn aimd_drives_a_real_bulkhead_on_tokio() {
    const CAPACITY: usize = 20;
    const SHEDS_PAST: usize = 25;
    let builder = Bulkhead::builder()
        .name("downstream")
        .max_wait(Duration::ZERO);
    let (bh, limiter) =
        adaptive::build(builder, Aimd::new().initial_limit(4).bounds(2, 100)).unwrap();
    let busy = Arc::new(AtomicUsize::new(0));
    let most_busy = Arc::new(AtomicUsize::new(0));

    let mut calls = Vec::new();
    for _ in 0..6_000 {
        let (bh, busy, most_busy) = (bh.clone(), busy.clone(), most_busy.clone());
        calls.push(tokio::spawn(async move {
            bh.call(async {
                let n = busy.fetch_add(1, Ordering::SeqCst) + 1;
                most_busy.fetch_max(n, Ordering::SeqCst);
                let latency = ms(50) * (n.max(CAPACITY) as u32) / CAPACITY as u32;
                tokio::time::sleep(latency).await;
                busy.fetch_sub(1, Ordering::SeqCst);
                if n > SHEDS_PAST { Err("503") } else { Ok(()) }
            })
            .await
        }));
        tokio::time::sleep(ms(2)).await; // 500 calls a second
    }
    let mut shed = 0;
    for call in calls {
        if let Err(watertight::BulkheadError::Inner(_)) = call.await.unwrap() {
            shed += 1;
        }
    }

    let m = bh.metrics();
    assert_eq!(limiter.samples(), m.permitted());
    assert_eq!(m.max_concurrent_calls(), limiter.limit());
    assert!(m.rejected() > 0, "the limit held calls back: {m:?}");
    // Without a latency signal, AIMD finds the shedding point by crossing
    // it: once per cycle of its saw tooth (about one call in six here).
    assert!(shed > 0, "the limit probed past the shedding point");
    assert!(
        shed < m.permitted() / 4,
        "but not all the time: {shed} of {m:?}"
    );
    assert!(most_busy.load(Ordering::SeqCst) <= 40);
    // It grew from 4 to the shedding point, and backed off from there.
    let history = limiter.history();
    assert!(history.iter().any(|c| c.to > c.from));
    assert!(history.iter().any(|c| c.to < c.from && c.sample.failed));
    assert!(
        (CAPACITY - 2..=SHEDS_PAST + 2).contains(&limiter.limit()),
        "limit {}",
        limiter.limit()
    );
    limiter.detach();
}

/// The simulation against arithmetic: 5 calls at a time, 50 ms each, is
/// about 100 calls a second.
#[test]
fn a_fixed_limit_in_the_simulation_serves_what_it_can() {
    let mut scenario = Scenario::standard();
    scenario.duration = 5.0;
    let report = run(&scenario, "fixed 5", &mut Fixed(5));
    assert!(
        (90.0..110.0).contains(&report.summary.goodput),
        "{}",
        report.summary.goodput
    );
}
