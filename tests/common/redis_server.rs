//! The test harness for the Redis backend tests:
//!
//! - [`RedisServer`]: a throwaway `redis-server` on a free loopback port, with
//!   persistence off, that can be stopped, restarted on the same port and sent
//!   commands (through the `redis` crate's synchronous connection);
//! - [`RedisServer::start_or_skip`]: where no `redis-server` can be run, the
//!   tests that need one return early and the test binary says so once on
//!   stderr, unless [`REQUIRE_REDIS_ENV`] is set (CI sets it);
//! - process helpers for multi-process tests: [`signal`], [`spawn_child`],
//!   [`ChildTest`], [`ChildLines`] and [`read_line_timeout`];
//! - [`RedisCluster`]: a Redis Cluster made of such servers (primaries
//!   only, or with replicas), and [`SentinelSet`]: a primary, a replica
//!   and one Sentinel (or several, with a quorum) watching them;
//! - [`ConcurrencyProbe`] and [`ProbeClient`]: an independent count of
//!   concurrent holders (threads or processes) that uses neither the library
//!   nor Redis.
//!
//! Include it with `#[path = "common/redis_server.rs"] mod redis_server;`
//! (it needs the `redis` feature, for the `redis` crate). Nothing here may
//! hang a test: every socket read has a timeout and every wait is bounded.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::ffi::OsString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisResult};

/// How long a server may take to answer `PING` after it was started.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The default read/write timeout of [`RedisServer::cmd`].
pub const CMD_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that marks a re-executed test binary as a child.
pub const CHILD_ENV: &str = "WATERTIGHT_CHILD";

/// Overrides the `redis-server` binary (default: `redis-server` from `PATH`).
pub const REDIS_SERVER_ENV: &str = "WATERTIGHT_REDIS_SERVER";

/// Set to `1` to make a `redis-server` that cannot be run fail every test
/// that needs one, instead of skipping it. `.ci/run` sets it, so CI never
/// skips the Redis tests.
pub const REQUIRE_REDIS_ENV: &str = "WATERTIGHT_REQUIRE_REDIS";

const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test must not turn every later `Drop` into a second panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A `redis-server` child process on `127.0.0.1:<free port>`, with
/// persistence off and its own temporary directory (holding `redis.log`).
///
/// All methods take `&self`, so an `Arc<RedisServer>` can be shared between
/// threads and tasks, and one of them may `stop` or `restart` it. Dropping it
/// kills the server and removes the directory.
///
/// `DEBUG` is enabled (`--enable-debug-command yes`); Redis 7 refuses it by
/// default.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    log: PathBuf,
    extra_args: Vec<String>,
    /// For a Sentinel: its configuration file (Sentinel rewrites it).
    sentinel_conf: Option<PathBuf>,
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`;
    /// `None` if no `redis-server` can be run here (see
    /// [`server_available`]): the test then returns at once, with
    /// `let Some(server) = RedisServer::start_or_skip() else { return };`.
    ///
    /// Panics if no server can be run and [`REQUIRE_REDIS_ENV`] is set, and
    /// (with the tail of the server's log) if a server that was started
    /// does not answer within [`STARTUP_TIMEOUT`].
    pub fn start_or_skip() -> Option<RedisServer> {
        RedisServer::start_with_or_skip(&[])
    }

    /// Like [`start_or_skip`](Self::start_or_skip), with extra
    /// `redis-server` arguments appended to the defaults (e.g.
    /// `&["--maxmemory", "10mb"]`). They are kept for
    /// [`restart`](Self::restart).
    pub fn start_with_or_skip(extra_args: &[&str]) -> Option<RedisServer> {
        server_available().then(|| RedisServer::start_with(extra_args))
    }

    /// [`start_with_or_skip`](Self::start_with_or_skip) once a server is
    /// known to run here.
    fn start_with(extra_args: &[&str]) -> RedisServer {
        RedisServer::start_in(temp_dir("redis"), extra_args, None)
    }

    /// A server (or, with `sentinel_conf`, a Sentinel) in `dir`.
    fn start_in(dir: PathBuf, extra_args: &[&str], sentinel_conf: Option<PathBuf>) -> RedisServer {
        let extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        RedisServer::start_in_with(dir, || extra.clone(), sentinel_conf)
    }

    /// [`start_in`](Self::start_in) with the extra arguments made afresh
    /// at each attempt (a cluster node's bus port is a free port too, and
    /// may be taken by the time the node starts).
    fn start_in_with(
        dir: PathBuf,
        extra_args: impl Fn() -> Vec<String>,
        sentinel_conf: Option<PathBuf>,
    ) -> RedisServer {
        let log = dir.join("redis.log");
        let mut server = RedisServer {
            port: 0,
            dir,
            log,
            extra_args: Vec::new(),
            sentinel_conf,
            child: Mutex::new(None),
        };
        let mut last_error = String::new();
        for _ in 0..10 {
            server.port = free_port();
            server.extra_args = extra_args();
            match server.launch() {
                Ok(()) => return server,
                Err(Launch::PortTaken(e)) => last_error = e,
                // Dropping `server` removes its directory.
                Err(Launch::Failed(e)) => panic!("{e}"),
            }
        }
        panic!("redis-server found no free port after 10 attempts: {last_error}");
    }

    /// The server's TCP port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary directory (its `--dir`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the server's log, and of its stdout and
    /// stderr (`redis.out`, where redis-server reports bad arguments before
    /// it opens the log).
    pub fn log_tail(&self, lines: usize) -> String {
        let out = log_tail(&self.dir.join("redis.out"), lines);
        let log = log_tail(&self.log, lines);
        if out.is_empty() {
            log
        } else {
            format!("{log}\n--- stdout/stderr ---\n{out}")
        }
    }

    /// The server's process id, or `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    /// Whether the server process is running (it may be frozen).
    pub fn is_running(&self) -> bool {
        match lock(&self.child).as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server (`SIGKILL`, no clean shutdown) and waits for it to
    /// exit. Every connection to it is closed. Does nothing if it is stopped.
    pub fn stop(&self) {
        if let Some(mut child) = lock(&self.child).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts a new one on the same port (and with the
    /// same directory and arguments), then waits until it answers `PING`.
    /// With persistence off, the new server starts empty: every key, script
    /// and client is gone.
    ///
    /// Retries for about 5 s if the port is briefly unavailable; panics with
    /// the log tail if the server does not come back.
    pub fn restart(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(Launch::PortTaken(_)) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(Launch::PortTaken(e) | Launch::Failed(e)) => {
                    panic!("redis-server did not restart on port {}: {e}", self.port)
                }
            }
        }
    }

    /// Freezes the server process with `SIGSTOP`: connections stay open but
    /// nothing is answered until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        let pid = self.pid().expect("freeze: the redis server is stopped");
        signal(pid, "STOP");
    }

    /// Resumes a server frozen by [`freeze`](Self::freeze) (`SIGCONT`).
    pub fn thaw(&self) {
        let pid = self.pid().expect("thaw: the redis server is stopped");
        signal(pid, "CONT");
    }

    /// `CLIENT PAUSE <ms> ALL`: the server holds every client's commands
    /// for `dur`. Returns at once.
    pub fn pause(&self, dur: Duration) {
        let reply: String = self.cmd(&["CLIENT", "PAUSE", &dur.as_millis().to_string(), "ALL"]);
        assert_eq!(reply, "OK", "CLIENT PAUSE");
    }

    /// Creates the ACL user `user` afresh and returns a URL that logs in
    /// as it: `ACL SETUSER <user> reset on ><password>`, then `rules`
    /// (such as `["~*", "&*", "+@all", "-evalsha"]`).
    pub fn acl_user(&self, user: &str, password: &str, rules: &[&str]) -> String {
        let pass = format!(">{password}");
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", pass.as_str()];
        args.extend_from_slice(rules);
        let reply: String = self.cmd(&args);
        assert_eq!(reply, "OK", "ACL SETUSER {user}");
        self.url_as(user, password)
    }

    /// The server's URL with a user name and password in it.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// Script calls this server has run so far: `EVALSHA` and `EVAL`, less
    /// those that failed (an `EVALSHA` answered `NOSCRIPT` is retried as an
    /// `EVAL`).
    pub fn script_calls(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let field = |line: &str, name: &str| -> u64 {
            line.split(&format!("{name}="))
                .nth(1)
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .map(|l| field(l, "calls") - field(l, "failed_calls"))
            .sum()
    }

    /// A new connection to the server (the `redis` crate's synchronous
    /// one), with `timeout` for connecting and for every read and write.
    pub fn connection(&self, timeout: Duration) -> RedisResult<redis::Connection> {
        connect(&self.url(), timeout)
    }

    /// Sends one command over a fresh connection and converts the reply,
    /// e.g. `cmd::<String>(&["PING"])` is `"PONG"`, `cmd::<i64>(&["DBSIZE"])`,
    /// `cmd::<Option<String>>(&["GET", "k"])` is `None` for a missing key.
    ///
    /// Panics (with the log tail) if the server cannot be reached, does not
    /// reply within [`CMD_TIMEOUT`], answers with an error, or the reply
    /// does not convert to `T`; see [`try_cmd`](Self::try_cmd).
    pub fn cmd<T: FromRedisValue>(&self, args: &[&str]) -> T {
        self.cmd_timeout(args, CMD_TIMEOUT)
    }

    /// [`cmd`](Self::cmd) on a Cluster replica: `READONLY` first, so that
    /// it answers a read of its primary's slots instead of `MOVED`.
    pub fn replica_cmd<T: FromRedisValue>(&self, args: &[&str]) -> T {
        let read = || -> RedisResult<T> {
            let mut conn = self.connection(CMD_TIMEOUT)?;
            redis::cmd("READONLY").exec(&mut conn)?;
            let (name, rest) = args.split_first().expect("a command needs a name");
            let mut command = redis::cmd(name);
            for arg in rest {
                command.arg(*arg);
            }
            command.query(&mut conn)
        };
        read().unwrap_or_else(|e| panic!("{args:?} on replica {}: {e}", self.port))
    }

    /// [`cmd`](Self::cmd) with a read/write timeout of `timeout` (e.g. for
    /// `DEBUG SLEEP` longer than [`CMD_TIMEOUT`]).
    pub fn cmd_timeout<T: FromRedisValue>(&self, args: &[&str], timeout: Duration) -> T {
        self.try_cmd_timeout(args, timeout).unwrap_or_else(|e| {
            panic!(
                "redis command {args:?} on port {} failed: {e}\n--- log tail ---\n{}",
                self.port,
                self.log_tail(20)
            )
        })
    }

    /// [`cmd`](Self::cmd), returning connection errors, timeouts and error
    /// replies (e.g. to check that a stopped or frozen server does not
    /// answer).
    pub fn try_cmd<T: FromRedisValue>(&self, args: &[&str]) -> RedisResult<T> {
        self.try_cmd_timeout(args, CMD_TIMEOUT)
    }

    /// [`try_cmd`](Self::try_cmd) with a timeout of `timeout` for
    /// connecting, writing and reading.
    pub fn try_cmd_timeout<T: FromRedisValue>(
        &self,
        args: &[&str],
        timeout: Duration,
    ) -> RedisResult<T> {
        query(&self.url(), args, timeout)
    }

    fn launch(&self) -> Result<(), Launch> {
        let bin = server_binary();
        let out_path = self.dir.join("redis.out");
        let log_start = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let out_start = fs::metadata(&out_path).map(|m| m.len()).unwrap_or(0);
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out_path)
            .map_err(|e| Launch::Failed(format!("could not create redis.out: {e}")))?;
        let err = out
            .try_clone()
            .map_err(|e| Launch::Failed(format!("could not clone redis.out: {e}")))?;
        let mut command = Command::new(&bin);
        if let Some(conf) = &self.sentinel_conf {
            command.arg(conf).arg("--sentinel");
        }
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--daemonize", "no"]);
        if self.sentinel_conf.is_none() {
            command
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--enable-debug-command", "yes"]);
        }
        command
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&self.log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = command.spawn().map_err(|e| {
            Launch::Failed(format!(
                "could not run {bin:?} (is redis-server on PATH? set {REDIS_SERVER_ENV} to override): {e}"
            ))
        })?;
        let pid = child.id();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                // Only this attempt's output: the files grow across restarts.
                let port_taken =
                    [(&self.log, log_start), (&out_path, out_start)]
                        .iter()
                        .any(|(path, start)| {
                            let bytes = fs::read(path).unwrap_or_default();
                            let new = bytes.get(*start as usize..).unwrap_or(&[]);
                            String::from_utf8_lossy(new).contains("Address already in use")
                        });
                let message = format!(
                    "redis-server exited during startup ({status}) on port {}\n--- log tail ---\n{}",
                    self.port,
                    self.log_tail(20)
                );
                return Err(if port_taken {
                    Launch::PortTaken(message)
                } else {
                    Launch::Failed(message)
                });
            }
            // Check that the PONG comes from our child, not from some other
            // server that holds the port.
            let probe = Duration::from_millis(500);
            if let Ok(info) = query::<String>(&self.url(), &["INFO", "server"], probe) {
                if info.contains(&format!("process_id:{pid}\r\n")) {
                    let ping = query::<String>(&self.url(), &["PING"], probe);
                    if matches!(&ping, Ok(p) if p == "PONG") {
                        *lock(&self.child) = Some(child);
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Launch::Failed(format!(
                    "redis-server (pid {pid}) on port {} did not answer PING within {STARTUP_TIMEOUT:?}\n--- log tail ---\n{}",
                    self.port,
                    self.log_tail(20)
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

enum Launch {
    /// The port was in use (worth retrying).
    PortTaken(String),
    Failed(String),
}

/// A port that was free a moment ago: bind `127.0.0.1:0` and drop the
/// listener.
pub fn free_port() -> u16 {
    for _ in 0..10 {
        if let Ok(listener) = TcpListener::bind((LOCALHOST, 0)) {
            if let Ok(addr) = listener.local_addr() {
                return addr.port();
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("could not bind 127.0.0.1:0 to find a free port");
}

/// A fresh, empty directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-{tag}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("could not create {}: {e}", dir.display()));
    dir
}

/// The last `lines` lines of a file, or a note that it could not be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

// ---------------------------------------------------------------------------
// RedisCluster
// ---------------------------------------------------------------------------

/// Overrides the `redis-cli` binary that creates clusters (default:
/// `redis-cli` from `PATH`).
pub const REDIS_CLI_ENV: &str = "WATERTIGHT_REDIS_CLI";

/// How long a new cluster may take to reach `cluster_state:ok`, and a
/// Sentinel to see the primary and its replica.
pub const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// A Redis Cluster, each node a [`RedisServer`] on a free loopback port
/// (its cluster bus on another free port), the slots spread evenly over the
/// primaries by `redis-cli --cluster create`: primaries only
/// ([`start_or_skip`](Self::start_or_skip)), or with replicas
/// ([`start_with_or_skip`](Self::start_with_or_skip)). Dropping it kills
/// every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `primaries` nodes, joins them into a cluster and waits until
    /// every node reports `cluster_state:ok`; `None` where no
    /// `redis-server` can be run (as [`RedisServer::start_or_skip`]).
    ///
    /// Panics if `redis-cli` cannot be run or the cluster does not form
    /// within [`FORM_TIMEOUT`].
    pub fn start_or_skip(primaries: usize) -> Option<RedisCluster> {
        RedisCluster::start_with_or_skip(primaries, 0, &[])
    }

    /// A cluster of `primaries` primaries with `replicas` replicas each
    /// (`redis-cli --cluster create --cluster-replicas`), every node
    /// started with `extra_args` as well (such as
    /// `&["--cluster-node-timeout", "1000"]`, which overrides the default
    /// 2000 ms); waits until the cluster is `ok` on every node and every
    /// replica's link to its primary is up. All nodes are started in
    /// parallel. `None` where no `redis-server` can be run.
    pub fn start_with_or_skip(
        primaries: usize,
        replicas: usize,
        extra_args: &[&str],
    ) -> Option<RedisCluster> {
        if !server_available() {
            return None;
        }
        let extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let starts: Vec<_> = (0..primaries * (1 + replicas))
            .map(|_| {
                let extra = extra.clone();
                thread::spawn(move || {
                    let args = || {
                        let mut args: Vec<String> = [
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-port",
                            &free_port().to_string(),
                            "--cluster-node-timeout",
                            "2000",
                        ]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                        args.extend(extra.iter().cloned());
                        args
                    };
                    RedisServer::start_in_with(temp_dir("redis"), args, None)
                })
            })
            .collect();
        let nodes: Vec<RedisServer> = starts
            .into_iter()
            .map(|t| t.join().expect("a cluster node failed to start"))
            .collect();
        let cli = std::env::var_os(REDIS_CLI_ENV).unwrap_or_else(|| OsString::from("redis-cli"));
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("could not run {cli:?} (set {REDIS_CLI_ENV} to override): {e}")
            });
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        let formed = eventually(FORM_TIMEOUT, || {
            cluster.nodes.iter().all(|n| {
                n.try_cmd::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            }) && cluster
                .nodes
                .iter()
                .all(|n| cluster.shards_seen_by(n) == primaries)
                && cluster.nodes.iter().all(|n| {
                    n.try_cmd::<String>(&["INFO", "replication"])
                        .is_ok_and(|i| {
                            i.contains("role:master") || i.contains("master_link_status:up")
                        })
                })
        });
        assert!(formed, "the cluster did not form within {FORM_TIMEOUT:?}");
        Some(cluster)
    }

    /// How many nodes owning slots `node` knows of.
    fn shards_seen_by(&self, node: &RedisServer) -> usize {
        node.try_cmd::<String>(&["CLUSTER", "NODES"])
            .map(|nodes| {
                nodes
                    .lines()
                    .filter(|l| l.split(' ').nth(8).is_some())
                    .count()
            })
            .unwrap_or(0)
    }

    /// The nodes, in the order they were started (and given slots).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Every node's URL, with `suffix` appended (e.g. `"?protocol=3"`).
    pub fn urls(&self, suffix: &str) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("{}{suffix}", n.url()))
            .collect()
    }

    /// The hash slot of `key`, as the cluster computes it.
    pub fn slot(&self, key: &str) -> u16 {
        let slot: i64 = self.live()[0].cmd(&["CLUSTER", "KEYSLOT", key]);
        u16::try_from(slot).expect("a slot fits u16")
    }

    /// The node that owns `key`'s slot, by the first live node's `CLUSTER
    /// NODES`.
    pub fn owner(&self, key: &str) -> &RedisServer {
        let slot = self.slot(key);
        let table: String = self.live()[0].cmd(&["CLUSTER", "NODES"]);
        for line in table.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let port = fields
                .get(1)
                .and_then(|addr| addr.split('@').next())
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok());
            let owns = fields.iter().skip(8).any(|range| {
                let mut ends = range.splitn(2, '-');
                let lo = ends.next().and_then(|n| n.parse::<u16>().ok());
                let hi = ends.next().and_then(|n| n.parse::<u16>().ok()).or(lo);
                matches!((lo, hi), (Some(lo), Some(hi)) if (lo..=hi).contains(&slot))
            });
            if owns {
                if let Some(node) = self.nodes.iter().find(|n| Some(n.port()) == port) {
                    return node;
                }
            }
        }
        panic!("no node owns slot {slot} of {key:?}:\n{table}");
    }

    /// The nodes that run (not stopped by a test).
    pub fn live(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|n| n.is_running()).collect()
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node of the cluster is on port {port}"))
    }

    /// The replicas of the primary on `port`, by that primary's
    /// `INFO replication` (`slaveN:ip=…,port=…`).
    pub fn replicas_of(&self, port: u16) -> Vec<&RedisServer> {
        let info: String = self.node(port).cmd(&["INFO", "replication"]);
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("port="))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix("port="))
                    .and_then(|p| p.trim().parse::<u16>().ok())
            })
            .map(|p| self.node(p))
            .collect()
    }

    /// Waits until every live node names the node on `port` as the owner
    /// of `key`'s slot (after a failover); returns whether they did within
    /// `timeout`.
    pub fn wait_owner(&self, key: &str, port: u16, timeout: Duration) -> bool {
        let slot = self.slot(key);
        eventually(timeout, || {
            self.nodes
                .iter()
                .filter(|n| n.is_running())
                .all(|n| slot_owner_port(n, slot) == Some(port))
        })
    }
}

/// The port of the primary that `node`'s `CLUSTER NODES` says owns `slot`
/// (a node marked `fail` owns nothing).
fn slot_owner_port(node: &RedisServer, slot: u16) -> Option<u16> {
    let table: String = node.try_cmd(&["CLUSTER", "NODES"]).ok()?;
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let flags = fields.get(2)?;
        if !flags.contains("master") || flags.contains("fail") {
            return None;
        }
        let owns = fields.iter().skip(8).any(|range| {
            let mut ends = range.splitn(2, '-');
            let lo = ends.next().and_then(|n| n.parse::<u16>().ok());
            let hi = ends.next().and_then(|n| n.parse::<u16>().ok()).or(lo);
            matches!((lo, hi), (Some(lo), Some(hi)) if (lo..=hi).contains(&slot))
        });
        if !owns {
            return None;
        }
        fields
            .get(1)
            .and_then(|addr| addr.split('@').next())
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
    })
}

// ---------------------------------------------------------------------------
// SentinelSet
// ---------------------------------------------------------------------------

/// The service name a [`SentinelSet`]'s Sentinel monitors.
pub const SERVICE: &str = "mymaster";

/// A primary, one replica of it and one Sentinel (quorum 1) on loopback,
/// the Sentinel declaring the primary down after 500 ms without an answer
/// ([`start_or_skip`](Self::start_or_skip)); or several Sentinels with a
/// quorum ([`start_with_or_skip`](Self::start_with_or_skip)). Dropping it
/// kills them all.
#[derive(Debug)]
pub struct SentinelSet {
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl SentinelSet {
    /// Starts the three and waits until the Sentinel knows the primary and
    /// sees its replica connected; `None` where no `redis-server` can be
    /// run. Panics if they do not come together within [`FORM_TIMEOUT`].
    pub fn start_or_skip() -> Option<SentinelSet> {
        SentinelSet::start_with_or_skip(1, 1, 500)
    }

    /// A primary, a replica and `sentinels` Sentinels (started in
    /// parallel) with `quorum`, each declaring the primary down after
    /// `down_after_ms`; waits until every Sentinel sees the replica
    /// connected and knows every other Sentinel (they find each other
    /// through the primary's `__sentinel__:hello` channel, every 2 s), so
    /// that a failover can be agreed on at once.
    pub fn start_with_or_skip(
        sentinels: usize,
        quorum: usize,
        down_after_ms: u64,
    ) -> Option<SentinelSet> {
        if !server_available() {
            return None;
        }
        let primary = RedisServer::start_with(&[]);
        let port = primary.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        // Linked before the Sentinels start, so that their first look at
        // the primary (`INFO`, then every 10 s) finds the replica.
        let linked = eventually(FORM_TIMEOUT, || {
            replica
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
        });
        assert!(
            linked,
            "the replica did not link to its primary within {FORM_TIMEOUT:?}"
        );
        // With several Sentinels a split vote makes them try again after
        // twice this: 4 s, not 10 s.
        let failover_timeout = if sentinels > 1 { 2000 } else { 5000 };
        let starts: Vec<_> = (0..sentinels)
            .map(|_| {
                let port = port.clone();
                thread::spawn(move || {
                    let dir = temp_dir("sentinel");
                    let conf = dir.join("sentinel.conf");
                    fs::write(
                        &conf,
                        format!(
                            "sentinel monitor {SERVICE} 127.0.0.1 {port} {quorum}\n\
                             sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n\
                             sentinel failover-timeout {SERVICE} {failover_timeout}\n\
                             sentinel parallel-syncs {SERVICE} 1\n"
                        ),
                    )
                    .unwrap_or_else(|e| panic!("could not write {}: {e}", conf.display()));
                    RedisServer::start_in(dir, &[], Some(conf))
                })
            })
            .collect();
        let sentinels: Vec<RedisServer> = starts
            .into_iter()
            .map(|t| t.join().expect("a sentinel failed to start"))
            .collect();
        let set = SentinelSet {
            servers: vec![primary, replica],
            sentinels,
        };
        let others = set.sentinels.len() - 1;
        let ready = eventually(FORM_TIMEOUT, || {
            let linked = set.servers[1]
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"));
            linked
                && set.sentinels.iter().all(|sentinel| {
                    let seen = sentinel
                        .try_cmd::<Vec<std::collections::HashMap<String, String>>>(&[
                            "SENTINEL", "REPLICAS", SERVICE,
                        ])
                        .is_ok_and(|replicas| {
                            replicas.iter().any(|r| {
                                r.get("flags").is_some_and(|f| f == "slave")
                                    && r.get("master-link-status").is_some_and(|s| s == "ok")
                            })
                        });
                    let peers = sentinel
                        .try_cmd::<Vec<redis::Value>>(&["SENTINEL", "SENTINELS", SERVICE])
                        .is_ok_and(|peers| peers.len() == others);
                    seen && peers
                })
        });
        assert!(
            ready,
            "the sentinels did not see the primary, its replica and each other within {FORM_TIMEOUT:?}\n--- sentinel log ---\n{}",
            set.sentinels[0].log_tail(20)
        );
        Some(set)
    }

    /// Every Sentinel.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The (first) Sentinel's URL.
    pub fn sentinel_url(&self) -> String {
        self.sentinels[0].url()
    }

    /// The (first) Sentinel itself.
    pub fn sentinel(&self) -> &RedisServer {
        &self.sentinels[0]
    }

    /// The port of the primary the Sentinel names now.
    pub fn primary_port(&self) -> u16 {
        let addr: Vec<String> =
            self.sentinels[0].cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
        addr.get(1)
            .and_then(|p| p.parse().ok())
            .expect("the sentinel names a primary")
    }

    /// The server the Sentinel names as primary now.
    pub fn primary(&self) -> &RedisServer {
        let port = self.primary_port();
        self.server(port)
    }

    /// The data server on `port` (the primary or the replica).
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server of the set is on port {port}"))
    }

    /// Both data servers, the first primary first.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Waits until the Sentinel names a primary other than the one on
    /// `old_port` and that server answers `ROLE` as a primary; returns its
    /// port, or `None` after `timeout`.
    pub fn wait_new_primary(&self, old_port: u16, timeout: Duration) -> Option<u16> {
        let mut found = None;
        eventually(timeout, || {
            let addr: RedisResult<Vec<String>> =
                self.sentinels[0].try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
            let Some(port) = addr
                .ok()
                .and_then(|a| a.get(1).and_then(|p| p.parse::<u16>().ok()))
            else {
                return false;
            };
            if port == old_port {
                return false;
            }
            let role: RedisResult<redis::Value> = self.server(port).try_cmd(&["ROLE"]);
            let is_primary = matches!(&role, Ok(redis::Value::Array(v))
                if matches!(v.first(), Some(redis::Value::BulkString(b)) if b == b"master"));
            if is_primary {
                found = Some(port);
            }
            is_primary
        });
        found
    }
}

// ---------------------------------------------------------------------------
// Commands, and whether there is a server to run
// ---------------------------------------------------------------------------

/// A connection to `url` with `timeout` for connecting (the handshake
/// included) and for every later read and write.
fn connect(url: &str, timeout: Duration) -> RedisResult<redis::Connection> {
    let connection = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    Ok(connection)
}

/// Sends `args` (the command and its arguments) over a fresh connection to
/// `url` and converts the reply; an error reply is an `Err`.
pub fn query<T: FromRedisValue>(url: &str, args: &[&str], timeout: Duration) -> RedisResult<T> {
    let (name, rest) = args.split_first().expect("a command needs a name");
    let mut command = redis::cmd(name);
    for arg in rest {
        command.arg(*arg);
    }
    command.query(&mut connect(url, timeout)?)
}

/// The `redis-server` binary to run: [`REDIS_SERVER_ENV`], or
/// `redis-server` from `PATH`.
fn server_binary() -> OsString {
    std::env::var_os(REDIS_SERVER_ENV).unwrap_or_else(|| OsString::from("redis-server"))
}

/// Why no `redis-server` can be run here, or `None` if one can. Tried once
/// per test binary (`redis-server --version`).
fn server_missing() -> Option<&'static str> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    MISSING
        .get_or_init(|| {
            let bin = server_binary();
            let tried = Command::new(&bin)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            // Only a binary that cannot be run at all is "missing"; one that
            // runs but fails is a real failure, reported by `start`.
            tried.err().map(|e| format!("cannot run {bin:?}: {e}"))
        })
        .as_deref()
}

/// Whether [`REQUIRE_REDIS_ENV`] asks for the Redis tests to run.
fn redis_required() -> bool {
    std::env::var_os(REQUIRE_REDIS_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether a `redis-server` can be run for a test. If not, the first call
/// in this test binary prints one line to stderr saying that the tests that
/// need a server are skipped and how to install one, and every call returns
/// `false`; the tests return early, so they pass without checking anything.
///
/// Panics instead if [`REQUIRE_REDIS_ENV`] is set.
pub fn server_available() -> bool {
    let Some(why) = server_missing() else {
        return true;
    };
    assert!(
        !redis_required(),
        "{REQUIRE_REDIS_ENV} is set but no Redis server can be run ({why}): install one \
         (`apt-get install redis-server`) or set {REDIS_SERVER_ENV} to the redis-server binary"
    );
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        let binary = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "this test binary".into());
        // Straight to the process's stderr: libtest captures `eprintln!`
        // in a passing test, and this line is for whoever ran the suite.
        let _ = writeln!(
            io::stderr(),
            "SKIPPED: the Redis tests in {binary} need redis-server ({why}); install it \
             (`apt-get install redis-server`) or set {REDIS_SERVER_ENV} to its path, and set \
             {REQUIRE_REDIS_ENV}=1 to fail instead of skipping"
        );
    });
    false
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Sends a signal with the `kill` command: `signal(pid, "STOP")` (or
/// `"-STOP"`, `"CONT"`, `"KILL"`, `"TERM"`, ...). Panics if `kill` fails
/// (e.g. the process no longer exists); see [`try_signal`].
pub fn signal(pid: u32, sig: &str) {
    let sig = sig.trim_start_matches('-');
    let output = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("could not run `kill`: {e}"));
    assert!(
        output.status.success(),
        "kill -{sig} {pid} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// Like [`signal`], but returns whether `kill` succeeded instead of
/// panicking.
pub fn try_signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{}", sig.trim_start_matches('-')))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process is a child spawned by [`spawn_child`]. Child test
/// functions start with `if !is_child() { return; }`, so they are no-ops in
/// the normal run.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Re-executes the current test binary to run the single test `test_name`
/// (its full path inside the test crate, e.g. `"child_holds"` or
/// `"module::child_holds"`) with `--exact --nocapture --test-threads=1`,
/// `WATERTIGHT_CHILD=1` and `env`.
///
/// stdout is piped (wrap it in [`ChildLines`]), stdin is null and stderr is
/// inherited. The child's `println!` lines arrive in order, but libtest's own
/// output is mixed in: `""`, `"running 1 test"`, and the child's first line
/// is prefixed with `"test NAME ... "`. Use [`ChildLines::expect`], which
/// matches a marker anywhere in a line.
pub fn spawn_child(test_name: &str, env: &[(&str, String)]) -> Child {
    child_command(test_name, env)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("could not re-execute the test binary for {test_name}: {e}"))
}

fn child_command(test_name: &str, env: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = Command::new(exe);
    command
        .arg(test_name)
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// The lines of a child's stdout, read by a background thread so that a
/// read can time out instead of blocking forever.
#[derive(Debug)]
pub struct ChildLines {
    rx: Receiver<String>,
    /// Every line received so far, for failure messages.
    seen: Vec<String>,
}

impl ChildLines {
    /// Starts a thread that reads `stdout` line by line (until EOF or an
    /// error).
    pub fn new(stdout: impl Read + Send + 'static) -> ChildLines {
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("child-stdout".into())
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let text = String::from_utf8_lossy(&line);
                            let text = text.trim_end_matches(['\n', '\r']).to_owned();
                            if tx.send(text).is_err() {
                                break;
                            }
                        }
                    }
                }
            })
            .expect("spawn the child-stdout reader");
        ChildLines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Takes the piped stdout of `child`.
    pub fn of(child: &mut Child) -> ChildLines {
        ChildLines::new(
            child
                .stdout
                .take()
                .expect("the child's stdout is not piped (or was taken)"),
        )
    }

    /// The next line (without its newline), or `None` if none arrives within
    /// `timeout` or the child closed its stdout.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        match self.rx.recv_timeout(timeout) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Skips lines until one contains `marker` and returns that line from
    /// `marker` on (so a libtest prefix is cut off). `None` if no such line
    /// arrives within `timeout` (in total) or stdout closes first.
    ///
    /// Panics if libtest reports `running 0 tests` (the test name given to
    /// [`spawn_child`] does not exist).
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.next_line(left)?;
            if let Some(at) = line.find(marker) {
                return Some(line[at..].to_owned());
            }
            assert!(
                line.trim() != "running 0 tests",
                "the child test binary ran no test: is the test name exact?"
            );
        }
    }

    /// [`wait_for`](Self::wait_for), panicking with every line seen so far
    /// if the marker does not arrive in time.
    pub fn expect(&mut self, marker: &str, timeout: Duration) -> String {
        self.wait_for(marker, timeout).unwrap_or_else(|| {
            panic!(
                "no line containing {marker:?} from the child within {timeout:?}; its output so far:\n{}",
                self.seen.join("\n")
            )
        })
    }

    /// Every line received so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }
}

/// The next line from `lines` within `timeout`, or `None`. Never blocks
/// longer than `timeout`: the reading happens on [`ChildLines`]'s thread.
pub fn read_line_timeout(lines: &mut ChildLines, timeout: Duration) -> Option<String> {
    lines.next_line(timeout)
}

/// A child test process (see [`spawn_child`]) with its stdout lines. Dropping
/// it kills the child (`SIGKILL`, which also ends a stopped one) and reaps it.
#[derive(Debug)]
pub struct ChildTest {
    name: String,
    child: Child,
    lines: ChildLines,
}

impl ChildTest {
    /// Spawns `test_name` as a child (see [`spawn_child`]).
    pub fn spawn(test_name: &str, env: &[(&str, String)]) -> ChildTest {
        let mut child = spawn_child(test_name, env);
        let lines = ChildLines::of(&mut child);
        ChildTest {
            name: test_name.to_owned(),
            child,
            lines,
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdout lines.
    pub fn lines(&mut self) -> &mut ChildLines {
        &mut self.lines
    }

    /// The next line within `timeout`, or `None`.
    pub fn read_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.next_line(timeout)
    }

    /// The first line containing `marker`, from `marker` on (see
    /// [`ChildLines::expect`]); panics if none arrives within `timeout`.
    pub fn expect_line(&mut self, marker: &str, timeout: Duration) -> String {
        let name = self.name.clone();
        self.lines.wait_for(marker, timeout).unwrap_or_else(|| {
            panic!(
                "child {name}: no line containing {marker:?} within {timeout:?}; its output so far:\n{}",
                self.lines.seen().join("\n")
            )
        })
    }

    /// Sends `sig` to the child (see [`signal`]).
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Freezes the child (`SIGSTOP`).
    pub fn stop(&self) {
        self.signal("STOP");
    }

    /// Resumes a frozen child (`SIGCONT`).
    pub fn cont(&self) {
        self.signal("CONT");
    }

    /// Kills the child (`SIGKILL`) and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait for the killed child")
    }

    /// The child's exit status if it exits within `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_timeout(&mut self.child, timeout)
    }

    /// Waits up to `timeout` for the child to exit and asserts that it
    /// succeeded (its test passed).
    pub fn assert_success(&mut self, timeout: Duration) {
        match self.wait_timeout(timeout) {
            Some(status) => assert!(
                status.success(),
                "child {} failed ({status}); its output:\n{}",
                self.name,
                self.lines.seen().join("\n")
            ),
            None => panic!(
                "child {} did not exit within {timeout:?}; its output so far:\n{}",
                self.name,
                self.lines.seen().join("\n")
            ),
        }
    }

    /// The underlying process.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `timeout` for `child` to exit (polling `try_wait`).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// For a `Child` spawned elsewhere with a piped stdout.
impl From<ChildStdout> for ChildLines {
    fn from(stdout: ChildStdout) -> ChildLines {
        ChildLines::new(stdout)
    }
}

// ---------------------------------------------------------------------------
// ConcurrencyProbe
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct ProbeCounts {
    current: usize,
    max: usize,
    total: usize,
}

#[derive(Debug, Default)]
struct ProbeShared {
    counts: Mutex<ProbeCounts>,
    changed: Condvar,
    shutdown: AtomicBool,
}

/// An independent count of concurrent holders, from any thread or process:
/// a line-protocol TCP server on `127.0.0.1:0`. A client sends `enter\n` when
/// it starts holding and `exit\n` when it stops (or closes the connection,
/// e.g. because its process was killed); each is acked with `ok\n`, so with
/// [`ProbeClient`] the counts are updated before `enter`/`exit` return.
///
/// One connection may enter several times; closing it exits every hold it
/// still has. A client that is only frozen (`SIGSTOP`) still counts.
#[derive(Debug)]
pub struct ConcurrencyProbe {
    addr: SocketAddr,
    shared: Arc<ProbeShared>,
}

impl ConcurrencyProbe {
    /// Starts the probe's server on a background thread.
    pub fn start() -> ConcurrencyProbe {
        let listener = TcpListener::bind((LOCALHOST, 0)).expect("bind the concurrency probe");
        let addr = listener.local_addr().expect("probe address");
        let shared = Arc::new(ProbeShared::default());
        let accept_shared = shared.clone();
        thread::Builder::new()
            .name("concurrency-probe".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shared.shutdown.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = accept_shared.clone();
                    let _ = thread::Builder::new()
                        .name("concurrency-probe-conn".into())
                        .spawn(move || probe_connection(stream, &shared));
                }
            })
            .expect("spawn the concurrency probe");
        ConcurrencyProbe { addr, shared }
    }

    /// The address clients connect to (pass `addr().to_string()` to a child
    /// process).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The most holders seen at once.
    pub fn max_seen(&self) -> usize {
        lock(&self.shared.counts).max
    }

    /// How many `enter`s there were in all.
    pub fn total_enters(&self) -> usize {
        lock(&self.shared.counts).total
    }

    /// How many holders there are now.
    pub fn current(&self) -> usize {
        lock(&self.shared.counts).current
    }

    /// Resets `max_seen` to the current count.
    pub fn reset_max(&self) {
        let mut counts = lock(&self.shared.counts);
        counts.max = counts.current;
    }

    /// Waits up to `timeout` until `current() == n` (e.g. after a holder
    /// process was killed, whose exit the probe sees asynchronously).
    /// Returns whether it got there.
    pub fn wait_current(&self, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |c| c.current == n)
    }

    /// Waits up to `timeout` until `total_enters() >= n`. Returns whether it
    /// got there.
    pub fn wait_total(&self, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |c| c.total >= n)
    }

    fn wait_until(&self, timeout: Duration, done: impl Fn(&ProbeCounts) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut counts = lock(&self.shared.counts);
        loop {
            if done(&counts) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            counts = self
                .shared
                .changed
                .wait_timeout(counts, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for ConcurrencyProbe {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

fn probe_connection(stream: TcpStream, shared: &ProbeShared) {
    let _ = stream.set_nodelay(true);
    let mut held = 0;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let reply: &[u8] = match line.trim() {
            "enter" => {
                held += 1;
                let mut counts = lock(&shared.counts);
                counts.current += 1;
                counts.total += 1;
                counts.max = counts.max.max(counts.current);
                shared.changed.notify_all();
                b"ok\n"
            }
            "exit" if held > 0 => {
                held -= 1;
                lock(&shared.counts).current -= 1;
                shared.changed.notify_all();
                b"ok\n"
            }
            _ => b"err\n",
        };
        if (&stream).write_all(reply).is_err() {
            break;
        }
    }
    if held > 0 {
        lock(&shared.counts).current -= held;
        shared.changed.notify_all();
    }
}

/// One holder registered with a [`ConcurrencyProbe`]. Blocking (a round trip
/// on loopback), so usable from threads, async tasks and child processes.
#[derive(Debug)]
pub struct ProbeClient {
    stream: Option<BufReader<TcpStream>>,
}

impl ProbeClient {
    /// Connects to the probe at `addr` (a `SocketAddr` or `"127.0.0.1:PORT"`)
    /// and enters; the probe has counted it when this returns.
    pub fn enter(addr: impl ToSocketAddrs) -> ProbeClient {
        let addr = addr
            .to_socket_addrs()
            .expect("probe address")
            .next()
            .expect("probe address resolves to nothing");
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to the concurrency probe at {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set_read_timeout");
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .expect("set_write_timeout");
        let _ = stream.set_nodelay(true);
        let mut stream = BufReader::new(stream);
        probe_round_trip(&mut stream, "enter").unwrap_or_else(|e| panic!("probe enter: {e}"));
        ProbeClient {
            stream: Some(stream),
        }
    }

    /// Exits; the probe has counted it when this returns.
    pub fn exit(mut self) {
        if let Some(mut stream) = self.stream.take() {
            probe_round_trip(&mut stream, "exit").unwrap_or_else(|e| panic!("probe exit: {e}"));
        }
    }

    /// Closes the connection without `exit`, like a crashed holder. The
    /// probe counts the exit asynchronously (see
    /// [`ConcurrencyProbe::wait_current`]).
    pub fn abandon(mut self) {
        self.stream.take();
    }
}

impl Drop for ProbeClient {
    fn drop(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            // Never panic in drop (the test may be unwinding already).
            let _ = probe_round_trip(&mut stream, "exit");
        }
    }
}

fn probe_round_trip(stream: &mut BufReader<TcpStream>, request: &str) -> io::Result<()> {
    stream
        .get_mut()
        .write_all(format!("{request}\n").as_bytes())?;
    let mut reply = String::new();
    stream.read_line(&mut reply)?;
    if reply.trim() == "ok" {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "probe answered {reply:?} to {request:?}"
        )))
    }
}

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

/// Retries `check` every 10 ms until it returns true or `timeout` passes.
/// Returns whether it became true.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// How many subscriptions `server` holds on the channels of the semaphore
/// `name` with the default key prefix: the shared `…:wake` (unfair mode)
/// and each process's own `…:wake:<token>` (fair mode, one per process).
/// `sharded`: count shard channels (`SSUBSCRIBE`, on a Cluster).
pub fn wake_subscribers(server: &RedisServer, name: &str, sharded: bool) -> i64 {
    let (list, count) = match sharded {
        true => ("SHARDCHANNELS", "SHARDNUMSUB"),
        false => ("CHANNELS", "NUMSUB"),
    };
    let pattern = format!("bulkhead:{{{name}}}:wake*");
    let channels: Vec<String> = server.cmd(&["PUBSUB", list, &pattern]);
    channels
        .iter()
        .map(|channel| {
            let (_channel, n): (String, i64) = server.cmd(&["PUBSUB", count, channel]);
            n
        })
        .sum()
}
