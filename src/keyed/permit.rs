//! The guard that holds a key's permit (and a global one).

use core::fmt;
use std::sync::Arc;

use super::entry::Entry;
use crate::bulkhead::{BulkheadPermit, CallOutcome};

/// A caller's hold on a tracked key: holders and waiters alike. While any
/// exists, the key's entry cannot be evicted. Made with the key's shard's
/// map lock held (the count only grows there); dropped anywhere.
pub(super) struct User {
    pub(super) entry: Arc<Entry>,
}

impl User {
    /// Counts one more user of `entry`. Call it with the entry's shard's map
    /// lock held, and the entry in the map.
    #[inline]
    pub(super) fn enter(entry: &Arc<Entry>) -> Self {
        entry.enter();
        Self {
            entry: entry.clone(),
        }
    }

    /// Takes over the count of a new entry, made with one user.
    pub(super) fn adopt(entry: Arc<Entry>) -> Self {
        Self { entry }
    }
}

impl Drop for User {
    fn drop(&mut self) {
        self.entry.leave();
    }
}

/// A permit from [`KeyedBulkhead::acquire`](super::KeyedBulkhead::acquire)
/// or [`KeyedBulkhead::try_acquire`](super::KeyedBulkhead::try_acquire):
/// one of its key's permits and, with a global limit, one global permit.
/// The call counts as in flight, for its key and globally, until this is
/// dropped. While it is held its key cannot be evicted. It owns what it
/// needs, so it can move into spawned tasks.
///
/// # Examples
///
/// ```
/// use watertight::keyed::KeyedBulkhead;
///
/// let tenants = KeyedBulkhead::<String>::builder()
///     .max_concurrent_calls(1)
///     .global_limit(10)
///     .build()
///     .unwrap();
/// let permit = tenants.try_acquire("acme").unwrap();
/// assert_eq!(tenants.metrics_for("acme").unwrap().in_flight(), 1);
/// assert_eq!(tenants.global_metrics().unwrap().in_flight(), 1);
/// assert_eq!(tenants.evict_idle(), 0); // in use: never evicted
/// drop(permit);
/// assert_eq!(tenants.global_metrics().unwrap().in_flight(), 0);
/// assert_eq!(tenants.evict_idle(), 1);
/// ```
#[must_use = "dropping the permit ends the call it guards at once"]
#[clippy::has_significant_drop]
pub struct KeyedPermit {
    // Dropped in this order (declaration order): the global permit, then
    // the key's, then the user count. The count must go last: once it is
    // zero the key may be evicted and made afresh, and a fresh bulkhead
    // must not start while a permit of the old one is still out.
    pub(super) global: Option<BulkheadPermit>,
    pub(super) key: BulkheadPermit,
    pub(super) user: User,
}

impl KeyedPermit {
    /// The name of the key's bulkhead: the keyed bulkhead's name, with the
    /// key's label in brackets when there is a
    /// [`key_label`](super::KeyedBulkheadBuilder::key_label).
    pub fn bulkhead_name(&self) -> &str {
        self.key.bulkhead_name()
    }

    /// The key's metric label, if the keyed bulkhead has a `key_label`.
    pub fn label(&self) -> Option<&str> {
        self.user.entry.label.as_deref()
    }

    /// Whether the permit includes a global one.
    pub fn has_global(&self) -> bool {
        self.global.is_some()
    }

    /// Marks how the guarded work ended, for the observers of the key's
    /// bulkhead and the global one (the default is
    /// [`CallOutcome::Released`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::CallOutcome;
    /// use watertight::keyed::KeyedBulkhead;
    ///
    /// let hosts = KeyedBulkhead::<u16>::builder().max_concurrent_calls(1).build().unwrap();
    /// let mut permit = hosts.try_acquire(&443).unwrap();
    /// permit.set_outcome(CallOutcome::Success);
    /// ```
    pub fn set_outcome(&mut self, outcome: CallOutcome) {
        self.key.set_outcome(outcome);
        if let Some(global) = &mut self.global {
            global.set_outcome(outcome);
        }
    }
}

impl fmt::Debug for KeyedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPermit")
            .field("bulkhead", &self.key.bulkhead_name())
            .field("global", &self.global.as_ref().map(|g| g.bulkhead_name()))
            .finish_non_exhaustive()
    }
}
