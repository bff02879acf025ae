//! A leased permit: the handle a holder keeps, its release, and the
//! future that resolves when its lease is lost.

use core::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{LostReason, ReleaseError};
use super::inner::{Inner, ReleaseOutcome};
use crate::lease::{Lease, Lost};

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

    /// Whether the lease is lost: true from the instant its
    /// [`deadline`](Self::deadline) passes without a renewal answered in
    /// time (this reads the clock; it does not wait for the lease keeper),
    /// or once a renewal found it expired. It never turns false again.
    ///
    /// Check it before acting on the guarded resource: while it is false,
    /// no other client has been granted this permit, unless clocks drift
    /// apart by more than the builder's
    /// [`drift_margin`](super::RedisSemaphoreBuilder::drift_margin) over one
    /// time to live (or Redis forgot the lease: see the fence).
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    /// When this process stops counting on the lease unless it is renewed
    /// first: the last successful renewal's (or the grant's) *send* time,
    /// plus the time to live, less the drift margin. Redis's own deadline
    /// is later by at least the margin, less the millisecond its clock
    /// rounds down.
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// How long ago the permit was granted.
    pub fn held_for(&self) -> Duration {
        self.lease.granted.elapsed()
    }

    /// Resolves when the lease is lost: at its [`deadline`](Self::deadline)
    /// (by the semaphore's timer, not the lease keeper), or when a renewal
    /// finds it expired. Race the guarded work against it to stop work that
    /// no longer holds a permit, or let
    /// [`RedisSemaphore::call`](super::RedisSemaphore::call) do that.
    pub fn lost(&self) -> Lost {
        Lost::new(self.lease.clone(), self.inner.timer.clone())
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
    ///
    /// # Cancel safety
    ///
    /// Dropping it before Redis answers still releases the lease, in the
    /// background, as dropping the permit does; only the report is lost.
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
