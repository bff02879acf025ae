//! redis-rs alone, without bulkhead: the floors the Redis benches compare
//! the semaphore with. Included with `#[path]` by `benches/redis.rs` and
//! `benches/redis_client.rs`.
//!
//! - [`Bare`]: the like-for-like floor. redis-rs's `Script::invoke_async`
//!   sending the semaphore's **own** acquire and release scripts (read from
//!   `src/redis/scripts.rs`, so the same text and SHA) with the same keys and
//!   arguments (a fixed permit id of the same length): the same work in
//!   Redis and the same bytes on the wire as one uncontended cycle, so the
//!   difference to the semaphore's cycle is what its client adds.
//! - [`comparable`]: calls of [`COMPARABLE_SCRIPT`] (one key, one argument,
//!   5 commands), the floor that `benches/redis.rs` has measured against
//!   since before the fair line; lighter than ours in Redis and on the wire.

#![allow(dead_code)]

// ---------------------------------------------------------------------------

/// A script of about the cost the semaphore's had before the fair line: the
/// server's clock, a range scan that finds nothing (as the purge of expired
/// leases usually does), then add, count and remove a member of a sorted set
/// whose key carries a hash tag. 5 commands; ours run 8 (acquire) and 9
/// (release) when nobody waits, with eleven and ten keys.
pub const COMPARABLE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
redis.call('ZADD', KEYS[1], now + 30000, ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
redis.call('ZREM', KEYS[1], ARGV[1])
return {1, now, n}
";
pub const COMPARABLE_KEY: &str = "bench:{cmp}:leases";
pub const COMPARABLE_MEMBER: &str = "0123456789abcdef0123456789abcdef";

const SCRIPTS_RS: &str = include_str!("../../src/redis/scripts.rs");

/// The body of `const NAME: &str = r"…";` in `src/redis/scripts.rs`.
fn lua(name: &str) -> &'static str {
    let start = format!("const {name}: &str = r\"");
    let at = SCRIPTS_RS
        .find(&start)
        .unwrap_or_else(|| panic!("no {name} in src/redis/scripts.rs"))
        + start.len();
    let len = SCRIPTS_RS[at..].find("\";").expect("the script's end");
    &SCRIPTS_RS[at..at + len]
}

/// A script as `Scripts::new` builds it (same text, so the same SHA).
fn our_script(body: &str, publish: &str) -> redis::Script {
    redis::Script::new(&format!(
        "local PUBLISH = '{publish}'\n{}{}",
        lua("PRELUDE"),
        lua(body)
    ))
}

/// The keys of semaphore `name` (see `scripts.rs`), the epoch marker last.
fn keys(name: &str) -> Vec<String> {
    let base = format!("bulkhead:{{{name}}}");
    [
        "leases",
        "info",
        "fence",
        "limit",
        "wake",
        "quarantine",
        "queue",
        "queue:beat",
        "queue:info",
        "queue:seq",
        "epoch",
    ]
    .iter()
    .map(|k| format!("{base}:{k}"))
    .collect()
}

/// redis-rs alone, sending the semaphore's own acquire and release with
/// its arguments: the same ttl, limit, quarantine, a fixed id of the same
/// length, a label and token of the same lengths, the epoch marker read
/// from the server.
pub struct Bare {
    acquire: redis::Script,
    release: redis::Script,
    keys: Vec<String>,
    label: String,
    token: String,
    epoch: String,
    /// The highest fence granted so far, sent back as the semaphore does.
    fence: std::cell::Cell<u64>,
}

impl Bare {
    pub async fn new(
        name: &str,
        publish: &str,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> Bare {
        let keys = keys(name);
        let epoch_script = redis::Script::new(
            "local e = redis.call('GET', KEYS[1]) if not e then local t = redis.call('TIME') \
             e = t[1] .. '.' .. t[2] redis.call('SET', KEYS[1], e) end return e",
        );
        let epoch: String = epoch_script
            .key(&keys[10])
            .invoke_async(conn)
            .await
            .expect("the epoch marker");
        Bare {
            acquire: our_script("ACQUIRE", publish),
            release: our_script("RELEASE", publish),
            keys,
            label: format!("{}/{}", "bench-host", std::process::id()),
            token: "0123456789abcdef".into(),
            epoch,
            fence: std::cell::Cell::new(0),
        }
    }

    pub async fn cycles(&self, conn: &mut impl redis::aio::ConnectionLike, n: u64) {
        let id = COMPARABLE_MEMBER;
        for _ in 0..n {
            let mut call = self.acquire.prepare_invoke();
            for key in &self.keys {
                call.key(key);
            }
            call.arg(id)
                .arg(30_000u64)
                .arg(1usize)
                .arg(&self.label)
                .arg(self.fence.get())
                .arg(30_000u64)
                .arg(1u8)
                .arg(&self.token)
                .arg(&self.epoch)
                .arg("0")
                .arg(1u8);
            let reply: Vec<i64> = call.invoke_async(conn).await.expect("acquire");
            assert_eq!(reply[0], 1, "the bare acquire is granted: {reply:?}");
            self.fence.set(reply[1] as u64);
            let mut call = self.release.prepare_invoke();
            for key in &self.keys[..10] {
                call.key(key);
            }
            call.arg(id);
            let left: Option<i64> = call.invoke_async(conn).await.expect("release");
            assert!(left.is_some_and(|ms| ms > 0), "released in time");
        }
    }
}

/// `n` calls of [`COMPARABLE_SCRIPT`] on `conn`, one at a time.
pub async fn comparable(conn: &mut impl redis::aio::ConnectionLike, n: u64) {
    let script = redis::Script::new(COMPARABLE_SCRIPT);
    for _ in 0..n {
        let out: (i64, i64, i64) = script
            .key(COMPARABLE_KEY)
            .arg(COMPARABLE_MEMBER)
            .invoke_async(conn)
            .await
            .expect("the script runs");
        std::hint::black_box(out);
    }
}
