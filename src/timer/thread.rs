//! [`ThreadTimer`]: sleeps driven by one background thread per process, so
//! they work under any executor. The design is described in the module
//! documentation of [`timer`](super#implementation-notes).

use core::fmt;
use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};
use std::time::Instant;

use super::{Sleep, Timer};

/// The name of the timer thread, as debuggers and `top -H` show it.
const THREAD_NAME: &str = "bulkhead-timer";

/// The most wakers the timer thread takes from the queue under one lock, so
/// a burst of expiring sleeps never holds up sleeps being registered.
const MAX_BATCH: usize = 256;

/// The longest the timer thread parks in one go. It re-checks the queue
/// after that, which costs nothing and keeps huge timeouts away from the
/// platform's parking primitive; a sleep due later than that need not
/// unpark it.
const MAX_PARK: Duration = Duration::from_secs(60 * 60);

/// The driver of every [`ThreadTimer`] and [`ThreadSleep`] in the process.
static GLOBAL: Driver = Driver::new();

/// A timer that works under any executor, driven by one background thread
/// per process.
///
/// The thread, named `bulkhead-timer`, is started by the first sleep that is
/// polled and then lives as long as the process, parked while no sleep is
/// pending (it may wake once more, at the deadline of a sleep that was
/// dropped). All `ThreadTimer`s share it and are interchangeable. A waker
/// that panics there is caught, so the thread keeps serving every other
/// sleep.
///
/// Each pending sleep costs 56 bytes in the timer's queue: a slot that
/// holds its waker and an entry in a heap of deadlines. A sleep that
/// is dropped takes its entry out and drops its waker at once, on the
/// dropping thread, and its slot is reused. The queue's vectors keep their
/// capacity: registering a sleep allocates only when more sleeps are
/// pending in the process than ever before (a vector then doubles), so a
/// line of waiters moving through the queue allocates nothing, however
/// long it is. The memory of the busiest moment stays with the process.
///
/// A sleep wakes its task about 0.1 ms after its deadline (the median on
/// Linux; 5 to 35 µs behind `std::thread::sleep`, for the hop through this
/// thread). Registering a sleep unparks the thread only if the sleep is
/// due before the thread would look at the queue anyway, so a sleep made
/// and dropped before its deadline costs about 0.1 µs of CPU, alone or
/// among thousands, none of it on the thread. `PERFORMANCE.md` has the
/// measurements, against `futures-timer`.
///
/// Prefer a runtime's own timer where there is one (`TokioTimer`,
/// `AsyncIoTimer`): it is driven by threads the runtime already has. This
/// one is for `futures::executor::block_on`, custom executors and builds
/// without a runtime feature.
///
/// `ThreadTimer` is always available; the `thread-timer` feature (on by
/// default) only lets [`default_timer`](super::default_timer) choose it, so
/// that the crate never starts a thread unless asked to.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::{ThreadTimer, Timer};
///
/// # futures::executor::block_on(async {
/// let timer = ThreadTimer::new();
/// let start = Instant::now();
/// timer.sleep(Duration::from_millis(10)).await;
/// assert!(start.elapsed() >= Duration::from_millis(10));
/// # });
/// ```
#[derive(Clone, Copy)]
pub struct ThreadTimer {
    driver: &'static Driver,
}

impl ThreadTimer {
    /// A handle to the process's timer thread. The thread is started by the
    /// first sleep that is polled, not here.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use watertight::timer::{ThreadTimer, Timer};
    ///
    /// let timer: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
    /// # drop(timer);
    /// ```
    #[must_use]
    pub const fn new() -> ThreadTimer {
        ThreadTimer { driver: &GLOBAL }
    }
}

impl Default for ThreadTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl Timer for ThreadTimer {
    /// A boxed [`ThreadSleep`].
    ///
    /// # Panics
    ///
    /// The sleep panics when first polled if the timer thread is not
    /// running yet and cannot be started (the operating system refused to
    /// create a thread).
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(ThreadSleep::with_driver(
            self.driver,
            Instant::now().checked_add(duration),
        ))
    }
}

impl fmt::Debug for ThreadTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadTimer")
            .field("started", &self.driver.thread.get().is_some())
            .field("pending", &self.driver.lock().len())
            .finish()
    }
}

/// A future that completes at a deadline, driven by the timer thread of
/// [`ThreadTimer`].
///
/// [`ThreadTimer`]'s [`sleep`](Timer::sleep) returns it boxed; make one
/// directly with [`new`](Self::new) or [`until`](Self::until) to await it
/// without the box. Registering it allocates nothing unless more sleeps
/// are pending in the process than ever before (see [`ThreadTimer`]).
///
/// # Cancel safety
///
/// Dropping the sleep cancels it and removes it from the timer thread's
/// queue at once, together with the waker it had registered: both are gone
/// when `drop` returns, and the timer thread is not involved.
///
/// # Panics
///
/// Polling panics if the timer thread is not running yet and cannot be
/// started (the operating system refused to create a thread).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::timer::ThreadSleep;
///
/// # futures::executor::block_on(async {
/// let start = Instant::now();
/// ThreadSleep::new(Duration::from_millis(10)).await;
/// assert!(start.elapsed() >= Duration::from_millis(10));
/// # });
/// ```
#[must_use = "futures do nothing unless polled; dropping this one cancels the sleep"]
pub struct ThreadSleep {
    driver: &'static Driver,
    /// When the sleep completes; `None` if it never does (the deadline
    /// would not fit in an `Instant`).
    deadline: Option<Instant>,
    state: State,
}

/// Where a [`ThreadSleep`] stands with the timer thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not polled yet (or never to complete): no entry in the queue.
    Idle,
    /// Polled and pending: the queue holds an entry under this key, unless
    /// the timer thread has just taken it out to wake the sleep. (Two
    /// fields rather than a [`Key`], so that the tag packs beside `slot`
    /// and the sleep stays 40 bytes.)
    Registered { slot: u32, id: u64 },
    /// Completed; no entry in the queue.
    Done,
}

impl ThreadSleep {
    /// A sleep that completes once `duration` has passed from now.
    ///
    /// A duration too large for a deadline (such as [`Duration::MAX`]) makes
    /// a sleep that never completes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use watertight::timer::ThreadSleep;
    ///
    /// # futures::executor::block_on(async {
    /// ThreadSleep::new(Duration::ZERO).await; // completes on first poll
    /// # });
    /// ```
    pub fn new(duration: Duration) -> ThreadSleep {
        Self::with_driver(&GLOBAL, Instant::now().checked_add(duration))
    }

    /// A sleep that completes at `deadline` (at once if it has passed).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::timer::ThreadSleep;
    ///
    /// # futures::executor::block_on(async {
    /// let deadline = Instant::now() + Duration::from_millis(10);
    /// ThreadSleep::until(deadline).await;
    /// assert!(Instant::now() >= deadline);
    /// # });
    /// ```
    pub fn until(deadline: Instant) -> ThreadSleep {
        Self::with_driver(&GLOBAL, Some(deadline))
    }

    fn with_driver(driver: &'static Driver, deadline: Option<Instant>) -> ThreadSleep {
        ThreadSleep {
            driver,
            deadline,
            state: State::Idle,
        }
    }

    /// The instant the sleep completes at, or `None` if it never does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use watertight::timer::ThreadSleep;
    ///
    /// let deadline = Instant::now() + Duration::from_secs(1);
    /// assert_eq!(ThreadSleep::until(deadline).deadline(), Some(deadline));
    /// assert_eq!(ThreadSleep::new(Duration::MAX).deadline(), None);
    /// ```
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Puts the sleep in the queue with a clone of `waker`, starting the
    /// timer thread if this is the first sleep ever, and wakes the thread if
    /// the sleep is due before the thread would look at the queue again.
    fn register(&mut self, deadline: Instant, waker: &Waker) {
        let thread = self.driver.thread();
        // Cloned before locking: no waker code runs under the lock.
        let waker = waker.clone();
        let (Key { slot, id }, unpark) = self.driver.lock().insert(deadline, waker);
        self.state = State::Registered { slot, id };
        if unpark {
            thread.unpark();
        }
    }

    /// Polls a registered sleep: completes it if the timer thread has taken
    /// its entry out, or else makes sure the entry holds `waker`.
    fn refresh(&mut self, key: Key, waker: &Waker) -> Poll<()> {
        match self.driver.lock().waker(key) {
            None => {
                self.state = State::Done;
                return Poll::Ready(());
            }
            Some(registered) if registered.will_wake(waker) => return Poll::Pending,
            Some(_) => {}
        }
        // Polled by another task: swap in its waker. Cloned before locking,
        // and the waker swapped out is dropped after unlocking.
        let waker = waker.clone();
        let (pending, _dropped) = self.driver.lock().replace_waker(key, waker);
        if pending {
            Poll::Pending
        } else {
            self.state = State::Done;
            Poll::Ready(())
        }
    }

    /// Removes the sleep's entry from the queue, if it has one.
    fn deregister(&mut self) {
        if let State::Registered { slot, id } = self.state {
            // Dropped after the lock is released.
            let _waker = self.driver.lock().remove(Key { slot, id });
        }
    }
}

impl Future for ThreadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.state == State::Done {
            return Poll::Ready(());
        }
        let Some(deadline) = this.deadline else {
            // Never completes, so there is nothing to register.
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            // Due: complete even if the timer thread has not got to it.
            this.deregister();
            this.state = State::Done;
            return Poll::Ready(());
        }
        match this.state {
            State::Idle => {
                this.register(deadline, cx.waker());
                Poll::Pending
            }
            State::Registered { slot, id } => this.refresh(Key { slot, id }, cx.waker()),
            State::Done => unreachable!("handled above"),
        }
    }
}

impl futures_core::FusedFuture for ThreadSleep {
    fn is_terminated(&self) -> bool {
        self.state == State::Done
    }
}

impl Drop for ThreadSleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

impl fmt::Debug for ThreadSleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Idle => "idle",
            State::Registered { .. } => "registered",
            State::Done => "done",
        };
        f.debug_struct("ThreadSleep")
            .field("deadline", &self.deadline)
            .field("state", &state)
            .finish()
    }
}

/// The timer thread and the queue it serves.
struct Driver {
    /// The pending sleeps. Held only to look up, insert or remove entries:
    /// no waker is cloned, woken or dropped while it is locked, so waker
    /// code can never re-enter it.
    queue: Mutex<Queue>,
    /// The timer thread, set once it has been started.
    thread: OnceLock<Thread>,
}

impl Driver {
    const fn new() -> Driver {
        Driver {
            queue: Mutex::new(Queue::new()),
            thread: OnceLock::new(),
        }
    }

    /// Locks the queue, ignoring poison: no code that can panic runs while
    /// the queue is locked and half-updated.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The timer thread, started on the first call.
    fn thread(&'static self) -> &'static Thread {
        self.thread.get_or_init(|| {
            // If this panics the cell stays empty and the next sleep tries
            // again.
            thread::Builder::new()
                .name(THREAD_NAME.to_owned())
                .spawn(move || self.run())
                .unwrap_or_else(|err| panic!("cannot start the {THREAD_NAME} thread: {err}"))
                .thread()
                .clone()
        })
    }

    /// The timer thread's loop: wake the due sleeps, park until the next
    /// deadline, repeat.
    fn run(&self) -> ! {
        let mut due = Vec::with_capacity(MAX_BATCH);
        loop {
            let next = {
                let mut queue = self.lock();
                queue.expire(Instant::now(), &mut due)
            };
            for waker in due.drain(..) {
                // A waker that panics must not end the thread that every
                // sleep in the process relies on. The panic hook has
                // reported it.
                let _ = panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
            }
            match next {
                Next::Now => {}
                Next::At(at) => thread::park_timeout(at.saturating_duration_since(Instant::now())),
                Next::Never => thread::park(),
            }
        }
    }
}

/// What the timer thread does after a round of [`Queue::expire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// More sleeps are due: go again without parking.
    Now,
    /// Park until this instant (or until a sleep due before it unparks the
    /// thread).
    At(Instant),
    /// Nothing is pending: park until a sleep unparks the thread.
    Never,
}

/// How many children an entry of the heap has. Eight rather than two: a
/// third as many levels (five for 10,000 sleeps), so fewer entries moved
/// and slots told when an entry goes down, and the children read side by
/// side in memory. Taking the earliest of 10,000 entries costs about 1.5x
/// a `BTreeMap`'s `pop_first` this way, 2.5x with two children; the
/// heap's storage is not as local as the map's leaves.
const ARITY: usize = 8;

/// The position of the parent of the heap entry at `at` (not the root).
#[inline]
fn parent(at: usize) -> usize {
    (at - 1) / ARITY
}

/// Marks the end of the free list, and a slot index that is never used.
const NO_SLOT: u32 = u32::MAX;

/// The pending sleeps, ordered by deadline: a min-heap of entries with
/// [`ARITY`] children each, every entry naming the slot of its sleep in a
/// slab.
///
/// # Invariants
///
/// - `heap` is a min-heap in [`Queue::before`] order (by deadline, then by
///   the slot's id): no entry comes before its parent
///   (`heap[(i - 1) / ARITY]`). No two entries tie, since ids are unique.
/// - Every entry's slot is taken, and the slot's `link` is that entry's
///   position in `heap`: the two name each other. A taken slot is named by
///   exactly one entry, so `heap.len()` is the number of taken slots.
/// - The free slots form one list from `free` through their `link`s,
///   ending in [`NO_SLOT`].
/// - While the timer thread is parked (or about to park), every entry's
///   deadline is at or after `wake_at`, or the thread has been unparked.
///
/// `slots` never shrinks, and neither vector gives back capacity: once they
/// have held as many sleeps as are pending, registering one allocates
/// nothing, and neither does taking one out.
struct Queue {
    /// The pending entries, earliest at the root.
    heap: Vec<Entry>,
    /// One per sleep ever pending at once: taken by a registered sleep
    /// (which holds its index and id) or free.
    slots: Vec<Slot>,
    /// The first free slot, or [`NO_SLOT`].
    free: u32,
    /// The id for the next registration.
    next_id: u64,
    /// When the timer thread looks at the queue next, at the latest:
    /// `None` while it is parked with no timeout (or not started). A
    /// registration due before it unparks the thread and brings it forward.
    wake_at: Option<Instant>,
}

/// A pending sleep in [`Queue::heap`].
#[derive(Clone, Copy, Debug)]
struct Entry {
    deadline: Instant,
    /// Its slot in [`Queue::slots`], whose id breaks ties between equal
    /// deadlines (kept there rather than here: 24 bytes an entry, not 32,
    /// for a heap read faster).
    slot: u32,
}

/// A place in [`Queue::slots`].
#[derive(Debug)]
struct Slot {
    /// The id of the sleep registered here (of the last one, if free): it
    /// tells a sleep whether the slot is still its own, and orders equal
    /// deadlines by registration.
    id: u64,
    /// The sleep's waker while the slot is taken; `None` while it is free.
    waker: Option<Waker>,
    /// Taken: the position of the slot's entry in the heap. Free: the next
    /// free slot, or [`NO_SLOT`].
    link: u32,
}

/// Where a registered sleep's entry is found: its slot and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    slot: u32,
    id: u64,
}

impl Queue {
    const fn new() -> Queue {
        Queue {
            heap: Vec::new(),
            slots: Vec::new(),
            free: NO_SLOT,
            next_id: 0,
            wake_at: None,
        }
    }

    /// How many sleeps are pending.
    fn len(&self) -> usize {
        self.heap.len()
    }

    /// The slot under `key`, if it is still that sleep's: the timer thread
    /// has not taken its entry out.
    #[inline]
    fn slot(&self, key: Key) -> Option<&Slot> {
        self.slots
            .get(key.slot as usize)
            .filter(|slot| slot.id == key.id && slot.waker.is_some())
    }

    /// The waker registered under `key`, if the sleep is still pending.
    #[inline]
    fn waker(&self, key: Key) -> Option<&Waker> {
        self.slot(key)?.waker.as_ref()
    }

    /// Adds an entry. Returns its key, and whether the timer thread must be
    /// unparked: when the entry is due before the thread looks again.
    fn insert(&mut self, deadline: Instant, waker: Waker) -> (Key, bool) {
        let id = self.next_id;
        // 2^64 sleeps take centuries to make; should it ever wrap, an id is
        // long free again.
        self.next_id = self.next_id.wrapping_add(1);
        let at = self.heap.len() as u32;
        let slot = if self.free != NO_SLOT {
            let slot = self.free;
            let free = &mut self.slots[slot as usize];
            self.free = free.link;
            *free = Slot {
                id,
                waker: Some(waker),
                link: at,
            };
            slot
        } else {
            // Checked before anything changes; 2^32 pending sleeps would
            // need hundreds of gigabytes first.
            let slot = u32::try_from(self.slots.len())
                .ok()
                .filter(|&slot| slot != NO_SLOT)
                .expect("too many sleeps pending");
            self.slots.push(Slot {
                id,
                waker: Some(waker),
                link: at,
            });
            slot
        };
        self.heap.push(Entry { deadline, slot });
        self.sift_up(at as usize);
        let unpark = self.wake_at.is_none_or(|wake_at| deadline < wake_at);
        if unpark {
            self.wake_at = Some(deadline);
        }
        (Key { slot, id }, unpark)
    }

    /// Puts `waker` in the entry under `key`. Returns whether the entry was
    /// there (the sleep is still pending) and the waker for the caller to
    /// drop once the lock is released: the one replaced, or `waker` itself
    /// if the entry is gone.
    fn replace_waker(&mut self, key: Key, waker: Waker) -> (bool, Waker) {
        if self.slot(key).is_none() {
            return (false, waker);
        }
        match &mut self.slots[key.slot as usize].waker {
            Some(registered) => (true, mem::replace(registered, waker)),
            None => (false, waker),
        }
    }

    /// Takes out the entry under `key`, if the sleep is still pending, and
    /// returns its waker for the caller to drop once the lock is released.
    fn remove(&mut self, key: Key) -> Option<Waker> {
        let at = self.slot(key)?.link;
        self.remove_at(at as usize)
    }

    /// Moves the wakers of the sleeps due at `now` into `due` (at most
    /// [`MAX_BATCH`] in all), earliest first, and says when to look again.
    fn expire(&mut self, now: Instant, due: &mut Vec<Waker>) -> Next {
        let next = loop {
            let Some(first) = self.heap.first() else {
                break Next::Never;
            };
            if first.deadline > now {
                break Next::At(first.deadline);
            }
            if due.len() >= MAX_BATCH {
                break Next::Now;
            }
            due.extend(self.remove_at(0));
        };
        // The thread looks again at the earliest deadline, or at an earlier
        // one it was unparked for whose sleep has gone since: keeping that
        // costs one wake-up at most, and spares it one per sleep registered
        // meanwhile (they are usually later). Never more than `MAX_PARK`
        // away, which also keeps huge timeouts from the platform's parking.
        let promised = self.wake_at.filter(|&wake_at| wake_at > now);
        let next = match (next, promised) {
            (Next::Now, _) => Next::Now,
            (Next::At(deadline), Some(promised)) => Next::At(deadline.min(promised)),
            (Next::At(at), None) | (Next::Never, Some(at)) => Next::At(at),
            (Next::Never, None) => Next::Never,
        };
        let next = match (next, now.checked_add(MAX_PARK)) {
            (Next::At(at), Some(latest)) => Next::At(at.min(latest)),
            (next, _) => next,
        };
        self.wake_at = match next {
            // Going again at once: what is registered meanwhile is seen.
            Next::Now => Some(now),
            Next::At(at) => Some(at),
            Next::Never => None,
        };
        next
    }

    /// Takes the entry at `at` out of the heap and frees its slot; returns
    /// its waker.
    fn remove_at(&mut self, at: usize) -> Option<Waker> {
        let entry = self.heap.swap_remove(at);
        if at < self.heap.len() {
            // The last entry fills the hole: move it up or down into place.
            if at > 0 && self.before(self.heap[at], self.heap[parent(at)]) {
                self.sift_up(at);
            } else {
                self.sift_down(at);
            }
        }
        let slot = &mut self.slots[entry.slot as usize];
        slot.link = self.free;
        self.free = entry.slot;
        slot.waker.take()
    }

    /// Moves the entry at `at` towards the root until its parent is
    /// earlier, keeping each moved entry's slot pointing at it.
    fn sift_up(&mut self, at: usize) {
        let entry = self.heap[at];
        self.rise(at, entry, 0);
    }

    /// Puts `entry` in the hole at `at`, or above it but no higher than
    /// `top`: the first place whose parent is earlier.
    fn rise(&mut self, mut at: usize, entry: Entry, top: usize) {
        while at > top {
            let parent = parent(at);
            if self.before(self.heap[parent], entry) {
                break;
            }
            self.put(at, self.heap[parent]);
            at = parent;
        }
        self.put(at, entry);
    }

    /// Moves the entry at `at`, which is not before its parent, into place
    /// below, keeping each moved entry's slot pointing at it.
    ///
    /// Bottom-up (Floyd's): the hole goes all the way down along the
    /// earliest children, without comparing them with the entry, which is
    /// then put in the hole and moved up, a step or none. The entry is most
    /// often the heap's last, so among the latest, and belongs near the
    /// bottom: this saves a comparison per level on the way.
    fn sift_down(&mut self, start: usize) {
        let entry = self.heap[start];
        let len = self.heap.len();
        let mut at = start;
        loop {
            let first = ARITY * at + 1;
            if first >= len {
                break;
            }
            let mut child = first;
            for other in first + 1..(first + ARITY).min(len) {
                if self.before(self.heap[other], self.heap[child]) {
                    child = other;
                }
            }
            self.put(at, self.heap[child]);
            at = child;
        }
        // The entry rises no higher than `start`: every entry above it is
        // earlier.
        self.rise(at, entry, start);
    }

    /// Whether `a` comes before `b`: by deadline, then by registration.
    #[inline]
    fn before(&self, a: Entry, b: Entry) -> bool {
        a.deadline < b.deadline
            || (a.deadline == b.deadline
                && self.slots[a.slot as usize].id < self.slots[b.slot as usize].id)
    }

    /// Stores `entry` at `at` in the heap and tells its slot.
    #[inline]
    fn put(&mut self, at: usize, entry: Entry) {
        self.heap[at] = entry;
        self.slots[entry.slot as usize].link = at as u32;
    }

    /// Checks every invariant but the last (see [`Queue`]), panicking with
    /// the first one broken.
    #[cfg(test)]
    fn assert_valid(&self) {
        for (at, entry) in self.heap.iter().enumerate() {
            if at > 0 {
                let parent = &self.heap[parent(at)];
                assert!(
                    self.before(*parent, *entry),
                    "an entry is before its parent"
                );
            }
            let slot = &self.slots[entry.slot as usize];
            assert!(slot.waker.is_some(), "an entry's slot must be taken");
            assert_eq!(slot.link as usize, at, "a slot must know its entry");
        }
        let mut free = 0;
        let mut next = self.free;
        while next != NO_SLOT {
            let slot = &self.slots[next as usize];
            assert!(slot.waker.is_none(), "a free slot must hold no waker");
            free += 1;
            assert!(free <= self.slots.len(), "the free list must not loop");
            next = slot.link;
        }
        assert_eq!(
            self.heap.len() + free,
            self.slots.len(),
            "every slot is taken by one entry or free"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Arc;

    use crate::test_util::{Count, counted};

    /// A driver of its own, so no other test's sleeps show in its queue.
    fn private_driver() -> &'static Driver {
        Box::leak(Box::new(Driver::new()))
    }

    #[test]
    fn queue_expires_in_deadline_order_then_id_order() {
        let mut queue = Queue::new();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let (late, late_waker) = counted();
        let (early, early_waker) = counted();
        let (tie, tie_waker) = counted();

        assert!(queue.insert(at(20), late_waker).1);
        assert!(queue.insert(at(10), early_waker).1);
        assert!(!queue.insert(at(10), tie_waker).1);
        queue.assert_valid();

        let mut due = Vec::new();
        assert_eq!(queue.expire(at(5), &mut due), Next::At(at(10)));
        assert!(due.is_empty());
        assert_eq!(queue.expire(at(10), &mut due), Next::At(at(20)));
        assert_eq!(due.len(), 2);
        queue.assert_valid();
        let wakes = || [&early, &tie, &late].map(|c| c.get());
        due.remove(0).wake();
        assert_eq!(wakes(), [1, 0, 0], "the earliest deadline comes first");
        due.remove(0).wake();
        assert_eq!(wakes(), [1, 1, 0], "equal deadlines come in id order");
        assert_eq!(queue.expire(at(30), &mut due), Next::Never);
        due.drain(..).for_each(Waker::wake);
        assert_eq!(wakes(), [1, 1, 1]);
        assert_eq!(queue.len(), 0);
        queue.assert_valid();
    }

    #[test]
    fn queue_expires_in_bounded_batches() {
        let mut queue = Queue::new();
        let now = Instant::now();
        for _ in 0..MAX_BATCH + 1 {
            queue.insert(now, Waker::noop().clone());
        }
        let mut due = Vec::new();
        assert_eq!(queue.expire(now, &mut due), Next::Now);
        assert_eq!(due.len(), MAX_BATCH);
        due.clear();
        assert_eq!(queue.expire(now, &mut due), Next::Never);
        assert_eq!(due.len(), 1);
        queue.assert_valid();
    }

    #[test]
    fn replace_waker_hands_back_the_waker_to_drop() {
        let mut queue = Queue::new();
        let deadline = Instant::now();
        let (first, first_waker) = counted();
        let (second, second_waker) = counted();
        let (key, _) = queue.insert(deadline, first_waker);

        let (pending, old) = queue.replace_waker(key, second_waker.clone());
        assert!(pending);
        old.wake();
        assert_eq!(first.get(), 1, "the replaced waker");
        let gone = Key {
            id: key.id + 1,
            ..key
        };
        let (pending, unused) = queue.replace_waker(gone, second_waker);
        assert!(!pending);
        unused.wake();
        assert_eq!(second.get(), 1, "the unused waker");
        assert_eq!(Arc::strong_count(&second), 2, "one waker left in the queue");
    }

    /// A slot freed and taken again does not answer to the key of the
    /// sleep that had it: the sleep has fired.
    #[test]
    fn a_reused_slot_does_not_answer_to_an_old_key() {
        let mut queue = Queue::new();
        let now = Instant::now();
        let (old, _) = queue.insert(now, Waker::noop().clone());
        let mut due = Vec::new();
        queue.expire(now, &mut due);
        let (new, _) = queue.insert(now + Duration::from_secs(1), Waker::noop().clone());
        assert_eq!(new.slot, old.slot, "the slot is reused");
        assert!(queue.waker(old).is_none());
        assert!(queue.remove(old).is_none());
        assert!(!queue.replace_waker(old, Waker::noop().clone()).0);
        assert_eq!(queue.len(), 1, "the new sleep is left alone");
        assert!(queue.remove(new).is_some());
        assert!(queue.remove(new).is_none(), "removed once");
        queue.assert_valid();
    }

    /// The thread is unparked only for a sleep due before it would look at
    /// the queue anyway; a deadline it was unparked for is kept after its
    /// sleep is dropped (one stale wake-up), so later sleeps do not unpark
    /// it again.
    #[test]
    fn only_a_sleep_due_before_the_thread_looks_unparks_it() {
        let mut queue = Queue::new();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let noop = || Waker::noop().clone();
        let mut due = Vec::new();

        assert!(queue.insert(at(20), noop()).1, "the thread parked for good");
        assert!(!queue.insert(at(30), noop()).1, "later than the first");
        assert!(!queue.insert(at(20), noop()).1, "as late as the first");
        assert_eq!(queue.expire(t0, &mut due), Next::At(at(20)));
        let (earlier, unpark) = queue.insert(at(10), noop());
        assert!(unpark, "due before the thread looks");
        assert!(!queue.insert(at(15), noop()).1, "the thread looks at 10");
        assert!(queue.remove(earlier).is_some());
        assert_eq!(
            queue.expire(at(1), &mut due),
            Next::At(at(10)),
            "the deadline it was unparked for is kept"
        );
        assert!(!queue.insert(at(12), noop()).1);
        assert_eq!(queue.expire(at(10), &mut due), Next::At(at(12)));
        assert!(due.is_empty(), "the stale wake-up finds nothing due");
        assert_eq!(queue.expire(at(40), &mut due), Next::Never);
        assert_eq!(due.len(), 5);
        assert!(queue.insert(at(50), noop()).1, "the thread parked for good");

        // Parked for at most `MAX_PARK`: a sleep due after that need not
        // unpark the thread.
        let mut queue = Queue::new();
        assert!(queue.insert(t0 + 2 * MAX_PARK, noop()).1);
        assert_eq!(queue.expire(t0, &mut due), Next::At(t0 + MAX_PARK));
        assert!(!queue.insert(t0 + MAX_PARK * 3 / 2, noop()).1);
        assert!(queue.insert(t0 + MAX_PARK / 2, noop()).1);
    }

    /// Random inserts, removals, waker swaps and expiries against an
    /// ordered map: the heap wakes exactly the due sleeps, earliest first,
    /// keeps its invariants, and never answers to the key of a sleep gone.
    #[test]
    fn the_heap_matches_an_ordered_map() {
        let mut queue = Queue::new();
        let mut model: BTreeMap<(Instant, u64), (Key, Arc<Count>)> = BTreeMap::new();
        let mut gone: VecDeque<Key> = VecDeque::new();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut now = t0;
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut random = |n: usize| {
            // xorshift64
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let rounds = if cfg!(miri) { 300 } else { 20_000 };
        for _ in 0..rounds {
            match random(10) {
                0..=4 => {
                    let deadline = now + ms(random(200) as u64);
                    let (count, waker) = counted();
                    let (key, _) = queue.insert(deadline, waker);
                    model.insert((deadline, key.id), (key, count));
                }
                5 | 6 if !model.is_empty() => {
                    let nth = random(model.len());
                    let (&at, &(key, _)) = model.iter().nth(nth).unwrap();
                    model.remove(&at);
                    assert!(queue.remove(key).is_some(), "a pending sleep");
                    gone.push_back(key);
                }
                7 if !model.is_empty() => {
                    let nth = random(model.len());
                    let (key, count) = model.values_mut().nth(nth).unwrap();
                    let (new, waker) = counted();
                    let (pending, old) = queue.replace_waker(*key, waker);
                    assert!(pending);
                    assert_eq!(old.data(), Arc::as_ptr(count).cast(), "its own waker");
                    *count = new;
                }
                _ => {
                    now += ms(random(50) as u64);
                    let mut due = Vec::new();
                    let next = queue.expire(now, &mut due);
                    let mut expected = Vec::new();
                    while expected.len() < MAX_BATCH {
                        match model.first_entry() {
                            Some(first) if first.key().0 <= now => {
                                let (key, count) = first.remove();
                                expected.push(Arc::as_ptr(&count).cast::<()>());
                                gone.push_back(key);
                            }
                            _ => break,
                        }
                    }
                    let woken: Vec<*const ()> = due.iter().map(Waker::data).collect();
                    assert_eq!(woken, expected, "the due sleeps, earliest first");
                    match model.first_key_value() {
                        Some((first, _)) if first.0 <= now => assert_eq!(next, Next::Now),
                        Some((first, _)) => assert!(
                            matches!(next, Next::At(at) if now < at && at <= first.0),
                            "looks again by the next deadline"
                        ),
                        None => assert!(matches!(next, Next::Never | Next::At(_))),
                    }
                }
            }
            while gone.len() > 64 {
                gone.pop_front();
            }
            for &key in &gone {
                assert!(queue.waker(key).is_none(), "a sleep gone is gone");
            }
            queue.assert_valid();
            assert_eq!(queue.len(), model.len());
        }
    }

    /// What the docs say a sleep costs: 40 bytes inline, 56 in the queue.
    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn sizes() {
        assert_eq!(size_of::<ThreadSleep>(), 40);
        assert_eq!(size_of::<Entry>() + size_of::<Slot>(), 56);
    }

    /// Sleeps made, polled and dropped in a loop leave no entry behind.
    #[test]
    #[cfg_attr(miri, ignore = "starts a timer thread that never ends")]
    fn dropped_sleeps_leave_the_queue() {
        let driver = private_driver();
        let far = Instant::now().checked_add(Duration::from_secs(3600));
        let (count, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..10_000 {
            let mut sleep = ThreadSleep::with_driver(driver, far);
            assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
            assert_eq!(driver.lock().len(), 1);
            drop(sleep);
            assert_eq!(driver.lock().len(), 0);
        }
        // Only the waker held here is left: the queue kept no clone.
        assert_eq!(Arc::strong_count(&count), 2);
        assert_eq!(count.get(), 0);
    }

    /// A sleep that becomes the earliest deadline wakes the thread, which
    /// had parked until a later one (up to an hour: `MAX_PARK`).
    #[test]
    #[cfg_attr(miri, ignore = "starts a timer thread that never ends")]
    fn an_earlier_deadline_unparks_the_thread() {
        let driver = private_driver();
        let (late, late_waker) = counted();
        let mut far =
            ThreadSleep::with_driver(driver, Instant::now().checked_add(Duration::from_secs(30)));
        assert!(
            Pin::new(&mut far)
                .poll(&mut Context::from_waker(&late_waker))
                .is_pending()
        );
        // Let the thread park until the late deadline.
        thread::sleep(Duration::from_millis(20));

        // Pending at its first poll, so registered (made again if this
        // thread was descheduled for the 10 ms before it: then the poll
        // found it ready, and the thread was never asked).
        let (early, start, _near) = (0..100)
            .find_map(|_| {
                let (early, early_waker) = counted();
                let start = Instant::now();
                let mut near =
                    ThreadSleep::with_driver(driver, start.checked_add(Duration::from_millis(10)));
                Pin::new(&mut near)
                    .poll(&mut Context::from_waker(&early_waker))
                    .is_pending()
                    .then_some((early, start, near))
            })
            .expect("a 10 ms sleep was ready at its first poll 100 times");
        let give_up = start + Duration::from_secs(10);
        while early.get() == 0 {
            assert!(
                Instant::now() < give_up,
                "the thread slept through an earlier deadline"
            );
            thread::sleep(Duration::from_millis(1));
        }
        assert!(start.elapsed() >= Duration::from_millis(10));
        assert_eq!(late.get(), 0);
        assert_eq!(driver.lock().len(), 1, "only the late sleep is left");
    }

    /// A sleep polled by a second task moves its entry to the second waker,
    /// and the thread wakes only that one.
    #[test]
    #[cfg_attr(miri, ignore = "starts a timer thread that never ends")]
    fn a_new_waker_replaces_the_old_one() {
        let driver = private_driver();
        // Both polls before the deadline, or the round proves nothing (a
        // thread descheduled for the 20 ms may find the sleep fired) and
        // runs again.
        let (deadline, mut sleep, first, second, second_waker) = (0..100)
            .find_map(|_| {
                let deadline = Instant::now() + Duration::from_millis(20);
                let mut sleep = ThreadSleep::with_driver(driver, Some(deadline));
                let (first, first_waker) = counted();
                let (second, second_waker) = counted();
                let polled = Pin::new(&mut sleep)
                    .poll(&mut Context::from_waker(&first_waker))
                    .is_pending();
                let held = Arc::strong_count(&first);
                let repolled = Pin::new(&mut sleep)
                    .poll(&mut Context::from_waker(&second_waker))
                    .is_pending();
                let released = Arc::strong_count(&first);
                if Instant::now() >= deadline {
                    return None;
                }
                assert!(polled && repolled, "pending before its deadline");
                assert_eq!(held, 3, "the queue holds a clone");
                assert_eq!(released, 2, "the old clone was dropped");
                Some((deadline, sleep, first, second, second_waker))
            })
            .expect("descheduled past a 20 ms sleep 100 times");
        let give_up = Instant::now() + Duration::from_secs(10);
        while second.get() == 0 {
            assert!(Instant::now() < give_up, "the sleep was never woken");
            thread::sleep(Duration::from_millis(1));
        }
        assert!(Instant::now() >= deadline);
        assert_eq!(first.get(), 0);
        assert!(
            Pin::new(&mut sleep)
                .poll(&mut Context::from_waker(&second_waker))
                .is_ready()
        );
        assert_eq!(driver.lock().len(), 0);
    }
}
