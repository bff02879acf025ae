//! What the tests that restart Redis under a live `RedisSemaphore` share
//! (`tests/redis_faults.rs`, `tests/redis_failover.rs`, `tests/redis_cluster.rs`). Include it with
//! `#[path = "common/redis_reconnect.rs"] mod redis_reconnect;`, beside
//! `redis_server` (declared at the test crate's root).

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

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

/// `try_acquire` until Redis refuses `sem` for a quarantine, within
/// `within` (a grant from a server that has not seen the loss yet is given
/// back; a connection not made again yet is tried again 20 ms later):
/// what is left of the quarantine.
pub async fn until_quarantined(sem: &RedisSemaphore, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        match sem.try_acquire().await {
            Err(LeaseError::Quarantined { retry_after }) => return retry_after,
            Ok(permit) => drop(permit.release().await),
            Err(LeaseError::Unavailable(_)) => {}
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed() < within, "no quarantine within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each of `clients` granted at its first try once it reaches the server
/// (one that is still reconnecting is tried again): refused for no second
/// quarantine.
pub async fn each_granted(clients: &[RedisSemaphore]) {
    for (i, client) in clients.iter().enumerate() {
        match try_after_reconnect(client).await {
            Ok(permit) => permit.release().await.unwrap(),
            other => panic!("client {i}: {other:?}"),
        }
    }
}
