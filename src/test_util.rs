//! Helpers shared by the unit tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

/// A waker's target that counts its wake-ups.
#[derive(Default)]
pub(crate) struct Count(AtomicUsize);

impl Count {
    /// The wake-ups so far.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A counter and a waker that counts on it.
pub(crate) fn counted() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count::default());
    (count.clone(), Waker::from(count))
}
