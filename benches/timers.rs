//! `ThreadTimer`, the crate's own timer thread, against `futures-timer` 3,
//! the crate a user would otherwise pick for sleeps outside a runtime
//! (issue 12). Both run one background thread per process; they differ in
//! where a sleep's state lives (`ThreadSleep` inline in the future, a slot
//! and a heap entry in vectors behind a mutex; `futures_timer::Delay` an
//! `Arc`'d node, handed to the thread through a lock-free list on creation
//! and again on drop, kept in a binary heap there).
//!
//! Contenders (the last part of every benchmark name):
//!
//! | name | what |
//! |---|---|
//! | `thread_sleep` | `ThreadSleep::new`: what a bulkhead's `max_wait` and `call_timeout` use, inline in the call's future |
//! | `thread_timer_boxed` | `ThreadTimer::sleep`: the same sleep boxed, as the `Timer` trait hands it out |
//! | `futures_timer` | `futures_timer::Delay::new` |
//!
//! Criterion cells (time per timer; one timer is made, polled once with
//! `Waker::noop()`, which must leave it pending, and dropped: the cost of a
//! wait that ends before its deadline, the common case of `max_wait`):
//!
//! - `timer_cycle/*`: one thread, nothing else pending, sleeps of 1 s.
//! - `timer_cycle_2_threads/*`: two threads doing it at once; the time is
//!   the wall time of both divided by the timers made (so 1 / throughput).
//! - `timer_cycle_10k_pending/*`: one thread, with 10,000 sleeps pending
//!   (deadlines spread over 60 to 120 s), sleeps of 90 s.
//!
//! Then plain measurements, printed as tables, every contender interleaved
//! round by round so that a change of machine load hits all alike:
//!
//! - **Cost per timer, all threads**: the same cycle, counting CPU time of
//!   the calling thread and of the timer thread (from
//!   `/proc/self/task/*/schedstat`), the timer thread's context switches
//!   (its wake-ups), and the allocations made per timer (a counting global
//!   allocator, on only while measuring): alone, among 10,000 pending, and
//!   as a line of 10,000 waiters moves (the oldest dropped, a new one made
//!   at the back, as a bulkhead's waiters with one `max_wait` do).
//! - **Allocations in a line** of 11, 12, 100 and 10,000 sleeps. No line
//!   may allocate with `ThreadSleep` (its queue was an ordered map once,
//!   which allocated from 12 on).
//! - **Memory per pending sleep**: bytes allocated (net) to register
//!   10,000 sleeps.
//! - **Lateness**: `futures::executor::block_on` of one sleep, many times,
//!   for 1, 10 and 100 ms; actual wake minus requested, median, p99 and
//!   max; `std::thread::sleep` as the floor the operating system sets. A
//!   sleep that wakes early fails the bench.
//! - **Expiry burst**: 10,000 sleeps of 100 ms registered at once; the
//!   timer thread's CPU per wake-up, and how late the first, median and
//!   last wake-up are. Every sleep must be woken once, none early.
//! - **Idle**: the timer thread's CPU and wake-ups over one second with
//!   10,000 sleeps pending far away, and with none pending after 1,000
//!   sleeps were cancelled (must be about nothing).
//! - **Behaviour**: whether a dropped sleep's waker is released at once,
//!   and whether sleeps still work after a waker panicked on the timer
//!   thread (they must, with `ThreadSleep`). This runs last: it ends
//!   futures-timer's thread.
//!
//! Run with `cargo bench -p watertight-benches --bench timers` (about two and a half minutes);
//! `cargo test -p watertight-benches --bench timers` runs every cell once and the measurements
//! with small counts, checks included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock, mpsc};
use std::task::{Context, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use watertight::timer::{ThreadSleep, ThreadTimer, Timer};

// ---------------------------------------------------------------------------
// Counting allocator

/// Counts allocations while [`COUNTING`] is on, and does nothing else
/// otherwise (one relaxed load), so the criterion cells pay nothing for it.
struct Counting;

/// Whether allocations are counted.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations (`alloc`, `alloc_zeroed`, `realloc`) on every thread.
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated, and bytes freed, on every thread.
static BYTES_IN: AtomicU64 = AtomicU64::new(0);
static BYTES_OUT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Allocations on this thread (only counted while [`COUNTING`] is on).
    static OWN_ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Set while this thread does the measuring's own work (reading
    /// `/proc`), which is not counted.
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Whether an allocation on this thread, now, is counted.
fn counted_here() -> bool {
    COUNTING.load(Ordering::Relaxed) && !UNCOUNTED.try_with(Cell::get).unwrap_or(false)
}

/// Runs `f` without counting its allocations on this thread.
fn uncounted<R>(f: impl FnOnce() -> R) -> R {
    let was = UNCOUNTED.with(|u| u.replace(true));
    let out = f();
    UNCOUNTED.with(|u| u.set(was));
    out
}

fn note_alloc(bytes: usize) {
    if counted_here() {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES_IN.fetch_add(bytes as u64, Ordering::Relaxed);
        let _ = OWN_ALLOCS.try_with(|n| n.set(n.get() + 1));
    }
}

fn note_free(bytes: usize) {
    if counted_here() {
        BYTES_OUT.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping touches atomics and a const-initialised thread-local, which
// never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc(new_size);
        note_free(layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What the allocator saw while a [`Counted`] was alive.
#[derive(Clone, Copy, Debug, Default)]
struct Allocs {
    /// On the thread that made the `Counted`.
    own: u64,
    /// On every thread (the timer thread's included).
    all: u64,
    /// Bytes allocated minus bytes freed, on every thread.
    net_bytes: i64,
}

/// Counts allocations from [`Counted::start`] to [`Counted::stop`].
struct Counted {
    own: u64,
    all: u64,
    bytes_in: u64,
    bytes_out: u64,
}

impl Counted {
    fn start() -> Counted {
        let counted = Counted {
            own: OWN_ALLOCS.with(Cell::get),
            all: ALLOCS.load(Ordering::SeqCst),
            bytes_in: BYTES_IN.load(Ordering::SeqCst),
            bytes_out: BYTES_OUT.load(Ordering::SeqCst),
        };
        COUNTING.store(true, Ordering::SeqCst);
        counted
    }

    fn stop(self) -> Allocs {
        COUNTING.store(false, Ordering::SeqCst);
        let bytes_in = BYTES_IN.load(Ordering::SeqCst) - self.bytes_in;
        let bytes_out = BYTES_OUT.load(Ordering::SeqCst) - self.bytes_out;
        Allocs {
            own: OWN_ALLOCS.with(Cell::get) - self.own,
            all: ALLOCS.load(Ordering::SeqCst) - self.all,
            net_bytes: bytes_in as i64 - bytes_out as i64,
        }
    }
}

// ---------------------------------------------------------------------------
// Contenders

/// A timer under test: how to make one of its sleeps.
trait Contender {
    /// The benchmark name.
    const NAME: &'static str;
    /// The name of its timer thread, as `/proc/self/task/*/comm` shows it.
    const THREAD: &'static str;
    type Sleep: Future<Output = ()> + Send + Unpin + 'static;
    /// A sleep of `duration` from now.
    fn sleep(duration: Duration) -> Self::Sleep;
}

struct Inline;
impl Contender for Inline {
    const NAME: &'static str = "thread_sleep";
    const THREAD: &'static str = "bulkhead-timer";
    type Sleep = ThreadSleep;
    #[inline(always)]
    fn sleep(duration: Duration) -> ThreadSleep {
        ThreadSleep::new(duration)
    }
}

struct Boxed;
impl Contender for Boxed {
    const NAME: &'static str = "thread_timer_boxed";
    const THREAD: &'static str = "bulkhead-timer";
    type Sleep = watertight::timer::Sleep;
    #[inline(always)]
    fn sleep(duration: Duration) -> watertight::timer::Sleep {
        ThreadTimer::new().sleep(duration)
    }
}

struct FuturesTimer;
impl Contender for FuturesTimer {
    const NAME: &'static str = "futures_timer";
    const THREAD: &'static str = "futures-timer";
    type Sleep = futures_timer::Delay;
    #[inline(always)]
    fn sleep(duration: Duration) -> futures_timer::Delay {
        futures_timer::Delay::new(duration)
    }
}

/// One timer made, polled once (it must be pending) and dropped.
#[inline(always)]
fn cycle<C: Contender>(duration: Duration, cx: &mut Context<'_>) {
    let mut sleep = pin!(C::sleep(duration));
    assert!(
        sleep.as_mut().poll(cx).is_pending(),
        "{}: a sleep of {duration:?} was ready on its first poll",
        C::NAME
    );
}

/// Polls a sleep once (it must be pending): registers it with its thread.
fn register<S: Future<Output = ()> + Unpin>(sleep: &mut S, cx: &mut Context<'_>) {
    assert!(
        Pin::new(sleep).poll(cx).is_pending(),
        "a pending sleep was ready"
    );
}

/// `count` registered sleeps with deadlines spread evenly over 60 to
/// 120 s from now: a bulkhead's waiters with long `max_wait`s.
fn pending<C: Contender>(count: usize) -> Vec<C::Sleep> {
    let mut cx = Context::from_waker(Waker::noop());
    (0..count)
        .map(|i| {
            let spread = Duration::from_secs(60).mul_f64(i as f64 / count as f64);
            let mut sleep = C::sleep(Duration::from_secs(60) + spread);
            register(&mut sleep, &mut cx);
            sleep
        })
        .collect()
}

/// Starts both timer threads (and lets them settle), so no cell or
/// measurement pays for a thread start.
fn start_timer_threads() {
    futures::executor::block_on(Inline::sleep(Duration::from_millis(1)));
    futures::executor::block_on(FuturesTimer::sleep(Duration::from_millis(1)));
    thread::sleep(Duration::from_millis(10));
}

// ---------------------------------------------------------------------------
// Criterion cells

const CYCLE_SLEEP: Duration = Duration::from_secs(1);
const PENDING: usize = 10_000;
const PENDING_SLEEP: Duration = Duration::from_secs(90);

fn single_thread(c: &mut Criterion) {
    start_timer_threads();
    let mut g = c.benchmark_group("timer_cycle");
    fn one<C: Contender>(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
        let mut cx = Context::from_waker(Waker::noop());
        g.bench_function(C::NAME, |b| {
            b.iter(|| cycle::<C>(black_box(CYCLE_SLEEP), &mut cx))
        });
    }
    one::<Inline>(&mut g);
    one::<Boxed>(&mut g);
    one::<FuturesTimer>(&mut g);
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_cycle_2_threads");
    fn one<C: Contender>(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
        g.bench_function(C::NAME, |b| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(2);
                let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
                    let workers: Vec<_> = (0..2)
                        .map(|_| {
                            s.spawn(|| {
                                let mut cx = Context::from_waker(Waker::noop());
                                barrier.wait();
                                let start = Instant::now();
                                for _ in 0..iters {
                                    cycle::<C>(black_box(CYCLE_SLEEP), &mut cx);
                                }
                                (start, Instant::now())
                            })
                        })
                        .collect();
                    workers.into_iter().map(|w| w.join().unwrap()).collect()
                });
                let start = spans.iter().map(|s| s.0).min().unwrap();
                let end = spans.iter().map(|s| s.1).max().unwrap();
                // Two timers per iteration: report the time per timer.
                (end - start) / 2
            })
        });
    }
    one::<Inline>(&mut g);
    one::<Boxed>(&mut g);
    one::<FuturesTimer>(&mut g);
    g.finish();
}

fn with_pending(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_cycle_10k_pending");
    fn one<C: Contender>(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
        let held = pending::<C>(PENDING);
        let mut cx = Context::from_waker(Waker::noop());
        g.bench_function(C::NAME, |b| {
            b.iter(|| cycle::<C>(black_box(PENDING_SLEEP), &mut cx))
        });
        drop(held);
        // Let futures-timer's thread take the dropped sleeps off its heap.
        thread::sleep(Duration::from_millis(50));
    }
    one::<Inline>(&mut g);
    one::<Boxed>(&mut g);
    one::<FuturesTimer>(&mut g);
    g.finish();
}

// ---------------------------------------------------------------------------
// Thread CPU time and context switches, from /proc (Linux only)

/// A thread of this process, by its `/proc/self/task` id.
#[derive(Clone, Debug)]
struct Task(String);

impl Task {
    /// The calling thread.
    fn current() -> Option<Task> {
        let link = std::fs::read_link("/proc/thread-self").ok()?;
        Some(Task(link.file_name()?.to_str()?.to_owned()))
    }

    /// The thread named `name`.
    fn named(name: &str) -> Option<Task> {
        std::fs::read_dir("/proc/self/task")
            .ok()?
            .filter_map(Result::ok)
            .find(|task| {
                std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .map(|task| Task(task.file_name().to_string_lossy().into_owned()))
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(format!("/proc/self/task/{}/{file}", self.0)).ok()
    }

    /// CPU time the thread has run. The kernel brings a running thread's
    /// count up to date when it is switched out (or at a tick): to read
    /// its own, a thread calls this after [`Task::switch_out`].
    fn cpu(&self) -> Option<Duration> {
        uncounted(|| {
            let stat = self.read("schedstat")?;
            let ns = stat.split_whitespace().next()?.parse().ok()?;
            Some(Duration::from_nanos(ns))
        })
    }

    /// Sleeps for a moment, so that the calling thread's CPU time in
    /// `/proc` is up to date.
    fn switch_out() {
        thread::sleep(Duration::from_micros(50));
    }

    /// Context switches, voluntary and not: how often it went to sleep.
    fn switches(&self) -> Option<u64> {
        uncounted(|| {
            let status = self.read("status")?;
            let field = |name: &str| -> Option<u64> {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(name))?
                    .trim()
                    .parse()
                    .ok()
            };
            Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
        })
    }
}

/// The CPU time and switches of a set of threads, read at once.
#[derive(Clone, Copy, Debug)]
struct Usage {
    caller_cpu: Duration,
    timer_cpu: Duration,
    timer_switches: u64,
}

struct Threads {
    caller: Task,
    timer: Task,
}

impl Threads {
    fn of<C: Contender>() -> Option<Threads> {
        Some(Threads {
            caller: Task::current()?,
            timer: Task::named(C::THREAD)?,
        })
    }

    /// Called on the caller's thread.
    fn usage(&self) -> Option<Usage> {
        Task::switch_out();
        Some(Usage {
            caller_cpu: self.caller.cpu()?,
            timer_cpu: self.timer.cpu()?,
            timer_switches: self.timer.switches()?,
        })
    }

    /// Waits until the timer thread has stopped running (its CPU time
    /// unchanged over 20 ms), so that work it was handed is counted.
    fn settle(&self) {
        let mut last = self.timer.cpu();
        for _ in 0..100 {
            thread::sleep(Duration::from_millis(20));
            let now = self.timer.cpu();
            if now == last {
                return;
            }
            last = now;
        }
    }
}

// ---------------------------------------------------------------------------
// Measurements

/// The counts of the measurements: full in `cargo bench`, small under
/// `cargo test -p watertight-benches --bench timers`, which only checks them.
struct Sizes {
    rounds: usize,
    cycles: usize,
    pending: usize,
    lateness: [(Duration, usize); 3],
    burst: usize,
    idle: Duration,
}

fn sizes() -> Sizes {
    if std::env::args().any(|a| a == "--bench") {
        Sizes {
            rounds: 5,
            cycles: 100_000,
            pending: PENDING,
            lateness: [
                (Duration::from_millis(1), 500),
                (Duration::from_millis(10), 100),
                (Duration::from_millis(100), 20),
            ],
            burst: 10_000,
            idle: Duration::from_secs(1),
        }
    } else {
        Sizes {
            rounds: 1,
            cycles: 1_000,
            pending: 1_000,
            lateness: [
                (Duration::from_millis(1), 5),
                (Duration::from_millis(10), 2),
                (Duration::from_millis(100), 1),
            ],
            burst: 1_000,
            idle: Duration::from_millis(100),
        }
    }
}

fn median<T: Copy + Ord>(values: &mut [T]) -> T {
    values.sort_unstable();
    values[values.len() / 2]
}

/// The cost of `cycles` timer cycles on the calling thread and on the timer
/// thread, with `pending` sleeps pending, per timer.
#[derive(Clone, Copy, Debug)]
struct CycleCost {
    wall: Duration,
    caller_cpu: Duration,
    timer_cpu: Duration,
    /// Timer-thread context switches per 1,000 timers.
    timer_switches_per_k: u64,
    allocs_own: f64,
    allocs_all: f64,
}

/// What else is pending while timers are made and dropped.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// Nothing: each sleep (of 1 s) is the only one.
    Alone,
    /// That many sleeps pending 60 to 120 s away; each new sleep (of
    /// 90 s) goes among them and is dropped again.
    Among(usize),
    /// That many sleeps of 90 s pending in a line, as a bulkhead's waiters
    /// with one `max_wait`: each step drops the oldest (its wait ended) and
    /// makes and polls a new one at the back.
    Line(usize),
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Load::Alone => f.write_str("none"),
            Load::Among(n) => write!(f, "{n}, the new one among them"),
            Load::Line(n) => write!(f, "{n} in line, the oldest dropped"),
        }
    }
}

fn cycle_cost<C: Contender>(cycles: usize, load: Load) -> Option<CycleCost> {
    let mut cx = Context::from_waker(Waker::noop());
    let (held, mut line) = match load {
        Load::Alone => (Vec::new(), VecDeque::new()),
        Load::Among(n) => (pending::<C>(n), VecDeque::new()),
        Load::Line(n) => {
            let line = (0..n)
                .map(|_| {
                    let mut sleep = C::sleep(PENDING_SLEEP);
                    register(&mut sleep, &mut cx);
                    sleep
                })
                .collect();
            (Vec::new(), line)
        }
    };
    let mut step = |cx: &mut Context<'_>| match load {
        Load::Alone => cycle::<C>(black_box(CYCLE_SLEEP), cx),
        Load::Among(_) => cycle::<C>(black_box(PENDING_SLEEP), cx),
        Load::Line(_) => {
            drop(line.pop_front());
            let mut sleep = C::sleep(black_box(PENDING_SLEEP));
            register(&mut sleep, cx);
            line.push_back(sleep);
        }
    };
    let threads = Threads::of::<C>()?;
    // Warm up: the timers' vectors.
    for _ in 0..1_000 {
        step(&mut cx);
    }
    threads.settle();
    let before = threads.usage()?;
    let counted = Counted::start();
    let start = Instant::now();
    for _ in 0..cycles {
        step(&mut cx);
    }
    let wall = start.elapsed();
    // The caller's CPU now, before `settle` spends some of its own.
    Task::switch_out();
    let caller_after = threads.caller.cpu()?;
    threads.settle();
    let allocs = counted.stop();
    let after = threads.usage()?;
    drop(held);
    drop(line);
    threads.settle();
    let n = cycles as u32;
    Some(CycleCost {
        wall: wall / n,
        caller_cpu: (caller_after - before.caller_cpu) / n,
        timer_cpu: (after.timer_cpu - before.timer_cpu) / n,
        timer_switches_per_k: (after.timer_switches - before.timer_switches) * 1_000
            / cycles as u64,
        allocs_own: allocs.own as f64 / cycles as f64,
        allocs_all: allocs.all as f64 / cycles as f64,
    })
}

/// The median of each field over rounds.
fn median_cost(costs: &[CycleCost]) -> CycleCost {
    let pick =
        |f: &dyn Fn(&CycleCost) -> Duration| median(&mut costs.iter().map(f).collect::<Vec<_>>());
    let pick_f = |f: &dyn Fn(&CycleCost) -> f64| {
        let mut v: Vec<f64> = costs.iter().map(f).collect();
        v.sort_unstable_by(f64::total_cmp);
        v[v.len() / 2]
    };
    CycleCost {
        wall: pick(&|c| c.wall),
        caller_cpu: pick(&|c| c.caller_cpu),
        timer_cpu: pick(&|c| c.timer_cpu),
        timer_switches_per_k: median(
            &mut costs
                .iter()
                .map(|c| c.timer_switches_per_k)
                .collect::<Vec<_>>(),
        ),
        allocs_own: pick_f(&|c| c.allocs_own),
        allocs_all: pick_f(&|c| c.allocs_all),
    }
}

fn cycle_costs(sizes: &Sizes) {
    println!();
    println!(
        "Cost per timer (made, polled once, dropped), all threads; median of {} interleaved rounds of {} timers",
        sizes.rounds, sizes.cycles
    );
    println!(
        "| pending | timer | wall ns | caller CPU ns | timer thread CPU ns | total CPU ns | timer thread switches / 1k timers | allocations (caller) | allocations (all threads) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for load in [
        Load::Alone,
        Load::Among(sizes.pending),
        Load::Line(sizes.pending),
    ] {
        let mut costs: [Vec<CycleCost>; 3] = Default::default();
        for _ in 0..sizes.rounds {
            let round = [
                cycle_cost::<Inline>(sizes.cycles, load),
                cycle_cost::<Boxed>(sizes.cycles, load),
                cycle_cost::<FuturesTimer>(sizes.cycles, load),
            ];
            for (all, one) in costs.iter_mut().zip(round) {
                match one {
                    Some(one) => all.push(one),
                    None => {
                        println!("(no /proc here: CPU times not measured)");
                        return;
                    }
                }
            }
        }
        let names = [Inline::NAME, Boxed::NAME, FuturesTimer::NAME];
        for (name, costs) in names.iter().zip(&costs) {
            let c = median_cost(costs);
            println!(
                "| {load} | `{name}` | {} | {} | {} | {} | {} | {:.3} | {:.3} |",
                c.wall.as_nanos(),
                c.caller_cpu.as_nanos(),
                c.timer_cpu.as_nanos(),
                (c.caller_cpu + c.timer_cpu).as_nanos(),
                c.timer_switches_per_k,
                c.allocs_own,
                c.allocs_all,
            );
        }
        // The promise the bulkhead builds on: an inline sleep allocates
        // nothing, on any thread, once the queue has held as many.
        let inline = median_cost(&costs[0]);
        assert!(
            inline.allocs_all < 0.01,
            "ThreadSleep allocated {} times per timer, pending: {load}",
            inline.allocs_all
        );
    }
}

/// Allocations per timer for lines of waiters of several lengths
/// ([`Load::Line`]): an ordered map would split a node at the back of the
/// line and free one at the front as the line moves; the timer's vectors
/// keep their capacity.
fn line_allocations(sizes: &Sizes) {
    println!();
    println!(
        "Allocations per timer (all threads), a line of n sleeps: the oldest dropped, a new one made"
    );
    println!("| n | `thread_sleep` | `futures_timer` |");
    println!("|---:|---:|---:|");
    for n in [11, 12, 100, sizes.pending] {
        let steps = sizes.cycles.max(10 * n);
        let (Some(inline), Some(peer)) = (
            cycle_cost::<Inline>(steps, Load::Line(n)),
            cycle_cost::<FuturesTimer>(steps, Load::Line(n)),
        ) else {
            println!("(no /proc here: not measured)");
            return;
        };
        println!(
            "| {n} | {:.3} | {:.3} |",
            inline.allocs_all, peer.allocs_all
        );
        assert_eq!(inline.allocs_all, 0.0, "a line of {n} allocated");
    }
}

/// Bytes allocated, net, to register `count` sleeps of each contender.
fn memory_per_pending(sizes: &Sizes) {
    fn one<C: Contender>(count: usize) -> (f64, f64) {
        let counted = Counted::start();
        let held = pending::<C>(count);
        // futures-timer's thread moves them from its list to its heap.
        thread::sleep(Duration::from_millis(100));
        let allocs = counted.stop();
        drop(held);
        thread::sleep(Duration::from_millis(50));
        (
            allocs.net_bytes as f64 / count as f64,
            allocs.all as f64 / count as f64,
        )
    }
    println!();
    println!(
        "Memory per pending sleep ({} registered at once)",
        sizes.pending
    );
    println!("| timer | bytes allocated (net) per sleep | allocations per sleep |");
    println!("|---|---:|---:|");
    for (name, (bytes, allocs)) in [
        (Inline::NAME, one::<Inline>(sizes.pending)),
        (Boxed::NAME, one::<Boxed>(sizes.pending)),
        (FuturesTimer::NAME, one::<FuturesTimer>(sizes.pending)),
    ] {
        println!("| `{name}` | {bytes:.0} | {allocs:.3} |");
    }
    println!(
        "(sizes: ThreadSleep {} bytes inline, futures_timer::Delay {} bytes + its node)",
        size_of::<ThreadSleep>(),
        size_of::<futures_timer::Delay>()
    );
}

/// How late a blocked-on sleep of `duration` wakes.
fn lateness_of(duration: Duration, sleep: impl FnOnce()) -> Duration {
    let start = Instant::now();
    sleep();
    let elapsed = start.elapsed();
    assert!(
        elapsed >= duration,
        "a sleep of {duration:?} woke after {elapsed:?}"
    );
    elapsed - duration
}

fn lateness(sizes: &Sizes) {
    println!();
    println!(
        "Lateness (actual wake minus requested) of `block_on(sleep)`, interleaved; median / p99 / max, µs"
    );
    println!("| sleep | samples | `thread_sleep` | `futures_timer` | `std::thread::sleep` |");
    println!("|---|---:|---|---|---|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for &(duration, samples) in &sizes.lateness {
        let mut late: [Vec<Duration>; 3] = Default::default();
        for _ in 0..samples {
            late[0].push(lateness_of(duration, || {
                futures::executor::block_on(Inline::sleep(duration))
            }));
            late[1].push(lateness_of(duration, || {
                futures::executor::block_on(FuturesTimer::sleep(duration))
            }));
            late[2].push(lateness_of(duration, || thread::sleep(duration)));
        }
        let cells: Vec<String> = late
            .iter_mut()
            .map(|l| {
                l.sort_unstable();
                let p99 = l[(l.len() * 99 / 100).min(l.len() - 1)];
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    us(l[l.len() / 2]),
                    us(p99),
                    us(l[l.len() - 1])
                )
            })
            .collect();
        println!(
            "| {duration:?} | {samples} | {} | {} | {} |",
            cells[0], cells[1], cells[2]
        );
    }
}

/// A waker for one sleep of a burst: records when it is first woken and
/// counts the sleeps woken; the last one unparks the measuring thread.
struct BurstWaker {
    woken_at: OnceLock<Instant>,
    wakes: AtomicUsize,
    all: Arc<BurstCount>,
}

struct BurstCount {
    woken: AtomicUsize,
    of: usize,
    waiter: Thread,
}

impl Wake for BurstWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let now = Instant::now();
        if self.wakes.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = self.woken_at.set(now);
            if self.all.woken.fetch_add(1, Ordering::SeqCst) + 1 == self.all.of {
                self.all.waiter.unpark();
            }
        }
    }
}

/// `count` sleeps of 100 ms registered at once, each with its own waker.
/// Returns the timer thread's CPU per wake-up and the lateness of the
/// first, median and last wake-up.
fn burst<C: Contender>(count: usize) -> Option<(Duration, [Duration; 3])> {
    const SLEEP: Duration = Duration::from_millis(100);
    let threads = Threads::of::<C>()?;
    let all = Arc::new(BurstCount {
        woken: AtomicUsize::new(0),
        of: count,
        waiter: thread::current(),
    });
    let wakers: Vec<Arc<BurstWaker>> = (0..count)
        .map(|_| {
            Arc::new(BurstWaker {
                woken_at: OnceLock::new(),
                wakes: AtomicUsize::new(0),
                all: all.clone(),
            })
        })
        .collect();
    let before = threads.usage()?;
    let mut sleeps = Vec::with_capacity(count);
    let mut deadlines = Vec::with_capacity(count);
    for waker in &wakers {
        // A lower bound of the sleep's own deadline, read just before it.
        deadlines.push(Instant::now() + SLEEP);
        let mut sleep = C::sleep(SLEEP);
        register(
            &mut sleep,
            &mut Context::from_waker(&Waker::from(waker.clone())),
        );
        sleeps.push(sleep);
    }
    let give_up = Instant::now() + Duration::from_secs(30);
    while all.woken.load(Ordering::SeqCst) < count {
        assert!(
            Instant::now() < give_up,
            "{}: a burst never finished",
            C::NAME
        );
        thread::park_timeout(Duration::from_millis(10));
    }
    threads.settle();
    let after = threads.usage()?;
    let mut late = Vec::with_capacity(count);
    for ((waker, deadline), sleep) in wakers.iter().zip(&deadlines).zip(&mut sleeps) {
        let woken_at = *waker.woken_at.get().expect("every sleep was woken");
        assert!(
            woken_at >= *deadline,
            "{}: a sleep was woken early",
            C::NAME
        );
        assert_eq!(waker.wakes.load(Ordering::SeqCst), 1, "woken once");
        assert!(
            Pin::new(sleep)
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_ready(),
            "{}: a woken sleep was not ready",
            C::NAME
        );
        late.push(woken_at - *deadline);
    }
    late.sort_unstable();
    Some((
        (after.timer_cpu - before.timer_cpu) / count as u32,
        [late[0], late[late.len() / 2], late[late.len() - 1]],
    ))
}

fn bursts(sizes: &Sizes) {
    println!();
    println!(
        "Expiry burst: {} sleeps of 100 ms registered at once, each woken by the timer thread",
        sizes.burst
    );
    println!(
        "| timer | timer thread CPU per wake-up, ns | lateness: first / median / last wake-up, µs |"
    );
    println!("|---|---:|---|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, result) in [
        (Inline::NAME, burst::<Inline>(sizes.burst)),
        (FuturesTimer::NAME, burst::<FuturesTimer>(sizes.burst)),
    ] {
        let Some((cpu, [first, mid, last])) = result else {
            println!("(no /proc here: not measured)");
            return;
        };
        println!(
            "| `{name}` | {} | {:.0} / {:.0} / {:.0} |",
            cpu.as_nanos(),
            us(first),
            us(mid),
            us(last)
        );
    }
}

fn idle(sizes: &Sizes) {
    /// The timer thread's CPU time and wake-ups over `period`, with
    /// `pending_sleeps` pending far away, after `cancelled` sleeps of half
    /// the period were made, polled and dropped.
    fn one<C: Contender>(
        pending_sleeps: usize,
        cancelled: usize,
        period: Duration,
    ) -> Option<(Duration, u64)> {
        let held = pending::<C>(pending_sleeps);
        let threads = Threads::of::<C>()?;
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..cancelled {
            cycle::<C>(period / 2, &mut cx);
        }
        threads.settle();
        let before = threads.usage()?;
        thread::sleep(period);
        let after = threads.usage()?;
        drop(held);
        threads.settle();
        Some((
            after.timer_cpu - before.timer_cpu,
            after.timer_switches - before.timer_switches,
        ))
    }
    println!();
    println!("Idle: the timer thread over {:?}", sizes.idle);
    println!("| timer | while | timer thread CPU, µs | wake-ups |");
    println!("|---|---|---:|---:|");
    let cases = [
        (
            format!("{} sleeps pending, 60 to 120 s away", sizes.pending),
            sizes.pending,
            0,
        ),
        (
            format!(
                "nothing pending, after 1,000 sleeps of {:?} were cancelled",
                sizes.idle / 2
            ),
            0,
            1_000,
        ),
    ];
    for (what, pending_sleeps, cancelled) in &cases {
        for (name, result) in [
            (
                Inline::NAME,
                one::<Inline>(*pending_sleeps, *cancelled, sizes.idle),
            ),
            (
                FuturesTimer::NAME,
                one::<FuturesTimer>(*pending_sleeps, *cancelled, sizes.idle),
            ),
        ] {
            let Some((cpu, wakes)) = result else {
                println!("(no /proc here: not measured)");
                return;
            };
            println!("| `{name}` | {what} | {} | {wakes} |", cpu.as_micros());
            assert!(
                cpu < Duration::from_millis(5) && wakes <= 2,
                "{name}: the timer thread was busy while nothing was due"
            );
        }
    }
}

/// A waker that panics when woken if told to, and says which thread let
/// go of its last clone.
struct Probe {
    panics: bool,
    released: Option<mpsc::Sender<Option<String>>>,
}

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.panics {
            panic!("a waker that panics");
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(released) = &self.released {
            let _ = released.send(thread::current().name().map(str::to_owned));
        }
    }
}

/// Which thread releases the waker a dropped sleep had registered, and
/// what later sleeps do after a waker panics on the timer thread. Runs
/// last: it may end futures-timer's thread.
fn behaviour() {
    /// The name of the thread that drops the waker of a sleep that was
    /// registered a while ago and is then dropped here, and whether it was
    /// gone when `drop` returned.
    fn released_by<C: Contender>() -> (Option<String>, bool) {
        let (released, by) = mpsc::channel();
        let waker = Waker::from(Arc::new(Probe {
            panics: false,
            released: Some(released),
        }));
        let mut sleep = C::sleep(Duration::from_secs(60));
        register(&mut sleep, &mut Context::from_waker(&waker));
        drop(waker);
        // Let the timer thread take the sleep in (futures-timer's does so
        // after the sleep is made) and park again.
        thread::sleep(Duration::from_millis(20));
        assert!(by.try_recv().is_err(), "the timer holds a clone");
        drop(sleep);
        if let Ok(thread) = by.try_recv() {
            return (thread, true);
        }
        let thread = by
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{}: a dropped sleep's waker was kept", C::NAME));
        (thread, false)
    }

    /// What a sleep made after a waker panicked on the timer thread does.
    fn after_a_panicking_waker<C: Contender>() -> &'static str {
        let probe = Arc::new(Probe {
            panics: true,
            released: None,
        });
        let mut sleep = C::sleep(Duration::from_millis(5));
        register(&mut sleep, &mut Context::from_waker(&Waker::from(probe)));
        thread::sleep(Duration::from_millis(50));
        let (done, outcome) = mpsc::channel();
        thread::spawn(move || {
            let result = std::panic::catch_unwind(|| {
                futures::executor::block_on(C::sleep(Duration::from_millis(5)))
            });
            let _ = done.send(result.is_ok());
        });
        match outcome.recv_timeout(Duration::from_secs(5)) {
            Ok(true) => "completes",
            Ok(false) => "panics",
            Err(_) => "never completes",
        }
    }

    println!();
    println!("Behaviour");
    println!("| | `thread_sleep` | `futures_timer` |");
    println!("|---|---|---|");
    let here = thread::current().name().map(str::to_owned);
    let by = |(thread, in_drop): (Option<String>, bool)| {
        let thread = if thread == here {
            "the dropping thread".to_owned()
        } else {
            format!("`{}`", thread.as_deref().unwrap_or("?"))
        };
        let when = if in_drop { "in `drop`" } else { "after `drop`" };
        format!("{when}, by {thread}")
    };
    let inline = released_by::<Inline>();
    assert_eq!(
        inline,
        (here.clone(), true),
        "ThreadSleep kept a dropped sleep's waker"
    );
    println!(
        "| a dropped sleep's waker is released | {} | {} |",
        by(inline),
        by(released_by::<FuturesTimer>())
    );
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let inline = after_a_panicking_waker::<Inline>();
    let peer = after_a_panicking_waker::<FuturesTimer>();
    std::panic::set_hook(hook);
    println!("| a sleep made after a waker panicked on the timer thread | {inline} | {peer} |");
    assert_eq!(inline, "completes", "a panicking waker broke ThreadTimer");
}

fn measurements(_: &mut Criterion) {
    start_timer_threads();
    let sizes = sizes();
    let started = Instant::now();
    cycle_costs(&sizes);
    line_allocations(&sizes);
    memory_per_pending(&sizes);
    lateness(&sizes);
    bursts(&sizes);
    idle(&sizes);
    behaviour();
    println!();
    println!("(measurements took {:.1?})", started.elapsed());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = single_thread, two_threads, with_pending, measurements
}
criterion_main!(benches);
