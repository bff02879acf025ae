//! How this process's waiters learn that a permit may be free: messages
//! through pub/sub, or their own polls when no message can come. The
//! subscriber (`keeper`) decides which; this keeps what it decided for the
//! handles to read, and tells a change through the metrics and a log event.

use core::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// How this process's waiters are woken when a permit may be free: read
/// with [`RedisSemaphore::wakeups`](super::RedisSemaphore::wakeups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wakeups {
    /// Through pub/sub: the subscription is made and has delivered a
    /// message (a release in another process reaches a waiter here in
    /// about a millisecond).
    PubSub,
    /// By polling: no subscription delivers messages (`pubsub(false)`, the
    /// channel rights taken away, the connection lost and not yet made
    /// again), or the subscription has not delivered its first message yet
    /// (a few milliseconds after `build`). A waiter looks again at the
    /// earliest lease deadline and at least every `max_poll`, so a release
    /// elsewhere reaches it up to `max_poll` later.
    Polling,
}

/// Why the subscriber found that no message can come.
pub(super) enum Silence {
    /// Connecting or subscribing failed (no rights on the channel, Redis
    /// out of reach).
    Refused(redis::RedisError),
    /// The subscription's connection ended.
    Ended,
    /// The probe could not be published.
    Unpublished(redis::RedisError),
    /// The subscription is made, but the probe published on its channel
    /// did not come back within this long: the server does not deliver
    /// (a refused `SUBSCRIBE` looks made to the redis crate).
    Unheard(Duration),
}

impl fmt::Display for Silence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(e) => write!(f, "subscribing failed: {e}"),
            Self::Ended => f.write_str("the subscription's connection ended"),
            Self::Unpublished(e) => write!(f, "the probe could not be published: {e}"),
            Self::Unheard(within) => write!(
                f,
                "a message published on the channel did not arrive within {within:?}"
            ),
        }
    }
}

/// What the subscriber decided, for the handles to read: `Polling` until
/// the first message comes through a subscription, and always when no
/// subscriber runs.
pub(super) struct State(AtomicU8);

/// `Polling`, before the first message: the gauge is set at that
/// message, and nothing is told before.
const UNHEARD: u8 = 0;
/// `PubSub`.
const HEARD: u8 = 1;
/// `Polling`: the subscription's connection ended, and is being made
/// again (as after a restart or a failover).
const ENDED: u8 = 2;
/// `Polling`: no subscription could be made that delivers.
const SILENT: u8 = 3;

impl State {
    pub(super) fn new(pubsub: bool) -> Self {
        Self(AtomicU8::new(if pubsub { UNHEARD } else { SILENT }))
    }

    pub(super) fn get(&self) -> Wakeups {
        match self.0.load(Ordering::Acquire) {
            HEARD => Wakeups::PubSub,
            _ => Wakeups::Polling,
        }
    }

    /// No message can come, for `why`: told if that is news. An ended
    /// connection is told once, and so is a failure to make one that
    /// delivers, even right after an ended one.
    pub(super) fn silent(&self, name: &str, why: &Silence, max_poll: Duration) {
        let now = match why {
            Silence::Ended => ENDED,
            _ => SILENT,
        };
        let was = self.0.swap(now, Ordering::AcqRel);
        if was != now && was != SILENT {
            told_silent(name, why, max_poll, matches!(was, UNHEARD | HEARD));
        }
    }

    /// A message came: the gauge set at the first, and a change told.
    pub(super) fn heard(&self, name: &str) {
        match self.0.swap(HEARD, Ordering::AcqRel) {
            HEARD => {}
            was => told_heard(name, was != UNHEARD),
        }
    }
}

/// The gauge of the way waiters are woken: 1 through pub/sub, 0 polling.
#[cfg(feature = "metrics")]
const GAUGE: &str = "bulkhead_redis_pubsub_up";
/// The counter of the times wake-ups fell back to polling.
#[cfg(feature = "metrics")]
const FALLBACKS: &str = "bulkhead_redis_pubsub_lost_total";

#[cold]
// What each is told with depends on the features on.
#[cfg_attr(not(all(feature = "metrics", feature = "tracing")), allow(unused))]
fn told_silent(name: &str, why: &Silence, max_poll: Duration, fell_back: bool) {
    #[cfg(feature = "metrics")]
    if fell_back {
        describe();
        let semaphore = name.to_owned();
        metrics::gauge!(GAUGE, "semaphore" => semaphore.clone()).set(0.0);
        metrics::counter!(FALLBACKS, "semaphore" => semaphore).increment(1);
    }
    // A connection that ended (a restart, a failover) is made again at
    // once; the others are what an operator must look at.
    #[cfg(feature = "tracing")]
    match why {
        Silence::Ended => tracing::info!(
            target: "watertight::redis",
            semaphore = name,
            cause = %why,
            ?max_poll,
            "wake-ups through pub/sub stopped; waiters poll",
        ),
        _ => tracing::warn!(
            target: "watertight::redis",
            semaphore = name,
            cause = %why,
            ?max_poll,
            "wake-ups through pub/sub stopped; waiters poll",
        ),
    }
}

#[cold]
// What each is told with depends on the features on.
#[cfg_attr(not(all(feature = "metrics", feature = "tracing")), allow(unused))]
fn told_heard(name: &str, resumed: bool) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::gauge!(GAUGE, "semaphore" => name.to_owned()).set(1.0);
    }
    #[cfg(feature = "tracing")]
    if resumed {
        tracing::info!(
            target: "watertight::redis",
            semaphore = name,
            "wake-ups through pub/sub resumed",
        );
    }
}

#[cfg(feature = "metrics")]
fn describe() {
    metrics::describe_gauge!(
        GAUGE,
        "1 while waiters are woken through pub/sub, 0 while they poll"
    );
    metrics::describe_counter!(
        FALLBACKS,
        "Times the wake-ups through pub/sub stopped and waiters fell back to polling"
    );
}
