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

    /// The observers to install, ahead of the user's. `series`: the
    /// metrics exporter to use instead of a new one of the bulkhead's own
    /// (a keyed bulkhead's keys share one per label).
    pub(crate) fn observers(
        &self,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] name: &str,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] series: Option<
            std::sync::Arc<dyn super::observer::Observer>,
        >,
    ) -> Vec<std::sync::Arc<dyn super::observer::Observer>> {
        #[cfg_attr(not(any(feature = "metrics", feature = "tracing")), allow(unused_mut))]
        let mut observers: Vec<std::sync::Arc<dyn super::observer::Observer>> = Vec::new();
        #[cfg(feature = "metrics")]
        if self.metrics {
            observers
                .push(series.unwrap_or_else(|| std::sync::Arc::new(MetricsExporter::new(name))));
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
    use std::sync::atomic::{AtomicIsize, Ordering};
    use std::sync::{Arc, OnceLock};

    use metrics::{Counter, Gauge, Histogram, Label};

    use super::super::observer::{
        CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection,
    };
    use super::super::reason::{REASONS, RejectReason};

    /// Publishes through the `metrics` crate's recorder. Names, all
    /// labelled `bulkhead=<name>` (and a keyed bulkhead's keys
    /// `key=<label>`):
    ///
    /// | name | kind | extra labels |
    /// |---|---|---|
    /// | `bulkhead_calls_permitted_total` | counter | |
    /// | `bulkhead_calls_rejected_total` | counter | `reason` |
    /// | `bulkhead_calls_finished_total` | counter | `outcome` |
    /// | `bulkhead_calls_in_flight` | gauge | |
    /// | `bulkhead_calls_waiting` | gauge | |
    /// | `bulkhead_limit` | gauge | |
    /// | `bulkhead_permits_available` | gauge | |
    /// | `bulkhead_wait_seconds` | histogram | |
    /// | `bulkhead_hold_seconds` | histogram | |
    /// | `bulkhead_leaks_suspected_total` | counter | |
    ///
    /// Labels are bounded: one bulkhead name (and key label), seven
    /// reasons, six outcomes.
    ///
    /// The handles are registered on the first event that finds a
    /// recorder in effect (the thread's local one, else the global one),
    /// and kept: every later event costs no allocation or lookup, only the
    /// `OnceLock`'s load. Until then each event looks for one, and meanwhile
    /// publishes to `metrics`' no-op recorder: a bulkhead made and called
    /// before the recorder is installed starts publishing at its first
    /// event after. Registering at build time instead would tie a bulkhead
    /// made at startup (a `static`, a config loader) to whatever recorder
    /// existed then, which is usually none. The no-op recorder is told
    /// from a real one by its size (none): a zero-sized recorder of the
    /// user's is published to as well, but looked for again at every
    /// event.
    ///
    /// The gauges are set, not moved: calls in flight are counted here
    /// (so a recorder installed while calls run starts from the right
    /// number), the line and the limit come with each event. The keys of
    /// a keyed bulkhead that share a label share one exporter (their sum);
    /// only a bulkhead's own exporter publishes the line, the limit and the
    /// permits available, which a sum of keys would not mean (and a Redis
    /// bulkhead's no permits available: they are the fleet's).
    #[derive(Debug)]
    pub(crate) struct MetricsExporter {
        labels: Vec<Label>,
        /// The gauges published besides calls in flight.
        gauges: Gauges,
        /// Calls this exporter saw admitted and not yet ended (signed: an
        /// end may be counted just before its admission by a racing reader;
        /// published at least 0).
        in_flight: AtomicIsize,
        /// Registered with a recorder that has state; never replaced.
        handles: OnceLock<Handles>,
        /// Registered with a zero-sized recorder (the no-op one, until a
        /// recorder is installed).
        provisional: OnceLock<Handles>,
    }

    /// The gauges an exporter publishes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Gauges {
        /// Calls in flight, waiting, the limit and the permits free.
        All,
        /// All but the permits free.
        #[cfg_attr(not(feature = "redis"), allow(dead_code))]
        NoAvailable,
        /// Calls in flight alone (the sum of several keys).
        InFlight,
    }

    /// One bulkhead's series, registered together.
    #[derive(Debug)]
    struct Handles {
        /// Registered with a recorder that has state (else the no-op's).
        live: bool,
        permitted: Counter,
        rejected: [Counter; REASONS],
        finished: [Counter; CallOutcome::ALL.len()],
        in_flight: Gauge,
        waiting: Gauge,
        limit: Gauge,
        available: Gauge,
        wait: Histogram,
        hold: Histogram,
        leaks: Counter,
    }

    impl MetricsExporter {
        /// A bulkhead's own exporter.
        pub(crate) fn new(name: &str) -> Self {
            Self::with_labels(vec![Label::new("bulkhead", name.to_owned())], Gauges::All)
        }

        /// The exporter of a bulkhead whose free permits it cannot know
        /// (a Redis bulkhead's are the fleet's).
        #[cfg(feature = "redis")]
        pub(crate) fn without_available(name: &str) -> Self {
            let labels = vec![Label::new("bulkhead", name.to_owned())];
            Self::with_labels(labels, Gauges::NoAvailable)
        }

        /// The exporter shared by a keyed bulkhead's keys labelled `key`
        /// (every key, with `None`).
        pub(crate) fn for_keys(name: &str, key: Option<&Arc<str>>) -> Arc<Self> {
            let mut labels = vec![Label::new("bulkhead", name.to_owned())];
            if let Some(key) = key {
                labels.push(Label::new("key", key.to_string()));
            }
            Arc::new(Self::with_labels(labels, Gauges::InFlight))
        }

        fn with_labels(labels: Vec<Label>, gauges: Gauges) -> Self {
            Self {
                labels,
                gauges,
                in_flight: AtomicIsize::new(0),
                handles: OnceLock::new(),
                provisional: OnceLock::new(),
            }
        }

        #[inline]
        fn handles(&self) -> &Handles {
            match self.handles.get() {
                Some(handles) => handles,
                None => self.look_for_recorder(),
            }
        }

        /// No recorder with state was in effect at an earlier event: the
        /// one in effect now, if it has one, else the no-op's handles.
        #[cold]
        fn look_for_recorder(&self) -> &Handles {
            let found = metrics::with_recorder(|r| size_of_val(r) != 0);
            let slot = match found {
                true => &self.handles,
                false => &self.provisional,
            };
            slot.get_or_init(|| Handles::register(&self.labels, self.gauges, found))
        }

        /// Sets the gauges after an event: calls in flight (and the
        /// permits free) from this exporter's count, the rest as the event
        /// saw them.
        fn set_gauges(&self, h: &Handles, waiting: usize, limit: usize) {
            if !h.live {
                // The no-op recorder's: nothing to set.
                return;
            }
            if self.gauges != Gauges::InFlight {
                h.waiting.set(waiting as f64);
                h.limit.set(limit as f64);
            }
            let available = (self.gauges == Gauges::All).then_some(limit);
            self.publish_in_flight(h, available);
        }

        /// Sets the in-flight gauge to the count (and, given the limit, the
        /// permits-free gauge to what the count leaves), and again while
        /// the count moved meanwhile: of two events racing, the one that
        /// set an older count sees it moved and sets it again, so once calls
        /// stop coming the gauges hold the count. Both are set before the
        /// count is read again: a gauge set after that read could undo a
        /// racing event's newer setting. (A few rounds at most under load;
        /// the next event's setting catches up after that.)
        fn publish_in_flight(&self, h: &Handles, limit: Option<usize>) {
            let mut count = self.in_flight.load(Ordering::SeqCst);
            for _ in 0..8 {
                let held = count.max(0) as usize;
                h.in_flight.set(held as f64);
                if let Some(limit) = limit {
                    h.available.set(limit.saturating_sub(held) as f64);
                }
                let now = self.in_flight.load(Ordering::SeqCst);
                if now == count {
                    break;
                }
                count = now;
            }
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
        metrics::describe_gauge!(
            "bulkhead_calls_waiting",
            Unit::Count,
            "Callers waiting in the bulkhead's line."
        );
        metrics::describe_gauge!(
            "bulkhead_limit",
            Unit::Count,
            "The bulkhead's limit on calls in flight."
        );
        metrics::describe_gauge!(
            "bulkhead_permits_available",
            Unit::Count,
            "Permits free now: the limit less the calls in flight."
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
        fn register(labels: &[Label], gauges: Gauges, live: bool) -> Self {
            describe();
            let with = |extra: Option<Label>| -> Vec<Label> {
                labels.iter().cloned().chain(extra).collect()
            };
            let own = || with(None);
            // Only those published (see `Gauges`).
            let gauge = |name: &'static str, published: bool| match published {
                true => metrics::gauge!(name, own()),
                false => Gauge::noop(),
            };
            Self {
                live,
                permitted: metrics::counter!("bulkhead_calls_permitted_total", own()),
                rejected: RejectReason::ALL.map(|r| {
                    metrics::counter!(
                        "bulkhead_calls_rejected_total",
                        with(Some(Label::from_static_parts("reason", r.as_str())))
                    )
                }),
                finished: CallOutcome::ALL.map(|o| {
                    metrics::counter!(
                        "bulkhead_calls_finished_total",
                        with(Some(Label::from_static_parts("outcome", o.as_str())))
                    )
                }),
                in_flight: metrics::gauge!("bulkhead_calls_in_flight", own()),
                waiting: gauge("bulkhead_calls_waiting", gauges != Gauges::InFlight),
                limit: gauge("bulkhead_limit", gauges != Gauges::InFlight),
                available: gauge("bulkhead_permits_available", gauges == Gauges::All),
                wait: metrics::histogram!("bulkhead_wait_seconds", own()),
                hold: metrics::histogram!("bulkhead_hold_seconds", own()),
                leaks: metrics::counter!("bulkhead_leaks_suspected_total", own()),
            }
        }
    }

    impl Observer for MetricsExporter {
        fn on_permitted(&self, e: &Permitted<'_>) {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let h = self.handles();
            h.permitted.increment(1);
            h.wait.record(e.waited.as_secs_f64());
            self.set_gauges(h, e.waiting, e.limit);
        }

        fn on_rejected(&self, e: &Rejection<'_>) {
            let h = self.handles();
            h.rejected[e.reason.index()].increment(1);
            self.set_gauges(h, e.waiting, e.limit);
        }

        fn on_finished(&self, e: &Finished<'_>) {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let h = self.handles();
            h.finished[e.outcome.index()].increment(1);
            h.hold.record(e.held.as_secs_f64());
            self.set_gauges(h, e.waiting, e.limit);
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
