//! The bulkhead: a semaphore wrapped in the policy people use to guard a
//! downstream dependency.
//!
//! # Implementation notes
//!
//! A bulkhead is an `Arc<Shared>` around one fair [`Semaphore`] with
//! `max_concurrent_calls` permits. Each admitted call holds one permit; the
//! calls in flight are therefore `limit - balance`, computed rather than
//! counted, so admitting and finishing a call costs the semaphore's two CASes
//! (take, give back) plus one relaxed counter increment (`permitted`).
//!
//! * **Fast path.** `try_take(1)` on the semaphore (`admit_now`). Only when
//!   it fails does the policy apply: fail fast (`max_wait == 0`), else the
//!   caller waits on the semaphore's FIFO queue (with `max_queue`, after
//!   reserving a place in the bounded line: `waiting`, a counter with
//!   `fetch_add` and undo; without it, the semaphore's queue is the line),
//!   raced against an inline sleep for `max_wait` that is armed only once
//!   the acquire is pending. `call` does all of it in one hand-written
//!   future ([`Call`], `call.rs`); `acquire` in `Policy::wait_in`. Nothing is
//!   allocated on any path.
//! * **Limit changes** run under a small mutex that only
//!   `set_max_concurrent_calls` and readers of `in_flight` take: growing is
//!   `add_permits` (waiters are served at once), shrinking is
//!   `reduce_permits` (the balance may go negative; calls in flight finish,
//!   and nobody is admitted until enough have). Neither blocks.
//! * **Idle.** A permit whose return brings the balance up to the limit
//!   notifies the bulkhead's `Idle` (`idle.rs`); `wait_idle` re-checks under the
//!   limit's mutex, so a racing limit change cannot make it miss the moment.
//! * **Observers** run after the state change they report, with no lock
//!   held, each contained (`catch_unwind`) so that one that panics cannot
//!   keep the others from an event; time is only measured when an observer
//!   is installed or a hold time is sampled.
//! * **A permit handed to a cancelled waiter** goes back through the
//!   semaphore, not a guard: every waiter leaves the line through
//!   `Shared::left_line`, which checks for idle unless the waiter leaves
//!   holding its permit.
//! * **Priority classes** (`priorities`): the seats live in `classes.rs`
//!   (`Seats` and one line per class under one mutex) and the semaphore
//!   has no permits and is closed, so a plain call's `try_take` fails into
//!   the closed branch, which looks for them (a plain call is of the least important class
//!   and never waits); `Local::give_back` tests `classes` once. A classed
//!   waiter is a `Seating` (`seating.rs`) with its own `max_wait` sleep.

mod admission;
pub(crate) mod builder;
mod call;
mod classes;
mod delay;
mod engine;
pub(crate) mod error;
pub(crate) mod export;
pub(crate) mod guard;
pub(crate) mod idle;
mod leak;
mod line_timer;
mod metrics;
pub(crate) mod name;
pub(crate) mod observer;
mod options;
pub(crate) mod permit;
pub(crate) mod policy;
pub(crate) mod reason;
pub(crate) mod run;
pub(crate) mod seating;
mod stages;
pub(crate) mod wait;

#[cfg(feature = "tower")]
pub(crate) use admission::{Admission, Admissions};
pub use builder::BulkheadBuilder;
pub use call::Call;
use call::CallWith;
pub use error::{BuildError, BuildErrorKind, BulkheadError, CallTimeout, RejectReason, Rejected};
pub use metrics::Metrics;
pub use observer::{CallOutcome, Observer};
pub use options::CallOptions;
pub use permit::BulkheadPermit;
#[cfg(feature = "tower")]
pub(crate) use seating::AdmissionAs;

use core::fmt;
use core::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idle::Idle;

use crate::semaphore::Semaphore;
pub(crate) use permit::Admitted;
use policy::Policy;
use run::run_blocking;
use wait::Line;

/// Limits how many calls reach a downstream dependency at once, and decides
/// what happens to the rest: wait in a fair line (for at most `max_wait`,
/// and only if the line is shorter than `max_queue`), or be rejected at once
/// with a typed reason.
///
/// A `Bulkhead` is cheap to clone; clones share one state. It works on any
/// executor: timers come from the runtime feature you enable or from a
/// built-in timer thread (see [`timer`](crate::timer)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::{Bulkhead, BulkheadError};
///
/// # futures::executor::block_on(async {
/// let bh = Bulkhead::builder()
///     .name("invoice-provider")
///     .max_concurrent_calls(5)
///     .max_wait(Duration::from_secs(3))
///     .max_queue(1_000)
///     .call_timeout(Duration::from_secs(10))
///     .build()?;
///
/// let sent: Result<u32, BulkheadError<std::io::Error>> =
///     bh.call(async { Ok(42) }).await;
/// assert_eq!(sent.unwrap(), 42);
/// assert_eq!(bh.metrics().permitted(), 1);
/// # Ok::<(), watertight::BuildError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Bulkhead {
    shared: Arc<Shared>,
}

/// The state every clone of a bulkhead shares.
pub(crate) struct Shared {
    pub(crate) policy: Policy,
    /// In an `Arc` of its own, so that a future that owns the bulkhead can
    /// also own its waiting acquire (`Semaphore::acquire_owned`, see
    /// [`Admission`]).
    pub(crate) sem: Arc<Semaphore>,
    /// Priority classes, if on (`BulkheadBuilder::priorities`): then the
    /// seats live here, and `sem` has no permits and is closed (see
    /// `classes.rs`).
    pub(crate) classes: Option<Box<classes::Classes>>,
    /// The configured limit. Held while changing the limit and while reading
    /// `limit - balance`, so the two are read as one.
    limit: Mutex<usize>,
    /// A copy of `limit` for lock-free reads (the idle check on release).
    limit_now: AtomicUsize,
    /// Notified when the balance comes back up to the limit.
    idle: Idle,
}

impl Bulkhead {
    /// Starts configuring a bulkhead.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("db").max_concurrent_calls(10).build().unwrap();
    /// assert_eq!(bh.name(), "db");
    /// ```
    pub fn builder() -> BulkheadBuilder {
        BulkheadBuilder::new()
    }

    /// The bulkhead's name, as given to the builder.
    pub fn name(&self) -> &str {
        self.shared.policy.name()
    }

    /// Runs `call` once a permit is granted, then gives the permit back.
    ///
    /// The future is not polled at all if the call is rejected. If
    /// `call_timeout` is set and the call runs longer, it is dropped and
    /// [`BulkheadError::CallTimeout`] returned.
    ///
    /// # Errors
    ///
    /// [`BulkheadError::Rejected`] if the call was not admitted (see
    /// [`RejectReason`]), [`BulkheadError::CallTimeout`] if it ran out of
    /// time, [`BulkheadError::Inner`] with the call's own error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future while it waits leaves the line; while
    /// the call runs, it drops the call and releases the permit. A panic in
    /// the call releases the permit too.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, BulkheadError};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    /// let failed = bh.call(async { Err::<(), _>("provider said no") }).await;
    /// assert_eq!(failed.unwrap_err(), BulkheadError::Inner("provider said no"));
    /// # });
    /// ```
    #[inline]
    pub fn call<F, T, E>(&self, call: F) -> Call<'_, F>
    where
        F: Future<Output = Result<T, E>>,
    {
        Call::new(&self.shared, call)
    }

    /// [`call`](Self::call) with [`CallOptions`]: a deadline
    /// (deadline-aware admission), a `max_wait` of its own, a priority
    /// class. What each does is said on [`CallOptions`];
    /// `call_with(CallOptions::new(), f)` is `call(f)`.
    ///
    /// With a class, on a bulkhead with
    /// [`priorities`](crate::BulkheadBuilder::priorities), the call takes
    /// a free seat if nobody waits, else waits in its class's line, served
    /// by the classes' rules (a seat that frees goes first to a class
    /// under its reserved share, then by importance); a call of a less
    /// important class waiting in a full line (`max_queue`) may be
    /// displaced by it ([`RejectReason::Displaced`]), and a deadline's
    /// expected wait counts only the waiters served before it. A call that
    /// names no class is of the least important one, and takes a seat only
    /// if one is free and nobody waits.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), and [`BulkheadError::Rejected`] with
    /// [`RejectReason::WontMakeDeadline`] or [`RejectReason::Displaced`].
    ///
    /// # Cancel safety
    ///
    /// As [`call`](Self::call): dropped while waiting, it leaves its line
    /// (a permit or seat handed to it meanwhile goes to the next caller it
    /// is owed to); while the call runs, it drops the call and gives the
    /// permit back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::{Bulkhead, BulkheadError, CallOptions, RejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    /// let by = CallOptions::new().deadline(Instant::now() + Duration::from_secs(5));
    /// assert_eq!(bh.call_with(by, async { Ok::<_, ()>(7) }).await, Ok(7));
    ///
    /// let too_late = CallOptions::new().deadline(Instant::now() - Duration::from_millis(1));
    /// match bh.call_with(too_late, async { Ok::<_, ()>(8) }).await {
    ///     Err(BulkheadError::Rejected(r)) => {
    ///         assert_eq!(r.reason(), RejectReason::WontMakeDeadline)
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # });
    /// ```
    pub fn call_with<F, T, E>(
        &self,
        options: CallOptions,
        call: F,
    ) -> impl Future<Output = Result<T, BulkheadError<E>>>
    where
        F: Future<Output = Result<T, E>>,
    {
        // Either future built in place, not moved into another on its
        // first poll: a `Call` is some 300 bytes.
        let Some(class) = self.classed(&options) else {
            return call::Either::Left {
                future: CallWith::new(&self.shared, options, call),
            };
        };
        call::Either::Right {
            future: async move {
                let shared = &*self.shared;
                // Already reported as permitted, its outcome `Cancelled`
                // until set: dropped or unwound through while the call
                // runs, it gives the seat back as cancelled.
                let admission = seating::AdmissionAs::new(self.shared.clone(), class, options);
                let mut permit = admission.await?;
                let (result, outcome) = shared.policy.run(shared.policy.traced(call)).await;
                permit.set_outcome(outcome);
                result
            },
        }
    }

    /// [`call`](Self::call) for a plain thread: blocks the thread until a
    /// permit is granted (under the same `max_wait`, line and policy as an
    /// async caller, in the same line), runs `call` on it, then gives the
    /// permit back. Async and blocking callers share one bulkhead.
    ///
    /// A closure cannot be stopped from outside, so `call_timeout` does not
    /// cut it short: it runs to the end and its result is returned (its
    /// time still counts in the hold times, and the leak watch still sees
    /// a call held too long). A panic in `call` gives the permit back and
    /// is reported as [`CallOutcome::Panicked`] before it unwinds on.
    ///
    /// Never call it inside an async task: it blocks the executor's thread
    /// (and on a single-threaded runtime, the timer that bounds the wait).
    /// Use it on plain threads, or in `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// [`BulkheadError::Rejected`] if the call was not admitted,
    /// [`BulkheadError::Inner`] with the call's own error.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// let bh = Bulkhead::builder()
    ///     .name("scanner")
    ///     .max_concurrent_calls(1)
    ///     .max_wait(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(bh.call_blocking(|| Ok::<_, ()>(7)), Ok(7));
    ///
    /// let held = bh.try_acquire().unwrap();
    /// let err = bh.call_blocking(|| Ok::<_, ()>(8)).unwrap_err();
    /// assert_eq!(err.reason(), Some(RejectReason::Timeout));
    /// drop(held);
    /// ```
    pub fn call_blocking<T, E>(
        &self,
        call: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, BulkheadError<E>> {
        let mut permit = crate::blocking::block_on(self.acquire())?;
        run_blocking(call, |outcome| permit.set_outcome(outcome)).map_err(BulkheadError::Inner)
    }

    /// Waits for a permit under the bulkhead's policy, for callers that
    /// manage the guarded work themselves. The call counts as in flight
    /// until the permit is dropped.
    ///
    /// # Errors
    ///
    /// [`Rejected`], with the [reason](Rejected::reason).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives up its place in line and
    /// nothing else.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let permit = bh.acquire().await.unwrap();
    /// // ... the guarded work ...
    /// drop(permit);
    /// # });
    /// ```
    pub async fn acquire(&self) -> Result<BulkheadPermit, Rejected> {
        self.acquire_with(CallOptions::new()).await
    }

    /// [`acquire`](Self::acquire) with [`CallOptions`]: admitted, rejected
    /// at once or bounded in its wait as
    /// [`call_with`](Self::call_with) says.
    ///
    /// # Errors
    ///
    /// [`Rejected`], with the [reason](Rejected::reason), among them
    /// [`RejectReason::WontMakeDeadline`] and [`RejectReason::Displaced`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives up its place in line (a
    /// seat handed to it meanwhile goes to the next caller it is owed to)
    /// and nothing else.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::{Bulkhead, CallOptions, RejectReason};
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).priorities(&[1, 1]).build().unwrap();
    /// let soon = CallOptions::new().class(1).deadline(Instant::now() + Duration::from_secs(1));
    /// let permit = bh.acquire_with(soon).await.unwrap();
    /// assert_eq!(bh.metrics().in_flight(), 1);
    /// drop(permit);
    /// let passed = CallOptions::new().class(0).deadline(Instant::now() - Duration::from_secs(1));
    /// let rejected = bh.acquire_with(passed).await.unwrap_err();
    /// assert_eq!(rejected.reason(), RejectReason::WontMakeDeadline);
    /// # });
    /// ```
    pub async fn acquire_with(&self, options: CallOptions) -> Result<BulkheadPermit, Rejected> {
        if let Some(class) = self.classed(&options) {
            let mut permit = seating::AdmissionAs::new(self.shared.clone(), class, options).await?;
            // A permit the caller manages: released, not cancelled, unless
            // the caller says otherwise.
            permit.set_outcome(CallOutcome::Released);
            return Ok(permit);
        }
        let shared = &*self.shared;
        let mut line = Line::default();
        let now = if options.waits_plainly() {
            shared.admit_now(true)
        } else {
            shared.admit_now_with(&options, &mut line)
        };
        let admitted = match now {
            Some(now) => now?,
            None => shared.admit_waiting_in(line).await?,
        };
        let permit = BulkheadPermit::new(self.shared.clone(), admitted);
        self.shared.policy.permitted(admitted.waited());
        Ok(permit)
    }

    /// Takes a permit only if one is free now; never waits, whatever
    /// `max_wait` says.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with [`RejectReason::Full`] or [`RejectReason::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, RejectReason};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// let _permit = bh.try_acquire().unwrap();
    /// assert_eq!(bh.try_acquire().unwrap_err().reason(), RejectReason::Full);
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<BulkheadPermit, Rejected> {
        let shared = &*self.shared;
        if let Some(Err(rejected)) = shared.admit_now(false) {
            return Err(rejected);
        }
        let permit = BulkheadPermit::new(self.shared.clone(), Admitted::Now);
        shared.policy.permitted(Duration::ZERO);
        Ok(permit)
    }

    /// [`try_acquire`](Self::try_acquire) with [`CallOptions`]: with a
    /// class, a seat of that class only if one is free and nobody waits;
    /// with a deadline, deadline-aware admission first. A `max_wait` of
    /// its own changes nothing: it never waits.
    ///
    /// # Errors
    ///
    /// [`Rejected`] with [`RejectReason::Full`], [`RejectReason::Closed`]
    /// or [`RejectReason::WontMakeDeadline`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, CallOptions, RejectReason};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).priorities(&[1, 1]).build().unwrap();
    /// let _held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    /// let next = bh.try_acquire_with(CallOptions::new().class(0)).unwrap_err();
    /// assert_eq!(next.reason(), RejectReason::Full);
    /// ```
    #[inline]
    pub fn try_acquire_with(&self, options: CallOptions) -> Result<BulkheadPermit, Rejected> {
        if options.has_deadline() || options.class_named().is_some() {
            return self.try_acquire_judged(&options);
        }
        self.try_acquire()
    }

    /// [`try_acquire_with`](Self::try_acquire_with) for a caller with a
    /// deadline or a class.
    #[cold]
    fn try_acquire_judged(&self, options: &CallOptions) -> Result<BulkheadPermit, Rejected> {
        let shared = &*self.shared;
        let Some(class) = self.classed(options) else {
            shared
                .policy
                .line_for(options, shared.free_now(), shared.policy.queued())?;
            return self.try_acquire();
        };
        match Shared::seat_with(shared, class, options, false)? {
            seating::Seat::Now => {}
            seating::Seat::Wait(_) => unreachable!("a caller that may not wait never queues"),
        }
        let permit = BulkheadPermit::of_class(self.shared.clone(), class, Admitted::Now);
        shared.policy.permitted(Duration::ZERO);
        Ok(permit)
    }

    /// The class a caller with `options` is seated as, on a bulkhead with
    /// priority classes and a caller that names one; `None` for a plain
    /// caller (see [`call_with`](Self::call_with)).
    #[inline]
    pub(crate) fn classed(&self, options: &CallOptions) -> Option<usize> {
        let class = options.class_named()?;
        self.shared.classes.as_ref()?;
        Some(self.shared.class_of(class))
    }

    /// Per priority class, in order (class 0 first): the seats it is
    /// guaranteed at the current limit, the seats it holds and its callers
    /// waiting now. Empty without classes.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Bulkhead, CallOptions};
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(10).priorities(&[50, 30, 20]).build().unwrap();
    /// let _p = bh.try_acquire_with(CallOptions::new().class(2)).unwrap();
    /// let seats = bh.priority_seats();
    /// assert_eq!(seats.iter().map(|c| c.reserved).collect::<Vec<_>>(), [5, 3, 2]);
    /// assert_eq!((seats[2].held, seats[2].waiting), (1, 0));
    /// bh.set_max_concurrent_calls(20);
    /// assert_eq!(bh.priority_seats()[0].reserved, 10);
    /// ```
    pub fn priority_seats(&self) -> Vec<ClassSeats> {
        self.shared
            .classes
            .as_deref()
            .map(classes::Classes::per_class)
            .unwrap_or_default()
            .into_iter()
            .map(|(reserved, held, waiting)| ClassSeats {
                reserved,
                held,
                waiting,
            })
            .collect()
    }

    /// A snapshot of the bulkhead's gauges and totals.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().name("ocr").max_concurrent_calls(3).build().unwrap();
    /// let m = bh.metrics();
    /// assert_eq!((m.name(), m.max_concurrent_calls(), m.in_flight()), ("ocr", 3, 0));
    /// ```
    pub fn metrics(&self) -> Metrics {
        let s = &*self.shared;
        let (limit, in_flight) = s.limit_and_in_flight();
        s.policy.metrics(limit, in_flight, s.is_closed())
    }

    /// Changes the limit on calls in flight, at once and without blocking.
    ///
    /// Growing admits waiting callers right away. Shrinking never cuts a
    /// call short: calls in flight above the new limit finish, and nobody
    /// new is admitted until in-flight calls fall below it. `0` pauses
    /// admission (callers wait or are rejected by the policy).
    ///
    /// # Panics
    ///
    /// Panics if `limit` exceeds [`Semaphore::MAX_PERMITS`]. A waiter's
    /// waker that panics as it is woken is resumed here, once every waiter
    /// served has been woken (as the [`Semaphore`]'s wakers are).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(3).build().unwrap();
    /// let held: Vec<_> = (0..3).map(|_| bh.try_acquire().unwrap()).collect();
    /// bh.set_max_concurrent_calls(1);
    /// assert_eq!(bh.metrics().in_flight(), 3); // nobody is cut short
    /// drop(held);
    /// assert_eq!(bh.metrics().available(), 1);
    /// ```
    pub fn set_max_concurrent_calls(&self, limit: usize) {
        assert!(
            limit <= Semaphore::MAX_PERMITS,
            "max_concurrent_calls must not exceed Semaphore::MAX_PERMITS"
        );
        let s = &*self.shared;
        let mut wakers = Vec::new();
        {
            let mut current = s.limit.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(classes) = s.classes.as_deref() {
                // The nominal seats follow; seats a higher limit frees are
                // handed out by the classes' rules.
                wakers = classes.set_limit(limit, &s.policy);
            } else if limit > *current {
                s.sem.add_permits(limit - *current);
            } else {
                s.sem.reduce_permits(*current - limit);
            }
            *current = limit;
            s.limit_now.store(limit, Ordering::Release);
            s.policy.note_limit(limit);
        }
        // In-flight counts against a new limit: let `wait_idle` look again.
        s.became_idle();
        classes::wake_all(wakers);
    }

    /// Rejects every waiting and every later call with
    /// [`RejectReason::Closed`]. Calls in flight run to the end and return
    /// their permits; use [`wait_idle`](Self::wait_idle) to wait for them.
    ///
    /// # Panics
    ///
    /// If a waiter's waker panics as it is woken: resumed once every
    /// waiter has been rejected and woken.
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
    pub fn close(&self) {
        self.shared.sem.close();
        let wakers = match self.shared.classes.as_deref() {
            Some(classes) => classes.close(&self.shared.policy),
            None => Vec::new(),
        };
        // Rejected waiters hold nothing, but let `wait_idle` look again.
        self.shared.became_idle();
        classes::wake_all(wakers);
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    /// assert!(!bh.is_closed());
    /// bh.close();
    /// assert!(bh.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Resolves once no call is in flight: the graceful-shutdown companion
    /// of [`close`](Self::close).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Bulkhead;
    ///
    /// # futures::executor::block_on(async {
    /// let bh = Bulkhead::builder().max_concurrent_calls(2).build().unwrap();
    /// let permit = bh.try_acquire().unwrap();
    /// bh.close();
    /// std::thread::spawn(move || drop(permit));
    /// bh.wait_idle().await;
    /// assert_eq!(bh.metrics().in_flight(), 0);
    /// # });
    /// ```
    ///
    /// # Cancel safety
    ///
    /// It holds nothing: dropping it only stops the wait.
    pub async fn wait_idle(&self) {
        let s = &*self.shared;
        s.idle.wait(|| s.limit_and_in_flight().1 == 0).await;
    }
}

impl Bulkhead {
    /// A handle that does not keep the bulkhead alive (for the adaptive
    /// limiter, which the bulkhead itself holds as its observer).
    pub(crate) fn downgrade(&self) -> std::sync::Weak<Shared> {
        Arc::downgrade(&self.shared)
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// One priority class's seats, from [`Bulkhead::priority_seats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassSeats {
    /// The seats the class is guaranteed: its share of the limit.
    pub reserved: usize,
    /// The seats it holds now (more than `reserved` while it borrows).
    pub held: usize,
    /// Its callers waiting now.
    pub waiting: usize,
}

/// Counts a `wait_idle` future as watching until it is dropped.
impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, in_flight) = self.shared.limit_and_in_flight();
        f.debug_struct("Bulkhead")
            .field("name", &self.shared.policy.name())
            .field("max_concurrent_calls", &limit)
            .field("in_flight", &in_flight)
            .field("queued", &self.shared.policy.queued())
            .field("closed", &self.shared.is_closed())
            .field("timer", &self.shared.policy.clock())
            .finish()
    }
}
