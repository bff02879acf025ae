//! The engine of [`KeyedBulkhead`]: the two stages of a call (its key's
//! bulkhead, then the global one of `global.rs`, within one budget), the
//! run, and the registry's entry and rejection bookkeeping.

use core::future::{Future, poll_fn};
use core::hash::{BuildHasher, Hash};
use core::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::BorrowedKey;
use super::entry::Entry;
use super::fair::{FairLine, TurnIf};
use super::global::{Budget, Now, admitted, global_stage_ended, refused};
use super::labels::{KeySeries, Labels};
use super::permit::User;
use super::registry::{Refused, Registry};
use super::{
    Config, Counters, Inner, KeyedBulkhead, KeyedError, KeyedPermit, KeyedRejectReason,
    KeyedRejected, bump, nanos,
};
use crate::BulkheadPermit;
use crate::bulkhead::run::poll_call;
use crate::bulkhead::wait::Line;
use crate::bulkhead::{Bulkhead, CallOptions, CallOutcome, CallTimeout, Rejected};
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
        Q: BorrowedKey<K> + ?Sized,
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

    /// [`KeyedBulkhead::acquire_with`] for a caller counted as a user of
    /// its key ([`enter`](Self::enter)): the two stages, each reading the
    /// call's options.
    pub(super) async fn acquire_with(
        &self,
        user: User,
        options: CallOptions,
    ) -> Result<KeyedPermit, KeyedRejected> {
        // A budget starts once, for both stages.
        let options = options.started(|| self.now());
        self.acquire_staged(
            user,
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

    /// [`KeyedBulkhead::try_acquire_with`] for a caller counted as a user
    /// of its key ([`enter`](Self::enter)): both stages without waiting,
    /// each reading the call's options. Not generic over the borrowed key.
    pub(super) fn try_acquire_with(
        &self,
        user: User,
        options: CallOptions,
    ) -> Result<KeyedPermit, KeyedRejected> {
        // A budget starts once, for both stages.
        let options = options.started(|| self.now());
        let mut key_permit = user
            .entry
            .bulkhead
            .try_acquire_with(options)
            .map_err(|r| self.key_rejected(r))?;
        let global = match &self.global {
            None => None,
            Some(global) => {
                key_permit.guard().defer_report();
                let now = |now| match now {
                    Now::Take => Ok(global.try_acquire_with(options)),
                    _ => Err(()),
                };
                let Ok(admitted) = self.global_now(&user.entry, None, Some(Budget::NO_WAIT), now)
                else {
                    unreachable!("without a budget to wait, admission is decided at once");
                };
                Some(admitted)
            }
        };
        staged_permit(user, key_permit, global)
    }

    /// The two stages of [`acquire_with`](Self::acquire_with) for `user`,
    /// a caller counted as a user of its key: `key_stage` is the key's
    /// bulkhead's admission; `now` and `wait` are the global bulkhead's,
    /// without waiting and waiting, within the budget of `options`. Not
    /// generic over the borrowed key.
    async fn acquire_staged(
        &self,
        user: User,
        options: &CallOptions,
        key_stage: impl AsyncFnOnce(&Bulkhead) -> Result<BulkheadPermit, Rejected>,
        now_global: impl FnOnce(&Bulkhead) -> Result<BulkheadPermit, Rejected>,
        wait: impl AsyncFnOnce(&Bulkhead, CallOptions, TurnIf<'_>) -> Result<BulkheadPermit, Rejected>,
    ) -> Result<KeyedPermit, KeyedRejected> {
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
                Some(admitted)
            }
        };
        staged_permit(user, key_permit, global)
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
    pub(super) fn enter<Q: BorrowedKey<K> + ?Sized>(&self, key: &Q) -> Result<User, KeyedRejected> {
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
}

/// The permit of a call its key's bulkhead admitted (`key`, whose report
/// waits for the global stage), and `global`, how the global stage ended
/// if there is one.
fn staged_permit(
    user: User,
    mut key: BulkheadPermit,
    global: Option<Result<BulkheadPermit, KeyedRejected>>,
) -> Result<KeyedPermit, KeyedRejected> {
    let global = global
        .map(|admitted| global_stage_ended(&user.entry, key.guard(), admitted))
        .transpose()?;
    Ok(KeyedPermit { global, key, user })
}
