//! How evenly a semaphore spreads its grants among equal tasks in a hot
//! loop: `TASKS` tokio tasks on a 2-worker runtime (built with
//! `enable_all`, as `#[tokio::main]` builds it), one permit, each task
//! looping acquire, count, release, and acquiring again at once. After
//! `WARM_UP`, the grants in the next `WINDOW` are counted, and the report is max/min over the tasks
//! (1.00 is perfectly even; a strict FIFO hand-off should give about 1.00).
//!
//! Usage: `cargo bench -p watertight-benches --bench fairness -- run [RUNS]`
//! (prints a markdown table; without `run` it prints this usage).
//!
//! `-- trace [WORKERS]` is the diagnosis behind the numbers: the same loop,
//! every grant recorded in order (the task, and the worker that polled it),
//! and for each crate a report of how far the order is from round-robin and
//! where the tasks that fell behind were (see PERFORMANCE.md, "Fairness").

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

const TASKS: usize = 64;
const WINDOW: Duration = Duration::from_millis(200);
const WARM_UP: Duration = Duration::from_millis(50);

/// One permit's acquire, as each crate spells it.
trait Fair: Send + Sync + 'static {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_;
}

impl Fair for watertight::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire()
    }
}

impl Fair for tokio::sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire()
    }
}

impl Fair for futures_intrusive::sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire(1)
    }
}

impl Fair for maitake_sync::Semaphore {
    fn grant(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        self.acquire(1)
    }
}

/// The order of the grants, for `trace`: one entry per grant, the task's
/// index in the low byte and the polling worker's in the high one, written
/// by the permit's holder (so the order of the slots is the order of the
/// grants).
struct Log {
    next: AtomicUsize,
    slots: Vec<AtomicU16>,
    /// Releases (`drop(permit)`) that took longer than `STALL`: the log
    /// position of the grant, the task, the wall time and the thread's
    /// CPU time the drop took, in nanoseconds.
    stalls: std::sync::Mutex<Vec<(usize, usize, u64, u64)>>,
    /// Calls of the runtime's `wake` (made by a semaphore for the task it
    /// serves) that took longer than `STALL`: wall and CPU nanoseconds.
    wake_stalls: std::sync::Mutex<Vec<(u64, u64)>>,
}

/// A release this long is not work (it takes well under a microsecond).
const STALL: Duration = Duration::from_micros(100);

/// The calling thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Log {
    fn new(capacity: usize) -> Self {
        Self {
            next: AtomicUsize::new(0),
            slots: (0..capacity).map(|_| AtomicU16::new(0)).collect(),
            stalls: std::sync::Mutex::new(Vec::new()),
            wake_stalls: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Records a grant to `task`; returns its position.
    fn record(&self, task: usize) -> usize {
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.slots.get(at) {
            slot.store(
                task as u16 | u16::from(WORKER.get()) << 8,
                Ordering::Relaxed,
            );
        }
        at
    }
}

/// A task's waker wrapped to time the runtime's `wake`, for `trace`.
struct TimedWaker {
    inner: Waker,
    log: Arc<Log>,
}

impl Wake for TimedWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let (wall, cpu) = (Instant::now(), thread_cpu_ns());
        self.inner.wake_by_ref();
        let took = wall.elapsed();
        if took >= STALL {
            let cpu = thread_cpu_ns() - cpu;
            let entry = (took.as_nanos() as u64, cpu);
            self.log.wake_stalls.lock().unwrap().push(entry);
        }
    }
}

/// Polls `fut` with the task's waker wrapped in a [`TimedWaker`].
async fn timed<F: Future>(fut: F, log: Arc<Log>) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut wrapped: Option<(Waker, Waker)> = None;
    std::future::poll_fn(move |cx| {
        let waker = match &wrapped {
            Some((task, waker)) if task.will_wake(cx.waker()) => waker.clone(),
            _ => {
                let waker = Waker::from(Arc::new(TimedWaker {
                    inner: cx.waker().clone(),
                    log: log.clone(),
                }));
                wrapped = Some((cx.waker().clone(), waker.clone()));
                waker
            }
        };
        fut.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await
}

thread_local! {
    /// This thread's worker index (set by `on_thread_start`), for `trace`.
    static WORKER: Cell<u8> = const { Cell::new(0) };
}

/// Grants per task over one window, and with `log`, the order of every
/// grant (the log's positions at the window's start and end are returned
/// too).
fn counts<S: Fair>(
    rt: &tokio::runtime::Runtime,
    sem: S,
    log: Option<Arc<Log>>,
) -> (Vec<u64>, usize, usize) {
    let sem = Arc::new(sem);
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
    rt.block_on(async {
        let start = Arc::new(tokio::sync::Barrier::new(TASKS + 1));
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                let (sem, stop, counts, start, log) = (
                    sem.clone(),
                    stop.clone(),
                    counts.clone(),
                    start.clone(),
                    log.clone(),
                );
                tokio::spawn(async move {
                    start.wait().await;
                    while !stop.load(Ordering::Relaxed) {
                        let permit = match &log {
                            Some(log) => timed(sem.grant(), log.clone()).await,
                            None => sem.grant().await,
                        };
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        if let Some(log) = &log {
                            let at = log.record(i);
                            let (wall, cpu) = (Instant::now(), thread_cpu_ns());
                            drop(permit);
                            let took = wall.elapsed();
                            if took >= STALL {
                                let cpu = thread_cpu_ns() - cpu;
                                let entry = (at, i, took.as_nanos() as u64, cpu);
                                log.stalls.lock().unwrap().push(entry);
                            }
                        } else {
                            drop(permit);
                        }
                    }
                })
            })
            .collect();
        start.wait().await;
        // Counted from when every task has had time to join the line: the
        // start (a task that runs before the others are polled takes the
        // free permit again and again) is not what is measured.
        tokio::time::sleep(WARM_UP).await;
        let before: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let from = log.as_ref().map_or(0, |l| l.next.load(Ordering::Relaxed));
        tokio::time::sleep(WINDOW).await;
        let snapshot: Vec<u64> = counts
            .iter()
            .zip(before)
            .map(|(c, before)| c.load(Ordering::Relaxed) - before)
            .collect();
        let to = log.as_ref().map_or(0, |l| l.next.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            handle.await.expect("a task panicked");
        }
        (snapshot, from, to)
    })
}

fn spread(counts: &[u64]) -> (u64, u64, u64) {
    let max = *counts.iter().max().unwrap();
    let min = *counts.iter().min().unwrap();
    (max, min, counts.iter().sum())
}

/// One crate's run, with or without a log.
type Case = (
    &'static str,
    Box<dyn Fn(&tokio::runtime::Runtime, Option<Arc<Log>>) -> (Vec<u64>, usize, usize)>,
);

fn cases() -> Vec<Case> {
    vec![
        (
            "bulkhead (fair)",
            Box::new(|rt, log| counts(rt, watertight::Semaphore::new(1), log)),
        ),
        (
            "tokio",
            Box::new(|rt, log| counts(rt, tokio::sync::Semaphore::new(1), log)),
        ),
        (
            "futures-intrusive (fair)",
            Box::new(|rt, log| counts(rt, futures_intrusive::sync::Semaphore::new(true, 1), log)),
        ),
        (
            "maitake-sync",
            Box::new(|rt, log| counts(rt, maitake_sync::Semaphore::new(1), log)),
        ),
    ]
}

/// The worker threads' ids, in the order `WORKER` numbers them.
static TIDS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A multi-thread runtime with `workers` workers, built as `#[tokio::main]`
/// builds it, whose threads number themselves in `WORKER`.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    let started = Arc::new(AtomicUsize::new(0));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .on_thread_start(move || {
            let index = started.fetch_add(1, Ordering::Relaxed);
            WORKER.set(index.min(255) as u8);
            let tid = std::fs::read_link("/proc/thread-self")
                .map(|p| {
                    p.to_string_lossy()
                        .rsplit('/')
                        .next()
                        .unwrap_or("")
                        .to_owned()
                })
                .unwrap_or_default();
            TIDS.lock().unwrap().push(tid);
        })
        .build()
        .unwrap()
}

/// Involuntary context switches of each worker thread so far (Linux only;
/// empty elsewhere).
fn preemptions() -> Vec<u64> {
    TIDS.lock()
        .unwrap()
        .iter()
        .map(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                        .and_then(|v| v.trim().parse().ok())
                })
                .unwrap_or(0)
        })
        .collect()
}

/// Reports how far one window's grant order is from round-robin.
fn analyse(
    name: &str,
    entries: &[u16],
    workers: usize,
    preempted: &[u64],
) -> Vec<(usize, usize, usize)> {
    let task = |e: u16| (e & 0xff) as usize;
    let worker = |e: u16| (e >> 8) as usize;
    let n = entries.len();
    let mut per_task = vec![0u64; TASKS];
    let mut per_worker = vec![0u64; workers.max(1)];
    let mut last: Vec<Option<usize>> = vec![None; TASKS];
    // Gaps between a task's consecutive grants (grants in between, + 1).
    let (mut round, mut short, mut one_less, mut long) = (0u64, 0u64, 0u64, 0u64);
    let mut min_gap = usize::MAX;
    // Long gaps (the task missed at least one turn): their length, and the
    // share of the grants inside them that the other worker(s) made.
    let mut outages: Vec<(usize, f64)> = Vec::new();
    let mut spans: Vec<(usize, usize, usize)> = Vec::new();
    let mut lost = vec![0u64; TASKS];
    // Grants in a row on one worker, and how often the worker changes.
    let mut switches = 0u64;
    for (at, &e) in entries.iter().enumerate() {
        let (t, w) = (task(e), worker(e));
        per_task[t] += 1;
        if let Some(c) = per_worker.get_mut(w) {
            *c += 1;
        }
        if at > 0 && worker(entries[at - 1]) != w {
            switches += 1;
        }
        if let Some(prev) = last[t] {
            let gap = at - prev;
            min_gap = min_gap.min(gap);
            match gap {
                g if g == TASKS => round += 1,
                g if g == TASKS - 1 => one_less += 1,
                g if g < TASKS - 1 => short += 1,
                g => {
                    long += 1;
                    if g >= TASKS + TASKS / 2 {
                        let own = worker(entries[prev]);
                        let other = entries[prev + 1..at]
                            .iter()
                            .filter(|&&e| worker(e) != own)
                            .count();
                        outages.push((g, other as f64 / (g - 1) as f64));
                        spans.push((prev, at, own));
                        lost[t] += ((g - TASKS / 2) / TASKS) as u64;
                    }
                }
            }
        }
        last[t] = Some(at);
    }
    let gaps = (round + short + one_less + long).max(1) as f64;
    let (max, min, _) = spread(&per_task);
    println!("## {name}\n");
    println!(
        "- {n} grants in the window; max/min per task {:.3} ({max}/{min})",
        max as f64 / min.max(1) as f64
    );
    println!(
        "- share of grants per worker: {:?}; worker changes: one every {:.1} grants",
        per_worker
            .iter()
            .map(|&c| format!("{:.3}", c as f64 / n.max(1) as f64))
            .collect::<Vec<_>>(),
        n as f64 / switches.max(1) as f64
    );
    println!(
        "- gaps between a task's turns: {:.4} exactly {TASKS}, {:.4} {}, {:.4} shorter, {:.4} longer; shortest {min_gap}",
        round as f64 / gaps,
        one_less as f64 / gaps,
        TASKS - 1,
        short as f64 / gaps,
        long as f64 / gaps,
    );
    outages.sort_by_key(|o| std::cmp::Reverse(o.0));
    let turns: Vec<u64> = outages.iter().map(|o| (o.0 / TASKS) as u64).collect();
    let missed: u64 = turns.iter().sum();
    let on_other = if outages.is_empty() {
        0.0
    } else {
        outages.iter().map(|o| o.1 * o.0 as f64).sum::<f64>()
            / outages.iter().map(|o| o.0 as f64).sum::<f64>()
    };
    println!(
        "- {} missed-turn gaps ({missed} turns missed in all); longest {:?} grants; share of the grants inside them made by another worker than the absent task's last: {on_other:.3}",
        outages.len(),
        outages.iter().take(5).map(|o| o.0).collect::<Vec<_>>(),
    );
    let (most, least) = (
        per_task.iter().enumerate().max_by_key(|c| c.1).unwrap().0,
        per_task.iter().enumerate().min_by_key(|c| c.1).unwrap().0,
    );
    println!(
        "- turns lost in long gaps: the busiest task {}, the least served {} (of {max} and {min} grants)",
        lost[most], lost[least]
    );
    println!("- involuntary context switches per worker in the window: {preempted:?}");
    spans
}

/// Each worker thread's `/proc` schedstat: nanoseconds on a CPU, and
/// nanoseconds runnable but waiting for one.
fn schedstats() -> Vec<(u64, u64)> {
    TIDS.lock()
        .unwrap()
        .iter()
        .map(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
                .ok()
                .map(|s| {
                    let mut f = s.split_whitespace().map(|v| v.parse().unwrap_or(0));
                    (f.next().unwrap_or(0), f.next().unwrap_or(0))
                })
                .unwrap_or((0, 0))
        })
        .collect()
}

/// A sample of the log's position and the workers' schedstats.
struct Sample {
    at: usize,
    when: std::time::Instant,
    workers: Vec<(u64, u64)>,
}

fn trace(workers: usize) {
    let rt = runtime(workers);
    let log = Arc::new(Log::new(1 << 25));
    // Warm the runtime's threads up (so each has numbered itself).
    rt.block_on(async { tokio::task::yield_now().await });
    println!("{TASKS} tasks, 1 permit, {workers} worker(s), {WINDOW:?}: the order of the grants\n");
    for (name, case) in cases() {
        log.next.store(0, Ordering::Relaxed);
        let before = preemptions();
        // A sampler, every 250 us: where the log is, and how long each
        // worker has run and waited for a CPU (it costs a few percent of a
        // core, the same for every crate).
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (log, done) = (log.clone(), done.clone());
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    samples.push(Sample {
                        at: log.next.load(Ordering::Relaxed),
                        when: Instant::now(),
                        workers: schedstats(),
                    });
                    std::thread::sleep(Duration::from_micros(250));
                }
                samples
            })
        };
        let (_, from, to) = case(&rt, Some(log.clone()));
        done.store(true, Ordering::Relaxed);
        let samples = sampler.join().unwrap();
        let after = preemptions();
        let to = to.min(log.slots.len());
        let entries: Vec<u16> = log.slots[from..to]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect();
        let preempted: Vec<u64> = after
            .iter()
            .zip(before.iter().chain(std::iter::repeat(&0)))
            .map(|(a, b)| a - b)
            .collect();
        let spans = analyse(name, &entries, workers, &preempted);
        // Which long gaps began with a release that stalled, and whether
        // the stalled thread was working or off the CPU meanwhile.
        let stalls = std::mem::take(&mut *log.stalls.lock().unwrap());
        let in_window: Vec<_> = stalls.iter().filter(|s| s.0 >= from && s.0 < to).collect();
        let (wall, cpu): (u64, u64) = in_window
            .iter()
            .fold((0, 0), |(w, c), s| (w + s.2, c + s.3));
        let starts: std::collections::HashMap<usize, (u64, u64)> =
            in_window.iter().map(|s| (s.0 - from, (s.2, s.3))).collect();
        let (mut begun, mut lost_all, mut lost_begun) = (0, 0, 0);
        for &(start, end, _) in &spans {
            let turns = (end - start) / TASKS;
            lost_all += turns;
            if starts.contains_key(&start) {
                begun += 1;
                lost_begun += turns;
            }
        }
        println!(
            "- releases over {STALL:?}: {} ({:.1} ms in all, of which the thread was on a CPU {:.3}); {begun} of the {} long gaps began with one, {lost_begun} of the {lost_all} turns missed",
            in_window.len(),
            wall as f64 / 1e6,
            cpu as f64 / wall.max(1) as f64,
            spans.len(),
        );
        let wakes = std::mem::take(&mut *log.wake_stalls.lock().unwrap());
        let (wake_wall, wake_cpu): (u64, u64) =
            wakes.iter().fold((0, 0), |(w, c), s| (w + s.0, c + s.1));
        println!(
            "- runtime `wake` calls over {STALL:?} (whole run, warm-up included): {} ({:.1} ms, on a CPU {:.3})",
            wakes.len(),
            wake_wall as f64 / 1e6,
            wake_cpu as f64 / wake_wall.max(1) as f64
        );
        let window: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .collect();
        if let (Some(first), Some(last)) = (window.first(), window.last()) {
            let wall = (last.when - first.when).as_nanos().max(1) as f64;
            let shares: Vec<String> = first
                .workers
                .iter()
                .zip(&last.workers)
                .map(|(a, b)| {
                    format!(
                        "ran {:.2} waited {:.2}",
                        (b.0 - a.0) as f64 / wall,
                        (b.1 - a.1) as f64 / wall
                    )
                })
                .collect();
            println!("- each worker over the window, as a share of wall time: {shares:?}");
        }
        println!();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "trace") {
        let workers = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(2);
        trace(workers);
        return;
    }
    let Some(at) = args.iter().position(|a| a == "run") else {
        println!(
            "usage: cargo bench -p watertight-benches --bench fairness -- run [RUNS] | trace [WORKERS]"
        );
        return;
    };
    let runs: usize = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(3);
    let rt = runtime(2);
    println!(
        "{TASKS} tasks, 1 permit, 2 workers, {WINDOW:?} per run: max/min grants per task (total grants)\n"
    );
    println!(
        "| crate | {} |",
        (1..=runs)
            .map(|r| format!("run {r}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(runs));
    let cases = cases();
    let mut cells: Vec<Vec<String>> = vec![Vec::new(); cases.len()];
    for _ in 0..runs {
        for (i, (_, case)) in cases.iter().enumerate() {
            let got = case(&rt, None).0;
            if std::env::var_os("FAIRNESS_DUMP").is_some() {
                let mut sorted = got.clone();
                sorted.sort_unstable();
                eprintln!("{}: {sorted:?}", cases[i].0);
            }
            let (max, min, total) = spread(&got);
            let ratio = if min == 0 {
                f64::INFINITY
            } else {
                max as f64 / min as f64
            };
            cells[i].push(format!("{ratio:.2} ({total})"));
        }
    }
    for (i, (name, _)) in cases.iter().enumerate() {
        println!("| {name} | {} |", cells[i].join(" | "));
    }
}
