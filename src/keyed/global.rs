//! The second stage of a keyed call: the global bulkhead's decision
//! without waiting, the wait in its line within what is left of the
//! call's budget (and until the keyed bulkhead closes), the hold and the
//! seat of a call that goes on to run, and how a global rejection is
//! counted for the caller's key, on every path, unwinding included.

use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::entry::Entry;
use super::fair::TurnIf;
use super::{Counters, Inner, KeyedRejectReason, KeyedRejected, bump};
use crate::bulkhead::Shared;
use crate::bulkhead::guard::{Guard, Source};
use crate::bulkhead::permit::SeatHeld;
use crate::bulkhead::wait::Line;
use crate::bulkhead::{Bulkhead, CallOptions, RejectReason, Rejected};
use crate::futures::Acquire;

impl<K, S> Inner<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The budget of a call's waits as its global stage begins (`own`:
    /// the options of a call that has some), if it has one: the keyed
    /// bulkhead's `max_wait`, or the call's own if shorter, less the wait
    /// for its key (from `start`, if it waited there).
    #[inline]
    pub(super) fn budget(
        &self,
        own: Option<&CallOptions>,
        start: Option<Instant>,
    ) -> Option<Budget> {
        let whole = match own {
            None => self.max_wait,
            Some(options) => options.budget(self.max_wait),
        }?;
        let left = match start {
            Some(start) => whole.saturating_sub(self.since(start)),
            None => whole,
        };
        Some(Budget { whole, left })
    }

    /// The second stage without waiting: `Ok` if it is decided at once (a
    /// global permit, or a rejection), `Err` with what to wait with if the
    /// caller is to wait ([`wait_global`](Self::wait_global)). The caller
    /// waited for its key from `start` (if it did) within `budget`, and
    /// holds its key's permit meanwhile. `now` is the global bulkhead's
    /// decision without waiting, as [`Now`] asks it (`Err`: the caller is
    /// to wait, never so for [`Now::Take`]).
    #[inline(always)]
    pub(super) fn global_now<P, W>(
        &self,
        entry: &Entry,
        start: Option<Instant>,
        budget: Option<Budget>,
        now: impl FnOnce(Now) -> Result<Result<P, Rejected>, W>,
    ) -> Result<Result<P, KeyedRejected>, W> {
        let waited = || start.map_or(Duration::ZERO, |start| self.since(start));
        let spent = match budget {
            Some(budget) if budget.whole.is_zero() => Some(false),
            Some(budget) if budget.left.is_zero() => Some(true),
            _ => None,
        };
        let unwinding = GlobalStage::new(self.global.as_ref(), entry, &self.counters);
        // Fair shares: while callers wait for their turn, a free seat is
        // one of theirs.
        let queue = self.fair_busy();
        let Some(spent) = spent else {
            // Two calls, each with a constant: `now` inlines with it folded.
            let decided = match queue {
                true => now(Now::Queue),
                false => now(Now::Wait),
            };
            unwinding.passed();
            return decided
                .map(|decided| decided.map_err(|r| self.global_rejected(entry, r, waited())));
        };
        // Fail fast, or the key's wait used the whole budget: a free
        // global permit is still taken (unless it is for others).
        let decided = match (queue, self.global.as_ref()) {
            (true, Some(global)) => Ok(Err(global.reject_now(RejectReason::Full))),
            _ => now(Now::Take),
        };
        unwinding.passed();
        let Ok(decided) = decided else {
            unreachable!("without waiting, admission is decided at once");
        };
        Ok(decided.map_err(|r| {
            let rejected = self.global_rejected(entry, r, waited());
            if spent {
                rejected.budget_spent()
            } else {
                rejected
            }
        }))
    }

    /// The gate before the global line: the caller's turn with fair
    /// shares, open at once without.
    #[inline]
    pub(super) fn turn<'s>(&'s self, entry: &Entry) -> TurnIf<'s> {
        TurnIf(match (self.fair.as_deref(), self.global.as_ref()) {
            (Some(fair), Some(global)) => Some(fair.turn(global, entry)),
            _ => None,
        })
    }

    /// Waits for a global permit, after [`global_now`](Self::global_now)
    /// said `None`: `wait` is the global bulkhead's wait in line, whose
    /// own `max_wait` is what is left of the call's budget, until we close
    /// (see [`GlobalWait`]).
    #[inline]
    pub(super) fn wait_global<'s, W>(
        &'s self,
        entry: &'s Entry,
        start: Option<Instant>,
        wait: W,
    ) -> GlobalWait<'s, K, S, W> {
        GlobalWait {
            inner: self,
            entry,
            wait,
            closing: self.closing.acquire(),
            waiting: None,
            begun: start,
        }
    }

    /// The global stage of [`KeyedBulkhead::call_with`](super::KeyedBulkhead::call_with) for a caller
    /// without a class (`plain`: without options; `own`, the options of a
    /// call that has some), holding its key's permit: decided at once
    /// (`Ok`), or the line of its wait (`Err`), whose own `max_wait` is
    /// what is left of its budget (read only then: a call admitted at once
    /// reads no clock for it).
    #[inline(always)]
    pub(super) fn hold_global<'s>(
        &'s self,
        entry: &Entry,
        start: Option<Instant>,
        own: Option<&CallOptions>,
        plain: bool,
        global: &'s Bulkhead,
    ) -> Result<Result<SeatHeld<&'s Shared>, KeyedRejected>, Line> {
        let options = own.copied().unwrap_or_default();
        let now = |now| {
            let mut line = Line::default();
            let decided = match (now, plain) {
                (Now::Queue, true) => None,
                (Now::Queue, false) => match global.judge(&options) {
                    Ok(judged) => {
                        line = judged;
                        None
                    }
                    Err(rejected) => Some(Err(rejected)),
                },
                (now, true) => global.hold_now(now == Now::Wait),
                (now, false) => global.hold_now_with(&options, &mut line, now == Now::Wait),
            };
            decided.ok_or(line)
        };
        let budget = self.budget(own, start);
        self.global_now(entry, start, budget, now)
            .map_err(|mut line| {
                if let Some(budget) = budget {
                    global.limit_wait(&mut line, budget.left);
                }
                line
            })
    }

    /// The global stage of [`KeyedBulkhead::call_with`](super::KeyedBulkhead::call_with) for a caller of
    /// priority `class` on a global bulkhead with classes, holding its
    /// key's permit: decided at once (`Ok`), or its wait in its class's
    /// line (`Err`), within what is left of its budget. (Fair shares need
    /// the global limit the keyed bulkhead makes, which has no classes:
    /// nobody waits for a turn.)
    #[cold]
    // The wait is returned once and moved into the one that awaits it in
    // place: boxing it would allocate.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(super) fn seat_global<'s>(
        &'s self,
        entry: &Entry,
        start: Option<Instant>,
        own: Option<&CallOptions>,
        global: &'s Bulkhead,
        class: usize,
    ) -> Result<
        Result<SeatHeld<&'s Shared>, KeyedRejected>,
        impl Future<Output = Result<SeatHeld<&'s Shared>, Rejected>> + use<'s, K, S>,
    > {
        let budget = self.budget(own, start);
        // What is left of the budget is the wait's own `max_wait`, which
        // the class's line reads with the call's options.
        let options = own.copied().unwrap_or_default();
        let options = match budget {
            Some(budget) => options.waiting_at_most(budget.left),
            None => options,
        };
        let now = |now| match global.seat_now(class, &options, now != Now::Take) {
            Ok(Ok(held)) => Ok(Ok(held)),
            Ok(Err(wait)) => Err(wait),
            Err(rejected) => Ok(Err(rejected)),
        };
        self.global_now(entry, start, budget, now)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn global_rejected(
        &self,
        entry: &Entry,
        rejected: Rejected,
        waited: Duration,
    ) -> KeyedRejected {
        count_global_rejection(entry, &self.counters, rejected.reason());
        KeyedRejected::from_bulkhead(
            rejected,
            true,
            waited,
            self.interned,
            self.registry.max_keys(),
        )
    }

    /// The wait for a global permit ended because we were closed.
    /// Counted for the key, and by the global bulkhead as its own
    /// rejection (the caller waited in its line).
    #[cold]
    #[inline(never)]
    pub(super) fn closed_in_global_line(&self, entry: &Entry, waited: Duration) -> KeyedRejected {
        let reason = KeyedRejectReason::Closed;
        if let Some(by) = reason.bulkhead_reason() {
            count_global_rejection(entry, &self.counters, by);
            if let Some(global) = &self.global {
                let _ = global.reject_waited(by, waited);
            }
        }
        KeyedRejected::new(
            reason,
            waited,
            self.interned,
            self.registry.max_keys(),
            None,
        )
    }
}

/// Counts, for `entry`'s key and in `counters`, a rejection by the global
/// bulkhead (which counted it itself).
pub(super) fn count_global_rejection(entry: &Entry, counters: &Counters, reason: RejectReason) {
    bump(&entry.rejected_global[reason.index()]);
    bump(&counters.rejected_global);
}

/// Armed around each step of the global stage that may reject (a
/// decision without waiting, a poll of the wait): if the global bulkhead
/// rejects and one of its observers panics, the panic unwinds past
/// [`global_rejected`](Inner::global_rejected), which would count the
/// rejection for the caller's key; dropped while unwinding, this counts
/// it instead, with the reason the global bulkhead noted
/// ([`Bulkhead::take_unwinding_rejection`]). Forgotten when the step
/// returns ([`passed`](Self::passed)), so that on the fast path it costs
/// no more than keeping its fields where the unwinding path finds them.
pub(super) struct GlobalStage<'a> {
    global: Option<&'a Bulkhead>,
    entry: &'a Entry,
    counters: &'a Counters,
}

impl<'a> GlobalStage<'a> {
    #[inline(always)]
    pub(super) fn new(
        global: Option<&'a Bulkhead>,
        entry: &'a Entry,
        counters: &'a Counters,
    ) -> Self {
        Self {
            global,
            entry,
            counters,
        }
    }

    /// The step returned (a permit, a rejection counted by the caller, or
    /// a wait): nothing to count here.
    #[inline(always)]
    pub(super) fn passed(self) {
        core::mem::forget(self);
    }
}

impl Drop for GlobalStage<'_> {
    /// Only while unwinding (the step did not return).
    #[cold]
    fn drop(&mut self) {
        let Some(global) = self.global else { return };
        if let Some(reason) = global.take_unwinding_rejection() {
            count_global_rejection(self.entry, self.counters, reason);
        }
    }
}

/// What [`Inner::global_now`] asks of the global bulkhead.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Now {
    /// A free permit, else `None` (the caller is to wait), or a rejection.
    Wait,
    /// A free permit, else a rejection: the caller may not wait.
    Take,
    /// No permit (fair shares: others wait for their turn): a rejection
    /// at once (a deadline the caller cannot make), else `None`.
    Queue,
}

pin_project! {
    /// The wait for a global permit ([`Inner::wait_global`]): the global
    /// bulkhead's wait in line (`wait`), which keeps every limit of its
    /// own, and the listener for `close` (a waiter on `closing`), in one
    /// future written by hand so that each is kept once and inline. The
    /// key's gauge of waiters counts the caller once the wait is pending.
    pub(super) struct GlobalWait<'a, K, S, W> {
        inner: &'a Inner<K, S>,
        entry: &'a Entry,
        #[pin]
        wait: W,
        #[pin]
        closing: Acquire<'a>,
        waiting: Option<Counted<'a>>,
        // When the caller began to wait: for its key, if it did, else just
        // before the global line's first poll.
        begun: Option<Instant>,
    }
}

impl<K, S, W, P> Future for GlobalWait<'_, K, S, W>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
    W: Future<Output = Result<P, Rejected>>,
{
    type Output = Result<P, KeyedRejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (inner, entry) = (*this.inner, *this.entry);
        let waited = |begun: Option<Instant>| begun.map_or(Duration::ZERO, |b| inner.since(b));
        // Read before the global line's first poll, which starts the global
        // bulkhead's own measure of the wait: the caller's covers it.
        let fresh = this.waiting.is_none() && this.begun.is_none();
        if fresh {
            *this.begun = Some(inner.now());
        }
        let unwinding = GlobalStage::new(inner.global.as_ref(), entry, &inner.counters);
        let polled = this.wait.poll(cx);
        unwinding.passed();
        if let Poll::Ready(acquired) = polled {
            // Decided at its first poll: the caller did not wait here.
            let begun = if fresh { None } else { *this.begun };
            return Poll::Ready(
                acquired.map_err(|r| inner.global_rejected(entry, r, waited(begun))),
            );
        }
        this.waiting
            .get_or_insert_with(|| Counted::new(&entry.waiting_global));
        // `close` sets the flag, then closes `closing`, which wakes every
        // waiter on it and fails every later poll.
        match this.closing.poll(cx) {
            Poll::Ready(_) => {
                Poll::Ready(Err(inner.closed_in_global_line(entry, waited(*this.begun))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A call's wait budget as its global stage begins (see
/// [`Inner::budget`]).
#[derive(Clone, Copy)]
pub(super) struct Budget {
    /// The whole budget, for both stages.
    whole: Duration,
    /// What the wait for the key left of it.
    pub(super) left: Duration,
}

impl Budget {
    /// No wait in either stage: a try.
    pub(super) const NO_WAIT: Budget = Budget {
        whole: Duration::ZERO,
        left: Duration::ZERO,
    };
}

/// Counts a caller in a gauge until dropped.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    pub(super) fn new(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How the global stage ended, for the key's entry and permit: admitted
/// by both stages ([`admitted`]), or turned away by the global one
/// ([`refused`]). The one place every way through the stages settles it.
#[inline(always)]
pub(super) fn global_stage_ended<P, S: Source>(
    entry: &Entry,
    key_permit: &mut Guard<S>,
    global: Result<P, KeyedRejected>,
) -> Result<P, KeyedRejected> {
    let permit = global.map_err(refused(key_permit))?;
    admitted(entry, key_permit);
    Ok(permit)
}

/// Both stages admitted the call: counted on the key, and reported by
/// the key's bulkhead as its admission.
#[inline(always)]
pub(super) fn admitted<S: Source>(entry: &Entry, key_permit: &mut Guard<S>) {
    bump(&entry.admitted);
    key_permit.report_admitted();
}

/// The global stage turned the call away: the key's permit, whose call
/// never ran, goes back unreported, and the key's bulkhead reports a
/// rejection for the global stage's reason.
pub(super) fn refused<S: Source>(
    key_permit: &mut Guard<S>,
) -> impl FnOnce(KeyedRejected) -> KeyedRejected {
    move |rejected| {
        let reason = rejected.reason().bulkhead_reason();
        key_permit.report_refused(reason.unwrap_or(RejectReason::Unavailable));
        rejected
    }
}
