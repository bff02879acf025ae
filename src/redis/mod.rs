//! A semaphore whose permits are leases in Redis, shared by every process
//! that names the same semaphore (feature `redis`, with `tokio` or `smol`).
//!
//! Use it when one quota is shared by many instances of a service: a
//! partner API that allows 5 connections in total, a job that must not
//! overlap across servers. [`RedisBulkhead`] puts the bulkhead's policy
//! (waiting with a time limit, failing fast, a bounded line, call timeouts,
//! metrics and observers) over it. Both run on one Redis server, a Redis
//! Cluster (feature `redis-cluster`) or the primary that Redis Sentinel
//! names (feature `redis-sentinel`): see [`Backend`].
//!
//! # Guarantees
//!
//! * At most `limit` unexpired leases exist at any time *as the Redis
//!   primary sees it*. Every grant, renewal and release is one Lua script
//!   that reads the server's clock, so clients' clocks do not matter.
//! * A lease is renewed in the background while its permit is held. If a
//!   holder crashes, its permit comes back within one lease time to live.
//! * Waiters are granted permits in arrival order across processes: a
//!   release grants the head of a line kept in Redis inside its own
//!   script, and tells only that waiter's process (two script calls and
//!   one wake-up per contended grant). [`RedisSemaphoreBuilder::fair`]
//!   turns it off.
//! * Every grant carries a fencing token that increases per semaphore. A
//!   holder that stalls past its lease loses it: the permit reports it, and
//!   the guarded resource can refuse the old token.
//! * A holder counts its lease lost from its local deadline (the last
//!   renewal's send time, plus the time to live, less a
//!   [drift margin](RedisSemaphoreBuilder::drift_margin)), before Redis can
//!   grant the permit to anyone else, clock drift within the margin.
//!   [`RedisSemaphore::call`] and [`RedisBulkhead::call`] drop the work at
//!   that instant; `call_to_end` lets it finish and reports the loss.
//! * This is a load-protection limit, not mutual exclusion: a Redis
//!   failover or restart without persistence can forget leases and admit
//!   more than `limit` until the loss is seen (by a holder's renewal, by
//!   an acquire that finds the semaphore's epoch marker gone, by a watch
//!   of the replication id that finds a promoted replica); then no grant
//!   is made for one lease time to live (the
//!   [quarantine](RedisSemaphoreBuilder::quarantine)). Grants can also
//!   wait for replicas ([`replicas`](RedisSemaphoreBuilder::replicas)). Where
//!   correctness depends on exclusivity, check fencing tokens at the
//!   resource.
//!
//! The [distributed guide](crate::guide::distributed) has the measured
//! guarantees, the configuration, the errors and the operations.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use watertight::redis::RedisSemaphore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let sem = RedisSemaphore::builder(client, "partner-api")
//!     .limit(5)
//!     .lease_ttl(Duration::from_secs(10))
//!     .build()
//!     .await?;
//! let permit = sem.acquire().await?;
//! // Tell the partner which grant this is; it can refuse older ones.
//! let fence = permit.fence();
//! # let _ = fence;
//! permit.release().await?;
//! # Ok(()) }
//! ```

mod attempt;
mod builder;
mod call;
mod conn;
mod error;
mod failover;
mod inner;
mod keeper;
mod keys;
mod line;
mod replication;
mod scripts;
mod semaphore;
mod signals;
mod spawn;
mod store;
mod wakeups;

pub use crate::lease::{Completed, Holder, Lost};

/// A permit leased from a [`RedisSemaphore`].
pub type LeasedPermit = crate::lease::LeasedPermit<RedisSemaphore>;
/// A [`LeasedBulkhead`](crate::lease::LeasedBulkhead) whose permits are
/// leases in Redis, shared by every process that uses the same
/// [`RedisSemaphore`].
pub type RedisBulkhead = crate::lease::LeasedBulkhead<RedisSemaphore>;
/// Configures a [`RedisBulkhead`].
pub type RedisBulkheadBuilder = crate::lease::LeasedBulkheadBuilder<RedisSemaphore>;
/// A lease held through a [`RedisBulkhead`].
pub type RedisBulkheadPermit = crate::lease::LeasedBulkheadPermit<RedisSemaphore>;
pub use builder::RedisSemaphoreBuilder;
pub use conn::Backend;
pub use error::{ConfigError, LeaseError, LostReason, ReleaseError};
pub use semaphore::RedisSemaphore;
pub use wakeups::Wakeups;
