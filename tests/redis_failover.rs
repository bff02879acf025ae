//! Failover and data loss seen by clients that were never granted anything
//! (the epoch marker, a promoted replica's replication id), and `WAIT` on
//! grants, against real `redis-server` processes started per test: a
//! restart without persistence, a restart with AOF, a replica promoted with
//! `REPLICAOF NO ONE` behind a switched address (also one cut off from its
//! primary first, which lost the last grants, and one whose quarantine
//! write is lost in a black hole), a Sentinel failover, and a primary whose
//! replica is stopped (also behind a proxy that gives every request a new
//! server connection).
#![cfg(all(not(loom), feature = "redis", feature = "tokio"))]

#[path = "common/failover_load.rs"]
mod failover_load;
#[path = "common/redis_reconnect.rs"]
mod redis_reconnect;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use failover_load::Load;
use redis_reconnect::{restart, try_after_reconnect};
use redis_server::RedisServer;
use watertight::redis::{ConfigError, LeaseError, RedisSemaphore};

/// How long anything that should happen "soon" may take before a test
/// gives up (only reached when something is broken).
const PATIENCE: Duration = Duration::from_secs(15);

fn builder(url: &str, name: &str) -> watertight::redis::RedisSemaphoreBuilder {
    RedisSemaphore::builder(redis::Client::open(url).unwrap(), name)
}

fn key(name: &str, suffix: &str) -> String {
    format!("bulkhead:{{{name}}}:{suffix}")
}

// ---------------------------------------------------------------------------
// Restarts
// ---------------------------------------------------------------------------

/// A client that was built before Redis restarted without persistence, and
/// was never granted anything, finds the epoch marker gone (or written
/// anew by a client built after the restart): grants stop, for every
/// client, the new one too. With `quarantine(false)` it is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_quarantines_a_client_never_granted() {
    const TTL: Duration = Duration::from_millis(1_500);
    for quarantine in [true, false] {
        let name = format!("lost-{quarantine}");
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let server = Arc::new(server);
        let before = builder(&server.url(), &name)
            .lease_ttl(TTL)
            .quarantine(quarantine)
            .build()
            .await
            .unwrap();
        restart(&server).await;
        // Built after the restart: it cannot know, and writes a new marker.
        let after = builder(&server.url(), &name)
            .lease_ttl(TTL)
            .quarantine(quarantine)
            .build()
            .await
            .unwrap();
        let got = try_after_reconnect(&before).await;
        if quarantine {
            let Err(LeaseError::Quarantined { retry_after }) = got else {
                panic!("the marker changed: quarantined, got {got:?}")
            };
            assert!(
                retry_after > TTL / 2 && retry_after <= TTL,
                "{retry_after:?}"
            );
            let other = after.try_acquire().await;
            assert!(
                matches!(other, Err(LeaseError::Quarantined { .. })),
                "every client is refused: {other:?}"
            );
            // It ends after one time to live; no second quarantine follows
            // (both clients learned the new marker).
            let permit = tokio::time::timeout(PATIENCE, before.acquire())
                .await
                .unwrap()
                .unwrap();
            permit.release().await.unwrap();
            after.try_acquire().await.unwrap().release().await.unwrap();
            before.try_acquire().await.unwrap().release().await.unwrap();
        } else {
            got.expect("without the quarantine, granted at once")
                .release()
                .await
                .unwrap();
        }
    }
}

/// A restart with AOF (`appendfsync always`: nothing acknowledged is lost)
/// keeps the marker and the leases: no quarantine, the holder keeps its
/// lease, and a second client is granted the other permit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_persistence_does_not_quarantine() {
    const NAME: &str = "kept";
    const TTL: Duration = Duration::from_millis(1_500);
    let Some(server) =
        RedisServer::start_with_or_skip(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let server = Arc::new(server);
    let a = builder(&server.url(), NAME)
        .lease_ttl(TTL)
        .limit(2)
        .build()
        .await
        .unwrap();
    let b = builder(&server.url(), NAME)
        .lease_ttl(TTL)
        .limit(2)
        .build()
        .await
        .unwrap();
    let held = a.try_acquire().await.unwrap();
    let replid = |s: &RedisServer| -> String {
        let info: String = s.cmd(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix("master_replid:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let id_before = replid(&server);
    restart(&server).await;
    assert_ne!(
        replid(&server),
        id_before,
        "a restart changes the replication id"
    );
    let permit = try_after_reconnect(&b)
        .await
        .expect("the data survived: no quarantine");
    assert!(permit.fence() > held.fence());
    // Two renewal rounds later (each reads the replication id), the holder
    // still holds and nothing is quarantined.
    tokio::time::sleep(TTL).await;
    assert!(!held.is_lost());
    let q: bool = server.cmd(&["EXISTS", &key(NAME, "quarantine")]);
    assert!(!q, "no quarantine after a restart that lost nothing");
    permit.release().await.unwrap();
    held.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// Promotion of a replica
// ---------------------------------------------------------------------------

/// A TCP proxy whose upstream can be switched, as a virtual IP or a DNS
/// name moves to a promoted replica: switching closes every connection. It
/// can also turn into a black hole (see [`Hole`]).
struct Switch {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    /// Both ends of every connection, with its black-hole flag.
    conns: Arc<Mutex<Vec<End>>>,
    stop: Arc<AtomicBool>,
    hole: Arc<Hole>,
}

/// One end of a [`Switch`]'s connection, and whether that connection is a
/// black hole.
type End = (TcpStream, Arc<AtomicBool>);

/// What a [`Switch`] drops instead of forwarding.
#[derive(Default)]
struct Hole {
    /// Every connection drops whatever it reads, both ways.
    all: AtomicBool,
    /// A request containing these bytes turns its connection into a black
    /// hole: that request and everything after it, both ways, is dropped.
    pattern: Mutex<Option<Vec<u8>>>,
    /// Connections turned into black holes by the pattern.
    hits: AtomicUsize,
}

impl Switch {
    fn start(upstream: SocketAddr) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let switch = Switch {
            addr,
            upstream: Arc::new(Mutex::new(upstream)),
            conns: Arc::default(),
            stop: Arc::default(),
            hole: Arc::default(),
        };
        let (upstream, conns, stop, hole) = (
            switch.upstream.clone(),
            switch.conns.clone(),
            switch.stop.clone(),
            switch.hole.clone(),
        );
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((down, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(2));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let target = *upstream.lock().unwrap();
                let Ok(up) = TcpStream::connect(target) else {
                    continue;
                };
                let holed = Arc::new(AtomicBool::new(false));
                let mut list = conns.lock().unwrap();
                list.push((down.try_clone().unwrap(), holed.clone()));
                list.push((up.try_clone().unwrap(), holed.clone()));
                drop(list);
                let ends = (down.try_clone().unwrap(), up.try_clone().unwrap());
                pipe(ends, &hole, true, &holed);
                pipe((up, down), &hole, false, &holed);
            }
        });
        switch
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Points new connections at `upstream` and closes the old ones.
    fn switch_to(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
        for (conn, _) in self.conns.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }

    /// From now on, every connection drops what it reads.
    fn cut(&self) {
        self.hole.all.store(true, Ordering::SeqCst);
    }

    /// From now on, a request containing `pattern` turns its connection
    /// into a black hole.
    fn arm(&self, pattern: &str) {
        *self.hole.pattern.lock().unwrap() = Some(pattern.as_bytes().to_vec());
    }

    /// Connections turned into black holes so far.
    fn hits(&self) -> usize {
        self.hole.hits.load(Ordering::SeqCst)
    }

    /// Disarms the pattern and closes the black holes (the client
    /// reconnects).
    fn heal(&self) {
        *self.hole.pattern.lock().unwrap() = None;
        self.conns.lock().unwrap().retain(|(conn, holed)| {
            let keep = !holed.load(Ordering::SeqCst);
            if !keep {
                let _ = conn.shutdown(Shutdown::Both);
            }
            keep
        });
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.switch_to(self.addr);
    }
}

/// Forwards `from` to `to` until either closes, unless `hole` says to
/// drop it; `requests` for the client's side, whose requests it looks into.
fn pipe(
    (mut from, mut to): (TcpStream, TcpStream),
    hole: &Arc<Hole>,
    requests: bool,
    holed: &Arc<AtomicBool>,
) {
    let (hole, holed) = (hole.clone(), holed.clone());
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if requests {
                let pattern = hole.pattern.lock().unwrap();
                let hit = pattern
                    .as_deref()
                    .is_some_and(|p| buf[..n].windows(p.len()).any(|w| w == p));
                drop(pattern);
                if hit && !holed.swap(true, Ordering::SeqCst) {
                    hole.hits.fetch_add(1, Ordering::SeqCst);
                }
            }
            if hole.all.load(Ordering::SeqCst) || holed.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// A primary and a replica of it, linked.
fn primary_and_replica() -> Option<(RedisServer, RedisServer)> {
    let primary = RedisServer::start_or_skip()?;
    let port = primary.port().to_string();
    let replica = RedisServer::start_with_or_skip(&["--replicaof", "127.0.0.1", &port])?;
    let linked = redis_server::eventually(PATIENCE, || {
        replica
            .try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("master_link_status:up"))
    });
    assert!(linked, "the replica did not link to its primary");
    Some((primary, replica))
}

/// The address a client uses moves to a replica promoted with `REPLICAOF
/// NO ONE` (it had every key: the epoch marker survives). The client,
/// never granted anything, sees the new server's `master_replid2` equal to
/// the id it read before, and starts the quarantine within one renewal
/// round; with `quarantine(false)` it is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_quarantines_a_client_never_granted() {
    const TTL: Duration = Duration::from_millis(3_000);
    for quarantine in [true, false] {
        let name = format!("promoted-{quarantine}");
        let Some((primary, replica)) = primary_and_replica() else {
            return;
        };
        let switch = Switch::start(primary.addr());
        let sem = builder(&switch.url(), &name)
            .lease_ttl(TTL)
            .quarantine(quarantine)
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        // The marker (written at build, with the quarantine on) reached
        // the replica before the switch.
        let replicated = redis_server::eventually(PATIENCE, || {
            replica
                .try_cmd::<bool>(&["EXISTS", &key(&name, "epoch")])
                .unwrap_or(false)
        });
        assert_eq!(replicated, quarantine);
        let ok: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
        assert_eq!(ok, "OK");
        switch.switch_to(replica.addr());
        let switched = Instant::now();
        // Until the keeper's next round reads the replication id, grants
        // may still be made (the gap the docs state); after it, none.
        let refused = loop {
            match sem.try_acquire().await {
                Err(LeaseError::Quarantined { .. }) => break Some(switched.elapsed()),
                Ok(permit) => permit.release().await.unwrap(),
                Err(LeaseError::Unavailable(_)) => {}
                Err(e) => panic!("{e:?}"),
            }
            if switched.elapsed() > TTL * 2 {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if quarantine {
            let after = refused.expect("the promotion is seen");
            eprintln!("promoted replica: quarantined {after:?} after the switch");
            // One renewal round (a third of the time to live less the
            // margin), plus the first reconnection.
            assert!(after < TTL / 3 + Duration::from_secs(1), "{after:?}");
            let q: bool = replica.cmd(&["EXISTS", &key(&name, "quarantine")]);
            assert!(q, "the quarantine is on the promoted server");
        } else {
            assert_eq!(refused, None, "no quarantine when turned off");
        }
    }
}

/// A failover that loses grants. The replica follows its primary through a
/// proxy, which is then cut (the replication stream is dropped); the
/// limit's two permits are granted on the primary to holders that work
/// until they learn their lease is lost; the primary is killed, and the
/// replica, which never saw those grants, is promoted behind the clients'
/// address. The newcomers' calls failed during the outage, so the first
/// grant on the new server reads its replication id first: with the
/// quarantine they are refused from their first acquire there, for one
/// time to live, and the permits in use at once (old holders and new
/// grants) never exceed the limit. With `quarantine(false)` the newcomers
/// are granted the lost permits at once, and 4 are in use until the
/// holders' next renewal finds their leases gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_grants_is_quarantined_before_any_regrant() {
    const LIMIT: usize = 2;
    const TTL: Duration = Duration::from_secs(2);
    // The holders' first renewal (and look at the replication id) comes
    // this long after they were built: they learn of the loss then.
    const HOLDER_RENEW: Duration = Duration::from_millis(1_950);
    for quarantine in [true, false] {
        let name = format!("lost-grants-{quarantine}");
        let Some(primary) = RedisServer::start_or_skip() else {
            return;
        };
        let link = Switch::start(primary.addr());
        let link_port = link.addr.port().to_string();
        let Some(replica) =
            RedisServer::start_with_or_skip(&["--replicaof", "127.0.0.1", &link_port])
        else {
            return;
        };
        let linked = redis_server::eventually(PATIENCE, || {
            replica
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
        });
        assert!(linked, "the replica did not link to its primary");
        let front = Switch::start(primary.addr());
        let sem = |renew: Option<Duration>| {
            let b = builder(&front.url(), &name)
                .limit(LIMIT)
                .lease_ttl(TTL)
                .quarantine(quarantine)
                .response_timeout(Duration::from_millis(300));
            match renew {
                Some(every) => b.renew_every(every),
                None => b,
            }
            .build()
        };
        let newcomer = sem(None).await.unwrap();
        // One grant and release (which installs the limit), replicated.
        newcomer
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let synced = redis_server::eventually(PATIENCE, || {
            replica
                .try_cmd::<(Option<i64>, i64)>(&[
                    "EVAL",
                    "return {redis.call('GET', KEYS[1]), redis.call('ZCARD', KEYS[2])}",
                    "2",
                    &key(&name, "fence"),
                    &key(&name, "leases"),
                ])
                .is_ok_and(|r| r == (Some(1), 0))
        });
        assert!(
            synced,
            "the first grant and its release reached the replica"
        );

        link.cut();
        let holder = sem(Some(HOLDER_RENEW)).await.unwrap();
        // Old holders and newcomers, counted together.
        let mut load = Load::default();
        let lost_at = Arc::new(Mutex::new(Vec::new()));
        let mut holders = Vec::new();
        for _ in 0..LIMIT {
            let permit = holder.try_acquire().await.unwrap();
            let (held, lost_at) = (load.enter(), lost_at.clone());
            holders.push(tokio::spawn(async move {
                let lost = tokio::time::timeout(TTL * 2, permit.lost()).await;
                lost_at.lock().unwrap().push(Instant::now());
                drop(held);
                assert!(lost.is_ok(), "a holder never learned its lease was lost");
                let _ = permit.release().await;
            }));
        }
        let on_primary: i64 = primary.cmd(&["ZCARD", &key(&name, "leases")]);
        assert_eq!(on_primary, LIMIT as i64);

        // The outage: the newcomer's calls fail.
        primary.stop();
        let failed = tokio::time::timeout(PATIENCE, async {
            while !matches!(
                newcomer.try_acquire().await,
                Err(LeaseError::Unavailable(_))
            ) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(failed.is_ok(), "no call failed while the primary was down");
        let on_replica: i64 = replica.cmd(&["ZCARD", &key(&name, "leases")]);
        assert_eq!(on_replica, 0, "the replica never saw the grants");
        let ok: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
        assert_eq!(ok, "OK");
        front.switch_to(replica.addr());
        let promoted = Instant::now();

        for _ in 0..LIMIT {
            load.spawn_holding(newcomer.clone(), Duration::from_millis(100));
        }
        for h in holders {
            h.await.unwrap();
        }
        // Grants resume once the quarantine ends (it may have started
        // again when the holders' renewals found their leases gone).
        let resumed = redis_server::eventually(TTL * 3, || {
            let refused = load.first_refusal();
            load.granted_at()
                .iter()
                .any(|&t| refused.is_none_or(|r| t > r))
        });
        load.stop().await;
        let ms = |t: Instant| t.saturating_duration_since(promoted).as_millis();
        let granted = load.granted_at();
        let refused = load.first_refusal();
        let lost: Vec<_> = lost_at.lock().unwrap().iter().map(|&t| ms(t)).collect();
        let max = load.max_held();
        eprintln!(
            "lost grants, quarantine {quarantine}: refused at {:?} ms, first grant at {:?} ms, \
             holders lost at {lost:?} ms after the promotion, most in use {max}",
            refused.map(ms),
            granted.first().map(|&t| ms(t)),
        );
        assert!(resumed, "grants resumed");
        if quarantine {
            let refused = refused.expect("the promotion quarantined");
            let early = granted.iter().filter(|&&t| t < refused).count();
            assert_eq!(early, 0, "grants on the new primary before the quarantine");
            assert!(max <= LIMIT, "{max} permits in use at once, limit {LIMIT}");
            assert!(
                granted.first().is_some_and(|&t| t >= refused + TTL * 3 / 4),
                "grants resumed before one time to live"
            );
        } else {
            assert_eq!(refused, None, "no quarantine when turned off");
            assert!(
                max > LIMIT,
                "the lost grants' permits were granted again at once: {max} in use"
            );
        }
    }
}

/// An idle client (it holds and asks nothing) sees a promotion behind its
/// address through its watch, and the quarantine write that follows runs
/// out of time: the proxy turns the connection that carries it into a
/// black hole. The loss stays known, and once the black hole is closed
/// (the client reconnects), the watch writes the quarantine at a later
/// look. (Before, only the look that saw the promotion wrote it: an idle
/// client, which makes no acquire to carry the loss flag, never did.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_write_that_ran_out_of_time_is_written_later() {
    const NAME: &str = "quarantine-retried";
    const TTL: Duration = Duration::from_millis(1_500);
    const EVERY: Duration = Duration::from_millis(300);
    let Some((primary, replica)) = primary_and_replica() else {
        return;
    };
    let switch = Switch::start(primary.addr());
    let sem = builder(&switch.url(), NAME)
        .lease_ttl(TTL)
        .renew_every(EVERY)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let replicated = redis_server::eventually(PATIENCE, || {
        replica
            .try_cmd::<bool>(&["EXISTS", &key(NAME, "epoch")])
            .unwrap_or(false)
    });
    assert!(replicated, "the marker reached the replica");
    let quarantine_key = key(NAME, "quarantine");
    let ok: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(ok, "OK");
    switch.arm(&quarantine_key);
    switch.switch_to(replica.addr());
    let switched = Instant::now();
    let sent = redis_server::eventually(PATIENCE, || switch.hits() > 0);
    assert!(sent, "the watch never sent the quarantine write");
    let dropped = switched.elapsed();
    // The write runs out of time (its bound is `renew_every`), and looks
    // after it go to the black hole too.
    tokio::time::sleep(EVERY * 3).await;
    let early: bool = replica.cmd(&["EXISTS", &quarantine_key]);
    assert!(!early, "the black hole let the quarantine write through");
    switch.heal();
    let healed = Instant::now();
    let written = redis_server::eventually(EVERY * 10, || {
        replica
            .try_cmd::<bool>(&["EXISTS", &quarantine_key])
            .unwrap_or(false)
    });
    eprintln!(
        "quarantine write dropped {dropped:?} after the switch; written {:?} after the heal",
        healed.elapsed()
    );
    assert!(
        written,
        "the quarantine whose write ran out of time was never written"
    );
    drop(sem);
}

/// A Sentinel failover: the semaphore follows the promoted replica and,
/// never granted anything, starts the quarantine there at its first
/// acquire: it reads the new primary's replication id before it switches
/// to it. A limit of 0 keeps every other sign out (no grant, no fence),
/// and a 30 s time to live keeps the keeper's own `INFO` watch (every
/// `renew_every`, 9.9 s) from running before the bound below.
#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_quarantines_a_client_never_granted() {
    use redis_server::{SERVICE, SentinelSet};
    const NAME: &str = "sentinel-promoted";
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let backend =
        watertight::redis::Backend::sentinel(vec![set.sentinel_url()], SERVICE, None).unwrap();
    let sem = RedisSemaphore::builder(backend, NAME)
        .limit(0)
        .lease_ttl(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let built = Instant::now();
    assert!(matches!(
        sem.try_acquire().await,
        Err(LeaseError::NoPermits { .. })
    ));
    let old = set.primary_port();
    let ok: String = set.sentinel().cmd(&["SENTINEL", "FAILOVER", SERVICE]);
    assert_eq!(ok, "OK");
    let new = tokio::task::block_in_place(|| set.wait_new_primary(old, PATIENCE))
        .expect("sentinel promotes the replica");
    let promoted = Instant::now();
    let refused = loop {
        match sem.try_acquire().await {
            Err(LeaseError::Quarantined { .. }) => break promoted.elapsed(),
            Err(LeaseError::NoPermits { .. } | LeaseError::Unavailable(_)) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(5),
            "the promotion was not seen within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("sentinel failover: quarantined {refused:?} after the promotion");
    assert!(
        built.elapsed() < Duration::from_secs(9),
        "the keeper's INFO watch may have run: the test proves nothing"
    );
    let q: bool = set.server(new).cmd(&["EXISTS", &key(NAME, "quarantine")]);
    assert!(q, "the quarantine is on the new primary");
}

/// After `SENTINEL FAILOVER`, three clients built before it: the first
/// one back starts the quarantine, and the others, each of which sees the
/// promotion too (on switching to the new primary), join it and are then
/// granted at their first try: one promotion, one quarantine.
#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_one_quarantine_for_every_client() {
    use redis_server::{SERVICE, SentinelSet};
    const NAME: &str = "sentinel-one-quarantine";
    const TTL: Duration = Duration::from_millis(2_000);
    let Some(set) = SentinelSet::start_or_skip() else {
        return;
    };
    let mut clients = Vec::new();
    for _ in 0..3 {
        let backend =
            watertight::redis::Backend::sentinel(vec![set.sentinel_url()], SERVICE, None).unwrap();
        let sem = RedisSemaphore::builder(backend, NAME)
            .limit(3)
            .lease_ttl(TTL)
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        sem.try_acquire().await.unwrap().release().await.unwrap();
        clients.push(sem);
    }
    let old = set.primary_port();
    let ok: String = set.sentinel().cmd(&["SENTINEL", "FAILOVER", SERVICE]);
    assert_eq!(ok, "OK");
    tokio::task::block_in_place(|| set.wait_new_primary(old, PATIENCE))
        .expect("sentinel promotes the replica");
    let promoted = Instant::now();
    let retry_after = redis_reconnect::until_quarantined(&clients[0], PATIENCE).await;
    let detected = promoted.elapsed();
    tokio::time::sleep(retry_after).await;
    redis_reconnect::each_granted(&clients).await;
    let resumed = promoted.elapsed();
    assert!(
        resumed <= detected + TTL + Duration::from_millis(500),
        "quarantined {detected:?} after the promotion, all granted after {resumed:?}"
    );
}

// ---------------------------------------------------------------------------
// WAIT on grants
// ---------------------------------------------------------------------------

/// With `replicas(1, …)` and a live replica, grants succeed and the replica
/// has the lease as soon as the grant is returned; with the replica
/// stopped, the grant fails typed after the timeout and is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_replicas_and_fail_typed_without_them() {
    const NAME: &str = "replicated";
    const WAIT: Duration = Duration::from_millis(300);
    let Some((primary, replica)) = primary_and_replica() else {
        return;
    };
    let sem = builder(&primary.url(), NAME)
        .limit(2)
        .replicas(1, WAIT)
        .build()
        .await
        .unwrap();
    for _ in 0..20 {
        let permit = sem.try_acquire().await.unwrap();
        let on_replica: i64 = replica.cmd(&["ZCARD", &key(NAME, "leases")]);
        assert_eq!(on_replica, 1, "the replica acknowledged the grant");
        permit.release().await.unwrap();
    }
    let held = sem.acquire().await.unwrap();

    replica.freeze();
    let start = Instant::now();
    let got = sem.try_acquire().await;
    let took = start.elapsed();
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
    assert!(took >= WAIT, "WAIT waited its timeout: {took:?}");
    // A waiting acquire fails at once too.
    let got = sem.acquire().await;
    assert!(
        matches!(got, Err(LeaseError::NotReplicated { .. })),
        "{got:?}"
    );
    // The refused grants are released; the held one is renewed meanwhile
    // (renewals do not wait behind WAIT).
    let released = redis_server::eventually(PATIENCE, || {
        primary.cmd::<i64>(&["ZCARD", &key(NAME, "leases")]) == 1
    });
    assert!(released, "a grant too few replicas had is released");
    tokio::time::sleep(sem.lease_ttl() / 10).await;
    assert!(!held.is_lost());
    replica.thaw();
    held.release().await.unwrap();
    let ok = redis_server::eventually(PATIENCE, || {
        primary
            .try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("connected_slaves:1"))
    });
    assert!(ok);
    sem.try_acquire().await.unwrap().release().await.unwrap();
}

/// A TCP proxy that opens a new connection to the server for every
/// request the client sends after an answer reached it: the client keeps
/// its connection to the proxy, but whatever it sends once answered runs on
/// another server connection, as it would after the client's own
/// connection was replaced (a reconnection, a Sentinel switch). Commands
/// sent together (a pipeline, one write) stay on one server connection.
struct Regroup {
    addr: SocketAddr,
    /// Server connections opened so far.
    upstreams: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Regroup {
    fn start(server: SocketAddr) -> Regroup {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let proxy = Regroup {
            addr,
            upstreams: Arc::default(),
            stop: Arc::default(),
        };
        let (upstreams, stop) = (proxy.upstreams.clone(), proxy.stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((down, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(2));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let upstreams = upstreams.clone();
                thread::spawn(move || regroup(down, server, &upstreams));
            }
        });
        proxy
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    fn upstreams(&self) -> usize {
        self.upstreams.load(Ordering::SeqCst)
    }
}

impl Drop for Regroup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One client connection of a [`Regroup`] proxy.
fn regroup(mut down: TcpStream, server: SocketAddr, upstreams: &AtomicUsize) {
    let answered = Arc::new(AtomicBool::new(false));
    let mut up: Option<TcpStream> = None;
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match down.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if up.is_none() || answered.swap(false, Ordering::SeqCst) {
            if let Some(old) = up.take() {
                let _ = old.shutdown(Shutdown::Both);
            }
            let Ok(fresh) = TcpStream::connect(server) else {
                break;
            };
            upstreams.fetch_add(1, Ordering::SeqCst);
            let (mut from, mut to, answered) = (
                fresh.try_clone().unwrap(),
                down.try_clone().unwrap(),
                answered.clone(),
            );
            thread::spawn(move || {
                let mut buf = [0u8; 64 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    answered.store(true, Ordering::SeqCst);
                }
            });
            up = Some(fresh);
        }
        if up.as_mut().unwrap().write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if let Some(up) = up {
        let _ = up.shutdown(Shutdown::Both);
    }
    let _ = down.shutdown(Shutdown::Both);
}

/// `WAIT` counts the writes of the connection it runs on. Behind a
/// [`Regroup`] proxy, a `WAIT` sent after its grant's answer runs on
/// another server connection, which wrote nothing: with the replica
/// frozen (still connected, so counted for any offset it acknowledged),
/// it would answer 1 at once and the grant would be reported replicated
/// although the replica never saw it. Sent with the acquire script as one
/// pipeline, it counts the grant: `NotReplicated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_counts_its_grant_when_the_connection_changes_after_it() {
    const NAME: &str = "regrouped";
    // Long enough for the replica of a loaded machine to acknowledge;
    // short where the test waits for it to run out.
    const WAIT: Duration = Duration::from_secs(2);
    const SHORT: Duration = Duration::from_millis(300);
    let Some((primary, replica)) = primary_and_replica() else {
        return;
    };
    let proxy = Regroup::start(primary.addr());
    let build = |wait| {
        builder(&proxy.url(), NAME)
            .limit(2)
            .replicas(1, wait)
            .build()
    };
    let live = build(WAIT).await.unwrap();
    let sem = build(SHORT).await.unwrap();
    for _ in 0..5 {
        let permit = live.try_acquire().await.unwrap();
        let on_replica: i64 = replica.cmd(&["ZCARD", &key(NAME, "leases")]);
        assert_eq!(on_replica, 1, "the replica acknowledged the grant");
        permit.release().await.unwrap();
    }
    let opened = proxy.upstreams();
    replica.freeze();
    let got = sem.try_acquire().await;
    let on_primary: i64 = primary.cmd(&["ZCARD", &key(NAME, "leases")]);
    replica.thaw();
    assert!(
        proxy.upstreams() > opened,
        "the proxy opened no new server connection: the test proves nothing"
    );
    assert!(
        matches!(
            got,
            Err(LeaseError::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "a grant the frozen replica never saw was reported replicated: {got:?} \
         ({on_primary} lease(s) on the primary)"
    );
}

/// A zero `WAIT` timeout would block for ever: refused at build.
#[tokio::test]
async fn replicas_with_a_zero_timeout_are_refused() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let got = builder(&server.url(), "zero")
        .replicas(1, Duration::ZERO)
        .build()
        .await;
    assert!(matches!(got, Err(ConfigError::BadReplicas)), "{got:?}");
}

// ---------------------------------------------------------------------------
// No quarantine without a loss
// ---------------------------------------------------------------------------

/// Permits released (and dropped) while renewals run all the time: a
/// renewal that raced a release finds the lease gone, but its holder gave
/// it back, so this is no sign of a loss and nothing is quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_racing_renewals_do_not_quarantine() {
    const NAME: &str = "churn";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), NAME)
        .limit(1_000)
        .lease_ttl(Duration::from_millis(300))
        .renew_every(Duration::from_millis(5))
        .build()
        .await
        .unwrap();
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(4) {
        let mut held = Vec::new();
        for _ in 0..40 {
            match sem.try_acquire().await {
                Ok(permit) => held.push(permit),
                Err(e) => panic!("round {rounds}: {e:?}"),
            }
        }
        // Half dropped (released in the background), half released.
        let releases: Vec<_> = held
            .into_iter()
            .enumerate()
            .filter_map(|(i, p)| (i % 2 == 0).then_some(p))
            .map(|p| tokio::spawn(p.release()))
            .collect();
        for r in releases {
            let _ = r.await.unwrap();
        }
        rounds += 1;
    }
    let q: bool = server.cmd(&["EXISTS", &key(NAME, "quarantine")]);
    assert!(!q, "quarantined after {rounds} rounds without any loss");
}
