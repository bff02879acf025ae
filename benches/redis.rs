//! The Redis backend's acquire/release round trip on loopback, next to
//! `redis-benchmark` against the same server, in one run.
//!
//! The bench starts its own `redis-server` on a free port of 127.0.0.1 with
//! persistence off (`WATERTIGHT_REDIS_SERVER` overrides the binary) and kills
//! it at the end. Run it with
//! `cargo bench -p watertight-benches --bench redis --features redis,tokio`,
//! or through `benches/redis_report.py`, which also prints the table whose
//! round trips `PERFORMANCE.md` quotes.
//!
//! Criterion cases (group `redis`; one iteration is one acquire/release
//! cycle, which is two script calls when nobody waits):
//!
//! - `try_acquire_release`: `try_acquire().await`, then
//!   `permit.release().await`, on a current-thread runtime.
//! - `acquire_release`: `acquire().await` and `release().await`, uncontended,
//!   on a current-thread runtime.
//! - `acquire_release_mt`: the same inside a task of a multi-thread runtime
//!   with two workers (the connection's driver task and pub/sub run on the
//!   other worker, as in most services).
//! - `contended_t16_p4`: 16 tasks share a limit of 4 on a two-worker
//!   multi-thread runtime, each looping acquire, release (no work while
//!   holding). The time is wall time divided by the cycles done: the
//!   inverse of throughput, not a latency. Fair mode (the default: a
//!   waiter joins the line in Redis and is granted by the release).
//! - `contended_t16_p4_unfair`: the same with `fair(false)` (waiters race
//!   on `free 1`).
//! - `redis_rs_evalsha`: the floor for any client written with redis-rs:
//!   one `Script::invoke_async` of [`COMPARABLE_SCRIPT`] on a
//!   `ConnectionManager` configured like the semaphore's. One iteration is
//!   **one** script call here. Lighter than ours (5 commands, one key).
//! - `redis_rs_ours`: the like-for-like floor (`benches/common/redis_bare.rs`):
//!   redis-rs alone sending the semaphore's own acquire and release scripts
//!   with its keys and arguments. One iteration is one cycle, two calls.
//! - `cluster_acquire_release`, `cluster_redis_rs_evalsha`,
//!   `cluster_redis_rs_ours` (feature `redis-cluster`): the same on a
//!   3-primary cluster.
//!
//! Around each case the bench resets and reads `INFO commandstats`, to count
//! the script calls per cycle (waiters that lose a race call again) and the
//! server's own time per script call.
//!
//! After the criterion cases, `redis-benchmark` (`WATERTIGHT_REDIS_BENCHMARK`
//! overrides the binary) runs against the same server: `PING` with one
//! connection (the round-trip floor), and `EVALSHA` of
//! [`COMPARABLE_SCRIPT`] (loaded with `SCRIPT LOAD`) with one connection and
//! one request in flight (`-c 1 -P 1`: the single-connection round trip to
//! compare our per-call time with), one connection pipelining 16
//! (`-c 1 -P 16`: what one connection can carry), and 16 connections
//! (`-c 16`: the server's throughput with as many clients as the contended
//! case has tasks). Each runs [`RB_REPEATS`] times with `-n` [`RB_REQUESTS`],
//! round robin, and the median counts (criterion reports a median too).
//! Every figure is printed to stderr and written to
//! `<criterion dir>/redis_extra.json` for `benches/redis_report.py`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::{Builder, Runtime};
use watertight::redis::RedisSemaphore;

/// Tasks and limit of the contended case.
const TASKS: usize = 16;
const LIMIT: usize = 4;

/// `redis-benchmark -n`, and how many times each configuration runs (the
/// median is reported).
const RB_REQUESTS: u64 = 100_000;
const RB_REPEATS: usize = 3;

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::{ScriptStats, Server};

#[path = "common/redis_bare.rs"]
mod redis_bare;
use redis_bare::{Bare, COMPARABLE_KEY, COMPARABLE_MEMBER, COMPARABLE_SCRIPT};

// ---------------------------------------------------------------------------
// The criterion cases
// ---------------------------------------------------------------------------

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn semaphore(server: &Server, name: &str, limit: usize) -> RedisSemaphore {
    semaphore_fair(server, name, limit, true).await
}

/// A semaphore in fair mode (the default: waiters queue in Redis) or not.
async fn semaphore_fair(server: &Server, name: &str, limit: usize, fair: bool) -> RedisSemaphore {
    RedisSemaphore::builder(server.client(), name)
        .limit(limit)
        .fair(fair)
        .build()
        .await
        .expect("the semaphore connects")
}

/// What one case did, counted around its criterion run (warm-up included).
struct CaseStats {
    name: &'static str,
    /// Script calls one iteration makes when nobody waits.
    nominal_calls: u64,
    cycles: u64,
    scripts: ScriptStats,
}

/// Runs one criterion case between a reset and a read of the server's
/// command statistics. `cycles` counts the iterations the routine did.
fn with_stats(
    server: &Server,
    stats: &mut Vec<CaseStats>,
    name: &'static str,
    nominal_calls: u64,
    run: impl FnOnce(&Arc<AtomicU64>),
) {
    server.reset_stats();
    let cycles = Arc::new(AtomicU64::new(0));
    run(&cycles);
    let cycles = cycles.load(Ordering::Relaxed);
    // Zero when a command-line filter skipped the case.
    if cycles > 0 {
        stats.push(CaseStats {
            name,
            nominal_calls,
            cycles,
            scripts: server.script_stats(),
        });
    }
}

fn bench_cases(c: &mut Criterion, server: &Server) -> Vec<CaseStats> {
    let mut stats = Vec::new();
    let mut g = c.benchmark_group("redis");
    g.throughput(Throughput::Elements(1));

    // (a) try_acquire + release, sequential.
    with_stats(server, &mut stats, "try_acquire_release", 2, |cycles| {
        let rt = current_thread();
        let sem = rt.block_on(semaphore(server, "bench-try", 1));
        g.bench_function("try_acquire_release", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let permit = sem.try_acquire().await.expect("a free permit");
                        permit.release().await.expect("released in time");
                    }
                    cycles.fetch_add(iters, Ordering::Relaxed);
                    start.elapsed()
                })
            })
        });
    });

    // (b) acquire + release, uncontended, current-thread runtime.
    with_stats(server, &mut stats, "acquire_release", 2, |cycles| {
        let rt = current_thread();
        let sem = rt.block_on(semaphore(server, "bench-acquire", 1));
        g.bench_function("acquire_release", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let permit = sem.acquire().await.expect("a permit");
                        permit.release().await.expect("released in time");
                    }
                    cycles.fetch_add(iters, Ordering::Relaxed);
                    start.elapsed()
                })
            })
        });
    });

    // (b') the same in a task of a two-worker multi-thread runtime.
    with_stats(server, &mut stats, "acquire_release_mt", 2, |cycles| {
        let rt = multi_thread();
        let sem = rt.block_on(semaphore(server, "bench-acquire-mt", 1));
        g.bench_function("acquire_release_mt", |b| {
            b.iter_custom(|iters| {
                let sem = sem.clone();
                let cycles = cycles.clone();
                rt.block_on(async move {
                    tokio::spawn(async move {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let permit = sem.acquire().await.expect("a permit");
                            permit.release().await.expect("released in time");
                        }
                        cycles.fetch_add(iters, Ordering::Relaxed);
                        start.elapsed()
                    })
                    .await
                    .expect("the bench task")
                })
            })
        });
    });

    // (c) TASKS tasks share LIMIT permits, in fair mode (the default) and
    // in unfair mode.
    for (name, fair) in [
        ("contended_t16_p4", true),
        ("contended_t16_p4_unfair", false),
    ] {
        contended(server, &mut stats, &mut g, name, fair);
    }

    // The redis-rs floor: one EVALSHA per iteration, no bulkhead.
    with_stats(server, &mut stats, "redis_rs_evalsha", 1, |cycles| {
        let rt = current_thread();
        let conn: ConnectionManager = rt
            .block_on(server.client().get_connection_manager_with_config(config()))
            .expect("a connection");
        let script = redis::Script::new(COMPARABLE_SCRIPT);
        g.bench_function("redis_rs_evalsha", |b| {
            b.iter_custom(|iters| {
                let elapsed = rt.block_on(comparable_calls(&script, conn.clone(), iters));
                cycles.fetch_add(iters, Ordering::Relaxed);
                elapsed
            })
        });
    });

    // The like-for-like floor: redis-rs alone sending our own acquire and
    // release scripts, with our keys and arguments. One iteration is one
    // cycle (two script calls), as for `acquire_release`.
    with_stats(server, &mut stats, "redis_rs_ours", 2, |cycles| {
        let rt = current_thread();
        let mut conn: ConnectionManager = rt
            .block_on(server.client().get_connection_manager_with_config(config()))
            .expect("a connection");
        let bare = rt.block_on(Bare::new("bench-bare", "PUBLISH", &mut conn));
        g.bench_function("redis_rs_ours", |b| {
            b.iter_custom(|iters| {
                let elapsed = rt.block_on(async {
                    let start = Instant::now();
                    bare.cycles(&mut conn.clone(), iters).await;
                    start.elapsed()
                });
                cycles.fetch_add(iters, Ordering::Relaxed);
                elapsed
            })
        });
    });

    g.finish();
    stats
}

/// A `ConnectionManager` configuration like the semaphore's.
fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1))
}

/// `iters` calls of [`COMPARABLE_SCRIPT`] on `conn`, one at a time: the
/// redis-rs floor, on whichever connection type.
async fn comparable_calls(
    script: &redis::Script,
    mut conn: impl redis::aio::ConnectionLike,
    iters: u64,
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let out: (i64, i64, i64) = script
            .key(COMPARABLE_KEY)
            .arg(COMPARABLE_MEMBER)
            .invoke_async(&mut conn)
            .await
            .expect("the script runs");
        std::hint::black_box(out);
    }
    start.elapsed()
}

// ---------------------------------------------------------------------------
// The same cycle on a Redis Cluster
// ---------------------------------------------------------------------------

/// The test harness's cluster (three primaries on loopback, started and
/// joined with `redis-cli --cluster create`).
#[cfg(feature = "redis-cluster")]
#[path = "../tests/common/redis_server.rs"]
mod harness;

/// Script calls and time in Redis summed over every node of the cluster.
#[cfg(feature = "redis-cluster")]
fn cluster_stats(cluster: &harness::RedisCluster, reset: bool) -> ScriptStats {
    let mut stats = ScriptStats::default();
    for node in cluster.nodes() {
        if reset {
            let _: () = node.cmd(&["CONFIG", "RESETSTAT"]);
            continue;
        }
        let info: String = node.cmd(&["INFO", "commandstats"]);
        let one = ScriptStats::parse(&info);
        stats.calls += one.calls;
        stats.usec += one.usec;
    }
    stats
}

/// `cluster_acquire_release` and `cluster_redis_rs_evalsha`: the
/// uncontended cycle (current-thread runtime) through a
/// `redis::cluster::ClusterClient` over RESP3, and the redis-rs floor on
/// the same cluster connection type, routed by the key's slot.
#[cfg(feature = "redis-cluster")]
fn bench_cluster(c: &mut Criterion) -> Vec<CaseStats> {
    use redis::cluster::ClusterClient;

    let mut stats = Vec::new();
    let Some(cluster) = harness::RedisCluster::start_or_skip(3) else {
        eprintln!("no redis-server here: the cluster cases are skipped");
        return stats;
    };
    let client = || ClusterClient::new(cluster.urls("?protocol=3")).expect("cluster URLs");
    let mut g = c.benchmark_group("redis");
    g.throughput(Throughput::Elements(1));
    let rt = current_thread();

    let mut case = |name: &'static str, nominal: u64, run: &mut dyn FnMut(u64) -> Duration| {
        cluster_stats(&cluster, true);
        let cycles = Arc::new(AtomicU64::new(0));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                cycles.fetch_add(iters, Ordering::Relaxed);
                run(iters)
            })
        });
        let cycles = cycles.load(Ordering::Relaxed);
        if cycles > 0 {
            stats.push(CaseStats {
                name,
                nominal_calls: nominal,
                cycles,
                scripts: cluster_stats(&cluster, false),
            });
        }
    };

    let sem = rt
        .block_on(
            RedisSemaphore::builder(client(), "bench-cluster")
                .limit(1)
                .build(),
        )
        .expect("the semaphore connects to the cluster");
    case("cluster_acquire_release", 2, &mut |iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                let permit = sem.acquire().await.expect("a permit");
                permit.release().await.expect("released in time");
            }
            start.elapsed()
        })
    });

    // Configured like the semaphore's (`conn/cluster.rs`: both timeouts at
    // the default 2 s; redis-rs's defaults differ, and cost the cycle two
    // system calls fewer).
    let config = redis::cluster::ClusterConfig::new()
        .set_connection_timeout(Duration::from_secs(2))
        .set_response_timeout(Duration::from_secs(2));
    let conn = rt
        .block_on(client().get_async_connection_with_config(config))
        .expect("a cluster connection");
    let script = redis::Script::new(COMPARABLE_SCRIPT);
    case("cluster_redis_rs_evalsha", 1, &mut |iters| {
        rt.block_on(comparable_calls(&script, conn.clone(), iters))
    });

    let mut bare_conn = conn.clone();
    let bare = rt.block_on(Bare::new("bench-bare", "SPUBLISH", &mut bare_conn));
    case("cluster_redis_rs_ours", 2, &mut |iters| {
        rt.block_on(async {
            let start = Instant::now();
            bare.cycles(&mut bare_conn.clone(), iters).await;
            start.elapsed()
        })
    });
    g.finish();
    stats
}

#[cfg(not(feature = "redis-cluster"))]
fn bench_cluster(_: &mut Criterion) -> Vec<CaseStats> {
    eprintln!("built without the `redis-cluster` feature: the cluster cases are skipped");
    Vec::new()
}

/// `TASKS` tasks share `LIMIT` permits, each looping acquire, release (no
/// work while holding); one iteration is one cycle of one task.
fn contended(
    server: &Server,
    stats: &mut Vec<CaseStats>,
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &'static str,
    fair: bool,
) {
    with_stats(server, stats, name, 2, |cycles| {
        let rt = multi_thread();
        let sem = rt.block_on(semaphore_fair(server, name, LIMIT, fair));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let left = Arc::new(AtomicI64::new(iters as i64));
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..TASKS)
                        .map(|_| {
                            let (sem, left, cycles) = (sem.clone(), left.clone(), cycles.clone());
                            tokio::spawn(async move {
                                while left.fetch_sub(1, Ordering::Relaxed) > 0 {
                                    let permit = sem.acquire().await.expect("a permit");
                                    permit.release().await.expect("released in time");
                                    cycles.fetch_add(1, Ordering::Relaxed);
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("a bench task");
                    }
                    start.elapsed()
                })
            })
        });
        // Every cycle released its permit: nothing may be left behind.
        let holders = rt.block_on(sem.holders()).expect("holders");
        assert!(holders.is_empty(), "leases left after the run: {holders:?}");
    });
}

// ---------------------------------------------------------------------------
// redis-benchmark
// ---------------------------------------------------------------------------

/// One `redis-benchmark` configuration and what its repeats reported.
struct RbRun {
    label: &'static str,
    args: Vec<String>,
    /// Requests per second of each repeat, in the order they ran.
    rps_runs: Vec<f64>,
    /// The p50 latency of each repeat, in ms.
    p50_runs: Vec<f64>,
    /// Summed over the repeats.
    scripts: ScriptStats,
}

impl RbRun {
    /// The median of the repeats (like criterion's median of samples).
    fn rps(&self) -> f64 {
        median(&self.rps_runs)
    }

    fn p50_ms(&self) -> Option<f64> {
        (!self.p50_runs.is_empty()).then(|| median(&self.p50_runs))
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Requests per second and p50 latency from `redis-benchmark -q` output
/// (progress lines end in `\r`; the last line is the result).
fn parse_rb(out: &str) -> Option<(f64, Option<f64>)> {
    let line = out
        .split(['\r', '\n'])
        .rfind(|l| l.contains("requests per second"))?;
    let before = line.split(" requests per second").next()?;
    let rps = before.rsplit([' ', ':']).next()?.trim().parse().ok()?;
    let p50 = line
        .split("p50=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok());
    Some((rps, p50))
}

/// Runs every configuration `repeats` times, round robin, so that a busy
/// moment on the machine hits one repeat of each rather than all repeats
/// of one.
fn run_redis_benchmark(server: &Server, requests: u64, repeats: usize) -> Vec<RbRun> {
    let bin =
        std::env::var("WATERTIGHT_REDIS_BENCHMARK").unwrap_or_else(|_| "redis-benchmark".into());
    let sha: String = server.query(redis::cmd("SCRIPT").arg("LOAD").arg(COMPARABLE_SCRIPT));
    let evalsha = ["EVALSHA", &sha, "1", COMPARABLE_KEY, COMPARABLE_MEMBER].map(String::from);
    let configs: [(&'static str, &[&str], &[String]); 4] = [
        ("PING -c 1", &["-c", "1", "-P", "1"], &["PING".to_owned()]),
        ("EVALSHA -c 1 -P 1", &["-c", "1", "-P", "1"], &evalsha),
        ("EVALSHA -c 1 -P 16", &["-c", "1", "-P", "16"], &evalsha),
        ("EVALSHA -c 16", &["-c", "16", "-P", "1"], &evalsha),
    ];
    let mut results: Vec<RbRun> = configs
        .iter()
        .map(|(label, opts, command)| {
            let mut args: Vec<String> = ["-h", "127.0.0.1", "-p", &server.port.to_string()]
                .map(String::from)
                .to_vec();
            args.extend(["-n".into(), requests.to_string(), "-q".into()]);
            args.extend(opts.iter().map(|s| s.to_string()));
            args.extend(command.iter().cloned());
            RbRun {
                label,
                args,
                rps_runs: Vec::new(),
                p50_runs: Vec::new(),
                scripts: ScriptStats::default(),
            }
        })
        .collect();
    for _ in 0..repeats {
        for run in &mut results {
            server.reset_stats();
            let output = match Command::new(&bin)
                .args(&run.args)
                .stdin(Stdio::null())
                .output()
            {
                Ok(output) => output,
                Err(e) => {
                    eprintln!(
                        "could not run {bin:?} (set WATERTIGHT_REDIS_BENCHMARK): {e}; skipped"
                    );
                    return Vec::new();
                }
            };
            let stdout = String::from_utf8_lossy(&output.stdout);
            let Some((rps, p50_ms)) = parse_rb(&stdout) else {
                eprintln!(
                    "redis-benchmark {}: no result in its output ({}):\n{stdout}{}",
                    run.label,
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                );
                continue;
            };
            run.rps_runs.push(rps);
            run.p50_runs.extend(p50_ms);
            let stats = server.script_stats();
            run.scripts.calls += stats.calls;
            run.scripts.usec += stats.usec;
        }
    }
    results.retain(|r| !r.rps_runs.is_empty());
    results
}

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------

/// Where criterion writes its results (the rules criterion itself follows).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        PathBuf::from(home)
    } else if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(target).join("criterion")
    } else {
        // The workspace's target directory: this crate sits in `benches/`.
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/criterion"))
    }
}

fn report(server: &Server, cases: &[CaseStats], runs: &[RbRun], requests: u64, repeats: usize) {
    let info: String = server.query(redis::cmd("INFO").arg("server"));
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();

    eprintln!();
    eprintln!(
        "redis-benchmark against redis {version} on 127.0.0.1:{}, {requests} requests a run, \
         median of {repeats} runs:",
        server.port
    );
    for r in runs {
        let server_side = if r.scripts.calls > 0 {
            format!(", {:.2} us per script in Redis", r.scripts.usec_per_call())
        } else {
            String::new()
        };
        eprintln!(
            "  {:<20} {:>10.0} requests/s = {:>7.0} ns per call (p50 {} ms; runs: {}){server_side}",
            r.label,
            r.rps(),
            1e9 / r.rps(),
            r.p50_ms().map_or("?".into(), |p| format!("{p:.3}")),
            r.rps_runs
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    if let Some(rt) = runs.iter().find(|r| r.label == "EVALSHA -c 1 -P 1") {
        eprintln!(
            "  one uncontended cycle (2 script calls) at redis-benchmark's EVALSHA round trip: {:.0} ns",
            2e9 / rt.rps()
        );
    }
    eprintln!("script calls counted by the server (INFO commandstats, warm-up included):");
    for case in cases {
        eprintln!(
            "  {:<20} {:>8} cycles, {:.3} script calls per cycle, {:.2} us per script in Redis",
            case.name,
            case.cycles,
            case.scripts.calls as f64 / case.cycles as f64,
            case.scripts.usec_per_call()
        );
    }

    let mut json = String::from("{\n");
    let _ = writeln!(json, "  \"redis_version\": \"{version}\",");
    let _ = writeln!(json, "  \"requests\": {requests},");
    let _ = writeln!(json, "  \"repeats\": {repeats},");
    let _ = writeln!(json, "  \"tasks\": {TASKS},");
    let _ = writeln!(json, "  \"limit\": {LIMIT},");
    json.push_str("  \"redis_benchmark\": [\n");
    let rows: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "    {{\"label\": \"{}\", \"args\": \"{}\", \"rps\": {:.2}, \"rps_runs\": [{}], \
                 \"p50_ms\": {}, \"script_calls\": {}, \"script_usec\": {}}}",
                r.label,
                r.args.join(" "),
                r.rps(),
                r.rps_runs
                    .iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.p50_ms().map_or("null".into(), |p| p.to_string()),
                r.scripts.calls,
                r.scripts.usec
            )
        })
        .collect();
    json.push_str(&rows.join(",\n"));
    json.push_str("\n  ],\n  \"cases\": [\n");
    let rows: Vec<String> = cases
        .iter()
        .map(|c| {
            format!(
                "    {{\"name\": \"{}\", \"nominal_calls\": {}, \"cycles\": {}, \
                 \"script_calls\": {}, \"script_usec\": {}}}",
                c.name, c.nominal_calls, c.cycles, c.scripts.calls, c.scripts.usec
            )
        })
        .collect();
    json.push_str(&rows.join(",\n"));
    json.push_str("\n  ]\n}\n");

    let dir = criterion_dir();
    let path = dir.join("redis_extra.json");
    if std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, json))
        .is_err()
    {
        eprintln!("could not write {}", path.display());
    }
}

fn bench(c: &mut Criterion) {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") {
        return;
    }
    // `cargo test -p watertight-benches --benches` runs each case once: keep redis-benchmark short too.
    let (requests, repeats) = if has("--test") {
        (1_000, 1)
    } else {
        (RB_REQUESTS, RB_REPEATS)
    };

    let server = Server::start();
    let mut cases = bench_cases(c, &server);
    cases.extend(bench_cluster(c));
    let runs = run_redis_benchmark(&server, requests, repeats);
    report(&server, &cases, &runs, requests, repeats);
}

criterion_group! {
    name = benches;
    // Plots cost seconds per case; the table comes from `benches/redis_report.py`.
    config = Criterion::default()
        .without_plots()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
