//! A multi-tenant API in front of one report service that can take 10
//! reports at once. Each tenant may run 4 at once; callers wait at most
//! 300 ms for a slot (in a line of at most 8 per tenant), then get "busy".
//!
//! Three tenants send a steady trickle (one report every 100 ms). A fourth,
//! `acme`, runs a script that fires 60 reports at once, twice. Without
//! per-tenant limits `acme` would take all 10 slots and the others would
//! queue behind its 120 reports; here it gets its 4, its excess is turned
//! away or waits in its own line, and the others never notice. Meanwhile
//! 40 trial tenants send one report each: the bulkhead tracks at most 16
//! tenants, evicting idle ones, and labels them all `trial` in metrics.
//!
//! Run with `cargo run --example tenants`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedStats};
use watertight::{Bulkhead, BulkheadError};

/// Reports per tenant at once.
const PER_TENANT: usize = 4;
/// Reports at once in all: what the report service can take.
const SERVICE_SLOTS: usize = 10;
/// How long a caller waits for a slot, for its tenant and the service.
const MAX_WAIT: Duration = Duration::from_millis(300);
/// How many of one tenant's callers may wait.
const TENANT_QUEUE: usize = 8;
/// How long one report takes.
const REPORT_TIME: Duration = Duration::from_millis(80);
/// The steady tenants send one report this often.
const TRICKLE_GAP: Duration = Duration::from_millis(100);
/// The most tenants tracked at once.
const MAX_TENANTS: usize = 16;
/// Tenants idle this long are evicted.
const IDLE_TIMEOUT: Duration = Duration::from_millis(200);
/// For comparison, one limit for everybody: its waiting line.
const SHARED_QUEUE: usize = 64;

const STEADY: [&str; 3] = ["globex", "initech", "umbrella"];
const NOISY: &str = "acme";
const BURST: usize = 60;
const TRIALS: usize = 40;

/// How one report request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Done,
    /// Rejected, with the reason's label.
    Busy(&'static str),
}

/// One request's record.
#[derive(Debug)]
struct Record {
    tenant: String,
    outcome: Outcome,
    waited: Duration,
}

/// Counts reports running at once, per tenant and in all.
#[derive(Debug, Default)]
struct Gauges {
    running: BTreeMap<String, (AtomicUsize, AtomicUsize)>,
    total: AtomicUsize,
    peak_total: AtomicUsize,
}

impl Gauges {
    fn new(tenants: impl IntoIterator<Item = String>) -> Self {
        Self {
            running: tenants
                .into_iter()
                .map(|t| (t, Default::default()))
                .collect(),
            ..Self::default()
        }
    }

    async fn run(&self, tenant: &str, work: Duration) {
        let (now, peak) = &self.running[tenant];
        peak.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
        self.peak_total.fetch_max(
            self.total.fetch_add(1, Ordering::SeqCst) + 1,
            Ordering::SeqCst,
        );
        tokio::time::sleep(work).await; // the report service at work
        self.total.fetch_sub(1, Ordering::SeqCst);
        now.fetch_sub(1, Ordering::SeqCst);
    }

    fn peak(&self, tenant: &str) -> usize {
        self.running[tenant].1.load(Ordering::SeqCst)
    }
}

/// How the report service is guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One plain [`Bulkhead`] of [`SERVICE_SLOTS`] for everybody, with a
    /// line of [`SHARED_QUEUE`].
    Shared,
    /// [`PER_TENANT`] per tenant (a line of [`TENANT_QUEUE`] each), and
    /// [`SERVICE_SLOTS`] in all.
    PerTenant,
}

/// The guard in front of the report service, as [`Mode`] says.
#[derive(Debug, Clone)]
enum Reports {
    /// A plain bulkhead: its rejections are `full` and `timeout`.
    Shared(Bulkhead),
    /// A bulkhead per tenant under a global one: `key_full`,
    /// `key_timeout`, `global_full`, `global_timeout`, ...
    PerTenant(KeyedBulkhead<String>),
}

impl Reports {
    /// Runs `report` for `tenant`; a rejection comes back as its reason's
    /// label and the time the caller waited.
    async fn call<F: Future<Output = ()>>(
        &self,
        tenant: &str,
        report: F,
    ) -> Result<(), (&'static str, Duration)> {
        let ok = async {
            report.await;
            Ok::<_, std::convert::Infallible>(())
        };
        match self {
            Self::Shared(bulkhead) => match bulkhead.call(ok).await {
                Ok(()) => Ok(()),
                Err(BulkheadError::Rejected(r)) => Err((r.reason().as_str(), r.waited())),
                Err(e) => panic!("report for {tenant} failed: {e}"),
            },
            Self::PerTenant(keyed) => match keyed.call(tenant, ok).await {
                Ok(()) => Ok(()),
                Err(KeyedError::Rejected(r)) => Err((r.reason().as_str(), r.waited())),
                Err(e) => panic!("report for {tenant} failed: {e}"),
            },
        }
    }
}

/// What a run did.
#[derive(Debug)]
struct Summary {
    records: Vec<Record>,
    gauges: Arc<Gauges>,
    /// The keyed bulkhead's numbers (per tenant only).
    stats: Option<KeyedStats>,
    /// Idle tenants `evict_idle` found after the run, once `IDLE_TIMEOUT`
    /// had passed.
    evicted_after: usize,
}

impl Summary {
    fn of<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(move |r| r.tenant == tenant)
    }

    fn count(&self, tenant: &str, outcome: Outcome) -> usize {
        self.of(tenant).filter(|r| r.outcome == outcome).count()
    }

    fn rejected(&self, tenant: &str) -> usize {
        self.of(tenant)
            .filter(|r| r.outcome != Outcome::Done)
            .count()
    }

    fn max_wait_done(&self, tenant: &str) -> Duration {
        self.of(tenant)
            .filter(|r| r.outcome == Outcome::Done)
            .map(|r| r.waited)
            .max()
            .unwrap_or_default()
    }
}

/// Sends one report request for `tenant` at `at` (from `start`).
fn request(
    reports: &Reports,
    gauges: &Arc<Gauges>,
    tenant: &str,
    start: Instant,
    at: Duration,
    scale: u32,
) -> tokio::task::JoinHandle<Record> {
    let (reports, gauges, tenant) = (reports.clone(), gauges.clone(), tenant.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep_until((start + at).into()).await;
        let called = Instant::now();
        let mut waited = Duration::ZERO;
        let report = async {
            waited = called.elapsed();
            gauges.run(&tenant, REPORT_TIME / scale).await;
        };
        let result = reports.call(&tenant, report).await;
        let outcome = match result {
            Ok(()) => Outcome::Done,
            Err((reason, rejected_after)) => {
                waited = rejected_after;
                Outcome::Busy(reason)
            }
        };
        Record {
            tenant,
            outcome,
            waited,
        }
    })
}

/// The whole story; `scale` divides every delay (1 for real time).
async fn run(scale: u32, mode: Mode) -> Summary {
    let reports = match mode {
        Mode::Shared => Reports::Shared(
            Bulkhead::builder()
                .name("reports")
                .max_concurrent_calls(SERVICE_SLOTS)
                .max_wait(MAX_WAIT / scale)
                .max_queue(SHARED_QUEUE)
                .build()
                .expect("a valid bulkhead"),
        ),
        Mode::PerTenant => Reports::PerTenant(
            KeyedBulkhead::<String>::builder()
                .name("reports")
                .max_concurrent_calls(PER_TENANT)
                .max_wait(MAX_WAIT / scale)
                .max_queue(TENANT_QUEUE)
                .global_limit(SERVICE_SLOTS)
                .max_keys(MAX_TENANTS)
                .idle_timeout(IDLE_TIMEOUT / scale)
                // Bounded metric labels: one per named tenant, one for all trials.
                .key_label(|tenant: &String| {
                    if tenant.starts_with("trial-") {
                        "trial".to_owned()
                    } else {
                        tenant.clone()
                    }
                })
                .build()
                .expect("a valid keyed bulkhead"),
        ),
    };

    let trials: Vec<String> = (0..TRIALS).map(|i| format!("trial-{i}")).collect();
    let tenants = STEADY
        .iter()
        .chain([&NOISY])
        .map(|t| t.to_string())
        .chain(trials.iter().cloned());
    let gauges = Arc::new(Gauges::new(tenants));
    let start = Instant::now();
    let mut tasks = Vec::new();
    // The steady tenants: one report every 100 ms for 2 s.
    for tenant in STEADY {
        for i in 0..20 {
            let at = TRICKLE_GAP * i / scale;
            tasks.push(request(&reports, &gauges, tenant, start, at, scale));
        }
    }
    // acme's script: 60 at once, twice.
    for burst_at in [Duration::from_millis(200), Duration::from_millis(1_100)] {
        for _ in 0..BURST {
            tasks.push(request(
                &reports,
                &gauges,
                NOISY,
                start,
                burst_at / scale,
                scale,
            ));
        }
    }
    // Trial tenants, one report each, one every 40 ms.
    for (i, trial) in trials.iter().enumerate() {
        let at = Duration::from_millis(40) * i as u32 / scale;
        tasks.push(request(&reports, &gauges, trial, start, at, scale));
    }

    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        records.push(task.await.expect("a request task panicked"));
    }
    let (stats, evicted_after) = match &reports {
        Reports::Shared(_) => (None, 0),
        Reports::PerTenant(keyed) => {
            let stats = keyed.stats();
            // Later, a maintenance task frees every tenant idle for idle_timeout.
            tokio::time::sleep(IDLE_TIMEOUT / scale).await;
            (Some(stats), keyed.evict_idle())
        }
    };
    Summary {
        records,
        gauges,
        stats,
        evicted_after,
    }
}

fn print_table(summary: &Summary) {
    println!("  tenant      sent  done  busy  peak at once  longest wait (done)  rejections");
    for tenant in STEADY.iter().chain([&NOISY]) {
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for r in summary.of(tenant) {
            if let Outcome::Busy(reason) = r.outcome {
                *reasons.entry(reason).or_default() += 1;
            }
        }
        println!(
            "  {tenant:<10} {:>5} {:>5} {:>5} {:>13} {:>17} ms  {reasons:?}",
            summary.of(tenant).count(),
            summary.count(tenant, Outcome::Done),
            summary.rejected(tenant),
            summary.gauges.peak(tenant),
            summary.max_wait_done(tenant).as_millis(),
        );
    }
    let trial_done = summary
        .records
        .iter()
        .filter(|r| r.tenant.starts_with("trial-") && r.outcome == Outcome::Done)
        .count();
    println!("  {TRIALS} trial tenants: {trial_done} of {TRIALS} reports done");
    println!(
        "  at most {} reports ran at once ({SERVICE_SLOTS} slots)",
        summary.gauges.peak_total.load(Ordering::SeqCst)
    );
}

#[tokio::main]
async fn main() {
    println!(
        "report service: {SERVICE_SLOTS} reports at once; callers wait at most {} ms\n",
        MAX_WAIT.as_millis()
    );
    println!("one plain bulkhead for everybody ({SERVICE_SLOTS} at once, {SHARED_QUEUE} waiting):");
    print_table(&run(1, Mode::Shared).await);

    println!(
        "\nper tenant: {PER_TENANT} at once and {TENANT_QUEUE} waiting each, \
         {SERVICE_SLOTS} at once in all:"
    );
    let summary = run(1, Mode::PerTenant).await;
    print_table(&summary);

    let s = summary.stats.as_ref().expect("per-tenant stats");
    println!(
        "\ntenants: {} tracked at the end (at most {}), {} tracked over the run, {} idle ones \
         evicted, {} turned away for lack of room; all {} evicted once idle for {} ms",
        s.keys_tracked(),
        s.max_keys(),
        s.keys_created(),
        s.keys_evicted(),
        s.rejected_too_many_keys(),
        summary.evicted_after,
        IDLE_TIMEOUT.as_millis(),
    );
    println!(
        "metric labels: {} (globex, initech, umbrella, acme, trial), however many tenants come",
        s.labels_in_use()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same story at a fifth of the time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_noisy_tenant_is_limited_and_the_others_are_not() {
        let summary = tokio::time::timeout(Duration::from_secs(30), run(5, Mode::PerTenant))
            .await
            .expect("the run hung");
        for tenant in STEADY.iter().chain([&NOISY]) {
            let peak = summary.gauges.peak(tenant);
            assert!(peak <= PER_TENANT, "{tenant}: {peak} at once");
        }
        let peak = summary.gauges.peak_total.load(Ordering::SeqCst);
        assert!(peak <= SERVICE_SLOTS, "{peak} at once in all");
        // acme's bursts are mostly turned away, at once: its line is full.
        assert!(
            summary.count(NOISY, Outcome::Busy("key_full"))
                >= 2 * (BURST - PER_TENANT - TENANT_QUEUE)
        );
        assert!(summary.count(NOISY, Outcome::Done) >= 2 * PER_TENANT);
        // Nobody else is.
        for tenant in STEADY {
            assert_eq!(
                summary.rejected(tenant),
                0,
                "{tenant}: {:?}",
                summary.of(tenant).collect::<Vec<_>>()
            );
        }
        let s = summary.stats.as_ref().expect("per-tenant stats");
        assert!(s.keys_tracked() <= MAX_TENANTS);
        assert!(s.keys_evicted() > 0, "{s:?}");
        assert_eq!(s.labels_in_use(), 5);
        assert_eq!(summary.evicted_after, s.keys_tracked());
    }

    /// With one limit for everybody, acme's bursts take every slot and the
    /// steady tenants queue behind them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_one_limit_for_everybody_the_noisy_tenant_takes_every_slot() {
        let summary = tokio::time::timeout(Duration::from_secs(30), run(5, Mode::Shared))
            .await
            .expect("the run hung");
        assert!(summary.gauges.peak(NOISY) > PER_TENANT);
        // The steady requests sent just after a burst wait for (at least)
        // one round of acme's reports.
        for tenant in STEADY {
            let waited = summary.max_wait_done(tenant);
            assert!(waited >= REPORT_TIME / 5, "{tenant} waited only {waited:?}");
        }
        let peak = summary.gauges.peak_total.load(Ordering::SeqCst);
        assert!(peak <= SERVICE_SLOTS, "{peak} at once in all");
        // A plain bulkhead's rejections: no key in their reasons. (Whether
        // acme's bursts time out depends on how the machine schedules them;
        // a full bulkhead below rejects for sure.)
        for r in &summary.records {
            assert!(
                matches!(r.outcome, Outcome::Done | Outcome::Busy("timeout" | "full")),
                "{r:?}"
            );
        }
        let full = Bulkhead::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_millis(5))
            .build()
            .unwrap();
        let _held = full.try_acquire().unwrap();
        let rejected = Reports::Shared(full).call(NOISY, async {}).await;
        assert_eq!(rejected.map_err(|(reason, _)| reason), Err("timeout"));
    }
}
