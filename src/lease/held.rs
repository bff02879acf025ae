//! What this process holds of one store, whichever it is: its leases by
//! id, which the renewer renews until their permits give them up, and the
//! releases of those given up that still run in tasks of their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Background, Lease};
use crate::LostReason;

/// The leases this process holds of one store, and its releases under way
/// (see [`Background`]). `pub` for the sealed `Store` trait's signatures,
/// and unreachable from outside the crate, as `Down` is.
///
/// The map's lock is held only to read or change the map: never while a
/// lease is checked (finding it lost wakes its `lost()` futures) or a call
/// is awaited. A panic cannot leave the map half changed, so a poisoned
/// lock still guards a valid map and is taken as it is.
#[allow(unreachable_pub)]
#[derive(Default)]
pub struct HeldLeases {
    leases: Mutex<HashMap<String, Arc<Lease>>>,
    /// The releases of leases given up, running in tasks of their own.
    pub(crate) background: Arc<Background>,
}

impl HeldLeases {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Lease>>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the lease granted to `id` by a call sent at `sent` (`life` is
    /// the time to live less the drift margin), and returns it for its
    /// permit.
    pub(crate) fn granted(
        &self,
        id: String,
        fence: u64,
        sent: Instant,
        life: Duration,
    ) -> Arc<Lease> {
        let lease = Arc::new(Lease::new(id, fence, sent, life));
        self.lock().insert(lease.id.clone(), lease.clone());
        lease
    }

    /// Stops renewing `id`.
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Marks `lease` lost and stops renewing it.
    pub(crate) fn lost(&self, lease: &Lease, reason: LostReason) {
        lease.mark_lost(reason);
        self.forget(&lease.id);
    }

    /// Whether `id` is still held: a renewal answered after its permit
    /// gave it up (a release forgets the lease before it is sent) does not
    /// make it lost.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// How many leases are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The earliest local deadline of the leases held: when the renewer
    /// must look again at the latest. Read without checking the leases
    /// (that may wake `lost()` futures, which must not run under the map's
    /// lock), so a lease already lost counts too, and the next round, which
    /// forgets it, comes no later than its deadline.
    pub(crate) fn earliest_deadline(&self) -> Option<Instant> {
        self.lock().values().map(|lease| lease.deadline()).min()
    }

    /// The leases held now, for a round of renewals to check and renew
    /// outside the lock.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Lease>> {
        self.lock().values().cloned().collect()
    }
}

impl core::fmt::Debug for HeldLeases {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HeldLeases")
            .field("leases", &self.len())
            .field("background", &self.background)
            .finish()
    }
}
