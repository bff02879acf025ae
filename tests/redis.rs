//! The Redis semaphore and bulkhead against a real `redis-server`, started
//! per test on a free loopback port with persistence off.
#![cfg(all(not(loom), feature = "redis", feature = "tokio"))]

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::error::Error;
use std::time::Duration;

use redis_server::RedisServer;
use watertight::RejectReason;
use watertight::redis::{ConfigError, LeaseError, RedisBulkhead, RedisSemaphore, ReleaseError};

async fn semaphore(server: &RedisServer, name: &str, limit: usize, ttl_ms: u64) -> RedisSemaphore {
    let client = redis::Client::open(server.url()).unwrap();
    RedisSemaphore::builder(client, name)
        .limit(limit)
        .lease_ttl(Duration::from_millis(ttl_ms))
        .max_poll(Duration::from_millis(200))
        .build()
        .await
        .unwrap()
}

/// Grants stop at the limit, fences increase, a release frees a permit and
/// wakes a waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_up_to_the_limit_with_increasing_fences() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = semaphore(&server, "api", 2, 5_000).await;
    let a = sem.acquire().await.unwrap();
    let b = sem.try_acquire().await.unwrap();
    assert!(b.fence() > a.fence());
    match sem.try_acquire().await {
        Err(LeaseError::NoPermits { retry_after, limit }) => {
            assert_eq!(limit, 2);
            let hint = retry_after.expect("leases are held");
            assert!(
                hint <= Duration::from_millis(5_000) && hint > Duration::from_millis(3_000),
                "{hint:?}"
            );
        }
        other => panic!("expected NoPermits, got {other:?}"),
    }
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 2);
    // Earliest deadline first; two grants in the same millisecond tie, so
    // compare the fences as a set.
    let mut fences: Vec<u64> = holders.iter().map(|h| h.fence).collect();
    fences.sort_unstable();
    assert_eq!(fences, vec![a.fence(), b.fence()]);
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|p| p.fence()) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    let fence_b = b.fence();
    b.release().await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(c > fence_b);
    drop(a);
}

/// A dropped permit is released at once in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_is_released() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = semaphore(&server, "drop", 1, 30_000).await;
    drop(sem.acquire().await.unwrap());
    let again = tokio::time::timeout(Duration::from_secs(2), sem.acquire())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sem.holders().await.unwrap().len(), 1);
    again.release().await.unwrap();
    assert!(sem.holders().await.unwrap().is_empty());
}

/// A permit dropped just before its process ends its runtime is released
/// only if the process waits for it: `wait_released` does.
#[test]
fn wait_released_gives_back_what_was_dropped_before_the_runtime_ends() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (waited, not_waited) = rt.block_on(async {
        let sem = semaphore(&server, "shutdown", 2, 30_000).await;
        let a = sem.acquire().await.unwrap();
        let b = sem.acquire().await.unwrap();
        let ids = (a.id().to_owned(), b.id().to_owned());
        drop(a);
        sem.wait_released().await;
        // Its release is a task that this runtime drops unrun.
        drop(b);
        ids
    });
    drop(rt);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let holders: Vec<String> = rt.block_on(async {
        let sem = semaphore(&server, "shutdown", 2, 30_000).await;
        sem.holders()
            .await
            .unwrap()
            .into_iter()
            .map(|h| h.id)
            .collect()
    });
    assert!(!holders.contains(&waited), "waited for: released");
    assert!(
        holders.contains(&not_waited),
        "not waited for: held until it expires"
    );
}

/// A lease that expired before release is reported as an overrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_reports_the_overrun() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let client = redis::Client::open(server.url()).unwrap();
    let sem = RedisSemaphore::builder(client, "late")
        .limit(1)
        .lease_ttl(Duration::from_millis(300))
        // Under the 290 ms the default drift margin (10 ms) leaves.
        .renew_every(Duration::from_millis(280))
        .build()
        .await
        .unwrap();
    let permit = sem.acquire().await.unwrap();
    server.pause(Duration::from_millis(400)); // DEBUG SLEEP: renewals can't land
    let lost = tokio::time::timeout(Duration::from_secs(3), permit.lost()).await;
    assert!(lost.is_ok(), "the loss was not noticed");
    assert!(matches!(
        permit.release().await,
        Err(ReleaseError::Overrun { .. })
    ));
}

/// The bulkhead policy over Redis: fail fast reports Full, a limit change
/// reaches another client, an unreachable Redis rejects as Unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulkhead_policy_over_redis() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let one = RedisBulkhead::builder(semaphore(&server, "bh", 1, 5_000).await)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let other = RedisBulkhead::builder(semaphore(&server, "bh", 1, 5_000).await)
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let held = one.acquire().await.unwrap();
    assert_eq!(
        one.try_acquire().await.unwrap_err().reason(),
        RejectReason::Full
    );
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.call(async { Ok::<_, ()>(7) }).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    one.set_max_concurrent_calls(2).await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        7
    );
    assert_eq!(other.metrics().max_concurrent_calls(), 2);
    assert_eq!(one.metrics().in_flight(), 1);
    drop(held);
    server.stop();
    let r = one.call(async { Ok::<_, ()>(()) }).await.unwrap_err();
    assert_eq!(r.rejected().unwrap().reason(), RejectReason::Unavailable);
    // The error behind it, through the call's error.
    let behind = std::error::Error::source(r.rejected().unwrap())
        .and_then(|e| e.downcast_ref::<LeaseError>());
    assert!(
        matches!(behind, Some(LeaseError::Unavailable(e)) if e.is_io_error()),
        "{behind:?}"
    );
    assert_eq!(one.metrics().rejected_unavailable(), 1);
}

/// A caller of the bulkhead that finds every permit leased waits from its
/// first attempt, which puts it in the fair line: that call and the
/// holder's release, which grants it the permit, are the only script calls
/// (the grant reaches the waiter as a message: no second attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_bulkhead_caller_is_granted_in_two_script_calls() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let holder = semaphore(&server, "twice", 1, 30_000).await;
    // No poll within the test: only pub/sub can wake the waiter.
    let polls_rarely = RedisSemaphore::builder(redis::Client::open(server.url()).unwrap(), "twice")
        .limit(1)
        .lease_ttl(Duration::from_secs(30))
        .max_poll(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let waiter = RedisBulkhead::builder(polls_rarely)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let held = holder.acquire().await.unwrap();
    // Let the waiter's subscription settle: (re)subscribing wakes every
    // waiter once, since messages may have been missed before it. Both
    // handles' subscriptions are made in the background: waited for in
    // Redis (a fixed sleep let a loaded machine subscribe after the
    // waiter joined the line: one more attempt), then a moment for the
    // subscriber to take in Redis's confirmation.
    let subscribed = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(10), || {
            redis_server::wake_subscribers(&server, "twice", false) == 2
        })
    });
    assert!(subscribed, "both handles subscribe");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.script_calls();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await }
    });
    // Wait until the waiter is in line (its first attempt was answered).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while waiter.metrics().queued() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(waiter.metrics().queued(), 1);
    let fence = held.fence();
    held.release().await.unwrap(); // one script call
    let granted = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(granted.fence() > fence);
    // The busy attempt and the release (counted while the permit is still
    // held: dropping it is one more).
    let calls = server.script_calls() - before;
    assert!(
        calls == 2,
        "{calls} script calls: {}",
        server.cmd::<String>(&["INFO", "commandstats"])
    );
    drop(granted);
}

/// A first connection that fails is `ConfigError::Connect`: its message is
/// its own, and the redis crate's error is its source. Needs no server.
#[tokio::test]
async fn a_connect_error_returns_the_redis_error_from_source() {
    // Nothing listens on a port that was free a moment ago.
    let url = format!("redis://127.0.0.1:{}/", redis_server::free_port());
    let client = redis::Client::open(url).unwrap();
    let err = RedisSemaphore::builder(client, "nowhere")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, ConfigError::Connect(_)), "{err:?}");
    let chain = common::error_chain(&err, 1);
    assert_eq!(chain[0], "could not connect to redis", "{chain:?}");
    assert!(err.source().unwrap().is::<redis::RedisError>());
}

/// With the server gone, an acquire is `LeaseError::Unavailable` and a
/// release `ReleaseError::Unavailable`: messages of their own, the redis
/// crate's error as the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_errors_return_the_redis_error_from_source() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = semaphore(&server, "gone", 2, 30_000).await;
    let held = sem.acquire().await.unwrap();
    server.stop();

    let lease = sem.try_acquire().await.unwrap_err();
    assert!(matches!(lease, LeaseError::Unavailable(_)), "{lease:?}");
    let chain = common::error_chain(&lease, 1);
    assert_eq!(
        chain[0], "redis is unavailable, no permit granted",
        "{chain:?}"
    );
    assert!(lease.source().unwrap().is::<redis::RedisError>());

    let release = held.release().await.unwrap_err();
    assert!(
        matches!(release, ReleaseError::Unavailable(_)),
        "{release:?}"
    );
    let chain = common::error_chain(&release, 1);
    assert_eq!(
        chain[0], "redis is unavailable, lease not released",
        "{chain:?}"
    );
    assert!(release.source().unwrap().is::<redis::RedisError>());
}

/// A key prefix is checked as the name is: a brace in it would make the
/// name no longer the keys' hash tag (with `x{}`, Redis Cluster hashes each
/// key of one semaphore to a slot of its own). Checked before connecting,
/// so it needs no server.
#[tokio::test]
async fn a_key_prefix_with_braces_or_empty_is_refused() {
    let url = format!("redis://127.0.0.1:{}/", redis_server::free_port());
    for prefix in ["x{}", "{}", "{a}", "a}", "", "{"] {
        let client = redis::Client::open(url.as_str()).unwrap();
        let err = RedisSemaphore::builder(client, "jobs")
            .key_prefix(prefix)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::BadKeyPrefix),
            "{prefix:?}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            "the key prefix must be non-empty and contain no '{' or '}'"
        );
    }
}

/// Every key a semaphore writes sits on one Cluster slot: by Redis
/// Cluster's rule (the part between the first `{` and the next `}`, if not
/// empty, is what is hashed), all of them hash the name alone, with a
/// custom prefix too. (`CLUSTER KEYSLOT` needs a server in cluster mode.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_semaphores_keys_share_one_cluster_slot() {
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let client = redis::Client::open(server.url()).unwrap();
    let sem = RedisSemaphore::builder(client, "slots")
        .key_prefix("app:v2")
        .limit(2)
        .build()
        .await
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.len() >= 2, "{keys:?}");
    for key in &keys {
        assert!(key.starts_with("app:v2:{slots}"), "{keys:?}");
        assert_eq!(hash_tag(key), "slots", "{key}");
    }
    // The rule itself, on the prefixes that used to be accepted.
    assert_eq!(hash_tag("x{}:{slots}:leases"), "x{}:{slots}:leases");
    drop(held);
}

/// The `metrics` exporter of a Redis bulkhead publishes the fleet's limit
/// as last read and this process's calls, and no free permits, which only
/// Redis knows.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "current_thread")]
async fn the_metrics_exporter_publishes_no_free_permits_of_the_fleet() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // This thread's: the current-thread runtime polls the calls here.
    let _local = metrics::set_default_local_recorder(&recorder);
    let bh = RedisBulkhead::builder(semaphore(&server, "exported", 3, 5_000).await)
        .build()
        .unwrap();
    bh.call(async { Ok::<_, ()>(()) }).await.unwrap();
    let gauges: std::collections::BTreeMap<String, f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        // The bulkhead's (the semaphore's own gauge, of its wake-ups,
        // is labelled `semaphore`).
        .filter(|(key, ..)| key.key().labels().any(|l| l.key() == "bulkhead"))
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(g) => Some((key.key().name().to_owned(), g.into_inner())),
            _ => None,
        })
        .collect();
    let expected = [
        ("bulkhead_calls_in_flight", 0.0),
        ("bulkhead_calls_waiting", 0.0),
        ("bulkhead_limit", 3.0),
    ];
    let expected: std::collections::BTreeMap<String, f64> = expected
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(gauges, expected);
}
