//! The wake-ups a semaphore's handles share with its background tasks.

use std::sync::atomic::{AtomicBool, Ordering};

use event_listener::Event;

use super::line::Line;

/// Wake-ups shared by the semaphore's handles and its background tasks.
#[derive(Default)]
pub(super) struct Signals {
    /// Notified when permits may have come free (a pub/sub message, a
    /// (re)subscription, `close`).
    pub(super) wake: Event,
    /// This process's waiters in the fair line, and the grants announced
    /// to them.
    pub(super) line: Line,
    /// Set, and `shutdown` notified, when the last handle is gone.
    stopped: AtomicBool,
    pub(super) shutdown: Event,
}

impl Signals {
    /// Whether the last handle is gone.
    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The last handle is gone: the background tasks stop.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.shutdown.notify(usize::MAX);
    }
}
