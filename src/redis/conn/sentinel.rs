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
use crate::redis::replication::{is_promotion, parse_replication};
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
    /// With `replicas`: the config of the grants' own connection (its
    /// response timeout covers the `WAIT`).
    grant_config: Option<ConnectionManagerConfig>,
    timeout: Duration,
    timer: Arc<dyn Timer>,
    spawner: Spawner,
    /// With the quarantine on: set when the primary Sentinel names next
    /// is a replica promoted in place of the current one (see
    /// `failover.rs`), before any call goes to it.
    loss_known: Option<Arc<AtomicBool>>,
}

struct Current {
    /// Bumped at every change of primary.
    generation: u64,
    client: redis::Client,
    conn: ConnectionManager,
    /// With `replicas`: the grants' own connection to the same primary.
    grants: Option<ConnectionManager>,
    /// When Sentinel was last asked.
    asked: Instant,
    /// The primary's `master_replid` (with the quarantine on, if `INFO`
    /// answered).
    replid: Option<String>,
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
    let (client, conn, role) = Timeout::new(find, settings.timer.sleep(settings.response_timeout))
        .await
        .unwrap_or_else(|_elapsed| Err(no_answer()))
        .map_err(ConfigError::of)?;
    if !matches!(role, redis::Role::Primary { .. }) {
        return Err(ConfigError::NotPrimary);
    }
    let replid = match &settings.loss_known {
        Some(_) => replication_id(&conn).await.map(|ids| ids.0),
        None => None,
    };
    let grant_config = settings.wait.map(|wait| {
        config
            .clone()
            .set_response_timeout(Some(settings.response_timeout + wait))
    });
    let grants = match &grant_config {
        None => None,
        Some(grant_config) => Some(
            client
                .get_connection_manager_with_config(grant_config.clone())
                .await
                .map_err(ConfigError::of)?,
        ),
    };
    let primary = Arc::new(Primary {
        sentinel: Mutex::new(Some(sentinel)),
        current: Mutex::new(Current {
            generation: 0,
            client,
            conn,
            grants,
            asked: Instant::now(),
            replid,
        }),
        finding: AtomicBool::new(false),
        moved: Event::new(),
        config,
        grant_config,
        timeout: settings.response_timeout,
        timer: settings.timer.clone(),
        spawner: settings.spawner.clone(),
        loss_known: settings.loss_known.clone(),
    });
    settings.spawner.spawn(watch(Arc::downgrade(&primary)));
    Ok(Connected {
        conn: Conn::Sentinel(primary.clone()),
        grant_conn: settings.wait.map(|_| Conn::SentinelGrants(primary.clone())),
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

/// The ids of the primary on `conn` (`None` if `INFO` failed or it is
/// not a primary).
async fn replication_id(conn: &ConnectionManager) -> Option<(String, String)> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn.clone())
        .await
        .ok()?;
    parse_replication(&info)
}

/// Whether a reply says the primary may have moved.
fn may_have_moved(result: &RedisResult<Value>) -> bool {
    match result {
        Err(e) => classify(e) == Failure::Transient,
        Ok(value) => says_moved(value),
    }
}

/// Whether an answer is an error that says the primary may have moved
/// (`READONLY` from a demoted primary, `MASTERDOWN`).
fn says_moved(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => {
            classify(&redis::RedisError::from(e.clone())) == Failure::Transient
        }
        _ => false,
    }
}

impl Primary {
    /// The current primary's generation and connection: the grants' own
    /// with `grants` (if there is one).
    fn current(&self, grants: bool) -> (u64, ConnectionManager) {
        let current = lock(&self.current);
        let conn = match (&current.grants, grants) {
            (Some(conn), true) => conn,
            _ => &current.conn,
        };
        (current.generation, conn.clone())
    }

    pub(super) fn client(&self) -> redis::Client {
        lock(&self.current).client.clone()
    }

    pub(super) fn get_db(&self) -> i64 {
        lock(&self.current).conn.get_db()
    }

    /// Sends `cmd` to the current primary, on the grants' own connection
    /// with `grants`.
    pub(super) async fn request(self: Arc<Self>, cmd: &Cmd, grants: bool) -> RedisResult<Value> {
        let (generation, mut conn) = self.current(grants);
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
        grants: bool,
    ) -> RedisResult<Vec<Value>> {
        let (generation, mut conn) = self.current(grants);
        let result = conn.req_packed_commands(cmd, offset, count).await;
        // (A pipeline's answers carry their errors: the acquire script's
        // `READONLY` is one of them, with `replicas`.)
        let moved = match &result {
            Err(e) => classify(e) == Failure::Transient,
            Ok(answers) => answers.iter().any(says_moved),
        };
        if moved {
            self.find(generation);
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
        let grants = match &self.grant_config {
            None => None,
            Some(config) => {
                let Ok(grants) = client
                    .get_connection_manager_with_config(config.clone())
                    .await
                else {
                    return;
                };
                Some(grants)
            }
        };
        // Before any call goes to it: a promoted replica may lack the last
        // grants (the acquire script then starts the quarantine).
        let ids = match &self.loss_known {
            Some(_) => replication_id(&conn).await,
            None => None,
        };
        let mut current = lock(&self.current);
        if let (Some(loss), Some(old), Some(ids)) = (&self.loss_known, &current.replid, &ids) {
            if is_promotion(old, ids) {
                loss.store(true, Ordering::Release);
            }
        }
        current.generation += 1;
        current.client = client;
        current.conn = conn;
        current.grants = grants;
        current.replid = ids.map(|ids| ids.0);
        drop(current);
        self.moved.notify(usize::MAX);
    }

    /// A subscription on the current primary that ends when the primary
    /// changes. Asks Sentinel first when the last subscription was lost
    /// (the primary may have gone with it).
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> redis::RedisResult<Subscription> {
        let listener = self.moved.listen();
        let (generation, _) = self.current(false);
        let client = self.client();
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok(pubsub)
        };
        let pubsub = match subscribed.await {
            Ok(pubsub) => pubsub,
            Err(e) => {
                self.find(generation);
                return Err(e);
            }
        };
        Ok(Subscription::Messages {
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
