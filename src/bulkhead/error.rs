//! The bulkhead's errors: why a call was not admitted, what went wrong with
//! an admitted call, and what is wrong with a configuration.

use core::fmt;
use core::num::NonZeroU32;
use std::error::Error;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::name::Name;
pub use super::reason::RejectReason;

/// A call the bulkhead did not admit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::{Bulkhead, RejectReason};
///
/// let bh = Bulkhead::builder()
///     .name("gpu")
///     .max_concurrent_calls(1)
///     .max_wait(Duration::ZERO) // fail fast
///     .build()
///     .unwrap();
/// let _held = bh.try_acquire().unwrap();
/// let rejected = bh.try_acquire().unwrap_err();
/// assert_eq!(rejected.reason(), RejectReason::Full);
/// assert_eq!(rejected.name(), "gpu");
/// assert_eq!(rejected.to_string(), r#"bulkhead "gpu" is full"#);
/// ```
///
/// `Debug` shows what a log of it needs: the bulkhead, the reason, the
/// wait and the retry hint.
///
/// ```
/// # use std::time::Duration;
/// # use watertight::Bulkhead;
/// # let bh = Bulkhead::builder().name("gpu").max_concurrent_calls(1)
/// #     .max_wait(Duration::ZERO).build().unwrap();
/// # let _held = bh.try_acquire().unwrap();
/// let rejected = bh.try_acquire().unwrap_err();
/// assert_eq!(
///     format!("{rejected:?}"),
///     r#"Rejected { bulkhead: "gpu", reason: Full, waited: 0ns, retry_after: None }"#
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Rejected {
    reason: RejectReason,
    /// `Unavailable` because the timer cannot run, not the permit store.
    timer_gone: bool,
    /// Nanoseconds, saturating (8 bytes where a `Duration` takes 16).
    waited_ns: u64,
    name: Name,
    detail: Detail,
}

/// A rejection's retry hint, or the error that made it `Unavailable` (which
/// has no hint): 16 bytes either way, the tag kept in the hint's limit,
/// which is never zero.
#[derive(Clone, PartialEq, Eq)]
enum Detail {
    Hint(Hint),
    // Only a distributed bulkhead's rejections carry a cause.
    #[cfg_attr(
        not(any(
            all(feature = "redis", any(feature = "tokio", feature = "smol")),
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    Cause(Cause),
}

/// The error behind a rejection, shared by its clones: behind one pointer
/// (8 bytes), so that a rejection without one stays as small as before.
#[derive(Clone)]
struct Cause(Arc<Box<dyn Error + Send + Sync>>);

/// Two rejections are equal only with the same cause (the same error, not
/// an equal one: errors seldom compare).
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cause {}

// A rejection stays unwind safe with a cause: the cause is never changed
// through it, so a panic cannot leave one half-updated where a caller that
// catches the panic would see it.
impl UnwindSafe for Cause {}
impl RefUnwindSafe for Cause {}

/// What [`Rejected::retry_after`] is computed from, when asked: the
/// division is left out of the rejection path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hint {
    /// The average hold time (0: none known).
    pub(crate) hold_ns: u64,
    /// The callers waiting, plus this one.
    pub(crate) ahead: u32,
    /// The limit.
    pub(crate) limit: NonZeroU32,
}

impl Hint {
    /// No estimate.
    pub(crate) const NONE: Hint = Hint {
        hold_ns: 0,
        ahead: 1,
        limit: NonZeroU32::MIN,
    };
}

/// A time waited in nanoseconds, saturating (as [`Rejected`] keeps it).
#[inline]
pub(crate) fn nanos(waited: Duration) -> u64 {
    u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX)
}

impl Rejected {
    /// A rejection after `waited_ns` nanoseconds of waiting (see
    /// [`nanos`]). `timer_gone`: `Unavailable` because the timer that
    /// bounds waiting or the call cannot run (its tokio runtime is gone),
    /// said so in `Display`.
    #[inline]
    pub(crate) fn new(
        reason: RejectReason,
        timer_gone: bool,
        waited_ns: u64,
        name: Name,
        hint: Hint,
    ) -> Self {
        Self {
            reason,
            timer_gone,
            waited_ns,
            name,
            detail: Detail::Hint(hint),
        }
    }

    /// This rejection with `cause` as its [`source`](Error::source): the
    /// error of the permit store that made it
    /// [`Unavailable`](RejectReason::Unavailable).
    #[cold]
    #[cfg_attr(
        not(any(
            all(feature = "redis", any(feature = "tokio", feature = "smol")),
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    pub(crate) fn caused_by(mut self, cause: impl Error + Send + Sync + 'static) -> Self {
        self.detail = Detail::Cause(Cause(Arc::new(Box::new(cause))));
        self
    }

    /// Why the call was turned away.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// bh.close();
    /// assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Closed);
    /// ```
    pub fn reason(&self) -> RejectReason {
        self.reason
    }

    /// How long the caller waited before it was turned away: zero when it
    /// was rejected at once, `max_wait` (as the timer measured it) for a
    /// timeout. A wait that ended otherwise (the bulkhead closed while the
    /// caller waited) is measured only when an observer is installed, since
    /// that costs a clock reading per wait; without one it reads zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// assert!(bh.acquire().await.unwrap_err().waited() >= Duration::from_millis(20));
    /// assert_eq!(bh.try_acquire().unwrap_err().waited(), Duration::ZERO);
    /// # });
    /// ```
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns)
    }

    /// The name of the bulkhead that rejected the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("ledger").max_concurrent_calls(1).build().unwrap();
    /// let _held = bh.try_acquire().unwrap();
    /// assert_eq!(bh.try_acquire().unwrap_err().name(), "ledger");
    /// ```
    pub fn name(&self) -> &str {
        self.name
    }

    /// When trying again is likely to find a free permit: an estimate from
    /// the bulkhead's recent hold times (an average over a sample of
    /// calls), the callers already waiting and the limit, as
    /// `hold × (waiting + 1) / limit`. Use it for an HTTP `Retry-After` or
    /// a client's back-off. `None` for [`RejectReason::Closed`] and
    /// [`RejectReason::Unavailable`], and before any call has finished.
    /// For [`RejectReason::WontMakeDeadline`] it says when the line is
    /// likely to have room, not whether a later deadline would be met.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder()
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::ZERO)
    ///     .build()
    ///     .unwrap();
    /// let held = bh.try_acquire().unwrap();
    /// // No call has finished yet: nothing to estimate from.
    /// assert_eq!(bh.try_acquire().unwrap_err().retry_after(), None);
    /// drop(held);
    /// for _ in 0..16 {
    ///     let p = bh.try_acquire().unwrap();
    ///     std::thread::sleep(Duration::from_millis(1));
    ///     drop(p);
    /// }
    /// let _held = bh.try_acquire().unwrap();
    /// let hint = bh.try_acquire().unwrap_err().retry_after().unwrap();
    /// assert!(hint > Duration::ZERO);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        let Detail::Hint(Hint {
            hold_ns,
            ahead,
            limit,
        }) = self.detail
        else {
            return None;
        };
        if hold_ns == 0 || !self.reason.row().hint {
            return None;
        }
        let ns = hold_ns
            .saturating_mul(u64::from(ahead))
            .div_ceil(u64::from(limit.get()));
        Some(Duration::from_nanos(ns))
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up and
    /// at least 1: the value of an HTTP `Retry-After` header (which counts
    /// whole seconds, so a hint under a second would otherwise read 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).max_wait(Duration::ZERO).build().unwrap();
    /// for _ in 0..16 {
    ///     // Hold times to estimate from, of about a millisecond.
    ///     let p = bh.try_acquire().unwrap();
    ///     std::thread::sleep(Duration::from_millis(1));
    ///     drop(p);
    /// }
    /// let _held = bh.try_acquire().unwrap();
    /// let rejected = bh.try_acquire().unwrap_err();
    /// assert!(rejected.retry_after().unwrap() < Duration::from_secs(1));
    /// assert_eq!(rejected.retry_after_secs(), Some(1));
    /// ```
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(|d| {
            let whole = d.as_secs();
            let secs = if d.subsec_nanos() > 0 {
                whole + 1
            } else {
                whole
            };
            secs.max(1)
        })
    }
}

impl fmt::Debug for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Rejected");
        d.field("bulkhead", &self.name())
            .field("reason", &self.reason)
            .field("waited", &self.waited())
            .field("retry_after", &self.retry_after());
        if let Detail::Cause(Cause(cause)) = &self.detail {
            d.field("cause", cause);
        }
        d.finish()
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.timer_gone {
            return write!(
                f,
                "bulkhead {:?} cannot keep its time limits: its timer is not running",
                self.name()
            );
        }
        let row = self.reason.row();
        write!(f, "bulkhead {:?} {}", self.name(), row.says)?;
        if row.shows_wait {
            // Whole milliseconds: the timer's jitter below that is noise.
            write!(
                f,
                " {:?}",
                Duration::from_millis(self.waited_ns / 1_000_000)
            )?;
        }
        Ok(())
    }
}

/// The source is the permit store's error behind an `Unavailable`, when
/// it gave one (the Redis bulkhead's
/// `LeaseError`, whose own source is the Redis error); none for the other
/// reasons.
impl Error for Rejected {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.detail {
            Detail::Cause(Cause(cause)) => Some(&***cause),
            Detail::Hint(_) => None,
        }
    }
}

/// An admitted call that ran past its bulkhead's `call_timeout`: it was
/// dropped and its permit released. Whether the downstream did the work is
/// unknown: the request may have been sent before the time ran out.
///
/// It is [`BulkheadError::CallTimeout`] and
/// [`KeyedError::CallTimeout`](crate::keyed::KeyedError::CallTimeout), and
/// the error of a `BulkheadService` (feature `tower`) downcasts to it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::{Bulkhead, BulkheadError};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder()
///     .name("upstream")
///     .max_concurrent_calls(1)
///     .call_timeout(Duration::from_millis(30))
///     .build()
///     .unwrap();
/// let err = bh.call(std::future::pending::<Result<(), ()>>()).await.unwrap_err();
/// let BulkheadError::CallTimeout(timed_out) = &err else { panic!("{err}") };
/// assert_eq!(timed_out.bulkhead_name(), "upstream");
/// assert_eq!(timed_out.timeout(), Duration::from_millis(30));
/// assert_eq!(err.to_string(), r#"call in bulkhead "upstream" timed out after 30ms"#);
/// # });
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct CallTimeout {
    name: Name,
    /// Nanoseconds, saturating (see [`nanos`]).
    timeout_ns: u64,
}

impl CallTimeout {
    #[cold]
    pub(crate) fn new(name: Name, timeout: Duration) -> Self {
        Self {
            name,
            timeout_ns: nanos(timeout),
        }
    }

    /// The name of the bulkhead whose `call_timeout` ran out.
    pub fn bulkhead_name(&self) -> &str {
        self.name
    }

    /// The `call_timeout` that ran out.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns)
    }
}

impl fmt::Debug for CallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTimeout")
            .field("bulkhead", &self.bulkhead_name())
            .field("timeout", &self.timeout())
            .finish()
    }
}

impl fmt::Display for CallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "call in bulkhead {:?} timed out after {:?}",
            self.bulkhead_name(),
            self.timeout()
        )
    }
}

impl std::error::Error for CallTimeout {}

/// The error of [`Bulkhead::call`](crate::Bulkhead::call): the call was
/// rejected, ran out of time, or failed on its own.
///
/// `Display` names the bulkhead and says what happened, so that
/// `e.to_string()` in a log or a response is enough: a rejection and a
/// call timeout display as themselves (`bulkhead "ledger" is closed`,
/// `call in bulkhead "ledger" timed out after 300ms`). The call's own
/// error, and the reason a lease was lost, are the
/// [`source`](std::error::Error::source), not repeated in the message (as
/// the Rust API guidelines ask): print the whole chain (`{:#}` with
/// `anyhow`) to see them. [`reason`](Self::reason) and
/// [`retry_after`](Self::retry_after) are one call away.
///
/// More variants may be added: a `match` needs a `_` arm.
///
/// # Examples
///
/// ```
/// use watertight::{Bulkhead, BulkheadError};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
/// match bh.call(async { Err::<u32, _>("declined") }).await {
///     Ok(n) => println!("got {n}"),
///     Err(BulkheadError::Rejected(r)) => println!("not admitted: {r}"),
///     Err(BulkheadError::CallTimeout(t)) => println!("took more than {:?}", t.timeout()),
///     Err(BulkheadError::Inner(e)) => assert_eq!(e, "declined"),
///     Err(other) => println!("{other}"),
/// }
/// # });
/// ```
///
/// What happened is the message; the call's own error is the source:
///
/// ```
/// use std::error::Error;
/// use watertight::{Bulkhead, RejectReason};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder().name("ledger").max_concurrent_calls(1).build().unwrap();
/// let failed = bh.call(async { Err::<(), _>(std::io::Error::other("disk full")) });
/// let err = failed.await.unwrap_err();
/// assert_eq!(err.to_string(), "the call guarded by a bulkhead failed");
/// assert_eq!(err.source().unwrap().to_string(), "disk full");
///
/// bh.close();
/// let err = bh.call(async { Ok::<(), std::io::Error>(()) }).await.unwrap_err();
/// assert_eq!(err.to_string(), r#"bulkhead "ledger" is closed"#);
/// assert_eq!(err.reason(), Some(RejectReason::Closed));
/// assert!(err.source().is_none());
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkheadError<E> {
    /// The bulkhead did not admit the call; the guarded future never ran.
    Rejected(Rejected),
    /// The call was admitted but did not finish within `call_timeout`; it
    /// was dropped and its permit released.
    CallTimeout(CallTimeout),
    /// The guarded call ran and returned this error.
    Inner(E),
    /// The permit was a lease from a shared store (the Redis bulkhead's)
    /// that was lost while the call ran: the call was dropped unfinished,
    /// since another process may hold the permit now. The reason is the
    /// [`source`](std::error::Error::source).
    LeaseLost(crate::LostReason),
}

/// The accessors and the `From` every call error has, written once for
/// [`BulkheadError`] and [`KeyedError`](crate::keyed::KeyedError): its
/// rejection, its call's own error, the rejection's reason and retry hint.
/// The docs of `rejected` and `into_inner` come first, each ended by `;`.
macro_rules! call_error_accessors {
    (
        $error:ident, $rejected:ident, $reason:ident;
        $(#[$rejected_doc:meta])* ;
        $(#[$inner_doc:meta])* ;
    ) => {
        impl<E> $error<E> {
            $(#[$rejected_doc])*
            pub fn rejected(&self) -> Option<&$rejected> {
                match self {
                    Self::Rejected(r) => Some(r),
                    _ => None,
                }
            }

            $(#[$inner_doc])*
            pub fn into_inner(self) -> Option<E> {
                match self {
                    Self::Inner(e) => Some(e),
                    _ => None,
                }
            }

            #[doc = concat!("Why the call was not admitted, if it was not (see [`", stringify!($rejected), "::reason`]).")]
            pub fn reason(&self) -> Option<$reason> {
                self.rejected().map($rejected::reason)
            }

            #[doc = concat!("When trying again is likely to succeed, if the call was not admitted and the bulkhead that said no has an estimate (see [`", stringify!($rejected), "::retry_after`]).")]
            pub fn retry_after(&self) -> Option<Duration> {
                self.rejected().and_then($rejected::retry_after)
            }
        }

        impl<E> From<$rejected> for $error<E> {
            fn from(r: $rejected) -> Self {
                Self::Rejected(r)
            }
        }
    };
}
pub(crate) use call_error_accessors;

call_error_accessors! {
    BulkheadError, Rejected, RejectReason;
    /// The rejection, if the call was not admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BulkheadError, RejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// bh.close();
    /// let err = bh.call(async { Ok::<(), ()>(()) }).await.unwrap_err();
    /// assert_eq!(err.rejected().map(|r| r.reason()), Some(RejectReason::Closed));
    /// assert_eq!(BulkheadError::<()>::Inner(()).rejected(), None);
    /// # });
    /// ```
    ;
    /// The call's own error, if it ran and failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BulkheadError};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let err = bh.call(async { Err::<(), _>("no such invoice") }).await.unwrap_err();
    /// assert_eq!(err.into_inner(), Some("no such invoice"));
    /// bh.close();
    /// let closed = bh.call(async { Err::<(), _>("no such invoice") }).await.unwrap_err();
    /// assert_eq!(closed.into_inner(), None);
    /// # });
    /// ```
    ;
}

/// A rejection and a call timeout display as themselves; the call's error
/// and a lost lease's reason are the source.
impl<E> fmt::Display for BulkheadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected(r) => fmt::Display::fmt(r, f),
            Self::CallTimeout(t) => fmt::Display::fmt(t, f),
            Self::Inner(_) => f.write_str("the call guarded by a bulkhead failed"),
            Self::LeaseLost(_) => f.write_str("the call's lease was lost, the call was dropped"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BulkheadError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected(r) => r.source(),
            Self::CallTimeout(t) => t.source(),
            Self::Inner(e) => Some(e),
            Self::LeaseLost(reason) => Some(reason),
        }
    }
}

/// A configuration that [`BulkheadBuilder::build`](crate::BulkheadBuilder::build)
/// refused.
///
/// # Examples
///
/// ```
/// use watertight::{Bulkhead, BuildErrorKind};
///
/// let err = Bulkhead::builder().max_concurrent_calls(0).build().unwrap_err();
/// assert_eq!(err.kind(), BuildErrorKind::ZeroLimit);
/// println!("bad configuration: {err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    kind: BuildErrorKind,
}

/// What is wrong with a bulkhead configuration.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::{Bulkhead, BuildErrorKind};
///
/// let err = Bulkhead::builder()
///     .max_concurrent_calls(1)
///     .call_timeout(Duration::ZERO)
///     .build()
///     .unwrap_err();
/// assert_eq!(err.kind(), BuildErrorKind::ZeroCallTimeout);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildErrorKind {
    /// `max_concurrent_calls` was not set.
    MissingLimit,
    /// `max_concurrent_calls` was zero: nothing could ever be admitted.
    ZeroLimit,
    /// `max_concurrent_calls` exceeds [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    LimitTooLarge,
    /// The name is empty.
    EmptyName,
    /// `call_timeout` was zero: every call would time out.
    ZeroCallTimeout,
    /// `leak_threshold` was zero: every permit would be reported.
    ZeroLeakThreshold,
    /// `queue_delay`'s target was zero: every waiter would be cut once
    /// the line stood.
    ZeroQueueDelayTarget,
    /// The target of `queue_delay` is at or above `max_wait` (or the
    /// bulkhead fails fast): every wait ends before it could be cut, so
    /// controlled delay would never act.
    QueueDelayTargetNotBelowMaxWait,
    /// `priorities` was given no class, or only shares of zero: no class
    /// would be guaranteed a seat, and the split is undefined.
    NoPriorityShare,
    /// A leased bulkhead's `priority_classes` was zero: a caller would have
    /// no class to wait in.
    NoPriorityClass,
    /// `adaptive_lifo` was set without `queue_delay`: nothing would say
    /// when the line stands, which is when it serves the newest first.
    AdaptiveLifoWithoutQueueDelay,
    /// `adaptive_lifo` was set on an unfair bulkhead (`fair(false)`), which
    /// hands freed permits to no waiter, so has no order to change.
    AdaptiveLifoUnfair,
    /// A keyed bulkhead's `max_keys` was zero: no key could ever be served.
    ZeroMaxKeys,
    /// A keyed bulkhead's `fair_shares` (or `key_weight`) was set without
    /// `global_limit`: fair shares divide the global limit the keyed
    /// bulkhead makes (not one shared with `global`, whose other callers
    /// the rotation cannot see).
    FairSharesWithoutGlobalLimit,
    /// A non-zero `max_wait` or a `call_timeout` needs a timer, and none is
    /// available: no timer was given, and no runtime feature (`tokio`,
    /// `async-io`) or the default `thread-timer` feature is enabled.
    NoTimer,
    /// The timer cannot make a sleep here: the tokio runtime the bulkhead
    /// is built in (or the one its `TokioTimer` runs on) has no time
    /// driver. Enable it (`enable_time` or `enable_all` on the runtime
    /// builder) or pass another timer.
    TimerUnavailable,
}

impl BuildError {
    pub(crate) fn new(kind: BuildErrorKind) -> Self {
        Self { kind }
    }

    /// What is wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BuildErrorKind};
    ///
    /// let err = Bulkhead::builder().build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::MissingLimit);
    /// ```
    pub fn kind(&self) -> BuildErrorKind {
        self.kind
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            BuildErrorKind::MissingLimit => "max_concurrent_calls must be set",
            BuildErrorKind::ZeroLimit => "max_concurrent_calls must be at least 1",
            BuildErrorKind::LimitTooLarge => {
                "max_concurrent_calls must not exceed Semaphore::MAX_PERMITS"
            }
            BuildErrorKind::EmptyName => "the bulkhead name must not be empty",
            BuildErrorKind::ZeroCallTimeout => "call_timeout must be greater than zero",
            BuildErrorKind::ZeroLeakThreshold => "leak_threshold must be greater than zero",
            BuildErrorKind::ZeroQueueDelayTarget => {
                "the target of queue_delay must be greater than zero"
            }
            BuildErrorKind::QueueDelayTargetNotBelowMaxWait => {
                "the target of queue_delay must be below max_wait"
            }
            BuildErrorKind::NoPriorityShare => {
                "priorities needs at least one class with a share greater than zero"
            }
            BuildErrorKind::NoPriorityClass => "priority_classes must be at least 1",
            BuildErrorKind::AdaptiveLifoWithoutQueueDelay => {
                "adaptive_lifo needs queue_delay, which finds when the line stands"
            }
            BuildErrorKind::AdaptiveLifoUnfair => {
                "adaptive_lifo needs a fair bulkhead: an unfair one hands permits to no waiter"
            }
            BuildErrorKind::ZeroMaxKeys => "max_keys must be at least 1",
            BuildErrorKind::FairSharesWithoutGlobalLimit => {
                "fair_shares needs a global_limit (not a shared global bulkhead)"
            }
            BuildErrorKind::NoTimer => {
                "max_wait or call_timeout needs a timer: pass one with .timer(..) or enable the \
                 `tokio`, `async-io` or `thread-timer` feature"
            }
            BuildErrorKind::TimerUnavailable => {
                "the timer cannot run: the tokio runtime has no time driver (call `enable_time` \
                 on its builder, or pass another timer with .timer(..))"
            }
        })
    }
}

impl std::error::Error for BuildError {}
#[cfg(test)]
mod tests {
    use super::{BulkheadError, Hint, RejectReason, Rejected};
    use crate::bulkhead::name::intern;
    use core::num::NonZeroU32;
    use std::error::Error;
    use std::io;

    /// A rejection with a cause: the cause is its source, shown by `Debug`
    /// and not by `Display`, shared by its clones; it has no retry hint.
    #[test]
    fn a_cause_is_the_source() {
        let hint = Hint {
            hold_ns: 1_000_000,
            ahead: 1,
            limit: NonZeroU32::MIN,
        };
        let plain = Rejected::new(RejectReason::Unavailable, false, 0, intern("db"), hint);
        assert!(plain.source().is_none());
        let caused = plain.clone().caused_by(io::Error::other("refused"));
        assert_eq!(caused.source().unwrap().to_string(), "refused");
        assert_eq!(caused.to_string(), plain.to_string());
        assert!(
            format!("{caused:?}").ends_with(r#"cause: Custom { kind: Other, error: "refused" } }"#),
            "{caused:?}"
        );
        assert_eq!(caused.retry_after(), None);
        assert_eq!(caused.clone(), caused);
        assert_ne!(caused, plain);
        let again = plain.caused_by(io::Error::other("refused"));
        assert_ne!(again, caused, "equal only with the same cause");
    }

    /// A rejection is returned by value on every refused call: its cause
    /// shares the retry hint's room, so carrying one costs no size.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_rejection_is_five_words_and_unwind_safe() {
        assert_eq!(size_of::<Rejected>(), 40);
        fn auto<T: Send + Sync + Unpin + std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
        auto::<Rejected>();
        assert_eq!(size_of::<BulkheadError<()>>(), 40);
    }
}
