//! The renewer: renews this handle's leases in one call a round. It holds
//! only a weak reference, and stops once the last handle is dropped.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::inner::Inner;
use crate::LostReason;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

pub(super) fn start(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let timer = inner.timer.clone();
    let every = inner.renew_every;
    inner.runtime.spawn(renew_loop(weak, timer, every));
}

async fn renew_loop(weak: Weak<Inner>, timer: Arc<dyn Timer>, every: Duration) {
    let mut pause = every;
    loop {
        timer.sleep(pause).await;
        let Some(inner) = weak.upgrade() else { return };
        // Sleep `every` or until the earliest local deadline, whichever
        // is first: a lease whose renewals fail is forgotten at its
        // deadline (it is lost at that instant whether this task runs or
        // not: see `Lease`).
        pause = match renew_all(&inner).await {
            Some(earliest) => every.min(earliest.saturating_duration_since(Instant::now())),
            None => every,
        }
        .max(Duration::from_millis(1));
    }
}

/// One round; returns the earliest local deadline of the leases still
/// held, if any.
async fn renew_all(inner: &Inner) -> Option<Instant> {
    // Checked outside the map's lock: finding a lease lost wakes its
    // `lost()` futures.
    let held: Vec<_> = inner.lock_leases().values().cloned().collect();
    let mut leases = Vec::with_capacity(held.len());
    for lease in held {
        if lease.sending() {
            leases.push(lease);
        } else {
            inner.forget_lease(&lease.id);
        }
    }
    if leases.is_empty() {
        return None;
    }
    let ids: Vec<String> = leases.iter().map(|l| l.id.clone()).collect();
    let sent = Instant::now();
    // A renewal may not outlast the earliest lease it renews: past that
    // deadline the lease is lost, and an answer read later would not
    // bring it back.
    let earliest = leases.iter().map(|l| l.deadline()).min().unwrap_or(sent);
    let budget = earliest.saturating_duration_since(sent);
    let renewal = inner.renew(&ids);
    if let Ok(Ok(renewed)) = Timeout::new(renewal, inner.timer.sleep(budget)).await {
        let renewed: HashSet<String> = renewed.into_iter().collect();
        for lease in &leases {
            if renewed.contains(&lease.id) {
                lease.renewed(sent, inner.life);
            } else if inner.lock_leases().contains_key(&lease.id) {
                // Not released meanwhile: the database no longer has it.
                lease.mark_lost(LostReason::Expired);
                inner.forget_lease(&lease.id);
            }
        }
    }
    // Unanswered or failed: the leases stay `unanswered`, and are lost at
    // their deadlines unless a later round gets through.
    let held: Vec<_> = inner.lock_leases().values().cloned().collect();
    held.iter()
        .filter(|l| l.lost_reason().is_none())
        .map(|l| l.deadline())
        .min()
}
