//! What every distributed store of leased permits shares: the bulkhead
//! over any of them ([`LeasedBulkhead`], over a [`LeaseStore`]: the Redis
//! and the PostgreSQL semaphores), the future that resolves when a lease
//! is lost ([`Lost`]), the permit itself ([`LeasedPermit`]), and what
//! work that ran to its end reports ([`Completed`]).
//!
//! Each backend's module names the bulkhead over its semaphore
//! ([`RedisBulkhead`](crate::redis::RedisBulkhead),
//! [`PgBulkhead`](crate::postgres::PgBulkhead)) and re-exports the rest;
//! this module is where their one definition lives.

mod background;
mod builder;
mod bulkhead;
mod call;
mod handoff;
mod held;
mod holder;
mod id;
mod lost;
mod permit;
mod renewer;
mod settings;
mod state;
mod store;
mod timing;

pub(crate) use background::Background;
pub use builder::LeasedBulkheadBuilder;
pub use bulkhead::{LeasedBulkhead, LeasedBulkheadPermit};
pub use call::Completed;
pub(crate) use call::{UntilLost, leased_calls, to_end, until_lost};
pub(crate) use held::HeldLeases;
pub use holder::Holder;
pub(crate) use id::IdSource;
pub use lost::Lost;
pub use permit::LeasedPermit;
pub(crate) use renewer::renew_loop;
pub(crate) use settings::{LeaseSettings, lease_setters};
pub(crate) use state::Lease;
pub use store::LeaseStore;
pub(crate) use store::sealed::Store;
pub(crate) use store::{Attempt, Down, Local, Released};
pub(crate) use timing::{Timing, default_label};
