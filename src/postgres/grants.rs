//! Grants notified to this handle's waiters: a release (or an expiry, or a
//! raised limit) elsewhere grants the head of the line inside its own
//! transaction and notifies the waiter's channel with `"<id> <fence>"`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use event_listener::{Event, EventListener};

use crate::loom::lock;

/// This handle's waiters, by lease id: `Some(fence)` once a grant was
/// notified.
#[derive(Default)]
pub(super) struct Grants {
    slots: Mutex<HashMap<String, Option<u64>>>,
    /// Notified when any slot is filled, when the connection is made
    /// again, and at `close`.
    event: Event,
    /// Counts [`wake_all`](Self::wake_all)s: a waiter that sees it move
    /// looks again at once.
    round: AtomicU64,
}

impl Grants {
    /// A waiter for `id` starts listening for its grant.
    pub(super) fn wait_for(&self, id: &str) {
        lock(&self.slots).insert(id.to_owned(), None);
    }

    /// The waiter for `id` is done (granted, failed or dropped).
    pub(super) fn forget(&self, id: &str) {
        lock(&self.slots).remove(id);
    }

    /// The fence of the grant notified for `id`, if one was.
    pub(super) fn granted(&self, id: &str) -> Option<u64> {
        lock(&self.slots).get(id).copied().flatten()
    }

    pub(super) fn listen(&self) -> EventListener {
        self.event.listen()
    }

    /// A notification's payload. One for a waiter that is gone (its
    /// acquire dropped, or granted by its own attempt first) is ignored:
    /// the dropped acquire releases its id, which gives back a lease
    /// granted to it.
    pub(super) fn notified(&self, payload: &str) {
        let Some((id, fence)) = payload.split_once(' ') else {
            return;
        };
        let Ok(fence) = fence.parse::<u64>() else {
            return;
        };
        let filled = match lock(&self.slots).get_mut(id) {
            Some(slot) => {
                *slot = Some(fence);
                true
            }
            None => false,
        };
        if filled {
            self.event.notify(usize::MAX);
        }
    }

    /// Wakes every waiter to look again.
    pub(super) fn wake_all(&self) {
        self.round.fetch_add(1, Ordering::AcqRel);
        self.event.notify(usize::MAX);
    }

    pub(super) fn round(&self) -> u64 {
        self.round.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_fills_only_its_waiters_slot() {
        let grants = Grants::default();
        grants.wait_for("a");
        grants.wait_for("b");
        grants.notified("b 42");
        grants.notified("gone 7");
        grants.notified("a not-a-fence");
        grants.notified("no-space");
        assert_eq!(grants.granted("a"), None);
        assert_eq!(grants.granted("b"), Some(42));
        assert_eq!(grants.granted("gone"), None);
        grants.forget("b");
        assert_eq!(grants.granted("b"), None);
    }
}
