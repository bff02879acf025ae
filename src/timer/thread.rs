//! [`ThreadTimer`]: sleeps driven by one background thread per process, so
//! they work under any executor. The design is described in the module
//! documentation of [`timer`](super#implementation-notes).

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};
use std::time::Instant;

use super::queue::{Key, MAX_BATCH, Next, Queue};
use super::{Sleep, Timer};

/// The name of the timer thread, as debuggers and `top -H` show it.
const THREAD_NAME: &str = "bulkhead-timer";

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

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use crate::test_util::counted;

    /// A driver of its own, so no other test's sleeps show in its queue.
    fn private_driver() -> &'static Driver {
        Box::leak(Box::new(Driver::new()))
    }

    /// What the docs say a sleep costs: 40 bytes inline, 56 in the queue.
    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn sizes() {
        assert_eq!(size_of::<ThreadSleep>(), 40);
        use super::super::queue::{Entry, Slot};
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
