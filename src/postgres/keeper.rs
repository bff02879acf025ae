//! The renewer: renews this handle's leases in one call a round. It holds
//! only a weak reference, and stops once the last handle is dropped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::inner::Inner;
use crate::LostReason;
use crate::lease::renew_loop;
use crate::timer::timeout::Timeout;

pub(super) fn start(inner: &Arc<Inner>) {
    let timer = inner.local.timer.clone();
    let sleep = move |pause| {
        let timer = timer.clone();
        async move {
            timer.sleep(pause).await;
            true
        }
    };
    let round = |inner: Arc<Inner>| async move { renew_all(&inner).await };
    let every = inner.settings.renew_every;
    inner
        .runtime
        .spawn(renew_loop(Arc::downgrade(inner), every, sleep, round));
}

/// One round; returns the earliest local deadline of the leases still
/// held, if any.
async fn renew_all(inner: &Inner) -> Option<Instant> {
    // Checked outside the map's lock: finding a lease lost wakes its
    // `lost()` futures.
    let held = inner.local.held.snapshot();
    let mut leases = Vec::with_capacity(held.len());
    for lease in held {
        if lease.sending() {
            leases.push(lease);
        } else {
            inner.local.held.forget(&lease.id);
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
    if let Ok(Ok(renewed)) = Timeout::new(renewal, inner.local.timer.sleep(budget)).await {
        let renewed: HashSet<String> = renewed.into_iter().collect();
        for lease in &leases {
            if renewed.contains(&lease.id) {
                lease.renewed(sent, inner.settings.life);
            } else if inner.local.held.holds(&lease.id) {
                // Not released meanwhile: the database no longer has it.
                inner.local.held.lost(lease, LostReason::Expired);
            }
        }
    }
    // Unanswered or failed: the leases stay `unanswered`, and are lost at
    // their deadlines unless a later round gets through.
    inner.local.held.earliest_deadline()
}
