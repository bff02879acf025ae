//! Work guarded by a lease: [`RedisSemaphore::call`], which drops the work
//! when the lease is lost, and [`RedisSemaphore::call_to_end`], which lets
//! it finish and says so ([`Completed`](crate::lease::Completed)).
//! `RedisBulkhead` has the same two.

use super::error::LeaseError;
use super::semaphore::RedisSemaphore;
use crate::lease;

impl RedisSemaphore {
    lease::leased_calls! {
        LeaseError;
        /// Waits for a permit as [`acquire`](Self::acquire) does, runs `work`
        /// while it holds the lease, and drops the work unfinished the moment
        /// the lease is lost. The permit is then released in the background.
        ///
        /// The loss is the lease's local deadline passing (see
        /// [`LeasedPermit::is_lost`](super::LeasedPermit::is_lost)), found by
        /// the timer, or a renewal finding the lease gone; it is checked before
        /// each poll of the work, so the work is not polled once the lease is
        /// known lost. Work that must not stop half-way: use
        /// [`call_to_end`](Self::call_to_end).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// use watertight::redis::{LeaseError, RedisSemaphore};
        ///
        /// # async fn demo(sem: RedisSemaphore) {
        /// match sem.call(async { "report sent" }).await {
        ///     Ok(done) => println!("{done}"),
        ///     Err(LeaseError::Lost(reason)) => eprintln!("stopped: {reason}"),
        ///     Err(e) => eprintln!("no permit: {e}"),
        /// }
        /// # }
        /// ```
        ///
        /// # Errors
        ///
        /// [`LeaseError::Lost`] if the lease was lost before the work ended
        /// (the work was dropped); otherwise as for [`acquire`](Self::acquire).
        ///
        /// # Cancel safety
        ///
        /// Dropping the future drops the work and releases the lease (or the
        /// pending grant) in the background.
        ;

        /// Waits for a permit as [`acquire`](Self::acquire) does, runs `work`
        /// to its end while it holds the lease, and says whether the lease was
        /// lost before the work ended. The permit is then released in the
        /// background.
        ///
        /// For work that must not stop half-way: the caller learns afterwards
        /// that it may have overlapped with another holder (who holds a higher
        /// [fence](super::LeasedPermit::fence)), and can undo or check it.
        ///
        /// # Cancel safety
        ///
        /// As for [`call`](Self::call).
        ;
    }
}
