//! The fair line's local half: this process's waiters that stand in the
//! line in Redis (`…:queue`), and the grants that a release elsewhere made
//! to them, as announced on this process's own channel.
//!
//! A release, an expiry purge or a raised limit grants the line's head
//! inside its own script and publishes `grant id fence ttl limit` on the
//! waiter's process channel; the subscriber task hands it to the waiter's
//! [`Slot`] here, and the waiter takes the permit without another script
//! call. A message that never arrives costs only time: the waiter looks
//! again by running the acquire script with the same id (after `max_poll`,
//! or at once when the subscription was lost), which returns the grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use event_listener::{Event, EventListener};

/// This process's waiters in the line, by permit id.
#[derive(Default)]
pub(super) struct Line {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// One waiter's place in the line, as seen from its process.
pub(super) struct Slot {
    state: Mutex<SlotState>,
    /// Notified when a grant arrives, or when the waiter should look again.
    event: Event,
}

struct SlotState {
    /// When the latest call was sent that found the id still waiting (the
    /// acquire that put it in line, or a heartbeat): the grant came after
    /// it, so a lease counted from here ends before Redis's.
    since: Instant,
    /// The fence and limit of the grant announced for it, not yet taken.
    grant: Option<(u64, usize)>,
}

impl Line {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `id` before the acquire call that may put it in line is
    /// sent at `since` (a grant can be announced before that call's answer
    /// is read).
    pub(super) fn join(&self, id: &str, since: Instant) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState { since, grant: None }),
            event: Event::new(),
        });
        self.lock().insert(id.to_owned(), slot.clone());
        slot
    }

    /// Forgets `id` (granted, or its acquire was dropped).
    pub(super) fn leave(&self, id: &str) {
        self.lock().remove(id);
    }

    /// A grant was announced for `id`: stores it in its slot and wakes the
    /// waiter. An id no longer here (its acquire was dropped, which
    /// releases the id) is ignored.
    pub(super) fn granted(&self, id: &str, fence: u64, limit: usize) {
        let slot = self.lock().get(id).cloned();
        if let Some(slot) = slot {
            slot.state().grant = Some((fence, limit));
            slot.wake();
        }
    }

    /// Every waiter here, for the heartbeat.
    pub(super) fn entries(&self) -> Vec<(String, Arc<Slot>)> {
        self.lock()
            .iter()
            .map(|(id, slot)| (id.clone(), slot.clone()))
            .collect()
    }

    /// Wakes every waiter, to look again: messages may have been lost (the
    /// subscription was made again), or the semaphore was closed.
    pub(super) fn wake_all(&self) {
        let slots: Vec<_> = self.lock().values().cloned().collect();
        for slot in slots {
            slot.wake();
        }
    }
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A listener for the slot's next wake-up.
    pub(super) fn listen(&self) -> EventListener {
        self.event.listen()
    }

    /// Wakes the waiter (outside the slot's lock).
    pub(super) fn wake(&self) {
        self.event.notify(usize::MAX);
    }

    /// A call sent at `sent` found the id still waiting.
    pub(super) fn still_waiting(&self, sent: Instant) {
        let mut state = self.state();
        state.since = state.since.max(sent);
    }

    /// Takes the announced grant, if any: its fence, the limit, and the
    /// instant that the grant came after.
    pub(super) fn take(&self) -> Option<(u64, usize, Instant)> {
        let mut state = self.state();
        state
            .grant
            .take()
            .map(|(fence, limit)| (fence, limit, state.since))
    }
}
