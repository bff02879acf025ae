//! The bulkhead's policy, apart from where permits come from: fail fast or
//! wait in a bounded line for at most `max_wait`, bound each call's run
//! time, count everything and tell the observer. The in-process
//! [`Bulkhead`](crate::Bulkhead) and the Redis bulkhead share it.

use core::future::Future;
use core::num::NonZeroU32;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::delay::LineDelay;
use super::error::{CallTimeout, Hint, RejectReason, Rejected, nanos};
use super::leak::{LeakWatches, Watched};
use super::line_timer::LineTimer;
use super::metrics::{Counters, Metrics};
use super::name::Name;
use super::observer::{CallOutcome, Finished, Observer, Permitted, Rejection};
use crate::overload::HoldEstimate;
use crate::timer::Clock;

/// The one owner of admission for every bulkhead (in-process, keyed,
/// Redis): where permits come from is the caller's business, everything
/// else (fail fast, the bounded line, `max_wait`, `call_timeout`, counters,
/// observers, retry hints, leak watches) is decided here.
pub(crate) struct Policy {
    pub(super) name: Name,
    pub(super) max_wait: Option<Duration>,
    pub(super) max_queue: Option<usize>,
    pub(super) call_timeout: Option<Duration>,
    /// Present whenever `max_wait` is non-zero, `call_timeout` or
    /// `leak_threshold` is set.
    pub(super) clock: Option<Clock>,
    /// The exporters first, then the user's observers, so that a user's
    /// panicking hook cannot keep an exporter from seeing an event.
    pub(super) observers: Arc<[Arc<dyn Observer>]>,
    pub(super) counters: Counters,
    /// Callers waiting for a permit now (the bounded line), counted here
    /// unless `line_of` counts them.
    pub(super) waiting: AtomicUsize,
    /// A fair semaphore whose waiters are exactly this policy's, with no
    /// `max_queue` to enforce: its own queue length is the line, and a
    /// waiting caller is spared two atomic read-modify-writes.
    pub(super) line_of: Option<Arc<crate::Semaphore>>,
    /// One sleep for the whole line, when the semaphore is fair and the
    /// clock can be read (see `line_timer.rs`); else each waiter arms its
    /// own `Deadline`.
    pub(super) line_timer: Option<LineTimer>,
    /// The permits held longer than `leak_threshold` (needs `clock`).
    pub(super) leaks: LeakWatches,
    /// Run each admitted call of `call` inside a `bulkhead_call` span
    /// (the `tracing` exporter).
    #[cfg(feature = "tracing")]
    pub(super) spans: bool,
    /// The limit, as last known, for retry hints.
    pub(super) hint_limit: AtomicUsize,
    /// A moving average of hold times in nanoseconds (0: no sample yet),
    /// from the calls that `clock` times: a [`HoldEstimate`], kept in an
    /// atomic.
    pub(super) hold_ns: AtomicU64,
    /// Where the deadlines of calls that carry one, and controlled
    /// delay's samples, count from (see [`Line::deadline`](super::wait::Line::deadline)).
    pub(super) origin: Instant,
    /// Controlled delay on the line (`queue_delay`), if on. Boxed: it is
    /// read on waiting paths only, and a pointer keeps the policy's layout
    /// (and the code of the fast path) as it is without it.
    pub(super) delay: Option<Box<LineDelay>>,
    /// Admissions are told to the observers when the caller says so
    /// ([`Guard::report_admitted`](super::guard::Guard::report_admitted)),
    /// not at the grant (where they are counted): a keyed bulkhead's key
    /// under a global limit, whose call is admitted once both stages
    /// admit it, and is a rejection to the key's observers if the global
    /// stage turns it away.
    pub(super) reports_later: bool,
}

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
    /// See `Policy::reports_later`.
    pub(crate) reports_later: bool,
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
            reports_later,
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
            leaks: LeakWatches::new(leak_threshold),
            #[cfg(feature = "tracing")]
            spans,
            hint_limit: AtomicUsize::new(limit),
            hold_ns: AtomicU64::new(0),
            origin,
            delay: queue_delay.map(|(target, interval)| {
                Box::new(LineDelay::new(target, interval, adaptive_lifo))
            }),
            reports_later,
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
    pub(super) fn left_delayed_line(&self, delay: &LineDelay) {
        if self.queued() == 0 {
            delay.emptied();
        } else if self.line_timer.is_none() && delay.cut().is_some() {
            delay.wake_front();
        }
    }

    /// The start of a timed wait, on the line's clock.
    #[inline(never)]
    pub(super) fn start_timed(&self) -> Option<Instant> {
        Some(self.line_now())
    }

    /// Adaptive LIFO, for a line whose waiters are served by the caller
    /// (a leased bulkhead's): whether the line stands, so that the newest
    /// waiter goes first.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    #[inline]
    pub(crate) fn serves_newest(&self) -> bool {
        self.delay.as_deref().is_some_and(LineDelay::serves_newest)
    }

    /// Controlled delay's cut, for a waiter that started at `start`: its
    /// wait if the line stands and it has waited the target, else `None`.
    #[inline(never)]
    pub(super) fn cut_now(&self, start: Option<Instant>) -> Option<Duration> {
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
    pub(super) fn timed_wait_ended(&self, start: Option<Instant>, sample: bool) -> Duration {
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
    pub(super) fn join_line(&self, placed: &mut bool) -> usize {
        debug_assert!(!*placed, "a wait takes one place in line");
        if self.line_of.is_some() {
            return 0;
        }
        *placed = true;
        self.waiting.fetch_add(1, Ordering::Relaxed)
    }

    /// Gives back the place in line that `placed` says is held, if any.
    #[inline]
    pub(super) fn leave_line(&self, placed: &mut bool) {
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
    #[inline]
    pub(crate) fn clock(&self) -> Option<&Clock> {
        self.clock.as_ref()
    }

    /// The limit as last noted (see [`note_limit`](Self::note_limit)).
    #[inline]
    pub(crate) fn limit_now(&self) -> usize {
        self.hint_limit.load(Ordering::Relaxed)
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
    pub(super) fn call_span(&self) -> tracing::Span {
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
    pub(super) fn notify(&self, f: impl Fn(&dyn Observer)) {
        if !self.observers.is_empty() {
            self.notify_each(&f);
        }
    }

    #[cold]
    pub(super) fn notify_each(&self, f: &dyn Fn(&dyn Observer)) {
        if let Some(payload) = self.run_each(f) {
            resume_unwind(payload);
        }
    }

    /// Runs `f` on every observer, and returns the first panic's payload
    /// for the caller to resume, unless a panic is already unwinding.
    #[cold]
    pub(super) fn run_each(
        &self,
        f: &dyn Fn(&dyn Observer),
    ) -> Option<Box<dyn core::any::Any + Send>> {
        let mut panic = None;
        for observer in &*self.observers {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(&**observer))) {
                panic.get_or_insert(payload);
            }
        }
        panic.filter(|_| !std::thread::panicking())
    }

    /// Counts an admitted call and tells the observers (unless the policy
    /// reports later: see the field `reports_later`). Call it once the
    /// permit is owned by a guard, so that a panicking observer cannot
    /// leak it.
    #[inline]
    pub(crate) fn permitted(&self, waited: Duration) {
        Counters::bump(&self.counters.permitted);
        if self.observed() && !self.reports_later {
            self.tell_permitted(waited);
        }
    }

    /// Whether admissions are told later (see the field).
    #[inline]
    pub(crate) fn reports_later(&self) -> bool {
        self.reports_later
    }

    /// Tells the observers of an admission counted earlier (a policy that
    /// reports later).
    #[inline]
    pub(crate) fn report_permitted(&self, waited: Duration) {
        if self.observed() {
            self.tell_permitted(waited);
        }
    }

    /// Tells the observers that a call admitted here, and counted as
    /// such, was turned away by a later stage for `reason` (a policy that
    /// reports later). A panicking observer unwinds past it.
    #[cold]
    pub(crate) fn report_refused(&self, reason: RejectReason, waited: Duration) {
        if self.observed() {
            self.tell_rejected(reason, nanos(waited));
        }
    }

    /// Tells the observers of an admission. A rejection noted for this
    /// thread ([`UNWINDING`]) is stale by now (its panic was caught
    /// without anyone taking the note): it is dropped, so that a panic
    /// here is not taken for it.
    #[cold]
    #[inline(never)]
    pub(super) fn tell_permitted(&self, waited: Duration) {
        UNWINDING.set(None);
        self.notify_each(&|o| {
            o.on_permitted(&Permitted {
                name: self.name,
                waited,
                waiting: self.queued(),
                limit: self.limit_now(),
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

    /// The error of a call that ran past `call_timeout`.
    #[cold]
    pub(crate) fn call_timed_out(&self) -> CallTimeout {
        CallTimeout::new(self.name, self.call_timeout.unwrap_or_default())
    }

    /// Counts a rejection by its reason, tells the observers and makes the
    /// error. A panicking observer unwinds past a counted rejection, which
    /// is what happened.
    #[inline]
    pub(super) fn rejected(
        &self,
        reason: RejectReason,
        timer_gone: bool,
        waited_ns: u64,
    ) -> Rejected {
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
    pub(super) fn tell_rejected(&self, reason: RejectReason, waited_ns: u64) {
        let panic = self.run_each(&|o| {
            o.on_rejected(&Rejection {
                name: self.name,
                reason,
                waited: Duration::from_nanos(waited_ns),
                waiting: self.queued(),
                limit: self.limit_now(),
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
    pub(super) fn id(&self) -> usize {
        core::ptr::from_ref(self).addr()
    }

    /// What a rejected caller's retry hint is computed from (see
    /// [`Rejected::retry_after`]): three loads, no division.
    #[inline]
    pub(super) fn retry_hint(&self) -> Hint {
        Hint {
            hold_ns: self.hold_ns.load(Ordering::Relaxed),
            ahead: u32::try_from(self.queued())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            limit: NonZeroU32::new(
                u32::try_from(self.hint_limit.load(Ordering::Relaxed)).unwrap_or(u32::MAX),
            )
            .unwrap_or(NonZeroU32::MIN),
        }
    }

    /// When a permit was granted, for the hold time: measured when an
    /// observer listens, and otherwise for a sample of the grants (one in
    /// `BUSY_SAMPLE` of those that left no permit free, whose hold times
    /// decide when a rejected caller can come back, and one in
    /// `HOLD_SAMPLE` of the rest).
    #[inline]
    pub(crate) fn clock_in(&self, busy: bool) -> Option<Instant> {
        self.timed(busy).then(|| self.read_clock())
    }

    /// [`line_now`](Self::line_now), out of line: for the sampled reads
    /// of the grant paths, which stay small enough to inline into the
    /// caller's future.
    #[inline(never)]
    fn read_clock(&self) -> Instant {
        self.line_now()
    }

    /// Whether an observer is installed (and so sees wait times).
    #[inline]
    pub(super) fn observed(&self) -> bool {
        !self.observers.is_empty()
    }

    /// Whether this grant's hold time is measured (see `clock_in`).
    #[inline]
    pub(super) fn timed(&self, busy: bool) -> bool {
        let n = self.counters.permitted.load(Ordering::Relaxed);
        let every = if busy { BUSY_SAMPLE } else { HOLD_SAMPLE };
        sampled(n, every) || !self.observers.is_empty()
    }

    /// Folds one hold time into the moving average (weight 1/4). Racing
    /// updates may lose one sample; the average stays an average.
    pub(super) fn record_hold(&self, held: Duration) {
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
    /// for "none" in [`Line::deadline`](super::wait::Line::deadline)).
    #[inline]
    pub(crate) fn since_origin(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.origin)).saturating_add(1)
    }

    /// How long a timed wait that started at `start` has waited, on the
    /// line's clock.
    #[inline]
    pub(super) fn waited_since(&self, start: Option<Instant>) -> Duration {
        start.map_or(Duration::ZERO, |start| {
            self.line_now().saturating_duration_since(start)
        })
    }

    /// Tells the observers that a call granted at `since` ended. Call it
    /// after the permit is given back, with no lock held. During a panic
    /// the outcome is `Panicked`, and an observer's own panic is dropped.
    #[inline]
    pub(crate) fn finished(&self, since: Option<Instant>, outcome: CallOutcome) {
        let held = since.map_or(Duration::ZERO, |t| {
            self.read_clock().saturating_duration_since(t)
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
                    waiting: self.queued(),
                    limit: self.limit_now(),
                })
            });
        }
    }
}

impl Policy {
    /// Starts watching a newly granted permit for a leak, if a threshold
    /// is set (see [`LeakWatches::watch`]): returns the watch's id (0:
    /// none), for [`unwatch`](Self::unwatch) when the permit goes back.
    /// Call it once a guard owns the permit: a custom timer may panic here.
    #[inline]
    pub(crate) fn watch(&self) -> u64 {
        match self.leaks.threshold() {
            None => 0,
            Some(_) => self.leaks.watch(&Watched {
                name: self.name,
                observers: &self.observers,
                leaks: &self.counters.leaks_suspected,
                clock: self.clock.as_ref(),
                now: self.line_now(),
            }),
        }
    }

    /// Cancels the watch `id` (the permit went back).
    #[inline]
    pub(crate) fn unwatch(&self, id: u64) {
        if id != 0 {
            self.leaks.unwatch(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sampled;

    #[test]
    pub(super) fn the_sample_is_one_in_every_whatever_the_pattern_of_grants() {
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
