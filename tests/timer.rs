//! The timers behind `max_wait` and `call_timeout`: `ThreadTimer` on every
//! executor, its queue (earliest deadline first, wake-ups, cancellation,
//! extreme durations), the runtime timers behind the `tokio` and `async-io`
//! features, and the choice `default_timer` makes.
//!
//! Timing assertions are one-sided where it matters: a sleep of `d` must
//! never complete before `d` has passed (checked strictly), and must
//! complete within `d + SLACK` (generous, so a loaded machine does not fail
//! the test). Tests that could hang run under a watchdog.
//!
//! Cancellation is checked through the wakers: a registered sleep holds a
//! clone of its task's waker, so the waker's reference count shows whether
//! the timer still holds an entry for a sleep.

#![cfg(not(loom))]

mod common;

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{WATCHDOG, poll_noop, scaled, with_watchdog};
use futures::executor::block_on;
use futures::future::{FusedFuture, join_all};
use watertight::timer::{Sleep, ThreadSleep, ThreadTimer, Timer, default_timer};

/// How late a sleep may complete before a test calls it lost.
const SLACK: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Asserts that a sleep of `duration` took `elapsed`: never less, and not
/// absurdly more.
#[track_caller]
fn assert_slept(duration: Duration, elapsed: Duration) {
    assert!(
        elapsed >= duration,
        "a sleep of {duration:?} completed after only {elapsed:?}"
    );
    assert!(
        elapsed < duration + SLACK,
        "a sleep of {duration:?} took {elapsed:?}"
    );
}

/// Sleeps for `duration` on `timer`, checks how long it took, and returns
/// that.
async fn timed_sleep(timer: &dyn Timer, duration: Duration) -> Duration {
    let start = Instant::now();
    timer.sleep(duration).await;
    let elapsed = start.elapsed();
    assert_slept(duration, elapsed);
    elapsed
}

/// A waker that counts its wake-ups; its `Arc`'s strong count shows how
/// many clones of it exist.
#[derive(Debug, Default)]
struct Flag(AtomicUsize);

impl Flag {
    fn waker() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag::default());
        (flag.clone(), Waker::from(flag))
    }

    fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `fut` once with `waker`.
fn poll_with<F: Future + ?Sized>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

/// Waits (on this thread) until `flag` has been woken; fails after
/// `limit`.
#[track_caller]
fn wait_for_wake(flag: &Flag, limit: Duration) {
    let give_up = Instant::now() + limit;
    while flag.wakes() == 0 {
        assert!(Instant::now() < give_up, "the sleep was never woken");
        std::thread::sleep(ms(1));
    }
}

// ---------------------------------------------------------------------------
// Trait promises
// ---------------------------------------------------------------------------

#[test]
fn timers_and_sleeps_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<ThreadTimer>();
    send_sync::<ThreadSleep>();
    send_sync::<Arc<dyn Timer>>();
    send::<Sleep>();
    #[cfg(feature = "tokio")]
    send_sync::<watertight::timer::TokioTimer>();
    #[cfg(feature = "async-io")]
    send_sync::<watertight::timer::AsyncIoTimer>();
}

#[test]
#[cfg_attr(miri, ignore = "starts the timer thread")]
fn an_arc_of_a_timer_is_a_timer() {
    fn sleep_on(timer: impl Timer, duration: Duration) -> Sleep {
        timer.sleep(duration)
    }
    with_watchdog("Arc<dyn Timer>", WATCHDOG, || {
        let shared: Arc<dyn Timer> = Arc::new(ThreadTimer::new());
        let start = Instant::now();
        block_on(sleep_on(shared.clone(), ms(5)));
        block_on(sleep_on(Arc::new(ThreadTimer::new()), ms(5)));
        assert!(start.elapsed() >= ms(10));
    });
}

#[test]
fn debug_output_names_the_timer() {
    let timer = format!("{:?}", ThreadTimer::new());
    assert!(timer.starts_with("ThreadTimer {"), "{timer}");
    assert!(timer.contains("pending"), "{timer}");
    let sleep = format!("{:?}", ThreadSleep::new(Duration::MAX));
    assert_eq!(sleep, "ThreadSleep { deadline: None, state: \"idle\" }");
    #[cfg(feature = "async-io")]
    assert_eq!(
        format!("{:?}", watertight::timer::AsyncIoTimer::new()),
        "AsyncIoTimer { .. }"
    );
}

// ---------------------------------------------------------------------------
// ThreadTimer on every executor
// ---------------------------------------------------------------------------

#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn thread_timer_under_futures_block_on() {
    with_watchdog("ThreadTimer under block_on", WATCHDOG, || {
        let timer = ThreadTimer::new();
        for duration in [ms(1), ms(20), ms(50)] {
            block_on(timed_sleep(&timer, duration));
        }
    });
}

#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn thread_timer_on_tokio_multi_thread() {
    with_watchdog("ThreadTimer on tokio", WATCHDOG, || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build() // no `enable_time`: the runtime's own timer is off
            .unwrap();
        runtime.block_on(async {
            let tasks: Vec<_> = (0..20)
                .map(|i| {
                    tokio::spawn(async move {
                        timed_sleep(&ThreadTimer::new(), ms(10 + 3 * i)).await;
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
    });
}

#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn thread_timer_on_smol() {
    with_watchdog("ThreadTimer on smol", WATCHDOG, || {
        smol::block_on(async {
            let tasks: Vec<_> = (0..20)
                .map(|i| {
                    smol::spawn(async move {
                        timed_sleep(&ThreadTimer::new(), ms(10 + 3 * i)).await;
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
        });
    });
}

#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn thread_timer_on_async_std() {
    with_watchdog("ThreadTimer on async-std", WATCHDOG, || {
        async_std::task::block_on(async {
            let tasks: Vec<_> = (0..20)
                .map(|i| {
                    async_std::task::spawn(async move {
                        timed_sleep(&ThreadTimer::new(), ms(10 + 3 * i)).await;
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
        });
    });
}

// ---------------------------------------------------------------------------
// ThreadTimer's queue
// ---------------------------------------------------------------------------

/// Many sleeps made in scrambled order, all pending at once: each completes
/// no earlier than its own deadline, and soon after it. (The exact order in
/// which the thread wakes them is checked by a unit test of its queue:
/// asserting it here would need an upper bound on scheduling delays.)
#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn many_concurrent_sleeps_each_wait_for_their_own_deadline() {
    with_watchdog("many sleeps", WATCHDOG, || {
        let timer = ThreadTimer::new();
        let count: u64 = 300;
        let start = Instant::now();
        // 0, 7, 14, ... ms modulo 150: deadlines out of creation order.
        let sleeps = (0..count).map(|i| {
            let duration = ms(i * 7 % 150);
            let sleep = timer.sleep(duration);
            async move {
                sleep.await;
                (duration, start.elapsed())
            }
        });
        let done = block_on(join_all(sleeps));
        assert_eq!(done.len() as u64, count);
        for (duration, elapsed) in done {
            assert_slept(duration, elapsed);
        }
    });
}

/// A sleep that becomes the earliest deadline wakes the timer thread, which
/// had parked until a later one.
#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn an_earlier_deadline_registered_later_still_fires_on_time() {
    with_watchdog("earlier deadline", WATCHDOG, || {
        let timer = ThreadTimer::new();
        let (late_flag, late_waker) = Flag::waker();
        let mut late = timer.sleep(Duration::from_secs(30));
        assert!(poll_with(late.as_mut(), &late_waker).is_pending());
        // Let the thread park until the late deadline.
        std::thread::sleep(ms(20));

        let elapsed = block_on(timed_sleep(&timer, ms(30)));
        assert!(elapsed < Duration::from_secs(30));
        assert_eq!(late_flag.wakes(), 0, "the late sleep fired early");
        drop(late);
    });
}

/// A sleep holds its task's waker while pending, and gives it back when
/// dropped: a loop that makes, polls and drops sleeps leaves nothing in the
/// timer.
#[test]
#[cfg_attr(miri, ignore = "starts the timer thread")]
fn dropped_sleeps_release_their_entries() {
    let timer = ThreadTimer::new();
    let (flag, waker) = Flag::waker();
    let baseline = Arc::strong_count(&flag);
    for _ in 0..scaled(20_000, 10) {
        let mut sleep = timer.sleep(Duration::from_secs(3600));
        assert!(poll_with(sleep.as_mut(), &waker).is_pending());
        assert_eq!(Arc::strong_count(&flag), baseline + 1, "registered");
        drop(sleep);
        assert_eq!(Arc::strong_count(&flag), baseline, "released on drop");
    }
    // Many pending at once, then all dropped.
    let mut sleeps: Vec<Sleep> = (0..1000).map(|_| timer.sleep(ms(3_600_000))).collect();
    for sleep in &mut sleeps {
        assert!(poll_with(sleep.as_mut(), &waker).is_pending());
    }
    assert_eq!(Arc::strong_count(&flag), baseline + 1000);
    drop(sleeps);
    assert_eq!(Arc::strong_count(&flag), baseline);
    assert_eq!(flag.wakes(), 0);
}

/// Polling a sleep again with the same waker keeps one entry; with another
/// waker, the first is released and only the second is woken.
#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn a_sleep_wakes_the_last_waker_it_was_polled_with() {
    with_watchdog("waker change", WATCHDOG, || {
        // Everything up to the last poll must happen within the 30 ms: if
        // this thread was descheduled past them (the last poll may have
        // found the sleep ready, the timer may have woken the first
        // waker), the round proves nothing and runs again, with new flags.
        let (start, mut sleep, first, second, second_waker) = (0..100)
            .find_map(|_| {
                let (first, first_waker) = Flag::waker();
                let (second, second_waker) = Flag::waker();
                let start = Instant::now();
                let mut sleep = ThreadSleep::new(ms(30));
                let polls: Vec<bool> = (0..3)
                    .map(|_| poll_with(Pin::new(&mut sleep), &first_waker).is_pending())
                    .collect();
                let held_first = Arc::strong_count(&first);
                let pending = poll_with(Pin::new(&mut sleep), &second_waker).is_pending();
                let counts = (Arc::strong_count(&first), Arc::strong_count(&second));
                if start.elapsed() >= ms(30) {
                    return None;
                }
                assert_eq!(polls, [true; 3], "pending before its deadline");
                assert_eq!(held_first, 3, "one clone in the timer");
                assert!(pending);
                assert_eq!(counts.0, 2, "the first clone released");
                assert_eq!(counts.1, 3, "the second one held");
                Some((start, sleep, first, second, second_waker))
            })
            .expect("descheduled past a 30 ms sleep 100 times");

        wait_for_wake(&second, ms(30) + SLACK);
        assert_slept(ms(30), start.elapsed());
        assert_eq!(first.wakes(), 0);
        assert!(!sleep.is_terminated());
        assert!(poll_with(Pin::new(&mut sleep), &second_waker).is_ready());
        assert!(sleep.is_terminated());
        assert_eq!(Arc::strong_count(&second), 2, "woken: no clone left");
        // Polling a completed sleep again is harmless.
        assert!(poll_with(Pin::new(&mut sleep), &second_waker).is_ready());
    });
}

/// The deadline is fixed when the sleep is made; a sleep first polled after
/// it completes at once, without the timer thread.
#[test]
#[cfg_attr(miri, ignore = "real time")]
fn a_sleep_counts_from_when_it_was_made() {
    let (flag, waker) = Flag::waker();
    let mut sleep = ThreadTimer::new().sleep(ms(10));
    std::thread::sleep(ms(15));
    assert!(poll_with(sleep.as_mut(), &waker).is_ready());
    assert_eq!(Arc::strong_count(&flag), 2, "nothing was registered");
}

#[test]
fn a_zero_sleep_completes_on_first_poll() {
    let timer = ThreadTimer::new();
    assert!(poll_noop(timer.sleep(Duration::ZERO).as_mut()).is_ready());
    let mut sleep = pin!(ThreadSleep::new(Duration::ZERO));
    assert!(poll_noop(sleep.as_mut()).is_ready());
    assert!(sleep.is_terminated());
    let past = ThreadSleep::until(Instant::now());
    assert!(poll_noop(pin!(past)).is_ready());
}

/// A duration past what an `Instant` can hold never completes, and neither
/// panics nor registers anything.
#[test]
fn a_max_sleep_is_pending_forever_without_panicking() {
    let (flag, waker) = Flag::waker();
    let mut sleep = ThreadTimer::new().sleep(Duration::MAX);
    for _ in 0..3 {
        assert!(poll_with(sleep.as_mut(), &waker).is_pending());
    }
    assert_eq!(Arc::strong_count(&flag), 2, "nothing was registered");
    drop(sleep);
    assert_eq!(ThreadSleep::new(Duration::MAX).deadline(), None);
}

/// A sleep years away parks the thread no differently: earlier sleeps still
/// fire on time.
#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn a_sleep_years_away_does_not_hold_up_the_others() {
    with_watchdog("far sleep", WATCHDOG, || {
        let (flag, waker) = Flag::waker();
        let years = Duration::from_secs(100 * 365 * 24 * 3600);
        let mut far = ThreadTimer::new().sleep(years);
        assert!(poll_with(far.as_mut(), &waker).is_pending());
        block_on(timed_sleep(&ThreadTimer::new(), ms(20)));
        assert_eq!(flag.wakes(), 0);
        drop(far);
        assert_eq!(Arc::strong_count(&flag), 2);
    });
}

/// A waker that panics when woken is reported by the panic hook, and the
/// timer thread goes on serving every other sleep.
#[test]
#[cfg_attr(miri, ignore = "real time and the timer thread")]
fn a_panicking_waker_does_not_stop_the_timer_thread() {
    struct Bomb;
    impl Wake for Bomb {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics on purpose (expected in this test)");
        }
    }
    with_watchdog("panicking waker", WATCHDOG, || {
        let bomb = Waker::from(Arc::new(Bomb));
        // Registered with the timer thread: pending at its first poll,
        // which a thread descheduled for the millisecond between making
        // and polling it would see ready (then it is made again).
        let _doomed = (0..100)
            .find_map(|_| {
                let mut doomed = ThreadSleep::new(ms(1));
                poll_with(Pin::new(&mut doomed), &bomb)
                    .is_pending()
                    .then_some(doomed)
            })
            .expect("a 1 ms sleep was ready at its first poll 100 times");
        std::thread::sleep(ms(20));
        for _ in 0..3 {
            block_on(timed_sleep(&ThreadTimer::new(), ms(10)));
        }
    });
}

// ---------------------------------------------------------------------------
// Runtime timers
// ---------------------------------------------------------------------------

#[cfg(feature = "tokio")]
mod tokio_timer {
    use super::*;
    use watertight::timer::TokioTimer;

    /// Sleeps spawned on a multi-thread runtime, and sleeps polled on a
    /// plain thread outside it, all run on its time driver.
    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn sleeps_inside_and_outside_the_runtime() {
        with_watchdog("TokioTimer", WATCHDOG, || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .unwrap();
            let timer = TokioTimer::new(runtime.handle().clone());
            assert_eq!(timer.handle().id(), runtime.handle().id());

            // On a plain thread, no tokio context.
            assert!(TokioTimer::try_current().is_none());
            block_on(timed_sleep(&timer, ms(20)));

            // As tasks of the runtime.
            runtime.block_on(async {
                let tasks: Vec<_> = (0..10)
                    .map(|i| {
                        let timer = TokioTimer::try_current().expect("inside the runtime");
                        tokio::spawn(async move {
                            timed_sleep(&timer, ms(10 + 5 * i)).await;
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            });
        });
    }

    /// A sleep is driven by its runtime's time driver, not by the wall
    /// clock: on a current-thread runtime that nobody is driving, it cannot
    /// complete, however long it waits; once the runtime runs, it does.
    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn sleeps_follow_their_runtimes_time_driver() {
        with_watchdog("TokioTimer driver", WATCHDOG, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let timer = TokioTimer::new(runtime.handle().clone());
            let (flag, waker) = Flag::waker();
            let start = Instant::now();
            let mut sleep = timer.sleep(ms(10));
            assert!(poll_with(sleep.as_mut(), &waker).is_pending());
            std::thread::sleep(ms(50));
            assert_eq!(flag.wakes(), 0, "fired without its runtime running");
            assert!(poll_with(sleep.as_mut(), &waker).is_pending());

            // Driving the runtime fires it.
            runtime.block_on(async { tokio::time::sleep(ms(1)).await });
            wait_for_wake(&flag, SLACK);
            assert!(poll_with(sleep.as_mut(), &waker).is_ready());
            assert!(start.elapsed() >= ms(10));
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn zero_and_max_durations() {
        with_watchdog("TokioTimer extremes", WATCHDOG, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let timer = TokioTimer::new(runtime.handle().clone());
            runtime.block_on(timer.sleep(Duration::ZERO));
            let mut forever = timer.sleep(Duration::MAX);
            runtime.block_on(async {
                assert!(poll_noop(forever.as_mut()).is_pending());
                tokio::time::sleep(ms(5)).await;
                assert!(poll_noop(forever.as_mut()).is_pending());
            });
        });
    }

    /// Inside a tokio runtime, `default_timer` uses it.
    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn default_timer_picks_tokio_inside_a_runtime() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let timer = runtime.block_on(async { default_timer() }).unwrap();
        let name = format!("{timer:?}");
        assert!(name.starts_with("TokioTimer"), "{name}");
        // From a blocking task and under `enter` as well.
        let timer = runtime
            .block_on(async { tokio::task::spawn_blocking(default_timer).await })
            .unwrap()
            .unwrap();
        assert!(format!("{timer:?}").starts_with("TokioTimer"));
        let timer = {
            let _guard = runtime.enter();
            default_timer().unwrap()
        };
        assert!(format!("{timer:?}").starts_with("TokioTimer"));
        // And the timer it picked runs on that runtime from anywhere.
        with_watchdog("default TokioTimer", WATCHDOG, move || {
            block_on(timed_sleep(&timer, ms(10)));
            drop(runtime);
        });
    }
}

#[cfg(feature = "async-io")]
mod async_io_timer {
    use super::*;
    use watertight::timer::AsyncIoTimer;

    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn under_futures_block_on() {
        with_watchdog("AsyncIoTimer under block_on", WATCHDOG, || {
            block_on(timed_sleep(&AsyncIoTimer::new(), ms(20)));
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn on_smol_and_async_std() {
        with_watchdog("AsyncIoTimer on smol", WATCHDOG, || {
            smol::block_on(async {
                let tasks: Vec<_> = (0..10)
                    .map(|i| {
                        smol::spawn(async move {
                            timed_sleep(&AsyncIoTimer::new(), ms(10 + 5 * i)).await;
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await;
                }
            });
            async_std::task::block_on(timed_sleep(&AsyncIoTimer::new(), ms(20)));
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "real time")]
    fn zero_and_max_durations() {
        with_watchdog("AsyncIoTimer extremes", WATCHDOG, || {
            block_on(AsyncIoTimer::new().sleep(Duration::ZERO));
            let mut forever = AsyncIoTimer::new().sleep(Duration::MAX);
            assert!(poll_noop(forever.as_mut()).is_pending());
        });
    }
}

// ---------------------------------------------------------------------------
// default_timer
// ---------------------------------------------------------------------------

/// Outside any runtime, `default_timer` follows the features: `async-io`,
/// else `thread-timer`, else none.
#[test]
fn default_timer_outside_a_runtime_follows_the_features() {
    let picked = default_timer().map(|timer| format!("{timer:?}"));
    let expected = if cfg!(feature = "async-io") {
        Some("AsyncIoTimer")
    } else if cfg!(feature = "thread-timer") {
        Some("ThreadTimer")
    } else {
        None
    };
    match (picked.as_deref(), expected) {
        (Some(name), Some(prefix)) => assert!(name.starts_with(prefix), "{name}"),
        (None, None) => {}
        (picked, expected) => panic!("default_timer() gave {picked:?}, expected {expected:?}"),
    }
}

/// Without the `tokio` feature, a tokio runtime makes no difference.
#[cfg(not(feature = "tokio"))]
#[test]
#[cfg_attr(miri, ignore = "tokio's runtime is slow under Miri")]
fn default_timer_without_the_tokio_feature_ignores_tokio() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inside = runtime.block_on(async { default_timer().map(|t| format!("{t:?}")) });
    let outside = default_timer().map(|t| format!("{t:?}"));
    let kind = |name: Option<String>| name.map(|n| n.split(' ').next().unwrap().to_owned());
    assert_eq!(kind(inside), kind(outside));
}

/// The default timer, whichever it is, keeps time.
#[test]
#[cfg_attr(miri, ignore = "real time")]
fn the_default_timer_keeps_time() {
    with_watchdog("default timer", WATCHDOG, || {
        if let Some(timer) = default_timer() {
            block_on(timed_sleep(&*timer, ms(20)));
        }
    });
}

#[cfg(feature = "tokio")]
mod tokio_paused_clock {
    use super::*;
    use watertight::timer::TokioTimer;

    /// Under tokio's paused clock, a sleep completes when the clock is
    /// advanced past its deadline, not before, and takes no real time.
    #[test]
    #[cfg_attr(miri, ignore = "tokio's runtime is slow under Miri")]
    fn sleeps_follow_the_paused_clock() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let real = Instant::now();
        runtime.block_on(async {
            tokio::time::pause();
            let timer = TokioTimer::try_current().expect("inside the runtime");
            let mut sleep = timer.sleep(Duration::from_secs(3600));
            assert!(poll_noop(sleep.as_mut()).is_pending());
            tokio::time::advance(Duration::from_secs(3599)).await;
            assert!(poll_noop(sleep.as_mut()).is_pending());
            // Tokio rounds deadlines up to its millisecond tick.
            tokio::time::advance(Duration::from_secs(1) + ms(1)).await;
            assert!(poll_noop(sleep.as_mut()).is_ready());
            // With nothing else to do, the paused clock jumps to the next
            // deadline: `default_timer` sleeps follow it too.
            let start = tokio::time::Instant::now();
            default_timer()
                .unwrap()
                .sleep(Duration::from_secs(60))
                .await;
            let slept = start.elapsed();
            assert!(
                slept >= Duration::from_secs(60) && slept < Duration::from_secs(61),
                "{slept:?}"
            );
        });
        assert!(real.elapsed() < SLACK, "paused time took real time");
    }
}
