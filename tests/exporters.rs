//! The `metrics` and `tracing` exporters publish what users rely on.
#![cfg(all(not(loom), feature = "metrics"))]

use std::time::Duration;

use bulkhead::{Bulkhead, RejectReason};
use futures::executor::block_on;

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
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
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
    // Every series is registered when the bulkhead is built: one per
    // rejection reason and call outcome, and no more (bounded labels).
    assert_eq!(seen.len(), 1 + 4 + 6 + 1 + 2 + 1, "{seen:#?}");
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
