//! One lease holder, as a semaphore's `holders` lists it.

use std::time::Duration;

/// One lease holder, as [`RedisSemaphore::holders`](crate::redis::RedisSemaphore::holders)
/// or [`PgSemaphore::holders`](crate::postgres::PgSemaphore::holders) lists
/// it: what an operator would otherwise read from a lock table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The lease's id ([`LeasedPermit::id`](super::LeasedPermit::id)).
    pub id: String,
    /// The grant's fencing token.
    pub fence: u64,
    /// The holder's label (the builder's `label`; by default the host name
    /// and process id).
    pub label: String,
    /// How many permits the lease holds (always 1 in Redis).
    pub weight: u32,
    /// How long ago the permit was granted, by the store's clock.
    pub age: Duration,
    /// How long until the lease expires unless renewed, by the store's
    /// clock.
    pub expires_in: Duration,
}
