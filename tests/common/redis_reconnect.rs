//! What the tests that restart Redis under a live `RedisSemaphore` share
//! (`tests/redis_faults.rs`, `tests/redis_failover.rs`). Include it with
//! `#[path = "common/redis_reconnect.rs"] mod redis_reconnect;`, beside
//! `redis_server` (declared at the test crate's root).

use std::sync::Arc;
use std::time::{Duration, Instant};

use watertight::redis::{LeaseError, LeasedPermit, RedisSemaphore};

use crate::redis_server::RedisServer;

/// How long a client may take to reconnect after a restart.
const RECONNECT_PATIENCE: Duration = Duration::from_secs(15);

/// Restarts `server` off the async runtime (with the server's persistence
/// settings: the tests' default, none, brings it back empty).
pub async fn restart(server: &Arc<RedisServer>) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.restart())
        .await
        .unwrap();
}

/// `try_acquire` until it stops failing for want of a connection (the
/// handle reconnects after a restart); returns the first other outcome.
pub async fn try_after_reconnect(sem: &RedisSemaphore) -> Result<LeasedPermit, LeaseError> {
    let deadline = Instant::now() + RECONNECT_PATIENCE;
    loop {
        match sem.try_acquire().await {
            Err(LeaseError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}
