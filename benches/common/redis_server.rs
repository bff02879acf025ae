//! The `redis-server` the Redis benches start for themselves: a child on a
//! free port of 127.0.0.1 with persistence off (`WATERTIGHT_REDIS_SERVER`
//! overrides the binary), killed when dropped, and the server's own count
//! of script calls. Included with `#[path]` by `benches/redis.rs` and
//! `benches/redis_procs.rs`.

#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long the server may take to answer `PING` after it was started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child on `127.0.0.1:<free port>`, persistence off, with
/// a temporary directory for its log. Dropping it kills the server.
pub struct Server {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Server {
    pub fn start() -> Server {
        let bin =
            std::env::var("WATERTIGHT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut last_error = String::new();
        for attempt in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!(
                "bulkhead-bench-redis-{}-{attempt}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("could not create {}: {e}", dir.display()));
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("could not run {bin:?} (set WATERTIGHT_REDIS_SERVER to override): {e}")
                });
            let mut server = Server { child, port, dir };
            match server.wait_ready() {
                Ok(()) => return server,
                // Most likely the port was taken in between: try another.
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// Waits until this child (not some other process on the port) answers.
    fn wait_ready(&mut self) -> Result<(), String> {
        let pid = self.child.id();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}: {}", self.log_tail()));
            }
            let ours = self
                .try_query::<String>(redis::cmd("INFO").arg("server"))
                .is_ok_and(|info| info.contains(&format!("process_id:{pid}\r\n")));
            if ours {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "no answer within {STARTUP_TIMEOUT:?}: {}",
            self.log_tail()
        ))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a valid redis URL")
    }

    /// One command over a fresh blocking connection.
    pub fn try_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut conn = self.client().get_connection()?;
        cmd.query(&mut conn)
    }

    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        self.try_query(cmd)
            .unwrap_or_else(|e| panic!("{cmd:?} on port {} failed: {e}", self.port))
    }

    pub fn reset_stats(&self) {
        let _: () = self.query(redis::cmd("CONFIG").arg("RESETSTAT"));
    }

    /// Script calls (`EVALSHA` and `EVAL`) since the last reset, and the
    /// microseconds the server spent in them.
    pub fn script_stats(&self) -> ScriptStats {
        ScriptStats::parse(&self.query::<String>(redis::cmd("INFO").arg("commandstats")))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("could not bind 127.0.0.1:0")
        .port()
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ScriptStats {
    pub calls: u64,
    pub usec: u64,
}

impl ScriptStats {
    /// The script calls (`EVALSHA` and `EVAL`) and their microseconds in
    /// the text of `INFO commandstats`.
    pub fn parse(info: &str) -> ScriptStats {
        let mut stats = ScriptStats::default();
        for line in info.lines() {
            let Some(rest) = line
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| line.strip_prefix("cmdstat_eval:"))
            else {
                continue;
            };
            for field in rest.split(',') {
                match field.split_once('=') {
                    Some(("calls", n)) => stats.calls += n.trim().parse::<u64>().unwrap_or(0),
                    Some(("usec", n)) => stats.usec += n.trim().parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
        stats
    }

    pub fn usec_per_call(self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.usec as f64 / self.calls as f64
        }
    }
}
