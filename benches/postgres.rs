//! Not a criterion bench: the PostgreSQL backend against the bare client
//! and beside the Redis backend, in one run, on servers the bench starts
//! (PostgreSQL 15 from the Debian package, redis-server if installed).
//!
//! ```sh
//! cargo bench -p watertight-benches --bench postgres --features postgres,redis,tokio -- run [ROUNDS] [CYCLES]
//! ```
//!
//! 1. **Uncontended cycle** (acquire, then release; one task, a
//!    current-thread runtime), cases interleaved round by round:
//!    - `pg`: `PgSemaphore::acquire().await`, then `release().await`;
//!    - `pg_bare`: tokio-postgres alone, on one connection, sending the
//!      same two prepared statements (`acquire`, `release`) with the same
//!      arguments: the same server work, so the difference is what the
//!      crate adds;
//!    - `redis`: `RedisSemaphore::acquire` and `release`, for a user who
//!      chooses between the two.
//!
//!    It prints the time per cycle (min, median, max over the rounds) and
//!    the paired ratio `pg / pg_bare` of each round.
//! 2. **Contended grant**: two handles (to the database, two processes),
//!    one holds the only permit, the other waits in line; the holder
//!    releases. It counts the function calls per hand-off in the server's
//!    log (`log_statement = 'all'` for this part) and times release to
//!    grant. The time for Redis too.
//! 3. **Processes**: 10 tasks on a limit of 4, each acquiring and
//!    releasing at once for 3 s, in one process and in 10 processes (this
//!    bench re-run as children): grants per second of each.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pg_bare::Bare;
use tokio::runtime::{Builder, Runtime};
use tokio_postgres::NoTls;
use watertight::postgres::PgSemaphore;
use watertight::redis::RedisSemaphore;

#[path = "common/pg_bare.rs"]
mod pg_bare;
#[path = "../tests/common/pg_server.rs"]
mod pg_server;
#[path = "common/redis_server.rs"]
mod redis_server;

const CHILD_ENV: &str = "WATERTIGHT_BENCH_PG_CHILD";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Ok(url) = std::env::var(CHILD_ENV) {
        return child(&url, &args);
    }
    match args.get(1).map(String::as_str) {
        Some("run") => {
            let rounds = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
            let cycles = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(200);
            run(rounds, cycles);
        }
        _ => println!(
            "usage: cargo bench -p watertight-benches --bench postgres \
             --features postgres,redis,tokio -- run [ROUNDS] [CYCLES]"
        ),
    }
}

fn runtime() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn run(rounds: usize, cycles: u64) {
    let pg = pg_server::PgServer::start("bench postgres").expect("PostgreSQL 15 is installed");
    let redis = Some(redis_server::Server::start());
    let rt = runtime();
    let url = pg.url();
    uncontended(&rt, &url, redis.as_ref(), rounds, cycles);
    contended(&rt, &url, redis.as_ref(), &pg);
    processes(&url);
}

// ---------------------------------------------------------------------------
// 1. Uncontended
// ---------------------------------------------------------------------------

async fn pg_semaphore(url: &str, name: &str, limit: usize) -> PgSemaphore {
    PgSemaphore::builder(url.parse().unwrap(), name)
        .limit(limit)
        .build()
        .await
        .unwrap()
}

fn uncontended(
    rt: &Runtime,
    url: &str,
    redis: Option<&redis_server::Server>,
    rounds: usize,
    cycles: u64,
) {
    let (sem, mut bare, rsem) = rt.block_on(async {
        let sem = pg_semaphore(url, "uncontended", 1).await;
        let bare = Bare::new(url, "uncontended-bare").await;
        // The bare case's row, as the semaphore's build stores it.
        pg_semaphore(url, "uncontended-bare", 1).await;
        let rsem = match redis {
            Some(server) => Some(
                RedisSemaphore::builder(redis::Client::open(server.url()).unwrap(), "uncontended")
                    .limit(1)
                    .build()
                    .await
                    .unwrap(),
            ),
            None => None,
        };
        (sem, bare, rsem)
    });
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut ratios = Vec::new();
    for round in 0..=rounds {
        let mut per = [0.0; 3];
        for k in 0..3 {
            let case = (k + round) % 3;
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..cycles {
                    match case {
                        0 => sem.acquire().await.unwrap().release().await.unwrap(),
                        1 => bare.cycle().await,
                        _ => {
                            if let Some(r) = &rsem {
                                r.acquire().await.unwrap().release().await.unwrap();
                            }
                        }
                    }
                }
            });
            per[case] = start.elapsed().as_secs_f64() * 1e6 / cycles as f64;
        }
        // The first round warms up.
        if round > 0 {
            for case in 0..3 {
                times[case].push(per[case]);
            }
            ratios.push(per[0] / per[1]);
        }
    }
    println!(
        "uncontended acquire + release, µs per cycle (min / median / max over {rounds} rounds of {cycles})"
    );
    for (case, name) in ["pg", "pg_bare", "redis"].iter().enumerate() {
        if case == 2 && rsem.is_none() {
            println!("  redis: no redis-server");
            continue;
        }
        let (lo, mid, hi) = spread(&mut times[case]);
        println!("  {name:8} {lo:8.1} {mid:8.1} {hi:8.1}");
    }
    let (lo, mid, hi) = spread(&mut ratios);
    println!("  pg / pg_bare, paired by round: {lo:.3} / {mid:.3} / {hi:.3}");
}

fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

// ---------------------------------------------------------------------------
// 2. Contended
// ---------------------------------------------------------------------------

fn contended(
    rt: &Runtime,
    url: &str,
    redis: Option<&redis_server::Server>,
    pg: &pg_server::PgServer,
) {
    const GRANTS: usize = 200;
    // Every statement the server runs goes to its log while this part
    // runs, after a marker: the statements per hand-off are counted there.
    pg.psql("ALTER SYSTEM SET log_statement = 'all'");
    pg.psql("SELECT pg_reload_conf()");
    pg.psql("SELECT 'contended-start'");
    let mut waits = rt.block_on(async {
        let holder = pg_semaphore(url, "contended", 1).await;
        let waiter = pg_semaphore(url, "contended", 1).await;
        let mut waits = Vec::new();
        for _ in 0..GRANTS {
            let held = holder.acquire().await.unwrap();
            let pending = tokio::spawn({
                let waiter = waiter.clone();
                async move {
                    let permit = waiter.acquire().await.unwrap();
                    (permit, Instant::now())
                }
            });
            // Until the waiter's row is in line.
            while !in_line(url).await {
                tokio::task::yield_now().await;
            }
            let released = Instant::now();
            held.release().await.unwrap();
            let (permit, granted) = pending.await.unwrap();
            waits.push((granted - released).as_secs_f64() * 1e6);
            permit.release().await.unwrap();
        }
        waits
    });
    pg.psql("ALTER SYSTEM RESET log_statement");
    pg.psql("SELECT pg_reload_conf()");
    let log = std::fs::read_to_string(pg.log_path()).unwrap();
    let after = &log[log.rfind("contended-start").unwrap()..];
    let count = |function: &str| {
        after
            .lines()
            .filter(|l| l.contains("execute") && l.contains(function))
            .count()
    };
    let (acquires, releases) = (count("watertight.acquire("), count("watertight.release("));
    let (lo, mid, hi) = spread(&mut waits);
    println!(
        "contended grant, PostgreSQL: release to grant {lo:.0} / {mid:.0} / {hi:.0} µs \
         (min / median / max of {GRANTS}); per round (holder's grant, waiter's join, \
         the release that grants the waiter, the waiter's release): {:.2} acquire and \
         {:.2} release calls, so {:.2} calls per contended grant beyond the holder's own",
        acquires as f64 / GRANTS as f64,
        releases as f64 / GRANTS as f64,
        (acquires + releases) as f64 / GRANTS as f64 - 3.0,
    );
    if let Some(server) = redis {
        let mut waits = rt.block_on(async {
            let make = || async {
                RedisSemaphore::builder(redis::Client::open(server.url()).unwrap(), "contended")
                    .limit(1)
                    .build()
                    .await
                    .unwrap()
            };
            let (holder, waiter) = (make().await, make().await);
            let mut waits = Vec::new();
            for _ in 0..GRANTS {
                let held = holder.acquire().await.unwrap();
                let pending = tokio::spawn({
                    let waiter = waiter.clone();
                    async move {
                        let permit = waiter.acquire().await.unwrap();
                        (permit, Instant::now())
                    }
                });
                tokio::time::sleep(Duration::from_millis(2)).await;
                let released = Instant::now();
                held.release().await.unwrap();
                let (permit, granted) = pending.await.unwrap();
                waits.push((granted - released).as_secs_f64() * 1e6);
                permit.release().await.unwrap();
            }
            waits
        });
        let (lo, mid, hi) = spread(&mut waits);
        println!(
            "contended grant, Redis: release to grant {lo:.0} / {mid:.0} / {hi:.0} µs \
             (min / median / max of {GRANTS})"
        );
    }
}

async fn query_one_u64(url: &str, sql: &str) -> u64 {
    let (client, connection) = url
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
    n.unsigned_abs()
}

async fn in_line(url: &str) -> bool {
    query_one_u64(
        url,
        "SELECT count(*) FROM watertight.waiters WHERE semaphore = 'contended'",
    )
    .await
        == 1
}

// ---------------------------------------------------------------------------
// 3. Processes
// ---------------------------------------------------------------------------

const TASKS: usize = 10;
const LIMIT: usize = 4;
const FOR: Duration = Duration::from_secs(3);

fn processes(url: &str) {
    for procs in [1, 10] {
        let name = format!("procs-{procs}");
        let tasks = TASKS / procs;
        let start = Instant::now();
        let children: Vec<_> = (0..procs)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .env(CHILD_ENV, url)
                    .arg(&name)
                    .arg(tasks.to_string())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut grants = 0u64;
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
            grants += String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap();
        }
        let took = start.elapsed();
        println!(
            "{procs:2} process(es) x {tasks:2} task(s), limit {LIMIT}: {grants} grants, \
             {:.0} per second of the run ({took:.1?} with start-up)",
            grants as f64 / FOR.as_secs_f64()
        );
    }
}

/// A child of `processes`: `tasks` tasks acquire and release as fast as
/// they can for `FOR`, once every child is up; prints its grants.
fn child(url: &str, args: &[String]) {
    let name = args[1].clone();
    let tasks: usize = args[2].parse().unwrap();
    let rt = Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let grants = rt.block_on(async {
        let sem = pg_semaphore(url, &name, LIMIT).await;
        let count = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + FOR;
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (sem, count) = (sem.clone(), count.clone());
                tokio::spawn(async move {
                    while Instant::now() < end {
                        let permit = sem.acquire().await.unwrap();
                        count.fetch_add(1, Ordering::Relaxed);
                        permit.release().await.unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        count.load(Ordering::Relaxed)
    });
    println!("{grants}");
}
