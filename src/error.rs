//! Errors returned by the semaphore, and how a permit leased from a
//! shared store was lost.

use core::fmt;

/// The error of an [`Acquire`](crate::futures::Acquire) future or a blocking
/// acquire: the semaphore was closed before the permits were granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireError(());

impl AcquireError {
    pub(crate) const fn closed() -> Self {
        Self(())
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("semaphore closed")
    }
}

impl std::error::Error for AcquireError {}

/// The error of [`Semaphore::try_acquire`](crate::Semaphore::try_acquire) and
/// its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryAcquireError {
    /// Not enough permits are available now, or (in fair mode) earlier
    /// acquirers are waiting in line.
    NoPermits,
    /// The semaphore was closed.
    Closed,
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoPermits => "no permits available",
            Self::Closed => "semaphore closed",
        })
    }
}

impl std::error::Error for TryAcquireError {}

impl From<AcquireError> for TryAcquireError {
    fn from(_: AcquireError) -> Self {
        Self::Closed
    }
}

/// How a permit leased from a shared store (the Redis backend) was lost
/// while it was held: the store may grant it to someone else, so work
/// guarded by it must stop.
///
/// # Examples
///
/// ```
/// use watertight::LostReason;
///
/// assert_eq!(
///     LostReason::Expired.to_string(),
///     "the lease expired in the shared store"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal found the lease expired or gone in the store (the holder
    /// was paused, or its renewals were late, past the time to live).
    Expired,
    /// The lease's local deadline (its time to live less the drift margin,
    /// from the last renewal sent) passed while a renewal had failed or was
    /// still unanswered: the store unreachable or too slow, or this process
    /// paused while a renewal was in flight.
    Unreachable,
    /// The lease's local deadline passed before this process sent a
    /// renewal: it was paused (a stop-the-world pause, `SIGSTOP`), or the
    /// runtime that runs the lease keeper was blocked. The store may hold
    /// the lease a little longer, but no one can count on it.
    Stalled,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "the lease expired in the shared store",
            Self::Unreachable => "the shared store was unreachable until the lease ran out",
            Self::Stalled => "the lease ran out before this process renewed it",
        })
    }
}

impl std::error::Error for LostReason {}
