//! A load of tasks that take and give back a Redis semaphore's permits in
//! a loop while a failover happens, counted apart from Redis: how many
//! hold a permit at once (at most the limit, whatever Redis says), every
//! grant's time, and the first refusal by the quarantine. Shared by the
//! Cluster, the Sentinel and the lost-grants failover tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use watertight::redis::{LeaseError, RedisSemaphore};

#[derive(Default)]
struct Counts {
    now: AtomicUsize,
    max: AtomicUsize,
    grants: AtomicUsize,
    granted_at: Mutex<Vec<Instant>>,
    /// For each grant, when its `try_acquire` was called: the grant was
    /// made no sooner (its answer may be read much later).
    asked_at: Mutex<Vec<Instant>>,
    quarantined: Mutex<Option<Instant>>,
    stop: AtomicBool,
}

impl Counts {
    fn enter(&self) {
        let here = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(here, Ordering::SeqCst);
    }
}

/// A permit held outside the load's tasks, counted among those held at
/// once until dropped ([`Load::enter`]).
pub struct Held(Arc<Counts>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The tasks and what they counted.
#[derive(Default)]
pub struct Load {
    counts: Arc<Counts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts a task on `sem`: `try_acquire`, hold 10 ms, release, 5 ms
    /// apart; a lost or unanswered release no longer counts the permit.
    pub fn spawn(&mut self, sem: RedisSemaphore) {
        self.spawn_holding(sem, Duration::from_millis(10));
    }

    /// [`spawn`](Self::spawn), each grant held `hold`.
    pub fn spawn_holding(&mut self, sem: RedisSemaphore, hold: Duration) {
        let c = self.counts.clone();
        self.tasks.push(tokio::spawn(async move {
            while !c.stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                match sem.try_acquire().await {
                    Ok(permit) => {
                        c.enter();
                        c.grants.fetch_add(1, Ordering::SeqCst);
                        c.granted_at.lock().unwrap().push(Instant::now());
                        c.asked_at.lock().unwrap().push(asked);
                        tokio::time::sleep(hold).await;
                        c.now.fetch_sub(1, Ordering::SeqCst);
                        // Lost in the switch (`Overrun`) or unanswered:
                        // either way this task no longer counts it.
                        let _ = permit.release().await;
                    }
                    Err(LeaseError::Quarantined { .. }) => {
                        c.quarantined
                            .lock()
                            .unwrap()
                            .get_or_insert_with(Instant::now);
                    }
                    Err(LeaseError::NoPermits { .. } | LeaseError::Unavailable(_)) => {}
                    Err(e) => panic!("{e:?}"),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    /// Counts a permit held outside the load's tasks (a holder granted
    /// before them) among those held at once, until the `Held` is dropped.
    pub fn enter(&self) -> Held {
        self.counts.enter();
        Held(self.counts.clone())
    }

    /// When each of the tasks' grants was made, so far.
    pub fn granted_at(&self) -> Vec<Instant> {
        self.counts.granted_at.lock().unwrap().clone()
    }

    /// Grants so far.
    pub fn grants(&self) -> usize {
        self.counts.grants.load(Ordering::SeqCst)
    }

    /// The most permits held at once.
    pub fn max_held(&self) -> usize {
        self.counts.max.load(Ordering::SeqCst)
    }

    /// When the quarantine first refused a task, if it has.
    pub fn first_refusal(&self) -> Option<Instant> {
        *self.counts.quarantined.lock().unwrap()
    }

    /// Stops the tasks and waits for them (10 s each at most).
    pub async fn stop(&mut self) {
        self.counts.stop.store(true, Ordering::SeqCst);
        for task in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// The grants asked for after `since` and before the first refusal,
    /// as times since `since` of when they were asked for. (When asked,
    /// not when answered: a grant asked for before `since`, its answer
    /// read late by a descheduled task, is not one of them.)
    pub fn before_refusal(&self, since: Instant) -> Vec<Duration> {
        let refusal = self.first_refusal().expect("the promotion quarantined");
        self.counts
            .asked_at
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t > since && t < refusal)
            .map(|&t| t - since)
            .collect()
    }
}
