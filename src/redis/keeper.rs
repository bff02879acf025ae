//! The lease keeper: renews this process's leases, and turns pub/sub
//! messages into local wake-ups. Both run as background tasks that hold
//! only weak references, and stop once the last handle is dropped.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_listener::IntoNotification;
use futures_core::Stream;

use super::conn::{Conn, Subscriber, Subscription, Wake};
use super::error::LostReason;
use super::inner::Inner;
use super::line::Slot;
use super::signals::Signals;
use super::wakeups::Silence;
use crate::lease::renew_loop;
use crate::timer::timeout::Timeout;
use crate::timer::{Sleep, Timer};

/// Starts the renewer, and the subscriber unless `pubsub` is off (then
/// waiters poll): to this process's own channel in fair mode (where its
/// waiters' grants are announced), to the shared one otherwise. The
/// scripts publish with `publish`, and so does the subscriber's probe.
pub(super) fn start(
    inner: &Arc<Inner>,
    subscriber: Subscriber,
    publish: &'static str,
    pubsub: bool,
) {
    let (timer, signals) = (inner.local.timer.clone(), inner.signals.clone());
    let sleep = move |pause| {
        let (timer, signals) = (timer.clone(), signals.clone());
        async move { sleep_unless_stopped(&*timer, pause, &signals).await }
    };
    let round = |inner: Arc<Inner>| async move { renew_all(&inner).await };
    inner.spawner.spawn(renew_loop(
        Arc::downgrade(inner),
        inner.renew_every,
        sleep,
        round,
    ));
    if pubsub {
        inner.spawner.spawn(pubsub_loop(
            subscriber,
            Probe {
                conn: inner.conn.clone(),
                publish,
                channel: inner.channel(),
                within: inner.response_timeout,
            },
            inner.signals.clone(),
            inner.local.timer.clone(),
            Said {
                name: inner.local.name.clone(),
                max_poll: inner.max_poll,
            },
        ));
    }
}

/// One round of renewals; returns the earliest local deadline of the
/// leases still held, if any.
async fn renew_all(inner: &Inner) -> Option<Instant> {
    // A lease lost meanwhile (its deadline passed) is not renewed, and
    // no longer kept here.
    // (Checked outside the map's lock: finding a lease lost wakes its
    // `lost()` futures.)
    let (leases, gone): (Vec<_>, Vec<_>) = inner
        .local
        .held
        .snapshot()
        .into_iter()
        .partition(|l| l.lost_reason().is_none());
    for lease in &gone {
        inner.local.held.forget(&lease.id);
    }
    // The waiters in the fair line are heartbeaten in the first call
    // (or in one of their own if nothing is held).
    let mut waiting = Some(inner.signals.line.entries()).filter(|w| !w.is_empty());
    for chunk in leases.chunks(512) {
        let chunk: Vec<_> = chunk.iter().filter(|l| l.sending()).cloned().collect();
        if chunk.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let mut call = inner.keys.call_all(&inner.scripts.renew);
        call.arg(inner.ttl.as_millis() as u64);
        for lease in &chunk {
            call.arg(&lease.id);
        }
        let beats = waiting.take().unwrap_or_default();
        add_beats(&mut call, &beats);
        // A renewal may not outlast the earliest lease it renews: past
        // that deadline the lease is lost (its holder knew at once),
        // and an answer read later would not bring it back.
        let earliest = chunk.iter().map(|l| l.deadline()).min().unwrap_or(sent);
        let budget = earliest.saturating_duration_since(sent);
        let mut conn = inner.conn.clone();
        let renewal = call.invoke_async(&mut conn);
        let answer: Option<redis::RedisResult<Vec<i64>>> =
            Timeout::new(renewal, inner.local.timer.sleep(budget))
                .await
                .ok();
        match answer {
            Some(Ok(ttls)) => {
                let answered = Instant::now();
                let mut forgotten = false;
                beaten(&beats, ttls.get(chunk.len()..).unwrap_or(&[]), sent);
                for (lease, ttl) in chunk.iter().zip(ttls) {
                    if ttl > 0 {
                        lease.renewed(sent, inner.life);
                    } else {
                        // Answered before the holder's own deadline,
                        // which comes before Redis's: the renewal
                        // reached Redis before the lease could expire
                        // there, so Redis lost it. (Sent before the
                        // deadline is not enough: a renewal sent just
                        // before it may arrive after Redis's, on a
                        // loaded machine or a slow network.) Unless it
                        // was released meanwhile (a release forgets the
                        // lease before it is sent, and may reach Redis
                        // before this renewal did).
                        let released = !inner.local.held.holds(&lease.id);
                        forgotten |= answered < lease.deadline() && !released;
                        inner.local.held.lost(lease, LostReason::Expired);
                    }
                }
                if forgotten && inner.quarantine_ms > 0 {
                    // Redis forgot a lease it should still hold (a
                    // restart without persistence, a failover to a
                    // replica that was behind): stop new grants to
                    // every client for one quarantine. Best effort: if
                    // this call fails, the next acquire of a client
                    // granted a lost fence still starts it.
                    inner.quarantine_now().await;
                }
            }
            Some(Err(_)) | None => {
                // Out of reach: each lease stays unanswered, and is
                // lost (`Unreachable`) when its deadline passes, unless
                // a later round gets through first. The server may
                // come back as another (a promoted replica): the next
                // grant reads its identity first.
                inner.failover.suspect();
                for lease in &chunk {
                    if lease.lost_reason().is_some() {
                        inner.local.held.forget(&lease.id);
                    }
                }
            }
        }
    }
    if let Some(beats) = waiting {
        heartbeat(inner, &beats).await;
    }
    inner.local.held.earliest_deadline()
}

/// Heartbeats the waiters in the fair line when no lease is renewed
/// (one call; a failed one is not retried: an entry lives a whole lease
/// time to live, three rounds).
async fn heartbeat(inner: &Inner, beats: &[(String, Arc<Slot>)]) {
    let sent = Instant::now();
    let mut call = inner.keys.call_all(&inner.scripts.renew);
    call.arg(inner.ttl.as_millis() as u64);
    add_beats(&mut call, beats);
    let mut conn = inner.conn.clone();
    let within = inner.local.timer.sleep(inner.renew_every);
    let answer: Result<redis::RedisResult<Vec<i64>>, _> =
        Timeout::new(call.invoke_async(&mut conn), within).await;
    if let Ok(Ok(answers)) = answer {
        beaten(beats, &answers, sent);
    }
}

/// The waiter ids after the lease ids of a renewal (see the renew script).
fn add_beats(call: &mut redis::ScriptInvocation<'_>, beats: &[(String, Arc<Slot>)]) {
    if !beats.is_empty() {
        call.arg("");
        for (id, _) in beats {
            call.arg(id);
        }
    }
}

/// Reads the renew script's answers for the waiters of a heartbeat sent
/// at `sent`: still waiting (the grant, when it comes, came after `sent`),
/// or gone (the entry expired: the waiter looks again at once, and joins
/// the line anew unless it was granted meanwhile). A waiter found granted
/// gets its `grant` message, or looks again at its next poll.
fn beaten(beats: &[(String, Arc<Slot>)], answers: &[i64], sent: Instant) {
    for ((_, slot), answer) in beats.iter().zip(answers) {
        match answer {
            1 => slot.still_waiting(sent),
            0 => slot.wake(),
            _ => {}
        }
    }
}

/// How long a subscription may stay silent before it is probed.
const PROBE_AFTER: Duration = Duration::from_secs(10);

/// The longest wait before a subscription is made again after it failed
/// or proved silent.
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(10);

/// Proves that a subscription delivers: a message published on its
/// channel (`free 0`, which wakes no one, in any version of this crate)
/// must come back within `within`.
struct Probe {
    conn: Conn,
    publish: &'static str,
    channel: String,
    within: Duration,
}

impl Probe {
    async fn send(&self, timer: &dyn Timer) -> Result<(), Silence> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd(self.publish);
        cmd.arg(&self.channel).arg("free 0");
        let sent = cmd.query_async::<i64>(&mut conn);
        match Timeout::new(sent, timer.sleep(self.within)).await {
            Ok(Ok(_receivers)) => Ok(()),
            Ok(Err(e)) => Err(Silence::Unpublished(e)),
            Err(_elapsed) => Err(Silence::Unpublished(super::conn::no_answer())),
        }
    }
}

/// What a change of the way waiters are woken is told with.
struct Said {
    name: Arc<str>,
    max_poll: Duration,
}

/// Keeps one subscription to the semaphore's channel (or this process's)
/// and wakes local waiters for each message: `free n` wakes `n` more of
/// them, `grant id fence ttl limit` the waiter `id`. Whenever a
/// subscription starts or stops delivering, every waiter is woken, since
/// messages may have been missed. Waiters never depend on this: they also
/// retry at the earliest lease deadline and at least every `max_poll`.
///
/// A subscription is proved at once and after every `PROBE_AFTER` of
/// silence (see [`Probe`]): the server may refuse a `SUBSCRIBE` (channel
/// rights taken away after `build`) in a way the redis crate reports as
/// made, and then nothing would come. A subscription that fails, ends or
/// stays silent is made again, after a pause that grows to
/// `RESUBSCRIBE_MAX`; meanwhile waiters poll, and the state says so.
async fn pubsub_loop(
    subscriber: Subscriber,
    probe: Probe,
    signals: Arc<Signals>,
    timer: Arc<dyn Timer>,
    said: Said,
) {
    let mut backoff = Duration::from_millis(50);
    while !signals.is_stopped() {
        let mut delivered = false;
        let why = match subscriber.subscribe(&probe.channel).await {
            Ok(mut messages) => {
                let ended = deliver(&mut messages, &probe, &signals, &*timer, &said);
                match ended.await {
                    Delivered::Until(why) => why,
                    Delivered::Then(why) => {
                        delivered = true;
                        why
                    }
                    Delivered::Stopped => return,
                }
            }
            Err(e) => Silence::Refused(e),
        };
        signals.wakeups.silent(&said.name, &why, said.max_poll);
        if delivered {
            // Messages may be missed from now on: every waiter looks
            // again. A subscription that delivered and then ended (a
            // restart, a failover) is made again at once, as it was.
            signals.wake.notify(usize::MAX);
            signals.line.wake_all();
            backoff = Duration::from_millis(50);
        }
        if !sleep_unless_stopped(&*timer, backoff, &signals).await {
            return;
        }
        backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
    }
}

/// How a subscription's delivery ended.
enum Delivered {
    /// Before anything came through it, for this reason.
    Until(Silence),
    /// After messages came through it, for this reason.
    Then(Silence),
    /// The semaphore is gone.
    Stopped,
}

impl Delivered {
    fn ended(proved: bool, why: Silence) -> Self {
        match proved {
            true => Self::Then(why),
            false => Self::Until(why),
        }
    }
}

/// Wakes waiters for each message of a subscription until it ends or
/// proves silent. At its first message, every waiter is woken (messages
/// may have been missed before it).
async fn deliver(
    messages: &mut Subscription,
    probe: &Probe,
    signals: &Signals,
    timer: &dyn Timer,
    said: &Said,
) -> Delivered {
    // Probed at once: nothing has come through it yet.
    let mut check = timer.sleep(Duration::ZERO);
    let mut heard = false;
    let mut probed = false;
    let mut proved = false;
    loop {
        let next = NextOrStop {
            stream: &mut *messages,
            signals,
            listener: None,
            check: &mut check,
        }
        .await;
        match next {
            Next::Message(wake) => {
                heard = true;
                if !proved {
                    proved = true;
                    signals.wakeups.heard(&said.name);
                    signals.wake.notify(usize::MAX);
                    signals.line.wake_all();
                }
                match wake {
                    Wake::Free(usize::MAX) => {
                        signals.wake.notify(usize::MAX);
                        signals.line.wake_all();
                    }
                    Wake::Free(n) => {
                        signals.wake.notify(n.additional());
                    }
                    Wake::Granted { id, fence, limit } => {
                        signals.line.granted(&id, fence, limit);
                    }
                }
            }
            Next::Check if probed && !heard => {
                return Delivered::ended(proved, Silence::Unheard(probe.within));
            }
            Next::Check if heard => {
                // Something came since the last check: silent for no more
                // than `PROBE_AFTER` yet.
                heard = false;
                probed = false;
                check = timer.sleep(PROBE_AFTER);
            }
            Next::Check => {
                if let Err(why) = probe.send(timer).await {
                    return Delivered::ended(proved, why);
                }
                probed = true;
                check = timer.sleep(probe.within);
            }
            Next::Ended => return Delivered::ended(proved, Silence::Ended),
            Next::Stopped => return Delivered::Stopped,
        }
    }
}

/// Sleeps for `d`; returns `false` early if the semaphore is dropped.
async fn sleep_unless_stopped(timer: &dyn Timer, d: Duration, signals: &Signals) -> bool {
    let stop = signals.shutdown.listen();
    if signals.is_stopped() {
        return false;
    }
    let sleep = timer.sleep(d);
    match crate::timer::timeout::Timeout::new(stop, sleep).await {
        Ok(()) => false,
        Err(_elapsed) => !signals.is_stopped(),
    }
}

enum Next {
    /// A wake-up message.
    Message(Wake),
    /// The time to look at how long the subscription has been silent.
    Check,
    Ended,
    Stopped,
}

/// The next pub/sub message, or the end of the subscription, or the
/// semaphore's shutdown, or the `check` sleep's end, whichever comes
/// first.
struct NextOrStop<'a, S> {
    stream: &'a mut S,
    signals: &'a Signals,
    listener: Option<event_listener::EventListener>,
    check: &'a mut Sleep,
}

impl<S: Stream<Item = Wake> + Unpin> Future for NextOrStop<'_, S> {
    type Output = Next;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Next> {
        let this = &mut *self;
        if let Poll::Ready(item) = Pin::new(&mut *this.stream).poll_next(cx) {
            return Poll::Ready(item.map_or(Next::Ended, Next::Message));
        }
        if this.check.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Next::Check);
        }
        loop {
            if this.signals.is_stopped() {
                return Poll::Ready(Next::Stopped);
            }
            match &mut this.listener {
                None => this.listener = Some(this.signals.shutdown.listen()),
                Some(l) => {
                    if Pin::new(l).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.listener = None;
                }
            }
        }
    }
}
