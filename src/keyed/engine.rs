//! The engine of [`KeyedBulkhead`]: the two stages of a call (its key's
//! bulkhead, then the global one, within one budget), the global stage's
//! wait, the run, and the registry's entry and rejection bookkeeping.

use core::borrow::Borrow;
use core::future::{Future, poll_fn};
use core::hash::{BuildHasher, Hash};
use core::pin::pin;
use core::task::{Poll, ready};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::entry::Entry;
use super::fair::{FairLine, Turn};
use super::labels::{KeySeries, Labels};
use super::permit::User;
use super::registry::{Refused, Registry};
use super::{
    Config, Counters, Inner, KeyedBulkhead, KeyedError, KeyedPermit, KeyedRejectReason,
    KeyedRejected, bump, nanos,
};
use crate::BulkheadPermit;
use crate::bulkhead::Shared;
use crate::bulkhead::guard::{Guard, Source};
use crate::bulkhead::permit::{Admitted, SeatHeld};
use crate::bulkhead::run::poll_call;
use crate::bulkhead::wait::Line;
use crate::bulkhead::{Bulkhead, CallOptions, CallOutcome, CallTimeout, RejectReason, Rejected};
use crate::semaphore::Semaphore;
use crate::timer::{Clock, Deadline};

impl<K, S> KeyedBulkhead<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The two stages of [`call_with`](Self::call_with), and of
    /// [`call`](Self::call) with `PLAIN` (no options: every test of them
    /// folds away).
    // Not an `async fn`: one keeps its arguments apart from the future it
    // awaits them in, more bytes for every call that waits.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn staged<const PLAIN: bool, Q, F, T, E>(
        &self,
        key: &Q,
        mut options: CallOptions,
        call: F,
    ) -> impl Future<Output = Result<T, KeyedError<E>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: Future<Output = Result<T, E>>,
    {
        async move {
            let inner = &*self.inner;
            // Dropped in place, at the end, in the reverse order: the global
            // permit, the key's, then the user count (see `KeyedPermit`). The
            // permits are borrowed from the entry the user keeps alive, so that
            // nothing is cloned for them; until their outcome is set they go
            // back as `Cancelled`.
            let user = inner.enter(key)?;
            let entry = &*user.entry;
            // A budget starts once, for both stages (in place: another
            // binding would be another slot in the future).
            if !PLAIN && options.has_budget() {
                options = options.started(|| inner.now());
            }
            let plain = PLAIN || options.waits_plainly();
            let own = if PLAIN { None } else { Some(&options) };
            let mut start = None;
            // In a block of its own, so that the global stage's state overlaps
            // the key's wait in the future's memory.
            let mut key_held = {
                let mut line = Line::default();
                // `if let`, not `match`, so that the decision does not live
                // across the wait.
                if let Some(held) = match plain {
                    true => entry.bulkhead.hold_now(true),
                    false => entry.bulkhead.hold_now_with(&options, &mut line, true),
                } {
                    held.map_err(|r| inner.key_rejected(r))?
                } else {
                    // Only a call that waits for its key starts the budget's
                    // clock before the global stage.
                    start = inner.budget_clock();
                    let held = entry.bulkhead.hold_waiting_in(line).await;
                    held.map_err(|r| inner.key_rejected(r))?
                }
            };
            let mut global_held = None;
            if let Some(global) = &inner.global {
                key_held.defer_report();
                let classed = if PLAIN {
                    None
                } else {
                    global.classed(&options)
                };
                global_held = Some(if let Some(class) = classed {
                    inner
                        .seat_global(entry, start, &options, global, class)
                        .await
                        .map_err(refused(&mut key_held))?
                } else {
                    // The call's own `max_wait` is read again by the global
                    // bulkhead (from when it starts waiting there), but the
                    // budget of both waits ends it first.
                    let mut line = Line::default();
                    let now = |now| match (now, plain) {
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
                    if let Some(held) = inner.global_now(entry, start, own, now) {
                        held.map_err(refused(&mut key_held))?
                    } else {
                        let wait = move |turn| async move {
                            match turn {
                                None => global.hold_waiting_in(line).await,
                                Some(turn) => global.hold_waiting_after(Some(line), turn).await,
                            }
                        };
                        inner
                            .wait_global(entry, start, own, wait)
                            .await
                            .map_err(refused(&mut key_held))?
                    }
                });
                admitted(entry, &mut key_held);
            }
            let (result, outcome) = inner.run(entry, call).await;
            if let Some(global_held) = &mut global_held {
                global_held.set_outcome(outcome);
            }
            key_held.set_outcome(outcome);
            result
        }
    }
}

impl<K, S> Inner<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    pub(super) fn new(config: Config<K, S>) -> Self {
        let Config {
            name,
            template,
            default_limit,
            limit_for,
            key_label,
            max_labels,
            max_wait,
            call_timeout,
            clock,
            global,
            global_owned,
            fair_shares,
            key_weight,
            max_keys,
            idle_timeout,
            hasher,
        } = config;
        Self {
            interned: crate::bulkhead::name::intern(&name),
            series: KeySeries::new(&name),
            name,
            template,
            default_limit,
            limit_for,
            key_label,
            labels: Labels::new(max_labels),
            max_wait,
            call_timeout,
            clock,
            global,
            global_owned,
            fair: fair_shares.then(|| Box::new(FairLine::new())),
            key_weight,
            registry: Registry::new(max_keys, idle_timeout.map(nanos), hasher),
            limits: Mutex::new(()),
            closed: AtomicBool::new(false),
            closing: Semaphore::new(0),
            counters: Counters::default(),
        }
    }

    /// The limit a key gets when it starts being tracked, before
    /// overrides. Runs user code: call it with no lock held.
    pub(super) fn limit_of(&self, key: &K) -> usize {
        match &self.limit_for {
            Some(limit_for) => limit_for(key).min(Semaphore::MAX_PERMITS),
            None => self.default_limit,
        }
    }

    /// A key's weight in the rotation of fair shares, when it starts being
    /// tracked (at least 1). Runs user code: call it with no lock held.
    fn weight_of(&self, key: &K) -> u32 {
        match &self.key_weight {
            Some(key_weight) => key_weight(key).max(1),
            None => 1,
        }
    }

    /// Whether fair shares are on and callers wait for their turn.
    #[inline]
    pub(super) fn fair_busy(&self) -> bool {
        self.fair.as_deref().is_some_and(FairLine::busy)
    }

    /// When a call's `max_wait` budget starts, read only by a caller that
    /// has to wait for its key (the budget then covers both waits), and
    /// only if there is a global stage to spend the rest on.
    #[inline]
    fn budget_clock(&self) -> Option<Instant> {
        self.global.as_ref().map(|_| self.now())
    }

    /// The time now on the clock the waits are timed on (as the plain
    /// bulkhead reads it: a paused tokio clock included), so that the
    /// budget and the sleeps that enforce it agree.
    #[inline]
    pub(super) fn now(&self) -> Instant {
        Clock::now_on(self.clock.as_ref())
    }

    /// How long since `start`, on [`now`](Self::now)'s clock.
    #[inline]
    pub(super) fn since(&self, start: Instant) -> Duration {
        self.now().saturating_duration_since(start)
    }

    /// The budget of a call's waits: the keyed bulkhead's `max_wait`, or
    /// the call's own if shorter (`own`: the options of a call that has
    /// some).
    #[inline]
    pub(super) fn budget(&self, own: Option<&CallOptions>) -> Option<Duration> {
        match own {
            None => self.max_wait,
            Some(options) => options.budget(self.max_wait),
        }
    }

    /// [`KeyedBulkhead::acquire_with`]: the two stages, each reading the
    /// call's options.
    pub(super) async fn acquire_with<Q>(
        &self,
        key: &Q,
        options: CallOptions,
    ) -> Result<KeyedPermit, KeyedRejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A budget starts once, for both stages.
        let options = options.started(|| self.now());
        self.acquire_staged(
            key,
            &options,
            async |bulkhead: &Bulkhead| bulkhead.acquire_with(options).await,
            |global: &Bulkhead| global.try_acquire_with(options),
            async |global: &Bulkhead, turn: Option<Turn<'_>>| match turn {
                None => global.acquire_with(options).await,
                Some(turn) => {
                    let line = global.judge(&options)?;
                    global.acquire_after(Some(line), turn).await
                }
            },
        )
        .await
    }

    /// The two stages of [`acquire_with`](Self::acquire_with): `key_stage`
    /// is the key's bulkhead's admission; `now` and `wait` are the global
    /// bulkhead's, without waiting and waiting, within the budget of
    /// `options`.
    async fn acquire_staged<Q>(
        &self,
        key: &Q,
        options: &CallOptions,
        key_stage: impl AsyncFnOnce(&Bulkhead) -> Result<BulkheadPermit, Rejected>,
        now_global: impl FnOnce(&Bulkhead) -> Result<BulkheadPermit, Rejected>,
        wait: impl AsyncFnOnce(&Bulkhead, Option<Turn<'_>>) -> Result<BulkheadPermit, Rejected>,
    ) -> Result<KeyedPermit, KeyedRejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let user = self.enter(key)?;
        let mut start = None;
        let acquired = {
            let mut acquiring = pin!(key_stage(&user.entry.bulkhead));
            poll_fn(|cx| {
                let polled = acquiring.as_mut().poll(cx);
                if polled.is_pending() && start.is_none() {
                    start = self.budget_clock();
                }
                polled
            })
            .await
        };
        let mut key_permit = acquired.map_err(|r| self.key_rejected(r))?;
        let global = match &self.global {
            None => None,
            Some(global) => {
                key_permit.guard().defer_report();
                let now = |now| (now == Now::Take).then(|| now_global(global));
                let admitted = if let Some(admitted) =
                    self.global_now(&user.entry, start, Some(options), now)
                {
                    admitted
                } else {
                    let wait = |turn| wait(global, turn);
                    self.wait_global(&user.entry, start, Some(options), wait)
                        .await
                };
                Some(global_stage_ended(
                    &user.entry,
                    key_permit.guard(),
                    admitted,
                )?)
            }
        };
        Ok(KeyedPermit {
            global,
            key: key_permit,
            user,
        })
    }

    /// The second stage without waiting: `Some` if it is decided at once (a
    /// global permit, or a rejection), `None` if the caller is to wait
    /// ([`wait_global`](Self::wait_global)). The budget started at `start`
    /// if the caller waited for its key (else it is whole); the caller
    /// holds its key's permit meanwhile. `now` is the global bulkhead's
    /// decision without waiting, as [`Now`] asks it (`None`: the caller is
    /// to wait, never so for [`Now::Take`]).
    #[inline]
    fn global_now<P>(
        &self,
        entry: &Entry,
        start: Option<Instant>,
        own: Option<&CallOptions>,
        now: impl FnOnce(Now) -> Option<Result<P, Rejected>>,
    ) -> Option<Result<P, KeyedRejected>> {
        let waited = || start.map_or(Duration::ZERO, |start| self.since(start));
        let spent = match (self.budget(own), start) {
            (Some(max_wait), _) if max_wait.is_zero() => Some(false),
            (Some(max_wait), Some(start)) if self.since(start) >= max_wait => Some(true),
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
            return Some(match decided? {
                Ok(permit) => Ok(permit),
                Err(r) => Err(self.global_rejected(entry, r, waited())),
            });
        };
        // Fail fast, or the key's wait used the whole budget: a free
        // global permit is still taken (unless it is for others).
        let decided = match queue {
            true => self
                .global
                .as_ref()
                .map(|g| Err(g.reject_now(RejectReason::Full))),
            false => now(Now::Take),
        };
        unwinding.passed();
        let decided = decided.expect("without waiting, admission is decided at once");
        Some(decided.map_err(|r| {
            let rejected = self.global_rejected(entry, r, waited());
            if spent {
                rejected.budget_spent()
            } else {
                rejected
            }
        }))
    }

    /// Waits for a global permit, after [`global_now`](Self::global_now)
    /// said `None`: `wait()` is the global bulkhead's admission, waited for
    /// with what is left of the budget, until we close. What the wait needs
    /// lives inline (no allocation): the gauge, the listener for `close` (a
    /// waiter on `closing`) and the deadline, all made the first time the
    /// admission is pending.
    async fn wait_global<'s, P, W>(
        &'s self,
        entry: &Entry,
        start: Option<Instant>,
        own: Option<&CallOptions>,
        wait: impl FnOnce(Option<Turn<'s>>) -> W,
    ) -> Result<P, KeyedRejected>
    where
        W: Future<Output = Result<P, Rejected>>,
    {
        // With fair shares, the wait waits for its key's turn first.
        let turn = match (self.fair.as_deref(), self.global.as_ref()) {
            (Some(fair), Some(global)) => Some(fair.turn(global, entry)),
            _ => None,
        };
        // Made here, not passed in: a future moved into an `async fn` is
        // stored twice in its state.
        let mut wait = pin!(wait(turn));
        let mut closing = pin!(self.closing.acquire());
        let mut deadline = pin!(Deadline::new());
        let mut waiting: Option<Counted<'_>> = None;
        let mut begun = start;
        let outcome = poll_fn(|cx| {
            let unwinding = GlobalStage::new(self.global.as_ref(), entry, &self.counters);
            let polled = wait.as_mut().poll(cx);
            unwinding.passed();
            if let Poll::Ready(acquired) = polled {
                return Poll::Ready(acquired.map_err(GlobalFailure::Rejected));
            }
            waiting.get_or_insert_with(|| Counted::new(&entry.waiting_global));
            let begun = *begun.get_or_insert_with(|| self.now());
            // `close` sets the flag, then closes `closing`, which wakes
            // every waiter on it and fails every later poll.
            if closing.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(GlobalFailure::Closed));
            }
            let Some(max_wait) = self.budget(own) else {
                return Poll::Pending;
            };
            // What is left of the budget, read only to arm the deadline.
            let left = match deadline.is_armed() {
                true => Duration::ZERO,
                false => max_wait.saturating_sub(self.since(begun)),
            };
            deadline
                .as_mut()
                .poll_at(self.clock.as_ref(), left, cx)
                .map(|expired| match expired {
                    Ok(()) => Err(GlobalFailure::Timeout),
                    Err(_gone) => Err(GlobalFailure::Unavailable),
                })
        })
        .await;
        let waited = || begun.map_or(Duration::ZERO, |begun| self.since(begun));
        let reason = match outcome {
            Ok(permit) => return Ok(permit),
            Err(GlobalFailure::Rejected(r)) => {
                return Err(self.global_rejected(entry, r, waited()));
            }
            Err(GlobalFailure::Closed) => KeyedRejectReason::Closed,
            Err(GlobalFailure::Timeout) => KeyedRejectReason::GlobalTimeout,
            Err(GlobalFailure::Unavailable) => KeyedRejectReason::Unavailable,
        };
        Err(self.global_gave_up(entry, reason, waited()))
    }

    /// The global stage of [`KeyedBulkhead::call_with`] for a caller of
    /// priority `class` on a global bulkhead with classes, holding its
    /// key's permit: a seat now, or a wait in its class's line within what
    /// is left of the budget that started at `start`. (Fair shares need the global limit the keyed
    /// bulkhead makes, which has no classes: nobody waits for a turn.)
    #[cold]
    async fn seat_global<'s>(
        &'s self,
        entry: &Entry,
        start: Option<Instant>,
        options: &CallOptions,
        global: &'s Bulkhead,
        class: usize,
    ) -> Result<SeatHeld<&'s Shared>, KeyedRejected> {
        // Pinned here and polled through a reference: the wait is kept
        // once, not moved into each future that awaits it.
        let mut seating = pin!(None);
        let now = |now| match global.seat_now(class, options, now != Now::Take) {
            Ok(Ok(held)) => Some(Ok(held)),
            Ok(Err(wait)) => {
                seating.set(Some(wait));
                None
            }
            Err(rejected) => Some(Err(rejected)),
        };
        if let Some(held) = self.global_now(entry, start, Some(options), now) {
            return held;
        }
        let wait = |_turn| {
            poll_fn(move |cx| {
                let Some(wait) = seating.as_mut().as_pin_mut() else {
                    unreachable!("a classed caller told to wait is in its line");
                };
                let waited = ready!(wait.poll(cx))?;
                Poll::Ready(Ok(global.seat_after(class, Admitted::Waited(waited))))
            })
        };
        self.wait_global(entry, start, Some(options), wait).await
    }

    /// Runs an admitted call under `call_timeout`, whose deadline is armed
    /// only once the call is pending (a call that finishes on its first
    /// poll makes no timer entry). Resolves to the result and how the call
    /// ended, for the observers; the call is dropped before this returns.
    pub(super) async fn run<F, T, E>(
        &self,
        entry: &Entry,
        call: F,
    ) -> (Result<T, KeyedError<E>>, CallOutcome)
    where
        F: Future<Output = Result<T, E>>,
    {
        let mut call = pin!(call);
        let mut deadline = pin!(Deadline::new());
        let limit = self.call_timeout;
        let clock = self.clock.as_ref();
        poll_fn(|cx| {
            poll_call(call.as_mut(), deadline.as_mut(), limit, clock, cx).map(|ran| {
                ran.settle(
                    KeyedError::Inner,
                    || {
                        bump(&entry.call_timeouts);
                        KeyedError::CallTimeout(CallTimeout::new(
                            self.interned,
                            limit.unwrap_or_default(),
                        ))
                    },
                    || KeyedError::Rejected(self.unavailable()),
                )
            })
        })
        .await
    }

    /// Looks `key` up, tracking it if it is new, and counts the caller as
    /// one of its users.
    #[inline]
    pub(super) fn enter<Q>(&self, key: &Q) -> Result<User, KeyedRejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.closed.load(Ordering::Relaxed) {
            return Err(self.rejected_closed());
        }
        let hash = self.registry.hash(key);
        match self.registry.enter(hash, key) {
            Some(user) => Ok(user),
            None => self.enter_slow(hash, key.to_owned()),
        }
    }

    /// A key not tracked a moment ago: build its bulkhead with no lock
    /// held (that runs `limit_for`, `key_label`, and metrics recorders),
    /// then insert it, unless another caller did first.
    #[cold]
    fn enter_slow(&self, hash: u64, key: K) -> Result<User, KeyedRejected> {
        let limit = self.limit_of(&key);
        let weight = self.weight_of(&key);
        let label = self
            .key_label
            .as_ref()
            .map(|key_label| self.labels.assign(key_label(&key)));
        let Some(bulkhead) = self.make_bulkhead(limit, label.as_ref()) else {
            return Err(self.unavailable());
        };
        match self
            .registry
            .insert(hash, key, bulkhead, label, weight, limit, &self.closed)
        {
            Ok(user) => Ok(user),
            Err(Refused::Closed) => Err(self.rejected_closed()),
            Err(Refused::TooManyKeys) => {
                bump(&self.counters.rejected_too_many_keys);
                Err(KeyedRejected::new(
                    KeyedRejectReason::TooManyKeys,
                    Duration::ZERO,
                    self.interned,
                    self.registry.max_keys(),
                    None,
                ))
            }
        }
    }

    /// A key's bulkhead, or `None` if its timer cannot run here: the
    /// template was checked by `KeyedBulkheadBuilder::build`, so that is
    /// the only way building it can fail (the default timer, asked for by
    /// a key first seen inside a tokio runtime without a time driver; a
    /// `TokioTimer` whose runtime is gone).
    fn make_bulkhead(&self, limit: usize, label: Option<&Arc<str>>) -> Option<Bulkhead> {
        let name = match label {
            Some(label) => format!("{}[{label}]", self.name),
            None => self.name.to_string(),
        };
        let mut template = self.template.clone();
        template.metrics_series = self.series.for_key(label);
        let bulkhead = template
            .name(name)
            .max_concurrent_calls(limit.max(1))
            .build()
            .ok()?;
        if limit == 0 {
            // Not shared yet: nobody waits on it.
            bulkhead.set_max_concurrent_calls(0);
        }
        Some(bulkhead)
    }

    /// A time limit cannot be kept: the timer cannot run here.
    #[cold]
    pub(super) fn unavailable(&self) -> KeyedRejected {
        self.rejected_at_once(KeyedRejectReason::Unavailable)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn rejected_closed(&self) -> KeyedRejected {
        bump(&self.counters.rejected_closed);
        self.rejected_at_once(KeyedRejectReason::Closed)
    }

    /// A rejection for `reason` that no stage decided and nobody waited
    /// for (counted by the caller).
    fn rejected_at_once(&self, reason: KeyedRejectReason) -> KeyedRejected {
        KeyedRejected::new(
            reason,
            Duration::ZERO,
            self.interned,
            self.registry.max_keys(),
            None,
        )
    }

    #[cold]
    #[inline(never)]
    pub(super) fn key_rejected(&self, rejected: Rejected) -> KeyedRejected {
        let waited = rejected.waited();
        KeyedRejected::from_bulkhead(
            rejected,
            false,
            waited,
            self.interned,
            self.registry.max_keys(),
        )
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

    /// The wait for a global permit ended without the global bulkhead
    /// saying no: our budget ran out (or its timer cannot run), or we were
    /// closed. Counted for the key, and by the global bulkhead as its own
    /// rejection (the caller waited in its line).
    #[cold]
    #[inline(never)]
    fn global_gave_up(
        &self,
        entry: &Entry,
        reason: KeyedRejectReason,
        waited: Duration,
    ) -> KeyedRejected {
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
fn count_global_rejection(entry: &Entry, counters: &Counters, reason: RejectReason) {
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
enum Now {
    /// A free permit, else `None` (the caller is to wait), or a rejection.
    Wait,
    /// A free permit, else a rejection: the caller may not wait.
    Take,
    /// No permit (fair shares: others wait for their turn): a rejection
    /// at once (a deadline the caller cannot make), else `None`.
    Queue,
}

/// How the wait for a global permit failed.
enum GlobalFailure {
    Rejected(Rejected),
    Closed,
    Timeout,
    /// The budget's timer cannot run.
    Unavailable,
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
fn admitted<S: Source>(entry: &Entry, key_permit: &mut Guard<S>) {
    bump(&entry.admitted);
    key_permit.report_admitted();
}

/// The global stage turned the call away: the key's permit, whose call
/// never ran, goes back unreported, and the key's bulkhead reports a
/// rejection for the global stage's reason.
fn refused<S: Source>(key_permit: &mut Guard<S>) -> impl FnOnce(KeyedRejected) -> KeyedRejected {
    move |rejected| {
        let reason = rejected.reason().bulkhead_reason();
        key_permit.report_refused(reason.unwrap_or(RejectReason::Unavailable));
        rejected
    }
}
