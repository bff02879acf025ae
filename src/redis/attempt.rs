//! The acquire path: one attempt (the grant script, retried with the same
//! permit id when its outcome is unknown), the wait between attempts, and
//! the [`Pending`] id that is released if its future is dropped while a
//! grant may exist.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use event_listener::EventListener;

use super::error::{Failure, LeaseError, classify};
use super::inner::Inner;
use super::line::Slot;
use super::scripts::AcquireReply;
use super::scripts::Call;
use super::{LeasedPermit, RedisSemaphore};
use crate::lease::Store;
use crate::timer::timeout::Timeout;

/// What one acquire script call decided.
enum Grant {
    Granted(LeasedPermit),
    Busy {
        retry_after: Option<Duration>,
        limit: usize,
        /// Refused because Redis lost writes (the acquire script's
        /// quarantine); `retry_after` is what is left of it.
        quarantined: bool,
        /// The id's place in the fair line (0: the head), if it is in it.
        place: Option<usize>,
    },
}

/// What one attempt found: a grant, or what to wait on before the next.
enum Found {
    Granted(LeasedPermit),
    Wait {
        listener: EventListener,
        pause: Duration,
        down_since: Option<Instant>,
        retry_after: Option<Duration>,
        limit: usize,
        quarantined: bool,
        /// Why no permit could be counted (Redis out of reach, or
        /// quarantined); `None` when every permit is leased.
        cause: Option<LeaseError>,
    },
}

/// The outcome of [`attempt`].
pub(super) type Attempt = crate::lease::Attempt<LeasedPermit, Busy>;

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Busy")
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}

/// Why the latest attempt of a wait could not count the permits: Redis out
/// of reach or quarantined (the error it gave).
pub(super) type Down = crate::lease::Down<LeaseError>;

/// Where a waiting acquire goes on from (see [`attempt`]). `pub` for the
/// sealed `Store` trait's signatures; no one outside the crate can name it.
#[allow(unreachable_pub)]
pub struct Busy {
    pending: Pending,
    listener: EventListener,
    pause: Duration,
    down_since: Option<Instant>,
    cause: Option<LeaseError>,
}

/// One acquire attempt (one script call). Busy, or unreachable within
/// `outage_tolerance`, it returns the
/// state to go on waiting from: the same permit id, a listener
/// registered *before* the script ran (so a release between the answer
/// and the wait is not missed), and how long to sleep at most.
pub(super) async fn first_attempt(inner: &Arc<Inner>) -> Result<Attempt, LeaseError> {
    attempt(inner, pending(inner, inner.fair), None).await
}

/// See [`first_attempt`]; `down_since` is when an
/// ongoing outage began.
async fn attempt(
    inner: &Arc<Inner>,
    mut pending: Pending,
    down_since: Option<Instant>,
) -> Result<Attempt, LeaseError> {
    attempt_with(inner, &mut pending, down_since, true)
        .await
        .map(|found| match found {
            Found::Granted(permit) => Attempt::Granted(permit),
            Found::Wait {
                listener,
                pause,
                down_since,
                cause,
                ..
            } => Attempt::Busy(Busy {
                pending,
                listener,
                pause,
                down_since,
                cause,
            }),
        })
}

async fn attempt_with(
    inner: &Arc<Inner>,
    pending: &mut Pending,
    down_since: Option<Instant>,
    tolerate: bool,
) -> Result<Found, LeaseError> {
    // A waiter in the fair line is woken through its slot only (its
    // grant, a lost subscription, `close`). Listening before the check
    // below: a `close` after the check wakes this listener.
    let listener = match &pending.slot {
        Some(slot) => slot.listen(),
        None => inner.signals.wake.listen(),
    };
    if inner.local.is_closed() {
        return Err(LeaseError::Closed);
    }
    let attempt_start = Instant::now();
    // The outage began when the first failed attempt did; it may last
    // until `outage_tolerance` after that, and no call runs past it
    // (but the first call of an outage, which nobody knew of when it
    // was sent, gets its whole response timeout).
    let since = down_since.unwrap_or(attempt_start);
    let bound = match tolerate {
        true => Bound {
            end: since + inner.outage_tolerance,
            cut_first: down_since.is_some(),
        },
        // `try_acquire`: no outage to ride out. Its first call gets the
        // whole response timeout, and a retry (of a call that failed
        // fast: a dropped connection) only what is left of it, so an
        // unanswering Redis costs one response timeout, not one per
        // retry.
        false => Bound {
            end: attempt_start + inner.response_timeout,
            cut_first: false,
        },
    };
    match grant(inner, pending, Some(bound)).await {
        Ok(Grant::Granted(permit)) => Ok(Found::Granted(permit)),
        Ok(Grant::Busy {
            retry_after,
            limit,
            quarantined,
            place,
        }) => Ok(Found::Wait {
            listener,
            // A lease that expires frees a permit for the line's first
            // `limit` waiters only; the others are served by the
            // releases and purges ahead of them (and look again every
            // `max_poll`, should a grant message be lost).
            pause: match place {
                Some(place) if place >= limit => pause(inner, None),
                _ => pause(inner, retry_after),
            },
            down_since: None,
            retry_after,
            limit,
            quarantined,
            cause: quarantined.then(|| LeaseError::Quarantined {
                retry_after: retry_after.unwrap_or_default(),
            }),
        }),
        Err(LeaseError::Unavailable(e)) if tolerate => {
            // `pending` keeps its id (a grant may have landed): the
            // next attempt returns that grant, or the id is released
            // when its owner ends.
            if since.elapsed() >= inner.outage_tolerance {
                return Err(LeaseError::Unavailable(e));
            }
            Ok(Found::Wait {
                listener,
                pause: pause(inner, Some(Duration::from_millis(100))),
                down_since: Some(since),
                retry_after: None,
                limit: inner.local.limit_seen(),
                quarantined: false,
                cause: Some(LeaseError::Unavailable(e)),
            })
        }
        Err(e) => Err(e),
    }
}

/// Goes on waiting after a busy [`attempt`], as
/// [`acquire`](super::RedisSemaphore::acquire) does after its first one. `down` keeps,
/// after each attempt, what kept that attempt from counting the permits,
/// if anything did (see [`Down`]).
pub(super) async fn wait_from(
    inner: &Arc<Inner>,
    busy: Busy,
    down: &Down,
) -> Result<LeasedPermit, LeaseError> {
    let Busy {
        mut pending,
        mut listener,
        mut pause,
        mut down_since,
        cause,
    } = busy;
    down.set(cause);
    loop {
        if let Some(permit) = announced(inner, &mut pending) {
            return Ok(permit);
        }
        let _ = Timeout::new(listener, inner.local.timer.sleep(pause)).await;
        if let Some(permit) = announced(inner, &mut pending) {
            return Ok(permit);
        }
        // An attempt that failed for good (denied, refused) ends the
        // wait with its error, which the caller keeps. A quarantine
        // counts as an outage: the permits cannot be counted meanwhile.
        match attempt_with(inner, &mut pending, down_since, true).await? {
            Found::Granted(permit) => return Ok(permit),
            Found::Wait {
                listener: next,
                pause: next_pause,
                down_since: since,
                cause,
                ..
            } => {
                down.set(cause);
                listener = next;
                pause = next_pause;
                down_since = since;
            }
        }
    }
}

/// The one attempt of [`try_acquire`](super::RedisSemaphore::try_acquire): no outage
/// tolerance, and a busy answer is [`LeaseError::NoPermits`].
pub(super) async fn sole_attempt(inner: &Arc<Inner>) -> Result<LeasedPermit, LeaseError> {
    let mut pending = pending(inner, false);
    match attempt_with(inner, &mut pending, None, false).await? {
        Found::Granted(permit) => Ok(permit),
        Found::Wait {
            quarantined: true,
            retry_after,
            ..
        } => Err(LeaseError::Quarantined {
            retry_after: retry_after.unwrap_or_default(),
        }),
        Found::Wait {
            retry_after, limit, ..
        } => Err(LeaseError::NoPermits { retry_after, limit }),
    }
}

/// A new permit id; with `join`, one that joins the fair line when no
/// permit is free (registered in the local line at once: its grant may
/// be announced before the answer that put it in line is read).
fn pending(inner: &Arc<Inner>, join: bool) -> Pending {
    let id = inner.ids.next();
    let slot = join.then(|| inner.signals.line.join(&id, Instant::now()));
    Pending {
        inner: inner.clone(),
        id,
        maybe_granted: false,
        sent: false,
        queued: false,
        slot,
    }
}

/// The permit whose grant from the fair line was announced to
/// `pending`'s slot, taken without a script call. The lease counts
/// from the latest call that found the id still waiting (the grant
/// came after it, so this deadline is before Redis's); if that leaves
/// less than half a lease's life, `None`: the acquire script then runs
/// again with the same id, returns the grant and extends the lease.
fn announced(inner: &Arc<Inner>, pending: &mut Pending) -> Option<LeasedPermit> {
    let (fence, limit, since) = pending.slot.as_ref()?.take()?;
    inner.local.saw_limit(limit);
    // With `replicas`, the acquire script runs again instead: its write
    // (the lease extended) comes after the grant, so the `WAIT` after it
    // covers the grant too.
    if (since + inner.life).saturating_duration_since(Instant::now()) < inner.life / 2
        || inner.failover.replicas.is_some()
    {
        return None;
    }
    inner.fence_seen.fetch_max(fence, Ordering::Relaxed);
    pending.settle();
    let lease =
        inner
            .local
            .held
            .granted(core::mem::take(&mut pending.id), fence, since, inner.life);
    Some(LeasedPermit::new(RedisSemaphore::of(inner), lease))
}

/// How long a waiter sleeps before trying again, unless woken sooner:
/// until the earliest lease expires, capped by `max_poll`, plus a little
/// jitter so that waiters across processes do not retry in lockstep.
fn pause(inner: &Inner, retry_after: Option<Duration>) -> Duration {
    let base = retry_after.map_or(inner.max_poll, |r| r.min(inner.max_poll));
    let jitter_ms = inner.ids.random() % (base.as_millis() as u64 / 10 + 1);
    base + Duration::from_millis(jitter_ms + 1)
}

/// Runs the acquire script for `pending`'s id, retrying a transient
/// failure with the same id (a retry of a grant that did happen returns
/// that same grant). With a `bound`, no call or back-off runs past its
/// end. Any other failure (a denied call, refused credentials, a
/// failed script) is returned at once.
async fn grant(
    inner: &Arc<Inner>,
    pending: &mut Pending,
    bound: Option<Bound>,
) -> Result<Grant, LeaseError> {
    let mut attempt = 0;
    loop {
        pending.maybe_granted = true;
        let sent = Instant::now();
        let first = !pending.sent;
        pending.sent = true;
        let mut conn = inner.grant_conn();
        let script = async {
            // After a transient failure, the server's identity first
            // (a promotion sets the loss flag sent below).
            if inner.failover.is_suspect() {
                inner.check_identity().await?;
            }
            let mut call = Call::new(&inner.scripts.acquire, &inner.keys.all(), 10);
            call.arg(&pending.id)
                .arg(inner.ttl.as_millis() as u64)
                .arg(inner.default_limit)
                .arg(&inner.label)
                .arg(inner.fence_seen.load(Ordering::Relaxed))
                .arg(inner.quarantine_ms)
                .arg(u8::from(pending.slot.is_some()))
                .arg(&inner.token)
                .arg(&*inner.failover.epoch())
                .arg(inner.failover.loss_flag())
                .arg(u8::from(first));
            match &inner.failover.replicas {
                None => call.invoke(&mut conn).await.map(|reply| (reply, None)),
                // `WAIT` in the same pipeline: it runs on the connection
                // (and the node) that ran the script, whatever happens
                // to the connection afterwards.
                Some(r) => call
                    .invoke_then(&mut conn, &r.wait)
                    .await
                    .map(|(reply, acked)| (reply, Some(acked))),
            }
        };
        let cut = bound.and_then(|b| (attempt > 0 || b.cut_first).then_some(b.end));
        let answer: redis::RedisResult<(AcquireReply, Option<redis::Value>)> = match cut {
            None => script.await,
            Some(end) => {
                // (The bound is the script's: a `WAIT` in its pipeline
                // may take its own timeout on top, as it would after it.)
                let wait = inner.failover.replicas.as_ref().map(|r| r.timeout);
                let left = end.saturating_duration_since(sent) + wait.unwrap_or_default();
                Timeout::new(script, inner.local.timer.sleep(left))
                    .await
                    .unwrap_or_else(|_elapsed| Err(outage_over()))
            }
        };
        match answer {
            Ok((
                AcquireReply {
                    granted,
                    fence,
                    ms,
                    limit,
                    quarantined,
                    queued,
                    epoch,
                },
                acked,
            )) => {
                let limit = usize::try_from(limit).unwrap_or(0);
                inner.local.saw_limit(limit);
                if quarantined == 1 || epoch.is_some() {
                    // Grants are quarantined, or the loss this client
                    // would have found was: the marker the server has now.
                    inner.failover.adopt(epoch);
                }
                if granted == 0 {
                    pending.maybe_granted = false;
                    pending.queued = queued > 0;
                    if let Some(slot) = pending.slot.as_ref().filter(|_| queued > 0) {
                        slot.still_waiting(sent);
                    }
                    return Ok(Grant::Busy {
                        retry_after: u64::try_from(ms).ok().map(Duration::from_millis),
                        limit,
                        quarantined: quarantined == 1,
                        place: usize::try_from(queued - 1).ok(),
                    });
                }
                inner.fence_seen.fetch_max(fence, Ordering::Relaxed);
                // Too few replicas: `pending` is still marked, and its
                // drop releases the grant.
                if let Some(acked) = acked {
                    inner.replicated(acked)?;
                }
                pending.settle();
                let lease = inner.local.held.granted(
                    core::mem::take(&mut pending.id),
                    fence,
                    sent,
                    inner.life,
                );
                pending.maybe_granted = false;
                return Ok(Grant::Granted(LeasedPermit::new(
                    RedisSemaphore::of(inner),
                    lease,
                )));
            }
            Err(e) if attempt < inner.retries && classify(&e) == Failure::Transient => {
                inner.failover.suspect();
                attempt += 1;
                let mut backoff = Duration::from_millis(20 << attempt.min(6));
                if let Some(b) = bound {
                    let left = b.end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(LeaseError::Unavailable(e));
                    }
                    backoff = backoff.min(left);
                }
                inner.local.timer.sleep(backoff).await;
            }
            // `pending` is still marked: its drop releases the id (a
            // script that failed half-way may have granted it).
            Err(e) => {
                if classify(&e) == Failure::Transient {
                    inner.failover.suspect();
                }
                return Err(LeaseError::of(e));
            }
        }
    }
}

/// Where an outage tolerance ends, for [`grant`]'s calls.
#[derive(Clone, Copy)]
struct Bound {
    end: Instant,
    /// Whether the first call is cut at `end` too: not when it opens the
    /// outage (it gets its whole response timeout, as nobody knew Redis
    /// was down when it was sent).
    cut_first: bool,
}

/// The error of a call cut short because the outage tolerance ran out.
fn outage_over() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from redis within the outage tolerance",
    )
    .into()
}

/// A permit id on its way to becoming a grant. If the future that owns it
/// is dropped while a grant may have happened (a script call in flight, or
/// failed ambiguously) or while it waits in the fair line (where a release
/// may grant it at any moment), the id is released in the background: the
/// release script takes it out of the line, and hands a permit that was
/// granted to it to the next waiter.
struct Pending {
    inner: Arc<Inner>,
    id: String,
    maybe_granted: bool,
    /// A call with the id was sent (not the first any more: it may hold a
    /// lease or stand in the line, which the acquire script then looks up).
    sent: bool,
    /// The last answer put (or kept) the id in the fair line.
    queued: bool,
    /// Its place in this process's line, while it may join or wait in the
    /// fair line.
    slot: Option<Arc<Slot>>,
}

impl Pending {
    /// The id became a permit: it waits no more.
    fn settle(&mut self) {
        self.queued = false;
        if self.slot.take().is_some() {
            self.inner.signals.line.leave(&self.id);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.slot.take().is_some() {
            self.inner.signals.line.leave(&self.id);
        }
        if self.maybe_granted || self.queued {
            RedisSemaphore::of(&self.inner).release_in_background(core::mem::take(&mut self.id));
        }
    }
}
