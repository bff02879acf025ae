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
    /// Redis could not be reached, timed out or answered with an error.
    /// The semaphore fails closed: no permit is granted without Redis.
    Unavailable(redis::RedisError),
    /// [`close`](super::RedisSemaphore::close) was called on this handle.
    Closed,
    /// The lease was lost while [`RedisSemaphore::call`](super::RedisSemaphore::call)
    /// ran its work, which was dropped unfinished. The reason is the
    /// [`source`](std::error::Error::source).
    Lost(LostReason),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPermits { limit, .. } => {
                write!(f, "all {limit} leased permits are held")
            }
            Self::Unavailable(_) => f.write_str("redis is unavailable, no permit granted"),
            Self::Closed => f.write_str("the semaphore was closed"),
            Self::Lost(_) => f.write_str("the lease was lost, the call was dropped"),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) => Some(e),
            Self::Lost(reason) => Some(reason),
            _ => None,
        }
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
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overrun { by: Some(by) } => {
                write!(f, "the lease had expired {by:?} before it was released")
            }
            Self::Overrun { by: None } => f.write_str("the lease was lost before it was released"),
            Self::Unavailable(_) => f.write_str("redis is unavailable, lease not released"),
        }
    }
}

impl std::error::Error for ReleaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) => Some(e),
            Self::Overrun { .. } => None,
        }
    }
}

/// How a held lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal found the lease expired or gone in Redis (the holder was
    /// paused, or its renewals were late, past the time to live).
    Expired,
    /// The lease's local deadline (its time to live less the drift margin,
    /// from the last renewal sent) passed while a renewal had failed or was
    /// still unanswered: Redis unreachable or too slow, or this process
    /// paused while a renewal was in flight.
    Unreachable,
    /// The lease's local deadline passed before this process sent a
    /// renewal: it was paused (a stop-the-world pause, `SIGSTOP`), or the
    /// runtime that runs the lease keeper was blocked. Redis may hold the
    /// lease a little longer, but no one can count on it.
    Stalled,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "the lease expired in redis",
            Self::Unreachable => "redis was unreachable until the lease ran out",
            Self::Stalled => "the lease ran out before this process renewed it",
        })
    }
}

impl std::error::Error for LostReason {}

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
    /// The drift margin is not shorter than the lease's time to live.
    BadDriftMargin,
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
            Self::BadDriftMargin => {
                f.write_str("the drift margin must be shorter than the lease time to live")
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) => Some(e),
            _ => None,
        }
    }
}
