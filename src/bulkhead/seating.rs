//! A caller of a priority class waiting in its class's line (see
//! `classes.rs`), for at most `max_wait`.

use core::future::Future;
use core::ops::Deref;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::options::CallOptions;

use pin_project_lite::pin_project;

use super::Shared;
use super::classes::{Admit, GaveUp, NONE, Sample, wake};
use super::error::{RejectReason, Rejected};
use super::permit::{Admitted, BulkheadPermit};
use super::wait::Waited;
use crate::timer::{Clock, Deadline};

/// The clock of a bulkhead that has no timer setting, for a classed wait
/// bounded by a deadline only.
static AUTO_CLOCK: Clock = Clock::Auto;

/// How a classed caller was admitted, or that it must wait.
// Returned once and awaited in place: boxing the wait would allocate.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Seat<S: Deref<Target = Shared>> {
    /// A seat, taken at once.
    Now,
    /// Waiting in line: await it.
    Wait(Seating<S>),
}

impl Shared {
    /// The classes, for a bulkhead that has them.
    #[inline]
    pub(crate) fn classes_on(&self) -> &super::classes::Classes {
        self.classes
            .as_deref()
            .expect("only a bulkhead with priority classes has classed seats")
    }

    /// The class a caller that names `class` belongs to: the one rule for
    /// every entry point (`call_with` and its siblings, the tower layer's
    /// `priority_from`). A class past the last is the least important one,
    /// so that a class read from a request can never make the service
    /// panic; without classes every caller is of class 0.
    #[inline]
    pub(crate) fn class_of(&self, class: usize) -> usize {
        self.classes.as_deref().map_or(0, |c| class.min(c.least()))
    }

    /// A classed caller of `class` takes a seat now, joins its class's
    /// line (`may_wait`, and the policy does not fail fast), or is
    /// rejected. A waiter it displaced is woken here, with no lock held.
    /// With `until`, the wait ends then too, rejected for the reason it
    /// gives (a call's own limit: see `Policy::line_for`).
    pub(crate) fn seat<S: Deref<Target = Shared>>(
        this: S,
        class: usize,
        may_wait: bool,
        until: Option<(Duration, RejectReason)>,
    ) -> Result<Seat<S>, Rejected> {
        let policy = &this.policy;
        let may_wait = may_wait && !policy.fails_fast();
        let (admit, displaced) = this.classes_on().admit(class, may_wait, policy);
        let seat = match admit {
            Admit::Seat => Seat::Now,
            Admit::Rejected(reason) => return Err(policy.reject_now(reason)),
            Admit::Queued(slot) => {
                let start = policy.line_now();
                Seat::Wait(Seating {
                    shared: this,
                    slot,
                    class,
                    start,
                    until,
                    armed: Arm::None,
                    deadline: Deadline::new(),
                    kept: None,
                })
            }
        };
        // Woken once the newcomer's wait owns its slot: if the displaced
        // waiter's waker panics, dropping the wait takes it out of line.
        if let Some(waker) = displaced {
            wake(waker);
        }
        Ok(seat)
    }

    /// [`seat`](Self::seat) for a caller with `options`, which are read
    /// first: a deadline's expected wait counts only the waiters served
    /// before it (those of its class and of the more important ones), and
    /// the limit of a wait of its own (a deadline's, its own `max_wait`)
    /// bounds the wait in its class's line.
    pub(crate) fn seat_with<S: Deref<Target = Shared>>(
        this: S,
        class: usize,
        options: &CallOptions,
        may_wait: bool,
    ) -> Result<Seat<S>, Rejected> {
        let mut until = None;
        if !options.waits_plainly() {
            let (ahead, free) = this.classes_on().ahead_of(class);
            let free = isize::try_from(free).unwrap_or(isize::MAX);
            let line = this.policy.line_for(options, free, ahead)?;
            until = this.policy.wait_budget(&line);
        }
        Shared::seat(this, class, may_wait && options.may_wait(), until)
    }

    /// A plain call's seat comes back: with priority classes, it is of the
    /// least important class.
    #[cold]
    #[inline(never)]
    pub(crate) fn give_plain_seat_back(&self) {
        self.give_seat_back(self.classes_on().least());
    }

    /// A seat of `class` comes back: to the waiter it is owed to, if any.
    #[inline(never)]
    pub(crate) fn give_seat_back(&self, class: usize) {
        let (wake, idle) = self.classes_on().release(class, &self.policy);
        if idle {
            self.became_idle();
        }
        if let Some(waker) = wake {
            self::wake(waker);
        }
    }
}

pin_project! {
    /// A classed caller's wait in line: resolves once it is handed a seat
    /// (owned by the caller from then on: wrap it in a guard at once), or
    /// is displaced, closed out or out of `max_wait`, rejected (counted
    /// and reported).
    ///
    /// Dropping it leaves the line; a seat handed to it meanwhile goes to
    /// the next waiter it is owed to, and a displacement it had not seen
    /// yet is counted then.
    ///
    /// A poll that wakes another waiter (the next one to look at a
    /// standing line) whose waker panics resumes that panic once its own
    /// verdict is settled, and keeps the verdict: the next poll returns
    /// it, and dropping the wait gives back a seat it had been handed.
    pub(crate) struct Seating<S: Deref<Target = Shared>> {
        shared: S,
        // Its slot in the classes' line; `NONE` once it has its verdict.
        slot: u32,
        class: usize,
        start: Instant,
        // A call's own limit (its deadline's latest start or its own
        // `max_wait`), if it ends the wait before `max_wait`, and the
        // reason it ends it for.
        until: Option<(Duration, RejectReason)>,
        // What `deadline` is armed for.
        armed: Arm,
        // The soonest of `max_wait`, `until` and (with controlled delay)
        // the target, armed at the first poll that finds no seat yet; at
        // the target, re-armed for what is left of the others.
        #[pin]
        deadline: Deadline,
        // The verdict of a poll that a waker's panic interrupted (see
        // above), until it is returned or the wait dropped.
        kept: Option<Result<Waited, Rejected>>,
    }

    impl<S: Deref<Target = Shared>> PinnedDrop for Seating<S> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let shared = &**this.shared;
            if let Some(Ok(_)) = this.kept.take() {
                // A seat it was handed, never returned.
                shared.give_seat_back(*this.class);
                return;
            }
            if *this.slot == NONE {
                return;
            }
            let dropped = shared.classes_on().drop_waiter(*this.slot, &shared.policy);
            *this.slot = NONE;
            if dropped.idle {
                shared.became_idle();
            }
            if let Some(waker) = dropped.wake {
                wake(waker);
            }
            if dropped.displaced {
                let waited = shared.policy.line_now().saturating_duration_since(*this.start);
                shared.policy.reject(RejectReason::Displaced, waited);
            }
        }
    }
}

/// What a classed wait's own sleep is armed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    /// Not yet (no poll has found it waiting).
    None,
    /// Controlled delay's target: there, a waiter on a standing line is
    /// cut, and one on a line that does not stand sleeps on.
    Target,
    /// `max_wait`.
    MaxWait,
    /// The call's own limit (`until`).
    Until,
    /// Nothing: the wait has no limit left.
    Unneeded,
}

impl<S: Deref<Target = Shared>> Future for Seating<S> {
    type Output = Result<Waited, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(kept) = this.kept.take() {
            return Poll::Ready(kept);
        }
        let shared = &**this.shared;
        let policy = &shared.policy;
        assert!(*this.slot != NONE, "a classed wait polled after it ended");
        let classes = shared.classes_on();
        // With controlled delay, every look reads the clock: the wait is
        // a sample if served, and is cut past the target if the line stands.
        let target = classes.target();
        let now = target.map(|_| policy.line_now());
        let sample = now.map(|now| Sample {
            now: policy.since_origin(now),
            waited: crate::bulkhead::error::nanos(now.saturating_duration_since(*this.start)),
        });
        let (polled, wake) = classes.poll(*this.slot, cx, sample, policy);
        let verdict = match polled {
            Poll::Ready(verdict) => verdict,
            Poll::Pending => {
                debug_assert!(wake.is_none(), "a waiter still waiting woke another");
                // A deadline's limit needs a timer even where `max_wait` does
                // not: the bulkhead's clock, as for a plain call's.
                let clock = policy.clock().or(Some(&AUTO_CLOCK));
                let fired = match *this.armed {
                    Arm::None => {
                        let waited =
                            sample.map_or(Duration::ZERO, |s| Duration::from_nanos(s.waited));
                        let limits = [
                            target.map(|t| (t, Arm::Target)),
                            policy.max_wait().map(|m| (m, Arm::MaxWait)),
                            this.until.map(|(u, _)| (u, Arm::Until)),
                        ];
                        let Some((limit, arm)) = soonest(limits, waited) else {
                            *this.armed = Arm::Unneeded;
                            return Poll::Pending;
                        };
                        *this.armed = arm;
                        ready!(this.deadline.as_mut().poll_at(clock, limit, cx))
                    }
                    Arm::Unneeded => return Poll::Pending,
                    _ => ready!(this.deadline.as_mut().poll_at(clock, Duration::ZERO, cx)),
                };
                let arm = *this.armed;
                if arm == Arm::Target && fired.is_ok() {
                    // At the target, on a line that does not stand (or it
                    // would have been cut above): sleep on for what is left
                    // of the other limits, if any.
                    this.deadline.set(Deadline::new());
                    let waited = policy.line_now().saturating_duration_since(*this.start);
                    let limits = [
                        None,
                        policy.max_wait().map(|m| (m, Arm::MaxWait)),
                        this.until.map(|(u, _)| (u, Arm::Until)),
                    ];
                    let Some((limit, next)) = soonest(limits, waited) else {
                        *this.armed = Arm::Unneeded;
                        return Poll::Pending;
                    };
                    *this.armed = next;
                    let fired = ready!(this.deadline.as_mut().poll_at(clock, limit, cx));
                    let until = this.until.map(|(_, reason)| reason);
                    return give_up(
                        shared,
                        this.slot,
                        *this.start,
                        fired,
                        next,
                        until,
                        this.kept,
                    );
                }
                let until = this.until.map(|(_, reason)| reason);
                return give_up(shared, this.slot, *this.start, fired, arm, until, this.kept);
            }
        };
        *this.slot = NONE;
        let waited = policy.line_now().saturating_duration_since(*this.start);
        wake_then(wake, this.kept, || match verdict {
            Ok(()) => Ok(Waited {
                waited,
                since: policy.clock_in(true),
            }),
            Err(reason) => Err(policy.reject(reason, waited)),
        })
    }
}

/// Wakes the waiter a wait's end passes the look on to (if any), then
/// settles the wait's verdict (`out`: a rejection is counted and
/// reported, and an observer may panic). If that waker panicked, the
/// verdict is kept for the next poll (or the drop) and the panic resumed.
fn wake_then(
    wake: Option<core::task::Waker>,
    kept: &mut Option<Result<Waited, Rejected>>,
    out: impl FnOnce() -> Result<Waited, Rejected>,
) -> Poll<Result<Waited, Rejected>> {
    let panic = wake.and_then(|waker| catch_unwind(AssertUnwindSafe(|| waker.wake())).err());
    let out = out();
    if let Some(payload) = panic {
        if !std::thread::panicking() {
            *kept = Some(out);
            resume_unwind(payload);
        }
    }
    Poll::Ready(out)
}

/// The soonest of a wait's `limits` (each from the start of the wait),
/// as time left after `waited`; on a tie, not the target (at the same
/// instant, `max_wait` or the deadline ends the wait), and the first
/// given (`max_wait` before the deadline, as before there was a target).
fn soonest(limits: [Option<(Duration, Arm)>; 3], waited: Duration) -> Option<(Duration, Arm)> {
    limits
        .into_iter()
        .flatten()
        .map(|(limit, arm)| (limit.saturating_sub(waited), arm))
        .min_by_key(|&(left, arm)| (left, arm == Arm::Target))
}

/// A classed wait's own sleep fired (`fired`, armed for `arm`): it leaves
/// the line, unless a seat or a rejection reached it first.
fn give_up(
    shared: &Shared,
    slot: &mut u32,
    start: Instant,
    fired: Result<(), crate::timer::TimerGone>,
    arm: Arm,
    until: Option<RejectReason>,
    kept: &mut Option<Result<Waited, Rejected>>,
) -> Poll<Result<Waited, Rejected>> {
    let policy = &shared.policy;
    let classes = shared.classes_on();
    let now = policy.line_now();
    let waited = now.saturating_duration_since(start);
    // Only a wait out of `max_wait` is a sample of the line: a deadline
    // is the caller's patience.
    let sample =
        (classes.target().is_some() && arm == Arm::MaxWait && fired.is_ok()).then(|| Sample {
            now: policy.since_origin(now),
            waited: crate::bulkhead::error::nanos(waited),
        });
    let (gave_up, wake) = classes.give_up(*slot, sample, policy);
    *slot = NONE;
    wake_then(wake, kept, || match gave_up {
        GaveUp::Granted => Ok(Waited {
            waited,
            since: policy.clock_in(true),
        }),
        GaveUp::Rejected(reason) => Err(policy.reject(reason, waited)),
        GaveUp::Left => Err(match fired {
            Ok(()) => policy.reject(
                match (arm, until) {
                    (Arm::Until, Some(reason)) => reason,
                    _ => RejectReason::Timeout,
                },
                waited,
            ),
            Err(_gone) => policy.reject_timer_gone(waited),
        }),
    })
}

pin_project! {
    /// One classed call's admission as a named `'static` future that owns
    /// a handle of the bulkhead (`call_with` and `acquire_with` with a
    /// class, the tower layer's `priority_from`): the call's options read
    /// first (a deadline's expected wait counts only the waiters served
    /// before it; rejected at once if it cannot make it, else waiting at
    /// most until it could still finish), then a seat now or a wait in its
    /// class's line. Resolves to the call's permit, already reported as
    /// permitted, whose outcome is `Cancelled` until set.
    pub(crate) struct AdmissionAs {
        // The bulkhead, until it moves into the permit.
        shared: Option<Arc<Shared>>,
        class: usize,
        // The options, until the first poll has read them.
        options: Option<CallOptions>,
        #[pin]
        seating: Option<Seating<Arc<Shared>>>,
    }
}

impl AdmissionAs {
    pub(crate) fn new(shared: Arc<Shared>, class: usize, options: CallOptions) -> Self {
        Self {
            shared: Some(shared),
            class,
            options: Some(options),
            seating: None,
        }
    }
}

impl Future for AdmissionAs {
    type Output = Result<BulkheadPermit, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let class = *this.class;
        let admitted = match this.seating.as_mut().as_pin_mut() {
            Some(seating) => {
                let waited = ready!(seating.poll(cx));
                this.seating.set(None);
                waited.map(Admitted::Waited)
            }
            None => {
                let shared = this
                    .shared
                    .as_ref()
                    .expect("admission polled after completion");
                let options = this.options.take().unwrap_or_default();
                match Shared::seat_with(shared.clone(), class, &options, true) {
                    Err(rejected) => Err(rejected),
                    Ok(Seat::Now) => Ok(Admitted::Now),
                    Ok(Seat::Wait(seating)) => {
                        this.seating.set(Some(seating));
                        let seating = this.seating.as_mut().as_pin_mut().expect("just set");
                        let waited = ready!(seating.poll(cx));
                        this.seating.set(None);
                        waited.map(Admitted::Waited)
                    }
                }
            }
        };
        let shared = this.shared.take().expect("checked above");
        Poll::Ready(admitted.map(|admitted| BulkheadPermit::admitted(shared, class, admitted)))
    }
}
