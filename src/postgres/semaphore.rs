//! The handle and its public methods.

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::LeasedPermit;
use super::error::{Failure, LeaseError};
use super::inner::{Attempt, Down, Inner};
use crate::lease::{self, Holder};

/// A semaphore whose permits are leases in PostgreSQL, shared by every
/// process that names it in the same schema. Clones share one connection.
///
/// See the [module docs](super) for what it guarantees, and
/// [`PgSemaphore::builder`] to make one.
#[derive(Clone)]
pub struct PgSemaphore {
    pub(super) inner: Arc<Inner>,
}

impl PgSemaphore {
    /// The semaphore's name: its row in the schema's `semaphores` table.
    pub fn name(&self) -> &str {
        self.inner.local.name()
    }

    /// How long a lease lives without renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.settings.lease_ttl
    }

    /// The limit as last read from the database (at `build`, then at every
    /// attempt).
    pub fn limit_seen(&self) -> usize {
        self.inner.local.limit_seen()
    }

    /// How many leases this handle (and its clones) holds now.
    pub fn held_here(&self) -> usize {
        self.inner.local.held.len()
    }

    /// Waits for a permit: one call of the `acquire` function per attempt.
    /// In fair mode (the default, see
    /// [`PgSemaphoreBuilder::fair`](super::PgSemaphoreBuilder::fair)) a
    /// busy attempt joins the line (a row of `waiters`), and the release
    /// that frees a permit grants it to the line's head inside its own
    /// transaction and notifies that waiter's connection: the waiter takes
    /// it without another call. Otherwise a waiter looks again when the
    /// earliest lease expires, and at least every `max_poll`.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unavailable`] if the database stays unreachable for
    /// the builder's `outage_tolerance` (fails closed; a shorter outage,
    /// such as a restart, is ridden out with the same lease id, keeping the
    /// waiter's place in line; the call that ends the outage's tolerance may
    /// take its whole `response_timeout`), [`LeaseError::Closed`] after
    /// [`close`](Self::close). [`LeaseError::Denied`], [`LeaseError::Auth`]
    /// and [`LeaseError::Sql`] at once: the database answered, and asking
    /// again would not change its answer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point leaks no lease: the id is released
    /// in the background (leaving the line, and handing on a permit granted
    /// to it meanwhile), and its row expires within its time to live if the
    /// database cannot be reached.
    pub async fn acquire(&self) -> Result<LeasedPermit, LeaseError> {
        self.acquire_many(1).await
    }

    /// Waits for a lease of `permits` permits at once, as
    /// [`acquire`](Self::acquire) waits for one (its row's `weight`). In
    /// fair mode a heavy waiter at the head of the line holds back the
    /// lighter ones behind it until enough permits are free.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire), and [`LeaseError::Weight`] at
    /// once for zero permits or more than the limit (or, while waiting,
    /// once the limit is lowered below `permits`).
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, permits: u32) -> Result<LeasedPermit, LeaseError> {
        match self.inner.first_attempt(permits).await? {
            Attempt::Granted(permit) => Ok(permit),
            Attempt::Busy(busy) => self.inner.wait_from(busy, &Down::default()).await,
        }
    }

    /// Takes a permit if one is free now and, in fair mode, nobody waits
    /// in the line: one call, no waiting.
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoPermits`] with a retry hint;
    /// [`LeaseError::Unavailable`] if the database did not answer within
    /// one `response_timeout`; otherwise as for [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping it before the database answers releases the id in the
    /// background: a lease granted meanwhile goes back at once.
    pub async fn try_acquire(&self) -> Result<LeasedPermit, LeaseError> {
        self.inner.try_acquire(1).await
    }

    /// Takes a lease of `permits` permits if they are free now (and, in
    /// fair mode, nobody waits in the line): one call, no waiting.
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](Self::try_acquire), and [`LeaseError::Weight`]
    /// for zero permits or more than the limit.
    ///
    /// # Cancel safety
    ///
    /// As for [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_many(&self, permits: u32) -> Result<LeasedPermit, LeaseError> {
        self.inner.try_acquire(permits).await
    }

    lease::leased_calls! {
        LeaseError;
        /// Runs `work` under a lease that [`acquire`](Self::acquire) grants,
        /// and drops it unfinished at the instant the lease is lost (see
        /// [`LeasedPermit::lost`](super::LeasedPermit::lost)); the lease is
        /// released in the background afterwards.
        ///
        /// # Errors
        ///
        /// [`LeaseError::Lost`] when the work was dropped for that; the errors
        /// of [`acquire`](Self::acquire) before it ran.
        ///
        /// # Cancel safety
        ///
        /// The work is dropped with the future, and the lease (or a grant still
        /// on its way) released in the background.
        ;

        /// Waits for a permit as [`acquire`](Self::acquire) does, runs `work`
        /// to its end while it holds the lease, and says whether the lease was
        /// lost before the work ended.
        ///
        /// # Cancel safety
        ///
        /// As for [`call`](Self::call).
        ;
    }

    /// Lists the unexpired leases, oldest grant first: what
    /// `SELECT * FROM <schema>.leases` shows, with ages on the database's
    /// clock.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unavailable`], [`LeaseError::Denied`],
    /// [`LeaseError::Auth`] or [`LeaseError::Sql`], if the query failed.
    ///
    /// # Cancel safety
    ///
    /// It only reads.
    pub async fn holders(&self) -> Result<Vec<Holder>, LeaseError> {
        let inner = &*self.inner;
        let rows = inner
            .conn
            .bounded(async {
                let live = inner.conn.live().await?;
                Ok(live
                    .client
                    .query(&live.holders, &[&inner.local.name()])
                    .await?)
            })
            .await
            .map_err(Failure::lease)?;
        let millis = |ms: i64| Duration::from_millis(ms.max(0).unsigned_abs());
        rows.iter()
            .map(|row| {
                Ok(Holder {
                    id: row.try_get(0)?,
                    label: row.try_get(1)?,
                    weight: row.try_get::<_, i32>(2)?.unsigned_abs(),
                    fence: row.try_get::<_, i64>(3)?.unsigned_abs(),
                    age: millis(row.try_get(4)?),
                    expires_in: millis(row.try_get(5)?),
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| Failure::from(e).lease())
    }

    /// Reads the limit stored in the database.
    ///
    /// # Errors
    ///
    /// As for [`holders`](Self::holders).
    ///
    /// # Cancel safety
    ///
    /// It only reads.
    pub async fn limit(&self) -> Result<usize, LeaseError> {
        let inner = &*self.inner;
        let limit = inner.read_limit().await.map_err(Failure::lease)?;
        inner.local.saw_limit(limit);
        Ok(limit)
    }

    /// Changes the limit for every client; a higher limit grants the
    /// line's head at once, in the same transaction. Leases held beyond a
    /// lower limit are kept until released.
    ///
    /// # Errors
    ///
    /// As for [`holders`](Self::holders), and [`LeaseError::Sql`] for a
    /// limit that does not fit a `bigint`.
    ///
    /// # Cancel safety
    ///
    /// Dropped before the answer, the change may or may not have been made.
    pub async fn set_limit(&self, limit: usize) -> Result<(), LeaseError> {
        let inner = &*self.inner;
        let stored = i64::try_from(limit).map_err(|e| LeaseError::Sql(Box::new(e)))?;
        inner
            .conn
            .bounded(async {
                let live = inner.conn.live().await?;
                live.client
                    .query_one(&live.set_limit, &[&inner.local.name(), &stored])
                    .await?;
                Ok(())
            })
            .await
            .map_err(Failure::lease)?;
        inner.local.saw_limit(limit);
        Ok(())
    }

    /// Refuses this handle's waiting and later acquires with
    /// [`LeaseError::Closed`]; permits held stay valid until released.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Resolves once every release this handle started in the background
    /// (for a dropped permit, or an acquire dropped while a grant may have
    /// been made) has been answered or has failed: before a process ends
    /// its runtime, so that no lease it gave up stays held until its time
    /// to live runs out. Each release is bounded by the response timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(sem: watertight::postgres::PgSemaphore, permit: watertight::postgres::LeasedPermit) {
    /// // Shutting down:
    /// sem.close();
    /// drop(permit);
    /// sem.wait_released().await;
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// It holds nothing: dropping it only stops the wait.
    pub async fn wait_released(&self) {
        self.inner.local.held.background.settled().await;
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}

impl fmt::Debug for PgSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSemaphore")
            .field("name", &self.inner.local.name())
            .field("limit_seen", &self.limit_seen())
            .field("held_here", &self.held_here())
            .field("closed", &self.is_closed())
            .finish()
    }
}
