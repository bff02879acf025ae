//! Helpers shared by the integration tests: hand-polling with counting
//! wakers, bounded waits, a watchdog for tests that could hang, and the
//! runtime-agnostic scenarios that `tests/runtimes.rs` runs on every
//! executor.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use watertight::{Semaphore, TryAcquireError};

/// How long a test may wait for another thread or task to reach a state
/// before it fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// How long a whole stress test or runtime scenario may run before the
/// watchdog fails it.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// Picks the native count, or the small one under Miri.
pub const fn scaled(native: usize, miri: usize) -> usize {
    if cfg!(miri) { miri } else { native }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// The messages of `err` and of its sources, outermost first, after checking
/// that none of the first `ours` (the crate's own errors) repeats the
/// message of its source (the Rust API guidelines: an error returns its
/// cause from `source()` or shows it in `Display`, never both). The errors
/// below them are not ours to check: the redis crate's `RedisError` does
/// repeat its `io::Error`.
pub fn error_chain(err: &(dyn std::error::Error + 'static), ours: usize) -> Vec<String> {
    let mut messages = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let message = e.to_string();
        next = e.source();
        if let Some(source) = next.filter(|_| messages.len() < ours) {
            let cause = source.to_string();
            assert!(
                !message.contains(&cause),
                "{message:?} repeats its source's message {cause:?}"
            );
        }
        messages.push(message);
    }
    assert!(
        messages.len() >= ours,
        "{messages:?}: fewer than {ours} errors"
    );
    messages
}

/// An error with a source of its own ([`Cause`]), to follow a chain
/// through a wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the provider declined")
    }
}

impl std::error::Error for Declined {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&Cause)
    }
}

/// [`Declined`]'s source.
#[derive(Debug)]
pub struct Cause;

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("quota exceeded")
    }
}

impl std::error::Error for Cause {}

// ---------------------------------------------------------------------------
// Hand-polling
// ---------------------------------------------------------------------------

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub struct WakeCounter(AtomicUsize);

impl Wake for WakeCounter {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker together with the count of its wake-ups.
#[derive(Debug, Clone)]
pub struct Counted {
    counter: Arc<WakeCounter>,
    waker: Waker,
}

impl Counted {
    pub fn new() -> Self {
        let counter = Arc::new(WakeCounter::default());
        let waker = Waker::from(counter.clone());
        Self { counter, waker }
    }

    /// How many times the waker (or a clone of it) was woken.
    pub fn wakes(&self) -> usize {
        self.counter.0.load(Ordering::SeqCst)
    }

    pub fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Polls `fut` once with this waker.
    pub fn poll<F: Future + ?Sized>(&self, fut: Pin<&mut F>) -> Poll<F::Output> {
        fut.poll(&mut Context::from_waker(&self.waker))
    }

    /// Polls `fut` once and asserts that it is still pending.
    #[track_caller]
    pub fn assert_pending<F: Future + ?Sized>(&self, fut: Pin<&mut F>) {
        assert!(
            self.poll(fut).is_pending(),
            "future should still be pending"
        );
    }

    /// Polls `fut` once and returns its output, failing if it is pending.
    #[track_caller]
    pub fn ready<F: Future + ?Sized>(&self, fut: Pin<&mut F>) -> F::Output {
        match self.poll(fut) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("future should be ready"),
        }
    }
}

impl Default for Counted {
    fn default() -> Self {
        Self::new()
    }
}

/// Polls `fut` once with a waker that does nothing.
pub fn poll_noop<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Asserts the balance and the queue length together.
#[track_caller]
pub fn assert_state(sem: &Semaphore, available: isize, queued: usize) {
    assert_eq!(
        (sem.available_permits(), sem.queue_len()),
        (available, queued),
        "(available_permits, queue_len)"
    );
}

// ---------------------------------------------------------------------------
// Bounded waiting
// ---------------------------------------------------------------------------

/// Spins (yielding the thread) until `cond` holds; panics after
/// [`PATIENCE`] instead of hanging.
#[track_caller]
pub fn spin_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::yield_now();
    }
}

/// Runs `f` on its own thread and fails if it has not finished within
/// `limit`, so a lost wake-up fails the test instead of hanging CI. A panic
/// in `f` is passed on unchanged.
#[track_caller]
pub fn with_watchdog<F>(name: &str, limit: Duration, f: F)
where
    F: FnOnce() + Send + 'static,
{
    let (done_tx, done_rx) = mpsc::channel();
    let handle = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            f();
            let _ = done_tx.send(());
        })
        .expect("spawn the watched thread");
    match done_rx.recv_timeout(limit) {
        Ok(()) => handle.join().expect("the watched thread finished"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // `f` panicked: report its panic, not ours.
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
            unreachable!("the watched thread dropped its sender without panicking");
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name} did not finish within {limit:?}: a waiter was never woken")
        }
    }
}

/// Returns `Pending` once (waking itself), then `Ready`: lets other tasks
/// run on any executor.
pub async fn yield_now() {
    struct YieldNow(bool);
    impl Future for YieldNow {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                Poll::Ready(())
            } else {
                self.0 = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
    YieldNow(false).await
}

/// Yields to the executor until `cond` holds; panics after [`PATIENCE`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        yield_now().await;
    }
}

// ---------------------------------------------------------------------------
// Runtime-agnostic scenarios
// ---------------------------------------------------------------------------

/// How the bounded-concurrency scenario is sized.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Permits in the semaphore (K).
    pub permits: usize,
    /// Concurrent tasks (N).
    pub tasks: usize,
    /// Acquire/release rounds per task.
    pub rounds: usize,
}

impl Load {
    /// 16 tasks over 3 permits, fewer rounds under Miri.
    pub const DEFAULT: Load = Load {
        permits: 3,
        tasks: scaled(16, 4),
        rounds: scaled(200, 5),
    };
}

/// N tasks share K permits through one fair semaphore, each holding its
/// permits across a yield. Asserts that the permits held at once never
/// exceed K, that every round completes, and that afterwards the balance is
/// K again with nobody queued. Returns the largest number of permits seen
/// held at once.
///
/// `spawn` starts a task on the runtime under test and returns a future that
/// resolves when the task has finished; the identity function (joining the
/// futures in place) works too.
pub async fn bounded_concurrency<S, H>(load: Load, mut spawn: S) -> usize
where
    S: FnMut(BoxFuture<'static, ()>) -> H,
    H: Future<Output = ()>,
{
    let Load {
        permits,
        tasks,
        rounds,
    } = load;
    let sem = Arc::new(Semaphore::new(permits));
    let held = Arc::new(AtomicUsize::new(0));
    let max_held = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));

    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let sem = sem.clone();
        let held = held.clone();
        let max_held = max_held.clone();
        let completed = completed.clone();
        let errors = errors.clone();
        handles.push(spawn(Box::pin(async move {
            // Enter with `weight` permits, yield while holding them, leave.
            let critical = |weight: usize| {
                let now = held.fetch_add(weight, Ordering::SeqCst) + weight;
                max_held.fetch_max(now, Ordering::SeqCst);
                let held = held.clone();
                async move {
                    yield_now().await;
                    held.fetch_sub(weight, Ordering::SeqCst);
                }
            };
            for round in 0..rounds {
                // Odd tasks ask for two permits at a time (never more than K).
                let weight = (1 + task % 2).min(permits);
                // Alternate borrowed and owned permits.
                if round % 2 == 0 {
                    match sem.acquire_many(weight).await {
                        Ok(permit) if permit.num_permits() == weight => {
                            critical(weight).await;
                            drop(permit);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                } else {
                    match sem.acquire_many_owned(weight).await {
                        Ok(permit) if permit.num_permits() == weight => {
                            critical(weight).await;
                            drop(permit);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                completed.fetch_add(1, Ordering::SeqCst);
            }
        })));
    }
    // Joined, not awaited one by one: with the identity `spawn` the tasks
    // only run while polled, and must run concurrently.
    futures::future::join_all(handles).await;

    let max_held = max_held.load(Ordering::SeqCst);
    assert!(
        max_held <= permits,
        "{max_held} permits were held at once, more than the {permits} that exist"
    );
    assert_eq!(errors.load(Ordering::SeqCst), 0, "acquires that failed");
    assert_eq!(
        completed.load(Ordering::SeqCst),
        tasks * rounds,
        "rounds completed"
    );
    assert_eq!(held.load(Ordering::SeqCst), 0);
    assert_state(&sem, permits as isize, 0);
    max_held
}

/// Waiters queued on a fair semaphore (the first one partly served) are all
/// woken by `close` with an error; the head's partial permits and a permit
/// held across the close come back to the balance; later acquires fail.
///
/// `spawn` must really start the task (the scenario waits for the tasks to
/// queue before it closes the semaphore).
pub async fn close_wakes_waiters<S, H>(waiters: usize, mut spawn: S)
where
    S: FnMut(BoxFuture<'static, ()>) -> H,
    H: Future<Output = ()>,
{
    let sem = Arc::new(Semaphore::new(1));
    let holder = sem.try_acquire_owned().expect("the only permit");
    let failed = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let waiter = |n: usize| -> BoxFuture<'static, ()> {
        let sem = sem.clone();
        let failed = failed.clone();
        let granted = granted.clone();
        Box::pin(async move {
            match sem.acquire_many(n).await {
                Ok(_) => granted.fetch_add(1, Ordering::SeqCst),
                Err(_) => failed.fetch_add(1, Ordering::SeqCst),
            };
        })
    };

    // The head wants 3 and gets 2 of them before the close.
    let mut handles = vec![spawn(waiter(3))];
    wait_until("the head waiter is queued", || sem.queue_len() == 1).await;
    sem.add_permits(2);
    // `queue_len` counts the head once it is linked, while it may still
    // hold the lock to publish that someone waits: permits added in that
    // window go to the balance, and the head takes them before unlocking.
    wait_until("the head is handed both permits", || {
        sem.available_permits() == 0
    })
    .await;
    assert_state(&sem, 0, 1);
    for _ in 0..waiters {
        handles.push(spawn(waiter(1)));
    }
    wait_until("every waiter is queued", || sem.queue_len() == waiters + 1).await;
    assert_state(&sem, 0, waiters + 1);

    sem.close();
    futures::future::join_all(handles).await;
    assert_eq!(
        failed.load(Ordering::SeqCst),
        waiters + 1,
        "waiters failed by close"
    );
    assert_eq!(
        granted.load(Ordering::SeqCst),
        0,
        "waiters granted despite close"
    );
    assert_state(&sem, 2, 0);

    // The permit held across the close is still good and comes back.
    assert_eq!(holder.num_permits(), 1);
    drop(holder);
    assert_state(&sem, 3, 0);
    assert!(sem.acquire().await.is_err());
    assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::Closed);
}

/// What a test's log subscriber wrote: a `tracing_subscriber::fmt` writer
/// (clone it into `with_writer`), read back with [`text`](Self::text).
#[derive(Clone, Default)]
pub struct LogBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuf {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
