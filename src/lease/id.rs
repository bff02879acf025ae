//! [`IdSource`]: permit ids, and the randomness for waiters' jitter.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Permit ids: 128 bits from the process's random hasher keys, the process
/// id, the time and a counter, so ids never repeat across processes.
///
/// The process id is read once, when the source is made (`getpid` is a
/// system call, which every acquire paid twice when it was read per id). A
/// child forked after that would share the hasher keys and the counter, but
/// not the handle's use: the handle's connections and tasks belong to the
/// parent's runtime, which does not survive a fork.
pub(crate) struct IdSource {
    hasher: RandomState,
    counter: AtomicU64,
    start: Instant,
    pid: u32,
}

impl IdSource {
    pub(crate) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            counter: AtomicU64::new(0),
            start: Instant::now(),
            pid: std::process::id(),
        }
    }

    pub(crate) fn random(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.hasher
            .hash_one((n, self.pid, self.start.elapsed().as_nanos()))
    }

    pub(crate) fn next(&self) -> String {
        format!("{:016x}{:016x}", self.random(), self.random())
    }
}
