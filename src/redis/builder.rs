//! [`RedisSemaphoreBuilder`]: the semaphore's settings, their validation,
//! and the connection and lease keeper that `build` starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use super::conn::{Backend, Conn, Settings};
use super::error::{ConfigError, Failure, classify};
use super::failover::{Failover, Replicas};
use super::inner::Inner;
use super::keeper;
use super::keys::Keys;
use super::scripts::Scripts;
use super::semaphore::RedisSemaphore;
use super::signals::Signals;
use super::spawn::Spawner;
use crate::lease::{IdSource, LeaseSettings, Local, Timing, default_label};
use crate::semaphore::Semaphore;

/// Configures a [`RedisSemaphore`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RedisSemaphoreBuilder {
    backend: Backend,
    name: String,
    lease: LeaseSettings,
    key_prefix: String,
    retries: usize,
    pubsub: bool,
    quarantine: bool,
    replicas: Option<(usize, Duration)>,
}

impl RedisSemaphore {
    /// Starts configuring the semaphore `name` on `backend`: a
    /// `redis::Client` for one server, a `redis::cluster::ClusterClient`
    /// (feature `redis-cluster`), or [`Backend::sentinel`] (feature
    /// `redis-sentinel`). Every process that uses the same name (and key
    /// prefix) on the same deployment shares its permits.
    pub fn builder(backend: impl Into<Backend>, name: impl Into<String>) -> RedisSemaphoreBuilder {
        RedisSemaphoreBuilder::new(backend.into(), name.into())
    }
}

impl RedisSemaphoreBuilder {
    /// The defaults, for [`RedisSemaphore::builder`].
    pub(super) fn new(backend: Backend, name: String) -> Self {
        Self {
            backend,
            name,
            lease: LeaseSettings::default(),
            key_prefix: "bulkhead".into(),
            retries: 2,
            pubsub: true,
            quarantine: true,
            replicas: None,
        }
    }

    // The settings every leased semaphore has: their setters are written
    // once (`lease_setters!`), their docs are Redis's.
    crate::lease::lease_setters! {
        /// The limit to install if Redis holds none for this semaphore yet
        /// (default 1). Once stored, the limit in Redis wins, and
        /// [`RedisSemaphore::set_limit`] changes it for every client.
        limit;
        /// How long a lease lives without renewal (default 30 s): a crashed
        /// holder's permit comes back after at most this long. At least 10 ms.
        lease_ttl;
        /// How often held leases are renewed (default: a third of the time to
        /// live less the [drift margin](Self::drift_margin)). All of a
        /// process's leases are renewed in one script call.
        renew_every;
        /// The longest a waiter sleeps between attempts when no wake-up comes
        /// through pub/sub (default 1 s): the safety net should a notification
        /// be lost.
        max_poll;
    }

    /// The prefix of every key (default `"bulkhead"`): the keys are
    /// `{prefix}:{{name}}:leases` and so on. Like the name, it must be
    /// non-empty and contain no `{` or `}` ([`ConfigError::BadKeyPrefix`]
    /// from `build`), so that the name is the keys' hash tag and one
    /// semaphore's keys share one Redis Cluster slot.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    crate::lease::lease_setters! {
        /// A label stored with each lease and shown by
        /// [`RedisSemaphore::holders`] (default: host name and process id).
        label;
        /// How long to wait for any answer from Redis before giving up on it
        /// (default 2 s).
        response_timeout;
    }

    /// How many times a grant that failed for a transient reason (a
    /// timeout, a dropped connection, Redis loading or failing over: its
    /// outcome may be unknown) is retried with the same permit id before
    /// the call fails with [`LeaseError::Unavailable`](super::LeaseError::Unavailable)
    /// (default 2). A refusal (`Denied`, `Auth`, `Script`) is never
    /// retried. In [`try_acquire`](RedisSemaphore::try_acquire), the
    /// retries fit in one [`response_timeout`](Self::response_timeout): a
    /// call that went unanswered for that long is not tried again.
    pub fn retries(mut self, retries: usize) -> Self {
        self.retries = retries;
        self
    }

    crate::lease::lease_setters! {
        /// How long a *waiting* [`acquire`](RedisSemaphore::acquire) keeps
        /// trying while Redis is unreachable (a restart, a failover) before it
        /// fails with [`LeaseError::Unavailable`](super::LeaseError::Unavailable)
        /// (default 5 s). Zero fails at the first unanswered attempt.
        /// The outage is counted from when the first failed call was sent, and
        /// no call or back-off runs past its end: a call still unanswered then
        /// is cut short. Only the call that opened the outage gets its whole
        /// [`response_timeout`](Self::response_timeout), so the acquire fails
        /// after at most the longer of the two.
        /// [`try_acquire`](RedisSemaphore::try_acquire) never waits: it fails
        /// once its `retries` are used up, or one `response_timeout` has
        /// passed, whichever is first.
        outage_tolerance;
        /// The timer for waits between attempts and for renewals (default:
        /// [`default_timer`](crate::timer::default_timer)).
        timer;
    }

    /// Whether waiters are woken through pub/sub (default `true`). With
    /// `false`, this process does not subscribe to the semaphore's channel,
    /// and `build` does not check that the user may: a waiter then looks
    /// again at the earliest lease deadline and at least every
    /// [`max_poll`](Self::max_poll), so a release elsewhere reaches it up
    /// to `max_poll` later. For a Redis user without rights on the channel
    /// (Redis 7 gives new ACL users none) who cannot be granted them.
    pub fn pubsub(mut self, enabled: bool) -> Self {
        self.pubsub = enabled;
        self
    }

    /// Whether grants stop for one lease time to live after Redis is found
    /// to have lost writes (default `true`).
    ///
    /// Redis that restarts without persistence, or a replica promoted
    /// before it received the last grants, forgets leases that their
    /// holders still count on, and would grant those permits again: more
    /// than `limit` holders at once, for up to one time to live. The
    /// acquire script notices when the fence counter is below a fence this
    /// process was granted; it then sets the counter back up (fences keep
    /// increasing) and refuses new grants to every client for one lease
    /// time to live, by when the forgotten leases have expired (or been
    /// renewed, which writes them back). Meanwhile `try_acquire` fails with
    /// [`LeaseError::Quarantined`](super::LeaseError::Quarantined), a
    /// waiting `acquire` waits, and a `RedisBulkhead` rejects as
    /// `Unavailable`.
    ///
    /// The loss is seen, whichever comes first, by: the next acquire of any
    /// client built before it, granted or not, which finds the semaphore's
    /// *epoch marker* (a key with no time to live) missing, or written since
    /// and not by a quarantine (the data set was lost); a check of `INFO replication`
    /// every [`renew_every`](Self::renew_every), which finds a promoted
    /// replica (its `master_replid2` is the id read before); the next
    /// acquire of a client that was granted a lost fence; a holder's next
    /// renewal, which finds its lease gone. A restart with persistence
    /// that kept the data keeps the marker and quarantines nothing; every
    /// promotion quarantines (nothing proves the replica had the last
    /// grants: see [`replicas`](Self::replicas)). One loss is one
    /// quarantine: the one that starts writes a new marker, and a client
    /// that finds it once that quarantine is over adopts it instead of
    /// starting another. Grants made before the
    /// loss is seen are not prevented (see the [distributed guide](crate::guide::distributed#what-it-does-not-guarantee-redis-losing-writes)). With
    /// `true`, `build` writes the marker if it is missing, and reads `INFO`
    /// (skipped if the user may not). With `false` nothing is looked at.
    pub fn quarantine(mut self, enabled: bool) -> Self {
        self.quarantine = enabled;
        self
    }

    /// Counts a grant only once `count` replicas acknowledged it, waiting
    /// for them for at most `timeout` (default: off).
    ///
    /// Redis replicates asynchronously: a primary that fails right after a
    /// grant may not have passed it on, and the replica promoted in its
    /// place does not know the lease (the [quarantine](Self::quarantine)
    /// covers that case once the promotion is seen). With this option,
    /// each acquire script call is followed by `WAIT count timeout`, sent
    /// with it as one pipeline (so it counts the writes of the connection
    /// that made the grant, even if that connection is replaced right
    /// after), on a connection the grants have to themselves (`WAIT` holds
    /// up the connection it runs on, and renewals and releases must not
    /// wait behind it). When fewer
    /// replicas acknowledge in time, the grant is released and the acquire
    /// fails with [`LeaseError::NotReplicated`](super::LeaseError::NotReplicated)
    /// at once (a waiting `acquire` too: waiting longer would not bring a
    /// replica back; retry when one is). A grant that waited for `count`
    /// replicas survives the promotion of any of them; `WAIT` does not
    /// make Redis strongly consistent (a replica that acknowledged may
    /// still lose the write if it restarts without persistence).
    ///
    /// Each acquire call then costs the replicas' lag (no more round trips
    /// to Redis), and may take up to `timeout` longer than without, a busy
    /// answer too when the replicas lag (also
    /// [`try_acquire`](RedisSemaphore::try_acquire), whose own bound of one
    /// [`response_timeout`](Self::response_timeout) covers the script call
    /// only). Renewals and releases do not wait. `count` 0 turns it off.
    ///
    /// Every backend: on one server and with Sentinel the `WAIT` runs on
    /// the primary, on a Redis Cluster on the primary that owns the
    /// semaphore's slot (the pipeline is routed by the script's key, and
    /// sent again whole after a `MOVED`), and counts that primary's
    /// replicas. With a zero `timeout`, `build` fails with
    /// [`ConfigError::BadReplicas`].
    pub fn replicas(mut self, count: usize, timeout: Duration) -> Self {
        self.replicas = (count > 0).then_some((count, timeout));
        self
    }

    crate::lease::lease_setters! {
        /// Whether waiters in every process are granted permits in arrival
        /// order (default `true`, as for the local
        /// [`Semaphore`](crate::semaphore::Semaphore)).
        ///
        /// Fair: a waiting [`acquire`](RedisSemaphore::acquire) that finds no
        /// permit free joins a line in Redis, and a release, an expired lease
        /// or a raised limit grants the line's head inside the same script,
        /// then tells only that waiter's process, on a channel of its own: a
        /// contended grant costs two script calls (the waiter's acquire and
        /// the holder's release) and one wake-up, and no process can starve
        /// another by asking more often. A waiter's entry is heartbeaten with
        /// this process's renewals; the entry of a process that stops (a
        /// crash) expires after one lease time to live, and the line moves on.
        ///
        /// Unfair (`false`, the behaviour before the line existed): waiters
        /// are not queued; every release publishes `free 1` to every process,
        /// whose waiters race to run the acquire script, so a process that
        /// asks again at once after releasing (barging) may take the permit
        /// before older waiters elsewhere. It saves the hop from the
        /// releaser to the waiter's process when one process does most of the
        /// work, at the price of more script calls per grant under contention
        /// and no bound on how long a waiter waits.
        ///
        /// Processes of both kinds may share a semaphore: every release serves
        /// the line first, and only the permits left over are raced for.
        /// [`try_acquire`](RedisSemaphore::try_acquire) never joins the line,
        /// and takes a permit only if nobody waits in it.
        fair;
        /// How much sooner than Redis this process stops counting on a lease
        /// (default: 1% of the time to live, at least 10 ms, at most a quarter
        /// of the time to live).
        ///
        /// A lease's local deadline is when the grant or the last successful
        /// renewal was *sent*, plus the time to live, less this margin; from
        /// that instant [`LeasedPermit::is_lost`](super::LeasedPermit::is_lost)
        /// is true. Redis starts the time to live when the call arrives, by its
        /// own clock rounded down to the millisecond, so the holder knows at
        /// least `margin - 1 ms` before Redis can grant the permit to anyone
        /// else, as long as the two clocks run at rates that differ by less
        /// than that over one time to live (NTP keeps them within 500 ppm: 15
        /// ms over 30 s) and Redis's wall clock is not stepped. Its
        /// [`Lost`](super::Lost) future and the work of
        /// [`RedisSemaphore::call`] are woken by the timer, which may be a
        /// millisecond or two late: leave room for that too.
        ///
        /// Must be shorter than the time to live ([`ConfigError::BadDriftMargin`]),
        /// and leave room for the renewals: `renew_every` must be shorter than
        /// the time to live less the margin ([`ConfigError::BadRenewInterval`]).
        drift_margin;
    }

    /// Connects, checks that the user may run the semaphore's scripts and
    /// use its channel, subscribes to wake-ups and starts the lease keeper
    /// on the current runtime (tokio if called inside one, else smol's
    /// global executor).
    ///
    /// The checks cost a few round trips: a probe script, sent as the
    /// scripts are (`EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again) with
    /// all the semaphore's keys, and, unless [`pubsub(false)`](Self::pubsub),
    /// on a connection of their own, a `PUBLISH` of a wake-up for no one
    /// (`free 0`) and a `SUBSCRIBE` (on a Redis Cluster: `SPUBLISH` and
    /// `SSUBSCRIBE`, on the cluster connection); with the
    /// [quarantine](Self::quarantine) on, the epoch marker is read (and
    /// written, if missing: the only write) and `INFO replication`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a setting that cannot work, a failed first
    /// connection ([`Connect`](ConfigError::Connect)), credentials Redis
    /// refuses ([`Auth`](ConfigError::Auth)), a user who may not run the
    /// scripts on the keys ([`Denied`](ConfigError::Denied)) or use the
    /// channel ([`ChannelDenied`](ConfigError::ChannelDenied)), a cluster
    /// client without RESP3 while pub/sub is on
    /// ([`NeedsResp3`](ConfigError::NeedsResp3)), a Cluster node without
    /// sharded pub/sub (Redis 6) while pub/sub is on
    /// ([`NoShardedPubSub`](ConfigError::NoShardedPubSub)), a Sentinel client for
    /// replicas ([`NotPrimary`](ConfigError::NotPrimary)), a
    /// [`replicas`](Self::replicas) setting that cannot work
    /// ([`BadReplicas`](ConfigError::BadReplicas)). None of them is
    /// retried.
    ///
    /// # Cancel safety
    ///
    /// Dropping it mid-way leaves no connection or task behind; what it may
    /// have written to Redis (the limit, if none was stored, and the epoch
    /// marker) is what every build writes.
    pub async fn build(self) -> Result<RedisSemaphore, ConfigError> {
        // Both are checked alike: the keys are `{prefix}:{{name}}:...`, and
        // the name in braces must be the first hash tag, so that one
        // semaphore's keys share one Cluster slot.
        let bad = |part: &str| part.is_empty() || part.contains(['{', '}']);
        if bad(&self.name) {
            return Err(ConfigError::BadName);
        }
        if bad(&self.key_prefix) {
            return Err(ConfigError::BadKeyPrefix);
        }
        let lease = self.lease;
        let Timing { life, renew_every } = lease.timing(
            Duration::from_millis(10),
            [
                ConfigError::BadLeaseTtl,
                ConfigError::BadDriftMargin,
                ConfigError::BadRenewInterval,
            ],
        )?;
        if lease.limit > Semaphore::MAX_PERMITS {
            return Err(ConfigError::LimitTooLarge);
        }
        let timer = match lease.timer {
            Some(t) => t,
            None => crate::timer::default_timer().ok_or(ConfigError::NoTimer)?,
        };
        if self
            .replicas
            .is_some_and(|(_, timeout)| timeout.as_millis() == 0)
        {
            return Err(ConfigError::BadReplicas);
        }
        let spawner = Spawner::current().ok_or(ConfigError::NoRuntime)?;
        let loss_known = Arc::new(AtomicBool::new(false));
        let suspect = Arc::new(AtomicBool::new(false));
        let settings = Settings {
            response_timeout: lease.response_timeout,
            pubsub: self.pubsub,
            timer: timer.clone(),
            spawner: spawner.clone(),
            wait: self.replicas.map(|(_, timeout)| timeout),
            loss_known: self.quarantine.then(|| loss_known.clone()),
            suspect: self.quarantine.then(|| suspect.clone()),
        };
        let connected = self.backend.connect(&settings).await?;
        let conn = connected.conn;
        let replicas = self.replicas.zip(connected.grant_conn);
        let base = format!("{}:{{{}}}", self.key_prefix, self.name);
        let keys = Keys {
            leases: format!("{base}:leases"),
            info: format!("{base}:info"),
            fence: format!("{base}:fence"),
            limit: format!("{base}:limit"),
            channel: format!("{base}:wake"),
            quarantine: format!("{base}:quarantine"),
            queue: format!("{base}:queue"),
            queue_beat: format!("{base}:queue:beat"),
            queue_info: format!("{base}:queue:info"),
            queue_seq: format!("{base}:queue:seq"),
            epoch: format!("{base}:epoch"),
        };
        let scripts = Scripts::new(connected.publish);
        check_scripts(&conn, &scripts, &keys).await?;
        let ids = IdSource::new();
        let token = format!("{:016x}", ids.random());
        let replicas = replicas.map(|((count, timeout), conn)| Replicas::new(count, timeout, conn));
        let flags = (loss_known, suspect);
        let failover = Failover::start(&conn, &keys, self.quarantine, flags, replicas)
            .await
            .map_err(ConfigError::of)?;
        if self.pubsub {
            // The channel the subscriber will keep (see `Inner::channel`).
            let channel = match lease.fair {
                true => format!("{}:{token}", keys.channel),
                false => keys.channel.clone(),
            };
            connected
                .subscriber
                .check(&channel, &*timer, lease.response_timeout)
                .await?;
        }
        let label = lease.label.unwrap_or_else(default_label);
        let signals = Arc::new(Signals::new(self.pubsub));
        let inner = Arc::new(Inner {
            local: Local::new(self.name.into(), timer, lease.limit),
            keys,
            conn,
            scripts,
            ttl: lease.lease_ttl,
            life,
            renew_every,
            max_poll: lease.max_poll,
            label,
            default_limit: lease.limit,
            retries: self.retries,
            outage_tolerance: lease.outage_tolerance,
            response_timeout: lease.response_timeout,
            spawner,
            signals,
            ids,
            fence_seen: AtomicU64::new(0),
            quarantine_ms: match self.quarantine {
                true => u64::try_from(lease.lease_ttl.as_millis()).unwrap_or(u64::MAX),
                false => 0,
            },
            failover,
            fair: lease.fair,
            token,
        });
        keeper::start(&inner, connected.subscriber, connected.publish, self.pubsub);
        Inner::start_watch(&inner);
        Ok(RedisSemaphore { inner })
    }
}

/// Runs the probe script: the user may run `EVALSHA` and `SCRIPT LOAD`,
/// and read and write the semaphore's keys.
async fn check_scripts(conn: &Conn, scripts: &Scripts, keys: &Keys) -> Result<(), ConfigError> {
    let probe: redis::RedisResult<i64> = keys
        .call_all(&scripts.probe)
        .invoke_async(&mut conn.clone())
        .await;
    match probe {
        Ok(_one) => Ok(()),
        // A client that has not authenticated may send no command of more
        // than 10 arguments (the probe has 13), and Redis closes its
        // connection: a `PING` (on the connection made again) gets the
        // server's own `NOAUTH` for the error. Either way it is `Auth`.
        Err(e) if e.detail().is_some_and(|d| d.contains("unauthenticated")) => {
            for _ in 0..3 {
                let ping: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut conn.clone()).await;
                match ping {
                    Err(noauth) if classify(&noauth) == Failure::Auth => {
                        return Err(ConfigError::of(noauth));
                    }
                    Err(_) => continue,
                    Ok(_) => break,
                }
            }
            Err(ConfigError::of(e))
        }
        Err(e) => Err(ConfigError::of(e)),
    }
}
