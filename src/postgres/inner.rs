//! The state every clone of a [`PgSemaphore`](super::PgSemaphore) shares,
//! and the calls it makes: one attempt at a grant, the wait between
//! attempts, releases, renewals.

use core::future::Future;
use core::pin::Pin;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio_postgres::Config;

use super::conn::Conn;
use super::error::{Failure, Kind, LeaseError};
use super::grants::Grants;
use super::sql;
use super::{LeasedPermit, PgSemaphore};
use crate::lease::{IdSource, Local, Released, Store};
use crate::timer::Timer;

/// The shortest pause before an attempt is made again while the database
/// cannot be reached; it doubles up to `max_poll`.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

pub(super) struct Inner {
    /// The name, the timer, the leases held, the limit seen, the close.
    pub(super) local: Local,
    pub(super) label: String,
    pub(super) conn: Conn,
    pub(super) grants: Arc<Grants>,
    pub(super) ids: IdSource,
    pub(super) runtime: tokio::runtime::Handle,
    /// What `build` checked.
    pub(super) settings: Settings,
}

/// What one attempt found.
pub(super) struct Reply {
    pub(super) fence: Option<u64>,
    pub(super) limit: usize,
    /// Until the earliest lease expires, if one is held.
    pub(super) next_expiry: Option<Duration>,
}

impl Inner {
    /// The state of a semaphore whose settings `build` checked. The id
    /// source, the grants and the connection are made here: they are this
    /// state's alone, and the connection listens on a channel named from
    /// the ids and hands the grants it hears to `grants`.
    pub(super) fn new(
        name: String,
        label: String,
        config: Config,
        schema: &str,
        timer: Arc<dyn Timer>,
        runtime: tokio::runtime::Handle,
        settings: Settings,
    ) -> Self {
        let ids = IdSource::new();
        let channel = format!("wt_{:016x}{:016x}", ids.random(), ids.random());
        let grants = Arc::new(Grants::default());
        let conn = Conn::new(
            config,
            channel,
            sql::Statements::new(schema),
            grants.clone(),
            timer.clone(),
            settings.response_timeout,
            runtime.clone(),
        );
        let limit = settings.limit;
        Self {
            local: Local::new(name.into(), timer, limit),
            label,
            conn,
            grants,
            ids,
            runtime,
            settings,
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.local.is_closed()
    }

    pub(super) fn close(&self) {
        self.local.mark_closed();
        self.grants.wake_all();
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.settings.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// One call of the `acquire` function for `id`; with `queue`, a busy
    /// answer keeps (or takes) the id's place in the line.
    async fn attempt(&self, id: &str, weight: i32, queue: bool) -> Result<Reply, Failure> {
        let reply = self
            .conn
            .bounded(async {
                let live = self.conn.live().await?;
                let row = live
                    .client
                    .query_one(
                        &live.acquire,
                        &[
                            &self.local.name(),
                            &id,
                            &self.conn.channel,
                            &self.label,
                            &weight,
                            &self.ttl_ms(),
                            &self.settings.fair,
                            &queue,
                        ],
                    )
                    .await?;
                let granted: bool = row.try_get(0)?;
                let fence: Option<i64> = row.try_get(1)?;
                let limit: i64 = row.try_get(2)?;
                let next_expiry: Option<i64> = row.try_get(4)?;
                Ok(Reply {
                    fence: fence.filter(|_| granted).map(|f| f.unsigned_abs()),
                    limit: usize::try_from(limit).unwrap_or(usize::MAX),
                    next_expiry: next_expiry.map(|ms| Duration::from_millis(ms.unsigned_abs())),
                })
            })
            .await?;
        self.local.saw_limit(reply.limit);
        Ok(reply)
    }

    /// The permit for a grant to `id` made by a call sent at `sent`.
    fn granted(self: &Arc<Self>, id: String, fence: u64, sent: Instant) -> LeasedPermit {
        let lease = self.local.held.granted(id, fence, sent, self.settings.life);
        let sem = PgSemaphore {
            inner: self.clone(),
        };
        LeasedPermit::new(sem, lease)
    }

    /// One attempt for `permits`, no waiting.
    pub(super) async fn try_acquire(
        self: &Arc<Self>,
        permits: u32,
    ) -> Result<LeasedPermit, LeaseError> {
        let mut waiter = self.waiter(permits, false)?;
        let sent = Instant::now();
        let reply = self
            .attempt(&waiter.id, waiter.weight, false)
            .await
            .map_err(Failure::lease)?;
        match reply.fence {
            Some(fence) => Ok(waiter.granted(fence, sent)),
            None => {
                // Not in line: nothing of it is left in the database.
                waiter.settled = true;
                too_heavy(permits, reply.limit)?;
                Err(LeaseError::NoPermits {
                    retry_after: reply.next_expiry,
                    limit: reply.limit,
                })
            }
        }
    }

    /// The first attempt of a waiting acquire for `permits`: a grant, or
    /// where the wait goes on from (the id, in line in fair mode, or the
    /// outage it met).
    pub(super) async fn first_attempt(
        self: &Arc<Self>,
        permits: u32,
    ) -> Result<Attempt, LeaseError> {
        let mut waiter = self.waiter(permits, true)?;
        let down = Down::default();
        Ok(match waiter.attempt(&down).await? {
            Some(permit) => Attempt::Granted(permit),
            None => Attempt::Busy(Busy {
                waiter,
                cause: down.take(),
            }),
        })
    }

    /// A new waiter for `permits` (`listens` when a grant may be notified
    /// to it), unless the handle is closed or `permits` is no weight the
    /// functions take (at least 1, at most what an `integer` holds).
    fn waiter(self: &Arc<Self>, permits: u32, listens: bool) -> Result<Waiter, LeaseError> {
        let weight = match i32::try_from(permits) {
            Ok(weight) if weight > 0 => weight,
            _ => {
                return Err(LeaseError::Weight {
                    permits,
                    limit: self.local.limit_seen(),
                });
            }
        };
        if self.is_closed() {
            return Err(LeaseError::Closed);
        }
        Ok(Waiter::new(self, weight, listens))
    }

    /// Waits after a busy first attempt: a pause until a grant is
    /// notified, the earliest lease expires, or `max_poll` passes, then
    /// another attempt, and so on. While the database cannot be reached,
    /// attempts go on with a growing pause for up to the outage
    /// tolerance; `down` holds the latest attempt's error meanwhile.
    pub(super) async fn wait_from(
        &self,
        busy: Busy,
        down: &Down,
    ) -> Result<LeasedPermit, LeaseError> {
        let Busy { mut waiter, cause } = busy;
        down.set(cause);
        loop {
            if let Some(permit) = waiter.notified().await {
                return Ok(permit);
            }
            if let Some(permit) = waiter.attempt(down).await? {
                return Ok(permit);
            }
        }
    }

    /// The limit stored in the database.
    pub(super) async fn read_limit(&self) -> Result<usize, Failure> {
        let limit: i64 = self
            .conn
            .bounded(async {
                let live = self.conn.live().await?;
                let row = live
                    .client
                    .query_one(&live.limit, &[&self.local.name()])
                    .await?;
                Ok(row.try_get(0)?)
            })
            .await?;
        Ok(usize::try_from(limit).unwrap_or(usize::MAX))
    }

    /// Gives `id` back: its lease, or its place in the line.
    pub(super) async fn release_id(&self, id: &str) -> Result<Released, Failure> {
        self.conn
            .bounded(async {
                let live = self.conn.live().await?;
                let row = live
                    .client
                    .query_one(&live.release, &[&self.local.name(), &id])
                    .await?;
                let outcome: i32 = row.try_get(0)?;
                let late: Option<i64> = row.try_get(1)?;
                Ok(match outcome {
                    0 => Released::InTime,
                    1 => Released::Late(Duration::from_millis(late.unwrap_or(0).unsigned_abs())),
                    _ => Released::Gone,
                })
            })
            .await
    }

    /// Renews `ids` in one call; returns those the database still had.
    pub(super) async fn renew(&self, ids: &[String]) -> Result<Vec<String>, Failure> {
        self.conn
            .bounded(async {
                let live = self.conn.live().await?;
                let rows = live
                    .client
                    .query(&live.renew, &[&self.local.name(), &ids, &self.ttl_ms()])
                    .await?;
                rows.iter()
                    .map(|row| row.try_get::<_, String>(0).map_err(Failure::from))
                    .collect()
            })
            .await
    }
}

/// The settings `build` checked.
pub(super) struct Settings {
    /// The limit to store if the database has none yet.
    pub(super) limit: usize,
    pub(super) lease_ttl: Duration,
    /// The time to live less the drift margin: how long after a grant or
    /// renewal was sent this process counts on the lease.
    pub(super) life: Duration,
    pub(super) renew_every: Duration,
    pub(super) max_poll: Duration,
    pub(super) outage_tolerance: Duration,
    /// How long the connection waits for any answer.
    pub(super) response_timeout: Duration,
    pub(super) fair: bool,
}

/// The error for `permits` over a limit of `limit`, which no release
/// could ever grant.
fn too_heavy(permits: u32, limit: usize) -> Result<(), LeaseError> {
    match usize::try_from(permits) {
        Ok(n) if n <= limit => Ok(()),
        _ => Err(LeaseError::Weight { permits, limit }),
    }
}

/// The outcome of a first attempt.
pub(super) type Attempt = crate::lease::Attempt<LeasedPermit, Busy>;

/// The latest attempt's error while the database cannot be reached.
pub(super) type Down = crate::lease::Down<LeaseError>;

/// Where a waiting acquire goes on from after a busy first attempt. `pub`
/// for the sealed `Store` trait's signatures; no one outside the crate can
/// name it.
#[allow(unreachable_pub)]
pub struct Busy {
    waiter: Waiter,
    /// The first attempt's error, if the database could not be reached.
    cause: Option<LeaseError>,
}

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Busy")
            .field("id", &self.waiter.id)
            .finish_non_exhaustive()
    }
}

/// A lease id on its way to a grant. Until it settles, the id may hold a
/// lease or a place in line in the database: dropped before that (its
/// acquire cancelled, or failed), it releases the id in the background,
/// which hands a permit granted to it meanwhile on.
struct Waiter {
    inner: Arc<Inner>,
    id: String,
    /// How many permits it asks for.
    weight: i32,
    settled: bool,
    /// When the ongoing outage began.
    down_since: Option<Instant>,
    backoff: Duration,
    /// When the latest attempt that found this waiter in line was sent: a
    /// grant notified after it was made later still, so its lease lives at
    /// least a time to live from then.
    in_line_since: Option<Instant>,
    /// How long to wait before the next attempt.
    pause: Duration,
}

impl Waiter {
    /// A new id for `weight` permits; `listens` when a grant may be
    /// notified to it.
    fn new(inner: &Arc<Inner>, weight: i32, listens: bool) -> Self {
        let id = inner.ids.next();
        if listens {
            inner.grants.wait_for(&id);
        }
        Self {
            inner: inner.clone(),
            id,
            weight,
            settled: false,
            down_since: None,
            backoff: FIRST_BACKOFF,
            in_line_since: None,
            pause: Duration::ZERO,
        }
    }

    /// The permit for the grant to this id made by a call sent at `sent`.
    fn granted(&mut self, fence: u64, sent: Instant) -> LeasedPermit {
        self.settled = true;
        self.inner.granted(self.id.clone(), fence, sent)
    }

    /// One attempt in line: the permit, or `None` to wait `pause` first.
    /// A transient failure is kept in `down` while the outage tolerance
    /// lasts, and returned once it is over.
    async fn attempt(&mut self, down: &Down) -> Result<Option<LeasedPermit>, LeaseError> {
        let inner = self.inner.clone();
        if inner.is_closed() {
            return Err(LeaseError::Closed);
        }
        let sent = Instant::now();
        match inner.attempt(&self.id, self.weight, true).await {
            Ok(reply) => {
                if let Some(fence) = reply.fence {
                    return Ok(Some(self.granted(fence, sent)));
                }
                // More than the limit (perhaps lowered meanwhile) can never
                // be granted: it leaves the line rather than block it.
                too_heavy(self.weight.unsigned_abs(), reply.limit)?;
                down.set(None);
                self.down_since = None;
                self.backoff = FIRST_BACKOFF;
                self.in_line_since = Some(sent);
                // A lease that expires without a release frees a permit
                // that nobody is told of: look again then.
                let expiry = reply.next_expiry.map(|d| d + Duration::from_millis(1));
                self.pause =
                    expiry.map_or(inner.settings.max_poll, |d| d.min(inner.settings.max_poll));
                Ok(None)
            }
            Err(failure) if failure.kind == Kind::Transient => {
                let since = *self.down_since.get_or_insert(sent);
                let end = since + inner.settings.outage_tolerance;
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(failure.lease());
                }
                down.set(Some(failure.lease()));
                self.pause = self.backoff.min(left);
                self.backoff = (self.backoff * 2).min(inner.settings.max_poll);
                Ok(None)
            }
            Err(failure) => Err(failure.lease()),
        }
    }

    /// Waits up to `pause` for a grant to be notified: its permit, or
    /// `None` when the pause ends, or early when the connection was made
    /// again or the handle closed (the next attempt then looks).
    async fn notified(&mut self) -> Option<LeasedPermit> {
        let inner = self.inner.clone();
        let mut sleep = inner.local.timer.sleep(self.pause);
        let round = inner.grants.round();
        let fence = loop {
            let mut listener = inner.grants.listen();
            if let Some(fence) = inner.grants.granted(&self.id) {
                break fence;
            }
            if inner.is_closed() || inner.grants.round() != round {
                return None;
            }
            let woken = poll_fn(|cx| {
                if Pin::new(&mut listener).poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                sleep.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if !woken {
                break inner.grants.granted(&self.id)?;
            }
        };
        // Without an attempt that found it in line, the grant's time is
        // unknown here: the next attempt finds the lease and renews it.
        let since = self.in_line_since?;
        Some(self.granted(fence, since))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.inner.grants.forget(&self.id);
        if !self.settled {
            // If the database cannot be reached, the lease or the place
            // in line expires within its time to live.
            let sem = PgSemaphore {
                inner: self.inner.clone(),
            };
            sem.release_in_background(self.id.clone());
        }
    }
}
