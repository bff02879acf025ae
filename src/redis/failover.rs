//! Failover and data loss: what tells this process that Redis lost writes
//! although it was never granted anything (the epoch marker, a promoted
//! replica's replication id), and the optional `WAIT` on grants.
//!
//! # Implementation notes
//!
//! * **Epoch marker.** `…:epoch` holds a value written when a script
//!   found it missing, and again (ending in `:q`) by each quarantine that
//!   starts, and never expires. `build` reads it (writing it first if there
//!   is none); the acquire script compares it with the one this process
//!   saw: a different one not written by a quarantine starts the
//!   quarantine, one written by a quarantine that is over is adopted
//!   (`Failover::adopt`), so that one loss is one quarantine (see
//!   `scripts.rs`). It survives exactly what the data survives: a restart
//!   with AOF or RDB keeps it, a restart without persistence or a flush
//!   loses it. It is checked inside the acquire script, so no grant is made
//!   on a server that lost it to a client that had seen it.
//! * **Replication id.** A replica that is promoted takes a new
//!   `master_replid` and keeps its old primary's as `master_replid2`.
//!   Every `renew_every`, a task of its own reads `INFO
//!   replication` from the node that runs the semaphore's scripts (on a
//!   Cluster, the owner of the semaphore's slot, through a script: see
//!   `Conn::info_replication`); so does the first grant after a call
//!   failed for a transient reason or a cluster node's connection dropped
//!   (`Failover::suspect`), before it builds its arguments, so that a
//!   replica promoted during an outage is known before it grants
//!   anything; when the id changed and
//!   the new server's `master_replid2` is the id seen before, this is a
//!   promotion. Replication is asynchronous, so nothing proves the promoted
//!   replica had the last grants: the quarantine starts. A restart (with or
//!   without persistence) also changes `master_replid` (Redis 7.0 does not
//!   keep it), but not into a `master_replid2` equal to the old one: it is
//!   left to the epoch marker, which tells a restart that lost the data
//!   from one that did not. `run_id` changes at every restart, so it proves
//!   nothing by itself and is not read.
//! * **`WAIT`.** `WAIT n timeout` waits for the writes *of the connection it
//!   runs on*, and blocks that connection meanwhile: the script calls share
//!   one multiplexed connection, on which a `WAIT` would hold up every
//!   renewal and release behind it. With [`replicas`], grants get a
//!   connection of their own (with Sentinel a second connection to the
//!   primary, on a Cluster a second cluster connection), and `WAIT` is sent
//!   with the acquire script as one pipeline (`Call::invoke_then`): it runs
//!   right after the script on the connection that ran it (on a Cluster,
//!   the node: the pipeline is routed by the script's key and sent again
//!   whole after `MOVED`), even if that connection is replaced the moment
//!   after. Sent apart, it could run on a fresh connection, which wrote
//!   nothing, and count the grant acknowledged by replicas that never saw
//!   it. A retried grant extends its lease, a write after the grant, so
//!   the `WAIT` of the retry covers the grant too.
//!
//! [`replicas`]: super::RedisSemaphoreBuilder::replicas

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::conn::Conn;
use super::keys::Keys;
use super::replication::{is_promotion, parse_replication};

/// `KEYS[1]`: the epoch marker. Returns it, written first (the server's
/// `TIME`) if it is missing.
const EPOCH: &str = r"
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  local t = redis.call('TIME')
  epoch = t[1] .. '.' .. t[2]
  redis.call('SET', KEYS[1], epoch)
end
return epoch
";

/// What this process knows about the server's history.
pub(super) struct Failover {
    /// The epoch marker as last seen (empty with the quarantine off).
    pub(super) epoch: Mutex<Arc<str>>,
    /// The `master_replid` of the scripts' node as last read; `None`
    /// before the first read, or if `INFO` is refused.
    pub(super) replid: Mutex<Option<String>>,
    /// Set when a promotion was seen (here, or by the Sentinel backend as
    /// it switches to the new primary), until a script confirms that the
    /// quarantine started.
    pub(super) loss_known: Arc<AtomicBool>,
    /// Set when a call failed for a transient reason, or (on a Cluster) a
    /// connection to a node dropped: the server may come back as another,
    /// a replica promoted in its place. Until the replication id is read
    /// again, each grant reads it first (see [`Inner::check_identity`](super::inner::Inner::check_identity)).
    pub(super) suspect: Arc<AtomicBool>,
    /// `WAIT` on grants, if asked for.
    pub(super) replicas: Option<Replicas>,
}

/// [`RedisSemaphoreBuilder::replicas`](super::RedisSemaphoreBuilder::replicas).
pub(super) struct Replicas {
    pub(super) count: usize,
    pub(super) timeout: Duration,
    /// `WAIT count timeout`, sent in the acquire script's pipeline.
    pub(super) wait: redis::Cmd,
    /// The grants' own connection.
    pub(super) conn: Conn,
}

impl Replicas {
    pub(super) fn new(count: usize, timeout: Duration, conn: Conn) -> Self {
        let mut wait = redis::cmd("WAIT");
        wait.arg(count)
            .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        Self {
            count,
            timeout,
            wait,
            conn,
        }
    }
}

impl Failover {
    /// Reads (or writes) the epoch marker and the replication id, for
    /// `build`; with the quarantine off, neither.
    pub(super) async fn start(
        conn: &Conn,
        keys: &Keys,
        quarantine: bool,
        (loss_known, suspect): (Arc<AtomicBool>, Arc<AtomicBool>),
        replicas: Option<Replicas>,
    ) -> redis::RedisResult<Self> {
        let mut epoch = String::new();
        let mut replid = None;
        if quarantine {
            epoch = redis::Script::new(EPOCH)
                .key(&keys.epoch)
                .invoke_async(&mut conn.clone())
                .await?;
            // `INFO` needs `@dangerous`: a user without it only has the
            // epoch marker and the fence check.
            replid = replication_id(conn, &keys.epoch).await.ok().flatten();
        }
        Ok(Self {
            epoch: Mutex::new(epoch.into()),
            replid: Mutex::new(replid.map(|(id, _)| id)),
            loss_known,
            suspect,
            replicas,
        })
    }

    /// The epoch marker to send with an acquire.
    pub(super) fn epoch(&self) -> Arc<str> {
        self.epoch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `"1"` if a loss was seen that no script has quarantined yet.
    pub(super) fn loss_flag(&self) -> &'static str {
        match self.loss_known.load(Ordering::Acquire) {
            true => "1",
            false => "0",
        }
    }

    /// A call failed for a transient reason: the next grant first reads
    /// the server's identity (if there is one to compare with).
    pub(super) fn suspect(&self) {
        if !self.epoch().is_empty() {
            self.suspect.store(true, Ordering::Release);
        }
    }

    /// Whether the next grant reads the server's identity first.
    pub(super) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// Records the ids the server has now; `true` if they show a replica
    /// promoted in place of the server read before (the loss is then
    /// known, for the next acquire script).
    pub(super) fn saw(&self, now: (String, String)) -> bool {
        let promoted = {
            let mut seen = self.replid.lock().unwrap_or_else(PoisonError::into_inner);
            let promoted = seen.as_deref().is_some_and(|old| is_promotion(old, &now));
            *seen = Some(now.0);
            promoted
        };
        if promoted {
            self.loss_known.store(true, Ordering::Release);
        }
        promoted
    }

    /// An acquire answered that grants are quarantined, or that the loss
    /// this client would have found was (see `ACQUIRE`), with the marker
    /// the server has now: the loss is Redis's to know from here. The
    /// server's replication id is read afresh, not compared with the one
    /// read before the loss: a watch that reads it late would take the
    /// promotion behind that quarantine for a new one.
    pub(super) fn adopt(&self, epoch: Option<String>) {
        self.loss_known.store(false, Ordering::Release);
        *self.replid.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if let Some(epoch) = epoch.filter(|e| !e.is_empty()) {
            *self.epoch.lock().unwrap_or_else(PoisonError::into_inner) = epoch.into();
        }
    }
}

/// The `master_replid` and `master_replid2` of the node that runs the
/// scripts for the semaphore whose epoch marker is `epoch_key`, if it is a
/// primary (`None` for a replica: its ids are its primary's).
pub(super) async fn replication_id(
    conn: &Conn,
    epoch_key: &str,
) -> redis::RedisResult<Option<(String, String)>> {
    Ok(parse_replication(&conn.info_replication(epoch_key).await?))
}
