//! The lease keeper: renews this process's leases, and turns pub/sub
//! messages into local wake-ups. Both run as background tasks that hold
//! only weak references, and stop once the last handle is dropped.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use event_listener::{Event, IntoNotification};
use futures_core::Stream;

use super::conn::Subscriber;
use super::error::LostReason;
use super::semaphore::Inner;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// Wake-ups shared by the semaphore's handles and its background tasks.
#[derive(Default)]
pub(super) struct Signals {
    /// Notified when permits may have come free (a pub/sub message, a
    /// (re)subscription, `close`).
    pub(super) wake: Event,
    /// Set, and `shutdown` notified, when the last handle is gone.
    stopped: AtomicBool,
    shutdown: Event,
}

impl Signals {
    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.signals.stopped.store(true, Ordering::SeqCst);
        self.signals.shutdown.notify(usize::MAX);
    }
}

/// Starts the renewer, and the subscriber unless `pubsub` is off (then
/// waiters poll).
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
            inner.keys.channel.clone(),
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
        pause = match inner.renew_all().await {
            Some(earliest) => every.min(earliest.saturating_duration_since(Instant::now())),
            None => every,
        }
        .max(Duration::from_millis(1));
    }
}

impl Inner {
    /// One round of renewals; returns the earliest local deadline of the
    /// leases still held, if any.
    async fn renew_all(&self) -> Option<Instant> {
        // A lease lost meanwhile (its deadline passed) is not renewed, and
        // no longer kept here.
        // (Checked outside the map's lock: finding a lease lost wakes its
        // `lost()` futures.)
        let held: Vec<_> = self.lock_leases().values().cloned().collect();
        let (leases, lost): (Vec<_>, Vec<_>) =
            held.into_iter().partition(|l| l.lost_reason().is_none());
        for lease in &lost {
            self.forget_lease(&lease.id);
        }
        for chunk in leases.chunks(512) {
            let chunk: Vec<_> = chunk.iter().filter(|l| l.sending()).cloned().collect();
            if chunk.is_empty() {
                continue;
            }
            let sent = Instant::now();
            let mut call = self.keys.call(&self.scripts.renew);
            call.arg(self.ttl.as_millis() as u64);
            for lease in &chunk {
                call.arg(&lease.id);
            }
            // A renewal may not outlast the earliest lease it renews: past
            // that deadline the lease is lost (its holder knew at once),
            // and an answer read later would not bring it back.
            let earliest = chunk.iter().map(|l| l.deadline()).min().unwrap_or(sent);
            let budget = earliest.saturating_duration_since(sent);
            let mut conn = self.conn.clone();
            let renewal = call.invoke_async(&mut conn);
            let answer: Option<redis::RedisResult<Vec<i64>>> =
                Timeout::new(renewal, self.timer.sleep(budget)).await.ok();
            match answer {
                Some(Ok(ttls)) => {
                    let mut forgotten = false;
                    for (lease, ttl) in chunk.iter().zip(ttls) {
                        if ttl > 0 {
                            lease.renewed(sent, self.life);
                        } else {
                            // Sent before the holder's own deadline, which
                            // comes before Redis's: Redis should still
                            // have had it, and lost it. Unless its holder
                            // gave it back meanwhile (a release is sent
                            // only once the lease is out of the map).
                            forgotten |= sent < lease.deadline()
                                && self.lock_leases().contains_key(&lease.id);
                            self.lost(lease, LostReason::Expired);
                        }
                    }
                    if forgotten && self.quarantine_ms > 0 {
                        self.start_quarantine().await;
                    }
                }
                Some(Err(_)) | None => {
                    // Out of reach: each lease stays unanswered, and is
                    // lost (`Unreachable`) when its deadline passes, unless
                    // a later round gets through first.
                    for lease in &chunk {
                        if lease.lost_reason().is_some() {
                            self.forget_lease(&lease.id);
                        }
                    }
                }
            }
        }
        self.lock_leases().values().map(|l| l.deadline()).min()
    }

    /// Redis forgot a lease it should still hold (a restart without
    /// persistence, a failover to a replica that was behind): stops new
    /// grants to every client for one quarantine (see the acquire script).
    /// Best effort: if this call fails, the next acquire of a client that
    /// was granted a lost fence still starts it.
    async fn start_quarantine(&self) {
        let mut call = self.keys.call(&self.scripts.quarantine);
        call.key(&self.keys.quarantine)
            .arg(self.fence_seen.load(Ordering::Relaxed))
            .arg(self.quarantine_ms);
        let mut conn = self.conn.clone();
        let within = self.timer.sleep(self.renew_every);
        let _: Result<redis::RedisResult<i64>, _> =
            Timeout::new(call.invoke_async(&mut conn), within).await;
    }

    fn lost(&self, lease: &super::permit::Lease, reason: LostReason) {
        lease.mark_lost(reason);
        self.forget_lease(&lease.id);
    }
}

/// Keeps one subscription to the semaphore's channel and wakes local
/// waiters for each message: `free n` wakes `n` more of them. Whenever the
/// subscription is (re)made or lost, every waiter is woken, since messages
/// may have been missed. Waiters never depend on this: they also retry at
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
            loop {
                match (NextOrStop {
                    stream: &mut messages,
                    signals: &signals,
                    listener: None,
                })
                .await
                {
                    Next::Message(n) => {
                        signals.wake.notify(n.additional());
                    }
                    Next::Ended => break,
                    Next::Stopped => return,
                }
            }
        }
        signals.wake.notify(usize::MAX);
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
    /// A wake-up for this many waiters.
    Message(usize),
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

impl<S: Stream<Item = usize> + Unpin> Future for NextOrStop<'_, S> {
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
