//! Errors of the Redis semaphore.
//!
//! As the Rust API guidelines ask, a variant that holds the `redis` crate's
//! error returns it from `source()` and does not repeat it in `Display`.

use core::fmt;
use std::time::Duration;

/// Why a lease was not granted.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseError {
    /// Every permit is leased ([`try_acquire`](super::RedisSemaphore::try_acquire)
    /// only; `acquire` waits instead).
    NoPermits {
        /// The time until the earliest lease expires, as Redis sees it: when
        /// a permit comes back at the latest if its holder crashed. `None`
        /// when no lease is held (a limit of zero).
        retry_after: Option<Duration>,
        /// The limit every client obeys, as stored in Redis.
        limit: usize,
    },
    /// Redis could not be reached, timed out, or is not serving for now
    /// (loading its data, failing over, busy with a script, out of
    /// memory): the errors a waiting `acquire` rides out for up to the
    /// builder's `outage_tolerance`. The semaphore fails closed: no permit
    /// is granted without Redis.
    Unavailable(redis::RedisError),
    /// [`close`](super::RedisSemaphore::close) was called on this handle.
    Closed,
    /// Redis refused the call for lack of rights (`NOPERM`): the user may
    /// not run `EVALSHA` or `SCRIPT LOAD`, a command the scripts use, or
    /// the semaphore's keys. Returned at once, never retried.
    Denied(redis::RedisError),
    /// Redis did not accept the credentials (`WRONGPASS`), or wants some
    /// and got none (`NOAUTH`). Returned at once, never retried.
    Auth(redis::RedisError),
    /// A script failed on the server (a runtime error, a key of the wrong
    /// type) or answered what this version does not expect. Returned at
    /// once, never retried.
    Script(redis::RedisError),
    /// Redis was found to have lost writes (a restart without persistence,
    /// a failover to a replica that was behind), and grants are refused
    /// for one lease time to live, to every client, so that leases it
    /// forgot cannot be granted twice: see
    /// [`quarantine`](super::RedisSemaphoreBuilder::quarantine).
    Quarantined {
        /// How long the quarantine has left, as Redis counts it.
        retry_after: Duration,
    },
    /// The lease was lost while [`RedisSemaphore::call`](super::RedisSemaphore::call)
    /// ran its work, which was dropped unfinished. The reason is the
    /// [`source`](std::error::Error::source).
    Lost(LostReason),
    /// The grant was made, but fewer replicas than
    /// [`replicas`](super::RedisSemaphoreBuilder::replicas) asks for
    /// acknowledged it within its timeout (`WAIT`), so a failover could
    /// lose it: it was released again (in the background; if Redis cannot
    /// be reached, it expires within its time to live). Returned at once,
    /// not retried.
    NotReplicated {
        /// How many replicas acknowledged the grant.
        acked: usize,
        /// How many were asked for.
        wanted: usize,
    },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPermits { limit, .. } => {
                write!(f, "all {limit} leased permits are held")
            }
            Self::Unavailable(_) => f.write_str("redis is unavailable, no permit granted"),
            Self::Closed => f.write_str("the semaphore was closed"),
            Self::Denied(_) => f.write_str("redis denied the semaphore's script call"),
            Self::Auth(_) => f.write_str("redis refused the credentials"),
            Self::Script(_) => f.write_str("the semaphore's script failed in redis"),
            Self::Lost(_) => f.write_str("the lease was lost, the call was dropped"),
            Self::Quarantined { retry_after } => write!(
                f,
                "redis lost writes; grants resume in {} ms",
                retry_after.as_millis()
            ),
            Self::NotReplicated { acked, wanted } => write!(
                f,
                "{acked} of {wanted} replicas acknowledged the grant; it was released"
            ),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) | Self::Denied(e) | Self::Auth(e) | Self::Script(e) => Some(e),
            Self::Lost(reason) => Some(reason),
            Self::NoPermits { .. }
            | Self::Closed
            | Self::Quarantined { .. }
            | Self::NotReplicated { .. } => None,
        }
    }
}

impl LeaseError {
    /// The error for a failed script call, by [`classify`].
    pub(super) fn of(e: redis::RedisError) -> Self {
        classify(&e).pick([Self::Unavailable, Self::Denied, Self::Auth, Self::Script])(e)
    }
}

/// What went wrong when a permit was given back.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The lease had expired (or was found lost) before it was released:
    /// for a while the guarded work ran without a permit, and another
    /// holder may have been granted it. `by` is how long ago it expired,
    /// when Redis still had the entry.
    Overrun {
        /// How long ago the lease expired, if known.
        by: Option<Duration>,
    },
    /// Redis could not be reached; the lease expires on its own within its
    /// time to live.
    Unavailable(redis::RedisError),
    /// Redis refused the release for lack of rights (`NOPERM`); the lease
    /// expires on its own within its time to live.
    Denied(redis::RedisError),
    /// Redis refused the credentials (`WRONGPASS`, `NOAUTH`); the lease
    /// expires on its own within its time to live.
    Auth(redis::RedisError),
    /// The release script failed on the server or answered what this
    /// version does not expect: whether the lease was removed is unknown
    /// (if not, it expires on its own within its time to live).
    Script(redis::RedisError),
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overrun { by: Some(by) } => {
                write!(f, "the lease had expired {by:?} before it was released")
            }
            Self::Overrun { by: None } => f.write_str("the lease was lost before it was released"),
            Self::Unavailable(_) => f.write_str("redis is unavailable, lease not released"),
            Self::Denied(_) => f.write_str("redis denied the release, lease not released"),
            Self::Auth(_) => f.write_str("redis refused the credentials, lease not released"),
            Self::Script(_) => f.write_str("the release script failed in redis"),
        }
    }
}

impl std::error::Error for ReleaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) | Self::Denied(e) | Self::Auth(e) | Self::Script(e) => Some(e),
            Self::Overrun { .. } => None,
        }
    }
}

impl ReleaseError {
    /// The error for a failed release call, by [`classify`].
    pub(super) fn of(e: redis::RedisError) -> Self {
        classify(&e).pick([Self::Unavailable, Self::Denied, Self::Auth, Self::Script])(e)
    }
}

pub use crate::error::LostReason;

/// A [`RedisSemaphoreBuilder`](super::RedisSemaphoreBuilder) setting that
/// cannot work.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name is empty or contains `{` or `}` (it is the keys' hash tag).
    BadName,
    /// The key prefix is empty or contains `{` or `}`: a brace before the
    /// name's hash tag would make Redis Cluster hash the keys apart (`x{}`
    /// puts each key of one semaphore on a slot of its own).
    BadKeyPrefix,
    /// The lease time to live is under 10 ms, or not a whole number of
    /// milliseconds Redis can store.
    BadLeaseTtl,
    /// The renewal interval is zero or not shorter than the lease's time
    /// to live less the drift margin (the lease would be counted as lost
    /// before its first renewal).
    BadRenewInterval,
    /// The limit is over [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    LimitTooLarge,
    /// No timer is available: enable the `tokio` or `smol` feature.
    NoTimer,
    /// Not called inside a tokio runtime, and the `smol` feature is off:
    /// the lease keeper has nowhere to run.
    NoRuntime,
    /// The first connection to Redis failed.
    Connect(redis::RedisError),
    /// Redis did not accept the credentials (`WRONGPASS`), or wants some
    /// and got none (`NOAUTH`).
    Auth(redis::RedisError),
    /// The user may not run the semaphore's scripts: `EVALSHA`, `SCRIPT
    /// LOAD`, or read and write the semaphore's keys (`NOPERM`).
    Denied(redis::RedisError),
    /// The user may not `PUBLISH` or `SUBSCRIBE` on the semaphore's
    /// channel, `{prefix}:{{name}}:wake` (Redis 7 gives new ACL users no
    /// channels). Grant it (`&bulkhead:*`), or build with
    /// [`pubsub(false)`](super::RedisSemaphoreBuilder::pubsub) to have
    /// waiters poll instead.
    ChannelDenied(redis::RedisError),
    /// The probe script failed on the server for another reason.
    Script(redis::RedisError),
    /// The drift margin is not shorter than the lease's time to live.
    BadDriftMargin,
    /// Wake-ups on a Redis Cluster are sharded pub/sub pushes, which the
    /// redis crate's cluster connection receives over RESP3 only: connect
    /// with `?protocol=3` in the node URLs (or
    /// `ClusterClientBuilder::use_protocol(ProtocolVersion::RESP3)`), or
    /// build with [`pubsub(false)`](super::RedisSemaphoreBuilder::pubsub)
    /// to have waiters poll instead.
    NeedsResp3(redis::RedisError),
    /// The server Sentinel named is not a primary: the `SentinelClient` was
    /// built for replicas (`SentinelServerType::Replica`).
    NotPrimary,
    /// [`replicas`](super::RedisSemaphoreBuilder::replicas) was given a
    /// zero timeout (`WAIT` would block for ever).
    BadReplicas,
    /// The Redis Cluster node that owns the semaphore's slot does not know
    /// `SPUBLISH` or `SSUBSCRIBE` (sharded pub/sub came with Redis 7.0, and
    /// an operator may have renamed or disabled the commands): wake-ups on
    /// a Cluster need them. Upgrade the nodes, or build with
    /// [`pubsub(false)`](super::RedisSemaphoreBuilder::pubsub) to have
    /// waiters poll instead.
    NoShardedPubSub(redis::RedisError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadName => f.write_str("the name must be non-empty and contain no '{' or '}'"),
            Self::BadKeyPrefix => {
                f.write_str("the key prefix must be non-empty and contain no '{' or '}'")
            }
            Self::BadLeaseTtl => f.write_str("the lease time to live must be at least 10 ms"),
            Self::BadRenewInterval => {
                f.write_str(
                "the renewal interval must be non-zero and shorter than the lease less the drift margin",
            )
            }
            Self::LimitTooLarge => f.write_str("the limit exceeds Semaphore::MAX_PERMITS"),
            Self::NoTimer => f.write_str("no timer: enable the `tokio` or `smol` feature"),
            Self::NoRuntime => f.write_str(
                "no runtime for the lease keeper: build inside a tokio runtime or enable `smol`",
            ),
            Self::Connect(_) => f.write_str("could not connect to redis"),
            Self::Auth(_) => f.write_str("redis refused the credentials"),
            Self::Denied(_) => f.write_str(
                "the redis user may not run the semaphore's scripts (EVALSHA, SCRIPT LOAD) \
                 on its keys",
            ),
            Self::ChannelDenied(_) => f.write_str(
                "the redis user may not publish or subscribe on the semaphore's channel: \
                 grant it, or build with pubsub(false) to poll",
            ),
            Self::Script(_) => f.write_str("the semaphore's probe script failed in redis"),
            Self::BadDriftMargin => {
                f.write_str("the drift margin must be shorter than the lease time to live")
            }
            Self::NeedsResp3(_) => f.write_str(
                "wake-ups on a redis cluster need RESP3 (`?protocol=3`): connect with it, \
                 or build with pubsub(false) to poll",
            ),
            Self::NotPrimary => f.write_str("the server sentinel named is not a primary"),
            Self::BadReplicas => f.write_str("waiting for replicas needs a non-zero timeout"),
            Self::NoShardedPubSub(_) => f.write_str(
                "wake-ups on a redis cluster need sharded pub/sub (SPUBLISH and SSUBSCRIBE, \
                 redis 7.0 or later), which the slot's node does not have: upgrade it, \
                 or build with pubsub(false) to poll",
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e)
            | Self::Auth(e)
            | Self::Denied(e)
            | Self::ChannelDenied(e)
            | Self::Script(e)
            | Self::NeedsResp3(e)
            | Self::NoShardedPubSub(e) => Some(e),
            _ => None,
        }
    }
}

impl ConfigError {
    /// The error for a failed call of `build`'s checks, by [`classify`]
    /// (`Connect` for one that did not reach Redis).
    pub(super) fn of(e: redis::RedisError) -> Self {
        match classify(&e) {
            Failure::Transient => Self::Connect(e),
            Failure::Denied => Self::Denied(e),
            Failure::Auth => Self::Auth(e),
            Failure::Script => Self::Script(e),
        }
    }
}

/// What a failed Redis call means for whoever made it (see [`classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// Redis is out of reach or not serving for now: retried, within the
    /// outage tolerance.
    Transient,
    /// The user lacks a right: fails at once.
    Denied,
    /// The credentials were refused or missing: fails at once.
    Auth,
    /// Anything else Redis answered: fails at once.
    Script,
}

impl Failure {
    /// Of an error type's variants for the four kinds (`Unavailable`,
    /// `Denied`, `Auth`, `Script`, in this order), the one for this kind.
    pub(super) fn pick<T>(
        self,
        variants: [fn(redis::RedisError) -> T; 4],
    ) -> fn(redis::RedisError) -> T {
        let [transient, denied, auth, script] = variants;
        match self {
            Self::Transient => transient,
            Self::Denied => denied,
            Self::Auth => auth,
            Self::Script => script,
        }
    }
}

/// Sorts a failed call into what is worth retrying and what is not.
///
/// | Redis said | `Failure` |
/// |---|---|
/// | no answer: I/O errors, dropped connections, timeouts, parse errors | `Transient` |
/// | `LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY`, `MOVED`, `ASK`, `OOM`, `MISCONF`, `NOREPLICAS`, `ERR max number of clients reached` | `Transient` |
/// | `NOSCRIPT` (still, after the redis crate loaded the script: the cache was emptied in between, or on a Cluster the load went to the nodes of a slot map that a failover had just changed) | `Transient` |
/// | `NOPERM`, `ERR The user executing the script can't …` | `Denied` |
/// | `WRONGPASS`, `NOAUTH`, a failed `AUTH` | `Auth` |
/// | anything else (`ERR` from a script, `WRONGTYPE`, an unexpected reply) | `Script` |
pub(super) fn classify(e: &redis::RedisError) -> Failure {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return Failure::Transient;
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => Failure::Auth,
        ErrorKind::Server(ServerErrorKind::NoPerm) => Failure::Denied,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::NoScript,
        )
        | ErrorKind::Io
        | ErrorKind::Parse
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel => Failure::Transient,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            let detail = e.detail().unwrap_or("");
            if detail.starts_with("The user executing the script can't") {
                Failure::Denied
            } else if detail.contains("Protocol error: unauthenticated") {
                // Redis refuses a command of more than 10 arguments from a
                // client that has not authenticated (every script call of
                // the semaphore has more) before it would answer `NOAUTH`.
                Failure::Auth
            } else if detail.starts_with("max number of clients reached") {
                Failure::Transient
            } else {
                Failure::Script
            }
        }
        ErrorKind::Extension => match e.code() {
            Some("NOAUTH" | "WRONGPASS") => Failure::Auth,
            Some("BUSY" | "OOM" | "MISCONF" | "NOREPLICAS" | "LOADING" | "MASTERDOWN") => {
                Failure::Transient
            }
            _ => Failure::Script,
        },
        _ => Failure::Script,
    }
}
