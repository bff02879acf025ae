//! The bulkhead layer (`Bulkhead::call`, `try_acquire`, the tower
//! `BulkheadLayer`) against what a user would write instead, all in one
//! run so the ratios between them mean something. Issue 10 sets the
//! targets; `benches/layer_report.py` prints the medians, the ratios and
//! whether each target holds.
//!
//! Contenders (the last part of every benchmark name):
//!
//! | name | what |
//! |---|---|
//! | `bulkhead` | `Bulkhead::call` (in the `tower` cell: `watertight::tower::BulkheadLayer`) |
//! | `bulkhead_try_acquire` | `Bulkhead::try_acquire` (`reject_full` only) |
//! | `bulkhead_tower` | `watertight::tower::BulkheadLayer`, driven like the tower stacks |
//! | `tokio` | a hand-rolled bulkhead: `Arc<tokio::sync::Semaphore>`, `try_acquire` to fail fast, `tokio::time::timeout` around the acquire (`max_wait`) and around the call (`call_timeout`) |
//! | `tokio_try_acquire` | a bare `tokio::sync::Semaphore::try_acquire` (`reject_full` only) |
//! | `tower` | tower 0.5: `ConcurrencyLimit`, with `Timeout` inside it for `call_timeout` and `LoadShed` in front to fail fast (`reject_full`); `max_wait` is a `tokio::time::timeout` around `ready()` |
//! | `tower_resilience` | `tower_resilience_bulkhead::BulkheadLayer` (its default mode, which waits in the response future like ours), with tower's `Timeout` inside it for `call_timeout` |
//!
//! Every contender runs the same guarded work, [`work`]: ready at once, or
//! `tokio::task::yield_now().await` once (the contended cells). The tower
//! stacks run it as `service_fn(work)`, the others as `call(work(..))`. The
//! limit is 8 everywhere.
//!
//! Cells (criterion groups; `contended` has six, one per variant):
//!
//! - `reject_full`: every permit is held (by permits, ready service clones
//!   or hanging calls, whatever holds one in that crate) and one call is
//!   rejected. Fail fast: `max_wait(Duration::ZERO)`, tower's `LoadShed`,
//!   tower-resilience's `reject_when_full`. No `call_timeout`. Target:
//!   `bulkhead` at most 2x `tokio`.
//! - `uncontended`: one call admitted at once and ready on its first poll,
//!   with `max_wait` and `call_timeout` of 10 s. Target: `bulkhead` no
//!   slower than `tokio`.
//! - `contended/ct`, `contended/ct_max_wait`, `contended/ct_timeouts` and
//!   the same three `contended/mt*`: 256 tasks share 8 permits, each
//!   doing `CONTENDED_CALLS / 256` calls whose work yields once, on a
//!   current-thread (`ct`) or two-worker (`mt`) runtime. No timeouts in
//!   the plain cells; `max_wait` 10 s in `_max_wait` (the case issue 10
//!   measured); `max_wait` and `call_timeout` 10 s in `_timeouts` (where
//!   tower's stack is `ConcurrencyLimit` + `Timeout`). Each task has its
//!   own clone of the bulkhead, semaphore handle or service (tower stacks:
//!   `ready().await`, then `call`). Target: `bulkhead` at least as fast as
//!   `tokio` and `tower` in all six.
//! - `tower`: 64 tasks, each `ready().await` then `call` on its own clone of
//!   a service whose work yields once, no timeouts, two-worker runtime:
//!   `BulkheadLayer` against tower's `ConcurrencyLimit` and
//!   tower-resilience. Target: `bulkhead` at least as fast as `tower`.
//!
//! The single-call cells (`reject_full`, `uncontended`) run their loop
//! inside one `block_on` of a current-thread runtime with the time driver
//! (so `tokio::time::timeout` works), the same for every crate; the times
//! are per call. The contended cells are timed per call too (criterion's
//! `Throughput::Elements`), spawning and joining included. All runtimes
//! enable the time driver; the bulkhead is built inside its runtime with
//! the default timer, so its waits sleep on the same clock and wheel as
//! tokio's.
//!
//! Before measuring, every contender is checked once, built by the same
//! function with 20 ms instead of 10 s: an admitted call returns `Ok`; with
//! `call_timeout`, a call that never finishes comes back as a call timeout
//! after the 20 ms; with `max_wait`, a call into a full limit is rejected,
//! after the 20 ms (waiting) or at once (fail fast). While measuring, every
//! call's result is counted (every rejection in `reject_full` must be an
//! error, every other call `Ok`), and after each benchmark every permit
//! must be free again. A watchdog aborts the run if a contended batch
//! makes no progress for 60 s.
//!
//! Run it with
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-bench cargo bench -p watertight-benches --bench layer --features tokio,tower
//! CARGO_TARGET_DIR=/work/target-bench python3 benches/layer_report.py
//! ```

use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    Bencher, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use tokio::runtime::{Builder, Runtime};
use tokio::sync::Semaphore;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::timeout::TimeoutLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_resilience_bulkhead::{BulkheadHandle, BulkheadServiceError};
use watertight::tower::BulkheadLayer;
use watertight::{Bulkhead, BulkheadError};

/// Permits in every cell.
const LIMIT: usize = 8;
/// `max_wait` and `call_timeout` where they are set: long enough never to
/// fire while measuring.
const LONG: Duration = Duration::from_secs(10);
/// What [`LONG`] becomes in the checks, so that they fire.
const CHECK: Duration = Duration::from_millis(20);
/// Tasks in the `contended/*` cells.
const CONTENDED_TASKS: usize = 256;
/// Calls per iteration of a `contended/*` cell, over all tasks.
const CONTENDED_CALLS: usize = 65_536;
/// Tasks in the `tower` cell.
const TOWER_TASKS: usize = 64;
/// Calls per iteration of the `tower` cell, over all tasks.
const TOWER_CALLS: usize = 65_536;
/// A contended batch that takes longer than this has lost a wake-up.
const HANG_TIMEOUT: Duration = Duration::from_secs(60);

/// What the guarded call does.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Finishes on its first poll.
    Ready,
    /// Yields to the scheduler once, then finishes.
    Yield,
    /// Never finishes (the checks of `call_timeout`, and holding permits).
    Hang,
}

/// The guarded work, the same for every contender.
async fn work(work: Work) -> Result<u32, Infallible> {
    match work {
        Work::Ready => {}
        Work::Yield => tokio::task::yield_now().await,
        Work::Hang => std::future::pending::<()>().await,
    }
    Ok(black_box(1))
}

/// A contender's policy.
#[derive(Clone, Copy, Debug)]
struct Settings {
    limit: usize,
    /// `None`: wait as long as it takes; zero: fail fast.
    max_wait: Option<Duration>,
    call_timeout: Option<Duration>,
}

impl Settings {
    const fn new(max_wait: Option<Duration>, call_timeout: Option<Duration>) -> Settings {
        Settings {
            limit: LIMIT,
            max_wait,
            call_timeout,
        }
    }

    /// The same policy with [`CHECK`] for every non-zero duration.
    fn checking(self) -> Settings {
        let short = |d: Duration| if d.is_zero() { d } else { CHECK };
        Settings {
            limit: self.limit,
            max_wait: self.max_wait.map(short),
            call_timeout: self.call_timeout.map(short),
        }
    }
}

/// How a call ended, for the checks.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// Not admitted: full (fail fast, load shed) or `max_wait` ran out.
    Rejected,
    /// Admitted, then dropped at `call_timeout`.
    CallTimeout,
    Other(String),
}

/// One contender, behind one trait so that every crate runs the same
/// monomorphised loops. Clones share the limit.
trait Peer: Clone + Send + 'static {
    type Error: fmt::Debug + Send;
    /// One guarded call of `work`.
    fn call(&mut self, work: Work) -> impl Future<Output = Result<u32, Self::Error>> + Send;
    fn classify(error: &Self::Error) -> Outcome;
    /// Takes all `limit` permits, the way they are held in this crate; they
    /// come back when the result is dropped. Needs a runtime context.
    fn hold_all(&self, limit: usize) -> Vec<Box<dyn Any>>;
    /// A handle that says how many permits are taken.
    fn probe(&self) -> Probe;
}

fn outcome<T, P: Peer>(result: &Result<T, P::Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(e) => P::classify(e),
    }
}

/// Says how many permits are taken, without holding the contender.
enum Probe {
    Bulkhead(Bulkhead),
    Tokio(Arc<Semaphore>, usize),
    Resilience(BulkheadHandle),
}

impl Probe {
    fn in_use(&self) -> usize {
        match self {
            Probe::Bulkhead(bh) => bh.metrics().in_flight(),
            Probe::Tokio(sem, limit) => limit - sem.available_permits(),
            Probe::Resilience(handle) => handle.active_calls(),
        }
    }
}

/// Polls `fut` once with a no-op waker.
fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    pin!(fut).poll(&mut Context::from_waker(Waker::noop()))
}

// ---------------------------------------------------------------------------
// bulkhead: `Bulkhead::call`

#[derive(Clone)]
struct BulkheadPeer(Bulkhead);

/// A bulkhead with `settings`, built inside `rt` with the default timer
/// (what a tokio user gets without configuring one: each wait sleeps on
/// the runtime it runs in).
fn bulkhead(rt: &Runtime, s: Settings) -> Bulkhead {
    let _entered = rt.enter();
    let mut b = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(s.limit);
    if let Some(d) = s.max_wait {
        b = b.max_wait(d);
    }
    if let Some(d) = s.call_timeout {
        b = b.call_timeout(d);
    }
    b.build().expect("the bench's bulkhead builds")
}

impl Peer for BulkheadPeer {
    type Error = BulkheadError<Infallible>;

    #[inline]
    fn call(&mut self, w: Work) -> impl Future<Output = Result<u32, Self::Error>> + Send {
        self.0.call(work(w))
    }

    fn classify(error: &Self::Error) -> Outcome {
        match error {
            BulkheadError::Rejected(_) => Outcome::Rejected,
            BulkheadError::CallTimeout(_) => Outcome::CallTimeout,
            BulkheadError::Inner(never) => match *never {},
            // Non-exhaustive: a variant added later.
            other => Outcome::Other(format!("{other:?}")),
        }
    }

    fn hold_all(&self, limit: usize) -> Vec<Box<dyn Any>> {
        (0..limit)
            .map(|_| Box::new(self.0.try_acquire().expect("a free permit")) as Box<dyn Any>)
            .collect()
    }

    fn probe(&self) -> Probe {
        Probe::Bulkhead(self.0.clone())
    }
}

// ---------------------------------------------------------------------------
// tokio: the bulkhead a tokio user writes by hand

/// `Arc<tokio::sync::Semaphore>` with the same policy as a bulkhead.
#[derive(Clone)]
struct HandRolled {
    sem: Arc<Semaphore>,
    limit: usize,
    max_wait: Option<Duration>,
    call_timeout: Option<Duration>,
}

#[derive(Debug)]
#[allow(dead_code)] // `Inner` is read through `Debug` only
enum HandRolledError<E> {
    Full,
    WaitTimeout,
    Closed,
    CallTimeout,
    Inner(E),
}

impl HandRolled {
    fn new(s: Settings) -> HandRolled {
        HandRolled {
            sem: Arc::new(Semaphore::new(s.limit)),
            limit: s.limit,
            max_wait: s.max_wait,
            call_timeout: s.call_timeout,
        }
    }

    async fn call<T, E>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, HandRolledError<E>> {
        use tokio::sync::TryAcquireError;
        let _permit = match self.max_wait {
            Some(d) if d.is_zero() => self.sem.try_acquire().map_err(|e| match e {
                TryAcquireError::NoPermits => HandRolledError::Full,
                TryAcquireError::Closed => HandRolledError::Closed,
            })?,
            Some(d) => match tokio::time::timeout(d, self.sem.acquire()).await {
                Ok(permit) => permit.map_err(|_| HandRolledError::Closed)?,
                Err(_) => return Err(HandRolledError::WaitTimeout),
            },
            None => self
                .sem
                .acquire()
                .await
                .map_err(|_| HandRolledError::Closed)?,
        };
        match self.call_timeout {
            Some(d) => match tokio::time::timeout(d, call).await {
                Ok(result) => result.map_err(HandRolledError::Inner),
                Err(_) => Err(HandRolledError::CallTimeout),
            },
            None => call.await.map_err(HandRolledError::Inner),
        }
    }
}

impl Peer for HandRolled {
    type Error = HandRolledError<Infallible>;

    #[inline]
    fn call(&mut self, w: Work) -> impl Future<Output = Result<u32, Self::Error>> + Send {
        HandRolled::call(self, work(w))
    }

    fn classify(error: &Self::Error) -> Outcome {
        match error {
            HandRolledError::Full | HandRolledError::WaitTimeout => Outcome::Rejected,
            HandRolledError::CallTimeout => Outcome::CallTimeout,
            other => Outcome::Other(format!("{other:?}")),
        }
    }

    fn hold_all(&self, limit: usize) -> Vec<Box<dyn Any>> {
        let permits = self.sem.clone().try_acquire_many_owned(limit as u32);
        vec![Box::new(permits.expect("free permits"))]
    }

    fn probe(&self) -> Probe {
        Probe::Tokio(self.sem.clone(), self.limit)
    }
}

// ---------------------------------------------------------------------------
// Tower stacks: tower's own, tower-resilience-bulkhead, and our layer

/// A tower service driven as a tower user does: `ready().await`, then
/// `call`. `ready_timeout` bounds the `ready()` (tower's own stacks wait
/// for a permit there, and tower has no layer for that).
#[derive(Clone)]
struct TowerPeer<S> {
    svc: S,
    ready_timeout: Option<Duration>,
    hold: HoldBy,
    probe: ProbeBy,
}

/// How the permits of a tower stack are held.
#[derive(Clone)]
enum HoldBy {
    /// Clones polled ready (tower's `ConcurrencyLimit` takes its permit in
    /// `poll_ready`).
    ReadyClones,
    /// Calls of [`Work::Hang`] polled once (the permit is taken in the
    /// response future).
    HangingCalls,
    /// The bulkhead behind the layer.
    Bulkhead(Bulkhead),
}

#[derive(Clone)]
enum ProbeBy {
    Bulkhead(Bulkhead),
    Tokio(Arc<Semaphore>, usize),
    Resilience(BulkheadHandle),
}

#[derive(Debug)]
enum TowerError<E> {
    Service(E),
    /// The `ready()` ran past `ready_timeout`.
    WaitTimeout,
}

/// Sorts a tower stack's error into an [`Outcome`].
trait Classify {
    fn classify(&self) -> Outcome;
}

impl Classify for Infallible {
    fn classify(&self) -> Outcome {
        match *self {}
    }
}

impl Classify for BoxError {
    fn classify(&self) -> Outcome {
        if self.is::<tower::load_shed::error::Overloaded>() || self.is::<watertight::Rejected>() {
            Outcome::Rejected
        } else if self.is::<tower::timeout::error::Elapsed>()
            || self.is::<watertight::tower::CallTimeout>()
        {
            Outcome::CallTimeout
        } else {
            Outcome::Other(self.to_string())
        }
    }
}

impl<E: Classify> Classify for BulkheadServiceError<E> {
    fn classify(&self) -> Outcome {
        match self {
            BulkheadServiceError::Bulkhead(_) => Outcome::Rejected,
            BulkheadServiceError::Inner(e) => e.classify(),
        }
    }
}

impl<S> Peer for TowerPeer<S>
where
    S: Service<Work, Response = u32> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Classify + fmt::Debug + Send + 'static,
{
    type Error = TowerError<S::Error>;

    #[inline]
    async fn call(&mut self, w: Work) -> Result<u32, Self::Error> {
        match self.ready_timeout {
            Some(d) => match tokio::time::timeout(d, self.svc.ready()).await {
                Ok(ready) => ready.map_err(TowerError::Service)?,
                Err(_) => return Err(TowerError::WaitTimeout),
            },
            None => self.svc.ready().await.map_err(TowerError::Service)?,
        };
        self.svc.call(w).await.map_err(TowerError::Service)
    }

    fn classify(error: &Self::Error) -> Outcome {
        match error {
            TowerError::Service(e) => e.classify(),
            TowerError::WaitTimeout => Outcome::Rejected,
        }
    }

    fn hold_all(&self, limit: usize) -> Vec<Box<dyn Any>> {
        let mut held: Vec<Box<dyn Any>> = Vec::with_capacity(limit);
        for _ in 0..limit {
            match &self.hold {
                HoldBy::ReadyClones => {
                    let mut svc = self.svc.clone();
                    assert!(
                        matches!(poll_once(svc.ready()), Poll::Ready(Ok(_))),
                        "a clone of a free stack is ready"
                    );
                    held.push(Box::new(svc));
                }
                HoldBy::HangingCalls => {
                    let mut svc = self.svc.clone();
                    assert!(
                        matches!(poll_once(svc.ready()), Poll::Ready(Ok(_))),
                        "the stack is ready"
                    );
                    let mut call = Box::pin(svc.call(Work::Hang));
                    assert!(
                        poll_once(call.as_mut()).is_pending(),
                        "a hanging call hangs"
                    );
                    held.push(Box::new((svc, call)));
                }
                HoldBy::Bulkhead(bh) => {
                    held.push(Box::new(bh.try_acquire().expect("a free permit")));
                }
            }
        }
        held
    }

    fn probe(&self) -> Probe {
        match &self.probe {
            ProbeBy::Bulkhead(bh) => Probe::Bulkhead(bh.clone()),
            ProbeBy::Tokio(sem, limit) => Probe::Tokio(sem.clone(), *limit),
            ProbeBy::Resilience(handle) => Probe::Resilience(handle.clone()),
        }
    }
}

/// The bounds every tower stack here meets.
trait Stack<E>:
    Service<Work, Response = u32, Error = E, Future: Send + 'static> + Clone + Send + 'static
{
}
impl<S, E> Stack<E> for S where
    S: Service<Work, Response = u32, Error = E, Future: Send + 'static> + Clone + Send + 'static
{
}

/// tower's `ConcurrencyLimit` + `Timeout`: `max_wait` bounds `ready()`,
/// `call_timeout` is the `Timeout` layer inside the limit (it bounds the
/// call, not the wait). `ConcurrencyLimitLayer::new(n)` builds the same
/// service over `Arc::new(Semaphore::new(n))`; the bench keeps the
/// semaphore to check that every permit came back.
fn tower_limit_timeout(s: Settings) -> TowerPeer<impl Stack<BoxError>> {
    let sem = Arc::new(Semaphore::new(s.limit));
    let svc = ServiceBuilder::new()
        .layer(GlobalConcurrencyLimitLayer::with_semaphore(sem.clone()))
        .layer(TimeoutLayer::new(
            s.call_timeout.expect("this stack has a call timeout"),
        ))
        .service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: s.max_wait,
        hold: HoldBy::ReadyClones,
        probe: ProbeBy::Tokio(sem, s.limit),
    }
}

/// tower's `ConcurrencyLimit` without `Timeout`; `max_wait` bounds
/// `ready()`.
fn tower_limit(s: Settings) -> TowerPeer<impl Stack<Infallible>> {
    assert!(s.call_timeout.is_none());
    let sem = Arc::new(Semaphore::new(s.limit));
    let svc = ServiceBuilder::new()
        .layer(GlobalConcurrencyLimitLayer::with_semaphore(sem.clone()))
        .service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: s.max_wait,
        hold: HoldBy::ReadyClones,
        probe: ProbeBy::Tokio(sem, s.limit),
    }
}

/// tower's `LoadShed` over `ConcurrencyLimit`: fail fast (`reject_full`).
fn tower_load_shed(s: Settings) -> TowerPeer<impl Stack<BoxError>> {
    assert!(s.max_wait == Some(Duration::ZERO) && s.call_timeout.is_none());
    let sem = Arc::new(Semaphore::new(s.limit));
    let svc = ServiceBuilder::new()
        .load_shed()
        .layer(GlobalConcurrencyLimitLayer::with_semaphore(sem.clone()))
        .service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: None,
        hold: HoldBy::ReadyClones,
        probe: ProbeBy::Tokio(sem, s.limit),
    }
}

/// tower-resilience-bulkhead's layer with `max_wait` as its
/// `max_wait_duration` (zero is its `reject_when_full`).
fn resilience_layer(s: Settings) -> (tower_resilience_bulkhead::BulkheadLayer, BulkheadHandle) {
    let mut b = tower_resilience_bulkhead::BulkheadLayer::builder()
        .name("bench")
        .max_concurrent_calls(s.limit);
    if let Some(d) = s.max_wait {
        b = b.max_wait_duration(d);
    }
    b.build_with_handle()
        .expect("the bench's tower-resilience bulkhead builds")
}

/// tower-resilience-bulkhead, with tower's `Timeout` inside it for
/// `call_timeout` (it has none of its own).
fn resilience_timeout(s: Settings) -> TowerPeer<impl Stack<BulkheadServiceError<BoxError>>> {
    let (layer, handle) = resilience_layer(s);
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(TimeoutLayer::new(
            s.call_timeout.expect("this stack has a call timeout"),
        ))
        .service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: None,
        hold: HoldBy::HangingCalls,
        probe: ProbeBy::Resilience(handle),
    }
}

/// tower-resilience-bulkhead without a call timeout.
fn resilience(s: Settings) -> TowerPeer<impl Stack<BulkheadServiceError<Infallible>>> {
    assert!(s.call_timeout.is_none());
    let (layer, handle) = resilience_layer(s);
    let svc = ServiceBuilder::new().layer(layer).service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: None,
        hold: HoldBy::HangingCalls,
        probe: ProbeBy::Resilience(handle),
    }
}

/// Our `BulkheadLayer` over the same work.
fn bulkhead_layer(rt: &Runtime, s: Settings) -> TowerPeer<impl Stack<BoxError>> {
    let bh = bulkhead(rt, s);
    let svc = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()))
        .service(service_fn(work));
    TowerPeer {
        svc,
        ready_timeout: None,
        hold: HoldBy::Bulkhead(bh.clone()),
        probe: ProbeBy::Bulkhead(bh),
    }
}

// ---------------------------------------------------------------------------
// Checks and loops

/// Checks once that `make` builds a contender that does the work the cell
/// claims: admitted calls succeed, `call_timeout` and `max_wait` fire, a
/// full limit rejects. Built with [`Settings::checking`].
fn check<P: Peer>(rt: &Runtime, what: &str, settings: Settings, make: &dyn Fn(Settings) -> P) {
    let s = settings.checking();
    let _enter = rt.enter();
    let mut peer = make(s);
    let probe = peer.probe();
    rt.block_on(async {
        for w in [Work::Ready, Work::Yield] {
            let r = peer.call(w).await;
            assert_eq!(
                outcome::<_, P>(&r),
                Outcome::Ok,
                "{what}: a {w:?} call: {r:?}"
            );
        }
        assert_eq!(probe.in_use(), 0, "{what}: a permit is still taken");
        if s.call_timeout.is_some() {
            let start = Instant::now();
            let r = peer.call(Work::Hang).await;
            let took = start.elapsed();
            assert_eq!(outcome::<_, P>(&r), Outcome::CallTimeout, "{what}: {r:?}");
            assert!(
                took >= CHECK * 9 / 10,
                "{what}: call timeout after {took:?}"
            );
        }
        if let Some(max_wait) = s.max_wait {
            let held = peer.hold_all(s.limit);
            assert_eq!(probe.in_use(), s.limit, "{what}: the limit is not held");
            let start = Instant::now();
            let r = peer.call(Work::Ready).await;
            let took = start.elapsed();
            assert_eq!(outcome::<_, P>(&r), Outcome::Rejected, "{what}: {r:?}");
            if max_wait.is_zero() {
                assert!(took < CHECK, "{what}: failing fast took {took:?}");
            } else {
                assert!(took >= max_wait * 9 / 10, "{what}: max_wait after {took:?}");
            }
            drop(held);
        }
    });
    drop(peer);
    assert_eq!(probe.in_use(), 0, "{what}: a permit was lost");
}

/// `iters` calls of [`Work::Ready`] one after another in one task; every
/// call's result must be `Ok` (if `admitted`) or an error.
fn serial<P: Peer>(rt: &Runtime, peer: &mut P, admitted: bool, iters: u64) -> Duration {
    rt.block_on(async {
        let mut ok = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            ok += u64::from(black_box(peer.call(Work::Ready).await).is_ok());
        }
        let took = start.elapsed();
        assert_eq!(ok, if admitted { iters } else { 0 }, "a call ended wrongly");
        took
    })
}

/// `tasks` tasks, each `calls / tasks` calls of [`Work::Yield`] on its own
/// clone of `peer`, `iters` times over.
fn contended<P: Peer>(rt: &Runtime, peer: &P, tasks: usize, calls: usize, iters: u64) -> Duration {
    let per_task = calls / tasks;
    let _watch = Watchdog::arm();
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let mut handles = Vec::with_capacity(tasks);
            for _ in 0..tasks {
                let mut peer = peer.clone();
                handles.push(tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..per_task {
                        ok += usize::from(peer.call(Work::Yield).await.is_ok());
                    }
                    ok
                }));
            }
            for handle in handles {
                let ok = handle.await.expect("a benchmark task panicked");
                assert_eq!(ok, per_task, "a contended call failed");
            }
        }
        start.elapsed()
    })
}

/// One cell: its runtime, policy and load, shared by its contenders.
struct Cell<'a> {
    /// `reject_full`, `contended/ct_max_wait`, ...
    name: String,
    /// The variant part of the criterion id (the `contended` group), if any.
    variant: Option<&'a str>,
    rt: &'a Runtime,
    settings: Settings,
    load: Load,
}

#[derive(Clone, Copy)]
enum Load {
    /// One call at a time in one task; with `full`, every permit is held
    /// and every call rejected.
    Serial { full: bool },
    /// `tasks` tasks making `calls` calls among them per iteration.
    Tasks { tasks: usize, calls: usize },
}

impl Cell<'_> {
    /// Checks the contender `name` that `make` builds, then measures it.
    /// Criterion calls the closure once per sample, so the checks, the
    /// build and the holding of permits happen outside it, once.
    fn bench<P: Peer>(
        &self,
        g: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        make: &dyn Fn(Settings) -> P,
    ) {
        let what = format!("{}/{name}", self.name);
        check(self.rt, &what, self.settings, make);
        let _enter = self.rt.enter();
        let mut peer = make(self.settings);
        let probe = peer.probe();
        let full = matches!(self.load, Load::Serial { full: true });
        let held = full.then(|| peer.hold_all(self.settings.limit));
        let (rt, load) = (self.rt, self.load);
        let mut run = |b: &mut Bencher<'_>| {
            b.iter_custom(|iters| match load {
                Load::Serial { full } => serial(rt, &mut peer, !full, iters),
                Load::Tasks { tasks, calls } => contended(rt, &peer, tasks, calls, iters),
            })
        };
        match self.variant {
            Some(v) => g.bench_function(BenchmarkId::new(v, name), &mut run),
            None => g.bench_function(name, &mut run),
        };
        drop(held);
        drop(peer);
        assert_eq!(probe.in_use(), 0, "{what}: a permit was lost");
    }
}

/// Aborts the process if a batch of contended rounds runs longer than
/// [`HANG_TIMEOUT`]: a thread of its own, so the measured runtimes carry no
/// extra timer.
struct Watchdog;

static BATCH_STARTED: Mutex<Option<Instant>> = Mutex::new(None);

impl Watchdog {
    fn arm() -> Watchdog {
        static THREAD: OnceLock<()> = OnceLock::new();
        THREAD.get_or_init(|| {
            std::thread::spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    let started = *BATCH_STARTED.lock().unwrap();
                    if started.is_some_and(|t| t.elapsed() > HANG_TIMEOUT) {
                        eprintln!(
                            "contended benchmark made no progress for {HANG_TIMEOUT:?}: \
                             a lost wake-up or leaked permit; aborting"
                        );
                        std::process::abort();
                    }
                }
            });
        });
        *BATCH_STARTED.lock().unwrap() = Some(Instant::now());
        Watchdog
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *BATCH_STARTED.lock().unwrap() = None;
    }
}

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Cells

fn bench_reject_full(c: &mut Criterion) {
    let rt = current_thread();
    let s = Settings::new(Some(Duration::ZERO), None);
    let cell = Cell {
        name: "reject_full".into(),
        variant: None,
        rt: &rt,
        settings: s,
        load: Load::Serial { full: true },
    };
    let mut g = c.benchmark_group("reject_full");
    g.throughput(Throughput::Elements(1));

    cell.bench(&mut g, "bulkhead", &|s| BulkheadPeer(bulkhead(&rt, s)));
    {
        let _enter = rt.enter();
        let bh = bulkhead(&rt, s);
        let held = BulkheadPeer(bh.clone()).hold_all(s.limit);
        assert!(bh.try_acquire().is_err(), "a full bulkhead rejects");
        g.bench_function("bulkhead_try_acquire", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut ok = 0u64;
                    let start = Instant::now();
                    for _ in 0..iters {
                        ok += u64::from(black_box(bh.try_acquire()).is_ok());
                    }
                    let took = start.elapsed();
                    assert_eq!(ok, 0, "a full bulkhead admitted a call");
                    took
                })
            })
        });
        drop(held);
        assert_eq!(bh.metrics().in_flight(), 0);
    }
    cell.bench(&mut g, "bulkhead_tower", &|s| bulkhead_layer(&rt, s));
    cell.bench(&mut g, "tokio", &HandRolled::new);
    {
        let sem = Semaphore::new(s.limit);
        let held = sem.try_acquire_many(s.limit as u32).unwrap();
        assert!(sem.try_acquire().is_err(), "a full semaphore rejects");
        g.bench_function("tokio_try_acquire", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut ok = 0u64;
                    let start = Instant::now();
                    for _ in 0..iters {
                        ok += u64::from(black_box(sem.try_acquire()).is_ok());
                    }
                    let took = start.elapsed();
                    assert_eq!(ok, 0, "a full semaphore admitted a call");
                    took
                })
            })
        });
        drop(held);
        assert_eq!(sem.available_permits(), s.limit);
    }
    cell.bench(&mut g, "tower", &tower_load_shed);
    cell.bench(&mut g, "tower_resilience", &resilience);
    g.finish();
}

fn bench_uncontended(c: &mut Criterion) {
    let rt = current_thread();
    let cell = Cell {
        name: "uncontended".into(),
        variant: None,
        rt: &rt,
        settings: Settings::new(Some(LONG), Some(LONG)),
        load: Load::Serial { full: false },
    };
    let mut g = c.benchmark_group("uncontended");
    g.throughput(Throughput::Elements(1));

    cell.bench(&mut g, "bulkhead", &|s| BulkheadPeer(bulkhead(&rt, s)));
    cell.bench(&mut g, "bulkhead_tower", &|s| bulkhead_layer(&rt, s));
    cell.bench(&mut g, "tokio", &HandRolled::new);
    cell.bench(&mut g, "tower", &tower_limit_timeout);
    cell.bench(&mut g, "tower_resilience", &resilience_timeout);
    g.finish();
}

fn bench_contended(c: &mut Criterion) {
    let variants = [
        ("", Settings::new(None, None)),
        ("_max_wait", Settings::new(Some(LONG), None)),
        ("_timeouts", Settings::new(Some(LONG), Some(LONG))),
    ];
    let mut g = c.benchmark_group("contended");
    g.sample_size(10)
        .throughput(Throughput::Elements(CONTENDED_CALLS as u64));
    for (flavor, rt) in [("ct", current_thread()), ("mt", multi_thread())] {
        for (suffix, settings) in variants {
            let variant = format!("{flavor}{suffix}");
            let cell = Cell {
                name: format!("contended/{variant}"),
                variant: Some(&variant),
                rt: &rt,
                settings,
                load: Load::Tasks {
                    tasks: CONTENDED_TASKS,
                    calls: CONTENDED_CALLS,
                },
            };
            cell.bench(&mut g, "bulkhead", &|s| BulkheadPeer(bulkhead(&rt, s)));
            cell.bench(&mut g, "tokio", &HandRolled::new);
            if settings.call_timeout.is_some() {
                cell.bench(&mut g, "tower", &tower_limit_timeout);
                cell.bench(&mut g, "tower_resilience", &resilience_timeout);
            } else {
                cell.bench(&mut g, "tower", &tower_limit);
                cell.bench(&mut g, "tower_resilience", &resilience);
            }
        }
    }
    g.finish();
}

fn bench_tower(c: &mut Criterion) {
    let rt = multi_thread();
    let cell = Cell {
        name: "tower".into(),
        variant: None,
        rt: &rt,
        settings: Settings::new(None, None),
        load: Load::Tasks {
            tasks: TOWER_TASKS,
            calls: TOWER_CALLS,
        },
    };
    let mut g = c.benchmark_group("tower");
    g.sample_size(10)
        .throughput(Throughput::Elements(TOWER_CALLS as u64));

    cell.bench(&mut g, "bulkhead", &|s| bulkhead_layer(&rt, s));
    cell.bench(&mut g, "tower", &tower_limit);
    cell.bench(&mut g, "tower_resilience", &resilience);
    g.finish();
}

criterion_group! {
    name = benches;
    // Plots cost seconds per benchmark; `benches/layer_report.py` prints
    // the tables. Command-line times (`--warm-up-time`,
    // `--measurement-time`) override these.
    config = Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = bench_reject_full, bench_uncontended, bench_contended, bench_tower
}
criterion_main!(benches);
