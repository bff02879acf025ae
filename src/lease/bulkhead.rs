//! The bulkhead's policy over a distributed store of leased permits: one
//! type for every store, generic over the [`LeaseStore`] seam.

use core::fmt;
use core::future::{Future, poll_fn};
use core::pin::pin;
use core::task::Poll;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::LeasedBulkheadBuilder;
use super::handoff::{LocalLine, Place};
use super::store::{Attempt, Down, LeaseStore};
use super::{Completed, LeasedPermit, Lost, UntilLost};
use crate::LostReason;
use crate::bulkhead::guard::{Guard, Source};
use crate::bulkhead::idle::Idle;
use crate::bulkhead::observer::CallOutcome;
use crate::bulkhead::policy::Policy;
use crate::bulkhead::wait::{Line, Waited};
use crate::timer::Timer;
use crate::timer::timeout::Timeout;
use crate::{BulkheadError, CallOptions, Metrics, RejectReason, Rejected};

/// A [`Bulkhead`](crate::Bulkhead) whose permits are leases in a store
/// shared by every process that uses the same semaphore: Redis
/// ([`RedisBulkhead`](crate::redis::RedisBulkhead), over a
/// [`RedisSemaphore`](crate::redis::RedisSemaphore)) or PostgreSQL
/// ([`PgBulkhead`](crate::postgres::PgBulkhead), over a
/// [`PgSemaphore`](crate::postgres::PgSemaphore)).
///
/// The policy is the in-process bulkhead's: wait for at most `max_wait`
/// (zero fails fast), a bounded waiting line, a `call_timeout`, typed
/// rejections, metrics and observers. What differs:
///
/// * **The limit** lives in the store: [`set_max_concurrent_calls`](Self::set_max_concurrent_calls)
///   changes it for every client, and is async.
/// * **The waiting line** (`max_queue`) is per process: each process
///   bounds its own waiters.
/// * **Metrics** count this process's calls; `in_flight` is this process's
///   share. The semaphore's `holders` lists every holder.
/// * **The store out of reach** rejects with [`RejectReason::Unavailable`]
///   (fail closed), the store's error as its [`source`](std::error::Error::source).
/// * **A lost lease** stops a running [`call`](Self::call) at once
///   ([`BulkheadError::LeaseLost`]); [`call_to_end`](Self::call_to_end)
///   lets it finish and says so.
pub struct LeasedBulkhead<S: LeaseStore> {
    shared: Arc<Shared<S>>,
}

impl<S: LeaseStore> Clone for LeasedBulkhead<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<S: LeaseStore> {
    policy: Policy,
    sem: S,
    /// Calls of this process holding a lease now.
    in_flight: AtomicUsize,
    /// Notified when `in_flight` comes down to zero.
    idle: Idle,
    /// With priority classes or adaptive LIFO: this process's waiters, to
    /// whom a lease granted to one of them goes.
    local: Option<LocalLine<LeasedPermit<S>>>,
}

impl<S: LeaseStore> LeasedBulkhead<S> {
    /// Starts configuring a bulkhead over `sem`.
    pub fn builder(sem: S) -> LeasedBulkheadBuilder<S> {
        LeasedBulkheadBuilder::new(sem)
    }

    /// The bulkhead that [`LeasedBulkheadBuilder::build`] makes.
    pub(super) fn new(policy: Policy, sem: S, local: Option<LocalLine<LeasedPermit<S>>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                policy,
                sem,
                in_flight: AtomicUsize::new(0),
                idle: Idle::default(),
                local,
            }),
        }
    }

    /// The bulkhead's name: its semaphore's.
    pub fn name(&self) -> &str {
        self.shared.policy.name()
    }

    /// The semaphore underneath, for its `holders` and the like.
    pub fn semaphore(&self) -> &S {
        &self.shared.sem
    }

    /// Runs `call` once a lease is granted, then releases it. As
    /// [`Bulkhead::call`](crate::Bulkhead::call), and the call is dropped
    /// unfinished the moment its lease is lost (as the semaphore's `call`
    /// does; the observer sees it
    /// [`Cancelled`](CallOutcome::Cancelled)). For a call that must not stop
    /// half-way, use [`call_to_end`](Self::call_to_end).
    ///
    /// # Errors
    ///
    /// [`BulkheadError::Rejected`] if not admitted (including
    /// [`RejectReason::Unavailable`]), [`BulkheadError::CallTimeout`],
    /// [`BulkheadError::Inner`], [`BulkheadError::LeaseLost`].
    ///
    /// # Cancel safety
    ///
    /// As [`Bulkhead::call`](crate::Bulkhead::call): dropped while it waits,
    /// it leaves the line (a lease granted to it meanwhile is released in the
    /// background); dropped while the call runs, it drops the call and
    /// releases the lease in the background.
    pub async fn call<F, T, E>(&self, call: F) -> Result<T, BulkheadError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        self.call_with(CallOptions::new(), call).await
    }

    /// [`call`](Self::call) with [`CallOptions`]: a deadline (deadline-aware
    /// admission, as [`Bulkhead::call_with`](crate::Bulkhead::call_with)'s,
    /// on this process's line: a call that cannot make its deadline is
    /// rejected before it asks the store, or once the store says it must
    /// wait), a `max_wait` of its own, and with
    /// [`priority_classes`](LeasedBulkheadBuilder::priority_classes) a
    /// class, which orders this process's waiters (the line in the store
    /// is served in arrival order).
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), and [`BulkheadError::Rejected`] with
    /// [`RejectReason::WontMakeDeadline`].
    ///
    /// # Cancel safety
    ///
    /// As [`call`](Self::call).
    pub async fn call_with<F, T, E>(
        &self,
        options: CallOptions,
        call: F,
    ) -> Result<T, BulkheadError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        let mut permit = self.admit(options, CallOutcome::Cancelled).await?;
        let policy = &self.shared.policy;
        let run = policy.run(policy.traced(call));
        match UntilLost::new(run, permit.lost()).await {
            Ok((result, outcome)) => {
                permit.set_outcome(outcome);
                drop(permit);
                result
            }
            // The outcome stays `Cancelled`.
            Err(reason) => Err(BulkheadError::LeaseLost(reason)),
        }
    }

    /// Runs `call` once a lease is granted, lets it finish even if the
    /// lease is lost meanwhile (`call_timeout` still applies), then
    /// releases the lease; says what the call returned, as
    /// [`call`](Self::call) would, and whether the lease was lost before
    /// the call ended.
    ///
    /// For work that must not stop half-way: the caller learns afterwards
    /// that it may have overlapped with another holder (who holds a higher
    /// [fence](LeasedBulkheadPermit::fence)), and can undo or check it.
    ///
    /// # Cancel safety
    ///
    /// As [`call`](Self::call).
    pub async fn call_to_end<F, T, E>(&self, call: F) -> Completed<Result<T, BulkheadError<E>>>
    where
        F: Future<Output = Result<T, E>>,
    {
        let mut permit = match self.admit(CallOptions::new(), CallOutcome::Cancelled).await {
            Ok(permit) => permit,
            Err(rejected) => {
                return Completed {
                    output: Err(rejected.into()),
                    lost: None,
                };
            }
        };
        let policy = &self.shared.policy;
        let (output, outcome) = policy.run(policy.traced(call)).await;
        let lost = permit.lost_reason();
        permit.set_outcome(outcome);
        drop(permit);
        Completed { output, lost }
    }

    /// Waits for a lease under the bulkhead's policy.
    ///
    /// # Errors
    ///
    /// [`Rejected`], with the [reason](Rejected::reason).
    ///
    /// # Cancel safety
    ///
    /// Dropped while it waits, it leaves the line; a lease granted to it
    /// meanwhile is released in the background.
    pub async fn acquire(&self) -> Result<LeasedBulkheadPermit<S>, Rejected> {
        self.admit(CallOptions::new(), CallOutcome::Released).await
    }

    /// [`acquire`](Self::acquire) with [`CallOptions`], as
    /// [`call_with`](Self::call_with) reads them.
    ///
    /// # Errors
    ///
    /// [`Rejected`], with the [reason](Rejected::reason), among them
    /// [`RejectReason::WontMakeDeadline`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with(
        &self,
        options: CallOptions,
    ) -> Result<LeasedBulkheadPermit<S>, Rejected> {
        self.admit(options, CallOutcome::Released).await
    }

    /// Takes a lease if one is free now: one call to the store, no waiting.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with [`RejectReason::Full`], [`RejectReason::Closed`]
    /// or [`RejectReason::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// As the semaphore's `try_acquire`: a lease granted to a call dropped
    /// before the answer is released in the background.
    pub async fn try_acquire(&self) -> Result<LeasedBulkheadPermit<S>, Rejected> {
        self.try_acquire_with(CallOptions::new()).await
    }

    /// [`try_acquire`](Self::try_acquire) with [`CallOptions`]: with a
    /// deadline, a call that could not make it even if a lease is free is
    /// rejected before the store is asked.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), and [`RejectReason::WontMakeDeadline`].
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_with(
        &self,
        options: CallOptions,
    ) -> Result<LeasedBulkheadPermit<S>, Rejected> {
        let s = &self.shared;
        s.policy.line_for(&options, isize::MAX, 0)?;
        let first = s.sem.try_acquire().await;
        self.note_limit();
        match first {
            Ok(lease) => Ok(self.admitted(lease, self.at_once(), CallOutcome::Released)),
            Err(e) => Err(refused::<S>(&s.policy, e)),
        }
    }

    /// Admission under the policy with `options`: the lease, owned by a
    /// permit whose outcome is `outcome` until set.
    async fn admit(
        &self,
        options: CallOptions,
        outcome: CallOutcome,
    ) -> Result<LeasedBulkheadPermit<S>, Rejected> {
        let s = &self.shared;
        // Before the store is asked: a call that could not make its deadline
        // even with a lease free now.
        let started = (!options.waits_plainly()).then(|| s.policy.line_now());
        // A budget starts once, here, not again when the store says busy.
        let options = match started {
            Some(now) => options.started(|| now),
            None => options,
        };
        if options.has_deadline() {
            s.policy.line_for(&options, isize::MAX, 0)?;
        }
        if s.policy.fails_fast() || !options.may_wait() {
            // Fail fast: one script call, no outage tolerance.
            let first = s.sem.try_acquire().await;
            self.note_limit();
            return match first {
                Ok(lease) => Ok(self.admitted(lease, self.at_once(), outcome)),
                Err(e) => Err(refused::<S>(&s.policy, e)),
            };
        }
        // The first attempt is bounded by `max_wait` too: against a store
        // that does not answer (a black hole) it could take up to the
        // outage tolerance. No answer by then is `Unavailable`.
        let first = match options.budget(s.policy.max_wait()) {
            Some(limit) => {
                let sleep = s.sem.local().timer.sleep(limit);
                match Timeout::new(s.sem.first_attempt(), sleep).await {
                    Ok(first) => first,
                    Err(_elapsed) => {
                        return Err(s
                            .policy
                            .reject(RejectReason::Unavailable, limit)
                            .caused_by(S::silent(limit)));
                    }
                }
            }
            None => s.sem.first_attempt().await,
        };
        self.note_limit();
        let (lease, waited) = match first {
            Ok(Attempt::Granted(lease)) => {
                return Ok(self.admitted(lease, self.at_once(), outcome));
            }
            // Busy, or the store briefly out of reach: wait within the
            // policy's bounds, going on from this attempt (same id, a
            // listener registered before it) rather than asking again at
            // once.
            //
            // Out of `max_wait` while the latest attempt could not reach
            // the store is `Unavailable`, not `Timeout`: nobody knows
            // whether a permit was free.
            Ok(Attempt::Busy(busy)) => {
                // No lease free: the call's options read for its wait in
                // this process's line, what its first attempt took spent.
                let line = match started {
                    None => Line::default(),
                    Some(started) => {
                        let spent = s.policy.line_now().saturating_duration_since(started);
                        let options = options.spent(spent);
                        s.policy.line_for(&options, 0, s.policy.queued())?
                    }
                };
                // Declared before the wait, so dropped after it: the line
                // is counted without this waiter when the policy looks.
                let _left = LeftLine(&s.policy);
                let down = Down::default();
                let acquire = async {
                    let waited = match &s.local {
                        None => s.sem.wait_from(busy, &down).await,
                        Some(local) => {
                            let class = local.class_of(options.class_named());
                            let place = local.join(class);
                            wait_classed(&s.sem, &s.policy, &place, busy, &down).await
                        }
                    };
                    waited.map_err(|e| {
                        let reason = S::reason(&e);
                        down.set(Some(e));
                        reason
                    })
                };
                let timed_out = || {
                    if down.is_down() {
                        RejectReason::Unavailable
                    } else {
                        RejectReason::Timeout
                    }
                };
                let waited = s.policy.wait_or(acquire, line, timed_out).await;
                waited.map_err(|rejected| match down.take() {
                    Some(e) if rejected.reason() == RejectReason::Unavailable => {
                        rejected.caused_by(e)
                    }
                    _ => rejected,
                })?
            }
            Err(e) => return Err(refused::<S>(&s.policy, e)),
        };
        Ok(self.admitted(lease, waited, outcome))
    }

    /// Keeps the retry hint's limit in step with the limit in the store.
    fn note_limit(&self) {
        let s = &self.shared;
        s.policy.note_limit(s.sem.local().limit_seen());
    }

    /// A grant without waiting; its hold time is measured as the policy
    /// samples busy grants (a lease is always a scarce permit).
    fn at_once(&self) -> Waited {
        Waited {
            waited: Duration::ZERO,
            since: self.shared.policy.clock_in(true),
        }
    }

    fn admitted(
        &self,
        lease: LeasedPermit<S>,
        waited: Waited,
        outcome: CallOutcome,
    ) -> LeasedBulkheadPermit<S> {
        let s = &self.shared;
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        let permit = LeasedBulkheadPermit {
            guard: Guard::new(
                Lease {
                    shared: s.clone(),
                    lease: Some(lease),
                },
                waited.since,
                outcome,
            ),
        };
        s.policy.permitted(waited.waited);
        permit
    }

    /// A snapshot of this process's view: `max_concurrent_calls` is the
    /// limit as last read from the store, `in_flight` this process's calls.
    pub fn metrics(&self) -> Metrics {
        let s = &*self.shared;
        s.policy.metrics(
            s.sem.local().limit_seen(),
            s.in_flight.load(Ordering::SeqCst),
            s.sem.local().is_closed(),
        )
    }

    /// Changes the limit for every client (kept in the store; waiters
    /// everywhere are served when it grows).
    ///
    /// # Errors
    ///
    /// The store's error if the change could not be made.
    ///
    /// # Cancel safety
    ///
    /// As the semaphore's `set_limit`: dropped before the answer, the
    /// change may or may not have been made.
    pub async fn set_max_concurrent_calls(&self, limit: usize) -> Result<(), S::LimitError> {
        self.shared.sem.set_limit(limit).await
    }

    /// Rejects this process's waiting and later calls with
    /// [`RejectReason::Closed`]; calls in flight finish.
    pub fn close(&self) {
        self.shared.sem.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.sem.local().is_closed()
    }

    /// Resolves once none of this process's calls is in flight.
    ///
    /// # Cancel safety
    ///
    /// It holds nothing: dropping it only stops the wait.
    pub async fn wait_idle(&self) {
        let s = &*self.shared;
        s.idle
            .wait(|| s.in_flight.load(Ordering::SeqCst) == 0)
            .await;
    }
}

/// The rejection for an acquire that failed with `e`; the error is its
/// source when it made the call `Unavailable`.
#[cold]
/// The wait of a caller on a bulkhead with priority classes or adaptive
/// LIFO, from its first attempt (`busy`), in its `place` in this process's
/// line: a lease handed to it by another waiter, or one the store grants
/// it, which it hands on to the waiter of this process it is owed to if
/// that is another (see `LocalLine`), then going back in the store's line,
/// at its end.
async fn wait_classed<S: LeaseStore>(
    sem: &S,
    policy: &Policy,
    place: &Place<'_, LeasedPermit<S>>,
    busy: S::Busy,
    down: &Down<S::Error>,
) -> Result<LeasedPermit<S>, S::Error> {
    let mut next = Attempt::Busy(busy);
    loop {
        let lease = match next {
            Attempt::Granted(lease) => lease,
            Attempt::Busy(busy) => {
                let mut own = pin!(sem.wait_from(busy, down));
                let granted = poll_fn(|cx| {
                    if let Poll::Ready(lease) = place.poll_given(cx) {
                        return Poll::Ready(Ok(lease));
                    }
                    own.as_mut().poll(cx).map(Err)
                })
                .await;
                match granted {
                    // Handed on by another waiter: its own wait is done.
                    Ok(given) => return Ok(given),
                    Err(own) => own?,
                }
            }
        };
        if let Err(lease) = place.hand_on(lease, policy.serves_newest()) {
            return Ok(lease);
        }
        next = sem.first_attempt().await?;
    }
}

fn refused<S: LeaseStore>(policy: &Policy, e: S::Error) -> Rejected {
    let rejected = policy.reject_now(S::reason(&e));
    match rejected.reason() {
        RejectReason::Unavailable => rejected.caused_by(e),
        _ => rejected,
    }
}

/// Tells the policy a waiter left this process's line (served, rejected
/// or dropped), as the local bulkhead's waiters do: with controlled delay,
/// an empty line ends an overload.
struct LeftLine<'a>(&'a Policy);

impl Drop for LeftLine<'_> {
    fn drop(&mut self) {
        self.0.left_line();
    }
}

impl<S: LeaseStore> fmt::Debug for LeasedBulkhead<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBulkhead")
            .field("name", &self.shared.policy.name())
            .field("semaphore", &self.shared.sem)
            .field("in_flight", &self.shared.in_flight.load(Ordering::Relaxed))
            .field("queued", &self.shared.policy.queued())
            .finish()
    }
}

/// A lease held through a [`LeasedBulkhead`]: the call counts as in flight
/// until it is dropped or [released](Self::release).
#[must_use = "dropping the permit ends the call it guards at once"]
pub struct LeasedBulkheadPermit<S: LeaseStore> {
    guard: Guard<Lease<S>>,
}

/// A lease, as a guard's [`Source`]: giving it back drops the lease
/// (which releases it in the store, in the background) and counts the call
/// out of this process's in-flight calls. `lease` is `None` once
/// [`release`](LeasedBulkheadPermit::release) took it.
struct Lease<S: LeaseStore> {
    shared: Arc<Shared<S>>,
    lease: Option<LeasedPermit<S>>,
}

impl<S: LeaseStore> Source for Lease<S> {
    fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    fn give_back(&mut self) {
        drop(self.lease.take());
        let s = &*self.shared;
        if s.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            s.idle.notify();
        }
    }
}

impl<S: LeaseStore> LeasedBulkheadPermit<S> {
    fn lease(&self) -> &LeasedPermit<S> {
        self.guard
            .source()
            .lease
            .as_ref()
            .expect("the lease is only taken on release")
    }

    /// The grant's fencing token: it increases with every grant of the
    /// semaphore.
    pub fn fence(&self) -> u64 {
        self.lease().fence()
    }

    /// Whether the lease is lost: true from its local deadline on, without
    /// waiting for any task.
    pub fn is_lost(&self) -> bool {
        self.lease().lost_reason().is_some()
    }

    /// Resolves when the lease is lost.
    pub fn lost(&self) -> Lost {
        self.lease().lost()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease().lost_reason()
    }

    /// Marks how the guarded work ended, for the observer.
    pub fn set_outcome(&mut self, outcome: CallOutcome) {
        self.guard.set_outcome(outcome);
    }

    /// Releases the lease now and reports whether it was still held.
    ///
    /// # Errors
    ///
    /// As the semaphore permit's `release`: an overrun, or the store's
    /// error.
    ///
    /// # Cancel safety
    ///
    /// The lease is released in the background if the future is dropped
    /// first.
    pub async fn release(mut self) -> Result<(), S::ReleaseError> {
        let lease = self.guard.source_mut().lease.take();
        let released = lease.expect("released once").release().await;
        // If this future is dropped before here, dropping `self` ends the
        // call all the same.
        self.guard.finish();
        released
    }
}

impl<S: LeaseStore> fmt::Debug for LeasedBulkheadPermit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBulkheadPermit")
            .field("bulkhead", &self.guard.source().shared.policy.name())
            .field("lease", &self.guard.source().lease)
            .finish()
    }
}
