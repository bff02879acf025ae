//! The acquire futures and the wait-queue node that lives inside them.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::ptr::NonNull;
use core::task::{Context, Poll, Waker};
use std::sync::Arc;

use super::wake_list::WakeList;
use super::{OwnedPermit, Permit, Semaphore};
use crate::error::{AcquireError, TryAcquireError};
use crate::list::List;
use crate::list::{Linked, Links};
use crate::loom::{AtomicUsize, MutexGuard, Ordering, UnsafeCell, lock};

/// Set in [`Waiter::remaining`] when `close` unlinked the node.
const NODE_CLOSED: usize = 1 << (usize::BITS - 1);
/// [`Waiter::remaining`] of a node that an unfair semaphore unlinked and woke
/// so that it competes for the balance again (no permits were handed to it).
const NODE_NOTIFIED: usize = 1 << (usize::BITS - 2);

/// A waiting acquirer's node in the semaphore's wait queue.
///
/// It lives inside an [`Acquire`] or [`AcquireOwned`] future, which is
/// pinned before the node is linked and unlinks it (under the lock) before it
/// is dropped.
pub(super) struct Waiter {
    /// Position in the queue. Only touched under the semaphore's lock.
    links: Links<Waiter>,
    /// The task to wake when the node is served or closed. May only be
    /// accessed while the semaphore's lock is held, and is never cloned,
    /// woken or dropped then (that is user code, which may panic or call
    /// back into the semaphore): the owner clones its task's waker before it
    /// locks, and a waker taken out is woken or dropped after unlocking.
    /// A cancelled future that unlinked its own node and served nobody
    /// leaves its waker here; the node is then its alone, and the waker is
    /// dropped with the future, after the lock is released.
    waker: UnsafeCell<Option<Waker>>,
    /// While linked: the permits still owed (non-zero). Once unlinked: `0`
    /// if served in full, `NODE_CLOSED | owed` if the semaphore closed, or
    /// `NODE_NOTIFIED` if an unfair semaphore woke it to compete.
    /// Written only under the lock; the store that unlinks the node is a
    /// release store and the last access by anyone but the owning future.
    remaining: AtomicUsize,
}

// SAFETY: `links` and `waker` are only accessed under the semaphore's lock,
// which serialises all threads, or by the owner once it has unlinked the node
// (nobody else can reach it then); `remaining` is atomic. `Waker` is
// Send+Sync.
unsafe impl Send for Waiter {}
// SAFETY: as above.
unsafe impl Sync for Waiter {}

// SAFETY: `links` returns the `links` field of the node `this` points to.
unsafe impl Linked for Waiter {
    unsafe fn links(this: NonNull<Self>) -> NonNull<Links<Self>> {
        // SAFETY: the caller guarantees `this` points to a live node; taking
        // the field's address creates no reference to the node.
        unsafe { NonNull::new_unchecked(core::ptr::addr_of_mut!((*this.as_ptr()).links)) }
    }
}

/// What the owner of a node sees of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Linked, still owed this many permits.
    Waiting(usize),
    /// Unlinked and served in full.
    Granted,
    /// Unlinked by `close`, still owed this many permits.
    Closed(usize),
    /// Unlinked and woken by an unfair semaphore, holding nothing: the next
    /// poll tries the balance again.
    Notified,
}

impl Waiter {
    fn new() -> Self {
        Self {
            links: Links::new(),
            waker: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
        }
    }

    /// The permits still owed. Call with the lock held and the node linked.
    #[inline]
    pub(super) fn remaining(&self) -> usize {
        self.remaining.load(Ordering::Relaxed)
    }

    /// Records a partial hand-off. Call with the lock held and the node
    /// linked; `owed` is non-zero.
    #[inline]
    pub(super) fn set_remaining(&self, owed: usize) {
        debug_assert!(
            owed != 0 && owed & NODE_CLOSED == 0,
            "a linked node is owed permits"
        );
        self.remaining.store(owed, Ordering::Release);
    }

    /// Marks the node served and returns its waker. Call with the lock held,
    /// right after unlinking the node. After this returns the node may be
    /// freed by its owner at any moment: do not touch it again.
    #[inline]
    pub(super) fn grant(&self) -> Option<Waker> {
        // SAFETY: the lock is held (caller's contract), which gives us the
        // waker.
        let waker = self.waker.with_mut(|w| unsafe { (*w).take() });
        self.remaining.store(0, Ordering::Release);
        waker
    }

    /// Marks the node woken to compete (unfair mode) and returns its waker.
    /// Same contract as [`grant`](Self::grant).
    #[inline]
    pub(super) fn notify(&self) -> Option<Waker> {
        // SAFETY: the lock is held (caller's contract).
        let waker = self.waker.with_mut(|w| unsafe { (*w).take() });
        self.remaining.store(NODE_NOTIFIED, Ordering::Release);
        waker
    }

    /// Marks the node closed and returns its waker. Same contract as
    /// [`grant`](Self::grant).
    pub(super) fn close(&self) -> Option<Waker> {
        // SAFETY: the lock is held (caller's contract).
        let waker = self.waker.with_mut(|w| unsafe { (*w).take() });
        let owed = self.remaining.load(Ordering::Relaxed);
        self.remaining.store(owed | NODE_CLOSED, Ordering::Release);
        waker
    }

    /// Reads the node's status; valid without the lock once the node has
    /// been linked, and authoritative when read under the lock.
    #[inline]
    fn status(&self) -> Status {
        match self.remaining.load(Ordering::Acquire) {
            0 => Status::Granted,
            NODE_NOTIFIED => Status::Notified,
            r if r & NODE_CLOSED != 0 => Status::Closed(r & !NODE_CLOSED),
            r => Status::Waiting(r),
        }
    }

    /// Whether the node is linked and still owed all of `n` (the request
    /// of a queued acquire, non-zero): one load and compare. Call with the
    /// lock held.
    #[inline]
    fn owes_all(&self, n: usize) -> bool {
        // `n` is at most `MAX_PERMITS`, so it never equals a value with
        // `NODE_CLOSED` or `NODE_NOTIFIED` set, and it is not zero.
        debug_assert!(n != 0 && n & (NODE_CLOSED | NODE_NOTIFIED) == 0);
        self.remaining.load(Ordering::Relaxed) == n
    }

    /// Whether the stored waker wakes the same task as `waker`. Runs no user
    /// code (`Waker::will_wake` compares pointers).
    ///
    /// # Safety
    ///
    /// The semaphore's lock must be held.
    unsafe fn will_wake(&self, waker: &Waker) -> bool {
        // SAFETY: the caller holds the lock, which guards the waker.
        self.waker
            .with(|w| unsafe { (*w).as_ref() }.is_some_and(|old| old.will_wake(waker)))
    }

    /// Stores `waker`, cloned by the caller before it took the lock (a clone
    /// is user code), and returns the one it replaces, to be dropped after
    /// unlocking.
    ///
    /// # Safety
    ///
    /// The semaphore's lock must be held.
    unsafe fn replace_waker(&self, waker: Waker) -> Option<Waker> {
        // SAFETY: the caller holds the lock, which guards the waker.
        self.waker.with_mut(|w| unsafe { (*w).replace(waker) })
    }

    /// Takes the waker out.
    ///
    /// # Safety
    ///
    /// The semaphore's lock must be held.
    pub(super) unsafe fn take_waker(&self) -> Option<Waker> {
        // SAFETY: the caller holds the lock.
        self.waker.with_mut(|w| unsafe { (*w).take() })
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// Where an acquire future is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not polled yet, or polled without needing to wait; not linked.
    Idle,
    /// Linked at some point: the node's status says whether it still is.
    Queued,
    /// The output was returned (or the permits given back): nothing to undo.
    Done,
}

/// The output of an attempt to take permits without waiting: `None` if the
/// acquirer must wait, else the future's result (and it is done).
#[inline]
fn took(
    attempt: Result<(), TryAcquireError>,
    phase: &mut Phase,
) -> Option<Poll<Result<(), AcquireError>>> {
    let result = match attempt {
        Ok(()) => Ok(()),
        Err(TryAcquireError::Closed) => Err(AcquireError::closed()),
        Err(TryAcquireError::NoPermits) => return None,
    };
    *phase = Phase::Done;
    Some(Poll::Ready(result))
}

impl AcquireFields<'_, '_> {
    /// Polls the acquire of `permits` permits whose node is `waiter`: the
    /// fast paths inline (a first poll that takes the permits without the
    /// lock, a wake-up after being served in line), the rest out of line
    /// in [`Semaphore::poll_slow`], which takes the fields one by one so
    /// that they stay in registers here.
    #[inline]
    fn poll(self, cx: &mut Context<'_>) -> Poll<Result<(), AcquireError>> {
        let Self {
            sem,
            waiter,
            permits: n,
            phase,
        } = self;
        match *phase {
            Phase::Idle => match took(sem.try_take(n), phase) {
                Some(done) => done,
                None => sem.poll_slow(waiter, n, phase, cx),
            },
            // Served while queued (fair mode): the common wake-up, decided
            // by one load, with no call.
            Phase::Queued if waiter.status() == Status::Granted => {
                *phase = Phase::Done;
                Poll::Ready(Ok(()))
            }
            Phase::Queued => sem.poll_slow(waiter, n, phase, cx),
            Phase::Done => panic!("acquire future polled after completion"),
        }
    }
}

impl Semaphore {
    /// The polls that [`AcquireFields::poll`] does not finish inline: a
    /// first poll that found too few permits joins the back of the line
    /// (see [`enqueue`](Self::enqueue)); a poll after the node was linked
    /// keeps its waker or takes what happened to the node. Out of line, so
    /// that the fast path inlined into every `poll` stays small.
    #[inline(never)]
    fn poll_slow(
        &self,
        waiter: Pin<&Waiter>,
        n: usize,
        phase: &mut Phase,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), AcquireError>> {
        if *phase == Phase::Idle {
            // Cloned before the lock is taken, as every waker call is. If
            // the clone panics, nothing has changed yet.
            let waker = cx.waker().clone();
            return self.enqueue(waiter, n, phase, waker, false);
        }
        let node = waiter.get_ref();
        if let Status::Waiting(_) = node.status() {
            if self.keep_waker(node, cx) {
                return Poll::Pending;
            }
        }
        match node.status() {
            Status::Notified => {
                // Woken to compete: no longer counted as woken, and from
                // here on the node is an unlinked one holding nothing.
                self.notified.fetch_sub(n, Ordering::Relaxed);
                *phase = Phase::Idle;
                match took(self.try_take(n), phase) {
                    Some(done) => done,
                    None => {
                        // Lost the race: back to the front of the line. The
                        // wake-up is spent, so if cloning the waker (user
                        // code) panics, the future is out of line for good
                        // and passes the wake-up on, as a dropped one does.
                        let pass_on = PassOn(self);
                        let waker = cx.waker().clone();
                        core::mem::forget(pass_on);
                        self.enqueue(waiter, n, phase, waker, true)
                    }
                }
            }
            done => self.finish(done, n, phase),
        }
    }

    /// Retries the balance under the lock, else joins the line with `waker`
    /// (the task's, cloned by the caller without the lock): at its back, or
    /// at its front for an unfair waiter that was woken and lost the race
    /// for the permits, so that it keeps its place. Inlined into both of
    /// [`poll_slow`](Self::poll_slow)'s calls, so that a woken unfair
    /// waiter that lost makes one call, not two.
    ///
    /// No user code runs under the lock, and wherever a waker is dropped
    /// after it (user code that may panic), `phase` and the node's status
    /// already say what the future owns: a panic there loses nothing.
    #[inline(always)]
    fn enqueue(
        &self,
        waiter: Pin<&Waiter>,
        n: usize,
        phase: &mut Phase,
        waker: Waker,
        front: bool,
    ) -> Poll<Result<(), AcquireError>> {
        let mut list = lock(&self.waiters);
        let waiter = waiter.get_ref();
        // With the lock held, `WAITERS` is set exactly when the line is
        // non-empty, so this is the same check as the fast path, now final.
        match self.try_take(n) {
            Err(TryAcquireError::NoPermits) => {}
            Ok(()) => {
                // Taken after all, and `waker` is not needed. Until it is
                // dropped the future holds the permits as a served node
                // does (`Queued`, status `Granted`; the node is unlinked and
                // ours), so that if the drop panics the next poll returns
                // them and the future's drop gives them back.
                waiter.remaining.store(0, Ordering::Relaxed);
                *phase = Phase::Queued;
                drop(list);
                drop(waker);
                *phase = Phase::Done;
                return Poll::Ready(Ok(()));
            }
            Err(TryAcquireError::Closed) => {
                *phase = Phase::Done;
                drop(list);
                drop(waker);
                return Poll::Ready(Err(AcquireError::closed()));
            }
        }
        waiter.remaining.store(n, Ordering::Relaxed);
        // SAFETY: we hold the lock. The node is not linked (never was, or
        // the semaphore unlinked it and took its waker), so the slot is
        // empty and nothing is dropped under the lock.
        let old = unsafe { waiter.replace_waker(waker) };
        debug_assert!(old.is_none(), "an unlinked node has no waker");
        // SAFETY: `waiter` is pinned inside this future, is not linked, and
        // the future's drop unlinks it (under the lock) before it goes away:
        // `phase` becomes `Queued` right here, and `cancel` handles that.
        unsafe {
            if front {
                list.push_front(NonNull::from(waiter));
            } else {
                list.push_back(NonNull::from(waiter));
            }
        }
        *phase = Phase::Queued;
        self.queued.store(list.len(), Ordering::Relaxed);
        // `WAITERS` only changes under the lock, which we hold. If it is
        // already set, every release since it was set has run (or will run)
        // `distribute` itself, and the waiters ahead of us come first: there
        // is nothing for us to do.
        if self.state.load(Ordering::Relaxed) & super::WAITERS != 0 {
            drop(list);
            return Poll::Pending;
        }
        // First in line: publish that someone waits, then take whatever the
        // balance has. A release ordered before this `fetch_or` is in the
        // balance read below; one ordered after it sees `WAITERS` and runs
        // `distribute` itself.
        let prev = self.state.fetch_or(super::WAITERS, Ordering::AcqRel);
        if !self.fair() {
            // Alone in line: take the permits ourselves rather than be woken
            // to take them.
            if self.try_take(n).is_err() {
                return Poll::Pending;
            }
            // SAFETY: we hold the lock and the node is linked (we are the
            // only node).
            unsafe { list.remove(NonNull::from(waiter)) };
            self.queued.store(list.len(), Ordering::Relaxed);
            debug_assert!(list.is_empty(), "the line held only this node");
            self.state.fetch_and(!super::WAITERS, Ordering::Relaxed);
            // Served by ourselves: marked granted, as a hand-off would, so
            // that while our waker is dropped (user code, which may panic)
            // the future owns the permits, with `phase` still `Queued`.
            let own = waiter.grant();
            drop(list);
            drop(own);
            *phase = Phase::Done;
            return Poll::Ready(Ok(()));
        }
        // Fair: nothing in the balance (the common case, every permit held),
        // so `distribute` would hand out nothing; and whoever adds from here
        // on sees `WAITERS` and serves us itself. Decided on the word the
        // `fetch_or` replaced, without the call and its batch of wakers.
        if prev & super::CLOSED == 0 && super::balance(prev) <= 0 {
            drop(list);
            return Poll::Pending;
        }
        self.distribute_and_unlock(list);
        match waiter.status() {
            Status::Waiting(_) => Poll::Pending,
            done => self.finish(done, n, phase),
        }
    }

    /// Makes sure a node that looked linked will wake the polling task:
    /// returns `true` if it still waits (the poll is pending), `false` if it
    /// was served, closed or notified meanwhile.
    ///
    /// A new waker is cloned with the lock released (a clone is user code);
    /// until it is stored, the old one stays, so a hand-off meanwhile wakes
    /// the old task, and we see the hand-off when we look again.
    #[inline(always)]
    fn keep_waker(&self, node: &Waiter, cx: &mut Context<'_>) -> bool {
        let list = lock(&self.waiters);
        // Read again under the lock: now nobody can serve or close the node
        // until we unlock.
        if !matches!(node.status(), Status::Waiting(_)) {
            return false;
        }
        // SAFETY: we hold the lock.
        if unsafe { node.will_wake(cx.waker()) } {
            return true;
        }
        drop(list);
        let new = cx.waker().clone();
        let list = lock(&self.waiters);
        if let Status::Waiting(_) = node.status() {
            // SAFETY: we hold the lock.
            let old = unsafe { node.replace_waker(new) };
            drop(list);
            // If this panics, the new waker is already in place.
            drop(old);
            return true;
        }
        drop(list);
        // Served, closed or notified meanwhile, and `phase` is `Queued`: if
        // this drop panics, the next poll or the future's drop completes it.
        drop(new);
        false
    }

    /// Turns an unlinked node's status into the future's output.
    fn finish(
        &self,
        status: Status,
        n: usize,
        phase: &mut Phase,
    ) -> Poll<Result<(), AcquireError>> {
        *phase = Phase::Done;
        match status {
            Status::Granted => Poll::Ready(Ok(())),
            Status::Closed(owed) => {
                self.release(n - owed);
                Poll::Ready(Err(AcquireError::closed()))
            }
            Status::Waiting(_) | Status::Notified => {
                unreachable!("finish is only called on a served or closed node")
            }
        }
    }

    /// Undoes a pending acquire when its future is dropped: leaves the line
    /// and passes on every permit the node had been handed, or the wake-up
    /// it had been given. Nothing to do unless the node was queued, which is
    /// checked inline: most futures are dropped after they completed.
    #[inline]
    fn cancel(&self, waiter: Pin<&Waiter>, n: usize, phase: &mut Phase) {
        if *phase == Phase::Queued {
            self.cancel_queued(waiter, n, phase);
        }
    }

    /// The drop of a queued future. Out of line, and small: the common
    /// cancellation (in a long line, a waiter that is not the head and was
    /// handed nothing) is decided and done here, with few registers to save,
    /// and everything else is in [`cancel_rest`](Self::cancel_rest).
    #[inline(never)]
    fn cancel_queued(&self, waiter: Pin<&Waiter>, n: usize, phase: &mut Phase) {
        *phase = Phase::Done;
        let waiter = waiter.get_ref();
        // The lock first, and the node's status read only under it: the
        // node is cold when a long line is cancelled from at random, and
        // a load of it before the lock's atomic would have to complete
        // before the lock is taken, in series with the loads of the links.
        let mut list = lock(&self.waiters);
        let node = NonNull::from(waiter);
        // Still owed all `n` (handed nothing), and not the head.
        if waiter.owes_all(n) && list.front() != Some(node) {
            // SAFETY: the status is read under the lock, and a waiting node
            // is linked in this semaphore's list.
            unsafe { list.remove(node) };
            self.queued.store(list.len(), Ordering::Relaxed);
            // Nothing came back and the head is the same, so nobody can be
            // served who could not be before (and the line is not empty:
            // the head is in it): no distribution pass. The waker stays in
            // the node, which is now ours alone, and is dropped with the
            // future after we unlock (one write and one read fewer under
            // the lock).
            return;
        }
        self.cancel_rest(list, waiter, n);
    }

    /// The rest of [`cancel_queued`](Self::cancel_queued), with the lock
    /// held (`list` is its guard): a node that was the head, was handed
    /// some permits, was served, closed or notified.
    #[cold]
    #[inline(never)]
    fn cancel_rest<'a>(
        &'a self,
        mut list: MutexGuard<'a, List<Waiter>>,
        waiter: &Waiter,
        n: usize,
    ) {
        let give_back = match waiter.status() {
            Status::Waiting(owed) => {
                // SAFETY: the status is read under the lock, and a
                // `Waiting` node is linked in this semaphore's list.
                unsafe { list.remove(NonNull::from(waiter)) };
                self.queued.store(list.len(), Ordering::Relaxed);
                let handed = n - owed;
                // SAFETY: we hold the lock.
                let waker = unsafe { waiter.take_waker() };
                let overflow = handed != 0 && self.add_balance(handed).is_err();
                // The head may have changed, or permits come back: serve
                // the next waiters (and clear `WAITERS` if the line is now
                // empty).
                let mut wakers = WakeList::new();
                self.distribute_and_unlock_with(list, &mut wakers);
                // Our own waker last, once the others are woken: dropping
                // it is user code too.
                wakers.catch(|| drop(waker));
                if overflow {
                    self.overflow(handed);
                }
                wakers.resume_panic();
                return;
            }
            Status::Notified => {
                // Pass the wake-up on: the permits it was woken for may
                // serve the next waiter. Under the lock, so that every later
                // `distribute` sees the lower count.
                self.notified.fetch_sub(n, Ordering::Relaxed);
                self.distribute_and_unlock(list);
                return;
            }
            Status::Granted => n,
            Status::Closed(owed) => n - owed,
        };
        drop(list);
        self.release(give_back);
    }
}

/// Passes on an unfair wake-up that its future spent when it is dropped,
/// as a woken future dropped before it runs does. Armed only while a woken
/// waiter that lost the race clones its waker to queue again, and defused
/// with `mem::forget`: it runs only if the clone panics.
struct PassOn<'a>(&'a Semaphore);

impl Drop for PassOn<'_> {
    fn drop(&mut self) {
        self.0.distribute_and_unlock(lock(&self.0.waiters));
    }
}

/// The future returned by [`Semaphore::acquire`] and
/// [`Semaphore::acquire_many`].
///
/// It resolves to a [`Permit`] once the permits are granted, or to
/// [`AcquireError`] if the semaphore is closed first. The node that
/// queues it is stored inside the future, so waiting allocates nothing.
///
/// # Cancel safety
///
/// Dropping it at any point gives up its place in line and nothing else:
/// permits it had already been handed go to the next waiters or back to
/// the semaphore.
///
/// # Panics
///
/// Polling it again after it returned `Ready` panics. A poll or a drop
/// also panics if a waker it runs panics, after finishing its work; see
/// [Wakers that panic](Semaphore#wakers-that-panic).
///
/// # Examples
///
/// ```
/// use watertight::{Semaphore, futures::Acquire};
///
/// struct Waiting<'a> {
///     fut: Acquire<'a>, // a nameable type that can be stored
/// }
/// let sem = Semaphore::new(1);
/// let w = Waiting { fut: sem.acquire() };
/// let permit = futures::executor::block_on(w.fut).unwrap();
/// # drop(permit);
/// ```
#[must_use = "futures do nothing unless polled; dropping this one gives up its place in line"]
pub struct Acquire<'a> {
    sem: &'a Semaphore,
    /// Structurally pinned (see `project`); `Waiter` is `!Unpin`, so
    /// `Acquire` is too.
    waiter: Waiter,
    permits: usize,
    phase: Phase,
}

/// `Acquire`'s fields, the waiter pinned: what one poll works on (see
/// [`poll`](Self::poll)).
struct AcquireFields<'p, 'a> {
    sem: &'a Semaphore,
    waiter: Pin<&'p Waiter>,
    permits: usize,
    phase: &'p mut Phase,
}

impl<'a> Acquire<'a> {
    #[inline]
    pub(super) fn new(sem: &'a Semaphore, permits: usize) -> Self {
        Self {
            sem,
            waiter: Waiter::new(),
            permits,
            phase: Phase::Idle,
        }
    }

    /// The pinned projection, written by hand rather than by
    /// `pin_project!` so that the drop below can be `#[inline]`: the
    /// macro's drop calls an inner function of its own, which is not
    /// inlined into other crates, and that call was a fifth of an
    /// uncontended acquire's time.
    #[inline]
    fn project<'p>(self: Pin<&'p mut Self>) -> AcquireFields<'p, 'a> {
        // SAFETY: the waiter is structurally pinned: no method moves it
        // out of a pinned `Acquire` or hands out `&mut` to it, and the
        // drop below uses it in place; the other fields are not pinned
        // (they are copied or mutated in place, never pinned).
        let this = unsafe { self.get_unchecked_mut() };
        AcquireFields {
            sem: this.sem,
            // SAFETY: as above.
            waiter: unsafe { Pin::new_unchecked(&this.waiter) },
            permits: this.permits,
            phase: &mut this.phase,
        }
    }

    /// Leaves the line now, as dropping the future would: permits it was
    /// handed but did not deliver move on. The future is done afterwards
    /// (for a caller that owns it inline and cannot drop it yet).
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn cancel(self: Pin<&mut Self>) {
        let this = self.project();
        this.sem.cancel(this.waiter, this.permits, this.phase);
        *this.phase = Phase::Done;
    }
}

impl Drop for Acquire<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.phase == Phase::Queued {
            // SAFETY: `Queued` means the future was polled, so pinned, and
            // it has not moved since (pinned values stay put until dropped);
            // this is the last use of the waiter.
            let waiter = unsafe { Pin::new_unchecked(&self.waiter) };
            self.sem.cancel(waiter, self.permits, &mut self.phase);
        }
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = Result<Permit<'a>, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let sem: &'a Semaphore = this.sem;
        let n = this.permits;
        match this.poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(Permit::new(sem, n))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_core::FusedFuture for Acquire<'_> {
    fn is_terminated(&self) -> bool {
        self.phase == Phase::Done
    }
}

impl fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("permits", &self.permits)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

/// The future returned by [`Semaphore::acquire_owned`] and
/// [`Semaphore::acquire_many_owned`]: like [`Acquire`], but it holds an
/// `Arc` of the semaphore, so it and its [`OwnedPermit`] are `'static`.
///
/// # Cancel safety
///
/// As [`Acquire`].
///
/// # Panics
///
/// Polling it again after it returned `Ready` panics. A poll or a drop
/// also panics if a waker it runs panics, after finishing its work; see
/// [Wakers that panic](Semaphore#wakers-that-panic).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use watertight::Semaphore;
///
/// # futures::executor::block_on(async {
/// let sem = Arc::new(Semaphore::new(1));
/// let fut = sem.acquire_owned();
/// let handle = std::thread::spawn(move || futures::executor::block_on(fut));
/// let permit = handle.join().unwrap().unwrap();
/// assert_eq!(sem.available_permits(), 0);
/// # drop(permit);
/// # });
/// ```
#[must_use = "futures do nothing unless polled; dropping this one gives up its place in line"]
pub struct AcquireOwned {
    // `None` once the permits were granted: the `Arc` moved into the
    // permit.
    sem: Option<Arc<Semaphore>>,
    /// Structurally pinned, as [`Acquire`]'s.
    waiter: Waiter,
    permits: usize,
    phase: Phase,
}

impl AcquireOwned {
    #[inline]
    pub(super) fn new(sem: Arc<Semaphore>, permits: usize) -> Self {
        Self {
            sem: Some(sem),
            waiter: Waiter::new(),
            permits,
            phase: Phase::Idle,
        }
    }
}

impl Drop for AcquireOwned {
    #[inline]
    fn drop(&mut self) {
        if self.phase == Phase::Queued {
            if let Some(sem) = &self.sem {
                // SAFETY: as in `Acquire`'s drop: `Queued` means pinned,
                // and not moved since.
                let waiter = unsafe { Pin::new_unchecked(&self.waiter) };
                sem.cancel(waiter, self.permits, &mut self.phase);
            }
        }
    }
}

impl Future for AcquireOwned {
    type Output = Result<OwnedPermit, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: as in `Acquire::project`: the waiter is structurally
        // pinned and never moved out; `sem`, `permits` and `phase` are not
        // pinned (the `Arc` is moved into the permit).
        let this = unsafe { self.get_unchecked_mut() };
        let n = this.permits;
        let sem = this
            .sem
            .as_ref()
            .expect("acquire future polled after completion");
        // SAFETY: as above.
        let waiter = unsafe { Pin::new_unchecked(&this.waiter) };
        let fields = AcquireFields {
            sem,
            waiter,
            permits: n,
            phase: &mut this.phase,
        };
        match fields.poll(cx) {
            Poll::Ready(Ok(())) => {
                let sem = this.sem.take().expect("checked above");
                Poll::Ready(Ok(OwnedPermit::new(sem, n)))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_core::FusedFuture for AcquireOwned {
    fn is_terminated(&self) -> bool {
        self.phase == Phase::Done
    }
}

impl fmt::Debug for AcquireOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireOwned")
            .field("permits", &self.permits)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}
