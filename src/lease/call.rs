//! Work guarded by a lease: [`UntilLost`], which drops the work when the
//! lease is lost, and [`Completed`], what work that ran to its end reports.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{LeaseStore, LeasedPermit, Lost};
use crate::LostReason;

/// What a call that ran to its end returned, and whether its lease was
/// lost before it ended: the result of a leased semaphore's or bulkhead's
/// `call_to_end`.
///
/// # Examples
///
/// ```no_run
/// use watertight::redis::{Completed, RedisSemaphore};
///
/// # async fn demo(sem: RedisSemaphore) -> Result<(), Box<dyn std::error::Error>> {
/// let Completed { output, lost, .. } = sem.call_to_end(async { 42 }).await;
/// if let Some(reason) = lost {
///     // Another client may have held the permit for part of the call.
///     eprintln!("lease lost during the call: {reason}");
/// }
/// let answer = output?;
/// # let _ = answer;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completed<R> {
    /// What the call returned (for a call that was not granted a lease,
    /// the error saying so).
    pub output: R,
    /// How the lease was lost before the work ended, if it was: for part
    /// of the call, another client may have held the permit. `None` also
    /// when no lease was granted.
    pub lost: Option<LostReason>,
}

impl<R> Completed<R> {
    /// What the call returned, whether or not the lease was lost.
    pub fn into_output(self) -> R {
        self.output
    }
}

pin_project! {
    /// Polls the loss first, then the work: once the lease is lost, the
    /// work is not polled again.
    pub(crate) struct UntilLost<F> {
        #[pin]
        work: F,
        lost: Lost,
    }
}

impl<F> UntilLost<F> {
    pub(crate) fn new(work: F, lost: Lost) -> Self {
        Self { work, lost }
    }
}

impl<F: Future> Future for UntilLost<F> {
    type Output = Result<F::Output, LostReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(reason) = Pin::new(this.lost).poll(cx) {
            return Poll::Ready(Err(reason));
        }
        this.work.poll(cx).map(Ok)
    }
}

/// `work`, under the lease `acquired` granted (or its error), dropped
/// unfinished the moment the lease is lost: the body of a semaphore's
/// `call`. The permit is released when this ends.
pub(crate) async fn until_lost<S: LeaseStore, F: Future, E>(
    acquired: Result<LeasedPermit<S>, E>,
    work: F,
    lost: fn(LostReason) -> E,
) -> Result<F::Output, E> {
    let permit = acquired?;
    UntilLost::new(work, permit.lost()).await.map_err(lost)
}

/// `work` run to its end under the lease `acquired` granted (or its
/// error), with how the lease was lost meanwhile: the body of a
/// semaphore's `call_to_end`.
pub(crate) async fn to_end<S: LeaseStore, F: Future, E>(
    acquired: Result<LeasedPermit<S>, E>,
    work: F,
) -> Completed<Result<F::Output, E>> {
    let permit = match acquired {
        Ok(permit) => permit,
        Err(e) => {
            return Completed {
                output: Err(e),
                lost: None,
            };
        }
    };
    let output = work.await;
    Completed {
        output: Ok(output),
        lost: permit.lost_reason(),
    }
}

/// A leased semaphore's `call` and `call_to_end`, written once for the
/// Redis and the PostgreSQL semaphore over [`until_lost`] and [`to_end`]:
/// each waits as the semaphore's `acquire` does and fails with its
/// `$error`, whose `Lost` variant tells a call dropped for a lost lease.
/// The docs of `call` and of `call_to_end` are the backend's, each ended
/// by `;`.
macro_rules! leased_calls {
    (
        $error:ident;
        $(#[$call_doc:meta])* ;
        $(#[$to_end_doc:meta])* ;
    ) => {
        $(#[$call_doc])*
        pub async fn call<F: ::core::future::Future>(
            &self,
            work: F,
        ) -> Result<F::Output, $error> {
            $crate::lease::until_lost(self.acquire().await, work, $error::Lost).await
        }

        $(#[$to_end_doc])*
        pub async fn call_to_end<F: ::core::future::Future>(
            &self,
            work: F,
        ) -> $crate::lease::Completed<Result<F::Output, $error>> {
            $crate::lease::to_end(self.acquire().await, work).await
        }
    };
}

pub(crate) use leased_calls;
