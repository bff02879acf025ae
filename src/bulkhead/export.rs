//! Observers that publish a bulkhead's events to the `metrics` facade and to
//! `tracing`, installed by the builder when the matching feature is on.

#[cfg(feature = "metrics")]
pub(crate) use self::metrics_export::MetricsExporter;
#[cfg(feature = "tracing")]
pub(crate) use self::tracing_export::TracingExporter;

#[cfg(feature = "metrics")]
mod metrics_export {
    use std::sync::OnceLock;

    use metrics::{Counter, Gauge, Histogram};

    use super::super::observer::{
        CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection,
    };
    use super::super::reason::{REASONS, RejectReason};

    /// Publishes through the `metrics` crate's recorder. Names, all
    /// labelled `bulkhead=<name>`:
    ///
    /// | name | kind | extra labels |
    /// |---|---|---|
    /// | `bulkhead_calls_permitted_total` | counter | |
    /// | `bulkhead_calls_rejected_total` | counter | `reason` |
    /// | `bulkhead_calls_finished_total` | counter | `outcome` |
    /// | `bulkhead_calls_in_flight` | gauge | |
    /// | `bulkhead_wait_seconds` | histogram | |
    /// | `bulkhead_hold_seconds` | histogram | |
    /// | `bulkhead_leaks_suspected_total` | counter | |
    ///
    /// Labels are bounded: one bulkhead name, six reasons, six outcomes.
    /// The handles are registered once, on the bulkhead's first event, with
    /// the recorder in effect there (the thread's local one, else the
    /// global one, else the no-op): a bulkhead built before the recorder is
    /// installed publishes as long as it had no event before. Every event
    /// after the first costs no allocation or lookup, only the `OnceLock`'s
    /// load. Registering at build time instead would tie a bulkhead made
    /// at startup (a `static`, a config loader) to whatever recorder
    /// existed then, which is usually none.
    #[derive(Debug)]
    pub(crate) struct MetricsExporter {
        name: String,
        /// Set on the first event; never replaced.
        handles: OnceLock<Handles>,
    }

    /// One bulkhead's series, registered together.
    #[derive(Debug)]
    struct Handles {
        permitted: Counter,
        rejected: [Counter; REASONS],
        finished: [Counter; CallOutcome::ALL.len()],
        in_flight: Gauge,
        wait: Histogram,
        hold: Histogram,
        leaks: Counter,
    }

    impl MetricsExporter {
        pub(crate) fn new(name: &str) -> Self {
            Self {
                name: name.to_owned(),
                handles: OnceLock::new(),
            }
        }

        #[inline]
        fn handles(&self) -> &Handles {
            self.handles.get_or_init(|| Handles::register(&self.name))
        }
    }

    impl Handles {
        #[cold]
        fn register(name: &str) -> Self {
            let name = name.to_owned();
            Self {
                permitted: metrics::counter!("bulkhead_calls_permitted_total", "bulkhead" => name.clone()),
                rejected: RejectReason::ALL.map(|r| {
                    metrics::counter!(
                        "bulkhead_calls_rejected_total",
                        "bulkhead" => name.clone(),
                        "reason" => r.as_str()
                    )
                }),
                finished: CallOutcome::ALL.map(|o| {
                    metrics::counter!(
                        "bulkhead_calls_finished_total",
                        "bulkhead" => name.clone(),
                        "outcome" => o.as_str()
                    )
                }),
                in_flight: metrics::gauge!("bulkhead_calls_in_flight", "bulkhead" => name.clone()),
                wait: metrics::histogram!("bulkhead_wait_seconds", "bulkhead" => name.clone()),
                hold: metrics::histogram!("bulkhead_hold_seconds", "bulkhead" => name.clone()),
                leaks: metrics::counter!("bulkhead_leaks_suspected_total", "bulkhead" => name),
            }
        }
    }

    impl Observer for MetricsExporter {
        fn on_permitted(&self, e: &Permitted<'_>) {
            let h = self.handles();
            h.permitted.increment(1);
            h.in_flight.increment(1.0);
            h.wait.record(e.waited.as_secs_f64());
        }

        fn on_rejected(&self, e: &Rejection<'_>) {
            self.handles().rejected[e.reason.index()].increment(1);
        }

        fn on_finished(&self, e: &Finished<'_>) {
            let h = self.handles();
            h.finished[e.outcome.index()].increment(1);
            h.in_flight.decrement(1.0);
            h.hold.record(e.held.as_secs_f64());
        }

        fn on_leak_suspected(&self, _: &LeakSuspected<'_>) {
            self.handles().leaks.increment(1);
        }
    }
}

#[cfg(feature = "tracing")]
mod tracing_export {
    use super::super::observer::{Finished, LeakSuspected, Observer, Permitted, Rejection};

    /// Emits a `tracing` event for every admission (debug), rejection (warn),
    /// finished call (debug; warn when it timed out or panicked) and
    /// suspected leak (warn), with target `watertight`. (The `bulkhead_call`
    /// span around each call comes from `Policy::traced`, not from here:
    /// an observer sees events, not the call's future.)
    #[derive(Debug)]
    pub(crate) struct TracingExporter;

    impl Observer for TracingExporter {
        fn on_permitted(&self, e: &Permitted<'_>) {
            tracing::debug!(target: "watertight", bulkhead = e.name, waited = ?e.waited, "call permitted");
        }

        fn on_rejected(&self, e: &Rejection<'_>) {
            tracing::warn!(
                target: "watertight",
                bulkhead = e.name,
                reason = e.reason.as_str(),
                waited = ?e.waited,
                "call rejected"
            );
        }

        fn on_finished(&self, e: &Finished<'_>) {
            use super::super::observer::CallOutcome;
            match e.outcome {
                CallOutcome::TimedOut | CallOutcome::Panicked => tracing::warn!(
                    target: "watertight",
                    bulkhead = e.name,
                    outcome = e.outcome.as_str(),
                    held = ?e.held,
                    "call finished"
                ),
                _ => tracing::debug!(
                    target: "watertight",
                    bulkhead = e.name,
                    outcome = e.outcome.as_str(),
                    held = ?e.held,
                    "call finished"
                ),
            }
        }

        fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
            tracing::warn!(
                target: "watertight",
                bulkhead = e.name,
                held = ?e.held,
                threshold = ?e.threshold,
                "permit held past the leak threshold"
            );
        }
    }
}
