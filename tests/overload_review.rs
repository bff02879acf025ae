//! Review of the overload controls of issue 14 (priority classes,
//! controlled delay and adaptive LIFO on classed lines, deadline
//! admission with classes, the keyed fair line), as a demanding user:
//! cancellation, panicking user code (wakers, observers), runtime limit
//! changes, and promises of the overload guide (`watertight::guide::overload`)
//! that the other test files do not pin down. Hand-polled futures, or tokio's paused clock: no timing
//! assertions.
#![cfg(not(loom))]

mod common;

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use watertight::CallOptions;

use common::{Counted, poll_noop};
use watertight::{Bulkhead, BulkheadPermit, RejectReason, Rejected};

const MS: Duration = Duration::from_millis(1);

type Waiter<'a> = Pin<Box<dyn Future<Output = Result<BulkheadPermit, Rejected>> + 'a>>;

/// A waker whose first `wake` panics (later ones count, and do not).
#[derive(Default)]
struct PanicsOnFirstWake(AtomicUsize);

impl PanicsOnFirstWake {
    fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for PanicsOnFirstWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("the waker panics");
        }
    }
}

fn poll_with<F: Future + ?Sized>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

fn held(bh: &Bulkhead) -> Vec<usize> {
    bh.priority_seats().iter().map(|c| c.held).collect()
}

fn waiting(bh: &Bulkhead) -> Vec<usize> {
    bh.priority_seats().iter().map(|c| c.waiting).collect()
}

/// Nothing held, nobody waiting, in every count a user can read, and a
/// seat of every class can be taken again.
#[track_caller]
fn assert_at_rest(bh: &Bulkhead) {
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued()), (0, 0), "gauges");
    let seats = bh.priority_seats();
    assert!(
        seats.iter().all(|c| c.held == 0 && c.waiting == 0),
        "{seats:?}"
    );
    let permits: Vec<_> = (0..m.max_concurrent_calls())
        .map(|_| {
            bh.try_acquire_with(CallOptions::new().class(0))
                .expect("every seat is free")
        })
        .collect();
    drop(permits);
}

// ---------------------------------------------------------------------------
// Controlled delay on a class's line
// ---------------------------------------------------------------------------

/// The classed counterpart of `tests/overload.rs`'s
/// `the_last_waiter_finding_the_line_standing_leaves_it_empty_not_standing`:
/// "the overload clears when the line empties". When the waiter whose
/// wait finds its class's line standing was the last one in it, the line
/// is empty, and the next caller that waits past the target is served,
/// as on a bulkhead without classes, not cut.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_class_line_whose_last_waiter_finds_it_standing_is_left_empty_not_standing() {
    for classes in [false, true] {
        let mut builder = Bulkhead::builder()
            .max_concurrent_calls(1)
            // Standing at the first wait of 20 ms or more.
            .queue_delay(20 * MS, Duration::ZERO)
            .max_wait(Duration::from_secs(60));
        if classes {
            builder = builder.priorities(&[1, 1]);
        }
        let bh = builder.build().unwrap();
        let wait = |bh: &Bulkhead| {
            let bh = bh.clone();
            tokio::spawn(async move {
                let permit = bh
                    .acquire_with(CallOptions::new().class(0))
                    .await
                    .map_err(|r| r.reason())?;
                tokio::time::sleep(50 * MS).await;
                drop(permit);
                Ok::<_, RejectReason>(())
            })
        };
        let seat = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
        let first = wait(&bh);
        tokio::time::sleep(50 * MS).await;
        // Served after 50 ms, with nobody behind it.
        drop(seat);
        tokio::task::yield_now().await;
        // Waits 50 ms behind it, past the target, on a line that emptied.
        let second = wait(&bh);
        let case = format!("classes {classes}");
        assert_eq!(first.await.unwrap(), Ok(()), "{case}");
        assert_eq!(second.await.unwrap(), Ok(()), "{case}");
        assert_eq!(bh.metrics().rejected_queue_delay(), 0, "{case}");
        assert_at_rest(&bh);
    }
}

// ---------------------------------------------------------------------------
// Wakers that panic
// ---------------------------------------------------------------------------

/// A classed waiter handed a seat, whose look at the line finds it
/// standing and wakes the front waiter, whose waker panics: the panic
/// may reach the served waiter's poll, but its seat is not lost (dropping
/// it gives the seat back), and the waiter behind is still served.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_waker_woken_as_a_classed_waiter_is_served_loses_no_seat() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1])
        // Standing at the first wait of 10 ms or more.
        .queue_delay(10 * MS, Duration::ZERO)
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let seat = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let mut a: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    assert!(poll_noop(a.as_mut()).is_pending());
    tokio::time::advance(15 * MS).await;
    let bad = Arc::new(PanicsOnFirstWake::default());
    let bad_waker = Waker::from(bad.clone());
    let mut b: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    assert!(poll_with(b.as_mut(), &bad_waker).is_pending());
    tokio::time::advance(5 * MS).await;
    // a is served after 20 ms: its sample finds the line standing, and
    // wakes b (5 ms in line) to look at its wait.
    drop(seat);
    let polled = catch_unwind(AssertUnwindSafe(|| poll_noop(a.as_mut())));
    assert_eq!(bad.wakes(), 1, "b was woken to look");
    match polled {
        Ok(Poll::Ready(Ok(permit))) => drop(permit),
        Ok(other) => panic!("a should be served: {other:?}"),
        // The waker's panic reached a's poll: a still holds the seat,
        // which dropping it gives back.
        Err(_) => {
            assert_eq!(held(&bh), [1], "a holds the seat it was handed");
            let dropped = catch_unwind(AssertUnwindSafe(|| drop(a)));
            assert!(dropped.is_ok(), "dropping a after its poll panicked");
        }
    }
    // The seat went on to b, waiting under the target.
    match poll_noop(b.as_mut()) {
        Poll::Ready(Ok(permit)) => drop(permit),
        other => panic!("b should be served: {other:?}"),
    }
    drop(b);
    assert_at_rest(&bh);
}

/// A newcomer that displaces a waiter from a full line, whose waker
/// panics: the newcomer's poll may panic, but it leaves no phantom waiter
/// behind to take (and keep) the next seat that frees.
#[test]
fn a_panicking_waker_of_a_displaced_waiter_strands_no_seat() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .max_queue(1)
        .build()
        .unwrap();
    let seat = bh.try_acquire_with(CallOptions::new().class(1)).unwrap();
    let bad = Arc::new(PanicsOnFirstWake::default());
    let bad_waker = Waker::from(bad.clone());
    let mut victim: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(1)));
    assert!(poll_with(victim.as_mut(), &bad_waker).is_pending());
    let mut newcomer: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    let polled = catch_unwind(AssertUnwindSafe(|| poll_noop(newcomer.as_mut())));
    assert_eq!(bad.wakes(), 1, "the displaced waiter was woken");
    match polled {
        // The panic did not reach the newcomer: it waits.
        Ok(Poll::Pending) => {
            assert_eq!(waiting(&bh), [1, 0]);
            drop(newcomer);
        }
        Ok(other) => panic!("the newcomer should wait: {other:?}"),
        // It did: the newcomer's future is spent and dropped.
        Err(_) => drop(newcomer),
    }
    assert_eq!(
        poll_noop(victim.as_mut()).map(|r| r.map(drop).map_err(|r| r.reason())),
        Poll::Ready(Err(RejectReason::Displaced))
    );
    drop(victim);
    assert_eq!(bh.metrics().rejected_displaced(), 1);
    assert_eq!(bh.metrics().queued(), 0, "nobody waits");
    drop(seat);
    assert_at_rest(&bh);
}

/// A bulkhead of one seat with two classes.
fn one_seat_two_classes() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1, 1])
        .build()
        .unwrap()
}

/// The seat held, and two classed waiters behind it, each polled once:
/// the first (class 0) with a waker that panics at its first wake, the
/// second (class 1) with a counting one.
struct TwoWaiters<'a> {
    seat: BulkheadPermit,
    bad: Arc<PanicsOnFirstWake>,
    first: Waiter<'a>,
    good: Counted,
    second: Waiter<'a>,
}

fn two_waiters(bh: &Bulkhead) -> TwoWaiters<'_> {
    let seat = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
    let bad = Arc::new(PanicsOnFirstWake::default());
    let bad_waker = Waker::from(bad.clone());
    let mut first: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    assert!(poll_with(first.as_mut(), &bad_waker).is_pending());
    let good = Counted::new();
    let mut second: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(1)));
    good.assert_pending(second.as_mut());
    TwoWaiters {
        seat,
        bad,
        first,
        good,
        second,
    }
}

/// `set_max_concurrent_calls` that hands seats to several classed
/// waiters, the first of whose wakers panics: every other one is woken
/// all the same (none is stranded holding a seat it never hears of).
#[test]
fn a_panicking_waker_in_a_raised_limit_strands_no_other_classed_waiter() {
    let bh = one_seat_two_classes();
    let TwoWaiters {
        seat,
        bad,
        mut first,
        good,
        mut second,
    } = two_waiters(&bh);
    let raised = catch_unwind(AssertUnwindSafe(|| bh.set_max_concurrent_calls(3)));
    assert_eq!(bad.wakes(), 1);
    assert_eq!(
        good.wakes(),
        1,
        "the second waiter was woken (raised: {raised:?})"
    );
    assert_eq!(bh.metrics().max_concurrent_calls(), 3);
    assert_eq!(held(&bh), [2, 1]);
    let p1 = good.ready(first.as_mut()).unwrap();
    let p2 = good.ready(second.as_mut()).unwrap();
    drop((p1, p2, seat));
    assert_at_rest(&bh);
}

/// `close` that rejects several classed waiters, the first of whose
/// wakers panics: every other one is woken all the same.
#[test]
fn a_panicking_waker_in_close_strands_no_other_classed_waiter() {
    let bh = one_seat_two_classes();
    let TwoWaiters {
        seat,
        bad,
        mut first,
        good,
        mut second,
    } = two_waiters(&bh);
    let closed = catch_unwind(AssertUnwindSafe(|| bh.close()));
    assert_eq!(bad.wakes(), 1);
    assert_eq!(
        good.wakes(),
        1,
        "the second waiter was woken (close: {closed:?})"
    );
    for w in [&mut first, &mut second] {
        let r = good.ready(w.as_mut()).map(drop).map_err(|r| r.reason());
        assert_eq!(r, Err(RejectReason::Closed));
    }
    drop(seat);
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
}

/// A classed call that panics gives its seat back as it unwinds, to a
/// waiter whose waker panics too: a second panic during unwinding would
/// abort the process; the seat reaches the waiter, and nothing is lost.
#[test]
fn a_panicking_waker_woken_as_a_panicking_classed_call_unwinds_does_not_abort() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .priorities(&[1])
        .build()
        .unwrap();
    let mut started = false;
    let work = std::future::poll_fn(move |_| {
        if !std::mem::replace(&mut started, true) {
            return Poll::<Result<(), ()>>::Pending;
        }
        panic!("the call panics");
    });
    let mut call = Box::pin(bh.call_with(CallOptions::new().class(0), work));
    assert!(poll_noop(call.as_mut()).is_pending());
    let bad = Arc::new(PanicsOnFirstWake::default());
    let bad_waker = Waker::from(bad.clone());
    let mut waiter: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
    assert!(poll_with(waiter.as_mut(), &bad_waker).is_pending());
    let polled = catch_unwind(AssertUnwindSafe(|| poll_noop(call.as_mut())));
    assert!(polled.is_err(), "the call's panic reaches its caller");
    drop(call);
    assert_eq!(bad.wakes(), 1, "the waiter was woken");
    match poll_noop(waiter.as_mut()) {
        Poll::Ready(Ok(permit)) => drop(permit),
        other => panic!("the waiter should be served: {other:?}"),
    }
    drop(waiter);
    assert_eq!(bh.metrics().finished(), 2, "the call and the waiter");
    assert_at_rest(&bh);
}

// ---------------------------------------------------------------------------
// Keys whose `Eq` panics
// ---------------------------------------------------------------------------

/// A key that hashes the same as every other (so every lookup compares),
/// and whose `Eq` panics at the comparison `PANIC_AT` counts down to.
#[derive(Debug, Clone)]
struct Colliding(u32);

static PANIC_AT: AtomicUsize = AtomicUsize::new(0);

impl PartialEq for Colliding {
    fn eq(&self, other: &Self) -> bool {
        if PANIC_AT.fetch_sub(1, Ordering::SeqCst) == 1 {
            panic!("the key's Eq panics");
        }
        self.0 == other.0
    }
}

impl Eq for Colliding {}

impl std::hash::Hash for Colliding {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u32(7);
    }
}

/// A new key whose `Eq` panics as the keyed bulkhead looks for it before
/// tracking it: nothing is tracked, and its place under `max_keys` is not
/// lost (else every such panic lowers `max_keys` for good, down to no key
/// at all).
#[test]
fn a_key_whose_eq_panics_as_it_is_tracked_takes_no_place() {
    use watertight::keyed::KeyedBulkhead;
    let kb = KeyedBulkhead::<Colliding>::builder()
        .max_concurrent_calls(1)
        .max_keys(2)
        .build()
        .unwrap();
    let busy = kb.try_acquire(&Colliding(1)).unwrap();
    // The lookup of key 2 compares it with key 1 (no panic), then, to
    // track it, compares again: that one panics.
    PANIC_AT.store(2, Ordering::SeqCst);
    let tracked = catch_unwind(AssertUnwindSafe(|| kb.try_acquire(&Colliding(2)).map(drop)));
    assert!(tracked.is_err(), "the key's Eq panicked");
    PANIC_AT.store(0, Ordering::SeqCst);
    assert_eq!(kb.keys_tracked(), 1);
    // Key 1 is busy (not evictable): the second place is key 3's.
    let other = kb.try_acquire(&Colliding(3)).map_err(|r| r.reason());
    assert!(other.is_ok(), "{other:?}");
    assert_eq!(kb.keys_tracked(), 2);
    drop((busy, other));
}

// ---------------------------------------------------------------------------
// Deadline-aware admission on a bulkhead with classes
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Quiet;

impl watertight::observer::Observer for Quiet {}

/// A plain `call_by` / `acquire_by` on a bulkhead with classes finds its
/// seat free (it never waits): its expected wait is zero, as without
/// classes, so a deadline that one call's hold fits in is admitted.
#[test]
fn a_plain_deadline_call_on_a_classed_bulkhead_counts_the_free_seats() {
    use std::time::Instant;
    for classes in [false, true] {
        let mut builder = Bulkhead::builder()
            .max_concurrent_calls(1)
            // Every hold is timed.
            .observer(Arc::new(Quiet));
        if classes {
            builder = builder.priorities(&[1]);
        }
        let bh = builder.build().unwrap();
        // The hold-time average is one hold of about `hold`, at most.
        let started = Instant::now();
        let permit = bh.try_acquire().unwrap();
        // Long enough that the margin (half a hold) dwarfs a loaded
        // machine's scheduling delays.
        std::thread::sleep(200 * MS);
        drop(permit);
        let hold = started.elapsed();
        // A seat free and nobody waiting: one hold fits in 1.5 of them.
        // (Counted as busy, the wait of one hold more would not.)
        let by = Instant::now() + hold * 3 / 2;
        let case = format!("classes {classes}");
        let called = futures::executor::block_on(
            bh.call_with(CallOptions::new().deadline(by), async { Ok::<_, ()>(7) }),
        );
        assert_eq!(called.map_err(|e| format!("{e}")), Ok(7), "{case}");
        let by = Instant::now() + hold * 3 / 2;
        let acquired =
            futures::executor::block_on(bh.acquire_with(CallOptions::new().deadline(by)));
        assert!(acquired.is_ok(), "{case}: {:?}", acquired.map(drop));
        drop(acquired);
        assert_eq!(bh.metrics().rejected_deadline(), 0, "{case}");
    }
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

/// A timer whose clock the bulkhead cannot read: every waiter gets a sleep
/// of its own (no line timer).
#[derive(Debug)]
struct OwnSleeps(watertight::timer::ThreadTimer);

impl watertight::timer::Timer for OwnSleeps {
    fn sleep(&self, duration: Duration) -> watertight::timer::Sleep {
        self.0.sleep(duration)
    }
}

/// A controlled-delay target and interval no line reaches (all but
/// `Duration::MAX`, under a `max_wait` of `Duration::MAX`): no overflow,
/// no hang, and a freed permit is still handed on. With the line timer,
/// with a sleep per waiter, and on a classed line. (A target at or above
/// a finite `max_wait` is refused at build: no wait would live to see it.)
#[test]
fn a_huge_queue_delay_target_and_interval_are_a_line_that_never_stands() {
    let refused = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(20 * MS)
        .queue_delay(Duration::MAX, Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        watertight::BuildErrorKind::QueueDelayTargetNotBelowMaxWait
    );
    common::with_watchdog("huge queue_delay", common::WATCHDOG, || {
        for (kind, classes, own_sleeps) in [
            ("line timer", false, false),
            ("own sleeps", false, true),
            ("classes", true, false),
        ] {
            let timer: Arc<dyn watertight::timer::Timer> = if own_sleeps {
                Arc::new(OwnSleeps(watertight::timer::ThreadTimer::new()))
            } else {
                Arc::new(watertight::timer::ThreadTimer::new())
            };
            let mut builder = Bulkhead::builder()
                .max_concurrent_calls(1)
                .max_wait(Duration::MAX)
                .queue_delay(Duration::MAX - Duration::from_nanos(1), Duration::MAX)
                .adaptive_lifo(true)
                .timer(timer);
            if classes {
                builder = builder.priorities(&[1, 1]);
            }
            let bh = builder.build().unwrap();
            let held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
            let mut waiter: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
            assert!(poll_noop(waiter.as_mut()).is_pending(), "{kind}");
            std::thread::sleep(2 * MS);
            assert!(poll_noop(waiter.as_mut()).is_pending(), "{kind}");
            drop(held);
            let served = futures::executor::block_on(waiter);
            assert!(served.is_ok(), "{kind}: {:?}", served.map(drop));
            drop(served);
            let m = bh.metrics();
            assert_eq!(m.rejected(), 0, "{kind}");
            assert_eq!((m.in_flight(), m.queued()), (0, 0), "{kind}");
        }
    });
}

// ---------------------------------------------------------------------------
// Seeded random runs
// ---------------------------------------------------------------------------

fn xorshift(seed: u64) -> impl FnMut(u64) -> usize {
    let mut x = seed;
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as usize
    }
}

/// Gauges a user reads, checked against what the test holds: every seat
/// is a permit it holds, every waiter one of its pending futures, and no
/// seat idles while someone waits.
#[track_caller]
fn assert_counts(bh: &Bulkhead, running: usize, line: usize, step: usize) {
    let m = bh.metrics();
    let s = bh.priority_seats();
    assert_eq!(m.in_flight(), running, "step {step}: in flight");
    assert_eq!(
        s.iter().map(|c| c.held).sum::<usize>(),
        running,
        "step {step}: {s:?}"
    );
    assert_eq!(m.queued(), line, "step {step}: queued");
    assert_eq!(
        s.iter().map(|c| c.waiting).sum::<usize>(),
        line,
        "step {step}: {s:?}"
    );
    assert!(
        line == 0 || running >= m.max_concurrent_calls(),
        "step {step}: a seat idles while {line} wait: {s:?}"
    );
}

/// Classes with controlled delay, adaptive LIFO, `max_wait` and a bounded
/// line, under random arrivals, cancellations (before the first poll,
/// while waiting, after a grant not yet seen), finished calls, limit
/// changes (shrinking below the seats held, growing with waiters) and
/// time passing, on tokio's paused clock: after every step the gauges
/// match what the callers hold; nobody is cut before the target or timed
/// out before `max_wait`; every rejection is counted under its reason;
/// and at the end nothing is left.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn classes_with_delay_lifo_and_limit_changes_lose_nothing() {
    use tokio::time::Instant;
    let (target, max_wait) = (10 * MS, 60 * MS);
    let bh = Bulkhead::builder()
        .max_concurrent_calls(3)
        .priorities(&[2, 1, 1])
        .queue_delay(target, 20 * MS)
        .adaptive_lifo(true)
        .max_wait(max_wait)
        .max_queue(8)
        .build()
        .unwrap();
    let mut rand = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut line: Vec<(Instant, Waiter<'_>)> = Vec::new();
    let mut running: Vec<BulkheadPermit> = Vec::new();
    let mut reasons = std::collections::HashMap::<RejectReason, u64>::new();
    let mut grants_from_line = 0;
    for step in 0..4_000 {
        match rand(20) {
            0..=7 => {
                let mut w: Waiter<'_> =
                    Box::pin(bh.acquire_with(CallOptions::new().class(rand(3))));
                if rand(10) == 0 {
                    // Dropped before its first poll.
                    drop(w);
                } else {
                    match poll_noop(w.as_mut()) {
                        Poll::Ready(Ok(p)) => running.push(p),
                        Poll::Ready(Err(r)) => *reasons.entry(r.reason()).or_default() += 1,
                        Poll::Pending => line.push((Instant::now(), w)),
                    }
                }
            }
            // Cancelled in line, or after a grant it has not seen.
            8 | 9 if !line.is_empty() => drop(line.remove(rand(line.len() as u64))),
            10..=13 if !running.is_empty() => {
                drop(running.swap_remove(rand(running.len() as u64)));
                if rand(3) == 0 && !line.is_empty() {
                    // The seat may have gone to this one: dropped unseen.
                    drop(line.remove(rand(line.len() as u64)));
                }
            }
            14 => bh.set_max_concurrent_calls(rand(6)),
            _ => tokio::time::advance(Duration::from_millis(rand(15) as u64)).await,
        }
        let mut still = Vec::new();
        for (joined, mut w) in line.drain(..) {
            match poll_noop(w.as_mut()) {
                Poll::Pending => still.push((joined, w)),
                Poll::Ready(Ok(p)) => {
                    grants_from_line += 1;
                    running.push(p);
                }
                Poll::Ready(Err(r)) => {
                    let waited = joined.elapsed();
                    match r.reason() {
                        RejectReason::QueueDelay => {
                            assert!(waited >= target, "step {step}: cut after {waited:?}")
                        }
                        RejectReason::Timeout => {
                            assert!(
                                waited >= max_wait,
                                "step {step}: timed out after {waited:?}"
                            )
                        }
                        RejectReason::Displaced => {}
                        other => panic!("step {step}: {other:?}"),
                    }
                    *reasons.entry(r.reason()).or_default() += 1;
                }
            }
        }
        line = still;
        assert_counts(&bh, running.len(), line.len(), step);
    }
    let m = bh.metrics();
    let count = |r| reasons.get(&r).copied().unwrap_or(0);
    assert_eq!(m.rejected_queue_delay(), count(RejectReason::QueueDelay));
    assert_eq!(m.rejected_timeout(), count(RejectReason::Timeout));
    assert_eq!(m.rejected_full(), count(RejectReason::Full));
    // A displaced waiter dropped before it looked is counted, not seen.
    assert!(m.rejected_displaced() >= count(RejectReason::Displaced));
    for r in [
        RejectReason::QueueDelay,
        RejectReason::Timeout,
        RejectReason::Displaced,
    ] {
        assert!(count(r) > 0, "no {r:?} in the run: {reasons:?}");
    }
    assert!(
        grants_from_line > 200,
        "only {grants_from_line} grants from the line"
    );
    drop(line);
    drop(running);
    bh.set_max_concurrent_calls(3);
    assert_at_rest(&bh);
}

/// Runs `f`; whether it panicked.
fn panicked(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// Classes under random arrivals, cancellations, finished calls and
/// limit changes, where one waiter in four has a waker that panics the
/// first time it is woken (in a release, a limit change, a displacement,
/// another waiter's drop or poll): whichever call runs it panics, and
/// still no seat is lost, no waiter stranded, no gauge left wrong; `close`
/// at the end rejects everyone left.
#[test]
fn classes_with_wakers_that_panic_lose_nothing() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(2)
        .priorities(&[1, 1, 1])
        .max_queue(6)
        .build()
        .unwrap();
    let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
    let mut line: Vec<(Waker, Waiter<'_>)> = Vec::new();
    let mut running: Vec<BulkheadPermit> = Vec::new();
    let mut panics = 0;
    for step in 0..4_000 {
        let panicked_here = match rand(10) {
            0..=4 => {
                let waker = if rand(4) == 0 {
                    Waker::from(Arc::new(PanicsOnFirstWake::default()))
                } else {
                    Waker::noop().clone()
                };
                let mut w: Waiter<'_> =
                    Box::pin(bh.acquire_with(CallOptions::new().class(rand(3))));
                let mut out = None;
                // A displaced waiter's waker may panic in this poll.
                if panicked(|| out = Some(poll_with(w.as_mut(), &waker))) {
                    // Spent: dropped.
                    assert!(!panicked(|| drop(w)), "step {step}");
                    true
                } else {
                    match out.expect("polled") {
                        Poll::Ready(Ok(p)) => running.push(p),
                        Poll::Ready(Err(r)) => assert_eq!(r.reason(), RejectReason::Full),
                        Poll::Pending => line.push((waker, w)),
                    }
                    false
                }
            }
            5 if !line.is_empty() => {
                let w = line.remove(rand(line.len() as u64));
                panicked(|| drop(w))
            }
            6 => {
                let limit = rand(4);
                panicked(|| bh.set_max_concurrent_calls(limit))
            }
            _ if !running.is_empty() => {
                let p = running.swap_remove(rand(running.len() as u64));
                panicked(|| drop(p))
            }
            _ => false,
        };
        panics += usize::from(panicked_here);
        let mut still = Vec::new();
        for (waker, mut w) in line.drain(..) {
            let mut out = None;
            if panicked(|| out = Some(poll_with(w.as_mut(), &waker))) {
                panics += 1;
                assert!(!panicked(|| drop(w)), "step {step}");
                continue;
            }
            match out.expect("polled") {
                Poll::Pending => still.push((waker, w)),
                Poll::Ready(Ok(p)) => running.push(p),
                Poll::Ready(Err(r)) => assert_eq!(r.reason(), RejectReason::Displaced),
            }
        }
        line = still;
        assert_counts(&bh, running.len(), line.len(), step);
    }
    assert!(panics > 20, "only {panics} wakers panicked");
    let closed_waiters = line.len();
    let _ = panicked(|| bh.close());
    for (waker, mut w) in line {
        let mut out = None;
        if !panicked(|| out = Some(poll_with(w.as_mut(), &waker))) {
            let r = out
                .expect("polled")
                .map(|r| r.map(drop).map_err(|r| r.reason()));
            assert_eq!(r, Poll::Ready(Err(RejectReason::Closed)));
        }
    }
    assert_eq!(bh.metrics().rejected_closed() as usize, closed_waiters);
    drop(running);
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
    assert!(
        bh.priority_seats()
            .iter()
            .all(|c| c.held == 0 && c.waiting == 0)
    );
}

/// The keyed bulkhead's fair line (weights 3, 1, 1, 1) under random
/// arrivals, cancellations (in a key's line, on its turn, just handed a
/// seat), finished calls, changes of the global limit (shrinking below
/// the seats held, growing with callers waiting) and wakers that panic
/// the first time they are woken: after every step (every caller polled
/// until none moves, as an executor would) the global gauges match what
/// the callers hold, no global seat idles while a caller waits, and at
/// the end nothing is left and a free seat is taken at once.
#[test]
fn the_fair_line_under_random_load_and_limit_changes_loses_nothing() {
    use watertight::keyed::{KeyedBulkhead, KeyedPermit, KeyedRejected};
    type Acquiring<'a> = Pin<Box<dyn Future<Output = Result<KeyedPermit, KeyedRejected>> + 'a>>;
    let kb = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(100)
        .global_limit(2)
        .key_weight(|&key| if key == 0 { 3 } else { 1 })
        .build()
        .unwrap();
    let global = kb.global().unwrap();
    let mut rand = xorshift(0xd1b5_4a32_d192_ed03);
    let mut line: Vec<(Waker, Acquiring<'_>)> = Vec::new();
    let mut running: Vec<KeyedPermit> = Vec::new();
    let mut panics = 0;
    let mut bombs = Vec::new();
    let mut from_line = 0;
    for step in 0..4_000 {
        let panicked_here = match rand(12) {
            // The line kept short: each caller holds its key's permit
            // while it waits for a global seat.
            0..=5 if line.len() < 40 => {
                let waker = if rand(8) == 0 {
                    let bomb = Arc::new(PanicsOnFirstWake::default());
                    bombs.push(bomb.clone());
                    Waker::from(bomb)
                } else {
                    Waker::noop().clone()
                };
                const KEYS: [u32; 4] = [0, 1, 2, 3];
                let mut w: Acquiring<'_> = Box::pin(kb.acquire(&KEYS[rand(4)]));
                let mut out = None;
                if panicked(|| out = Some(poll_with(w.as_mut(), &waker))) {
                    assert!(!panicked(|| drop(w)), "step {step}");
                    true
                } else {
                    match out.expect("polled") {
                        Poll::Ready(Ok(p)) => running.push(p),
                        Poll::Ready(Err(r)) => panic!("step {step}: {r}"),
                        Poll::Pending => line.push((waker, w)),
                    }
                    false
                }
            }
            0..=6 if !line.is_empty() => {
                let w = line.remove(rand(line.len() as u64));
                panicked(|| drop(w))
            }
            7 => {
                let limit = rand(4);
                panicked(|| global.set_max_concurrent_calls(limit))
            }
            _ if !running.is_empty() => {
                let p = running.swap_remove(rand(running.len() as u64));
                panicked(|| drop(p))
            }
            _ => false,
        };
        panics += usize::from(panicked_here);
        loop {
            let mut moved = false;
            let mut still = Vec::new();
            for (waker, mut w) in line.drain(..) {
                let mut out = None;
                if panicked(|| out = Some(poll_with(w.as_mut(), &waker))) {
                    panics += 1;
                    moved = true;
                    assert!(!panicked(|| drop(w)), "step {step}");
                    continue;
                }
                match out.expect("polled") {
                    Poll::Pending => still.push((waker, w)),
                    Poll::Ready(Ok(p)) => {
                        moved = true;
                        from_line += 1;
                        running.push(p);
                    }
                    Poll::Ready(Err(r)) => panic!("step {step}: {r}"),
                }
            }
            line = still;
            if !moved {
                break;
            }
        }
        let m = kb.global_metrics().unwrap();
        assert_eq!(m.in_flight(), running.len(), "step {step}: in flight");
        assert_eq!(m.queued(), line.len(), "step {step}: queued");
        let waiting: usize = kb.snapshot().iter().map(|k| k.waiting_for_global()).sum();
        assert_eq!(waiting, line.len(), "step {step}: the keys' waiting");
        assert!(
            line.is_empty() || running.len() >= m.max_concurrent_calls(),
            "step {step}: a global seat idles while {} wait",
            line.len()
        );
    }
    let fired = bombs.iter().filter(|b| b.wakes() > 0).count();
    assert!(
        fired > 10,
        "only {fired} wakers that panic were woken ({panics} panics seen)"
    );
    assert!(from_line > 500, "only {from_line} grants from the line");
    drop(line);
    drop(running);
    global.set_max_concurrent_calls(2);
    let m = kb.global_metrics().unwrap();
    assert_eq!((m.in_flight(), m.queued()), (0, 0));
    drop(kb.try_acquire(&9).unwrap());
}

// ---------------------------------------------------------------------------
// Adaptive LIFO and limit changes
// ---------------------------------------------------------------------------

/// While the line stands, the seats a raised limit frees go to the newest
/// waiters first, as a freed permit does ("a freed permit goes to the
/// newest waiter"); with the line timer, a sleep per waiter, and on a
/// classed line. Lowered again under the seats held, nobody is served
/// until enough have come back, and then the newest left is.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_raised_limit_serves_a_standing_line_newest_first() {
    let target = 100 * MS;
    for (kind, classes, max_wait) in [
        ("line timer", false, true),
        ("own sleeps", false, false),
        ("classes", true, true),
    ] {
        let mut builder = Bulkhead::builder()
            .max_concurrent_calls(1)
            // Standing at the first wait of the target or more.
            .queue_delay(target, Duration::ZERO)
            .adaptive_lifo(true);
        if max_wait {
            builder = builder.max_wait(Duration::from_secs(60));
        }
        if classes {
            builder = builder.priorities(&[1]);
        }
        let bh = builder.build().unwrap();
        let held = bh.try_acquire_with(CallOptions::new().class(0)).unwrap();
        let mut first: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
        assert!(poll_noop(first.as_mut()).is_pending(), "{kind}");
        tokio::time::advance(target + 50 * MS).await;
        let mut oldest: Waiter<'_> = Box::pin(bh.acquire_with(CallOptions::new().class(0)));
        assert!(poll_noop(oldest.as_mut()).is_pending(), "{kind}");
        drop(held);
        // Served past the target with `oldest` behind it: the line stands.
        let first = match poll_noop(first.as_mut()) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("{kind}: the first waiter is served: {other:?}"),
        };
        tokio::time::advance(MS).await;
        let mut newer: Vec<Waiter<'_>> = (0..3)
            .map(|_| Box::pin(bh.acquire_with(CallOptions::new().class(0))) as Waiter<'_>)
            .collect();
        for w in &mut newer {
            assert!(poll_noop(w.as_mut()).is_pending(), "{kind}");
            tokio::time::advance(MS).await;
        }
        // Two more seats: to the two newest.
        bh.set_max_concurrent_calls(3);
        let mut served = Vec::new();
        for (i, w) in newer.iter_mut().enumerate() {
            if let Poll::Ready(r) = poll_noop(w.as_mut()) {
                served.push((i, r.expect("served")));
            }
        }
        assert!(poll_noop(oldest.as_mut()).is_pending(), "{kind}");
        assert_eq!(
            served.iter().map(|s| s.0).collect::<Vec<_>>(),
            [1, 2],
            "{kind}"
        );
        // Lowered to 1 with 3 held: two must come back before anyone is
        // served; then the newest left (`newer[0]`), not `oldest`.
        bh.set_max_concurrent_calls(1);
        let (_, second) = served.pop().unwrap();
        drop(second);
        assert!(poll_noop(newer[0].as_mut()).is_pending(), "{kind}");
        drop(served);
        assert!(poll_noop(newer[0].as_mut()).is_pending(), "{kind}");
        drop(first);
        let last = match poll_noop(newer[0].as_mut()) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("{kind}: the newest left is served: {other:?}"),
        };
        assert!(poll_noop(oldest.as_mut()).is_pending(), "{kind}");
        drop(last);
        drop(newer);
        drop(oldest);
        assert_eq!(bh.metrics().rejected_queue_delay(), 0, "{kind}");
        assert_at_rest(&bh);
    }
}
