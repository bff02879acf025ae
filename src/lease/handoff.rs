//! This process's waiters of a leased bulkhead with priority classes or
//! adaptive LIFO: the store grants leases in its own line's order, one
//! waiter's id at a time, and a waiter granted one hands it to the waiter
//! of this process it is owed to, if that is another (then goes back in
//! the store's line itself): one of a more important class, or while the
//! line stands under adaptive LIFO, the newest of its own. Only leases
//! move here, never a place in the store's line, so other processes see
//! the same line as without them.

use core::task::{Context, Poll, Waker};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use crate::loom::lock;

/// The waiters of one bulkhead, by class and arrival.
pub(super) struct LocalLine<P> {
    classes: usize,
    state: Mutex<State<P>>,
}

struct State<P> {
    /// Each waiter's slot, `None` once it left (reused).
    slots: Vec<Option<Slot<P>>>,
    /// The arrival number of the next waiter.
    next: u64,
}

struct Slot<P> {
    class: usize,
    arrival: u64,
    waker: Option<Waker>,
    /// A lease handed to this waiter and not taken yet.
    given: Option<P>,
}

impl<P> LocalLine<P> {
    /// A line of `classes` classes, 0 the most important.
    pub(super) fn new(classes: usize) -> Self {
        Self {
            classes,
            state: Mutex::new(State {
                slots: Vec::new(),
                next: 0,
            }),
        }
    }

    /// The class of a caller that names `class` (`None`: none): one past
    /// the last is the least important, as is a caller that names none.
    pub(super) fn class_of(&self, class: Option<usize>) -> usize {
        class.map_or(self.classes - 1, |c| c.min(self.classes - 1))
    }

    /// A waiter of `class` joins; it leaves when its place is dropped.
    pub(super) fn join(&self, class: usize) -> Place<'_, P> {
        let mut state = lock(&self.state);
        let arrival = state.next;
        state.next += 1;
        let slot = Some(Slot {
            class,
            arrival,
            waker: None,
            given: None,
        });
        let index = match state.slots.iter().position(Option::is_none) {
            Some(free) => {
                state.slots[free] = slot;
                free
            }
            None => {
                state.slots.push(slot);
                state.slots.len() - 1
            }
        };
        Place { line: self, index }
    }

    /// Puts `lease` in the slot of the waiter that is owed it (see
    /// [`owed`](State::owed)), and says what to wake it with (with no lock
    /// held: a waker is user code), or gives the lease back if no waiter
    /// is owed it.
    fn hand(&self, lease: P, before: Option<usize>, newest: bool) -> Result<Option<Waker>, P> {
        let mut state = lock(&self.state);
        let Some(to) = state.owed(before, newest) else {
            return Err(lease);
        };
        let slot = state.slots[to]
            .as_mut()
            .expect("the waiter owed a lease is in the line");
        slot.given = Some(lease);
        Ok(slot.waker.take())
    }
}

impl<P> State<P> {
    /// The waiter a lease goes to: of the waiters not handed one already,
    /// the first to arrive (`newest`: the last) of the most important
    /// class, if it is served before the waiter in slot `before` (any
    /// waiter, without it): its class is more important, or it is of the
    /// same class and, with `newest`, came later.
    fn owed(&self, before: Option<usize>, newest: bool) -> Option<usize> {
        let before = before.and_then(|b| self.slots[b].as_ref().map(|s| (s.class, s.arrival)));
        let order = |s: &Slot<P>| {
            let arrival = if newest {
                u64::MAX - s.arrival
            } else {
                s.arrival
            };
            (s.class, arrival)
        };
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
            .filter(|(_, s)| s.given.is_none())
            .filter(|(_, s)| {
                before.is_none_or(|(class, arrival)| {
                    s.class < class || (newest && s.class == class && s.arrival > arrival)
                })
            })
            .min_by_key(|(_, s)| order(s))
            .map(|(i, _)| i)
    }
}

/// A waiter's place in a [`LocalLine`]. Dropped, it leaves: a lease handed
/// to it and not taken goes to the next waiter owed one, or is dropped
/// (released in the background) if none is.
pub(super) struct Place<'a, P> {
    line: &'a LocalLine<P>,
    index: usize,
}

impl<P> Place<'_, P> {
    /// A lease handed to this waiter, if any; else it is woken when one
    /// is.
    pub(super) fn poll_given(&self, cx: &mut Context<'_>) -> Poll<P> {
        {
            let mut state = lock(&self.line.state);
            let slot = self.slot(&mut state);
            if let Some(lease) = slot.given.take() {
                return Poll::Ready(lease);
            }
            if slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
        }
        // Cloned, and the old one dropped, with no lock held.
        let waker = cx.waker().clone();
        let old = {
            let mut state = lock(&self.line.state);
            let slot = self.slot(&mut state);
            if let Some(lease) = slot.given.take() {
                return Poll::Ready(lease);
            }
            slot.waker.replace(waker)
        };
        drop(old);
        Poll::Pending
    }

    /// Hands `lease`, just granted to this waiter, to the waiter it is
    /// owed to if that is another (`Ok`: this one waits on), else gives it
    /// back; `newest` while the line stands under adaptive LIFO.
    pub(super) fn hand_on(&self, lease: P, newest: bool) -> Result<(), P> {
        // A waker that panics unwinds through the poll of this waiter: the
        // lease is the other one's already.
        self.line
            .hand(lease, Some(self.index), newest)
            .map(|waker| waker.map_or((), Waker::wake))
    }

    fn slot<'s>(&self, state: &'s mut State<P>) -> &'s mut Slot<P> {
        state.slots[self.index]
            .as_mut()
            .expect("a place is in the line until dropped")
    }
}

impl<P> Drop for Place<'_, P> {
    fn drop(&mut self) {
        let slot = lock(&self.line.state).slots[self.index].take();
        let Some(Slot { waker, given, .. }) = slot else {
            return;
        };
        // Handed to this waiter, which no longer wants it: the next waiter
        // owed a lease takes it, whatever its class; with none, it is
        // released in the background.
        let wake = given.and_then(|lease| self.line.hand(lease, None, false).ok().flatten());
        // With no lock held: wakers are user code. While unwinding, a panic
        // of theirs is not let out (it would abort the process); the waiter
        // it should have woken finds its lease at its next poll.
        let user_code = move || {
            drop(waker);
            if let Some(wake) = wake {
                wake.wake();
            }
        };
        if std::thread::panicking() {
            let _ = catch_unwind(AssertUnwindSafe(user_code));
        } else {
            user_code();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn cx_of(count: &Arc<Count>) -> Waker {
        Waker::from(count.clone())
    }

    #[test]
    fn a_lease_goes_to_the_first_of_the_most_important_class_only() {
        let line = LocalLine::<u32>::new(3);
        let low = line.join(2);
        let first = line.join(1);
        let second = line.join(1);
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = cx_of(&woken);
        let mut cx = Context::from_waker(&waker);
        assert!(first.poll_given(&mut cx).is_pending());
        // Granted to the least important: handed to the first of class 1.
        assert_eq!(low.hand_on(7, false), Ok(()));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert_eq!(first.poll_given(&mut cx), Poll::Ready(7));
        // Class 1 hands nothing to its own class, nor to a less important.
        assert_eq!(second.hand_on(8, false), Err(8));
        assert_eq!(line.class_of(None), 2);
        assert_eq!(line.class_of(Some(9)), 2);
        assert_eq!(line.class_of(Some(0)), 0);
    }

    struct Panics;

    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics");
        }
    }

    /// A receiver's waker that panics unwinds through the waiter that
    /// handed the lease on; the lease is the receiver's all the same, and
    /// the panicking waker dropped while unwinding does not abort.
    #[test]
    fn a_waker_that_panics_loses_no_lease() {
        let line = LocalLine::<u32>::new(2);
        let low = line.join(1);
        let high = line.join(0);
        let waker = Waker::from(Arc::new(Panics));
        assert!(
            high.poll_given(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let handed = catch_unwind(AssertUnwindSafe(|| low.hand_on(3, false)));
        assert!(handed.is_err(), "the waker's panic comes out");
        let noop = Waker::noop();
        assert_eq!(
            high.poll_given(&mut Context::from_waker(noop)),
            Poll::Ready(3)
        );
        // A lease handed to a waiter that leaves while a panic unwinds, the
        // next one's waker panicking too: not let out.
        assert!(
            low.poll_given(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            let leaving = line.join(0);
            drop(high);
            // Granted to `low`, handed to `leaving`, which then unwinds.
            low.hand_on(4, false)
                .unwrap_or_else(|_| panic!("no one owed it"));
            let _keep = leaving;
            panic!("the caller's own panic");
        }));
        assert!(unwound.is_err());
        assert_eq!(
            low.poll_given(&mut Context::from_waker(noop)),
            Poll::Ready(4)
        );
    }

    /// While the line stands under adaptive LIFO, the newest of a class
    /// is served first; a newer waiter of a less important class is not.
    #[test]
    fn newest_first_within_a_class() {
        let line = LocalLine::<u32>::new(2);
        let oldest = line.join(0);
        let newer = line.join(0);
        let newest = line.join(0);
        let less = line.join(1);
        assert_eq!(less.hand_on(1, true), Ok(()));
        assert_eq!(oldest.hand_on(2, true), Ok(()));
        assert_eq!(newer.hand_on(3, false), Err(3), "in arrival order");
        assert_eq!(newest.hand_on(4, true), Err(4), "nobody newer waits");
        let noop = Waker::noop();
        let mut cx = Context::from_waker(noop);
        assert_eq!(newest.poll_given(&mut cx), Poll::Ready(1));
        assert_eq!(newer.poll_given(&mut cx), Poll::Ready(2));
    }

    #[test]
    fn a_lease_handed_to_a_waiter_that_leaves_goes_to_the_next() {
        let line = LocalLine::<u32>::new(2);
        let low = line.join(1);
        let high = line.join(0);
        let other_low = line.join(1);
        assert_eq!(low.hand_on(5, false), Ok(()));
        drop(high);
        // Whatever its class: the lease was meant for this process.
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert_eq!(low.poll_given(&mut cx), Poll::Ready(5));
        assert!(other_low.poll_given(&mut cx).is_pending());
        drop(low);
        drop(other_low);
        assert!(lock(&line.state).slots.iter().all(Option::is_none));
    }
}
