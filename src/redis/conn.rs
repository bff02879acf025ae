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
//!   connection to it is lost. Every call is cut at the response timeout
//!   (`cluster::Bounded`), since the crate retries a call to a dead node
//!   until the slot map changes.
//! * **Sentinel**: a `ConnectionManager` to the primary Sentinel names.
//!   A call that fails for a transient reason (no answer, `READONLY` from a
//!   demoted primary) asks Sentinel again in the background, at most every
//!   [`FIND_EVERY`](sentinel::FIND_EVERY); a different primary replaces the connection, and ends
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
mod cluster;
#[cfg(feature = "redis-sentinel")]
mod sentinel;

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
/// use watertight::redis::{Backend, RedisSemaphore};
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
    /// use watertight::redis::RedisSemaphore;
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
    /// use watertight::redis::{Backend, RedisSemaphore};
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
    #[cfg_attr(
        not(any(feature = "redis-sentinel", feature = "redis-cluster")),
        allow(dead_code)
    )]
    pub(super) timer: std::sync::Arc<dyn Timer>,
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    pub(super) spawner: Spawner,
    /// With `replicas`, the `WAIT` timeout: the grants then get a
    /// connection of their own, whose response timeout covers it.
    pub(super) wait: Option<Duration>,
    /// With the quarantine on, the flag a backend that switches servers
    /// itself (Sentinel) sets when the new one is a promoted replica.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    pub(super) loss_known: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// With the quarantine on, the flag a backend sets when it saw a
    /// connection to a node drop (a Cluster: its pushes say so), which
    /// makes the next grant read the server's identity first (see
    /// `failover.rs`).
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) suspect: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A backend, connected.
pub(super) struct Connected {
    pub(super) conn: Conn,
    pub(super) subscriber: Subscriber,
    /// The command the scripts publish wake-ups with.
    pub(super) publish: &'static str,
    /// The grants' own connection, with `Settings::wait`.
    pub(super) grant_conn: Option<Conn>,
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
                let grant_conn = match settings.wait {
                    None => None,
                    Some(wait) => {
                        let config = config
                            .clone()
                            .set_response_timeout(Some(settings.response_timeout + wait));
                        let conn = client
                            .get_connection_manager_with_config(config)
                            .await
                            .map_err(ConfigError::of)?;
                        Some(Conn::Node(conn))
                    }
                };
                let conn = client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(ConfigError::of)?;
                Ok(Connected {
                    conn: Conn::Node(conn),
                    subscriber: Subscriber::Node(client),
                    publish: "PUBLISH",
                    grant_conn,
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
    Cluster(cluster::Bounded),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<Primary>),
    /// With `replicas`: the grants' own connection to the primary Sentinel
    /// names (replaced with the shared one at a switch).
    #[cfg(feature = "redis-sentinel")]
    SentinelGrants(std::sync::Arc<Primary>),
}

impl Conn {
    /// `INFO replication` from the node that runs the scripts for the
    /// semaphore whose epoch marker is `epoch_key` (on a Cluster, the
    /// primary that owns its slot).
    ///
    /// On a Cluster, `INFO` itself cannot be sent there for sure: routed by
    /// the slot, the redis crate sends it to whichever node its slot map
    /// names, which may have been demoted since (and, since the crate sends
    /// `READONLY` on every connection, answers reads itself), or to a
    /// random node when it cannot connect to that one (a primary that
    /// died). It runs inside a script instead, keyed by the marker and
    /// declared as a writing one (`#!lua` without `no-writes`): any node
    /// but the slot's primary answers `MOVED`, which the crate follows.
    pub(super) async fn info_replication(&self, epoch_key: &str) -> redis::RedisResult<String> {
        match self {
            #[cfg(feature = "redis-cluster")]
            // `EVAL`, not `EVALSHA`: a promoted replica has no scripts
            // loaded, and the redis crate's `SCRIPT LOAD` after `NOSCRIPT`
            // goes to every node, which may include the dead primary until
            // the crate drops it (the call then times out, and so would
            // every check after a failover, until the crate drops it).
            Self::Cluster(conn) => {
                redis::cmd("EVAL")
                    .arg("#!lua\nreturn redis.call('INFO', 'replication')")
                    .arg(1)
                    .arg(epoch_key)
                    .query_async(&mut conn.clone())
                    .await
            }
            _ => {
                let _ = epoch_key;
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut self.clone())
                    .await
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) => Box::pin(primary.clone().request(cmd, false)),
            #[cfg(feature = "redis-sentinel")]
            Self::SentinelGrants(primary) => Box::pin(primary.clone().request(cmd, true)),
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
                Box::pin(primary.clone().request_pipeline(cmd, offset, count, false))
            }
            #[cfg(feature = "redis-sentinel")]
            Self::SentinelGrants(primary) => {
                Box::pin(primary.clone().request_pipeline(cmd, offset, count, true))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.conn.get_db(),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(primary) | Self::SentinelGrants(primary) => primary.get_db(),
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

    /// A subscription to `channel`, or the error of connecting or
    /// subscribing. A subscription the server refused may look made: the
    /// subscriber checks that messages come (see `keeper`).
    pub(super) async fn subscribe(&self, channel: &str) -> redis::RedisResult<Subscription> {
        match self {
            Self::Node(client) => {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok(Subscription::Messages {
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

/// What a message on one of the semaphore's channels asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// `free n` (shared channel): wake `n` local waiters (`usize::MAX`:
    /// every one, as for a malformed message or one that may have been
    /// missed).
    Free(usize),
    /// `grant id fence ttl limit` (this process's channel): the line's
    /// head `id` was granted the permit with this fence, under this limit.
    Granted {
        id: String,
        fence: u64,
        limit: usize,
    },
}

/// Reads a wake-up message; anything malformed wakes every waiter.
fn parse_wake(payload: &[u8]) -> Wake {
    let text = core::str::from_utf8(payload).unwrap_or("");
    if let Some(n) = text.strip_prefix("free ") {
        return Wake::Free(n.parse().unwrap_or(usize::MAX));
    }
    let mut parts = text.split(' ');
    if let (Some("grant"), Some(id), Some(fence), Some(_ttl), Some(limit), None) = (
        parts.next(),
        parts.next(),
        parts.next().and_then(|f| f.parse().ok()),
        parts.next(),
        parts.next().and_then(|l| l.parse().ok()),
        parts.next(),
    ) {
        return Wake::Granted {
            id: id.to_owned(),
            fence,
            limit,
        };
    }
    Wake::Free(usize::MAX)
}

/// A live subscription: yields what each message asks for, and ends when
/// the subscription is lost.
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
    type Item = Wake;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Wake>> {
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
                    .map(|msg| msg.map(|msg| parse_wake(msg.get_payload_bytes())))
            }
            #[cfg(feature = "redis-cluster")]
            Self::Pushes { pushes, listener } => pushes.poll_next(listener, cx),
        }
    }
}
