//! A leased permit and its lease's local state.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use event_listener::{Event, EventListener};

use super::error::{LostReason, ReleaseError};
use super::semaphore::{Inner, ReleaseOutcome};

/// What this process knows of one lease. Shared by the permit and the
/// lease keeper that renews it.
pub(super) struct Lease {
    pub(super) id: String,
    pub(super) fence: u64,
    pub(super) granted: Instant,
    state: Mutex<LeaseState>,
    /// Notified once, when the lease is found lost.
    lost: Event,
}

struct LeaseState {
    /// When the lease runs out at the latest, measured on this machine from
    /// the moment the last successful grant or renewal was *sent* (so never
    /// later than Redis's own deadline, clock drift aside).
    deadline: Instant,
    lost: Option<LostReason>,
}

impl Lease {
    pub(super) fn new(id: String, fence: u64, sent: Instant, ttl: Duration) -> Self {
        Self {
            id,
            fence,
            granted: Instant::now(),
            state: Mutex::new(LeaseState {
                deadline: sent + ttl,
                lost: None,
            }),
            lost: Event::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    pub(super) fn lost_reason(&self) -> Option<LostReason> {
        self.state().lost
    }

    /// A renewal sent at `sent` succeeded. A lost lease stays lost.
    pub(super) fn renewed(&self, sent: Instant, ttl: Duration) {
        let mut state = self.state();
        if state.lost.is_none() {
            state.deadline = state.deadline.max(sent + ttl);
        }
    }

    /// Marks the lease lost (once) and wakes whoever waits for that.
    /// Returns whether this call was the one that marked it.
    pub(super) fn mark_lost(&self, reason: LostReason) -> bool {
        let first = {
            let mut state = self.state();
            let first = state.lost.is_none();
            if first {
                state.lost = Some(reason);
            }
            first
        };
        if first {
            self.lost.notify(usize::MAX);
        }
        first
    }
}

/// A permit leased from a [`RedisSemaphore`](super::RedisSemaphore).
///
/// While it is held, the semaphore's lease keeper renews the lease about
/// every third of its time to live. Dropping the permit releases the lease
/// in the background; [`release`](Self::release) does it in the open and
/// reports an overrun.
///
/// If the process stalls (a long pause, a stopped process, Redis out of
/// reach) past the lease's time to live, the lease is *lost*: another
/// holder may have been granted the permit, with a higher
/// [`fence`](Self::fence). The permit says so ([`is_lost`](Self::is_lost),
/// [`lost`](Self::lost)); it is never quietly re-acquired.
#[must_use = "dropping the permit releases it at once"]
pub struct LeasedPermit {
    pub(super) inner: Arc<Inner>,
    pub(super) lease: Arc<Lease>,
    /// Set once `release` took over the lease.
    pub(super) done: bool,
}

impl LeasedPermit {
    /// The fencing token of this grant: it increases with every grant of the
    /// semaphore. Pass it to the guarded resource so that it can refuse
    /// requests from a holder whose lease was lost (an older token than one
    /// it has already seen).
    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    /// The lease's id in Redis (128 random bits, in hex), as listed by
    /// [`holders`](super::RedisSemaphore::holders).
    pub fn id(&self) -> &str {
        &self.lease.id
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    /// When the lease runs out unless renewed, measured on this machine
    /// from the last renewal sent (so no later than Redis's deadline).
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// How long ago the permit was granted.
    pub fn held_for(&self) -> Duration {
        self.lease.granted.elapsed()
    }

    /// Resolves when the lease is found lost: race the guarded work against
    /// it to stop work that no longer holds a permit.
    pub fn lost(&self) -> Lost {
        Lost {
            lease: self.lease.clone(),
            listener: None,
        }
    }

    /// Gives the permit back and says whether the lease was still held.
    ///
    /// # Errors
    ///
    /// [`ReleaseError::Overrun`] if the lease had expired or was lost
    /// first; [`ReleaseError::Unavailable`] if Redis could not be reached
    /// (the lease then expires by itself); [`ReleaseError::Denied`],
    /// [`ReleaseError::Auth`] or [`ReleaseError::Script`] if Redis refused
    /// the call.
    pub async fn release(mut self) -> Result<(), ReleaseError> {
        // From here the permit's drop does nothing: until the answer is
        // read, the release itself is guarded (if this future is dropped
        // first, the id is released in the background).
        self.done = true;
        self.inner.forget_lease(&self.lease.id);
        let known_lost = self.lease.lost_reason().is_some();
        let mut guard = ReleaseGuard {
            inner: &self.inner,
            id: &self.lease.id,
            armed: true,
        };
        let answer = self.inner.release_id(&self.lease.id).await;
        guard.armed = false;
        match answer {
            Ok(ReleaseOutcome::InTime) if !known_lost => Ok(()),
            Ok(ReleaseOutcome::InTime) => Err(ReleaseError::Overrun { by: None }),
            Ok(ReleaseOutcome::Late(by)) => Err(ReleaseError::Overrun { by: Some(by) }),
            Ok(ReleaseOutcome::Gone) => Err(ReleaseError::Overrun { by: None }),
            Err(e) => Err(ReleaseError::of(e)),
        }
    }
}

/// Releases the id in the background if a `release` future is dropped
/// before its answer came.
struct ReleaseGuard<'a> {
    inner: &'a Arc<Inner>,
    id: &'a str,
    armed: bool,
}

impl Drop for ReleaseGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.inner.release_in_background(self.id.to_owned());
        }
    }
}

impl Drop for LeasedPermit {
    fn drop(&mut self) {
        if !self.done {
            self.inner.forget_lease(&self.lease.id);
            self.inner.release_in_background(self.lease.id.clone());
        }
    }
}

impl fmt::Debug for LeasedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedPermit")
            .field("semaphore", &self.inner.name)
            .field("id", &self.lease.id)
            .field("fence", &self.lease.fence)
            .field("lost", &self.lease.lost_reason())
            .finish()
    }
}

/// The future of [`LeasedPermit::lost`]: resolves with how the lease was
/// lost. It owns its state, so it can be raced against work that borrows
/// the permit.
pub struct Lost {
    lease: Arc<Lease>,
    listener: Option<EventListener>,
}

impl Future for Lost {
    type Output = LostReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        loop {
            if let Some(reason) = self.lease.lost_reason() {
                return Poll::Ready(reason);
            }
            match &mut self.listener {
                None => self.listener = Some(self.lease.lost.listen()),
                Some(listener) => {
                    if Pin::new(listener).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.listener = None;
                }
            }
        }
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").field("id", &self.lease.id).finish()
    }
}
