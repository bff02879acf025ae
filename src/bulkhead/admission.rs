//! One call's admission as a named `'static` future that owns a handle of
//! the bulkhead: the tower layer's (`Admission`, or a classed caller's
//! `AdmissionAs`).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::sync::Arc;

use pin_project_lite::pin_project;

use super::error::{RejectReason, Rejected};
use super::options::CallOptions;
use super::permit::{Admitted, BulkheadPermit};
use super::seating;
use super::wait::{Line, Waiting};
use super::{Bulkhead, Shared};
use crate::futures::AcquireOwned;

impl Bulkhead {
    /// One call's admission as a named `'static` future that owns a handle
    /// of the bulkhead (for the tower layer's response future), with
    /// `options` as [`call_with`](Self::call_with) takes them: an
    /// [`Admission`], or for a classed caller on a bulkhead with priority
    /// classes, a [`seating::AdmissionAs`].
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn admission(&self, options: CallOptions) -> Admissions {
        if let Some(class) = self.classed(&options) {
            let classed = seating::AdmissionAs::new(self.shared.clone(), class, options);
            return Admissions::Classed(classed);
        }
        Admissions::Plain(Admission {
            shared: Some(self.shared.clone()),
            options: (!options.waits_plainly()).then_some(options),
            waiting: None,
        })
    }
}

/// One call's admission as [`Bulkhead::admission`] makes it: moved once
/// into the future that polls it, so the variants are not boxed.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Admissions {
    /// A plain call's.
    Plain(Admission),
    /// A classed caller's, on a bulkhead with priority classes.
    Classed(seating::AdmissionAs),
}

pin_project! {
    /// What `call` does before the call runs, as a future that owns a
    /// handle of the bulkhead instead of borrowing it, so that it is
    /// `'static` and can be named: the fast path (`admit_now`), else the
    /// wait under the policy, with the semaphore's owned acquire and the
    /// policy passed in at each poll. Resolves to the call's permit, owned
    /// by its guard and already reported as permitted, whose outcome is
    /// [`CallOutcome::Cancelled`] until set. Nothing is allocated.
    ///
    /// Dropping it while it waits leaves the line, as `call` does.
    pub(crate) struct Admission {
        // The bulkhead, until it moves into the permit; `None` once done.
        shared: Option<Arc<Shared>>,
        // The options of a call that has some, until the first poll has
        // looked at them (as `CallWith`'s).
        options: Option<CallOptions>,
        // The wait in line, once no permit was free at once; `None` again
        // when it ends. Its place in line is given back with `shared`'s
        // policy, by the drop if the wait did not end.
        #[pin]
        waiting: Option<Waiting<QueuedOwned>>,
    }

    impl PinnedDrop for Admission {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let (Some(shared), Some(waiting)) =
                (this.shared.as_deref(), this.waiting.as_mut().as_pin_mut())
            {
                waiting.leave(&shared.policy);
                // As `Queued` does: a permit handed to the acquire but never
                // delivered goes back through the semaphore.
                this.waiting.set(None);
                shared.left_line(false);
            }
        }
    }
}

impl Future for Admission {
    type Output = Result<BulkheadPermit, Rejected>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let shared = this
            .shared
            .as_deref()
            .expect("admission polled after completion");
        let out = if this.waiting.is_some() {
            ready!(poll_waiting(this.waiting.as_mut(), shared, cx))
        } else {
            let now = match this.options.take() {
                None => shared.admit_now(true),
                Some(options) => shared.admit_now_with_owned(&options, this.waiting.as_mut()),
            };
            match now {
                Some(now) => now,
                None => {
                    if this.waiting.is_none() {
                        let queued = QueuedOwned {
                            acquire: shared.sem.acquire_owned(),
                        };
                        this.waiting.set(Some(Waiting::new(queued)));
                    }
                    ready!(poll_waiting(this.waiting.as_mut(), shared, cx))
                }
            }
        };
        // Done either way: the handle moves into the permit, or goes.
        let shared = this.shared.take().expect("checked above");
        Poll::Ready(out.map(|admitted| {
            let class = shared.plain_class();
            BulkheadPermit::admitted(shared, class, admitted)
        }))
    }
}

/// Polls an [`Admission`]'s wait; once it ends, drops it (a rejected wait
/// gives its acquire back first, and `wait_idle` looks again, as on
/// `Queued`'s drop).
// Inline: its result, returned through memory, costs a store-forwarding
// stall on the tower layer's waiting path.
#[inline]
fn poll_waiting(
    mut waiting: Pin<&mut Option<Waiting<QueuedOwned>>>,
    shared: &Shared,
    cx: &mut Context<'_>,
) -> Poll<Result<Admitted, Rejected>> {
    let Some(wait) = waiting.as_mut().as_pin_mut() else {
        unreachable!("an admission polls its wait only while it waits");
    };
    let out = match wait.poll_with(cx, &shared.policy) {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(out) => out,
    };
    waiting.set(None);
    shared.left_line(out.is_ok());
    Poll::Ready(match out {
        Ok(((), waited)) => Ok(Admitted::Waited(waited)),
        Err(rejected) => Err(rejected),
    })
}

pin_project! {
    /// [`Queued`] for an [`Admission`]: the semaphore's owned acquire. What
    /// `Queued` does on drop, the admission does.
    pub(super) struct QueuedOwned {
        #[pin]
        acquire: AcquireOwned,
    }
}

impl Future for QueuedOwned {
    type Output = Result<(), RejectReason>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().acquire.poll(cx) {
            Poll::Pending => Poll::Pending,
            // The permit now belongs to the call; its guard gives it back.
            Poll::Ready(Ok(permit)) => {
                permit.forget();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_closed)) => Poll::Ready(Err(RejectReason::Closed)),
        }
    }
}

impl Shared {
    /// `admit_now_with` for an [`Admission`]: a
    /// call that is to wait gets its wait in `waiting` (with the limit its
    /// options left in its line), and `None`.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[cold]
    pub(super) fn admit_now_with_owned(
        &self,
        options: &CallOptions,
        mut waiting: Pin<&mut Option<Waiting<QueuedOwned>>>,
    ) -> Option<Result<Admitted, Rejected>> {
        let mut line = Line::default();
        let now = self.admit_now_with(options, &mut line);
        if now.is_none() {
            let queued = QueuedOwned {
                acquire: self.sem.acquire_owned(),
            };
            waiting.set(Some(Waiting::in_line(queued, line)));
        }
        now
    }
}
