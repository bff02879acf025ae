//! The Redis semaphore on the primary that Redis Sentinel names: a primary,
//! a replica and one Sentinel on loopback, started per test
//! (`tests/common/redis_server.rs`, `SentinelSet`), and failovers.
#![cfg(all(not(loom), feature = "redis-sentinel", feature = "tokio"))]

mod common;
#[path = "common/failover_load.rs"]
mod failover_load;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use failover_load::Load;
use redis_server::{SERVICE, SentinelSet};
use watertight::redis::{Backend, ConfigError, LeaseError, RedisSemaphore, ReleaseError};

fn backend(set: &SentinelSet) -> Backend {
    Backend::sentinel(vec![set.sentinel_url()], SERVICE, None).unwrap()
}

/// A semaphore on the set's primary, without the quarantine: these tests
/// time how fast the semaphore follows
/// a failover, and after `SENTINEL FAILOVER` the old primary goes on
/// granting for a moment, grants the new one never sees; a client that was
/// granted one finds the new primary's fence counter behind it, and the
/// quarantine then holds every grant for a lease time to live (10 s here),
/// as it should (`tests/redis_faults.rs` tests the quarantine itself).
async fn semaphore(set: &SentinelSet, name: &str, limit: usize) -> RedisSemaphore {
    RedisSemaphore::builder(backend(set), name)
        .quarantine(false)
        .limit(limit)
        .lease_ttl(Duration::from_secs(10))
        .max_poll(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(500))
        .outage_tolerance(Duration::from_secs(15))
        .build()
        .await
        .unwrap()
}

/// How many leases of `name` the server on `port` of the set holds.
fn leases_on(set: &SentinelSet, port: u16, name: &str) -> i64 {
    set.server(port)
        .cmd(&["ZCARD", &format!("bulkhead:{{{name}}}:leases")])
}

/// Waits for a release on `holder` to wake `waiter` (both limit 1, one
/// permit held by `holder`) and returns how long the wake-up took.
async fn wake_latency(holder: &RedisSemaphore, waiter: &RedisSemaphore) -> Duration {
    let held = holder.acquire().await.unwrap();
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let permit = waiter.acquire().await.unwrap();
            (Instant::now(), permit)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "the waiter waits");
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, permit) = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter is woken long before max_poll")
        .unwrap();
    permit.release().await.unwrap();
    granted - released
}

/// The semaphore works on the primary Sentinel names: grants stop at the
/// limit, the leases are on the primary, and a release on one client wakes
/// a waiter on another through pub/sub (`max_poll` is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_wake_ups_on_the_primary_sentinel_names() {
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let sem = semaphore(&set, "api", 2).await;
    let a = sem.acquire().await.unwrap();
    let b = sem.try_acquire().await.unwrap();
    assert!(b.fence() > a.fence());
    assert!(matches!(
        sem.try_acquire().await,
        Err(LeaseError::NoPermits { limit: 2, .. })
    ));
    assert_eq!(leases_on(&set, set.primary_port(), "api"), 2);
    a.release().await.unwrap();
    b.release().await.unwrap();

    let holder = semaphore(&set, "one", 1).await;
    let waiter = semaphore(&set, "one", 1).await;
    let latency = wake_latency(&holder, &waiter).await;
    eprintln!("sentinel wake-up latency: {latency:?}");
    assert!(latency < Duration::from_millis(500), "{latency:?}");
}

/// `SENTINEL FAILOVER` promotes the replica: the semaphore follows it
/// (acquire and release work again, the new leases are on the new
/// primary), and the subscription follows too (a release wakes a waiter
/// through pub/sub on the new primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_to_the_new_primary() {
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let holder = semaphore(&set, "jobs", 1).await;
    let waiter = semaphore(&set, "jobs", 1).await;
    let old = set.primary_port();
    holder.acquire().await.unwrap().release().await.unwrap();

    let start = Instant::now();
    let ok: String = set.sentinel().cmd(&["SENTINEL", "FAILOVER", SERVICE]);
    assert_eq!(ok, "OK");
    let new = tokio::task::block_in_place(|| set.wait_new_primary(old, Duration::from_secs(15)))
        .expect("sentinel promotes the replica");
    let promoted = start.elapsed();
    // Acquire and release, as a caller would, until the lease lands on the
    // new primary (the old one takes writes until Sentinel demotes it: the
    // semaphore must move by itself, on Sentinel's `+switch-master`).
    let back = loop {
        let permit = holder.acquire().await.unwrap();
        let on_new = leases_on(&set, new, "jobs") == 1;
        released(permit.release().await, on_new);
        if on_new {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still on the old primary"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("SENTINEL FAILOVER: promoted after {promoted:?}, granting on it after {back:?}");
    assert!(back < promoted + Duration::from_secs(1), "{back:?}");

    // Both subscriptions move to the new primary.
    let moved = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(5), || {
            redis_server::wake_subscribers(set.server(new), "jobs", false) == 2
        })
    });
    assert!(moved, "both clients subscribe on the new primary");
    let latency = wake_latency(&holder, &waiter).await;
    assert!(latency < Duration::from_millis(500), "{latency:?}");
}

/// A primary killed outright is replaced by Sentinel once it is declared
/// down (500 ms here): a waiting acquire rides out the outage and is granted
/// on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced() {
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let sem = semaphore(&set, "batch", 1).await;
    sem.acquire().await.unwrap().release().await.unwrap();
    let old = set.primary_port();
    // The release reached the replica (replication is asynchronous: a
    // failover can lose it, and the lease would hold until its TTL).
    let _acked: i64 = set.server(old).cmd(&["WAIT", "1", "2000"]);
    let start = Instant::now();
    set.server(old).stop();
    let acquire = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    tokio::task::block_in_place(|| set.wait_new_primary(old, Duration::from_secs(15)))
        .expect("sentinel promotes the replica");
    let promoted = start.elapsed();
    let permit = tokio::time::timeout(Duration::from_secs(20), acquire)
        .await
        .expect("granted within the outage tolerance")
        .unwrap()
        .unwrap();
    let back = start.elapsed();
    eprintln!("primary killed: promoted after {promoted:?}");
    let new = set.primary_port();
    assert_ne!(new, old);
    assert_eq!(leases_on(&set, new, "batch"), 1);
    permit.release().await.unwrap();
    eprintln!("primary killed: granting again after {back:?}");
    assert!(back < promoted + Duration::from_secs(1), "{back:?}");
}

/// A Sentinel client for replicas is refused: the semaphore must write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_for_replicas_is_refused() {
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let replicas = redis::sentinel::SentinelClient::build(
        vec![set.sentinel_url()],
        SERVICE.to_owned(),
        None,
        redis::sentinel::SentinelServerType::Replica,
    )
    .unwrap();
    let built = RedisSemaphore::builder(Backend::from_sentinel_client(replicas), "api")
        .build()
        .await;
    assert!(matches!(built, Err(ConfigError::NotPrimary)), "{built:?}");
}

/// A backend of any kind, and the builder holding it, can move between
/// threads (a builder is often made on one task and built on another).
#[test]
fn backends_and_builders_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let backend = Backend::sentinel(vec!["redis://127.0.0.1:1/"], SERVICE, None).unwrap();
    send_sync(&backend);
    send_sync(&RedisSemaphore::builder(backend, "api"));
    send_sync(&Backend::from(
        redis::Client::open("redis://127.0.0.1:1/").unwrap(),
    ));
}

/// Outside any tokio runtime the Sentinel backend runs on smol, failover
/// included (its questions to Sentinel and its watcher are smol tasks).
#[cfg(feature = "smol")]
#[test]
fn works_on_smol_outside_tokio() {
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let set = std::sync::Arc::new(set);
    let worker = std::thread::spawn({
        let set = set.clone();
        move || {
            smol::block_on(async move {
                assert!(tokio::runtime::Handle::try_current().is_err());
                let sem = RedisSemaphore::builder(backend(&set), "smol")
                    .quarantine(false) // as `semaphore` says
                    .max_poll(Duration::from_secs(30))
                    .build()
                    .await
                    .unwrap();
                sem.acquire().await.unwrap().release().await.unwrap();
                let old = set.primary_port();
                let ok: String = set.sentinel().cmd(&["SENTINEL", "FAILOVER", SERVICE]);
                assert_eq!(ok, "OK");
                let new = set
                    .wait_new_primary(old, Duration::from_secs(15))
                    .expect("sentinel promotes the replica");
                let start = Instant::now();
                loop {
                    let permit = sem.acquire().await.unwrap();
                    let on_new = leases_on(&set, new, "smol") == 1;
                    released(permit.release().await, on_new);
                    if on_new {
                        break;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "still on the old primary"
                    );
                    smol::Timer::after(Duration::from_millis(10)).await;
                }
            });
        }
    });
    worker.join().unwrap();
}

/// A release during the switch: a lease granted by the old primary is not
/// on the new one, so releasing it there finds nothing (`Overrun`): the
/// failover lost it, which is what a failover without quarantine does. A
/// lease the new primary granted must be released cleanly.
fn released(result: Result<(), ReleaseError>, on_new: bool) {
    match result {
        Ok(()) => {}
        Err(ReleaseError::Overrun { .. }) if !on_new => {}
        Err(e) => panic!("release failed (lease on the new primary: {on_new}): {e:?}"),
    }
}

/// `replicas(n, …)` with Sentinel: the `WAIT` runs on the primary, on the
/// grants' own connection. With the set's one replica, `n = 1` grants and
/// the replica has the lease when the grant is returned; `n = 2` gets
/// `NotReplicated { acked: 1, wanted: 2 }` and the grant is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_the_primarys_replicas() {
    // Long enough for a replica of a loaded machine to ack (`WAIT` returns
    // as soon as it does); short where the test waits for it to run out.
    const WAIT: Duration = Duration::from_secs(2);
    const SHORT: Duration = Duration::from_millis(200);
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let build = |n: usize, wait: Duration| {
        RedisSemaphore::builder(backend(&set), "replicated")
            .limit(2)
            .replicas(n, wait)
            .build()
    };
    let one = build(1, WAIT).await.unwrap();
    let primary = set.primary_port();
    let replica = set.servers().iter().find(|s| s.port() != primary).unwrap();
    for _ in 0..5 {
        let permit = one.try_acquire().await.unwrap();
        let on_replica: i64 = replica.cmd(&["ZCARD", "bulkhead:{replicated}:leases"]);
        assert_eq!(on_replica, 1, "the replica has the grant");
        permit.release().await.unwrap();
    }
    let two = build(2, SHORT).await.unwrap();
    let start = Instant::now();
    let got = two.try_acquire().await;
    assert!(
        matches!(
            got,
            Err(LeaseError::NotReplicated {
                acked: 1,
                wanted: 2
            })
        ),
        "{got:?}"
    );
    assert!(start.elapsed() >= SHORT, "WAIT waited its timeout");
    let released = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(5), || {
            leases_on(&set, primary, "replicated") == 0
        })
    });
    assert!(released, "the refused grant is released");
    // The shared connection was never held up: a grant without `WAIT`
    // meanwhile is at once.
    one.try_acquire().await.unwrap().release().await.unwrap();
}

/// Three Sentinels with a quorum of 2 watch a primary and its replica; the
/// primary is killed while two clients' tasks take and give back its two
/// permits in a loop. The Sentinels agree it is down, elect a leader, which
/// promotes the replica; the clients follow it, see the promotion (the new
/// primary's `master_replid2` is the old one's id) and quarantine, and
/// grants resume once the quarantine ends. Never more than two holders at
/// once (counted apart from Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sentinels_elect_a_new_primary_and_the_limit_holds() {
    const LIMIT: usize = 2;
    const TTL: Duration = Duration::from_millis(1_500);
    let Some(set) = SentinelSet::start_with_or_skip(3, 2, 300) else {
        return;
    };
    let urls: Vec<String> = set.sentinels().iter().map(|s| s.url()).collect();
    let mut load = Load::default();
    for _client in 0..2 {
        let sem = RedisSemaphore::builder(
            Backend::sentinel(urls.clone(), SERVICE, None).unwrap(),
            "quorum",
        )
        .limit(LIMIT)
        .lease_ttl(TTL)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
        for _task in 0..2 {
            load.spawn(sem.clone());
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(load.grants() > 0, "granting before the kill");
    let old = set.primary_port();
    let killed = Instant::now();
    set.server(old).stop();
    let new = tokio::task::block_in_place(|| set.wait_new_primary(old, Duration::from_secs(15)))
        .expect("the sentinels elect and promote the replica");
    let elected = killed.elapsed();
    let seen = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(10), || load.first_refusal().is_some())
    });
    let seen = seen.then(|| load.first_refusal().unwrap() - killed);
    let after = load.grants();
    let resumed = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(10), || load.grants() > after + 3)
    });
    let resumed_at = killed.elapsed();
    load.stop().await;
    let after_kill = load.before_refusal(killed);
    eprintln!("grants after the kill, before the first refusal: {after_kill:?}");
    // No new primary before `down-after-milliseconds` (300 ms): a grant
    // asked for in the first 200 ms may be the old one's last. (Asked for,
    // not answered: an answer read late by a descheduled task says nothing
    // of which primary granted it.)
    let early = after_kill
        .iter()
        .filter(|&&t| t > Duration::from_millis(200))
        .count();
    eprintln!(
        "3 sentinels, primary killed: new primary named after {elected:?}, quarantine seen \
         after {seen:?}, granting again by {resumed_at:?}; {early} grants on the new primary \
         before it"
    );
    assert!(seen.is_some());
    assert_eq!(
        early, 0,
        "the client checks the new primary before its first call"
    );
    assert!(resumed, "grants resumed on the new primary");
    assert!(load.max_held() <= LIMIT, "max {}", load.max_held());
    assert!(
        set.server(new)
            .cmd::<bool>(&["EXISTS", "bulkhead:{quorum}:epoch"]),
        "the new primary has the marker"
    );
}
