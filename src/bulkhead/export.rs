//! Observers that publish a bulkhead's events to the `metrics` facade and to
//! `tracing`, installed by the builder when the matching feature is on.

#[cfg(feature = "metrics")]
pub(crate) use self::metrics_export::MetricsExporter;
#[cfg(feature = "tracing")]
pub use self::tracing_export::TraceLevels;
#[cfg(feature = "tracing")]
pub(crate) use self::tracing_export::TracingExporter;

/// Which exporters a builder installs (each only with its feature on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exports {
    pub(crate) metrics: bool,
    pub(crate) tracing: bool,
    #[cfg(feature = "tracing")]
    pub(crate) levels: TraceLevels,
}

impl Exports {
    /// Both on, at the default levels.
    pub(crate) const ALL: Exports = Exports {
        metrics: true,
        tracing: true,
        #[cfg(feature = "tracing")]
        levels: TraceLevels::DEFAULT,
    };

    /// The observers to install, ahead of the user's.
    pub(crate) fn observers(
        &self,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] name: &str,
    ) -> Vec<std::sync::Arc<dyn super::observer::Observer>> {
        #[cfg_attr(not(any(feature = "metrics", feature = "tracing")), allow(unused_mut))]
        let mut observers: Vec<std::sync::Arc<dyn super::observer::Observer>> = Vec::new();
        #[cfg(feature = "metrics")]
        if self.metrics {
            observers.push(std::sync::Arc::new(MetricsExporter::new(name)));
        }
        #[cfg(feature = "tracing")]
        if self.tracing {
            observers.push(std::sync::Arc::new(TracingExporter {
                levels: self.levels,
            }));
        }
        observers
    }
}

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

    /// Every series with its unit and help text, for the recorder's
    /// `# HELP` and `# UNIT` lines (described again with each bulkhead's
    /// registration: a recorder installed later gets them too, and a
    /// recorder keeps one description a name).
    fn describe() {
        use metrics::Unit;
        metrics::describe_counter!(
            "bulkhead_calls_permitted_total",
            Unit::Count,
            "Calls the bulkhead admitted."
        );
        metrics::describe_counter!(
            "bulkhead_calls_rejected_total",
            Unit::Count,
            "Calls the bulkhead turned away, by reason."
        );
        metrics::describe_counter!(
            "bulkhead_calls_finished_total",
            Unit::Count,
            "Admitted calls that ended, by outcome."
        );
        metrics::describe_gauge!(
            "bulkhead_calls_in_flight",
            Unit::Count,
            "Calls holding a permit now."
        );
        metrics::describe_histogram!(
            "bulkhead_wait_seconds",
            Unit::Seconds,
            "How long admitted calls waited for their permit."
        );
        metrics::describe_histogram!(
            "bulkhead_hold_seconds",
            Unit::Seconds,
            "How long calls held their permit."
        );
        metrics::describe_counter!(
            "bulkhead_leaks_suspected_total",
            Unit::Count,
            "Permits held past the leak threshold."
        );
    }

    impl Handles {
        #[cold]
        fn register(name: &str) -> Self {
            describe();
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
    use tracing::Level;

    use super::super::observer::{
        CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection,
    };

    /// The level of each kind of event the `tracing` exporter emits (feature
    /// `tracing`), `None` for none; set with
    /// [`BulkheadBuilder::trace_levels`](crate::BulkheadBuilder::trace_levels).
    /// Every event has target `watertight` and names its bulkhead.
    ///
    /// | field | event | default | why |
    /// |---|---|---|---|
    /// | `permitted` | a call admitted | `DEBUG` | one per call: for debugging |
    /// | `rejected` | a call turned away | `DEBUG` | the bulkhead doing its job: under overload one per rejected call (thousands a second), which the metrics count; raise it where a rejection is rare and each one matters |
    /// | `finished` | a call ended (success, failure, cancelled, released) | `DEBUG` | one per call: for debugging |
    /// | `cut_short` | a call cut off by `call_timeout`, or that panicked | `WARN` | a call the bulkhead had to stop, or a bug |
    /// | `leak` | a permit held past `leak_threshold` | `WARN` | a bug: a permit that may never come back |
    ///
    /// # Examples
    ///
    /// ```
    /// use tracing::Level;
    /// use watertight::Bulkhead;
    /// use watertight::observer::TraceLevels;
    ///
    /// let mut levels = TraceLevels::default();
    /// levels.rejected = Some(Level::WARN); // rejections are rare here, and matter
    /// levels.permitted = None;
    /// let bh = Bulkhead::builder().max_concurrent_calls(4).trace_levels(levels).build().unwrap();
    /// # drop(bh);
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct TraceLevels {
        /// A call admitted.
        pub permitted: Option<Level>,
        /// A call turned away.
        pub rejected: Option<Level>,
        /// A call that ended on its own, or whose permit was dropped.
        pub finished: Option<Level>,
        /// A call cut off by `call_timeout`, or that panicked.
        pub cut_short: Option<Level>,
        /// A permit held past `leak_threshold`.
        pub leak: Option<Level>,
    }

    impl TraceLevels {
        /// The defaults of the table above.
        pub const DEFAULT: TraceLevels = TraceLevels {
            permitted: Some(Level::DEBUG),
            rejected: Some(Level::DEBUG),
            finished: Some(Level::DEBUG),
            cut_short: Some(Level::WARN),
            leak: Some(Level::WARN),
        };
    }

    impl Default for TraceLevels {
        fn default() -> Self {
            Self::DEFAULT
        }
    }

    /// A `tracing` event at a level known only at run time (the macros
    /// want it constant): one callsite per level.
    macro_rules! event_at {
        ($level:expr, $($event:tt)+) => {
            match $level {
                None => {}
                Some(level) if level == Level::ERROR => tracing::error!($($event)+),
                Some(level) if level == Level::WARN => tracing::warn!($($event)+),
                Some(level) if level == Level::INFO => tracing::info!($($event)+),
                Some(level) if level == Level::DEBUG => tracing::debug!($($event)+),
                Some(_) => tracing::trace!($($event)+),
            }
        };
    }

    /// Emits a `tracing` event for every admission, rejection, finished
    /// call and suspected leak, at the levels of its [`TraceLevels`]. (The
    /// `bulkhead_call` span around each call comes from `Policy::traced`,
    /// not from here: an observer sees events, not the call's future.)
    #[derive(Debug)]
    pub(crate) struct TracingExporter {
        pub(crate) levels: TraceLevels,
    }

    impl Observer for TracingExporter {
        fn on_permitted(&self, e: &Permitted<'_>) {
            event_at!(self.levels.permitted, target: "watertight", bulkhead = e.name, waited = ?e.waited, "call permitted");
        }

        fn on_rejected(&self, e: &Rejection<'_>) {
            event_at!(
                self.levels.rejected,
                target: "watertight",
                bulkhead = e.name,
                reason = e.reason.as_str(),
                waited = ?e.waited,
                "call rejected"
            );
        }

        fn on_finished(&self, e: &Finished<'_>) {
            let level = match e.outcome {
                CallOutcome::TimedOut | CallOutcome::Panicked => self.levels.cut_short,
                _ => self.levels.finished,
            };
            event_at!(
                level,
                target: "watertight",
                bulkhead = e.name,
                outcome = e.outcome.as_str(),
                held = ?e.held,
                "call finished"
            );
        }

        fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
            event_at!(
                self.levels.leak,
                target: "watertight",
                bulkhead = e.name,
                held = ?e.held,
                threshold = ?e.threshold,
                "permit held past the leak threshold"
            );
        }
    }
}
