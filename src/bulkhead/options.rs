//! What one call asks of a bulkhead beyond a permit: [`CallOptions`].

use core::fmt;
use std::time::{Duration, Instant};

/// What one call asks of the bulkhead that admits it, beyond a permit: a
/// deadline, a shorter wait than the bulkhead's `max_wait`, a priority
/// class. Every bulkhead kind takes the same value (`call_with`,
/// `acquire_with`, `try_acquire_with`, and the tower layer builds one per
/// request); `CallOptions::new()` asks for nothing, and is what
/// `call(f)` means.
///
/// Each option is read where the wait is decided, the same way by every
/// kind:
///
/// - [`deadline`](Self::deadline): deadline-aware admission. The call is
///   rejected at once ([`RejectReason::WontMakeDeadline`]) if the deadline
///   has passed, or if the wait it can expect plus the time a call holds
///   its permit (the averages behind [`Rejected::retry_after`]) does not
///   fit in the time left; otherwise it waits at most until the deadline
///   minus that hold time.
/// - [`within`](Self::within): the same, with the deadline given as a
///   time budget that starts when the bulkhead first judges the call.
/// - [`max_wait`](Self::max_wait): this call waits at most this long, if
///   that is sooner than the bulkhead's own `max_wait` (which it cannot
///   lengthen); run out, it is rejected as
///   [`Timeout`](crate::RejectReason::Timeout), as `max_wait` would.
/// - [`class`](Self::class): the priority class of the call on a bulkhead
///   with [`priorities`](crate::BulkheadBuilder::priorities) (0 is the most
///   important; a class past the last is the least important one). On a
///   bulkhead without classes it changes nothing.
///
/// Whichever of the call's limits, the bulkhead's `max_wait`, controlled
/// delay or `close` comes first ends the wait.
///
/// The deadline is read on the bulkhead's clock: inside a tokio runtime
/// with the default timer, tokio's (so take it from
/// `tokio::time::Instant::now().into_std()` under a paused test clock, or
/// give a budget, which starts on that clock), else the system's. Both estimates are averages, so a call admitted near
/// its deadline may still miss it: pass an earlier deadline for a margin.
/// Until a call's hold time has been measured, every call that has time
/// left is admitted. A call without options pays nothing for them.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::{Bulkhead, BulkheadError, CallOptions, RejectReason};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder().max_concurrent_calls(4).priorities(&[3, 1]).build().unwrap();
/// let checkout = CallOptions::new()
///     .class(0)
///     .deadline(Instant::now() + Duration::from_secs(2))
///     .max_wait(Duration::from_millis(100));
/// assert_eq!(bh.call_with(checkout, async { Ok::<_, ()>(7) }).await, Ok(7));
///
/// let too_late = CallOptions::new().deadline(Instant::now() - Duration::from_millis(1));
/// match bh.call_with(too_late, async { Ok::<_, ()>(8) }).await {
///     Err(BulkheadError::Rejected(r)) => assert_eq!(r.reason(), RejectReason::WontMakeDeadline),
///     other => panic!("{other:?}"),
/// }
/// # });
/// ```
///
/// [`RejectReason::WontMakeDeadline`]: crate::RejectReason::WontMakeDeadline
/// [`Rejected::retry_after`]: crate::Rejected::retry_after
/// [`RejectReason`]: crate::RejectReason
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallOptions {
    due: Due,
    // In nanoseconds, `NONE` for none (a longer wait is none either way):
    // a call's future keeps its options, so they are kept small.
    max_wait: u64,
    // `NONE as u32` for none; a class past `u32::MAX - 1` is the least
    // important one all the same.
    class: u32,
}

/// When a call must be done, if it must (16 bytes: the budget leaves the
/// instant's nanoseconds field, where the tag lives, alone).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Due {
    None,
    At(Instant),
    /// A budget in nanoseconds, from when the bulkhead first judges the
    /// call, on its clock.
    Within(u64),
}

/// No `max_wait`, no class (see [`CallOptions`]'s fields).
const NONE: u64 = u64::MAX;

impl CallOptions {
    /// No options: the call as [`Bulkhead::call`](crate::Bulkhead::call)
    /// makes it.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            due: Due::None,
            max_wait: NONE,
            class: NONE as u32,
        }
    }

    /// The call must be done by `by`: deadline-aware admission (see
    /// above). Replaces a [`within`](Self::within) budget given before.
    #[must_use]
    pub const fn deadline(mut self, by: Instant) -> Self {
        self.due = Due::At(by);
        self
    }

    /// The call must be done within `budget`: a deadline given as a time
    /// budget, which is what most callers hold (a request's timeout, what
    /// is left of a caller's budget). It starts when the bulkhead first
    /// judges the call (the first poll of `call_with` or `acquire_with`,
    /// `try_acquire_with`, or the tower layer's admission of the request)
    /// and is measured on the bulkhead's clock, tokio's paused clock
    /// included. Replaces a [`deadline`](Self::deadline) given before.
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, CallOptions, RejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let budget = CallOptions::new().within(Duration::from_secs(1));
    /// assert_eq!(bh.call_with(budget, async { Ok::<_, ()>(7) }).await, Ok(7));
    /// let spent = CallOptions::new().within(Duration::ZERO);
    /// let late = bh.try_acquire_with(spent).unwrap_err();
    /// assert_eq!(late.reason(), RejectReason::WontMakeDeadline);
    /// # });
    /// ```
    #[must_use]
    pub const fn within(mut self, budget: Duration) -> Self {
        self.due = Due::Within(saturating_nanos(budget));
        self
    }

    /// The call waits for a permit at most `max_wait`, if that is sooner
    /// than the bulkhead's own `max_wait`; `Duration::ZERO` takes a permit
    /// only if one is free at once.
    #[must_use]
    pub const fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = saturating_nanos(max_wait);
        self
    }

    /// The call's priority class (0 is the most important).
    #[must_use]
    pub const fn class(mut self, class: usize) -> Self {
        let most = NONE as u32 - 1;
        self.class = if class < most as usize {
            class as u32
        } else {
            most
        };
        self
    }

    /// Whether the call has a deadline (an instant or a budget).
    #[inline]
    pub(crate) fn has_deadline(&self) -> bool {
        self.due != Due::None
    }

    /// The call's deadline, a budget counted from `now` (read only for a
    /// budget).
    #[inline]
    pub(crate) fn deadline_by(&self, now: impl FnOnce() -> Instant) -> Option<Instant> {
        match self.due {
            Due::None => None,
            Due::At(by) => Some(by),
            // `NONE`, or past what an `Instant` holds: no deadline.
            Due::Within(NONE) => None,
            Due::Within(budget) => now().checked_add(Duration::from_nanos(budget)),
        }
    }

    /// These options with a budget turned into a deadline from `now`: for
    /// a kind that judges a call more than once (the keyed bulkhead's two
    /// stages, the Redis bulkhead before and after it asks Redis), so that
    /// the budget starts once.
    #[must_use]
    #[inline]
    pub(crate) fn started(self, now: impl FnOnce() -> Instant) -> Self {
        match self.due {
            Due::Within(_) => Self {
                due: match self.deadline_by(now) {
                    Some(by) => Due::At(by),
                    None => Due::None,
                },
                ..self
            },
            _ => self,
        }
    }

    /// Whether the deadline is a budget not started yet.
    #[inline]
    pub(crate) fn has_budget(&self) -> bool {
        matches!(self.due, Due::Within(_))
    }

    /// The call's own `max_wait`, if it has one.
    #[inline]
    pub(crate) fn own_wait(&self) -> Option<Duration> {
        (self.max_wait != NONE).then(|| Duration::from_nanos(self.max_wait))
    }

    /// The class the call names, if any.
    #[inline]
    pub(crate) fn class_named(&self) -> Option<usize> {
        (self.class != NONE as u32).then_some(self.class as usize)
    }

    /// Whether the call may wait at all: not with a `max_wait` of zero.
    #[inline]
    pub(crate) fn may_wait(&self) -> bool {
        self.max_wait != 0
    }

    /// The budget of this call's waits under a bulkhead's `max_wait`: the
    /// sooner of the two.
    #[inline]
    pub(crate) fn budget(&self, max_wait: Option<Duration>) -> Option<Duration> {
        match (self.own_wait(), max_wait) {
            (Some(own), Some(max)) => Some(own.min(max)),
            (own, max) => own.or(max),
        }
    }

    /// These options once `spent` of the call's own `max_wait` has passed.
    /// These options for a wait that may last at most `left` (the rest of
    /// a budget an earlier stage began): their own `max_wait` becomes
    /// `left` if that is shorter.
    #[inline]
    pub(crate) fn waiting_at_most(self, left: Duration) -> Self {
        Self {
            max_wait: self.max_wait.min(saturating_nanos(left)),
            ..self
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn spent(self, spent: Duration) -> Self {
        Self {
            max_wait: match self.own_wait() {
                Some(own) => own.saturating_sub(spent).as_nanos() as u64,
                None => NONE,
            },
            ..self
        }
    }

    /// Whether the call waits under the bulkhead's limits alone: no
    /// deadline, no wait of its own.
    #[inline]
    pub(crate) fn waits_plainly(&self) -> bool {
        !self.has_deadline() && self.max_wait == NONE
    }
}

/// `d` in nanoseconds, `NONE` if it is that long or longer.
const fn saturating_nanos(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    if nanos < NONE as u128 {
        nanos as u64
    } else {
        NONE
    }
}

impl Default for CallOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CallOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallOptions")
            .field(
                "deadline",
                &match self.due {
                    Due::At(by) => Some(by),
                    _ => None,
                },
            )
            .field(
                "within",
                &match self.due {
                    Due::Within(budget) if budget != NONE => Some(Duration::from_nanos(budget)),
                    _ => None,
                },
            )
            .field("max_wait", &self.own_wait())
            .field("class", &self.class_named())
            .finish()
    }
}
