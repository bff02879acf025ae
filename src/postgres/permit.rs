//! A permit leased from PostgreSQL: the handle a holder keeps, and its
//! release.

use core::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::ReleaseError;
use super::inner::{Inner, Released};
use crate::LostReason;
use crate::lease::{Lease, Lost};

/// A permit leased from a [`PgSemaphore`](super::PgSemaphore): a row of its
/// `leases` table.
///
/// While it is held, the semaphore's renewer pushes the lease's expiry on
/// about every third of its time to live. Dropping the permit releases the
/// lease in the background; [`release`](Self::release) does it in the open
/// and reports an overrun.
///
/// If the process stalls (a long pause, a stopped process, the database
/// out of reach) past the lease's time to live, the lease is *lost*:
/// another holder may have been granted the permit, with a higher
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
    /// The fencing token of this grant, from the schema's `fences`
    /// sequence: it increases with every grant, across restarts of the
    /// database. Pass it to the guarded resource so that it can refuse
    /// requests from a holder whose lease was lost (an older token than one
    /// it has already seen).
    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    /// The lease's id (128 random bits, in hex): its row's `id`.
    pub fn id(&self) -> &str {
        &self.lease.id
    }

    /// Whether the lease is lost: true from the instant its
    /// [`deadline`](Self::deadline) passes without a renewal answered in
    /// time (this reads the clock; it does not wait for the renewer), or
    /// once a renewal found it expired. It never turns false again.
    ///
    /// While it is false, no other client has been granted this permit,
    /// unless the database's clock and this process's drift apart by more
    /// than the [drift margin](super::PgSemaphoreBuilder::drift_margin)
    /// over one time to live.
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// How the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    /// When this process stops counting on the lease unless it is renewed
    /// first: the last successful renewal's (or the grant's) *send* time,
    /// plus the time to live, less the drift margin. The database's own
    /// expiry is later by at least the margin.
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// How long ago the permit was granted, as this process saw it.
    pub fn held_for(&self) -> Duration {
        self.lease.granted.elapsed()
    }

    /// Resolves when the lease is lost: at its [`deadline`](Self::deadline)
    /// (by the semaphore's timer, not the renewer), or when a renewal finds
    /// it expired.
    pub fn lost(&self) -> Lost {
        Lost::new(self.lease.clone(), self.inner.timer.clone())
    }

    /// Gives the permit back and says whether the lease was still held.
    ///
    /// # Errors
    ///
    /// [`ReleaseError::Overrun`] if the lease had expired or was lost
    /// first; [`ReleaseError::Unavailable`] if the database could not be
    /// reached, or [`ReleaseError::Refused`] if it refused the call (the
    /// lease then expires by itself).
    ///
    /// # Cancel safety
    ///
    /// Dropping it before the database answers still releases the lease,
    /// in the background, as dropping the permit does; only the report is
    /// lost.
    pub async fn release(mut self) -> Result<(), ReleaseError> {
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
            Ok(Released::InTime) if !known_lost => Ok(()),
            Ok(Released::InTime | Released::Gone) => Err(ReleaseError::Overrun { by: None }),
            Ok(Released::Late(by)) => Err(ReleaseError::Overrun { by: Some(by) }),
            Err(failure) => Err(failure.release()),
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
