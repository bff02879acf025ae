//! What the Redis semaphore and bulkhead say when Redis refuses them or
//! cannot be reached, against a real `redis-server` with ACL users: denied
//! rights, refused credentials and failed scripts fail at once with their
//! own error kinds; an outage is `Unavailable`, bounded by
//! `outage_tolerance`, also when a bulkhead's `max_wait` runs out first; a
//! user without rights on the channel is refused at `build`, or polls with
//! `pubsub(false)`.
//!
//! "At once" is measured against the 5 s outage tolerance these tests keep
//! (the default): a refusal that were retried would take that long.
#![cfg(all(not(loom), feature = "redis", feature = "tokio"))]

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::error::Error;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use tokio::time::timeout;
use watertight::RejectReason;
use watertight::redis::{
    ConfigError, LeaseError, RedisBulkhead, RedisSemaphore, RedisSemaphoreBuilder, ReleaseError,
};

/// The default outage tolerance, kept by every test here.
const TOLERANCE: Duration = Duration::from_secs(5);

/// Well under the tolerance: what "at once" may take on a loaded machine.
const AT_ONCE: Duration = Duration::from_secs(1);

/// How long anything may take before a test gives up (only reached when
/// something is broken).
const PATIENCE: Duration = Duration::from_secs(20);

/// Every right on every key and channel, as an ACL rule list.
const ALL: &[&str] = &["~*", "&*", "+@all"];

fn builder(url: &str, name: &str) -> RedisSemaphoreBuilder {
    RedisSemaphore::builder(redis::Client::open(url).unwrap(), name)
        .limit(1)
        .lease_ttl(Duration::from_secs(10))
        .max_poll(Duration::from_millis(200))
        .outage_tolerance(TOLERANCE)
}

/// `builder(..).build()`, timed.
async fn build_timed(b: RedisSemaphoreBuilder) -> (Result<RedisSemaphore, ConfigError>, Duration) {
    let start = Instant::now();
    let built = timeout(PATIENCE, b.build()).await.expect("build hung");
    (built, start.elapsed())
}

/// `sem.acquire()`, timed.
async fn acquire_timed(
    sem: &RedisSemaphore,
) -> (
    Result<watertight::redis::LeasedPermit, LeaseError>,
    Duration,
) {
    let start = Instant::now();
    let got = timeout(PATIENCE, sem.acquire())
        .await
        .expect("acquire hung");
    (got, start.elapsed())
}

/// Kills the connections of `user`, so that the next command reconnects
/// (and logs in again).
fn kill_clients_of(server: &RedisServer, user: &str) {
    let _killed: i64 = server.cmd(&["CLIENT", "KILL", "USER", user]);
}

// ---------------------------------------------------------------------------
// Rights
// ---------------------------------------------------------------------------

/// A user who may not run `EVALSHA` is refused by `build`, at once, as
/// `Denied`; so is one whose keys do not match the semaphore's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_a_user_who_may_not_run_the_scripts() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let no_eval = server.acl_user("noeval", "pw", &[ALL, &["-eval", "-evalsha"]].concat());
    let (built, took) = build_timed(builder(&no_eval, "jobs")).await;
    match built {
        Err(ConfigError::Denied(ref e)) => {
            assert_eq!(e.code(), Some("NOPERM"), "{e}");
        }
        other => panic!("expected ConfigError::Denied, got {other:?}"),
    }
    assert!(took < AT_ONCE, "build took {took:?}");
    let err = built.unwrap_err();
    assert!(err.source().unwrap().is::<redis::RedisError>());

    let other_keys = server.acl_user("otherkeys", "pw", &["~other:*", "&*", "+@all"]);
    let (built, took) = build_timed(builder(&other_keys, "jobs")).await;
    assert!(
        matches!(built, Err(ConfigError::Denied(_))),
        "expected ConfigError::Denied, got {built:?}"
    );
    assert!(took < AT_ONCE, "build took {took:?}");
}

/// Rights taken away after `build`: an acquire fails at once with
/// `LeaseError::Denied` (not after the outage tolerance, as if Redis were
/// down), a release with `ReleaseError::Denied`, and a waiting bulkhead
/// rejects at once as `Unavailable` (it fails closed), long before its
/// `max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_lost_after_build_fail_at_once_as_denied() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("worker", "pw", ALL);
    let sem = builder(&url, "jobs").limit(2).build().await.unwrap();
    let held = sem.acquire().await.unwrap();
    server.acl_user("worker", "pw", &[ALL, &["-evalsha", "-eval"]].concat());

    let (got, took) = acquire_timed(&sem).await;
    match got {
        Err(LeaseError::Denied(ref e)) => assert_eq!(e.code(), Some("NOPERM"), "{e}"),
        other => panic!("expected LeaseError::Denied, got {other:?}"),
    }
    assert!(took < AT_ONCE, "acquire took {took:?}");
    let chain = common::error_chain(&got.unwrap_err(), 1);
    assert_eq!(chain[0], "redis denied the semaphore's script call");

    let bh = RedisBulkhead::builder(sem.clone())
        .max_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    let rejected = bh.acquire().await.unwrap_err();
    assert_eq!(rejected.reason(), RejectReason::Unavailable);
    assert!(start.elapsed() < AT_ONCE, "took {:?}", start.elapsed());
    // The rejection's source is the acquire's error, and Redis's behind it.
    match cause_of(&rejected) {
        LeaseError::Denied(e) => assert_eq!(e.code(), Some("NOPERM"), "{e}"),
        other => panic!("expected LeaseError::Denied as the source, got {other:?}"),
    }
    let chain = common::error_chain(&rejected, 2);
    assert_eq!(
        chain[..2],
        [
            r#"bulkhead "jobs" cannot reach its shared permits"#,
            "redis denied the semaphore's script call"
        ]
    );
    // Then Redis's own error (which the redis crate may repeat as its
    // own source).
    assert!(
        chain.len() >= 3 && chain[2].contains("no permissions"),
        "{chain:?}"
    );

    let released = held.release().await;
    assert!(
        matches!(released, Err(ReleaseError::Denied(_))),
        "{released:?}"
    );
}

/// A script call denied inside the script (a command the scripts use is
/// missing) is `Denied` too, not a script failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_denied_inside_a_script_is_denied() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("worker", "pw", ALL);
    let sem = builder(&url, "jobs").build().await.unwrap();
    server.acl_user("worker", "pw", &[ALL, &["-zadd"]].concat());
    let (got, took) = acquire_timed(&sem).await;
    assert!(
        matches!(got, Err(LeaseError::Denied(_))),
        "expected LeaseError::Denied, got {got:?}"
    );
    assert!(took < AT_ONCE, "acquire took {took:?}");
}

// ---------------------------------------------------------------------------
// Credentials
// ---------------------------------------------------------------------------

/// A wrong password is `ConfigError::Auth` from `build`, at once; a
/// password changed after `build` makes the next acquire (once the
/// connection is made again) `LeaseError::Auth`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_auth_at_once() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("worker", "right", ALL);
    let (built, took) = build_timed(builder(&server.url_as("worker", "wrong"), "jobs")).await;
    assert!(
        matches!(built, Err(ConfigError::Auth(_))),
        "expected ConfigError::Auth, got {built:?}"
    );
    assert!(took < AT_ONCE, "build took {took:?}");
    let chain = common::error_chain(&built.unwrap_err(), 1);
    assert_eq!(chain[0], "redis refused the credentials");

    let sem = builder(&url, "jobs").build().await.unwrap();
    server.acl_user("worker", "changed", ALL);
    kill_clients_of(&server, "worker");
    // The kill may start a reconnect in the background (the subscriber's,
    // or the connection's own), whose back-off is at most a second: the
    // promise is about the acquire's own attempt, so it starts once that
    // reconnect has had its time.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (got, took) = acquire_timed(&sem).await;
    assert!(
        matches!(got, Err(LeaseError::Auth(_))),
        "expected LeaseError::Auth, got {got:?}"
    );
    assert!(took < AT_ONCE, "acquire took {took:?}");
}

/// No password where one is needed (`NOAUTH`) is `ConfigError::Auth`, at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_is_auth_at_once() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    // From here the harness's own commands (as `default`, without a
    // password) are refused too: nothing below needs them.
    let _: String = server.cmd(&["ACL", "SETUSER", "default", "resetpass", ">secret"]);
    let (built, took) = build_timed(builder(&server.url(), "jobs")).await;
    match built {
        Err(ConfigError::Auth(ref e)) => assert_eq!(e.code(), Some("NOAUTH"), "{e}"),
        other => panic!("expected ConfigError::Auth, got {other:?}"),
    }
    assert!(took < AT_ONCE, "build took {took:?}");
}

// ---------------------------------------------------------------------------
// Scripts
// ---------------------------------------------------------------------------

/// A script that fails on the server (here: a key of the wrong type) is
/// `LeaseError::Script`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_script_is_script_at_once() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), "jobs").build().await.unwrap();
    let _: i64 = server.cmd(&["HSET", "bulkhead:{jobs}:leases", "not", "a sorted set"]);
    let (got, took) = acquire_timed(&sem).await;
    match got {
        Err(LeaseError::Script(ref e)) => assert_eq!(e.code(), Some("WRONGTYPE"), "{e}"),
        other => panic!("expected LeaseError::Script, got {other:?}"),
    }
    assert!(took < AT_ONCE, "acquire took {took:?}");
}

// ---------------------------------------------------------------------------
// Channel rights
// ---------------------------------------------------------------------------

/// A user with every command and key but no channel (Redis 7's default for
/// new ACL users) is refused by `build` as `ChannelDenied`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_a_user_without_channel_rights() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("nochan", "pw", &["~*", "+@all", "resetchannels"]);
    let (built, took) = build_timed(builder(&url, "jobs")).await;
    match built {
        Err(ConfigError::ChannelDenied(ref e)) => assert_eq!(e.code(), Some("NOPERM"), "{e}"),
        other => panic!("expected ConfigError::ChannelDenied, got {other:?}"),
    }
    assert!(took < AT_ONCE, "build took {took:?}");
    // A user who may publish but not subscribe is refused all the same.
    let publish_only = server.acl_user(
        "pubonly",
        "pw",
        &["~*", "&*", "+@all", "-subscribe", "-psubscribe"],
    );
    let (built, _) = build_timed(builder(&publish_only, "jobs")).await;
    assert!(
        matches!(built, Err(ConfigError::ChannelDenied(_))),
        "expected ConfigError::ChannelDenied, got {built:?}"
    );
}

/// The same user with `pubsub(false)`: the scripts still work (their
/// `PUBLISH` is denied, and ignored), a release says it released (not
/// "unavailable"), and a waiter is granted the permit by polling, within
/// `max_poll` of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_channel_rights_pubsub_false_polls() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("nochan", "pw", &["~*", "+@all", "resetchannels"]);
    let sem = builder(&url, "jobs").pubsub(false).build().await.unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move {
            let permit = sem.acquire().await?;
            Ok::<_, LeaseError>((permit, Instant::now()))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    held.release().await.expect("the release did release");
    let (permit, granted_at) = timeout(PATIENCE, waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    let late = granted_at - released_at;
    assert!(
        late < Duration::from_millis(200 + 20 + 300),
        "granted {late:?} after the release, with max_poll 200 ms"
    );
    // An expired lease is purged (and its purge publishes, denied) without
    // failing the script.
    let _: i64 = server.cmd(&["ZADD", "bulkhead:{jobs}:leases", "1", "stale"]);
    permit.release().await.expect("released");
    let again = sem.try_acquire().await.expect("granted");
    again.release().await.expect("released");
}

/// How long a waiter polls for between attempts in the test below: long
/// enough that a grant within a small fraction of it was a wake-up.
const SLOW_POLL: Duration = Duration::from_secs(3);

/// `SUBSCRIBE` taken away after `build`, and the subscription's connection
/// closed: the redis crate makes the subscription again without an error
/// (or with one), and nothing would come through it. The subscriber's probe
/// finds out: `wakeups()` turns to `Polling`, the metrics say so and a
/// warning names the cause; a waiter is still granted by its polls. With
/// the right given back, messages come again: `PubSub`, and a release
/// reaches a waiter long before its next poll.
///
/// A current-thread runtime: the subscriber's task runs on this thread,
/// where the metrics recorder is installed. The log is the process's (a
/// subscriber of this thread's alone would miss events whose call sites
/// another test's thread reached first, while no subscriber wanted them).
#[tokio::test(flavor = "current_thread")]
async fn subscribe_rights_taken_after_build_fall_back_to_polling_and_back() {
    use watertight::redis::Wakeups;
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    #[cfg(feature = "metrics")]
    let (recorder, snapshotter) = {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        (recorder, snapshotter)
    };
    #[cfg(feature = "metrics")]
    let _metrics = metrics::set_default_local_recorder(&recorder);
    #[cfg(feature = "tracing")]
    let log = process_log();

    let url = server.acl_user("worker", "pw", ALL);
    let sem = builder(&url, "rights")
        .max_poll(SLOW_POLL)
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    // `PubSub` once the subscription delivered its first message (its
    // probe), which must come back within one response timeout.
    let built = Instant::now();
    while sem.wakeups() != Wakeups::PubSub {
        assert!(
            built.elapsed() < Duration::from_millis(500),
            "the probe did not come back within the response timeout"
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    println!("PubSub {:?} after build", built.elapsed());
    let other = builder(&server.url(), "rights").build().await.unwrap();
    // Each phase: a waiter of `sem` waits, a release by `other` 300 ms
    // later; how long the grant took after the release.
    let grant_after_release = || async {
        let held = other.acquire().await.unwrap();
        let waiter = tokio::spawn({
            let sem = sem.clone();
            async move {
                let permit = sem.acquire().await.unwrap();
                (permit, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        let released = Instant::now();
        held.release().await.unwrap();
        let (permit, granted) = timeout(PATIENCE, waiter).await.unwrap().unwrap();
        permit.release().await.unwrap();
        granted - released
    };
    let woken = grant_after_release().await;
    assert!(
        woken < Duration::from_millis(200),
        "granted {woken:?} after the release"
    );

    let taken = [ALL, &["-subscribe", "-psubscribe", "-ssubscribe"]].concat();
    server.acl_user("worker", "pw", &taken);
    kill_clients_of(&server, "worker");
    let start = Instant::now();
    until(|| sem.wakeups() == Wakeups::Polling).await;
    let found = start.elapsed();
    // The subscription made again within 50 ms, then its probe's wait of
    // one response timeout.
    assert!(
        found < Duration::from_secs(2),
        "polling found after {found:?}"
    );
    // Polling: the grant comes at the waiter's next poll, about
    // `SLOW_POLL` after its first attempt (300 ms before the release).
    let polled = grant_after_release().await;
    assert!(
        polled > SLOW_POLL / 2 && polled < SLOW_POLL + Duration::from_millis(500),
        "granted {polled:?} after the release, polling every {SLOW_POLL:?}"
    );

    server.acl_user("worker", "pw", ALL);
    let start = Instant::now();
    until(|| sem.wakeups() == Wakeups::PubSub).await;
    let back = start.elapsed();
    // Made again after a pause of at most 10 s, and probed.
    assert!(
        back < Duration::from_secs(12),
        "pub/sub back after {back:?}"
    );
    // Quoted in the distributed guide.
    eprintln!(
        "subscribe rights: polling found after {found:?}, pub/sub back {back:?} after the rights, polled grant {polled:?} after the release"
    );
    let woken = grant_after_release().await;
    assert!(
        woken < Duration::from_millis(200),
        "granted {woken:?} after the release"
    );

    #[cfg(feature = "metrics")]
    {
        use metrics_util::debugging::DebugValue;
        let values: Vec<(String, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == "semaphore" && l.value() == "rights")
            })
            .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
            .collect();
        assert!(
            values.contains(&(
                "bulkhead_redis_pubsub_up".into(),
                DebugValue::Gauge(1.0.into())
            )),
            "{values:?}"
        );
        assert!(
            values.contains(&(
                "bulkhead_redis_pubsub_lost_total".into(),
                DebugValue::Counter(1)
            )),
            "{values:?}"
        );
    }
    #[cfg(feature = "tracing")]
    {
        // The connection's end is news (told at `INFO`, as after a
        // restart); a subscription that delivers nothing is a warning,
        // once, with its cause: the redis crate reports the refused
        // `SUBSCRIBE` as made, and the probe did not come back.
        let text = log.text();
        let out: String = text
            .lines()
            .filter(|l| l.contains("semaphore=\"rights\""))
            .map(|l| format!("{l}\n"))
            .collect();
        let warned: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("pub/sub stopped"))
            .collect();
        assert_eq!(warned.len(), 1, "{out}");
        assert!(
            warned[0].contains("semaphore=\"rights\"")
                && (warned[0].contains("did not arrive within 500ms")
                    || warned[0].contains("subscribing failed")),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.contains("INFO") && l.contains("pub/sub resumed")),
            "{out}"
        );
    }
}

/// Channel rights taken away after `build`: Redis closes the
/// subscription's connection itself, no subscription delivers, and the
/// semaphore says `Polling` within a second or two; waiters are served by
/// their polls, and pub/sub is back once the rights are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_rights_taken_after_build_fall_back_to_polling() {
    use watertight::redis::Wakeups;
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.acl_user("worker", "pw", ALL);
    let sem = builder(&url, "channels")
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    until(|| sem.wakeups() == Wakeups::PubSub).await;
    let held = sem.acquire().await.unwrap();
    server.acl_user("worker", "pw", &[ALL, &["resetchannels"]].concat());
    let start = Instant::now();
    until(|| sem.wakeups() == Wakeups::Polling).await;
    let found = start.elapsed();
    assert!(
        found < Duration::from_secs(2),
        "polling found after {found:?}"
    );
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|p| (p, Instant::now())) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (permit, granted) = timeout(PATIENCE, waiter).await.unwrap().unwrap().unwrap();
    let polled = granted - released;
    // `max_poll` is 200 ms here.
    assert!(
        polled < Duration::from_millis(700),
        "granted {polled:?} after the release"
    );
    permit.release().await.unwrap();
    server.acl_user("worker", "pw", ALL);
    until(|| sem.wakeups() == Wakeups::PubSub).await;
}

/// The log of every `tracing` event in this test process, from the first
/// call on.
#[cfg(feature = "tracing")]
fn process_log() -> &'static common::LogBuf {
    static LOG: std::sync::OnceLock<common::LogBuf> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = common::LogBuf::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
}

/// Polls `condition` every 10 ms until it holds (at most `PATIENCE`).
async fn until(condition: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "the condition never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------
// Outages
// ---------------------------------------------------------------------------

/// A bulkhead waiting while Redis is down, with a `max_wait` shorter than
/// the outage tolerance, is rejected as `Unavailable` when `max_wait` runs
/// out, not as `Timeout`: its attempts could not reach Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_while_redis_is_down_is_unavailable() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), "jobs").build().await.unwrap();
    let bh = RedisBulkhead::builder(sem)
        .max_wait(Duration::from_millis(500))
        .build()
        .unwrap();
    server.stop();
    let start = Instant::now();
    let rejected = timeout(PATIENCE, bh.acquire())
        .await
        .expect("acquire hung")
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(rejected.reason(), RejectReason::Unavailable, "{rejected}");
    assert!(
        took >= Duration::from_millis(500) && took < TOLERANCE,
        "rejected after {took:?}: max_wait is 500 ms"
    );
    // Its source: the error of the latest attempt, which could not connect.
    match cause_of(&rejected) {
        LeaseError::Unavailable(e) => assert!(e.is_io_error(), "{e:?}"),
        other => panic!("expected LeaseError::Unavailable as the source, got {other:?}"),
    }
    assert_eq!(bh.metrics().rejected_unavailable(), 1);
    assert_eq!(bh.metrics().rejected_timeout(), 0);
}

/// Redis up and every permit held: a wait that runs out of `max_wait` is
/// `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_while_redis_says_full_is_timeout() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), "jobs").build().await.unwrap();
    let _held = sem.acquire().await.unwrap();
    let bh = RedisBulkhead::builder(sem)
        .max_wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let rejected = timeout(PATIENCE, bh.acquire())
        .await
        .expect("acquire hung")
        .unwrap_err();
    assert_eq!(rejected.reason(), RejectReason::Timeout, "{rejected}");
    assert!(rejected.source().is_none(), "{rejected:?}");
}

/// Redis down for a while, then back and full: the wait that then runs
/// out is `Timeout` (the latest attempt decides), though it began in an
/// outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_after_redis_came_back_full_is_timeout() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    // A limit of 0: full whenever Redis answers, also once a restart has
    // forgotten it (the scripts install the builder's limit again). The
    // restart loses the epoch marker, which would quarantine the grants
    // (also `Unavailable`: tests/redis_failover.rs): off here.
    let sem = builder(&server.url(), "jobs")
        .limit(0)
        .quarantine(false)
        .build()
        .await
        .unwrap();
    let bh = RedisBulkhead::builder(sem)
        .max_wait(Duration::from_secs(3))
        .build()
        .unwrap();
    server.stop();
    let waiting = tokio::spawn({
        let bh = bh.clone();
        async move { bh.acquire().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    server.restart();
    let rejected = timeout(PATIENCE, waiting)
        .await
        .expect("acquire hung")
        .unwrap()
        .unwrap_err();
    assert_eq!(rejected.reason(), RejectReason::Timeout, "{rejected}");
    // The outage it waited through is not its cause.
    assert!(rejected.source().is_none(), "{rejected:?}");
}

/// A black hole (a frozen server: connections stay open, nothing is
/// answered) with the default settings (2 s response timeout, 2 retries,
/// 5 s outage tolerance): a waiting acquire gives up at the tolerance,
/// not a response timeout later. Prints the margin measured (quoted in
/// the distributed guide, `watertight::guide::distributed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_ends_at_the_outage_tolerance() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = RedisSemaphore::builder(redis::Client::open(server.url()).unwrap(), "jobs")
        .build()
        .await
        .unwrap();
    sem.try_acquire().await.unwrap().release().await.unwrap();
    server.freeze();
    let (got, took) = acquire_timed(&sem).await;
    server.thaw();
    assert!(
        matches!(got, Err(LeaseError::Unavailable(_))),
        "expected Unavailable, got {got:?}"
    );
    eprintln!("black hole: acquire gave up after {took:?} (outage tolerance {TOLERANCE:?})");
    // Not a response timeout (2 s) later: half of one is room enough for a
    // loaded machine's late wake-up (300 ms was not always).
    assert!(
        took >= TOLERANCE && took < TOLERANCE + Duration::from_secs(1),
        "gave up after {took:?}, with an outage tolerance of {TOLERANCE:?}"
    );
}

/// The same black hole for `try_acquire`: one response timeout in all,
/// not one per retry (with 2 retries and their back-offs that would be
/// three response timeouts and more; with 300 ms it took about 1 s). A
/// response timeout of 1 s, so that a bound under two of them leaves a
/// loaded machine room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_costs_try_acquire_one_response_timeout() {
    const RESPONSE: Duration = Duration::from_secs(1);
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = RedisSemaphore::builder(redis::Client::open(server.url()).unwrap(), "jobs")
        .response_timeout(RESPONSE)
        .retries(2)
        .build()
        .await
        .unwrap();
    sem.try_acquire().await.unwrap().release().await.unwrap();
    server.freeze();
    let start = Instant::now();
    let got = timeout(PATIENCE, sem.try_acquire()).await;
    let took = start.elapsed();
    server.thaw();
    let got = got.expect("try_acquire hung");
    assert!(
        matches!(got, Err(LeaseError::Unavailable(_))),
        "expected Unavailable, got {got:?}"
    );
    eprintln!("black hole: try_acquire gave up after {took:?} (response timeout {RESPONSE:?})");
    assert!(
        took >= RESPONSE && took < RESPONSE * 3 / 2,
        "try_acquire gave up after {took:?}, with a response timeout of {RESPONSE:?}"
    );
}

/// The same black hole under a bulkhead whose `max_wait` is shorter than
/// the tolerance: its first attempt gets no answer, and it is rejected as
/// `Unavailable` at `max_wait`, not at the tolerance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_rejects_a_bulkhead_at_max_wait() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let sem = builder(&server.url(), "jobs").build().await.unwrap();
    let bh = RedisBulkhead::builder(sem)
        .max_wait(Duration::from_millis(500))
        .build()
        .unwrap();
    bh.acquire().await.unwrap().release().await.unwrap();
    server.freeze();
    let start = Instant::now();
    let rejected = timeout(PATIENCE, bh.acquire()).await;
    let took = start.elapsed();
    server.thaw();
    let rejected = rejected.expect("acquire hung").unwrap_err();
    assert_eq!(rejected.reason(), RejectReason::Unavailable, "{rejected}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
        "rejected after {took:?}: max_wait is 500 ms"
    );
    // No answer came: the source says so.
    match cause_of(&rejected) {
        LeaseError::Unavailable(e) => {
            assert!(e.is_timeout(), "{e:?}");
            assert!(
                e.to_string().contains("did not answer within max_wait"),
                "{e}"
            );
        }
        other => panic!("expected LeaseError::Unavailable as the source, got {other:?}"),
    }
}

/// The [`LeaseError`] a rejection of the Redis bulkhead names as its source.
fn cause_of(rejected: &watertight::Rejected) -> &LeaseError {
    rejected
        .source()
        .and_then(|e| e.downcast_ref::<LeaseError>())
        .unwrap_or_else(|| panic!("no LeaseError behind {rejected:?}"))
}
