//! [`IdSource`]: permit ids, and the randomness for waiters' jitter.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Permit ids: 128 bits from the process's random hasher keys, the process
/// id, the time and a counter, so ids never repeat across processes.
pub(super) struct IdSource {
    hasher: RandomState,
    counter: AtomicU64,
    start: Instant,
}

impl IdSource {
    pub(super) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            counter: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    pub(super) fn random(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.hasher
            .hash_one((n, std::process::id(), self.start.elapsed().as_nanos()))
    }

    pub(super) fn next(&self) -> String {
        format!("{:016x}{:016x}", self.random(), self.random())
    }
}
