//! The lease keeper: renews this process's leases, and turns pub/sub
//! messages into local wake-ups. Both run as background tasks that hold
//! only weak references, and stop once the last handle is dropped.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use event_listener::IntoNotification;
use futures_core::Stream;

use super::conn::{Subscriber, Wake};
use super::error::LostReason;
use super::inner::Inner;
use super::lease::Lease;
use super::line::Slot;
use super::signals::Signals;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// Starts the renewer, and the subscriber unless `pubsub` is off (then
/// waiters poll): to this process's own channel in fair mode (where its
/// waiters' grants are announced), to the shared one otherwise.
pub(super) fn start(inner: &Arc<Inner>, subscriber: Subscriber, pubsub: bool) {
    let weak = Arc::downgrade(inner);
    inner.spawner.spawn(renew_loop(
        weak,
        inner.timer.clone(),
        inner.renew_every,
        inner.signals.clone(),
    ));
    if pubsub {
        inner.spawner.spawn(pubsub_loop(
            subscriber,
            inner.channel(),
            inner.signals.clone(),
            inner.timer.clone(),
        ));
    }
}

/// Renews every lease this process holds, every `every`, in one script
/// call per round (in chunks, for very many leases).
async fn renew_loop(
    weak: Weak<Inner>,
    timer: Arc<dyn Timer>,
    every: Duration,
    signals: Arc<Signals>,
) {
    let mut pause = every;
    loop {
        if !sleep_unless_stopped(&*timer, pause, &signals).await {
            return;
        }
        let Some(inner) = weak.upgrade() else { return };
        // Renew, then sleep `every` or until the earliest local deadline,
        // whichever is first: a lease whose renewals keep failing is
        // forgotten at its deadline, not a round later. (It is lost at that
        // instant whether this task runs or not: see `Lease`.)
        pause = match renew_all(&inner).await {
            Some(earliest) => every.min(earliest.saturating_duration_since(Instant::now())),
            None => every,
        }
        .max(Duration::from_millis(1));
    }
}

/// One round of renewals; returns the earliest local deadline of the
/// leases still held, if any.
async fn renew_all(inner: &Inner) -> Option<Instant> {
    // A lease lost meanwhile (its deadline passed) is not renewed, and
    // no longer kept here.
    // (Checked outside the map's lock: finding a lease lost wakes its
    // `lost()` futures.)
    let held: Vec<_> = inner.lock_leases().values().cloned().collect();
    let (leases, gone): (Vec<_>, Vec<_>) =
        held.into_iter().partition(|l| l.lost_reason().is_none());
    for lease in &gone {
        inner.forget_lease(&lease.id);
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
            Timeout::new(renewal, inner.timer.sleep(budget)).await.ok();
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
                        let released = !inner.lock_leases().contains_key(&lease.id);
                        forgotten |= answered < lease.deadline() && !released;
                        lost(inner, lease, LostReason::Expired);
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
                        inner.forget_lease(&lease.id);
                    }
                }
            }
        }
    }
    if let Some(beats) = waiting {
        heartbeat(inner, &beats).await;
    }
    inner.lock_leases().values().map(|l| l.deadline()).min()
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
    let within = inner.timer.sleep(inner.renew_every);
    let answer: Result<redis::RedisResult<Vec<i64>>, _> =
        Timeout::new(call.invoke_async(&mut conn), within).await;
    if let Ok(Ok(answers)) = answer {
        beaten(beats, &answers, sent);
    }
}

fn lost(inner: &Inner, lease: &Lease, reason: LostReason) {
    lease.mark_lost(reason);
    inner.forget_lease(&lease.id);
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

/// Keeps one subscription to the semaphore's channel (or this process's)
/// and wakes local waiters for each message: `free n` wakes `n` more of
/// them, `grant id fence ttl limit` the waiter `id`. Whenever the subscription
/// is (re)made or lost, every waiter is woken, since messages may have
/// been missed. Waiters never depend on this: they also retry at
/// the earliest lease deadline and at least every `max_poll`.
async fn pubsub_loop(
    subscriber: Subscriber,
    channel: String,
    signals: Arc<Signals>,
    timer: Arc<dyn Timer>,
) {
    let mut backoff = Duration::from_millis(50);
    while !signals.is_stopped() {
        if let Some(mut messages) = subscriber.subscribe(&channel).await {
            backoff = Duration::from_millis(50);
            signals.wake.notify(usize::MAX);
            signals.line.wake_all();
            loop {
                match (NextOrStop {
                    stream: &mut messages,
                    signals: &signals,
                    listener: None,
                })
                .await
                {
                    Next::Message(Wake::Free(usize::MAX)) => {
                        signals.wake.notify(usize::MAX);
                        signals.line.wake_all();
                    }
                    Next::Message(Wake::Free(n)) => {
                        signals.wake.notify(n.additional());
                    }
                    Next::Message(Wake::Granted { id, fence, limit }) => {
                        signals.line.granted(&id, fence, limit);
                    }
                    Next::Ended => break,
                    Next::Stopped => return,
                }
            }
        }
        signals.wake.notify(usize::MAX);
        signals.line.wake_all();
        if !sleep_unless_stopped(&*timer, backoff, &signals).await {
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
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
    Ended,
    Stopped,
}

/// The next pub/sub message, or the end of the subscription, or the
/// semaphore's shutdown, whichever comes first.
struct NextOrStop<'a, S> {
    stream: &'a mut S,
    signals: &'a Signals,
    listener: Option<event_listener::EventListener>,
}

impl<S: Stream<Item = Wake> + Unpin> Future for NextOrStop<'_, S> {
    type Output = Next;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Next> {
        let this = &mut *self;
        if let Poll::Ready(item) = Pin::new(&mut *this.stream).poll_next(cx) {
            return Poll::Ready(item.map_or(Next::Ended, Next::Message));
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
