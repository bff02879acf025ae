//! The state every clone of a [`PgSemaphore`](super::PgSemaphore) shares,
//! and the calls it makes: one attempt at a grant, the wait between
//! attempts, releases, renewals.

use core::future::Future;
use core::pin::Pin;
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::error::{Failure, Kind, LeaseError};
use super::grants::Grants;
use super::permit::LeasedPermit;
use crate::lease::{IdSource, Lease};
use crate::loom::lock;
use crate::timer::Timer;

/// The shortest pause before an attempt is made again while the database
/// cannot be reached; it doubles up to `max_poll`.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

pub(super) struct Inner {
    pub(super) name: String,
    pub(super) label: String,
    pub(super) conn: Conn,
    pub(super) grants: Arc<Grants>,
    pub(super) ids: IdSource,
    pub(super) timer: Arc<dyn Timer>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) lease_ttl: Duration,
    /// The time to live less the drift margin: how long after a grant or
    /// renewal was sent this process counts on the lease.
    pub(super) life: Duration,
    pub(super) renew_every: Duration,
    pub(super) max_poll: Duration,
    pub(super) outage_tolerance: Duration,
    pub(super) fair: bool,
    /// The leases this handle holds, by id: what the renewer renews.
    leases: Mutex<HashMap<String, Arc<Lease>>>,
    pub(super) limit_seen: AtomicUsize,
    closed: AtomicBool,
}

/// What one attempt found.
pub(super) struct Reply {
    pub(super) fence: Option<u64>,
    pub(super) limit: usize,
    /// Until the earliest lease expires, if one is held.
    pub(super) next_expiry: Option<Duration>,
}

/// How a release ended, as the database saw it.
pub(super) enum Released {
    InTime,
    Late(Duration),
    Gone,
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        name: String,
        label: String,
        conn: Conn,
        grants: Arc<Grants>,
        ids: IdSource,
        timer: Arc<dyn Timer>,
        runtime: tokio::runtime::Handle,
        settings: Settings,
    ) -> Self {
        Self {
            name,
            label,
            conn,
            grants,
            ids,
            timer,
            runtime,
            lease_ttl: settings.lease_ttl,
            life: settings.life,
            renew_every: settings.renew_every,
            max_poll: settings.max_poll,
            outage_tolerance: settings.outage_tolerance,
            fair: settings.fair,
            leases: Mutex::new(HashMap::new()),
            limit_seen: AtomicUsize::new(settings.limit),
            closed: AtomicBool::new(false),
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.grants.wake_all();
    }

    pub(super) fn lock_leases(&self) -> MutexGuard<'_, HashMap<String, Arc<Lease>>> {
        lock(&self.leases)
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// One call of the `acquire` function for `id`; with `queue`, a busy
    /// answer keeps (or takes) the id's place in the line.
    async fn attempt(&self, id: &str, queue: bool) -> Result<Reply, Failure> {
        let reply = self
            .conn
            .bounded(async {
                let live = self.conn.live().await?;
                let row = live
                    .client
                    .query_one(
                        &live.acquire,
                        &[
                            &self.name,
                            &id,
                            &self.conn.channel,
                            &self.label,
                            &1_i32,
                            &self.ttl_ms(),
                            &self.fair,
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
        self.limit_seen.store(reply.limit, Ordering::Relaxed);
        Ok(reply)
    }

    /// The permit for a grant to `id` made by a call sent at `sent`.
    fn granted(self: &Arc<Self>, id: String, fence: u64, sent: Instant) -> LeasedPermit {
        let lease = Arc::new(Lease::new(id.clone(), fence, sent, self.life));
        self.lock_leases().insert(id, lease.clone());
        LeasedPermit {
            inner: self.clone(),
            lease,
            done: false,
        }
    }

    /// One attempt, no waiting.
    pub(super) async fn try_acquire(self: &Arc<Self>) -> Result<LeasedPermit, LeaseError> {
        if self.is_closed() {
            return Err(LeaseError::Closed);
        }
        let id = self.ids.next();
        let mut pending = Pending::new(self, &id);
        let sent = Instant::now();
        let reply = self.attempt(&id, false).await.map_err(Failure::lease)?;
        pending.settled();
        match reply.fence {
            Some(fence) => Ok(self.granted(id.clone(), fence, sent)),
            None => Err(LeaseError::NoPermits {
                retry_after: reply.next_expiry,
                limit: reply.limit,
            }),
        }
    }

    /// Waits for a grant: an attempt, then a pause until a grant is
    /// notified, the earliest lease expires, or `max_poll` passes, and
    /// again. While the database cannot be reached, attempts go on with a
    /// growing pause for up to the outage tolerance.
    pub(super) async fn acquire(self: &Arc<Self>) -> Result<LeasedPermit, LeaseError> {
        if self.is_closed() {
            return Err(LeaseError::Closed);
        }
        let id = self.ids.next();
        let mut pending = Pending::new(self, &id);
        self.grants.wait_for(&id);
        let mut down_since: Option<Instant> = None;
        let mut backoff = FIRST_BACKOFF;
        // When the latest attempt that found this waiter in line was sent:
        // a grant notified after it was made later still, so its lease
        // lives at least a time to live from then.
        let mut in_line_since: Option<Instant> = None;
        loop {
            if self.is_closed() {
                return Err(LeaseError::Closed);
            }
            let sent = Instant::now();
            let pause = match self.attempt(&id, true).await {
                Ok(reply) => {
                    if let Some(fence) = reply.fence {
                        pending.settled();
                        return Ok(self.granted(id.clone(), fence, sent));
                    }
                    down_since = None;
                    backoff = FIRST_BACKOFF;
                    in_line_since = Some(sent);
                    // A lease that expires without a release frees a
                    // permit that nobody is told of: look again then.
                    let expiry = reply.next_expiry.map(|d| d + Duration::from_millis(1));
                    expiry.map_or(self.max_poll, |d| d.min(self.max_poll))
                }
                Err(failure) if failure.kind == Kind::Transient => {
                    let since = *down_since.get_or_insert(sent);
                    let left =
                        (since + self.outage_tolerance).saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(failure.lease());
                    }
                    let pause = backoff.min(left);
                    backoff = (backoff * 2).min(self.max_poll);
                    pause
                }
                Err(failure) => return Err(failure.lease()),
            };
            if let (Some(fence), Some(since)) = (self.notified(&id, pause).await, in_line_since) {
                pending.settled();
                return Ok(self.granted(id.clone(), fence, since));
            }
        }
    }

    /// Waits up to `pause` for a grant to `id` to be notified; `None` when
    /// the pause ends, or early when the connection was made again or the
    /// handle closed (the next attempt then looks).
    async fn notified(&self, id: &str, pause: Duration) -> Option<u64> {
        let mut sleep = self.timer.sleep(pause);
        let round = self.grants.round();
        loop {
            let mut listener = self.grants.listen();
            if let Some(fence) = self.grants.granted(id) {
                return Some(fence);
            }
            if self.is_closed() || self.grants.round() != round {
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
                return self.grants.granted(id);
            }
        }
    }

    /// The limit stored in the database.
    pub(super) async fn read_limit(&self) -> Result<usize, Failure> {
        let limit: i64 = self
            .conn
            .bounded(async {
                let live = self.conn.live().await?;
                let row = live.client.query_one(&live.limit, &[&self.name]).await?;
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
                    .query_one(&live.release, &[&self.name, &id])
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

    /// Releases `id` in a task of its own (a dropped permit or acquire):
    /// if the database cannot be reached, the lease or the place in line
    /// expires within its time to live.
    pub(super) fn release_in_background(self: &Arc<Self>, id: String) {
        let inner = self.clone();
        self.runtime.spawn(async move {
            let _ = inner.release_id(&id).await;
        });
    }

    /// Stops renewing `id`.
    pub(super) fn forget_lease(&self, id: &str) {
        self.lock_leases().remove(id);
    }

    /// Renews `ids` in one call; returns those the database still had.
    pub(super) async fn renew(&self, ids: &[String]) -> Result<Vec<String>, Failure> {
        self.conn
            .bounded(async {
                let live = self.conn.live().await?;
                let rows = live
                    .client
                    .query(&live.renew, &[&self.name, &ids, &self.ttl_ms()])
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
    pub(super) limit: usize,
    pub(super) lease_ttl: Duration,
    pub(super) life: Duration,
    pub(super) renew_every: Duration,
    pub(super) max_poll: Duration,
    pub(super) outage_tolerance: Duration,
    pub(super) fair: bool,
}

/// An id that may have a lease or a place in line in the database until
/// its acquire settles: dropped before that, it releases the id in the
/// background, and stops listening for its grant.
struct Pending<'a> {
    inner: &'a Arc<Inner>,
    id: &'a str,
    settled: bool,
}

impl<'a> Pending<'a> {
    fn new(inner: &'a Arc<Inner>, id: &'a str) -> Self {
        Self {
            inner,
            id,
            settled: false,
        }
    }

    /// The id's lease now belongs to a permit.
    fn settled(&mut self) {
        self.settled = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.inner.grants.forget(self.id);
        if !self.settled {
            self.inner.release_in_background(self.id.to_owned());
        }
    }
}
