//! The lock that guards the semaphore's wait queue: a test-and-set spin
//! lock that backs off and then yields its thread, whose unlock is one plain
//! release store.
//!
//! # Why not a parking mutex
//!
//! Every critical section under this lock is a few list operations and
//! atomic updates: no user code runs in it (see the semaphore's notes), no
//! allocation, no system call. So a waiter is better off spinning for the
//! holder's few hundred nanoseconds than going to sleep in the kernel, and
//! nobody ever sleeps on the lock, so its unlock is a plain store rather
//! than the read-modify-write with which a parking mutex (std's,
//! parking_lot's) learns whether it must wake a sleeper. Measured against
//! both (`docs/benchmarks.md`, "The list lock"): a few percent faster in the
//! contended 2-worker cells, the same elsewhere.
//!
//! A spin lock's risk is a holder preempted in its critical section, with
//! waiters burning their time slices. A waiter here spins a bounded number
//! of times with exponential backoff and then calls
//! [`std::thread::yield_now`] between attempts, so a preempted holder gets
//! the CPU back.
//!
//! | `locked` | meaning                          |
//! |----------|----------------------------------|
//! | `false`  | free                             |
//! | `true`   | held by exactly one [`MutexGuard`] |

use core::cell::UnsafeCell;
use core::fmt;
use core::ops::{Deref, DerefMut};

// Under loom the lock is built from loom's atomic and its spin and yield
// (both are scheduling points there), so that its model below checks the
// lock's own orderings. The semaphore's models use loom's mutex instead
// (see `crate::loom`): the protocol needs only mutual exclusion, and a
// spinning lock would multiply their interleavings.
#[cfg(loom)]
use loom::{hint::spin_loop, sync::atomic::AtomicBool, thread::yield_now};
#[cfg(not(loom))]
use {core::hint::spin_loop, core::sync::atomic::AtomicBool, std::thread::yield_now};

use core::sync::atomic::Ordering;

/// How many rounds of doubling busy-wait a contended `lock` spins before it
/// starts yielding its thread (1, 2, 4, ... 64 spin hints).
const SPIN_ROUNDS: u32 = 7;

/// A mutual-exclusion lock without poisoning, for critical sections that run
/// no user code and never block.
pub(crate) struct Mutex<T> {
    /// Whether a guard exists.
    locked: AtomicBool,
    /// Only touched through a [`MutexGuard`], of which at most one exists.
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands `&mut T` to one thread at a time, so sharing the
// lock is sharing `T` by moving it between threads: `T: Send` suffices, as
// for `std::sync::Mutex`.
unsafe impl<T: Send> Sync for Mutex<T> {}

// Like std's mutex (which marks itself poisoned instead), a panic while the
// lock is held cannot expose a broken `T` here: the semaphore never panics
// in the middle of a list update.
impl<T> std::panic::RefUnwindSafe for Mutex<T> {}
impl<T> std::panic::UnwindSafe for Mutex<T> {}

impl<T> Mutex<T> {
    /// A free lock around `value`.
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Loom's atomics are not `const`.
    #[cfg(loom)]
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock: one compare-and-swap if it is free, else the
    /// spinning and yielding of [`lock_contended`](Self::lock_contended).
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        MutexGuard { lock: self }
    }

    /// Waits for the lock: reads it (which keeps the cache line shared while
    /// it is held) until it looks free, then tries to take it; backs off
    /// exponentially, then yields the thread between reads.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut round = 0;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if round < SPIN_ROUNDS {
                    for _ in 0..1u32 << round {
                        spin_loop();
                    }
                    round += 1;
                } else {
                    yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Proof that the lock is held; unlocks when dropped.
#[must_use = "dropping the guard unlocks at once"]
#[clippy::has_significant_drop]
pub(crate) struct MutexGuard<'a, T> {
    lock: &'a Mutex<T>,
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard is the only one (the lock was taken), so no
        // `&mut T` exists but through it, and it is borrowed shared here.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, borrowed exclusively through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // The release store publishes every write made under the lock to
        // the next thread whose acquire CAS sees `false`.
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl<T> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard").finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_other_threads() {
        // Each thread does a read-modify-write that is not atomic; any
        // overlap of two critical sections loses an increment.
        let lock = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..if cfg!(miri) { 50 } else { 20_000 } {
                        let mut guard = lock.lock();
                        let seen = *guard;
                        std::hint::black_box(&mut guard);
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let per = if cfg!(miri) { 50 } else { 20_000 };
        assert_eq!(*lock.lock(), 4 * per);
    }

    #[test]
    fn unlocks_when_the_guard_drops_even_in_a_panic() {
        let lock = Mutex::new(1);
        let caught = std::panic::catch_unwind(|| {
            let _guard = lock.lock();
            panic!("inside the lock");
        });
        assert!(caught.is_err());
        // No poisoning: the lock is free and the value intact.
        assert_eq!(*lock.lock(), 1);
    }
}

/// The lock's orderings, checked by loom: run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib lock::`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Mutex;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    /// A counter that only the lock's exclusion and its acquire/release
    /// orderings protect; loom reports any two accesses that are not
    /// ordered by them.
    struct Guarded {
        lock: Mutex<()>,
        count: UnsafeCell<usize>,
    }

    // SAFETY: `count` is only touched with `lock` held (in this test).
    unsafe impl Sync for Guarded {}

    impl Guarded {
        fn increment(&self) {
            let _guard = self.lock.lock();
            // SAFETY: the lock is held.
            self.count.with_mut(|c| unsafe { *c += 1 });
        }
    }

    #[test]
    fn critical_sections_exclude_each_other_and_publish_their_writes() {
        loom::model(|| {
            let shared = Arc::new(Guarded {
                lock: Mutex::new(()),
                count: UnsafeCell::new(0),
            });
            let other = {
                let shared = Arc::clone(&shared);
                thread::spawn(move || shared.increment())
            };
            shared.increment();
            // Read under the lock before the join: it sees one increment or
            // both, never a torn or unordered one.
            let seen = {
                let _guard = shared.lock.lock();
                // SAFETY: the lock is held.
                shared.count.with(|c| unsafe { *c })
            };
            assert!(seen == 1 || seen == 2, "saw {seen} increments");
            other.join().unwrap();
            let _guard = shared.lock.lock();
            // SAFETY: the lock is held.
            assert_eq!(shared.count.with(|c| unsafe { *c }), 2);
        });
    }
}
