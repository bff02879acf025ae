//! What the semaphore benches share: the contenders behind one trait, and
//! the contended workload. Included with `#[path]` by `benches/semaphore.rs`
//! (criterion) and `benches/instructions.rs` (callgrind), so both measure
//! the same code.

use std::future::Future;
use std::sync::Arc;

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

impl Contender for bulkhead::Semaphore {
    #[inline]
    fn acquire(&self) -> impl Future<Output = impl Send + '_> + Send + '_ {
        bulkhead::Semaphore::acquire(self)
    }
    #[inline]
    fn try_acquire(&self) -> Option<impl Send + '_> {
        bulkhead::Semaphore::try_acquire(self).ok()
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

/// `tasks` tasks, each doing `per_task` acquire → yield → release.
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
