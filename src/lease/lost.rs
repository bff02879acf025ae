//! The future that resolves when a lease is lost.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;
use std::time::Instant;

use event_listener::EventListener;

use super::Lease;
use crate::LostReason;
use crate::timer::{Sleep, Timer};

/// The future of a leased permit's `lost()`: resolves with how the lease
/// was lost. It owns its state, so it can be raced against work that borrows
/// the permit.
///
/// # Cancel safety
///
/// Dropping it changes nothing: it only watches the lease.
#[must_use = "futures do nothing unless polled"]
pub struct Lost {
    lease: Arc<Lease>,
    timer: Arc<dyn Timer>,
    /// Registered before the state is read again, so a mark in between is
    /// not missed.
    listener: Option<EventListener>,
    /// A sleep until the deadline it was armed for (re-armed when a
    /// renewal moves the deadline).
    sleep: Option<(Instant, Sleep)>,
}

impl Lost {
    pub(crate) fn new(lease: Arc<Lease>, timer: Arc<dyn Timer>) -> Self {
        Self {
            lease,
            timer,
            listener: None,
            sleep: None,
        }
    }
}

impl Future for Lost {
    type Output = LostReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        let this = &mut *self;
        loop {
            if let Some(reason) = this.lease.lost_reason() {
                return Poll::Ready(reason);
            }
            let Some(listener) = &mut this.listener else {
                this.listener = Some(this.lease.lost.listen());
                continue;
            };
            if Pin::new(listener).poll(cx).is_ready() {
                this.listener = None;
                continue;
            }
            let deadline = this.lease.deadline();
            let sleep = match &mut this.sleep {
                Some((armed, sleep)) if *armed == deadline => sleep,
                _ => {
                    let d = deadline.saturating_duration_since(Instant::now());
                    &mut this.sleep.insert((deadline, this.timer.sleep(d))).1
                }
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The deadline passed (or the timer woke early): look again.
            this.sleep = None;
        }
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").field("id", &self.lease.id).finish()
    }
}
