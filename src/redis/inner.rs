//! The state behind every clone of one `RedisSemaphore`, and what it does
//! on its own: release an id, watch the server's identity for lost writes,
//! pick the connection grants go through. The modules above it (the
//! acquire attempts, the keeper, the permits, the handle) work on it; it
//! imports none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;

use super::conn::Conn;
use super::error::{Failure, LeaseError, classify};
use super::failover::{Failover, replication_id};
use super::keys::Keys;
use super::scripts::{Call, Scripts};
use super::signals::Signals;
use super::spawn::Spawner;
use crate::lease::{IdSource, Local, Released};
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// The state behind every clone of one [`RedisSemaphore`](super::RedisSemaphore).
pub(super) struct Inner {
    /// The name, the timer, the leases held, the limit seen, the close.
    pub(super) local: Local,
    pub(super) keys: Keys,
    pub(super) conn: Conn,
    pub(super) scripts: Scripts,
    pub(super) ttl: Duration,
    /// The time to live less the drift margin: how long after sending a
    /// grant or renewal this process counts on the lease.
    pub(super) life: Duration,
    pub(super) renew_every: Duration,
    pub(super) max_poll: Duration,
    pub(super) label: String,
    pub(super) default_limit: usize,
    pub(super) retries: usize,
    pub(super) outage_tolerance: Duration,
    /// How long one call may go unanswered; also all that `try_acquire`
    /// spends on retries.
    pub(super) response_timeout: Duration,
    pub(super) spawner: Spawner,
    pub(super) signals: Arc<Signals>,
    pub(super) ids: IdSource,
    /// The highest fence this process was granted: a server whose counter
    /// is below it lost writes (see the acquire script's quarantine).
    pub(super) fence_seen: AtomicU64,
    /// The quarantine after such a loss, in ms (0: off).
    pub(super) quarantine_ms: u64,
    /// The other signs of a loss, and `WAIT` on grants.
    pub(super) failover: Failover,
    /// Whether a waiting acquire joins the fair line (see
    /// [`RedisSemaphoreBuilder::fair`](super::RedisSemaphoreBuilder::fair)).
    pub(super) fair: bool,
    /// This handle's suffix of its own channel, `{channel}:{token}`, where
    /// its waiters' grants are announced (hex digits).
    pub(super) token: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.signals.stop();
    }
}

impl Inner {
    /// Starts the watch of the replication id (with the quarantine on): a task
    /// of its own, so that a slow `INFO` never holds up a renewal. It holds
    /// only a weak reference, and stops within `renew_every` of the last
    /// handle's drop.
    pub(super) fn start_watch(inner: &Arc<Inner>) {
        if inner.quarantine_ms == 0 {
            return;
        }
        let weak = Arc::downgrade(inner);
        let (timer, every) = (inner.local.timer.clone(), inner.renew_every);
        inner.spawner.spawn(async move {
            loop {
                timer.sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                inner.watch_identity().await;
            }
        });
    }

    /// The channel this process subscribes to: its own in fair mode, where
    /// its waiters' grants are announced, else the shared one.
    pub(super) fn channel(&self) -> String {
        match self.fair {
            true => format!("{}:{}", self.keys.channel, self.token),
            false => self.keys.channel.clone(),
        }
    }

    /// What the release script found for `id`.
    pub(super) async fn release_id(&self, id: &str) -> redis::RedisResult<Released> {
        let mut call = Call::new(&self.scripts.release, &self.keys.all()[..10], 1);
        call.arg(id);
        let left: Option<i64> = call.invoke(&mut self.conn.clone()).await?;
        Ok(match left {
            None => Released::Gone,
            Some(ms) if ms > 0 => Released::InTime,
            Some(ms) => Released::Late(millis(-ms)),
        })
    }
}

impl Inner {
    /// The connection the acquire script runs on: the grants' own with
    /// `replicas`, else the shared one.
    pub(super) fn grant_conn(&self) -> Conn {
        match &self.failover.replicas {
            Some(r) => r.conn.clone(),
            None => self.conn.clone(),
        }
    }

    /// With `replicas`, after a grant: `acked` is the answer of the `WAIT`
    /// sent in the acquire script's pipeline. On too few replicas (or an
    /// error), the grant is not counted (the caller's pending id releases
    /// it).
    pub(super) fn replicated(&self, acked: Value) -> Result<(), LeaseError> {
        let Some(r) = &self.failover.replicas else {
            return Ok(());
        };
        let acked = acked
            .extract_error()
            .and_then(|v| Ok(redis::from_redis_value::<i64>(v)?))
            .map_err(LeaseError::of)?;
        let acked = usize::try_from(acked).unwrap_or(0);
        if acked < r.count {
            return Err(LeaseError::NotReplicated {
                acked,
                wanted: r.count,
            });
        }
        Ok(())
    }

    /// Every `renew_every` (see [`start_watch`](Self::start_watch)): reads the replication
    /// id, and starts the quarantine if the server is a promoted replica.
    async fn watch_identity(&self) {
        let f = &self.failover;
        let read = replication_id(&self.conn, &self.keys.epoch);
        let Ok(Ok(Some(now))) = Timeout::new(read, self.local.timer.sleep(self.renew_every)).await
        else {
            return;
        };
        f.suspect.store(false, Ordering::Release);
        // A promotion seen now, or a loss seen before whose quarantine has
        // not been written yet (its call ran out of time, as it may while
        // a Cluster client reads the slot map again): the quarantine is
        // written now, or tried again at the next look. An idle client
        // makes no acquire that would carry the loss flag, and the other
        // clients learn of the loss only from the quarantine key.
        let promoted = f.saw(now);
        if (promoted || f.loss_known.load(Ordering::Acquire)) && self.quarantine_now().await {
            f.loss_known.store(false, Ordering::Release);
        }
    }

    /// Before a grant after a transient failure (see `Failover::suspect`):
    /// reads the server's identity, so that a replica promoted while this
    /// client could not reach the old primary is known before it grants
    /// anything (the acquire script then starts the quarantine). A
    /// transient failure is returned (the grant is retried as if its own
    /// call had failed); `INFO` refused ends the check (there is nothing
    /// to read); a replica's answer (the slot map of a Cluster client not
    /// yet read again) leaves it for the next grant.
    pub(super) async fn check_identity(&self) -> redis::RedisResult<()> {
        let f = &self.failover;
        let read = replication_id(&self.conn, &self.keys.epoch);
        let r = Timeout::new(read, self.local.timer.sleep(self.response_timeout))
            .await
            .unwrap_or_else(|_elapsed| Err(super::conn::no_answer()));
        match r {
            Ok(Some(now)) => {
                f.suspect.store(false, Ordering::Release);
                f.saw(now);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) if classify(&e) == Failure::Transient => Err(e),
            Err(_) => {
                f.suspect.store(false, Ordering::Release);
                Ok(())
            }
        }
    }

    /// Starts the quarantine now (the quarantine script), waiting at most
    /// `renew_every` for the answer; `true` if Redis answered.
    pub(super) async fn quarantine_now(&self) -> bool {
        let mut call = self.keys.call_all(&self.scripts.quarantine);
        call.key(&self.keys.epoch)
            .arg(self.fence_seen.load(Ordering::Relaxed))
            .arg(self.quarantine_ms);
        let mut conn = self.conn.clone();
        let within = self.local.timer.sleep(self.renew_every);
        matches!(
            Timeout::new(call.invoke_async::<i64>(&mut conn), within).await,
            Ok(Ok(_))
        )
    }
}

/// A count of milliseconds from a script, as a duration (0 if negative).
pub(super) fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
