//! The bulkhead's errors: why a call was not admitted, what went wrong with
//! an admitted call, and what is wrong with a configuration.

use core::fmt;
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
/// assert_eq!(rejected.to_string(), "bulkhead gpu is full");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    reason: RejectReason,
    /// `Unavailable` because the timer cannot run, not the permit store.
    timer_gone: bool,
    /// Nanoseconds, saturating (8 bytes where a `Duration` takes 16).
    waited_ns: u64,
    name: Name,
    hint: Hint,
}

/// What [`Rejected::retry_after`] is computed from, when asked: the
/// division is left out of the rejection path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hint {
    /// The average hold time (0: none known).
    pub(crate) hold_ns: u64,
    /// The callers waiting, plus this one.
    pub(crate) ahead: u32,
    /// The limit (at least 1).
    pub(crate) limit: u32,
}

impl Hint {
    /// No estimate.
    pub(crate) const NONE: Hint = Hint {
        hold_ns: 0,
        ahead: 1,
        limit: 1,
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
            hint,
        }
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
        let Hint {
            hold_ns,
            ahead,
            limit,
        } = self.hint;
        if hold_ns == 0 || !self.reason.row().hint {
            return None;
        }
        let ns = hold_ns
            .saturating_mul(u64::from(ahead))
            .div_ceil(u64::from(limit.max(1)));
        Some(Duration::from_nanos(ns))
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.timer_gone {
            return write!(
                f,
                "bulkhead {} cannot keep its time limits: its timer is not running",
                self.name
            );
        }
        let row = self.reason.row();
        write!(f, "bulkhead {} {}", self.name, row.says)?;
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

impl std::error::Error for Rejected {}

/// The error of [`Bulkhead::call`](crate::Bulkhead::call): the call was
/// rejected, ran out of time, or failed on its own.
///
/// As the Rust API guidelines ask, `Display` says only what happened at
/// this level ("the bulkhead did not admit the call", "the guarded call
/// failed") and the error it holds, the [`Rejected`] or the call's own, is
/// its [`source`](std::error::Error::source), not repeated in the message.
/// Match the variant, or print the whole chain (`{:#}` with `anyhow`), to
/// see why.
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
///     Err(BulkheadError::CallTimeout) => println!("took too long"),
///     Err(BulkheadError::Inner(e)) => assert_eq!(e, "declined"),
///     Err(other) => println!("{other}"),
/// }
/// # });
/// ```
///
/// The cause is the source:
///
/// ```
/// use std::error::Error;
/// use watertight::{Bulkhead, BulkheadError};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder().name("ledger").max_concurrent_calls(1).build().unwrap();
/// bh.close();
/// let err = bh.call(async { Ok::<(), std::io::Error>(()) }).await.unwrap_err();
/// assert_eq!(err.to_string(), "the bulkhead did not admit the call");
/// assert_eq!(err.source().unwrap().to_string(), "bulkhead ledger is closed");
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkheadError<E> {
    /// The bulkhead did not admit the call; the guarded future never ran.
    Rejected(Rejected),
    /// The call was admitted but did not finish within `call_timeout`; it
    /// was dropped and its permit released.
    CallTimeout,
    /// The guarded call ran and returned this error.
    Inner(E),
    /// The permit was a lease from a shared store (the Redis bulkhead's)
    /// that was lost while the call ran: the call was dropped unfinished,
    /// since another process may hold the permit now. The reason is the
    /// [`source`](std::error::Error::source).
    LeaseLost(crate::LostReason),
}

impl<E> BulkheadError<E> {
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
    /// assert_eq!(BulkheadError::<()>::CallTimeout.rejected(), None);
    /// # });
    /// ```
    pub fn rejected(&self) -> Option<&Rejected> {
        match self {
            Self::Rejected(r) => Some(r),
            _ => None,
        }
    }

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
    /// assert_eq!(BulkheadError::<&str>::CallTimeout.into_inner(), None);
    /// # });
    /// ```
    pub fn into_inner(self) -> Option<E> {
        match self {
            Self::Inner(e) => Some(e),
            _ => None,
        }
    }
}

impl<E> From<Rejected> for BulkheadError<E> {
    fn from(r: Rejected) -> Self {
        Self::Rejected(r)
    }
}

/// This level only: the rejection or the call's error is the source.
impl<E> fmt::Display for BulkheadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rejected(_) => "the bulkhead did not admit the call",
            Self::CallTimeout => "call timed out inside the bulkhead",
            Self::Inner(_) => "the guarded call failed",
            Self::LeaseLost(_) => "the call's lease was lost, the call was dropped",
        })
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BulkheadError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected(r) => Some(r),
            Self::CallTimeout => None,
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
