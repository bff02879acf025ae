//! Model-based randomized test of [`Semaphore`].
//!
//! Each case builds one semaphore (fair or unfair, 0 to 5 permits) and runs
//! a random sequence of operations on it: acquire futures created, polled
//! by hand and dropped at any point; `try_acquire*`; permits dropped,
//! forgotten, split and merged; `add_permits`, `reduce_permits`,
//! `forget_permits`, `drain_permits`, `close` and `set_serve_newest`. Everything runs on the
//! test thread, so every step is deterministic.
//!
//! The same steps drive [`Model`], a few lines of plain code that encode the
//! documented semantics (strict FIFO with partial hand-off when fair, or
//! while serving the newest first, the newest waiter when the permits
//! cover all it needs and else the oldest, in part; when
//! not, barging, and releases that hand nothing over but wake waiters in
//! order, each once the spare balance covers its whole request, to compete
//! for it). After every step the test checks
//! that the semaphore and the model agree on the balance, the queue length,
//! whether it is closed, which futures are ready and with how many permits,
//! which fail, which wakers fired, and that no permit was created or lost:
//!
//! ```text
//! balance + held by guards + handed to unfinished futures
//!     == initial + added - reduced - forgotten by forget/drain - forgotten guards
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::future::FusedFuture;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use watertight::futures::{Acquire, AcquireOwned};
use watertight::{AcquireError, OwnedPermit, Permit, Semaphore, TryAcquireError};

// ---------------------------------------------------------------------------
// The operations
// ---------------------------------------------------------------------------

/// One step of a test case. Indices pick among the futures or permits alive
/// at that moment; a step whose target does not exist does nothing.
#[derive(Clone, Debug)]
enum Op {
    /// `acquire()` (`n == None`) or `acquire_many(n)`, borrowed or owned,
    /// optionally polled once right away.
    Acquire {
        n: Option<usize>,
        owned: bool,
        poll: bool,
    },
    /// `try_acquire()` or `try_acquire_many(n)`, borrowed or owned.
    TryAcquire {
        n: Option<usize>,
        owned: bool,
    },
    /// Polls a live future, with its own waker or a fresh one.
    Poll {
        fut: Index,
        new_waker: bool,
    },
    /// Drops a live future, polled or not.
    DropFuture(Index),
    /// Drops a permit guard: its permits go back.
    DropPermit(Index),
    /// `Permit::forget`: its permits are gone for good.
    ForgetPermit(Index),
    /// `Permit::split(n)`.
    Split {
        permit: Index,
        n: usize,
    },
    /// `Permit::merge`, when both guards are of the same kind.
    Merge {
        into: Index,
        from: Index,
    },
    AddPermits(usize),
    ReducePermits(usize),
    ForgetPermits(usize),
    DrainPermits,
    Close,
    /// `set_serve_newest`: adaptive LIFO on or off.
    ServeNewest(bool),
    /// Creates and polls this many `acquire()` futures, enough to overflow
    /// the semaphore's batch of 32 wakers.
    Burst(usize),
}

fn small() -> impl Strategy<Value = usize> {
    0usize..5
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        14 => (proptest::option::weighted(0.6, small()), any::<bool>(), prop::bool::weighted(0.8))
            .prop_map(|(n, owned, poll)| Op::Acquire { n, owned, poll }),
        6 => (proptest::option::of(small()), any::<bool>())
            .prop_map(|(n, owned)| Op::TryAcquire { n, owned }),
        14 => (any::<Index>(), prop::bool::weighted(0.2))
            .prop_map(|(fut, new_waker)| Op::Poll { fut, new_waker }),
        5 => any::<Index>().prop_map(Op::DropFuture),
        10 => any::<Index>().prop_map(Op::DropPermit),
        2 => any::<Index>().prop_map(Op::ForgetPermit),
        3 => (any::<Index>(), small()).prop_map(|(permit, n)| Op::Split { permit, n }),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(into, from)| Op::Merge { into, from }),
        6 => small().prop_map(Op::AddPermits),
        1 => (30usize..45).prop_map(Op::AddPermits),
        3 => small().prop_map(Op::ReducePermits),
        3 => small().prop_map(Op::ForgetPermits),
        2 => Just(Op::DrainPermits),
        1 => Just(Op::Close),
        3 => any::<bool>().prop_map(Op::ServeNewest),
        1 => (30usize..40).prop_map(Op::Burst),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    // Miri runs each step about a thousand times slower.
    let max = if cfg!(miri) { 16 } else { 60 };
    prop::collection::vec(op(), 1..max)
}

fn config() -> ProptestConfig {
    if cfg!(miri) {
        ProptestConfig {
            cases: 2,
            // Miri's isolation forbids the regression file.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    } else {
        ProptestConfig::with_cases(256)
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fair_semaphore_matches_model(initial in 0usize..6, ops in ops()) {
        run(true, initial, &ops)?;
    }

    #[test]
    fn unfair_semaphore_matches_model(initial in 0usize..6, ops in ops()) {
        run(false, initial, &ops)?;
    }
}

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

/// Where a modelled acquire future is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FutState {
    /// Never polled: not in line, holds nothing.
    Idle,
    /// In line, handed `received` of its permits so far.
    Waiting { received: usize },
    /// Served in full and out of line; the next poll is `Ready(Ok)`.
    Granted,
    /// Taken out of line by `close`; the next poll is `Ready(Err)` and gives
    /// back the `received` permits.
    Closed { received: usize },
    /// Unfair mode: taken out of line and woken, holding nothing; the next
    /// poll competes for the balance and, if it loses, goes back to the front
    /// of the line.
    Notified,
}

#[derive(Debug)]
struct ModelFut {
    id: u64,
    n: usize,
    state: FutState,
    /// How many times its waker should have fired since it was last polled.
    wakes: usize,
}

impl ModelFut {
    /// Permits this future holds that belong to nobody else yet.
    fn handed(&self) -> usize {
        match self.state {
            FutState::Idle | FutState::Notified => 0,
            FutState::Waiting { received } | FutState::Closed { received } => received,
            FutState::Granted => self.n,
        }
    }
}

/// What polling a future gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    Ready(usize),
    Closed,
}

/// The reference semaphore. `futs` and `held` run parallel to the real
/// futures and permits, in the same order.
#[derive(Debug)]
struct Model {
    fair: bool,
    closed: bool,
    balance: isize,
    /// Unfair mode: permits asked for by `Notified` futures.
    notified: usize,
    /// `set_serve_newest`: fair hand-offs go to the newest waiter when the
    /// permits cover it.
    newest: bool,
    /// Ids of the futures in line, oldest first.
    queue: VecDeque<u64>,
    futs: Vec<ModelFut>,
    held: Vec<usize>,
    next_id: u64,
}

impl Model {
    fn new(fair: bool, initial: usize) -> Self {
        Model {
            fair,
            closed: false,
            balance: initial as isize,
            notified: 0,
            newest: false,
            queue: VecDeque::new(),
            futs: Vec::new(),
            held: Vec::new(),
            next_id: 0,
        }
    }

    fn fut_mut(&mut self, id: u64) -> &mut ModelFut {
        self.futs
            .iter_mut()
            .find(|f| f.id == id)
            .expect("queued future is alive")
    }

    /// Whether a newcomer may take `n` permits from the balance now.
    /// Whether a newcomer may take `n` permits now; taking none is always
    /// allowed.
    fn may_take(&self, n: usize) -> bool {
        n == 0 || ((!self.fair || self.queue.is_empty()) && self.balance >= n as isize)
    }

    fn try_acquire(&mut self, n: usize) -> Result<usize, TryAcquireError> {
        if self.closed {
            return Err(TryAcquireError::Closed);
        }
        if !self.may_take(n) {
            return Err(TryAcquireError::NoPermits);
        }
        self.balance -= n as isize;
        self.held.push(n);
        Ok(n)
    }

    fn new_future(&mut self, n: usize) {
        let id = self.next_id;
        self.next_id += 1;
        self.futs.push(ModelFut {
            id,
            n,
            state: FutState::Idle,
            wakes: 0,
        });
    }

    fn poll(&mut self, i: usize) -> Outcome {
        self.futs[i].wakes = 0;
        let (id, n) = (self.futs[i].id, self.futs[i].n);
        let outcome = match self.futs[i].state {
            FutState::Idle if self.closed => Outcome::Closed,
            FutState::Idle if n == 0 => Outcome::Ready(0),
            FutState::Idle if self.may_take(n) => {
                self.balance -= n as isize;
                Outcome::Ready(n)
            }
            FutState::Idle => {
                self.futs[i].state = FutState::Waiting { received: 0 };
                self.queue.push_back(id);
                // Unfair: the newcomer could not take its permits, so the
                // spare balance cannot cover it either.
                if self.fair {
                    self.distribute();
                }
                if self.futs[i].state == FutState::Granted {
                    Outcome::Ready(n)
                } else {
                    Outcome::Pending
                }
            }
            FutState::Notified => {
                self.notified -= n;
                if self.closed {
                    Outcome::Closed
                } else if self.balance >= n as isize {
                    self.balance -= n as isize;
                    Outcome::Ready(n)
                } else {
                    self.futs[i].state = FutState::Waiting { received: 0 };
                    self.queue.push_front(id);
                    Outcome::Pending
                }
            }
            FutState::Waiting { .. } => Outcome::Pending,
            FutState::Granted => Outcome::Ready(n),
            FutState::Closed { received } => {
                self.release(received);
                Outcome::Closed
            }
        };
        if outcome != Outcome::Pending {
            self.futs.remove(i);
        }
        if let Outcome::Ready(n) = outcome {
            self.held.push(n);
        }
        outcome
    }

    fn drop_future(&mut self, i: usize) {
        let fut = self.futs.remove(i);
        match fut.state {
            FutState::Idle => {}
            FutState::Waiting { received } => {
                self.queue.retain(|&id| id != fut.id);
                self.balance += received as isize;
                self.distribute();
            }
            FutState::Granted => self.release(fut.n),
            FutState::Closed { received } => self.release(received),
            FutState::Notified => {
                self.notified -= fut.n;
                self.distribute();
            }
        }
    }

    fn release(&mut self, n: usize) {
        self.balance += n as isize;
        self.distribute();
    }

    /// Fair: hands the balance to the head of the line, in parts. Unfair:
    /// wakes waiters from the head, each only if the balance not yet
    /// promised to woken waiters covers it in full, and hands nothing over.
    fn distribute(&mut self) {
        if !self.fair {
            while let Some(&id) = self.queue.front() {
                if self.closed {
                    return;
                }
                let spare = self.balance - self.notified as isize;
                let fut = self.fut_mut(id);
                assert_eq!(fut.state, FutState::Waiting { received: 0 });
                let need = fut.n;
                if need as isize > spare {
                    return;
                }
                fut.state = FutState::Notified;
                fut.wakes += 1;
                self.notified += need;
                self.queue.pop_front();
            }
            return;
        }
        while let Some(&head) = self.queue.front() {
            if self.balance <= 0 {
                return;
            }
            let available = self.balance as usize;
            // Serving the newest first: the newest waiter, if the permits
            // cover all it still needs; else the oldest, in part if need be.
            let tail = *self.queue.back().expect("non-empty");
            let id = if self.newest && self.owed(tail) <= available {
                tail
            } else {
                head
            };
            let fut = self.fut_mut(id);
            let FutState::Waiting { received } = fut.state else {
                unreachable!("only waiting futures are in line")
            };
            let need = fut.n - received;
            let take = need.min(available);
            if take < need {
                fut.state = FutState::Waiting {
                    received: received + take,
                };
                self.balance -= take as isize;
                return;
            }
            fut.state = FutState::Granted;
            fut.wakes += 1;
            self.balance -= take as isize;
            self.queue.retain(|&q| q != id);
        }
    }

    /// What the waiting future `id` is still owed.
    fn owed(&self, id: u64) -> usize {
        let fut = self
            .futs
            .iter()
            .find(|f| f.id == id)
            .expect("queued future is alive");
        let FutState::Waiting { received } = fut.state else {
            unreachable!("only waiting futures are in line")
        };
        fut.n - received
    }

    fn close(&mut self) {
        self.closed = true;
        for id in std::mem::take(&mut self.queue) {
            let fut = self.fut_mut(id);
            let FutState::Waiting { received } = fut.state else {
                unreachable!("only waiting futures are in line")
            };
            fut.state = FutState::Closed { received };
            fut.wakes += 1;
        }
    }

    fn forget_permits(&mut self, n: usize) -> usize {
        let take = n.min(self.balance.max(0) as usize);
        self.balance -= take as isize;
        take
    }

    /// Checks the model against itself: after every operation nothing more
    /// could be handed out, and only a fair head can be partly served.
    fn check_invariants(&self) -> Result<(), TestCaseError> {
        prop_assert!(!self.closed || self.queue.is_empty(), "closed with waiters");
        for (pos, &id) in self.queue.iter().enumerate() {
            let fut = self.futs.iter().find(|f| f.id == id).unwrap();
            let FutState::Waiting { received } = fut.state else {
                return Err(TestCaseError::fail("queued future is not waiting"));
            };
            let need = (fut.n - received) as isize;
            if pos == 0 {
                let stuck = if self.fair {
                    self.balance <= 0
                } else {
                    self.balance - (self.notified as isize) < need
                };
                prop_assert!(stuck, "model left servable head: {:?}", self);
            }
            prop_assert!(
                received == 0 || (self.fair && pos == 0),
                "only a fair head is partly served: {:?}",
                self
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The real side
// ---------------------------------------------------------------------------

/// Counts how many times a task was woken.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl WakeCount {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

enum RealFut<'a> {
    Borrowed(Pin<Box<Acquire<'a>>>),
    Owned(Pin<Box<AcquireOwned>>),
}

enum RealPermit<'a> {
    Borrowed(Permit<'a>),
    Owned(OwnedPermit),
}

impl<'a> RealFut<'a> {
    fn poll(&mut self, waker: &Waker) -> Poll<Result<RealPermit<'a>, AcquireError>> {
        let mut cx = Context::from_waker(waker);
        match self {
            RealFut::Borrowed(f) => f.as_mut().poll(&mut cx).map_ok(RealPermit::Borrowed),
            RealFut::Owned(f) => f.as_mut().poll(&mut cx).map_ok(RealPermit::Owned),
        }
    }

    fn is_terminated(&self) -> bool {
        match self {
            RealFut::Borrowed(f) => f.is_terminated(),
            RealFut::Owned(f) => f.is_terminated(),
        }
    }
}

impl RealPermit<'_> {
    fn num_permits(&self) -> usize {
        match self {
            RealPermit::Borrowed(p) => p.num_permits(),
            RealPermit::Owned(p) => p.num_permits(),
        }
    }

    fn forget(self) {
        match self {
            RealPermit::Borrowed(p) => p.forget(),
            RealPermit::Owned(p) => p.forget(),
        }
    }

    fn split(&mut self, n: usize) -> Option<Self> {
        match self {
            RealPermit::Borrowed(p) => p.split(n).map(RealPermit::Borrowed),
            RealPermit::Owned(p) => p.split(n).map(RealPermit::Owned),
        }
    }

    /// Merges `other` into `self`, or hands it back if the kinds differ.
    fn merge(&mut self, other: Self) -> Result<(), Self> {
        match (self, other) {
            (RealPermit::Borrowed(a), RealPermit::Borrowed(b)) => a.merge(b),
            (RealPermit::Owned(a), RealPermit::Owned(b)) => a.merge(b),
            (_, other) => return Err(other),
        }
        Ok(())
    }
}

struct Slot<'a> {
    fut: RealFut<'a>,
    wake: Arc<WakeCount>,
}

/// The semaphore under test, everything alive that belongs to it, and the
/// model it is checked against.
struct Harness<'a> {
    sem: &'a Arc<Semaphore>,
    futs: Vec<Slot<'a>>,
    held: Vec<RealPermit<'a>>,
    /// Wakers replaced by a later poll, with their count at that moment:
    /// the semaphore must never wake them again.
    retired: Vec<(Arc<WakeCount>, usize)>,
    /// Permits that exist, counted from the operations and their results:
    /// initial + added - reduced - forgotten (by `forget_permits`, `drain`
    /// or `Permit::forget`).
    ledger: isize,
    model: Model,
}

fn run(fair: bool, initial: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let sem = Arc::new(if fair {
        Semaphore::new(initial)
    } else {
        Semaphore::new_unfair(initial)
    });
    let mut h = Harness {
        sem: &sem,
        futs: Vec::new(),
        held: Vec::new(),
        retired: Vec::new(),
        ledger: initial as isize,
        model: Model::new(fair, initial),
    };
    h.check("start")?;
    for (step, op) in ops.iter().enumerate() {
        h.apply(op)?;
        h.check(&format!("step {step}: {op:?}"))?;
    }
    h.tear_down()
}

impl<'a> Harness<'a> {
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Acquire { n, owned, poll } => {
                self.acquire(n, owned);
                if poll {
                    self.poll(self.futs.len() - 1, false)?;
                }
            }
            Op::TryAcquire { n, owned } => {
                let real = match (n, owned) {
                    (None, false) => self.sem.try_acquire().map(RealPermit::Borrowed),
                    (Some(n), false) => self.sem.try_acquire_many(n).map(RealPermit::Borrowed),
                    (None, true) => self.sem.try_acquire_owned().map(RealPermit::Owned),
                    (Some(n), true) => self.sem.try_acquire_many_owned(n).map(RealPermit::Owned),
                };
                let expected = self.model.try_acquire(n.unwrap_or(1));
                prop_assert_eq!(
                    real.as_ref().map(RealPermit::num_permits).map_err(|e| *e),
                    expected
                );
                if let Ok(permit) = real {
                    self.held.push(permit);
                }
            }
            Op::Poll { fut, new_waker } => {
                if !self.futs.is_empty() {
                    self.poll(fut.index(self.futs.len()), new_waker)?;
                }
            }
            Op::DropFuture(fut) => {
                if !self.futs.is_empty() {
                    self.drop_future(fut.index(self.futs.len()));
                }
            }
            Op::DropPermit(permit) => {
                if !self.held.is_empty() {
                    let i = permit.index(self.held.len());
                    drop(self.held.remove(i));
                    let n = self.model.held.remove(i);
                    self.model.release(n);
                }
            }
            Op::ForgetPermit(permit) => {
                if !self.held.is_empty() {
                    let i = permit.index(self.held.len());
                    let permit = self.held.remove(i);
                    self.ledger -= permit.num_permits() as isize;
                    permit.forget();
                    self.model.held.remove(i);
                }
            }
            Op::Split { permit, n } => {
                if !self.held.is_empty() {
                    let i = permit.index(self.held.len());
                    let real = self.held[i].split(n);
                    let expected = self.model.held[i].checked_sub(n);
                    prop_assert_eq!(real.is_some(), expected.is_some());
                    if let (Some(part), Some(rest)) = (real, expected) {
                        prop_assert_eq!(part.num_permits(), n);
                        self.held.push(part);
                        self.model.held[i] = rest;
                        self.model.held.push(n);
                    }
                }
            }
            Op::Merge { into, from } => {
                if !self.held.is_empty() {
                    let (into, from) = (into.index(self.held.len()), from.index(self.held.len()));
                    if into != from {
                        let other = self.held.remove(from);
                        let into = if into > from { into - 1 } else { into };
                        match self.held[into].merge(other) {
                            Ok(()) => {
                                let n = self.model.held.remove(from);
                                self.model.held[into] += n;
                            }
                            // Different kinds: put it back where it was.
                            Err(other) => self.held.insert(from, other),
                        }
                    }
                }
            }
            Op::AddPermits(n) => {
                self.sem.add_permits(n);
                self.ledger += n as isize;
                self.model.release(n);
            }
            Op::ReducePermits(n) => {
                self.sem.reduce_permits(n);
                self.ledger -= n as isize;
                self.model.balance -= n as isize;
            }
            Op::ForgetPermits(n) => {
                let real = self.sem.forget_permits(n);
                self.ledger -= real as isize;
                prop_assert_eq!(real, self.model.forget_permits(n));
            }
            Op::DrainPermits => {
                let real = self.sem.drain_permits();
                self.ledger -= real as isize;
                prop_assert_eq!(real, self.model.forget_permits(usize::MAX));
            }
            Op::Close => {
                self.sem.close();
                self.model.close();
            }
            Op::ServeNewest(on) => {
                self.sem.set_serve_newest(on);
                self.model.newest = on;
                prop_assert_eq!(self.sem.serves_newest(), on);
            }
            Op::Burst(count) => {
                for _ in 0..count {
                    self.acquire(None, false);
                    self.poll(self.futs.len() - 1, false)?;
                    self.check("inside a burst")?;
                }
            }
        }
        Ok(())
    }

    fn acquire(&mut self, n: Option<usize>, owned: bool) {
        let fut = match (n, owned) {
            (None, false) => RealFut::Borrowed(Box::pin(self.sem.acquire())),
            (Some(n), false) => RealFut::Borrowed(Box::pin(self.sem.acquire_many(n))),
            (None, true) => RealFut::Owned(Box::pin(self.sem.acquire_owned())),
            (Some(n), true) => RealFut::Owned(Box::pin(self.sem.acquire_many_owned(n))),
        };
        self.futs.push(Slot {
            fut,
            wake: Arc::default(),
        });
        self.model.new_future(n.unwrap_or(1));
    }

    fn poll(&mut self, i: usize, new_waker: bool) -> Result<(), TestCaseError> {
        let slot = &mut self.futs[i];
        if new_waker {
            let old = std::mem::take(&mut slot.wake);
            let count = old.get();
            self.retired.push((old, count));
        } else {
            slot.wake.0.store(0, Ordering::SeqCst);
        }
        let waker = Waker::from(slot.wake.clone());
        let real = match slot.fut.poll(&waker) {
            Poll::Pending => Outcome::Pending,
            Poll::Ready(Ok(permit)) => {
                let n = permit.num_permits();
                self.held.push(permit);
                Outcome::Ready(n)
            }
            Poll::Ready(Err(AcquireError { .. })) => Outcome::Closed,
        };
        if real != Outcome::Pending {
            let done = self.futs.remove(i);
            prop_assert!(
                done.fut.is_terminated(),
                "future {} not terminated after Ready",
                i
            );
        }
        let expected = self.model.poll(i);
        prop_assert_eq!(real, expected, "poll of future {}", i);
        Ok(())
    }

    fn drop_future(&mut self, i: usize) {
        drop(self.futs.remove(i));
        self.model.drop_future(i);
    }

    fn check(&self, step: &str) -> Result<(), TestCaseError> {
        let (sem, model) = (self.sem, &self.model);
        model.check_invariants()?;
        prop_assert_eq!(
            sem.available_permits(),
            model.balance,
            "balance after {}",
            step
        );
        prop_assert_eq!(sem.queue_len(), model.queue.len(), "queue after {}", step);
        prop_assert_eq!(sem.is_closed(), model.closed, "closed after {}", step);
        let held: Vec<usize> = self.held.iter().map(RealPermit::num_permits).collect();
        prop_assert_eq!(&held, &model.held, "held permits after {}", step);
        prop_assert_eq!(self.futs.len(), model.futs.len());
        for (i, (slot, fut)) in self.futs.iter().zip(&model.futs).enumerate() {
            prop_assert!(!slot.fut.is_terminated(), "future {} terminated", i);
            prop_assert_eq!(
                slot.wake.get(),
                fut.wakes,
                "wake-ups of future {} ({:?}) after {}",
                i,
                fut,
                step
            );
        }
        for (waker, count) in &self.retired {
            prop_assert_eq!(waker.get(), *count, "stale waker woken after {}", step);
        }
        let handed: usize = model.futs.iter().map(ModelFut::handed).sum();
        prop_assert_eq!(
            sem.available_permits() + held.iter().sum::<usize>() as isize + handed as isize,
            self.ledger,
            "permits created or lost after {}",
            step
        );
        Ok(())
    }

    /// Drops every future, then every permit, checking each step, and
    /// checks that all permits came home.
    fn tear_down(mut self) -> Result<(), TestCaseError> {
        while !self.futs.is_empty() {
            self.drop_future(0);
            self.check("tear-down: drop future 0")?;
        }
        while let Some(permit) = self.held.pop() {
            drop(permit);
            let n = self.model.held.pop().unwrap();
            self.model.release(n);
            self.check("tear-down: drop last permit")?;
        }
        prop_assert_eq!(self.sem.available_permits(), self.ledger);
        prop_assert_eq!(self.sem.queue_len(), 0);
        Ok(())
    }
}
