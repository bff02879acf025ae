//! What the semaphore benches share: the contenders behind one trait, and
//! the contended workload. Included with `#[path]` by `benches/semaphore.rs`
//! (criterion), `benches/instructions.rs` (callgrind), `benches/interleaved.rs`
//! and `benches/polls.rs`, so all of them measure the same code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

/// Acquisitions per round in every contended cell, whatever the task
/// count, so the cells are comparable. With 4096 tasks each task acquires
/// twice.
pub const TOTAL_ACQUIRES: usize = 8192;

/// What the benchmarks need from a semaphore. Each method returns the
/// crate's own future or guard unchanged (no wrapping), so the uncontended
/// numbers measure the crate and nothing else.
pub trait Contender: Send + Sync + 'static {
    /// One permit; the output holds it until dropped.
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_;
    /// One permit now, or `None`.
    fn try_acquire(&self) -> Option<impl Send + '_>;
}

impl Contender for watertight::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        watertight::Semaphore::acquire(self)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        watertight::Semaphore::try_acquire(self).ok()
    }
}

impl Contender for tokio::sync::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        tokio::sync::Semaphore::acquire(self)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        tokio::sync::Semaphore::try_acquire(self).ok()
    }
}

impl Contender for async_lock::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        async_lock::Semaphore::acquire(self)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        async_lock::Semaphore::try_acquire(self)
    }
}

impl Contender for futures_intrusive::sync::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        futures_intrusive::sync::Semaphore::acquire(self, 1)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        futures_intrusive::sync::Semaphore::try_acquire(self, 1)
    }
}

impl Contender for maitake_sync::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        maitake_sync::Semaphore::acquire(self, 1)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        maitake_sync::Semaphore::try_acquire(self, 1).ok()
    }
}

/// No semaphore at all: what the harness costs on its own.
pub struct Baseline;

impl Contender for Baseline {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        std::future::ready(())
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        Some(())
    }
}

/// Not a semaphore: the floor an uncontended acquire is held to (issue
/// 13's "at most 1.2x a bare compare-and-swap loop"). A counter of free
/// permits; acquiring is a load and a `compare_exchange_weak` loop that
/// takes one, releasing a `fetch_add`. Its acquire future does that loop
/// when polled and, with no permit free, wakes itself and returns
/// `Pending` (a spin through the executor: nothing queues), so it serves
/// the uncontended groups only, never a contended cell.
pub struct BareCas {
    free: AtomicUsize,
}

impl BareCas {
    /// A counter with `permits` free.
    pub fn new(permits: usize) -> BareCas {
        BareCas {
            free: AtomicUsize::new(permits),
        }
    }

    /// Takes one permit if one is free: load, then `compare_exchange_weak`
    /// until it succeeds or finds none.
    #[inline]
    fn take(&self) -> bool {
        let mut free = self.free.load(Ordering::Relaxed);
        loop {
            if free == 0 {
                return false;
            }
            match self.free.compare_exchange_weak(
                free,
                free - 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => free = now,
            }
        }
    }
}

/// A permit of [`BareCas`]: dropping it is one `fetch_add`.
pub struct BareCasPermit<'a>(&'a BareCas);

impl Drop for BareCasPermit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.free.fetch_add(1, Ordering::Release);
    }
}

/// [`BareCas`]'s acquire future: the loop, when polled.
pub struct BareCasAcquire<'a>(&'a BareCas);

impl<'a> Future for BareCasAcquire<'a> {
    type Output = BareCasPermit<'a>;
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BareCasPermit<'a>> {
        if self.0.take() {
            Poll::Ready(BareCasPermit(self.0))
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl Contender for BareCas {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        BareCasAcquire(self)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        self.take().then_some(BareCasPermit(self))
    }
}

/// One uncontended acquire, as `benches/semaphore.rs`'s
/// `uncontended_acquire` group times it and `benches/instructions.rs`
/// counts it: create `acquire()`, pin it on the stack, poll it once with
/// `cx` (it must be ready), drop the permit, then the future.
#[inline]
pub fn acquire_ready<S: Contender>(sem: &S, cx: &mut Context<'_>) {
    let mut fut = std::pin::pin!(sem.acquire());
    match fut.as_mut().poll(cx) {
        Poll::Ready(permit) => drop(std::hint::black_box(permit)),
        Poll::Pending => panic!("an uncontended acquire must be ready at once"),
    }
}

/// How a round waits for its tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// `for handle in handles { handle.await }`: the spawning thread is
    /// woken each time the task it awaits finishes while later ones have
    /// not, so a semaphore that finishes its tasks in spawn order (a FIFO
    /// one) wakes it once per task, and one that finishes them out of order
    /// only a few times a round. The harness before issue 13's fourth round.
    Spawn,
    /// A shared countdown of the tasks still running: each task lowers it
    /// when its loop ends (or it unwinds), the last one wakes the round
    /// once, and the handles, of tasks that have all finished their work,
    /// are dropped. The spawning thread is woken about once a round
    /// whatever order the tasks finish in.
    Countdown,
}

impl Join {
    /// `INTERLEAVED_JOIN=spawn` or `=countdown`; the countdown when unset.
    /// Exits with a message on any other value.
    pub fn from_env() -> Join {
        match std::env::var("INTERLEAVED_JOIN").as_deref() {
            Err(std::env::VarError::NotPresent) | Ok("countdown") => Join::Countdown,
            Ok("spawn") => Join::Spawn,
            other => {
                eprintln!("INTERLEAVED_JOIN must be `spawn` or `countdown`, not {other:?}");
                std::process::exit(2);
            }
        }
    }

    /// The name `from_env` reads.
    pub fn name(self) -> &'static str {
        match self {
            Join::Spawn => "spawn",
            Join::Countdown => "countdown",
        }
    }
}

/// The tasks of a round still running, for [`Join::Countdown`].
pub struct Countdown {
    left: AtomicUsize,
    panicked: AtomicBool,
    done: tokio::sync::Notify,
}

impl Countdown {
    /// A countdown from `tasks`.
    pub fn new(tasks: usize) -> Arc<Countdown> {
        Arc::new(Countdown {
            left: AtomicUsize::new(tasks),
            panicked: AtomicBool::new(false),
            done: tokio::sync::Notify::new(),
        })
    }

    /// Waits until every task's [`Finish`] has been dropped; panics if a
    /// task panicked.
    pub async fn wait(&self) {
        // `notify_one` stores a permit when nobody waits yet, so the last
        // task's notification is not lost if it comes first; the loop
        // guards against a stray one.
        while self.left.load(Ordering::Acquire) != 0 {
            self.done.notified().await;
        }
        assert!(
            !self.panicked.load(Ordering::Relaxed),
            "a benchmark task panicked"
        );
    }
}

/// Held by a task for its whole run; dropping it (at the end of the task's
/// loop, or while it unwinds) counts the task down.
pub struct Finish(Arc<Countdown>);

impl Finish {
    /// One task's share of `countdown`.
    pub fn new(countdown: &Arc<Countdown>) -> Finish {
        Finish(countdown.clone())
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.panicked.store(true, Ordering::Relaxed);
        }
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.done.notify_one();
        }
    }
}

/// Spawns `tasks` tasks with `spawn(task, finish)` and waits for them as
/// `join` says. `finish` is `Some` for [`Join::Countdown`]: the task must
/// hold it until its work is done. The same in both modes but for the
/// wait, so the task futures have the same layout whichever join runs.
pub async fn spawn_and_join<F>(
    tasks: usize,
    join: Join,
    mut spawn: impl FnMut(Option<Finish>) -> tokio::task::JoinHandle<F>,
) {
    let countdown = (join == Join::Countdown).then(|| Countdown::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        handles.push(spawn(countdown.as_ref().map(Finish::new)));
    }
    match countdown {
        None => {
            for handle in handles {
                handle.await.expect("a benchmark task panicked");
            }
        }
        Some(countdown) => {
            countdown.wait().await;
            // Every task has done its work; dropping a handle detaches it.
            drop(handles);
        }
    }
}

/// `tasks` tasks, each doing `per_task` acquire → yield → release, joined
/// in spawn order: the harness of `benches/semaphore.rs` and
/// `benches/instructions.rs`, unchanged since their published numbers (its
/// task futures have no [`Finish`] slot, so they are 8 bytes smaller than
/// [`round_joined`]'s).
pub async fn round<S: Contender>(sem: &Arc<S>, tasks: usize, per_task: usize) {
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let sem = sem.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let permit = sem.acquire().await;
                tokio::task::yield_now().await;
                drop(permit);
            }
        }));
    }
    for handle in handles {
        handle.await.expect("a benchmark task panicked");
    }
}

/// [`round`]'s workload, joined as `join` says (`benches/interleaved.rs`
/// and `benches/polls.rs`): the same task future for both joins.
pub async fn round_joined<S: Contender>(sem: &Arc<S>, tasks: usize, per_task: usize, join: Join) {
    spawn_and_join(tasks, join, |finish| {
        let sem = sem.clone();
        tokio::spawn(async move {
            let _finish = finish;
            for _ in 0..per_task {
                let permit = sem.acquire().await;
                tokio::task::yield_now().await;
                drop(permit);
            }
        })
    })
    .await;
}
