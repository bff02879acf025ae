//! The Lua scripts: every state change is one script call that reads the
//! Redis primary's own clock (`TIME`), so clients' clocks never matter.
//!
//! Keys of one semaphore (all share the hash tag `{name}`, so they live in
//! one Redis Cluster slot):
//!
//! * `KEYS[1]` `…:leases`: sorted set, permit id → lease deadline (ms).
//! * `KEYS[2]` `…:info`: hash, permit id → `fence:acquired_ms:label`.
//! * `KEYS[3]` `…:fence`: the fence counter (never expires).
//! * `KEYS[4]` `…:limit`: the limit every client obeys.
//! * `KEYS[5]` `…:wake`: the pub/sub channel (only published to).
//! * `KEYS[6]` `…:quarantine` (the acquire script only): present, with a
//!   time to live, while new grants are refused after this server was found
//!   to have lost writes (see `ACQUIRE`).
//! * `KEYS[7]` `…:epoch` (the acquire script only): the epoch marker,
//!   which a server that lost its data no longer has (see `ACQUIRE`).
//!
//! The wake-ups are published with `PUBLISH`, or with `SPUBLISH` on a
//! Redis Cluster (sharded pub/sub: the message stays on the shard that owns
//! the channel's slot, the semaphore's, instead of crossing the whole
//! cluster bus); each script starts with `local PUBLISH = '…'` naming which.
//!
//! Every `PUBLISH` is a `redis.pcall`: a wake-up is a hint, and a user who
//! may not publish on the channel (`pubsub(false)`) must not fail the
//! script half-way, after its writes (Redis does not roll them back).

use redis::Script;

/// Shared by every script: the server's clock in milliseconds, and the
/// removal of expired leases, published so that waiters look again.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, id in ipairs(expired) do
      redis.call('HDEL', KEYS[2], id)
    end
    redis.pcall(PUBLISH, KEYS[5], 'free ' .. #expired)
  end
end
local function limit_of(default)
  local limit = tonumber(redis.call('GET', KEYS[4]))
  if not limit then
    limit = tonumber(default)
    redis.call('SET', KEYS[4], default)
  end
  return limit
end
";

/// `KEYS`: as the others, with `KEYS[6]` the quarantine and `KEYS[7]` the
/// epoch marker. `ARGV`: id, ttl_ms, default limit, label, the highest
/// fence this client has been granted (0: none yet), the quarantine in ms
/// (0: off), the epoch marker this client last saw, `1` if this client
/// found another sign of a loss (a promoted replica: see `failover.rs`).
///
/// Returns `{1, fence, ttl_left_ms, limit, holders, 0}` when granted (also
/// for a retry of an id that already holds: same fence, lease extended), or
/// `{0, 0, retry_after_ms, limit, holders, 0}`, where `retry_after_ms` is
/// the time until the earliest lease expires (-1 when nothing is held, as
/// with a limit of zero), or `{0, 0, quarantine_left_ms, limit, holders,
/// 1, epoch}` while grants are refused.
///
/// **Quarantine.** A fence counter below a fence this client was granted
/// means the server lost writes: it restarted without persistence, or a
/// replica that had not received the last grants was promoted. The leases
/// it forgot may still be held, so a grant now could put more than `limit`
/// holders to work. The script then sets the counter back up to the fence
/// seen (fences keep increasing) and refuses every new grant, to every
/// client, for one quarantine (the lease time to live: by then every lease
/// granted before the loss has expired, or been renewed, which puts it
/// back). Consul's lock-delay does the same after a session is lost.
///
/// The **epoch marker** `KEYS[7]` is a value written once (the server's
/// `TIME` when it was found missing) and never expiring: a server that
/// lost its data (a restart without persistence, a flush, a promoted
/// replica that never had it) has none, or one written since. A client
/// that saw another starts the quarantine, although it was never granted
/// anything. A restart *with* persistence keeps it: no quarantine.
const ACQUIRE: &str = r"
purge()
local id, ttl = ARGV[1], tonumber(ARGV[2])
local limit = limit_of(ARGV[3])
local info = redis.call('HGET', KEYS[2], id)
if info then
  redis.call('ZADD', KEYS[1], 'XX', now + ttl, id)
  local fence = string.match(info, '^(%d+):')
  return {1, tonumber(fence), ttl, limit, redis.call('ZCARD', KEYS[1]), 0}
end
local holders = redis.call('ZCARD', KEYS[1])
local quarantine = tonumber(ARGV[6])
if quarantine > 0 then
  local epoch = redis.call('GET', KEYS[7])
  if not epoch then
    epoch = t[1] .. '.' .. t[2]
    redis.call('SET', KEYS[7], epoch)
  end
  local left = redis.call('PTTL', KEYS[6])
  if left > 0 then
    return {0, 0, left, limit, holders, 1, epoch}
  end
  local seen = tonumber(ARGV[5])
  local behind = seen > (tonumber(redis.call('GET', KEYS[3])) or 0)
  if behind or epoch ~= ARGV[7] or ARGV[8] == '1' then
    if behind then
      redis.call('SET', KEYS[3], seen)
    end
    redis.call('SET', KEYS[6], seen, 'PX', quarantine)
    return {0, 0, quarantine, limit, holders, 1, epoch}
  end
end
if holders < limit then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('HSET', KEYS[2], id, fence .. ':' .. now .. ':' .. ARGV[4])
  return {1, fence, ttl, limit, holders + 1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local retry = -1
if first[2] then
  retry = tonumber(first[2]) - now
end
return {0, 0, retry, limit, holders, 0}
";

/// `ARGV`: ttl_ms, then the ids to renew. Returns one number per id: the
/// lease's new time to live in ms, or -1 if the lease is gone or expired
/// (then it is removed: a lost lease is never revived).
const RENEW: &str = r"
local ttl = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local deadline = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if deadline and deadline > now then
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, id)
    out[#out + 1] = ttl
  else
    out[#out + 1] = -1
  end
end
purge()
return out
";

/// `ARGV`: id. Returns the ms the lease had left (> 0: released in time),
/// or how long ago it expired as a negative number or zero (an overrun;
/// the entry is removed either way), or `nil` if the id held nothing
/// (expired and purged, possibly granted to someone else since).
const RELEASE: &str = r"
local deadline = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
purge()
if not deadline then
  return nil
end
if deadline > now then
  redis.pcall(PUBLISH, KEYS[5], 'free 1')
end
return deadline - now
";

/// `ARGV`: the default limit. Returns `{now_ms, limit, fence counter, id,
/// deadline, info, id, deadline, info, …}` for the unexpired leases,
/// earliest deadline first (installing the default limit if none is
/// stored, as acquire would).
const HOLDERS: &str = r"
local limit = limit_of(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[3])) or 0
local out = {now, limit, fence}
local leases = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #leases, 2 do
  out[#out + 1] = leases[i]
  out[#out + 1] = tonumber(leases[i + 1])
  out[#out + 1] = redis.call('HGET', KEYS[2], leases[i]) or ''
end
return out
";

/// `ARGV`: the new limit. Stores it for every client and wakes waiters.
const SET_LIMIT: &str = r"
local old = tonumber(redis.call('GET', KEYS[4])) or 0
redis.call('SET', KEYS[4], ARGV[1])
if tonumber(ARGV[1]) > old then
  redis.pcall(PUBLISH, KEYS[5], 'free ' .. (tonumber(ARGV[1]) - old))
end
purge()
return old
";

/// `KEYS`: as the others, with `KEYS[6]` the quarantine. `ARGV`: the
/// highest fence this client was granted, the quarantine in ms. A renewal
/// found a lease gone that Redis should still have held (its renewal was
/// sent before the holder's own deadline, which is earlier than Redis's):
/// Redis lost writes. Starts the quarantine unless one runs, and sets the
/// fence counter back up to the fence seen. Returns 1.
const QUARANTINE: &str = r"
local seen = tonumber(ARGV[1])
if seen > (tonumber(redis.call('GET', KEYS[3])) or 0) then
  redis.call('SET', KEYS[3], seen)
end
redis.call('SET', KEYS[6], seen, 'PX', tonumber(ARGV[2]), 'NX')
return 1
";

/// `build`'s check that the user may run the scripts: sent by SHA like
/// the others (so `EVALSHA`, then `SCRIPT LOAD` on `NOSCRIPT`), with all
/// six keys (Redis checks a script's declared keys for read and write
/// rights before running it), and reads what the scripts read. Changes
/// nothing. Returns 1.
const PROBE: &str = r"
redis.call('ZCARD', KEYS[1])
redis.call('GET', KEYS[4])
redis.call('PTTL', KEYS[6])
return 1
";

/// The compiled scripts (each is sent by SHA, and re-sent in full when the
/// server answers `NOSCRIPT`, as after a restart).
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) holders: Script,
    pub(super) set_limit: Script,
    pub(super) probe: Script,
    pub(super) quarantine: Script,
}

impl Scripts {
    /// The scripts publishing wake-ups with `publish` (`PUBLISH` or
    /// `SPUBLISH`).
    pub(super) fn new(publish: &str) -> Self {
        let with_prelude =
            |body: &str| Script::new(&format!("local PUBLISH = '{publish}'\n{PRELUDE}{body}"));
        Self {
            acquire: with_prelude(ACQUIRE),
            renew: with_prelude(RENEW),
            release: with_prelude(RELEASE),
            holders: with_prelude(HOLDERS),
            set_limit: with_prelude(SET_LIMIT),
            probe: with_prelude(PROBE),
            quarantine: with_prelude(QUARANTINE),
        }
    }
}
