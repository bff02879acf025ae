//! The cluster backend: one `ClusterConnection` for the scripts and the
//! sharded subscription.

use core::future::Future;
use core::task::{Context, Poll};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use event_listener::{Event, EventListener};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, PushInfo, PushKind, RedisFuture, Value};

use super::{
    Conn, Connected, Settings, Subscriber, Subscription, Wake, no_answer, on_channel, parse_wake,
};
use crate::redis::error::ConfigError;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// The most wake-ups kept for the subscriber; past it they collapse into
/// one that wakes every waiter.
const MAX_QUEUED: usize = 1024;

/// What the cluster connection pushed, for the subscriber task.
#[derive(Default)]
pub(in crate::redis) struct Pushes {
    state: Mutex<State>,
    /// Notified for every push.
    event: Event,
    /// With the quarantine on: set when a connection to a node dropped
    /// (the node may have died, and a replica be promoted in its place),
    /// for the next grant to read the server's identity first.
    suspect: Option<Arc<std::sync::atomic::AtomicBool>>,
}

#[derive(Default)]
struct State {
    /// What each message asks for.
    wakes: VecDeque<Wake>,
    /// Set when the subscription was lost (the connection to the
    /// channel's node dropped, or the node dropped the subscription
    /// because the slot moved), until the subscriber subscribes again.
    lost: bool,
}

impl Pushes {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by the connection for every push (never blocks).
    fn push(&self, info: PushInfo) {
        let wake = match info.kind {
            PushKind::SMessage | PushKind::Message => match info.data.get(1) {
                Some(Value::BulkString(payload)) => parse_wake(payload),
                _ => Wake::Free(usize::MAX),
            },
            // A (re)subscription: messages may have been missed.
            PushKind::SSubscribe => Wake::Free(usize::MAX),
            PushKind::SUnsubscribe | PushKind::Disconnection => {
                if let (PushKind::Disconnection, Some(suspect)) = (&info.kind, &self.suspect) {
                    suspect.store(true, std::sync::atomic::Ordering::Release);
                }
                let mut state = self.lock();
                state.lost = true;
                state.wakes.push_back(Wake::Free(usize::MAX));
                drop(state);
                self.event.notify(usize::MAX);
                return;
            }
            _ => return,
        };
        let mut state = self.lock();
        if state.wakes.len() >= MAX_QUEUED {
            // (Grants dropped here are found by the waiters, which all
            // look again.)
            state.wakes.clear();
            state.wakes.push_back(Wake::Free(usize::MAX));
        } else {
            state.wakes.push_back(wake);
        }
        drop(state);
        self.event.notify(usize::MAX);
    }

    pub(super) fn poll_next(
        &self,
        listener: &mut Option<EventListener>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Wake>> {
        loop {
            {
                let mut state = self.lock();
                if let Some(wake) = state.wakes.pop_front() {
                    return Poll::Ready(Some(wake));
                }
                if state.lost {
                    return Poll::Ready(None);
                }
            }
            match listener {
                None => *listener = Some(self.event.listen()),
                Some(l) => {
                    if core::pin::Pin::new(l).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    *listener = None;
                }
            }
        }
    }
}

pub(super) async fn connect(
    client: ClusterClient,
    settings: &Settings,
) -> Result<Connected, ConfigError> {
    let pushes = Arc::new(Pushes {
        suspect: settings.suspect.clone(),
        ..Pushes::default()
    });
    let config = ClusterConfig::new()
        .set_connection_timeout(settings.response_timeout)
        .set_response_timeout(settings.response_timeout);
    let conn = if settings.pubsub {
        let sink = pushes.clone();
        let with_pushes = config.clone().set_push_sender(move |info: PushInfo| {
            sink.push(info);
            Ok::<(), core::convert::Infallible>(())
        });
        match client.get_async_connection_with_config(with_pushes).await {
            Ok(conn) => conn,
            // The redis crate refuses a push sender on a RESP2
            // connection, and reports it as a failed connection: if one
            // without succeeds, RESP3 is what is missing.
            Err(e) => match client.get_async_connection_with_config(config).await {
                Ok(_) => return Err(ConfigError::NeedsResp3(e)),
                Err(_) => return Err(ConfigError::of(e)),
            },
        }
    } else {
        client
            .get_async_connection_with_config(config)
            .await
            .map_err(ConfigError::of)?
    };
    // With `replicas`: the grants' own connections (one per node, as the
    // shared ones), whose `WAIT` holds up no renewal; no pushes on them.
    let grant_conn = match settings.wait {
        None => None,
        Some(wait) => {
            let config = ClusterConfig::new()
                .set_connection_timeout(settings.response_timeout)
                .set_response_timeout(settings.response_timeout + wait);
            let grants = client
                .get_async_connection_with_config(config)
                .await
                .map_err(ConfigError::of)?;
            Some(Conn::Cluster(Bounded::new(
                grants,
                settings.timer.clone(),
                settings.response_timeout + wait,
            )))
        }
    };
    Ok(Connected {
        conn: Conn::Cluster(Bounded::new(
            conn.clone(),
            settings.timer.clone(),
            settings.response_timeout,
        )),
        subscriber: Subscriber::Cluster { conn, pushes },
        publish: "SPUBLISH",
        grant_conn,
    })
}

/// `SPUBLISH` of a wake-up for no one, then the `SSUBSCRIBE` that the
/// subscriber keeps (both routed by the channel's slot).
pub(super) async fn check_channel(
    conn: &ClusterConnection,
    channel: &str,
) -> Result<(), ConfigError> {
    let mut conn = conn.clone();
    let _receivers: i64 = redis::cmd("SPUBLISH")
        .arg(channel)
        .arg("free 0")
        .query_async(&mut conn)
        .await
        .map_err(on_sharded)?;
    conn.ssubscribe(channel).await.map_err(|e| {
        if e.kind() == ErrorKind::InvalidClientConfig {
            ConfigError::NeedsResp3(e)
        } else {
            on_sharded(e)
        }
    })
}

/// A command the node does not know (Redis 6, or renamed away) is
/// `NoShardedPubSub`; anything else as [`on_channel`].
fn on_sharded(e: redis::RedisError) -> ConfigError {
    if is_unknown_command(&e) {
        ConfigError::NoShardedPubSub(e)
    } else {
        on_channel(e)
    }
}

/// Whether Redis answered `ERR unknown command …`.
fn is_unknown_command(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && e.detail().is_some_and(|d| d.starts_with("unknown command"))
}

pub(super) async fn subscribe(
    conn: &ClusterConnection,
    pushes: &Arc<Pushes>,
    channel: &str,
) -> redis::RedisResult<Subscription> {
    // Cleared before the `SSUBSCRIBE` is sent: a loss reported after it
    // ends the new subscription.
    pushes.lock().lost = false;
    conn.clone().ssubscribe(channel).await?;
    Ok(Subscription::Pushes {
        pushes: pushes.clone(),
        listener: None,
    })
}

/// A cluster connection whose every call is bounded by a timeout of its
/// own: the redis crate retries a call to a node it cannot reach (a dead
/// primary) until the slot map changes, for longer than its response
/// timeout (which bounds each try, not their sum, for a client built
/// without `overall_response_timeout`), and a call held that long would
/// run on a promoted replica before this client learns of the promotion.
/// A call cut short is dropped by the crate at its next try.
#[derive(Clone)]
pub(in crate::redis) struct Bounded {
    pub(super) conn: ClusterConnection,
    timer: Arc<dyn Timer>,
    within: Duration,
}

impl Bounded {
    pub(super) fn new(conn: ClusterConnection, timer: Arc<dyn Timer>, within: Duration) -> Self {
        Self {
            conn,
            timer,
            within,
        }
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        Timeout::new(call, self.timer.sleep(self.within))
            .await
            .unwrap_or_else(|_elapsed| Err(no_answer()))
    }
}

impl ConnectionLike for Bounded {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            self.bounded(conn.req_packed_command(cmd)).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            self.bounded(conn.req_packed_commands(cmd, offset, count))
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}
