//! A latency gradient: the limit follows the ratio of no-load latency to
//! current latency.

use std::time::Duration;

use super::{LimitAlgorithm, Sample};

/// How many standard errors apart a window's average and the baseline must
/// be before the difference counts as queueing.
const NOISE: f64 = 1.5;

/// Learns the dependency's latency when it is not loaded, and keeps the
/// limit where current latency stays close to it: the gradient algorithm of
/// Netflix's `concurrency-limits` and Envoy's adaptive concurrency filter.
///
/// Samples are averaged over windows of at least `window` calls and at
/// least one limit's worth (about one round trip when the bulkhead is
/// busy). At the end of each window:
///
/// ```text
/// gradient = clamp(tolerance × baseline × (1 + 1.5 × noise) / window average, 0.5, 1)
/// estimate = limit × gradient + headroom × √limit
/// limit    = limit + smoothing × (estimate − limit)
/// ```
///
/// When the dependency queues, latency rises above the baseline, the
/// gradient falls below 1 and the limit shrinks towards the concurrency the
/// dependency serves without queueing. `headroom × √limit` calls are kept
/// queued on purpose, so that the limit grows again when the dependency
/// gets faster. `noise` is the relative standard error of the window
/// average and of the baseline together: a difference within 1.5 standard
/// errors is read as chance, not queueing. A dependency that serves `C`
/// calls at once without slowing down has the limit settle a little above
/// `C × tolerance + headroom × √C`.
///
/// A window in which a share of the calls failed has its gradient capped at
/// one minus that share, so a dependency that fails fast under load is
/// backed off from too. The limit does not grow while fewer than half of it
/// are in flight.
///
/// **The baseline** (no-load latency) is measured by probes: after the
/// first window, then every `probe_interval` windows (round trips,
/// roughly), the limit is halved until the calls started before have
/// drained; at least `probe_samples` calls, and at least half a limit's
/// worth, are timed at that lower concurrency; their average becomes the
/// baseline; the limit returns to where it was. A probe lasts a few round
/// trips at half the limit, once every 500 windows by default: well under
/// 1 % of the throughput. Measuring, rather than keeping the lowest average seen,
/// has two reasons. The lowest of many noisy averages is biased low, and a
/// baseline a few percent too low reads as a queue of a few percent of the
/// limit, which at large limits is more than the headroom: the limit would
/// stop growing. And a baseline that could only fall would read a
/// dependency that got slower for good (heavier requests, a slower replica)
/// as overloaded forever, while one that crept up would take sustained
/// overload for the new normal. (If the limit is more than twice what the
/// dependency serves without queueing when a probe starts, even the probe
/// queues and overestimates the baseline; the limit then settles near half
/// of what it was, and the next probe, lower still, gets it right.)
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`initial_limit`](Self::initial_limit) | 10 | the limit before any sample |
/// | [`bounds`](Self::bounds) | 1 ..= 1000 | the limit never leaves them |
/// | [`tolerance`](Self::tolerance) | 1.0 | latency this many times the baseline still counts as no queueing |
/// | [`headroom`](Self::headroom) | 0.35 | calls queued on purpose, as a multiple of √limit |
/// | [`smoothing`](Self::smoothing) | 0.5 | how far one window moves the limit towards its estimate |
/// | [`window`](Self::window) | 10 | fewest samples per window |
/// | [`probe_interval`](Self::probe_interval) | 500 | windows between baseline probes |
/// | [`probe_samples`](Self::probe_samples) | 32 | fewest calls timed per probe |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::adaptive::{Gradient, LimitAlgorithm, Sample};
///
/// let ms = Duration::from_millis;
/// let mut gradient = Gradient::new().initial_limit(20).probe_samples(10);
///
/// // The first window gives a first baseline, and starts a probe at half
/// // the limit.
/// for _ in 0..20 {
///     gradient.update(Sample::success(ms(50), 20));
/// }
/// assert!(gradient.is_probing());
/// assert_eq!(gradient.limit(), 10);
/// // 20 calls may have started before the probe; the next 10 time it.
/// for _ in 0..30 {
///     gradient.update(Sample::success(ms(50), 10));
/// }
/// assert_eq!(gradient.baseline(), Some(ms(50)));
/// assert_eq!(gradient.limit(), 20);
///
/// // No queueing: grow (by half of 0.35 × √20 calls).
/// for _ in 0..20 {
///     gradient.update(Sample::success(ms(50), 20));
/// }
/// assert_eq!(gradient.limit(), 20); // 20.78
/// for _ in 0..20 {
///     gradient.update(Sample::success(ms(50), 20));
/// }
/// assert_eq!(gradient.limit(), 21);
///
/// // Twice as slow: the dependency queues. Shrink.
/// for _ in 0..21 {
///     gradient.update(Sample::success(ms(100), 21));
/// }
/// assert_eq!(gradient.limit(), 16);
/// ```
#[derive(Debug, Clone)]
pub struct Gradient {
    min: usize,
    max: usize,
    tolerance: f64,
    headroom: f64,
    smoothing: f64,
    window: usize,
    probe_interval: u64,
    probe_samples: usize,
    /// The limit, with its fraction.
    limit: f64,
    /// The no-load latency, once known.
    baseline: Option<Baseline>,
    /// The window being filled.
    current: Window,
    /// Windows since the last probe ended.
    since_probe: u64,
    /// The probe under way, if any.
    probe: Option<Probe>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    latency: Mean,
    failures: usize,
    max_in_flight: usize,
}

/// A running mean of latencies, in seconds, and how sure it is.
#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    n: usize,
    sum: f64,
    sum_sq: f64,
}

impl Mean {
    fn add(&mut self, latency: Duration) {
        let x = latency.as_secs_f64();
        self.n += 1;
        self.sum += x;
        self.sum_sq += x * x;
    }

    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }

    /// The standard error of the mean, relative to the mean.
    fn relative_error(&self) -> f64 {
        let n = self.n as f64;
        let mean = self.mean();
        if self.n < 2 || mean <= 0.0 {
            return 0.0;
        }
        let variance = ((self.sum_sq - n * mean * mean) / (n - 1.0)).max(0.0);
        (variance / n).sqrt() / mean
    }
}

/// The no-load latency, as measured.
#[derive(Debug, Clone, Copy)]
struct Baseline {
    /// Seconds.
    latency: f64,
    /// Its standard error, relative to it.
    error: f64,
}

impl Baseline {
    fn of(mean: &Mean) -> Self {
        Self {
            latency: mean.mean(),
            error: mean.relative_error(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The limit to return to.
    resume: f64,
    /// The limit while probing.
    limit: usize,
    /// Low-concurrency samples still to skip: calls that may have started
    /// before the drain.
    skip: usize,
    latency: Mean,
}

impl Default for Gradient {
    fn default() -> Self {
        Self {
            min: 1,
            max: 1000,
            tolerance: 1.0,
            headroom: 0.35,
            smoothing: 0.5,
            window: 10,
            probe_interval: 500,
            probe_samples: 32,
            limit: 10.0,
            baseline: None,
            current: Window::default(),
            since_probe: 0,
            probe: None,
        }
    }
}

impl Gradient {
    limit_settings!("A gradient limit");

    /// How much slower than the baseline a window may be and still count as
    /// not queueing (default 1.0), on top of the allowance for noise that
    /// the algorithm makes itself. The limit settles about this much higher.
    ///
    /// # Panics
    ///
    /// Unless `tolerance >= 1`.
    #[must_use]
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        assert!(tolerance >= 1.0, "tolerance must be at least 1");
        self.tolerance = tolerance;
        self
    }

    /// How many calls to keep queued on purpose, as a multiple of the square
    /// root of the limit (default 0.35). More headroom finds new capacity
    /// faster and settles further above it.
    ///
    /// # Panics
    ///
    /// Unless `headroom > 0` (with none, the limit could never grow).
    #[must_use]
    pub fn headroom(mut self, headroom: f64) -> Self {
        assert!(headroom > 0.0, "headroom must be greater than 0");
        self.headroom = headroom;
        self
    }

    /// How far one window moves the limit towards its new estimate, from
    /// just above 0 (slow and steady) to 1 (all the way; default 0.5).
    ///
    /// # Panics
    ///
    /// Unless `0 < smoothing <= 1`.
    #[must_use]
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        assert!(
            smoothing > 0.0 && smoothing <= 1.0,
            "smoothing must be in (0, 1]"
        );
        self.smoothing = smoothing;
        self
    }

    /// The fewest samples averaged per window (default 10). A window also
    /// holds at least one limit's worth of samples.
    ///
    /// # Panics
    ///
    /// If `samples` is 0.
    #[must_use]
    pub fn window(mut self, samples: usize) -> Self {
        assert!(samples > 0, "window must be at least 1 sample");
        self.window = samples;
        self
    }

    /// Windows from the end of one baseline probe to the start of the next
    /// (default 500).
    ///
    /// # Panics
    ///
    /// If `windows` is 0.
    #[must_use]
    pub fn probe_interval(mut self, windows: u64) -> Self {
        assert!(windows > 0, "probe_interval must be at least 1 window");
        self.probe_interval = windows;
        self
    }

    /// The fewest calls a probe times (default 32); it also times at least
    /// the limit it probes at.
    ///
    /// # Panics
    ///
    /// If `samples` is 0.
    #[must_use]
    pub fn probe_samples(mut self, samples: usize) -> Self {
        assert!(samples > 0, "probe_samples must be at least 1");
        self.probe_samples = samples;
        self
    }

    /// The no-load latency learned so far, if any.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline.map(|b| Duration::from_secs_f64(b.latency))
    }

    /// Whether a baseline probe is under way (the limit is halved for it).
    pub fn is_probing(&self) -> bool {
        self.probe.is_some()
    }

    fn start_probe(&mut self) {
        let limit = (self.limit as usize / 2).max(self.min);
        self.probe = Some(Probe {
            resume: self.limit,
            limit,
            skip: 2 * limit,
            latency: Mean::default(),
        });
    }

    fn probe_sample(&mut self, sample: &Sample) {
        let Some(probe) = &mut self.probe else { return };
        if sample.in_flight > probe.limit {
            return; // still draining
        }
        if probe.skip > 0 {
            probe.skip -= 1;
            return;
        }
        probe.latency.add(sample.latency);
        if probe.latency.n >= self.probe_samples.max(probe.limit) {
            self.baseline = Some(Baseline::of(&probe.latency));
            self.limit = probe.resume;
            self.probe = None;
            self.since_probe = 0;
        }
    }

    fn end_window(&mut self) {
        let w = std::mem::take(&mut self.current);
        let Some(baseline) = self.baseline else {
            // A first guess; the probe that starts now measures it.
            self.baseline = Some(Baseline::of(&w.latency));
            self.start_probe();
            return;
        };
        let average = w.latency.mean();
        // A difference within `NOISE` standard errors is chance, not queueing.
        let (a, b) = (w.latency.relative_error(), baseline.error);
        let error = (a * a + b * b).sqrt(); // not `hypot`: libm differs by platform
        let latency = if average > 0.0 {
            self.tolerance * baseline.latency * (1.0 + NOISE * error) / average
        } else {
            1.0
        };
        let failures = 1.0 - w.failures as f64 / w.latency.n as f64;
        let gradient = latency.min(failures).clamp(0.5, 1.0);
        let mut estimate = self.limit * gradient + self.headroom * self.limit.sqrt();
        if w.max_in_flight.saturating_mul(2) < self.limit as usize {
            // Too little traffic to say whether more would be served well.
            estimate = estimate.min(self.limit);
        }
        let limit = self.limit + self.smoothing * (estimate - self.limit);
        self.limit = limit.clamp(self.min as f64, self.max as f64);
        self.since_probe += 1;
        if self.since_probe >= self.probe_interval {
            self.start_probe();
        }
    }
}

impl LimitAlgorithm for Gradient {
    fn limit(&self) -> usize {
        match &self.probe {
            Some(probe) => probe.limit,
            None => self.limit as usize,
        }
    }

    fn update(&mut self, sample: Sample) -> usize {
        if self.probe.is_some() {
            self.probe_sample(&sample);
        } else {
            let w = &mut self.current;
            w.latency.add(sample.latency);
            w.failures += usize::from(sample.failed);
            w.max_in_flight = w.max_in_flight.max(sample.in_flight);
            if w.latency.n >= self.window.max(self.limit as usize) {
                self.end_window();
            }
        }
        self.limit()
    }
}
