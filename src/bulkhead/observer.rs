//! Hooks that see every call: admitted, rejected, finished.

use core::fmt;
use std::time::Duration;

use super::error::RejectReason;

/// How an admitted call ended.
///
/// # Examples
///
/// ```
/// use watertight::{Bulkhead, CallOutcome};
///
/// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
/// let mut permit = bh.try_acquire().unwrap();
/// // ... the guarded work succeeded:
/// permit.set_outcome(CallOutcome::Success);
/// assert_eq!(CallOutcome::Success.as_str(), "success");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallOutcome {
    /// The guarded future returned `Ok`.
    Success,
    /// The guarded future returned `Err`.
    Failure,
    /// The guarded future ran past `call_timeout` and was dropped.
    TimedOut,
    /// The call (or the permit's owner) was dropped before it finished.
    Cancelled,
    /// The guarded future, or the code holding the permit, panicked.
    Panicked,
    /// A permit from [`Bulkhead::acquire`](crate::Bulkhead::acquire) or
    /// [`Bulkhead::try_acquire`](crate::Bulkhead::try_acquire) was dropped:
    /// the bulkhead cannot tell whether the work succeeded.
    Released,
}

impl CallOutcome {
    /// A short lowercase label, for metrics and logs.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::CallOutcome;
    ///
    /// assert_eq!(CallOutcome::TimedOut.as_str(), "timed_out");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Panicked => "panicked",
            Self::Released => "released",
        }
    }

    /// Every outcome, in declaration order: `ALL[o.index()] == o`.
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) const ALL: [CallOutcome; 6] = [
        Self::Success,
        Self::Failure,
        Self::TimedOut,
        Self::Cancelled,
        Self::Panicked,
        Self::Released,
    ];

    /// This outcome's place in [`ALL`](Self::ALL).
    #[cfg(any(test, feature = "metrics"))]
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sees every call a bulkhead handles. Every method has a default that does
/// nothing, so implement only what you need.
///
/// The bulkhead never calls an observer while it holds a lock, so a hook may
/// call back into the same bulkhead (read its [metrics](crate::Bulkhead::metrics),
/// even change its limit) without deadlocking. Hooks run inline on the
/// caller's task: keep them short and non-blocking.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// use watertight::Bulkhead;
/// use watertight::observer::{Observer, Rejection};
///
/// #[derive(Debug, Default)]
/// struct CountRejections(AtomicU64);
///
/// impl Observer for CountRejections {
///     fn on_rejected(&self, _event: &Rejection<'_>) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let seen = Arc::new(CountRejections::default());
/// let bh = Bulkhead::builder()
///     .max_concurrent_calls(1)
///     .max_wait(Duration::ZERO)
///     .observer(seen.clone())
///     .build()
///     .unwrap();
/// let _held = bh.try_acquire().unwrap();
/// assert!(bh.try_acquire().is_err());
/// assert_eq!(seen.0.load(Ordering::Relaxed), 1);
/// ```
pub trait Observer: Send + Sync + 'static {
    /// A call was admitted after waiting `event.waited`.
    fn on_permitted(&self, event: &Permitted<'_>) {
        let _ = event;
    }

    /// A call was turned away.
    fn on_rejected(&self, event: &Rejection<'_>) {
        let _ = event;
    }

    /// An admitted call ended and gave its permit back.
    fn on_finished(&self, event: &Finished<'_>) {
        let _ = event;
    }

    /// A permit has been held longer than the bulkhead's
    /// [`leak_threshold`](crate::BulkheadBuilder::leak_threshold): the
    /// call may be stuck, or the permit leaked (kept alive by mistake).
    /// Called at most once per permit, from the timer (its thread, or the
    /// runtime's timer driver), not from the holder's task, with no lock
    /// held; the permit may be released meanwhile.
    fn on_leak_suspected(&self, event: &LeakSuspected<'_>) {
        let _ = event;
    }
}

/// What [`Observer::on_leak_suspected`] sees.
///
/// # Examples
///
/// ```
/// use watertight::observer::{Observer, LeakSuspected};
///
/// struct Log;
/// impl Observer for Log {
///     fn on_leak_suspected(&self, e: &LeakSuspected<'_>) {
///         println!("{}: {:?}", e.name, e.threshold);
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeakSuspected<'a> {
    /// The bulkhead's name.
    pub name: &'a str,
    /// How long the permit has been held so far.
    pub held: Duration,
    /// The configured threshold it passed.
    pub threshold: Duration,
}

/// What [`Observer::on_permitted`] sees.
///
/// # Examples
///
/// ```
/// use watertight::observer::{Observer, Permitted};
///
/// struct Log;
/// impl Observer for Log {
///     fn on_permitted(&self, e: &Permitted<'_>) {
///         println!("{}: {:?}", e.name, e.waited);
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Permitted<'a> {
    /// The bulkhead's name.
    pub name: &'a str,
    /// How long the call waited for its permit.
    pub waited: Duration,
    /// Callers waiting in the bulkhead's line at this moment.
    pub waiting: usize,
    /// The bulkhead's limit on calls in flight at this moment.
    pub limit: usize,
}

/// What [`Observer::on_rejected`] sees.
///
/// # Examples
///
/// ```
/// use watertight::observer::{Observer, Rejection};
///
/// struct Log;
/// impl Observer for Log {
///     fn on_rejected(&self, e: &Rejection<'_>) {
///         println!("{}: {:?}", e.name, e.reason);
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// The bulkhead's name.
    pub name: &'a str,
    /// Why the call was turned away.
    pub reason: RejectReason,
    /// How long it waited first.
    pub waited: Duration,
    /// Callers waiting in the bulkhead's line at this moment.
    pub waiting: usize,
    /// The bulkhead's limit on calls in flight at this moment.
    pub limit: usize,
}

/// What [`Observer::on_finished`] sees.
///
/// # Examples
///
/// ```
/// use watertight::observer::{Observer, Finished};
///
/// struct Log;
/// impl Observer for Log {
///     fn on_finished(&self, e: &Finished<'_>) {
///         println!("{}: {:?}", e.name, e.outcome);
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Finished<'a> {
    /// The bulkhead's name.
    pub name: &'a str,
    /// How long the permit was held.
    pub held: Duration,
    /// How the call ended.
    pub outcome: CallOutcome,
    /// Callers waiting in the bulkhead's line at this moment.
    pub waiting: usize,
    /// The bulkhead's limit on calls in flight at this moment.
    pub limit: usize,
}

#[cfg(test)]
mod tests {
    use super::CallOutcome;

    #[test]
    fn every_outcome_sits_at_its_index() {
        for (i, outcome) in CallOutcome::ALL.iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
        }
    }
}
