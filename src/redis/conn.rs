//! [`Backend`]: the Redis deployment a semaphore lives on (one server, a
//! Redis Cluster, or the primary that Redis Sentinel names), and what
//! `build` makes of it: [`Conn`], the connection every script call goes
//! through, and [`Subscriber`], which keeps the wake-up subscription.
//!
//! # Implementation notes
//!
//! * **One server**: a `ConnectionManager` (reconnects by itself) for the
//!   scripts, and a pub/sub connection of its own for `SUBSCRIBE`.
//! * **Cluster**: one `cluster_async::ClusterConnection`, which routes each
//!   `EVALSHA` by its first key (all keys share the `{name}` hash tag, so the
//!   node that owns the slot runs the whole script), follows `MOVED` and
//!   `ASK`, and sends `SCRIPT LOAD` to every node on `NOSCRIPT`. The scripts
//!   publish with `SPUBLISH`; the same connection `SSUBSCRIBE`s the channel
//!   (RESP3 pushes), so the subscription is routed by the channel's slot, the
//!   semaphore's, to the node that owns it; the redis crate re-sends it after
//!   a reconnection or a slot-map refresh, and the subscriber sends it again
//!   whenever the node drops it (`sunsubscribe` after a slot moved) or the
//!   connection to it is lost.
//! * **Sentinel**: a `ConnectionManager` to the primary Sentinel names.
//!   A call that fails for a transient reason (no answer, `READONLY` from a
//!   demoted primary) asks Sentinel again in the background, at most every
//!   [`FIND_EVERY`]; a different primary replaces the connection, and ends
//!   the subscription, which is made again on the new primary. The failed
//!   call itself is retried by its caller (the acquire path's `retries` and
//!   `outage_tolerance`).

use core::fmt;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::error::ConfigError;
use super::spawn::Spawner;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;
#[cfg(feature = "redis-cluster")]
use cluster::Pushes;
#[cfg(feature = "redis-sentinel")]
use sentinel::{Moved, Primary};

/// Where a [`RedisSemaphore`](super::RedisSemaphore) keeps its leases: one
/// Redis server, a Redis Cluster, or the primary that Redis Sentinel names.
///
/// [`RedisSemaphore::builder`](super::RedisSemaphore::builder) takes
/// anything that converts into one: a `redis::Client` (one server), a
/// `redis::cluster::ClusterClient` (feature `redis-cluster`), or a
/// [`Backend::sentinel`] (feature `redis-sentinel`).
///
/// # Examples
///
/// ```no_run
/// use bulkhead::redis::{Backend, RedisSemaphore};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let one_server = redis::Client::open("redis://127.0.0.1/")?;
/// let sem = RedisSemaphore::builder(one_server, "partner-api").build().await?;
/// # let _ = sem;
/// # Ok(()) }
/// ```
pub struct Backend {
    kind: Kind,
}

enum Kind {
    Node(redis::Client),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster::ClusterClient),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(redis::sentinel::SentinelClient),
}

impl From<redis::Client> for Backend {
    /// One Redis server (or a proxy that looks like one).
    fn from(client: redis::Client) -> Self {
        Self {
            kind: Kind::Node(client),
        }
    }
}

#[cfg(feature = "redis-cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
impl From<redis::cluster::ClusterClient> for Backend {
    /// A Redis Cluster. For wake-ups through pub/sub the client must speak
    /// RESP3 (`redis://host:port/?protocol=3`, or
    /// `ClusterClientBuilder::use_protocol(ProtocolVersion::RESP3)`) and the
    /// nodes must run Redis 7 or later (sharded pub/sub); otherwise build
    /// with [`pubsub(false)`](super::RedisSemaphoreBuilder::pubsub).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use bulkhead::redis::RedisSemaphore;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let nodes = ["redis://10.0.0.5:7000/?protocol=3", "redis://10.0.0.6:7000/?protocol=3"];
    /// let cluster = redis::cluster::ClusterClient::new(nodes)?;
    /// let sem = RedisSemaphore::builder(cluster, "partner-api").build().await?;
    /// # let _ = sem;
    /// # Ok(()) }
    /// ```
    fn from(client: redis::cluster::ClusterClient) -> Self {
        Self {
            kind: Kind::Cluster(client),
        }
    }
}

#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
impl Backend {
    /// The primary that the Sentinels at `sentinels` name for
    /// `service_name`, with `node` for the connections to the Redis nodes
    /// themselves (credentials, TLS, database; `None` for the defaults).
    /// The semaphore follows the primary across failovers.
    ///
    /// # Errors
    ///
    /// The redis crate's error for a Sentinel address it cannot parse.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use bulkhead::redis::{Backend, RedisSemaphore};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = vec!["redis://10.0.0.5:26379/", "redis://10.0.0.6:26379/"];
    /// let primary = Backend::sentinel(sentinels, "mymaster", None)?;
    /// let sem = RedisSemaphore::builder(primary, "partner-api").build().await?;
    /// # let _ = sem;
    /// # Ok(()) }
    /// ```
    pub fn sentinel<T: redis::IntoConnectionInfo>(
        sentinels: Vec<T>,
        service_name: &str,
        node: Option<redis::sentinel::SentinelNodeConnectionInfo>,
    ) -> redis::RedisResult<Self> {
        let client = redis::sentinel::SentinelClient::build(
            sentinels,
            service_name.to_owned(),
            node,
            redis::sentinel::SentinelServerType::Master,
        )?;
        Ok(Self::from_sentinel_client(client))
    }

    /// A [`sentinel`](Self::sentinel) backend from a `SentinelClient` of
    /// your own (from `SentinelClientBuilder`, for credentials or TLS towards
    /// the Sentinels). It must be built for the primary
    /// (`SentinelServerType::Master`); `build` refuses a replica with
    /// [`ConfigError::NotPrimary`].
    pub fn from_sentinel_client(client: redis::sentinel::SentinelClient) -> Self {
        Self {
            kind: Kind::Sentinel(client),
        }
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Node(client) => f
                .debug_tuple("Backend::Node")
                .field(&client.get_connection_info().addr())
                .finish(),
            #[cfg(feature = "redis-cluster")]
            Kind::Cluster(_) => f.write_str("Backend::Cluster"),
            #[cfg(feature = "redis-sentinel")]
            Kind::Sentinel(_) => f.write_str("Backend::Sentinel"),
        }
    }
}

/// What `build` needs to connect (the one-server backend reads only the
/// response timeout).
pub(super) struct Settings {
    pub(super) response_timeout: Duration,
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) pubsub: bool,
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    pub(super) timer: std::sync::Arc<dyn Timer>,
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    pub(super) spawner: Spawner,
}

/// A backend, connected.
pub(super) struct Connected {
    pub(super) conn: Conn,
    pub(super) subscriber: Subscriber,
    /// The command the scripts publish wake-ups with.
    pub(super) publish: &'static str,
}

impl Backend {
    /// Makes the first connection (each within the response timeout).
    pub(super) async fn connect(self, settings: &Settings) -> Result<Connected, ConfigError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(settings.response_timeout))
            .set_connection_timeout(Some(settings.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        match self.kind {
            Kind::Node(client) => {
                let conn = client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(ConfigError::of)?;
                Ok(Connected {
                    conn: Conn::Node(conn),
                    subscriber: Subscriber::Node(client),
                    publish: "PUBLISH",
                })
            }
            #[cfg(feature = "redis-cluster")]
            Kind::Cluster(client) => cluster::connect(client, settings).await,
            #[cfg(feature = "redis-sentinel")]
            Kind::Sentinel(client) => sentinel::connect(client, config, settings).await,
        }
    }
}

/// The connection the scripts are sent on: cheap to clone, and every clone
/// shares the same connections.
#[derive(Clone)]
pub(super) enum Conn {
    Node(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<Primary>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) => Box::pin(primary.clone().request(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) => {
                Box::pin(primary.clone().request_pipeline(cmd, offset, count))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.get_db(),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) => primary.get_db(),
        }
    }
}

/// Makes the wake-up subscription, again whenever it is lost.
pub(super) enum Subscriber {
    /// One server: a pub/sub connection of its own.
    Node(redis::Client),
    /// A cluster: `SSUBSCRIBE` on the cluster connection, whose pushes land
    /// in `pushes`.
    #[cfg(feature = "redis-cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        pushes: std::sync::Arc<Pushes>,
    },
    /// Sentinel: a pub/sub connection to the current primary.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<Primary>),
}

impl Subscriber {
    /// `build`'s check that the user may publish on the channel (a wake-up
    /// for no one: `free 0`) and subscribe to it, within `timeout`.
    pub(super) async fn check(
        &self,
        channel: &str,
        timer: &dyn Timer,
        timeout: Duration,
    ) -> Result<(), ConfigError> {
        let check = async {
            match self {
                Self::Node(client) => check_node_channel(client, channel).await,
                #[cfg(feature = "redis-cluster")]
                Self::Cluster { conn, .. } => cluster::check_channel(conn, channel).await,
                #[cfg(feature = "redis-sentinel")]
                Self::Sentinel(primary) => check_node_channel(&primary.client(), channel).await,
            }
        };
        Timeout::new(check, timer.sleep(timeout))
            .await
            .unwrap_or_else(|_elapsed| Err(ConfigError::Connect(no_answer())))
    }

    /// A subscription to `channel`, or `None` if connecting or subscribing
    /// failed.
    pub(super) async fn subscribe(&self, channel: &str) -> Option<Subscription> {
        match self {
            Self::Node(client) => {
                let mut pubsub = client.get_async_pubsub().await.ok()?;
                pubsub.subscribe(channel).await.ok()?;
                Some(Subscription::Messages {
                    stream: Box::pin(pubsub.into_on_message()),
                    #[cfg(feature = "redis-sentinel")]
                    moved: None,
                })
            }
            #[cfg(feature = "redis-cluster")]
            Self::Cluster { conn, pushes } => cluster::subscribe(conn, pushes, channel).await,
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) => primary.subscribe(channel).await,
        }
    }
}

/// Checks the channel rights on a connection of its own that is closed
/// afterwards: `redis::aio::PubSub::subscribe` does not report a refused
/// `SUBSCRIBE`, and the shared connection must not be left subscribed.
async fn check_node_channel(client: &redis::Client, channel: &str) -> Result<(), ConfigError> {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(on_channel)?;
    let _receivers: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg("free 0")
        .query_async(&mut conn)
        .await
        .map_err(on_channel)?;
    let _subscribed: Value = redis::cmd("SUBSCRIBE")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .map_err(on_channel)?;
    Ok(())
}

/// A refused channel is `ChannelDenied`, not `Denied`.
fn on_channel(e: redis::RedisError) -> ConfigError {
    match ConfigError::of(e) {
        ConfigError::Denied(e) => ConfigError::ChannelDenied(e),
        other => other,
    }
}

/// The error of a check that Redis did not answer within the response
/// timeout.
pub(super) fn no_answer() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from redis within the response timeout",
    )
    .into()
}

/// How many waiters a wake-up message asks to wake: `free n` wakes `n`,
/// anything else (a malformed message) every one.
fn wake_count(payload: &[u8]) -> usize {
    core::str::from_utf8(payload)
        .ok()
        .and_then(|p| p.strip_prefix("free "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

/// A live subscription: yields how many local waiters to wake for each
/// message (`usize::MAX`: all of them), and ends when the subscription is
/// lost.
pub(super) enum Subscription {
    /// A pub/sub connection's messages; with Sentinel, it also ends when
    /// the primary changes.
    Messages {
        stream: Pin<Box<redis::aio::PubSubStream>>,
        #[cfg(feature = "redis-sentinel")]
        moved: Option<Moved>,
    },
    /// The cluster connection's pushes.
    #[cfg(feature = "redis-cluster")]
    Pushes {
        pushes: std::sync::Arc<Pushes>,
        listener: Option<event_listener::EventListener>,
    },
}

impl Stream for Subscription {
    type Item = usize;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        match self.get_mut() {
            Self::Messages {
                stream,
                #[cfg(feature = "redis-sentinel")]
                moved,
            } => {
                #[cfg(feature = "redis-sentinel")]
                if let Some(moved) = moved {
                    if moved.poll_moved(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                }
                stream
                    .as_mut()
                    .poll_next(cx)
                    .map(|msg| msg.map(|msg| wake_count(msg.get_payload_bytes())))
            }
            #[cfg(feature = "redis-cluster")]
            Self::Pushes { pushes, listener } => pushes.poll_next(listener, cx),
        }
    }
}

#[cfg(feature = "redis-cluster")]
mod cluster {
    //! The cluster backend: one `ClusterConnection` for the scripts and the
    //! sharded subscription.

    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex, PoisonError};

    use event_listener::{Event, EventListener};
    use redis::cluster::{ClusterClient, ClusterConfig};
    use redis::cluster_async::ClusterConnection;
    use redis::{ErrorKind, PushInfo, PushKind, Value};

    use super::{Conn, Connected, Settings, Subscriber, Subscription, on_channel, wake_count};
    use crate::redis::error::ConfigError;
    use core::task::{Context, Poll};

    /// The most wake-ups kept for the subscriber; past it they collapse into
    /// one that wakes every waiter.
    const MAX_QUEUED: usize = 1024;

    /// What the cluster connection pushed, for the subscriber task.
    #[derive(Default)]
    pub(in crate::redis) struct Pushes {
        state: Mutex<State>,
        /// Notified for every push.
        event: Event,
    }

    #[derive(Default)]
    struct State {
        /// Waiters to wake, per message.
        wakes: VecDeque<usize>,
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
                    Some(Value::BulkString(payload)) => wake_count(payload),
                    _ => usize::MAX,
                },
                // A (re)subscription: messages may have been missed.
                PushKind::SSubscribe => usize::MAX,
                PushKind::SUnsubscribe | PushKind::Disconnection => {
                    let mut state = self.lock();
                    state.lost = true;
                    state.wakes.push_back(usize::MAX);
                    drop(state);
                    self.event.notify(usize::MAX);
                    return;
                }
                _ => return,
            };
            let mut state = self.lock();
            if state.wakes.len() >= MAX_QUEUED {
                state.wakes.clear();
                state.wakes.push_back(usize::MAX);
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
        ) -> Poll<Option<usize>> {
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

    use core::future::Future;

    pub(super) async fn connect(
        client: ClusterClient,
        settings: &Settings,
    ) -> Result<Connected, ConfigError> {
        let pushes = Arc::new(Pushes::default());
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
        Ok(Connected {
            conn: Conn::Cluster(conn.clone()),
            subscriber: Subscriber::Cluster { conn, pushes },
            publish: "SPUBLISH",
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
            .map_err(on_channel)?;
        conn.ssubscribe(channel).await.map_err(|e| {
            if e.kind() == ErrorKind::InvalidClientConfig {
                ConfigError::NeedsResp3(e)
            } else {
                on_channel(e)
            }
        })
    }

    pub(super) async fn subscribe(
        conn: &ClusterConnection,
        pushes: &Arc<Pushes>,
        channel: &str,
    ) -> Option<Subscription> {
        // Cleared before the `SSUBSCRIBE` is sent: a loss reported after it
        // ends the new subscription.
        pushes.lock().lost = false;
        conn.clone().ssubscribe(channel).await.ok()?;
        Some(Subscription::Pushes {
            pushes: pushes.clone(),
            listener: None,
        })
    }
}

#[cfg(feature = "redis-sentinel")]
mod sentinel {
    //! The Sentinel backend: a connection to the current primary, replaced
    //! when Sentinel names another.

    use core::future::Future;
    use core::pin::Pin;
    use core::task::{Context, Poll};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
    use std::time::{Duration, Instant};

    use event_listener::{Event, EventListener};
    use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
    use redis::sentinel::SentinelClient;
    use redis::{Cmd, Pipeline, RedisResult, Value};

    use super::{Conn, Connected, Settings, Subscriber, Subscription, no_answer};
    use crate::redis::error::{ConfigError, Failure, classify};
    use crate::redis::spawn::Spawner;
    use crate::timer::Timer;
    use crate::timer::timeout::Timeout;

    /// The shortest time between two questions to Sentinel after failed
    /// calls.
    pub(in crate::redis) const FIND_EVERY: Duration = Duration::from_millis(100);

    /// How often the watcher of `+switch-master` checks that its semaphore
    /// is still there, and how long it waits before it subscribes again.
    const WATCH_TICK: Duration = Duration::from_secs(1);

    /// The primary as Sentinel last named it.
    pub(in crate::redis) struct Primary {
        /// Taken by the one task asking Sentinel, and put back after.
        sentinel: Mutex<Option<SentinelClient>>,
        current: Mutex<Current>,
        /// Set while a task is asking Sentinel.
        finding: AtomicBool,
        /// Notified when the primary changed.
        moved: Event,
        config: ConnectionManagerConfig,
        timeout: Duration,
        timer: Arc<dyn Timer>,
        spawner: Spawner,
    }

    struct Current {
        /// Bumped at every change of primary.
        generation: u64,
        client: redis::Client,
        conn: ConnectionManager,
        /// When Sentinel was last asked.
        asked: Instant,
    }

    pub(super) async fn connect(
        mut sentinel: SentinelClient,
        config: ConnectionManagerConfig,
        settings: &Settings,
    ) -> Result<Connected, ConfigError> {
        let find = async {
            let client = sentinel.async_get_client().await?;
            let conn = client
                .get_connection_manager_with_config(config.clone())
                .await?;
            let role: redis::Role = redis::cmd("ROLE").query_async(&mut conn.clone()).await?;
            Ok::<_, redis::RedisError>((client, conn, role))
        };
        let (client, conn, role) =
            Timeout::new(find, settings.timer.sleep(settings.response_timeout))
                .await
                .unwrap_or_else(|_elapsed| Err(no_answer()))
                .map_err(ConfigError::of)?;
        if !matches!(role, redis::Role::Primary { .. }) {
            return Err(ConfigError::NotPrimary);
        }
        let primary = Arc::new(Primary {
            sentinel: Mutex::new(Some(sentinel)),
            current: Mutex::new(Current {
                generation: 0,
                client,
                conn,
                asked: Instant::now(),
            }),
            finding: AtomicBool::new(false),
            moved: Event::new(),
            config,
            timeout: settings.response_timeout,
            timer: settings.timer.clone(),
            spawner: settings.spawner.clone(),
        });
        settings.spawner.spawn(watch(Arc::downgrade(&primary)));
        Ok(Connected {
            conn: Conn::Sentinel(primary.clone()),
            subscriber: Subscriber::Sentinel(primary),
            publish: "PUBLISH",
        })
    }

    /// Listens to the Sentinels' `+switch-master` announcements and asks
    /// for the primary at each, so that a failover is followed at once
    /// (after a forced failover the old primary goes on accepting writes
    /// until Sentinel turns it into a replica, so calls to it would not
    /// fail). Stops within [`WATCH_TICK`] of the semaphore's end.
    async fn watch(weak: Weak<Primary>) {
        loop {
            let Some(primary) = weak.upgrade() else {
                return;
            };
            let timer = primary.timer.clone();
            let within = timer.sleep(primary.timeout);
            let subscribed = Timeout::new(primary.subscribe_switches(), within).await;
            drop(primary);
            if let Ok(Some(mut switches)) = subscribed {
                loop {
                    match Timeout::new(NextMsg(&mut switches), timer.sleep(WATCH_TICK)).await {
                        Ok(Some(_switch)) => {
                            let Some(primary) = weak.upgrade() else {
                                return;
                            };
                            primary.switched().await;
                        }
                        Ok(None) => break,
                        Err(_elapsed) => {
                            if weak.strong_count() == 0 {
                                return;
                            }
                        }
                    }
                }
            }
            timer.sleep(WATCH_TICK).await;
        }
    }

    /// The next message of a subscription.
    struct NextMsg<'a>(&'a mut Pin<Box<redis::aio::PubSubStream>>);

    impl Future for NextMsg<'_> {
        type Output = Option<redis::Msg>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<redis::Msg>> {
            futures_core::Stream::poll_next(self.0.as_mut(), cx)
        }
    }

    /// The Sentinel client, lent out of its slot and put back when dropped
    /// (also when the call that borrowed it is cut short).
    struct Lent<'a> {
        slot: &'a Mutex<Option<SentinelClient>>,
        client: Option<SentinelClient>,
    }

    impl Drop for Lent<'_> {
        fn drop(&mut self) {
            if let Some(client) = self.client.take() {
                *lock(self.slot) = Some(client);
            }
        }
    }

    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a reply says the primary may have moved.
    fn may_have_moved(result: &RedisResult<Value>) -> bool {
        match result {
            Err(e) => classify(e) == Failure::Transient,
            Ok(Value::ServerError(e)) => {
                classify(&redis::RedisError::from(e.clone())) == Failure::Transient
            }
            Ok(_) => false,
        }
    }

    impl Primary {
        fn current(&self) -> (u64, ConnectionManager) {
            let current = lock(&self.current);
            (current.generation, current.conn.clone())
        }

        pub(super) fn client(&self) -> redis::Client {
            lock(&self.current).client.clone()
        }

        pub(super) fn get_db(&self) -> i64 {
            lock(&self.current).conn.get_db()
        }

        pub(super) async fn request(self: Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
            let (generation, mut conn) = self.current();
            let result = conn.req_packed_command(cmd).await;
            if may_have_moved(&result) {
                self.find(generation);
            }
            result
        }

        pub(super) async fn request_pipeline(
            self: Arc<Self>,
            cmd: &Pipeline,
            offset: usize,
            count: usize,
        ) -> RedisResult<Vec<Value>> {
            let (generation, mut conn) = self.current();
            let result = conn.req_packed_commands(cmd, offset, count).await;
            if let Err(e) = &result {
                if classify(e) == Failure::Transient {
                    self.find(generation);
                }
            }
            result
        }

        /// Asks Sentinel for the primary in the background, unless a task
        /// is asking already, the primary changed since `generation`, or
        /// Sentinel was asked less than [`FIND_EVERY`] ago.
        fn find(self: &Arc<Self>, generation: u64) {
            {
                let current = lock(&self.current);
                if current.generation != generation || current.asked.elapsed() < FIND_EVERY {
                    return;
                }
            }
            if self.finding.swap(true, Ordering::AcqRel) {
                return;
            }
            let primary = self.clone();
            self.spawner.spawn(async move {
                let within = primary.timer.sleep(primary.timeout);
                let _ = Timeout::new(primary.find_now(), within).await;
                lock(&primary.current).asked = Instant::now();
                primary.finding.store(false, Ordering::Release);
            });
        }

        /// The Sentinel client, unless another task has it.
        fn lend(&self) -> Option<Lent<'_>> {
            let client = lock(&self.sentinel).take()?;
            Some(Lent {
                slot: &self.sentinel,
                client: Some(client),
            })
        }

        /// A subscription to `+switch-master` on a Sentinel.
        async fn subscribe_switches(&self) -> Option<Pin<Box<redis::aio::PubSubStream>>> {
            let client = {
                let mut lent = self.lend()?;
                let sentinel = lent.client.as_mut()?;
                sentinel.async_get_sentinel_client().await.ok()?
            };
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(Box::pin(pubsub.into_on_message()))
        }

        /// Asks Sentinel for the primary after it announced a switch, once
        /// no other task is asking (for at most a response timeout).
        async fn switched(&self) {
            let deadline = Instant::now() + self.timeout;
            while self.finding.swap(true, Ordering::AcqRel) {
                if Instant::now() >= deadline {
                    return;
                }
                self.timer.sleep(Duration::from_millis(10)).await;
            }
            let within = self.timer.sleep(self.timeout);
            let _ = Timeout::new(self.find_now(), within).await;
            lock(&self.current).asked = Instant::now();
            self.finding.store(false, Ordering::Release);
        }

        async fn find_now(&self) {
            let found = {
                let Some(mut lent) = self.lend() else {
                    return;
                };
                let Some(sentinel) = lent.client.as_mut() else {
                    return;
                };
                sentinel.async_get_client().await
            };
            let Ok(client) = found else { return };
            let addr = client.get_connection_info().addr().to_string();
            if lock(&self.current)
                .client
                .get_connection_info()
                .addr()
                .to_string()
                == addr
            {
                return;
            }
            let Ok(conn) = client
                .get_connection_manager_with_config(self.config.clone())
                .await
            else {
                return;
            };
            let mut current = lock(&self.current);
            current.generation += 1;
            current.client = client;
            current.conn = conn;
            drop(current);
            self.moved.notify(usize::MAX);
        }

        /// A subscription on the current primary that ends when the primary
        /// changes. Asks Sentinel first when the last subscription was lost
        /// (the primary may have gone with it).
        pub(super) async fn subscribe(self: &Arc<Self>, channel: &str) -> Option<Subscription> {
            let listener = self.moved.listen();
            let (generation, _) = self.current();
            let client = self.client();
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await.ok()?;
                pubsub.subscribe(channel).await.ok()?;
                Some(pubsub)
            };
            let Some(pubsub) = subscribed.await else {
                self.find(generation);
                return None;
            };
            Some(Subscription::Messages {
                stream: Box::pin(pubsub.into_on_message()),
                moved: Some(Moved {
                    primary: self.clone(),
                    generation,
                    listener: Some(listener),
                }),
            })
        }
    }

    /// Ends a subscription when the primary changes.
    pub(in crate::redis) struct Moved {
        primary: Arc<Primary>,
        generation: u64,
        listener: Option<EventListener>,
    }

    impl Moved {
        pub(super) fn poll_moved(&mut self, cx: &mut Context<'_>) -> Poll<()> {
            loop {
                if lock(&self.primary.current).generation != self.generation {
                    return Poll::Ready(());
                }
                match &mut self.listener {
                    None => self.listener = Some(self.primary.moved.listen()),
                    Some(l) => {
                        if Pin::new(l).poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        self.listener = None;
                    }
                }
            }
        }
    }
}
