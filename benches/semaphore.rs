//! `watertight::Semaphore` against the semaphores a user would otherwise pick,
//! all in one run so the ratios between them are meaningful.
//!
//! Contenders (the last part of every benchmark name):
//!
//! | name              | type                                                |
//! |-------------------|-----------------------------------------------------|
//! | `bulkhead`        | `watertight::Semaphore::new` (fair)                   |
//! | `bulkhead_unfair` | `watertight::Semaphore::new_unfair`                   |
//! | `tokio`           | `tokio::sync::Semaphore` (fair)                     |
//! | `async_lock`      | `async_lock::Semaphore` (unfair)                    |
//! | `fi_fair`         | `futures_intrusive::sync::Semaphore::new(true, n)`  |
//! | `fi_unfair`       | `futures_intrusive::sync::Semaphore::new(false, n)` |
//! | `baseline`        | no semaphore: what the harness costs on its own     |
//! | `bare_cas`        | not a semaphore: a counter taken by a load and a    |
//! |                   | `compare_exchange_weak` loop, returned by one       |
//! |                   | `fetch_add` (`contended::BareCas`); uncontended     |
//! |                   | groups only, the floor of issue 13's 1.2x target    |
//!
//! Groups:
//!
//! - `uncontended_acquire/<name>`: create `acquire()`, poll it once with
//!   `Waker::noop()` (it is ready at once), drop the permit and the future
//!   (`contended::acquire_ready`). `bare_cas` runs the same: its `acquire()`
//!   is a future whose poll does the compare-and-swap loop.
//! - `uncontended_try_acquire/<name>`: `try_acquire()` and drop the permit.
//! - `contended_mt/t<T>_p<P>/<name>` and `contended_ct/t<T>_p<P>/<name>`:
//!   `T` tokio tasks share `P` permits on a multi-thread runtime with two
//!   workers (`mt`) or a current-thread runtime (`ct`). Together they do
//!   `TOTAL_ACQUIRES` acquisitions per iteration; each one is
//!   `acquire().await`, `yield_now().await` while holding the permit, then
//!   drop the permit. Times are per acquire/release pair and include
//!   spawning and joining the tasks (the `baseline` column shows how much).
//!   Neither runtime enables the I/O or time driver.
//!
//! Sizes of the acquire futures and permits are printed to stderr and written
//! to `<criterion dir>/sizes.json`; `benches/report.py` turns the estimates
//! and sizes into the tables that `PERFORMANCE.md` quotes.

#[path = "common/contended.rs"]
#[allow(
    dead_code,
    reason = "the joins serve benches/interleaved.rs and benches/polls.rs"
)]
mod contended;

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use contended::{BareCas, Baseline, Contender, TOTAL_ACQUIRES, acquire_ready, round};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::{Builder, Runtime};

const TASKS: [usize; 3] = [16, 256, 4096];
const PERMITS: [usize; 3] = [1, 8, 64];
/// A batch of contended rounds that takes longer than this has lost a
/// wake-up: the watchdog reports it and aborts instead of hanging.
const HANG_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds a contender's semaphore (a fresh one per call) and its loops.
type MakeRunner = Box<dyn Fn() -> Runner>;

/// One semaphore with `permits` permits per contender, in report order.
fn contenders(permits: usize) -> Vec<(&'static str, MakeRunner)> {
    vec![
        (
            "bulkhead",
            Box::new(move || Runner::new(watertight::Semaphore::new(permits))),
        ),
        (
            "bulkhead_unfair",
            Box::new(move || Runner::new(watertight::Semaphore::new_unfair(permits))),
        ),
        (
            "tokio",
            Box::new(move || Runner::new(tokio::sync::Semaphore::new(permits))),
        ),
        (
            "async_lock",
            Box::new(move || Runner::new(async_lock::Semaphore::new(permits))),
        ),
        (
            "fi_fair",
            Box::new(move || Runner::new(futures_intrusive::sync::Semaphore::new(true, permits))),
        ),
        (
            "fi_unfair",
            Box::new(move || Runner::new(futures_intrusive::sync::Semaphore::new(false, permits))),
        ),
        ("baseline", Box::new(|| Runner::new(Baseline))),
    ]
}

/// The uncontended groups' contenders: every crate with one permit, and the
/// bare compare-and-swap loop.
fn uncontended_contenders() -> Vec<(&'static str, MakeRunner)> {
    let mut all = contenders(1);
    all.push(("bare_cas", Box::new(|| Runner::new(BareCas::new(1)))));
    all
}

/// A type-erased contender: the benchmark loops, monomorphised for it.
struct Runner {
    uncontended_acquire: Box<dyn Fn(&mut criterion::Bencher<'_>)>,
    uncontended_try_acquire: Box<dyn Fn(&mut criterion::Bencher<'_>)>,
    /// `(runtime, tasks, iterations)` to the time those iterations took.
    contended: ContendedFn,
    /// The permits that can be taken now (stops at 4096).
    available: Box<dyn Fn() -> usize>,
}

type ContendedFn = Box<dyn Fn(&Runtime, usize, u64) -> Duration>;

impl Runner {
    fn new<S: Contender>(sem: S) -> Runner {
        let sem = Arc::new(sem);
        let (s1, s2, s3, s4) = (sem.clone(), sem.clone(), sem.clone(), sem);
        Runner {
            uncontended_acquire: Box::new(move |b| uncontended_acquire(b, &*s1)),
            uncontended_try_acquire: Box::new(move |b| uncontended_try_acquire(b, &*s2)),
            contended: Box::new(move |rt, tasks, iters| contended(rt, &s3, tasks, iters)),
            available: Box::new(move || available(&*s4)),
        }
    }
}

fn uncontended_acquire<S: Contender>(b: &mut criterion::Bencher<'_>, sem: &S) {
    let mut cx = Context::from_waker(Waker::noop());
    b.iter(|| acquire_ready(sem, &mut cx));
}

fn uncontended_try_acquire<S: Contender>(b: &mut criterion::Bencher<'_>, sem: &S) {
    b.iter(|| {
        drop(black_box(
            sem.try_acquire()
                .expect("an uncontended try_acquire succeeds"),
        ))
    });
}

/// Runs `iters` rounds of the contended workload and returns their time.
fn contended<S: Contender>(rt: &Runtime, sem: &Arc<S>, tasks: usize, iters: u64) -> Duration {
    let per_task = TOTAL_ACQUIRES / tasks;
    let _watch = Watchdog::arm();
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            round(sem, tasks, per_task).await;
        }
        start.elapsed()
    })
}

/// Aborts the process if a batch of contended rounds runs longer than
/// [`HANG_TIMEOUT`]. A thread of its own, so the runtimes need no timer (a
/// `tokio::time::timeout` per round would add the timer driver to every
/// scheduler tick of every contender).
struct Watchdog;

/// When the running batch started, if one is running.
static BATCH_STARTED: Mutex<Option<Instant>> = Mutex::new(None);

impl Watchdog {
    fn arm() -> Watchdog {
        static THREAD: OnceLock<()> = OnceLock::new();
        THREAD.get_or_init(|| {
            std::thread::spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    let started = *BATCH_STARTED.lock().unwrap();
                    if started.is_some_and(|t| t.elapsed() > HANG_TIMEOUT) {
                        eprintln!(
                            "contended benchmark made no progress for {HANG_TIMEOUT:?}: \
                             a lost wake-up or leaked permit; aborting"
                        );
                        std::process::abort();
                    }
                }
            });
        });
        *BATCH_STARTED.lock().unwrap() = Some(Instant::now());
        Watchdog
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *BATCH_STARTED.lock().unwrap() = None;
    }
}

/// How many permits can be taken at once now, up to 4096.
fn available<S: Contender>(sem: &S) -> usize {
    let mut held = Vec::new();
    while held.len() < 4096 {
        match sem.try_acquire() {
            Some(permit) => held.push(permit),
            None => break,
        }
    }
    held.len()
}

fn bench_uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended_acquire");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(1));
    for (name, make) in uncontended_contenders() {
        let runner = make();
        group.bench_function(name, |b| (runner.uncontended_acquire)(b));
    }
    group.finish();

    let mut group = c.benchmark_group("uncontended_try_acquire");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(1));
    for (name, make) in uncontended_contenders() {
        let runner = make();
        group.bench_function(name, |b| (runner.uncontended_try_acquire)(b));
    }
    group.finish();
}

fn bench_contended(c: &mut Criterion, group_name: &str, rt: &Runtime) {
    let mut group = c.benchmark_group(group_name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .throughput(Throughput::Elements(TOTAL_ACQUIRES as u64));
    for tasks in TASKS {
        for permits in PERMITS {
            for (name, make) in contenders(permits) {
                let runner = make();
                let id = BenchmarkId::new(format!("t{tasks}_p{permits}"), name);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| (runner.contended)(rt, tasks, iters));
                });
                // Every permit must have come back.
                if name != "baseline" {
                    let left = (runner.available)();
                    assert_eq!(
                        left, permits,
                        "{group_name}/t{tasks}_p{permits}/{name} leaked permits"
                    );
                }
            }
        }
    }
    group.finish();
}

fn bench_contended_mt(c: &mut Criterion) {
    // No `enable_*`: the workload needs neither I/O nor timers, and each
    // driver would add its own work to every scheduler tick.
    let rt = Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    bench_contended(c, "contended_mt", &rt);
}

fn bench_contended_ct(c: &mut Criterion) {
    let rt = Builder::new_current_thread().build().unwrap();
    bench_contended(c, "contended_ct", &rt);
}

/// Sizes in bytes of each crate's acquire future and permit, printed and
/// written to `<criterion dir>/sizes.json` for `benches/report.py`.
fn record_sizes(_: &mut Criterion) {
    use std::mem::{size_of, size_of_val};

    let b = Arc::new(watertight::Semaphore::new(1));
    let t = Arc::new(tokio::sync::Semaphore::new(1));
    let a = Arc::new(async_lock::Semaphore::new(1));
    let f = futures_intrusive::sync::Semaphore::new(true, 1);
    let fs = futures_intrusive::sync::SharedSemaphore::new(true, 1);

    let rows = [
        Sizes {
            name: "bulkhead",
            acquire: size_of_val(&b.acquire()),
            permit: size_of::<watertight::Permit<'_>>(),
            acquire_owned: size_of_val(&b.acquire_owned()),
            permit_owned: size_of::<watertight::OwnedPermit>(),
        },
        Sizes {
            name: "tokio",
            acquire: size_of_val(&t.acquire()),
            permit: size_of::<tokio::sync::SemaphorePermit<'_>>(),
            acquire_owned: size_of_val(&t.clone().acquire_owned()),
            permit_owned: size_of::<tokio::sync::OwnedSemaphorePermit>(),
        },
        Sizes {
            name: "async_lock",
            acquire: size_of_val(&a.acquire()),
            permit: size_of::<async_lock::SemaphoreGuard<'_>>(),
            acquire_owned: size_of_val(&a.acquire_arc()),
            permit_owned: size_of::<async_lock::SemaphoreGuardArc>(),
        },
        Sizes {
            name: "futures_intrusive",
            acquire: size_of_val(&f.acquire(1)),
            permit: size_of::<futures_intrusive::sync::SemaphoreReleaser<'_>>(),
            acquire_owned: size_of_val(&fs.acquire(1)),
            permit_owned: size_of::<futures_intrusive::sync::SharedSemaphoreReleaser>(),
        },
    ];

    eprintln!("sizes in bytes: acquire future, permit, owned acquire future, owned permit");
    let mut entries = Vec::new();
    for r in &rows {
        let Sizes {
            name,
            acquire,
            permit,
            acquire_owned,
            permit_owned,
        } = r;
        eprintln!("  {name:<18} {acquire:>4} {permit:>4} {acquire_owned:>4} {permit_owned:>4}");
        entries.push(format!(
            "  \"{name}\": {{\"acquire\": {acquire}, \"permit\": {permit}, \
             \"acquire_owned\": {acquire_owned}, \"permit_owned\": {permit_owned}}}"
        ));
    }
    let json = format!("{{\n{}\n}}\n", entries.join(",\n"));

    if rows[0].acquire > rows[1].acquire {
        eprintln!(
            "WARNING: bulkhead's acquire future ({} B) is larger than tokio's ({} B)",
            rows[0].acquire, rows[1].acquire
        );
    }

    let dir = criterion_dir();
    if std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("sizes.json"), json))
        .is_err()
    {
        eprintln!("could not write {}", dir.join("sizes.json").display());
    }
}

/// One row of the sizes table, in bytes.
struct Sizes {
    name: &'static str,
    acquire: usize,
    permit: usize,
    acquire_owned: usize,
    permit_owned: usize,
}

/// Where criterion writes its results (the same rules criterion follows).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        PathBuf::from(home)
    } else if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(target).join("criterion")
    } else {
        // The workspace's target directory: this crate sits in `benches/`.
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/criterion"))
    }
}

criterion_group! {
    name = benches;
    // Plotting costs several seconds per benchmark, more than measuring it;
    // the tables come from `benches/report.py` instead.
    config = Criterion::default().without_plots();
    targets = record_sizes, bench_uncontended, bench_contended_mt, bench_contended_ct
}
criterion_main!(benches);
