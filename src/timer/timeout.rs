//! Races a future against a timer's sleep.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::timer::Sleep;

/// The sleep finished first.
#[derive(Debug)]
pub(crate) struct Elapsed;

pin_project! {
    /// Resolves to the inner future's output, or to `Elapsed` once `sleep`
    /// completes. The inner future is polled first, so a result that is ready
    /// at the deadline wins.
    pub(crate) struct Timeout<F> {
        #[pin]
        inner: F,
        sleep: Sleep,
    }
}

impl<F> Timeout<F> {
    pub(crate) fn new(inner: F, sleep: Sleep) -> Self {
        Self { inner, sleep }
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}
