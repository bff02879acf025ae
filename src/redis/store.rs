//! The Redis semaphore as a [`LeaseStore`](crate::lease::LeaseStore): what
//! the bulkhead over it asks, answered by the attempts of `attempt.rs`.

use core::future::Future;
use std::io;
use std::time::Duration;

use super::attempt::{self, Attempt, Busy, Down};
use super::{LeaseError, LeasedPermit, RedisSemaphore, ReleaseError};
use crate::RejectReason;
use crate::lease::{Local, Released, Store};

impl Store for RedisSemaphore {
    type Error = LeaseError;
    type Busy = Busy;
    type LimitError = redis::RedisError;
    type ReleaseError = ReleaseError;

    fn local(&self) -> &Local {
        &self.inner().local
    }

    fn try_acquire(&self) -> impl Future<Output = Result<LeasedPermit, LeaseError>> + Send {
        RedisSemaphore::try_acquire(self)
    }

    fn first_attempt(&self) -> impl Future<Output = Result<Attempt, LeaseError>> + Send {
        attempt::first_attempt(self.inner())
    }

    fn wait_from<'a>(
        &'a self,
        busy: Busy,
        down: &'a Down,
    ) -> impl Future<Output = Result<LeasedPermit, LeaseError>> + Send + 'a {
        attempt::wait_from(self.inner(), busy, down)
    }

    fn reason(e: &LeaseError) -> RejectReason {
        match e {
            LeaseError::NoPermits { .. } => RejectReason::Full,
            LeaseError::Closed => RejectReason::Closed,
            // Refused by Redis (rights, credentials, a failed script): the
            // permits cannot be reached either, and the bulkhead fails
            // closed.
            LeaseError::Unavailable(_)
            | LeaseError::Denied(_)
            | LeaseError::Auth(_)
            | LeaseError::Script(_) => RejectReason::Unavailable,
            // Not an acquire's error: only `call` reports it.
            LeaseError::Lost(_) => RejectReason::Unavailable,
            // Redis lost writes: the permits cannot be counted for a while.
            LeaseError::Quarantined { .. } => RejectReason::Unavailable,
            // Too few replicas have it: as unreachable as a primary alone.
            LeaseError::NotReplicated { .. } => RejectReason::Unavailable,
        }
    }

    fn silent(_max_wait: Duration) -> LeaseError {
        let silent = io::Error::new(
            io::ErrorKind::TimedOut,
            "redis did not answer within max_wait",
        );
        LeaseError::Unavailable(silent.into())
    }

    fn set_limit(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<(), redis::RedisError>> + Send {
        RedisSemaphore::set_limit(self, limit)
    }

    fn close(&self) {
        RedisSemaphore::close(self);
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.inner.spawner.spawn(task);
    }

    async fn release_lease(&self, id: &str) -> Result<Released, ReleaseError> {
        self.inner.release_id(id).await.map_err(ReleaseError::of)
    }

    fn overrun(by: Option<Duration>) -> ReleaseError {
        ReleaseError::Overrun { by }
    }
}
