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
    pub(crate) fn start<T: AsRef<Background>>(owner: &Arc<T>) -> Started<T> {
        let background: &Background = (**owner).as_ref();
        background.running.fetch_add(1, Ordering::SeqCst);
        Started(owner.clone())
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

/// A release under way (see [`Background::start`]), holding what started
/// it.
pub(crate) struct Started<T: AsRef<Background>>(pub(crate) Arc<T>);

impl<T: AsRef<Background>> Drop for Started<T> {
    fn drop(&mut self) {
        let background: &Background = (*self.0).as_ref();
        if background.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            background.done.notify(usize::MAX);
        }
    }
}
