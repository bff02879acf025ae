//! The PostgreSQL semaphore against a real server started per test: the
//! limit across handles (each its own connection and renewer, so to the
//! database a process of its own), the fair line and its wake-ups, the
//! rows an operator reads, cancelled waiters that leave nothing behind,
//! the lease's edge, a restart, an outage, and bad configurations.
#![cfg(all(not(loom), feature = "postgres"))]

#[path = "common/pg_server.rs"]
mod pg_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_server::PgServer;
use tokio::time::{sleep, timeout};
use watertight::postgres::{ConfigError, LeaseError, PgBulkhead, PgSemaphore, PgSemaphoreBuilder};
use watertight::{BuildErrorKind, BulkheadError, CallOptions, RejectReason};

const PATIENCE: Duration = Duration::from_secs(10);

fn builder(url: &str, name: &str) -> PgSemaphoreBuilder {
    PgSemaphore::builder(url.parse().unwrap(), name)
        .limit(1)
        .lease_ttl(Duration::from_secs(30))
}

/// Polls `condition` every 5 ms until it holds, for at most `PATIENCE`.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// What a role needs to use a semaphore in `schema` that it did not set up.
fn grant_all(server: &PgServer, schema: &str, role: &str) {
    server.psql(&format!(
        "GRANT USAGE ON SCHEMA {schema} TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
    ));
}

fn count(server: &PgServer, sql: &str) -> usize {
    server.psql(sql).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_across_handles() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let limit = 3;
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(
            builder(&server.url(), "shared")
                .limit(limit)
                .build()
                .await
                .unwrap(),
        );
    }
    // Counted here, not by the crate.
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for sem in &handles {
        for _ in 0..16 {
            let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let permit = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        timeout(Duration::from_secs(60), task)
            .await
            .expect("the calls finished")
            .unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        limit,
        "the limit was reached, never passed"
    );
    assert_eq!(count(&server, "SELECT count(*) FROM watertight.leases"), 0);
    assert_eq!(count(&server, "SELECT count(*) FROM watertight.waiters"), 0);
}

/// Processes that start together on a database without the schema
/// install it once: the others, which found it missing before they could
/// take the set-up's lock, find it installed once they have the lock. A
/// second install would lock the tables that the first process already
/// uses, and could deadlock with its grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_together_install_the_schema_once() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    server.psql("ALTER SYSTEM SET log_statement = 'ddl'");
    server.psql("SELECT pg_reload_conf()");
    // The set-up's lock, held here until every handle below has found the
    // schema missing and waits for the lock.
    let (gate, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let lock = "hashtext('watertight schema watertight')";
    gate.execute(&format!("SELECT pg_advisory_lock({lock})"), &[])
        .await
        .unwrap();
    const HANDLES: usize = 4;
    let builds: Vec<_> = (0..HANDLES)
        .map(|_| tokio::spawn(builder(&server.url(), "together").build()))
        .collect();
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    until("every handle waits for the set-up's lock", || {
        count(&server, waiting) == HANDLES
    })
    .await;
    gate.execute(&format!("SELECT pg_advisory_unlock({lock})"), &[])
        .await
        .unwrap();
    let mut handles = Vec::new();
    for build in builds {
        handles.push(build.await.unwrap().unwrap());
    }
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let installs = log
        .matches("CREATE SCHEMA IF NOT EXISTS watertight")
        .count();
    assert_eq!(installs, 1, "the schema was installed {installs} times");
    for handle in &handles {
        handle.acquire().await.unwrap().release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_line_in_arrival_order_and_wakes_the_waiter() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let polite = || {
        builder(&server.url(), "line")
            // No poll within the test: only a notification wakes a waiter.
            .max_poll(Duration::from_secs(30))
            .build()
    };
    let (a, b, c) = (
        polite().await.unwrap(),
        polite().await.unwrap(),
        polite().await.unwrap(),
    );
    let held = a.acquire().await.unwrap();
    let first = tokio::spawn({
        let b = b.clone();
        async move { b.acquire().await.map(|p| (p, Instant::now())) }
    });
    let server = &server;
    let waiting = |n: usize| move || count(server, "SELECT count(*) FROM watertight.waiters") == n;
    until("b waits", waiting(1)).await;
    let second = tokio::spawn({
        let c = c.clone();
        async move { c.acquire().await.map(|p| (p, Instant::now())) }
    });
    until("c waits behind b", waiting(2)).await;
    // A try_acquire does not pass the line, and neither does a new waiter.
    assert!(matches!(
        a.try_acquire().await,
        Err(LeaseError::NoPermits { limit: 1, .. })
    ));

    let fence = held.fence();
    let released = Instant::now();
    held.release().await.unwrap();
    let (b_permit, b_at) = timeout(PATIENCE, first).await.unwrap().unwrap().unwrap();
    assert!(!second.is_finished(), "c waits for b");
    assert!(b_permit.fence() > fence);
    let wake = b_at - released;
    println!("release to grant across handles: {wake:?}");
    assert!(
        wake < Duration::from_secs(2),
        "woken by its notification, not a poll"
    );

    let b_fence = b_permit.fence();
    drop(b_permit);
    let (c_permit, _) = timeout(PATIENCE, second).await.unwrap().unwrap().unwrap();
    assert!(c_permit.fence() > b_fence);
    let rows = c.holders().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, c_permit.id());
    assert_eq!(rows[0].fence, c_permit.fence());
    assert!(rows[0].expires_in > Duration::from_secs(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_dropped_mid_wait_leave_nothing_behind() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let holder = builder(&server.url(), "drops").build().await.unwrap();
    let waiters = builder(&server.url(), "drops").build().await.unwrap();
    let held = holder.acquire().await.unwrap();
    let mut pending = Vec::new();
    for _ in 0..500 {
        let w = waiters.clone();
        pending.push(tokio::spawn(async move { w.acquire().await }));
    }
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("500 in line", || count(&server, sql) == 500).await;
    for task in &pending {
        task.abort();
    }
    for task in pending {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    until("the line is empty", || count(&server, sql) == 0).await;
    // The permit goes where it should: to a new waiter, at the release.
    let next = tokio::spawn({
        let w = waiters.clone();
        async move { w.acquire().await }
    });
    until("one waits", || count(&server, sql) == 1).await;
    drop(held);
    let permit = timeout(PATIENCE, next).await.unwrap().unwrap().unwrap();
    assert_eq!(waiters.held_here(), 1);
    drop(permit);
    let leases = "SELECT count(*) FROM watertight.leases";
    until("nothing held", || count(&server, leases) == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_grants_the_waiters_at_once() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let sem = builder(&server.url(), "raise")
        .max_poll(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let other = builder(&server.url(), "raise").build().await.unwrap();
    let _held = sem.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire().await }
    });
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("it waits", || count(&server, sql) == 1).await;
    sem.set_limit(2).await.unwrap();
    let raised = Instant::now();
    let _granted = timeout(PATIENCE, waiter).await.unwrap().unwrap().unwrap();
    assert!(raised.elapsed() < Duration::from_secs(2));
    assert_eq!(other.limit().await.unwrap(), 2);
    assert_eq!(
        server.psql("SELECT max_permits FROM watertight.semaphores WHERE name = 'raise'"),
        "2"
    );
    // The builder's limit does not overwrite the stored one.
    let late = builder(&server.url(), "raise")
        .limit(7)
        .build()
        .await
        .unwrap();
    assert_eq!(late.limit_seen(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_knows_its_lease_is_lost_before_another_is_granted_it() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let ttl = Duration::from_millis(1000);
    let other = builder(&server.url(), "edge")
        .lease_ttl(ttl)
        .max_poll(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    // The holder logs in as a role of its own, which can then be shut out.
    let url = server.user("holder", "pw");
    grant_all(&server, "watertight", "holder");
    let sem = builder(&url, "edge").lease_ttl(ttl).build().await.unwrap();
    let permit = sem.acquire().await.unwrap();
    let lost = permit.lost();
    let watch = tokio::spawn(async move {
        let reason = lost.await;
        (reason, Instant::now())
    });
    let waiter = tokio::spawn(async move {
        let permit = other.acquire().await;
        (permit, Instant::now())
    });
    // Cut off: its connection ended, a new one refused, so that it cannot
    // renew; the other handle's attempts go through.
    server.psql(
        "ALTER ROLE holder NOLOGIN; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'holder'",
    );
    let (reason, lost_at) = timeout(PATIENCE, watch).await.unwrap().unwrap();
    let (granted, granted_at) = timeout(PATIENCE, waiter).await.unwrap().unwrap();
    let granted = granted.unwrap();
    println!(
        "lost ({reason:?}) {:?} before the permit was granted elsewhere",
        granted_at - lost_at
    );
    assert_eq!(reason, watertight::LostReason::Unreachable);
    assert!(lost_at < granted_at);
    assert!(granted.fence() > permit.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_fences_survive_a_restart_and_waiters_ride_it_out() {
    let Some(mut server) = PgServer::start("postgres") else {
        return;
    };
    let sem = builder(&server.url(), "restart")
        .lease_ttl(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let other = builder(&server.url(), "restart")
        .max_poll(Duration::from_millis(50))
        .outage_tolerance(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let fence = held.fence();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire().await }
    });
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("it waits", || count(&server, sql) == 1).await;
    server.kill();
    server.restart();
    // The lease is still there, renewed over a new connection.
    let leases = "SELECT count(*) FROM watertight.leases";
    assert_eq!(count(&server, leases), 1);
    sleep(Duration::from_secs(4)).await;
    assert!(!held.is_lost(), "renewed across the restart");
    assert!(!waiter.is_finished());
    let released = Instant::now();
    held.release().await.unwrap();
    let next = timeout(PATIENCE, waiter).await.unwrap().unwrap().unwrap();
    println!("granted {:?} after the release", released.elapsed());
    assert!(
        next.fence() > fence,
        "fences keep increasing across the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_out_of_reach_fails_closed() {
    let Some(mut server) = PgServer::start("postgres") else {
        return;
    };
    let sem = builder(&server.url(), "outage")
        .response_timeout(Duration::from_millis(300))
        .outage_tolerance(Duration::from_millis(800))
        .build()
        .await
        .unwrap();
    let held = sem.acquire().await.unwrap();
    server.stop();
    let start = Instant::now();
    assert!(matches!(
        sem.try_acquire().await,
        Err(LeaseError::Unavailable(_))
    ));
    assert!(start.elapsed() < Duration::from_millis(600));
    let start = Instant::now();
    let refused = sem.acquire().await;
    let took = start.elapsed();
    assert!(
        matches!(refused, Err(LeaseError::Unavailable(_))),
        "{refused:?}"
    );
    println!("acquire refused after {took:?} (tolerance 800 ms)");
    assert!(took >= Duration::from_millis(800) && took < Duration::from_millis(1500));
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_are_refused_with_a_clear_error() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let url = server.url();
    let refused = |b: PgSemaphoreBuilder| async move { b.build().await.unwrap_err() };
    assert!(matches!(
        refused(builder(&url, "")).await,
        ConfigError::BadName
    ));
    assert!(matches!(
        refused(builder(&url, "a\nb")).await,
        ConfigError::BadName
    ));
    assert!(matches!(
        refused(builder(&url, "x").schema("Bad-Schema")).await,
        ConfigError::BadSchema
    ));
    assert!(matches!(
        refused(builder(&url, "x").lease_ttl(Duration::from_millis(50))).await,
        ConfigError::BadLeaseTtl
    ));
    assert!(matches!(
        refused(builder(&url, "x").drift_margin(Duration::from_secs(30))).await,
        ConfigError::BadDriftMargin
    ));
    assert!(matches!(
        refused(builder(&url, "x").renew_every(Duration::from_secs(40))).await,
        ConfigError::BadRenewInterval
    ));
    assert!(matches!(
        refused(builder(&url, "x").limit(usize::MAX)).await,
        ConfigError::LimitTooLarge
    ));
    // Nothing listens on this port.
    let closed = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        pg_server::free_port()
    );
    assert!(matches!(
        refused(builder(&closed, "x")).await,
        ConfigError::Connect(_)
    ));
    let user = server.user("worker", "right");
    let wrong = user.replace("right", "wrong");
    assert!(matches!(
        refused(builder(&wrong, "x")).await,
        ConfigError::Auth(_)
    ));
    // A user with no right to create the schema, in a database without it.
    let denied = refused(builder(&user, "x").schema("theirs")).await;
    assert!(matches!(denied, ConfigError::Denied(_)), "{denied:?}");
    let missing = refused(builder(&url, "x").schema("nothing").create_schema(false)).await;
    assert!(matches!(missing, ConfigError::NoSchema), "{missing:?}");
    // Installed by the statements a DBA would run, it needs no creation.
    server.psql(&PgSemaphore::schema_sql("theirs").unwrap());
    grant_all(&server, "theirs", "worker");
    let sem = builder(&user, "x")
        .schema("theirs")
        .create_schema(false)
        .build()
        .await
        .unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    assert!(matches!(
        PgSemaphore::schema_sql("a;b"),
        Err(ConfigError::BadSchema)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulkhead_fails_closed_and_names_the_cause() {
    let Some(mut server) = PgServer::start("postgres") else {
        return;
    };
    let sem = builder(&server.url(), "closed")
        .response_timeout(Duration::from_millis(200))
        .outage_tolerance(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let bh = PgBulkhead::builder(sem)
        .max_wait(Duration::from_millis(400))
        .build()
        .unwrap();
    assert_eq!(bh.call(async { Ok::<_, ()>(1) }).await.unwrap(), 1);
    server.stop();
    // A wait that runs out while the database is out of reach is
    // `Unavailable`, with the database's error behind it.
    let start = Instant::now();
    let err = bh.call(async { Ok::<_, ()>(2) }).await.unwrap_err();
    let took = start.elapsed();
    let BulkheadError::Rejected(rejected) = err else {
        panic!("{err:?}")
    };
    assert_eq!(rejected.reason(), RejectReason::Unavailable);
    let source = std::error::Error::source(&rejected).expect("a cause");
    let lease = source
        .downcast_ref::<LeaseError>()
        .expect("the lease error");
    assert!(matches!(lease, LeaseError::Unavailable(_)), "{lease:?}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(bh.metrics().rejected_for(RejectReason::Unavailable), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_bulkheads_call() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    // The schema first, so that the holder's role can be given rights.
    builder(&server.url(), "stop").build().await.unwrap();
    let url = server.user("holder", "pw");
    grant_all(&server, "watertight", "holder");
    let ttl = Duration::from_millis(600);
    let sem = builder(&url, "stop").lease_ttl(ttl).build().await.unwrap();
    let bh = PgBulkhead::builder(sem).build().unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let call = tokio::spawn({
        let (bh, started) = (bh.clone(), started.clone());
        async move {
            bh.call(async {
                started.notify_one();
                sleep(Duration::from_secs(30)).await;
                Ok::<_, ()>(())
            })
            .await
        }
    });
    started.notified().await;
    let cut = Instant::now();
    server.psql(
        "ALTER ROLE holder NOLOGIN; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'holder'",
    );
    let out = timeout(PATIENCE, call).await.unwrap().unwrap();
    assert!(
        matches!(
            out,
            Err(BulkheadError::LeaseLost(
                watertight::LostReason::Unreachable
            ))
        ),
        "{out:?}"
    );
    assert!(cut.elapsed() < ttl + Duration::from_millis(300));
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// An operator who deletes a lease row by hand (the habit of lock tables
/// without leases) gives its permit back at the next call, and the holder
/// learns at its next renewal that its lease is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_row_deleted_by_hand_gives_its_permit_back() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let ttl = Duration::from_millis(900);
    let holder = builder(&server.url(), "by-hand")
        .lease_ttl(ttl)
        .build()
        .await
        .unwrap();
    let other = builder(&server.url(), "by-hand").build().await.unwrap();
    let permit = holder.acquire().await.unwrap();
    assert!(matches!(
        other.try_acquire().await,
        Err(LeaseError::NoPermits { .. })
    ));
    server.psql("DELETE FROM watertight.leases WHERE semaphore = 'by-hand'");
    let taken = other.try_acquire().await.expect("the permit is back");
    let lost = timeout(PATIENCE, permit.lost()).await.unwrap();
    assert_eq!(lost, watertight::LostReason::Expired);
    drop(taken);
}

/// With other leases still held, a row deleted by hand is counted out at
/// the next renewal of any holder, which serves the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_deleted_by_hand_is_counted_out_at_the_next_renewal() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let ttl = Duration::from_millis(900);
    let make = || {
        builder(&server.url(), "recount")
            .limit(2)
            .lease_ttl(ttl)
            .build()
    };
    let (a, c, b) = (
        make().await.unwrap(),
        make().await.unwrap(),
        make().await.unwrap(),
    );
    let gone = a.acquire().await.unwrap();
    let kept = c.acquire().await.unwrap();
    server.psql(&format!(
        "DELETE FROM watertight.leases WHERE id = '{}'",
        gone.id()
    ));
    let deleted = Instant::now();
    let granted = timeout(PATIENCE, b.acquire()).await.unwrap().unwrap();
    let after = deleted.elapsed();
    println!(
        "granted {after:?} after the row was deleted (renewals every {:?})",
        ttl / 3
    );
    assert!(after < ttl, "{after:?}");
    assert!(!kept.is_lost());
    drop((gone, granted));
}

/// A waiter whose database goes away while it waits keeps its place for
/// the outage tolerance, then fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_fails_closed_when_the_database_goes_away_mid_wait() {
    let Some(mut server) = PgServer::start("postgres") else {
        return;
    };
    let tolerance = Duration::from_millis(800);
    let holder = builder(&server.url(), "mid-wait").build().await.unwrap();
    let waiter = builder(&server.url(), "mid-wait")
        .max_poll(Duration::from_millis(50))
        .response_timeout(Duration::from_millis(300))
        .outage_tolerance(tolerance)
        .build()
        .await
        .unwrap();
    let held = holder.acquire().await.unwrap();
    let waiting = tokio::spawn(async move {
        let out = waiter.acquire().await;
        (out, Instant::now())
    });
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("it waits", || count(&server, sql) == 1).await;
    let cut = Instant::now();
    server.stop();
    let (out, ended) = timeout(PATIENCE, waiting).await.unwrap().unwrap();
    let after = ended - cut;
    println!("refused {after:?} after the server stopped (tolerance {tolerance:?})");
    assert!(matches!(out, Err(LeaseError::Unavailable(_))), "{out:?}");
    // The outage counts from the first failed attempt, at most one poll
    // after the stop; the last attempt may take one response timeout.
    assert!(after >= tolerance, "{after:?}");
    assert!(
        after < tolerance + Duration::from_millis(50 + 300 + 500),
        "{after:?}"
    );
    drop(held);
}

/// Weighted leases: a lease of several permits, refused at once when it
/// could never be granted, and in fair mode a heavy head of the line holds
/// back a lighter waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_leases_take_several_permits_in_arrival_order() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let make = || {
        builder(&server.url(), "weights")
            .limit(3)
            .max_poll(Duration::from_secs(30))
            .build()
    };
    let (a, b, c) = (
        make().await.unwrap(),
        make().await.unwrap(),
        make().await.unwrap(),
    );
    let two = a.acquire_many(2).await.unwrap();
    assert!(matches!(
        b.try_acquire_many(2).await,
        Err(LeaseError::NoPermits { limit: 3, .. })
    ));
    assert!(matches!(
        b.try_acquire_many(0).await,
        Err(LeaseError::Weight { permits: 0, .. })
    ));
    assert!(matches!(
        b.try_acquire_many(4).await,
        Err(LeaseError::Weight {
            permits: 4,
            limit: 3
        })
    ));
    let rows = a.holders().await.unwrap();
    assert_eq!((rows.len(), rows[0].weight), (1, 2));

    let heavy = tokio::spawn({
        let b = b.clone();
        async move { b.acquire_many(2).await.map(|p| (p, Instant::now())) }
    });
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("the heavy one waits", || count(&server, sql) == 1).await;
    // One permit is free, but the heavy waiter came first.
    let light = tokio::spawn({
        let c = c.clone();
        async move { c.acquire().await.map(|p| (p, Instant::now())) }
    });
    until("the light one waits behind it", || count(&server, sql) == 2).await;
    drop(two);
    let (heavy, heavy_at) = timeout(PATIENCE, heavy).await.unwrap().unwrap().unwrap();
    let (light, light_at) = timeout(PATIENCE, light).await.unwrap().unwrap().unwrap();
    assert!(heavy.fence() < light.fence(), "served in arrival order");
    assert!(heavy_at <= light_at + Duration::from_millis(50));
    drop((heavy, light));

    // A waiter heavier than a lowered limit leaves the line with an error
    // at its next look.
    let _three = a.acquire_many(3).await.unwrap();
    let d = builder(&server.url(), "weights")
        .max_poll(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { d.acquire_many(3).await });
    until("it waits", || count(&server, sql) == 1).await;
    a.set_limit(2).await.unwrap();
    let out = timeout(PATIENCE, waiting).await.unwrap().unwrap();
    assert!(
        matches!(
            out,
            Err(LeaseError::Weight {
                permits: 3,
                limit: 2
            })
        ),
        "{out:?}"
    );
    until("it left the line", || count(&server, sql) == 0).await;
}

/// A permit dropped just before its process ends its runtime is released
/// only if the process waits for it: `wait_released` does.
#[test]
fn wait_released_gives_back_what_was_dropped_before_the_runtime_ends() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (waited, not_waited) = rt.block_on(async {
        let sem = builder(&url, "shutdown").limit(2).build().await.unwrap();
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
    let held = |id: &str| {
        server.psql(&format!(
            "SELECT count(*) FROM watertight.leases WHERE id = '{id}'"
        ))
    };
    assert_eq!(held(&waited), "0", "waited for: released");
    assert_eq!(
        held(&not_waited),
        "1",
        "not waited for: held until it expires"
    );
}

/// Rights taken away after `build`: every call is refused at once with
/// `Denied` (never retried, never a hang), and the bulkhead fails closed
/// with that error as the rejection's source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_taken_away_after_build_are_refused_at_once() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    builder(&server.url(), "rights").build().await.unwrap();
    let url = server.user("worker", "pw");
    grant_all(&server, "watertight", "worker");
    let sem = builder(&url, "rights")
        .outage_tolerance(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    server.psql("REVOKE ALL ON ALL TABLES IN SCHEMA watertight FROM worker");
    let start = Instant::now();
    let denied = sem.acquire().await;
    assert!(matches!(denied, Err(LeaseError::Denied(_))), "{denied:?}");
    assert!(matches!(
        sem.try_acquire().await,
        Err(LeaseError::Denied(_))
    ));
    assert!(start.elapsed() < Duration::from_secs(2), "not retried");
    let bh = PgBulkhead::builder(sem).build().unwrap();
    let BulkheadError::Rejected(rejected) = bh.call(async { Ok::<_, ()>(()) }).await.unwrap_err()
    else {
        panic!("rejected")
    };
    assert_eq!(rejected.reason(), RejectReason::Unavailable);
    let cause = std::error::Error::source(&rejected).unwrap();
    assert!(matches!(
        cause.downcast_ref::<LeaseError>(),
        Some(LeaseError::Denied(_))
    ));
}

/// `close` refuses this handle's waiter at once; its place in the line is
/// given up in the background, which `wait_released` waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_refuses_a_waiter_and_its_place_is_given_up() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let holder = builder(&server.url(), "close").build().await.unwrap();
    let sem = builder(&server.url(), "close")
        .max_poll(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let held = holder.acquire().await.unwrap();
    let waiting = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    let sql = "SELECT count(*) FROM watertight.waiters";
    until("it waits", || count(&server, sql) == 1).await;
    let closed = Instant::now();
    sem.close();
    let out = timeout(PATIENCE, waiting).await.unwrap().unwrap();
    assert!(matches!(out, Err(LeaseError::Closed)), "{out:?}");
    assert!(closed.elapsed() < Duration::from_secs(1));
    assert!(matches!(sem.try_acquire().await, Err(LeaseError::Closed)));
    sem.wait_released().await;
    assert_eq!(count(&server, sql), 0);
    // The permit goes to the next in line, not to the closed handle.
    drop(held);
    let again = timeout(PATIENCE, holder.acquire()).await.unwrap().unwrap();
    drop(again);
}

/// User code panics inside the PostgreSQL bulkhead (the same code as the
/// Redis one): the guarded future, then an observer. No lease is kept, the
/// count in flight comes back to zero, and a waiter behind is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_user_code_keeps_no_lease() {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;
    use std::sync::Mutex;
    use watertight::observer::{CallOutcome, Finished, Observer, Permitted};

    #[derive(Default)]
    struct Seen {
        outcomes: Mutex<Vec<CallOutcome>>,
        panic_on_permit: std::sync::atomic::AtomicBool,
    }
    impl Observer for Seen {
        fn on_permitted(&self, _: &Permitted<'_>) {
            if self.panic_on_permit.load(Ordering::SeqCst) {
                panic!("observer panics");
            }
        }
        fn on_finished(&self, event: &Finished<'_>) {
            self.outcomes.lock().unwrap().push(event.outcome);
        }
    }

    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let seen = Arc::new(Seen::default());
    let sem = builder(&server.url(), "panics").build().await.unwrap();
    let bh = PgBulkhead::builder(sem.clone())
        .max_wait(PATIENCE)
        .observer(seen.clone())
        .build()
        .unwrap();
    let other = builder(&server.url(), "panics").build().await.unwrap();
    let leases = "SELECT count(*) FROM watertight.leases";

    // The guarded future panics.
    let panicked = AssertUnwindSafe(bh.call(async {
        if true {
            panic!("the call panics");
        }
        Ok::<_, ()>(())
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    assert_eq!(bh.metrics().in_flight(), 0);
    until("its lease is released", || count(&server, leases) == 0).await;
    assert_eq!(*seen.outcomes.lock().unwrap(), [CallOutcome::Panicked]);

    // An observer panics when the call is admitted, while a waiter of
    // another process stands behind it.
    let held = other.acquire().await.unwrap();
    let waiting = tokio::spawn({
        let bh = bh.clone();
        async move {
            AssertUnwindSafe(bh.call(async { Ok::<_, ()>(()) }))
                .catch_unwind()
                .await
        }
    });
    until("it waits", || {
        count(&server, "SELECT count(*) FROM watertight.waiters") == 1
    })
    .await;
    seen.panic_on_permit.store(true, Ordering::SeqCst);
    drop(held);
    let out = timeout(PATIENCE, waiting).await.unwrap().unwrap();
    assert!(out.is_err(), "the observer's panic reaches the caller");
    assert_eq!(bh.metrics().in_flight(), 0);
    until("no lease is kept", || count(&server, leases) == 0).await;
    // The permit is free again for anyone.
    seen.panic_on_permit.store(false, Ordering::SeqCst);
    other.try_acquire().await.unwrap().release().await.unwrap();
}

/// Two handles on the semaphore `name`, two processes as far as the
/// database can tell, whose waiters only a notification wakes (no poll
/// within a test).
async fn two_handles(server: &PgServer, name: &str) -> (PgSemaphore, PgSemaphore) {
    let handle = || {
        builder(&server.url(), name)
            .max_poll(Duration::from_secs(30))
            .build()
    };
    (handle().await.unwrap(), handle().await.unwrap())
}

/// Whether `n` waiters stand in the database's line, to wait for with
/// [`until`].
fn waiting(server: &PgServer, n: usize) -> impl FnMut() -> bool + '_ {
    move || count(server, "SELECT count(*) FROM watertight.waiters") == n
}

/// Priority classes order this process's waiters and nothing else: a
/// lease the database grants to this process's waiter of class 1 goes to
/// its waiter of class 0 that came later, and the one of class 1 goes back
/// in line and is served next; another process's waiter, in line before
/// both, is served first all the same (the database's line keeps its
/// order). Zero classes is a build error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_classes_order_this_processs_waiters_only() {
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let (other, ours) = two_handles(&server, "classes").await;
    let refused = PgBulkhead::builder(ours.clone())
        .priority_classes(0)
        .build()
        .unwrap_err();
    assert_eq!(refused.kind(), BuildErrorKind::NoPriorityClass);
    let bh = PgBulkhead::builder(ours)
        .max_wait(PATIENCE)
        .priority_classes(2)
        .build()
        .unwrap();
    let held = other.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiting = |n: usize| waiting(&server, n);
    let elsewhere = tokio::spawn({
        let (other, order) = (other.clone(), order.clone());
        async move {
            let permit = other.acquire().await.unwrap();
            order.lock().unwrap().push("elsewhere");
            sleep(Duration::from_millis(20)).await;
            permit.release().await.unwrap();
        }
    });
    until("another process waits", waiting(1)).await;
    let call = |class: usize, name: &'static str| {
        let (bh, order) = (bh.clone(), order.clone());
        tokio::spawn(async move {
            let options = CallOptions::new().class(class);
            bh.call_with(options, async {
                order.lock().unwrap().push(name);
                sleep(Duration::from_millis(20)).await;
                Ok::<_, ()>(())
            })
            .await
            .unwrap();
        })
    };
    let low = call(1, "class 1");
    until("class 1 waits", waiting(2)).await;
    let high = call(0, "class 0");
    until("class 0 waits behind it", waiting(3)).await;
    held.release().await.unwrap();
    for task in [elsewhere, low, high] {
        timeout(PATIENCE, task).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["elsewhere", "class 0", "class 1"]);
    let metrics = bh.metrics();
    assert_eq!((metrics.in_flight(), metrics.queued()), (0, 0));
    assert_eq!(metrics.permitted(), 2);
    until("nothing held or waiting", || {
        count(&server, "SELECT count(*) FROM watertight.leases") == 0 && waiting(0)()
    })
    .await;
}

/// Adaptive LIFO on this process's line: once a wait past the target has
/// made the line stand, a lease the database grants to this process's
/// older waiter goes to its newer one, and the older goes back in line.
/// It needs `queue_delay`, as the in-process bulkhead's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_lifo_serves_the_newest_of_this_processs_waiters_while_its_line_stands() {
    const TARGET: Duration = Duration::from_millis(300);
    let Some(server) = PgServer::start("postgres") else {
        return;
    };
    let (other, ours) = two_handles(&server, "lifo").await;
    let refused = PgBulkhead::builder(ours.clone())
        .adaptive_lifo(true)
        .build()
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        BuildErrorKind::AdaptiveLifoWithoutQueueDelay
    );
    let bh = PgBulkhead::builder(ours)
        .max_wait(PATIENCE)
        .queue_delay(TARGET, Duration::ZERO)
        .adaptive_lifo(true)
        .build()
        .unwrap();
    let held = other.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiting = |n: usize| waiting(&server, n);
    let call = |name: &'static str| {
        let (bh, order) = (bh.clone(), order.clone());
        tokio::spawn(async move {
            bh.call(async {
                order.lock().unwrap().push(name);
                sleep(Duration::from_millis(20)).await;
                Ok::<_, ()>(())
            })
            .await
        })
    };
    let first = call("first");
    until("the first waits", waiting(1)).await;
    // Past the target: served, it makes the line stand.
    sleep(TARGET + Duration::from_millis(50)).await;
    let older = call("older");
    until("an older waiter", waiting(2)).await;
    let newer = call("newer");
    until("a newer one", waiting(3)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    for task in [first, older, newer] {
        timeout(PATIENCE, task).await.unwrap().unwrap().unwrap();
    }
    // Neither later waiter waited the target (it would have been cut).
    assert!(released.elapsed() < TARGET, "{:?}", released.elapsed());
    assert_eq!(*order.lock().unwrap(), ["first", "newer", "older"]);
    assert_eq!(bh.metrics().in_flight(), 0);
}
