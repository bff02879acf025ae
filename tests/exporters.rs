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
    assert_eq!(seen.len(), 1 + 7 + 6 + 1 + 2 + 1, "{seen:#?}");
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

/// The series are registered on a bulkhead's first event, not when it is
/// built: a bulkhead built before the global recorder is installed
/// publishes, as long as it had no event before. One that did keeps the
/// no-op recorder it found then. (The only test here that installs a
/// global recorder: it can be installed once per process.)
#[cfg(feature = "metrics")]
#[test]
fn metrics_recorder_installed_after_build_is_used_from_the_first_event() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let built_early = Bulkhead::builder()
        .name("built-before-the-recorder")
        .max_concurrent_calls(1)
        .build()
        .unwrap();
    let used_early = Bulkhead::builder()
        .name("used-before-the-recorder")
        .max_concurrent_calls(1)
        .build()
        .unwrap();
    drop(used_early.try_acquire().unwrap());

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();

    block_on(built_early.call(async { Ok::<_, ()>(()) })).unwrap();
    block_on(used_early.call(async { Ok::<_, ()>(()) })).unwrap();
    let _held = built_early.try_acquire().unwrap();
    assert!(built_early.try_acquire().is_err());

    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |metric: &str, bulkhead: &str, extra: Option<(&str, &str)>| {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let has = |k: &str, v: &str| key.labels().any(|l| l.key() == k && l.value() == v);
            let matches = key.name() == metric
                && has("bulkhead", bulkhead)
                && extra.is_none_or(|(k, v)| has(k, v));
            match value {
                DebugValue::Counter(n) if matches => Some(*n),
                _ => None,
            }
        })
    };
    let permitted = "bulkhead_calls_permitted_total";
    assert_eq!(
        counter(permitted, "built-before-the-recorder", None),
        Some(2)
    );
    assert_eq!(
        counter(
            "bulkhead_calls_rejected_total",
            "built-before-the-recorder",
            Some(("reason", "full"))
        ),
        Some(1)
    );
    assert_eq!(
        counter(
            "bulkhead_calls_finished_total",
            "built-before-the-recorder",
            Some(("outcome", "success"))
        ),
        Some(1)
    );
    // Its first event came before the recorder: nothing of it is published.
    assert!(
        !snapshot.iter().any(|(key, ..)| key
            .key()
            .labels()
            .any(|l| l.value() == "used-before-the-recorder")),
        "{snapshot:?}"
    );
}
