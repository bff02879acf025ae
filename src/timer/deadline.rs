//! A deadline armed only once something waits for it: the bound on a wait
//! (`max_wait`) or on a running call (`call_timeout`), shared by the
//! bulkhead's policy and the keyed bulkhead.
//!
//! A [`Deadline`] starts empty and costs nothing. The first time it is
//! polled (which its owner does only once the future it bounds has
//! returned `Pending`), it makes a sleep of its [`Clock`] for the limit,
//! from that moment, and keeps it inline: with the bundled timers no
//! allocation and no timer entry is made for a future that finishes on its
//! first poll, and none is allocated for one that waits.

use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use pin_project_lite::pin_project;

use super::{Clock, ClockSleep, TimerGone};

pin_project! {
    /// A lazily armed deadline. See the [module notes](self).
    pub(crate) struct Deadline {
        #[pin]
        sleep: Option<ClockSleep>,
    }
}

impl Deadline {
    /// A deadline not yet armed.
    #[inline]
    pub(crate) const fn new() -> Self {
        Self { sleep: None }
    }

    /// Whether the deadline was armed (polled once already).
    #[inline]
    pub(crate) fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Arms the deadline for `limit` from now if it is not armed yet (later
    /// calls ignore `clock` and `limit`), then polls it: `Ready(Ok)` once
    /// the limit has passed, `Ready(Err)` if the timer cannot run (no
    /// clock, a tokio runtime without a time driver or one that is gone).
    #[inline]
    pub(crate) fn poll_at(
        self: Pin<&mut Self>,
        clock: Option<&Clock>,
        limit: Duration,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), TimerGone>> {
        let mut sleep = self.project().sleep;
        if sleep.is_none() {
            match clock.map_or(Err(TimerGone), |clock| clock.sleep(limit)) {
                Ok(armed) => sleep.set(Some(armed)),
                Err(gone) => return Poll::Ready(Err(gone)),
            }
        }
        match sleep.as_pin_mut() {
            Some(sleep) => sleep.poll_sleep(cx),
            None => Poll::Ready(Err(TimerGone)),
        }
    }
}
