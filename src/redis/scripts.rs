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
//! * `KEYS[6]` `…:quarantine`: present, with a time to live, while new
//!   grants are refused after this server was found to have lost writes
//!   (see `ACQUIRE`).
//! * `KEYS[7]` `…:queue`: sorted set, waiting permit id → arrival number:
//!   the fair line (see `serve`).
//! * `KEYS[8]` `…:queue:beat`: sorted set, waiting permit id → the deadline
//!   of its entry (ms), pushed back by its process's heartbeats.
//! * `KEYS[9]` `…:queue:info`: hash, waiting permit id →
//!   `ttl_ms:process_token:label`, what its grant needs.
//! * `KEYS[10]` `…:queue:seq`: the arrival counter (never expires).
//! * `KEYS[11]` `…:epoch` (the acquire script only): the epoch marker,
//!   which a server that lost its data no longer has (see `ACQUIRE`).
//!
//! The scripts that change leases (acquire, renew, release, set limit)
//! take all ten keys (`Keys::call_all`); the others take the first five
//! (`Keys::call`) or six. A waiter's process listens on its own channel,
//! `KEYS[5] .. ':' .. process_token` (same hash tag, so same slot).
//!
//! The wake-ups are published with `PUBLISH`, or with `SPUBLISH` on a
//! Redis Cluster (sharded pub/sub: the message stays on the shard that owns
//! the channel's slot, the semaphore's, instead of crossing the whole
//! cluster bus); each script starts with `local PUBLISH = '…'` naming which.
//!
//! Every `PUBLISH` is a `redis.pcall`: a wake-up is a hint, and a user who
//! may not publish on the channel (`pubsub(false)`) must not fail the
//! script half-way, after its writes (Redis does not roll them back).

use redis::{Cmd, FromRedisValue, ParsingError, RedisResult, Script, ToRedisArgs, Value};

/// Shared by every script: the server's clock in milliseconds, and the
/// removal of expired leases.
///
/// **The fair line.** `serve` hands the permits that are free to the heads
/// of the line (`KEYS[7]`), in arrival order, inside the script that freed
/// them (a release, an expiry purge, a raised limit, or any later script
/// call, which also serves a line left waiting by a quarantine that has
/// ended): lease added and fence bumped, as the acquire script would, and
/// a `grant id fence ttl limit` message published on the waiter's process
/// channel only. It first drops the entries whose process stopped
/// heartbeating them (their deadline in `KEYS[8]` passed), and grants
/// nothing while a quarantine runs. `wake` then publishes `free n` on the
/// shared channel for the waiters that are not in the line (unfair mode),
/// for the permits still free once the line is served (none while the
/// line is not empty), so a grant from the line wakes no one else.
///
/// **`lined`**: whether the line may have anyone in it, read once per
/// script (one `EXISTS`; `false` for the scripts not given `KEYS[7]`) and
/// kept by the scripts that change the line, so that with nobody waiting,
/// the usual case, the line costs that one command: no purge of dead
/// waiters, no rank lookup, no second look. `false` means the line is
/// empty; `true` that it was not, or (after `serve` granted every free
/// permit) that it may be, where nothing then depends on which: no permit
/// is free.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lined = KEYS[7] ~= nil and redis.call('EXISTS', KEYS[7]) == 1
local function serve()
  if not lined then
    return
  end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now)
    for _, id in ipairs(gone) do
      redis.call('ZREM', KEYS[7], id)
      redis.call('HDEL', KEYS[9], id)
    end
    lined = redis.call('EXISTS', KEYS[7]) == 1
    if not lined then
      return
    end
  end
  local limit = tonumber(redis.call('GET', KEYS[4])) or 0
  local free = limit - redis.call('ZCARD', KEYS[1])
  if free <= 0 or redis.call('EXISTS', KEYS[6]) == 1 then
    return
  end
  while free > 0 do
    local id = redis.call('ZPOPMIN', KEYS[7])[1]
    if not id then
      lined = false
      return
    end
    local w = redis.call('HGET', KEYS[9], id) or ''
    redis.call('ZREM', KEYS[8], id)
    redis.call('HDEL', KEYS[9], id)
    local ttl, token, label = string.match(w, '^(%d+):(%x*):(.*)$')
    if ttl and redis.call('HEXISTS', KEYS[2], id) == 0 then
      local fence = redis.call('INCR', KEYS[3])
      redis.call('ZADD', KEYS[1], now + tonumber(ttl), id)
      redis.call('HSET', KEYS[2], id, fence .. ':' .. now .. ':' .. label)
      redis.pcall(PUBLISH, KEYS[5] .. ':' .. token, 'grant ' .. id .. ' ' .. fence .. ' ' .. ttl .. ' ' .. limit)
      free = free - 1
    end
  end
end
local function wake(n)
  if n <= 0 or lined then
    return
  end
  local free = (tonumber(redis.call('GET', KEYS[4])) or 0) - redis.call('ZCARD', KEYS[1])
  if free > 0 then
    redis.pcall(PUBLISH, KEYS[5], 'free ' .. math.min(n, free))
  end
end
local function quarantine_from(seen, ms)
  redis.call('SET', KEYS[6], seen, 'PX', ms)
  local epoch = t[1] .. '.' .. t[2] .. ':q'
  redis.call('SET', KEYS[11], epoch)
  return epoch
end
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, id in ipairs(expired) do
      redis.call('HDEL', KEYS[2], id)
    end
  end
  serve()
  wake(#expired)
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

/// `KEYS`: the ten, and `KEYS[11]` the epoch marker. `ARGV`: id, ttl_ms,
/// default limit, label, the highest fence this client has been granted
/// (0: none yet), the quarantine in ms (0: off), whether to join the line
/// when no permit is free (1, fair mode) or not (0), the process token (the
/// suffix of this process's channel), the epoch marker this client last
/// saw, `1` if this client found another sign of a loss (a promoted
/// replica: see `failover.rs`), and `1` if the id is new (this is its first
/// call: it can neither hold a lease nor stand in the line, so neither is
/// looked up; a client that does not send it gets both looked up).
///
/// Returns `{1, fence, ttl_left_ms, limit, holders, 0, 0}` when granted
/// (also for a retry of an id that already holds, or was granted from the
/// line meanwhile: same fence, lease extended), or `{0, 0, retry_after_ms,
/// limit, holders, 0, queued}`, where `retry_after_ms` is the time until
/// the earliest lease expires (-1 when nothing is held, as with a limit of
/// zero) and `queued` is the id's place in the line plus one (0: not in
/// it; an id already in line keeps its place, and its entry's deadline is
/// pushed back), or `{0, 0, quarantine_left_ms, limit, holders, 1, queued,
/// epoch}` while grants are refused. A grant or a wait also carries the
/// epoch marker, eighth, when the client is to adopt it (see below).
///
/// A free permit is taken only if nobody waits in the line: `purge` has
/// just served the line, so the line is empty whenever a permit is free,
/// but during a quarantine.
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
/// The **epoch marker** `KEYS[11]` is a value with no time to live: the
/// server's `TIME` when it was found missing, and a new one, ending in
/// `:q`, whenever a quarantine starts (`quarantine_from`). A server that
/// lost its data (a restart without persistence, a flush, a promoted
/// replica that never had it) has none, or one written since. A client
/// sends the marker it saw last, and:
///
/// * the same marker: its signs of a loss (a fence behind, a promoted
///   replica) are of a new loss, which starts a quarantine;
/// * an older one, and the marker ends in `:q`: the loss it would find was
///   quarantined, and that quarantine is over (one that runs refuses it
///   first). It adopts the marker (the eighth value of the answer), and a
///   fence of its above the counter sets the counter up to it: no second
///   quarantine for one loss;
/// * an older one, and a marker not written by a quarantine (written when
///   found missing, here or by a client built since): a loss nobody
///   quarantined yet, which starts one, although this client was never
///   granted anything.
///
/// A restart *with* persistence keeps the marker: no quarantine.
const ACQUIRE: &str = r"
purge()
local id, ttl = ARGV[1], tonumber(ARGV[2])
local quarantine = tonumber(ARGV[6])
local state = {}
if quarantine > 0 then
  state = redis.call('MGET', KEYS[4], KEYS[3], KEYS[6], KEYS[11])
else
  state[1] = redis.call('GET', KEYS[4])
end
local limit = tonumber(state[1])
if not limit then
  limit = tonumber(ARGV[3])
  redis.call('SET', KEYS[4], ARGV[3])
end
local info = ARGV[11] ~= '1' and redis.call('HGET', KEYS[2], id)
if info then
  redis.call('ZADD', KEYS[1], 'XX', now + ttl, id)
  local fence = string.match(info, '^(%d+):')
  return {1, tonumber(fence), ttl, limit, redis.call('ZCARD', KEYS[1]), 0, 0}
end
local holders = redis.call('ZCARD', KEYS[1])
local queued = 0
local rank = lined and ARGV[11] ~= '1' and redis.call('ZRANK', KEYS[7], id)
if rank then
  redis.call('ZADD', KEYS[8], 'XX', now + ttl, id)
  queued = rank + 1
end
local adopt = nil
if quarantine > 0 then
  local epoch = state[4]
  if not epoch then
    epoch = t[1] .. '.' .. t[2]
    redis.call('SET', KEYS[11], epoch)
  end
  if state[3] then
    local left = redis.call('PTTL', KEYS[6])
    if left > 0 then
      return {0, 0, left, limit, holders, 1, queued, epoch}
    end
  end
  local seen = tonumber(ARGV[5])
  local behind = seen > (tonumber(state[2]) or 0)
  if behind then
    redis.call('SET', KEYS[3], seen)
  end
  local current = epoch == ARGV[9]
  if current and (behind or ARGV[10] == '1') or not current and string.sub(epoch, -2) ~= ':q' then
    epoch = quarantine_from(seen, quarantine)
    return {0, 0, quarantine, limit, holders, 1, queued, epoch}
  end
  if not current then
    adopt = epoch
  end
end
if queued == 0 and holders < limit and not lined then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('HSET', KEYS[2], id, fence .. ':' .. now .. ':' .. ARGV[4])
  return {1, fence, ttl, limit, holders + 1, 0, 0, adopt}
end
if queued == 0 and ARGV[7] == '1' then
  redis.call('ZADD', KEYS[7], redis.call('INCR', KEYS[10]), id)
  redis.call('ZADD', KEYS[8], now + ttl, id)
  redis.call('HSET', KEYS[9], id, ttl .. ':' .. ARGV[8] .. ':' .. ARGV[4])
  queued = redis.call('ZCARD', KEYS[7])
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local retry = -1
if first[2] then
  retry = tonumber(first[2]) - now
end
return {0, 0, retry, limit, holders, 0, queued, adopt}
";

/// `ARGV`: ttl_ms, then the ids to renew, then optionally an empty string
/// and the ids of this process's waiters in the line, to heartbeat.
/// Returns one number per lease id: the lease's new time to live in ms, or
/// -1 if the lease is gone or expired (then it is removed: a lost lease is
/// never revived); then one per waiter id: 1 if it is still in line (its
/// entry's deadline pushed back), 2 if it was granted (its `grant`
/// message is on its way, or was lost), 0 if it is neither (its entry
/// expired: an expired entry is never revived either).
const RENEW: &str = r"
local ttl = tonumber(ARGV[1])
local out = {}
local waiters = false
for i = 2, #ARGV do
  local id = ARGV[i]
  if id == '' then
    waiters = true
  elseif waiters then
    local beat = tonumber(redis.call('ZSCORE', KEYS[8], id))
    if beat and beat > now then
      redis.call('ZADD', KEYS[8], 'XX', now + ttl, id)
      out[#out + 1] = 1
    elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
      out[#out + 1] = 2
    else
      out[#out + 1] = 0
    end
  else
    local deadline = tonumber(redis.call('ZSCORE', KEYS[1], id))
    if deadline and deadline > now then
      redis.call('ZADD', KEYS[1], 'XX', now + ttl, id)
      out[#out + 1] = ttl
    else
      out[#out + 1] = -1
    end
  end
end
purge()
return out
";

/// `ARGV`: id. Returns the ms the lease had left (> 0: released in time),
/// or how long ago it expired as a negative number or zero (an overrun;
/// the entry is removed either way), or `nil` if the id held nothing
/// (expired and purged, possibly granted to someone else since). An id
/// waiting in the line leaves it (a cancelled waiter), and the permit
/// freed goes to the line's head first.
const RELEASE: &str = r"
local deadline = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if deadline then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('HDEL', KEYS[2], ARGV[1])
if lined and redis.call('ZREM', KEYS[7], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[8], ARGV[1])
  redis.call('HDEL', KEYS[9], ARGV[1])
  lined = redis.call('EXISTS', KEYS[7]) == 1
end
purge()
if not deadline then
  return nil
end
if deadline > now then
  wake(1)
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

/// `ARGV`: the new limit. Stores it for every client, grants the permits
/// it adds to the line's heads, and wakes the other waiters.
const SET_LIMIT: &str = r"
local old = tonumber(redis.call('GET', KEYS[4])) or 0
redis.call('SET', KEYS[4], ARGV[1])
purge()
if tonumber(ARGV[1]) > old then
  wake(tonumber(ARGV[1]) - old)
end
return old
";

/// `KEYS`: the acquire script's eleven. `ARGV`: the highest fence this
/// client was granted, the quarantine in ms. A renewal found a lease gone
/// that Redis should still have held (its renewal was sent before the
/// holder's own deadline, which is earlier than Redis's): Redis lost
/// writes. Starts the quarantine unless one runs (a new epoch marker with
/// it, as the acquire script does), and sets the fence counter back up to
/// the fence seen. Returns 1.
const QUARANTINE: &str = r"
local seen = tonumber(ARGV[1])
if seen > (tonumber(redis.call('GET', KEYS[3])) or 0) then
  redis.call('SET', KEYS[3], seen)
end
if redis.call('EXISTS', KEYS[6]) == 0 then
  quarantine_from(seen, tonumber(ARGV[2]))
end
return 1
";

/// `build`'s check that the user may run the scripts: sent by SHA like
/// the others (so `EVALSHA`, then `SCRIPT LOAD` on `NOSCRIPT`), with all
/// ten keys (Redis checks a script's declared keys for read and write
/// rights before running it), and reads what the scripts read. Changes
/// nothing. Returns 1.
const PROBE: &str = r"
redis.call('ZCARD', KEYS[1])
redis.call('GET', KEYS[4])
redis.call('PTTL', KEYS[6])
redis.call('ZCARD', KEYS[7])
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

/// One script call written straight into a `redis::Cmd`: `EVALSHA sha
/// numkeys keys… args…`, sent by SHA and re-sent after `SCRIPT LOAD` when
/// the server answers `NOSCRIPT` (as after a restart), as redis-rs's own
/// `ScriptInvocation` does. That one first collects every key and argument
/// in a `Vec` of its own, then copies them into a `Cmd`: about twenty
/// allocations for the acquire script, where this makes two. For the
/// scripts of every acquire and release; the rarer calls keep redis-rs's.
pub(super) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    /// A call of `script` with `keys`, and room for `args` arguments.
    pub(super) fn new(script: &'a Script, keys: &[&str], args: usize) -> Self {
        let hash = script.get_hash();
        let bytes = "EVALSHA".len()
            + hash.len()
            + 2
            + keys.iter().map(|k| k.len()).sum::<usize>()
            + args * 20;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self { script, cmd }
    }

    /// Appends an argument (`ARGV[n]`, in order).
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call on `conn`; on `NOSCRIPT`, loads the script and sends
    /// it once more.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }

    /// Sends the call and `then` as one pipeline on `conn`, and returns
    /// both answers (`then`'s as Redis gave it, an error included); on
    /// `NOSCRIPT`, loads the script and sends both once more.
    ///
    /// A pipeline is one write on one connection (the redis crate's
    /// multiplexed connection, and on a Cluster its connection to the node
    /// that the call's first key routes to, which runs both commands and
    /// is sent both again after a `MOVED` or `ASK`), so `then` runs right
    /// after the call, on the connection that ran it: what `WAIT` needs to
    /// count the call's writes.
    pub(super) async fn invoke_then<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        then: &Cmd,
    ) -> RedisResult<(T, redis::Value)> {
        let mut pipe = redis::pipe();
        pipe.add_command(self.cmd.clone()).add_command(then.clone());
        let mut loaded = false;
        loop {
            let mut answers = conn.req_packed_commands(&pipe, 0, 2).await?;
            let (Some(then_answer), Some(answer), None) =
                (answers.pop(), answers.pop(), answers.pop())
            else {
                return Err(redis::ParsingError::from("a pipeline of 2 answered otherwise").into());
            };
            match answer.extract_error() {
                Err(e)
                    if !loaded
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    self.script.load_async(conn).await?;
                    loaded = true;
                }
                Err(e) => return Err(e),
                Ok(answer) => return Ok((T::from_redis_value(answer)?, then_answer)),
            }
        }
    }
}

/// The acquire script's answer: seven numbers, and the epoch marker when
/// grants are quarantined or the client is to adopt it.
pub(super) struct AcquireReply {
    pub(super) granted: i64,
    pub(super) fence: u64,
    pub(super) ms: i64,
    pub(super) limit: i64,
    pub(super) quarantined: i64,
    pub(super) queued: i64,
    pub(super) epoch: Option<String>,
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut items: Vec<Value> = redis::from_redis_value(v)?;
        if !(7..=8).contains(&items.len()) {
            return Err(format!("acquire answered {} values, not 7 or 8", items.len()).into());
        }
        let epoch = match items.len() {
            8 => items.pop().map(redis::from_redis_value).transpose()?,
            _ => None,
        };
        let n = |i: usize| redis::from_redis_value_ref::<i64>(&items[i]);
        Ok(Self {
            granted: n(0)?,
            fence: u64::try_from(n(1)?).map_err(|e| ParsingError::from(e.to_string()))?,
            ms: n(2)?,
            limit: n(3)?,
            quarantined: n(5)?,
            queued: n(6)?,
            epoch,
        })
    }
}
