//! Errors returned by the semaphore.

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
