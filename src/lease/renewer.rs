//! The schedule of a renewer, the same for every store: a round of
//! renewals every `every`, or sooner when a lease's local deadline comes
//! first, until the last handle is gone or the store's handle stops it.

use core::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Runs `round` (which renews what the handle holds and returns the
/// earliest local deadline still counted on) after each `sleep`, which
/// sleeps for the pause given and says whether to go on. It holds only
/// `weak` between rounds, and ends once that is gone.
///
/// The pause is `every`, or until the earliest deadline if that is sooner:
/// a lease whose renewals keep failing is forgotten at its deadline, not a
/// round later. (It is lost at that instant whether this task runs or not:
/// see `Lease`.)
pub(crate) async fn renew_loop<T, S, R>(
    weak: Weak<T>,
    every: Duration,
    mut sleep: impl FnMut(Duration) -> S,
    mut round: impl FnMut(Arc<T>) -> R,
) where
    S: Future<Output = bool>,
    R: Future<Output = Option<Instant>>,
{
    let mut pause = every;
    loop {
        if !sleep(pause).await {
            return;
        }
        let Some(inner) = weak.upgrade() else { return };
        pause = match round(inner).await {
            Some(earliest) => every.min(earliest.saturating_duration_since(Instant::now())),
            None => every,
        }
        .max(Duration::from_millis(1));
    }
}
