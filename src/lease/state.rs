//! What this process knows of one lease: its id and fence, its local
//! deadline, and whether it is lost. Shared by the permit that holds it
//! and the task that renews it, whichever store granted it.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use event_listener::Event;

use crate::LostReason;

/// What this process knows of one lease. Shared by the permit and the
/// lease keeper that renews it.
///
/// The lease is lost from the instant its local deadline passes, whether
/// or not anyone is looking: [`lost_reason`](Self::lost_reason) compares
/// the clock against the deadline itself, and a renewal answered after the
/// deadline does not bring the lease back. So "lost" depends only on time
/// and on the answers read before it, never on when a task got to run.
pub(crate) struct Lease {
    pub(crate) id: String,
    pub(crate) fence: u64,
    pub(crate) granted: Instant,
    state: Mutex<LeaseState>,
    /// Notified once, when the lease is found lost.
    pub(crate) lost: Event,
}

struct LeaseState {
    /// When this process stops counting on the lease: the moment the last
    /// successful grant or renewal was *sent*, plus the time to live, less
    /// the drift margin. The store set its own deadline when the call arrived
    /// (later), so this is before the store's by at least the margin, less
    /// the rounding of the store's clock (a millisecond in Redis).
    deadline: Instant,
    lost: Option<LostReason>,
    /// A renewal was sent and not (successfully) answered since the last
    /// success: a deadline that passes now is `Unreachable`, not `Stalled`.
    unanswered: bool,
}

impl LeaseState {
    /// The loss, marking it if the deadline has passed by `now`. Returns
    /// whether this call marked it.
    fn check(&mut self, now: Instant) -> bool {
        if self.lost.is_none() && now >= self.deadline {
            self.lost = Some(if self.unanswered {
                LostReason::Unreachable
            } else {
                LostReason::Stalled
            });
            return true;
        }
        false
    }
}

impl Lease {
    /// A lease granted by a call sent at `sent`; `life` is the time to
    /// live less the drift margin.
    pub(crate) fn new(id: String, fence: u64, sent: Instant, life: Duration) -> Self {
        Self {
            id,
            fence,
            granted: Instant::now(),
            state: Mutex::new(LeaseState {
                deadline: sent + life,
                lost: None,
                unanswered: false,
            }),
            lost: Event::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state once the deadline is checked, and wakes the
    /// `lost()` futures if the lease was found lost in between.
    fn update<T>(&self, f: impl FnOnce(&mut LeaseState) -> T) -> T {
        let (out, marked) = {
            let mut state = self.state();
            let was_lost = state.lost.is_some();
            state.check(Instant::now());
            let out = f(&mut state);
            (out, !was_lost && state.lost.is_some())
        };
        if marked {
            self.lost.notify(usize::MAX);
        }
        out
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// How the lease was lost, if it was; past the deadline it is, at once.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.update(|state| state.lost)
    }

    /// A renewal is about to be sent. Returns `false` if the lease is lost
    /// (then it is not to be renewed).
    pub(crate) fn sending(&self) -> bool {
        self.update(|state| {
            state.unanswered = true;
            state.lost.is_none()
        })
    }

    /// A renewal sent at `sent` succeeded; `life` is the time to live less
    /// the drift margin. A lost lease stays lost, and so does one whose
    /// deadline passed before this answer was read.
    pub(crate) fn renewed(&self, sent: Instant, life: Duration) {
        self.update(|state| {
            if state.lost.is_none() {
                state.deadline = state.deadline.max(sent + life);
                state.unanswered = false;
            }
        });
    }

    /// Marks the lease lost (once: the first reason stays, and a deadline
    /// that passed before this call comes first) and wakes whoever waits
    /// for that.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        self.update(|state| {
            if state.lost.is_none() {
                state.lost = Some(reason);
            }
        });
    }
}
