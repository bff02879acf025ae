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

pub(crate) mod builder;
mod call;
mod classes;
mod delay;
pub(crate) mod error;
mod export;
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
pub(crate) mod wait;

pub use builder::BulkheadBuilder;
pub use call::Call;
use call::CallWith;
pub use error::{BuildError, BuildErrorKind, BulkheadError, RejectReason, Rejected};
pub use metrics::Metrics;
pub use observer::{CallOutcome, Observer};
pub use options::CallOptions;
pub use permit::BulkheadPermit;
#[cfg(feature = "tower")]
pub(crate) use seating::AdmissionAs;

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idle::Idle;

use pin_project_lite::pin_project;

use crate::error::TryAcquireError;
use crate::futures::{Acquire, AcquireOwned};
use crate::semaphore::Semaphore;
pub(crate) use permit::Admitted;
use policy::Policy;
use wait::{Line, Waiting};

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
        if options.deadline.is_some() || options.class_named().is_some() {
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

    /// One call's admission as a named `'static` future that owns a handle
    /// of the bulkhead (for the tower layer's response future), with
    /// `options` as [`call_with`](Self::call_with) takes them: an
    /// [`Admission`], or for a classed caller on a bulkhead with priority
    /// classes, a [`seating::AdmissionAs`].
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn admission(&self, options: CallOptions) -> Admissions {
        if let Some(class) = self.classed(&options) {
            let classed = seating::AdmissionAs::new(self.shared.clone(), class, options);
            return Admissions::Classed(classed);
        }
        Admissions::Plain(Admission {
            shared: Some(self.shared.clone()),
            options: (!options.waits_plainly()).then_some(options),
            waiting: None,
        })
    }
}

impl Shared {
    #[inline]
    pub(crate) fn limit(&self) -> usize {
        self.limit_now.load(Ordering::Acquire)
    }

    /// A permit came back and the balance reached the limit: wake
    /// `wait_idle`, if anyone waits for it (it re-checks under the limit's
    /// lock, so a racing limit change is harmless).
    #[inline]
    pub(crate) fn became_idle(&self) {
        self.idle.notify();
    }

    /// An admitted call's permit, borrowed, as a guard whose outcome is
    /// `Cancelled` until it is set; the observers are told of the
    /// admission.
    #[inline]
    fn hold(&self, admitted: Admitted) -> permit::SeatHeld<&Shared> {
        let held = permit::held_plain(self, admitted, CallOutcome::Cancelled);
        self.policy.permitted(admitted.waited());
        held
    }

    /// A waiter left the line for good (see [`Policy::left_line`]). Unless
    /// it leaves holding the permit it was granted, a permit handed to it
    /// meanwhile went back through the semaphore, not a guard, and the
    /// bulkhead may be idle now: the one place that says so.
    #[inline]
    pub(crate) fn left_line(&self, holds_permit: bool) {
        self.policy.left_line();
        if !holds_permit {
            self.became_idle_maybe();
        }
    }

    /// A permit may have come back outside a guard (a granted waiter that
    /// was cancelled): wake `wait_idle` if the bulkhead is now empty.
    #[cold]
    fn became_idle_maybe(&self) {
        if let Some(classes) = self.classes.as_deref() {
            if classes.in_use_and_queued().0 == 0 {
                self.became_idle();
            }
            return;
        }
        if self.sem.available_permits() >= self.limit() as isize {
            self.became_idle();
        }
    }

    /// The configured limit and the calls in flight, read consistently.
    fn limit_and_in_flight(&self) -> (usize, usize) {
        let limit = self.limit.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(classes) = self.classes.as_deref() {
            return (*limit, classes.in_use_and_queued().0);
        }
        let in_flight = (*limit as isize - self.sem.available_permits()).max(0);
        (*limit, in_flight as usize)
    }

    /// The decision that needs no waiting: a permit taken at once
    /// (`Some(Ok)`), or a rejection (`Some(Err)`: closed, or full when the
    /// policy fails fast, or always when `may_wait` is false); `None` when
    /// the caller is to wait in line ([`admit_waiting_in`](Self::admit_waiting_in)).
    /// Nothing waiting-related is built on these paths, so they move
    /// nothing bigger than a pointer.
    #[inline]
    fn admit_now(&self, may_wait: bool) -> Option<Result<Admitted, Rejected>> {
        let reason = match self.sem.try_take(1) {
            Ok(()) => return Some(Ok(Admitted::Now)),
            // With priority classes the semaphore is closed from the start
            // (the seats are the classes'): a plain call finds them here,
            // off the paths that find a permit or find none.
            Err(TryAcquireError::Closed) => return Some(self.closed_or_classed()),
            Err(TryAcquireError::NoPermits) if may_wait && !self.policy.fails_fast() => {
                return None;
            }
            Err(TryAcquireError::NoPermits) => RejectReason::Full,
        };
        Some(Err(self.policy.reject_now(reason)))
    }

    /// [`admit_now`](Self::admit_now) on a closed semaphore: closed, or
    /// the classes' seats.
    #[cold]
    #[inline(never)]
    fn closed_or_classed(&self) -> Result<Admitted, Rejected> {
        if self.classes.is_some() {
            return self.admit_plain();
        }
        Err(self.policy.reject_now(RejectReason::Closed))
    }

    /// Whether the bulkhead was closed.
    pub(crate) fn is_closed(&self) -> bool {
        match self.classes.as_deref() {
            Some(classes) => classes.is_closed(),
            None => self.sem.is_closed(),
        }
    }

    /// [`admit_now`](Self::admit_now) with priority classes on: a plain
    /// call is of the least important class, and takes a seat only if one
    /// is free and nobody waits; it never waits.
    #[cold]
    #[inline(never)]
    fn admit_plain(&self) -> Result<Admitted, Rejected> {
        match Shared::seat(self, self.plain_class(), false, None)? {
            seating::Seat::Now => Ok(Admitted::Now),
            seating::Seat::Wait(_) => unreachable!("a plain call never waits for a classed seat"),
        }
    }

    /// The class of a call that names none: the least important one.
    #[inline]
    pub(crate) fn plain_class(&self) -> usize {
        self.classes.as_deref().map_or(0, classes::Classes::least)
    }

    /// Seats free now (permits, without classes).
    pub(crate) fn seats_left(&self) -> usize {
        match self.classes.as_deref() {
            Some(classes) => self.limit().saturating_sub(classes.in_use_and_queued().0),
            None => usize::try_from(self.sem.available_permits()).unwrap_or(0),
        }
    }

    /// Permits free now, for deadline-aware admission's expected wait:
    /// with priority classes, the seats free (the semaphore then has none).
    #[inline]
    fn free_now(&self) -> isize {
        match self.classes.as_deref() {
            Some(_) => isize::try_from(self.seats_left()).unwrap_or(isize::MAX),
            None => self.sem.available_permits(),
        }
    }

    /// Waits in line under the policy (the bounded line, `max_wait`, the
    /// limit `line` holds: see [`admit_now_with`](Self::admit_now_with));
    /// the waiting future and its timer live inline, so nothing is
    /// allocated. The caller wraps the permit in a guard, then reports it
    /// with `permitted`.
    async fn admit_waiting_in(&self, line: Line) -> Result<Admitted, Rejected> {
        let queued = Queued {
            shared: self,
            acquire: Some(self.sem.acquire()),
        };
        let ((), waited) = self.policy.wait_in(queued, line).await?;
        Ok(Admitted::Waited(waited))
    }

    /// [`admit_waiting_in`](Self::admit_waiting_in) (from `line`, if given) for
    /// a caller that waits for `gate` before it queues (see [`After`]).
    async fn admit_waiting_after<G: Future<Output = ()>>(
        &self,
        line: Option<Line>,
        gate: G,
    ) -> Result<Admitted, Rejected> {
        let after = After {
            queued: Queued {
                shared: self,
                acquire: Some(self.sem.acquire()),
            },
            gate,
            through: false,
        };
        let line = line.unwrap_or_default();
        let ((), waited) = self.policy.wait_in(after, line).await?;
        Ok(Admitted::Waited(waited))
    }

    /// [`admit_now`](Self::admit_now) for a call with `options` (a
    /// deadline, a wait of its own): the policy reads them first
    /// ([`Policy::line_for`]), which may reject the call at once and
    /// leaves in `line` how long it may wait.
    #[cold]
    fn admit_now_with(
        &self,
        options: &CallOptions,
        line: &mut Line,
    ) -> Option<Result<Admitted, Rejected>> {
        let (free, ahead) = (self.free_now(), self.policy.queued());
        if let Err(rejected) = self.policy.judge_into(options, free, ahead, line) {
            return Some(Err(rejected));
        }
        self.admit_now(options.may_wait())
    }
}

impl Shared {
    /// [`admit_now_with`](Self::admit_now_with) for an [`Admission`]: a
    /// call that is to wait gets its wait in `waiting` (with the limit its
    /// options left in its line), and `None`.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[cold]
    fn admit_now_with_owned(
        &self,
        options: &CallOptions,
        mut waiting: Pin<&mut Option<Waiting<QueuedOwned>>>,
    ) -> Option<Result<Admitted, Rejected>> {
        let mut line = Line::default();
        let now = self.admit_now_with(options, &mut line);
        if now.is_none() {
            let queued = QueuedOwned {
                acquire: self.sem.acquire_owned(),
            };
            waiting.set(Some(Waiting::in_line(queued, line)));
        }
        now
    }
}

pin_project! {
    /// The semaphore's acquire for a bulkhead: on drop, a permit it was
    /// handed but never delivered has gone back through the semaphore, so
    /// `wait_idle` looks again (the bulkhead may have emptied).
    struct Queued<'a> {
        shared: &'a Shared,
        #[pin]
        acquire: Option<Acquire<'a>>,
    }

    impl PinnedDrop for Queued<'_> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.acquire.is_some() {
                this.acquire.set(None);
                this.shared.left_line(false);
            }
        }
    }
}

impl Future for Queued<'_> {
    type Output = Result<(), RejectReason>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(acquire) = this.acquire.as_mut().as_pin_mut() else {
            return Poll::Ready(Err(RejectReason::Closed));
        };
        let out = ready!(Pin::new(&mut call::Take { acquire }).poll(cx));
        // Done: nothing to hand back on drop.
        this.acquire.set(None);
        this.shared.left_line(out.is_ok());
        Poll::Ready(out)
    }
}

pin_project! {
    /// A wait for a permit that first waits for its turn: `gate` resolves
    /// when the caller may queue for the semaphore (the keyed bulkhead's
    /// fair shares), then `queued` is polled. The policy's line (its
    /// count, `max_queue`, the wait's limits and controlled delay) covers
    /// both. Dropped, `queued` goes first (a permit it was handed goes
    /// back through the semaphore), then `gate` (which passes the turn
    /// on).
    struct After<'a, G> {
        #[pin]
        queued: Queued<'a>,
        #[pin]
        gate: G,
        through: bool,
    }
}

impl<G: Future<Output = ()>> Future for After<'_, G> {
    type Output = Result<(), RejectReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if !*this.through {
            ready!(this.gate.poll(cx));
            *this.through = true;
        }
        this.queued.poll(cx)
    }
}

/// One call's admission as [`Bulkhead::admission`] makes it: moved once
/// into the future that polls it, so the variants are not boxed.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Admissions {
    /// A plain call's.
    Plain(Admission),
    /// A classed caller's, on a bulkhead with priority classes.
    Classed(seating::AdmissionAs),
}

pin_project! {
    /// What `call` does before the call runs, as a future that owns a
    /// handle of the bulkhead instead of borrowing it, so that it is
    /// `'static` and can be named: the fast path (`admit_now`), else the
    /// wait under the policy, with the semaphore's owned acquire and the
    /// policy passed in at each poll. Resolves to the call's permit, owned
    /// by its guard and already reported as permitted, whose outcome is
    /// [`CallOutcome::Cancelled`] until set. Nothing is allocated.
    ///
    /// Dropping it while it waits leaves the line, as `call` does.
    pub(crate) struct Admission {
        // The bulkhead, until it moves into the permit; `None` once done.
        shared: Option<Arc<Shared>>,
        // The options of a call that has some, until the first poll has
        // looked at them (as `CallWith`'s).
        options: Option<CallOptions>,
        // The wait in line, once no permit was free at once; `None` again
        // when it ends. Its place in line is given back with `shared`'s
        // policy, by the drop if the wait did not end.
        #[pin]
        waiting: Option<Waiting<QueuedOwned>>,
    }

    impl PinnedDrop for Admission {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let (Some(shared), Some(waiting)) =
                (this.shared.as_deref(), this.waiting.as_mut().as_pin_mut())
            {
                waiting.leave(&shared.policy);
                // As `Queued` does: a permit handed to the acquire but never
                // delivered goes back through the semaphore.
                this.waiting.set(None);
                shared.left_line(false);
            }
        }
    }
}

impl Future for Admission {
    type Output = Result<BulkheadPermit, Rejected>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared = this
            .shared
            .as_deref()
            .expect("admission polled after completion");
        let out = if this.waiting.is_some() {
            ready!(poll_waiting(this.waiting.as_mut(), shared, cx))
        } else {
            let now = match this.options.take() {
                None => shared.admit_now(true),
                Some(options) => shared.admit_now_with_owned(&options, this.waiting.as_mut()),
            };
            match now {
                Some(now) => now,
                None => {
                    if this.waiting.is_none() {
                        let queued = QueuedOwned {
                            acquire: shared.sem.acquire_owned(),
                        };
                        this.waiting.set(Some(Waiting::new(queued)));
                    }
                    ready!(poll_waiting(this.waiting.as_mut(), shared, cx))
                }
            }
        };
        // Done either way: the handle moves into the permit, or goes.
        let shared = this.shared.take().expect("checked above");
        Poll::Ready(out.map(|admitted| {
            let class = shared.plain_class();
            BulkheadPermit::admitted(shared, class, admitted)
        }))
    }
}

/// Polls an [`Admission`]'s wait; once it ends, drops it (a rejected wait
/// gives its acquire back first, and `wait_idle` looks again, as on
/// `Queued`'s drop).
// Inline: its result, returned through memory, costs a store-forwarding
// stall on the tower layer's waiting path.
#[inline]
fn poll_waiting(
    mut waiting: Pin<&mut Option<Waiting<QueuedOwned>>>,
    shared: &Shared,
    cx: &mut Context<'_>,
) -> Poll<Result<Admitted, Rejected>> {
    let Some(wait) = waiting.as_mut().as_pin_mut() else {
        unreachable!("an admission polls its wait only while it waits");
    };
    let out = match wait.poll_with(cx, &shared.policy) {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(out) => out,
    };
    waiting.set(None);
    shared.left_line(out.is_ok());
    Poll::Ready(match out {
        Ok(((), waited)) => Ok(Admitted::Waited(waited)),
        Err(rejected) => Err(rejected),
    })
}

pin_project! {
    /// [`Queued`] for an [`Admission`]: the semaphore's owned acquire. What
    /// `Queued` does on drop, the admission does.
    struct QueuedOwned {
        #[pin]
        acquire: AcquireOwned,
    }
}

impl Future for QueuedOwned {
    type Output = Result<(), RejectReason>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().acquire.poll(cx) {
            Poll::Pending => Poll::Pending,
            // The permit now belongs to the call; its guard gives it back.
            Poll::Ready(Ok(permit)) => {
                permit.forget();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_closed)) => Poll::Ready(Err(RejectReason::Closed)),
        }
    }
}

/// Admission for a caller that borrows the bulkhead and runs the call
/// itself, as [`Bulkhead::call`] does: the keyed bulkhead's two stages.
/// The permit comes owned by its guard and already reported as permitted;
/// it goes back when the guard is dropped, as [`CallOutcome::Cancelled`]
/// unless the outcome is set. Nothing is allocated, and only the wait
/// borrows more than a pointer.
impl Bulkhead {
    /// The decision that needs no waiting (`admit_now`): `Some` with a
    /// permit or a rejection, `None` if the caller is to wait
    /// ([`hold_waiting_in`](Self::hold_waiting_in)). With `may_wait` false, a
    /// full bulkhead rejects, as [`try_acquire`](Self::try_acquire) does.
    // Always: returned through memory, its result costs a store-forwarding
    // stall on the keyed bulkhead's fast path (about 10 ns).
    #[inline(always)]
    pub(crate) fn hold_now(
        &self,
        may_wait: bool,
    ) -> Option<Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        match shared.admit_now(may_wait)? {
            Ok(admitted) => {
                let held = permit::held_plain(shared, admitted, CallOutcome::Cancelled);
                shared.policy.permitted(Duration::ZERO);
                Some(Ok(held))
            }
            Err(rejected) => Some(Err(rejected)),
        }
    }

    /// [`hold_now`](Self::hold_now) for a call with `options` (a deadline,
    /// a wait of its own): the policy reads them first, which may reject
    /// the call at once and leaves in `line` how long it may wait.
    #[cold]
    pub(crate) fn hold_now_with(
        &self,
        options: &CallOptions,
        line: &mut Line,
        may_wait: bool,
    ) -> Option<Result<permit::SeatHeld<&Shared>, Rejected>> {
        let shared = &*self.shared;
        let (free, ahead) = (shared.free_now(), shared.policy.queued());
        if let Err(rejected) = shared.policy.judge_into(options, free, ahead, line) {
            return Some(Err(rejected));
        }
        self.hold_now(may_wait && options.may_wait())
    }

    /// The wait in line under the policy, after [`hold_now`](Self::hold_now)
    /// or [`hold_now_with`](Self::hold_now_with) said `None`, from the
    /// `line` the latter left (else the default).
    pub(crate) async fn hold_waiting_in(
        &self,
        line: Line,
    ) -> Result<permit::SeatHeld<&Shared>, Rejected> {
        let shared = &*self.shared;
        let admitted = shared.admit_waiting_in(line).await?;
        Ok(shared.hold(admitted))
    }

    /// [`hold_waiting_in`](Self::hold_waiting_in) for a caller that waits for
    /// `gate` (its turn) before it queues for a permit, within the same
    /// wait in line (see [`After`]); with `line`, a wait that
    /// [`hold_now_with`](Self::hold_now_with) or [`judge`](Self::judge)
    /// looked at. The gate is dropped when the wait ends.
    pub(crate) async fn hold_waiting_after<G: Future<Output = ()>>(
        &self,
        line: Option<Line>,
        gate: G,
    ) -> Result<permit::SeatHeld<&Shared>, Rejected> {
        let shared = &*self.shared;
        let admitted = shared.admit_waiting_after(line, gate).await?;
        Ok(shared.hold(admitted))
    }

    /// [`acquire`](Self::acquire) (with `line`, the wait of
    /// [`acquire_with`](Self::acquire_with), which [`judge`](Self::judge)
    /// looked at) for a caller that waits for `gate` first, as
    /// [`hold_waiting_after`](Self::hold_waiting_after).
    pub(crate) async fn acquire_after<G: Future<Output = ()>>(
        &self,
        line: Option<Line>,
        gate: G,
    ) -> Result<BulkheadPermit, Rejected> {
        let admitted = self.shared.admit_waiting_after(line, gate).await?;
        let permit = BulkheadPermit::new(self.shared.clone(), admitted);
        self.shared.policy.permitted(admitted.waited());
        Ok(permit)
    }

    /// The policy's reading of a call's `options` alone (no permit
    /// taken), for a caller that is to wait anyway: `Err` if it is
    /// rejected at once, else the line it waits in.
    #[cold]
    pub(crate) fn judge(&self, options: &CallOptions) -> Result<Line, Rejected> {
        let shared = &*self.shared;
        shared
            .policy
            .line_for(options, shared.free_now(), shared.policy.queued())
    }

    /// The global stage of a keyed caller that names a class, on a
    /// bulkhead with priority classes (see [`classed`](Self::classed)): a
    /// seat now, already reported as permitted (`Ok(Ok)`), or the wait in
    /// its class's line (`Ok(Err)`: await it, then [`seat_after`](Self::seat_after)).
    #[cold]
    pub(crate) fn seat_now(
        &self,
        class: usize,
        options: &CallOptions,
        may_wait: bool,
    ) -> Result<Result<permit::SeatHeld<&Shared>, seating::Seating<&Shared>>, Rejected> {
        let shared = &*self.shared;
        Ok(match Shared::seat_with(shared, class, options, may_wait)? {
            seating::Seat::Now => Ok(self.seat_after(class, Admitted::Now)),
            seating::Seat::Wait(seating) => Err(seating),
        })
    }

    /// A seat of `class` just granted, in a guard whose outcome is
    /// `Cancelled` until set; the observers are told of the admission.
    pub(crate) fn seat_after(&self, class: usize, admitted: Admitted) -> permit::SeatHeld<&Shared> {
        let shared = &*self.shared;
        let held = permit::seated(shared, class, admitted, CallOutcome::Cancelled);
        shared.policy.permitted(admitted.waited());
        held
    }

    /// Seats free now.
    pub(crate) fn seats_left(&self) -> usize {
        self.shared.seats_left()
    }

    /// Rejects a caller at once for `reason` (counted and reported as the
    /// bulkhead's own rejections are), without looking for a permit.
    #[cold]
    pub(crate) fn reject_now(&self, reason: RejectReason) -> Rejected {
        self.shared.policy.reject_now(reason)
    }

    /// While unwinding from one of this bulkhead's admissions: the reason
    /// of the rejection it counted, if its observers' panic is what
    /// unwinds (see `Policy::take_unwinding_rejection`). Taken once.
    #[cold]
    pub(crate) fn take_unwinding_rejection(&self) -> Option<RejectReason> {
        self.shared.policy.take_unwinding_rejection()
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
