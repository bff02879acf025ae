//! The bulkhead's policy, apart from where permits come from: fail fast or
//! wait in a bounded line for at most `max_wait`, bound each call's run
//! time, count everything and tell the observer. The in-process
//! [`Bulkhead`](crate::Bulkhead) and the Redis bulkhead share it.

use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::delay::LineDelay;
use super::error::{Hint, RejectReason, Rejected, nanos};
use super::line_timer::LineTimer;
use super::metrics::{Counters, Metrics};
use super::name::Name;
use super::observer::{CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection};
use crate::overload::{HoldEstimate, Verdict};
use crate::timer::{Clock, ClockSleep, Deadline, TimerGone, poll_by_waker};

/// The one owner of admission for every bulkhead (in-process, keyed,
/// Redis): where permits come from is the caller's business, everything
/// else (fail fast, the bounded line, `max_wait`, `call_timeout`, counters,
/// observers, retry hints, leak watches) is decided here.
pub(crate) struct Policy {
    name: Name,
    max_wait: Option<Duration>,
    max_queue: Option<usize>,
    call_timeout: Option<Duration>,
    /// Present whenever `max_wait` is non-zero, `call_timeout` or
    /// `leak_threshold` is set.
    clock: Option<Clock>,
    /// The exporters first, then the user's observers, so that a user's
    /// panicking hook cannot keep an exporter from seeing an event.
    observers: Arc<[Arc<dyn Observer>]>,
    counters: Counters,
    /// Callers waiting for a permit now (the bounded line), counted here
    /// unless `line_of` counts them.
    waiting: AtomicUsize,
    /// A fair semaphore whose waiters are exactly this policy's, with no
    /// `max_queue` to enforce: its own queue length is the line, and a
    /// waiting caller is spared two atomic read-modify-writes.
    line_of: Option<Arc<crate::Semaphore>>,
    /// One sleep for the whole line, when the semaphore is fair and the
    /// clock can be read (see `line_timer.rs`); else each waiter arms its
    /// own `Deadline`.
    line_timer: Option<LineTimer>,
    /// Report permits held longer than this (needs `clock`).
    leak_threshold: Option<Duration>,
    /// The permits under watch for leaks, by id (only with a threshold).
    watches: Mutex<HashMap<u64, LeakWatch>>,
    /// The next watch id; 0 means "not watched".
    next_watch: AtomicU64,
    /// Run each admitted call of `call` inside a `bulkhead_call` span
    /// (the `tracing` exporter).
    #[cfg(feature = "tracing")]
    spans: bool,
    /// The limit, as last known, for retry hints.
    hint_limit: AtomicUsize,
    /// A moving average of hold times in nanoseconds (0: no sample yet),
    /// from the calls that `clock` times: a [`HoldEstimate`], kept in an
    /// atomic.
    hold_ns: AtomicU64,
    /// Where the deadlines of calls that carry one, and controlled
    /// delay's samples, count from (see [`Line::deadline`]).
    origin: Instant,
    /// Controlled delay on the line (`queue_delay`), if on. Boxed: it is
    /// read on waiting paths only, and a pointer keeps the policy's layout
    /// (and the code of the fast path) as it is without it.
    delay: Option<Box<LineDelay>>,
}

/// The clock of a policy that has none (no setting of it needs a timer),
/// for a call that carries a deadline and waits.
static AUTO: Clock = Clock::Auto;

/// The future of [`Policy::traced`].
#[cfg(feature = "tracing")]
pub(crate) type Traced<F> = tracing::instrument::Instrumented<F>;
/// The future of [`Policy::traced`].
#[cfg(not(feature = "tracing"))]
pub(crate) type Traced<F> = F;

/// What a builder decided, for `Policy::new`.
pub(crate) struct Settings {
    pub(crate) name: Name,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) max_queue: Option<usize>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) clock: Option<Clock>,
    pub(crate) observers: Vec<Arc<dyn Observer>>,
    /// The limit at first, for retry hints.
    pub(crate) limit: usize,
    pub(crate) leak_threshold: Option<Duration>,
    /// Controlled delay: target and interval.
    pub(crate) queue_delay: Option<(Duration, Duration)>,
    /// Adaptive LIFO while the controlled-delay line stands.
    pub(crate) adaptive_lifo: bool,
    /// See `Policy::spans`.
    #[cfg(feature = "tracing")]
    pub(crate) spans: bool,
}

/// One call in this many has its hold time measured for retry hints even
/// when permits are plentiful, so the uncontended path rarely reads the
/// clock (which costs tens of nanoseconds on some virtual machines: 30 ns
/// on this project's benchmark machine).
const HOLD_SAMPLE: u64 = 64;

/// One grant in this many that left no permit free has its hold time
/// measured: these decide when a rejected caller can come back, and a
/// moving average needs a sample now and then, not every call.
const BUSY_SAMPLE: u64 = 16;

std::thread_local! {
    /// The rejection whose observers' panic unwinds on this thread, by the
    /// policy that made it ([`Policy::id`]): set as the panic is resumed,
    /// until a keyed bulkhead unwinding from that policy's admission takes
    /// it
    /// ([`Policy::take_unwinding_rejection`]), or the next rejection or
    /// admission with observers on this thread replaces it. Only the
    /// observers' (cold) paths touch it.
    static UNWINDING: core::cell::Cell<Option<(usize, RejectReason)>> =
        const { core::cell::Cell::new(None) };
}

/// Whether grant number `n` is in the sample of one in `every` (a power of
/// two): `n` times an odd constant, whose top bits pick the sample. Not
/// `n % every`: grants often come in a fixed pattern (a bulkhead of 2
/// whose callers take both permits in turn), and then the busy grants'
/// numbers may all be odd, and a modulus never picks one. The product's
/// top bits follow no such pattern; grant 0 is always in.
#[inline]
fn sampled(n: u64, every: u64) -> bool {
    debug_assert!(every.is_power_of_two());
    n.wrapping_mul(0x9e37_79b9_7f4a_7c15) < u64::MAX / every
}

impl Policy {
    pub(crate) fn new(settings: Settings) -> Self {
        let Settings {
            name,
            max_wait,
            max_queue,
            call_timeout,
            clock,
            observers,
            limit,
            leak_threshold,
            queue_delay,
            adaptive_lifo,
            #[cfg(feature = "tracing")]
            spans,
        } = settings;
        // No earlier than any reading of the clock to come: a paused tokio
        // clock reads behind the system's, and a bulkhead built outside
        // the runtime reads it there later.
        let origin = Clock::now_on(clock.as_ref()).min(Instant::now());
        Self {
            name,
            max_wait,
            max_queue,
            call_timeout,
            clock,
            observers: observers.into(),
            counters: Counters::default(),
            waiting: AtomicUsize::new(0),
            line_of: None,
            line_timer: None,
            leak_threshold,
            #[cfg(feature = "tracing")]
            spans,
            watches: Mutex::new(HashMap::new()),
            next_watch: AtomicU64::new(1),
            hint_limit: AtomicUsize::new(limit),
            hold_ns: AtomicU64::new(0),
            origin,
            delay: queue_delay.map(|(target, interval)| {
                Box::new(LineDelay::new(target, interval, adaptive_lifo))
            }),
        }
    }

    /// The bulkhead's name.
    #[inline]
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Whether a call that finds no free permit is rejected at once
    /// (`max_wait` is zero). The one place this is decided.
    #[inline]
    pub(crate) fn fails_fast(&self) -> bool {
        self.max_wait == Some(Duration::ZERO)
    }

    /// The longest a caller waits for a permit (`None`: no limit).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// Lets `sem`'s queue length stand for the waiting line, if that is
    /// exact: `sem` is fair, only this policy's callers wait on it, and no
    /// `max_queue` needs a place reserved before the caller queues.
    pub(crate) fn line_of(&mut self, sem: &Arc<crate::Semaphore>) {
        if self.max_queue.is_none() && sem.is_fair() {
            self.line_of = Some(sem.clone());
        }
    }

    /// Times the line of `sem` (whose waiters are exactly this policy's)
    /// with one sleep, if `max_wait` bounds waiting and the clock allows.
    pub(crate) fn time_line(&mut self, sem: &Arc<crate::Semaphore>) {
        if self.max_wait.is_some_and(|d| !d.is_zero()) {
            if let Some(clock) = &self.clock {
                self.line_timer = LineTimer::new(sem, clock);
            }
        }
    }

    /// Drops controlled delay on the policy's own line, for a bulkhead
    /// whose lines are its priority classes' (each with a delay of its own).
    pub(crate) fn no_line_delay(&mut self) {
        self.delay = None;
    }

    /// Lets controlled delay wake the front waiter of `sem` (whose waiters
    /// are exactly this policy's) when the line starts to stand, and, with
    /// adaptive LIFO, switch `sem` to serving its newest waiter first while
    /// the line stands.
    pub(crate) fn delay_line(&mut self, sem: &Arc<crate::Semaphore>) {
        if let Some(delay) = &mut self.delay {
            delay.set_line(sem);
        }
    }

    /// A waiter left the line for good, its acquire gone (served, rejected,
    /// dropped): with a line timer, the next one may have to look at its
    /// deadline; with controlled delay, an empty line ends an overload.
    #[inline]
    pub(crate) fn left_line(&self) {
        if let Some(timer) = &self.line_timer {
            timer.pass_on();
        }
        if let Some(delay) = &self.delay {
            self.left_delayed_line(delay);
        }
    }

    /// [`left_line`](Self::left_line) under controlled delay: an empty
    /// line clears an overload; without a line timer, while the line
    /// stands, the new front waiter looks at how long it has waited (the
    /// chain of `delay.rs`'s notes).
    #[inline(never)]
    fn left_delayed_line(&self, delay: &LineDelay) {
        if self.queued() == 0 {
            delay.emptied();
        } else if self.line_timer.is_none() && delay.cut().is_some() {
            delay.wake_front();
        }
    }

    /// The start of a timed wait, on the line's clock.
    #[inline(never)]
    fn start_timed(&self) -> Option<Instant> {
        Some(self.line_now())
    }

    /// Controlled delay's cut, for a waiter that started at `start`: its
    /// wait if the line stands and it has waited the target, else `None`.
    #[inline(never)]
    fn cut_now(&self, start: Option<Instant>) -> Option<Duration> {
        let target = self.delay.as_ref()?.cut()?;
        let waited = self.waited_since(start);
        (waited >= target).then_some(waited)
    }

    /// A timed wait left the line at its end (served, or out of
    /// `max_wait`: `sample`), having started at `start`: how long it
    /// waited, on the line's clock. With controlled delay a sample tells
    /// it how long the line is; the sample that finds it standing cuts
    /// the waiters past the target, by waking the front one.
    #[inline(never)]
    fn timed_wait_ended(&self, start: Option<Instant>, sample: bool) -> Duration {
        let now = self.line_now();
        let waited = start.map_or(Duration::ZERO, |start| now.saturating_duration_since(start));
        if let Some(delay) = self.delay.as_ref().filter(|_| sample) {
            if delay.sample(self.since_origin(now), nanos(waited)) {
                if self.queued() == 0 {
                    // Nobody is left behind it: the line is empty, which
                    // ends the overload at once (whether this waiter's
                    // acquire, gone or not yet, has told `left_line`).
                    delay.emptied();
                } else {
                    match &self.line_timer {
                        Some(timer) => timer.restart(),
                        None => delay.wake_front(),
                    }
                }
            }
        }
        waited
    }

    /// Sets the waiting line's length, for a line kept elsewhere (the
    /// priority classes'), which then stands for it in `queued`.
    #[inline]
    pub(crate) fn set_queued(&self, queued: usize) {
        debug_assert!(self.line_of.is_none(), "a line counted twice");
        self.waiting.store(queued, Ordering::Relaxed);
    }

    /// Callers in the waiting line now.
    #[inline]
    pub(crate) fn queued(&self) -> usize {
        match &self.line_of {
            Some(sem) => sem.queue_len(),
            None => self.waiting.load(Ordering::Relaxed),
        }
    }

    /// Takes a place in the waiting line (unless the semaphore's queue is
    /// the line) and marks `placed`; returns how many were waiting before
    /// this caller, if counted here.
    #[inline]
    fn join_line(&self, placed: &mut bool) -> usize {
        debug_assert!(!*placed, "a wait takes one place in line");
        if self.line_of.is_some() {
            return 0;
        }
        *placed = true;
        self.waiting.fetch_add(1, Ordering::Relaxed)
    }

    /// Gives back the place in line that `placed` says is held, if any.
    #[inline]
    fn leave_line(&self, placed: &mut bool) {
        if core::mem::take(placed) {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The limit on an admitted call's run time, if any.
    #[inline]
    pub(crate) fn call_timeout(&self) -> Option<Duration> {
        self.call_timeout
    }

    /// The counters this policy keeps.
    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The timer's kind, for `Debug`.
    pub(crate) fn clock(&self) -> Option<&Clock> {
        self.clock.as_ref()
    }

    /// Keeps the retry hint's idea of the limit current.
    #[inline]
    pub(crate) fn note_limit(&self, limit: usize) {
        self.hint_limit.store(limit, Ordering::Relaxed);
    }

    /// The snapshot of `Bulkhead::metrics` and its kin: the gauges come
    /// from where the permits live, the rest from here.
    pub(crate) fn metrics(&self, limit: usize, in_flight: usize, closed: bool) -> Metrics {
        let c = &self.counters;
        Metrics {
            name: self.name,
            max_concurrent_calls: limit,
            in_flight,
            queued: self.queued(),
            max_queue: self.max_queue,
            max_wait: self.max_wait,
            closed,
            permitted: Counters::get(&c.permitted),
            rejected: c.rejected.each_ref().map(Counters::get),
            call_timeouts: Counters::get(&c.call_timeouts),
            leaks_suspected: Counters::get(&c.leaks_suspected),
        }
    }

    /// The waiting part of admission, once no permit was free at once:
    /// fail fast if `max_wait` is zero, else take a place in the bounded
    /// line and wait for `acquire` for at most `max_wait`. Resolves to the
    /// permit and the time waited. The timer is armed only if `acquire`
    /// is still pending after its first poll.
    #[inline]
    pub(crate) fn wait<A>(&self, acquire: A) -> Wait<'_, A, impl Fn() -> RejectReason> {
        self.wait_or(acquire, || RejectReason::Timeout)
    }

    /// [`wait`](Self::wait), where a wait that runs out of `max_wait` is
    /// rejected for the reason `timed_out` gives then, rather than always
    /// `Timeout`: the Redis bulkhead's is `Unavailable` while Redis is out
    /// of reach.
    #[inline]
    pub(crate) fn wait_or<A, T>(&self, acquire: A, timed_out: T) -> Wait<'_, A, T>
    where
        T: Fn() -> RejectReason,
    {
        Wait {
            policy: self,
            acquire,
            deadline: Deadline::new(),
            line: Line::default(),
            timed_out,
        }
    }

    /// [`wait`](Self::wait) from `line`: a call that carries a deadline,
    /// once [`admit_by`](Self::admit_by) has looked at it.
    pub(crate) fn wait_in<A>(
        &self,
        acquire: A,
        line: Line,
    ) -> Wait<'_, A, impl Fn() -> RejectReason> {
        Wait {
            policy: self,
            acquire,
            deadline: Deadline::new(),
            line,
            timed_out: || RejectReason::Timeout,
        }
    }

    /// The admitted call, inside a `bulkhead_call` span naming the
    /// bulkhead when the `tracing` exporter is on (so the call's own events
    /// show which bulkhead admitted them); unchanged otherwise.
    #[inline]
    pub(crate) fn traced<F: Future>(&self, call: F) -> Traced<F> {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            call.instrument(self.call_span())
        }
        #[cfg(not(feature = "tracing"))]
        call
    }

    /// [`traced`](Self::traced) for a call that is made here: `make` runs
    /// inside the span too (the tower layer's inner `call`, where a client
    /// may already start sending).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn traced_with<F: Future>(&self, make: impl FnOnce() -> F) -> Traced<F> {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            let span = self.call_span();
            let call = span.in_scope(make);
            call.instrument(span)
        }
        #[cfg(not(feature = "tracing"))]
        make()
    }

    /// The `bulkhead_call` span of [`traced`](Self::traced).
    #[cfg(feature = "tracing")]
    #[inline]
    fn call_span(&self) -> tracing::Span {
        if self.spans {
            tracing::debug_span!(target: "watertight", "bulkhead_call", bulkhead = self.name)
        } else {
            tracing::Span::none()
        }
    }

    /// Runs `f` on every observer. Each runs even if an earlier one
    /// panicked; the first panic is then resumed, unless a panic is already
    /// unwinding (a guard dropped during a panic), when it is dropped: a
    /// second panic would abort the process.
    #[inline]
    fn notify(&self, f: impl Fn(&dyn Observer)) {
        if !self.observers.is_empty() {
            self.notify_each(&f);
        }
    }

    #[cold]
    fn notify_each(&self, f: &dyn Fn(&dyn Observer)) {
        if let Some(payload) = self.run_each(f) {
            resume_unwind(payload);
        }
    }

    /// Runs `f` on every observer, and returns the first panic's payload
    /// for the caller to resume, unless a panic is already unwinding.
    #[cold]
    fn run_each(&self, f: &dyn Fn(&dyn Observer)) -> Option<Box<dyn core::any::Any + Send>> {
        let mut panic = None;
        for observer in &*self.observers {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(&**observer))) {
                panic.get_or_insert(payload);
            }
        }
        panic.filter(|_| !std::thread::panicking())
    }

    /// Counts an admitted call and tells the observers. Call it once the
    /// permit is owned by a guard, so that a panicking observer cannot
    /// leak it.
    #[inline]
    pub(crate) fn permitted(&self, waited: Duration) {
        Counters::bump(&self.counters.permitted);
        if self.observed() {
            self.tell_permitted(waited);
        }
    }

    /// Tells the observers of an admission. A rejection noted for this
    /// thread ([`UNWINDING`]) is stale by now (its panic was caught
    /// without anyone taking the note): it is dropped, so that a panic
    /// here is not taken for it.
    #[cold]
    #[inline(never)]
    fn tell_permitted(&self, waited: Duration) {
        UNWINDING.set(None);
        self.notify_each(&|o| {
            o.on_permitted(&Permitted {
                name: self.name,
                waited,
            })
        });
    }

    /// Counts a rejection of a caller that did not wait (full and failing
    /// fast, closed, a full line), tells the observers and makes the
    /// error: the hot path under overload, so the event for the observers
    /// is made only if there are any.
    #[inline]
    pub(crate) fn reject_now(&self, reason: RejectReason) -> Rejected {
        self.rejected(reason, false, 0)
    }

    /// [`reject_now`](Self::reject_now) for a caller that waited.
    #[cold]
    #[inline(never)]
    pub(crate) fn reject(&self, reason: RejectReason, waited: Duration) -> Rejected {
        self.rejected(reason, false, nanos(waited))
    }

    /// A rejection because the timer cannot run (its runtime is gone).
    #[cold]
    pub(crate) fn reject_timer_gone(&self, waited: Duration) -> Rejected {
        self.rejected(RejectReason::Unavailable, true, nanos(waited))
    }

    /// Counts a rejection by its reason, tells the observers and makes the
    /// error. A panicking observer unwinds past a counted rejection, which
    /// is what happened.
    #[inline]
    fn rejected(&self, reason: RejectReason, timer_gone: bool, waited_ns: u64) -> Rejected {
        let c = &self.counters;
        Counters::bump(&c.rejected[reason.index()]);
        if self.observed() {
            self.tell_rejected(reason, waited_ns);
        }
        let hint = if timer_gone {
            Hint::NONE
        } else {
            self.retry_hint()
        };
        Rejected::new(reason, timer_gone, waited_ns, self.name, hint)
    }

    /// Tells the observers of a counted rejection. If one of them panics,
    /// the rejection is noted for this thread ([`UNWINDING`]) as the panic
    /// is resumed, for a keyed bulkhead whose global stage this is to
    /// count it for the caller's key as the panic unwinds past it
    /// ([`take_unwinding_rejection`](Self::take_unwinding_rejection)).
    #[cold]
    #[inline(never)]
    fn tell_rejected(&self, reason: RejectReason, waited_ns: u64) {
        let panic = self.run_each(&|o| {
            o.on_rejected(&Rejection {
                name: self.name,
                reason,
                waited: Duration::from_nanos(waited_ns),
            })
        });
        if let Some(payload) = panic {
            UNWINDING.set(Some((self.id(), reason)));
            resume_unwind(payload);
        }
    }

    /// The reason of the rejection by this policy whose observers' panic
    /// is unwinding through the caller, if that is what unwinds: call it
    /// only while unwinding from one of this policy's admissions. Takes
    /// the note, so that the rejection is counted once.
    #[cold]
    pub(crate) fn take_unwinding_rejection(&self) -> Option<RejectReason> {
        match UNWINDING.take() {
            Some((id, reason)) if id == self.id() => Some(reason),
            other => {
                // Another policy's: left for whoever unwinds from it.
                UNWINDING.set(other);
                None
            }
        }
    }

    /// The policy's identity while it lives: its address (it lives in its
    /// bulkhead's shared state, which does not move).
    fn id(&self) -> usize {
        core::ptr::from_ref(self).addr()
    }

    /// What a rejected caller's retry hint is computed from (see
    /// [`Rejected::retry_after`]): three loads, no division.
    #[inline]
    fn retry_hint(&self) -> Hint {
        Hint {
            hold_ns: self.hold_ns.load(Ordering::Relaxed),
            ahead: u32::try_from(self.queued())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            limit: u32::try_from(self.hint_limit.load(Ordering::Relaxed))
                .unwrap_or(u32::MAX)
                .max(1),
        }
    }

    /// When a permit was granted, for the hold time: measured when an
    /// observer listens, and otherwise for a sample of the grants (one in
    /// `BUSY_SAMPLE` of those that left no permit free, whose hold times
    /// decide when a rejected caller can come back, and one in
    /// `HOLD_SAMPLE` of the rest).
    #[inline]
    pub(crate) fn clock_in(&self, busy: bool) -> Option<Instant> {
        self.timed(busy).then(|| self.line_now())
    }

    /// Whether an observer is installed (and so sees wait times).
    #[inline]
    fn observed(&self) -> bool {
        !self.observers.is_empty()
    }

    /// Whether this grant's hold time is measured (see `clock_in`).
    #[inline]
    fn timed(&self, busy: bool) -> bool {
        let n = self.counters.permitted.load(Ordering::Relaxed);
        let every = if busy { BUSY_SAMPLE } else { HOLD_SAMPLE };
        sampled(n, every) || !self.observers.is_empty()
    }

    /// Folds one hold time into the moving average (weight 1/4). Racing
    /// updates may lose one sample; the average stays an average.
    fn record_hold(&self, held: Duration) {
        let mut estimate = HoldEstimate::from_ns(self.hold_ns.load(Ordering::Relaxed));
        estimate.record(nanos(held));
        self.hold_ns.store(estimate.ns(), Ordering::Relaxed);
    }

    /// The time now on the clock the line's sleeps run on, where it can be
    /// read (a paused tokio clock included), else the system's.
    #[inline]
    pub(crate) fn line_now(&self) -> Instant {
        Clock::now_on(self.clock.as_ref())
    }

    /// `t` in nanoseconds since the policy's origin, at least 1 (0 stands
    /// for "none" in [`Line::deadline`]).
    #[inline]
    pub(crate) fn since_origin(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.origin)).saturating_add(1)
    }

    /// Whether a wait that starts now is timed on the line's clock and
    /// polled by [`poll_timed`]: it carries a deadline, or the line has
    /// controlled delay.
    #[inline]
    fn times(&self, line: &Line) -> bool {
        line.deadline != 0 || self.delay.is_some()
    }

    /// How long a timed wait that started at `start` has waited, on the
    /// line's clock.
    #[inline]
    fn waited_since(&self, start: Option<Instant>) -> Duration {
        start.map_or(Duration::ZERO, |start| {
            self.line_now().saturating_duration_since(start)
        })
    }

    /// Deadline-aware admission of a call that carries a deadline (in
    /// `line.deadline`, see [`Line::by`]), before it takes a permit, with
    /// `free` permits free now: rejected at once (`WontMakeDeadline`,
    /// counted) if the deadline has passed, or if the expected wait for a
    /// permit plus the expected hold time (the retry hint's estimate, from
    /// the same average) exceeds the time left. Otherwise `line.deadline`
    /// becomes the latest time the call may still start, `deadline - hold`,
    /// or 0 if `max_wait` ends its wait before that anyway. Before the
    /// first timed call no hold time is known: the call is admitted and
    /// may wait until its deadline.
    #[cold]
    pub(crate) fn admit_by(&self, line: &mut Line, free: isize) -> Result<(), Rejected> {
        self.admit_by_behind(line, free, self.queued())
    }

    /// [`admit_by`](Self::admit_by) for a caller served after `waiting`
    /// others (a priority class's: the waiters of its class and the more
    /// important ones), not the whole line.
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
                        now.saturating_add(budget)
                    }
                    _ => 0,
                };
                Ok(())
            }
        }
    }

    /// After [`admit_by`](Self::admit_by): how long from now the call may
    /// still wait and finish in time, if that ends its wait before
    /// `max_wait` does.
    pub(crate) fn wait_budget(&self, line: &Line) -> Option<Duration> {
        (line.deadline != 0).then(|| {
            let now = self.since_origin(self.line_now());
            Duration::from_nanos(line.deadline.saturating_sub(now))
        })
    }

    /// Tells the observers that a call granted at `since` ended. Call it
    /// after the permit is given back, with no lock held. During a panic
    /// the outcome is `Panicked`, and an observer's own panic is dropped.
    #[inline]
    pub(crate) fn finished(&self, since: Option<Instant>, outcome: CallOutcome) {
        let held = since.map_or(Duration::ZERO, |t| {
            self.line_now().saturating_duration_since(t)
        });
        if since.is_some() {
            self.record_hold(held);
        }
        if !self.observers.is_empty() {
            let outcome = if std::thread::panicking() {
                CallOutcome::Panicked
            } else {
                outcome
            };
            self.notify(|o| {
                o.on_finished(&Finished {
                    name: self.name,
                    held,
                    outcome,
                })
            });
        }
    }
}

pin_project! {
    /// The future of [`Policy::wait`]: [`Waiting`] with its policy, as its
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
        let timed_out = &*this.timed_out;
        poll_wait_or(
            this.acquire,
            this.deadline,
            this.line,
            this.policy,
            cx,
            timed_out,
        )
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
    /// Before that, for a call that carries a deadline, in nanoseconds
    /// since the policy's origin (0: none): the deadline itself until
    /// [`Policy::admit_by`] has looked at it, then the latest time the call
    /// may start and still finish in time (0 again if `max_wait` ends the
    /// wait sooner), which [`poll_timed`] turns into the wait's own sleep
    /// at the first pending poll. One field for both, not two: a `Line` is
    /// built with every call, and another field to clear is another store
    /// on the path of a call admitted at once.
    deadline: u64,
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
            Armed::Checkpoint => End::Cut,
            _ => End::MaxWait,
        }
    }

    /// The line of a call that must be done `by`: [`Policy::admit_by`]
    /// decides on it before the call takes a permit.
    #[inline]
    pub(crate) fn by(policy: &Policy, by: Instant) -> Self {
        Self {
            deadline: policy.since_origin(by),
            ..Self::default()
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
    /// A wait for `acquire` (see [`Policy::wait`]); nothing happens until
    /// it is first polled.
    #[inline]
    pub(crate) fn new(acquire: A) -> Self {
        Self {
            acquire,
            deadline: Deadline::new(),
            line: Line::default(),
        }
    }

    /// [`new`](Self::new) from `line`: a call that carries a deadline,
    /// once [`Policy::admit_by`] has looked at it.
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

/// Polls a wait in line: the body of [`Wait`], [`Waiting`] and
/// `Bulkhead::call`'s future. `acquire` is polled first; `deadline` is
/// armed for `max_wait` only once it is pending.
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
    poll_wait_or(acquire, deadline, line, policy, cx, &|| {
        RejectReason::Timeout
    })
}

/// [`poll_wait`], rejecting a wait that ran out of `max_wait` for the
/// reason `timed_out` gives then (see [`Policy::wait_or`]).
#[inline]
fn poll_wait_or<A, P>(
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

/// [`poll_wait_or`] for a wait whose limits are more than `max_wait` (see
/// [`Line::armed`]): a call that carries a deadline, and waits at most
/// until it could still finish in time; a line under controlled delay,
/// where a waiter is cut once it has waited the target on a standing
/// line. With the line timer, that keeps `max_wait` and the cut (the
/// line's deadlines stay in arrival order) and the wait's own sleep is
/// armed for the deadline's limit; else the own sleep is armed for
/// whichever limit comes first. Out of line, so that the untimed wait's
/// code (and the fast path that `Bulkhead::call` inlines with it) stays
/// as it was.
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
    if until == Some(Duration::ZERO) {
        return Poll::Ready(Ok(End::Until));
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
            until.map(|d| (d, Armed::Until)),
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

impl Policy {
    /// Starts watching a newly granted permit for a leak, if a threshold
    /// is set: a sleep of the threshold on the policy's timer, polled with
    /// a waker that reports the leak once the sleep completes (so it runs
    /// on the timer's clock, a paused tokio clock included). Returns the
    /// watch's id (0: none), for [`unwatch`](Self::unwatch) when the permit
    /// goes back. Call it once a guard owns the permit: a custom timer may
    /// panic here. The watches live in the policy, so a permit's guard
    /// holds a plain number.
    #[inline]
    pub(crate) fn watch(&self) -> u64 {
        match self.leak_threshold {
            None => 0,
            Some(threshold) => self.start_watch(threshold),
        }
    }

    /// Cancels the watch `id` (the permit went back): disarms its report
    /// and drops its sleep, outside the watches' lock.
    #[inline]
    pub(crate) fn unwatch(&self, id: u64) {
        if id != 0 {
            self.stop_watch(id);
        }
    }

    #[cold]
    fn stop_watch(&self, id: u64) {
        let watch = self
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        drop(watch);
    }

    #[cold]
    fn start_watch(&self, threshold: Duration) -> u64 {
        let Some(clock) = self.clock.as_ref() else {
            return 0;
        };
        let Ok(sleep) = clock.sleep(threshold) else {
            // The timer's runtime is gone: nothing can watch this permit.
            return 0;
        };
        let check = Arc::new(LeakCheck {
            name: self.name,
            observers: self.observers.clone(),
            leaks: self.counters.leaks_suspected.clone(),
            since: self.line_now(),
            clock: clock.clone(),
            threshold,
            state: AtomicU8::new(ARMED),
            sleep: Mutex::new(Some(Box::pin(sleep))),
            again: AtomicBool::new(false),
        });
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                LeakWatch {
                    check: check.clone(),
                },
            );
        // The first poll registers the waker; a sleep that is done already
        // reports at once.
        check.poll_sleep();
        id
    }
}

/// A permit under watch for leaks; removed when the permit goes back.
struct LeakWatch {
    check: Arc<LeakCheck>,
}

impl Drop for LeakWatch {
    fn drop(&mut self) {
        // Also breaks the cycle of a sleep that holds its watch's waker.
        self.check.disarm();
    }
}

const ARMED: u8 = 0;
const DISARMED: u8 = 1;
const FIRED: u8 = 2;

/// A leak watch's state, and the waker of its sleep: when the sleep
/// completes, the permit is still held unless the watch was disarmed.
struct LeakCheck {
    name: &'static str,
    observers: Arc<[Arc<dyn Observer>]>,
    leaks: Arc<AtomicU64>,
    /// When the permit was granted, on `clock`.
    since: Instant,
    /// The policy's clock, which the sleep runs on.
    clock: Clock,
    threshold: Duration,
    state: AtomicU8,
    /// The sleep, polled only by whoever holds this lock: the watch's own
    /// waker, which never blocks on it (see `again`). No other lock is held
    /// while it is polled.
    sleep: Mutex<Option<Pin<Box<ClockSleep>>>>,
    /// Set by a wake-up that found the sleep being polled: poll it again.
    again: AtomicBool,
}

impl LeakCheck {
    /// The permit went back: never report, and drop the sleep (outside
    /// the lock).
    fn disarm(&self) {
        self.state.store(DISARMED, Ordering::Release);
        let sleep = self
            .sleep
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(sleep);
    }

    /// Polls the sleep, reporting the leak once it completes. A timer
    /// that panics or whose runtime is gone ends the watch quietly: there
    /// is no caller to tell, and the permit is unaffected.
    fn poll_sleep(self: &Arc<Self>) {
        let ended = poll_by_waker(&self.sleep, &self.again, |slot| {
            let sleep = slot.as_mut()?;
            let waker = Waker::from(self.clone());
            let polled = catch_unwind(AssertUnwindSafe(|| {
                sleep.as_mut().poll_sleep(&mut Context::from_waker(&waker))
            }));
            match polled {
                Ok(Poll::Pending) => None,
                Ok(Poll::Ready(Ok(()))) => Some((slot.take(), true)),
                Ok(Poll::Ready(Err(_))) | Err(_) => Some((slot.take(), false)),
            }
        });
        if let Some((sleep, elapsed)) = ended {
            // A custom timer's sleep, outside the lock: it may panic again
            // in its drop.
            let _ = catch_unwind(AssertUnwindSafe(|| drop(sleep)));
            if elapsed {
                self.report();
            }
        }
    }

    /// The sleep completed: report once, unless disarmed meanwhile.
    fn report(&self) {
        if self
            .state
            .compare_exchange(ARMED, FIRED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        self.leaks.fetch_add(1, Ordering::Relaxed);
        let event = LeakSuspected {
            name: self.name,
            held: Clock::now_on(Some(&self.clock))
                .saturating_duration_since(self.since)
                .max(self.threshold),
            threshold: self.threshold,
        };
        // Called from the timer, with nobody to pass a panic to: each
        // observer runs, and their panics are dropped.
        for observer in &*self.observers {
            let _ = catch_unwind(AssertUnwindSafe(|| observer.on_leak_suspected(&event)));
        }
    }
}

impl Wake for LeakCheck {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.load(Ordering::Acquire) == ARMED {
            self.poll_sleep();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sampled;

    #[test]
    fn the_sample_is_one_in_every_whatever_the_pattern_of_grants() {
        assert!(sampled(0, 16) && sampled(0, 64));
        for every in [16, 64] {
            // All grants, every second one, every fourth one (the busy
            // grants of bulkheads of 2 and 4 filled in turn), every 16th.
            for stride in [1, 2, 4, 16] {
                let n = if cfg!(miri) { 6_400 } else { 64_000 };
                let hits = (0..n).filter(|k| sampled(k * stride, every)).count() as u64;
                let expected = n / every;
                assert!(
                    hits.abs_diff(expected) <= expected / 10,
                    "1 in {every}, stride {stride}: {hits} of {n}"
                );
            }
        }
    }
}
