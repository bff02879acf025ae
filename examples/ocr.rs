//! An ID-card OCR service on a GPU that reads 3 images at once. A caller
//! waits at most 2 s for the GPU; after that it gets "busy, retry later"
//! rather than a request that hangs.
//!
//! A burst of 20 scans arrives together (one every 10 ms, so the order of
//! the line is plain to see). The GPU is simulated: each image takes 0.3 to
//! 1.5 s, drawn from a fixed pseudo-random sequence, so every run tells the
//! same story. The line is served first come, first served; the scans at
//! its back are still waiting when their 2 s are up, and are told to come
//! back later.
//!
//! Run with `cargo run --example ocr`.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use watertight::{Bulkhead, BulkheadError, Metrics, RejectReason, Rejected};

/// Images the GPU reads at once.
const GPU_SLOTS: usize = 3;
/// How long a caller waits for the GPU before it is told "busy".
const MAX_WAIT: Duration = Duration::from_secs(2);
/// A read that takes longer than this is abandoned (a stuck GPU job).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest and longest read of one image.
const READ_TIME: (u64, u64) = (300, 1_500);
/// The time between two arrivals in the burst.
const ARRIVAL_GAP: Duration = Duration::from_millis(10);

/// One uploaded photo of an ID card.
#[derive(Debug, Clone)]
struct IdCardImage {
    request: usize,
    /// How long the GPU will take on this photo (the simulation's secret).
    read_time: Duration,
}

/// What the OCR read from the card, and how long it took (as a service
/// would report in a `Server-Timing` header).
#[derive(Debug, Clone)]
struct Scan {
    card_number: String,
    /// From the call until the GPU took the image.
    waited: Duration,
    /// The GPU's time on the image.
    read_in: Duration,
}

/// Why a scan was not done: what the caller of [`OcrService::scan`] sees.
#[derive(Debug, Clone)]
enum ScanError {
    /// The GPU stayed busy for the whole wait: try again later.
    Busy { waited: Duration },
    /// The read itself took longer than the service allows.
    TooSlow,
    /// The service is shutting down.
    Unavailable(Rejected),
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy { waited } => write!(
                f,
                "ocr service is busy, retry later (waited {:.2} s)",
                waited.as_secs_f64()
            ),
            Self::TooSlow => f.write_str("ocr took too long on this image"),
            Self::Unavailable(r) => write!(f, "ocr service unavailable: {r}"),
        }
    }
}

impl std::error::Error for ScanError {}

/// The OCR service: every read goes through a bulkhead of [`GPU_SLOTS`].
#[derive(Debug)]
struct OcrService {
    gpu: Bulkhead,
    /// Divides every delay, so tests can run the same story faster.
    scale: u32,
    on_gpu: AtomicUsize,
    peak_on_gpu: AtomicUsize,
}

impl OcrService {
    fn new(scale: u32) -> Self {
        let gpu = Bulkhead::builder()
            .name("gpu-ocr")
            .max_concurrent_calls(GPU_SLOTS)
            .max_wait(MAX_WAIT / scale)
            .call_timeout(CALL_TIMEOUT / scale)
            .build()
            .expect("a valid bulkhead");
        Self {
            gpu,
            scale,
            on_gpu: AtomicUsize::new(0),
            peak_on_gpu: AtomicUsize::new(0),
        }
    }

    /// Reads one ID card, or says why not.
    async fn scan(&self, image: &IdCardImage) -> Result<Scan, ScanError> {
        let called = Instant::now();
        // Not polled until the bulkhead admits the call.
        let read = async {
            let started = Instant::now();
            let on_gpu = OnGpu::enter(&self.on_gpu, &self.peak_on_gpu);
            tokio::time::sleep(image.read_time / self.scale).await; // the GPU at work
            drop(on_gpu);
            let digits = mix(image.request as u64) % 1_000_000_000;
            Ok::<_, Infallible>(Scan {
                card_number: format!(
                    "079 {:03} {:03} {:03}",
                    digits / 1_000_000,
                    digits / 1_000 % 1_000,
                    digits % 1_000
                ),
                waited: started - called,
                read_in: started.elapsed(),
            })
        };
        self.gpu.call(read).await.map_err(|e| match e {
            BulkheadError::Rejected(r) if r.reason() == RejectReason::Timeout => {
                ScanError::Busy { waited: r.waited() }
            }
            BulkheadError::Rejected(r) => ScanError::Unavailable(r),
            BulkheadError::CallTimeout(_) => ScanError::TooSlow,
            BulkheadError::Inner(never) => match never {},
            // `BulkheadError` is non-exhaustive; this example knows every
            // variant it has today.
            other => unreachable!("a bulkhead error this example does not know: {other:?}"),
        })
    }
}

/// Counts an image as on the GPU until dropped, also when `call_timeout`
/// drops the read half-way.
struct OnGpu<'a>(&'a AtomicUsize);

impl<'a> OnGpu<'a> {
    fn enter(on_gpu: &'a AtomicUsize, peak: &AtomicUsize) -> Self {
        let now = on_gpu.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        Self(on_gpu)
    }
}

impl Drop for OnGpu<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fixed pseudo-random spread (splitmix64): no `rand` needed, and the
/// same seed gives the same run.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How one request ended.
#[derive(Debug)]
struct Record {
    request: usize,
    /// From arrival until the GPU took the image, or until "busy".
    waited: Duration,
    /// From the burst until the request arrived.
    arrived_at: Duration,
    /// From the burst until the answer.
    answered_at: Duration,
    outcome: Result<Scan, ScanError>,
}

/// What a run did.
#[derive(Debug)]
struct Summary {
    /// In the order the answers went out.
    records: Vec<Record>,
    peak_on_gpu: usize,
    gpu: Metrics,
    max_wait: Duration,
    elapsed: Duration,
}

impl Summary {
    fn processed(&self) -> usize {
        self.records.iter().filter(|r| r.outcome.is_ok()).count()
    }

    fn busy(&self) -> usize {
        self.records
            .iter()
            .filter(|r| matches!(r.outcome, Err(ScanError::Busy { .. })))
            .count()
    }
}

/// A burst of `requests` scans arrives, one every [`ARRIVAL_GAP`]; `scale`
/// divides every delay (1 for real time).
async fn run(requests: usize, seed: u64, scale: u32) -> Summary {
    let service = Arc::new(OcrService::new(scale));
    let burst = Instant::now();
    let tasks: Vec<_> = (0..requests)
        .map(|request| {
            let service = service.clone();
            let (shortest, longest) = READ_TIME;
            let millis = shortest + mix(seed ^ request as u64) % (longest - shortest + 1);
            let image = IdCardImage {
                request,
                read_time: Duration::from_millis(millis),
            };
            let arrival = ARRIVAL_GAP * request as u32 / scale;
            tokio::spawn(async move {
                tokio::time::sleep_until((burst + arrival).into()).await;
                let arrived = Instant::now();
                let arrived_at = arrived - burst;
                let outcome = service.scan(&image).await;
                let waited = match &outcome {
                    Ok(scan) => scan.waited,
                    Err(_) => arrived.elapsed(),
                };
                Record {
                    request,
                    waited,
                    arrived_at,
                    answered_at: burst.elapsed(),
                    outcome,
                }
            })
        })
        .collect();
    let mut records = Vec::with_capacity(requests);
    for task in tasks {
        records.push(task.await.expect("a request task panicked"));
    }
    records.sort_by_key(|r| r.answered_at);
    Summary {
        records,
        peak_on_gpu: service.peak_on_gpu.load(Ordering::SeqCst),
        gpu: service.gpu.metrics(),
        max_wait: MAX_WAIT / scale,
        elapsed: burst.elapsed(),
    }
}

#[tokio::main]
async fn main() {
    let requests = 20;
    println!(
        "{requests} ID-card scans arrive within {:.1} s; the GPU reads {GPU_SLOTS} at a time; \
         a caller waits at most {} s for it\n",
        (ARRIVAL_GAP * requests as u32).as_secs_f64(),
        MAX_WAIT.as_secs(),
    );
    let summary = run(requests, 7, 1).await;

    println!("  answered  request  arrived  waited  outcome");
    for r in &summary.records {
        let outcome = match &r.outcome {
            Ok(scan) => format!(
                "read card {} in {:.2} s",
                scan.card_number,
                scan.read_in.as_secs_f64()
            ),
            Err(e) => e.to_string(),
        };
        println!(
            "  {:>6.2} s  #{:<6} {:>5.2} s  {:>4.2} s  {outcome}",
            r.answered_at.as_secs_f64(),
            r.request,
            r.arrived_at.as_secs_f64(),
            r.waited.as_secs_f64(),
        );
    }

    let m = &summary.gpu;
    let other = summary.records.len() - summary.processed() - summary.busy();
    println!(
        "\n{} read, {} told \"busy, retry later\"{}; every request answered within {:.2} s",
        summary.processed(),
        summary.busy(),
        if other > 0 {
            format!(", {other} failed otherwise")
        } else {
            String::new()
        },
        summary.elapsed.as_secs_f64(),
    );
    println!(
        "GPU: at most {} images at once ({GPU_SLOTS} slots)",
        summary.peak_on_gpu
    );
    println!(
        "bulkhead \"{}\": {} permitted, {} rejected after waiting {} s, {} in flight now",
        m.name(),
        m.permitted(),
        m.rejected_timeout(),
        summary.max_wait.as_secs(),
        m.in_flight(),
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ScanError;

    /// The same story at a tenth of the time: a 200 ms wait, reads of 30 to
    /// 150 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_after_the_wait_and_never_more_than_three_on_the_gpu() {
        let summary = tokio::time::timeout(Duration::from_secs(30), super::run(20, 7, 10))
            .await
            .expect("the run hung");
        assert_eq!(summary.max_wait, Duration::from_millis(200));
        assert!(
            summary.peak_on_gpu <= super::GPU_SLOTS,
            "peak {}",
            summary.peak_on_gpu
        );
        assert!(summary.busy() >= 1, "nobody was told to retry: {summary:?}");
        for r in &summary.records {
            match &r.outcome {
                Ok(_) => {}
                Err(ScanError::Busy { waited }) => {
                    assert!(
                        *waited >= summary.max_wait,
                        "request {} busy after {waited:?}",
                        r.request
                    );
                    assert!(
                        r.waited >= summary.max_wait,
                        "request {} busy after {:?}",
                        r.request,
                        r.waited
                    );
                }
                Err(e) => panic!("request {} failed: {e}", r.request),
            }
        }
        assert_eq!(summary.processed() + summary.busy(), 20);
        let m = &summary.gpu;
        assert_eq!(m.permitted(), summary.processed() as u64);
        assert_eq!(m.rejected_timeout(), summary.busy() as u64);
        assert_eq!(
            (m.rejected(), m.call_timeouts()),
            (summary.busy() as u64, 0)
        );
        assert_eq!((m.in_flight(), m.queued()), (0, 0));
    }
}
