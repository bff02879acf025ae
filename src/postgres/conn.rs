//! The connection a handle's statements and wake-ups go through, made
//! again when it is lost.
//!
//! One connection per handle: tokio-postgres pipelines the statements of
//! concurrent callers on it, and the same connection `LISTEN`s on the
//! handle's channel, so a notification and the replies arrive in the order
//! the server sent them. A task drives the connection and hands each
//! notification's payload to [`Grants`]. When the connection ends, the
//! next statement connects again (one caller at a time), listens again
//! and prepares the statements again; a grant notified meanwhile is found
//! by the waiter's next attempt.

use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Statement};

use super::error::Failure;
use super::grants::Grants;
use super::sql::Statements;
use crate::loom::lock;
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// A live connection and its prepared statements.
pub(super) struct Live {
    pub(super) client: Client,
    pub(super) acquire: Statement,
    pub(super) release: Statement,
    pub(super) renew: Statement,
    pub(super) set_limit: Statement,
    pub(super) limit: Statement,
    pub(super) holders: Statement,
}

pub(super) struct Conn {
    config: Config,
    /// The channel this handle listens on: its waiters' grants are
    /// notified there.
    pub(super) channel: String,
    statements: Statements,
    grants: Arc<Grants>,
    timer: Arc<dyn Timer>,
    response_timeout: Duration,
    runtime: tokio::runtime::Handle,
    live: Mutex<Option<Arc<Live>>>,
    /// Held while a connection is made, so that callers who find it lost
    /// together make one.
    connecting: tokio::sync::Mutex<()>,
}

impl Conn {
    pub(super) fn new(
        config: Config,
        channel: String,
        statements: Statements,
        grants: Arc<Grants>,
        timer: Arc<dyn Timer>,
        response_timeout: Duration,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            config,
            channel,
            statements,
            grants,
            timer,
            response_timeout,
            runtime,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The live connection, made if there is none, within one response
    /// timeout.
    pub(super) async fn live(&self) -> Result<Arc<Live>, Failure> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _one = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let live = self.bounded(self.connect()).await?;
        let live = Arc::new(live);
        *lock(&self.live) = Some(live.clone());
        Ok(live)
    }

    fn current(&self) -> Option<Arc<Live>> {
        lock(&self.live)
            .as_ref()
            .filter(|live| !live.client.is_closed())
            .cloned()
    }

    /// Runs `call` within the response timeout; an unanswered call is a
    /// transient failure.
    pub(super) async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let timeout = self.response_timeout;
        Timeout::new(call, self.timer.sleep(timeout))
            .await
            .unwrap_or_else(|_elapsed| Err(Failure::silent(timeout)))
    }

    async fn connect(&self) -> Result<Live, Failure> {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let grants = self.grants.clone();
        // Ends when the connection does (the client dropped, the server
        // gone); notifications are handed over as they come.
        self.runtime.spawn(poll_fn(move |cx| {
            loop {
                match connection.poll_message(cx) {
                    Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                        grants.notified(n.payload());
                    }
                    Poll::Ready(Some(Ok(_))) => {}
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }));
        client
            .batch_execute(&format!("LISTEN {}", self.channel))
            .await?;
        let s = &self.statements;
        let (acquire, release, renew, set_limit, limit, holders) = (
            client.prepare(&s.acquire).await?,
            client.prepare(&s.release).await?,
            client.prepare(&s.renew).await?,
            client.prepare(&s.set_limit).await?,
            client.prepare(&s.limit).await?,
            client.prepare(&s.holders).await?,
        );
        // The connection is back: a grant notified while it was down is
        // found by its waiter's next attempt, which this wakes.
        self.grants.wake_all();
        Ok(Live {
            client,
            acquire,
            release,
            renew,
            set_limit,
            limit,
            holders,
        })
    }
}
