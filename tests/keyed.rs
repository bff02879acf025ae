//! Per-key bulkheads: independent limits, the global limit, the cap on
//! tracked keys, eviction of idle keys (the one idle longest first, never a
//! key in use, and an evicted key back with fresh counts), cancellation,
//! bounded labels, and concurrent stress tests that count calls in flight
//! on their own.

mod common;

use std::collections::HashSet;
use std::error::Error;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use watertight::keyed::{KeyedBulkhead, KeyedError, KeyedPermit, KeyedRejectReason, KeyedRejected};
use watertight::observer::{Observer, Permitted, Rejection};
use watertight::{BuildErrorKind, Bulkhead, CallOutcome, RejectReason};

fn fail_fast(limit: usize) -> KeyedBulkhead<String> {
    KeyedBulkhead::builder()
        .name("tenants")
        .max_concurrent_calls(limit)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap()
}

fn reason(result: Result<KeyedPermit, watertight::keyed::KeyedRejected>) -> KeyedRejectReason {
    result.expect_err("expected a rejection").reason()
}

#[test]
fn futures_and_permits_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<KeyedBulkhead<String>>();
    fn send_only<T: Send>() {}
    send_only::<KeyedPermit>();
    let kb = fail_fast(1);
    send(&kb.acquire("a"));
    send(&kb.call("a", async { Ok::<(), ()>(()) }));
}

#[test]
fn each_key_has_its_own_limit() {
    let kb = fail_fast(2);
    let noisy: Vec<_> = (0..2).map(|_| kb.try_acquire("noisy").unwrap()).collect();
    assert_eq!(reason(kb.try_acquire("noisy")), KeyedRejectReason::KeyFull);
    // The noisy tenant is at its limit; the quiet one has all of its own.
    let quiet: Vec<_> = (0..2).map(|_| kb.try_acquire("quiet").unwrap()).collect();
    assert_eq!(reason(kb.try_acquire("quiet")), KeyedRejectReason::KeyFull);

    let m = kb.metrics_for("noisy").unwrap();
    assert_eq!(
        (m.in_flight(), m.admitted(), m.rejected_by_key()),
        (2, 2, 1)
    );
    assert_eq!(m.bulkhead().name(), "tenants");
    drop((noisy, quiet));
    assert_eq!(kb.metrics_for("noisy").unwrap().in_flight(), 0);
    assert_eq!(kb.keys_tracked(), 2);
}

#[test]
fn limit_for_and_overrides() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .limit_for(|k: &String| if k == "big" { 3 } else { 1 })
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let big: Vec<_> = (0..3).map(|_| kb.try_acquire("big").unwrap()).collect();
    assert_eq!(reason(kb.try_acquire("big")), KeyedRejectReason::KeyFull);
    drop(big);

    // An override recorded before the key is tracked applies when it is,
    // and survives an eviction.
    kb.set_limit_for("small", 2);
    let two = [
        kb.try_acquire("small").unwrap(),
        kb.try_acquire("small").unwrap(),
    ];
    assert_eq!(reason(kb.try_acquire("small")), KeyedRejectReason::KeyFull);
    drop(two);
    assert_eq!(kb.evict_idle(), 2);
    assert!(kb.metrics_for("small").is_none());
    let p = kb.try_acquire("small").unwrap();
    assert_eq!(kb.metrics_for("small").unwrap().max_concurrent_calls(), 2);

    // A live change: shrinking never cuts a call short.
    kb.set_limit_for("small", 0);
    assert_eq!(reason(kb.try_acquire("small")), KeyedRejectReason::KeyFull);
    assert_eq!(kb.metrics_for("small").unwrap().in_flight(), 1);
    kb.clear_limit_for("small");
    assert_eq!(kb.metrics_for("small").unwrap().max_concurrent_calls(), 1);
    drop(p);
    let _again = kb.try_acquire("small").unwrap();

    // `limit_for` returning 0 pauses a key.
    let paused = KeyedBulkhead::<u8>::builder()
        .limit_for(|_| 0)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(reason(paused.try_acquire(&1)), KeyedRejectReason::KeyFull);
}

#[test]
fn the_global_limit_caps_the_sum() {
    let kb = KeyedBulkhead::<String>::builder()
        .name("tenants")
        .max_concurrent_calls(3)
        .global_limit(4)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let a: Vec<_> = (0..3).map(|_| kb.try_acquire("a").unwrap()).collect();
    let b = kb.try_acquire("b").unwrap();
    assert!(b.has_global());
    assert_eq!(reason(kb.try_acquire("c")), KeyedRejectReason::GlobalFull);
    let c = kb.metrics_for("c").unwrap();
    // c's key permit went back when the global limit said no.
    assert_eq!(
        (c.in_flight(), c.bulkhead().in_flight(), c.admitted()),
        (0, 0, 0)
    );
    assert_eq!((c.rejected_by_global(), c.rejected()), (1, 1));
    let g = kb.global_metrics().unwrap();
    assert_eq!(
        (g.name(), g.in_flight(), g.rejected_full()),
        ("tenants.global", 4, 1)
    );
    assert_eq!(kb.stats().rejected_by_global(), 1);
    drop(b);
    let _c = kb.try_acquire("c").unwrap();
    drop(a);
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_the_global_limit_gets_the_next_global_permit() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .global_limit(1)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let a = kb.try_acquire("a").unwrap();
    let waiter = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.acquire("b").await.map(drop) })
    };
    while kb
        .metrics_for("b")
        .is_none_or(|m| m.waiting_for_global() == 0)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let b = kb.metrics_for("b").unwrap();
    assert_eq!(
        (b.queued(), b.in_flight(), b.bulkhead().in_flight()),
        (1, 0, 1)
    );
    drop(a);
    waiter.await.unwrap().unwrap();
    let b = kb.metrics_for("b").unwrap();
    assert_eq!((b.admitted(), b.queued(), b.in_flight()), (1, 0, 0));
}

#[tokio::test]
async fn a_key_wait_times_out_after_max_wait() {
    let kb = KeyedBulkhead::<String>::builder()
        .name("tenants")
        .max_concurrent_calls(1)
        .max_wait(Duration::from_millis(50))
        .build()
        .unwrap();
    let _held = kb.try_acquire("a").unwrap();
    let rejected = kb.acquire("a").await.unwrap_err();
    assert_eq!(rejected.reason(), KeyedRejectReason::KeyTimeout);
    assert!(rejected.waited() >= Duration::from_millis(50));
    assert!(rejected.reason().is_timeout() && !rejected.reason().is_global());
    assert_eq!(
        rejected.bulkhead_rejection().unwrap().reason(),
        watertight::RejectReason::Timeout
    );
    let a = kb.metrics_for("a").unwrap();
    assert_eq!((a.queued(), a.rejected_by_key()), (0, 1));
}

/// What `one_max_wait_budget_covers_both_limits` and its paused-clock
/// twin run: a budget of `budget` for both limits (1 each), "b" holding the
/// only global permit throughout. The first caller of "a" takes a's permit
/// at once and waits for the global one: it gives up after the whole
/// budget, giving a's permit back. Half a budget later a second caller
/// waits for a's permit, then for the global one with what is left.
/// Returns the bulkhead, the two rejections and how long the second call
/// took on tokio's clock (the real one unless the runtime is paused).
async fn two_callers_on_one_budget(
    budget: Duration,
) -> (
    KeyedBulkhead<String>,
    KeyedRejected,
    KeyedRejected,
    Duration,
) {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .global_limit(1)
        .max_wait(budget)
        .build()
        .unwrap();
    let b = kb.try_acquire("b").unwrap();
    let first = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.acquire("a").await.map(drop) })
    };
    while kb
        .metrics_for("a")
        .is_none_or(|m| m.waiting_for_global() == 0)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(budget / 2).await;
    let start = tokio::time::Instant::now();
    let second = kb.acquire("a").await.unwrap_err();
    let elapsed = start.elapsed();
    let first = first.await.unwrap().unwrap_err();
    drop(b);
    assert_eq!(first.reason(), KeyedRejectReason::GlobalTimeout);
    assert_eq!(second.reason(), KeyedRejectReason::GlobalTimeout);
    (kb, first, second, elapsed)
}

/// On tokio's paused clock, where the budget is read as the waits are
/// timed (it was read on the system's clock, so a paused runtime's second
/// caller waited half a budget for its key and then a whole one for the
/// global permit): exactly one budget, to tokio's millisecond.
/// (The default timer runs on tokio's clock only with the `tokio` feature.)
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn one_max_wait_budget_covers_both_limits_on_a_paused_clock() {
    let budget = Duration::from_secs(1);
    let (_kb, first, second, elapsed) = two_callers_on_one_budget(budget).await;
    let within = |d: Duration| d >= budget && d <= budget + Duration::from_millis(2);
    assert!(
        within(elapsed),
        "the two waits did not share one budget: {elapsed:?}"
    );
    assert!(within(second.waited()), "waited {:?}", second.waited());
    assert!(within(first.waited()), "waited {:?}", first.waited());
}

/// On the real clock. A budget of 1 s: the bound below leaves a late
/// wake-up a third of it (with 400 ms, 133 ms was not always enough on a
/// loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_max_wait_budget_covers_both_limits() {
    let budget = Duration::from_secs(1);
    let (kb, first, second, elapsed) = two_callers_on_one_budget(budget).await;
    assert!(first.waited() >= budget, "{:?}", first.waited());
    assert!(
        first
            .to_string()
            .contains("the global limit had no free permit within"),
        "{first}"
    );
    // The global line's own limit was what was left of the budget.
    let by_global = first.bulkhead_rejection().expect("the global line's");
    assert_eq!(by_global.reason(), RejectReason::Timeout);
    assert!(by_global.waited() <= first.waited());
    assert!(second.waited() >= budget, "{:?}", second.waited());
    assert!(elapsed >= budget, "{elapsed:?}");
    assert!(
        elapsed < budget + budget / 3,
        "the two waits did not share one budget: {elapsed:?}"
    );
    let a = kb.metrics_for("a").unwrap();
    assert_eq!(
        (a.in_flight(), a.queued(), a.bulkhead().in_flight()),
        (0, 0, 0)
    );
    assert_eq!((a.rejected_by_global(), a.bulkhead().permitted()), (2, 2));
    assert_eq!(kb.stats().rejected_by_global(), 2);
    // The keyed budget ended both waits in the global bulkhead's line,
    // which counts them as its own timeouts.
    let global = kb.global_metrics().unwrap();
    assert_eq!((global.rejected(), global.rejected_timeout()), (2, 2));
}

#[test]
fn max_keys_rejects_new_keys_while_all_are_in_use() {
    let kb = KeyedBulkhead::<String>::builder()
        .name("tenants")
        .max_concurrent_calls(1)
        .max_keys(2)
        .build()
        .unwrap();
    let a = kb.try_acquire("a").unwrap();
    let b = kb.try_acquire("b").unwrap();
    let rejected = kb.try_acquire("c").unwrap_err();
    assert_eq!(rejected.reason(), KeyedRejectReason::TooManyKeys);
    assert_eq!(
        rejected.to_string(),
        r#"keyed bulkhead "tenants" tracks its maximum of 2 keys and none is idle"#
    );
    assert!(rejected.bulkhead_rejection().is_none());
    assert_eq!(kb.keys_tracked(), 2);
    // Tracked keys are still served.
    assert_eq!(reason(kb.try_acquire("a")), KeyedRejectReason::KeyFull);

    drop(a);
    let _c = kb.try_acquire("c").unwrap(); // a was idle: evicted for c
    let mut keys = kb.keys();
    keys.sort();
    assert_eq!(keys, ["b", "c"]);
    let s = kb.stats();
    assert_eq!(
        (
            s.keys_created(),
            s.keys_evicted(),
            s.rejected_too_many_keys()
        ),
        (3, 1, 1)
    );
    drop(b);
}

#[test]
fn the_key_idle_longest_is_evicted_first() {
    let kb = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(1)
        .max_keys(3)
        .build()
        .unwrap();
    for key in [1, 2, 3] {
        drop(kb.try_acquire(&key).unwrap());
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(kb.try_acquire(&1).unwrap()); // 1 is the most recently used now
    std::thread::sleep(Duration::from_millis(2));
    let _four = kb.try_acquire(&4).unwrap();
    let mut keys = kb.keys();
    keys.sort_unstable();
    assert_eq!(keys, [1, 3, 4]);
}

/// A `BuildHasher` that counts the hashers it makes and hashes a `u32` to
/// itself (so that every key's hash is known and small).
#[derive(Clone, Default)]
struct CountingIdentity(Arc<AtomicUsize>);

struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u32 keys")
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

impl std::hash::BuildHasher for CountingIdentity {
    type Hasher = Identity;
    fn build_hasher(&self) -> Identity {
        self.0.fetch_add(1, Ordering::Relaxed);
        Identity(0)
    }
}

/// The builder's hasher is the one keys are hashed with; with a hash as
/// weak as the identity, limits, the cap and eviction behave as with the
/// default.
#[test]
fn a_custom_hasher_hashes_the_keys_and_the_bulkhead_behaves_the_same() {
    let hashed = CountingIdentity::default();
    let kb: KeyedBulkhead<u32, CountingIdentity> = KeyedBulkhead::builder()
        .max_concurrent_calls(2)
        .max_keys(100)
        .hasher(hashed.clone())
        .build()
        .unwrap();
    let before = hashed.0.load(Ordering::Relaxed);
    let _a = kb.try_acquire(&7).unwrap();
    let _b = kb.try_acquire(&7).unwrap();
    assert_eq!(reason(kb.try_acquire(&7)), KeyedRejectReason::KeyFull);
    assert!(
        hashed.0.load(Ordering::Relaxed) >= before + 3,
        "the hasher hashed every lookup"
    );
    for key in 1_000..2_000 {
        drop(kb.try_acquire(&key).unwrap());
    }
    // Key 7 is in use, so it stayed; the rest are the 99 most recent.
    let mut keys = kb.keys();
    keys.sort_unstable();
    let mut expected: Vec<u32> = vec![7];
    expected.extend(1_901..2_000);
    assert_eq!(keys, expected);
    assert_eq!(kb.stats().keys_evicted(), 901);
    assert_eq!(reason(kb.try_acquire(&7)), KeyedRejectReason::KeyFull);
}

/// Hashes a `u32` to itself, and panics on any other key than `only`
/// while `only` is set: user code that may panic.
#[derive(Clone, Default)]
struct Tripwire(Arc<std::sync::atomic::AtomicU64>);

const UNSET: u64 = u64::MAX;

struct TripwireHasher(Arc<std::sync::atomic::AtomicU64>, u64);

impl std::hash::Hasher for TripwireHasher {
    fn finish(&self) -> u64 {
        self.1
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u32 keys")
    }
    fn write_u32(&mut self, n: u32) {
        let only = self.0.load(Ordering::SeqCst);
        assert!(
            only == UNSET || only == u64::from(n),
            "the hasher trips on {n}"
        );
        self.1 = u64::from(n);
    }
}

impl std::hash::BuildHasher for Tripwire {
    type Hasher = TripwireHasher;
    fn build_hasher(&self) -> TripwireHasher {
        TripwireHasher(self.0.clone(), 0)
    }
}

/// The hasher is user code: it runs before any shard is locked, never while
/// a table rehashes (which would hash every key in it, and a panic there
/// would leave the table half rehashed), and a hasher that panics loses
/// nothing.
#[test]
fn a_hasher_that_panics_runs_outside_the_registry_and_loses_nothing() {
    let wire = Tripwire::default();
    wire.0.store(UNSET, Ordering::SeqCst);
    let kb: KeyedBulkhead<u32, Tripwire> = KeyedBulkhead::builder()
        .max_concurrent_calls(1)
        .max_keys(1_000)
        .hasher(wire.clone())
        .build()
        .unwrap();
    // Each new key may grow its shard's table: only the new key is hashed.
    for key in 0..500 {
        wire.0.store(u64::from(key), Ordering::SeqCst);
        drop(kb.try_acquire(&key).unwrap());
    }
    wire.0.store(UNSET, Ordering::SeqCst);
    assert_eq!(kb.keys_tracked(), 500);
    // A key whose hashing panics: the call panics before it touches
    // anything.
    let held = kb.try_acquire(&3).unwrap();
    wire.0.store(3, Ordering::SeqCst);
    let tripped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kb.try_acquire(&7)));
    assert!(tripped.is_err(), "the hasher panicked");
    wire.0.store(UNSET, Ordering::SeqCst);
    assert_eq!(kb.keys_tracked(), 500);
    assert_eq!(reason(kb.try_acquire(&3)), KeyedRejectReason::KeyFull);
    drop(held);
    for key in 0..500 {
        drop(kb.try_acquire(&key).unwrap());
    }
    drop(kb.try_acquire(&7).unwrap());
    assert_eq!(kb.keys_tracked(), 500);
    kb.set_limit_for(&9, 2);
    let (_a, _b) = (kb.try_acquire(&9).unwrap(), kb.try_acquire(&9).unwrap());
}

/// Waits until the clock has moved on, so that the next key to go idle
/// goes idle strictly later than the last (on a clock of any resolution).
fn tick() {
    let now = Instant::now();
    while Instant::now() == now {
        std::hint::spin_loop();
    }
}

/// At the cap, each new key evicts exactly the key idle longest, across all
/// of the registry's shards: keys used again move to the back, keys in use
/// are passed over (however long ago they were last idle), and a key that
/// went idle again goes to the back.
#[test]
fn at_the_cap_each_new_key_evicts_the_key_idle_longest() {
    const KEYS: u32 = 64;
    let kb = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(1)
        .max_keys(KEYS as usize)
        .build()
        .unwrap();
    for key in 0..KEYS {
        drop(kb.try_acquire(&key).unwrap());
        tick();
    }
    // Used again, in a scrambled order: this is the order they went idle.
    let mut order: Vec<u32> = (0..KEYS).map(|i| (i * 37 + 11) % KEYS).collect();
    for &key in &order {
        drop(kb.try_acquire(&key).unwrap());
        tick();
    }
    // Two of the keys idle longest are in use now.
    let held = [
        kb.try_acquire(&order[0]).unwrap(),
        kb.try_acquire(&order[2]).unwrap(),
    ];
    let (first, third) = (order.remove(0), order.remove(1));

    let mut tracked: HashSet<u32> = (0..KEYS).collect();
    for (new, &expected) in (1_000..).zip(&order[..20]) {
        drop(kb.try_acquire(&new).unwrap());
        tick();
        assert!(
            kb.metrics_for(&expected).is_none(),
            "key {new} should have evicted {expected}, the key idle longest"
        );
        tracked.remove(&expected);
        tracked.insert(new);
        assert_eq!(kb.keys().into_iter().collect::<HashSet<_>>(), tracked);
    }
    // The held keys went idle just now: they are the last to go.
    drop(held);
    tick();
    let mut next = order[20..].to_vec();
    next.extend(1_000..1_020);
    next.extend([first, third]);
    for (new, &expected) in (2_000..).zip(&next) {
        drop(kb.try_acquire(&new).unwrap());
        tick();
        assert!(
            kb.metrics_for(&expected).is_none(),
            "{new} evicts {expected}"
        );
    }
    let s = kb.stats();
    assert_eq!(s.keys_tracked(), KEYS as usize);
    assert_eq!(
        (s.keys_created(), s.keys_evicted()),
        (
            u64::from(KEYS) + 20 + next.len() as u64,
            20 + next.len() as u64
        )
    );
}

/// An evicted key keeps nothing of its old state but its limit override
/// and its label: its counts start from zero, and its bulkhead is a new one
/// with every permit free.
#[tokio::test]
async fn an_evicted_key_comes_back_fresh_with_its_override_and_label() {
    let kb = KeyedBulkhead::<String>::builder()
        .name("tenants")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .call_timeout(Duration::from_millis(5))
        .max_keys(2)
        .key_label(|t: &String| format!("plan-{}", t.len()))
        .build()
        .unwrap();
    kb.set_limit_for("acme", 2);
    let two = [
        kb.try_acquire("acme").unwrap(),
        kb.try_acquire("acme").unwrap(),
    ];
    assert_eq!(reason(kb.try_acquire("acme")), KeyedRejectReason::KeyFull);
    drop(two);
    let slow = kb
        .call("acme", async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), ()>(())
        })
        .await;
    assert!(matches!(slow, Err(KeyedError::CallTimeout(_))), "{slow:?}");
    let before = kb.metrics_for("acme").unwrap();
    assert_eq!(
        (
            before.admitted(),
            before.rejected_by_key(),
            before.call_timeouts(),
            before.bulkhead().permitted()
        ),
        (3, 1, 1, 3)
    );
    tick();

    // Two newer keys at a cap of two: acme, idle longest, goes.
    drop(kb.try_acquire("b").unwrap());
    tick();
    drop(kb.try_acquire("c").unwrap());
    assert!(kb.metrics_for("acme").is_none());
    assert_eq!(kb.stats().keys_evicted(), 1);

    let back = [
        kb.try_acquire("acme").unwrap(),
        kb.try_acquire("acme").unwrap(),
    ];
    assert_eq!(back[0].label(), Some("plan-4"));
    assert_eq!(back[0].bulkhead_name(), "tenants[plan-4]");
    let after = kb.metrics_for("acme").unwrap();
    assert_eq!(after.max_concurrent_calls(), 2, "the override is kept");
    assert_eq!(
        (
            after.admitted(),
            after.rejected(),
            after.call_timeouts(),
            after.in_flight(),
            after.bulkhead().permitted(),
            after.bulkhead().rejected_full()
        ),
        (2, 0, 0, 2, 2, 0),
        "counts start from zero"
    );
    assert_eq!(after.label(), Some("plan-4"));
    drop(back);
    let s = kb.stats();
    assert_eq!((s.keys_created(), s.keys_evicted()), (4, 2));
    assert_eq!(s.labels_in_use(), 2); // plan-4 and plan-1
}

/// New keys arriving at the cap from several threads at once, each one
/// evicting, while other keys are held: the keys in use are never evicted
/// (their limit of one holds, counted by the test), the cap holds, and the
/// counts add up.
#[test]
fn new_keys_at_the_cap_from_many_threads_never_evict_a_key_in_use() {
    const THREADS: u64 = 4;
    const MAX_KEYS: usize = 32;
    let rounds: u64 = if cfg!(debug_assertions) {
        2_000
    } else {
        20_000
    };
    let kb = KeyedBulkhead::<u64>::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .max_keys(MAX_KEYS)
        .build()
        .unwrap();
    // Held throughout: a second permit of these would mean a new bulkhead.
    let held: Vec<_> = (0..8u64)
        .map(|k| kb.try_acquire(&(u64::MAX - k)).unwrap())
        .collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let kb = &kb;
            s.spawn(move || {
                for i in 0..rounds {
                    // Mostly new keys; now and then one of the held ones.
                    let key = if i % 16 == 0 {
                        u64::MAX - i % 8
                    } else {
                        t << 32 | i
                    };
                    match kb.try_acquire(&key) {
                        Ok(permit) => {
                            assert!(key < u64::MAX - 8, "held key {key} admitted twice");
                            drop(permit);
                        }
                        Err(r) => assert!(
                            matches!(
                                r.reason(),
                                KeyedRejectReason::KeyFull | KeyedRejectReason::TooManyKeys
                            ),
                            "{r}"
                        ),
                    }
                    assert!(kb.keys_tracked() <= MAX_KEYS);
                }
            });
        }
    });
    for k in 0..8u64 {
        let m = kb
            .metrics_for(&(u64::MAX - k))
            .expect("a held key stays tracked");
        assert_eq!((m.in_flight(), m.admitted()), (1, 1));
    }
    let s = kb.stats();
    assert_eq!(s.keys_tracked(), MAX_KEYS);
    assert_eq!(s.keys_created() - s.keys_evicted(), MAX_KEYS as u64);
    assert!(s.keys_evicted() > rounds, "{s:?}");
    drop(held);
    assert_eq!(kb.evict_idle(), MAX_KEYS);
    assert_eq!(kb.keys_tracked(), 0);
}

#[test]
fn idle_keys_are_evicted_after_idle_timeout_and_come_back_fresh() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(2)
        .idle_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let used = Instant::now();
    drop(kb.try_acquire("a").unwrap());
    drop(kb.try_acquire("a").unwrap());
    let busy = kb.try_acquire("busy").unwrap();
    assert_eq!(kb.metrics_for("a").unwrap().admitted(), 2);
    let evicted = kb.evict_idle();
    // Only if this thread was not descheduled for idle_timeout meanwhile
    // (then "a" may have been idle long enough, and rightly evicted).
    if used.elapsed() < Duration::from_millis(100) {
        assert_eq!(evicted, 0, "idle for less than idle_timeout");
    } else {
        eprintln!("descheduled for {:?}: not checked", used.elapsed());
    }

    std::thread::sleep(Duration::from_millis(150));
    // A new key sweeps out keys idle for idle_timeout; "busy" is in use.
    drop(kb.try_acquire("b").unwrap());
    assert!(kb.metrics_for("a").is_none());
    assert!(kb.metrics_for("busy").is_some());
    assert_eq!(kb.stats().keys_evicted(), 1);

    // Back, with a new bulkhead and counts from zero.
    drop(kb.try_acquire("a").unwrap());
    let a = kb.metrics_for("a").unwrap();
    assert_eq!((a.admitted(), a.bulkhead().permitted()), (1, 1));
    assert_eq!(kb.stats().keys_created(), 4);
    drop(busy);
}

#[test]
fn evict_idle_takes_every_idle_key_without_idle_timeout() {
    let kb = fail_fast(1);
    let held = kb.try_acquire("held").unwrap();
    for k in ["x", "y", "z"] {
        drop(kb.try_acquire(k).unwrap());
    }
    assert_eq!(kb.evict_idle(), 3);
    assert_eq!(kb.keys(), ["held"]);
    drop(held);
    assert_eq!(kb.evict_idle(), 1);
    assert_eq!(kb.keys_tracked(), 0);
}

/// The guarantee eviction must keep: a key's bulkhead is never replaced by
/// a new one while a permit of the old one is out, or the key's limit
/// would hold twice over.
#[test]
fn a_held_permit_keeps_its_key_and_its_limit_across_eviction_attempts() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .max_keys(1)
        .idle_timeout(Duration::from_millis(1))
        .build()
        .unwrap();
    let held = kb.try_acquire("a").unwrap();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_micros(100));
        assert_eq!(kb.evict_idle(), 0);
        assert_eq!(reason(kb.try_acquire("b")), KeyedRejectReason::TooManyKeys);
        // Still the same bulkhead, still at its limit.
        assert_eq!(reason(kb.try_acquire("a")), KeyedRejectReason::KeyFull);
    }
    let a = kb.metrics_for("a").unwrap();
    assert_eq!(
        (a.admitted(), a.in_flight(), a.bulkhead().rejected_full()),
        (1, 1, 50)
    );
    assert_eq!(kb.stats().keys_created(), 1);
    assert_eq!(kb.stats().keys_evicted(), 0);

    drop(held);
    let _b = kb.try_acquire("b").unwrap(); // now "a" may go
    assert_eq!(kb.keys(), ["b"]);
}

#[tokio::test]
async fn a_waiter_keeps_its_key_and_cancelling_it_leaves_nothing_behind() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .max_keys(1)
        .build()
        .unwrap();
    kb.set_limit_for("a", 0); // nobody holds a permit; callers can only wait
    {
        let mut waiting = pin!(kb.acquire("a"));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        let a = kb.metrics_for("a").unwrap();
        assert_eq!((a.queued(), a.in_flight()), (1, 0));
        assert_eq!(kb.evict_idle(), 0, "a waiter is a user of its key");
        assert_eq!(reason(kb.try_acquire("b")), KeyedRejectReason::TooManyKeys);
    } // cancelled here
    let a = kb.metrics_for("a").unwrap();
    assert_eq!((a.queued(), a.in_flight(), a.rejected()), (0, 0, 0));
    assert_eq!(kb.evict_idle(), 1);
    let _b = kb.try_acquire("b").unwrap();
}

#[tokio::test]
async fn cancelling_a_wait_for_the_global_limit_gives_the_key_permit_back() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .global_limit(1)
        .build()
        .unwrap();
    let a = kb.try_acquire("a").unwrap();
    {
        let mut waiting = pin!(kb.acquire("b"));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        let b = kb.metrics_for("b").unwrap();
        assert_eq!((b.waiting_for_global(), b.bulkhead().in_flight()), (1, 1));
        assert_eq!(kb.global_metrics().unwrap().queued(), 1);
        assert_eq!(reason(kb.try_acquire("b")), KeyedRejectReason::KeyFull);
    }
    let b = kb.metrics_for("b").unwrap();
    assert_eq!(
        (b.waiting_for_global(), b.bulkhead().in_flight(), b.queued()),
        (0, 0, 0)
    );
    assert_eq!(kb.global_metrics().unwrap().queued(), 0);
    assert_eq!(kb.evict_idle(), 1); // b; a is held
    drop(a);
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 0);
}

#[tokio::test]
async fn call_runs_under_both_permits_and_reports_how_it_ended() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .global_limit(5)
        .call_timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    let inside = kb
        .call("a", async {
            Ok::<_, ()>((
                kb.metrics_for("a").unwrap().in_flight(),
                kb.global_metrics().unwrap().in_flight(),
            ))
        })
        .await
        .unwrap();
    assert_eq!(inside, (1, 1));
    let failed = kb.call("a", async { Err::<(), _>("no") }).await;
    assert_eq!(failed, Err(KeyedError::Inner("no")));
    let slow = kb
        .call("a", async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), ()>(())
        })
        .await;
    assert!(matches!(slow, Err(KeyedError::CallTimeout(_))), "{slow:?}");
    let a = kb.metrics_for("a").unwrap();
    assert_eq!((a.admitted(), a.call_timeouts(), a.in_flight()), (3, 1, 0));
    assert_eq!(kb.global_metrics().unwrap().in_flight(), 0);
}

/// `KeyedError`'s `Display` names the keyed bulkhead and says what
/// happened: a rejection and a call timeout display as themselves (the
/// rejection's source is the key's bulkhead's rejection), the call's error
/// is the source.
#[tokio::test]
async fn a_keyed_call_error_returns_its_cause_from_source_without_repeating_it() {
    let kb = KeyedBulkhead::<&'static str>::builder()
        .name("tenants")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .call_timeout(Duration::from_millis(10))
        .build()
        .unwrap();

    let failed = kb
        .call(&"acme", async { Err::<(), _>(common::Declined) })
        .await
        .unwrap_err();
    assert_eq!(
        common::error_chain(&failed, 1),
        [
            "the call guarded by a keyed bulkhead failed",
            "the provider declined",
            "quota exceeded"
        ]
    );

    let held = kb.try_acquire(&"acme").unwrap();
    let rejected = kb
        .call(&"acme", async { Ok::<(), common::Declined>(()) })
        .await
        .unwrap_err();
    let chain = common::error_chain(&rejected, 2);
    assert_eq!(
        chain,
        [
            r#"keyed bulkhead "tenants": the key is full"#,
            r#"bulkhead "tenants" is full"#
        ]
    );
    assert_eq!(rejected.reason(), Some(KeyedRejectReason::KeyFull));
    let inner = rejected
        .source()
        .unwrap()
        .downcast_ref::<watertight::Rejected>();
    assert_eq!(
        inner.map(|r| r.reason()),
        Some(watertight::RejectReason::Full)
    );
    drop(held);

    let timed_out = kb
        .call(&"acme", async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), common::Declined>(())
        })
        .await
        .unwrap_err();
    let KeyedError::CallTimeout(cut) = &timed_out else {
        panic!("{timed_out:?}")
    };
    assert_eq!(cut.timeout(), Duration::from_millis(10));
    assert_eq!(
        common::error_chain(&timed_out, 1),
        [r#"call in bulkhead "tenants" timed out after 10ms"#]
    );
}

#[derive(Debug, Default)]
struct Names(Mutex<HashSet<String>>);

impl Observer for Names {
    fn on_permitted(&self, e: &Permitted<'_>) {
        self.0.lock().unwrap().insert(e.name.to_owned());
    }
    fn on_rejected(&self, e: &Rejection<'_>) {
        self.0.lock().unwrap().insert(e.name.to_owned());
    }
}

#[test]
fn labels_stay_bounded_however_many_keys_come_and_go() {
    let names = Arc::new(Names::default());
    let kb = KeyedBulkhead::<u32>::builder()
        .name("hosts")
        .max_concurrent_calls(1)
        .global_limit(100)
        .max_keys(4)
        .key_label(|host: &u32| format!("host-{host}"))
        .max_labels(3)
        .observer(names.clone())
        .build()
        .unwrap();
    for host in 0..200 {
        let p = kb.try_acquire(&host).unwrap();
        assert_eq!(
            p.label(),
            Some(
                if host < 3 {
                    format!("host-{host}")
                } else {
                    "other".into()
                }
                .as_str()
            )
        );
        drop(p);
    }
    // A labelled key evicted and seen again keeps its label.
    assert!(kb.metrics_for(&0).is_none());
    assert_eq!(kb.try_acquire(&0).unwrap().bulkhead_name(), "hosts[host-0]");
    let mut seen: Vec<_> = names.0.lock().unwrap().iter().cloned().collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "hosts.global",
            "hosts[host-0]",
            "hosts[host-1]",
            "hosts[host-2]",
            "hosts[other]"
        ]
    );
    let s = kb.stats();
    assert_eq!(
        (s.labels_in_use(), s.max_labels(), s.keys_tracked()),
        (3, 3, 4)
    );
    assert!(s.keys_evicted() >= 196);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_rejects_waiters_of_keys_and_of_a_shared_global_limit() {
    let shared = Bulkhead::builder()
        .name("pool")
        .max_concurrent_calls(1)
        .build()
        .unwrap();
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .global(shared.clone())
        .build()
        .unwrap();
    let held = kb.try_acquire("a").unwrap();
    let key_waiter = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.acquire("a").await.map(drop) })
    };
    let global_waiter = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.acquire("b").await.map(drop) })
    };
    while kb.metrics_for("a").is_none_or(|m| m.queued() == 0)
        || kb
            .metrics_for("b")
            .is_none_or(|m| m.waiting_for_global() == 0)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    kb.close();
    assert!(kb.is_closed());
    let key_waiter = key_waiter.await.unwrap().unwrap_err();
    let global_waiter = global_waiter.await.unwrap().unwrap_err();
    assert_eq!(key_waiter.reason(), KeyedRejectReason::Closed);
    assert_eq!(global_waiter.reason(), KeyedRejectReason::Closed);
    assert_eq!(reason(kb.try_acquire("c")), KeyedRejectReason::Closed);
    assert_eq!(kb.stats().rejected_closed(), 1);
    // The shared bulkhead is not ours to close.
    assert!(!shared.is_closed());
    let idle = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.wait_idle().await })
    };
    drop(held);
    idle.await.unwrap();
    assert_eq!(shared.metrics().in_flight(), 0);
}

#[test]
fn build_errors() {
    let kind = |b: watertight::keyed::KeyedBulkheadBuilder<u8>| b.build().unwrap_err().kind();
    assert_eq!(kind(KeyedBulkhead::builder()), BuildErrorKind::MissingLimit);
    assert_eq!(
        kind(KeyedBulkhead::builder().max_concurrent_calls(0)),
        BuildErrorKind::ZeroLimit
    );
    assert_eq!(
        kind(
            KeyedBulkhead::builder()
                .max_concurrent_calls(1)
                .global_limit(0)
        ),
        BuildErrorKind::ZeroLimit
    );
    assert_eq!(
        kind(KeyedBulkhead::builder().max_concurrent_calls(1).name("")),
        BuildErrorKind::EmptyName
    );
    assert_eq!(
        kind(
            KeyedBulkhead::builder()
                .max_concurrent_calls(1)
                .call_timeout(Duration::ZERO)
        ),
        BuildErrorKind::ZeroCallTimeout
    );
    assert_eq!(
        kind(
            KeyedBulkhead::builder()
                .max_concurrent_calls(1)
                .leak_threshold(Duration::ZERO)
        ),
        BuildErrorKind::ZeroLeakThreshold
    );
    assert_eq!(
        kind(KeyedBulkhead::builder().max_concurrent_calls(usize::MAX)),
        BuildErrorKind::LimitTooLarge
    );
}

/// The keyed builder validates with the bulkhead builder's own checks:
/// every setting they share fails the same way on both.
#[test]
fn keyed_and_plain_builders_reject_the_same_settings() {
    type Tweak = fn(watertight::BulkheadBuilder) -> watertight::BulkheadBuilder;
    type KeyedTweak = fn(
        watertight::keyed::KeyedBulkheadBuilder<u8>,
    ) -> watertight::keyed::KeyedBulkheadBuilder<u8>;
    let cases: [(Tweak, KeyedTweak); 7] = [
        (|b| b.max_concurrent_calls(0), |b| b.max_concurrent_calls(0)),
        (|b| b.name(""), |b| b.name("")),
        (
            |b| b.call_timeout(Duration::ZERO),
            |b| b.call_timeout(Duration::ZERO),
        ),
        (
            |b| b.leak_threshold(Duration::ZERO),
            |b| b.leak_threshold(Duration::ZERO),
        ),
        (
            |b| b.max_concurrent_calls(watertight::Semaphore::MAX_PERMITS + 1),
            |b| b.max_concurrent_calls(watertight::Semaphore::MAX_PERMITS + 1),
        ),
        // A controlled-delay target that no wait lives to see.
        (
            |b| {
                b.max_wait(Duration::from_millis(50))
                    .queue_delay(Duration::from_millis(50), Duration::from_millis(100))
            },
            |b| {
                b.max_wait(Duration::from_millis(50))
                    .queue_delay(Duration::from_millis(50), Duration::from_millis(100))
            },
        ),
        (
            |b| {
                b.max_wait(Duration::ZERO)
                    .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
            },
            |b| {
                b.max_wait(Duration::ZERO)
                    .queue_delay(Duration::from_millis(5), Duration::from_millis(100))
            },
        ),
    ];
    for (plain, keyed) in cases {
        let plain = plain(watertight::Bulkhead::builder().max_concurrent_calls(1))
            .build()
            .unwrap_err()
            .kind();
        let keyed = keyed(KeyedBulkhead::builder().max_concurrent_calls(1))
            .build()
            .unwrap_err()
            .kind();
        assert_eq!(plain, keyed);
    }
}

#[test]
fn zero_max_keys_is_a_build_error() {
    let err = KeyedBulkhead::<u8>::builder()
        .max_concurrent_calls(1)
        .max_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), BuildErrorKind::ZeroMaxKeys);
    assert_eq!(err.to_string(), "max_keys must be at least 1");
}

/// Counts calls in flight per key and in all, independently of the
/// bulkhead, and remembers the highest counts seen.
struct Probe {
    per_key: Vec<AtomicUsize>,
    total: AtomicUsize,
    peak_per_key: Vec<AtomicUsize>,
    peak_total: AtomicUsize,
}

impl Probe {
    fn new(keys: usize) -> Self {
        Self {
            per_key: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            total: AtomicUsize::new(0),
            peak_per_key: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            peak_total: AtomicUsize::new(0),
        }
    }

    /// Counts the caller in (for `key` and in all) while `work` runs, also
    /// when it is cancelled half-way.
    async fn inside(&self, key: usize, work: impl Future<Output = ()>) {
        struct Out<'a>(&'a Probe, usize);
        impl Drop for Out<'_> {
            fn drop(&mut self) {
                self.0.total.fetch_sub(1, Ordering::SeqCst);
                self.0.per_key[self.1].fetch_sub(1, Ordering::SeqCst);
            }
        }
        let now = self.per_key[key].fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_per_key[key].fetch_max(now, Ordering::SeqCst);
        let now = self.total.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_total.fetch_max(now, Ordering::SeqCst);
        let _out = Out(self, key);
        work.await;
    }
}

fn limit_of(key: usize) -> usize {
    key % 3 + 1
}

/// Many tasks on many threads, over more keys than may be tracked, with
/// keys evicted all the time (idle_timeout of 1 ms, a sweeper calling
/// `evict_idle`), waits that time out, and callers cancelled mid-wait and
/// mid-call: the per-key and global limits hold at every instant, counted
/// by the test itself, and every count is back to zero at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_limits_hold_under_churn_and_cancellation() {
    const KEYS: usize = 12;
    const GLOBAL: usize = 8;
    const TASKS: usize = 48;
    const ROUNDS: usize = 150;
    let kb = KeyedBulkhead::<usize>::builder()
        .name("stress")
        .max_concurrent_calls(1)
        .limit_for(|k| limit_of(*k))
        .global_limit(GLOBAL)
        .max_wait(Duration::from_millis(20))
        .max_keys(6)
        .idle_timeout(Duration::from_millis(1))
        .build()
        .unwrap();
    let probe = Arc::new(Probe::new(KEYS));
    let outcomes = Arc::new(Mutex::new(std::collections::HashMap::<&str, usize>::new()));

    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sweeper = {
        let (kb, sweeping) = (kb.clone(), sweeping.clone());
        tokio::spawn(async move {
            while sweeping.load(Ordering::Relaxed) {
                kb.evict_idle();
                tokio::task::yield_now().await;
            }
        })
    };

    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (kb, probe, outcomes) = (kb.clone(), probe.clone(), outcomes.clone());
            tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (task as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                for _ in 0..ROUNDS {
                    // A few hot keys and a long tail.
                    let r = next();
                    let key = if r % 2 == 0 {
                        (r >> 8) as usize % 3
                    } else {
                        (r >> 8) as usize % KEYS
                    };
                    let spins = next() % 4;
                    let work = async {
                        for _ in 0..spins {
                            tokio::task::yield_now().await;
                        }
                    };
                    let outcome = match next() % 4 {
                        0 => match kb.try_acquire(&key) {
                            Ok(permit) => {
                                probe.inside(key, work).await;
                                drop(permit);
                                "admitted"
                            }
                            Err(r) => r.reason().as_str(),
                        },
                        1 => {
                            // Cancelled while waiting or while working.
                            let call = async {
                                let permit = kb.acquire(&key).await.map_err(|r| r.reason())?;
                                probe
                                    .inside(key, tokio::time::sleep(Duration::from_millis(2)))
                                    .await;
                                drop(permit);
                                Ok::<_, KeyedRejectReason>(())
                            };
                            match tokio::time::timeout(Duration::from_millis(1), call).await {
                                Ok(Ok(())) => "admitted",
                                Ok(Err(reason)) => reason.as_str(),
                                Err(_) => "cancelled",
                            }
                        }
                        _ => match kb
                            .call(&key, async {
                                probe.inside(key, work).await;
                                Ok::<_, ()>(())
                            })
                            .await
                        {
                            Ok(()) => "admitted",
                            Err(KeyedError::Rejected(r)) => r.reason().as_str(),
                            Err(e) => panic!("{e:?}"),
                        },
                    };
                    *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    sweeping.store(false, Ordering::Relaxed);
    sweeper.await.unwrap();

    for key in 0..KEYS {
        let peak = probe.peak_per_key[key].load(Ordering::SeqCst);
        assert!(
            peak <= limit_of(key),
            "key {key}: {peak} at once, limit {}",
            limit_of(key)
        );
        assert_eq!(probe.per_key[key].load(Ordering::SeqCst), 0);
    }
    let peak = probe.peak_total.load(Ordering::SeqCst);
    assert!(peak <= GLOBAL, "{peak} at once in all, limit {GLOBAL}");
    assert!(peak > 1, "no concurrency at all");

    // Nothing left behind by cancelled or rejected callers.
    let g = kb.global_metrics().unwrap();
    assert_eq!((g.in_flight(), g.queued()), (0, 0));
    for m in kb.snapshot() {
        assert_eq!(
            (m.in_flight(), m.queued(), m.bulkhead().in_flight()),
            (0, 0, 0),
            "key {}",
            m.key()
        );
    }
    let s = kb.stats();
    assert!(s.keys_tracked() <= 6);
    assert_eq!(s.keys_created() - s.keys_evicted(), s.keys_tracked() as u64);
    std::thread::sleep(Duration::from_millis(5)); // past idle_timeout
    assert_eq!(kb.evict_idle(), s.keys_tracked());
    let outcomes = outcomes.lock().unwrap();
    assert_eq!(outcomes.values().sum::<usize>(), TASKS * ROUNDS);
    assert!(
        outcomes.get("admitted").copied().unwrap_or(0) > TASKS * ROUNDS / 10,
        "{outcomes:?}"
    );
    assert!(s.keys_evicted() > 0, "{s:?}");
    eprintln!("{outcomes:?} {s:?}");
}

/// One tenant floods the bulkhead with waiting callers; another's calls
/// still go straight through, because the flood waits in its own key's
/// line and holds no global permit while it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_cannot_starve_a_quiet_one() {
    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(2)
        .global_limit(4)
        .build()
        .unwrap();
    let noisy: Vec<_> = (0..100)
        .map(|_| {
            let kb = kb.clone();
            tokio::spawn(async move {
                kb.call("noisy", async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, ()>(())
                })
                .await
            })
        })
        .collect();
    while kb.metrics_for("noisy").is_none_or(|m| m.queued() < 90) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Straight through: a global permit is free whenever the quiet tenant
    // asks (the flood holds at most its key's two), so `try_acquire`
    // succeeds every time, and calls go through. (Not a bound on how long
    // the calls took, which a descheduled thread would break.)
    for _ in 0..5 {
        let permit = kb.try_acquire("quiet").expect("a free global permit");
        assert!(permit.has_global());
        drop(permit);
        // A generous bound, so that a starved call fails instead of hanging.
        tokio::time::timeout(
            Duration::from_secs(10),
            kb.call("quiet", async { Ok::<_, ()>(()) }),
        )
        .await
        .expect("the quiet tenant's call is not starved")
        .unwrap();
    }
    assert!(kb.global_metrics().unwrap().in_flight() <= 2);
    for task in noisy {
        task.abort();
    }
}

/// A key's observers hear of a call once both stages admitted it, and of
/// a call the global limit turned away as a rejection for its reason (not
/// as an admission that was cancelled); the global bulkhead's hear of its
/// own. `bulkhead()` still counts the key's stage alone.
#[test]
fn permit_outcome_reaches_the_observers() {
    #[derive(Debug, Default)]
    struct Seen(Mutex<Vec<(String, String)>>);
    impl Observer for Seen {
        fn on_permitted(&self, e: &watertight::observer::Permitted<'_>) {
            self.0
                .lock()
                .unwrap()
                .push((e.name.to_owned(), "permitted".to_owned()));
        }
        fn on_rejected(&self, e: &watertight::observer::Rejection<'_>) {
            let what = format!("rejected {}", e.reason);
            self.0.lock().unwrap().push((e.name.to_owned(), what));
        }
        fn on_finished(&self, e: &watertight::observer::Finished<'_>) {
            self.0
                .lock()
                .unwrap()
                .push((e.name.to_owned(), e.outcome.to_string()));
        }
    }
    let seen = Arc::new(Seen::default());
    let kb = KeyedBulkhead::<String>::builder()
        .name("t")
        .max_concurrent_calls(1)
        .global_limit(1)
        .key_label(|k: &String| k.clone())
        .observer(seen.clone())
        .build()
        .unwrap();
    let mut p = kb.try_acquire("a").unwrap();
    p.set_outcome(CallOutcome::Success);
    assert_eq!(reason(kb.try_acquire("b")), KeyedRejectReason::GlobalFull);
    drop(p);
    let b = kb.metrics_for("b").unwrap();
    assert_eq!(
        (
            b.bulkhead().permitted(),
            b.admitted(),
            b.rejected_by_global()
        ),
        (1, 0, 1)
    );
    let seen = seen.0.lock().unwrap();
    let seen: Vec<(&str, &str)> = seen.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("t.global", "permitted"),
            ("t[a]", "permitted"),
            ("t.global", "rejected full"),
            ("t[b]", "rejected full"),
            ("t.global", "success"),
            ("t[a]", "success"),
        ]
    );
}

/// While fewer than half of `max_keys` are tracked (and without an
/// `idle_timeout`), keys going idle do not read the clock: they are stamped
/// with the time of the last new key. At the cap, those keys still go
/// first, in the order the new keys between them give, and the keys that
/// went idle since (stamped with the clock) after them.
#[test]
fn below_half_full_idle_keys_are_ordered_by_the_new_keys_between_them() {
    let kb = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(1)
        .max_keys(8)
        .build()
        .unwrap();
    for key in 0..3 {
        drop(kb.try_acquire(&key).unwrap());
        tick();
    }
    // Used again after 2 arrived: 0 now goes after 1 (and with 2).
    drop(kb.try_acquire(&0).unwrap());
    tick();
    // Half full from here on: keys going idle read the clock.
    for key in 3..8 {
        drop(kb.try_acquire(&key).unwrap());
        tick();
    }
    let evicted_by = |key: u32| {
        let before: HashSet<u32> = kb.keys().into_iter().collect();
        drop(kb.try_acquire(&key).unwrap());
        let after: HashSet<u32> = kb.keys().into_iter().collect();
        let gone: Vec<u32> = before.difference(&after).copied().collect();
        assert_eq!(gone.len(), 1, "{gone:?}");
        gone[0]
    };
    assert_eq!(evicted_by(100), 1);
    let next_two: HashSet<u32> = [evicted_by(101), evicted_by(102)].into();
    assert_eq!(next_two, [0, 2].into());
    assert_eq!(evicted_by(103), 3);
    assert_eq!(evicted_by(104), 4);
}

/// Below half full, a key whose last user leaves while it is still linked
/// in the idle order keeps its place without the order's lock; a cleaner
/// (`evict_idle`) that unlinks it because it saw it busy races with that.
/// Whatever the interleaving, once every call has ended every key is idle
/// and linked: `evict_idle` takes all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn below_half_full_every_key_is_evictable_once_idle_under_churn() {
    const KEYS: u64 = 16;
    const TASKS: u64 = 16;
    const ROUNDS: usize = 1_000;
    let kb = KeyedBulkhead::<u64>::builder()
        .max_concurrent_calls(2)
        .max_keys(10_000)
        .build()
        .unwrap();
    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sweeper = {
        let (kb, sweeping) = (kb.clone(), sweeping.clone());
        tokio::spawn(async move {
            while sweeping.load(Ordering::Relaxed) {
                kb.evict_idle();
                tokio::task::yield_now().await;
            }
        })
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let kb = kb.clone();
            tokio::spawn(async move {
                let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (task + 1);
                for _ in 0..ROUNDS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let yields = rng % 3;
                    let done = kb
                        .call(&((rng >> 8) % KEYS), async {
                            for _ in 0..yields {
                                tokio::task::yield_now().await;
                            }
                            Ok::<_, ()>(())
                        })
                        .await;
                    assert!(matches!(done, Ok(()) | Err(KeyedError::Rejected(_))));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    sweeping.store(false, Ordering::Relaxed);
    sweeper.await.unwrap();
    let s = kb.stats();
    assert!(s.keys_evicted() > 0 && s.keys_created() > KEYS, "{s:?}");
    kb.evict_idle();
    assert_eq!(kb.keys(), [], "an idle key was left out of the order");
}

/// A timer of the user's, counting the sleeps it is asked for.
#[derive(Debug, Default)]
struct CountingTimer(AtomicUsize);

impl watertight::timer::Timer for CountingTimer {
    fn sleep(&self, duration: Duration) -> watertight::timer::Sleep {
        self.0.fetch_add(1, Ordering::SeqCst);
        watertight::timer::ThreadTimer::new().sleep(duration)
    }
}

fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    fut.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// `call_timeout` and the `max_wait` budget arm a timer only once
/// something waits: a call that is admitted at once and finishes on its
/// first poll makes no sleep at all.
#[test]
fn timers_are_armed_only_when_something_waits() {
    let timer = Arc::new(CountingTimer::default());
    let kb = KeyedBulkhead::<u32>::builder()
        .max_concurrent_calls(1)
        .global_limit(1)
        .max_wait(Duration::from_secs(10))
        .call_timeout(Duration::from_secs(10))
        .timer(timer.clone())
        .build()
        .unwrap();
    let sleeps = || timer.0.load(Ordering::SeqCst);
    let ready = |n| kb.call(&1, async move { Ok::<_, ()>(n) });
    for n in 0..3 {
        assert_eq!(poll_once(pin!(ready(n))), std::task::Poll::Ready(Ok(n)));
    }
    assert_eq!(sleeps(), 0, "nothing waited");

    // Pending once: the call's deadline is armed.
    let mut yielded = false;
    let mut slow = pin!(kb.call(
        &1,
        std::future::poll_fn(|cx| {
            if std::mem::replace(&mut yielded, true) {
                return std::task::Poll::Ready(Ok::<_, ()>(()));
            }
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        })
    ));
    assert!(poll_once(slow.as_mut()).is_pending());
    assert_eq!(poll_once(slow), std::task::Poll::Ready(Ok(())));
    assert_eq!(sleeps(), 1, "the call timeout, once the call waited");

    // Waiting for the global permit: the budget's deadline.
    let held = kb.try_acquire(&2).unwrap();
    let mut waiting = pin!(ready(4));
    assert!(poll_once(waiting.as_mut()).is_pending());
    assert_eq!(sleeps(), 2);
    drop(held);
    assert_eq!(poll_once(waiting), std::task::Poll::Ready(Ok(4)));

    // Waiting for the key: its bulkhead's own `max_wait`.
    let held = kb.try_acquire(&1).unwrap();
    let mut waiting = pin!(ready(5));
    assert!(poll_once(waiting.as_mut()).is_pending());
    assert_eq!(sleeps(), 3);
    drop(held);
    assert_eq!(poll_once(waiting), std::task::Poll::Ready(Ok(5)));
    assert_eq!(sleeps(), 3, "the global permit was free");
}

/// A tokio runtime without a time driver: building a keyed bulkhead with
/// a time limit inside it fails; one built elsewhere turns away, with
/// `Unavailable`, a new key it cannot make a bulkhead for there, a wait it
/// cannot bound, and a call whose `call_timeout` it cannot arm (dropping
/// the call), rather than panic or wait unbounded.
#[cfg(feature = "tokio")]
#[test]
fn a_runtime_without_a_time_driver_is_a_build_error_or_unavailable() {
    let timeless = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let built_inside = timeless.block_on(async {
        KeyedBulkhead::<String>::builder()
            .max_concurrent_calls(1)
            .max_wait(Duration::from_secs(1))
            .build()
    });
    assert_eq!(
        built_inside.unwrap_err().kind(),
        BuildErrorKind::TimerUnavailable
    );

    let kb = KeyedBulkhead::<String>::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::from_secs(1))
        .call_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let held = kb.try_acquire("a").unwrap();
    drop(kb.try_acquire("c").unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    timeless.block_on(async {
        let new_key = kb.call("b", async { Ok::<_, ()>(()) }).await;
        let waited = kb.call("a", async { Ok::<_, ()>(()) }).await;
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let counted = Counted(dropped.clone());
        let unbounded = kb
            .call("c", async move {
                let _counted = counted;
                std::future::pending::<()>().await;
                Ok::<_, ()>(())
            })
            .await;
        for out in [new_key, waited, unbounded] {
            match out {
                Err(KeyedError::Rejected(r)) => {
                    assert_eq!(r.reason(), KeyedRejectReason::Unavailable);
                    assert!(r.to_string().contains("timer is not running"), "{r}");
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
    });
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the unbounded call was dropped"
    );
    drop(held);
    for key in ["a", "c"] {
        assert_eq!(kb.metrics_for(key).unwrap().in_flight(), 0);
    }
    assert!(kb.metrics_for("b").is_none());
}
