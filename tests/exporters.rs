//! The `metrics` and `tracing` exporters publish what users rely on.
#![cfg(all(not(loom), feature = "metrics"))]

use std::time::Duration;

use futures::executor::block_on;
use watertight::{Bulkhead, RejectReason};

/// With the `metrics` feature, every call is counted with bounded labels,
/// and the in-flight gauge and wait/hold histograms are published.
#[cfg(feature = "metrics")]
#[test]
fn metrics_feature_publishes_counters_gauges_and_histograms() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let bh = Bulkhead::builder()
            .name("partner")
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Full);
        drop(held);
        block_on(bh.call(async { Ok::<_, ()>(()) })).unwrap();
    });
    let mut seen = std::collections::BTreeMap::new();
    for (key, unit, help, value) in snapshotter.snapshot().into_vec() {
        // Every series is described, with its unit: `# HELP` lines.
        let unit = unit.unwrap_or_else(|| panic!("{key:?} has no unit"));
        let expected = match key.key().name() {
            "bulkhead_wait_seconds" | "bulkhead_hold_seconds" => metrics::Unit::Seconds,
            _ => metrics::Unit::Count,
        };
        assert_eq!(unit, expected, "{key:?}");
        assert!(help.is_some_and(|h| !h.is_empty()), "{key:?} has no help");
        let (kind, key) = (key.kind(), key.key().clone());
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{:?} {}{{{}}}", kind, key.name(), labels.join(","));
        let value = match value {
            DebugValue::Counter(n) => format!("{n}"),
            DebugValue::Gauge(g) => format!("{}", g.into_inner()),
            DebugValue::Histogram(h) => format!("{} samples", h.len()),
        };
        seen.insert(name, value);
    }
    let expect = [
        (
            "Counter bulkhead_calls_permitted_total{bulkhead=partner}",
            "2",
        ),
        (
            "Counter bulkhead_calls_rejected_total{bulkhead=partner,reason=full}",
            "1",
        ),
        (
            "Counter bulkhead_calls_finished_total{bulkhead=partner,outcome=released}",
            "1",
        ),
        (
            "Counter bulkhead_calls_finished_total{bulkhead=partner,outcome=success}",
            "1",
        ),
        ("Gauge bulkhead_calls_in_flight{bulkhead=partner}", "0"),
        ("Gauge bulkhead_calls_waiting{bulkhead=partner}", "0"),
        ("Gauge bulkhead_limit{bulkhead=partner}", "1"),
        ("Gauge bulkhead_permits_available{bulkhead=partner}", "1"),
        (
            "Histogram bulkhead_wait_seconds{bulkhead=partner}",
            "2 samples",
        ),
        (
            "Histogram bulkhead_hold_seconds{bulkhead=partner}",
            "2 samples",
        ),
    ];
    for (name, value) in expect {
        assert_eq!(
            seen.get(name).map(String::as_str),
            Some(value),
            "{name} in {seen:#?}"
        );
    }
    // Every series is registered on the bulkhead's first event: one per
    // rejection reason and call outcome, and no more (bounded labels).
    assert_eq!(seen.len(), 1 + 7 + 6 + 4 + 2 + 1, "{seen:#?}");
    for (name, value) in &seen {
        if !expect.iter().any(|(n, _)| n == name) {
            assert!(value == "0" || value == "0 samples", "{name} = {value}");
        }
    }
}

/// `exporters(false)` turns the feature exporters off for one bulkhead.
#[cfg(feature = "metrics")]
#[test]
fn exporters_can_be_turned_off() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let bh = Bulkhead::builder()
            .max_concurrent_calls(1)
            .exporters(false)
            .build()
            .unwrap();
        drop(bh.try_acquire().unwrap());
    });
    assert!(snapshotter.snapshot().into_vec().is_empty());
}

/// `export_metrics(false)` turns the metrics exporter off alone, and
/// `export_tracing(false)` leaves it on.
#[cfg(feature = "metrics")]
#[test]
fn the_metrics_exporter_turns_off_alone() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let off = Bulkhead::builder()
            .max_concurrent_calls(1)
            .export_metrics(false)
            .build()
            .unwrap();
        drop(off.try_acquire().unwrap());
    });
    assert!(snapshotter.snapshot().into_vec().is_empty());
    metrics::with_local_recorder(&recorder, || {
        let on = Bulkhead::builder()
            .name("metrics-only")
            .max_concurrent_calls(1)
            .export_tracing(false)
            .build()
            .unwrap();
        drop(on.try_acquire().unwrap());
    });
    let series = snapshotter.snapshot().into_vec();
    assert!(
        series
            .iter()
            .any(|(key, ..)| key.key().labels().any(|l| l.value() == "metrics-only")),
        "the metrics exporter stayed on"
    );
}

/// The series are registered on a bulkhead's first event that finds a
/// recorder, not when it is built: a bulkhead built, and even called,
/// before the global recorder is installed publishes from its first event
/// after, with its in-flight gauge counting the permit held across the
/// installation. (The only test here that installs a global recorder: it
/// can be installed once per process.)
#[cfg(feature = "metrics")]
#[test]
fn metrics_recorder_installed_after_build_or_use_is_published_to() {
    use metrics_util::CompositeKey;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let built_early = Bulkhead::builder()
        .name("built-before-the-recorder")
        .max_concurrent_calls(1)
        .build()
        .unwrap();
    let used_early = Bulkhead::builder()
        .name("used-before-the-recorder")
        .max_concurrent_calls(2)
        .build()
        .unwrap();
    drop(used_early.try_acquire().unwrap());
    let held_across = used_early.try_acquire().unwrap();

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();

    block_on(built_early.call(async { Ok::<_, ()>(()) })).unwrap();
    block_on(used_early.call(async { Ok::<_, ()>(()) })).unwrap();
    let _held = built_early.try_acquire().unwrap();
    assert!(built_early.try_acquire().is_err());

    // A snapshot takes the values (the debugging recorder sets each back
    // to zero): one per phase.
    let snapshot = || snapshotter.snapshot().into_vec();
    let find = |snapshot: &[(CompositeKey, _, _, DebugValue)],
                metric: &str,
                bulkhead: &str,
                extra: Option<(&str, &str)>| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let has = |k: &str, v: &str| key.labels().any(|l| l.key() == k && l.value() == v);
            let matches = key.name() == metric
                && has("bulkhead", bulkhead)
                && extra.is_none_or(|(k, v)| has(k, v));
            match value {
                DebugValue::Counter(n) if matches => Some(*n as f64),
                DebugValue::Gauge(g) if matches => Some(g.into_inner()),
                _ => None,
            }
        })
    };
    let now = snapshot();
    let permitted = "bulkhead_calls_permitted_total";
    let early = "built-before-the-recorder";
    assert_eq!(find(&now, permitted, early, None), Some(2.0));
    let full = Some(("reason", "full"));
    assert_eq!(
        find(&now, "bulkhead_calls_rejected_total", early, full),
        Some(1.0)
    );
    let success = Some(("outcome", "success"));
    assert_eq!(
        find(&now, "bulkhead_calls_finished_total", early, success),
        Some(1.0)
    );
    // Called before the recorder: what came after is published, and the
    // permit taken before still counts in flight until it goes back.
    let used = "used-before-the-recorder";
    assert_eq!(find(&now, permitted, used, None), Some(1.0));
    assert_eq!(
        find(&now, "bulkhead_calls_in_flight", used, None),
        Some(1.0)
    );
    assert_eq!(
        find(&now, "bulkhead_permits_available", used, None),
        Some(1.0)
    );
    drop(held_across);
    let now = snapshot();
    assert_eq!(
        find(&now, "bulkhead_permits_available", used, None),
        Some(2.0)
    );
    let released = Some(("outcome", "released"));
    assert_eq!(
        find(&now, "bulkhead_calls_finished_total", used, released),
        Some(1.0)
    );

    // Threads racing: in each round they take a permit each at once,
    // and give it back at once; the gauge ends each half at the permits
    // held, whatever order the racing events set it in.
    let racing = Bulkhead::builder()
        .name("racing")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    let threads = 4;
    const ROUNDS: usize = 300;
    let step = std::sync::Barrier::new(threads + 1);
    let gauge = |metric| find(&snapshot(), metric, "racing", None);
    let mut wrong = Vec::new();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    step.wait();
                    let permit = racing.try_acquire().unwrap();
                    step.wait();
                    step.wait();
                    drop(permit);
                    step.wait();
                }
            });
        }
        // Noted, not asserted here: a panic would leave the threads
        // waiting at the barrier.
        for round in 0..ROUNDS {
            step.wait();
            step.wait();
            // A snapshot sets the debugging recorder's gauges to zero, so
            // only the permits free are read after each half.
            let taken = gauge("bulkhead_permits_available");
            step.wait();
            step.wait();
            let back = gauge("bulkhead_permits_available");
            if (taken, back) != (Some(8.0 - threads as f64), Some(8.0)) {
                wrong.push((round, taken, back));
            }
        }
    });
    assert!(
        wrong.is_empty(),
        "rounds, free permits taken and back: {wrong:?}"
    );
}

/// A keyed bulkhead's keys are published as `bulkhead=<name>` with the
/// key's label as a label of its own; keys that share a label share its
/// series (their sum), and the global limit is `bulkhead=<name>.global`,
/// with the line, the limit and the permits free.
#[cfg(feature = "metrics")]
#[test]
fn keyed_series_carry_the_key_as_a_label() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use watertight::keyed::KeyedBulkhead;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (held, snapshot) = metrics::with_local_recorder(&recorder, || {
        let kb = KeyedBulkhead::<String>::builder()
            .name("tenants")
            .max_concurrent_calls(2)
            .global_limit(5)
            .max_wait(Duration::ZERO)
            // Both of acme's regions share its label.
            .key_label(|key: &String| key.split('/').next().unwrap().to_owned())
            .build()
            .unwrap();
        let held = [
            kb.try_acquire("acme/eu").unwrap(),
            kb.try_acquire("acme/us").unwrap(),
            kb.try_acquire("acme/us").unwrap(),
            kb.try_acquire("initech/eu").unwrap(),
        ];
        let full = kb.try_acquire("acme/us").unwrap_err();
        assert_eq!(
            full.to_string(),
            "keyed bulkhead \"tenants\": the key is full"
        );
        (held, snapshotter.snapshot().into_vec())
    });
    let series: std::collections::BTreeMap<String, f64> = snapshot
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(_) => return None,
            };
            Some((format!("{}{{{}}}", key.name(), labels.join(",")), value))
        })
        .collect();
    let expect = [
        (
            "bulkhead_calls_permitted_total{bulkhead=tenants,key=acme}",
            3.0,
        ),
        (
            "bulkhead_calls_permitted_total{bulkhead=tenants,key=initech}",
            1.0,
        ),
        ("bulkhead_calls_in_flight{bulkhead=tenants,key=acme}", 3.0),
        (
            "bulkhead_calls_rejected_total{bulkhead=tenants,key=acme,reason=full}",
            1.0,
        ),
        (
            "bulkhead_calls_permitted_total{bulkhead=tenants.global}",
            4.0,
        ),
        ("bulkhead_calls_in_flight{bulkhead=tenants.global}", 4.0),
        ("bulkhead_limit{bulkhead=tenants.global}", 5.0),
        ("bulkhead_permits_available{bulkhead=tenants.global}", 1.0),
        ("bulkhead_calls_waiting{bulkhead=tenants.global}", 0.0),
    ];
    for (name, value) in expect {
        assert_eq!(series.get(name), Some(&value), "{name} in {series:#?}");
    }
    // The line, the limit and the permits free are the global bulkhead's
    // (and a plain bulkhead's): a sum over keys would not mean them.
    assert!(
        !series
            .keys()
            .any(|k| k.contains("key=") && k.starts_with("bulkhead_limit")),
        "{series:#?}"
    );
    assert!(
        !series.keys().any(|k| k.contains("tenants[")),
        "{series:#?}"
    );
    drop(held);
}

/// A call whose key admits it but whose wait for the global limit runs
/// out of its budget is a timeout on the key's series and on the global
/// one, and not an admission: neither `permitted` nor a `cancelled` end.
#[cfg(feature = "metrics")]
#[test]
fn a_global_stage_timeout_is_a_rejection_on_both_series() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedRejectReason};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let snapshot = metrics::with_local_recorder(&recorder, || {
        let kb = KeyedBulkhead::<String>::builder()
            .name("tenants")
            .max_concurrent_calls(2)
            .global_limit(1)
            .max_wait(Duration::from_millis(20))
            .key_label(|key: &String| key.clone())
            .build()
            .unwrap();
        let held = kb.try_acquire("quiet").unwrap();
        let out = block_on(kb.call("noisy", async { Ok::<_, ()>(()) }));
        match out {
            Err(KeyedError::Rejected(r)) => {
                assert_eq!(r.reason(), KeyedRejectReason::GlobalTimeout)
            }
            other => panic!("expected a global timeout, got {other:?}"),
        }
        drop(held);
        block_on(kb.call("noisy", async { Ok::<_, ()>(()) })).unwrap();
        snapshotter.snapshot().into_vec()
    });
    let value = |name: &str, labels: &[(&str, &str)]| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let all = labels
                .iter()
                .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v));
            let count = key.labels().count();
            match value {
                DebugValue::Counter(n) if key.name() == name && all && count == labels.len() => {
                    Some(*n)
                }
                _ => None,
            }
        })
    };
    let noisy = [("bulkhead", "tenants"), ("key", "noisy")];
    let with = |extra: (&'static str, &'static str)| {
        let mut labels = noisy.to_vec();
        labels.push(extra);
        labels
    };
    let rejected = "bulkhead_calls_rejected_total";
    let finished = "bulkhead_calls_finished_total";
    assert_eq!(value("bulkhead_calls_permitted_total", &noisy), Some(1));
    assert_eq!(value(rejected, &with(("reason", "timeout"))), Some(1));
    assert_eq!(value(finished, &with(("outcome", "cancelled"))), Some(0));
    assert_eq!(value(finished, &with(("outcome", "success"))), Some(1));
    let global = [("bulkhead", "tenants.global"), ("reason", "timeout")];
    assert_eq!(value(rejected, &global), Some(1));
}

/// `bulkhead_limit` follows `set_max_concurrent_calls` from the next
/// event, and the permits free with it; the line is the callers waiting.
#[cfg(feature = "metrics")]
#[test]
fn the_limit_gauge_follows_the_limit() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauges = || {
        let mut gauges = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let DebugValue::Gauge(g) = value {
                gauges.insert(key.key().name().to_owned(), g.into_inner());
            }
        }
        gauges
    };
    let get =
        |gauges: &std::collections::BTreeMap<String, f64>, name: &str| gauges.get(name).copied();
    metrics::with_local_recorder(&recorder, || {
        let bh = Bulkhead::builder()
            .name("resized")
            .max_concurrent_calls(2)
            .max_wait(Duration::from_secs(10))
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        let now = gauges();
        assert_eq!(get(&now, "bulkhead_limit"), Some(2.0));
        assert_eq!(get(&now, "bulkhead_permits_available"), Some(1.0));
        bh.set_max_concurrent_calls(5);
        let second = bh.try_acquire().unwrap();
        let now = gauges();
        assert_eq!(get(&now, "bulkhead_limit"), Some(5.0));
        assert_eq!(get(&now, "bulkhead_permits_available"), Some(3.0));
        // Two callers waiting at a limit of 2, seen by the next event.
        bh.set_max_concurrent_calls(2);
        let mut first = std::pin::pin!(bh.acquire());
        let mut other = std::pin::pin!(bh.acquire());
        let cx = &mut std::task::Context::from_waker(std::task::Waker::noop());
        assert!(first.as_mut().poll(cx).is_pending());
        assert!(other.as_mut().poll(cx).is_pending());
        drop(held);
        let std::task::Poll::Ready(Ok(_served)) = first.as_mut().poll(cx) else {
            panic!("the first waiter is served");
        };
        let now = gauges();
        assert_eq!(get(&now, "bulkhead_calls_waiting"), Some(1.0));
        assert_eq!(get(&now, "bulkhead_limit"), Some(2.0));
        drop(second);
    });
}
