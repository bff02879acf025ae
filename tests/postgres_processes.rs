//! The PostgreSQL semaphore shared by real processes, against a real
//! server started per test: the limit held across four processes (one of
//! them through the bulkhead), a SIGKILLed holder's permit back within one
//! time to live, a SIGSTOPped holder that knows its lease is lost before
//! another process is granted it, a polite process served in arrival order
//! next to a hot one, and a killed process's dropped waiters that leave
//! nothing behind.
//!
//! Multi-process tests re-execute this binary to run one `child_*` test
//! (see `redis_server::spawn_child`, generic despite its file's name);
//! those tests do nothing in a normal run. Children read the server's URL
//! (and the rest) from environment variables, and are started together or
//! told to move on through a flag file the parent creates.
//!
//! Every wait is bounded. Timing assertions are either exact on the
//! database's clock (PostgreSQL runs on this machine, so its
//! `clock_timestamp()` is the wall clock the processes read), bracketed by
//! clock reads on both sides, or have margins far wider than the behaviour
//! they check would take if it were right.
#![cfg(all(not(loom), feature = "postgres", feature = "redis", feature = "tokio"))]

#[path = "common/pg_server.rs"]
mod pg_server;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pg_server::PgServer;
use redis_server::{ChildTest, ConcurrencyProbe, ProbeClient, is_child};
use tokio::time::{sleep, timeout};
use watertight::postgres::{LeaseError, PgBulkhead, PgSemaphore, PgSemaphoreBuilder, ReleaseError};

/// How long anything that should happen "soon" may take before a test
/// gives up (only reached when something is broken).
const PATIENCE: Duration = Duration::from_secs(15);

const ENV_URL: &str = "WATERTIGHT_TEST_PG_URL";
const ENV_PROBE: &str = "WATERTIGHT_TEST_PROBE";
const ENV_MODE: &str = "WATERTIGHT_TEST_MODE";
const ENV_NAME: &str = "WATERTIGHT_TEST_NAME";
const ENV_FLAG: &str = "WATERTIGHT_TEST_FLAG";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn builder(url: &str, name: &str) -> PgSemaphoreBuilder {
    PgSemaphore::builder(url.parse().unwrap(), name)
        .limit(1)
        .lease_ttl(Duration::from_secs(30))
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

/// Runs blocking harness calls (child output, kills) off the async
/// worker's cooperative budget.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The parent's own connection, for the rows an operator reads.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The single `bigint` a query answers.
async fn number(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Polls `sql` (a single `bigint`) every 5 ms until it answers `n`;
/// returns how long that took.
async fn until_number(db: &tokio_postgres::Client, sql: &str, n: i64) -> Duration {
    let start = Instant::now();
    loop {
        let now = number(db, sql).await;
        if now == n {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{sql} never answered {n} (still {now})"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// A time column of the lease `id`, in µs since the Unix epoch on the
/// database's clock.
async fn lease_time_us(db: &tokio_postgres::Client, column: &str, id: &str) -> Option<i64> {
    let sql = format!(
        "SELECT (extract(epoch FROM {column}) * 1000000)::bigint \
         FROM watertight.leases WHERE id = $1"
    );
    db.query_opt(&sql, &[&id]).await.unwrap().map(|r| r.get(0))
}

/// The fences handed out so far (the `fences` sequence's last value).
async fn fences_issued(db: &tokio_postgres::Client) -> u64 {
    let sql = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM watertight.fences";
    number(db, sql).await.unsigned_abs()
}

/// A wall-clock time in ns since the Unix epoch.
fn unix_ns(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

/// An instant of this process's monotonic clock on the wall clock, in ns
/// since the Unix epoch (both read together; the error is a few µs).
fn instant_unix_ns(at: Instant) -> i64 {
    let (now, wall) = (Instant::now(), unix_ns(SystemTime::now()));
    if at >= now {
        wall + i64::try_from((at - now).as_nanos()).unwrap()
    } else {
        wall - i64::try_from((now - at).as_nanos()).unwrap()
    }
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// Parses `KEY=VALUE` out of a child's line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// A file the parent creates to tell its children to move on: each child
/// polls for it. Removed when dropped.
struct Flag {
    path: PathBuf,
}

impl Flag {
    fn new(what: &str) -> Flag {
        let path = std::env::temp_dir().join(format!(
            "watertight-pg-{what}-{}-{}",
            std::process::id(),
            unix_ns(SystemTime::now())
        ));
        let _ = std::fs::remove_file(&path);
        Flag { path }
    }

    fn raise(&self) {
        std::fs::write(&self.path, b"go").unwrap();
    }

    fn env(&self) -> (&'static str, String) {
        (ENV_FLAG, self.path.to_string_lossy().into_owned())
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// In a child: whether the parent raised its flag.
fn raised() -> bool {
    Path::new(&env(ENV_FLAG)).exists()
}

/// In a child: waits (bounded) for the parent's flag.
async fn until_raised() {
    let deadline = Instant::now() + PATIENCE;
    while !raised() {
        assert!(Instant::now() < deadline, "no flag from the parent");
        sleep(Duration::from_millis(2)).await;
    }
}

// ---------------------------------------------------------------------------
// 1. Several processes share one limit
// ---------------------------------------------------------------------------

const SHARED: &str = "shared";
const SHARED_LIMIT: usize = 3;
const SHARED_PROCESSES: usize = 4;
const SHARED_TASKS: usize = 16;
const SHARED_ROUNDS: usize = 4;

/// Child of `processes_share_one_limit`: 16 tasks × 4 rounds of acquire,
/// enter the probe, hold 2–5 ms, exit the probe, release. Prints every
/// fence it was granted. With `WATERTIGHT_TEST_MODE=bulkhead` it goes
/// through a `PgBulkhead` instead of the bare semaphore.
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
    let bulkhead = PgBulkhead::builder(sem.clone())
        .max_wait(PATIENCE)
        .build()
        .unwrap();
    println!("READY");
    // Start together with the other processes.
    until_raised().await;

    let tasks: Vec<_> = (0..SHARED_TASKS)
        .map(|task| {
            let (sem, bulkhead, probe) = (sem.clone(), bulkhead.clone(), probe.clone());
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
                        sleep(hold).await;
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
                        sleep(hold).await;
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
    let list: Vec<String> = fences.iter().map(u64::to_string).collect();
    println!("FENCES {}", list.join(","));
}

/// Four processes × 16 tasks share a limit of 3 (one process through the
/// bulkhead): an independent probe never sees more than 3 holders at once
/// and sees at least 2, every round ran, every grant had a fence of its
/// own (and no fence was handed out that nobody used), and nothing is
/// left in the tables afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_share_one_limit() {
    if is_child() {
        return;
    }
    let Some(server) = PgServer::start("postgres_processes") else {
        return;
    };
    let url = server.url();
    // The schema and the semaphore's row (with its limit) first.
    let sem = builder(&url, SHARED)
        .limit(SHARED_LIMIT)
        .build()
        .await
        .unwrap();
    let db = connect(&url).await;
    let probe = ConcurrencyProbe::start();
    let go = Flag::new("go");
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
                    (ENV_URL, url.clone()),
                    (ENV_PROBE, probe.addr().to_string()),
                    (ENV_MODE, mode.to_owned()),
                    go.env(),
                ],
            )
        })
        .collect();
    blocking(|| {
        for child in &mut children {
            child.expect_line("READY", PATIENCE);
        }
    });
    let start = Instant::now();
    go.raise();

    let mut fences: Vec<u64> = Vec::new();
    blocking(|| {
        for child in &mut children {
            let line = child.expect_line("FENCES ", Duration::from_secs(60));
            fences.extend(
                line["FENCES ".len()..]
                    .split(',')
                    .map(|f| f.parse::<u64>().unwrap()),
            );
            child.assert_success(PATIENCE);
        }
    });
    let took = start.elapsed();

    let work = SHARED_PROCESSES * SHARED_TASKS * SHARED_ROUNDS;
    assert!(
        probe.max_seen() <= SHARED_LIMIT,
        "{} holders at once with a limit of {SHARED_LIMIT}",
        probe.max_seen()
    );
    // Not a guarantee, but 64 contenders for 3 permits reach at least 2.
    assert!(probe.max_seen() >= 2, "no contention: {}", probe.max_seen());
    assert_eq!(probe.total_enters(), work, "every round ran");
    assert_eq!(probe.current(), 0);
    fences.sort_unstable();
    let granted = fences.len();
    fences.dedup();
    assert_eq!(fences.len(), granted, "a fence was handed out twice");
    assert_eq!(granted, work);
    // One fence per grant, none skipped: no grant went to nobody.
    assert_eq!(fences, (1..=work as u64).collect::<Vec<_>>());
    assert_eq!(fences_issued(&db).await, work as u64);
    assert_eq!(
        number(&db, "SELECT count(*) FROM watertight.leases").await,
        0
    );
    assert_eq!(
        number(&db, "SELECT count(*) FROM watertight.waiters").await,
        0
    );
    assert!(sem.holders().await.unwrap().is_empty());
    println!(
        "processes_share_one_limit: {work} holds over {SHARED_PROCESSES} processes in {took:?}, \
         max_seen {}",
        probe.max_seen()
    );
}

// ---------------------------------------------------------------------------
// 2. A killed holder's permit comes back within one time to live
// ---------------------------------------------------------------------------

const CRASH: &str = "crash";
const CRASH_TTL: Duration = Duration::from_millis(1500);

/// Child of `a_killed_holders_permit_comes_back_within_its_ttl`: takes the
/// only permit and holds it until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_until_killed() {
    if !is_child() {
        return;
    }
    let sem = builder(&env(ENV_URL), CRASH)
        .lease_ttl(CRASH_TTL)
        .label("doomed")
        .build()
        .await
        .unwrap();
    let permit = sem.try_acquire().await.unwrap();
    println!("HOLDING fence={} id={}", permit.fence(), permit.id());
    sleep(Duration::from_secs(60)).await;
    drop(permit);
}

/// SIGKILL a holder: a waiter already in line (polling every 50 ms) is
/// granted the permit one time to live after the holder's last renewal,
/// so within TTL + 1 s of the kill and no sooner than TTL less one renewal
/// interval (and a little) after it; on the database's clock, not before
/// the dead holder's lease expired, and that expiry is no later than one
/// TTL after the kill (nothing renews a dead holder's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_comes_back_within_its_ttl() {
    if is_child() {
        return;
    }
    let Some(server) = PgServer::start("postgres_processes") else {
        return;
    };
    let url = server.url();
    let sem = builder(&url, CRASH)
        .lease_ttl(CRASH_TTL)
        .max_poll(Duration::from_millis(50))
        .label("survivor")
        .build()
        .await
        .unwrap();
    let db = connect(&url).await;
    // The builder's defaults: a drift margin of 1% (at least 10 ms), and
    // renewals every third of what is left.
    let drift = (CRASH_TTL / 100).max(Duration::from_millis(10));
    let renew_every = (CRASH_TTL - drift) / 3;

    let mut child = ChildTest::spawn("child_holds_until_killed", &[(ENV_URL, url.clone())]);
    let line = blocking(|| child.expect_line("HOLDING", PATIENCE));
    let child_fence: u64 = field(&line, "fence").parse().unwrap();
    let child_id = field(&line, "id").to_owned();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move {
            let permit = sem.acquire().await;
            (permit, Instant::now(), SystemTime::now())
        }
    });
    until_number(&db, "SELECT count(*) FROM watertight.waiters", 1).await;
    // Let the child renew at least once: the kill comes about 100 ms after
    // a renewal, so the lease it leaves runs one time to live from that
    // renewal, not from its grant.
    sleep(renew_every + Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());

    let kill_sent = Instant::now();
    let kill_wall_us = unix_ns(SystemTime::now()) / 1000;
    let status = blocking(|| child.kill());
    let killed = Instant::now();
    assert!(!status.success());
    // A renewal the child sent just before it died has landed by now.
    sleep(Duration::from_millis(50)).await;
    let child_granted_us = lease_time_us(&db, "granted_at", &child_id)
        .await
        .expect("the dead child's lease is in the table");
    let child_expires_us = lease_time_us(&db, "expires_at", &child_id).await.unwrap();
    let ttl_us = i64::try_from(CRASH_TTL.as_micros()).unwrap();
    assert!(child_expires_us - child_granted_us >= ttl_us);
    assert!(
        child_expires_us <= kill_wall_us + ttl_us + 100_000,
        "the dead holder's lease runs until {} ms after the kill",
        (child_expires_us - kill_wall_us) / 1000
    );

    let (permit, granted, granted_wall) = timeout(CRASH_TTL + PATIENCE, waiter)
        .await
        .expect("the permit never came back")
        .unwrap();
    let permit = permit.unwrap();
    let after_kill = granted - kill_sent;
    let after_killed = granted - killed;
    let grant_us = lease_time_us(&db, "granted_at", permit.id()).await.unwrap();
    println!(
        "killed holder: granted {after_kill:?} after the kill was sent ({after_killed:?} after it \
         was reaped; ttl {CRASH_TTL:?}, renew every {renew_every:?}); the dead lease expired {} ms \
         after the kill, the grant came {} ms after that (database clock), {} ms before the \
         waiter had it",
        ms((child_expires_us - kill_wall_us) * 1000),
        ms((grant_us - child_expires_us) * 1000),
        ms(unix_ns(granted_wall) - grant_us * 1000),
    );
    assert!(permit.fence() > child_fence);
    assert!(
        grant_us >= child_expires_us,
        "granted {} µs before the dead holder's lease expired",
        child_expires_us - grant_us
    );
    assert!(
        after_killed <= CRASH_TTL + Duration::from_secs(1),
        "the permit came back {after_killed:?} after the kill"
    );
    assert!(
        after_kill >= CRASH_TTL - renew_every - Duration::from_millis(50),
        "the permit came back {after_kill:?} after the kill: sooner than its last renewal allows"
    );
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        (holders[0].id.as_str(), holders[0].label.as_str()),
        (permit.id(), "survivor")
    );
    permit.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// 3. A stopped holder knows its lease is lost before anyone else has it
// ---------------------------------------------------------------------------

const FROZEN: &str = "frozen";
const FROZEN_TTL: Duration = Duration::from_millis(1000);

/// Child of `a_stopped_holder_knows_its_lease_is_lost_before_another_is_granted_it`:
/// holds the only permit and prints its local deadline on the wall clock
/// every 10 ms (`DEADLINE <ns>`) until the lease is lost; then prints
/// `LOST reason=… deadline=<ns> noticed=<ns> is_lost=…` and what its
/// `release` said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_through_a_stop() {
    if !is_child() {
        return;
    }
    let sem = builder(&env(ENV_URL), FROZEN)
        .lease_ttl(FROZEN_TTL)
        .label("frozen")
        .build()
        .await
        .unwrap();
    let permit = sem.try_acquire().await.unwrap();
    println!("HOLDING fence={} id={}", permit.fence(), permit.id());
    let lost = permit.lost();
    let watch = tokio::spawn(async move {
        let reason = lost.await;
        (reason, unix_ns(SystemTime::now()))
    });
    while !watch.is_finished() {
        println!("DEADLINE {}", instant_unix_ns(permit.deadline()));
        sleep(Duration::from_millis(10)).await;
    }
    let (reason, noticed) = watch.await.unwrap();
    // Lost, its deadline no longer moves: it is when this process stopped
    // counting on the lease.
    println!(
        "LOST reason={reason:?} deadline={} noticed={noticed} is_lost={}",
        instant_unix_ns(permit.deadline()),
        permit.is_lost()
    );
    assert!(permit.is_lost());
    match permit.release().await {
        Err(ReleaseError::Overrun { by }) => println!("RELEASE overrun by={by:?}"),
        Ok(()) => println!("RELEASE ok"),
        Err(e) => println!("RELEASE error {e}"),
    }
    assert_eq!(sem.held_here(), 0);
}

/// SIGSTOP a holder (TTL 1 s) and let a waiter in the parent (polling
/// every 20 ms) take its permit: the holder's local deadline, printed
/// before the stop, comes before the grant (on the database's clock and on
/// the parent's), by at least the drift margin; once continued, the holder
/// says its lease is lost (at that same deadline), and its release reports
/// an overrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_knows_its_lease_is_lost_before_another_is_granted_it() {
    if is_child() {
        return;
    }
    let Some(server) = PgServer::start("postgres_processes") else {
        return;
    };
    let url = server.url();
    let sem = builder(&url, FROZEN)
        .lease_ttl(FROZEN_TTL)
        .max_poll(Duration::from_millis(20))
        .label("thief")
        .build()
        .await
        .unwrap();
    let db = connect(&url).await;
    let drift = (FROZEN_TTL / 100).max(Duration::from_millis(10));
    let drift_ns = i64::try_from(drift.as_nanos()).unwrap();

    let mut child = ChildTest::spawn("child_holds_through_a_stop", &[(ENV_URL, url.clone())]);
    let line = blocking(|| child.expect_line("HOLDING", PATIENCE));
    let child_fence: u64 = field(&line, "fence").parse().unwrap();
    let child_id = field(&line, "id").to_owned();
    // Stop it once a renewal has moved its deadline.
    let deadline_of = |line: &str| -> i64 { line["DEADLINE ".len()..].trim().parse().unwrap() };
    let first = deadline_of(&blocking(|| child.expect_line("DEADLINE ", PATIENCE)));
    let mut last = first;
    while last < first + 100_000_000 {
        last = deadline_of(&blocking(|| child.expect_line("DEADLINE ", PATIENCE)));
    }
    child.stop();
    let stopped_ns = unix_ns(SystemTime::now());
    // Every line it printed before the stop has arrived by then.
    sleep(Duration::from_millis(100)).await;
    blocking(|| {
        while let Some(line) = child.read_line(Duration::from_millis(20)) {
            if let Some(at) = line.find("DEADLINE ") {
                last = deadline_of(&line[at..]);
            }
        }
    });
    let printed = last;
    let child_expires_us = lease_time_us(&db, "expires_at", &child_id)
        .await
        .expect("the stopped holder's lease is in the table");

    let permit = timeout(PATIENCE, sem.acquire())
        .await
        .expect("the stopped holder's permit never came back")
        .unwrap();
    let granted_ns = unix_ns(SystemTime::now());
    let grant_ns = lease_time_us(&db, "granted_at", permit.id()).await.unwrap() * 1000;
    assert!(permit.fence() > child_fence);
    assert!(grant_ns >= child_expires_us * 1000, "granted before expiry");

    child.cont();
    let lost = blocking(|| child.expect_line("LOST ", PATIENCE));
    let release = blocking(|| child.expect_line("RELEASE", PATIENCE));
    blocking(|| child.assert_success(PATIENCE));
    let reason = field(&lost, "reason");
    let deadline: i64 = field(&lost, "deadline").parse().unwrap();
    let noticed: i64 = field(&lost, "noticed").parse().unwrap();
    println!(
        "stopped holder: deadline printed before the stop {} ms after the stop, its final \
         deadline {} ms after it; the database expired the lease {} ms after that deadline and \
         granted it {} ms after it ({} ms after the printed one; the waiter had it {} ms after \
         the deadline); the holder noticed {} ms after the grant, once continued; {reason}, \
         {release:?}",
        ms(printed - stopped_ns),
        ms(deadline - stopped_ns),
        ms(child_expires_us * 1000 - deadline),
        ms(grant_ns - deadline),
        ms(grant_ns - printed),
        ms(granted_ns - deadline),
        ms(noticed - grant_ns),
    );
    // What the child knew before it was stopped.
    assert!(
        printed < grant_ns && printed < granted_ns,
        "the holder counted on its lease until {} ms after it was granted elsewhere",
        ms(printed - grant_ns)
    );
    // The deadline it counted the lease lost at: no earlier than the one
    // it printed (a renewal answered just before the stop may have moved
    // it; the conversions to the wall clock differ by a few µs), and at
    // least the drift margin before the grant (less 2 ms for the two
    // clocks' rates).
    assert!(deadline >= printed - 1_000_000, "the deadline went back");
    assert!(
        grant_ns - deadline >= drift_ns - 2_000_000,
        "the holder knew only {} ms before the grant (drift margin {drift:?})",
        ms(grant_ns - deadline)
    );
    assert!(
        reason == "Stalled" || reason == "Unreachable",
        "unexpected {lost:?}"
    );
    assert!(lost.contains("is_lost=true"), "{lost:?}");
    assert!(release.starts_with("RELEASE overrun"), "{release:?}");

    // The new holder is unaffected.
    assert!(!permit.is_lost());
    let holders = sem.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].id.as_str(), holders[0].fence),
        (permit.id(), permit.fence())
    );
    permit.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// 4. A polite process next to a hot one
// ---------------------------------------------------------------------------

/// How many tasks the hot process runs.
const HOT_TASKS: usize = 4;
/// How long the polite process asks.
const POLITE_FOR: Duration = Duration::from_millis(2000);

/// Child of `a_polite_process_is_served_in_arrival_order_next_to_a_hot_one`:
/// 4 tasks that acquire, hold 1 ms and release, asking again at once,
/// until the parent's flag; prints `HOT` at its first grant and
/// `GRANTS n` once every task is done. `WATERTIGHT_TEST_MODE` is `fair`
/// or `unfair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_runs_hot() {
    if !is_child() {
        return;
    }
    let fair = env(ENV_MODE) == "fair";
    let sem = builder(&env(ENV_URL), &env(ENV_NAME))
        .fair(fair)
        .max_poll(Duration::from_secs(1))
        .label("hot")
        .build()
        .await
        .unwrap();
    let grants = Arc::new(AtomicU64::new(0));
    let said = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..HOT_TASKS)
        .map(|_| {
            let (sem, grants, said) = (sem.clone(), grants.clone(), said.clone());
            tokio::spawn(async move {
                while !raised() {
                    let permit = timeout(PATIENCE, sem.acquire())
                        .await
                        .expect("acquire hung")
                        .unwrap();
                    grants.fetch_add(1, Ordering::Relaxed);
                    if !said.swap(true, Ordering::Relaxed) {
                        println!("HOT");
                    }
                    sleep(Duration::from_millis(1)).await;
                    permit.release().await.unwrap();
                }
            })
        })
        .collect();
    // The tasks end at the flag, each after its last grant: not with
    // `close`, whose waiters, refused, would give back a grant made to
    // them meanwhile only in the background, which may not run before
    // this process exits (the lease would then stay for its time to live).
    for task in tasks {
        task.await.unwrap();
    }
    println!("GRANTS {}", grants.load(Ordering::Relaxed));
}

/// What the polite process saw.
#[derive(Debug, Default)]
struct Polite {
    grants: u64,
    /// The most grants made to others between its asking (the fences
    /// issued just before its acquire) and its own grant.
    worst_overtaken: u64,
    worst_wait: Duration,
    waits: Vec<Duration>,
}

/// A hot child process (4 tasks asking again the instant they release)
/// and this process, asking politely (1 task, 1 ms holds, 10 ms pauses),
/// share one permit for 2 s. Returns the hot process's grants and what the
/// polite one saw.
async fn hot_and_polite(server: &PgServer, name: &str, fair: bool) -> (u64, Polite) {
    let url = server.url();
    let polite = builder(&url, name)
        .fair(fair)
        .max_poll(Duration::from_secs(1))
        .label("polite")
        .build()
        .await
        .unwrap();
    let db = connect(&url).await;
    let stop = Flag::new(name);
    let mode = if fair { "fair" } else { "unfair" };
    let mut hot = ChildTest::spawn(
        "child_runs_hot",
        &[
            (ENV_URL, url.clone()),
            (ENV_NAME, name.to_owned()),
            (ENV_MODE, mode.to_owned()),
            stop.env(),
        ],
    );
    blocking(|| hot.expect_line("HOT", PATIENCE));
    // Let all four hot tasks into the rotation.
    sleep(Duration::from_millis(100)).await;
    let mut seen = Polite::default();
    let start = Instant::now();
    while start.elapsed() < POLITE_FOR {
        let asked = fences_issued(&db).await;
        let asking = Instant::now();
        let permit = timeout(PATIENCE, polite.acquire())
            .await
            .expect("the polite process was never served")
            .unwrap();
        let waited = asking.elapsed();
        seen.grants += 1;
        seen.worst_overtaken = seen
            .worst_overtaken
            .max(permit.fence().saturating_sub(asked + 1));
        seen.worst_wait = seen.worst_wait.max(waited);
        seen.waits.push(waited);
        sleep(Duration::from_millis(1)).await;
        permit.release().await.unwrap();
        sleep(Duration::from_millis(10)).await;
    }
    stop.raise();
    let line = blocking(|| hot.expect_line("GRANTS ", PATIENCE));
    blocking(|| hot.assert_success(PATIENCE));
    let hot_grants = line["GRANTS ".len()..].trim().parse().unwrap();
    let left: Vec<String> = db
        .query(
            "SELECT label || ' fence=' || fence || ' expires_in_ms=' || \
             (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint \
             FROM watertight.leases UNION ALL \
             SELECT 'waiter ' || label FROM watertight.waiters",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    (hot_grants, seen)
}

/// The waits' median and 99th percentile.
fn percentiles(waits: &[Duration]) -> (Duration, Duration) {
    let mut sorted = waits.to_vec();
    sorted.sort_unstable();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// With the line, a polite process that asks only now and then is served
/// in its arrival order next to a hot process: overtaken by at most the
/// hot waiters ahead of it in line (three, as one of the four holds) and
/// the grants made between its reading of the fence sequence and its
/// arrival (a grant takes about 3 ms here: a few at most), each wait short
/// (about 10 ms; at most 500 ms asserted), and a share of the grants. The
/// unfair numbers are printed for comparison (not asserted: with
/// `fair(false)` every release still serves the line first, so they come
/// out about the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polite_process_is_served_in_arrival_order_next_to_a_hot_one() {
    if is_child() {
        return;
    }
    let Some(server) = PgServer::start("postgres_processes") else {
        return;
    };
    let (hot, polite) = hot_and_polite(&server, "share-fair", true).await;
    let (p50, p99) = percentiles(&polite.waits);
    println!(
        "fair: hot {hot} grants, polite {} grants ({:.0} %), overtaken by at most {}, waits \
         p50 {p50:?} p99 {p99:?} max {:?}",
        polite.grants,
        100.0 * polite.grants as f64 / (hot + polite.grants) as f64,
        polite.worst_overtaken,
        polite.worst_wait
    );
    assert!(hot >= 100, "the hot process ran: {hot} grants");
    assert!(
        polite.grants >= 20,
        "the polite process was served: {polite:?}"
    );
    assert!(
        polite.worst_overtaken <= HOT_TASKS as u64 + 4,
        "the polite process was overtaken by {} grants",
        polite.worst_overtaken
    );
    assert!(
        polite.worst_wait < Duration::from_millis(500),
        "the polite process waited {:?}",
        polite.worst_wait
    );

    let (hot, polite) = hot_and_polite(&server, "share-unfair", false).await;
    let (p50, p99) = percentiles(&polite.waits);
    println!(
        "unfair: hot {hot} grants, polite {} grants ({:.0} %), overtaken by at most {}, waits \
         p50 {p50:?} p99 {p99:?} max {:?}",
        polite.grants,
        100.0 * polite.grants as f64 / (hot + polite.grants).max(1) as f64,
        polite.worst_overtaken,
        polite.worst_wait
    );
}

// ---------------------------------------------------------------------------
// 5. A killed process's dropped waiters leave nothing behind
// ---------------------------------------------------------------------------

const DROPS: &str = "drops";
const DROPS_TTL: Duration = Duration::from_millis(1000);
const DROPS_WAITERS: i64 = 500;

/// Child of `a_killed_processs_dropped_waiters_leave_nothing_behind`:
/// 500 acquires wait in line; at the parent's flag it drops them all
/// (their ids are released in the background) and says `DROPPED`, and is
/// killed then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_drops_its_waiters() {
    if !is_child() {
        return;
    }
    let sem = builder(&env(ENV_URL), DROPS)
        .lease_ttl(DROPS_TTL)
        .label("doomed")
        .build()
        .await
        .unwrap();
    let pending: Vec<_> = (0..DROPS_WAITERS)
        .map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        })
        .collect();
    println!("WAITING");
    until_raised().await;
    for task in &pending {
        task.abort();
    }
    println!("DROPPED");
    sleep(Duration::from_secs(60)).await;
}

/// 500 acquires dropped mid-wait in a process that is then SIGKILLed
/// (before most of their background releases are sent): the rows of the
/// line it leaves expire one time to live after their last attempt at
/// most, so none is alive TTL + 500 ms after the kill, the next call
/// clears them, and the permit then goes to a new waiter in the parent at
/// the holder's release (the dead process is never granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_processs_dropped_waiters_leave_nothing_behind() {
    if is_child() {
        return;
    }
    let Some(server) = PgServer::start("postgres_processes") else {
        return;
    };
    let url = server.url();
    let holder = builder(&url, DROPS)
        .lease_ttl(DROPS_TTL)
        .label("survivor")
        .build()
        .await
        .unwrap();
    let waiters = builder(&url, DROPS)
        .lease_ttl(DROPS_TTL)
        .max_poll(Duration::from_millis(50))
        .label("survivor")
        .build()
        .await
        .unwrap();
    let db = connect(&url).await;
    let held = holder.acquire().await.unwrap();
    let flag = Flag::new("drops");
    let mut child = ChildTest::spawn(
        "child_drops_its_waiters",
        &[(ENV_URL, url.clone()), flag.env()],
    );
    blocking(|| child.expect_line("WAITING", PATIENCE));
    let doomed = "SELECT count(*) FROM watertight.waiters WHERE label = 'doomed'";
    let lined = until_number(&db, doomed, DROPS_WAITERS).await;
    flag.raise();
    blocking(|| child.expect_line("DROPPED", PATIENCE));
    let kill_sent = Instant::now();
    let status = blocking(|| child.kill());
    let killed = Instant::now();
    assert!(!status.success());
    let left_at_kill = number(&db, doomed).await;

    // Alive: not expired yet (a row past its expiry stays until the next
    // call that serves the line drops it).
    let alive = "SELECT count(*) FROM watertight.waiters WHERE expires_at > clock_timestamp()";
    until_number(&db, alive, 0).await;
    let expired_after = killed.elapsed();
    let expired_rows = number(&db, doomed).await;
    // Any call serves the line: a try_acquire, which does not join it.
    assert!(matches!(
        holder.try_acquire().await,
        Err(LeaseError::NoPermits { limit: 1, .. })
    ));
    let waiting = "SELECT count(*) FROM watertight.waiters";
    assert_eq!(number(&db, waiting).await, 0, "the line is empty");
    let leases = "SELECT count(*) FROM watertight.leases";
    assert_eq!(number(&db, leases).await, 1, "only the holder's lease");
    println!(
        "dropped waiters: 500 in line after {lined:?}; {left_at_kill} of their rows left at the \
         kill (the rest released in the background in time), {expired_rows} still there \
         (expired) when none was alive, {expired_after:?} after the kill ({:?} after it was \
         sent; ttl {DROPS_TTL:?})",
        expired_after + (killed - kill_sent)
    );
    assert!(
        expired_after <= DROPS_TTL + Duration::from_millis(500),
        "the dead process's waiters lived {expired_after:?} after the kill"
    );

    // The permit goes where it should: to a new waiter, at the release.
    let next = tokio::spawn({
        let waiters = waiters.clone();
        async move { waiters.acquire().await }
    });
    until_number(&db, waiting, 1).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let permit = timeout(PATIENCE, next).await.unwrap().unwrap().unwrap();
    let took = released.elapsed();
    println!("dropped waiters: the new waiter was granted {took:?} after the release");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let holders = holder.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].id.as_str(), holders[0].label.as_str()),
        (permit.id(), "survivor")
    );
    assert_eq!(waiters.held_here(), 1);
    permit.release().await.unwrap();
    assert_eq!(number(&db, leases).await, 0);
    assert_eq!(number(&db, waiting).await, 0);
}
