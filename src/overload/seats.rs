//! Priority classes with reserved, borrowable seats (Kubernetes API
//! Priority and Fairness; Stripe keeping capacity for critical traffic).
//!
//! A bulkhead's `limit` seats are split among `N` classes by their shares:
//! class `c` is *guaranteed* `nominal(c)` seats (the shares' proportions of
//! the limit, rounded so that they add up to it exactly). Class 0 is the
//! most important, class `N - 1` the least. [`Seats`] counts the seats
//! each class holds and the waiters each has; the waiting line itself
//! (who exactly waits, in what order within a class) is its owner's.
//!
//! The rules, and what they guarantee:
//!
//! * **Idle seats are lent.** A caller that finds a seat free and nobody
//!   waiting takes it, whatever its class and however many it holds
//!   already ([`try_take`](Seats::try_take)): no seat sits idle while
//!   someone could use it.
//! * **A freed seat goes to an owner first.** When a seat frees
//!   ([`release`](Seats::release), then [`pick`](Seats::pick)), it goes
//!   to the most important class that has waiters and holds fewer seats
//!   than its nominal share; only if there is none, to the most important
//!   class with waiters (which then borrows). This is what "borrowed
//!   capacity is returned as soon as the owner asks" means with seats that
//!   are held for a whole call and cannot be taken back mid-call: no
//!   borrower gets another seat while an owner under its share waits, and
//!   the owner gets the very next seat that frees, unless a more important
//!   owner under its share is also waiting. So a class that asks for its
//!   nominal share gets it after at most that many releases plus the
//!   shortfalls of the more important classes (**a class always gets its
//!   reserved share when it asks**), however many seats others borrowed
//!   and however many of their callers wait.
//! * **A more important class never waits behind a less important one**:
//!   a seat goes to a less important class while a more important one
//!   waits only when the less important one takes back one of its own
//!   nominal seats and the more important one already holds its share
//!   (and would be borrowing). Borrowing itself goes by importance.
//! * **The least important are shed first.** With a bounded line
//!   (`max_queue`) that is full, a caller displaces a waiter of the least
//!   important class below its own ([`join`](Seats::join) returns
//!   [`Join::Displaced`]); a caller with nobody less important to
//!   displace is rejected.
//!
//! A call takes one seat; wider calls (weighted permits) counting as
//! several seats, as Kubernetes' do, are not modelled yet.

/// What [`Seats::join`] decided for a caller that must wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// It waits in line.
    Queued,
    /// The line was full: it waits, and one waiter of this (less
    /// important) class must leave the line, rejected (the owner picks
    /// which; the newest of its class is the natural choice). Already
    /// counted: do not call [`Seats::leave`] for it.
    Displaced(usize),
    /// The line is full of callers at least as important: reject it.
    Full,
}

/// The seats of one bulkhead among priority classes (see the
/// [module notes](self)).
#[derive(Debug, Clone)]
pub(crate) struct Seats {
    limit: usize,
    /// The classes' shares, as given (at least one non-zero).
    shares: Vec<u32>,
    /// Guaranteed seats per class; they add up to `limit`.
    nominal: Vec<usize>,
    /// Seats held per class; they add up to `in_use`.
    held: Vec<usize>,
    /// Waiters per class; they add up to `queued`.
    waiting: Vec<usize>,
    in_use: usize,
    queued: usize,
    max_queue: Option<usize>,
}

impl Seats {
    /// `limit` seats shared among `shares.len()` classes in proportion to
    /// `shares` (class 0 first, the most important), with a line of at
    /// most `max_queue` waiters (`None`: unbounded).
    ///
    /// # Panics
    ///
    /// If there is no class, or every share is zero.
    pub(crate) fn new(limit: usize, shares: &[u32], max_queue: Option<usize>) -> Self {
        assert!(
            shares.iter().any(|&s| s > 0),
            "priority classes need at least one non-zero share"
        );
        let n = shares.len();
        Self {
            limit,
            shares: shares.to_vec(),
            nominal: split(limit, shares),
            held: vec![0; n],
            waiting: vec![0; n],
            in_use: 0,
            queued: 0,
            max_queue,
        }
    }

    /// Changes the limit, and with it the nominal seats. Seats held above
    /// a lower limit stay held (no call is cut short); nobody is served
    /// until they are back under it. After raising it, [`pick`](Self::pick)
    /// until it returns `None`.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        self.nominal = split(limit, &self.shares);
    }

    /// The number of classes.
    pub(crate) fn classes(&self) -> usize {
        self.nominal.len()
    }

    /// The seats `class` is guaranteed.
    pub(crate) fn nominal(&self, class: usize) -> usize {
        self.nominal[class]
    }

    /// The seats `class` holds.
    pub(crate) fn held(&self, class: usize) -> usize {
        self.held[class]
    }

    /// The waiters of `class`.
    pub(crate) fn waiting(&self, class: usize) -> usize {
        self.waiting[class]
    }

    /// All waiters.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// Seats free now.
    pub(crate) fn free(&self) -> usize {
        self.limit.saturating_sub(self.in_use)
    }

    /// Seats held, all classes together.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// Takes a seat for a caller of `class` at once, if one is free and
    /// nobody waits (a waiter is served before a newcomer; the owner hands
    /// free seats to waiters with [`pick`](Self::pick)).
    #[inline]
    pub(crate) fn try_take(&mut self, class: usize) -> bool {
        if self.in_use < self.limit && self.queued == 0 {
            self.held[class] += 1;
            self.in_use += 1;
            true
        } else {
            false
        }
    }

    /// A caller of `class` that could not take a seat joins the line.
    pub(crate) fn join(&mut self, class: usize) -> Join {
        if self.max_queue.is_none_or(|max| self.queued < max) {
            self.waiting[class] += 1;
            self.queued += 1;
            return Join::Queued;
        }
        match (class + 1..self.classes())
            .rev()
            .find(|&c| self.waiting[c] > 0)
        {
            Some(victim) => {
                self.waiting[victim] -= 1;
                self.waiting[class] += 1;
                Join::Displaced(victim)
            }
            None => Join::Full,
        }
    }

    /// A waiter of `class` left the line without a seat (its caller gave
    /// up, its wait timed out, its future was dropped).
    pub(crate) fn leave(&mut self, class: usize) {
        debug_assert!(
            self.waiting[class] > 0,
            "a waiter left a class nobody waits in"
        );
        self.waiting[class] -= 1;
        self.queued -= 1;
    }

    /// A seat held by `class` is given back (its call ended, or the seat
    /// was picked for a waiter that had gone meanwhile). Then
    /// [`pick`](Self::pick) who gets it.
    pub(crate) fn release(&mut self, class: usize) {
        debug_assert!(self.held[class] > 0, "a seat released that was not held");
        self.held[class] -= 1;
        self.in_use -= 1;
    }

    /// If a seat is free and someone waits, gives it to the class whose
    /// waiter is served next, and returns that class: the most important
    /// one under its nominal share, else the most important one waiting.
    /// The owner serves that class's next waiter; if it is gone (a
    /// cancellation racing the hand-off), [`release`](Self::release) the
    /// seat and pick again.
    pub(crate) fn pick(&mut self) -> Option<usize> {
        if self.in_use >= self.limit || self.queued == 0 {
            return None;
        }
        let waiting = |c: &usize| self.waiting[*c] > 0;
        let class = (0..self.classes())
            .filter(waiting)
            .find(|&c| self.held[c] < self.nominal[c])
            .or_else(|| (0..self.classes()).find(waiting))?;
        self.waiting[class] -= 1;
        self.queued -= 1;
        self.held[class] += 1;
        self.in_use += 1;
        Some(class)
    }
}

/// `limit` split in proportion to `shares`, by largest remainder (ties to
/// the more important class), so the parts add up to `limit` exactly.
fn split(limit: usize, shares: &[u32]) -> Vec<usize> {
    let total: u128 = shares.iter().map(|&s| u128::from(s)).sum();
    let limit_wide = limit as u128;
    let mut parts: Vec<usize> = shares
        .iter()
        .map(|&s| (limit_wide * u128::from(s) / total) as usize)
        .collect();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    // Largest remainder first; the sort is stable, so ties keep the more
    // important class first.
    order.sort_by_key(|&c| core::cmp::Reverse(limit_wide * u128::from(shares[c]) % total));
    let short = limit - parts.iter().sum::<usize>();
    for &c in order.iter().take(short) {
        parts[c] += 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn nominal_seats_add_up_to_the_limit() {
        assert_eq!(split(20, &[50, 30, 20]), [10, 6, 4]);
        assert_eq!(split(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(split(7, &[0, 1]), [0, 7]);
        assert_eq!(split(0, &[1, 2]), [0, 0]);
        assert_eq!(split(3, &[1, 1, 1, 1]), [1, 1, 1, 0]);
        let mut s = Seats::new(20, &[50, 30, 20], None);
        s.set_limit(9);
        assert_eq!((0..3).map(|c| s.nominal(c)).collect::<Vec<_>>(), [4, 3, 2]);
    }

    /// Fills every seat with class `class` callers.
    fn fill(s: &mut Seats, class: usize) {
        while s.try_take(class) {}
    }

    #[test]
    fn idle_seats_are_lent() {
        let mut s = Seats::new(10, &[50, 50], None);
        fill(&mut s, 1);
        assert_eq!(s.held(1), 10);
        assert_eq!(s.nominal(1), 5);
    }

    #[test]
    fn a_class_always_gets_its_reserved_share_when_it_asks() {
        // The low class borrowed every seat and has 100 more waiting; the
        // high class asks for its 6 seats.
        let mut s = Seats::new(10, &[60, 40], None);
        fill(&mut s, 1);
        for _ in 0..100 {
            assert_eq!(s.join(1), Join::Queued);
        }
        for _ in 0..6 {
            assert_eq!(s.join(0), Join::Queued);
        }
        // Each of the next 6 seats to free is the high class's.
        for got in 1..=6 {
            s.release(1);
            assert_eq!(s.pick(), Some(0));
            assert_eq!(s.held(0), got);
        }
        // Then the low class, back at its share of 4, gets the rest.
        s.release(1);
        assert_eq!(s.pick(), Some(1));
        assert_eq!((s.held(0), s.held(1)), (6, 4));
    }

    #[test]
    fn borrowed_capacity_is_returned_as_soon_as_the_owner_asks() {
        // The high class borrowed all seats; the low class (share 4)
        // asks: it gets the next seat, though more high callers wait.
        let mut s = Seats::new(10, &[60, 40], None);
        fill(&mut s, 0);
        for _ in 0..50 {
            s.join(0);
        }
        s.join(1);
        s.release(0);
        assert_eq!(s.pick(), Some(1));
        // At its share of 4 the low class takes back seat after seat.
        for _ in 0..3 {
            s.join(1);
        }
        for _ in 0..3 {
            s.release(0);
            assert_eq!(s.pick(), Some(1));
        }
        assert_eq!(s.held(1), 4);
        // Then no more: the low class borrows only what nobody more
        // important waits for.
        s.join(1);
        s.release(0);
        assert_eq!(s.pick(), Some(0));
    }

    #[test]
    fn borrowing_goes_by_importance() {
        let mut s = Seats::new(6, &[1, 1, 1], None);
        fill(&mut s, 2);
        s.release(2);
        s.release(2);
        // Classes 1 and 0 wait; both under their share of 2: class 0.
        s.join(1);
        s.join(0);
        assert_eq!(s.pick(), Some(0));
        assert_eq!(s.pick(), Some(1));
        // Both at share 1 of 2, and waiting again; class 2 holds 4.
        s.join(1);
        s.join(0);
        s.release(2);
        assert_eq!(s.pick(), Some(0));
        s.release(2);
        assert_eq!(s.pick(), Some(1));
        // Each holds its 2. A seat of class 1 (nobody waiting there)
        // frees: nobody waiting is under its share, class 0 borrows first.
        s.join(2);
        s.join(0);
        s.release(1);
        assert_eq!(s.pick(), Some(0));
        // A seat of class 2 frees: class 2 is under its share, and takes
        // it back before class 0, which is borrowing.
        s.join(0);
        s.release(2);
        assert_eq!(s.pick(), Some(2));
        assert_eq!((s.held(0), s.held(1), s.held(2)), (3, 1, 2));
    }

    #[test]
    fn the_least_important_are_shed_first() {
        let mut s = Seats::new(1, &[1, 1, 1], Some(3));
        assert!(s.try_take(2));
        assert_eq!(s.join(1), Join::Queued);
        assert_eq!(s.join(2), Join::Queued);
        assert_eq!(s.join(2), Join::Queued);
        // Full: class 0 displaces a class 2 waiter, twice; then class 1.
        assert_eq!(s.join(0), Join::Displaced(2));
        assert_eq!(s.join(0), Join::Displaced(2));
        assert_eq!(s.join(0), Join::Displaced(1));
        // Nobody less important left to displace.
        assert_eq!(s.join(0), Join::Full);
        assert_eq!(s.join(2), Join::Full);
        assert_eq!((s.waiting(0), s.waiting(1), s.waiting(2)), (3, 0, 0));
        assert_eq!(s.queued(), 3);
    }

    #[test]
    fn a_newcomer_does_not_pass_the_line() {
        let mut s = Seats::new(2, &[1, 1], None);
        fill(&mut s, 1);
        s.join(1);
        s.release(1);
        // The seat is free but someone waits: the newcomer queues.
        assert!(!s.try_take(0));
        assert_eq!(s.pick(), Some(1));
        assert_eq!(s.pick(), None);
    }

    #[test]
    fn a_hand_off_to_a_waiter_that_left_goes_to_the_next() {
        // Cancellation between `pick` and the waiter taking its seat: the
        // owner releases it and picks again.
        let mut s = Seats::new(1, &[1, 1], None);
        assert!(s.try_take(1));
        s.join(0);
        s.join(1);
        s.release(1);
        assert_eq!(s.pick(), Some(0));
        s.release(0); // the class 0 waiter was gone
        assert_eq!(s.pick(), Some(1));
        assert_eq!((s.in_use(), s.queued()), (1, 0));
        // Cancellation of a queued waiter: nothing to hand off.
        s.join(0);
        s.leave(0);
        s.release(1);
        assert_eq!(s.pick(), None);
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn a_lower_limit_serves_nobody_until_under_it() {
        let mut s = Seats::new(4, &[1, 1], None);
        fill(&mut s, 0);
        s.join(1);
        s.set_limit(2);
        s.release(0);
        assert_eq!(s.pick(), None);
        s.release(0);
        assert_eq!(s.pick(), None);
        s.release(0);
        assert_eq!(s.pick(), Some(1));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Arrive(usize),
        Leave(usize),
        Finish(usize),
        Limit(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize).prop_map(Op::Arrive),
            1 => (0..3usize).prop_map(Op::Leave),
            3 => (0..3usize).prop_map(Op::Finish),
            1 => (0..12usize).prop_map(Op::Limit),
        ]
    }

    proptest! {
        /// Any sequence of arrivals, cancellations, finished calls and
        /// limit changes, with the owner handing out free seats after
        /// each: the counts add up, no seat idles while someone waits, and
        /// every pick keeps both guarantees.
        #[test]
        // Hundreds of random cases, in safe code: nothing for Miri to check
        // that would be worth its hours.
        #[cfg_attr(miri, ignore)]
        fn every_pick_keeps_the_guarantees(
            shares in proptest::collection::vec(0..5u32, 3),
            ops in proptest::collection::vec(op(), 1..300),
            max_queue in proptest::option::of(0..8usize),
        ) {
            prop_assume!(shares.iter().any(|&s| s > 0));
            let mut s = Seats::new(6, &shares, max_queue);
            let mut limit = 6;
            for op in ops {
                match op {
                    Op::Arrive(c) => {
                        if !s.try_take(c) {
                            let before = s.queued();
                            match s.join(c) {
                                Join::Queued => prop_assert!(max_queue.is_none_or(|m| before < m)),
                                Join::Displaced(v) => {
                                    prop_assert!(v > c);
                                    prop_assert_eq!(s.queued(), before);
                                }
                                Join::Full => prop_assert!((c + 1..3).all(|v| s.waiting(v) == 0)),
                            }
                        }
                    }
                    Op::Leave(c) => if s.waiting(c) > 0 { s.leave(c) },
                    Op::Finish(c) => if s.held(c) > 0 { s.release(c) },
                    Op::Limit(l) => { s.set_limit(l); limit = l; }
                }
                loop {
                    let before: Vec<(usize, usize)> = (0..3).map(|c| (s.held(c), s.waiting(c))).collect();
                    let Some(c) = s.pick() else { break };
                    let (held, _) = before[c];
                    for (h, &(h_held, h_waiting)) in before.iter().enumerate().take(c) {
                        // A more important class waited: it was at or over
                        // its share, and `c` took back one of its own.
                        prop_assert!(
                            h_waiting == 0 || (h_held >= s.nominal(h) && held < s.nominal(c)),
                            "class {} served before class {} ({:?})", c, h, before
                        );
                    }
                    // An owner under its share waited: the seat is an owner's.
                    if held >= s.nominal(c) {
                        prop_assert!((0..3).all(|o| before[o].1 == 0 || before[o].0 >= s.nominal(o)));
                    }
                }
                prop_assert_eq!(s.in_use(), (0..3).map(|c| s.held(c)).sum::<usize>());
                prop_assert_eq!(s.queued(), (0..3).map(|c| s.waiting(c)).sum::<usize>());
                prop_assert!(s.queued() == 0 || s.in_use() >= limit, "a seat idles while someone waits");
                prop_assert_eq!((0..3).map(|c| s.nominal(c)).sum::<usize>(), limit);
            }
        }
    }
}
