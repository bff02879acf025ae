//! The Redis semaphore under faults, against a real `redis-server` started
//! per test: holders in other processes (killed, frozen), a restarted
//! server, flushed scripts, a killed pub/sub connection, futures dropped
//! mid-call, and the smol runtime.
//!
//! Multi-process tests re-execute this binary to run one `child_*` test
//! (see `redis_server::spawn_child`); those tests do nothing in a normal run.
//!
//! Every wait is bounded. Timing assertions are either exact on Redis's own
//! clock (lease deadlines and grant times read from the keys; Redis runs on
//! this machine, so its clock is the wall clock) or have margins of seconds
//! against behaviour that would take far longer if it were wrong.
#![cfg(all(not(loom), feature = "redis", feature = "tokio"))]

#[path = "common/redis_reconnect.rs"]
mod redis_reconnect;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use redis_reconnect::{restart, try_after_reconnect};
use redis_server::{ChildTest, ConcurrencyProbe, ProbeClient, RedisServer, is_child};
use tokio::time::timeout;
use watertight::redis::{
    Holder, LeaseError, LeasedPermit, LostReason, RedisBulkhead, RedisSemaphore,
    RedisSemaphoreBuilder, ReleaseError,
};

/// How long anything that should happen "soon" may take before a test
/// gives up (only reached when something is broken).
const PATIENCE: Duration = Duration::from_secs(15);

const ENV_URL: &str = "WATERTIGHT_TEST_REDIS_URL";
const ENV_PROBE: &str = "WATERTIGHT_TEST_PROBE";
const ENV_MODE: &str = "WATERTIGHT_TEST_MODE";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn builder(url: &str, name: &str) -> RedisSemaphoreBuilder {
    RedisSemaphore::builder(redis::Client::open(url).unwrap(), name)
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

/// `bulkhead:{name}:suffix`, the library's key layout with the default prefix.
fn key(name: &str, suffix: &str) -> String {
    format!("bulkhead:{{{name}}}:{suffix}")
}

/// The wall clock in ms, as Redis's `TIME` reads it (same machine).
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The deadline (Redis ms) of lease `id` as stored in the `leases` sorted set.
fn lease_deadline_ms(server: &RedisServer, name: &str, id: &str) -> Option<i64> {
    let score: Option<String> = server.cmd(&["ZSCORE", &key(name, "leases"), id]);
    score.map(|s| s.parse::<f64>().unwrap() as i64)
}

/// When (Redis ms) lease `id` was granted, from its `fence:granted_ms:label`
/// entry in the `info` hash.
fn granted_at_ms(server: &RedisServer, name: &str, id: &str) -> i64 {
    let info: Option<String> = server.cmd(&["HGET", &key(name, "info"), id]);
    let info = info.unwrap_or_else(|| panic!("no info entry for lease {id}"));
    info.split(':').nth(1).unwrap().parse().unwrap()
}

/// Entries in the leases sorted set (expired ones included until purged)
/// and in the info hash.
fn raw_lease_counts(server: &RedisServer, name: &str) -> (i64, i64) {
    (
        server.cmd(&["ZCARD", &key(name, "leases")]),
        server.cmd(&["HLEN", &key(name, "info")]),
    )
}

/// Subscribers of the semaphore's wake-up channels (each process's own in
/// fair mode, the shared one otherwise).
fn subscribers(server: &RedisServer, name: &str) -> i64 {
    redis_server::wake_subscribers(server, name, false)
}

async fn wait_subscribers(server: &RedisServer, name: &str, n: i64) {
    let deadline = Instant::now() + PATIENCE;
    while subscribers(server, name) != n {
        assert!(
            Instant::now() < deadline,
            "the wake-up channel never had {n} subscribers (has {})",
            subscribers(server, name)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn cached_scripts(server: &RedisServer) -> i64 {
    let info: String = server.cmd(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
        .expect("INFO memory lists number_of_cached_scripts")
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) until Redis lists no unexpired lease of `sem`; returns
/// how long that took, or panics with what is still there.
async fn wait_no_holders(sem: &RedisSemaphore, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let holders = sem.holders().await.unwrap();
        if holders.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "leases still held after {within:?}: {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Parses `HOLDING fence=F id=ID`.
fn parse_holding(line: &str) -> (u64, String) {
    let mut fence = None;
    let mut id = None;
    for word in line.split_whitespace() {
        if let Some(f) = word.strip_prefix("fence=") {
            fence = Some(f.parse().unwrap());
        }
        if let Some(i) = word.strip_prefix("id=") {
            id = Some(i.to_owned());
        }
    }
    (
        fence.unwrap_or_else(|| panic!("no fence in {line:?}")),
        id.unwrap_or_else(|| panic!("no id in {line:?}")),
    )
}

/// Runs blocking harness calls (child output, restarts) off the async
/// worker's cooperative budget.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Waits until `n` callers stand in the semaphore's fair line in Redis.
fn wait_in_line(server: &RedisServer, name: &str, n: i64) {
    let queue = key(name, "queue");
    let lined = blocking(|| {
        redis_server::eventually(PATIENCE, || server.cmd::<i64>(&["ZCARD", &queue]) == n)
    });
    assert!(lined, "{name}: {n} not in line within {PATIENCE:?}");
}

// ---------------------------------------------------------------------------
// 1. Several processes share one limit
// ---------------------------------------------------------------------------

const SHARED: &str = "shared";
const SHARED_LIMIT: usize = 3;
const SHARED_PROCESSES: usize = 3;
const SHARED_TASKS: usize = 8;
const SHARED_ROUNDS: usize = 10;

/// Child of `processes_share_one_limit`: 8 tasks × 10 rounds of acquire,
/// enter the probe, hold a few ms, exit the probe, release. Prints every
/// fence it was granted. With `WATERTIGHT_TEST_MODE=bulkhead` it goes
/// through a `RedisBulkhead` instead of the bare semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_shares_the_limit() {
    if !is_child() {
        return;
    }
    let url = env(ENV_URL);
    let probe = env(ENV_PROBE);
    let bulkhead_mode = std::env::var(ENV_MODE).is_ok_and(|m| m == "bulkhead");
    let sem = builder(&url, SHARED)
        .limit(SHARED_LIMIT)
        .lease_ttl(Duration::from_secs(2))
        .max_poll(Duration::from_millis(200))
        .label(format!("worker-{}", std::process::id()))
        .build()
        .await
        .unwrap();
    let bulkhead = RedisBulkhead::builder(sem.clone())
        .max_wait(PATIENCE)
        .build()
        .unwrap();
    println!("READY");

    // Start together with the other processes: wait for the parent's `go`.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let go: Option<String> = redis::cmd("GET")
            .arg("go")
            .query_async(&mut conn)
            .await
            .unwrap();
        if go.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no go from the parent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let tasks: Vec<_> = (0..SHARED_TASKS)
        .map(|task| {
            let sem = sem.clone();
            let bulkhead = bulkhead.clone();
            let probe = probe.clone();
            tokio::spawn(async move {
                let mut fences = Vec::new();
                for round in 0..SHARED_ROUNDS {
                    let hold = Duration::from_millis(2 + ((task + round) % 4) as u64);
                    if bulkhead_mode {
                        let permit = timeout(PATIENCE, bulkhead.acquire())
                            .await
                            .expect("bulkhead acquire hung")
                            .expect("bulkhead acquire rejected");
                        let held = ProbeClient::enter(probe.as_str());
                        tokio::time::sleep(hold).await;
                        assert!(!permit.is_lost());
                        held.exit();
                        fences.push(permit.fence());
                        permit.release().await.expect("released in time");
                    } else {
                        let permit = timeout(PATIENCE, sem.acquire())
                            .await
                            .expect("acquire hung")
                            .expect("acquire failed");
                        let held = ProbeClient::enter(probe.as_str());
                        tokio::time::sleep(hold).await;
                        assert!(!permit.is_lost());
                        held.exit();
                        fences.push(permit.fence());
                        permit.release().await.expect("released in time");
                    }
                }
                fences
            })
        })
        .collect();
    let mut fences = Vec::new();
    for task in tasks {
        fences.extend(task.await.unwrap());
    }
    assert_eq!(sem.held_here(), 0);
    println!(
        "FENCES {}",
        fences
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// Three processes × 8 tasks share a limit of 3: an independent probe never
/// sees more than 3 holders at once, every round ran, and every grant had
/// its own fence.
#[test]
fn processes_share_one_limit() {
    if is_child() {
        return;
    }
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let probe = ConcurrencyProbe::start();
    let mut children: Vec<ChildTest> = (0..SHARED_PROCESSES)
        .map(|i| {
            let mode = if i == SHARED_PROCESSES - 1 {
                "bulkhead"
            } else {
                "semaphore"
            };
            ChildTest::spawn(
                "child_shares_the_limit",
                &[
                    (ENV_URL, server.url()),
                    (ENV_PROBE, probe.addr().to_string()),
                    (ENV_MODE, mode.to_owned()),
                ],
            )
        })
        .collect();
    for child in &mut children {
        child.expect_line("READY", PATIENCE);
    }
    let start = Instant::now();
    assert_eq!(server.cmd::<String>(&["SET", "go", "1"]), "OK");

    let mut fences: Vec<u64> = Vec::new();
    for child in &mut children {
        let line = child.expect_line("FENCES ", Duration::from_secs(40));
        fences.extend(
            line["FENCES ".len()..]
                .split(',')
                .map(|f| f.parse::<u64>().unwrap()),
        );
        child.assert_success(PATIENCE);
    }
    let took = start.elapsed();

    let work = SHARED_PROCESSES * SHARED_TASKS * SHARED_ROUNDS;
    assert!(
        probe.max_seen() <= SHARED_LIMIT,
        "{} holders at once with a limit of {SHARED_LIMIT}",
        probe.max_seen()
    );
    // Not a guarantee, but 24 contenders for 3 permits reach the limit.
    assert!(probe.max_seen() >= 2, "no contention: {}", probe.max_seen());
    assert_eq!(probe.total_enters(), work);
    assert_eq!(probe.current(), 0);
    // One fence per grant, none repeated, none skipped.
    fences.sort_unstable();
    assert_eq!(fences, (1..=work as u64).collect::<Vec<_>>());
    assert_eq!(
        server
            .cmd::<Option<String>>(&["GET", &key(SHARED, "fence")])
            .as_deref(),
        Some(work.to_string().as_str())
    );
    assert_eq!(raw_lease_counts(&server, SHARED), (0, 0));
    eprintln!(
        "processes_share_one_limit: {work} holds in {took:?}, max_seen {}",
        probe.max_seen()
    );
}

// ---------------------------------------------------------------------------
// 2. A killed holder's permit comes back after its TTL, not before
// ---------------------------------------------------------------------------

const CRASH: &str = "crash";
const CRASH_TTL: Duration = Duration::from_millis(1500);

/// Child of `a_killed_holders_permit_comes_back_after_its_ttl`: takes the
/// only permit and holds it until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_until_killed() {
    if !is_child() {
        return;
    }
    let sem = builder(&env(ENV_URL), CRASH)
        .limit(1)
        .lease_ttl(CRASH_TTL)
        .label("doomed")
        .build()
        .await
        .unwrap();
    let permit = sem.try_acquire().await.unwrap();
    println!("HOLDING fence={} id={}", permit.fence(), permit.id());
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(permit);
}

/// SIGKILL a holder: its permit stays taken until its lease's deadline in
/// Redis (at least one TTL after the grant), then comes back, and a waiter
/// whose `max_poll` is far longer gets it within TTL + 1 s of the kill (it
/// sleeps until the earliest lease deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_comes_back_after_its_ttl() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), CRASH)
        .limit(1)
        .lease_ttl(CRASH_TTL)
        .max_poll(Duration::from_secs(10))
        .label("survivor")
        .build()
        .await
        .unwrap();
    let mut child = ChildTest::spawn("child_holds_until_killed", &[(ENV_URL, server.url())]);
    let line = blocking(|| child.expect_line("HOLDING", PATIENCE));
    let (child_fence, child_id) = parse_holding(&line);
    let status = child.kill();
    let killed = Instant::now();
    let killed_ms = wall_ms();
    assert!(!status.success());

    // Let a renewal the child wrote just before it died land, then read the
    // lease as Redis has it. (Were one to land later still, the deadline
    // would only move later: every check below would still hold.)
    tokio::time::sleep(Duration::from_millis(50)).await;
    let granted_ms = granted_at_ms(&server, CRASH, &child_id);
    let deadline_ms =
        lease_deadline_ms(&server, CRASH, &child_id).expect("the dead child's lease is in Redis");
    let ttl_ms = CRASH_TTL.as_millis() as i64;
    assert!(
        deadline_ms - granted_ms >= ttl_ms,
        "the lease lives at least one TTL after its grant"
    );
    assert!(
        deadline_ms <= killed_ms + ttl_ms + 300,
        "nothing renews a dead holder's lease (deadline {deadline_ms}, killed at {killed_ms})"
    );
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        (holders[0].fence, holders[0].label.as_str()),
        (child_fence, "doomed")
    );

    // Until shortly before the deadline, try_acquire keeps failing. An
    // attempt that *completed* before the deadline (wall clock = Redis's
    // clock) ran before it, so it must have been refused.
    let mut refused = 0;
    let mut refused_late = false;
    let mut back = None;
    while wall_ms() < deadline_ms - 250 {
        let result = sem.try_acquire().await;
        let done_ms = wall_ms();
        match result {
            Err(LeaseError::NoPermits { retry_after, limit }) => {
                assert_eq!(limit, 1);
                let hint = retry_after.expect("a lease is held");
                assert!(!hint.is_zero() && hint <= CRASH_TTL, "{hint:?}");
                refused += 1;
                refused_late |= done_ms >= deadline_ms - 600;
            }
            Ok(permit) => {
                assert!(
                    done_ms >= deadline_ms,
                    "granted {} ms before the dead holder's lease ran out",
                    deadline_ms - done_ms
                );
                back = Some(permit);
                break;
            }
            Err(e) => panic!("try_acquire failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(refused > 0, "no attempt right after the kill");
    assert!(refused_late, "no refused attempt in the last 600 ms");

    // A waiting acquire: max_poll is 10 s, so only the lease deadline that
    // Redis reported can wake it in time.
    let permit = match back {
        Some(permit) => permit,
        None => timeout(
            (CRASH_TTL + Duration::from_secs(1)).saturating_sub(killed.elapsed()),
            sem.acquire(),
        )
        .await
        .expect("the permit did not come back within TTL + 1 s of the kill")
        .unwrap(),
    };
    let back_after = killed.elapsed();
    assert!(permit.fence() > child_fence);
    assert!(
        granted_at_ms(&server, CRASH, permit.id()) >= deadline_ms,
        "granted by Redis before the dead holder's lease ran out"
    );
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].id, permit.id());
    permit.release().await.unwrap();
    eprintln!(
        "killed holder: lease lived {} ms after its grant, back {back_after:?} after the kill",
        deadline_ms - granted_ms
    );
}

// ---------------------------------------------------------------------------
// 3. A frozen holder loses its lease and is told so
// ---------------------------------------------------------------------------

const FROZEN: &str = "frozen";

/// Child of `a_frozen_holder_loses_its_lease`: holds with a 1 s TTL, waits
/// for the loss, then releases and reports what `release` said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_through_a_freeze() {
    if !is_child() {
        return;
    }
    let sem = builder(&env(ENV_URL), FROZEN)
        .limit(1)
        .lease_ttl(Duration::from_secs(1))
        .label("frozen")
        .build()
        .await
        .unwrap();
    let permit = sem.try_acquire().await.unwrap();
    println!("HOLDING fence={} id={}", permit.fence(), permit.id());
    let reason = timeout(Duration::from_secs(30), permit.lost())
        .await
        .expect("the loss was never noticed");
    assert!(permit.is_lost());
    assert_eq!(permit.lost_reason(), Some(reason));
    println!("LOST {reason:?}");
    match permit.release().await {
        Err(ReleaseError::Overrun { by }) => println!("RELEASE overrun by={by:?}"),
        Ok(()) => println!("RELEASE ok"),
        Err(e) => println!("RELEASE error {e}"),
    }
    assert_eq!(sem.held_here(), 0);
}

/// SIGSTOP a holder past its TTL: another client gets the permit with a
/// higher fence (not before the frozen lease's deadline in Redis), and once
/// thawed the holder learns it lost the lease and its release reports an
/// overrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lease() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), FROZEN)
        .limit(1)
        .lease_ttl(Duration::from_secs(5))
        .max_poll(Duration::from_secs(10))
        .label("thief")
        .build()
        .await
        .unwrap();
    let mut child = ChildTest::spawn("child_holds_through_a_freeze", &[(ENV_URL, server.url())]);
    let line = blocking(|| child.expect_line("HOLDING", PATIENCE));
    let (child_fence, child_id) = parse_holding(&line);
    child.stop();
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let deadline_ms = lease_deadline_ms(&server, FROZEN, &child_id);

    let permit = timeout(Duration::from_secs(5), sem.acquire())
        .await
        .expect("the frozen holder's permit never came back")
        .unwrap();
    let took = stopped.elapsed();
    assert!(permit.fence() > child_fence);
    if let Some(deadline_ms) = deadline_ms {
        assert!(granted_at_ms(&server, FROZEN, permit.id()) >= deadline_ms);
    }
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} for a 1 s lease"
    );

    child.cont();
    let lost = blocking(|| child.expect_line("LOST", Duration::from_secs(5)));
    // The lease's local deadline passed during the freeze, so the holder
    // counts it lost the moment it runs again, before any renewal:
    // `Stalled`, or `Unreachable` if the freeze caught a renewal in flight.
    assert!(
        lost == "LOST Stalled" || lost == "LOST Unreachable",
        "unexpected {lost:?}"
    );
    let release = blocking(|| child.expect_line("RELEASE", Duration::from_secs(5)));
    assert!(release.starts_with("RELEASE overrun"), "{release:?}");
    blocking(|| child.assert_success(PATIENCE));

    // The new holder is unaffected.
    assert!(!permit.is_lost());
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].id.as_str(), holders[0].fence),
        (permit.id(), permit.fence())
    );
    permit.release().await.unwrap();
    eprintln!("frozen holder: permit taken over after {took:?}; child said {lost:?}, {release:?}");
}

/// While Redis does not answer, a holder's lease is marked lost once its
/// local deadline passes (the distributed guide,
/// `watertight::guide::distributed`: a held permit stays valid until its
/// local deadline passes without a renewal, and is lost then), not only
/// when a renewal finally times out, up to
/// `renew_every + response_timeout` later. (Were the holder partitioned away
/// rather than Redis frozen, a client that can reach Redis would be granted
/// the permit at about that local deadline, while the holder still believes
/// it holds it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_holder_is_told_at_its_deadline() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), "unreachable")
        .limit(1)
        .lease_ttl(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let permit = sem.acquire().await.unwrap();
    server.freeze();
    let lost = timeout(Duration::from_secs(10), permit.lost()).await;
    let lost_at = Instant::now();
    server.thaw();
    let reason = lost.expect("the holder was never told");
    assert_eq!(reason, LostReason::Unreachable);
    // No renewal succeeded while frozen, so this is the deadline it had.
    let deadline = permit.deadline();
    let late = lost_at.saturating_duration_since(deadline);
    let released = permit.release().await;
    assert!(
        matches!(released, Err(ReleaseError::Overrun { .. })),
        "{released:?}"
    );
    assert!(
        late < Duration::from_millis(500),
        "the lease was marked lost {late:?} after its local deadline"
    );
}

// ---------------------------------------------------------------------------
// 4. Restarted server, flushed scripts
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
enum WaitOutcome {
    Granted,
    Unavailable,
}

/// Waiters in `acquire` while the server restarts (empty: leases, limit and
/// scripts gone) each end with a permit or `Unavailable`, none hangs; the
/// holders whose leases the restart forgot are told they lost them; and
/// acquiring works again afterwards (scripts loaded anew after NOSCRIPT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_server_restart() {
    const NAME: &str = "restart";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let server = Arc::new(server);
    let holder_sem = builder(&server.url(), NAME)
        .limit(2)
        .lease_ttl(Duration::from_secs(2))
        .max_poll(Duration::from_millis(300))
        .label("holder")
        .build()
        .await
        .unwrap();
    let waiter_sem = builder(&server.url(), NAME)
        .limit(2)
        .lease_ttl(Duration::from_secs(2))
        .max_poll(Duration::from_millis(300))
        .label("waiter")
        .build()
        .await
        .unwrap();
    let held = [
        holder_sem.acquire().await.unwrap(),
        holder_sem.acquire().await.unwrap(),
    ];
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let sem = waiter_sem.clone();
            tokio::spawn(async move {
                match timeout(Duration::from_secs(10), sem.acquire()).await {
                    Ok(Ok(permit)) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        let _ = permit.release().await;
                        WaitOutcome::Granted
                    }
                    Ok(Err(LeaseError::Unavailable(_))) => WaitOutcome::Unavailable,
                    Ok(Err(e)) => panic!("waiter failed with {e:?}"),
                    Err(_) => panic!("a waiter hung across the restart"),
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "nobody may get in"
    );

    let restart = Instant::now();
    tokio::task::spawn_blocking({
        let server = server.clone();
        move || server.restart()
    })
    .await
    .unwrap();
    let restarted_in = restart.elapsed();

    let mut outcomes = Vec::new();
    for waiter in waiters {
        outcomes.push(
            timeout(PATIENCE, waiter)
                .await
                .expect("waiter task hung")
                .unwrap(),
        );
    }
    let waiters_done = restart.elapsed();

    // The restart forgot the holders' leases: their renewals say so.
    for permit in held {
        let reason = timeout(Duration::from_secs(5), permit.lost())
            .await
            .expect("a holder whose lease was forgotten was not told");
        let released = permit.release().await;
        match reason {
            LostReason::Expired => assert!(
                matches!(released, Err(ReleaseError::Overrun { .. })),
                "{released:?}"
            ),
            LostReason::Unreachable => assert!(released.is_err(), "{released:?}"),
            other => panic!("unexpected reason {other:?}"),
        }
    }
    assert_eq!(holder_sem.held_here(), 0);

    // A fresh acquire works on both handles once they have reconnected.
    for sem in [&holder_sem, &waiter_sem] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let permit = loop {
            match timeout(Duration::from_secs(5), sem.acquire()).await {
                Ok(Ok(permit)) => break permit,
                Ok(Err(LeaseError::Unavailable(e))) if Instant::now() < deadline => {
                    eprintln!("still reconnecting: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!("no permit after the restart: {other:?}"),
            }
        };
        assert_eq!(sem.limit_seen(), 2, "the default limit is installed again");
        permit.release().await.unwrap();
    }
    assert!(cached_scripts(&server) > 0);
    assert!(waiter_sem.holders().await.unwrap().is_empty());
    // Both handles subscribed again to the new server's channel.
    wait_subscribers(&server, NAME, 2).await;
    eprintln!(
        "restart: server back in {restarted_in:?}, waiters done {waiters_done:?} after it stopped: {outcomes:?}"
    );
}

/// A waiting `acquire` against a server that answers nothing (frozen)
/// gives up with `Unavailable` once `outage_tolerance` has passed since it
/// first went unanswered: it may finish the attempt under way, but starts
/// no new one after that (docs: it "keeps trying while Redis is unreachable
/// ... before it fails"). Here one attempt (3 calls of 400 ms, back-offs of
/// 40 and 80 ms) takes ~1.3 s, longer than the 300 ms tolerance, so the
/// first unanswered attempt is the last. Afterwards, the grants that ran
/// once the server thawed are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gives_up_on_a_frozen_server_within_outage_tolerance() {
    const NAME: &str = "outage";
    const TOLERANCE: Duration = Duration::from_millis(300);
    const ATTEMPT: Duration = Duration::from_millis(3 * 400 + 40 + 80);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), NAME)
        .limit(1)
        .lease_ttl(Duration::from_secs(10))
        .response_timeout(Duration::from_millis(400))
        .retries(2)
        .outage_tolerance(TOLERANCE)
        .build()
        .await
        .unwrap();
    sem.try_acquire().await.unwrap().release().await.unwrap();
    server.freeze();
    let start = Instant::now();
    let result = timeout(Duration::from_secs(20), sem.acquire()).await;
    let took = start.elapsed();
    server.thaw();
    match result {
        Ok(Err(LeaseError::Unavailable(_))) => {}
        Ok(other) => panic!("expected Unavailable, got {other:?}"),
        Err(_) => panic!("acquire hung on a frozen server"),
    }
    // Whatever the verdict on timing, nothing is left behind: the grants
    // queued in the frozen server ran at the thaw, then their release.
    wait_no_holders(&sem, Duration::from_secs(3)).await;
    assert!(
        took < TOLERANCE + ATTEMPT + Duration::from_millis(500),
        "acquire kept trying for {took:?} with an outage tolerance of {TOLERANCE:?} \
         (one attempt takes ~{ATTEMPT:?}): it started a new attempt after the tolerance"
    );
}

/// `limit()` reports the limit stored in Redis, "installing the builder's
/// if none is" (its docs): on a fresh server, and after a restart forgot
/// the limit set before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_installs_the_builders_limit_when_none_is_stored() {
    const NAME: &str = "limit";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    // The restart below loses the epoch marker, which quarantines grants
    // (tests/redis_failover.rs): off here, where the limit is tested.
    let sem = builder(&server.url(), NAME)
        .limit(4)
        .quarantine(false)
        .build()
        .await
        .unwrap();
    let stored = || server.cmd::<Option<String>>(&["GET", &key(NAME, "limit")]);
    let fresh = sem.limit().await.unwrap();
    let installed = stored();
    sem.set_limit(6).await.unwrap();
    assert_eq!(sem.limit().await.unwrap(), 6);
    blocking(|| server.restart());
    // The restart forgot the 6: the next acquire installs 4 again.
    let after_restart = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match sem.limit().await {
                Ok(limit) => break limit,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "no answer after the restart: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    let installed_after_restart = stored();
    sem.try_acquire().await.unwrap().release().await.unwrap();
    assert_eq!(
        sem.limit().await.unwrap(),
        4,
        "the acquire installed the default"
    );
    assert_eq!(fresh, 4);
    assert_eq!(
        installed.as_deref(),
        Some("4"),
        "limit() on a fresh server did not install the builder's limit"
    );
    assert_eq!(
        (after_restart, installed_after_restart.as_deref()),
        (4, Some("4")),
        "after a restart, limit() reported a limit Redis no longer holds"
    );
}

/// `SCRIPT FLUSH` under a held lease: renewals, releases, acquires and
/// `holders` reload their scripts (NOSCRIPT) and carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_survived() {
    const NAME: &str = "flush";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), NAME)
        .limit(1)
        .lease_ttl(Duration::from_millis(900))
        .max_poll(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let other = builder(&server.url(), NAME)
        .limit(1)
        .lease_ttl(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    let permit = sem.acquire().await.unwrap();
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(cached_scripts(&server), 0);
    // Past the TTL: only renewals that reloaded their script keep it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(!permit.is_lost(), "{:?}", permit.lost_reason());
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    let holders = other.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].id, permit.id());
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    assert!(matches!(
        other.try_acquire().await,
        Err(LeaseError::NoPermits { .. })
    ));
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    permit.release().await.unwrap();
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    let again = timeout(Duration::from_secs(5), other.acquire())
        .await
        .unwrap()
        .unwrap();
    assert!(cached_scripts(&server) > 0);
    again.release().await.unwrap();
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
}

// ---------------------------------------------------------------------------
// 5. Pub/sub wake-ups, and their loss
// ---------------------------------------------------------------------------

/// Builds a holder and a waiter handle, takes the only permit with a 30 s
/// lease (so no lease deadline wakes anyone), and waits until both are
/// subscribed.
async fn pubsub_setup(
    server: &RedisServer,
    name: &str,
    max_poll: Duration,
) -> (RedisSemaphore, RedisSemaphore, LeasedPermit) {
    let make = |label: &str| {
        builder(&server.url(), name)
            .limit(1)
            .lease_ttl(Duration::from_secs(30))
            .max_poll(max_poll)
            .label(label)
            .build()
    };
    let holder = make("holder").await.unwrap();
    let waiter = make("waiter").await.unwrap();
    let held = holder.acquire().await.unwrap();
    wait_subscribers(server, name, 2).await;
    (holder, waiter, held)
}

/// Starts a waiting acquire and checks that it is waiting.
async fn start_waiter(
    sem: &RedisSemaphore,
) -> tokio::task::JoinHandle<Result<LeasedPermit, LeaseError>> {
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held permit");
    waiter
}

/// With `max_poll` at 10 s and a 30 s lease, only a pub/sub message can
/// wake a waiter within 2 s of a release; the same holds after the pub/sub
/// connection was killed and the semaphore subscribed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_wakes_waiters_long_before_max_poll() {
    const NAME: &str = "wake";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let (holder, waiter_sem, held) = pubsub_setup(&server, NAME, Duration::from_secs(10)).await;
    let mut held = Some(held);
    for round in 0..2 {
        let held = match held.take() {
            Some(permit) => permit,
            None => holder.try_acquire().await.unwrap(),
        };
        let waiter = start_waiter(&waiter_sem).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let permit = timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: no wake-up within 2 s of the release"))
            .unwrap()
            .unwrap();
        eprintln!(
            "pubsub round {round}: woken {:?} after the release",
            released.elapsed()
        );
        permit.release().await.unwrap();
        if round == 0 {
            // Kill both subscriptions; wait until both are made again.
            assert_eq!(server.cmd::<i64>(&["CLIENT", "KILL", "TYPE", "pubsub"]), 2);
            wait_subscribers(&server, NAME, 2).await;
        }
    }
}

/// After a restart without persistence and the quarantine it starts, a
/// release wakes a waiter in another client by its message, as before the
/// restart, not at its next poll (`max_poll` 10 s): one that started
/// waiting after the quarantine, and one that waited across the restart
/// and the quarantine (the restart forgot its place in the line: it takes
/// one again). The subscriptions are made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_and_its_quarantine_a_release_wakes_a_waiter() {
    const NAME: &str = "wake-after-restart";
    const TTL: Duration = Duration::from_millis(1_000);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let server = Arc::new(server);
    let make = |label: &'static str| {
        builder(&server.url(), NAME)
            .limit(1)
            .lease_ttl(TTL)
            .max_poll(Duration::from_secs(10))
            .label(label)
            .build()
    };
    let holder = make("holder").await.unwrap();
    let waiter_sem = make("waiter").await.unwrap();
    wait_subscribers(&server, NAME, 2).await;
    restart(&server).await;
    let Err(LeaseError::Quarantined { retry_after }) = try_after_reconnect(&holder).await else {
        panic!("the restart starts the quarantine");
    };
    tokio::time::sleep(retry_after).await;
    wait_subscribers(&server, NAME, 2).await;
    let held = timeout(PATIENCE, holder.acquire()).await.unwrap().unwrap();
    let waiter = start_waiter(&waiter_sem).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let permit = timeout(Duration::from_secs(2), waiter)
        .await
        .expect("no wake-up within 2 s of the release: the waiter waited for its poll")
        .unwrap()
        .unwrap();
    let woken = released.elapsed();
    assert!(woken < Duration::from_secs(2), "{woken:?}");
    permit.release().await.unwrap();

    // A waiter that waited across the restart and the quarantine.
    let held = holder.try_acquire().await.unwrap();
    let waiter = start_waiter(&waiter_sem).await;
    restart(&server).await;
    let Err(LeaseError::Quarantined { retry_after }) = try_after_reconnect(&holder).await else {
        panic!("the second restart starts a quarantine of its own");
    };
    drop(held); // forgotten by the restart
    tokio::time::sleep(retry_after).await;
    let held = timeout(PATIENCE, holder.acquire()).await.unwrap();
    let held = match held {
        Ok(held) => held,
        Err(e) => panic!("the holder after the quarantine: {e}"),
    };
    // The waiter's place in line, which the restart forgot, taken again.
    wait_in_line(&server, NAME, 1);
    let released = Instant::now();
    held.release().await.unwrap();
    let permit = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter across the restart was not woken within 5 s")
        .unwrap()
        .unwrap();
    // By its message: a poll would have come 10 s after its last one.
    let woken = released.elapsed();
    assert!(
        woken < Duration::from_secs(1),
        "woken {woken:?} after the release"
    );
    permit.release().await.unwrap();
}

/// A waiter still gets a released permit when its pub/sub connection is
/// killed right before the release (the message may be lost), and when
/// subscribing is impossible altogether (`max_poll` is the safety net).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_killed_pubsub_connection() {
    const NAME: &str = "nopubsub";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let (holder, waiter_sem, held) = pubsub_setup(&server, NAME, Duration::from_millis(300)).await;

    // Killed right before the release.
    let waiter = start_waiter(&waiter_sem).await;
    assert_eq!(server.cmd::<i64>(&["CLIENT", "KILL", "TYPE", "pubsub"]), 2);
    let released = Instant::now();
    held.release().await.unwrap();
    let permit = timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter was stranded by the lost pub/sub connection")
        .unwrap()
        .unwrap();
    let first = released.elapsed();
    permit.release().await.unwrap();

    // Subscribing is refused from now on: no pub/sub at all.
    let held = holder.try_acquire().await.unwrap();
    assert_eq!(
        server.cmd::<String>(&["ACL", "SETUSER", "default", "-subscribe"]),
        "OK"
    );
    server.cmd::<i64>(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(subscribers(&server, NAME), 0);
    let waiter = start_waiter(&waiter_sem).await;
    let released = Instant::now();
    held.release().await.unwrap();
    assert_eq!(subscribers(&server, NAME), 0);
    let permit = timeout(Duration::from_secs(3), waiter)
        .await
        .expect("without pub/sub, max_poll did not get the waiter the permit")
        .unwrap()
        .unwrap();
    let second = released.elapsed();
    permit.release().await.unwrap();
    eprintln!("killed pub/sub: waiter served {first:?} / {second:?} after the release");
}

// ---------------------------------------------------------------------------
// 6. Dropped acquire futures leave no lease behind
// ---------------------------------------------------------------------------

/// Acquire futures dropped at every point (before the script call is sent,
/// while it is in flight, while waiting for a wake-up, right as they are
/// woken), with another client churning the only permit: no lease is left
/// behind. The TTL is 3 s, so a lease that is gone within 1 s was released,
/// not expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_no_lease() {
    const NAME: &str = "dropped";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let make = |label: &str| {
        builder(&server.url(), NAME)
            .limit(1)
            .lease_ttl(Duration::from_secs(3))
            .max_poll(Duration::from_millis(50))
            .label(label)
            .build()
    };
    let sem = make("dropper").await.unwrap();
    let churner = make("churner").await.unwrap();

    let mut granted = 0;
    let mut dropped = 0;
    let started = Instant::now();
    for phase in 0..2 {
        // Phase 1: another client takes and gives back the permit all along.
        let stop = Arc::new(AtomicBool::new(false));
        let churn = (phase == 1).then(|| {
            let churner = churner.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let permit = timeout(PATIENCE, churner.acquire())
                        .await
                        .expect("the churner starved")
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if n % 2 == 0 {
                        drop(permit);
                    } else {
                        permit.release().await.unwrap();
                    }
                    n += 1;
                }
                n
            })
        });
        for i in 0..300u64 {
            // 0 to 3 ms: dropped after the first poll, mid-call, or waiting.
            let patience = Duration::from_micros((i % 31) * 100);
            match timeout(patience, sem.acquire()).await {
                Ok(Ok(permit)) => {
                    granted += 1;
                    match i % 4 {
                        0 | 2 => drop(permit),
                        // A release polled once, then dropped: it was sent.
                        1 => drop(permit.release().now_or_never()),
                        _ => permit.release().await.unwrap(),
                    }
                }
                Ok(Err(e)) => panic!("acquire failed: {e}"),
                Err(_) => dropped += 1,
            }
            match i % 3 {
                // Polled exactly once: the script call is (at most) sent.
                0 => match sem.acquire().now_or_never() {
                    Some(result) => drop(result.unwrap()),
                    None => dropped += 1,
                },
                1 => match timeout(patience, sem.try_acquire()).await {
                    Ok(Ok(permit)) => drop(permit),
                    Ok(Err(LeaseError::NoPermits { .. })) => {}
                    Ok(Err(e)) => panic!("try_acquire failed: {e}"),
                    Err(_) => dropped += 1,
                },
                _ => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(churn) = churn {
            let rounds = timeout(PATIENCE, churn).await.unwrap().unwrap();
            assert!(rounds > 0);
        }
    }
    assert!(
        granted > 0 && dropped > 0,
        "granted {granted}, dropped {dropped}"
    );

    let gone_in = wait_no_holders(&sem, Duration::from_secs(1)).await;
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
    assert_eq!((sem.held_here(), churner.held_here()), (0, 0));
    eprintln!(
        "dropped acquires: {dropped} dropped, {granted} granted in {:?}; leases gone {gone_in:?} later",
        started.elapsed()
    );
}

/// A waiter dropped while it waits (or just as the permit comes free)
/// leaves nothing behind: each time, the holder gets the permit back well
/// within the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_no_lease() {
    const NAME: &str = "waiter";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let make = |label: &str| {
        builder(&server.url(), NAME)
            .limit(1)
            .lease_ttl(Duration::from_secs(5))
            .max_poll(Duration::from_millis(100))
            .label(label)
            .build()
    };
    let holder = make("holder").await.unwrap();
    let waiters = make("waiter").await.unwrap();
    let mut held = holder.acquire().await.unwrap();
    let mut raced = 0;
    for i in 0..20u64 {
        let waiter = tokio::spawn({
            let waiters = waiters.clone();
            async move { waiters.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished());
        if i % 2 == 0 {
            // Dropped while it waits.
            waiter.abort();
            held.release().await.unwrap();
        } else {
            // Dropped around its wake-up: mid-call or just granted.
            held.release().await.unwrap();
            tokio::time::sleep(Duration::from_micros((i % 7) * 300)).await;
            waiter.abort();
        }
        if let Ok(result) = waiter.await {
            raced += 1;
            drop(result.unwrap());
        }
        // A lease left behind would keep the permit for 5 s.
        held = timeout(Duration::from_secs(3), holder.acquire())
            .await
            .unwrap_or_else(|_| panic!("round {i}: the dropped waiter left a lease behind"))
            .unwrap();
    }
    held.release().await.unwrap();
    wait_no_holders(&waiters, Duration::from_secs(1)).await;
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
    assert_eq!(waiters.held_here(), 0);
    eprintln!("dropped waiters: {raced} of 20 were granted before the abort");
}

/// Acquires dropped while Redis does not answer (paused past the response
/// timeout, so the grant is retried with the same id, and dropped during
/// the retry's call or its back-off): the grants that run once Redis
/// answers again are released, and in any case no lease outlives its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_dropped_while_redis_stalls_leave_no_lease() {
    const NAME: &str = "stall";
    const TTL: Duration = Duration::from_millis(1500);
    const PAUSE: Duration = Duration::from_millis(1000);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    // Only the dropped acquires use the 100 ms response timeout; every
    // check goes through a handle with the default one, so that a loaded
    // machine cannot fail it.
    let sem = builder(&server.url(), NAME)
        .limit(1)
        .lease_ttl(TTL)
        .response_timeout(Duration::from_millis(100))
        .retries(2)
        .max_poll(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let observer = builder(&server.url(), NAME)
        .limit(1)
        .lease_ttl(TTL)
        .max_poll(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    // Warm up: the scripts are loaded, the connection is up.
    drop(sem.acquire().await.unwrap());
    wait_no_holders(&observer, Duration::from_secs(5)).await;

    server.pause(PAUSE);
    let paused = Instant::now();
    // First call times out at ~100 ms, back-off 40 ms, second call sent at
    // ~140 ms: dropped mid-call at 190 ms; then one dropped mid-back-off.
    for patience in [190, 120] {
        let r = timeout(Duration::from_millis(patience), sem.acquire()).await;
        assert!(r.is_err(), "an acquire completed while Redis was paused");
    }
    assert!(paused.elapsed() < PAUSE, "too slow to test");
    // The paused grants run when the pause ends, each followed by its
    // release.
    tokio::time::sleep(PAUSE.saturating_sub(paused.elapsed())).await;
    let gone = timeout(
        Duration::from_secs(5),
        wait_no_holders(&observer, Duration::from_secs(4)),
    )
    .await
    .unwrap();
    let released_in_time = gone < TTL - Duration::from_millis(300);
    // Whatever happened, nothing renews them: after one TTL, nothing is held.
    tokio::time::sleep(TTL).await;
    assert!(observer.holders().await.unwrap().is_empty());
    assert_eq!(sem.held_here(), 0);
    let again = timeout(Duration::from_secs(5), observer.acquire())
        .await
        .unwrap()
        .unwrap();
    again.release().await.unwrap();
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
    assert!(
        released_in_time,
        "the abandoned grants were not released: they expired {gone:?} after Redis answered again"
    );
}

/// The same through a `RedisBulkhead`: calls dropped while waiting or
/// mid-call leave no lease, no queued waiter and no call in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_bulkhead_acquires_leave_nothing_behind() {
    const NAME: &str = "bulkhead-drops";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let make = |label: &str| {
        builder(&server.url(), NAME)
            .limit(1)
            .lease_ttl(Duration::from_secs(3))
            .max_poll(Duration::from_millis(50))
            .label(label)
            .build()
    };
    let bulkhead = RedisBulkhead::builder(make("bulkhead").await.unwrap())
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let other = make("other").await.unwrap();
    let mut granted = 0;
    for i in 0..200u64 {
        // Someone else holds the permit half of the time.
        let held = if i % 2 == 0 {
            Some(other.acquire().await.unwrap())
        } else {
            None
        };
        let patience = Duration::from_micros((i % 23) * 150);
        let call = bulkhead.call(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, ()>(())
        });
        tokio::select! {
            r = call => {
                r.unwrap();
                granted += 1;
            }
            () = tokio::time::sleep(patience) => {}
        }
        if let Some(held) = held {
            held.release().await.unwrap();
        }
    }
    let m = bulkhead.metrics();
    assert_eq!((m.in_flight(), m.queued()), (0, 0), "{m:?}");
    wait_no_holders(&other, Duration::from_secs(1)).await;
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
    assert_eq!(bulkhead.semaphore().held_here(), 0);
    eprintln!("dropped bulkhead calls: {granted} of 200 completed");
}

// ---------------------------------------------------------------------------
// 7. smol
// ---------------------------------------------------------------------------

/// Outside any tokio runtime the backend runs on smol: connections, the
/// lease keeper (renewals past the TTL), pub/sub wake-ups and background
/// releases of dropped permits.
#[cfg(feature = "smol")]
#[test]
fn works_on_smol_outside_tokio() {
    const NAME: &str = "smol";
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.url();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        smol::block_on(async move {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let make = |label: &str| {
                builder(&url, NAME)
                    .limit(1)
                    .lease_ttl(Duration::from_millis(1500))
                    .max_poll(Duration::from_secs(10))
                    .label(label)
                    .build()
            };
            let sem = make("smol-a").await.unwrap();
            let other = make("smol-b").await.unwrap();
            let permit = sem.acquire().await.unwrap();
            assert!(matches!(
                other.try_acquire().await,
                Err(LeaseError::NoPermits { limit: 1, .. })
            ));
            // Past the TTL: renewed by the keeper on smol.
            smol::Timer::after(Duration::from_millis(1800)).await;
            assert!(!permit.is_lost(), "{:?}", permit.lost_reason());
            let holders = other.holders().await.unwrap();
            assert_eq!(holders.len(), 1);
            assert_eq!(holders[0].id, permit.id());
            assert_eq!(holders[0].label, "smol-a");

            // A waiter woken by pub/sub (max_poll is 10 s, the lease is
            // renewed).
            let waiter = smol::spawn({
                let other = other.clone();
                async move { other.acquire().await }
            });
            smol::Timer::after(Duration::from_millis(200)).await;
            assert!(!waiter.is_finished());
            let released = Instant::now();
            permit.release().await.unwrap();
            let got = waiter.await.unwrap();
            assert!(
                released.elapsed() < Duration::from_secs(3),
                "woken after {:?}",
                released.elapsed()
            );
            // A dropped permit is released in the background on smol (its
            // lease, renewed every 500 ms, would live for 1 s at least).
            drop(got);
            let start = Instant::now();
            while !sem.holders().await.unwrap().is_empty() {
                assert!(start.elapsed() < Duration::from_millis(700), "not released");
                smol::Timer::after(Duration::from_millis(10)).await;
            }
            let last = sem.try_acquire().await.unwrap();
            last.release().await.unwrap();
        });
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the smol test hung"),
    }
    assert_eq!(raw_lease_counts(&server, NAME), (0, 0));
}

// ---------------------------------------------------------------------------
// 8. holders()
// ---------------------------------------------------------------------------

fn holder_of<'a>(holders: &'a [Holder], permit: &LeasedPermit) -> &'a Holder {
    holders
        .iter()
        .find(|h| h.id == permit.id())
        .unwrap_or_else(|| panic!("{} not among {holders:?}", permit.id()))
}

/// `holders` lists every unexpired lease: its id, fence, label (set or the
/// default `host/pid`), an age that grows past the TTL while renewals keep
/// `expires_in` within it, earliest deadline first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_lists_labels_fences_and_ages() {
    const NAME: &str = "holders";
    const TTL: Duration = Duration::from_millis(1200);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let make = |label: Option<&str>| {
        let b = builder(&server.url(), NAME).limit(3).lease_ttl(TTL);
        match label {
            Some(label) => b.label(label),
            None => b,
        }
        .build()
    };
    let alpha = make(Some("alpha:with:colons")).await.unwrap();
    let beta = make(Some("beta")).await.unwrap();
    let anon = make(None).await.unwrap();
    assert!(alpha.holders().await.unwrap().is_empty());

    let a = alpha.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let b = beta.acquire().await.unwrap();
    let c = anon.acquire().await.unwrap();
    assert!(a.fence() < b.fence() && b.fence() < c.fence());

    let holders = beta.holders().await.unwrap();
    assert_eq!(holders.len(), 3, "{holders:?}");
    let (ha, hb, hc) = (
        holder_of(&holders, &a),
        holder_of(&holders, &b),
        holder_of(&holders, &c),
    );
    assert_eq!(
        (ha.fence, ha.label.as_str()),
        (a.fence(), "alpha:with:colons")
    );
    assert_eq!((hb.fence, hb.label.as_str()), (b.fence(), "beta"));
    assert_eq!(hc.fence, c.fence());
    assert!(
        hc.label.ends_with(&format!("/{}", std::process::id())),
        "default label {:?}",
        hc.label
    );
    // Ages on Redis's clock, in whole ms: b was granted ≥ 150 ms after a.
    assert!(
        ha.age >= hb.age + Duration::from_millis(149),
        "{ha:?} {hb:?}"
    );
    for h in &holders {
        assert!(h.expires_in <= TTL && !h.expires_in.is_zero(), "{h:?}");
    }
    assert!(
        holders
            .windows(2)
            .all(|w| w[0].expires_in <= w[1].expires_in),
        "earliest deadline first: {holders:?}"
    );

    // Past the TTL, renewed: older than the TTL, still expiring within it.
    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    let later = alpha.holders().await.unwrap();
    assert_eq!(later.len(), 3, "{later:?}");
    let ha2 = holder_of(&later, &a);
    assert!(
        ha2.age >= ha.age + TTL + Duration::from_millis(299),
        "{ha:?} {ha2:?}"
    );
    assert!(ha2.age > TTL);
    for h in &later {
        assert!(h.expires_in <= TTL && !h.expires_in.is_zero(), "{h:?}");
    }
    assert!(!a.is_lost() && !b.is_lost() && !c.is_lost());

    b.release().await.unwrap();
    let left = anon.holders().await.unwrap();
    let mut ids: Vec<_> = left.iter().map(|h| h.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec![a.id(), c.id()];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert_eq!(anon.limit().await.unwrap(), 3);
    a.release().await.unwrap();
    c.release().await.unwrap();
    assert!(alpha.holders().await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// Quarantine after Redis lost writes
// ---------------------------------------------------------------------------

/// A client granted fence 1, after Redis restarted empty, finds the fence
/// counter behind what it was granted: its next acquire refuses grants to
/// every client for one lease time to live, and the fences go on from
/// where they were, never repeating one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counter_gone_back_quarantines_every_client() {
    const NAME: &str = "quarantine-fence";
    const TTL: Duration = Duration::from_millis(1_000);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let server = Arc::new(server);
    let a = builder(&server.url(), NAME)
        .lease_ttl(TTL)
        .build()
        .await
        .unwrap();
    let b = builder(&server.url(), NAME)
        .lease_ttl(TTL)
        .build()
        .await
        .unwrap();
    let first = a.try_acquire().await.unwrap();
    let fence = first.fence();
    first.release().await.unwrap();

    restart(&server).await;
    let refused = Instant::now();
    let Err(LeaseError::Quarantined { retry_after }) = try_after_reconnect(&a).await else {
        panic!("the client that saw a fence must find the counter gone back")
    };
    assert!(
        retry_after <= TTL && retry_after > TTL / 2,
        "{retry_after:?}"
    );
    // Every client is refused, not only the one that noticed.
    assert!(matches!(
        b.try_acquire().await,
        Err(LeaseError::Quarantined { .. })
    ));
    // A waiting acquire waits the quarantine out.
    let permit = timeout(PATIENCE, b.acquire()).await.unwrap().unwrap();
    let waited = refused.elapsed();
    assert!(waited >= TTL - Duration::from_millis(50), "{waited:?}");
    assert!(
        permit.fence() > fence,
        "fences never repeat: {} after {fence}",
        permit.fence()
    );
    permit.release().await.unwrap();
}

/// One restart without persistence is one quarantine, whatever the
/// number of clients built before it and the order they come back in:
/// 1, 3 and 10 idle clients, the first to try after the restart starts
/// the quarantine, one more tries during it and is refused for what is
/// left of it, and every client trying after it is granted (none starts a
/// second one). Grants resume one time to live after the first refusal,
/// within the margin below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_restart_is_one_quarantine_for_every_client() {
    const TTL: Duration = Duration::from_millis(1_000);
    for clients in [1, 3, 10] {
        let name = format!("one-quarantine-{clients}");
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let server = Arc::new(server);
        let mut all = Vec::new();
        for _ in 0..clients {
            all.push(
                builder(&server.url(), &name)
                    .lease_ttl(TTL)
                    .build()
                    .await
                    .unwrap(),
            );
        }
        restart(&server).await;

        let before = Instant::now();
        let first = try_after_reconnect(&all[0]).await;
        let Err(LeaseError::Quarantined { retry_after }) = first else {
            panic!("{clients}: the first client back must start the quarantine: {first:?}");
        };
        let detected = Instant::now();
        assert!(
            retry_after <= TTL && retry_after > TTL / 2,
            "{retry_after:?}"
        );
        if clients > 1 {
            // During it: refused for what is left, not a new one.
            let during = try_after_reconnect(&all[1]).await;
            let Err(LeaseError::Quarantined { retry_after: left }) = during else {
                panic!("{clients}: a client during the quarantine is refused: {during:?}");
            };
            assert!(
                left <= retry_after,
                "{clients}: {left:?} after {retry_after:?}"
            );
        }
        tokio::time::sleep(retry_after).await;
        // The first grant after it, then every client in turn, each
        // granted at its first try (after reconnecting).
        let resumed = loop {
            match all[0].try_acquire().await {
                Ok(permit) => {
                    permit.release().await.unwrap();
                    break before.elapsed();
                }
                Err(LeaseError::Quarantined { retry_after }) => {
                    tokio::time::sleep(retry_after.max(Duration::from_millis(5))).await;
                }
                Err(e) => panic!("{clients}: {e}"),
            }
        };
        let bound = detected.duration_since(before) + TTL + Duration::from_millis(250);
        assert!(
            resumed <= bound,
            "{clients}: grants resumed after {resumed:?}, not by {bound:?}"
        );
        for (i, client) in all.iter().enumerate().skip(1) {
            match try_after_reconnect(client).await {
                Ok(permit) => permit.release().await.unwrap(),
                other => panic!("{clients}: client {i} after the quarantine: {other:?}"),
            }
        }
    }
}

/// Who comes back first after a restart without persistence.
#[derive(Debug, Clone, Copy)]
enum FirstBack {
    /// An idle client's `try_acquire`.
    Idle,
    /// The holder's renewal, which finds its lease gone.
    Holder,
    /// The waiter's own retry.
    Waiter,
}

/// A holder, a waiter (limit 1) and two idle clients, built before a
/// restart without persistence, each of them first back in turn: one
/// quarantine. The waiter is granted within one time to live of when the
/// first sign could come (the restart, plus `renew_every` for the
/// holder's renewal or `max_poll` for the waiter's retry) plus a margin;
/// the idle client that comes after it is told the permit is busy, not
/// quarantined; never more than one lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_restart_is_one_quarantine_with_a_holder_and_a_waiter() {
    const TTL: Duration = Duration::from_millis(1_000);
    const EVERY: Duration = Duration::from_millis(200);
    for first in [FirstBack::Idle, FirstBack::Holder, FirstBack::Waiter] {
        let name = format!("one-quarantine-{first:?}");
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let server = Arc::new(server);
        let build = || async {
            builder(&server.url(), &name)
                .limit(1)
                .lease_ttl(TTL)
                .renew_every(EVERY)
                .max_poll(EVERY)
                .build()
                .await
                .unwrap()
        };
        let (holder, waiter, idle, late) =
            (build().await, build().await, build().await, build().await);
        let held = holder.try_acquire().await.unwrap();
        let waiting = tokio::spawn(async move {
            let permit = waiter.acquire().await;
            (permit, Instant::now())
        });
        wait_in_line(&server, &name, 1);
        restart(&server).await;
        let back = Instant::now();
        match first {
            FirstBack::Idle => {
                let refused = try_after_reconnect(&idle).await;
                assert!(
                    matches!(refused, Err(LeaseError::Quarantined { .. })),
                    "{refused:?}"
                );
            }
            FirstBack::Holder => {
                let lost = timeout(PATIENCE, async {
                    while !held.is_lost() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                });
                lost.await
                    .expect("the holder's renewal finds its lease gone");
            }
            // The waiter's retries come on their own.
            FirstBack::Waiter => {}
        }
        let (permit, granted_at) = timeout(PATIENCE, waiting).await.unwrap().unwrap();
        let permit = permit.unwrap_or_else(|e| panic!("{first:?}: the waiter: {e}"));
        let granted = granted_at.duration_since(back);
        let bound = EVERY + TTL + Duration::from_millis(300);
        assert!(
            granted <= bound,
            "{first:?}: granted {granted:?} after the restart"
        );
        assert!(
            granted >= TTL / 2,
            "{first:?}: granted {granted:?}, inside the quarantine"
        );
        assert_eq!(raw_lease_counts(&server, &name).0, 1, "{first:?}");
        // No second quarantine: the late client finds the permit busy.
        match try_after_reconnect(&late).await {
            Err(LeaseError::NoPermits { .. }) => {}
            other => panic!("{first:?}: the late client: {other:?}"),
        }
        permit.release().await.unwrap();
        let again = try_after_reconnect(&late).await;
        let again = again.unwrap_or_else(|e| panic!("{first:?}: the late client: {e}"));
        again.release().await.unwrap();
        drop(held);
    }
}

/// A holder whose renewal finds its lease gone before its own deadline
/// (Redis forgot it) starts the quarantine at once, so that a client that
/// was never granted anything is refused too; with `quarantine(false)`,
/// the forgotten permit is granted again at once (more than `limit` at
/// work), which is what the quarantine prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_lease_found_by_its_renewal_quarantines_new_grants() {
    const TTL: Duration = Duration::from_millis(1_500);
    for quarantine in [true, false] {
        let name = format!("quarantine-renew-{quarantine}");
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let server = Arc::new(server);
        let holder = builder(&server.url(), &name)
            .lease_ttl(TTL)
            .quarantine(quarantine)
            .build()
            .await
            .unwrap();
        let newcomer = builder(&server.url(), &name)
            .lease_ttl(TTL)
            .quarantine(quarantine)
            .build()
            .await
            .unwrap();
        let held = holder.try_acquire().await.unwrap();
        restart(&server).await;
        // The holder's next renewal (a third of the time to live) finds the
        // lease gone, well before the holder's own deadline.
        let reason = timeout(TTL, held.lost())
            .await
            .expect("the renewal finds it gone");
        assert_eq!(reason, LostReason::Expired);
        let got = try_after_reconnect(&newcomer).await;
        if quarantine {
            assert!(
                matches!(got, Err(LeaseError::Quarantined { .. })),
                "{got:?}"
            );
        } else {
            let permit = got.expect("without the quarantine, granted again at once");
            permit.release().await.unwrap();
        }
        let _ = held.release().await;
    }
}

/// A Redis bulkhead refused by a quarantine says so: `Unavailable`, with
/// the semaphore's `LeaseError::Quarantined` as the rejection's source, for
/// a call that fails fast and for one whose `max_wait` runs out while the
/// quarantine lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_by_a_quarantine_names_it_as_its_source() {
    use std::error::Error;
    use watertight::RejectReason;
    const TTL: Duration = Duration::from_millis(2_000);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let server = Arc::new(server);
    let make = || {
        builder(&server.url(), "quarantine-source")
            .lease_ttl(TTL)
            .build()
    };
    let fast = RedisBulkhead::builder(make().await.unwrap())
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let patient = RedisBulkhead::builder(make().await.unwrap())
        .max_wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let quarantined_source = |rejected: &watertight::Rejected| {
        matches!(
            rejected.source().and_then(|e| e.downcast_ref::<LeaseError>()),
            Some(LeaseError::Quarantined { retry_after }) if *retry_after <= TTL
        )
    };
    restart(&server).await;

    // The fail-fast caller: out of reach while it reconnects, then the
    // quarantine it starts.
    let deadline = Instant::now() + PATIENCE;
    let rejected = loop {
        let rejected = fast.try_acquire().await.unwrap_err();
        assert_eq!(rejected.reason(), RejectReason::Unavailable, "{rejected}");
        let cause = rejected
            .source()
            .and_then(|e| e.downcast_ref::<LeaseError>());
        match cause {
            Some(LeaseError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => break rejected,
        }
    };
    let quarantine_began = Instant::now();
    assert!(quarantined_source(&rejected), "{rejected:?}");

    // The waiting caller joins that quarantine and runs out of `max_wait`
    // in it (its reconnection may take part of the wait).
    let rejected = timeout(PATIENCE, patient.acquire())
        .await
        .expect("acquire hung")
        .unwrap_err();
    assert!(
        quarantine_began.elapsed() < TTL,
        "the quarantine was over before the wait ended: the test proves nothing"
    );
    assert_eq!(rejected.reason(), RejectReason::Unavailable, "{rejected}");
    let cause = rejected
        .source()
        .and_then(|e| e.downcast_ref::<LeaseError>());
    assert!(
        quarantined_source(&rejected) || matches!(cause, Some(LeaseError::Unavailable(_))),
        "{rejected:?}"
    );
}

// ---------------------------------------------------------------------------
// One restart, one quarantine, for a fleet of processes
// ---------------------------------------------------------------------------

const FLEET: &str = "fleet";
const FLEET_TTL: Duration = Duration::from_millis(1_000);
const ENV_ROLE: &str = "WATERTIGHT_TEST_ROLE";
const ENV_GO: &str = "WATERTIGHT_TEST_GO";

/// What a client of the fleet saw, in wall-clock ms (the processes share
/// this machine's clock).
#[derive(Default)]
struct Seen {
    /// Each refusal for a quarantine: (when, when it ends).
    quarantined: Vec<(i64, i64)>,
    granted: i64,
}

/// `try_acquire` until granted (a refusal for a quarantine sleeps out what
/// is left of it; a busy permit or a connection not yet made again is
/// tried again 20 ms later); the permit held 30 ms inside the probe.
async fn until_granted(sem: &RedisSemaphore, probe: &str, seen: &mut Seen) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "never granted");
        match sem.try_acquire().await {
            Ok(permit) => {
                seen.granted = wall_ms();
                let held = ProbeClient::enter(probe);
                tokio::time::sleep(Duration::from_millis(30)).await;
                assert!(!permit.is_lost());
                held.exit();
                permit.release().await.expect("released in time");
                return;
            }
            Err(LeaseError::Quarantined { retry_after }) => {
                let now = wall_ms();
                seen.quarantined
                    .push((now, now + retry_after.as_millis() as i64));
                tokio::time::sleep(retry_after).await;
            }
            Err(LeaseError::NoPermits { .. } | LeaseError::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Child of `one_restart_is_one_quarantine_for_a_fleet_of_processes`: a
/// client built before the restart, as a `holder` (holds the permit until
/// its renewal finds the lease gone, then asks again), a `waiter` (waits
/// in the fair line across the restart) or `idle` (first asks once the
/// parent creates the file `WATERTIGHT_TEST_GO`). Prints `READY`, then
/// `DONE` with what it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_rides_out_a_restart() {
    if !is_child() {
        return;
    }
    let (url, probe, role) = (env(ENV_URL), env(ENV_PROBE), env(ENV_ROLE));
    let sem = builder(&url, FLEET)
        .lease_ttl(FLEET_TTL)
        .renew_every(Duration::from_millis(200))
        .max_poll(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let mut seen = Seen::default();
    let mut lost = 0;
    match role.as_str() {
        "holder" => {
            let permit = sem.acquire().await.unwrap();
            let held = ProbeClient::enter(probe.as_str());
            println!("READY");
            timeout(PATIENCE, permit.lost())
                .await
                .expect("the restart never cost the holder its lease");
            held.exit();
            lost = wall_ms();
            drop(permit);
            until_granted(&sem, &probe, &mut seen).await;
        }
        "waiter" => {
            let waiting = tokio::spawn({
                let sem = sem.clone();
                async move { sem.acquire().await }
            });
            println!("READY");
            let permit = timeout(PATIENCE, waiting)
                .await
                .expect("the waiter was never granted")
                .unwrap()
                .expect("the waiter's acquire failed");
            seen.granted = wall_ms();
            let held = ProbeClient::enter(probe.as_str());
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert!(!permit.is_lost());
            held.exit();
            permit.release().await.expect("released in time");
        }
        _ => {
            println!("READY");
            let go = std::path::PathBuf::from(env(ENV_GO));
            let deadline = Instant::now() + PATIENCE;
            while !go.exists() {
                assert!(Instant::now() < deadline, "no go from the parent");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            until_granted(&sem, &probe, &mut seen).await;
        }
    }
    let quarantined: Vec<String> = seen
        .quarantined
        .iter()
        .map(|(at, end)| format!("{at}:{end}"))
        .collect();
    println!(
        "DONE granted={} lost={lost} quarantined={}",
        seen.granted,
        quarantined.join(",")
    );
}

/// One restart without persistence under a fleet of processes built before
/// it (the quarantine on, a limit of 1, a time to live of 1 s): a holder,
/// a waiter in the fair line and idle clients, 1, 3 and 10 processes, the
/// idle ones asking first (right after the restart, before the holder's
/// renewal and the waiter's poll) or last (half a second later), in reverse
/// order of their start. Every refusal is for the same quarantine (their
/// ends within 100 ms of each other), no grant comes before it ends,
/// grants resume within one time to live (and the margin below) of the
/// first sign of the loss, every client is granted, and an independent
/// probe never sees two holders.
#[test]
fn one_restart_is_one_quarantine_for_a_fleet_of_processes() {
    if is_child() {
        return;
    }
    for (clients, idle_first) in [(1, false), (3, true), (3, false), (10, true), (10, false)] {
        let case = format!("{clients} processes, idle ones first: {idle_first}");
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let probe = ConcurrencyProbe::start();
        let spawn = |role: &str, go: &std::path::Path| {
            let mut child = ChildTest::spawn(
                "child_rides_out_a_restart",
                &[
                    (ENV_URL, server.url()),
                    (ENV_PROBE, probe.addr().to_string()),
                    (ENV_ROLE, role.to_owned()),
                    (ENV_GO, go.display().to_string()),
                ],
            );
            child.expect_line("READY", PATIENCE);
            child
        };
        let go = |i: usize| server.dir().join(format!("go-{i}"));
        let mut children = vec![spawn("holder", &go(0))];
        if clients > 1 {
            children.push(spawn("waiter", &go(1)));
            let queue = key(FLEET, "queue");
            let lined =
                redis_server::eventually(PATIENCE, || server.cmd::<i64>(&["ZCARD", &queue]) == 1);
            assert!(lined, "{case}: the waiter never stood in line");
        }
        for i in 2..clients {
            children.push(spawn("idle", &go(i)));
        }

        server.restart();
        let restarted = wall_ms();
        if !idle_first {
            std::thread::sleep(Duration::from_millis(500));
        }
        for i in (2..clients).rev() {
            std::fs::write(go(i), b"").unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }

        let mut granted = Vec::new();
        let mut lost = Vec::new();
        let mut refusals: Vec<(i64, i64)> = Vec::new();
        for child in &mut children {
            let line = child.expect_line("DONE ", PATIENCE);
            let field = |name: &str| -> String {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(&format!("{name}=")))
                    .unwrap_or_default()
                    .to_owned()
            };
            granted.push(field("granted").parse::<i64>().unwrap());
            let at = field("lost").parse::<i64>().unwrap();
            if at > 0 {
                lost.push(at);
            }
            for pair in field("quarantined").split(',').filter(|p| !p.is_empty()) {
                let (at, end) = pair.split_once(':').unwrap();
                refusals.push((at.parse().unwrap(), end.parse().unwrap()));
            }
            child.assert_success(PATIENCE);
        }

        assert!(
            probe.max_seen() <= 1,
            "{case}: {} holders at once",
            probe.max_seen()
        );
        assert_eq!(probe.current(), 0, "{case}");
        assert_eq!(lost.len(), 1, "{case}: the holder's lease was lost once");
        let ends: Vec<i64> = refusals.iter().map(|&(_, end)| end).collect();
        let (first_end, last_end) = (
            ends.iter().copied().min().unwrap_or(i64::MAX),
            ends.iter().copied().max().unwrap_or(i64::MIN),
        );
        assert!(
            ends.is_empty() || last_end - first_end <= 100,
            "{case}: refusals for more than one quarantine: {refusals:?}"
        );
        let resumed = granted.iter().copied().min().unwrap();
        assert!(
            ends.is_empty() || resumed >= first_end - 20,
            "{case}: granted at {resumed}, during the quarantine that ends at {first_end}"
        );
        // The first sign of the loss: the holder's renewal or a refusal.
        let detected = refusals
            .iter()
            .map(|&(at, _)| at)
            .chain(lost.iter().copied())
            .min()
            .unwrap();
        let ttl = FLEET_TTL.as_millis() as i64;
        assert!(
            resumed - detected <= ttl + 300,
            "{case}: grants resumed {} ms after the loss was found (time to live {ttl} ms)",
            resumed - detected
        );
        eprintln!(
            "{case}: loss found {} ms after the restart, grants resumed {} ms after that, \
             {} refusals, quarantine ends within {} ms of each other",
            detected - restarted,
            resumed - detected,
            refusals.len(),
            if ends.is_empty() {
                0
            } else {
                last_end - first_end
            }
        );
    }
}
