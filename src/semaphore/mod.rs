//! The async counting semaphore.
//!
//! # Implementation notes
//!
//! All permit accounting lives in one atomic word (see [`state`]): the
//! balance of available permits, which may be negative, a `CLOSED` flag and
//! a `WAITERS` flag. Waiting acquirers sit in an intrusive FIFO list guarded
//! by a mutex; each list node (a [`Waiter`]) lives inside the acquire future
//! that owns it, so waiting allocates nothing.
//!
//! **Fast paths.** `try_acquire` and the first poll of `acquire` take
//! permits with one compare-and-swap when the balance covers them and, in
//! fair mode, `WAITERS` is clear. Dropping a permit is one CAS that adds
//! only while `WAITERS` is clear; if it is set, the release takes the lock.
//! No lock, no allocation when nobody waits.
//!
//! **The `WAITERS` invariant.** `WAITERS` is set and cleared only under the
//! lock, and whenever the lock is free it is set exactly when the list is
//! non-empty. A waiter sets it after linking itself and *then* reads the
//! balance, so a release either happened before (and its permits are seen)
//! or after (and it sees `WAITERS` and takes the lock). Every change of the
//! word is one read-modify-write on the same atomic, so there is no window
//! in which a release can be missed.
//!
//! **Hand-off.** Under the lock, a returned permit goes straight to the
//! waiters at the head of the line (after repaying any deficit), and
//! [`Semaphore::distribute`] moves permits from the balance to them (after
//! `add_permits`, or when a waiter queues or leaves). Either decrements the
//! head's `remaining` counter and, once that reaches zero, unlinks the head,
//! takes its waker and publishes `remaining = 0` with release ordering. From
//! that store on the node belongs to its future again. Wakers are woken
//! after the lock is released: a release that serves only the head wakes
//! that one waker directly, anything more collects them in a batch first.
//! The head may be served
//! in parts, so a large request is never starved by smaller ones behind it.
//! That is fair mode. With [`Semaphore::set_serve_newest`] on, the hand-off
//! serves the *tail* of the line instead whenever the permits at hand
//! cover its whole request (else the head, as before, in parts if need
//! be): one flag, read under the lock by the hand-off only, so the list
//! keeps arrival order and only the head is ever served in part.
//!
//! **Unfair mode** hands nothing over. Newcomers take permits from the
//! balance whenever it covers them, and [`Semaphore::distribute`] *wakes*
//! waiters from the head instead (each only when the balance, less the
//! permits already promised to woken waiters that have not run, covers its
//! whole request), marking them notified. A woken future competes for the
//! balance like a newcomer and, if it loses, goes back to the front of the
//! line. See `ARCHITECTURE.md` for why no wake-up is lost.
//!
//! **Cancellation.** A future dropped while linked unlinks itself under the
//! lock, gives back the permits it had been handed (requested minus
//! remaining) and runs `distribute`, so those permits reach the next waiters.
//! A future served or closed but not yet polled to completion gives its
//! permits back with an ordinary release; one woken to compete (unfair)
//! passes its wake-up on by running `distribute`.
//!
//! **Wakers that panic.** A waker is user code: its `wake`, `clone` or
//! `drop` may panic. None of them runs with the lock held (a future clones
//! its task's waker before it locks; a waker taken out of a node is woken
//! or dropped after unlocking), and each runs where the node's status and
//! the future's phase already say what the future owns. A future that took
//! permits but still has a waker to drop is marked granted first, so after
//! a panic there it still holds them: its next poll returns them, its drop
//! gives them back. An unfair waiter that was woken, lost the race and
//! panics cloning its waker to queue again passes its wake-up on. A batch
//! ([`WakeList`]) wakes each waker under `catch_unwind`, finishes the batch
//! and the batches after it, and only then resumes the first panic: it
//! reaches the caller whose call ran the waker (a poll, `add_permits`,
//! `close`, dropping a permit or a future), and no other waiter is left
//! unwoken. If that caller is already unwinding from a panic of its own
//! (a permit dropped during a panic), the waker's panic is dropped instead:
//! a second one would abort the process.

mod acquire;
mod permit;
mod release;
pub(crate) mod state;
mod wake_list;

pub use acquire::{Acquire, AcquireOwned};
pub use permit::{OwnedPermit, Permit};

use core::fmt;
use std::sync::Arc;

use acquire::Waiter;
use state::{CLOSED, WAITERS, balance, units};

use crate::error::TryAcquireError;
use crate::list::List;
use crate::loom::{AtomicBool, AtomicUsize, Mutex, Ordering, lock};
use wake_list::WakeList;

/// An async counting semaphore: fair by default, weighted, safe to cancel,
/// usable from any executor and from plain threads.
///
/// A semaphore holds a balance of permits. [`acquire`](Self::acquire) waits
/// until a permit can be taken and returns a [`Permit`] guard that gives it
/// back when dropped. Permits are tokens, not ownership: they can be
/// [forgotten](Permit::forget) by one task and put back by another with
/// [`add_permits`](Self::add_permits), and the balance can be pushed below
/// zero with [`reduce_permits`](Self::reduce_permits), after which acquirers
/// wait until enough permits have come back. This follows
/// `java.util.concurrent.Semaphore`.
///
/// # Fairness
///
/// A semaphore made with [`new`](Self::new) is strictly first in, first out:
/// no acquire (not even [`try_acquire`](Self::try_acquire)) takes permits
/// while an earlier acquirer waits, and a waiter that asks for many permits
/// collects them as they come back, holding smaller requests behind it, so
/// weighted requests cannot starve. Released permits go straight to the
/// waiters.
///
/// A semaphore made with [`new_unfair`](Self::new_unfair) behaves like
/// Java's non-fair semaphore: returned permits go back to the balance, not
/// to a waiter, and an acquirer that arrives while others wait takes them if
/// enough are available. A release wakes the waiters at the head of the line
/// that the returned permits could serve, in order; each woken waiter then
/// competes for the permits when it runs, and if a newcomer got there first
/// it goes back to the front of the line and is woken by the next release.
/// This raises throughput under contention (a task that returns a permit and
/// asks again at once does not have to queue behind the waiter it woke), at
/// the cost of fairness: a waiter can lose that race repeatedly, and one
/// that asks for several permits is woken only when all of them are
/// available, so newcomers taking permits one at a time can starve it.
///
/// # Wakers that panic
///
/// A waker that panics (in `wake`, `clone` or `drop`) loses no permit and
/// strands no other waiter: the semaphore finishes what it was doing, wakes
/// everyone else it served, closed or woken, and then resumes the panic in
/// the call that ran the waker (a poll, [`add_permits`](Self::add_permits),
/// [`close`](Self::close), or dropping a permit or an acquire future). A
/// future whose poll panicked after it took permits still holds them: its
/// next poll returns them, and dropping it gives them back. When that call
/// is a drop during a panic's unwinding, the waker's panic is dropped, as a
/// second panic would abort the process.
///
/// # Examples
///
/// ```
/// use watertight::Semaphore;
///
/// # futures::executor::block_on(async {
/// let sem = Semaphore::new(2);
/// let a = sem.acquire().await.unwrap();
/// let b = sem.try_acquire().unwrap();
/// assert!(sem.try_acquire().is_err());
/// drop(a);
/// assert_eq!(sem.available_permits(), 1);
/// # drop(b);
/// # });
/// ```
pub struct Semaphore {
    /// Balance and flags; see the [`state`] module.
    state: AtomicUsize,
    /// The waiting acquirers, oldest first. The mutex *must* be held to touch
    /// the list, any linked node's links or waker, or to set or clear
    /// `WAITERS` in `state`.
    waiters: Mutex<List<Waiter>>,
    /// A copy of the list's length, written under the lock, read without it.
    queued: AtomicUsize,
    /// Unfair mode only: the permits asked for by waiters that were unlinked
    /// and woken to compete for the balance but have not polled (or been
    /// dropped) since. A release wakes a waiter only for permits beyond
    /// these, so one permit does not wake a crowd. Raised under the lock,
    /// lowered by the woken future without it.
    notified: AtomicUsize,
    /// The state word's flags that stop a newcomer from taking permits
    /// without the lock: `CLOSED`, and `WAITERS` too in fair mode (so the
    /// fast path tests both with one instruction).
    stops: usize,
    /// Fair mode: hand permits to the newest waiter first
    /// ([`set_serve_newest`](Self::set_serve_newest)). Read only by the
    /// hand-off, under the lock; written without it (either value keeps
    /// every invariant, so no order with other events matters).
    newest: AtomicBool,
}

/// The body of `Semaphore::with_fairness`, which is `const` but for
/// loom, whose primitives are not.
macro_rules! new_semaphore {
    ($permits:expr, $fair:expr) => {{
        assert!(
            $permits <= Semaphore::MAX_PERMITS,
            "a semaphore cannot hold more than MAX_PERMITS permits"
        );
        Semaphore {
            state: AtomicUsize::new(units($permits)),
            waiters: Mutex::new(List::new()),
            queued: AtomicUsize::new(0),
            notified: AtomicUsize::new(0),
            stops: if $fair { CLOSED | WAITERS } else { CLOSED },
            newest: AtomicBool::new(false),
        }
    }};
}

impl Semaphore {
    /// The most permits a semaphore can hold available at once, and the most
    /// a single acquire can ask for.
    pub const MAX_PERMITS: usize = state::MAX_PERMITS;

    /// Creates a fair (strictly FIFO) semaphore with `permits` permits.
    ///
    /// # Panics
    ///
    /// Panics if `permits` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// static LIMIT: Semaphore = Semaphore::new(4);
    /// assert_eq!(LIMIT.available_permits(), 4);
    /// assert!(LIMIT.is_fair());
    /// ```
    #[cfg(not(loom))]
    pub const fn new(permits: usize) -> Semaphore {
        Self::with_fairness(permits, true)
    }

    /// Creates a semaphore with `permits` permits in which newcomers may take
    /// available permits ahead of waiters (see [Fairness](Self#fairness)).
    ///
    /// # Panics
    ///
    /// Panics if `permits` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new_unfair(1);
    /// assert!(!sem.is_fair());
    /// ```
    #[cfg(not(loom))]
    pub const fn new_unfair(permits: usize) -> Semaphore {
        Self::with_fairness(permits, false)
    }

    #[cfg(not(loom))]
    const fn with_fairness(permits: usize, fair: bool) -> Semaphore {
        new_semaphore!(permits, fair)
    }

    /// Loom's primitives are not `const`.
    #[cfg(loom)]
    pub fn new(permits: usize) -> Semaphore {
        Self::with_fairness(permits, true)
    }

    /// Loom's primitives are not `const`.
    #[cfg(loom)]
    pub fn new_unfair(permits: usize) -> Semaphore {
        Self::with_fairness(permits, false)
    }

    #[cfg(loom)]
    fn with_fairness(permits: usize, fair: bool) -> Semaphore {
        new_semaphore!(permits, fair)
    }

    /// Whether this semaphore is strictly FIFO (made with [`new`](Self::new)).
    pub fn is_fair(&self) -> bool {
        self.fair()
    }

    /// Whether newcomers must queue behind waiters.
    #[inline]
    pub(super) fn fair(&self) -> bool {
        self.stops & WAITERS != 0
    }

    /// Serves the newest waiter first (`true`) or the oldest (`false`, the
    /// default): adaptive LIFO, for a line whose oldest callers have likely
    /// given up. May be switched at any time; it decides only who the next
    /// hand-off serves, so waiters keep their places and switching back
    /// serves the oldest first again.
    ///
    /// While on, a fair semaphore hands the permits that come back to the
    /// waiter that joined the line last, if they cover all it still needs;
    /// if they do not (a weighted request larger than what came back), they
    /// go to the oldest waiter as in FIFO mode, in parts if need be. So, as
    /// in FIFO mode, only the oldest waiter ever holds permits handed to it
    /// in part; but while newer waiters are served, those permits wait with
    /// it, and it collects the rest only from a release that cannot serve
    /// the newest waiter in full. Newcomers still queue while anyone waits
    /// ([`try_acquire`](Self::try_acquire) refuses), and a waiter dropped
    /// after it was served passes its permits on in the current order.
    ///
    /// Serving the newest first can leave the oldest waiting for as long as
    /// newcomers keep coming: bound the wait (the bulkhead's
    /// [`adaptive_lifo`](crate::BulkheadBuilder::adaptive_lifo) turns this
    /// on only while its line stands, where waits are cut to a target).
    ///
    /// An unfair semaphore ([`new_unfair`](Self::new_unfair)) hands nothing
    /// over, so there this changes nothing: a release wakes the oldest
    /// waiters to compete for the permits, and newcomers may take them
    /// first anyway.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// let held = sem.try_acquire().unwrap();
    /// let cx = &mut Context::from_waker(Waker::noop());
    /// let mut oldest = pin!(sem.acquire());
    /// let mut newest = pin!(sem.acquire());
    /// assert!(oldest.as_mut().poll(cx).is_pending());
    /// assert!(newest.as_mut().poll(cx).is_pending());
    ///
    /// sem.set_serve_newest(true);
    /// drop(held);
    /// let served = newest.as_mut().poll(cx); // holds the permit
    /// assert!(served.is_ready());
    /// assert!(oldest.as_mut().poll(cx).is_pending());
    /// ```
    pub fn set_serve_newest(&self, on: bool) {
        self.newest.store(on, Ordering::Relaxed);
    }

    /// Whether the newest waiter is served first
    /// ([`set_serve_newest`](Self::set_serve_newest)).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// assert!(!sem.serves_newest());
    /// sem.set_serve_newest(true);
    /// assert!(sem.serves_newest());
    /// ```
    pub fn serves_newest(&self) -> bool {
        self.newest.load(Ordering::Relaxed)
    }

    /// Waits for one permit.
    ///
    /// # Errors
    ///
    /// The future resolves to [`AcquireError`](crate::AcquireError) if the semaphore is closed
    /// before the permit is granted.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up its place in line and nothing else: any
    /// permits it had been handed go on to the next waiters or back to the
    /// semaphore.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// # futures::executor::block_on(async {
    /// let sem = Semaphore::new(1);
    /// let permit = sem.acquire().await.unwrap();
    /// assert_eq!(permit.num_permits(), 1);
    /// # });
    /// ```
    #[inline]
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire::new(self, 1)
    }

    /// Waits for `n` permits, granted together.
    ///
    /// Asking for more than the semaphore holds in total is allowed: the
    /// future waits until [`add_permits`](Self::add_permits) makes it
    /// possible. `n == 0` resolves at once unless the semaphore is closed.
    ///
    /// # Errors
    ///
    /// The future resolves to [`AcquireError`](crate::AcquireError) if the semaphore is closed
    /// before all `n` permits are granted.
    ///
    /// # Panics
    ///
    /// Panics if `n` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up its place in line and nothing else: the
    /// permits it had collected so far go on to the next waiters.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// # futures::executor::block_on(async {
    /// let sem = Semaphore::new(10);
    /// let permit = sem.acquire_many(3).await.unwrap();
    /// assert_eq!(sem.available_permits(), 7);
    /// # drop(permit);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_many(&self, n: usize) -> Acquire<'_> {
        check_request(n);
        Acquire::new(self, n)
    }

    /// Takes one permit if one is available now.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NoPermits`] if none is available or (in fair mode)
    /// others are waiting; [`TryAcquireError::Closed`] if the semaphore is
    /// closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Semaphore, TryAcquireError};
    ///
    /// let sem = Semaphore::new(1);
    /// let permit = sem.try_acquire().unwrap();
    /// assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::NoPermits);
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, TryAcquireError> {
        self.try_take(1)?;
        Ok(Permit::new(self, 1))
    }

    /// Takes `n` permits if they are available now. `n == 0` succeeds unless
    /// the semaphore is closed.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Panics
    ///
    /// Panics if `n` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(4);
    /// let permit = sem.try_acquire_many(3).unwrap();
    /// assert!(sem.try_acquire_many(2).is_err());
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_many(&self, n: usize) -> Result<Permit<'_>, TryAcquireError> {
        check_request(n);
        self.try_take(n)?;
        Ok(Permit::new(self, n))
    }

    /// Waits for one permit, returning a permit that holds an `Arc` of the
    /// semaphore and so can be moved into spawned tasks.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// # futures::executor::block_on(async {
    /// let sem = Arc::new(Semaphore::new(1));
    /// let permit = sem.acquire_owned().await.unwrap();
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(sem.available_permits(), 1);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_owned(self: &Arc<Self>) -> AcquireOwned {
        AcquireOwned::new(self.clone(), 1)
    }

    /// Waits for `n` permits, returning an [`OwnedPermit`].
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Panics
    ///
    /// Panics if `n` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// # futures::executor::block_on(async {
    /// let sem = Arc::new(Semaphore::new(5));
    /// let permit = sem.acquire_many_owned(5).await.unwrap();
    /// assert_eq!(permit.num_permits(), 5);
    /// # });
    /// ```
    #[inline]
    pub fn acquire_many_owned(self: &Arc<Self>, n: usize) -> AcquireOwned {
        check_request(n);
        AcquireOwned::new(self.clone(), n)
    }

    /// Takes one permit now if available, as an [`OwnedPermit`].
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(1));
    /// let permit = sem.try_acquire_owned().unwrap();
    /// assert!(sem.try_acquire_owned().is_err());
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit, TryAcquireError> {
        self.try_take(1)?;
        Ok(OwnedPermit::new(self.clone(), 1))
    }

    /// Takes `n` permits now if available, as an [`OwnedPermit`].
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Panics
    ///
    /// Panics if `n` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::Semaphore;
    ///
    /// let sem = Arc::new(Semaphore::new(3));
    /// let permit = sem.try_acquire_many_owned(2).unwrap();
    /// assert_eq!(sem.available_permits(), 1);
    /// # drop(permit);
    /// ```
    #[inline]
    pub fn try_acquire_many_owned(
        self: &Arc<Self>,
        n: usize,
    ) -> Result<OwnedPermit, TryAcquireError> {
        check_request(n);
        self.try_take(n)?;
        Ok(OwnedPermit::new(self.clone(), n))
    }

    /// Blocks the current thread until one permit is granted. Blocking and
    /// async acquirers wait in the same line, in one order.
    ///
    /// Do not call this inside an async task: it blocks the executor thread.
    ///
    /// # Errors
    ///
    /// [`AcquireError`](crate::AcquireError) if the semaphore is closed before the permit is
    /// granted.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// let permit = sem.acquire_blocking().unwrap();
    /// assert_eq!(sem.available_permits(), 0);
    /// # drop(permit);
    /// ```
    #[cfg(not(loom))]
    pub fn acquire_blocking(&self) -> Result<Permit<'_>, crate::AcquireError> {
        self.acquire_many_blocking(1)
    }

    /// Blocks the current thread until `n` permits are granted.
    ///
    /// # Errors
    ///
    /// [`AcquireError`](crate::AcquireError) if the semaphore is closed first.
    ///
    /// # Panics
    ///
    /// Panics if `n` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(0);
    /// std::thread::scope(|s| {
    ///     s.spawn(|| sem.add_permits(2));
    ///     let permit = sem.acquire_many_blocking(2).unwrap();
    ///     assert_eq!(permit.num_permits(), 2);
    /// });
    /// ```
    #[cfg(not(loom))]
    pub fn acquire_many_blocking(&self, n: usize) -> Result<Permit<'_>, crate::AcquireError> {
        check_request(n);
        match self.try_take(n) {
            Ok(()) => Ok(Permit::new(self, n)),
            Err(TryAcquireError::Closed) => Err(crate::AcquireError::closed()),
            Err(TryAcquireError::NoPermits) => crate::blocking::block_on(Acquire::new(self, n)),
        }
    }

    /// Adds `n` permits, waking waiters they satisfy. Like Java's
    /// `release(n)`, this may raise the balance above the initial count, and
    /// it is how a [forgotten](Permit::forget) permit is given back by
    /// another task.
    ///
    /// # Panics
    ///
    /// Panics if the balance would exceed [`MAX_PERMITS`](Self::MAX_PERMITS);
    /// the balance is then left as it was. Also panics if the waker of a
    /// waiter it serves panics, once every waiter is served and woken (see
    /// [Wakers that panic](Self#wakers-that-panic)).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// sem.add_permits(2);
    /// assert_eq!(sem.available_permits(), 3);
    /// ```
    pub fn add_permits(&self, n: usize) {
        if n == 0 {
            return;
        }
        // Fair, with waiters: the permits go to them under the lock, as a
        // released permit does, without passing through the balance.
        if self.fair() && self.state.load(Ordering::Relaxed) & WAITERS != 0 {
            return self.add_to_waiters(n);
        }
        let prev = self.add_checked(n);
        if prev & WAITERS != 0 {
            self.distribute_and_unlock(lock(&self.waiters));
        }
    }

    /// Adds `n` permits to the balance and returns the word it replaced.
    ///
    /// # Panics
    ///
    /// If the balance would exceed `MAX_PERMITS`; it is then left as it was.
    #[inline]
    fn add_checked(&self, n: usize) -> usize {
        match self.try_add_checked(n) {
            Ok(prev) => prev,
            Err(Overflow) => Self::add_overflow(n),
        }
    }

    /// Adds `n` permits to the balance and returns the word it replaced, or
    /// leaves it alone if it would exceed `MAX_PERMITS`. A CAS loop rather
    /// than [`add_balance`](Self::add_balance)'s add-then-check (the
    /// releases' slow paths), so that a call that would overflow never
    /// disturbs a concurrent legal one.
    #[inline]
    fn try_add_checked(&self, n: usize) -> Result<usize, Overflow> {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if n > Self::MAX_PERMITS || balance(cur) + n as isize > Self::MAX_PERMITS as isize {
                return Err(Overflow);
            }
            match self.state.compare_exchange_weak(
                cur,
                cur.wrapping_add(units(n)),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Reports an addition that `add_permits` refused.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn add_overflow(n: usize) -> ! {
        panic!("adding {n} permits would take the balance above Semaphore::MAX_PERMITS");
    }

    /// Removes `n` permits from the balance, which may go below zero, as
    /// Java's `reducePermits`. Permits already held stay valid; as they come
    /// back they repay the deficit first, and acquirers wait until the
    /// balance covers them. Never blocks.
    ///
    /// # Panics
    ///
    /// Panics if the balance would fall below `-MAX_PERMITS`; the balance is
    /// then left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(2);
    /// let held = sem.try_acquire_many(2).unwrap();
    /// sem.reduce_permits(3);
    /// assert_eq!(sem.available_permits(), -3);
    /// drop(held);
    /// assert_eq!(sem.available_permits(), -1);
    /// ```
    pub fn reduce_permits(&self, n: usize) {
        let floor = -(Self::MAX_PERMITS as isize);
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let ok = n <= Self::MAX_PERMITS && balance(cur) - n as isize >= floor;
            assert!(
                ok,
                "reducing by {n} permits would take the balance below -MAX_PERMITS"
            );
            match self.state.compare_exchange_weak(
                cur,
                cur.wrapping_sub(units(n)),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Removes up to `n` of the permits available now and returns how many
    /// it removed. Permits already held are not affected.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(5);
    /// assert_eq!(sem.forget_permits(3), 3);
    /// assert_eq!(sem.forget_permits(3), 2);
    /// assert_eq!(sem.available_permits(), 0);
    /// ```
    pub fn forget_permits(&self, n: usize) -> usize {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let take = n.min(balance(cur).max(0) as usize);
            if take == 0 {
                return 0;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur - units(take),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes every permit available now and returns how many, as Java's
    /// `drainPermits`. A negative balance is left as it is and `0` returned.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(7);
    /// assert_eq!(sem.drain_permits(), 7);
    /// assert_eq!(sem.available_permits(), 0);
    /// ```
    pub fn drain_permits(&self) -> usize {
        self.forget_permits(usize::MAX)
    }

    /// The balance of permits available now; negative while in deficit
    /// after [`reduce_permits`](Self::reduce_permits).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(0);
    /// sem.reduce_permits(2);
    /// assert_eq!(sem.available_permits(), -2);
    /// ```
    #[inline]
    pub fn available_permits(&self) -> isize {
        // SeqCst pairs with the release's SeqCst read-modify-write (see
        // `release`).
        balance(self.state.load(Ordering::SeqCst))
    }

    /// How many acquirers are waiting in line now. In unfair mode a waiter
    /// that a release woke is out of line until it runs (and back in line,
    /// at the front, if another acquirer took the permits first).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(0);
    /// let mut waiting = pin!(sem.acquire());
    /// assert!(waiting.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
    /// assert_eq!(sem.queue_len(), 1);
    /// ```
    pub fn queue_len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Closes the semaphore: every waiter and every later acquire fails with
    /// [`AcquireError`](crate::AcquireError), and `try_acquire*` with
    /// [`TryAcquireError::Closed`]. Permits already held stay valid and are
    /// returned normally when dropped.
    ///
    /// # Panics
    ///
    /// Panics if a waiter's waker panics, once every waiter has been failed
    /// and woken (see [Wakers that panic](Self#wakers-that-panic)).
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::{Semaphore, TryAcquireError};
    ///
    /// # futures::executor::block_on(async {
    /// let sem = Semaphore::new(1);
    /// let held = sem.try_acquire().unwrap();
    /// sem.close();
    /// assert!(sem.is_closed());
    /// assert!(sem.acquire().await.is_err());
    /// assert_eq!(sem.try_acquire().unwrap_err(), TryAcquireError::Closed);
    /// drop(held);
    /// assert_eq!(sem.available_permits(), 1);
    /// # });
    /// ```
    pub fn close(&self) {
        let mut list = lock(&self.waiters);
        self.state.fetch_or(CLOSED, Ordering::Release);
        // One batch at a time, and the same list for all: a waker that
        // panics neither stops the batch nor the next ones, and its panic
        // reaches our caller once every waiter is failed and woken.
        let mut wakers = WakeList::new();
        loop {
            while wakers.can_push() {
                let Some(node) = list.pop_front() else { break };
                // SAFETY: `node` was linked until just now, so it is alive;
                // its owner cannot free it before it sees the store below.
                let waiter = unsafe { node.as_ref() };
                if let Some(waker) = waiter.close() {
                    wakers.push(waker);
                }
            }
            self.queued.store(list.len(), Ordering::Relaxed);
            let done = list.is_empty();
            if done {
                self.state.fetch_and(!WAITERS, Ordering::Relaxed);
            }
            drop(list);
            wakers.wake_all();
            if done {
                break;
            }
            list = lock(&self.waiters);
        }
        wakers.resume_panic();
    }

    /// Wakes the task of the waiter at the front of the line, without
    /// serving it: its next poll finds it still waiting (and stores its
    /// waker again). For the bulkhead's line timer, which tells the oldest
    /// waiter to look at its deadline. Returns whether anyone waited. The
    /// waker is taken out under the lock and woken after it, as every
    /// waker is; a grant in between finds no waker and needs none, since
    /// the task is woken already.
    #[cfg(not(loom))]
    pub(crate) fn wake_front(&self) -> bool {
        let list = lock(&self.waiters);
        let Some(node) = list.front() else {
            return false;
        };
        // SAFETY: `node` is linked, so it is alive, and we hold the lock,
        // which guards its waker.
        let waker = unsafe { node.as_ref().take_waker() };
        drop(list);
        if let Some(waker) = waker {
            wake_list::wake(waker);
        }
        true
    }

    /// Whether [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use watertight::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// assert!(!sem.is_closed());
    /// sem.close();
    /// assert!(sem.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Takes `n` permits from the balance without waiting: one CAS when they
    /// are there. In fair mode it refuses while anyone waits.
    #[inline]
    pub(crate) fn try_take(&self, n: usize) -> Result<(), TryAcquireError> {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            // One test for closed and, in fair mode, for waiters; which of
            // the three stopped us is sorted out off the common path.
            if cur & self.stops != 0 || balance(cur) < n as isize {
                return Self::cannot_take(cur, n);
            }
            // AcqRel, not just Acquire: in unfair mode a woken waiter lowers
            // `notified` just before this, and a release whose `fetch_add`
            // comes after this in the word's order must see that, or its
            // `distribute` could count the permits as promised to it still
            // and wake nobody. (One locked instruction on x86 either way.)
            match self.state.compare_exchange_weak(
                cur,
                cur - units(n),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Why `try_take` found no permits to take in state `cur`: closed, or
    /// nothing to take (`n == 0` succeeds whatever the balance or the
    /// line), or no permits for a newcomer.
    #[cold]
    fn cannot_take(cur: usize, n: usize) -> Result<(), TryAcquireError> {
        if cur & CLOSED != 0 {
            Err(TryAcquireError::Closed)
        } else if n == 0 {
            Ok(())
        } else {
            Err(TryAcquireError::NoPermits)
        }
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("available_permits", &self.available_permits())
            .field("queue_len", &self.queue_len())
            .field("fair", &self.fair())
            .field("serves_newest", &self.serves_newest())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Default for Semaphore {
    /// A fair semaphore with no permits.
    fn default() -> Self {
        Self::new(0)
    }
}

/// The balance would have passed `MAX_PERMITS`.
#[derive(Debug)]
struct Overflow;

/// Panics if one acquire asks for more than `MAX_PERMITS`.
#[inline]
#[track_caller]
fn check_request(n: usize) {
    assert!(
        n <= Semaphore::MAX_PERMITS,
        "cannot acquire {n} permits: more than Semaphore::MAX_PERMITS"
    );
}

#[cfg(all(test, not(loom)))]
mod tests {
    use core::future::Future;
    use core::pin::pin;
    use core::task::{Context, Poll, Waker};
    use std::sync::Arc;

    use super::Semaphore;

    use crate::test_util::Count;

    /// `wake_front` wakes the front waiter's task without serving it; the
    /// waiter stays first in line, stores its waker again when polled, and
    /// is served by the next release as before.
    #[test]
    fn wake_front_wakes_without_serving() {
        let sem = Semaphore::new(0);
        assert!(!sem.wake_front(), "nobody waits");
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (wf, ws) = (Waker::from(first.clone()), Waker::from(second.clone()));
        let mut a = pin!(sem.acquire());
        let mut b = pin!(sem.acquire());
        assert!(a.as_mut().poll(&mut Context::from_waker(&wf)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&ws)).is_pending());
        assert!(sem.wake_front());
        assert_eq!(first.get(), 1);
        assert_eq!(second.get(), 0);
        // Woken, not served; waking again finds no waker until it polls.
        assert!(sem.wake_front());
        assert_eq!(first.get(), 1);
        assert!(a.as_mut().poll(&mut Context::from_waker(&wf)).is_pending());
        assert_eq!(sem.queue_len(), 2);
        // A release with no waker stored still serves it (the task was
        // woken); with the waker stored again, it is woken as usual.
        assert!(sem.wake_front());
        sem.add_permits(1);
        let Poll::Ready(Ok(held)) = a.as_mut().poll(&mut Context::from_waker(&wf)) else {
            panic!("the front waiter is served")
        };
        assert_eq!(sem.queue_len(), 1);
        sem.add_permits(1);
        assert_eq!(second.get(), 1, "the next waiter is served and woken");
        assert!(matches!(
            b.as_mut().poll(&mut Context::from_waker(&ws)),
            Poll::Ready(Ok(_))
        ));
        drop(held);
        assert_eq!(sem.available_permits(), 2, "both permits are back");
    }
}
