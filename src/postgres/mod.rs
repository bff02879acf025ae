//! A semaphore whose permits are leases in PostgreSQL, shared by every
//! process that names the same semaphore in the same schema (feature
//! `postgres`, on tokio).
//!
//! For services that share a database and no Redis, and for quotas that
//! guard correctness as well as load: PostgreSQL commits a grant durably
//! and is linearizable on its primary, so a restart keeps every lease and
//! every fence, and nothing has to be quarantined.
//!
//! # Guarantees
//!
//! * At most `limit` unexpired leases exist at any time. Every grant,
//!   renewal and release is one call of a function in the database, so
//!   one short transaction, which locks the semaphore's row first and
//!   reads the database's clock: clients' clocks do not matter.
//! * A lease is renewed in the background while its permit is held. If a
//!   holder crashes, its permit comes back within one lease time to live,
//!   with no manual cleanup: an expired row is dropped by the next call.
//! * Waiters are granted permits in arrival order across processes: a
//!   busy attempt takes a place in the `waiters` table, and a release
//!   grants the head of that line inside its own transaction and notifies
//!   only that waiter's connection (`LISTEN`/`NOTIFY`), with a bounded poll
//!   as the fallback. A waiter's row expires if its process stops looking.
//!   With [`PgSemaphoreBuilder::fair`] off, an attempt may take a free
//!   permit ahead of the line.
//! * Every grant carries a fencing token from a sequence, which increases
//!   across restarts. A holder counts its lease lost from its local
//!   deadline (the last renewal's send time, plus the time to live, less a
//!   [drift margin](PgSemaphoreBuilder::drift_margin)), before the
//!   database can grant the permit to anyone else, clock drift within the
//!   margin. [`PgSemaphore::call`] drops the work at that instant;
//!   `call_to_end` lets it finish and reports the loss.
//! * The database unreachable fails closed: no grant without it
//!   ([`LeaseError::Unavailable`]); a waiting acquire rides out an outage
//!   of up to the [`outage_tolerance`](PgSemaphoreBuilder::outage_tolerance)
//!   with its place in line.
//!
//! # The tables
//!
//! `build` creates them (idempotently, under an advisory lock) in the
//! schema `watertight` unless told another; [`PgSemaphore::schema_sql`]
//! gives the statements for a database whose migrations are its own. An
//! operator reads them with plain SQL:
//!
//! ```sql
//! SELECT * FROM watertight.semaphores;  -- name, max_permits, used, changed_at
//! SELECT * FROM watertight.leases;      -- who holds what, since and until when
//! SELECT * FROM watertight.waiters;     -- who waits, in arrival order
//! ```
//!
//! A row whose `expires_at` has passed counts for nothing; the next call on
//! the semaphore removes it.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use watertight::postgres::PgSemaphore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = "postgres://app@127.0.0.1/app".parse()?;
//! let sem = PgSemaphore::builder(config, "partner-api")
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

mod builder;
mod conn;
mod error;
mod grants;
mod inner;
mod keeper;
mod semaphore;
mod sql;
mod store;

pub use builder::PgSemaphoreBuilder;
pub use error::{Cause, ConfigError, LeaseError, ReleaseError};
pub use semaphore::PgSemaphore;
pub use tokio_postgres::Config;

pub use crate::LostReason;
pub use crate::lease::{Completed, Holder, Lost};

/// A permit leased from a [`PgSemaphore`]: a row of its `leases` table.
pub type LeasedPermit = crate::lease::LeasedPermit<PgSemaphore>;
/// A [`LeasedBulkhead`](crate::lease::LeasedBulkhead) whose permits are
/// leases in PostgreSQL, shared by every process that uses the same
/// [`PgSemaphore`].
pub type PgBulkhead = crate::lease::LeasedBulkhead<PgSemaphore>;
/// Configures a [`PgBulkhead`].
pub type PgBulkheadBuilder = crate::lease::LeasedBulkheadBuilder<PgSemaphore>;
/// A lease held through a [`PgBulkhead`].
pub type PgBulkheadPermit = crate::lease::LeasedBulkheadPermit<PgSemaphore>;
