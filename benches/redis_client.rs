//! Not a criterion bench: what the Redis backend's client adds to an
//! uncontended acquire + release, against two bare redis-rs script calls,
//! with the cases interleaved in one run (issue 11's 1.05x target).
//!
//! ```sh
//! cargo bench -p watertight-benches --bench redis_client --features redis-cluster,tokio -- run [SAMPLES] [CYCLES]
//! python3 benches/redis_client.py      # the instruction counts, under callgrind
//! ```
//!
//! Cases (each one cycle = two script calls, current-thread runtime, one
//! `ConnectionManager` configured like the semaphore's, or one cluster
//! connection):
//!
//! - `ours`: `RedisSemaphore::acquire().await`, then `release().await`, in
//!   fair mode with the quarantine on (the defaults).
//! - `bare_ours`: the like-for-like floor: redis-rs alone
//!   (`Script::invoke_async`) sending **our own** acquire and release
//!   scripts (read from `src/redis/scripts.rs`) with the same keys and
//!   arguments as the semaphore sends them. Same server work, same bytes
//!   on the wire: the difference to `ours` is what our client adds.
//! - `bare_cmp`: two calls of `benches/redis.rs`'s comparable script (one
//!   key, one argument, 5 commands): what `redis.rs` compared with.
//!
//! `run` builds every case, then takes SAMPLES (default 30) rounds; in each
//! round every case runs CYCLES (default 300) cycles, in an order rotated
//! round to round, with the server's `INFO commandstats` reset before and
//! read after each case's turn (outside the timed part). It prints, per
//! case, the time per cycle (min, median, max over the rounds), the
//! server's µs per script call, script calls per cycle, and heap
//! allocations per cycle (a counting global allocator); then the ratio
//! `ours / bare_ours` and `ours / bare_cmp` of each round (paired, so a
//! busy moment hits both) as min, median, max. With the `redis-cluster`
//! feature the same three cases run on a 3-primary cluster too.
//!
//! `count CASE CYCLES` runs one case (`ours`, `bare_ours`, `bare_cmp`, or
//! `cluster_` + one of them) for CYCLES cycles after 200 warm-up cycles,
//! for callgrind: the difference between two counts is the client's
//! instructions per cycle (`benches/redis_client.py`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::{Builder, Runtime};
use watertight::redis::RedisSemaphore;

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::{ScriptStats, Server};

/// The test harness's cluster (three primaries on loopback).
#[cfg(feature = "redis-cluster")]
#[path = "../tests/common/redis_server.rs"]
mod harness;

// ---------------------------------------------------------------------------
// Counting allocations
// ---------------------------------------------------------------------------

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[path = "common/redis_bare.rs"]
mod redis_bare;
use redis_bare::{Bare, comparable};

async fn ours(sem: &RedisSemaphore, n: u64) {
    for _ in 0..n {
        let permit = sem.acquire().await.expect("a permit");
        permit.release().await.expect("released in time");
    }
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

#[derive(Clone)]
enum Conn {
    Node(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

enum Kind {
    Ours(RedisSemaphore),
    BareOurs(Bare, Conn),
    BareCmp(Conn),
}

struct Case {
    name: String,
    kind: Kind,
    /// Reset and read the script statistics of the server(s) it uses.
    stats: Box<dyn Fn(bool) -> ScriptStats>,
}

impl Case {
    async fn run(&self, n: u64) {
        match &self.kind {
            Kind::Ours(sem) => ours(sem, n).await,
            Kind::BareOurs(bare, Conn::Node(c)) => bare.cycles(&mut c.clone(), n).await,
            Kind::BareCmp(Conn::Node(c)) => comparable(&mut c.clone(), 2 * n).await,
            #[cfg(feature = "redis-cluster")]
            Kind::BareOurs(bare, Conn::Cluster(c)) => bare.cycles(&mut c.clone(), n).await,
            #[cfg(feature = "redis-cluster")]
            Kind::BareCmp(Conn::Cluster(c)) => comparable(&mut c.clone(), 2 * n).await,
        }
    }
}

fn config() -> ConnectionManagerConfig {
    // As the semaphore's builder sets it (`conn.rs`, default response
    // timeout 2 s).
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1))
}

/// Everything that must outlive the cases.
struct Servers {
    node: Server,
    #[cfg(feature = "redis-cluster")]
    cluster: Option<harness::RedisCluster>,
}

fn node_stats(port: u16) -> Box<dyn Fn(bool) -> ScriptStats> {
    Box::new(move |reset| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let mut conn = client.get_connection().expect("a stats connection");
        if reset {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut conn)
                .unwrap();
            return ScriptStats::default();
        }
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .unwrap();
        ScriptStats::parse(&info)
    })
}

fn build_cases(rt: &Runtime, servers: &Servers, only: Option<&str>) -> Vec<Case> {
    let want = |name: &str| only.is_none_or(|o| o == name);
    let mut cases = Vec::new();
    let port = servers.node.port;
    rt.block_on(async {
        let client = servers.node.client();
        if want("ours") {
            let sem = RedisSemaphore::builder(client.clone(), "bench-ours")
                .limit(1)
                .build()
                .await
                .expect("the semaphore connects");
            cases.push(Case {
                name: "ours".into(),
                kind: Kind::Ours(sem),
                stats: node_stats(port),
            });
        }
        if want("bare_ours") {
            let mut conn = client
                .get_connection_manager_with_config(config())
                .await
                .expect("a connection");
            let bare = Bare::new("bench-bare", "PUBLISH", &mut conn).await;
            cases.push(Case {
                name: "bare_ours".into(),
                kind: Kind::BareOurs(bare, Conn::Node(conn)),
                stats: node_stats(port),
            });
        }
        if want("bare_cmp") {
            let conn = client
                .get_connection_manager_with_config(config())
                .await
                .expect("a connection");
            cases.push(Case {
                name: "bare_cmp".into(),
                kind: Kind::BareCmp(Conn::Node(conn)),
                stats: node_stats(port),
            });
        }
        #[cfg(feature = "redis-cluster")]
        if let Some(cluster) = &servers.cluster {
            let client =
                || redis::cluster::ClusterClient::new(cluster.urls("?protocol=3")).unwrap();
            // The bare connections configured like the semaphore's
            // (`conn/cluster.rs`: both timeouts at the default 2 s;
            // WATERTIGHT_BENCH_PUSHES=1 adds a push sender, as ours has).
            let bare_conn = || async {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(Duration::from_secs(2));
                let config = match std::env::var_os("WATERTIGHT_BENCH_PUSHES") {
                    Some(_) => config.set_push_sender(|_: redis::PushInfo| {
                        Ok::<(), core::convert::Infallible>(())
                    }),
                    None => config,
                };
                client()
                    .get_async_connection_with_config(config)
                    .await
                    .expect("a cluster connection")
            };
            let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
            let stats = move || -> Box<dyn Fn(bool) -> ScriptStats> {
                let nodes: Vec<_> = ports.iter().map(|&p| node_stats(p)).collect();
                Box::new(move |reset| {
                    let mut all = ScriptStats::default();
                    for node in &nodes {
                        let one = node(reset);
                        all.calls += one.calls;
                        all.usec += one.usec;
                    }
                    all
                })
            };
            if want("cluster_ours") {
                let sem = RedisSemaphore::builder(client(), "bench-ours")
                    .limit(1)
                    .build()
                    .await
                    .expect("the semaphore connects to the cluster");
                cases.push(Case {
                    name: "cluster_ours".into(),
                    kind: Kind::Ours(sem),
                    stats: stats(),
                });
            }
            if want("cluster_bare_ours") {
                let mut conn = bare_conn().await;
                let bare = Bare::new("bench-bare", "SPUBLISH", &mut conn).await;
                cases.push(Case {
                    name: "cluster_bare_ours".into(),
                    kind: Kind::BareOurs(bare, Conn::Cluster(conn)),
                    stats: stats(),
                });
            }
            if want("cluster_bare_cmp") {
                let conn = bare_conn().await;
                cases.push(Case {
                    name: "cluster_bare_cmp".into(),
                    kind: Kind::BareCmp(Conn::Cluster(conn)),
                    stats: stats(),
                });
            }
        }
    });
    cases
}

fn start_servers(cluster: bool) -> Servers {
    let _ = cluster;
    Servers {
        node: Server::start(),
        #[cfg(feature = "redis-cluster")]
        cluster: match cluster {
            true => harness::RedisCluster::start_or_skip(3),
            false => None,
        },
    }
}

// ---------------------------------------------------------------------------
// run
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Tally {
    /// ns per cycle, one per round.
    ns: Vec<f64>,
    allocs: u64,
    cycles: u64,
    scripts: ScriptStats,
}

fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    (v[0], median, v[v.len() - 1])
}

fn run(samples: usize, cycles: u64) {
    let rt = Builder::new_current_thread().enable_all().build().unwrap();
    let servers = start_servers(true);
    let cases = build_cases(&rt, &servers, None);
    // Warm-up: every case, the scripts loaded, the connections settled.
    for case in &cases {
        rt.block_on(case.run(cycles));
    }
    let mut tallies: Vec<Tally> = cases.iter().map(|_| Tally::default()).collect();
    for round in 0..samples {
        for k in 0..cases.len() {
            let i = (k + round) % cases.len();
            let case = &cases[i];
            (case.stats)(true);
            let allocs = ALLOCS.load(Ordering::Relaxed);
            let start = Instant::now();
            rt.block_on(case.run(cycles));
            let elapsed = start.elapsed();
            let t = &mut tallies[i];
            t.allocs += ALLOCS.load(Ordering::Relaxed) - allocs;
            t.ns.push(elapsed.as_nanos() as f64 / cycles as f64);
            t.cycles += cycles;
            let s = (case.stats)(false);
            t.scripts.calls += s.calls;
            t.scripts.usec += s.usec;
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{samples} rounds of {cycles} cycles per case, interleaved; load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "| case | µs per cycle, min / median / max | µs in Redis per script | script calls per cycle | allocations per cycle |"
    );
    println!("|---|---|--:|--:|--:|");
    for (case, t) in cases.iter().zip(&tallies) {
        let (lo, mid, hi) = spread(&t.ns);
        println!(
            "| `{}` | {:.1} / {:.1} / {:.1} | {:.2} | {:.3} | {:.1} |",
            case.name,
            lo / 1e3,
            mid / 1e3,
            hi / 1e3,
            t.scripts.usec_per_call(),
            t.scripts.calls as f64 / t.cycles as f64,
            t.allocs as f64 / t.cycles as f64,
        );
    }
    println!();
    println!("| ratio, paired by round | min | median | max |");
    println!("|---|--:|--:|--:|");
    let find = |name: &str| cases.iter().position(|c| c.name == name);
    for prefix in ["", "cluster_"] {
        let Some(o) = find(&format!("{prefix}ours")) else {
            continue;
        };
        for base in ["bare_ours", "bare_cmp"] {
            let Some(b) = find(&format!("{prefix}{base}")) else {
                continue;
            };
            let ratios: Vec<f64> = tallies[o]
                .ns
                .iter()
                .zip(&tallies[b].ns)
                .map(|(x, y)| x / y)
                .collect();
            let (lo, mid, hi) = spread(&ratios);
            println!("| `{prefix}ours` / `{prefix}{base}` | {lo:.3} | {mid:.3} | {hi:.3} |");
        }
    }
}

// ---------------------------------------------------------------------------
// count (for callgrind)
// ---------------------------------------------------------------------------

fn count(name: &str, cycles: u64) {
    let rt = Builder::new_current_thread().enable_all().build().unwrap();
    let servers = start_servers(name.starts_with("cluster_"));
    let cases = build_cases(&rt, &servers, Some(name));
    let Some(case) = cases.first() else {
        eprintln!("no case {name:?} (or no cluster here)");
        std::process::exit(2);
    };
    rt.block_on(case.run(200));
    let allocs = ALLOCS.load(Ordering::Relaxed);
    rt.block_on(case.run(cycles));
    eprintln!(
        "{name}: {cycles} cycles, {} allocations",
        ALLOCS.load(Ordering::Relaxed) - allocs
    );
}

fn usage() {
    eprintln!(
        "usage: redis_client run [SAMPLES] [CYCLES] | redis_client count CASE CYCLES\n\
         (see the top of benches/redis_client.rs)"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| {
        args.get(i)
            .and_then(|a| a.parse::<u64>().ok())
            .unwrap_or(default)
    };
    match args.first().map(String::as_str) {
        Some("run") => run(num(1, 30) as usize, num(2, 300)),
        Some("count") if args.len() == 3 => count(&args[1], num(2, 1000)),
        _ => usage(),
    }
}
