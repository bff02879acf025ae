//! [`Spawner`]: where the semaphore's background tasks run.

use core::future::Future;

/// Where background work (renewals, pub/sub, releases of dropped permits)
/// runs: the tokio runtime the semaphore was built in, or smol's global
/// executor.
#[derive(Clone)]
pub(super) enum Spawner {
    #[cfg(feature = "tokio")]
    Tokio(tokio::runtime::Handle),
    #[cfg(feature = "smol")]
    Smol,
}

impl Spawner {
    pub(super) fn current() -> Option<Self> {
        #[cfg(feature = "tokio")]
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return Some(Self::Tokio(handle));
        }
        #[cfg(feature = "smol")]
        return Some(Self::Smol);
        #[allow(unreachable_code)]
        None
    }

    pub(super) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        match self {
            #[cfg(feature = "tokio")]
            Self::Tokio(handle) => {
                // A runtime that has shut down drops the task: the lease
                // then expires by itself.
                drop(handle.spawn(fut));
            }
            #[cfg(feature = "smol")]
            Self::Smol => smol::spawn(fut).detach(),
        }
    }
}
