//! One matrix of option tests over every bulkhead kind: the same
//! [`CallOptions`] (a deadline, a `max_wait` of the call's own, a priority
//! class), and the same overload settings (controlled delay), read the
//! same way by `Bulkhead`, a classed `Bulkhead`,
//! `KeyedBulkhead` (with and without a classed global bulkhead), the tower
//! layer, and the Redis and PostgreSQL bulkheads (against real servers,
//! skipped without them unless `WATERTIGHT_REQUIRE_REDIS` or
//! `WATERTIGHT_REQUIRE_POSTGRES` is set).
//!
//! The waits run on the real clock: each test brackets what it asserts
//! with clock reads, with margins far above a loaded machine's jitter.
#![cfg(all(
    not(loom),
    feature = "tokio",
    feature = "tower",
    feature = "redis",
    feature = "postgres"
))]

mod common;
#[path = "common/pg_server.rs"]
mod pg_server;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::any::Any;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use pg_server::PgServer;
use redis_server::RedisServer;
use tower::{Service, ServiceExt};
use watertight::keyed::{KeyedBulkhead, KeyedError};
use watertight::postgres::{PgBulkhead, PgSemaphore};
use watertight::redis::{RedisBulkhead, RedisSemaphore};
use watertight::tower::BulkheadLayer;
use watertight::{Bulkhead, BulkheadError, CallOptions, RejectReason, Rejected};

/// The bulkheads' own `max_wait` unless a test says otherwise: far longer
/// than any wait a test expects to end by another limit.
const LONG: Duration = Duration::from_secs(10);

/// Beyond this, a wait that should have ended sooner did not.
const SOON: Duration = Duration::from_secs(5);

/// What a test asks of a call, as [`CallOptions`] for the kinds that take
/// them, and as a request the tower layer's readers take apart.
#[derive(Clone, Copy, Default)]
struct Opts {
    by: Option<Instant>,
    /// A deadline as a time budget.
    within: Option<Duration>,
    wait: Option<Duration>,
    class: Option<usize>,
    /// How long the tower kind's work holds its seat.
    hold: Option<Duration>,
}

impl Opts {
    fn by(by: Instant) -> Self {
        Self {
            by: Some(by),
            ..Self::default()
        }
    }

    fn within(budget: Duration) -> Self {
        Self {
            within: Some(budget),
            ..Self::default()
        }
    }

    fn wait(wait: Duration) -> Self {
        Self {
            wait: Some(wait),
            ..Self::default()
        }
    }

    fn class(class: usize) -> Self {
        Self {
            class: Some(class),
            ..Self::default()
        }
    }

    fn options(self) -> CallOptions {
        let mut options = CallOptions::new();
        if let Some(by) = self.by {
            options = options.deadline(by);
        }
        if let Some(budget) = self.within {
            options = options.within(budget);
        }
        if let Some(wait) = self.wait {
            options = options.max_wait(wait);
        }
        if let Some(class) = self.class {
            options = options.class(class);
        }
        options
    }
}

type TowerService = tower::util::BoxCloneSyncService<Opts, u32, tower::BoxError>;

/// One bulkhead kind, with one seat (with a global stage: one global seat).
enum Kind {
    Plain(Bulkhead),
    Classed(Bulkhead),
    Keyed(KeyedBulkhead<u64>),
    KeyedClassed(KeyedBulkhead<u64>),
    Tower(Bulkhead, TowerService),
    Redis(RedisBulkhead),
    Postgres(PgBulkhead),
}

/// Which kinds have priority classes.
const CLASSED: [&str; 5] = ["classed", "keyed-classed", "tower", "redis", "postgres"];

/// What every kind of a test is built with.
#[derive(Clone, Copy)]
struct Setup {
    max_wait: Duration,
    /// `queue_delay(target, interval)`.
    queue_delay: Option<(Duration, Duration)>,
}

impl From<Duration> for Setup {
    fn from(max_wait: Duration) -> Self {
        Setup {
            max_wait,
            queue_delay: None,
        }
    }
}

impl Kind {
    /// Every kind, each set up as `setup` says; the Redis one on
    /// `server`, if there is one.
    async fn all(setup: impl Into<Setup>, servers: &Servers, name: &str) -> Vec<Kind> {
        let setup = setup.into();
        let max_wait = setup.max_wait;
        let plain = || {
            let builder = Bulkhead::builder()
                .max_concurrent_calls(1)
                .max_wait(max_wait);
            match setup.queue_delay {
                Some((target, interval)) => builder.queue_delay(target, interval),
                None => builder,
            }
        };
        let keyed = || {
            let builder = KeyedBulkhead::builder()
                .max_concurrent_calls(1)
                .max_wait(max_wait);
            match setup.queue_delay {
                Some((target, interval)) => builder.queue_delay(target, interval),
                None => builder,
            }
        };
        let classed = || plain().priorities(&[1, 1]).build().unwrap();
        let mut kinds = vec![
            Kind::Plain(plain().build().unwrap()),
            Kind::Classed(classed()),
            Kind::Keyed(keyed().global_limit(4).build().unwrap()),
            Kind::KeyedClassed(keyed().global(classed()).build().unwrap()),
        ];
        let bh = classed();
        let layer = BulkheadLayer::new(bh.clone())
            .options_from(|r: &Opts| r.options())
            .priority_from(|r: &Opts| r.class.unwrap_or(1));
        let service = tower::ServiceBuilder::new()
            .layer(layer)
            .service(tower::service_fn(|opts: Opts| async move {
                if let Some(hold) = opts.hold.filter(|hold| !hold.is_zero()) {
                    tokio::time::sleep(hold).await;
                }
                Ok::<_, Infallible>(7)
            }));
        kinds.push(Kind::Tower(bh, TowerService::new(service)));
        if let Some(server) = &servers.redis {
            let client = redis::Client::open(server.url()).unwrap();
            let sem = RedisSemaphore::builder(client, name)
                .limit(1)
                .lease_ttl(Duration::from_secs(30))
                .max_poll(Duration::from_millis(100))
                .build()
                .await
                .unwrap();
            let mut rb = RedisBulkhead::builder(sem)
                .max_wait(max_wait)
                .priority_classes(2);
            if let Some((target, interval)) = setup.queue_delay {
                rb = rb.queue_delay(target, interval);
            }
            kinds.push(Kind::Redis(rb.build().unwrap()));
        }
        if let Some(server) = &servers.postgres {
            let sem = PgSemaphore::builder(server.url().parse().unwrap(), name)
                .limit(1)
                .lease_ttl(Duration::from_secs(30))
                .max_poll(Duration::from_millis(100))
                .build()
                .await
                .unwrap();
            let mut pb = PgBulkhead::builder(sem)
                .max_wait(max_wait)
                .priority_classes(2);
            if let Some((target, interval)) = setup.queue_delay {
                pb = pb.queue_delay(target, interval);
            }
            kinds.push(Kind::Postgres(pb.build().unwrap()));
        }
        kinds
    }

    fn name(&self) -> &'static str {
        match self {
            Kind::Plain(_) => "plain",
            Kind::Classed(_) => "classed",
            Kind::Keyed(_) => "keyed",
            Kind::KeyedClassed(_) => "keyed-classed",
            Kind::Tower(..) => "tower",
            Kind::Redis(_) => "redis",
            Kind::Postgres(_) => "postgres",
        }
    }

    /// How many callers wait for the seat now (at the global stage, for
    /// the keyed kind with a classed global bulkhead).
    fn waiting(&self) -> usize {
        match self {
            Kind::Plain(bh) | Kind::Classed(bh) | Kind::Tower(bh, _) => bh.metrics().queued(),
            Kind::Keyed(kb) => kb.metrics_for(&1).map_or(0, |m| m.queued()),
            Kind::KeyedClassed(kb) => kb.global().unwrap().metrics().queued(),
            Kind::Redis(rb) => rb.metrics().queued(),
            Kind::Postgres(pb) => pb.metrics().queued(),
        }
    }

    /// Takes the one seat the calls below compete for, as a call of class
    /// 0 where there are classes.
    async fn hold(&self) -> Box<dyn Any + Send> {
        let first = CallOptions::new().class(0);
        match self {
            Kind::Plain(bh) | Kind::Classed(bh) | Kind::Tower(bh, _) => {
                Box::new(bh.acquire_with(first).await.unwrap())
            }
            Kind::Keyed(kb) => Box::new(kb.acquire(&1).await.unwrap()),
            // Another key: the calls below wait at the global stage.
            Kind::KeyedClassed(kb) => Box::new(kb.acquire_with(&100, first).await.unwrap()),
            Kind::Redis(rb) => Box::new(rb.acquire().await.unwrap()),
            Kind::Postgres(pb) => Box::new(pb.acquire().await.unwrap()),
        }
    }

    /// A call with `options` (for `key`, on the keyed kinds), as its
    /// rejection's reason if it is rejected.
    fn call(&self, key: u64, opts: Opts) -> BoxFuture<'_, Result<u32, RejectReason>> {
        self.call_holding(key, opts, Duration::ZERO)
    }

    /// [`call`](Self::call) whose work holds its seat `hold`.
    fn call_holding(
        &self,
        key: u64,
        opts: Opts,
        hold: Duration,
    ) -> BoxFuture<'_, Result<u32, RejectReason>> {
        let work = async move {
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            Ok::<u32, ()>(7)
        };
        // On a classed kind, a call names a class (a plain one never
        // waits there): the least important unless the test says.
        let mut opts = opts;
        if CLASSED.contains(&self.name()) && opts.class.is_none() {
            opts.class = Some(1);
        }
        let options = opts.options();
        Box::pin(async move {
            match self {
                Kind::Plain(bh) | Kind::Classed(bh) => {
                    bh.call_with(options, work).await.map_err(reason)
                }
                Kind::Keyed(kb) | Kind::KeyedClassed(kb) => kb
                    .call_with(&key, options, work)
                    .await
                    .map_err(|e| match e {
                        KeyedError::Rejected(r) => r.reason().bulkhead_reason().unwrap(),
                        other => panic!("{other:?}"),
                    }),
                Kind::Tower(_, service) => {
                    let mut service = service.clone();
                    let ready = service.ready().await.unwrap();
                    let opts = Opts {
                        hold: Some(hold),
                        ..opts
                    };
                    ready.call(opts).await.map_err(|e| {
                        e.downcast_ref::<Rejected>()
                            .unwrap_or_else(|| panic!("{e}"))
                            .reason()
                    })
                }
                Kind::Redis(rb) => rb.call_with(options, work).await.map_err(reason),
                Kind::Postgres(pb) => pb.call_with(options, work).await.map_err(reason),
            }
        })
    }
}

fn reason<E: std::fmt::Debug>(e: BulkheadError<E>) -> RejectReason {
    match e {
        BulkheadError::Rejected(r) => r.reason(),
        other => panic!("{other:?}"),
    }
}

/// The servers of the distributed kinds, each none where it may be
/// skipped.
struct Servers {
    redis: Option<RedisServer>,
    postgres: Option<PgServer>,
}

fn server() -> Servers {
    Servers {
        redis: RedisServer::start_or_skip(),
        postgres: PgServer::start("call_options"),
    }
}

/// A call with a deadline that has passed is rejected at once, and one
/// with a deadline far ahead runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_is_judged_before_the_call_takes_a_seat() {
    let server = server();
    for kind in Kind::all(LONG, &server, "deadline").await {
        let passed = Opts::by(Instant::now() - Duration::from_millis(1));
        let before = Instant::now();
        assert_eq!(
            kind.call(1, passed).await,
            Err(RejectReason::WontMakeDeadline),
            "{}",
            kind.name()
        );
        assert!(before.elapsed() < SOON, "{}", kind.name());
        let ahead = Opts::by(Instant::now() + Duration::from_secs(60));
        assert_eq!(kind.call(1, ahead).await, Ok(7), "{}", kind.name());
    }
}

/// A call that waits with a deadline (no hold time measured yet, so it
/// is admitted) waits until the deadline at most, then is rejected as a
/// call that cannot make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_the_wait_it_can_no_longer_make() {
    let server = server();
    for kind in Kind::all(LONG, &server, "deadline-wait").await {
        let held = kind.hold().await;
        let before = Instant::now();
        let by = Opts::by(before + Duration::from_millis(200));
        let out = kind.call(1, by).await;
        let waited = before.elapsed();
        assert_eq!(out, Err(RejectReason::WontMakeDeadline), "{}", kind.name());
        assert!(
            waited >= Duration::from_millis(150) && waited < SOON,
            "{}: {waited:?}",
            kind.name()
        );
        drop(held);
    }
}

/// A deadline given as a time budget is the same promise: it starts when
/// the bulkhead first judges the call (once, for every stage and every
/// attempt), a budget of zero is spent at once, and a call that waits is
/// rejected when it can no longer make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_is_a_deadline_that_starts_with_the_call() {
    let server = server();
    for kind in Kind::all(LONG, &server, "budget").await {
        let before = Instant::now();
        assert_eq!(
            kind.call(1, Opts::within(Duration::ZERO)).await,
            Err(RejectReason::WontMakeDeadline),
            "{}",
            kind.name()
        );
        assert!(before.elapsed() < SOON, "{}", kind.name());
        let ample = Opts::within(Duration::from_secs(60));
        assert_eq!(kind.call(1, ample).await, Ok(7), "{}", kind.name());

        let held = kind.hold().await;
        let before = Instant::now();
        let out = kind.call(1, Opts::within(Duration::from_millis(200))).await;
        let waited = before.elapsed();
        assert_eq!(out, Err(RejectReason::WontMakeDeadline), "{}", kind.name());
        assert!(
            waited >= Duration::from_millis(150) && waited < SOON,
            "{}: {waited:?}",
            kind.name()
        );
        drop(held);
    }
}

/// A `max_wait` of the call's own, shorter than the bulkhead's, ends its
/// wait then, as a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_max_wait_of_its_own_ends_the_wait() {
    let server = server();
    for kind in Kind::all(LONG, &server, "own-wait").await {
        let held = kind.hold().await;
        let own = Opts::wait(Duration::from_millis(150));
        let before = Instant::now();
        let out = kind.call(1, own).await;
        let waited = before.elapsed();
        assert_eq!(out, Err(RejectReason::Timeout), "{}", kind.name());
        assert!(
            waited >= Duration::from_millis(150) && waited < SOON,
            "{}: {waited:?}",
            kind.name()
        );
        drop(held);
        assert_eq!(kind.call(1, own).await, Ok(7), "{}", kind.name());
    }
}

/// A call's own `max_wait` never lengthens the bulkhead's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_max_wait_of_its_own_changes_nothing() {
    let server = server();
    let short = Duration::from_millis(150);
    for kind in Kind::all(short, &server, "own-longer").await {
        let held = kind.hold().await;
        let before = Instant::now();
        let out = kind.call(1, Opts::wait(LONG)).await;
        let waited = before.elapsed();
        assert_eq!(out, Err(RejectReason::Timeout), "{}", kind.name());
        assert!(
            waited >= Duration::from_millis(100) && waited < SOON,
            "{}: {waited:?}",
            kind.name()
        );
        drop(held);
    }
}

/// A `max_wait` of zero takes a free seat or is rejected at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_wait_of_zero_never_waits() {
    let server = server();
    for kind in Kind::all(LONG, &server, "own-zero").await {
        let zero = Opts::wait(Duration::ZERO);
        assert_eq!(kind.call(1, zero).await, Ok(7), "{}", kind.name());
        let held = kind.hold().await;
        let before = Instant::now();
        let out = kind.call(1, zero).await;
        assert!(before.elapsed() < SOON, "{}", kind.name());
        assert_eq!(out, Err(RejectReason::Full), "{}", kind.name());
        drop(held);
    }
}

/// Where there are classes, a seat that frees goes to the more important
/// waiter, whichever came first; where there are none, a class changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_orders_the_waiters_where_there_are_classes() {
    let server = server();
    for kind in Kind::all(LONG, &server, "class").await {
        let kind = Arc::new(kind);
        let classed = CLASSED.contains(&kind.name());
        let held = kind.hold().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        // Keyed: the first waits at its key's stage behind the held seat;
        // with a classed global, each at the global stage with a key of
        // its own.
        let second = if kind.name() == "keyed-classed" { 2 } else { 1 };
        for (key, class) in [(1, 1), (second, 0)] {
            let (waiter, order) = (kind.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let out = waiter.call(key, Opts::class(class)).await;
                order.lock().unwrap().push(class);
                out
            }));
            // Each waiter is in line before the next arrives.
            let deadline = Instant::now() + SOON;
            while kind.waiting() < waiters.len() {
                assert!(Instant::now() < deadline, "{}: nobody waits", kind.name());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        drop(held);
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), Ok(7), "{}", kind.name());
        }
        let order = order.lock().unwrap().clone();
        let expected = if classed { [0, 1] } else { [1, 0] };
        assert_eq!(order, expected, "{}", kind.name());
    }
}

/// Controlled delay on every kind: a line that stands (a call arriving
/// every 2 ms, each holding the one seat 10 ms) is cut to the target, so
/// waiters are rejected `QueueDelay` and nobody waits anywhere near the
/// 10 s `max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_line_is_cut_to_the_target_on_every_kind() {
    let server = server();
    let setup = Setup {
        max_wait: LONG,
        queue_delay: Some((Duration::from_millis(30), Duration::from_millis(100))),
    };
    for kind in Kind::all(setup, &server, "queue-delay").await {
        let kind = Arc::new(kind);
        let start = Instant::now();
        let mut calls = Vec::new();
        while start.elapsed() < Duration::from_millis(600) {
            let kind = kind.clone();
            calls.push(tokio::spawn(async move {
                let arrived = Instant::now();
                let out = kind
                    .call_holding(1, Opts::default(), Duration::from_millis(10))
                    .await;
                (out, arrived.elapsed())
            }));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut cut = 0;
        for call in calls {
            let (out, waited) = call.await.unwrap();
            assert!(waited < SOON, "{}: a call took {waited:?}", kind.name());
            match out {
                Ok(7) => {}
                Err(RejectReason::QueueDelay) => cut += 1,
                other => panic!("{}: {other:?}", kind.name()),
            }
        }
        assert!(cut > 0, "{}: the standing line was never cut", kind.name());
    }
}
