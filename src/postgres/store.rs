//! The PostgreSQL semaphore as a [`LeaseStore`](crate::lease::LeaseStore):
//! what the bulkhead over it asks.

use core::future::Future;
use std::time::Duration;

use super::error::Failure;
use super::inner::{Attempt, Busy, Down};
use super::{LeaseError, LeasedPermit, PgSemaphore, ReleaseError};
use crate::RejectReason;
use crate::lease::{Local, Released, Store};

impl Store for PgSemaphore {
    type Error = LeaseError;
    type Busy = Busy;
    type LimitError = LeaseError;
    type ReleaseError = ReleaseError;

    fn local(&self) -> &Local {
        &self.inner.local
    }

    fn try_acquire(&self) -> impl Future<Output = Result<LeasedPermit, LeaseError>> + Send {
        self.inner.try_acquire(1)
    }

    fn first_attempt(&self) -> impl Future<Output = Result<Attempt, LeaseError>> + Send {
        self.inner.first_attempt(1)
    }

    fn wait_from<'a>(
        &'a self,
        busy: Busy,
        down: &'a Down,
    ) -> impl Future<Output = Result<LeasedPermit, LeaseError>> + Send + 'a {
        self.inner.wait_from(busy, down)
    }

    fn reason(e: &LeaseError) -> RejectReason {
        match e {
            LeaseError::NoPermits { .. } => RejectReason::Full,
            LeaseError::Closed => RejectReason::Closed,
            // Refused by the database (rights, credentials, a failed
            // statement): the permits cannot be reached either, and the
            // bulkhead fails closed.
            LeaseError::Unavailable(_)
            | LeaseError::Denied(_)
            | LeaseError::Auth(_)
            | LeaseError::Sql(_) => RejectReason::Unavailable,
            // Not an acquire's error: only `call` reports it.
            LeaseError::Lost(_) => RejectReason::Unavailable,
            // The bulkhead asks for one permit: a limit of zero.
            LeaseError::Weight { .. } => RejectReason::Full,
        }
    }

    fn silent(max_wait: Duration) -> LeaseError {
        Failure::silent(max_wait).lease()
    }

    fn set_limit(&self, limit: usize) -> impl Future<Output = Result<(), LeaseError>> + Send {
        PgSemaphore::set_limit(self, limit)
    }

    fn close(&self) {
        PgSemaphore::close(self);
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.inner.runtime.spawn(task);
    }

    async fn release_lease(&self, id: &str) -> Result<Released, ReleaseError> {
        self.inner.release_id(id).await.map_err(Failure::release)
    }

    fn overrun(by: Option<Duration>) -> ReleaseError {
        ReleaseError::Overrun { by }
    }
}
