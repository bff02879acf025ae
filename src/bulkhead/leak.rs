//! Leak watches: a permit held longer than `leak_threshold` is reported
//! once, to the observers and the `leaks_suspected` counter. Each watch
//! is a sleep of the threshold on the bulkhead's timer, polled by a waker
//! of its own that reports once the sleep completes, so it runs on the
//! bulkhead's clock (a paused tokio clock included) and needs no task.

use core::pin::Pin;
use core::task::Poll;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use super::observer::{LeakSuspected, Observer};
use crate::timer::{Clock, ClockSleep, poll_by_waker};

/// The permits of one bulkhead under watch, by id.
pub(crate) struct LeakWatches {
    /// Report permits held longer than this.
    threshold: Option<Duration>,
    /// The watches, by id (only with a threshold).
    watches: Mutex<HashMap<u64, LeakWatch>>,
    /// The next watch id; 0 means "not watched".
    next: AtomicU64,
}

/// What a watch reports to, and when it starts.
pub(crate) struct Watched<'a> {
    pub(crate) name: &'static str,
    pub(crate) observers: &'a Arc<[Arc<dyn Observer>]>,
    pub(crate) leaks: &'a Arc<AtomicU64>,
    /// The bulkhead's clock, which the sleep runs on (none: no watch).
    pub(crate) clock: Option<&'a Clock>,
    /// Now, on that clock: when the permit was granted.
    pub(crate) now: Instant,
}

impl LeakWatches {
    pub(crate) fn new(threshold: Option<Duration>) -> Self {
        Self {
            threshold,
            watches: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// The threshold, if leaks are watched.
    #[inline]
    pub(crate) fn threshold(&self) -> Option<Duration> {
        self.threshold
    }

    /// Starts watching a newly granted permit: a sleep of the threshold on
    /// the bulkhead's timer, polled with a waker that reports the leak
    /// once the sleep completes. Returns the watch's id (0: none). The
    /// watches live here, so a permit's guard holds a plain number.
    #[cold]
    pub(crate) fn watch(&self, at: &Watched<'_>) -> u64 {
        let (Some(threshold), Some(clock)) = (self.threshold, at.clock) else {
            return 0;
        };
        let Ok(sleep) = clock.sleep(threshold) else {
            // The timer's runtime is gone: nothing can watch this permit.
            return 0;
        };
        let check = Arc::new(LeakCheck {
            name: at.name,
            observers: at.observers.clone(),
            leaks: at.leaks.clone(),
            since: at.now,
            clock: clock.clone(),
            threshold,
            state: AtomicU8::new(ARMED),
            sleep: Mutex::new(Some(Box::pin(sleep))),
            again: AtomicBool::new(false),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                LeakWatch {
                    check: check.clone(),
                },
            );
        // The first poll registers the waker; a sleep that is done already
        // reports at once.
        check.poll_sleep();
        id
    }

    /// Cancels the watch `id` (the permit went back): disarms its report
    /// and drops its sleep, outside the watches' lock.
    #[cold]
    pub(crate) fn unwatch(&self, id: u64) {
        let watch = self
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        drop(watch);
    }
}

/// A permit under watch for leaks; removed when the permit goes back.
struct LeakWatch {
    check: Arc<LeakCheck>,
}

impl Drop for LeakWatch {
    fn drop(&mut self) {
        // Also breaks the cycle of a sleep that holds its watch's waker.
        self.check.disarm();
    }
}

const ARMED: u8 = 0;
const DISARMED: u8 = 1;
const FIRED: u8 = 2;

/// A leak watch's state, and the waker of its sleep: when the sleep
/// completes, the permit is still held unless the watch was disarmed.
struct LeakCheck {
    name: &'static str,
    observers: Arc<[Arc<dyn Observer>]>,
    leaks: Arc<AtomicU64>,
    /// When the permit was granted, on `clock`.
    since: Instant,
    /// The policy's clock, which the sleep runs on.
    clock: Clock,
    threshold: Duration,
    state: AtomicU8,
    /// The sleep, polled only by whoever holds this lock: the watch's own
    /// waker, which never blocks on it (see `again`). No other lock is held
    /// while it is polled.
    sleep: Mutex<Option<Pin<Box<ClockSleep>>>>,
    /// Set by a wake-up that found the sleep being polled: poll it again.
    again: AtomicBool,
}

impl LeakCheck {
    /// The permit went back: never report, and drop the sleep (outside
    /// the lock).
    fn disarm(&self) {
        self.state.store(DISARMED, Ordering::Release);
        let sleep = self
            .sleep
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(sleep);
    }

    /// Polls the sleep, reporting the leak once it completes. A timer
    /// that panics or whose runtime is gone ends the watch quietly: there
    /// is no caller to tell, and the permit is unaffected.
    fn poll_sleep(self: &Arc<Self>) {
        let ended = poll_by_waker(&self.sleep, &self.again, |slot| {
            let sleep = slot.as_mut()?;
            let waker = Waker::from(self.clone());
            let polled = catch_unwind(AssertUnwindSafe(|| {
                sleep.as_mut().poll_sleep(&mut Context::from_waker(&waker))
            }));
            match polled {
                Ok(Poll::Pending) => None,
                Ok(Poll::Ready(Ok(()))) => Some((slot.take(), true)),
                Ok(Poll::Ready(Err(_))) | Err(_) => Some((slot.take(), false)),
            }
        });
        if let Some((sleep, elapsed)) = ended {
            // A custom timer's sleep, outside the lock: it may panic again
            // in its drop.
            let _ = catch_unwind(AssertUnwindSafe(|| drop(sleep)));
            if elapsed {
                self.report();
            }
        }
    }

    /// The sleep completed: report once, unless disarmed meanwhile.
    fn report(&self) {
        if self
            .state
            .compare_exchange(ARMED, FIRED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        self.leaks.fetch_add(1, Ordering::Relaxed);
        let event = LeakSuspected {
            name: self.name,
            held: Clock::now_on(Some(&self.clock))
                .saturating_duration_since(self.since)
                .max(self.threshold),
            threshold: self.threshold,
        };
        // Called from the timer, with nobody to pass a panic to: each
        // observer runs, and their panics are dropped.
        for observer in &*self.observers {
            let _ = catch_unwind(AssertUnwindSafe(|| observer.on_leak_suspected(&event)));
        }
    }
}

impl Wake for LeakCheck {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.load(Ordering::Acquire) == ARMED {
            self.poll_sleep();
        }
    }
}
