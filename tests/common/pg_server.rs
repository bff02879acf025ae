//! The test harness for tests that need PostgreSQL: [`PgServer`], a
//! throwaway PostgreSQL server (`initdb` into a fresh temporary directory,
//! then `postgres` on a free loopback port) that can be stopped, killed,
//! restarted on the same data directory and port, frozen and thawed, and
//! sent SQL through `psql`.
//!
//! Where no PostgreSQL can be run, [`PgServer::start`] returns `None` and
//! the test binary says so once on stderr (one `SKIPPED:` line), unless
//! [`REQUIRE_POSTGRES_ENV`] is set (to anything but `0`): then it panics.
//!
//! Include it with `#[path = "common/pg_server.rs"] mod pg_server;`. It uses
//! only the standard library and the `kill`, `id` and (for cleanup after a
//! kill) `ipcrm` commands. Nothing here may hang a test: every wait is
//! bounded, and so is every `psql`.
//!
//! Run as root, `initdb` and `postgres` (which refuse to run as root) run as
//! the `postgres` user: the child drops to its uid/gid just before `exec`
//! (`CommandExt::uid`/`gid`, like `runuser` but without an intermediate
//! process, so [`PgServer::pid`] is the postmaster itself).

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// Set to anything but `0` to make a PostgreSQL that cannot be run fail
/// every test that needs one, instead of skipping it.
pub const REQUIRE_POSTGRES_ENV: &str = "WATERTIGHT_REQUIRE_POSTGRES";

/// Overrides the directory of the PostgreSQL binaries (`initdb`,
/// `postgres`, `psql`). Default: `/usr/lib/postgresql/15/bin`, else the
/// newest `/usr/lib/postgresql/*/bin`, else `PATH`.
pub const PG_BINDIR_ENV: &str = "WATERTIGHT_PG_BINDIR";

/// How long the server may take to accept connections after it was
/// started (or restarted, crash recovery included).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a fast shutdown ([`PgServer::stop`]) may take before the
/// server is killed.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one [`PgServer::psql`] may run before it is killed (and the
/// call panics).
pub const PSQL_TIMEOUT: Duration = Duration::from_secs(60);

/// The message the server logs once it accepts connections.
const READY_LINE: &str = "database system is ready to accept connections";

const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The `pg_hba.conf` the server runs with: `postgres` is trusted, every
/// other user needs its SCRAM password. The first matching line wins, so
/// the `postgres` lines come first. (initdb's own file trusts everyone on
/// 127.0.0.1, so it is replaced, not appended to.)
const PG_HBA: &str = "\
# Written by the watertight test harness (tests/common/pg_server.rs).
# TYPE  DATABASE  USER      ADDRESS        METHOD
local   all       postgres                 trust
local   all       all                      scram-sha-256
host    all       postgres  127.0.0.1/32   trust
host    all       all       127.0.0.1/32   scram-sha-256
host    all       postgres  ::1/128        trust
host    all       all       ::1/128        scram-sha-256
";

// ---------------------------------------------------------------------------
// PgServer
// ---------------------------------------------------------------------------

/// A PostgreSQL server on `127.0.0.1:<free port>`, in its own temporary
/// directory `dir()`, which holds the data directory `dir()/data`, the
/// server's log `dir()/server.log` (its stderr; `logging_collector=off`)
/// and its Unix socket. `fsync` and `full_page_writes` are off (the
/// operating system never crashes under a test), but every commit reaches
/// the WAL before it is answered, so a [`kill`](Self::kill) loses
/// nothing committed; `max_connections=200`.
///
/// Users: `postgres` (superuser, no password: [`url`](Self::url)) and
/// those made by [`user`](Self::user), which log in with their password
/// (`scram-sha-256`).
///
/// Dropping it ends the server (and every backend) and removes the
/// directory.
#[derive(Debug)]
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    /// `Some((uid, gid))` of the `postgres` user when the harness runs as
    /// root.
    run_as: Option<(u32, u32)>,
    /// The running postmaster, `None` after `stop`/`kill`.
    child: Option<Child>,
    /// The pid of the current or most recent postmaster.
    pid: u32,
}

impl PgServer {
    /// Runs `initdb` into a fresh temporary directory, starts `postgres` on
    /// a free loopback port and waits until it accepts connections.
    ///
    /// `None` if no PostgreSQL can be run here: the first such call in the
    /// process prints one `SKIPPED:` line naming `binary_label` to stderr,
    /// and the test returns at once, with
    /// `let Some(pg) = PgServer::start("pg_tests") else { return };`.
    ///
    /// Panics if no PostgreSQL can be run and [`REQUIRE_POSTGRES_ENV`] is
    /// set, if `initdb` fails, and (with the server's log) if the server
    /// does not accept connections within [`STARTUP_TIMEOUT`].
    pub fn start(binary_label: &str) -> Option<PgServer> {
        if !server_available(binary_label) {
            return None;
        }
        let bin = bindir();
        let run_as = run_as();
        let dir = temp_dir(run_as);
        let data = dir.join("data");
        let log = dir.join("server.log");
        let mut server = PgServer {
            port: 0,
            dir,
            data,
            log,
            bin,
            run_as,
            child: None,
            pid: 0,
        };
        // From here on, a panic drops `server`, which removes the directory.
        server.initdb();
        let mut last_error = String::new();
        for _ in 0..10 {
            server.port = free_port();
            match server.launch() {
                Ok(()) => return Some(server),
                Err(Launch::PortTaken(e)) => last_error = e,
                Err(Launch::Failed(e)) => panic!("{e}"),
            }
        }
        panic!("postgres found no free port after 10 attempts: {last_error}");
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (the superuser,
    /// trusted: no password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's TCP port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((LOCALHOST, self.port))
    }

    /// The pid of the postmaster: the running one, or after
    /// [`stop`](Self::stop)/[`kill`](Self::kill) the one that ran last.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the postmaster is running (it may be paused).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The temporary directory (holding `data/`, `server.log` and the
    /// socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`-D`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log file (its stderr, across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Runs `sql` with `psql` as `postgres` (`-X -A -t -v ON_ERROR_STOP=1`:
    /// unaligned, tuples only, `|` between columns, one row a line) and
    /// returns its trimmed stdout. Panics with psql's stderr if it fails,
    /// and if it runs longer than [`PSQL_TIMEOUT`] (e.g. on a paused
    /// server).
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql).unwrap_or_else(|e| {
            panic!(
                "psql on port {} failed: {e}\n--- sql ---\n{sql}\n--- server log tail ---\n{}",
                self.port,
                self.log_tail(20)
            )
        })
    }

    /// [`psql`](Self::psql), returning psql's stderr (or a timeout) as the
    /// error instead of panicking.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.try_psql_timeout(sql, PSQL_TIMEOUT)
    }

    /// [`try_psql`](Self::try_psql) with its own time limit (psql is killed
    /// when it runs out).
    pub fn try_psql_timeout(&self, sql: &str, timeout: Duration) -> Result<String, String> {
        let mut command = Command::new(psql_binary(&self.bin));
        command
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", "postgres", "-d", "postgres", "-c", sql]);
        clean_pg_env(&mut command);
        let connect_timeout = timeout.as_secs().clamp(2, 10);
        command
            .env("PGCONNECT_TIMEOUT", connect_timeout.to_string())
            .env("PGSSLMODE", "disable")
            .current_dir(&self.dir);
        let output =
            output_timeout(command, timeout).map_err(|e| format!("psql did not finish: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        } else {
            Err(format!(
                "psql exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Creates the login role `name` with `password` and no other rights
    /// (not a superuser; it may connect to `postgres`), or, if it exists,
    /// sets its password and `LOGIN` again. Returns its URL,
    /// `postgres://NAME:PASSWORD@127.0.0.1:PORT/postgres` (both
    /// percent-encoded).
    pub fn user(&self, name: &str, password: &str) -> String {
        let exists = self.psql(&format!(
            "SELECT 1 FROM pg_roles WHERE rolname = {}",
            quote_literal(name)
        ));
        let verb = if exists.is_empty() { "CREATE" } else { "ALTER" };
        self.psql(&format!(
            "SET password_encryption = 'scram-sha-256'; {verb} ROLE {} LOGIN PASSWORD {}",
            quote_ident(name),
            quote_literal(password)
        ));
        self.url_as(name, password)
    }

    /// The server's URL with a user name and password in it
    /// (percent-encoded).
    pub fn url_as(&self, name: &str, password: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/postgres",
            percent_encode(name),
            percent_encode(password),
            self.port
        )
    }

    /// Fast shutdown: `SIGINT` to the postmaster (which ends every session
    /// and writes a checkpoint), waiting up to [`SHUTDOWN_TIMEOUT`] for it
    /// to exit, then [`kill`](Self::kill). Does nothing if the server is not
    /// running. A paused server is resumed first (or it could not exit).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return; // It exited on its own (and is reaped now).
        }
        // A stopped postmaster or backend would never act on SIGINT.
        self.signal_tree(child.id(), "CONT");
        try_signal(&[child.id()], "INT");
        if wait_timeout(&mut child, SHUTDOWN_TIMEOUT).is_some() {
            return;
        }
        self.child = Some(child);
        self.kill();
    }

    /// Crashes the server: `SIGKILL` to the postmaster and every process it
    /// started (backends, checkpointer, ...), then waits until they are all
    /// gone. Open connections break; nothing is flushed, so recent
    /// asynchronous commits may be lost (see [`restart`](Self::restart)).
    /// The next [`restart`](Self::restart) runs crash recovery. The killed
    /// backends are orphans, reaped by init (they may show as zombies for
    /// a moment). Does nothing if the server is not running.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        // Freeze the postmaster first, so that it starts no new process
        // between the listing and the kill.
        try_signal(&[pid], "STOP");
        let children = children_of(pid);
        let mut all = children.clone();
        all.push(pid);
        try_signal(&all, "KILL");
        let _ = child.kill();
        let _ = child.wait();
        // Orphaned backends are reaped by init; they no longer run once they
        // are gone or zombies. A backend that still existed would keep the
        // shared memory attached and make the next start refuse to run.
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.iter().any(|&c| process_alive(c)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same data directory and port, after
    /// [`stop`](Self::stop) or [`kill`](Self::kill) (a running server is
    /// stopped first), and waits until it accepts connections; after a
    /// kill that includes crash recovery. Everything committed before a
    /// `stop` or a `kill` is kept.
    ///
    /// Retries for about 10 s if the port is briefly unavailable; panics
    /// with the log tail if the server does not come back.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(Launch::PortTaken(_)) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(Launch::PortTaken(e) | Launch::Failed(e)) => {
                    panic!("postgres did not restart on port {}: {e}", self.port)
                }
            }
        }
    }

    /// Freezes the server: `SIGSTOP` to the postmaster and then to every
    /// process it started. Connections stay open (and new ones are queued
    /// by the kernel) but nothing is answered until
    /// [`resume`](Self::resume). Panics if the server is not running.
    pub fn pause(&self) {
        let pid = self.running_pid("pause");
        // The postmaster first: stopped, it can start no new process.
        signal(&[pid], "STOP");
        let children = children_of(pid);
        if !children.is_empty() {
            try_signal(&children, "STOP");
        }
    }

    /// Resumes a server frozen by [`pause`](Self::pause): `SIGCONT` to
    /// every process it started and then to the postmaster.
    pub fn resume(&self) {
        let pid = self.running_pid("resume");
        self.signal_tree(pid, "CONT");
    }

    fn running_pid(&self, what: &str) -> u32 {
        match &self.child {
            Some(child) => child.id(),
            None => panic!(
                "{what}: the postgres server on port {} is stopped",
                self.port
            ),
        }
    }

    /// `sig` to the children of `pid`, then to `pid`.
    fn signal_tree(&self, pid: u32, sig: &str) {
        let mut all = children_of(pid);
        all.push(pid);
        try_signal(&all, sig);
    }

    /// `initdb` into `self.data`, then the harness's `pg_hba.conf` and
    /// `password_encryption`.
    fn initdb(&self) {
        let mut command = Command::new(self.bin.join("initdb"));
        command
            .arg("-D")
            .arg(&self.data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"]);
        clean_pg_env(&mut command);
        // Without TZ, initdb probes every zone file for the system's zone.
        command.env("TZ", "UTC");
        self.as_postgres(&mut command);
        let output = output_timeout(command, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("could not run initdb from {}: {e}", self.bin.display()));
        assert!(
            output.status.success(),
            "initdb -D {} failed ({}):\n{}{}",
            self.data.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // Rewriting existing files keeps their owner (postgres) and mode.
        let hba = self.data.join("pg_hba.conf");
        fs::write(&hba, PG_HBA)
            .unwrap_or_else(|e| panic!("could not write {}: {e}", hba.display()));
        let conf = self.data.join("postgresql.conf");
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .unwrap_or_else(|e| panic!("could not open {}: {e}", conf.display()));
        file.write_all(
            b"\n# Written by the watertight test harness.\n\
              password_encryption = 'scram-sha-256'\n",
        )
        .unwrap_or_else(|e| panic!("could not write {}: {e}", conf.display()));
    }

    /// Starts `postgres` on `self.port` and waits until it logs that it
    /// accepts connections and its port answers.
    fn launch(&mut self) -> Result<(), Launch> {
        let log_start = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| Launch::Failed(format!("could not open {}: {e}", self.log.display())))?;
        if let Some((uid, gid)) = self.run_as {
            let _ = std::os::unix::fs::chown(&self.log, Some(uid), Some(gid));
        }
        let err = out
            .try_clone()
            .map_err(|e| Launch::Failed(format!("could not clone the log's handle: {e}")))?;
        let mut command = Command::new(self.bin.join("postgres"));
        command
            .arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir);
        for setting in [
            "listen_addresses=127.0.0.1",
            "fsync=off",
            "full_page_writes=off",
            "max_connections=200",
            "shared_buffers=32MB",
            "logging_collector=off",
            "log_destination=stderr",
            // Dynamic shared memory as files in the data directory (removed
            // with it), not /dev/shm segments that a kill would leak.
            "dynamic_shared_memory_type=mmap",
        ] {
            command.arg("-c").arg(setting);
        }
        clean_pg_env(&mut command);
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        self.as_postgres(&mut command);
        let mut child = command.spawn().map_err(|e| {
            Launch::Failed(format!(
                "could not run {} (set {PG_BINDIR_ENV} to the directory of the PostgreSQL binaries): {e}",
                self.bin.join("postgres").display()
            ))
        })?;
        let pid = child.id();
        self.pid = pid;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let new_log = self.log_since(log_start);
                let message = format!(
                    "postgres (pid {pid}) exited during startup ({status}) on port {}\n--- {} ---\n{new_log}",
                    self.port,
                    self.log.display()
                );
                return Err(if new_log.contains("Address already in use") {
                    Launch::PortTaken(message)
                } else {
                    Launch::Failed(message)
                });
            }
            // This start's own ready line (the log grows across restarts),
            // then a TCP connection, which the postmaster accepts only when
            // it listens on our port.
            if self.log_since(log_start).contains(READY_LINE)
                && TcpStream::connect_timeout(&self.addr(), Duration::from_millis(500)).is_ok()
            {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut all = children_of(pid);
                all.push(pid);
                try_signal(&all, "KILL");
                let _ = child.wait();
                return Err(Launch::Failed(format!(
                    "postgres (pid {pid}) on port {} did not accept connections within {STARTUP_TIMEOUT:?}\n--- {} ---\n{}",
                    self.port,
                    self.log.display(),
                    self.log_since(log_start)
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The log from byte `start` on (lossy UTF-8).
    fn log_since(&self, start: u64) -> String {
        let bytes = fs::read(&self.log).unwrap_or_default();
        let new = bytes.get(start as usize..).unwrap_or(&[]);
        String::from_utf8_lossy(new).into_owned()
    }

    /// Runs `command` in the temporary directory, and as the `postgres`
    /// user if the harness runs as root.
    fn as_postgres(&self, command: &mut Command) {
        // As `postgres`, the test's working directory may be unreadable.
        command.current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            // std drops the supplementary groups too when root sets a uid.
            command.uid(uid).gid(gid);
        }
    }

    /// After the server was killed, its System V shared memory segment
    /// (the interlock, a few bytes; its id is line 7 of `postmaster.pid`)
    /// is left behind; a restart would remove it, a dropped server cannot.
    fn remove_leftover_shmem(&self) {
        let Ok(pidfile) = fs::read_to_string(self.data.join("postmaster.pid")) else {
            return; // A clean exit removes the file, and the segment.
        };
        let shmid = pidfile
            .lines()
            .nth(6)
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|id| id.parse::<u64>().ok());
        if let Some(shmid) = shmid {
            let _ = Command::new("ipcrm")
                .arg("-m")
                .arg(shmid.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown (SIGQUIT): the postmaster ends every
            // process and removes its shared memory, without a checkpoint.
            let pid = child.id();
            self.signal_tree(pid, "CONT");
            try_signal(&[pid], "QUIT");
            if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
                self.child = Some(child);
                self.kill();
            }
        }
        self.remove_leftover_shmem();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

enum Launch {
    /// The port was in use (worth retrying with another).
    PortTaken(String),
    Failed(String),
}

// ---------------------------------------------------------------------------
// Availability
// ---------------------------------------------------------------------------

/// The directory of the PostgreSQL binaries (see [`PG_BINDIR_ENV`]); empty
/// means "from `PATH`".
fn bindir() -> PathBuf {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os(PG_BINDIR_ENV) {
                return PathBuf::from(dir);
            }
            let preferred = PathBuf::from("/usr/lib/postgresql/15/bin");
            if preferred.join("postgres").is_file() {
                return preferred;
            }
            // The newest other Debian-style installation.
            let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
                    let bin = entry.path().join("bin");
                    bin.join("postgres").is_file().then_some((version, bin))
                })
                .collect();
            versions.sort();
            versions.pop().map(|(_, bin)| bin).unwrap_or_default()
        })
        .clone()
}

/// `psql` next to the server binaries, else from `PATH`.
fn psql_binary(bin: &Path) -> OsString {
    let beside = bin.join("psql");
    if beside.is_file() {
        beside.into_os_string()
    } else {
        OsString::from("psql")
    }
}

/// `Some((uid, gid))` of the `postgres` user if this process runs as root
/// (`id -u`); `None` otherwise. Panics if root and there is no such user
/// (checked by [`server_missing`] first).
fn run_as() -> Option<(u32, u32)> {
    postgres_ids().expect("root needs a `postgres` user to run PostgreSQL")
}

/// `Ok(None)`: not root; `Ok(Some(ids))`: root, run as `postgres`;
/// `Err(why)`: root and no usable `postgres` user.
fn postgres_ids() -> Result<Option<(u32, u32)>, String> {
    static IDS: OnceLock<Result<Option<(u32, u32)>, String>> = OnceLock::new();
    IDS.get_or_init(|| {
        let id = |args: &[&str]| -> Result<u32, String> {
            let output = Command::new("id")
                .args(args)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run `id`: {e}"))?;
            if !output.status.success() {
                return Err(format!("`id {}` failed", args.join(" ")));
            }
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("`id {}`: {e}", args.join(" ")))
        };
        if id(&["-u"])? != 0 {
            return Ok(None);
        }
        let uid = id(&["-u", "postgres"])
            .map_err(|e| format!("running as root, and no `postgres` user to run as ({e})"))?;
        let gid = id(&["-g", "postgres"])
            .map_err(|e| format!("running as root, and no `postgres` user to run as ({e})"))?;
        Ok(Some((uid, gid)))
    })
    .clone()
}

/// Why no PostgreSQL can be run here, or `None` if it can. Tried once per
/// test binary (`postgres --version`, `initdb --version`, and as root the
/// `postgres` user).
fn server_missing() -> Option<&'static str> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    MISSING
        .get_or_init(|| {
            let bin = bindir();
            for name in ["postgres", "initdb"] {
                let path = bin.join(name);
                let tried = Command::new(&path)
                    .arg("--version")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                // Only a binary that cannot be run at all is "missing"; one
                // that runs but fails is a real failure, reported by `start`.
                if let Err(e) = tried {
                    return Some(format!("cannot run {}: {e}", path.display()));
                }
            }
            postgres_ids().err()
        })
        .as_deref()
}

/// Whether [`REQUIRE_POSTGRES_ENV`] asks for the PostgreSQL tests to run.
fn postgres_required() -> bool {
    std::env::var_os(REQUIRE_POSTGRES_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether a PostgreSQL server can be run for a test. If not, the first
/// call in this process prints one `SKIPPED:` line to stderr (naming
/// `binary_label`) and every call returns `false`; the tests return early,
/// so they pass without checking anything.
///
/// Panics instead if [`REQUIRE_POSTGRES_ENV`] is set.
pub fn server_available(binary_label: &str) -> bool {
    let Some(why) = server_missing() else {
        return true;
    };
    assert!(
        !postgres_required(),
        "{REQUIRE_POSTGRES_ENV} is set but no PostgreSQL server can be run ({why}): install \
         one (`apt-get install postgresql`) or set {PG_BINDIR_ENV} to the directory of its binaries"
    );
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        // Straight to the process's stderr: libtest captures `eprintln!` in
        // a passing test, and this line is for whoever ran the suite.
        let _ = writeln!(
            io::stderr(),
            "SKIPPED: the PostgreSQL tests in {binary_label} need PostgreSQL ({why}); install it \
             (`apt-get install postgresql`) or set {PG_BINDIR_ENV} to its bin directory, and set \
             {REQUIRE_POSTGRES_ENV}=1 to fail instead of skipping"
        );
    });
    false
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Sends `sig` (`"STOP"`, `"CONT"`, `"KILL"`, ...) to `pids` with the
/// `kill` command; panics if it fails.
pub fn signal(pids: &[u32], sig: &str) {
    let output = kill_command(pids, sig)
        .output()
        .unwrap_or_else(|e| panic!("could not run `kill`: {e}"));
    assert!(
        output.status.success(),
        "kill -{sig} {pids:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// Like [`signal`], but returns whether `kill` succeeded (for every pid)
/// instead of panicking; a process that is already gone is no error here.
pub fn try_signal(pids: &[u32], sig: &str) -> bool {
    if pids.is_empty() {
        return true;
    }
    kill_command(pids, sig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn kill_command(pids: &[u32], sig: &str) -> Command {
    let mut command = Command::new("kill");
    command
        .arg(format!("-{}", sig.trim_start_matches('-')))
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null());
    command
}

/// The pids whose parent is `pid`, from `/proc/*/stat`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let (_state, ppid) = proc_stat(child)?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// `(state, ppid)` of `pid` from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((state, _)) if state != 'Z' && state != 'X')
}

/// Waits up to `timeout` for `child` to exit.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
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

/// Runs `command` with stdout and stderr captured; kills it (and returns an
/// error) if it runs longer than `timeout`.
fn output_timeout(mut command: Command, timeout: Duration) -> io::Result<Output> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    // `wait_with_output` reads both pipes, so a chatty child cannot block.
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output,
        Err(_) => {
            // The child is not reaped yet (the thread waits on it), so its
            // pid cannot have been reused.
            try_signal(&[pid], "KILL");
            let _ = rx.recv_timeout(Duration::from_secs(5));
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("killed after {timeout:?}"),
            ))
        }
    }
}

/// Removes the libpq/server variables that could point a command elsewhere
/// than the arguments say.
fn clean_pg_env(command: &mut Command) {
    for var in [
        "PGDATA",
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGUSER",
        "PGDATABASE",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICE",
        "PGSERVICEFILE",
        "PGOPTIONS",
        "PGSSLMODE",
        "PGTARGETSESSIONATTRS",
    ] {
        command.env_remove(var);
    }
}

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

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

/// A fresh directory (mode 0700; created, so never one that existed) under
/// the system temp dir, or under `/tmp` when running as root (where the
/// `postgres` user owns it: `TMPDIR` might not be reachable for it).
fn temp_dir(run_as: Option<(u32, u32)>) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let parent = match run_as {
        Some(_) => PathBuf::from("/tmp"),
        None => std::env::temp_dir(),
    };
    let mut last_error = None;
    for _ in 0..100 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!(
            "watertight-pg-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // `create`, not `create_all`: fails if it exists (mkdtemp semantics).
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                if let Some((uid, gid)) = run_as {
                    if let Err(e) = std::os::unix::fs::chown(&dir, Some(uid), Some(gid)) {
                        let _ = fs::remove_dir(&dir);
                        panic!(
                            "could not chown {} to the postgres user: {e}",
                            dir.display()
                        );
                    }
                }
                // A umask cannot have narrowed the mode further than 0700
                // for the owner, but make it exact.
                let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700));
                return dir;
            }
            Err(e) => last_error = Some(e),
        }
    }
    panic!(
        "could not create a temporary directory under {}: {last_error:?}",
        parent.display()
    );
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

/// `ident` as an SQL identifier: `"…"` with `"` doubled.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// `text` as an SQL string literal: `'…'` with `'` doubled
/// (`standard_conforming_strings` is on, so backslashes are plain).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters, for
/// the user and password of a URL.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
