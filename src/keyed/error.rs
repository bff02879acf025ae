//! Why a keyed bulkhead turned a call away, and what went wrong with an
//! admitted call.

use core::fmt;
use std::time::Duration;

use crate::bulkhead::name::Name;
use crate::bulkhead::{RejectReason, Rejected};

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
    /// The call carried a deadline
    /// ([`call_by`](super::KeyedBulkhead::call_by),
    /// [`acquire_by`](super::KeyedBulkhead::acquire_by)) that the key's
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
        matches!(
            self,
            Self::GlobalFull
                | Self::GlobalTimeout
                | Self::GlobalWontMakeDeadline
                | Self::GlobalQueueDelay
        )
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
/// assert_eq!(rejected.to_string(), "keyed bulkhead tenants: the key is at its limit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub(crate) fn from_bulkhead(
        rejected: Rejected,
        global: bool,
        waited: Duration,
        name: Name,
        max_keys: usize,
    ) -> Self {
        let reason = match (rejected.reason(), global) {
            (RejectReason::Closed, _) => KeyedRejectReason::Closed,
            (RejectReason::Unavailable, _) => KeyedRejectReason::Unavailable,
            (RejectReason::Timeout, false) => KeyedRejectReason::KeyTimeout,
            (RejectReason::Timeout, true) => KeyedRejectReason::GlobalTimeout,
            (RejectReason::WontMakeDeadline, false) => KeyedRejectReason::KeyWontMakeDeadline,
            (RejectReason::WontMakeDeadline, true) => KeyedRejectReason::GlobalWontMakeDeadline,
            (RejectReason::QueueDelay, false) => KeyedRejectReason::KeyQueueDelay,
            (RejectReason::QueueDelay, true) => KeyedRejectReason::GlobalQueueDelay,
            (_, false) => KeyedRejectReason::KeyFull,
            (_, true) => KeyedRejectReason::GlobalFull,
        };
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
    /// one), when one of them said no. `None` for
    /// [`TooManyKeys`](KeyedRejectReason::TooManyKeys), for a call turned
    /// away because the keyed bulkhead was closed before it looked up its
    /// key, and for a [`GlobalTimeout`](KeyedRejectReason::GlobalTimeout)
    /// decided by the keyed bulkhead's `max_wait` budget.
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

impl fmt::Display for KeyedRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name;
        // Whole milliseconds: the timer's jitter below that is noise.
        let waited = Duration::from_millis(self.waited_ns / 1_000_000);
        match self.reason {
            KeyedRejectReason::KeyFull => {
                write!(f, "keyed bulkhead {name}: the key is at its limit")
            }
            KeyedRejectReason::KeyTimeout => write!(
                f,
                "keyed bulkhead {name}: no free permit for the key within {waited:?}"
            ),
            KeyedRejectReason::GlobalFull => {
                write!(f, "keyed bulkhead {name}: the global limit is reached")
            }
            KeyedRejectReason::GlobalTimeout => write!(
                f,
                "keyed bulkhead {name}: no free global permit within {waited:?}"
            ),
            KeyedRejectReason::TooManyKeys => write!(
                f,
                "keyed bulkhead {name} tracks its maximum of {} keys and none is idle",
                self.max_keys
            ),
            KeyedRejectReason::Closed => write!(f, "keyed bulkhead {name} is closed"),
            KeyedRejectReason::Unavailable => write!(
                f,
                "keyed bulkhead {name} cannot keep its time limits: its timer is not running"
            ),
            KeyedRejectReason::KeyWontMakeDeadline => write!(
                f,
                "keyed bulkhead {name}: the key cannot serve the call before its deadline"
            ),
            KeyedRejectReason::GlobalWontMakeDeadline => write!(
                f,
                "keyed bulkhead {name}: the global limit cannot serve the call before its deadline"
            ),
            KeyedRejectReason::KeyQueueDelay => write!(
                f,
                "keyed bulkhead {name}: the key's waiting line stood past its target wait"
            ),
            KeyedRejectReason::GlobalQueueDelay => write!(
                f,
                "keyed bulkhead {name}: the global waiting line stood past its target wait"
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
    CallTimeout,
    /// The guarded call ran and returned this error.
    Inner(E),
}

impl<E> KeyedError<E> {
    /// The rejection, if the call was not admitted.
    pub fn rejected(&self) -> Option<&KeyedRejected> {
        match self {
            Self::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// The call's own error, if it ran and failed.
    pub fn into_inner(self) -> Option<E> {
        match self {
            Self::Inner(e) => Some(e),
            _ => None,
        }
    }
}

impl<E> From<KeyedRejected> for KeyedError<E> {
    fn from(r: KeyedRejected) -> Self {
        Self::Rejected(r)
    }
}

/// This level only: the rejection or the call's error is the source.
impl<E> fmt::Display for KeyedError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rejected(_) => "the keyed bulkhead did not admit the call",
            Self::CallTimeout => "call timed out inside the keyed bulkhead",
            Self::Inner(_) => "the guarded call failed",
        })
    }
}

impl<E: std::error::Error + 'static> std::error::Error for KeyedError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected(r) => Some(r),
            Self::CallTimeout => None,
            Self::Inner(e) => Some(e),
        }
    }
}
