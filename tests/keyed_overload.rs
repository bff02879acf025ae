//! The overload options of `KeyedBulkhead` (issue 14): controlled delay on
//! each key's line and on the global line (`queue_delay`), and
//! deadline-aware admission at both stages (`call_by`, `acquire_by`), with
//! their typed reasons, per-key and global counts, observer events,
//! cancellation at every await point and observers that panic. Standing
//! lines run on tokio's paused clock; deadline tests hold permits for
//! known times on the real clock (the hold-time average behind the
//! estimate is measured on it) and assert with margins a loaded machine
//! keeps.
#![cfg(not(loom))]

use std::future::{Future, pending};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};
use watertight::CallOptions;

use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedRejectReason, KeyedRejected};
use watertight::observer::{Observer, Rejection};
use watertight::{BuildErrorKind, RejectReason};

const MS: Duration = Duration::from_millis(1);

fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

fn block_on<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn rejected<T: std::fmt::Debug>(out: Result<T, KeyedError<()>>) -> KeyedRejected {
    match out {
        Err(KeyedError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Every rejection the bulkheads report, by bulkhead name, with the time
/// on tokio's clock (inside a runtime) of the first controlled-delay cut.
#[derive(Default)]
struct Seen {
    rejections: Mutex<Vec<(String, RejectReason)>>,
    first_cut: Mutex<Option<tokio::time::Instant>>,
}

impl Observer for Seen {
    fn on_rejected(&self, e: &Rejection<'_>) {
        self.rejections
            .lock()
            .unwrap()
            .push((e.name.to_owned(), e.reason));
        if e.reason == RejectReason::QueueDelay && tokio::runtime::Handle::try_current().is_ok() {
            self.first_cut
                .lock()
                .unwrap()
                .get_or_insert_with(tokio::time::Instant::now);
        }
    }
}

impl Seen {
    fn count(&self, name: &str, reason: RejectReason) -> usize {
        let seen = self.rejections.lock().unwrap();
        seen.iter()
            .filter(|(n, r)| n == name && *r == reason)
            .count()
    }
}

/// The gauges of a keyed bulkhead at rest: nothing in flight, nobody
/// waiting, for every key and globally, and every key evictable (no user
/// count left behind).
fn assert_at_rest<K>(kb: &KeyedBulkhead<K>, what: &str)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    for m in kb.snapshot() {
        assert_eq!(
            (m.in_flight(), m.queued(), m.waiting_for_global()),
            (0, 0, 0),
            "{what}: key {:?}",
            m.key()
        );
        assert_eq!(m.bulkhead().in_flight(), 0, "{what}: key {:?}", m.key());
    }
    if let Some(g) = kb.global_metrics() {
        assert_eq!((g.in_flight(), g.queued()), (0, 0), "{what}: global");
    }
    let tracked = kb.keys_tracked();
    assert_eq!(kb.evict_idle(), tracked, "{what}: a key still has a user");
}

// ---------------------------------------------------------------------------
// Controlled delay
// ---------------------------------------------------------------------------

#[cfg(feature = "tokio")]
#[derive(Debug)]
struct Arrival {
    key: u32,
    arrived: tokio::time::Instant,
    admitted: Option<tokio::time::Instant>,
    rejected: Option<KeyedRejectReason>,
}

#[cfg(feature = "tokio")]
/// Spawns a call for `key` that holds its permits `hold`, and reports
/// when it arrived and how it ended.
fn arrive(kb: &KeyedBulkhead<u32>, key: u32, hold: Duration) -> tokio::task::JoinHandle<Arrival> {
    let kb = kb.clone();
    tokio::spawn(async move {
        let arrived = tokio::time::Instant::now();
        let out = kb
            .call(&key, async {
                let admitted = tokio::time::Instant::now();
                tokio::time::sleep(hold).await;
                Ok::<_, ()>(admitted)
            })
            .await;
        Arrival {
            key,
            arrived,
            admitted: out.as_ref().ok().copied(),
            rejected: out
                .err()
                .map(|e| e.rejected().expect("a rejection").reason()),
        }
    })
}

#[cfg(feature = "tokio")]
/// After the first cut (and a hold, for the grant made at the cut),
/// nobody was admitted having waited more than the target.
fn assert_cut_to_target(calls: &[&Arrival], first_cut: tokio::time::Instant, hold: Duration) {
    let target = 20 * MS;
    let waited = |c: &Arrival| c.admitted.map(|at| at - c.arrived);
    let longest_before = calls
        .iter()
        .filter(|c| c.admitted.is_some_and(|at| at < first_cut))
        .filter_map(|c| waited(c))
        .max()
        .unwrap();
    assert!(longest_before >= 3 * target, "{longest_before:?}");
    for c in calls
        .iter()
        .filter(|c| c.admitted.is_some_and(|at| at >= first_cut + hold / 2))
    {
        let w = waited(c).unwrap();
        assert!(w <= target + 2 * MS, "admitted after waiting {w:?}");
    }
}

#[cfg(feature = "tokio")]
fn delayed(limit: usize, seen: &Arc<Seen>) -> watertight::keyed::KeyedBulkheadBuilder<u32> {
    KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(limit)
        .max_wait(Duration::from_secs(5))
        .queue_delay(20 * MS, 100 * MS)
        .key_label(|k: &u32| k.to_string())
        .observer(seen.clone())
}

/// Key 1 gets five times what its one permit serves, for 600 ms: its line
/// stands, is found standing, and is cut to the 20 ms target. Key 2's line
/// meanwhile holds waiters far past the target (its permit held 50 ms),
/// but has not stood for an interval: all of them are served. With one
/// controlled-delay state for every key, key 2's waiters would be cut.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_line_of_one_key_is_cut_to_the_target_and_other_keys_are_left_alone() {
    let seen = Arc::new(Seen::default());
    let kb = delayed(1, &seen).build().unwrap();
    let hold = 10 * MS;
    let start = tokio::time::Instant::now();
    let mut calls = Vec::new();
    let mut quiet = Vec::new();
    let mut quiet_held = None;
    while start.elapsed() < 600 * MS {
        calls.push(arrive(&kb, 1, hold));
        let t = start.elapsed();
        if t >= 300 * MS && quiet_held.is_none() && quiet.is_empty() {
            // Key 2, mid-way through key 1's standing line: its permit
            // held for 50 ms, three callers waiting behind it.
            quiet_held = Some(kb.try_acquire(&2).unwrap());
            quiet = (0..3).map(|_| arrive(&kb, 2, MS)).collect();
        }
        if t >= 350 * MS {
            quiet_held = None;
        }
        tokio::time::sleep(2 * MS).await;
    }
    let mut noisy = Vec::new();
    for call in calls {
        noisy.push(call.await.unwrap());
    }
    for call in quiet {
        let c = call.await.unwrap();
        assert_eq!(c.rejected, None, "key 2 was cut: {c:?}");
        let waited = c.admitted.unwrap() - c.arrived;
        assert!(waited >= 40 * MS, "key 2 waited {waited:?}");
    }
    let first_cut = seen.first_cut.lock().unwrap().expect("key 1 was never cut");
    assert_cut_to_target(&noisy.iter().collect::<Vec<_>>(), first_cut, hold);
    let cut = noisy
        .iter()
        .filter(|c| c.rejected == Some(KeyedRejectReason::KeyQueueDelay))
        .count();
    assert!(cut > noisy.len() / 2, "{cut} of {} cut", noisy.len());
    assert!(
        noisy
            .iter()
            .all(|c| c.rejected.is_none() || c.rejected == Some(KeyedRejectReason::KeyQueueDelay)),
        "{noisy:?}"
    );
    let m1 = kb.metrics_for(&1).unwrap();
    assert_eq!(m1.rejected_queue_delay(), cut as u64);
    assert_eq!(m1.bulkhead().rejected_queue_delay(), cut as u64);
    assert_eq!(m1.rejected_by_key(), cut as u64);
    assert_eq!(seen.count("t[1]", RejectReason::QueueDelay), cut);
    let m2 = kb.metrics_for(&2).unwrap();
    assert_eq!((m2.rejected(), m2.admitted()), (0, 4));
    assert_eq!(seen.count("t[2]", RejectReason::QueueDelay), 0);
    assert_at_rest(&kb, "after the run");
}

/// Every caller of a different key, so that all of them wait in the global
/// line (one permit): it stands, and is cut to the target, with
/// `GlobalQueueDelay`, counted for the global bulkhead, for each key and
/// in the keyed bulkhead's stats; every cut caller's key permit is back.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_standing_global_line_is_cut_to_the_target() {
    let seen = Arc::new(Seen::default());
    let kb = delayed(1, &seen).global_limit(1).build().unwrap();
    let hold = 10 * MS;
    let start = tokio::time::Instant::now();
    let mut calls = Vec::new();
    let mut key = 0;
    while start.elapsed() < 600 * MS {
        key += 1;
        calls.push(arrive(&kb, key, hold));
        tokio::time::sleep(2 * MS).await;
    }
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    let first_cut = seen.first_cut.lock().unwrap().expect("never cut");
    assert_cut_to_target(&out.iter().collect::<Vec<_>>(), first_cut, hold);
    let cut: Vec<_> = out
        .iter()
        .filter(|c| c.rejected == Some(KeyedRejectReason::GlobalQueueDelay))
        .collect();
    assert!(
        cut.len() > out.len() / 2,
        "{} of {} cut",
        cut.len(),
        out.len()
    );
    assert!(
        out.iter().all(
            |c| c.rejected.is_none() || c.rejected == Some(KeyedRejectReason::GlobalQueueDelay)
        ),
        "{out:?}"
    );
    let global = kb.global_metrics().unwrap();
    assert_eq!(global.rejected_queue_delay(), cut.len() as u64);
    assert_eq!(kb.stats().rejected_by_global(), cut.len() as u64);
    assert_eq!(seen.count("t.global", RejectReason::QueueDelay), cut.len());
    for c in &cut {
        let m = kb.metrics_for(&c.key).unwrap();
        assert_eq!(
            (
                m.rejected_queue_delay(),
                m.rejected_by_global(),
                m.rejected_by_key()
            ),
            (1, 1, 0),
            "key {}",
            c.key
        );
    }
    assert_at_rest(&kb, "after the run");
}

#[test]
fn a_zero_target_is_refused_and_the_reasons_have_labels() {
    let err = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(1)
        .queue_delay(Duration::ZERO, 100 * MS)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::ZeroQueueDelayTarget);
    let builder = KeyedBulkhead::<u32>::builder().queue_delay(5 * MS, 100 * MS);
    assert!(format!("{builder:?}").contains("queue_delay: Some((5ms, 100ms))"));
    let cases = [
        (
            KeyedRejectReason::KeyWontMakeDeadline,
            "key_deadline",
            false,
        ),
        (
            KeyedRejectReason::GlobalWontMakeDeadline,
            "global_deadline",
            true,
        ),
        (KeyedRejectReason::KeyQueueDelay, "key_queue_delay", false),
        (
            KeyedRejectReason::GlobalQueueDelay,
            "global_queue_delay",
            true,
        ),
    ];
    for (reason, label, global) in cases {
        assert_eq!(reason.as_str(), label);
        assert_eq!(reason.is_global(), global, "{reason}");
        assert!(!reason.is_timeout(), "{reason}");
    }
}

// ---------------------------------------------------------------------------
// Deadline-aware admission
// ---------------------------------------------------------------------------

/// A keyed bulkhead whose key 1 (limit 1) and, with `global`, global line
/// (limit 1) have a hold-time average of `hold`: one call held that long
/// (an observer is installed, so every hold is timed).
fn held_for(global: bool, hold: Duration, seen: &Arc<Seen>) -> KeyedBulkhead<u32> {
    let mut builder = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(10))
        .key_label(|k: &u32| k.to_string())
        .observer(seen.clone());
    if global {
        builder = builder.global_limit(1);
    }
    let kb = builder.build().unwrap();
    let permit = kb.try_acquire(&1).unwrap();
    thread::sleep(hold);
    drop(permit);
    kb
}

#[test]
fn a_passed_deadline_is_rejected_at_once_by_the_key_and_the_call_never_runs() {
    let seen = Arc::new(Seen::default());
    let kb = KeyedBulkhead::<u32>::builder()
        .name("t")
        .max_concurrent_calls(4)
        .global_limit(8)
        .observer(seen.clone())
        .build()
        .unwrap();
    for by in [Instant::now() - MS, Instant::now()] {
        let ran = std::cell::Cell::new(false);
        let call = pin!(kb.call_with(&1, CallOptions::new().deadline(by), async {
            ran.set(true);
            Ok::<_, ()>(())
        }));
        let r = match poll_once(call) {
            Poll::Ready(out) => rejected(out),
            Poll::Pending => panic!("a passed deadline must not wait"),
        };
        assert!(!ran.get(), "the call of a rejected deadline ran");
        assert_eq!(r.reason(), KeyedRejectReason::KeyWontMakeDeadline);
        assert_eq!(r.waited(), Duration::ZERO);
        assert_eq!(
            r.bulkhead_rejection().map(|b| b.reason()),
            Some(RejectReason::WontMakeDeadline)
        );
        assert_eq!(
            r.to_string(),
            r#"keyed bulkhead "t": the key cannot serve the call before its deadline"#
        );
    }
    let r = block_on(kb.acquire_with(&1, CallOptions::new().deadline(Instant::now() - MS)))
        .unwrap_err();
    assert_eq!(r.reason(), KeyedRejectReason::KeyWontMakeDeadline);
    let m = kb.metrics_for(&1).unwrap();
    assert_eq!(
        (m.rejected_deadline(), m.rejected_by_key(), m.admitted()),
        (3, 3, 0)
    );
    assert_eq!(seen.count("t", RejectReason::WontMakeDeadline), 3);
    // Time to spare: admitted by both stages.
    let by = Instant::now() + Duration::from_secs(5);
    assert_eq!(
        block_on(kb.call_with(&1, CallOptions::new().deadline(by), async {
            Ok::<_, ()>(7)
        })),
        Ok(7)
    );
    let permit = block_on(kb.acquire_with(&1, CallOptions::new().deadline(by))).unwrap();
    assert!(permit.has_global());
    drop(permit);
    assert_eq!(kb.metrics_for(&1).unwrap().admitted(), 2);
    assert_at_rest(&kb, "at the end");
}

#[test]
fn a_deadline_the_key_cannot_meet_is_rejected_at_once() {
    let seen = Arc::new(Seen::default());
    let kb = held_for(false, 100 * MS, &seen);
    // A free permit, but less time than one call takes.
    let out = block_on(kb.call_with(
        &1,
        CallOptions::new().deadline(Instant::now() + 50 * MS),
        async { Ok::<_, ()>(()) },
    ));
    assert_eq!(
        rejected(out).reason(),
        KeyedRejectReason::KeyWontMakeDeadline
    );
    // The permit busy: about one hold of waiting and one of work do not
    // fit in 150 ms: rejected at once, not after waiting.
    let held = kb.try_acquire(&1).unwrap();
    let started = Instant::now();
    let call = pin!(
        kb.call_with(&1, CallOptions::new().deadline(started + 150 * MS), async {
            Ok::<_, ()>(())
        })
    );
    let r = match poll_once(call) {
        Poll::Ready(out) => rejected(out),
        Poll::Pending => panic!("expected a rejection at once"),
    };
    assert_eq!(r.reason(), KeyedRejectReason::KeyWontMakeDeadline);
    assert!(r.retry_after().is_some(), "the usual hint");
    // At once: ready at the first poll (not a bound on the time taken,
    // which a descheduled thread would break).
    let r = match poll_once(pin!(
        kb.acquire_with(&1, CallOptions::new().deadline(Instant::now() + 150 * MS))
    )) {
        Poll::Ready(r) => r.unwrap_err(),
        Poll::Pending => panic!("expected acquire_by's rejection at once"),
    };
    assert_eq!(r.reason(), KeyedRejectReason::KeyWontMakeDeadline);
    // Another key has no hold time yet: admitted.
    let by = Instant::now() + 150 * MS;
    assert_eq!(
        block_on(kb.call_with(&2, CallOptions::new().deadline(by), async {
            Ok::<_, ()>(2)
        })),
        Ok(2)
    );
    drop(held);
    let m = kb.metrics_for(&1).unwrap();
    assert_eq!((m.rejected_deadline(), m.queued()), (3, 0));
    assert_eq!(m.bulkhead().rejected_deadline(), 3);
    assert_eq!(seen.count("t[1]", RejectReason::WontMakeDeadline), 3);
    assert_at_rest(&kb, "at the end");
}

/// Key 2 has room, the global line's average hold is 100 ms and its one
/// permit is held: a call of key 2 with 150 ms left is turned away by the
/// global stage at once, its key's permit given back, and counted for the
/// global bulkhead, for key 2 and in the stats.
#[test]
fn a_deadline_the_global_limit_cannot_meet_is_rejected_at_once() {
    let seen = Arc::new(Seen::default());
    let kb = held_for(true, 100 * MS, &seen);
    let held = kb.try_acquire(&1).unwrap();
    let started = Instant::now();
    let ran = std::cell::Cell::new(false);
    let call = pin!(
        kb.call_with(&2, CallOptions::new().deadline(started + 150 * MS), async {
            ran.set(true);
            Ok::<_, ()>(())
        })
    );
    let r = match poll_once(call) {
        Poll::Ready(out) => rejected(out),
        Poll::Pending => panic!("expected a rejection at once"),
    };
    assert!(!ran.get());
    assert_eq!(r.reason(), KeyedRejectReason::GlobalWontMakeDeadline);
    assert!(r.reason().is_global());
    assert_eq!(
        r.to_string(),
        r#"keyed bulkhead "t": the global limit cannot serve the call before its deadline"#
    );
    let r = match poll_once(pin!(
        kb.acquire_with(&2, CallOptions::new().deadline(Instant::now() + 150 * MS))
    )) {
        Poll::Ready(r) => r.unwrap_err(),
        Poll::Pending => panic!("expected acquire_by's rejection at once"),
    };
    assert_eq!(r.reason(), KeyedRejectReason::GlobalWontMakeDeadline);
    let m = kb.metrics_for(&2).unwrap();
    assert_eq!(
        (
            m.rejected_deadline(),
            m.rejected_by_global(),
            m.rejected_by_key()
        ),
        (2, 2, 0)
    );
    assert_eq!(
        (m.bulkhead().in_flight(), m.queued()),
        (0, 0),
        "key permit back"
    );
    assert_eq!(kb.global_metrics().unwrap().rejected_deadline(), 2);
    assert_eq!(kb.stats().rejected_by_global(), 2);
    assert_eq!(seen.count("t.global", RejectReason::WontMakeDeadline), 2);
    drop(held);
    assert_at_rest(&kb, "at the end");
}

/// Admitted with a deadline that can be met only after some waiting, a
/// call waits at most until `deadline - hold` (not the 10 s `max_wait`),
/// at the key's stage and at the global one.
#[test]
fn an_admitted_deadline_waits_at_most_until_it_could_still_finish() {
    for global in [false, true] {
        let seen = Arc::new(Seen::default());
        let kb = held_for(global, 100 * MS, &seen);
        let held = kb.try_acquire(&1).unwrap();
        // Key 1 busy (or, with a global limit, key 3 waits for the global
        // permit that key 1 holds).
        let key = if global { 3 } else { 1 };
        let started = Instant::now();
        let by = started + 500 * MS;
        let r = rejected(block_on(kb.call_with(
            &key,
            CallOptions::new().deadline(by),
            async { Ok::<_, ()>(()) },
        )));
        let waited = started.elapsed();
        let expected = match global {
            false => KeyedRejectReason::KeyWontMakeDeadline,
            true => KeyedRejectReason::GlobalWontMakeDeadline,
        };
        assert_eq!(r.reason(), expected);
        // The hold average the stage judged by (about 100 ms, more if the
        // machine overslept): the retry hint of one caller ahead.
        let hold = r.retry_after().expect("a hold time is known");
        let latest_start = (500 * MS).saturating_sub(hold);
        assert!(
            waited + 10 * MS >= latest_start && waited >= 250 * MS,
            "global {global}: after {waited:?}, hold {hold:?}"
        );
        assert!(waited < 500 * MS, "global {global}: after {waited:?}");
        assert_eq!(kb.metrics_for(&key).unwrap().rejected_deadline(), 1);
        // With time enough, the same wait ends in a permit.
        let by = Instant::now() + Duration::from_secs(5);
        let releaser = thread::spawn(move || {
            thread::sleep(50 * MS);
            drop(held);
        });
        assert_eq!(
            block_on(kb.call_with(&key, CallOptions::new().deadline(by), async {
                Ok::<_, ()>(9)
            })),
            Ok(9)
        );
        releaser.join().unwrap();
        assert_at_rest(&kb, "at the end");
    }
}

// ---------------------------------------------------------------------------
// Cancellation and panicking observers
// ---------------------------------------------------------------------------

/// Dropped at each await point: waiting for its key, waiting for a global
/// permit, and running, for `call_by` and `acquire_by`, with and without
/// controlled delay: no permit, gauge or user count is left behind, and
/// the next call is admitted.
#[test]
fn cancelling_a_deadline_call_at_each_await_point_leaves_nothing_behind() {
    for delay in [false, true] {
        let mut builder = KeyedBulkhead::<u32>::builder()
            .max_concurrent_calls(1)
            .global_limit(1)
            .max_wait(Duration::from_secs(10));
        if delay {
            builder = builder.queue_delay(MS, Duration::ZERO);
        }
        let kb = builder.build().unwrap();
        let by = || Instant::now() + Duration::from_secs(10);

        // Waiting for its key (key 1 held).
        let held = kb.try_acquire(&1).unwrap();
        {
            let mut call = pin!(kb.call_with(&1, CallOptions::new().deadline(by()), async {
                Ok::<_, ()>(())
            }));
            assert!(poll_once(call.as_mut()).is_pending());
            let mut acquire = pin!(kb.acquire_with(&1, CallOptions::new().deadline(by())));
            assert!(poll_once(acquire.as_mut()).is_pending());
            assert_eq!(kb.metrics_for(&1).unwrap().queued(), 2);
        }
        assert_eq!(kb.metrics_for(&1).unwrap().queued(), 0, "delay {delay}");

        // Waiting for the global permit (key 1 holds it).
        {
            let mut call = pin!(kb.call_with(&2, CallOptions::new().deadline(by()), async {
                Ok::<_, ()>(())
            }));
            assert!(poll_once(call.as_mut()).is_pending());
            let mut acquire = pin!(kb.acquire_with(&3, CallOptions::new().deadline(by())));
            assert!(poll_once(acquire.as_mut()).is_pending());
            let (m2, m3) = (kb.metrics_for(&2).unwrap(), kb.metrics_for(&3).unwrap());
            assert_eq!((m2.waiting_for_global(), m3.waiting_for_global()), (1, 1));
            assert_eq!(kb.global_metrics().unwrap().queued(), 2);
        }
        drop(held);
        assert_at_rest(&kb, "after cancelling waits");

        // Running.
        {
            let mut call = pin!(kb.call_with(&4, CallOptions::new().deadline(by()), async {
                pending::<()>().await;
                Ok::<_, ()>(())
            }));
            assert!(poll_once(call.as_mut()).is_pending());
            assert_eq!(kb.metrics_for(&4).unwrap().in_flight(), 1);
            assert_eq!(kb.global_metrics().unwrap().in_flight(), 1);
        }
        assert_at_rest(&kb, "after cancelling a running call");
        assert_eq!(
            block_on(kb.call_with(&5, CallOptions::new().deadline(by()), async {
                Ok::<_, ()>(5)
            })),
            Ok(5)
        );
        drop(block_on(kb.acquire_with(&5, CallOptions::new().deadline(by()))).unwrap());
        assert_at_rest(&kb, "at the end");
    }
}

/// Panics in `on_rejected`, or in `on_permitted`.
#[derive(Debug, Default)]
struct Panicky {
    on_permitted: bool,
    on_rejected: bool,
}

impl Observer for Panicky {
    fn on_permitted(&self, e: &watertight::observer::Permitted<'_>) {
        assert!(
            !self.on_permitted || e.name != "t.global",
            "on_permitted panics"
        );
    }
    fn on_rejected(&self, _: &Rejection<'_>) {
        assert!(!self.on_rejected, "on_rejected panics");
    }
}

/// An observer that panics as a deadline call is rejected (by its key, by
/// the global stage), as it is cut from a standing global line, or as the
/// global stage admits it: the panic comes out of the call, and no permit,
/// gauge or user count is left behind; the bulkheads' own counts keep
/// what happened.
#[test]
fn a_panicking_observer_leaves_no_permit_or_gauge_wrong() {
    let panics = |kb: &KeyedBulkhead<u32>, key: u32, by: Instant| {
        catch_unwind(AssertUnwindSafe(|| {
            block_on(kb.call_with(&key, CallOptions::new().deadline(by), async {
                Ok::<_, ()>(())
            }))
        }))
        .is_err()
    };
    let build = |observer: Panicky| {
        KeyedBulkhead::<u32>::builder()
            .name("t")
            .max_concurrent_calls(1)
            .global_limit(1)
            .max_wait(Duration::from_secs(10))
            // Standing at the first wait of 1 ms or more.
            .queue_delay(MS, Duration::ZERO)
            .observer(Arc::new(observer))
            .build()
            .unwrap()
    };
    let rejecting = || Panicky {
        on_rejected: true,
        ..Panicky::default()
    };

    // Rejected by its key: a passed deadline.
    let kb = build(rejecting());
    assert!(panics(&kb, 2, Instant::now() - MS), "rejected by the key");
    assert_eq!(
        kb.metrics_for(&2).unwrap().bulkhead().rejected_deadline(),
        1
    );
    assert_at_rest(&kb, "after a key's rejection that panicked");

    // Rejected by the global stage: its average hold is 50 ms and key 1
    // holds its permit; key 3 has no hold time yet, so its own stage
    // admits a call with 60 ms left, and the global stage does not.
    let kb = build(rejecting());
    let permit = kb.try_acquire(&1).unwrap();
    thread::sleep(50 * MS);
    drop(permit);
    let held = kb.try_acquire(&1).unwrap();
    assert!(
        panics(&kb, 3, Instant::now() + 60 * MS),
        "rejected globally"
    );
    assert_eq!(kb.global_metrics().unwrap().rejected_deadline(), 1);
    let m3 = kb.metrics_for(&3).unwrap();
    assert_eq!((m3.bulkhead().in_flight(), m3.waiting_for_global()), (0, 0));
    drop(held);
    assert_at_rest(&kb, "after a global rejection that panicked");

    // Cut from the global line: keys 4 and 5 wait for the global permit
    // (key 1 holds it) past the target; 4's grant finds the line standing,
    // and 5, polled, is cut, and its observer panics.
    let kb = build(rejecting());
    let held = kb.try_acquire(&1).unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    let mut first = Box::pin(kb.call_with(&4, CallOptions::new().deadline(by), async {
        Ok::<_, ()>(4)
    }));
    let mut second = Box::pin(kb.call_with(&5, CallOptions::new().deadline(by), async {
        Ok::<_, ()>(5)
    }));
    assert!(poll_once(first.as_mut()).is_pending());
    assert!(poll_once(second.as_mut()).is_pending());
    thread::sleep(5 * MS);
    drop(held);
    assert_eq!(block_on(first.as_mut()), Ok(4));
    let cut = catch_unwind(AssertUnwindSafe(|| poll_once(second.as_mut())));
    assert!(cut.is_err(), "the cut's observer panicked");
    drop(second);
    assert_eq!(kb.global_metrics().unwrap().rejected_queue_delay(), 1);
    assert_at_rest(&kb, "after a cut that panicked");

    // Admitted by the global stage, whose observer panics there.
    let kb = build(Panicky {
        on_permitted: true,
        ..Panicky::default()
    });
    assert!(panics(&kb, 6, Instant::now() + Duration::from_secs(5)));
    let g = kb.global_metrics().unwrap();
    assert_eq!((g.permitted(), g.in_flight()), (1, 0));
    assert_at_rest(&kb, "after an admission that panicked");
    // The same after waiting for the global permit (its limit 0 meanwhile).
    let blocker = kb.global().unwrap().clone();
    blocker.set_max_concurrent_calls(0);
    let mut waiter = Box::pin(kb.call_with(
        &7,
        CallOptions::new().deadline(Instant::now() + Duration::from_secs(5)),
        async { Ok::<_, ()>(7) },
    ));
    assert!(poll_once(waiter.as_mut()).is_pending());
    assert_eq!(kb.metrics_for(&7).unwrap().waiting_for_global(), 1);
    blocker.set_max_concurrent_calls(1);
    let admitted = catch_unwind(AssertUnwindSafe(|| poll_once(waiter.as_mut())));
    assert!(admitted.is_err(), "the waiter's admission panicked");
    drop(waiter);
    assert_at_rest(&kb, "after a waiting admission that panicked");
}

/// Adaptive LIFO on the keyed bulkhead: while one key's line stands, that
/// key's permits go to its newest waiter; another key's line, which does
/// not stand, stays first come, first served; and `adaptive_lifo` needs
/// `queue_delay`. On tokio's paused clock.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn adaptive_lifo_serves_only_a_standing_keys_line_newest_first() {
    use tokio::time::sleep;
    let err = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .adaptive_lifo(true)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::AdaptiveLifoWithoutQueueDelay);

    let tenants = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .queue_delay(10 * MS, 100 * MS)
        .adaptive_lifo(true)
        .build()
        .unwrap();
    let served: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let spawn_waiter = |key: &'static str, name: &'static str, at: u32, hold: u32| {
        let (tenants, served) = (tenants.clone(), served.clone());
        tokio::spawn(async move {
            sleep(at * MS).await;
            let permit = tenants.acquire(key).await.map_err(|r| r.reason())?;
            served.lock().unwrap().push(name);
            sleep(hold * MS).await;
            drop(permit);
            Ok::<_, KeyedRejectReason>(())
        })
    };
    let a_seat = tenants.try_acquire("a").unwrap();
    let b_seat = tenants.try_acquire("b").unwrap();
    let tasks = [
        // Key a: served at 20 ms after 20, the first long wait.
        spawn_waiter("a", "a1", 0, 105),
        // Served at 125 ms after 115: a's line has stood an interval.
        spawn_waiter("a", "a2", 10, 1),
        // Under the target then: not cut, and served newest first.
        spawn_waiter("a", "a-old", 120, 1),
        spawn_waiter("a", "a-mid", 122, 1),
        spawn_waiter("a", "a-new", 124, 1),
        // Key b: short waits, its line never stands: oldest first.
        spawn_waiter("b", "b-old", 121, 1),
        spawn_waiter("b", "b-mid", 122, 1),
        spawn_waiter("b", "b-new", 123, 1),
    ];
    sleep(20 * MS).await;
    drop(a_seat);
    sleep(105 * MS).await;
    drop(b_seat);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    let served = served.lock().unwrap().clone();
    let of = |key: char| -> Vec<_> {
        served
            .iter()
            .copied()
            .filter(|n| n.starts_with(key))
            .collect()
    };
    assert_eq!(of('a'), ["a1", "a2", "a-new", "a-mid", "a-old"]);
    assert_eq!(of('b'), ["b-old", "b-mid", "b-new"]);
    assert_eq!(tenants.metrics_for("a").unwrap().rejected_queue_delay(), 0);
}
