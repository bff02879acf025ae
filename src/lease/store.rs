//! The seam between the admission engine and a distributed store of
//! leased permits: what a [`LeasedBulkhead`](super::LeasedBulkhead) asks of
//! the Redis semaphore and of the PostgreSQL one. Everything else (the
//! policy, the wait in this process's line, the run, the guard) is the
//! engine's, written once.

use core::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{HeldLeases, LeasedPermit};
use crate::RejectReason;
use crate::loom::lock;
use crate::timer::Timer;

/// A semaphore whose permits are leases in a store shared by several
/// processes, which a [`LeasedBulkhead`](super::LeasedBulkhead) can guard
/// calls with: [`RedisSemaphore`](crate::redis::RedisSemaphore) (feature
/// `redis`) and [`PgSemaphore`](crate::postgres::PgSemaphore) (feature
/// `postgres`). Sealed: its methods are the crate's own.
pub trait LeaseStore: sealed::Store {}

impl<S: sealed::Store> LeaseStore for S {}

/// The outcome of a first attempt: a grant, or where the wait goes on from
/// (the same lease id, its place in the line, a listener registered before
/// the attempt ran). `pub` for the sealed trait's signatures, and
/// unreachable from outside the crate, as `Down` is.
#[allow(unreachable_pub)]
#[derive(Debug)]
pub enum Attempt<P, B> {
    Granted(P),
    Busy(B),
}

/// Why the latest attempt of a wait could not count the permits: the store
/// out of reach (the error it gave), or an attempt that failed for good.
/// Empty while the latest attempt found every permit leased. The bulkhead
/// reads it when the wait ends: `Unavailable` rather than `Timeout`, with
/// the error as the rejection's source.
#[derive(Debug)]
#[allow(unreachable_pub)]
pub struct Down<E>(Mutex<Option<E>>);

/// What a leased semaphore's handle (and its clones) keeps in this
/// process, whatever the store: its name, its timer, the leases it holds,
/// the limit it last read and whether it was closed. `pub` for the sealed
/// trait's signatures, and unreachable from outside the crate.
#[allow(unreachable_pub)]
pub struct Local {
    pub(crate) name: Arc<str>,
    pub(crate) timer: Arc<dyn Timer>,
    /// The leases held, by id: what the renewer renews.
    pub(crate) held: HeldLeases,
    limit_seen: AtomicUsize,
    closed: AtomicBool,
}

impl Local {
    pub(crate) fn new(name: Arc<str>, timer: Arc<dyn Timer>, limit_seen: usize) -> Self {
        Self {
            name,
            timer,
            held: HeldLeases::default(),
            limit_seen: AtomicUsize::new(limit_seen),
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The limit as the store last reported it.
    pub(crate) fn limit_seen(&self) -> usize {
        self.limit_seen.load(Ordering::Relaxed)
    }

    /// Notes the limit an answer of the store carried.
    pub(crate) fn saw_limit(&self, limit: usize) {
        self.limit_seen.store(limit, Ordering::Relaxed);
    }

    /// Marks the handle closed. Sequentially consistent, as the check in
    /// [`is_closed`](Self::is_closed): a waiter that registers for a
    /// wake-up and then checks sees the mark, or is woken by the close
    /// that follows it.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

impl core::fmt::Debug for Local {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Local")
            .field("name", &self.name)
            .field("held", &self.held.len())
            .field("limit_seen", &self.limit_seen())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// How a release ended, as the store saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)]
pub enum Released {
    /// The lease was unexpired and is now gone.
    InTime,
    /// The lease had expired this long ago (still stored, now removed).
    Late(Duration),
    /// Nothing was held under the id.
    Gone,
}

impl<E> Default for Down<E> {
    fn default() -> Self {
        Self(Mutex::new(None))
    }
}

impl<E> Down<E> {
    pub(crate) fn set(&self, cause: Option<E>) {
        *lock(&self.0) = cause;
    }

    /// Whether the latest attempt could not count the permits.
    pub(crate) fn is_down(&self) -> bool {
        lock(&self.0).is_some()
    }

    /// The error of the latest attempt that could not count the permits.
    pub(crate) fn take(&self) -> Option<E> {
        lock(&self.0).take()
    }
}

// The sealed half of the public traits: `pub` so that it may bound them,
// in a module no one outside the crate can name.
#[allow(unreachable_pub)]
pub(crate) mod sealed {
    use super::*;

    /// What the engine asks of a store. Public in a private module: the
    /// sealed half of [`LeaseStore`](super::LeaseStore).
    pub trait Store: Clone + core::fmt::Debug + Send + Sync + 'static {
        /// Why a lease was not granted.
        type Error: std::error::Error + Send + Sync + 'static;
        /// Where a waiting acquire goes on from after a busy first attempt.
        type Busy: Send;
        /// Why the limit could not be changed.
        type LimitError;
        /// Why a release went wrong.
        type ReleaseError;

        /// What the handle keeps in this process.
        fn local(&self) -> &Local;
        /// One attempt that does not join the line.
        fn try_acquire(
            &self,
        ) -> impl Future<Output = Result<LeasedPermit<Self>, Self::Error>> + Send;
        /// The first attempt of a waiting acquire.
        fn first_attempt(
            &self,
        ) -> impl Future<Output = Result<Attempt<LeasedPermit<Self>, Self::Busy>, Self::Error>> + Send;
        /// The wait after a busy first attempt, which keeps `down` up to
        /// date.
        fn wait_from<'a>(
            &'a self,
            busy: Self::Busy,
            down: &'a Down<Self::Error>,
        ) -> impl Future<Output = Result<LeasedPermit<Self>, Self::Error>> + Send + 'a;
        /// The rejection an acquire's error becomes.
        fn reason(e: &Self::Error) -> RejectReason;
        /// The error of a first attempt the store did not answer within
        /// `max_wait`.
        fn silent(max_wait: Duration) -> Self::Error;
        fn set_limit(
            &self,
            limit: usize,
        ) -> impl Future<Output = Result<(), Self::LimitError>> + Send;
        /// Closes the handle: [`Local::mark_closed`], and every waiter
        /// woken to see it.
        fn close(&self);
        /// Runs `task` where the store's background tasks run.
        fn spawn(&self, task: impl Future<Output = ()> + Send + 'static);
        /// Stops renewing the lease `id`.
        fn forget_lease(&self, id: &str) {
            self.local().held.forget(id);
        }
        /// Releases `id` in a task of its own (a dropped permit, an acquire
        /// dropped while a grant may exist): if the store cannot be
        /// reached, the lease expires within its time to live. The task
        /// counts as under way until it ends or is dropped unrun, and holds
        /// a handle, so the store outlives it.
        fn release_in_background(&self, id: String) {
            let started = self.local().held.background.start();
            let store = self.clone();
            self.spawn(async move {
                let _ = store.release_lease(&id).await;
                drop(started);
            });
        }
        /// Releases `id` and says how it ended.
        fn release_lease<'a>(
            &'a self,
            id: &'a str,
        ) -> impl Future<Output = Result<Released, Self::ReleaseError>> + Send + 'a;
        /// The error of a release that found the lease expired or lost.
        fn overrun(by: Option<Duration>) -> Self::ReleaseError;
    }
}
