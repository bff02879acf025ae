//! Why a keyed bulkhead turned a call away, and what went wrong with an
//! admitted call.

use core::fmt;
use std::time::Duration;

use crate::bulkhead::error::call_error_accessors;
use crate::bulkhead::name::Name;
use crate::bulkhead::{CallTimeout, RejectReason, Rejected};

/// Why a [`KeyedBulkhead`](super::KeyedBulkhead) turned a call away: which
/// of its limits said no.
///
/// # Examples
///
/// ```
/// use watertight::keyed::KeyedRejectReason;
///
/// assert_eq!(KeyedRejectReason::TooManyKeys.as_str(), "too_many_keys");
/// assert!(KeyedRejectReason::GlobalTimeout.is_global());
/// assert!(KeyedRejectReason::KeyTimeout.is_timeout());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyedRejectReason {
    /// The key's own limit: all its permits are held, and the call could
    /// not wait (fail fast, `max_wait` zero) or the key's line was full
    /// (`max_queue`).
    KeyFull,
    /// The call waited the whole `max_wait` for one of the key's permits.
    KeyTimeout,
    /// The global limit: the key had room, but every global permit is
    /// held and the call could not wait (fail fast, or the global line was
    /// full).
    GlobalFull,
    /// The key had room, but the rest of the `max_wait` budget ran out
    /// waiting for a global permit.
    GlobalTimeout,
    /// The key is not tracked yet, `max_keys` keys are, and none of them is
    /// idle (every one has a permit held or a caller waiting), so none could
    /// be evicted to make room.
    TooManyKeys,
    /// The keyed bulkhead (or the global bulkhead it shares) was closed.
    Closed,
    /// A time limit could not be kept: the timer that bounds the wait (or,
    /// from [`call`](super::KeyedBulkhead::call), the running call, which
    /// is then dropped) cannot run, because its tokio runtime has shut down
    /// or has no time driver.
    Unavailable,
    /// The call carried a [deadline](crate::CallOptions::deadline) that
    /// the key's
    /// own limit could not serve it by: the deadline had passed, the wait
    /// the key's line can expect plus the key's average hold time did not
    /// fit in the time left, or it waited for the key until it could no
    /// longer finish in time. As
    /// [`RejectReason::WontMakeDeadline`], for the first stage.
    KeyWontMakeDeadline,
    /// The key had room, but the global limit could not serve the call by
    /// its deadline, judged with what was left of it (as
    /// [`KeyWontMakeDeadline`](Self::KeyWontMakeDeadline), for the global
    /// stage).
    GlobalWontMakeDeadline,
    /// Controlled delay on the key's own line
    /// ([`queue_delay`](super::KeyedBulkheadBuilder::queue_delay)): the
    /// key's waiting line had stood past its target for an interval, and
    /// this caller had waited the target. Other keys' lines are judged on
    /// their own. As [`RejectReason::QueueDelay`], for the first stage.
    KeyQueueDelay,
    /// Controlled delay on the global line: the key had room, but the line
    /// for global permits had stood past its target for an interval, and
    /// this caller had waited the target in it.
    GlobalQueueDelay,
    /// Priority classes on the key's own line: a caller of a more
    /// important class took this caller's place in the key's full line.
    /// As [`RejectReason::Displaced`], for the first stage.
    KeyDisplaced,
    /// Priority classes on the global line: the key had room, but a caller
    /// of a more important class took this caller's place in the full
    /// global line.
    GlobalDisplaced,
}

impl KeyedRejectReason {
    /// A short lowercase label, for metrics and logs: `"key_full"`,
    /// `"key_timeout"`, `"global_full"`, `"global_timeout"`,
    /// `"too_many_keys"`, `"closed"`, `"unavailable"`, `"key_deadline"`,
    /// `"global_deadline"`, `"key_queue_delay"` or `"global_queue_delay"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KeyFull => "key_full",
            Self::KeyTimeout => "key_timeout",
            Self::GlobalFull => "global_full",
            Self::GlobalTimeout => "global_timeout",
            Self::TooManyKeys => "too_many_keys",
            Self::Closed => "closed",
            Self::Unavailable => "unavailable",
            Self::KeyWontMakeDeadline => "key_deadline",
            Self::GlobalWontMakeDeadline => "global_deadline",
            Self::KeyQueueDelay => "key_queue_delay",
            Self::GlobalQueueDelay => "global_queue_delay",
            Self::KeyDisplaced => "key_displaced",
            Self::GlobalDisplaced => "global_displaced",
        }
    }

    /// Whether the call gave up after waiting (`KeyTimeout` or
    /// `GlobalTimeout`).
    pub fn is_timeout(self) -> bool {
        matches!(self, Self::KeyTimeout | Self::GlobalTimeout)
    }

    /// Whether the global limit said no (`GlobalFull`, `GlobalTimeout`,
    /// `GlobalWontMakeDeadline` or `GlobalQueueDelay`): the key itself had
    /// room.
    pub fn is_global(self) -> bool {
        self.parts().1 == Some(Stage::Global)
    }

    /// The reason as the bulkhead of the stage that said no gave it
    /// ([`RejectReason`]), or `None` for
    /// [`TooManyKeys`](Self::TooManyKeys), which no bulkhead gives.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::RejectReason;
    /// use watertight::keyed::KeyedRejectReason;
    ///
    /// assert_eq!(KeyedRejectReason::GlobalTimeout.bulkhead_reason(), Some(RejectReason::Timeout));
    /// assert_eq!(KeyedRejectReason::TooManyKeys.bulkhead_reason(), None);
    /// ```
    pub fn bulkhead_reason(self) -> Option<RejectReason> {
        self.parts().0
    }

    /// The bulkhead reason and the stage that gave it: the one place that
    /// says which keyed reason is which.
    const fn parts(self) -> (Option<RejectReason>, Option<Stage>) {
        use RejectReason as R;
        use Stage::{Global, Key};
        let (reason, stage) = match self {
            Self::KeyFull => (R::Full, Key),
            Self::KeyTimeout => (R::Timeout, Key),
            Self::GlobalFull => (R::Full, Global),
            Self::GlobalTimeout => (R::Timeout, Global),
            Self::TooManyKeys => return (None, None),
            Self::Closed => return (Some(R::Closed), None),
            Self::Unavailable => return (Some(R::Unavailable), None),
            Self::KeyWontMakeDeadline => (R::WontMakeDeadline, Key),
            Self::GlobalWontMakeDeadline => (R::WontMakeDeadline, Global),
            Self::KeyQueueDelay => (R::QueueDelay, Key),
            Self::GlobalQueueDelay => (R::QueueDelay, Global),
            Self::KeyDisplaced => (R::Displaced, Key),
            Self::GlobalDisplaced => (R::Displaced, Global),
        };
        (Some(reason), Some(stage))
    }

    /// The keyed reason for a rejection by the key's bulkhead (`global`
    /// false) or the global one. Every bulkhead reason is spelled out, so
    /// that a new one cannot be filed under an old one.
    pub(crate) const fn staged(reason: RejectReason, global: bool) -> Self {
        match (reason, global) {
            (RejectReason::Closed, _) => Self::Closed,
            (RejectReason::Unavailable, _) => Self::Unavailable,
            (RejectReason::Full, false) => Self::KeyFull,
            (RejectReason::Full, true) => Self::GlobalFull,
            (RejectReason::Timeout, false) => Self::KeyTimeout,
            (RejectReason::Timeout, true) => Self::GlobalTimeout,
            (RejectReason::WontMakeDeadline, false) => Self::KeyWontMakeDeadline,
            (RejectReason::WontMakeDeadline, true) => Self::GlobalWontMakeDeadline,
            (RejectReason::QueueDelay, false) => Self::KeyQueueDelay,
            (RejectReason::QueueDelay, true) => Self::GlobalQueueDelay,
            (RejectReason::Displaced, false) => Self::KeyDisplaced,
            (RejectReason::Displaced, true) => Self::GlobalDisplaced,
        }
    }
}

/// Which of a keyed bulkhead's limits said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The key's own bulkhead.
    Key,
    /// The global bulkhead.
    Global,
}

impl Stage {
    /// What a message names the stage by.
    fn subject(self) -> &'static str {
        match self {
            Stage::Key => "the key",
            Stage::Global => "the global limit",
        }
    }
}

impl fmt::Display for KeyedRejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call a [`KeyedBulkhead`](super::KeyedBulkhead) did not admit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::keyed::{KeyedBulkhead, KeyedRejectReason};
///
/// let tenants = KeyedBulkhead::<String>::builder()
///     .name("tenants")
///     .max_concurrent_calls(1)
///     .max_wait(Duration::ZERO)
///     .build()
///     .unwrap();
/// let _held = tenants.try_acquire("acme").unwrap();
/// let rejected = tenants.try_acquire("acme").unwrap_err();
/// assert_eq!(rejected.reason(), KeyedRejectReason::KeyFull);
/// assert_eq!(rejected.name(), "tenants");
/// assert_eq!(rejected.to_string(), r#"keyed bulkhead "tenants": the key is full"#);
/// assert_eq!(
///     format!("{rejected:?}"),
///     r#"KeyedRejected { bulkhead: "tenants", reason: KeyFull, waited: 0ns, retry_after: None }"#
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct KeyedRejected {
    reason: KeyedRejectReason,
    /// Nanoseconds, saturating (8 bytes where a `Duration` takes 16).
    waited_ns: u64,
    /// Interned (a thin pointer, no reference count to touch), as
    /// [`Rejected`]'s: every layer a rejection goes through moves it.
    name: Name,
    max_keys: usize,
    source: Option<Rejected>,
}

impl KeyedRejected {
    #[cold]
    pub(crate) fn new(
        reason: KeyedRejectReason,
        waited: Duration,
        name: Name,
        max_keys: usize,
        source: Option<Rejected>,
    ) -> Self {
        Self {
            reason,
            waited_ns: u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            name,
            max_keys,
            source,
        }
    }

    /// Maps a rejection by the key's bulkhead (`global == false`) or by the
    /// global one.
    #[cold]
    #[inline(never)]
    pub(crate) fn from_bulkhead(
        rejected: Rejected,
        global: bool,
        waited: Duration,
        name: Name,
        max_keys: usize,
    ) -> Self {
        let reason = KeyedRejectReason::staged(rejected.reason(), global);
        Self::new(reason, waited, name, max_keys, Some(rejected))
    }

    /// A global `Full` that came from a `max_wait` budget already spent:
    /// reported as `GlobalTimeout`.
    pub(super) fn budget_spent(mut self) -> Self {
        if self.reason == KeyedRejectReason::GlobalFull {
            self.reason = KeyedRejectReason::GlobalTimeout;
        }
        self
    }

    /// Why the call was turned away.
    pub fn reason(&self) -> KeyedRejectReason {
        self.reason
    }

    /// How long the caller waited, for the key's permit and then for the
    /// global one, before it was turned away (zero when it was rejected at
    /// once).
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns)
    }

    /// The name of the keyed bulkhead.
    pub fn name(&self) -> &str {
        self.name
    }

    /// The rejection of the underlying bulkhead (the key's, or the global
    /// one), when one of them said no: the `max_wait` budget that runs
    /// out in the global line is that line's `Timeout`. `None` for
    /// [`TooManyKeys`](KeyedRejectReason::TooManyKeys) and for a call
    /// turned away because the keyed bulkhead was closed.
    pub fn bulkhead_rejection(&self) -> Option<&Rejected> {
        self.source.as_ref()
    }

    /// When trying again is likely to succeed, estimated by the bulkhead
    /// that said no (see [`Rejected::retry_after`]); `None` when there is
    /// no estimate.
    pub fn retry_after(&self) -> Option<Duration> {
        self.source.as_ref().and_then(Rejected::retry_after)
    }
}

impl fmt::Debug for KeyedRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRejected")
            .field("bulkhead", &self.name())
            .field("reason", &self.reason)
            .field("waited", &self.waited())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

impl fmt::Display for KeyedRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match self.reason.parts() {
            (Some(reason), Some(stage)) => {
                let row = reason.row();
                write!(
                    f,
                    "keyed bulkhead {name:?}: {} {}",
                    stage.subject(),
                    row.says
                )?;
                if row.shows_wait {
                    // Whole milliseconds: the timer's jitter below that is noise.
                    let waited = Duration::from_millis(self.waited_ns / 1_000_000);
                    write!(f, " {waited:?}")?;
                }
                Ok(())
            }
            (Some(RejectReason::Unavailable), None) => write!(
                f,
                "keyed bulkhead {name:?} cannot keep its time limits: its timer is not running"
            ),
            (Some(reason), None) => write!(f, "keyed bulkhead {name:?} {}", reason.row().says),
            (None, _) => write!(
                f,
                "keyed bulkhead {name:?} tracks its maximum of {} keys and none is idle",
                self.max_keys
            ),
        }
    }
}

impl std::error::Error for KeyedRejected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|r| r as &(dyn std::error::Error + 'static))
    }
}

/// The error of [`KeyedBulkhead::call`](super::KeyedBulkhead::call): the
/// call was rejected, ran out of time, or failed on its own.
///
/// Like [`BulkheadError`](crate::BulkheadError), `Display` says only what
/// happened at this level and the error it holds (the [`KeyedRejected`] or
/// the call's own) is its [`source`](std::error::Error::source). More
/// variants may be added: a `match` needs a `_` arm.
///
/// # Examples
///
/// ```
/// use watertight::keyed::{KeyedBulkhead, KeyedError};
///
/// # futures::executor::block_on(async {
/// let hosts = KeyedBulkhead::<&'static str>::builder().max_concurrent_calls(2).build().unwrap();
/// let failed = hosts.call(&"api.example.com", async { Err::<(), _>("503") }).await;
/// assert_eq!(failed.unwrap_err().into_inner(), Some("503"));
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedError<E> {
    /// The call was not admitted; the guarded future never ran.
    Rejected(KeyedRejected),
    /// The call was admitted but did not finish within `call_timeout`; it
    /// was dropped and its permits released.
    CallTimeout(CallTimeout),
    /// The guarded call ran and returned this error.
    Inner(E),
}

call_error_accessors! {
    KeyedError, KeyedRejected, KeyedRejectReason;
    /// The rejection, if the call was not admitted.
    ;
    /// The call's own error, if it ran and failed.
    ;
}

/// A rejection and a call timeout display as themselves (the rejection's
/// source is the underlying bulkhead's rejection, if one said no); the
/// call's error is the source.
impl<E> fmt::Display for KeyedError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected(r) => fmt::Display::fmt(r, f),
            Self::CallTimeout(t) => fmt::Display::fmt(t, f),
            Self::Inner(_) => f.write_str("the call guarded by a keyed bulkhead failed"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for KeyedError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected(r) => r.source(),
            Self::CallTimeout(t) => t.source(),
            Self::Inner(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KeyedRejectReason, Stage};
    use crate::bulkhead::RejectReason;

    /// Each bulkhead reason, at each stage, files under a keyed reason
    /// that gives it back with that stage (closing and a timer that cannot
    /// run are the keyed bulkhead's as a whole, at either stage).
    #[test]
    fn every_bulkhead_reason_keeps_its_reason_and_stage() {
        for reason in RejectReason::ALL {
            for global in [false, true] {
                let keyed = KeyedRejectReason::staged(reason, global);
                assert_eq!(keyed.bulkhead_reason(), Some(reason), "{keyed:?}");
                let stage = match reason {
                    RejectReason::Closed | RejectReason::Unavailable => None,
                    _ if global => Some(Stage::Global),
                    _ => Some(Stage::Key),
                };
                assert_eq!(keyed.parts().1, stage, "{keyed:?}");
                assert_eq!(keyed.is_global(), stage == Some(Stage::Global));
            }
        }
    }
}
