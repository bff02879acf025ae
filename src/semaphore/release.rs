//! Giving permits back: the release of a dropped permit (one CAS when
//! nobody waits, else a hand-off under the lock), `distribute` (permits
//! from the balance to the waiters, or wake-ups in unfair mode) and the
//! grant of the head of the line. The acquire side is in `acquire.rs`; the
//! protocol is described in the module notes of [`super`] and in
//! `ARCHITECTURE.md`.

use core::ptr::NonNull;
use core::task::Waker;

use super::acquire::Waiter;
use super::state::{CLOSED, WAITERS, balance, units};
use super::wake_list::{WakeList, wake};
use super::{Overflow, Semaphore};
use crate::list::List;
use crate::loom::{MutexGuard, Ordering, lock};

impl Semaphore {
    /// Gives `n` permits back: one CAS when nobody waits, else the lock and
    /// a hand-off straight to the waiters (see
    /// [`release_to_waiters`](Self::release_to_waiters)).
    ///
    /// The CAS adds only while `WAITERS` is clear, in the same atomic step
    /// that reads the flag, so a waiter that sets `WAITERS` either comes
    /// after the addition (and finds the permits when it reads the balance)
    /// or before it (and the release takes the lock instead).
    ///
    /// Returns the balance right after the addition (before any hand-off to
    /// waiters), which the bulkhead uses to notice it has become idle.
    #[inline]
    pub(crate) fn release(&self, n: usize) -> isize {
        if n == 0 {
            return self.available_permits();
        }
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur & WAITERS != 0 {
                return self.release_to_waiters(n);
            }
            // Wrapping: a negative balance is two's complement in the word.
            let new = cur.wrapping_add(units(n));
            // `balance(new) > MAX_PERMITS`, tested on the word itself (the
            // flags are its two low bits; the field has room for the excess,
            // see `state.rs`): one compare instead of a shift, an add and a
            // compare.
            if new as isize > (units(Self::MAX_PERMITS) | CLOSED | WAITERS) as isize {
                self.overflow(n);
            }
            // SeqCst rather than Release: the bulkhead pairs this with a
            // SeqCst load of its idle-waiter count (a store-load handshake),
            // and on the common targets an RMW costs the same either way.
            match self
                .state
                .compare_exchange_weak(cur, new, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return balance(new),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The release of `n` permits when someone waits.
    ///
    /// In fair mode the permits go from the releaser to the head of the line
    /// without passing through the balance: under the lock, they first repay
    /// any deficit (a balance below zero after `reduce_permits`), then serve
    /// the waiters in order, and only what is left is added to the balance.
    /// That saves the add and the take-back of two read-modify-writes on the
    /// state word, and the balance never shows permits in transit. It is the
    /// same as adding them and running [`distribute`](Self::distribute): with
    /// the lock held and `WAITERS` set, a fair balance is only above zero
    /// while an `add_permits` is between its addition and its own
    /// `distribute`, which serves those permits after us.
    ///
    /// In unfair mode permits always go to the balance, and the waiters who
    /// may compete for them are woken: the head alone, inline, in the common
    /// case where the spare balance is exactly its request; otherwise by
    /// `distribute`.
    #[cold]
    #[inline(never)]
    pub(super) fn release_to_waiters(&self, n: usize) -> isize {
        let mut list = lock(&self.waiters);
        let cur = self.state.load(Ordering::Acquire);
        let reported = balance(cur) + n as isize;
        let waker = if self.fair() {
            // SAFETY: `list` is this semaphore's list, from our guard.
            match unsafe { self.grant_head_whole(&mut list, cur, n) } {
                Some(waker) => waker,
                None => {
                    self.release_rest(list, cur, n);
                    return reported;
                }
            }
        } else {
            // Unfair: permits always go to the balance.
            if self.add_balance(n).is_err() {
                self.distribute_and_unlock(list);
                self.overflow(n);
            }
            // SAFETY: `list` is this semaphore's list, from our guard.
            match unsafe { self.notify_head_alone(&mut list) } {
                Some(waker) => waker,
                None => {
                    self.distribute_and_unlock(list);
                    return reported;
                }
            }
        };
        drop(list);
        if let Some(waker) = waker {
            wake(waker);
        }
        reported
    }

    /// `add_permits` on a fair semaphore that has waiters: as a release,
    /// the head owed exactly `n` is served directly under the lock; in any
    /// other case the permits are added to the balance (checked, as
    /// `add_permits` does) and `distribute` serves whoever they cover.
    #[cold]
    #[inline(never)]
    pub(super) fn add_to_waiters(&self, n: usize) {
        let mut list = lock(&self.waiters);
        let cur = self.state.load(Ordering::Acquire);
        // SAFETY: `list` is this semaphore's list, from our guard.
        if let Some(waker) = unsafe { self.grant_head_whole(&mut list, cur, n) } {
            drop(list);
            if let Some(waker) = waker {
                wake(waker);
            }
            return;
        }
        self.add_rest(list, n);
    }

    /// The rest of [`add_to_waiters`](Self::add_to_waiters), with the lock
    /// held (`list` is its guard).
    #[cold]
    #[inline(never)]
    fn add_rest<'a>(&'a self, list: MutexGuard<'a, List<Waiter>>, n: usize) {
        // An overflow changes nothing, and panics with the lock released
        // (the panic hook is user code).
        if self.try_add_checked(n).is_err() {
            drop(list);
            Self::add_overflow(n);
        }
        self.distribute_and_unlock(list);
    }

    /// The common fair hand-off (the callers have checked fairness),
    /// decided in a few compares: the semaphore is open, serves the oldest
    /// first, has no deficit to repay,
    /// and its head is owed exactly `n`. Then the head is unlinked and
    /// marked granted (and if it was the last waiter, `WAITERS` cleared, as
    /// `distribute` clears it on an empty line), and its waker returned (the
    /// outer `Some`), to wake once the lock is released. `None` (nothing
    /// done) in every other case, which [`release_rest`](Self::release_rest)
    /// or [`add_rest`](Self::add_rest) handles. The last waiter is the
    /// common case with few tasks (two tasks passing one permit back and
    /// forth hand it to a line of one every time), where `release_rest`
    /// and its batch cost more.
    ///
    /// The same as adding `n` to the balance and running `distribute`: with
    /// the lock held and `WAITERS` set, a fair balance is only above zero
    /// while an `add_permits` is between its addition and its own
    /// `distribute`, which serves those permits after us.
    ///
    /// Inlined into both callers, and kept out of the paths with a batch of
    /// wakers: a function that holds one saves six registers and half a
    /// kilobyte of stack on entry, which was a fifth of this path's
    /// instructions.
    ///
    /// # Safety
    ///
    /// `list` must be this semaphore's list, borrowed from its lock guard,
    /// and `cur` a value of the state word read with the lock held. Only
    /// for a fair semaphore (both callers check it first).
    #[inline(always)]
    unsafe fn grant_head_whole(
        &self,
        list: &mut List<Waiter>,
        cur: usize,
        n: usize,
    ) -> Option<Option<Waker>> {
        debug_assert!(self.fair(), "only a fair semaphore hands off directly");
        if cur & (CLOSED | WAITERS) != WAITERS || balance(cur) < 0 {
            return None;
        }
        let head = list.front()?;
        // SAFETY: `head` is linked, so it is alive, and we hold the lock.
        let waiter = unsafe { head.as_ref() };
        if waiter.remaining() != n || self.newest.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: our guard's list (the caller's contract), and `waiter`
        // its head.
        let waker = unsafe { self.grant_next(list, waiter) };
        if list.is_empty() {
            // Invariant W: the lock is held, and the line is now empty.
            self.state.fetch_and(!WAITERS, Ordering::Relaxed);
        }
        Some(waker)
    }

    /// The common unfair release, after its permits went to the balance:
    /// the spare balance (less the permits promised to woken waiters) is
    /// exactly the head's request. Then the head alone is unlinked and
    /// marked notified, without a batch (`distribute` would stop at the
    /// next one, with no spare left, or clear `WAITERS` on the empty line,
    /// which this does too), and its waker returned (the outer `Some`).
    /// `None`, nothing done, in every other case: the caller runs
    /// `distribute`. The last waiter is the common case with two tasks on
    /// one permit, where `distribute` and its batch cost more.
    ///
    /// If the spare grows after our reads (an `add_permits` without the
    /// lock, or a woken waiter lowering `notified`), that `add_permits`
    /// distributes after us, and that waiter either takes the permits or
    /// re-queues asking for more than the balance: no permit is left
    /// unclaimed while everyone sleeps.
    ///
    /// # Safety
    ///
    /// `list` must be this semaphore's list, borrowed from its lock guard.
    #[inline(always)]
    unsafe fn notify_head_alone(&self, list: &mut List<Waiter>) -> Option<Option<Waker>> {
        let head = list.front()?;
        // SAFETY: `head` is linked, so it is alive, and we hold the lock.
        let waiter = unsafe { head.as_ref() };
        let now = self.state.load(Ordering::Acquire);
        let spare = balance(now) - self.notified.load(Ordering::Relaxed) as isize;
        let need = waiter.remaining();
        if now & CLOSED != 0 || need as isize != spare {
            return None;
        }
        // SAFETY: our guard's list (the caller's contract), and `waiter`
        // its head.
        let waker = unsafe { self.notify_head(list, waiter, need) };
        if list.is_empty() {
            // Invariant W: the lock is held, and the line is now empty.
            self.state.fetch_and(!WAITERS, Ordering::Relaxed);
        }
        Some(waker)
    }

    /// The rest of [`release_to_waiters`](Self::release_to_waiters), with
    /// the lock held (`list` is its guard) and `cur` the state word read
    /// under it, in fair mode: closed, an empty line, a deficit, a head
    /// owed more or less than `n`, or serving the newest first.
    #[cold]
    #[inline(never)]
    fn release_rest<'a>(
        &'a self,
        mut list: MutexGuard<'a, List<Waiter>>,
        mut cur: usize,
        n: usize,
    ) {
        debug_assert!(self.fair(), "an unfair release does not get here");
        if cur & (CLOSED | WAITERS) != WAITERS {
            // Closed, or the line emptied before we got the lock.
            let added = self.add_balance(n);
            self.distribute_and_unlock(list);
            if added.is_err() {
                self.overflow(n);
            }
            return;
        }
        let mut left = n;
        // Repay the deficit first. `reduce_permits` and `add_permits` may
        // change the balance without the lock, hence the CAS loop.
        while left > 0 && balance(cur) < 0 {
            let repay = left.min(balance(cur).unsigned_abs());
            match self.state.compare_exchange_weak(
                cur,
                cur.wrapping_add(units(repay)),
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    left -= repay;
                    cur = cur.wrapping_add(units(repay));
                }
                Err(actual) => cur = actual,
            }
        }
        // The common case first: the head is owed exactly what is left after
        // the deficit, and others still wait behind it. One waker, woken
        // with the lock released, and no batch.
        if left > 0 {
            if let Some(node) = self.next_served(&list, left) {
                // SAFETY: `node` is linked, so it is alive, and we hold the lock.
                let waiter = unsafe { node.as_ref() };
                if waiter.remaining() == left && list.len() > 1 {
                    // SAFETY: our guard's list, and `waiter` linked in it.
                    let waker = unsafe { self.grant_next(&mut list, waiter) };
                    drop(list);
                    if let Some(waker) = waker {
                        wake(waker);
                    }
                    return;
                }
            }
        }
        let mut wakers = WakeList::new();
        while left > 0 && wakers.can_push() {
            let Some(node) = self.next_served(&list, left) else {
                break;
            };
            // SAFETY: `node` is linked, so it is alive, and we hold the lock.
            let waiter = unsafe { node.as_ref() };
            let need = waiter.remaining();
            if left < need {
                // Only the head is served in part (`next_served`).
                waiter.set_remaining(need - left);
                left = 0;
                break;
            }
            left -= need;
            // SAFETY: our guard's list, and `waiter` linked in it.
            if let Some(waker) = unsafe { self.grant_next(&mut list, waiter) } {
                wakers.push(waker);
            }
        }
        if left == 0 && !list.is_empty() {
            drop(list);
            wakers.wake_all();
            wakers.resume_panic();
            return;
        }
        // Permits left over, or the line is now empty: the rest goes to the
        // balance, and `distribute` serves whoever the full batch of wakers
        // held back, or clears `WAITERS`.
        let added = if left > 0 {
            self.add_balance(left)
        } else {
            Ok(0)
        };
        self.distribute_and_unlock_with(list, &mut wakers);
        if added.is_err() {
            self.overflow(left);
        }
        wakers.resume_panic();
    }

    /// Adds `n` to the balance and returns the word it replaced, or undoes
    /// the addition if it took the balance past `MAX_PERMITS`.
    #[inline]
    pub(super) fn add_balance(&self, n: usize) -> Result<usize, Overflow> {
        // SeqCst rather than Release: the bulkhead pairs this with a SeqCst
        // load of its idle-waiter count (a store-load handshake), and on the
        // common targets an RMW costs the same either way.
        let prev = self.state.fetch_add(units(n), Ordering::SeqCst);
        if balance(prev) + n as isize > Self::MAX_PERMITS as isize {
            self.state.fetch_sub(units(n), Ordering::Relaxed);
            return Err(Overflow);
        }
        Ok(prev)
    }

    /// Reports an addition that [`add_balance`](Self::add_balance) refused.
    #[cold]
    #[inline(never)]
    #[track_caller]
    pub(super) fn overflow(&self, n: usize) -> ! {
        panic!("returning {n} permits would take the balance above Semaphore::MAX_PERMITS");
    }

    /// Fair mode: the waiter the next hand-off of `available` permits
    /// serves. The head; or, while [serving the newest
    /// first](Semaphore::set_serve_newest), the tail if `available` covers
    /// all it still needs. So only the head is ever served in part, as in
    /// FIFO order. `None` if nobody waits. Must be called with the lock
    /// held (`list` is its guard's list).
    #[inline]
    fn next_served(&self, list: &List<Waiter>, available: usize) -> Option<NonNull<Waiter>> {
        let head = list.front()?;
        if self.newest.load(Ordering::Relaxed) {
            if let Some(tail) = list.back() {
                // SAFETY: `tail` is linked, so it is alive, and we hold the
                // lock.
                if unsafe { tail.as_ref() }.remaining() <= available {
                    return Some(tail);
                }
            }
        }
        Some(head)
    }

    /// Fair mode: unlinks `waiter` (the one [`next_served`](Self::next_served)
    /// picked), served in full, and marks it granted. Returns its waker, to
    /// wake once the lock is released.
    ///
    /// # Safety
    ///
    /// `list` must be this semaphore's list, borrowed from its lock guard,
    /// and `waiter` linked in it. (A node not linked here would be marked
    /// granted while still linked elsewhere, and its owner could free it.)
    #[inline]
    pub(super) unsafe fn grant_next(
        &self,
        list: &mut List<Waiter>,
        waiter: &Waiter,
    ) -> Option<Waker> {
        // SAFETY: the caller guarantees `waiter` is linked in `list`.
        unsafe { list.remove(NonNull::from(waiter)) };
        self.queued.store(list.len(), Ordering::Relaxed);
        // Just unlinked under the lock: `grant` is the last use of the node.
        waiter.grant()
    }

    /// Unfair mode: unlinks the head `waiter`, whose request of `need` the
    /// spare balance covers, counts it as notified and marks it so. Returns
    /// its waker, to wake once the lock is released.
    ///
    /// # Safety
    ///
    /// As [`grant_next`](Self::grant_next), and `waiter` must be the head.
    #[inline]
    pub(super) unsafe fn notify_head(
        &self,
        list: &mut List<Waiter>,
        waiter: &Waiter,
        need: usize,
    ) -> Option<Waker> {
        let head = list.pop_front();
        debug_assert!(
            head == Some(NonNull::from(waiter)),
            "only the head is notified"
        );
        self.queued.store(list.len(), Ordering::Relaxed);
        // Counted before the node is marked: its owner subtracts once it
        // sees the mark.
        self.notified.fetch_add(need, Ordering::Relaxed);
        // Just unlinked under the lock: `notify` is the last use of the node.
        waiter.notify()
    }

    /// Runs [`distribute`](Self::distribute) to completion, waking each batch
    /// of served waiters with the lock released. If a waker panics, the
    /// others are woken all the same and the panic is resumed at the end.
    /// Out of line: it holds a batch of wakers, whose half kilobyte of
    /// stack and saved registers the single-waiter paths that call it on
    /// their way out must not pay.
    #[inline(never)]
    pub(super) fn distribute_and_unlock<'a>(&'a self, list: MutexGuard<'a, List<Waiter>>) {
        let mut wakers = WakeList::new();
        self.distribute_and_unlock_with(list, &mut wakers);
        wakers.resume_panic();
    }

    /// As [`distribute_and_unlock`](Self::distribute_and_unlock), with
    /// wakers already collected under the same lock, and leaving a panic
    /// caught from one of them in `wakers` for the caller to resume.
    pub(super) fn distribute_and_unlock_with<'a>(
        &'a self,
        mut list: MutexGuard<'a, List<Waiter>>,
        wakers: &mut WakeList,
    ) {
        loop {
            let done = self.distribute(&mut list, wakers);
            drop(list);
            wakers.wake_all();
            if done {
                return;
            }
            list = lock(&self.waiters);
        }
    }

    /// Serves the head of the line from the balance: in fair mode by handing
    /// permits over, in unfair mode by waking waiters to compete for them
    /// (see [`notify_unfair`](Self::notify_unfair)). Pushes the wakers of
    /// the waiters it unlinked onto `wakers`, and clears `WAITERS` once the
    /// line is empty. Does nothing once the semaphore is closed: the waiters
    /// left belong to `close`. Returns `false` if it stopped because `wakers`
    /// is full (call it again after waking them), `true` once nothing more
    /// can be done.
    ///
    /// Must be called with the lock held (`list` is its guard).
    #[inline]
    pub(super) fn distribute(&self, list: &mut List<Waiter>, wakers: &mut WakeList) -> bool {
        if self.fair() {
            self.hand_off(list, wakers)
        } else {
            self.notify_unfair(list, wakers)
        }
    }

    /// Fair mode: hands permits from the balance to the waiters at the head
    /// of the line (or, while serving the newest first, at its tail; see
    /// [`next_served`](Self::next_served)), in parts to the head if need
    /// be. A waiter served in full
    /// is unlinked, marked granted and its waker collected. Contract as
    /// [`distribute`](Self::distribute).
    pub(super) fn hand_off(&self, list: &mut List<Waiter>, wakers: &mut WakeList) -> bool {
        'pick: loop {
            let Some(head) = list.front() else {
                self.state.fetch_and(!WAITERS, Ordering::Relaxed);
                return true;
            };
            // Look at the word before the head: with many waiters the head
            // node is cold in cache, and usually there is nothing to give.
            let mut cur = self.state.load(Ordering::Acquire);
            if cur & CLOSED != 0 || balance(cur) <= 0 {
                return true;
            }
            if !wakers.can_push() {
                return false;
            }
            // The head, or the tail while serving the newest first.
            let node = self
                .next_served(list, balance(cur) as usize)
                .unwrap_or(head);
            // SAFETY: `node` is linked, so it is alive, and we hold the lock.
            let waiter = unsafe { node.as_ref() };
            let need = waiter.remaining();
            let take = loop {
                // Once closed, every waiter still linked is `close`'s to fail
                // (it may be between wake-up batches): hand out nothing.
                if cur & CLOSED != 0 {
                    return true;
                }
                let available = balance(cur);
                if available <= 0 {
                    return true;
                }
                let take = (available as usize).min(need);
                if take < need && node != head {
                    // The balance fell (`reduce_permits`) since the tail
                    // was picked for a whole hand-off: only the head is
                    // served in part, so pick again.
                    continue 'pick;
                }
                match self.state.compare_exchange_weak(
                    cur,
                    cur - units(take),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break take,
                    Err(actual) => cur = actual,
                }
            };
            if take < need {
                waiter.set_remaining(need - take);
                return true;
            }
            // SAFETY: the caller holds the lock (`list` is its guard's list),
            // and `waiter` is linked in it.
            if let Some(waker) = unsafe { self.grant_next(list, waiter) } {
                wakers.push(waker);
            }
        }
    }

    /// Unfair mode: hands nothing over. Permits stay in the balance, where
    /// any acquirer may take them, and the waiters at the head of the line
    /// whose requests the balance covers are unlinked, marked notified and
    /// their wakers collected; each then polls and competes for the permits
    /// with newcomers, and one that loses goes back to the front of the line.
    /// Permits already promised to notified waiters that have not polled yet
    /// (`notified`) do not count, so a release wakes at most as many
    /// waiters as it has permits for. Stops at the first waiter the spare
    /// balance does not cover: waiters are woken in order and in full.
    /// Contract as [`distribute`](Self::distribute).
    pub(super) fn notify_unfair(&self, list: &mut List<Waiter>, wakers: &mut WakeList) -> bool {
        loop {
            let Some(node) = list.front() else {
                self.state.fetch_and(!WAITERS, Ordering::Relaxed);
                return true;
            };
            let cur = self.state.load(Ordering::Acquire);
            if cur & CLOSED != 0 {
                return true;
            }
            let spare = balance(cur) - self.notified.load(Ordering::Relaxed) as isize;
            if spare <= 0 {
                return true;
            }
            // SAFETY: `node` is linked, so it is alive, and we hold the lock.
            let waiter = unsafe { node.as_ref() };
            let need = waiter.remaining();
            if need as isize > spare {
                return true;
            }
            if !wakers.can_push() {
                return false;
            }
            // SAFETY: the caller holds the lock (`list` is its guard's list),
            // and `waiter` is its head.
            if let Some(waker) = unsafe { self.notify_head(list, waiter, need) } {
                wakers.push(waker);
            }
        }
    }
}
