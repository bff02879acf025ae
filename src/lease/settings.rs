//! The settings every leased semaphore's builder has (the limit, the
//! lease's timing, the waits, the label, the timer, fairness), their
//! defaults, their checks, and the setters that fill them in
//! ([`lease_setters!`]): written once for the Redis and the PostgreSQL
//! builders, which add the settings of their own store.

use std::sync::Arc;
use std::time::Duration;

use super::timing::{BadTiming, Timing};
use crate::timer::Timer;

/// The settings every leased semaphore's builder has, in its field
/// `lease`, as the setters left them.
#[derive(Debug)]
pub(crate) struct LeaseSettings {
    pub(crate) limit: usize,
    pub(crate) lease_ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) drift_margin: Option<Duration>,
    pub(crate) max_poll: Duration,
    pub(crate) label: Option<String>,
    pub(crate) response_timeout: Duration,
    pub(crate) outage_tolerance: Duration,
    pub(crate) timer: Option<Arc<dyn Timer>>,
    pub(crate) fair: bool,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            limit: 1,
            lease_ttl: Duration::from_secs(30),
            renew_every: None,
            drift_margin: None,
            max_poll: Duration::from_secs(1),
            label: None,
            response_timeout: Duration::from_secs(2),
            outage_tolerance: Duration::from_secs(5),
            timer: None,
            fair: true,
        }
    }
}

impl LeaseSettings {
    /// The lease's timing, checked: a time to live of at least `min_ttl`
    /// (the store's clock counts in milliseconds) and at most 2^50 ms, then
    /// the drift margin and the renewal interval (see [`Timing::new`]).
    /// A setting that cannot work is told by the backend's own error, of
    /// `bad`: for the time to live, the drift margin and the renewal
    /// interval, in this order.
    pub(crate) fn timing<E>(&self, min_ttl: Duration, bad: [E; 3]) -> Result<Timing, E> {
        let [bad_ttl, bad_drift_margin, bad_renew_interval] = bad;
        let ttl_ms = self.lease_ttl.as_millis();
        if !(min_ttl.as_millis()..=(1 << 50)).contains(&ttl_ms) {
            return Err(bad_ttl);
        }
        Timing::new(self.lease_ttl, self.drift_margin, self.renew_every).map_err(|e| match e {
            BadTiming::DriftMargin => bad_drift_margin,
            BadTiming::RenewInterval => bad_renew_interval,
        })
    }
}

/// The setters of [`LeaseSettings`], for a builder whose field `lease`
/// holds them: one line per setter, its name, after the docs the backend
/// writes for its store. A builder may call it more than once, to keep
/// its methods in the order its docs read best.
///
/// ```ignore
/// impl PgSemaphoreBuilder {
///     crate::lease::lease_setters! {
///         /// The limit to store if the database holds no row yet.
///         limit;
///         /// How long a lease lives without renewal.
///         lease_ttl;
///     }
/// }
/// ```
macro_rules! lease_setters {
    (@one $(#[$doc:meta])* limit) => {
        $(#[$doc])*
        pub fn limit(mut self, limit: usize) -> Self {
            self.lease.limit = limit;
            self
        }
    };
    (@one $(#[$doc:meta])* lease_ttl) => {
        $(#[$doc])*
        pub fn lease_ttl(mut self, ttl: ::std::time::Duration) -> Self {
            self.lease.lease_ttl = ttl;
            self
        }
    };
    (@one $(#[$doc:meta])* renew_every) => {
        $(#[$doc])*
        pub fn renew_every(mut self, every: ::std::time::Duration) -> Self {
            self.lease.renew_every = Some(every);
            self
        }
    };
    (@one $(#[$doc:meta])* drift_margin) => {
        $(#[$doc])*
        pub fn drift_margin(mut self, margin: ::std::time::Duration) -> Self {
            self.lease.drift_margin = Some(margin);
            self
        }
    };
    (@one $(#[$doc:meta])* max_poll) => {
        $(#[$doc])*
        pub fn max_poll(mut self, every: ::std::time::Duration) -> Self {
            // A waiter that never slept would spin.
            self.lease.max_poll = every.max(::std::time::Duration::from_millis(1));
            self
        }
    };
    (@one $(#[$doc:meta])* label) => {
        $(#[$doc])*
        pub fn label(mut self, label: impl Into<String>) -> Self {
            self.lease.label = Some(label.into());
            self
        }
    };
    (@one $(#[$doc:meta])* response_timeout) => {
        $(#[$doc])*
        pub fn response_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.lease.response_timeout = timeout;
            self
        }
    };
    (@one $(#[$doc:meta])* outage_tolerance) => {
        $(#[$doc])*
        pub fn outage_tolerance(mut self, tolerance: ::std::time::Duration) -> Self {
            self.lease.outage_tolerance = tolerance;
            self
        }
    };
    (@one $(#[$doc:meta])* timer) => {
        $(#[$doc])*
        pub fn timer(mut self, timer: ::std::sync::Arc<dyn $crate::timer::Timer>) -> Self {
            self.lease.timer = Some(timer);
            self
        }
    };
    (@one $(#[$doc:meta])* fair) => {
        $(#[$doc])*
        pub fn fair(mut self, fair: bool) -> Self {
            self.lease.fair = fair;
            self
        }
    };
    ($($(#[$doc:meta])* $name:ident;)*) => {
        $($crate::lease::lease_setters!(@one $(#[$doc])* $name);)*
    };
}

pub(crate) use lease_setters;
