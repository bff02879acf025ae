//! The Redis semaphore on a real Redis Cluster of three primaries, started
//! per test on loopback (`tests/common/redis_server.rs`, `RedisCluster`).
#![cfg(all(not(loom), feature = "redis-cluster", feature = "tokio"))]

mod common;
#[path = "common/failover_load.rs"]
mod failover_load;
#[path = "common/redis_reconnect.rs"]
mod redis_reconnect;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use failover_load::Load;
use redis::cluster::ClusterClient;
use redis_server::RedisCluster;
use watertight::redis::{ConfigError, LeaseError, RedisBulkhead, RedisSemaphore};

/// Names whose slots fall on every one of the three primaries (checked by
/// `names_spread_over_every_primary`).
const NAMES: [&str; 8] = [
    "partner-api",
    "nightly",
    "billing",
    "search",
    "mailer",
    "thumbnails",
    "exports",
    "ledger",
];

/// A RESP3 cluster client (what sharded pub/sub needs).
fn client(cluster: &RedisCluster) -> ClusterClient {
    ClusterClient::new(cluster.urls("?protocol=3")).unwrap()
}

async fn semaphore(cluster: &RedisCluster, name: &str, limit: usize) -> RedisSemaphore {
    RedisSemaphore::builder(client(cluster), name)
        .limit(limit)
        .lease_ttl(Duration::from_secs(5))
        .max_poll(Duration::from_secs(30))
        .build()
        .await
        .unwrap()
}

fn leases_key(name: &str) -> String {
    format!("bulkhead:{{{name}}}:leases")
}

/// The names land on all three primaries, so the other tests exercise
/// every node (this is what failed before: names on the node the client
/// was given worked, the rest got `MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_spread_over_every_primary_and_each_grants_up_to_its_limit() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let owners: BTreeSet<u16> = NAMES
        .iter()
        .map(|name| cluster.owner(&leases_key(name)).port())
        .collect();
    assert_eq!(owners.len(), 3, "the names must cover every primary");
    for name in NAMES {
        let sem = semaphore(&cluster, name, 2).await;
        let a = sem.acquire().await.unwrap();
        let b = sem.try_acquire().await.unwrap();
        assert!(b.fence() > a.fence(), "{name}");
        match sem.try_acquire().await {
            Err(LeaseError::NoPermits { limit: 2, .. }) => {}
            other => panic!("{name}: expected NoPermits, got {other:?}"),
        }
        assert_eq!(sem.holders().await.unwrap().len(), 2, "{name}");
        a.release().await.unwrap();
        let c = sem.try_acquire().await.unwrap();
        assert!(c.fence() > b.fence(), "{name}");
        // The keys are where Cluster says the name's slot is.
        let owner = cluster.owner(&leases_key(name));
        let held: i64 = owner.cmd(&["ZCARD", &leases_key(name)]);
        assert_eq!(held, 2, "{name}: the leases are on the slot's node");
        b.release().await.unwrap();
        c.release().await.unwrap();
        sem.set_limit(3).await.unwrap();
        assert_eq!(sem.limit().await.unwrap(), 3, "{name}");
    }
}

/// Several clients (each its own cluster connection) and tasks on six
/// names at once: no name ever has more holders than its limit, and each
/// reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_across_clients_on_every_name() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    const LIMIT: usize = 2;
    let mut tasks = Vec::new();
    let mut counters = Vec::new();
    for name in &NAMES[..6] {
        let now = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        counters.push((name, max.clone()));
        for _client in 0..3 {
            let sem = semaphore(&cluster, name, LIMIT).await;
            for _task in 0..2 {
                let (sem, now, max) = (sem.clone(), now.clone(), max.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..4 {
                        let permit = sem.acquire().await.unwrap();
                        let here = now.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(here, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.unwrap();
                    }
                }));
            }
        }
    }
    let all = futures::future::join_all(tasks);
    for task in tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .unwrap()
    {
        task.unwrap();
    }
    for (name, max) in counters {
        assert_eq!(max.load(Ordering::SeqCst), LIMIT, "{name}");
    }
}

/// A waiter on one client is woken by a release on another through sharded
/// pub/sub on the slot's node, not by polling: `max_poll` is 30 s, and the
/// wake-up comes within milliseconds. The subscription sits on the node
/// that owns the name's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_on_another_client_through_sharded_pubsub() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let mut latencies = Vec::new();
    for name in &NAMES[..6] {
        let holder = semaphore(&cluster, name, 1).await;
        let waiter = semaphore(&cluster, name, 1).await;
        let channel = format!("bulkhead:{{{name}}}:wake");
        let owner = cluster.owner(&channel);
        assert_eq!(
            redis_server::wake_subscribers(owner, name, true),
            2,
            "{name}: both clients subscribe on the slot's node"
        );
        let held = holder.acquire().await.unwrap();
        let task = tokio::spawn(async move {
            let permit = waiter.acquire().await.unwrap();
            (Instant::now(), permit)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!task.is_finished(), "{name}: the waiter waits");
        let released = Instant::now();
        held.release().await.unwrap();
        let (granted, permit) = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the waiter is woken long before max_poll")
            .unwrap();
        latencies.push(granted - released);
        permit.release().await.unwrap();
    }
    latencies.sort();
    let worst = *latencies.last().unwrap();
    eprintln!("cluster wake-up latency after release: {latencies:?}");
    assert!(worst < Duration::from_millis(500), "{latencies:?}");
}

/// A lease with a 300 ms time to live, held for 1.5 s, is renewed on its
/// slot's node: it is not lost, nobody else gets it, and it is released in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_a_lease_alive_on_its_node() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let mut sems = Vec::new();
    for name in &NAMES[..3] {
        let build = |cluster: &RedisCluster| {
            RedisSemaphore::builder(client(cluster), *name)
                .limit(1)
                .lease_ttl(Duration::from_millis(300))
                .build()
        };
        sems.push((
            build(&cluster).await.unwrap(),
            build(&cluster).await.unwrap(),
        ));
    }
    let mut held = Vec::new();
    for (sem, _) in &sems {
        held.push(sem.acquire().await.unwrap());
    }
    let end = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < end {
        for (_, other) in &sems {
            assert!(matches!(
                other.try_acquire().await,
                Err(LeaseError::NoPermits { .. })
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for permit in held {
        assert!(!permit.is_lost());
        permit.release().await.expect("released in time");
    }
}

/// A cluster client without RESP3 cannot receive sharded pushes: `build`
/// says so, and with `pubsub(false)` the semaphore works (polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp2_cluster_client_needs_pubsub_off() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let resp2 = || ClusterClient::new(cluster.urls("")).unwrap();
    match RedisSemaphore::builder(resp2(), "nightly").build().await {
        Err(ConfigError::NeedsResp3(_)) => {}
        other => panic!("expected NeedsResp3, got {other:?}"),
    }
    let sem = RedisSemaphore::builder(resp2(), "nightly")
        .pubsub(false)
        .max_poll(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let bulkhead = RedisBulkhead::builder(sem.clone())
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let permit = bulkhead.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|p| p.fence()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(permit);
    let fence = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(fence >= 2);
}

/// Killing the connections of the node that holds the subscription (every
/// client of it, as a restart would) makes the subscriber subscribe again:
/// a later release still wakes a waiter through pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscription_is_made_again() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let name = NAMES[1];
    let holder = semaphore(&cluster, name, 1).await;
    let waiter = semaphore(&cluster, name, 1).await;
    let channel = format!("bulkhead:{{{name}}}:wake");
    let owner = cluster.owner(&channel);
    let killed: i64 = owner.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed >= 2, "killed {killed}");
    let subscribed = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(5), || {
            redis_server::wake_subscribers(owner, name, true) == 2
        })
    });
    assert!(subscribed, "both clients subscribe again");
    let held = holder.acquire().await.unwrap();
    let task = tokio::spawn(async move { waiter.acquire().await.map(|p| p.fence()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_millis(500));
}

/// A cluster backend, and the builder holding it, can move between threads.
#[test]
fn a_cluster_backend_is_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let client = ClusterClient::new(["redis://127.0.0.1:1/?protocol=3"]).unwrap();
    let backend = watertight::redis::Backend::from(client);
    send_sync(&backend);
    send_sync(&RedisSemaphore::builder(backend, "api"));
}

/// Moves the slot of `name` from its owner to another primary, keys and
/// all, as a resharding does (`MIGRATING`/`IMPORTING`, `MIGRATE`, then
/// `SETSLOT … NODE` on every node). Returns the new owner's port.
fn move_slot(cluster: &RedisCluster, name: &str) -> u16 {
    let key = leases_key(name);
    let slot = cluster.slot(&key).to_string();
    let src = cluster.owner(&key);
    // (Primaries only: a replica refuses `SETSLOT`, and learns of the move
    // from its primary.)
    let primaries: Vec<_> = cluster
        .nodes()
        .iter()
        .filter(|n| {
            n.cmd::<Vec<redis::Value>>(&["ROLE"]).first()
                == Some(&redis::Value::BulkString(b"master".to_vec()))
        })
        .collect();
    let dst = primaries.iter().find(|n| n.port() != src.port()).unwrap();
    let src_id: String = src.cmd(&["CLUSTER", "MYID"]);
    let dst_id: String = dst.cmd(&["CLUSTER", "MYID"]);
    let _: String = dst.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
    let _: String = src.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    let keys: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
    if !keys.is_empty() {
        let port = dst.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let _: String = src.cmd(&args);
    }
    for node in &primaries {
        let _: String = node.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    }
    dst.port()
}

/// A resharding moves a name's slot to another primary: script calls
/// follow `MOVED`, the leases moved with the keys, and the subscription
/// follows the slot (the old node drops it with `sunsubscribe`, the
/// semaphore subscribes again and is routed to the new owner), so a release
/// still wakes a waiter through pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_is_followed_by_scripts_and_the_subscription() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let name = NAMES[2];
    let holder = semaphore(&cluster, name, 2).await;
    let waiter = semaphore(&cluster, name, 2).await;
    let kept = holder.acquire().await.unwrap();
    let new = move_slot(&cluster, name);
    assert_eq!(cluster.owner(&leases_key(name)).port(), new);
    // The lease moved with the keys; the second permit is granted there.
    // (Only the holder calls: the waiter's connection has not heard of the
    // move from a `MOVED` when its subscription is checked below.)
    let held = holder.acquire().await.unwrap();
    assert!(held.fence() > kept.fence());
    assert!(matches!(
        holder.try_acquire().await,
        Err(LeaseError::NoPermits { limit: 2, .. })
    ));
    let channel = format!("bulkhead:{{{name}}}:wake");
    let owner = cluster.owner(&channel);
    let subscribed = tokio::task::block_in_place(|| {
        redis_server::eventually(Duration::from_secs(5), || {
            redis_server::wake_subscribers(owner, name, true) == 2
        })
    });
    assert!(subscribed, "both clients subscribe on the slot's new node");
    let task = tokio::spawn(async move { waiter.acquire().await.map(|p| p.fence()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished());
    let released = Instant::now();
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("woken through pub/sub, long before max_poll")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_millis(500));
    kept.release().await.unwrap();
}

/// Outside any tokio runtime the cluster backend runs on smol: the
/// cluster connection, renewals and sharded pub/sub wake-ups.
#[cfg(feature = "smol")]
#[test]
fn works_on_smol_outside_tokio() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let urls = cluster.urls("?protocol=3");
    let worker = std::thread::spawn(move || {
        smol::block_on(async move {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let make = || {
                RedisSemaphore::builder(ClusterClient::new(urls.clone()).unwrap(), "smol")
                    .limit(1)
                    .lease_ttl(Duration::from_millis(600))
                    .max_poll(Duration::from_secs(30))
                    .build()
            };
            let sem = make().await.unwrap();
            let other = make().await.unwrap();
            let permit = sem.acquire().await.unwrap();
            // Past the TTL: renewed by the keeper on smol.
            smol::Timer::after(Duration::from_millis(900)).await;
            assert!(!permit.is_lost(), "{:?}", permit.lost_reason());
            let waiter = smol::spawn(async move { other.acquire().await });
            smol::Timer::after(Duration::from_millis(100)).await;
            let released = Instant::now();
            permit.release().await.unwrap();
            let granted = waiter.await.unwrap();
            assert!(released.elapsed() < Duration::from_millis(500));
            granted.release().await.unwrap();
        });
    });
    worker.join().unwrap();
}

/// The fair line on a Cluster: three clients that join the line one after
/// the other are granted in that order, each grant reaching its waiter by
/// `SPUBLISH` on its own shard channel, and the 3 contended grants cost
/// two script calls each (the waiter's acquire and the release before it),
/// all on the node that owns the name's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_line_grants_in_arrival_order_at_two_script_calls_each() {
    let Some(cluster) = RedisCluster::start_or_skip(3) else {
        return;
    };
    let name = NAMES[2];
    let owner = cluster.owner(&leases_key(name));
    let queue = format!("bulkhead:{{{name}}}:queue");
    let holder = semaphore(&cluster, name, 1).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(semaphore(&cluster, name, 1).await);
    }
    let held = holder.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = owner.script_calls();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (n, sem) in clients.into_iter().enumerate() {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let permit = sem.acquire().await.unwrap();
            order.lock().unwrap().push(n);
            permit.release().await.unwrap();
        }));
        let deadline = Instant::now() + Duration::from_secs(5);
        while owner.cmd::<i64>(&["ZCARD", &queue]) != n as i64 + 1 {
            assert!(
                Instant::now() < deadline,
                "waiter {n} never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("granted through sharded pub/sub, long before max_poll")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    // 3 acquires that joined the line, the holder's release and the 3
    // waiters' releases (the last one granted nobody).
    assert_eq!(owner.script_calls() - before, 7);
}

// ---------------------------------------------------------------------------
// A cluster with replicas: promotions, WAIT
// ---------------------------------------------------------------------------

/// A cluster of three primaries with one replica each, whose nodes declare
/// a silent peer failed after 1 s (a forced failover then takes 1.5-3 s).
fn replicated_cluster() -> Option<RedisCluster> {
    RedisCluster::start_with_or_skip(
        3,
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            // A replica whose primary was just killed may always stand.
            "--cluster-replica-validity-factor",
            "0",
        ],
    )
}

/// The primary that owns `name`'s slot, and its replica.
fn owner_and_replica<'a>(
    cluster: &'a RedisCluster,
    name: &str,
) -> (u16, &'a redis_server::RedisServer) {
    let owner = cluster.owner(&leases_key(name)).port();
    let replicas = cluster.replicas_of(owner);
    assert_eq!(replicas.len(), 1, "one replica per primary");
    (owner, replicas[0])
}

/// Polls `check` every 5 ms (off the runtime's threads) until it holds or
/// `within` passes; the time it took, or `None`.
async fn time_until(within: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if tokio::task::block_in_place(&mut check) {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `CLUSTER FAILOVER` on the replica of a name's primary, with a client
/// that holds nothing and calls nothing meanwhile: its watch of the
/// replication id reads the old primary, now a replica, finds it demoted,
/// has the redis crate read the slot map again, and reads the new
/// primary's `master_replid2` (the old primary's id): the quarantine starts
/// within one `renew_every` of the switch, before the client's next
/// acquire, which is refused. (Before the fix, the watch kept asking the
/// demoted node, whose answer names no primary, and the first acquire
/// after the switch was granted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_quarantines_an_idle_client_within_one_renewal() {
    const TTL: Duration = Duration::from_millis(1_500);
    const RENEW: Duration = Duration::from_millis(400);
    let Some(cluster) = replicated_cluster() else {
        return;
    };
    let name = NAMES[0];
    let (old, replica) = owner_and_replica(&cluster, name);
    let sem = RedisSemaphore::builder(client(&cluster), name)
        .limit(2)
        .lease_ttl(TTL)
        .renew_every(RENEW)
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    sem.try_acquire().await.unwrap().release().await.unwrap();
    // The marker and the fence are on the replica before the switch (a
    // manual failover waits for it to catch up anyway).
    let _acked: i64 = cluster.node(old).cmd(&["WAIT", "1", "2000"]);
    let ok: String = replica.cmd(&["CLUSTER", "FAILOVER"]);
    assert_eq!(ok, "OK");
    let new = replica.port();
    let promoted = tokio::task::block_in_place(|| {
        cluster.wait_owner(&leases_key(name), new, Duration::from_secs(10))
    });
    assert!(promoted, "the replica took over the slot");
    let quarantine = format!("bulkhead:{{{name}}}:quarantine");
    let seen = time_until(Duration::from_secs(5), || {
        replica
            .try_cmd::<bool>(&["EXISTS", &quarantine])
            .unwrap_or(false)
    })
    .await;
    let seen = seen.expect("the idle client saw the promotion and started the quarantine");
    eprintln!(
        "CLUSTER FAILOVER: quarantine started {seen:?} after the switch (renew_every {RENEW:?})"
    );
    let got = sem.try_acquire().await;
    assert!(
        matches!(got, Err(LeaseError::Quarantined { .. })),
        "the first acquire after the switch is refused: {got:?}"
    );
    let role: redis::Value = cluster.node(old).cmd(&["ROLE"]);
    assert!(format!("{role:?}").contains("slave"), "{role:?}");
}

/// `CLUSTER FAILOVER` under three idle clients built before it (each with
/// its own cluster connection and its own watch of the replication id):
/// one quarantine. The first client refused after the switch waits out
/// what is left of it; then every client is granted at its first try once
/// it reaches the new primary (none starts a second quarantine), within
/// one time to live of that refusal (and the margin below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_promotion_is_one_quarantine_for_every_client() {
    const TTL: Duration = Duration::from_millis(1_500);
    let Some(cluster) = replicated_cluster() else {
        return;
    };
    let name = NAMES[1];
    let (old, replica) = owner_and_replica(&cluster, name);
    let mut clients = Vec::new();
    for _ in 0..3 {
        let sem = RedisSemaphore::builder(client(&cluster), name)
            .limit(3)
            .lease_ttl(TTL)
            .renew_every(Duration::from_millis(400))
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        sem.try_acquire().await.unwrap().release().await.unwrap();
        clients.push(sem);
    }
    let _acked: i64 = cluster.node(old).cmd(&["WAIT", "1", "2000"]);
    let ok: String = replica.cmd(&["CLUSTER", "FAILOVER"]);
    assert_eq!(ok, "OK");
    let promoted = tokio::task::block_in_place(|| {
        cluster.wait_owner(&leases_key(name), replica.port(), Duration::from_secs(10))
    });
    assert!(promoted, "the replica took over the slot");
    let switched = Instant::now();
    let retry_after =
        redis_reconnect::until_quarantined(&clients[0], Duration::from_secs(10)).await;
    let detected = switched.elapsed();
    assert!(retry_after <= TTL, "{retry_after:?}");
    tokio::time::sleep(retry_after).await;
    redis_reconnect::each_granted(&clients).await;
    let resumed = switched.elapsed();
    eprintln!(
        "CLUSTER FAILOVER, 3 clients: refused {detected:?} after the switch, \
         every client granted {resumed:?} after it (time to live {TTL:?})"
    );
    assert!(
        resumed <= detected + TTL + Duration::from_millis(500),
        "refused {detected:?} after the switch, all granted after {resumed:?}"
    );
}

/// A name's primary is killed outright (`SIGKILL`) while two clients' tasks
/// take and give back its two permits in a loop: its replica is elected
/// once the other primaries agree it failed, the clients follow the slot
/// there (`MOVED`, the slot map read again), see the promotion and
/// quarantine; never more than two holders at once (counted apart from
/// Redis), before, during and after the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_across_a_forced_cluster_failover() {
    const LIMIT: usize = 2;
    const TTL: Duration = Duration::from_millis(1_500);
    let Some(cluster) = replicated_cluster() else {
        return;
    };
    let name = NAMES[1];
    let (old, replica) = owner_and_replica(&cluster, name);
    let mut load = Load::default();
    for _client in 0..2 {
        let sem = RedisSemaphore::builder(client(&cluster), name)
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
    let before = load.grants();
    assert!(before > 0, "granting before the kill");
    let killed = Instant::now();
    cluster.node(old).stop();
    let new = replica.port();
    let promoted = tokio::task::block_in_place(|| {
        cluster.wait_owner(&leases_key(name), new, Duration::from_secs(15))
    });
    assert!(
        promoted,
        "the replica was elected in the killed primary's place"
    );
    let elected = killed.elapsed();
    let seen = time_until(Duration::from_secs(10), || load.first_refusal().is_some())
        .await
        .map(|_| load.first_refusal().unwrap() - killed);
    // The quarantine ends one time to live later, and grants resume on the
    // new primary.
    let after = load.grants();
    let resumed = time_until(Duration::from_secs(10), || load.grants() > after + 3).await;
    load.stop().await;
    // The old primary is dead: every grant after the kill is the new
    // one's. Those before the first refusal were made before the client
    // knew of the promotion.
    let after_kill = load.before_refusal(killed);
    eprintln!("grants after the kill, before the first refusal: {after_kill:?}");
    // No replica is elected before the node timeout (1 s) has passed: a
    // grant asked for in the first 500 ms may be the old primary's last.
    // (Asked for, not answered: an answer read late by a descheduled task
    // says nothing of which primary granted it.)
    let early = after_kill
        .iter()
        .filter(|&&t| t > Duration::from_millis(500))
        .count();
    eprintln!(
        "primary killed: replica elected after {elected:?}, quarantine seen after {seen:?}, \
         grants again {resumed:?} later; {early} grants on the new primary before it"
    );
    assert_eq!(
        early, 0,
        "clients that saw the outage check the new primary first"
    );
    assert!(resumed.is_some(), "grants resumed on the new primary");
    assert!(load.max_held() <= LIMIT, "max {}", load.max_held());
    let on_new: i64 = replica.cmd(&["EXISTS", &format!("bulkhead:{{{name}}}:epoch")]);
    assert_eq!(on_new, 1, "the new primary has the marker");
}

/// `replicas(n, …)` on a Cluster: the `WAIT` goes to the primary that owns
/// the name's slot, on the connection the acquire script ran on. With its
/// one replica, `n = 1` grants (and the replica has the lease when the
/// grant is returned), on names of every primary; `n = 2` is more than any
/// primary has: `NotReplicated { acked: 1, wanted: 2 }`, and the grant is
/// released. With the replica frozen, `n = 1` fails with `acked: 0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_the_slot_primarys_replicas() {
    // Long enough for a replica of a loaded machine to ack (`WAIT` returns
    // as soon as it does); short where the test waits for it to run out.
    const WAIT: Duration = Duration::from_secs(2);
    const SHORT: Duration = Duration::from_millis(200);
    let Some(cluster) = replicated_cluster() else {
        return;
    };
    let names = &NAMES[..3];
    let owners: BTreeSet<u16> = names
        .iter()
        .map(|n| cluster.owner(&leases_key(n)).port())
        .collect();
    for name in names {
        let (owner, replica) = owner_and_replica(&cluster, name);
        let one = RedisSemaphore::builder(client(&cluster), *name)
            .limit(2)
            .replicas(1, WAIT)
            .build()
            .await
            .unwrap();
        for _ in 0..5 {
            let permit = one.try_acquire().await.unwrap();
            let on_replica: i64 = replica.replica_cmd(&["ZCARD", &leases_key(name)]);
            assert_eq!(on_replica, 1, "{name}: the replica has the grant");
            permit.release().await.unwrap();
        }
        let two = RedisSemaphore::builder(client(&cluster), *name)
            .limit(2)
            .replicas(2, SHORT)
            .build()
            .await
            .unwrap();
        let got = two.try_acquire().await;
        assert!(
            matches!(
                got,
                Err(LeaseError::NotReplicated {
                    acked: 1,
                    wanted: 2
                })
            ),
            "{name}: {got:?}"
        );
        let released = time_until(Duration::from_secs(5), || {
            cluster
                .node(owner)
                .cmd::<i64>(&["ZCARD", &leases_key(name)])
                == 0
        })
        .await;
        assert!(released.is_some(), "{name}: the refused grant is released");
    }
    assert!(owners.len() > 1, "the names cover several primaries");
    let name = names[0];
    let (owner, replica) = owner_and_replica(&cluster, name);
    let one = RedisSemaphore::builder(client(&cluster), name)
        .limit(2)
        .replicas(1, SHORT)
        .build()
        .await
        .unwrap();
    replica.freeze();
    let start = Instant::now();
    let got = one.try_acquire().await;
    let took = start.elapsed();
    replica.thaw();
    assert!(
        matches!(
            got,
            Err(LeaseError::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{got:?}"
    );
    assert!(took >= SHORT, "WAIT waited its timeout: {took:?}");
    let released = time_until(Duration::from_secs(5), || {
        cluster
            .node(owner)
            .cmd::<i64>(&["ZCARD", &leases_key(name)])
            == 0
    })
    .await;
    assert!(released.is_some(), "the refused grant is released");
}

/// `replicas(1, …)` across a resharding the client has not heard of: the
/// acquire script and its `WAIT`, one pipeline, reach the slot's old owner,
/// which answers the script with `MOVED`; the redis crate sends the whole
/// pipeline again to the new owner, so the `WAIT` that counts is the one
/// that ran after the grant, there. The new owner's replica was moved to
/// the old owner (`CLUSTER REPLICATE`): the new owner has none, so
/// `NotReplicated { acked: 0 }` (a `WAIT` on the old owner, which now has
/// two, would answer 2 at once), and the grant is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_follows_its_grant_to_a_slot_moved_meanwhile() {
    const SHORT: Duration = Duration::from_millis(300);
    let Some(cluster) = replicated_cluster() else {
        return;
    };
    let name = NAMES[1];
    let sem = RedisSemaphore::builder(client(&cluster), name)
        .limit(2)
        .replicas(1, SHORT)
        .build()
        .await
        .unwrap();
    // One grant on the old owner first (on a loaded machine its replica
    // may take longer than `SHORT`: then it is released in the background).
    match sem.try_acquire().await {
        Ok(permit) => permit.release().await.unwrap(),
        Err(LeaseError::NotReplicated { .. }) => {}
        Err(e) => panic!("{e:?}"),
    }
    let old = cluster.owner(&leases_key(name)).port();
    let released = time_until(Duration::from_secs(5), || {
        cluster.node(old).cmd::<i64>(&["ZCARD", &leases_key(name)]) == 0
    })
    .await;
    assert!(released.is_some());
    let new = move_slot(&cluster, name);
    assert_ne!(old, new);
    let old_id: String = cluster.node(old).cmd(&["CLUSTER", "MYID"]);
    for replica in cluster.replicas_of(new) {
        let _: String = replica.cmd(&["CLUSTER", "REPLICATE", &old_id]);
    }
    let moved = time_until(Duration::from_secs(10), || {
        cluster.replicas_of(new).is_empty() && cluster.replicas_of(old).len() == 2
    })
    .await;
    assert!(
        moved.is_some(),
        "the new owner's replica follows the old owner"
    );
    let got = sem.try_acquire().await;
    assert!(
        matches!(
            got,
            Err(LeaseError::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{got:?}"
    );
    let released = time_until(Duration::from_secs(5), || {
        cluster.node(new).cmd::<i64>(&["ZCARD", &leases_key(name)]) == 0
    })
    .await;
    assert!(released.is_some(), "the refused grant is released");
}

/// A cluster whose nodes have no `SSUBSCRIBE` (as Redis 6, which has no
/// sharded pub/sub; here renamed away): `build` says so with
/// `NoShardedPubSub`, and with `pubsub(false)` the semaphore works,
/// polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_sharded_pubsub_is_refused_with_a_clear_error() {
    let Some(cluster) =
        RedisCluster::start_with_or_skip(3, 0, &["--rename-command", "SSUBSCRIBE", ""])
    else {
        return;
    };
    let got = RedisSemaphore::builder(client(&cluster), "nightly")
        .build()
        .await;
    match got {
        Err(ConfigError::NoShardedPubSub(e)) => {
            let text = ConfigError::NoShardedPubSub(e).to_string();
            assert!(text.contains("pubsub(false)"), "{text}");
        }
        other => panic!("expected NoShardedPubSub, got {other:?}"),
    }
    let sem = RedisSemaphore::builder(client(&cluster), "nightly")
        .pubsub(false)
        .max_poll(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|p| p.fence()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let fence = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(fence >= 2);
}
