//! Tests of the Redis test harness in `tests/common/redis_server.rs`
//! itself: the server, commands, restarts, skipping without a server, the
//! concurrency probe and child processes.
// The harness talks to Redis through the `redis` crate, a dependency of the
// `redis` feature (which needs a runtime feature to build).
#![cfg(all(not(loom), feature = "redis", any(feature = "tokio", feature = "smol")))]

#[path = "common/redis_server.rs"]
mod redis_server;

use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use redis_server::{
    CHILD_ENV, ChildLines, ChildTest, ConcurrencyProbe, ProbeClient, REDIS_SERVER_ENV,
    REQUIRE_REDIS_ENV, RedisServer, is_child, read_line_timeout, spawn_child, wait_timeout,
};

const PATIENCE: Duration = Duration::from_secs(10);

/// The reply to `PING`.
fn pong() -> Value {
    Value::SimpleString("PONG".into())
}

#[test]
fn server_starts_and_answers_ping() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    assert_ne!(server.port(), 0);
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.cmd::<Value>(&["PING"]), pong());
    assert!(server.is_running());
    assert!(server.dir().is_dir());
    assert!(server.log_tail(50).contains("Ready to accept connections"));
}

#[test]
fn cmd_sends_commands_and_converts_replies() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    assert_eq!(
        server.cmd::<Value>(&["SET", "greeting", "hello world\r\n"]),
        Value::Okay
    );
    assert_eq!(
        server.cmd::<Value>(&["GET", "greeting"]),
        Value::BulkString(b"hello world\r\n".to_vec())
    );
    assert_eq!(
        server
            .cmd::<Option<String>>(&["GET", "greeting"])
            .as_deref(),
        Some("hello world\r\n")
    );
    assert_eq!(server.cmd::<Option<String>>(&["GET", "missing"]), None);
    assert_eq!(server.cmd::<Value>(&["GET", "missing"]), Value::Nil);

    assert_eq!(
        server.cmd::<Value>(&["ZADD", "z", "1", "a", "2", "b"]),
        Value::Int(2)
    );
    assert_eq!(server.cmd::<i64>(&["ZCARD", "z"]), 2);
    assert_eq!(
        server.cmd::<Vec<String>>(&["ZRANGE", "z", "0", "-1"]),
        ["a", "b"]
    );
    assert_eq!(server.cmd::<i64>(&["CLIENT", "KILL", "TYPE", "pubsub"]), 0);
    assert_eq!(server.cmd::<String>(&["DEBUG", "SLEEP", "0"]), "OK");
    assert_eq!(server.cmd::<String>(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(server.cmd::<String>(&["FLUSHALL"]), "OK");
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 0);

    // An error reply is an `Err`, not a value.
    let err = server.try_cmd::<Value>(&["NOSUCHCOMMAND"]).unwrap_err();
    assert!(err.to_string().contains("unknown command"), "{err}");
    // So is a reply of the wrong type.
    assert!(server.try_cmd::<i64>(&["GET", "greeting"]).is_err());

    // A connection of one's own, for several commands.
    let mut connection = server.connection(Duration::from_secs(5)).unwrap();
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut connection).unwrap();
    let m: i64 = redis::cmd("INCR").arg("n").query(&mut connection).unwrap();
    assert_eq!((n, m), (1, 2));
}

#[test]
fn restart_keeps_the_port_and_starts_empty() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let port = server.port();
    let first_pid = server.pid().unwrap();
    server.cmd::<()>(&["SET", "k", "v"]);

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid().unwrap(), first_pid);
    assert_eq!(server.cmd::<Value>(&["PING"]), pong());
    assert_eq!(
        server.cmd::<Option<String>>(&["GET", "k"]),
        None,
        "no persistence"
    );

    server.stop();
    assert!(!server.is_running());
    assert!(server.try_cmd::<Value>(&["PING"]).is_err());
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd::<Value>(&["PING"]), pong());
}

#[test]
fn a_frozen_server_times_out_and_thaws() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    server.freeze();
    let start = Instant::now();
    assert!(
        server
            .try_cmd_timeout::<Value>(&["PING"], Duration::from_millis(200))
            .is_err()
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    server.thaw();
    assert_eq!(server.cmd::<Value>(&["PING"]), pong());
}

#[test]
fn pause_holds_commands_for_a_while() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    // The clock read before the pause begins: read after it, a thread
    // descheduled in between saw less of the pause.
    let start = Instant::now();
    server.pause(Duration::from_millis(150));
    assert_eq!(server.cmd::<Value>(&["PING"]), pong());
    assert!(start.elapsed() >= Duration::from_millis(150));
}

/// Runs only as a child of `a_missing_server_skips_or_fails_as_asked`: a
/// test that needs a server, in a process where none can be run.
#[test]
fn child_needs_a_server() {
    if !is_child() {
        return;
    }
    // Twice: the skip line is printed once per test binary all the same.
    assert!(RedisServer::start_or_skip().is_none());
    assert!(RedisServer::start_or_skip().is_none());
}

/// Without a `redis-server` to run, a test that needs one returns early and
/// its binary says so once on stderr (not captured by libtest); with
/// `WATERTIGHT_REQUIRE_REDIS=1` the test fails instead, saying why.
#[test]
fn a_missing_server_skips_or_fails_as_asked() {
    if is_child() {
        return;
    }
    let run = |require: Option<&str>| {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["child_needs_a_server", "--exact", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env(REDIS_SERVER_ENV, "/nonexistent/redis-server")
            .env_remove(REQUIRE_REDIS_ENV)
            .stdin(Stdio::null());
        if let Some(value) = require {
            command.env(REQUIRE_REDIS_ENV, value);
        }
        let out = command.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };

    let (passed, stdout, stderr) = run(None);
    assert!(passed, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let skips: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("SKIPPED:"))
        .collect();
    assert_eq!(
        skips.len(),
        1,
        "one skip line per binary; stderr:\n{stderr}"
    );
    for needed in [
        "/nonexistent/redis-server",
        "apt-get install redis-server",
        REDIS_SERVER_ENV,
        REQUIRE_REDIS_ENV,
    ] {
        assert!(
            skips[0].contains(needed),
            "{needed:?} missing from {:?}",
            skips[0]
        );
    }
    assert!(stdout.contains("1 passed"), "{stdout}");

    for off in ["0", ""] {
        let (passed, _, stderr) = run(Some(off));
        assert!(
            passed && stderr.contains("SKIPPED:"),
            "{REQUIRE_REDIS_ENV}={off:?}: {stderr}"
        );
    }

    let (passed, stdout, stderr) = run(Some("1"));
    assert!(!passed, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stderr.contains("SKIPPED:"), "{stderr}");
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains(&format!(
            "{REQUIRE_REDIS_ENV} is set but no Redis server can be run"
        )),
        "{all}"
    );
}

#[test]
fn probe_counts_one_holder_at_a_time_under_a_mutex() {
    let probe = ConcurrencyProbe::start();
    let gate = Arc::new(Mutex::new(()));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let gate = gate.clone();
            let addr = probe.addr();
            thread::spawn(move || {
                for _ in 0..5 {
                    let _held = gate.lock().unwrap();
                    let client = ProbeClient::enter(addr);
                    thread::sleep(Duration::from_millis(1));
                    client.exit();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(probe.max_seen(), 1);
    assert_eq!(probe.total_enters(), 40);
    assert_eq!(probe.current(), 0);
}

#[test]
fn probe_counts_the_maximum_of_concurrent_holders() {
    let probe = ConcurrencyProbe::start();
    // Six holders and the main thread.
    let barrier = Arc::new(Barrier::new(7));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let barrier = barrier.clone();
            let addr = probe.addr().to_string();
            thread::spawn(move || {
                let client = ProbeClient::enter(addr.as_str());
                barrier.wait(); // all six hold at once
                barrier.wait(); // the main thread has looked
                drop(client); // Drop exits too
            })
        })
        .collect();
    barrier.wait();
    // `enter` returns only once the probe has counted it.
    assert_eq!(probe.current(), 6);
    barrier.wait();
    for t in threads {
        t.join()
            .unwrap_or_else(|_| panic!("holder thread panicked"));
    }
    assert_eq!(probe.max_seen(), 6);
    assert_eq!(probe.total_enters(), 6);
    assert_eq!(probe.current(), 0);

    // A holder that vanishes without `exit` is counted out asynchronously.
    let client = ProbeClient::enter(probe.addr());
    assert_eq!(probe.current(), 1);
    client.abandon();
    assert!(probe.wait_current(0, PATIENCE));
    probe.reset_max();
    assert_eq!(probe.max_seen(), 0);
}

/// Runs only as a child of `child_process_prints_and_exits`.
#[test]
fn child_prints_a_line() {
    if !is_child() {
        return;
    }
    let fence = std::env::var("HARNESS_FENCE").unwrap();
    println!("HOLDING fence={fence}");
}

#[test]
fn child_process_prints_and_exits() {
    if is_child() {
        return;
    }
    let mut child = ChildTest::spawn("child_prints_a_line", &[("HARNESS_FENCE", "7".to_owned())]);
    assert_eq!(child.expect_line("HOLDING", PATIENCE), "HOLDING fence=7");
    child.assert_success(PATIENCE);
}

/// Runs only as a child of `child_process_holds_the_probe_until_killed`.
#[test]
fn child_holds_the_probe() {
    if !is_child() {
        return;
    }
    let client = ProbeClient::enter(std::env::var("HARNESS_PROBE").unwrap());
    println!("ENTERED");
    thread::sleep(Duration::from_secs(60));
    client.exit();
}

#[test]
fn child_process_holds_the_probe_until_killed() {
    if is_child() {
        return;
    }
    let probe = ConcurrencyProbe::start();
    let mut child = ChildTest::spawn(
        "child_holds_the_probe",
        &[("HARNESS_PROBE", probe.addr().to_string())],
    );
    child.expect_line("ENTERED", PATIENCE);
    assert_eq!(probe.current(), 1);
    child.stop(); // SIGSTOP: still holds
    thread::sleep(Duration::from_millis(50));
    assert_eq!(probe.current(), 1);
    child.cont();
    let status = child.kill();
    assert!(!status.success());
    assert!(probe.wait_current(0, PATIENCE));
    assert_eq!((probe.max_seen(), probe.total_enters()), (1, 1));
}

/// Runs only as a child of `read_line_timeout_returns_none_on_a_silent_child`.
#[test]
fn child_goes_silent() {
    if !is_child() {
        return;
    }
    println!("READY");
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn read_line_timeout_returns_none_on_a_silent_child() {
    if is_child() {
        return;
    }
    let mut child = spawn_child("child_goes_silent", &[]);
    let mut lines = ChildLines::of(&mut child);
    assert_eq!(lines.wait_for("READY", PATIENCE).as_deref(), Some("READY"));
    let start = Instant::now();
    assert_eq!(
        read_line_timeout(&mut lines, Duration::from_millis(300)),
        None
    );
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3));
    child.kill().unwrap();
    assert!(wait_timeout(&mut child, PATIENCE).is_some());
    // After the child is gone, stdout is closed: no line, and no waiting.
    assert_eq!(read_line_timeout(&mut lines, PATIENCE), None);
}
