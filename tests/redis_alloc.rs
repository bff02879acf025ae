//! The Redis semaphore's client adds nothing to an uncontended cycle
//! (acquire, release) that redis-rs alone would not spend on the same two
//! script calls (the distributed guide, `watertight::guide::distributed`,
//! "Costs"): it allocates
//! less than redis-rs's own `Script::invoke_async` sending the same scripts
//! with the same keys and arguments, against a real `redis-server`.
//!
//! A counting global allocator counts the allocations made on the test's
//! thread; the runtime is a current-thread one, so the connection's driver
//! task, the semaphore's keeper and its subscriber run on that thread and
//! are counted too.
#![cfg(all(not(loom), feature = "redis", feature = "tokio"))]

#[path = "common/redis_server.rs"]
mod redis_server;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
/// The bare redis-rs client of the benches: our scripts, sent by redis-rs.
#[path = "../benches/common/redis_bare.rs"]
mod redis_bare;

use std::time::Duration;

use counting_alloc::{Counting, count};
use redis::aio::ConnectionManagerConfig;
use redis_bare::Bare;
use redis_server::RedisServer;
use watertight::redis::RedisSemaphore;

#[global_allocator]
static GLOBAL: Counting = Counting;

const CYCLES: u64 = 50;

/// Ours: 23 allocations a cycle with redis 1.2, against 56 for redis-rs
/// alone sending the same scripts; 63 before the scripts were written
/// straight into one command (then this failed).
#[test]
fn an_uncontended_cycle_allocates_less_than_redis_rs_alone() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let sem = RedisSemaphore::builder(client.clone(), "alloc-ours")
            .limit(1)
            .build()
            .await
            .unwrap();
        // As the semaphore's builder configures its connection.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let mut conn = client
            .get_connection_manager_with_config(config)
            .await
            .unwrap();
        let bare = Bare::new("alloc-bare", "PUBLISH", &mut conn).await;

        // Warm up: the subscription proved (its probe, a `PUBLISH` of its
        // own, made on this thread), the scripts loaded, the connections'
        // buffers grown.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sem.wakeups() != watertight::redis::Wakeups::PubSub {
            assert!(
                std::time::Instant::now() < deadline,
                "the subscription never delivered"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for _ in 0..10 {
            sem.acquire().await.unwrap().release().await.unwrap();
        }
        bare.cycles(&mut conn, 10).await;

        let before = count();
        for _ in 0..CYCLES {
            let permit = sem.acquire().await.unwrap();
            permit.release().await.unwrap();
        }
        let ours = count() - before;
        let before = count();
        bare.cycles(&mut conn, CYCLES).await;
        let alone = count() - before;
        eprintln!(
            "allocations per cycle: ours {:.1}, redis-rs alone {:.1}",
            ours as f64 / CYCLES as f64,
            alone as f64 / CYCLES as f64
        );
        assert!(
            ours < alone,
            "ours allocated {ours} times in {CYCLES} cycles, redis-rs alone {alone}"
        );
    });
}
