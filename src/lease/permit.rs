//! A leased permit: the handle a holder keeps, and its release.

use core::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::store::Released;
use super::{Lease, LeaseStore, Lost};
use crate::LostReason;

/// A permit leased from a [`LeaseStore`]: a
/// [`RedisSemaphore`](crate::redis::RedisSemaphore)'s or a
/// [`PgSemaphore`](crate::postgres::PgSemaphore)'s.
///
/// While it is held, the semaphore renews the lease in the background about
/// every third of its time to live. Dropping the permit releases the lease
/// in the background; [`release`](Self::release) does it in the open and
/// reports an overrun.
///
/// If the process stalls (a long pause, a stopped process, the store out
/// of reach) past the lease's time to live, the lease is *lost*: another
/// holder may have been granted the permit, with a higher
/// [`fence`](Self::fence). The permit says so ([`is_lost`](Self::is_lost),
/// [`lost`](Self::lost)); it is never quietly re-acquired.
#[must_use = "dropping the permit releases it at once"]
pub struct LeasedPermit<S: LeaseStore> {
    sem: S,
    lease: Arc<Lease>,
    /// Set once `release` took over the lease.
    done: bool,
}

impl<S: LeaseStore> LeasedPermit<S> {
    /// The permit of `lease`, granted by `sem` (which renews it until the
    /// permit is dropped or released).
    pub(crate) fn new(sem: S, lease: Arc<Lease>) -> Self {
        Self {
            sem,
            lease,
            done: false,
        }
    }

    /// The fencing token of this grant: it increases with every grant of the
    /// semaphore. Pass it to the guarded resource so that it can refuse
    /// requests from a holder whose lease was lost (an older token than one
    /// it has already seen).
    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    /// The lease's id in the store (128 random bits, in hex), as the
    /// semaphore's `holders` lists it.
    pub fn id(&self) -> &str {
        &self.lease.id
    }

    /// Whether the lease is lost: true from the instant its
    /// [`deadline`](Self::deadline) passes without a renewal answered in
    /// time (this reads the clock; it does not wait for any task), or once
    /// a renewal found it expired. It never turns false again.
    ///
    /// Check it before acting on the guarded resource: while it is false,
    /// no other client has been granted this permit, unless clocks drift
    /// apart by more than the semaphore's drift margin over one time to
    /// live (or the store forgot the lease: see the fence).
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    /// When this process stops counting on the lease unless it is renewed
    /// first: the last successful renewal's (or the grant's) *send* time,
    /// plus the time to live, less the drift margin. The store's own
    /// deadline is later by at least the margin, less the rounding of its
    /// clock (a millisecond in Redis).
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// How long ago the permit was granted.
    pub fn held_for(&self) -> Duration {
        self.lease.granted.elapsed()
    }

    /// Resolves when the lease is lost: at its [`deadline`](Self::deadline)
    /// (by the semaphore's timer, not its renewer), or when a renewal finds
    /// it expired. Race the guarded work against it to stop work that no
    /// longer holds a permit, or let the semaphore's `call` do that.
    pub fn lost(&self) -> Lost {
        Lost::new(self.lease.clone(), self.sem.local().timer.clone())
    }

    /// Gives the permit back and says whether the lease was still held.
    ///
    /// # Errors
    ///
    /// An overrun if the lease had expired or was lost first (the store's
    /// `ReleaseError::Overrun`); the store's error if it could not be
    /// reached or refused the call (the lease then expires by itself).
    ///
    /// # Cancel safety
    ///
    /// Dropping it before the store answers still releases the lease, in
    /// the background, as dropping the permit does; only the report is
    /// lost.
    pub async fn release(mut self) -> Result<(), S::ReleaseError> {
        // From here the permit's drop does nothing: until the answer is
        // read, the release itself is guarded (if this future is dropped
        // first, the id is released in the background).
        self.done = true;
        self.sem.forget_lease(&self.lease.id);
        let known_lost = self.lease.lost_reason().is_some();
        let mut guard = ReleaseGuard {
            sem: &self.sem,
            id: &self.lease.id,
            armed: true,
        };
        let answer = self.sem.release_lease(&self.lease.id).await;
        guard.armed = false;
        match answer? {
            Released::InTime if !known_lost => Ok(()),
            Released::InTime | Released::Gone => Err(S::overrun(None)),
            Released::Late(by) => Err(S::overrun(Some(by))),
        }
    }
}

/// Releases the id in the background if a `release` future is dropped
/// before its answer came.
struct ReleaseGuard<'a, S: LeaseStore> {
    sem: &'a S,
    id: &'a str,
    armed: bool,
}

impl<S: LeaseStore> Drop for ReleaseGuard<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.sem.release_in_background(self.id.to_owned());
        }
    }
}

impl<S: LeaseStore> Drop for LeasedPermit<S> {
    fn drop(&mut self) {
        if !self.done {
            self.sem.forget_lease(&self.lease.id);
            self.sem.release_in_background(self.lease.id.clone());
        }
    }
}

impl<S: LeaseStore> fmt::Debug for LeasedPermit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedPermit")
            .field("semaphore", &self.sem.local().name())
            .field("id", &self.lease.id)
            .field("fence", &self.lease.fence)
            .field("lost", &self.lease.lost_reason())
            .finish()
    }
}
