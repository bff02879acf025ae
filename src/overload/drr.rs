//! Fair shares of a contended global limit among keys: deficit round
//! robin (Shreedhar and Varghese, 1995), for `KeyedBulkhead`'s global
//! stage.
//!
//! With a plain first-come line before the global limit, a noisy key that
//! sends most of the calls holds most of the line, and a quiet key's
//! callers wait behind all of it. [`Drr`] instead serves the keys that
//! have waiters in turns: on its turn a key is credited `quantum ×
//! weight`, and its waiters are served (oldest first) while the credit
//! covers the cost of the next one (one seat per call; more for a
//! weighted call); then the next key's turn comes, and what is left of
//! the credit is kept for the next turn. A key whose line empties loses
//! its credit, so nobody saves up turns while idle.
//!
//! What it guarantees: while keys have waiters, in every round (each of
//! them having had one turn) each is served `quantum × weight` worth of
//! seats, give or take one call's cost carried over to the next round;
//! with calls of one seat and a quantum of one, exactly `weight` calls. A
//! key that starts waiting is served within one round of the others. The
//! line within a key stays first come, first served, and who waits where
//! is the owner's: this counts waiters per key and picks the key.
//!
//! A key that leaves the rotation because its last waiter left is marked,
//! not looked for (O(1)); it is dropped when its turn comes up, or takes
//! its old place again if it has waiters by then.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// One key's place in the rotation.
#[derive(Debug, Clone)]
struct Flow {
    weight: u64,
    /// Credit left from earlier turns (seats).
    deficit: u64,
    waiting: usize,
}

/// Deficit round robin over keys (see the [module notes](self)).
#[derive(Debug, Clone)]
pub(crate) struct Drr<K> {
    quantum: u64,
    /// The keys in the rotation (with waiters, or marked to leave it when
    /// their turn comes). A key is here at most once, exactly when it is
    /// in `flows`.
    rotation: VecDeque<K>,
    flows: HashMap<K, Flow>,
    /// Whether the key at the front of `rotation` was credited for the
    /// turn it is having.
    credited: bool,
}

impl<K: Hash + Eq + Clone> Drr<K> {
    /// A rotation crediting `quantum` seats per unit of weight per turn
    /// (at least 1; 1 for calls of one seat).
    pub(crate) fn new(quantum: u64) -> Self {
        Self {
            quantum: quantum.max(1),
            rotation: VecDeque::new(),
            flows: HashMap::new(),
            credited: false,
        }
    }

    /// A waiter of `key` joins the line; `weight` (at least 1) is the
    /// key's weight from now on.
    pub(crate) fn join(&mut self, key: K, weight: u32) {
        let weight = u64::from(weight.max(1));
        if let Some(flow) = self.flows.get_mut(&key) {
            flow.weight = weight;
            flow.waiting += 1;
            return;
        }
        self.rotation.push_back(key.clone());
        self.flows.insert(
            key,
            Flow {
                weight,
                deficit: 0,
                waiting: 1,
            },
        );
    }

    /// A waiter of `key` left the line unserved (its caller gave up, its
    /// wait timed out, its future was dropped).
    pub(crate) fn leave(&mut self, key: &K) {
        let flow = self
            .flows
            .get_mut(key)
            .expect("a waiter left a key that has none");
        flow.waiting -= 1;
        if flow.waiting == 0 {
            flow.deficit = 0;
        }
    }

    #[cfg(test)]
    /// The waiters of `key`.
    pub(crate) fn waiting(&self, key: &K) -> usize {
        self.flows.get(key).map_or(0, |f| f.waiting)
    }

    /// The key whose oldest waiter gets the seats that just freed, if
    /// anyone waits; `cost(key)` is the seats that waiter needs (1 for a
    /// plain call). Counts that waiter as served.
    pub(crate) fn next(&mut self, mut cost: impl FnMut(&K) -> u64) -> Option<K> {
        loop {
            let key = self.rotation.front()?;
            let flow = self
                .flows
                .get_mut(key)
                .expect("a key in the rotation has a flow");
            if flow.waiting == 0 {
                // Left the line since it was last looked at.
                let key = self.rotation.pop_front().expect("the front was just seen");
                self.flows.remove(&key);
                self.credited = false;
                continue;
            }
            if !self.credited {
                flow.deficit = flow
                    .deficit
                    .saturating_add(self.quantum.saturating_mul(flow.weight));
                self.credited = true;
            }
            let need = cost(key).max(1);
            if flow.deficit >= need {
                flow.deficit -= need;
                flow.waiting -= 1;
                let key = key.clone();
                if flow.waiting == 0 {
                    self.rotation.pop_front();
                    self.flows.remove(&key);
                    self.credited = false;
                }
                return Some(key);
            }
            // Its turn is over: the rest of the credit waits for the next.
            let key = self.rotation.pop_front().expect("the front was just seen");
            self.rotation.push_back(key);
            self.credited = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Serves `n` waiters of unit cost; returns the keys in order.
    fn serve(drr: &mut Drr<&'static str>, n: usize) -> Vec<&'static str> {
        (0..n).map(|_| drr.next(|_| 1).unwrap()).collect()
    }

    fn backlog(drr: &mut Drr<&'static str>, key: &'static str, weight: u32, n: usize) {
        for _ in 0..n {
            drr.join(key, weight);
        }
    }

    #[test]
    fn a_key_gets_its_weighted_share_within_one_round() {
        let mut drr = Drr::new(1);
        backlog(&mut drr, "noisy", 3, 1000);
        backlog(&mut drr, "quiet", 1, 1000);
        backlog(&mut drr, "mid", 2, 1000);
        // Every round (3 + 1 + 2 seats), exactly its weight to each.
        for _ in 0..100 {
            let round = serve(&mut drr, 6);
            assert_eq!(round, ["noisy", "noisy", "noisy", "quiet", "mid", "mid"]);
        }
    }

    #[test]
    fn a_noisy_key_cannot_fill_the_line() {
        // The noisy key came first with 1000 waiters; a quiet key's one
        // caller is served within the noisy key's one turn.
        let mut drr = Drr::new(1);
        backlog(&mut drr, "noisy", 1, 1000);
        assert_eq!(serve(&mut drr, 1), ["noisy"]);
        drr.join("quiet", 1);
        assert_eq!(serve(&mut drr, 2), ["quiet", "noisy"]);
        assert_eq!(drr.waiting(&"quiet"), 0);
    }

    #[test]
    fn weighted_calls_are_charged_their_cost() {
        // Key a's calls need 3 seats, b's 1; equal weights, quantum 4:
        // per round, both get 4 seats' worth on average, the remainder
        // carried over.
        let mut drr = Drr::new(4);
        backlog(&mut drr, "a", 1, 1000);
        backlog(&mut drr, "b", 1, 1000);
        let mut seats: HashMap<&str, u64> = HashMap::new();
        let cost = |k: &&str| if *k == "a" { 3 } else { 1 };
        for round in 1..=30u64 {
            // One round: until b's turn has passed once more.
            loop {
                let k = drr.next(cost).unwrap();
                *seats.entry(k).or_default() += cost(&k);
                if k == "b" && seats["b"] == 4 * round {
                    break;
                }
            }
            let a = seats["a"];
            assert!(
                a + 3 > 4 * round && a <= 4 * round,
                "round {round}: a had {a}"
            );
        }
    }

    #[test]
    fn an_emptied_key_loses_its_credit_and_its_place() {
        let mut drr = Drr::new(1);
        backlog(&mut drr, "a", 5, 2);
        backlog(&mut drr, "b", 1, 10);
        // a had 5 seats of credit and used 2: the 3 left go with its line.
        assert_eq!(serve(&mut drr, 3), ["a", "a", "b"]);
        backlog(&mut drr, "a", 5, 10);
        // b's turn is over; a comes back with a fresh credit of 5, not 8.
        assert_eq!(serve(&mut drr, 7), ["a", "a", "a", "a", "a", "b", "a"]);
    }

    #[test]
    fn waiters_that_leave_are_skipped() {
        let mut drr = Drr::new(1);
        backlog(&mut drr, "a", 1, 1);
        backlog(&mut drr, "b", 1, 2);
        backlog(&mut drr, "c", 1, 1);
        drr.leave(&"a");
        drr.leave(&"c");
        assert_eq!(serve(&mut drr, 2), ["b", "b"]);
        assert_eq!(drr.next(|_| 1), None);
        // A key that left and came back before its turn keeps its place.
        backlog(&mut drr, "x", 1, 1);
        backlog(&mut drr, "y", 1, 1);
        drr.leave(&"x");
        drr.join("x", 1);
        assert_eq!(serve(&mut drr, 2), ["x", "y"]);
        assert!(drr.flows.is_empty() && drr.rotation.is_empty());
    }
}
