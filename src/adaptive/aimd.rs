//! Additive increase, multiplicative decrease.

use std::time::Duration;

use super::{LimitAlgorithm, Sample};

/// Additive increase, multiplicative decrease: TCP's congestion control,
/// counted in calls instead of packets.
///
/// Every call that ends well, while the limit is in use, raises the limit by
/// `increase_by / limit`: one full limit's worth of good calls (about one
/// round trip when the bulkhead is busy) raises it by `increase_by`. A call
/// that failed, or took longer than `latency_threshold`, multiplies it by
/// `backoff_ratio`, at most once per round: the calls that finish right after
/// a back-off started before it, so their bad news is already acted on.
///
/// The limit is kept as a fraction internally and reported rounded down,
/// clamped to the bounds.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`initial_limit`](Self::initial_limit) | 20 | the limit before any sample |
/// | [`bounds`](Self::bounds) | 1 ..= 1000 | the limit never leaves them |
/// | [`increase_by`](Self::increase_by) | 1 | calls added per round of good calls |
/// | [`backoff_ratio`](Self::backoff_ratio) | 0.9 | the limit is multiplied by this on overload |
/// | [`latency_threshold`](Self::latency_threshold) | none | a call slower than this counts as overload |
///
/// Without a latency threshold only failures (errors and timeouts, by
/// default) shrink the limit. Set one a little above the latency the
/// dependency has when it is not overloaded: AIMD knows no baseline of its
/// own, which is what [`Gradient`](super::Gradient) learns.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::adaptive::{Aimd, LimitAlgorithm, Sample};
///
/// let mut aimd = Aimd::new()
///     .initial_limit(10)
///     .bounds(2, 50)
///     .latency_threshold(Duration::from_millis(100));
/// assert_eq!(aimd.limit(), 10);
///
/// // Quick calls with the bulkhead full: a round of them (a limit's worth,
/// // give or take) adds one permit.
/// for _ in 0..11 {
///     aimd.update(Sample::success(Duration::from_millis(40), 10));
/// }
/// assert_eq!(aimd.limit(), 11);
///
/// // A slow call: back off by 10 %.
/// assert_eq!(aimd.update(Sample::success(Duration::from_millis(300), 11)), 9);
/// // A timeout right after is the same congestion: no second back-off.
/// assert_eq!(aimd.update(Sample::failure(Duration::from_secs(1), 9)), 9);
/// ```
#[derive(Debug, Clone)]
pub struct Aimd {
    min: usize,
    max: usize,
    increase_by: usize,
    backoff_ratio: f64,
    latency_threshold: Option<Duration>,
    /// The limit, with its fraction.
    limit: f64,
    /// Samples seen since the last back-off.
    since_backoff: usize,
}

impl Default for Aimd {
    fn default() -> Self {
        Self {
            min: 1,
            max: 1000,
            increase_by: 1,
            backoff_ratio: 0.9,
            latency_threshold: None,
            limit: 20.0,
            since_backoff: usize::MAX,
        }
    }
}

impl Aimd {
    limit_settings!("AIMD");

    /// How many calls a round of good calls adds (default 1).
    ///
    /// # Panics
    ///
    /// If `calls` is 0.
    #[must_use]
    pub fn increase_by(mut self, calls: usize) -> Self {
        assert!(calls > 0, "increase_by must be at least 1");
        self.increase_by = calls;
        self
    }

    /// What the limit is multiplied by on overload (default 0.9).
    ///
    /// # Panics
    ///
    /// Unless `0 < ratio < 1`.
    #[must_use]
    pub fn backoff_ratio(mut self, ratio: f64) -> Self {
        assert!(
            ratio > 0.0 && ratio < 1.0,
            "backoff_ratio must be between 0 and 1"
        );
        self.backoff_ratio = ratio;
        self
    }

    /// A call that takes longer than this counts as overload, like a
    /// failure. Not set (the default): only failures do.
    #[must_use]
    pub fn latency_threshold(mut self, threshold: Duration) -> Self {
        self.latency_threshold = Some(threshold);
        self
    }
}

impl LimitAlgorithm for Aimd {
    fn limit(&self) -> usize {
        self.limit as usize
    }

    fn update(&mut self, sample: Sample) -> usize {
        let overloaded =
            sample.failed || self.latency_threshold.is_some_and(|t| sample.latency > t);
        if overloaded {
            // Once per round: the calls in flight at the last back-off
            // carry no news.
            if self.since_backoff >= self.limit as usize {
                self.limit = (self.limit * self.backoff_ratio).max(self.min as f64);
                self.since_backoff = 0;
            }
        } else if sample.in_flight.saturating_mul(2) >= self.limit as usize {
            // Grow only while the limit is in use: a bulkhead that runs at a
            // tenth of its limit learns nothing about a higher one.
            self.limit = (self.limit + self.increase_by as f64 / self.limit).min(self.max as f64);
        }
        self.since_backoff = self.since_backoff.saturating_add(1);
        self.limit()
    }
}
