//! Fair shares of a `KeyedBulkhead`'s global limit (issue 14,
//! `fair_shares`, `key_weight`): while the global limit is contended, the
//! keys are served in turns by weight (deficit round robin), each key's
//! callers first come, first served. Every test here polls by hand (or on
//! tokio's paused clock) and asserts orders and counts, not timings: grants
//! in exact rounds, a quiet key served within one round of a noisy one,
//! cancellation at each point of the wait (in a key's line, on its turn,
//! just handed a seat), timeouts and closing, the gauges, panics in the
//! weight closure, in observers and in wakers.
#![cfg(not(loom))]

mod common;

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use watertight::CallOptions;

use common::poll_noop;
use watertight::keyed::{
    KeyedBulkhead, KeyedBulkheadBuilder, KeyedPermit, KeyedRejectReason, KeyedRejected,
};
use watertight::observer::{Observer, Permitted, Rejection};
use watertight::{BuildErrorKind, Bulkhead};

type Acquiring<'a> = Pin<Box<dyn Future<Output = Result<KeyedPermit, KeyedRejected>> + 'a>>;

/// Keys of limit 100 under a global limit of 1.
fn builder() -> KeyedBulkheadBuilder<String> {
    KeyedBulkhead::<String>::builder()
        .name("fair")
        .max_concurrent_calls(100)
        .global_limit(1)
}

fn weights(key: &String) -> u32 {
    // `&String`: the closure `key_weight` takes is `Fn(&K)`.
    #![allow(clippy::ptr_arg)]
    match key.as_str() {
        "heavy" => 3,
        "zero" => 0,
        _ => 1,
    }
}

/// Callers of `keys`, in this order, each polled once: all wait for the
/// global seat.
fn waiters<'a>(
    kb: &'a KeyedBulkhead<String>,
    keys: &[&'static str],
) -> Vec<(&'static str, Acquiring<'a>)> {
    keys.iter()
        .map(|&key| {
            let mut fut: Acquiring<'a> = Box::pin(kb.acquire(key));
            assert!(
                poll_noop(fut.as_mut()).is_pending(),
                "{key} was admitted at once"
            );
            (key, fut)
        })
        .collect()
}

/// Serves every waiter, one global seat at a time (each permit dropped as
/// soon as it is granted); returns the keys in the order they were
/// granted. Each pass polls every waiter left, in arrival order: exactly
/// one is granted per pass.
fn serve(mut waiting: Vec<(&'static str, Acquiring<'_>)>) -> Vec<&'static str> {
    let mut order = Vec::new();
    while !waiting.is_empty() {
        let mut granted = Vec::new();
        for (i, (key, fut)) in waiting.iter_mut().enumerate() {
            if let Poll::Ready(out) = poll_noop(fut.as_mut()) {
                granted.push((i, *key, out.expect("granted")));
            }
        }
        assert_eq!(granted.len(), 1, "one seat, one grant per pass");
        let (i, key, permit) = granted.pop().unwrap();
        drop(waiting.remove(i));
        order.push(key);
        drop(permit);
    }
    order
}

/// [`serve`] for `n` grants only; returns them and the callers left.
fn serve_n<'a>(
    mut waiting: Vec<(&'static str, Acquiring<'a>)>,
    n: usize,
) -> (Vec<&'static str>, Vec<(&'static str, Acquiring<'a>)>) {
    let mut order = Vec::new();
    while order.len() < n {
        let i = waiting
            .iter_mut()
            .position(|(_, fut)| poll_noop(fut.as_mut()).is_ready())
            .expect("someone is granted");
        // Polled to completion above: the permit was dropped with it.
        order.push(waiting.remove(i).0);
    }
    (order, waiting)
}

fn repeat(round: &[&'static str], times: usize) -> Vec<&'static str> {
    round
        .iter()
        .copied()
        .cycle()
        .take(round.len() * times)
        .collect()
}

#[test]
fn backlogged_keys_get_their_weighted_share_in_every_round() {
    let kb = builder().key_weight(weights).build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    // The heavy key (weight 3) came first, with all its callers.
    let mut keys = vec!["first"];
    keys.extend(["heavy"; 9]);
    keys.extend(["light"; 3]);
    let waiting = waiters(&kb, &keys);
    drop(hold);
    let order = serve(waiting);
    // The first caller had its turn as it came (nobody else waited);
    // then every round gives 3 seats to heavy, 1 to light.
    assert_eq!(order[0], "first");
    assert_eq!(order[1..], repeat(&["heavy", "heavy", "heavy", "light"], 3));
    let global = kb.global_metrics().unwrap();
    assert_eq!((global.in_flight(), global.queued()), (0, 0));
}

#[test]
fn a_noisy_key_cannot_starve_a_quiet_one() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut keys = vec!["first"];
    keys.extend(["noisy"; 20]);
    keys.push("quiet");
    let waiting = waiters(&kb, &keys);
    drop(hold);
    let order = serve(waiting);
    // The noisy key's turn (one seat), then the quiet key's, though it
    // came after all twenty of the noisy key's callers.
    let mut expected = vec!["first", "noisy", "quiet"];
    expected.extend(["noisy"; 19]);
    assert_eq!(order, expected);
}

#[test]
fn off_by_default_the_global_line_is_first_come_first_served() {
    let kb = builder().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut keys = vec!["noisy"; 5];
    keys.push("quiet");
    let waiting = waiters(&kb, &keys);
    // The global bulkhead's line is its semaphore's queue, as before.
    assert_eq!(kb.global_metrics().unwrap().queued(), 6);
    drop(hold);
    let mut expected = vec!["noisy"; 5];
    expected.push("quiet");
    assert_eq!(serve(waiting), expected);
}

#[test]
fn a_weight_of_zero_counts_as_one() {
    let kb = builder().key_weight(weights).build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "zero", "zero", "zero", "one", "one", "one"]);
    drop(hold);
    assert_eq!(serve(waiting)[1..], repeat(&["zero", "one"], 3));
}

#[test]
fn every_way_in_waits_its_keys_turn() {
    // `call`, `call_by`, `acquire_by` (and `acquire`, above) all wait in
    // their key's line: a quiet key's caller overtakes the noisy backlog.
    let kb = builder().fair_shares().build().unwrap();
    let by = std::time::Instant::now() + Duration::from_secs(600);
    let order = Arc::new(Mutex::new(Vec::new()));
    let hold = kb.try_acquire("holder").unwrap();
    let record = |key: &'static str| {
        let order = order.clone();
        async move {
            order.lock().unwrap().push(key);
            Ok::<_, ()>(())
        }
    };
    let mut futs: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
    let first = kb.call("first", record("first"));
    futs.push(Box::pin(async move { first.await.unwrap() }));
    for _ in 0..3 {
        let call = kb.call("noisy", record("noisy"));
        futs.push(Box::pin(async move { call.await.unwrap() }));
    }
    let call_by = kb.call_with("quiet", CallOptions::new().deadline(by), record("quiet"));
    futs.push(Box::pin(async move { call_by.await.unwrap() }));
    let order2 = order.clone();
    let acquire_by = kb.acquire_with("calm", CallOptions::new().deadline(by));
    futs.push(Box::pin(async move {
        let _p = acquire_by.await.unwrap();
        order2.lock().unwrap().push("calm");
    }));
    for f in &mut futs {
        assert!(poll_noop(f.as_mut()).is_pending());
    }
    drop(hold);
    while !futs.is_empty() {
        futs.retain_mut(|f| poll_noop(f.as_mut()).is_pending());
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["first", "noisy", "quiet", "calm", "noisy", "noisy"]
    );
}

#[test]
fn the_global_gauge_and_the_keys_count_every_waiter() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b"]);
    // One of them queues for the semaphore; the line is all four.
    assert_eq!(kb.global_metrics().unwrap().queued(), 4);
    assert_eq!(kb.metrics_for("a").unwrap().waiting_for_global(), 2);
    assert_eq!(kb.metrics_for("b").unwrap().waiting_for_global(), 1);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a"]);
    assert_eq!(kb.global_metrics().unwrap().queued(), 0);
    assert_eq!(kb.metrics_for("a").unwrap().waiting_for_global(), 0);
}

#[test]
fn the_global_line_bound_counts_the_callers_in_every_keys_line() {
    let kb = builder().fair_shares().global_max_queue(4).build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b"]);
    let mut fifth = Box::pin(kb.acquire("c"));
    match poll_noop(fifth.as_mut()) {
        Poll::Ready(Err(r)) => assert_eq!(r.reason(), KeyedRejectReason::GlobalFull),
        other => panic!("{other:?}"),
    }
    assert_eq!(kb.metrics_for("c").unwrap().rejected_by_global(), 1);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a"]);
}

#[test]
fn newcomers_do_not_take_a_seat_from_the_callers_waiting() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a", "c"]);
    drop(hold);
    // The first caller is admitted, and its turn passes to a, which has
    // not queued for the seat yet when the first caller's permit is
    // dropped: the seat is free, but it is a's. `try_acquire` is turned
    // away, and a call that may wait joins its key's line, behind the
    // keys ahead of it in the rotation.
    let (_, mut first) = waiting.remove(0);
    match poll_noop(first.as_mut()) {
        Poll::Ready(Ok(permit)) => drop(permit),
        other => panic!("{other:?}"),
    }
    let r = kb.try_acquire("b").unwrap_err();
    assert_eq!(r.reason(), KeyedRejectReason::GlobalFull);
    waiting.extend(waiters(&kb, &["b"]));
    // b joined the rotation before a's turn came round again.
    assert_eq!(serve(waiting), ["a", "c", "b", "a"]);
    // Nobody waits: a free seat is taken at once again, and a call that
    // finds one runs on its first poll.
    drop(kb.try_acquire("b").unwrap());
    let mut call = Box::pin(kb.call("c", async { Ok::<_, ()>(1) }));
    assert_eq!(poll_noop(call.as_mut()), Poll::Ready(Ok(1)));
    assert_at_rest(&kb);
}

// Cancellation at every point of the wait.

#[test]
fn a_caller_that_leaves_its_keys_line_is_skipped() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a", "a", "b", "b", "c"]);
    // The second of a's (waiting in its line) and c's only caller leave.
    drop(waiting.remove(6));
    drop(waiting.remove(2));
    assert_eq!(kb.global_metrics().unwrap().queued(), 5);
    assert_eq!(kb.metrics_for("c").unwrap().waiting_for_global(), 0);
    assert_eq!(kb.metrics_for("a").unwrap().waiting_for_global(), 2);
    assert_eq!(kb.metrics_for("a").unwrap().bulkhead().in_flight(), 2);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a", "b"]);
    assert_at_rest(&kb);
}

#[test]
fn a_seat_handed_to_a_caller_that_is_gone_goes_to_the_next_turn() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a", "b"]);
    // The first caller is on its turn, queued for the seat: the release
    // hands it the seat; then it is dropped without seeing it.
    drop(hold);
    let (_, first) = waiting.remove(0);
    drop(first);
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 0);
    // The seat and the turn went on, in the rotation's order.
    assert_eq!(serve(waiting), ["a", "b", "a"]);
    assert_at_rest(&kb);
}

#[test]
fn a_caller_given_its_turn_and_dropped_before_it_queued_passes_it_on() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a", "b"]);
    drop(hold);
    // The first caller takes the seat; its turn passes to a (given, but a
    // has not been polled since, so it has not queued for the seat).
    let (_, mut first) = waiting.remove(0);
    let permit = match poll_noop(first.as_mut()) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    drop(waiting.remove(0));
    drop(permit);
    // a's turn is spent: b's comes, then a's again.
    assert_eq!(serve(waiting), ["b", "a"]);
    assert_at_rest(&kb);
}

#[test]
fn a_caller_dropped_while_it_waits_for_its_key_is_not_in_the_rotation() {
    let kb = KeyedBulkhead::<String>::builder()
        .name("fair")
        .max_concurrent_calls(2)
        .global_limit(1)
        .fair_shares()
        .build()
        .unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b"]);
    // a's third caller waits for one of a's own permits, then leaves.
    let mut third = Box::pin(kb.acquire("a"));
    assert!(poll_noop(third.as_mut()).is_pending());
    drop(third);
    assert_eq!(kb.metrics_for("a").unwrap().queued(), 2);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a"]);
    assert_at_rest(&kb);
}

#[test]
fn a_call_dropped_while_it_runs_gives_its_seat_to_the_next_turn() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut running = Box::pin(kb.call("a", std::future::pending::<Result<(), ()>>()));
    assert!(poll_noop(running.as_mut()).is_pending());
    let waiting = waiters(&kb, &["b", "b", "c"]);
    drop(hold);
    // a's turn came first: it has the seat and runs.
    assert!(poll_noop(running.as_mut()).is_pending());
    assert_eq!(kb.metrics_for("a").unwrap().admitted(), 1);
    drop(running);
    assert_eq!(serve(waiting), ["b", "c", "b"]);
    assert_at_rest(&kb);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_budget_covers_the_wait_in_the_keys_line() {
    let kb = builder()
        .fair_shares()
        .max_wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    // a is on its turn, b waits in its line; both from t = 0.
    let mut waiting = waiters(&kb, &["a", "b"]);
    tokio::time::advance(Duration::from_millis(60)).await;
    let late = waiters(&kb, &["c", "c", "d"]);
    tokio::time::advance(Duration::from_millis(50)).await;
    // a (on its turn) and b (in its line) ran out of the budget.
    for (key, fut) in &mut waiting {
        match poll_noop(fut.as_mut()) {
            Poll::Ready(Err(r)) => assert_eq!(r.reason(), KeyedRejectReason::GlobalTimeout),
            other => panic!("{key}: {other:?}"),
        }
        let m = kb.metrics_for(*key).unwrap();
        assert_eq!(
            (
                m.rejected_by_global(),
                m.waiting_for_global(),
                m.in_flight()
            ),
            (1, 0, 0)
        );
    }
    drop(waiting);
    // c has its turn and the seat, then d (its turn), then c.
    drop(hold);
    assert_eq!(serve(late), ["c", "d", "c"]);
    assert_at_rest(&kb);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_deadline_ends_the_wait_in_the_keys_line() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a"]);
    // b must be done in 50 ms; no hold time is known yet, so it may wait
    // until then, in its key's line.
    let by = (tokio::time::Instant::now() + Duration::from_millis(50)).into_std();
    let mut b: Acquiring<'_> = Box::pin(kb.acquire_with("b", CallOptions::new().deadline(by)));
    assert!(poll_noop(b.as_mut()).is_pending());
    waiting.extend(waiters(&kb, &["c"]));
    tokio::time::advance(Duration::from_millis(60)).await;
    match poll_noop(b.as_mut()) {
        Poll::Ready(Err(r)) => assert_eq!(r.reason(), KeyedRejectReason::GlobalWontMakeDeadline),
        other => panic!("{other:?}"),
    }
    drop(b);
    let m = kb.metrics_for("b").unwrap();
    assert_eq!(
        (m.rejected_deadline(), m.waiting_for_global(), m.in_flight()),
        (1, 0, 0)
    );
    assert_eq!(kb.global_metrics().unwrap().rejected_deadline(), 1);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "c", "a"]);
    assert_at_rest(&kb);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_line_is_cut_as_the_turns_pass_down_it() {
    let kb = builder()
        .fair_shares()
        .max_wait(Duration::from_secs(10))
        .queue_delay(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let mut held = Some(kb.try_acquire("holder").unwrap());
    let mut keys = vec!["first"];
    keys.extend(["a"; 10]);
    keys.extend(["b"; 10]);
    // Each caller polled only when its waker was woken, as an executor
    // does.
    let mut waiting: Vec<_> = keys
        .iter()
        .map(|&key| {
            let waker = common::Counted::new();
            let mut fut: Acquiring<'_> = Box::pin(kb.acquire(key));
            waker.assert_pending(fut.as_mut());
            (key, fut, waker, 0)
        })
        .collect();
    let (mut admitted, mut cut) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        if waiting.is_empty() {
            break;
        }
        // A seat held 20 ms: every wait stands past the 10 ms target.
        tokio::time::advance(Duration::from_millis(20)).await;
        drop(held.take());
        loop {
            let mut polled = false;
            waiting.retain_mut(|(key, fut, waker, seen)| {
                if waker.wakes() == *seen {
                    return true;
                }
                *seen = waker.wakes();
                polled = true;
                match waker.poll(fut.as_mut()) {
                    Poll::Pending => true,
                    Poll::Ready(Ok(permit)) => {
                        admitted.push(*key);
                        assert!(held.replace(permit).is_none(), "two seats at once");
                        false
                    }
                    Poll::Ready(Err(r)) => {
                        assert_eq!(r.reason(), KeyedRejectReason::GlobalQueueDelay);
                        cut.push(*key);
                        false
                    }
                }
            });
            if !polled {
                break;
            }
        }
    }
    assert!(
        waiting.is_empty(),
        "callers left waiting: {}",
        waiting.len()
    );
    drop(held);
    // Served by turns before the line was found standing, then cut.
    assert!(admitted.len() >= 3, "{admitted:?}");
    assert_eq!(admitted[..3], ["first", "a", "b"]);
    assert!(!cut.is_empty(), "nobody was cut: {admitted:?}");
    // Cut as their turns came: key by key, in the rotation's order.
    assert!(cut.windows(2).all(|w| w[0] != w[1]), "{cut:?}");
    let cut_of = |k: &str| cut.iter().filter(|c| **c == k).count() as u64;
    assert_eq!(
        kb.metrics_for("a").unwrap().rejected_queue_delay(),
        cut_of("a")
    );
    assert_eq!(
        kb.metrics_for("b").unwrap().rejected_queue_delay(),
        cut_of("b")
    );
    assert_eq!(
        kb.global_metrics().unwrap().rejected_queue_delay(),
        cut.len() as u64
    );
    assert_at_rest(&kb);
}

#[test]
fn closing_rejects_every_caller_waiting_for_its_turn() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b", "b"]);
    drop(hold);
    let (served, mut waiting) = serve_n(waiting, 3);
    assert_eq!(served, ["first", "a", "b"]);
    // One caller of a and one of b are left, one of them on its turn.
    kb.close();
    for (key, fut) in &mut waiting {
        match poll_noop(fut.as_mut()) {
            Poll::Ready(Err(r)) => assert_eq!(r.reason(), KeyedRejectReason::Closed),
            other => panic!("{key}: {other:?}"),
        }
    }
    drop(waiting);
    assert_at_rest(&kb);
}

#[test]
fn a_raised_global_limit_serves_several_turns_at_once() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["first", "a", "a", "b", "c"]);
    kb.global().unwrap().set_max_concurrent_calls(4);
    // The caller on its turn takes a new seat; as its turn passes, the
    // two seats still free give turns to three callers (one to wait for
    // the next seat), by the rotation: a, b, then c.
    let mut served = Vec::new();
    let mut permits = Vec::new();
    waiting.retain_mut(|(key, fut)| match poll_noop(fut.as_mut()) {
        Poll::Ready(out) => {
            served.push(*key);
            permits.push(out.unwrap());
            false
        }
        Poll::Pending => true,
    });
    assert_eq!(served, ["first", "a", "b"]);
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 4);
    drop(hold);
    assert_eq!(serve(waiting), ["c", "a"]);
    drop(permits);
    assert_at_rest(&kb);
}

// Panics in user code.

#[test]
fn a_weight_closure_that_panics_tracks_nothing() {
    let kb = builder()
        .key_weight(|key: &String| {
            assert!(key != "bad", "no weight for bad");
            1
        })
        .build()
        .unwrap();
    let panicked = catch_unwind(AssertUnwindSafe(|| kb.try_acquire("bad")));
    assert!(panicked.is_err());
    assert!(kb.metrics_for("bad").is_none());
    assert_eq!(kb.keys_tracked(), 0);
    // Everything else works, fairly.
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b"]);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a"]);
    assert_at_rest(&kb);
}

/// Panics once, when armed, as the global bulkhead admits or rejects.
#[derive(Default)]
struct PanicsOnce {
    permitted: AtomicBool,
    rejected: AtomicBool,
}

impl Observer for PanicsOnce {
    fn on_permitted(&self, e: &Permitted<'_>) {
        if e.name == "fair.global" && self.permitted.swap(false, Ordering::SeqCst) {
            panic!("on_permitted panics");
        }
    }
    fn on_rejected(&self, e: &Rejection<'_>) {
        if e.name == "fair.global" && self.rejected.swap(false, Ordering::SeqCst) {
            panic!("on_rejected panics");
        }
    }
}

#[test]
fn an_observer_that_panics_as_a_waiter_is_admitted_strands_nobody() {
    let observer = Arc::new(PanicsOnce::default());
    let kb = builder()
        .fair_shares()
        .observer(observer.clone())
        .build()
        .unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["a", "b", "c"]);
    drop(hold);
    observer.permitted.store(true, Ordering::SeqCst);
    let (_, mut a) = waiting.remove(0);
    let polled = catch_unwind(AssertUnwindSafe(|| poll_noop(a.as_mut())));
    assert!(polled.is_err(), "the observer's panic reaches the caller");
    drop(a);
    // a's seat went back; b's turn came as a's wait ended.
    assert_eq!(kb.metrics_for("a").unwrap().in_flight(), 0);
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 0);
    assert_eq!(serve(waiting), ["b", "c"]);
    assert_at_rest(&kb);
}

#[test]
fn an_observer_that_panics_on_a_rejection_in_the_line_strands_nobody() {
    let observer = Arc::new(PanicsOnce::default());
    let kb = builder()
        .fair_shares()
        .global_max_queue(4)
        .observer(observer.clone())
        .build()
        .unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let waiting = waiters(&kb, &["first", "a", "a", "b"]);
    observer.rejected.store(true, Ordering::SeqCst);
    let mut c = Box::pin(kb.acquire("c"));
    let polled = catch_unwind(AssertUnwindSafe(|| poll_noop(c.as_mut())));
    assert!(polled.is_err(), "the observer's panic reaches the caller");
    drop(c);
    let m = kb.metrics_for("c").unwrap();
    assert_eq!(
        (
            m.rejected_by_global(),
            m.in_flight(),
            m.waiting_for_global()
        ),
        (1, 0, 0)
    );
    assert_eq!(kb.global_metrics().unwrap().queued(), 4);
    drop(hold);
    assert_eq!(serve(waiting), ["first", "a", "b", "a"]);
    assert_at_rest(&kb);
}

/// A waker whose `wake` panics.
struct PanickingWaker(AtomicUsize);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("the waker panics");
    }
}

#[test]
fn a_waker_that_panics_as_its_turn_comes_holds_up_nobody() {
    let kb = builder().fair_shares().build().unwrap();
    let hold = kb.try_acquire("holder").unwrap();
    let mut waiting = waiters(&kb, &["a"]);
    let bad = Arc::new(PanickingWaker(AtomicUsize::new(0)));
    let bad_waker = Waker::from(bad.clone());
    let mut b: Acquiring<'_> = Box::pin(kb.acquire("b"));
    assert!(
        b.as_mut()
            .poll(&mut Context::from_waker(&bad_waker))
            .is_pending()
    );
    waiting.extend(waiters(&kb, &["c"]));
    drop(hold);
    // a is admitted; its turn passes to b, whose waker panics: the panic
    // does not reach a (its seat is safe), and c gets a turn as well.
    let (_, mut a) = waiting.remove(0);
    let pa = match poll_noop(a.as_mut()) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(bad.0.load(Ordering::SeqCst), 1);
    drop(pa);
    assert_eq!(serve(waiting), ["c"]);
    // b is still on its turn, whenever it is polled.
    match poll_noop(b.as_mut()) {
        Poll::Ready(Ok(p)) => drop(p),
        other => panic!("{other:?}"),
    }
    assert_at_rest(&kb);
}

// Configuration.

#[test]
fn fair_shares_need_a_global_limit_of_their_own() {
    let err = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(2)
        .fair_shares()
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::FairSharesWithoutGlobalLimit);
    let shared = Bulkhead::builder().max_concurrent_calls(4).build().unwrap();
    let err = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(2)
        .global(shared)
        .key_weight(|_| 2)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::FairSharesWithoutGlobalLimit);
    assert_eq!(
        err.to_string(),
        "fair_shares needs a global_limit (not a shared global bulkhead)"
    );
}

/// Nothing held, nobody waiting, anywhere.
#[track_caller]
fn assert_at_rest(kb: &KeyedBulkhead<String>) {
    let global = kb.global_metrics().unwrap();
    assert_eq!((global.in_flight(), global.queued()), (0, 0), "global");
    for m in kb.snapshot() {
        assert_eq!(
            (m.in_flight(), m.queued(), m.waiting_for_global()),
            (0, 0, 0),
            "{}",
            m.key()
        );
    }
    // And the rotation is empty: a free seat is taken at once.
    if !kb.is_closed() {
        drop(kb.try_acquire("at-rest").unwrap());
    }
}
