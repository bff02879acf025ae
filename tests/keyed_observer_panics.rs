//! Observers that panic at either stage of a `KeyedBulkhead`: every
//! per-key and keyed count and gauge still says what happened, the key's
//! permit goes back, and the key (and the global limit) can be used again.
//! The global bulkhead counts a rejection before it tells its observers,
//! and the keyed bulkhead counts the key's share of it even when their
//! panic unwinds past it.
#![cfg(not(loom))]

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};
use watertight::CallOptions;

use watertight::Bulkhead;
use watertight::keyed::KeyedBulkhead;
use watertight::observer::{Finished, Observer, Permitted, Rejection};

const MS: Duration = Duration::from_millis(1);

fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

fn block_on<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// Panics in the events chosen, for the bulkhead named `only`.
#[derive(Debug, Clone, Copy)]
struct Panics {
    only: &'static str,
    permitted: bool,
    rejected: bool,
    finished: bool,
}

impl Panics {
    fn on_rejected(only: &'static str) -> Arc<Self> {
        Arc::new(Self {
            only,
            permitted: false,
            rejected: true,
            finished: false,
        })
    }
}

impl Observer for Panics {
    fn on_permitted(&self, e: &Permitted<'_>) {
        assert!(
            !(self.permitted && e.name == self.only),
            "on_permitted panics"
        );
    }
    fn on_rejected(&self, e: &Rejection<'_>) {
        assert!(
            !(self.rejected && e.name == self.only),
            "on_rejected panics"
        );
    }
    fn on_finished(&self, e: &Finished<'_>) {
        assert!(
            !(self.finished && e.name == self.only),
            "on_finished panics"
        );
    }
}

/// The five ways in: `call`, `call_by`, `acquire`, `acquire_by` and
/// `try_acquire` (which has no deadline).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    Call,
    CallBy,
    Acquire,
    AcquireBy,
    TryAcquire,
}

const WAITING: [Way; 4] = [Way::Call, Way::CallBy, Way::Acquire, Way::AcquireBy];
const ALL: [Way; 5] = [
    Way::Call,
    Way::CallBy,
    Way::Acquire,
    Way::AcquireBy,
    Way::TryAcquire,
];

/// Calls `key` the `way` given (with `by` for the deadline ways) and
/// returns whether it panicked.
fn panics(kb: &KeyedBulkhead<u32>, way: Way, key: u32, by: Instant) -> bool {
    catch_unwind(AssertUnwindSafe(|| match way {
        Way::Call => drop(block_on(kb.call(&key, async { Ok::<_, ()>(()) }))),
        Way::CallBy => drop(block_on(kb.call_with(
            &key,
            CallOptions::new().deadline(by),
            async { Ok::<_, ()>(()) },
        ))),
        Way::Acquire => drop(block_on(kb.acquire(&key))),
        Way::AcquireBy => drop(block_on(
            kb.acquire_with(&key, CallOptions::new().deadline(by)),
        )),
        Way::TryAcquire => drop(kb.try_acquire(&key)),
    }))
    .is_err()
}

/// What a key turned away once by the global stage reads: one rejection
/// by the global limit (of the kind given), none by its own, nothing in
/// flight or queued, and its permit back.
#[derive(Debug, PartialEq)]
struct KeyCounts {
    by_global: u64,
    by_key: u64,
    deadline: u64,
    queue_delay: u64,
    in_flight: usize,
    queued: usize,
    key_in_flight: usize,
}

fn counts(kb: &KeyedBulkhead<u32>, key: u32) -> KeyCounts {
    let m = kb.metrics_for(&key).expect("the key is tracked");
    KeyCounts {
        by_global: m.rejected_by_global(),
        by_key: m.rejected_by_key(),
        deadline: m.rejected_deadline(),
        queue_delay: m.rejected_queue_delay(),
        in_flight: m.in_flight(),
        queued: m.queued(),
        key_in_flight: m.bulkhead().in_flight(),
    }
}

fn rejected_once(deadline: u64, queue_delay: u64) -> KeyCounts {
    KeyCounts {
        by_global: 1,
        by_key: 0,
        deadline,
        queue_delay,
        in_flight: 0,
        queued: 0,
        key_in_flight: 0,
    }
}

/// Once the global limit has room, every key is admitted again, its permit
/// comes back, and nothing is left in use.
fn usable_again(kb: &KeyedBulkhead<u32>, keys: impl IntoIterator<Item = u32>, what: &str) {
    for key in keys {
        let by = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            block_on(kb.call_with(&key, CallOptions::new().deadline(by), async {
                Ok::<_, ()>(key)
            })),
            Ok(key),
            "{what}: key {key}"
        );
        drop(kb.try_acquire(&key).expect(what));
        let m = kb.metrics_for(&key).unwrap();
        assert_eq!((m.in_flight(), m.queued()), (0, 0), "{what}: key {key}");
    }
    let g = kb.global_metrics().unwrap();
    assert_eq!((g.in_flight(), g.queued()), (0, 0), "{what}: global");
    let tracked = kb.keys_tracked();
    assert_eq!(kb.evict_idle(), tracked, "{what}: a key still has a user");
}

/// Fail-fast: the global limit is full (`GlobalFull`), and its observer
/// panics, for every way in; or the key's, told of it as the key's
/// rejection, panics (the key's permit is back by then). The rejection is
/// counted once for the key and by the global bulkhead.
#[test]
fn a_global_full_rejection_whose_observer_panics_is_counted_for_its_key() {
    for panicking in ["t.global", "t"] {
        let kb = KeyedBulkhead::<u32>::builder()
            .name("t")
            .max_concurrent_calls(2)
            .global_limit(1)
            .max_wait(Duration::ZERO)
            .observer(Panics::on_rejected(panicking))
            .build()
            .unwrap();
        let holder = kb.try_acquire(&0).unwrap();
        let by = Instant::now() + Duration::from_secs(10);
        for (way, key) in ALL.into_iter().zip(1..) {
            let what = format!("{panicking}, {way:?}");
            assert!(panics(&kb, way, key, by), "{what}: the observer panicked");
            assert_eq!(counts(&kb, key), rejected_once(0, 0), "{what}");
            assert_eq!(kb.stats().rejected_by_global(), u64::from(key), "{what}");
        }
        let g = kb.global_metrics().unwrap();
        assert_eq!((g.in_flight(), g.rejected_full()), (1, 5), "{panicking}");
        drop(holder);
        usable_again(&kb, 0..=5, &format!("{panicking}: after GlobalFull"));
    }
}

/// Waiting: a shared global bulkhead with its own `max_wait` times the
/// call out (`Timeout`, its rejection), and its observer panics.
#[test]
fn a_global_timeout_whose_observer_panics_is_counted_for_its_key() {
    let global = Bulkhead::builder()
        .name("g")
        .max_concurrent_calls(1)
        .max_wait(5 * MS)
        .observer(Panics::on_rejected("g"))
        .build()
        .unwrap();
    let kb = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(2)
        .global(global.clone())
        .max_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let holder = global.try_acquire().unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    for (way, key) in WAITING.into_iter().zip(1..) {
        assert!(panics(&kb, way, key, by), "{way:?}: the observer panicked");
        assert_eq!(counts(&kb, key), rejected_once(0, 0), "{way:?}");
    }
    assert_eq!(global.metrics().rejected_timeout(), 4);
    assert_eq!(kb.stats().rejected_by_global(), 4);
    drop(holder);
    usable_again(&kb, 1..=4, "after a global Timeout");
}

/// Deadline-aware admission at the global stage (`GlobalWontMakeDeadline`),
/// for `call_by` and `acquire_by`: the global hold-time average is 50 ms
/// and key 0 holds the global permit; a key with no hold time of its own
/// passes its stage with 60 ms left, and the global stage turns it away.
#[test]
fn a_global_deadline_rejection_whose_observer_panics_is_counted_for_its_key() {
    let kb = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(1)
        .global_limit(1)
        .max_wait(Duration::from_secs(10))
        .observer(Panics::on_rejected("t.global"))
        .build()
        .unwrap();
    let permit = kb.try_acquire(&0).unwrap();
    thread::sleep(50 * MS);
    drop(permit);
    let holder = kb.try_acquire(&0).unwrap();
    for (way, key) in [Way::CallBy, Way::AcquireBy].into_iter().zip(1..) {
        assert!(
            panics(&kb, way, key, Instant::now() + 60 * MS),
            "{way:?}: the observer panicked"
        );
        assert_eq!(counts(&kb, key), rejected_once(1, 0), "{way:?}");
    }
    assert_eq!(kb.global_metrics().unwrap().rejected_deadline(), 2);
    assert_eq!(kb.stats().rejected_by_global(), 2);
    drop(holder);
    usable_again(&kb, 0..=2, "after GlobalWontMakeDeadline");
}

/// Controlled delay on the global line (`GlobalQueueDelay`): two callers
/// wait for the global permit past the target; the first one's grant finds
/// the line standing, and the second, polled, is cut, and its observer
/// panics. For each waiting way in.
#[test]
fn a_global_queue_delay_cut_whose_observer_panics_is_counted_for_its_key() {
    let kb = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(1)
        .global_limit(1)
        .max_wait(Duration::from_secs(10))
        .queue_delay(MS, Duration::ZERO)
        .observer(Panics::on_rejected("t.global"))
        .build()
        .unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    for (way, key) in WAITING.into_iter().zip((2..).step_by(2)) {
        let holder = kb.try_acquire(&0).unwrap();
        let ahead = key - 1;
        let mut first = Box::pin(
            kb.call_with(&ahead, CallOptions::new().deadline(by), async {
                Ok::<_, ()>(())
            }),
        );
        assert!(poll_once(first.as_mut()).is_pending());
        let mut second: Pin<Box<dyn Future<Output = ()>>> = match way {
            Way::Call => Box::pin(async { drop(kb.call(&key, async { Ok::<_, ()>(()) }).await) }),
            Way::CallBy => Box::pin(async {
                drop(
                    kb.call_with(&key, CallOptions::new().deadline(by), async {
                        Ok::<_, ()>(())
                    })
                    .await,
                )
            }),
            Way::Acquire => Box::pin(async { drop(kb.acquire(&key).await) }),
            Way::AcquireBy => Box::pin(async {
                drop(kb.acquire_with(&key, CallOptions::new().deadline(by)).await)
            }),
            Way::TryAcquire => unreachable!(),
        };
        assert!(poll_once(second.as_mut()).is_pending());
        assert_eq!(counts(&kb, key).queued, 1, "{way:?}");
        thread::sleep(5 * MS);
        drop(holder);
        assert_eq!(block_on(first.as_mut()), Ok(()), "{way:?}");
        let cut = catch_unwind(AssertUnwindSafe(|| poll_once(second.as_mut())));
        assert!(cut.is_err(), "{way:?}: the cut's observer panicked");
        drop(second);
        assert_eq!(counts(&kb, key), rejected_once(0, 1), "{way:?}");
    }
    assert_eq!(kb.global_metrics().unwrap().rejected_queue_delay(), 4);
    assert_eq!(kb.stats().rejected_by_global(), 4);
    usable_again(&kb, 0..=8, "after GlobalQueueDelay");
}

/// An observer of the keys' bulkheads that panics (as a key rejects, admits
/// or ends a call) leaves the global stage's counts and gauges right: the
/// global permit, if one was taken, goes back, and nothing is counted as a
/// global rejection.
#[test]
fn a_key_observer_that_panics_leaves_the_global_counts_right() {
    let by = || Instant::now() + Duration::from_secs(10);
    for (event, observer) in [
        ("on_rejected", Panics::on_rejected("t")),
        (
            "on_permitted",
            Arc::new(Panics {
                only: "t",
                permitted: true,
                rejected: false,
                finished: false,
            }),
        ),
        (
            "on_finished",
            Arc::new(Panics {
                only: "t",
                permitted: false,
                rejected: false,
                finished: true,
            }),
        ),
    ] {
        let kb = KeyedBulkhead::<u32>::builder()
            .name("t")
            .max_concurrent_calls(1)
            .global_limit(4)
            .max_wait(Duration::ZERO)
            .observer(observer)
            .build()
            .unwrap();
        // For `on_rejected`, the key is full: held, outside the observer's
        // reach (`try_acquire` is not among the ways here).
        let holder = (event == "on_rejected").then(|| kb.try_acquire(&1).unwrap());
        for way in ALL {
            if holder.is_some() && way == Way::TryAcquire {
                continue;
            }
            let what = format!("{event}, {way:?}");
            assert!(panics(&kb, way, 1, by()), "{what}: the observer panicked");
            let held = usize::from(holder.is_some());
            let g = kb.global_metrics().unwrap();
            assert_eq!((g.in_flight(), g.queued()), (held, 0), "{what}");
            assert_eq!(g.permitted(), g.finished() + held as u64, "{what}");
            assert_eq!(g.rejected(), 0, "{what}");
            assert_eq!(kb.stats().rejected_by_global(), 0, "{what}");
            let m = kb.metrics_for(&1).unwrap();
            assert_eq!(m.rejected_by_global(), 0, "{what}");
            assert_eq!((m.in_flight(), m.queued()), (held, 0), "{what}");
        }
        drop(holder);
        // `usable_again` goes through the observer too: only with one that
        // does not panic on admission or ending.
        if event == "on_rejected" {
            usable_again(&kb, [1], event);
        } else {
            let g = kb.global_metrics().unwrap();
            assert_eq!(g.in_flight(), 0, "{event}");
            assert_eq!(kb.evict_idle(), 1, "{event}: the key still has a user");
        }
    }
}

/// Panics on the events switched on (at run time), for every bulkhead.
#[derive(Debug, Default)]
struct Switched {
    permitted: AtomicBool,
    rejected: AtomicBool,
}

impl Observer for Switched {
    fn on_permitted(&self, _: &Permitted<'_>) {
        assert!(
            !self.permitted.load(Ordering::Relaxed),
            "on_permitted panics"
        );
    }
    fn on_rejected(&self, _: &Rejection<'_>) {
        assert!(!self.rejected.load(Ordering::Relaxed), "on_rejected panics");
    }
}

/// A rejection by a shared global bulkhead whose observer panicked, caught
/// by a caller of that bulkhead itself (not the keyed bulkhead's), is not
/// counted later for a key whose global stage panics for another reason
/// (here its admission's observer).
#[test]
fn a_caught_global_rejection_is_not_counted_for_a_later_key() {
    let observer = Arc::new(Switched::default());
    let global = Bulkhead::builder()
        .name("g")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .observer(observer.clone())
        .build()
        .unwrap();
    let kb = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(1)
        .global(global.clone())
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    for way in ALL {
        // The global bulkhead's own caller: rejected, its observer panics,
        // and the caller catches it.
        let holder = global.try_acquire().unwrap();
        observer.rejected.store(true, Ordering::Relaxed);
        let caught = catch_unwind(AssertUnwindSafe(|| drop(global.try_acquire())));
        assert!(caught.is_err(), "{way:?}: the observer panicked");
        observer.rejected.store(false, Ordering::Relaxed);
        drop(holder);
        // A keyed call admitted globally, whose observer panics there.
        observer.permitted.store(true, Ordering::Relaxed);
        assert!(panics(&kb, way, 1, by), "{way:?}: the observer panicked");
        observer.permitted.store(false, Ordering::Relaxed);
        let m = kb.metrics_for(&1).unwrap();
        assert_eq!((m.rejected_by_global(), m.in_flight()), (0, 0), "{way:?}");
        assert_eq!(kb.stats().rejected_by_global(), 0, "{way:?}");
    }
    assert_eq!(global.metrics().rejected_full(), 5);
    usable_again(&kb, [1], "after caught rejections");
}

/// A classed global bulkhead whose observers panic as a keyed caller of a
/// class is seated (at once, and after waiting) or rejected (displaced,
/// out of `max_wait`): every seat and every key's permit comes back, and
/// the keys can be used again.
#[test]
fn a_classed_global_stage_whose_observers_panic_loses_no_seat() {
    for (permitted, rejected) in [(true, false), (false, true)] {
        let observer = Arc::new(Switched::default());
        let pool = Bulkhead::builder()
            .name("pool")
            .max_concurrent_calls(1)
            .max_queue(1)
            .max_wait(50 * MS)
            .priorities(&[1, 1])
            .observer(observer.clone())
            .build()
            .unwrap();
        let kb = KeyedBulkhead::<u32>::builder()
            .max_concurrent_calls(1)
            .max_wait(50 * MS)
            .global(pool.clone())
            .build()
            .unwrap();
        let arm = |on: bool| {
            observer.permitted.store(on && permitted, Ordering::Relaxed);
            observer.rejected.store(on && rejected, Ordering::Relaxed);
        };
        let class = |c| CallOptions::new().class(c);
        let what = format!("permitted {permitted}, rejected {rejected}");
        let caught = |f: &mut dyn FnMut()| {
            arm(true);
            let out = catch_unwind(AssertUnwindSafe(f));
            arm(false);
            out.is_err()
        };
        // Seated at once.
        let at_once = caught(&mut || {
            let _ = block_on(kb.call_with(&1, class(0), async { Ok::<_, ()>(()) }));
        });
        assert_eq!(at_once, permitted, "{what}");
        // Seated after waiting, and displaced: the seat is held, a caller
        // of class 1 waits (the line is full), one of class 0 displaces it.
        let held = kb.try_acquire_with(&2, class(1)).expect(&what);
        let mut low = Box::pin(kb.call_with(&3, class(1), async { Ok::<_, ()>(()) }));
        assert!(poll_once(low.as_mut()).is_pending(), "{what}");
        let mut high = Box::pin(kb.call_with(&4, class(0), async { Ok::<_, ()>(()) }));
        assert!(poll_once(high.as_mut()).is_pending(), "{what}");
        let displaced = caught(&mut || {
            let _ = poll_once(low.as_mut());
        });
        assert_eq!(displaced, rejected, "{what}: displaced");
        drop(low);
        drop(held);
        let served = caught(&mut || {
            let _ = poll_once(high.as_mut());
        });
        assert_eq!(served, permitted, "{what}: served after waiting");
        drop(high);
        // Out of `max_wait`.
        let blocker = pool.try_acquire_with(class(0)).expect(&what);
        let timed_out = caught(&mut || {
            let out = block_on(kb.call_with(&5, class(1), async { Ok::<_, ()>(()) }));
            assert!(out.is_err(), "{out:?}");
        });
        assert_eq!(timed_out, rejected, "{what}: timed out");
        drop(blocker);
        // Nothing held anywhere, and every key can be used again.
        let seats = pool.priority_seats();
        assert!(
            seats.iter().all(|s| s.held == 0 && s.waiting == 0),
            "{what}: {seats:?}"
        );
        assert_eq!(pool.metrics().in_flight(), 0, "{what}");
        for key in 1..=5 {
            let m = kb.metrics_for(&key).expect(&what);
            assert_eq!((m.in_flight(), m.queued()), (0, 0), "{what}: key {key}");
            let again = block_on(kb.call_with(&key, class(0), async { Ok::<_, ()>(key) }));
            assert_eq!(again, Ok(key), "{what}: key {key}");
        }
        assert_eq!(pool.metrics().in_flight(), 0, "{what}");
    }
}
