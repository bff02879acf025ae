//! The idle rule, for every bulkhead kind: `wait_idle` resolves once no
//! call is in flight, and whatever brings the count of calls in flight to
//! zero (a permit's return, a cancelled waiter whose permit went back
//! through the semaphore, a limit change) calls [`Idle::notify`].
//!
//! Notifying an `event_listener::Event` costs a full fence even with no
//! listener, so `notify` does nothing unless a `wait_idle` is watching: a
//! store-load handshake (a SeqCst increment of `watchers`, then a SeqCst
//! read of the count in flight; a SeqCst read-modify-write of that count
//! in the release, then a SeqCst read of `watchers`) in which at least one
//! side sees the other.

use std::sync::atomic::{AtomicUsize, Ordering};

use event_listener::Event;

/// Who waits for a bulkhead to be idle, and how they are woken.
#[derive(Default)]
pub(crate) struct Idle {
    event: Event,
    /// How many `wait` futures are watching.
    watchers: AtomicUsize,
}

impl Idle {
    /// Wakes the watchers, if any, to look again: call it when the count
    /// in flight may have reached zero.
    #[inline]
    pub(crate) fn notify(&self) {
        if self.watchers.load(Ordering::SeqCst) != 0 {
            self.event.notify(usize::MAX);
        }
    }

    /// Resolves once `is_idle` says so, looking again at every
    /// [`notify`](Self::notify). `is_idle` reads the count in flight (the
    /// bulkhead's own way); it is read after the listener is registered,
    /// so a notify in between is not missed.
    pub(crate) async fn wait(&self, is_idle: impl Fn() -> bool) {
        self.watchers.fetch_add(1, Ordering::SeqCst);
        let _watching = Watching(&self.watchers);
        loop {
            if is_idle() {
                return;
            }
            let listener = self.event.listen();
            if is_idle() {
                return;
            }
            listener.await;
        }
    }
}

/// Counts a `wait` as watching while it lives (dropped mid-wait too).
struct Watching<'a>(&'a AtomicUsize);

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
