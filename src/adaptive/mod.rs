//! Adaptive limits: a bulkhead whose limit is learned from latency and
//! failures.
//!
//! The right `max_concurrent_calls` is the concurrency at which the
//! dependency is busy but not yet queueing, and it moves: a deploy makes
//! requests heavier, a replica dies, a cache warms up. An adaptive limit
//! learns it from the calls themselves. An [`AdaptiveLimiter`] is an
//! [`Observer`] of one bulkhead: it turns every finished call into a
//! [`Sample`] (how long the permit was held, whether the call failed, how
//! many calls were in flight), feeds it to a [`LimitAlgorithm`], and sets
//! the bulkhead's limit with
//! [`set_max_concurrent_calls`](Bulkhead::set_max_concurrent_calls) when the
//! algorithm changes its mind.
//!
//! Two algorithms come with the crate, both clamped to bounds you give:
//!
//! - [`Aimd`]: additive increase, multiplicative decrease. Grows by one
//!   call per round of good calls, backs off by a ratio when a call fails
//!   or is slower than a threshold you set. Simple, and reacts to failures
//!   even when latency says nothing; needs to be told what "slow" is.
//! - [`Gradient`]: learns the dependency's no-load latency and shrinks the
//!   limit in proportion as latency rises above it, keeping a small queue
//!   on purpose so it notices new capacity. Needs no threshold.
//!
//! The algorithms are plain state machines with no clock: the same samples
//! give the same limits, which is how the simulation in the
//! [adaptive guide](crate::guide::adaptive) (`cargo run --release
//! --example adaptive_sim`) and the tests check them. Write your own by
//! implementing [`LimitAlgorithm`].
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use watertight::Bulkhead;
//! use watertight::adaptive::{self, Aimd};
//!
//! # futures::executor::block_on(async {
//! let builder = Bulkhead::builder()
//!     .name("inventory")
//!     .max_wait(Duration::ZERO);
//! let aimd = Aimd::new()
//!     .initial_limit(10)
//!     .bounds(2, 200)
//!     .latency_threshold(Duration::from_millis(250));
//! let (inventory, limiter) = adaptive::build(builder, aimd)?;
//! assert_eq!(inventory.metrics().max_concurrent_calls(), 10);
//!
//! inventory.call(async { Ok::<_, std::io::Error>(()) }).await.unwrap();
//! assert_eq!(limiter.samples(), 1);
//! assert_eq!(limiter.limit(), inventory.metrics().max_concurrent_calls());
//! # Ok::<(), watertight::BuildError>(())
//! # }).unwrap();
//! ```

/// The settings both algorithms share, written once: `new` (the defaults),
/// `initial_limit` and `bounds`, over the fields `min`, `max` and
/// `limit: f64`. `$what` begins the doc of `new`.
macro_rules! limit_settings {
    ($what:literal) => {
        #[doc = concat!($what, " with the default settings (see the [table](Self)).")]
        pub fn new() -> Self {
            Self::default()
        }

        /// The limit before any sample, clamped to the bounds.
        #[must_use]
        pub fn initial_limit(mut self, limit: usize) -> Self {
            self.limit = limit.clamp(self.min, self.max) as f64;
            self
        }

        /// The lowest and highest limit; the current one is clamped into them.
        ///
        /// # Panics
        ///
        /// If `min` is 0 (a bulkhead at 0 admits nothing, so it would never
        /// learn again), `min > max`, or `max` exceeds
        /// [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
        #[must_use]
        pub fn bounds(mut self, min: usize, max: usize) -> Self {
            super::check_bounds(min, max);
            self.min = min;
            self.max = max;
            self.limit = self.limit.clamp(min as f64, max as f64);
            self
        }
    };
}

mod aimd;
mod gradient;

pub use aimd::Aimd;
pub use gradient::Gradient;

use core::fmt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::bulkhead::Shared;
use crate::bulkhead::observer::{CallOutcome, Finished, Observer, Permitted};
use crate::{BuildError, Bulkhead, BulkheadBuilder, Semaphore};

/// What one finished call tells a [`LimitAlgorithm`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::adaptive::Sample;
///
/// let sample = Sample::failure(Duration::from_secs(2), 12);
/// assert!(sample.failed);
/// assert_eq!(sample.in_flight, 12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sample {
    /// How long the call held its permit.
    pub latency: Duration,
    /// Calls in flight when this one ended, itself included.
    pub in_flight: usize,
    /// Whether the call failed in a way that signals overload (by default:
    /// it returned an error or timed out; see [`Verdict`]).
    pub failed: bool,
}

impl Sample {
    /// A call that went well.
    pub fn success(latency: Duration, in_flight: usize) -> Self {
        Self {
            latency,
            in_flight,
            failed: false,
        }
    }

    /// A call that failed or timed out.
    pub fn failure(latency: Duration, in_flight: usize) -> Self {
        Self {
            latency,
            in_flight,
            failed: true,
        }
    }
}

/// Learns a concurrency limit from samples of finished calls.
///
/// Implementations should be deterministic state machines: no clock, no
/// randomness, time only from [`Sample::latency`]. [`AdaptiveLimiter`] calls
/// them under its lock, so they must not call back into the limiter.
///
/// # Examples
///
/// A limit that halves on every failure and never grows, within 1 ..= 64:
///
/// ```
/// use std::time::Duration;
/// use watertight::adaptive::{LimitAlgorithm, Sample};
///
/// #[derive(Debug)]
/// struct HalveOnFailure(usize);
///
/// impl LimitAlgorithm for HalveOnFailure {
///     fn limit(&self) -> usize {
///         self.0
///     }
///     fn update(&mut self, sample: Sample) -> usize {
///         if sample.failed {
///             self.0 = (self.0 / 2).max(1);
///         }
///         self.0
///     }
/// }
///
/// let mut halve = HalveOnFailure(64);
/// assert_eq!(halve.update(Sample::failure(Duration::from_secs(1), 64)), 32);
/// ```
pub trait LimitAlgorithm: Send + 'static {
    /// The current limit (before any sample: the initial one).
    fn limit(&self) -> usize;

    /// Learns from one finished call and returns the new limit.
    fn update(&mut self, sample: Sample) -> usize;
}

impl<A: LimitAlgorithm + ?Sized> LimitAlgorithm for Box<A> {
    fn limit(&self) -> usize {
        (**self).limit()
    }

    fn update(&mut self, sample: Sample) -> usize {
        (**self).update(sample)
    }
}

/// What a finished call counts as, for the algorithm: the answer of an
/// [`AdaptiveLimiterBuilder::classify`] function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// A sample that went well: its latency is what the dependency needs.
    Success,
    /// A sample that signals overload.
    Failure,
    /// Not a sample: says nothing about the dependency.
    Ignore,
}

impl Verdict {
    /// The default classification:
    ///
    /// | outcome | verdict | why |
    /// |---|---|---|
    /// | `Success` | `Success` | |
    /// | `Released` | `Success` | a permit from `acquire`: the time held is still the call's latency |
    /// | `Failure` | `Failure` | an overloaded dependency fails; classify application errors (not found, invalid) as `Success` if yours are common |
    /// | `TimedOut` | `Failure` | |
    /// | `Cancelled`, `Panicked` | `Ignore` | the call was cut short by the caller: its latency says nothing |
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::CallOutcome;
    /// use watertight::adaptive::Verdict;
    ///
    /// assert_eq!(Verdict::of(CallOutcome::TimedOut), Verdict::Failure);
    /// assert_eq!(Verdict::of(CallOutcome::Cancelled), Verdict::Ignore);
    /// ```
    pub fn of(outcome: CallOutcome) -> Self {
        match outcome {
            CallOutcome::Success | CallOutcome::Released => Self::Success,
            CallOutcome::Failure | CallOutcome::TimedOut => Self::Failure,
            _ => Self::Ignore,
        }
    }
}

/// One change of the limit, as kept by [`AdaptiveLimiter::history`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitChange {
    /// Which sample caused it, counting from 1.
    pub sample_number: u64,
    /// The limit before.
    pub from: usize,
    /// The limit after.
    pub to: usize,
    /// The sample that caused it.
    pub sample: Sample,
}

/// Drives a bulkhead's limit with a [`LimitAlgorithm`]: an [`Observer`]
/// that learns from every finished call and calls
/// [`set_max_concurrent_calls`](Bulkhead::set_max_concurrent_calls).
///
/// Made with [`new`](Self::new) or [`builder`](Self::builder) as an `Arc`,
/// given to the bulkhead's builder as its observer, then
/// [`attach`](Self::attach)ed to the bulkhead that was built; [`build`]
/// does the three steps. One limiter drives one bulkhead.
///
/// It counts calls in flight itself (admitted minus finished), so it must
/// see every call of the bulkhead from the start: give it to the builder,
/// not to a second bulkhead. The limit it sets wins over limits set by
/// hand: the next change overwrites them.
///
/// The algorithm runs under the limiter's mutex, once per finished call;
/// the bulkhead is called with no lock held. Samples that come in while the
/// limiter is not attached still teach the algorithm, and
/// [`attach`](Self::attach) applies what it learned.
///
/// The limiter holds the bulkhead it drives weakly: the bulkhead (which
/// holds the limiter as its observer) is freed when its last handle goes,
/// attached or not.
///
/// # Examples
///
/// ```
/// use watertight::Bulkhead;
/// use watertight::adaptive::{AdaptiveLimiter, Gradient};
///
/// let limiter = AdaptiveLimiter::new(Gradient::new().initial_limit(8).bounds(2, 64));
/// let db = Bulkhead::builder()
///     .name("db")
///     .max_concurrent_calls(limiter.limit())
///     .observer(limiter.clone())
///     .build()
///     .unwrap();
/// limiter.attach(&db);
///
/// let permit = db.try_acquire().unwrap();
/// drop(permit);
/// assert_eq!(limiter.samples(), 1);
/// assert_eq!(limiter.last_sample().unwrap().in_flight, 1);
///
/// ```
pub struct AdaptiveLimiter {
    state: Mutex<State>,
    /// A copy of the algorithm's limit, for lock-free reads.
    limit: AtomicUsize,
    /// Admitted calls not yet finished.
    in_flight: AtomicUsize,
    /// Samples fed to the algorithm.
    samples: AtomicU64,
    classify: fn(CallOutcome) -> Verdict,
    /// The bulkhead driven, held weakly: it holds this limiter.
    target: Mutex<Option<Weak<Shared>>>,
}

struct State {
    algorithm: Box<dyn LimitAlgorithm>,
    last: Option<Sample>,
    history: VecDeque<LimitChange>,
    history_len: usize,
}

/// Configures an [`AdaptiveLimiter`]; made by [`AdaptiveLimiter::builder`].
///
/// # Examples
///
/// Application errors (the caller's fault, say) are not overload:
///
/// ```
/// use watertight::CallOutcome;
/// use watertight::adaptive::{AdaptiveLimiter, Aimd, Verdict};
///
/// let limiter = AdaptiveLimiter::builder(Aimd::new())
///     .classify(|outcome| match outcome {
///         CallOutcome::Failure => Verdict::Success,
///         other => Verdict::of(other),
///     })
///     .history(1_000)
///     .build();
/// assert_eq!(limiter.limit(), 20);
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct AdaptiveLimiterBuilder {
    algorithm: Box<dyn LimitAlgorithm>,
    classify: fn(CallOutcome) -> Verdict,
    history_len: usize,
}

impl AdaptiveLimiterBuilder {
    /// How a finished call counts (default [`Verdict::of`]).
    pub fn classify(mut self, classify: fn(CallOutcome) -> Verdict) -> Self {
        self.classify = classify;
        self
    }

    /// How many of the latest limit changes
    /// [`history`](AdaptiveLimiter::history) keeps (default 64).
    pub fn history(mut self, changes: usize) -> Self {
        self.history_len = changes;
        self
    }

    /// Makes the limiter.
    pub fn build(self) -> Arc<AdaptiveLimiter> {
        let limit = clamp_limit(self.algorithm.limit());
        Arc::new(AdaptiveLimiter {
            state: Mutex::new(State {
                algorithm: self.algorithm,
                last: None,
                history: VecDeque::new(),
                history_len: self.history_len,
            }),
            limit: AtomicUsize::new(limit),
            in_flight: AtomicUsize::new(0),
            samples: AtomicU64::new(0),
            classify: self.classify,
            target: Mutex::new(None),
        })
    }
}

impl fmt::Debug for AdaptiveLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimiterBuilder")
            .field("limit", &self.algorithm.limit())
            .field("history", &self.history_len)
            .finish_non_exhaustive()
    }
}

impl AdaptiveLimiter {
    /// A limiter driven by `algorithm`, with the default settings.
    pub fn new(algorithm: impl LimitAlgorithm) -> Arc<Self> {
        Self::builder(algorithm).build()
    }

    /// Starts configuring a limiter driven by `algorithm`.
    pub fn builder(algorithm: impl LimitAlgorithm) -> AdaptiveLimiterBuilder {
        AdaptiveLimiterBuilder {
            algorithm: Box::new(algorithm),
            classify: Verdict::of,
            history_len: 64,
        }
    }

    /// Makes this limiter drive `bulkhead`, and sets its limit to the
    /// limiter's at once. Replaces the bulkhead attached before, if any.
    ///
    /// The limiter must also be the bulkhead's observer (see
    /// [`build`]), or it learns nothing.
    pub fn attach(&self, bulkhead: &Bulkhead) {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = Some(bulkhead.downgrade());
        self.apply();
    }

    /// Stops driving the bulkhead, and returns it (if it is still alive).
    /// The bulkhead keeps the limit it has; the limiter goes on learning
    /// from its calls.
    pub fn detach(&self) -> Option<Bulkhead> {
        self.target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .and_then(|weak| weak.upgrade())
            .map(Bulkhead::from_shared)
    }

    /// The bulkhead driven now, if attached and alive.
    fn target(&self) -> Option<Bulkhead> {
        self.target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(Weak::upgrade)
            .map(Bulkhead::from_shared)
    }

    /// The limit the algorithm wants now.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::SeqCst)
    }

    /// How many samples the algorithm has learned from.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// The last sample fed to the algorithm.
    pub fn last_sample(&self) -> Option<Sample> {
        self.lock().last
    }

    /// The latest changes of the limit, oldest first (as many as the
    /// [builder](AdaptiveLimiterBuilder::history) said to keep).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::Bulkhead;
    /// use watertight::adaptive::{self, Aimd};
    ///
    /// # futures::executor::block_on(async {
    /// let builder = Bulkhead::builder().max_wait(Duration::ZERO);
    /// let (bh, limiter) = adaptive::build(builder, Aimd::new().initial_limit(4))?;
    /// bh.call(async { Err::<(), _>("503") }).await.unwrap_err();
    ///
    /// let change = limiter.history()[0];
    /// assert_eq!((change.from, change.to), (4, 3)); // 4 × 0.9, rounded down
    /// assert!(change.sample.failed);
    /// assert_eq!(bh.metrics().max_concurrent_calls(), 3);
    /// # limiter.detach();
    /// # Ok::<(), watertight::BuildError>(())
    /// # }).unwrap();
    /// ```
    pub fn history(&self) -> Vec<LimitChange> {
        self.lock().history.iter().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Feeds one sample to the algorithm; applies the new limit if it moved.
    fn learn(&self, sample: Sample) {
        let moved = {
            let mut state = self.lock();
            let number = self.samples.fetch_add(1, Ordering::Relaxed) + 1;
            let from = self.limit.load(Ordering::SeqCst);
            let to = clamp_limit(state.algorithm.update(sample));
            state.last = Some(sample);
            if to != from {
                self.limit.store(to, Ordering::SeqCst);
                if state.history_len > 0 {
                    if state.history.len() == state.history_len {
                        state.history.pop_front();
                    }
                    state.history.push_back(LimitChange {
                        sample_number: number,
                        from,
                        to,
                        sample,
                    });
                }
            }
            to != from
        };
        if moved {
            self.apply();
        }
    }

    /// Sets the attached bulkhead's limit to the algorithm's, with no lock
    /// of the limiter held.
    ///
    /// Two threads may apply concurrently; each re-reads the limit after
    /// setting it, so whoever sets last also sets the latest value.
    fn apply(&self) {
        let Some(bulkhead) = self.target() else {
            return;
        };
        let mut limit = self.limit.load(Ordering::SeqCst);
        loop {
            bulkhead.set_max_concurrent_calls(limit);
            let now = self.limit.load(Ordering::SeqCst);
            if now == limit {
                return;
            }
            limit = now;
        }
    }
}

impl Observer for AdaptiveLimiter {
    fn on_permitted(&self, _event: &Permitted<'_>) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    fn on_finished(&self, event: &Finished<'_>) {
        // Including this call. Saturating: a limiter given to a bulkhead
        // after calls were admitted sees more finish than start.
        let in_flight = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or_else(|n| n)
            .max(1);
        let sample = match (self.classify)(event.outcome) {
            Verdict::Success => Sample::success(event.held, in_flight),
            Verdict::Failure => Sample::failure(event.held, in_flight),
            Verdict::Ignore => return,
        };
        self.learn(sample);
    }
}

impl fmt::Debug for AdaptiveLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attached = self.target().map(|b| b.name().to_owned());
        f.debug_struct("AdaptiveLimiter")
            .field("limit", &self.limit())
            .field("samples", &self.samples())
            .field("attached_to", &attached)
            .finish_non_exhaustive()
    }
}

/// Builds a bulkhead whose limit `algorithm` drives: starts it at the
/// algorithm's initial limit (whatever `max_concurrent_calls` the builder
/// had), adds an [`AdaptiveLimiter`] as an observer, and attaches it.
///
/// # Errors
///
/// What [`BulkheadBuilder::build`] returns.
///
/// # Examples
///
/// ```
/// use watertight::Bulkhead;
/// use watertight::adaptive::{self, Gradient};
///
/// let (bh, limiter) = adaptive::build(Bulkhead::builder(), Gradient::new().initial_limit(6))?;
/// assert_eq!(bh.metrics().max_concurrent_calls(), 6);
/// assert_eq!(limiter.limit(), 6);
/// # Ok::<(), watertight::BuildError>(())
/// ```
pub fn build(
    builder: BulkheadBuilder,
    algorithm: impl LimitAlgorithm,
) -> Result<(Bulkhead, Arc<AdaptiveLimiter>), BuildError> {
    let limiter = AdaptiveLimiter::new(algorithm);
    let bulkhead = builder
        .max_concurrent_calls(limiter.limit())
        .observer(limiter.clone())
        .build()?;
    limiter.attach(&bulkhead);
    Ok((bulkhead, limiter))
}

/// Keeps an algorithm's answer within what a bulkhead accepts: at least 1
/// (at 0 nothing is admitted, so nothing would ever be learned again) and
/// at most [`Semaphore::MAX_PERMITS`].
fn clamp_limit(limit: usize) -> usize {
    limit.clamp(1, Semaphore::MAX_PERMITS)
}

/// The bounds check the built-in algorithms share.
fn check_bounds(min: usize, max: usize) {
    assert!(min >= 1, "the lower bound must be at least 1");
    assert!(
        min <= max,
        "the lower bound must not exceed the upper bound"
    );
    assert!(
        max <= Semaphore::MAX_PERMITS,
        "the upper bound must not exceed Semaphore::MAX_PERMITS"
    );
}
