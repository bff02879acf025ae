//! The wake-ups a semaphore's handles share with its background tasks.

use std::sync::atomic::{AtomicBool, Ordering};

use event_listener::Event;

use super::line::Line;
use super::wakeups;

/// Wake-ups shared by the semaphore's handles and its background tasks.
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
    /// Whether messages come through pub/sub, as the subscriber found.
    pub(super) wakeups: wakeups::State,
}

impl Signals {
    /// With `pubsub`, a subscriber will deliver wake-ups.
    pub(super) fn new(pubsub: bool) -> Self {
        Self {
            wake: Event::new(),
            line: Line::default(),
            stopped: AtomicBool::new(false),
            shutdown: Event::new(),
            wakeups: wakeups::State::new(pubsub),
        }
    }

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
