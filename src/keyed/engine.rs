//! The engine of [`KeyedBulkhead`]: the two stages of a call (its key's
//! bulkhead, then the global one, within one budget), the global stage's
//! wait, the run, and the registry's entry and rejection bookkeeping.

use core::borrow::Borrow;
use core::future::{Future, poll_fn};
use core::hash::{BuildHasher, Hash};
use core::pin::{Pin, pin};
use core::task::{Context, Poll};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::entry::Entry;
use super::fair::{FairLine, TurnIf};
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
use crate::bulkhead::permit::SeatHeld;
use crate::bulkhead::run::poll_call;
use crate::bulkhead::wait::Line;
use crate::bulkhead::{Bulkhead, CallOptions, CallOutcome, CallTimeout, RejectReason, Rejected};
use crate::futures::Acquire;
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
            // The global stage: decided at once, or the wait, which only
            // the values it is built from (moved into it, never borrowed)
            // precede, so that nothing else lives across it.
            let mut global_held = match &inner.global {
                None => None,
                Some(global) => Some(
                    'global: {
                        key_held.defer_report();
                        let own = if PLAIN { None } else { Some(&options) };
                        let classed = if PLAIN {
                            None
                        } else {
                            global.classed(&options)
                        };
                        if let Some(class) = classed {
                            let seating = match inner.seat_global(entry, start, own, global, class)
                            {
                                Ok(decided) => break 'global decided,
                                Err(seating) => seating,
                            };
                            break 'global inner.wait_global(entry, start, seating).await;
                        }
                        let line = match inner.hold_global(entry, start, own, plain, global) {
                            Ok(decided) => break 'global decided,
                            Err(line) => line,
                        };
                        let wait = global.hold_waiting_after(line, inner.turn(entry));
                        inner.wait_global(entry, start, wait).await
                    }
                    .map_err(refused(&mut key_held))?,
                ),
            };
            if global_held.is_some() {
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

    /// The budget of a call's waits as its global stage begins (`own`:
    /// the options of a call that has some), if it has one: the keyed
    /// bulkhead's `max_wait`, or the call's own if shorter, less the wait
    /// for its key (from `start`, if it waited there).
    #[inline]
    fn budget(&self, own: Option<&CallOptions>, start: Option<Instant>) -> Option<Budget> {
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
            async |global: &Bulkhead, options: CallOptions, turn: TurnIf<'_>| match turn.0 {
                None => global.acquire_with(options).await,
                Some(_) => {
                    let line = global.judge(&options)?;
                    global.acquire_after(line, turn).await
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
        wait: impl AsyncFnOnce(&Bulkhead, CallOptions, TurnIf<'_>) -> Result<BulkheadPermit, Rejected>,
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
                let budget = self.budget(Some(options), start);
                let now = |now| match now {
                    Now::Take => Ok(now_global(global)),
                    _ => Err(()),
                };
                let admitted =
                    if let Ok(admitted) = self.global_now(&user.entry, start, budget, now) {
                        admitted
                    } else {
                        // What is left of the budget is the global wait's own
                        // `max_wait`.
                        let options = match budget {
                            Some(budget) => options.waiting_at_most(budget.left),
                            None => *options,
                        };
                        let wait = wait(global, options, self.turn(&user.entry));
                        self.wait_global(&user.entry, start, wait).await
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

    /// The second stage without waiting: `Ok` if it is decided at once (a
    /// global permit, or a rejection), `Err` with what to wait with if the
    /// caller is to wait ([`wait_global`](Self::wait_global)). The caller
    /// waited for its key from `start` (if it did) within `budget`, and
    /// holds its key's permit meanwhile. `now` is the global bulkhead's
    /// decision without waiting, as [`Now`] asks it (`Err`: the caller is
    /// to wait, never so for [`Now::Take`]).
    #[inline(always)]
    fn global_now<P, W>(
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
    fn turn<'s>(&'s self, entry: &Entry) -> TurnIf<'s> {
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
    fn wait_global<'s, W>(
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

    /// The global stage of [`KeyedBulkhead::call_with`] for a caller
    /// without a class (`plain`: without options; `own`, the options of a
    /// call that has some), holding its key's permit: decided at once
    /// (`Ok`), or the line of its wait (`Err`), whose own `max_wait` is
    /// what is left of its budget (read only then: a call admitted at once
    /// reads no clock for it).
    #[inline(always)]
    fn hold_global<'s>(
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

    /// The global stage of [`KeyedBulkhead::call_with`] for a caller of
    /// priority `class` on a global bulkhead with classes, holding its
    /// key's permit: decided at once (`Ok`), or its wait in its class's
    /// line (`Err`), within what is left of its budget. (Fair shares need
    /// the global limit the keyed bulkhead makes, which has no classes:
    /// nobody waits for a turn.)
    #[cold]
    // The wait is returned once and moved into the one that awaits it in
    // place: boxing it would allocate.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    fn seat_global<'s>(
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

    /// The wait for a global permit ended because we were closed.
    /// Counted for the key, and by the global bulkhead as its own
    /// rejection (the caller waited in its line).
    #[cold]
    #[inline(never)]
    fn closed_in_global_line(&self, entry: &Entry, waited: Duration) -> KeyedRejected {
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

pin_project! {
    /// The wait for a global permit ([`Inner::wait_global`]): the global
    /// bulkhead's wait in line (`wait`), which keeps every limit of its
    /// own, and the listener for `close` (a waiter on `closing`), in one
    /// future written by hand so that each is kept once and inline. The
    /// key's gauge of waiters counts the caller once the wait is pending.
    struct GlobalWait<'a, K, S, W> {
        inner: &'a Inner<K, S>,
        entry: &'a Entry,
        #[pin]
        wait: W,
        #[pin]
        closing: Acquire<'a>,
        waiting: Option<Counted<'a>>,
        // When the caller began to wait: for its key, if it did, else here.
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
        let unwinding = GlobalStage::new(inner.global.as_ref(), entry, &inner.counters);
        let polled = this.wait.poll(cx);
        unwinding.passed();
        if let Poll::Ready(acquired) = polled {
            return Poll::Ready(
                acquired.map_err(|r| inner.global_rejected(entry, r, waited(*this.begun))),
            );
        }
        this.waiting
            .get_or_insert_with(|| Counted::new(&entry.waiting_global));
        this.begun.get_or_insert_with(|| inner.now());
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
struct Budget {
    /// The whole budget, for both stages.
    whole: Duration,
    /// What the wait for the key left of it.
    left: Duration,
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
