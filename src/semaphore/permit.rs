//! The guards that hold permits and give them back on drop.

use core::fmt;
use std::sync::Arc;

use super::Semaphore;

/// Permits taken from a [`Semaphore`], given back when dropped.
///
/// # Examples
///
/// ```
/// use watertight::Semaphore;
///
/// let sem = Semaphore::new(3);
/// {
///     let _permit = sem.try_acquire_many(2).unwrap();
///     assert_eq!(sem.available_permits(), 1);
/// }
/// assert_eq!(sem.available_permits(), 3);
/// ```
///
/// A permit borrows its semaphore and cannot outlive it:
///
/// ```compile_fail
/// use watertight::{Permit, Semaphore};
///
/// let permit: Permit<'static> = {
///     let sem = Semaphore::new(1);
///     sem.try_acquire().unwrap()
/// };
/// ```
///
/// # Panics
///
/// Dropping the guard panics if giving its permits back would take the
/// balance above [`Semaphore::MAX_PERMITS`], which can only happen after
/// [`Semaphore::add_permits`] raised the balance close to that limit. The
/// permits are then lost, and the balance is left as it was. It also
/// panics if the waker of a waiter it serves panics, once every waiter is
/// served and woken; see [Wakers that panic](Semaphore#wakers-that-panic).
#[must_use = "dropping a permit gives its permits back at once"]
#[clippy::has_significant_drop]
pub struct Permit<'a> {
    sem: &'a Semaphore,
    permits: usize,
}

impl<'a> Permit<'a> {
    #[inline]
    pub(super) fn new(sem: &'a Semaphore, permits: usize) -> Self {
        Self { sem, permits }
    }

    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(4);
    /// assert_eq!(sem.try_acquire_many(3).unwrap().num_permits(), 3);
    /// ```
    pub fn num_permits(&self) -> usize {
        self.permits
    }

    /// The semaphore the permits came from.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// let permit = sem.try_acquire().unwrap();
    /// assert!(std::ptr::eq(permit.semaphore(), &sem));
    /// ```
    pub fn semaphore(&self) -> &'a Semaphore {
        self.sem
    }

    /// Drops the guard without giving the permits back. The semaphore's
    /// balance stays lower until someone calls
    /// [`Semaphore::add_permits`] (possibly another task: permits are
    /// tokens, not owned).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(2);
    /// sem.try_acquire().unwrap().forget();
    /// assert_eq!(sem.available_permits(), 1);
    /// sem.add_permits(1); // handed back by whoever finishes the work
    /// assert_eq!(sem.available_permits(), 2);
    /// ```
    pub fn forget(mut self) {
        self.permits = 0;
    }

    /// Moves `n` of this guard's permits into a new guard, or returns `None`
    /// (changing nothing) if it holds fewer than `n`.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(5);
    /// let mut permit = sem.try_acquire_many(5).unwrap();
    /// let two = permit.split(2).unwrap();
    /// assert_eq!((permit.num_permits(), two.num_permits()), (3, 2));
    /// assert!(permit.split(4).is_none());
    /// drop(two);
    /// assert_eq!(sem.available_permits(), 2);
    /// ```
    pub fn split(&mut self, n: usize) -> Option<Self> {
        self.permits = self.permits.checked_sub(n)?;
        Some(Self::new(self.sem, n))
    }

    /// Moves all of `other`'s permits into this guard.
    ///
    /// # Panics
    ///
    /// Panics if `other` belongs to another semaphore, or if the merged guard
    /// would hold more than [`Semaphore::MAX_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(3);
    /// let mut a = sem.try_acquire().unwrap();
    /// a.merge(sem.try_acquire_many(2).unwrap());
    /// assert_eq!(a.num_permits(), 3);
    /// ```
    #[track_caller]
    pub fn merge(&mut self, mut other: Self) {
        assert!(
            core::ptr::eq(self.sem, other.sem),
            "cannot merge permits that belong to different semaphores"
        );
        self.permits = merged(self.permits, other.permits);
        other.permits = 0;
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.sem.release(self.permits);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("permits", &self.permits)
            .field("semaphore", &(self.sem as *const Semaphore))
            .finish()
    }
}

/// Permits taken from an `Arc<Semaphore>`; `'static`, so they can move into
/// spawned tasks. Given back when dropped.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use watertight::Semaphore;
///
/// let sem = Arc::new(Semaphore::new(1));
/// let permit = sem.try_acquire_owned().unwrap();
/// std::thread::spawn(move || {
///     assert_eq!(permit.semaphore().available_permits(), 0);
/// })
/// .join()
/// .unwrap();
/// assert_eq!(sem.available_permits(), 1);
/// ```
///
/// # Panics
///
/// Dropping the guard panics if giving its permits back would take the
/// balance above [`Semaphore::MAX_PERMITS`], which can only happen after
/// [`Semaphore::add_permits`] raised the balance close to that limit. The
/// permits are then lost, and the balance is left as it was. It also
/// panics if the waker of a waiter it serves panics, once every waiter is
/// served and woken; see [Wakers that panic](Semaphore#wakers-that-panic).
#[must_use = "dropping a permit gives its permits back at once"]
#[clippy::has_significant_drop]
pub struct OwnedPermit {
    sem: Arc<Semaphore>,
    permits: usize,
}

impl OwnedPermit {
    #[inline]
    pub(super) fn new(sem: Arc<Semaphore>, permits: usize) -> Self {
        Self { sem, permits }
    }

    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(4));
    /// assert_eq!(sem.try_acquire_many_owned(3).unwrap().num_permits(), 3);
    /// ```
    pub fn num_permits(&self) -> usize {
        self.permits
    }

    /// The semaphore the permits came from.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(1));
    /// let permit = sem.try_acquire_owned().unwrap();
    /// assert!(Arc::ptr_eq(permit.semaphore(), &sem));
    /// ```
    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.sem
    }

    /// Drops the guard without giving the permits back; see
    /// [`Permit::forget`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(1));
    /// sem.try_acquire_owned().unwrap().forget();
    /// assert_eq!(sem.available_permits(), 0);
    /// ```
    pub fn forget(mut self) {
        self.permits = 0;
    }

    /// Moves `n` of this guard's permits into a new guard, or returns `None`
    /// if it holds fewer than `n`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(2));
    /// let mut permit = sem.try_acquire_many_owned(2).unwrap();
    /// let one = permit.split(1).unwrap();
    /// assert_eq!(one.num_permits(), 1);
    /// ```
    pub fn split(&mut self, n: usize) -> Option<Self> {
        self.permits = self.permits.checked_sub(n)?;
        Some(Self::new(self.sem.clone(), n))
    }

    /// Moves all of `other`'s permits into this guard.
    ///
    /// # Panics
    ///
    /// Panics if `other` belongs to another semaphore, or if the merged guard
    /// would hold more than [`Semaphore::MAX_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(2));
    /// let mut a = sem.try_acquire_owned().unwrap();
    /// a.merge(sem.try_acquire_owned().unwrap());
    /// assert_eq!(a.num_permits(), 2);
    /// ```
    #[track_caller]
    pub fn merge(&mut self, mut other: Self) {
        assert!(
            Arc::ptr_eq(&self.sem, &other.sem),
            "cannot merge permits that belong to different semaphores"
        );
        self.permits = merged(self.permits, other.permits);
        other.permits = 0;
    }
}

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        self.sem.release(self.permits);
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("permits", &self.permits)
            .field("semaphore", &Arc::as_ptr(&self.sem))
            .finish()
    }
}

/// The size of two merged guards, which must stay a valid request size.
#[track_caller]
fn merged(a: usize, b: usize) -> usize {
    match a.checked_add(b) {
        Some(sum) if sum <= Semaphore::MAX_PERMITS => sum,
        _ => panic!("a merged permit cannot hold more than Semaphore::MAX_PERMITS"),
    }
}
