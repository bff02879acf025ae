//! Tests of the std-only Redis test harness in `tests/common/redis_server.rs`
//! itself: the server, raw commands, restarts, the concurrency probe and
//! child processes.

#[path = "common/redis_server.rs"]
mod redis_server;

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_server::{
    ChildLines, ChildTest, ConcurrencyProbe, ProbeClient, RedisServer, is_child, parse_bulk,
    read_line_timeout, spawn_child, wait_timeout,
};

const PATIENCE: Duration = Duration::from_secs(10);

#[test]
fn server_starts_and_answers_ping() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 0);
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.cmd(&["PING"]), "+PONG\r\n");
    assert!(server.is_running());
    assert!(server.dir().is_dir());
    assert!(server.log_tail(50).contains("Ready to accept connections"));
}

#[test]
fn cmd_sends_commands_and_returns_raw_replies() {
    let server = RedisServer::start();
    assert_eq!(
        server.cmd(&["SET", "greeting", "hello world\r\n"]),
        "+OK\r\n"
    );
    let reply = server.cmd(&["GET", "greeting"]);
    assert_eq!(reply, "$13\r\nhello world\r\n\r\n");
    assert_eq!(parse_bulk(&reply).as_deref(), Some("hello world\r\n"));
    assert_eq!(parse_bulk(&server.cmd(&["GET", "missing"])), None);

    assert_eq!(server.cmd(&["ZADD", "z", "1", "a", "2", "b"]), ":2\r\n");
    assert_eq!(server.cmd_int(&["ZCARD", "z"]), 2);
    assert_eq!(
        server.cmd(&["ZRANGE", "z", "0", "-1"]),
        "*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );
    assert_eq!(server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]), ":0\r\n");
    assert_eq!(server.cmd(&["DEBUG", "SLEEP", "0"]), "+OK\r\n");
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "+OK\r\n");
    assert_eq!(server.cmd(&["FLUSHALL"]), "+OK\r\n");
    assert_eq!(server.cmd_int(&["DBSIZE"]), 0);
    assert!(server.cmd(&["NOSUCHCOMMAND"]).starts_with("-ERR"));
}

#[test]
fn restart_keeps_the_port_and_starts_empty() {
    let server = RedisServer::start();
    let port = server.port();
    let first_pid = server.pid().unwrap();
    server.cmd(&["SET", "k", "v"]);

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid().unwrap(), first_pid);
    assert_eq!(server.cmd(&["PING"]), "+PONG\r\n");
    assert_eq!(server.cmd(&["GET", "k"]), "$-1\r\n", "no persistence");

    server.stop();
    assert!(!server.is_running());
    assert!(server.try_cmd(&["PING"]).is_err());
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd(&["PING"]), "+PONG\r\n");
}

#[test]
fn a_frozen_server_times_out_and_thaws() {
    let server = RedisServer::start();
    server.freeze();
    let start = Instant::now();
    assert!(
        server
            .try_cmd_timeout(&["PING"], Duration::from_millis(200))
            .is_err()
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    server.thaw();
    assert_eq!(server.cmd(&["PING"]), "+PONG\r\n");
}

#[test]
fn pause_holds_commands_for_a_while() {
    let server = RedisServer::start();
    server.pause(Duration::from_millis(150));
    let start = Instant::now();
    assert_eq!(server.cmd(&["PING"]), "+PONG\r\n");
    assert!(start.elapsed() >= Duration::from_millis(100));
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
