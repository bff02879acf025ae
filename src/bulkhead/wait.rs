//! The wait machine: a caller that found no permit free waits in its
//! policy's line until it is granted one or the first of its limits ends
//! the wait: `max_wait`, the latest it can start and still make its
//! deadline, controlled delay's cut on a standing line, or the close of
//! the bulkhead (which the permit source reports). Every bulkhead kind
//! waits through it; where the permits come from is the `acquire` future
//! each passes in.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::delay::LineDelay;
use super::error::{RejectReason, Rejected, nanos};
use super::options::CallOptions;
use super::policy::Policy;
use crate::overload::{HoldEstimate, Verdict};
use crate::timer::{Clock, Deadline, TimerGone};

/// The bit of [`Line::deadline`] that marks a limit of the call's own
/// `max_wait` rather than its deadline's (a nanosecond off either).
const OWN_WAIT: u64 = 1;

/// The clock of a policy that has none (no setting of it needs a timer),
/// for a call that carries a deadline and waits.
static AUTO: Clock = Clock::Auto;

impl Policy {
    /// Whether a wait that starts now is timed on the line's clock and
    /// polled by [`poll_timed`]: it carries a deadline, or the line
    /// has controlled delay.
    #[inline]
    pub(super) fn times(&self, line: &Line) -> bool {
        line.deadline != 0 || self.delay.is_some()
    }

    /// Deadline-aware admission of a call that carries a deadline (in
    /// `line.deadline`, see [`line_for`](Self::line_for)), before it takes
    /// a permit, with `free` permits free now and `waiting` callers served
    /// before it (the whole line, or with priority classes the waiters of
    /// its class and of the more important ones): rejected at once
    /// (`WontMakeDeadline`, counted) if the deadline has passed, or if the
    /// expected wait for a permit plus the expected hold time (the retry
    /// hint's estimate, from the same average) exceeds the time left.
    /// Otherwise `line.deadline` becomes the latest time the call may still
    /// start, `deadline - hold`, or 0 if `max_wait` ends its wait before
    /// that anyway. Before the first timed call no hold time is known: the
    /// call is admitted and may wait until its deadline.
    #[cold]
    pub(crate) fn admit_by_behind(
        &self,
        line: &mut Line,
        free: isize,
        waiting: usize,
    ) -> Result<(), Rejected> {
        let now = self.since_origin(self.line_now());
        let remaining = line.deadline.saturating_sub(now);
        if remaining == 0 {
            return Err(self.reject_now(RejectReason::WontMakeDeadline));
        }
        let estimate = HoldEstimate::from_ns(self.hold_ns.load(Ordering::Relaxed));
        let max_wait = self.max_wait.map(nanos);
        let verdict = estimate.admit(
            remaining,
            waiting,
            usize::try_from(free).unwrap_or(0),
            self.hint_limit.load(Ordering::Relaxed),
            max_wait,
        );
        match verdict {
            Verdict::Reject { .. } => Err(self.reject_now(RejectReason::WontMakeDeadline)),
            Verdict::Admit { budget } => {
                line.deadline = match budget {
                    Some(budget) if budget != max_wait.unwrap_or(u64::MAX) => {
                        now.saturating_add(budget) & !OWN_WAIT
                    }
                    _ => 0,
                };
                Ok(())
            }
        }
    }

    /// The one place a call's [`CallOptions`] are read for its wait: the
    /// line it waits in, or its rejection at once. With a deadline,
    /// deadline-aware admission ([`admit_by_behind`](Self::admit_by_behind),
    /// `free` permits free now and `ahead` waiters served before it); with
    /// a `max_wait` of its own shorter than the policy's, the wait ends
    /// then too, as a timeout. The line's limit is the sooner of the two.
    #[cold]
    pub(crate) fn line_for(
        &self,
        options: &CallOptions,
        free: isize,
        ahead: usize,
    ) -> Result<Line, Rejected> {
        let mut line = Line::default();
        self.judge_into(options, free, ahead, &mut line)?;
        Ok(line)
    }

    /// [`line_for`](Self::line_for) into `line`, a line not yet polled
    /// (the call's future keeps it; nothing is moved). Inline: its callers
    /// are out of line already.
    #[inline]
    pub(crate) fn judge_into(
        &self,
        options: &CallOptions,
        free: isize,
        ahead: usize,
        line: &mut Line,
    ) -> Result<(), Rejected> {
        if let Some(by) = options.deadline_by(|| self.line_now()) {
            line.deadline = self.since_origin(by) & !OWN_WAIT;
            self.admit_by_behind(line, free, ahead)?;
        }
        if let Some(own) = options.own_wait() {
            self.limit_wait(line, own);
        }
        Ok(())
    }

    /// Ends the wait `line` is about to start once it has lasted `own`, as
    /// a [`Timeout`](RejectReason::Timeout), unless `max_wait` or a limit
    /// the line holds already ends it sooner: a call's own `max_wait`, or
    /// what an earlier stage left of a budget.
    #[inline]
    pub(crate) fn limit_wait(&self, line: &mut Line, own: Duration) {
        if self.max_wait.is_none_or(|max| own < max) {
            let end = self
                .since_origin(self.line_now())
                .saturating_add(nanos(own))
                | OWN_WAIT;
            if line.deadline == 0 || end < line.deadline {
                line.deadline = end;
            }
        }
    }

    /// After [`line_for`](Self::line_for): how long from now the call may
    /// still wait, if a limit of its own ends its wait before `max_wait`
    /// does, and the reason it is rejected for then.
    pub(crate) fn wait_budget(&self, line: &Line) -> Option<(Duration, RejectReason)> {
        (line.deadline != 0).then(|| {
            let now = self.since_origin(self.line_now());
            let left = Duration::from_nanos(line.deadline.saturating_sub(now));
            (left, line.end_of_limit())
        })
    }

    /// The waiting part of admission, once no permit was free at once:
    /// fail fast if `max_wait` is zero, else take a place in the bounded
    /// line and wait for `acquire` for at most `max_wait` or the limit of
    /// the call's own that `line` holds (see [`line_for`](Self::line_for)).
    /// Resolves to the permit and the time waited. The timer is armed only
    /// if `acquire` is still pending after its first poll.
    #[inline]
    pub(crate) fn wait_in<A>(
        &self,
        acquire: A,
        line: Line,
    ) -> Wait<'_, A, impl Fn() -> RejectReason> {
        self.wait_or(acquire, line, || RejectReason::Timeout)
    }

    /// [`wait_in`](Self::wait_in), where a wait that runs out of
    /// `max_wait` is rejected for the reason `timed_out` gives then, rather
    /// than always `Timeout`: the Redis bulkhead's is `Unavailable` while
    /// Redis is out of reach.
    #[inline]
    pub(crate) fn wait_or<A, T>(&self, acquire: A, line: Line, timed_out: T) -> Wait<'_, A, T>
    where
        T: Fn() -> RejectReason,
    {
        Wait {
            policy: self,
            acquire,
            deadline: Deadline::new(),
            line,
            timed_out,
        }
    }
}

pin_project! {
    /// The future of [`Policy::wait_in`]: [`Waiting`] with its policy, as its
    /// own fields (see [`Run`]).
    pub(crate) struct Wait<'a, A, T> {
        policy: &'a Policy,
        #[pin]
        acquire: A,
        #[pin]
        deadline: Deadline,
        line: Line,
        // The reason for a wait that ran out of time (see `wait_or`).
        timed_out: T,
    }

    impl<A, T> PinnedDrop for Wait<'_, A, T> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.policy.leave_line(&mut this.line.placed);
        }
    }
}

impl<A, P, T> Future for Wait<'_, A, T>
where
    A: Future<Output = Result<P, RejectReason>>,
    T: Fn() -> RejectReason,
{
    type Output = Result<(P, Waited), Rejected>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Polled {
            acquire: this.acquire,
            deadline: this.deadline,
            line: this.line,
            policy: this.policy,
            timed_out: &*this.timed_out,
        }
        .poll(cx)
    }
}

pin_project! {
    /// The state of a [`Wait`] without the policy it waits under, which
    /// every poll passes in: for a future that owns its bulkhead and so
    /// cannot also hold a borrow of its policy (the tower layer's). If it
    /// is dropped before the wait ended, its owner *must* call
    /// [`leave`](Self::leave) first.
    pub(crate) struct Waiting<A> {
        #[pin]
        acquire: A,
        #[pin]
        deadline: Deadline,
        line: Line,
    }

    impl<A> PinnedDrop for Waiting<A> {
        fn drop(this: Pin<&mut Self>) {
            debug_assert!(
                !this.line.placed || std::thread::panicking(),
                "a wait dropped before it ended must leave the line first"
            );
        }
    }
}

/// Where a wait stands in the policy's line.
#[derive(Default)]
pub(crate) struct Line {
    /// [`Armed::NotStarted`] until the first poll; then
    /// [`Armed::Untimed`] for a wait that only `max_wait` bounds. Any
    /// other: `start` was read on the line's clock ([`Policy::line_now`]),
    /// the wait's limits are more than `max_wait` (a deadline), and
    /// `poll_timed` polls it; then which limit its own sleep (`Deadline`)
    /// is armed for. (One byte for both, as `started` was before: another
    /// field to set costs an instruction on the path of every call.)
    armed: Armed,
    /// Whether this holds a place in the line (`Policy::waiting`): taken
    /// on the first poll, given back when the wait ends, or by the owner
    /// of a wait dropped before that (`Wait`'s drop, `Waiting::leave`).
    placed: bool,
    /// When the wait began, read only if an observer will see it (a clock
    /// reading costs about a tenth of a contended cycle).
    start: Option<Instant>,
    /// With a line timer: the wait's deadline on its clock (0 until the
    /// first pending poll).
    ///
    /// Before that, for a call with a limit of its own, in nanoseconds
    /// since the policy's origin (0: none): a deadline itself until
    /// [`Policy::admit_by_behind`] has looked at it, then the latest time
    /// the call may start and still finish in time, or the end of its own
    /// `max_wait` if sooner (marked by the bit [`OWN_WAIT`]; 0 again if the
    /// policy's `max_wait` ends the wait sooner), which [`poll_timed`]
    /// turns into the wait's own sleep at the first pending poll. One field for both, not two: a `Line` is
    /// built with every call, and another field to clear is another store
    /// on the path of a call admitted at once.
    pub(super) deadline: u64,
}

/// Whether a wait is timed, and what its own sleep is armed for, in
/// [`poll_timed`].
#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Armed {
    /// Not polled yet.
    #[default]
    NotStarted,
    /// Not a timed wait.
    Untimed,
    /// Not yet looked at: the wait has not been pending before.
    None,
    /// No own sleep: the line timer keeps the only limit, or there is none.
    Unneeded,
    /// `max_wait`.
    MaxWait,
    /// The latest start of a call that carries a deadline.
    Until,
    /// The call's own `max_wait`.
    OwnWait,
    /// Controlled delay's target: past it, a waiter is cut if the line
    /// stands (a sleep per waiter only; the line timer keeps the cut).
    Checkpoint,
}

/// How a wait of [`poll_timed`] ran out.
#[derive(Clone, Copy)]
enum End {
    /// `max_wait` passed.
    MaxWait,
    /// The call can no longer make its deadline.
    Until,
    /// The call's own `max_wait` passed.
    OwnWait,
    /// Controlled delay cut it: the line stands, and it has waited the
    /// target.
    Cut,
}

impl Line {
    /// How the wait ended, when the own sleep of [`poll_timed`] fired.
    #[inline]
    fn end(&self) -> End {
        match self.armed {
            Armed::Until => End::Until,
            Armed::OwnWait => End::OwnWait,
            Armed::Checkpoint => End::Cut,
            _ => End::MaxWait,
        }
    }

    /// What the limit in `deadline` (a call's own) ends the wait as.
    fn limit_arm(&self) -> Armed {
        if self.deadline & OWN_WAIT != 0 {
            Armed::OwnWait
        } else {
            Armed::Until
        }
    }

    /// The reason a wait that ran out of the call's own limit is rejected
    /// for.
    fn end_of_limit(&self) -> RejectReason {
        match self.limit_arm() {
            Armed::OwnWait => RejectReason::Timeout,
            _ => RejectReason::WontMakeDeadline,
        }
    }

    /// Gives the place in `policy`'s line back, if this still holds one
    /// (a wait dropped before it ended).
    #[inline]
    pub(crate) fn leave(&mut self, policy: &Policy) {
        policy.leave_line(&mut self.placed);
    }
}

/// A permit granted after waiting: how long the caller waited (measured
/// only when an observer will see it), and when the grant was, if this
/// call's hold time is to be measured (the same clock reading).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waited {
    pub(crate) waited: Duration,
    pub(crate) since: Option<Instant>,
}

impl<A> Waiting<A> {
    /// A wait for `acquire` (see [`Policy::wait_in`]); nothing happens until
    /// it is first polled.
    #[inline]
    pub(crate) fn new(acquire: A) -> Self {
        Self {
            acquire,
            deadline: Deadline::new(),
            line: Line::default(),
        }
    }

    /// [`new`](Self::new) from `line`: a call with a limit of its own, as
    /// [`Policy::line_for`] left it.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn in_line(acquire: A, line: Line) -> Self {
        Self {
            acquire,
            deadline: Deadline::new(),
            line,
        }
    }

    /// Gives the place in `policy`'s line back, if this still holds one.
    /// Call it before dropping a wait that may not have ended.
    #[inline]
    pub(crate) fn leave(self: Pin<&mut Self>, policy: &Policy) {
        policy.leave_line(&mut self.project().line.placed);
    }

    /// Polls the wait under `policy`, which must be the same at every poll
    /// (and at [`leave`](Self::leave)).
    #[inline]
    pub(crate) fn poll_with<P>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        policy: &Policy,
    ) -> Poll<Result<(P, Waited), Rejected>>
    where
        A: Future<Output = Result<P, RejectReason>>,
    {
        let this = self.project();
        poll_wait(this.acquire, this.deadline, this.line, policy, cx)
    }
}

/// Polls a wait in line that is rejected `Timeout` when `max_wait` runs
/// out (see [`Polled::poll`]): for [`Waiting`] and `Bulkhead::call`'s
/// future. `acquire` is polled first; `deadline` is armed for `max_wait`
/// only once it is pending.
#[inline]
pub(crate) fn poll_wait<A, P>(
    acquire: Pin<&mut A>,
    deadline: Pin<&mut Deadline>,
    line: &mut Line,
    policy: &Policy,
    cx: &mut Context<'_>,
) -> Poll<Result<(P, Waited), Rejected>>
where
    A: Future<Output = Result<P, RejectReason>>,
{
    Polled {
        acquire,
        deadline,
        line,
        policy,
        timed_out: &|| RejectReason::Timeout,
    }
    .poll(cx)
}

/// A wait's parts, borrowed for one poll: the permit source, the wait's
/// own sleep, its place in the line, the policy it waits under, and the
/// reason for a wait that ran out of `max_wait` (see [`Policy::wait_or`]).
struct Polled<'a, A, T> {
    acquire: Pin<&'a mut A>,
    deadline: Pin<&'a mut Deadline>,
    line: &'a mut Line,
    policy: &'a Policy,
    timed_out: &'a T,
}

impl<A, P, T> Polled<'_, A, T>
where
    A: Future<Output = Result<P, RejectReason>>,
    T: Fn() -> RejectReason,
{
    /// The body of [`poll_wait`] and of [`Wait`].
    #[inline]
    fn poll(self, cx: &mut Context<'_>) -> Poll<Result<(P, Waited), Rejected>> {
        let Self {
            acquire,
            deadline,
            line,
            policy,
            timed_out,
        } = self;
        if line.armed == Armed::NotStarted {
            if policy.fails_fast() {
                return Poll::Ready(Err(policy.reject_now(RejectReason::Full)));
            }
            let ahead = policy.join_line(&mut line.placed);
            line.armed = Armed::Untimed;
            if policy.max_queue.is_some_and(|max| ahead >= max) {
                policy.leave_line(&mut line.placed);
                return Poll::Ready(Err(policy.reject_now(RejectReason::Full)));
            }
            if policy.times(line) {
                line.armed = Armed::None;
                line.start = policy.start_timed();
                return poll_timed(acquire, deadline, line, policy, cx, timed_out);
            }
            line.start = policy.observed().then(|| policy.line_now());
        } else if line.armed != Armed::Untimed {
            return poll_timed(acquire, deadline, line, policy, cx, timed_out);
        }
        let start = line.start;
        let reason = match acquire.poll(cx) {
            Poll::Ready(Ok(permit)) => {
                policy.leave_line(&mut line.placed);
                // One clock reading for both, and only if someone needs it: a
                // granted waiter found no permit free.
                let since = policy.clock_in(true);
                let waited = match (start, since) {
                    (Some(start), Some(now)) => now - start,
                    _ => Duration::ZERO,
                };
                return Poll::Ready(Ok((permit, Waited { waited, since })));
            }
            Poll::Ready(Err(reason)) => reason,
            Poll::Pending => {
                let Some(limit) = policy.max_wait else {
                    return Poll::Pending;
                };
                if let Some(timer) = &policy.line_timer {
                    return match timer.expired(&mut line.deadline, limit) {
                        Ok(false) => Poll::Pending,
                        Ok(true) => {
                            policy.leave_line(&mut line.placed);
                            let waited = start.map_or(limit, |_| policy.waited_since(start));
                            Poll::Ready(Err(policy.reject(timed_out(), waited)))
                        }
                        Err(_gone) => {
                            policy.leave_line(&mut line.placed);
                            let waited = policy.waited_since(start);
                            Poll::Ready(Err(policy.reject_timer_gone(waited)))
                        }
                    };
                }
                match deadline.poll_at(policy.clock.as_ref(), limit, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(())) => {
                        policy.leave_line(&mut line.placed);
                        // The timer's own measure, unless it was read.
                        let waited = start.map_or(limit, |_| policy.waited_since(start));
                        return Poll::Ready(Err(policy.reject(timed_out(), waited)));
                    }
                    Poll::Ready(Err(_gone)) => {
                        policy.leave_line(&mut line.placed);
                        let waited = policy.waited_since(start);
                        return Poll::Ready(Err(policy.reject_timer_gone(waited)));
                    }
                }
            }
        };
        policy.leave_line(&mut line.placed);
        let waited = policy.waited_since(start);
        Poll::Ready(Err(policy.reject(reason, waited)))
    }
}

/// [`Polled::poll`] for a wait whose limits are more than `max_wait` (see
/// [`Line::armed`]): a call that carries a deadline, and waits at most
/// until it could still finish in time; a line under controlled delay,
/// where a waiter is cut once it has waited the target on a standing
/// line. With the line timer, that keeps `max_wait` and the cut (the
/// line's deadlines stay in arrival order) and the wait's own sleep is
/// armed for the deadline's limit; else the own sleep is armed for
/// whichever limit comes first. Out of line, so that the untimed wait's
/// code (and the fast path that `Bulkhead::call` inlines with it) stays
/// as it was; and with the parts one by one rather than as a [`Polled`],
/// which would have to be stored in memory for the call on that path too.
#[inline(never)]
fn poll_timed<A, P>(
    acquire: Pin<&mut A>,
    deadline: Pin<&mut Deadline>,
    line: &mut Line,
    policy: &Policy,
    cx: &mut Context<'_>,
    timed_out: &impl Fn() -> RejectReason,
) -> Poll<Result<(P, Waited), Rejected>>
where
    A: Future<Output = Result<P, RejectReason>>,
{
    if let Some(waited) = policy.cut_now(line.start) {
        // Before the acquire is polled: a permit handed to it already
        // goes back (its owner cancels it) to the next waiter.
        policy.leave_line(&mut line.placed);
        return Poll::Ready(Err(policy.reject(RejectReason::QueueDelay, waited)));
    }
    let reason = match acquire.poll(cx) {
        Poll::Ready(Ok(permit)) => {
            policy.leave_line(&mut line.placed);
            let since = policy.clock_in(true);
            let waited = policy.timed_wait_ended(line.start, true);
            return Poll::Ready(Ok((permit, Waited { waited, since })));
        }
        Poll::Ready(Err(reason)) => reason,
        Poll::Pending => {
            let end = match timed_limits(deadline, line, policy, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(end) => end,
            };
            policy.leave_line(&mut line.placed);
            // Only a wait out of `max_wait` is a sample of the line: a
            // deadline is the caller's patience, and a cut one waited the
            // target.
            let waited = policy.timed_wait_ended(line.start, matches!(end, Ok(End::MaxWait)));
            return Poll::Ready(Err(match end {
                Ok(End::MaxWait) => policy.reject(timed_out(), waited),
                Ok(End::Until) => policy.reject(RejectReason::WontMakeDeadline, waited),
                Ok(End::OwnWait) => policy.reject(timed_out(), waited),
                Ok(End::Cut) => policy.reject(RejectReason::QueueDelay, waited),
                Err(_gone) => policy.reject_timer_gone(waited),
            }));
        }
    };
    policy.leave_line(&mut line.placed);
    let waited = policy.waited_since(line.start);
    Poll::Ready(Err(policy.reject(reason, waited)))
}

/// Whether a timed wait has run out of one of its limits (see
/// [`poll_timed`]).
fn timed_limits(
    mut deadline: Pin<&mut Deadline>,
    line: &mut Line,
    policy: &Policy,
    cx: &mut Context<'_>,
) -> Poll<Result<End, TimerGone>> {
    let clock = policy.clock.as_ref().unwrap_or(&AUTO);
    let now = policy.line_now();
    let waited = line
        .start
        .map_or(Duration::ZERO, |start| now.saturating_duration_since(start));
    // Controlled delay: while the line stands, a waiter that has waited
    // the target is cut (one woken to look, or past its checkpoint).
    let cut = policy.delay.as_deref().and_then(LineDelay::cut);
    if cut.is_some_and(|target| waited >= target) {
        return Poll::Ready(Ok(End::Cut));
    }
    // What is left until the call can no longer make its deadline; the
    // line timer takes `line.deadline` for itself at the first look.
    let until = match (line.armed, &policy.line_timer) {
        (Armed::None, _) | (_, None) if line.deadline != 0 => Some(Duration::from_nanos(
            line.deadline.saturating_sub(policy.since_origin(now)),
        )),
        _ => None,
    };
    let own = line.limit_arm();
    if until == Some(Duration::ZERO) {
        return Poll::Ready(Ok(if own == Armed::OwnWait {
            End::OwnWait
        } else {
            End::Until
        }));
    }
    let mut arm = line.armed == Armed::None;
    if !arm && line.armed != Armed::Unneeded {
        match deadline.as_mut().poll_at(Some(clock), Duration::ZERO, cx) {
            Poll::Pending => {}
            Poll::Ready(Err(gone)) => return Poll::Ready(Err(gone)),
            Poll::Ready(Ok(())) if line.armed == Armed::Checkpoint && cut.is_none() => {
                // The target passed with the line not standing: sleep on
                // for what is left of the other limits.
                deadline.set(Deadline::new());
                arm = true;
            }
            Poll::Ready(Ok(())) => return Poll::Ready(Ok(line.end())),
        }
    }
    if arm {
        let checkpoint = match (&policy.delay, &policy.line_timer, line.armed) {
            (Some(delay), None, Armed::None) => Some(delay.target().saturating_sub(waited)),
            _ => None,
        };
        // With the line timer, it keeps `max_wait` and the cut; the own
        // sleep, only the deadline's limit.
        let max_left = match policy.line_timer {
            Some(_) => None,
            None => policy.max_wait.map(|max| max.saturating_sub(waited)),
        };
        if policy.line_timer.is_some() {
            line.deadline = 0;
        }
        let soonest = [
            checkpoint.map(|d| (d, Armed::Checkpoint)),
            until.map(|d| (d, own)),
            max_left.map(|d| (d, Armed::MaxWait)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|&(d, _)| d);
        match soonest {
            Some((limit, armed)) => {
                line.armed = armed;
                // Armed here, for `limit` from now.
                if let Poll::Ready(fired) = deadline.as_mut().poll_at(Some(clock), limit, cx) {
                    if armed != Armed::Checkpoint || fired.is_err() {
                        return Poll::Ready(fired.map(|()| line.end()));
                    }
                    // A checkpoint already past, on a line that does not
                    // stand: look again at the next poll.
                    cx.waker().wake_by_ref();
                }
            }
            None => line.armed = Armed::Unneeded,
        }
    }
    if let Some(timer) = &policy.line_timer {
        let max = policy.max_wait.unwrap_or(Duration::MAX);
        return match timer.expired_by(&mut line.deadline, max, cut) {
            Err(gone) => Poll::Ready(Err(gone)),
            Ok(true) if cut.is_some_and(|target| target < max) => Poll::Ready(Ok(End::Cut)),
            Ok(true) => Poll::Ready(Ok(End::MaxWait)),
            Ok(false) => Poll::Pending,
        };
    }
    Poll::Pending
}
