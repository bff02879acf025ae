//! The releases a semaphore runs in tasks of their own (a dropped permit,
//! an acquire dropped while a grant may exist), counted so that a process
//! that shuts down can wait for them: a task the runtime drops unrun
//! leaves its lease held until its time to live ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use event_listener::Event;

/// How many background releases are under way.
#[derive(Debug, Default)]
pub(crate) struct Background {
    running: AtomicUsize,
    /// Notified when `running` comes down to zero.
    done: Event,
}

impl Background {
    /// One release starts, in the task `started` is moved into: the count
    /// comes down when that task ends or is dropped unrun.
    pub(crate) fn start(self: &Arc<Self>) -> Started {
        self.running.fetch_add(1, Ordering::SeqCst);
        Started(self.clone())
    }

    /// Resolves once no release is under way.
    pub(crate) async fn settled(&self) {
        loop {
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            let listener = self.done.listen();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            listener.await;
        }
    }
}

/// A release under way (see [`Background::start`]).
pub(crate) struct Started(Arc<Background>);

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.done.notify(usize::MAX);
        }
    }
}
