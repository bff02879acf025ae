//! Many waiters in many processes on one Redis semaphore: grants per
//! second, script calls and pub/sub messages per grant, one process alone
//! against ten on the same server, in one run.
//!
//! Run it with
//! `cargo bench -p watertight-benches --bench redis_procs --features redis,tokio`.
//! It starts its own `redis-server` (see `common/redis_server.rs`), then for
//! each setup runs [`WAITERS`] tasks in all, spread over one process or over
//! [`PROCS`] processes (this binary again, as children), every task looping
//! `acquire().await`, `yield_now().await` while holding, `release().await`
//! on one semaphore of [`LIMIT`] permits. Each child runs a current-thread
//! tokio runtime, as a small service would.
//!
//! The children start together at a wall-clock instant the parent gives
//! them. After [`WARM_UP`] the parent resets the server's statistics, and
//! at the end of the window it reads them: script calls (`EVALSHA`, `EVAL`)
//! and publishes (`PUBLISH`, `SPUBLISH`, the scripts' wake-ups: commands a
//! script runs are counted like any other) over the window, and how many
//! subscriptions each wake-up channel has. Each child counts the grants it
//! got within the window and prints the count. Per grant:
//!
//! - **script calls**: 2 when every woken waiter wins its permit (its
//!   acquire and, later, its release); more when woken waiters race and
//!   lose;
//! - **messages delivered**: publishes per grant times the subscriptions
//!   per channel (exact when every channel has as many subscribers, as with
//!   one channel for all or one per process): the wake-ups that reach a
//!   process, each of which may wake several of its waiters.
//!
//! Each setup runs in fair mode (the default: waiters queue in Redis and a
//! release grants the head, telling only its process) and in unfair mode
//! (`fair(false)`: every waiter races on a `free` message to all).
//!
//! `--test` (as `cargo test --benches` passes) runs each setup briefly.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use watertight::redis::RedisSemaphore;

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

/// Waiters in all, in every setup.
const WAITERS: usize = 1000;
/// Processes of the spread setup.
const PROCS: usize = 10;
/// Permits of the semaphore.
const LIMIT: usize = 10;
/// Time from the start before the window opens, and the window.
const WARM_UP: Duration = Duration::from_millis(1000);
const WINDOW: Duration = Duration::from_millis(4000);
/// The same in `--test` mode.
const TEST_WARM_UP: Duration = Duration::from_millis(200);
const TEST_WINDOW: Duration = Duration::from_millis(300);
/// Time the children get to connect before the start.
const SETTLE: Duration = Duration::from_millis(1500);

/// The environment variable that makes this binary a child, and what it
/// carries: `url|name|fair|tasks|start_unix_ms|warm_up_ms|window_ms`.
const CHILD: &str = "WATERTIGHT_REDIS_PROCS_CHILD";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// How long until the wall-clock instant `at_ms` (zero if it passed).
fn until(at_ms: u64) -> Duration {
    Duration::from_millis(at_ms.saturating_sub(unix_ms()))
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") {
        return;
    }
    let (warm_up, window) = if has("--test") {
        (TEST_WARM_UP, TEST_WINDOW)
    } else {
        (WARM_UP, WINDOW)
    };

    let server = Server::start();
    // Fair mode (the default: waiters queue in Redis) and unfair mode.
    let setups = [
        ("fair", true, 1),
        ("fair", true, PROCS),
        ("unfair", false, 1),
        ("unfair", false, PROCS),
    ];
    let mut rows = Vec::new();
    for (i, (label, fair, procs)) in setups.into_iter().enumerate() {
        let name = format!("procs-{i}");
        rows.push((
            label,
            procs,
            run(&server, &name, fair, procs, warm_up, window),
        ));
    }

    eprintln!();
    eprintln!(
        "{WAITERS} waiters, limit {LIMIT}, each holding for one yield; window {window:?} after {warm_up:?}:"
    );
    for (label, procs, r) in &rows {
        // The same mode in one process.
        let alone = rows
            .iter()
            .find(|(l, p, _)| l == label && *p == 1)
            .map_or(f64::NAN, |(_, _, r)| r.grants_per_s(window));
        let per = |n: u64| n as f64 / r.grants.max(1) as f64;
        eprintln!(
            "  {label:<6} {procs:>2} x {:>4} tasks: {:>8.0} grants/s ({:.2} of one process), \
             {:.3} script calls, {:.3} publishes, {:.3} messages delivered per grant \
             (channels: {})",
            WAITERS / procs,
            r.grants_per_s(window),
            r.grants_per_s(window) / alone,
            per(r.scripts),
            per(r.publishes),
            per(r.publishes) * r.subscribers_per_channel(),
            r.channels_text(),
        );
        eprintln!(
            "      per grant: client CPU {:.1} µs, {:.2} voluntary + {:.2} involuntary context \
             switches; server CPU {:.1} µs, {:.2} read and {:.2} write events; \
             CPU of all {:.0} % of the machine's",
            r.clients.cpu_us as f64 / r.grants.max(1) as f64,
            per(r.clients.voluntary),
            per(r.clients.involuntary),
            r.server.cpu_us as f64 / r.grants.max(1) as f64,
            per(r.events.0),
            per(r.events.1),
            100.0 * (r.clients.cpu_us + r.server.cpu_us) as f64
                / (window.as_secs_f64() * 1e6 * cores() as f64),
        );
        eprintln!("      grants per process: {:?}", r.per_process);
    }
}

/// The machine's cores, for the share of CPU the setup used.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What one setup did within its window.
struct Outcome {
    grants: u64,
    per_process: Vec<u64>,
    scripts: u64,
    publishes: u64,
    /// Subscriptions per wake-up channel, near the end of the window.
    channels: BTreeMap<String, u64>,
    /// The client processes' CPU time and context switches, summed.
    clients: Usage,
    /// The server's.
    server: Usage,
    /// The server's read and write events.
    events: (u64, u64),
}

impl Outcome {
    fn grants_per_s(&self, window: Duration) -> f64 {
        self.grants as f64 / window.as_secs_f64()
    }

    fn subscribers_per_channel(&self) -> f64 {
        if self.channels.is_empty() {
            return 0.0;
        }
        self.channels.values().sum::<u64>() as f64 / self.channels.len() as f64
    }

    fn channels_text(&self) -> String {
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for subs in self.channels.values() {
            *counts.entry(*subs).or_default() += 1;
        }
        counts
            .iter()
            .map(|(subs, n)| format!("{n} with {subs} subscriber(s)"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn run(
    server: &Server,
    name: &str,
    fair: bool,
    procs: usize,
    warm_up: Duration,
    window: Duration,
) -> Outcome {
    let start = unix_ms() + SETTLE.as_millis() as u64;
    let exe = std::env::current_exe().expect("the bench's own path");
    let spec = format!(
        "{}|{name}|{fair}|{}|{start}|{}|{}",
        server.url(),
        WAITERS / procs,
        warm_up.as_millis(),
        window.as_millis()
    );
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .env(CHILD, &spec)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a child process")
        })
        .collect();

    std::thread::sleep(until(start + warm_up.as_millis() as u64));
    server.reset_stats();
    let server_before = Usage::of(&server.pid().to_string());
    std::thread::sleep(until(start + (warm_up + window).as_millis() as u64 - 100));
    let channels = wake_channels(server);
    std::thread::sleep(until(start + (warm_up + window).as_millis() as u64));
    let stats = command_calls(server);
    let server_usage = Usage::of(&server.pid().to_string()).since(server_before);
    let events = server_events(server);

    let mut clients = Usage::default();
    let per_process: Vec<u64> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("the child ends");
            assert!(out.status.success(), "a child failed: {}", out.status);
            let text = String::from_utf8_lossy(&out.stdout);
            let nums: Vec<u64> = text
                .split_whitespace()
                .map(|n| n.parse().expect("the child prints numbers"))
                .collect();
            let [grants, cpu_us, voluntary, involuntary] = nums[..] else {
                panic!("the child printed {text:?}");
            };
            clients.cpu_us += cpu_us;
            clients.voluntary += voluntary;
            clients.involuntary += involuntary;
            grants
        })
        .collect();
    let calls = |names: &[&str]| {
        names
            .iter()
            .map(|n| stats.get(*n).copied().unwrap_or(0))
            .sum()
    };
    Outcome {
        grants: per_process.iter().sum(),
        per_process,
        scripts: calls(&["evalsha", "eval"]),
        publishes: calls(&["publish", "spublish"]),
        channels,
        clients,
        server: server_usage,
        events,
    }
}

/// The server's read and write events since the last reset (`INFO stats`
/// `total_reads_processed`, `total_writes_processed`): one read event may
/// carry many commands of one connection (pipelined, or sent by many tasks
/// on one multiplexed connection), one write many answers and messages.
fn server_events(server: &Server) -> (u64, u64) {
    let info: String = server.query(redis::cmd("INFO").arg("stats"));
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        field("total_reads_processed"),
        field("total_writes_processed"),
    )
}

/// Calls per command since the last reset (`INFO commandstats`).
fn command_calls(server: &Server) -> BTreeMap<String, u64> {
    let info: String = server.query(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.trim().parse().ok()?))
        })
        .collect()
}

/// Every channel (plain and sharded) with its subscriptions.
fn wake_channels(server: &Server) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (list, count) in [("CHANNELS", "NUMSUB"), ("SHARDCHANNELS", "SHARDNUMSUB")] {
        let names: Vec<String> = server.query(redis::cmd("PUBSUB").arg(list));
        if names.is_empty() {
            continue;
        }
        let pairs: Vec<redis::Value> = server.query(redis::cmd("PUBSUB").arg(count).arg(&names));
        for pair in pairs.chunks(2) {
            if let [name, subs] = pair {
                let name: String = redis::from_redis_value(name.clone()).unwrap_or_default();
                let subs: u64 = redis::from_redis_value(subs.clone()).unwrap_or(0);
                out.insert(name, subs);
            }
        }
    }
    out
}

/// A child: `tasks` waiters loop until the window closes; prints the grants
/// they got within it.
fn child(spec: &str) {
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, name, fair, tasks, start, warm_up, window] = parts[..] else {
        panic!("bad {CHILD}: {spec}");
    };
    let num = |s: &str| s.parse::<u64>().expect("a number in the child's spec");
    let (tasks, start) = (num(tasks) as usize, num(start));
    let (open, close) = (start + num(warm_up), start + num(warm_up) + num(window));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let grants = rt.block_on(async {
        let client = redis::Client::open(url).expect("a valid URL");
        let sem = RedisSemaphore::builder(client, name)
            .limit(LIMIT)
            .fair(fair == "true")
            .build()
            .await
            .expect("the semaphore connects");
        tokio::time::sleep(until(start)).await;
        let open = tokio::time::Instant::now() + until(open);
        let close = tokio::time::Instant::now() + until(close);
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move {
                    let mut counted = 0u64;
                    loop {
                        let permit = tokio::select! {
                            p = sem.acquire() => p.expect("a permit"),
                            () = tokio::time::sleep_until(close) => break,
                        };
                        let now = tokio::time::Instant::now();
                        if now >= open && now < close {
                            counted += 1;
                        }
                        tokio::task::yield_now().await;
                        permit.release().await.expect("released in time");
                        if now >= close {
                            break;
                        }
                    }
                    counted
                })
            })
            .collect();
        // This process's CPU time and context switches over the window.
        let usage = tokio::spawn(async move {
            tokio::time::sleep_until(open).await;
            let before = Usage::read();
            tokio::time::sleep_until(close).await;
            Usage::read().since(before)
        });
        let mut grants = 0;
        for h in handles {
            grants += h.await.expect("a waiter task");
        }
        (grants, usage.await.expect("the usage task"))
    });
    let (grants, usage) = grants;
    println!(
        "{grants} {} {} {}",
        usage.cpu_us, usage.voluntary, usage.involuntary
    );
}

/// A process's CPU time (user and system, µs) and context switches
/// (voluntary: it waited; involuntary: it was preempted), from `/proc`
/// (zeros where there is none).
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu_us: u64,
    voluntary: u64,
    involuntary: u64,
}

impl Usage {
    fn read() -> Usage {
        Self::of("self")
    }

    /// Of the process `pid` (`"self"` for this one).
    fn of(pid: &str) -> Usage {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command name, which is in parentheses.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime are fields 14 and 15 of stat, 12 and 13 here, in
        // clock ticks (100 a second on Linux).
        let cpu_us = (ticks(11) + ticks(12)) * 10_000;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Usage {
            cpu_us,
            voluntary: field("voluntary_ctxt_switches:"),
            involuntary: field("nonvoluntary_ctxt_switches:"),
        }
    }

    fn since(self, before: Usage) -> Usage {
        Usage {
            cpu_us: self.cpu_us.saturating_sub(before.cpu_us),
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            involuntary: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}
