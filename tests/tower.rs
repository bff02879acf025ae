//! `watertight::tower`: the bulkhead as a tower layer, in real hyper server
//! and client stacks on loopback, and at the service level for what a
//! network cannot show precisely: no permit held by idle (ready) services,
//! the wait policy, typed errors through `BoxError`, and permits released
//! when a response future is dropped.
#![cfg(all(not(loom), feature = "tower"))]

use std::convert::Infallible;
use std::future::pending;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore as Gate};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};
use tower::limit::ConcurrencyLimit;
use tower::{Service, ServiceBuilder, ServiceExt};
use watertight::observer::{Finished, Observer};
use watertight::tower::{BoxError, BulkheadLayer, BulkheadService, CallTimeout};
use watertight::{Bulkhead, CallOutcome, RejectReason, Rejected};

/// A whole test fails, rather than hangs, past this.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// A handler that counts the requests it is working on
// ---------------------------------------------------------------------------

/// What the handler saw.
#[derive(Debug, Default)]
struct Stats {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    served: AtomicU64,
    /// Notified whenever a request enters the handler.
    arrived: Notify,
}

impl Stats {
    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// How the handler works on a request.
#[derive(Clone)]
enum Work {
    /// Sleeps this long.
    Sleep(Duration),
    /// Waits for a permit from the gate (which the test hands out).
    Gate(Arc<Gate>),
}

/// Counts the request in flight while it works, then answers 200 "ok".
async fn handle(stats: Arc<Stats>, work: Work) -> Result<Response<Full<Bytes>>, Infallible> {
    /// Uncounts the request even if its future is dropped.
    struct Counted<'a>(&'a Stats);
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let counted = Counted(&stats);
    stats.peak.fetch_max(now, Ordering::SeqCst);
    stats.arrived.notify_one();
    match work {
        Work::Sleep(d) => sleep(d).await,
        Work::Gate(gate) => gate.acquire().await.expect("gate closed").forget(),
    }
    stats.served.fetch_add(1, Ordering::SeqCst);
    drop(counted);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

// ---------------------------------------------------------------------------
// A hyper server that serves a tower service
// ---------------------------------------------------------------------------

/// An HTTP/1.1 server on `127.0.0.1`, stopped (no new connections) on drop.
struct Server {
    addr: SocketAddr,
    accept_loop: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

/// Serves `service` (a tower service) on a fresh loopback port: each
/// connection gets a clone, and each request is handed to a clone of that
/// with `oneshot` (what `hyper_util::service::TowerToHyperService` does).
async fn serve<S>(service: S) -> Server
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let accept_loop = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.expect("accept");
            let service = service.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request| service.clone().oneshot(request));
                // A failed connection shows up in the client's result.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Server { addr, accept_loop }
}

/// The server's stack: a bulkhead in front of the counting handler, and
/// above it a layer that answers a rejection with `503` and the reason
/// (where a hyper server would otherwise close the connection).
async fn serve_with_bulkhead(bh: &Bulkhead, stats: &Arc<Stats>, work: Work) -> Server {
    let stats = stats.clone();
    let service = ServiceBuilder::new()
        .map_result(rejection_to_503)
        .layer(BulkheadLayer::new(bh.clone()))
        .service_fn(move |_request: Request<Incoming>| handle(stats.clone(), work.clone()));
    serve(service).await
}

fn rejection_to_503(
    result: Result<Response<Full<Bytes>>, BoxError>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    match result {
        Err(e) => match e.downcast_ref::<Rejected>() {
            Some(rejected) => {
                let mut busy = Response::new(Full::new(Bytes::from(rejected.to_string())));
                *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                busy.headers_mut().insert(
                    "x-bulkhead-reject-reason",
                    rejected.reason().as_str().parse().unwrap(),
                );
                Ok(busy)
            }
            None => Err(e),
        },
        ok => ok,
    }
}

// ---------------------------------------------------------------------------
// A hyper client as a tower service
// ---------------------------------------------------------------------------

/// `GET /` on a connection of its own; the status and the whole body.
async fn get(addr: SocketAddr) -> Result<(StatusCode, Bytes), BoxError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = Request::get("/")
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// A hyper client as a tower service: `GET /` for each `()`.
fn client(
    addr: SocketAddr,
) -> impl Service<(), Response = (StatusCode, Bytes), Error = BoxError, Future: Send>
+ Clone
+ Send
+ 'static {
    tower::service_fn(move |()| get(addr))
}

// ---------------------------------------------------------------------------
// An observer that records how calls ended
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Outcomes(Mutex<Vec<CallOutcome>>);

impl Outcomes {
    fn take(&self) -> Vec<CallOutcome> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl Observer for Outcomes {
    fn on_finished(&self, event: &Finished<'_>) {
        self.0.lock().unwrap().push(event.outcome);
    }
}

fn ok_service()
-> impl Service<(), Response = &'static str, Error = Infallible, Future: Send> + Clone + Send + 'static
{
    tower::service_fn(|()| async { Ok::<_, Infallible>("ok") })
}

/// Polls once with a no-op waker: `None` if the future is pending.
fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    fut.now_or_never()
}

// ---------------------------------------------------------------------------
// Real hyper stacks on loopback
// ---------------------------------------------------------------------------

/// Many concurrent requests from hyper clients to a hyper server whose
/// stack has a `BulkheadLayer` of `N` that waits as long as it takes: the
/// handler never works on more than `N` at once, and every request is
/// answered `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hyper_server_behind_the_layer_never_exceeds_the_limit() {
    const N: usize = 4;
    const REQUESTS: usize = 200;

    timeout(PATIENCE, async {
        let bh = Bulkhead::builder()
            .name("server")
            .max_concurrent_calls(N)
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        let server = serve_with_bulkhead(&bh, &stats, Work::Sleep(Duration::from_millis(5))).await;

        let requests: Vec<_> = (0..REQUESTS)
            .map(|_| tokio::spawn(get(server.addr)))
            .collect();
        for request in requests {
            let (status, body) = request
                .await
                .expect("client task panicked")
                .expect("request failed");
            assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
        }

        println!("server peak {}, bulkhead {:?}", stats.peak(), bh.metrics());
        assert!(
            stats.peak() <= N,
            "the handler saw {} at once",
            stats.peak()
        );
        assert_eq!(
            stats.peak(),
            N,
            "the limit was never reached: a vacuous test"
        );
        assert_eq!(stats.served(), REQUESTS as u64);
        let m = bh.metrics();
        assert_eq!((m.permitted(), m.rejected()), (REQUESTS as u64, 0));
        assert_eq!((m.in_flight(), m.queued()), (0, 0));
    })
    .await
    .expect("the test hung");
}

/// The same from the client's side: a hyper client wrapped in the layer
/// (a bulkhead guarding a downstream), many requests at once from clones
/// of one client service, and a server with no limit of its own that never
/// sees more than `N` of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hyper_client_behind_the_layer_never_sends_more_than_the_limit() {
    const N: usize = 3;
    const REQUESTS: usize = 150;

    timeout(PATIENCE, async {
        let stats = Arc::new(Stats::default());
        let server = serve(tower::service_fn({
            let stats = stats.clone();
            move |_request: Request<Incoming>| {
                handle(stats.clone(), Work::Sleep(Duration::from_millis(5)))
            }
        }))
        .await;
        let bh = Bulkhead::builder()
            .name("downstream")
            .max_concurrent_calls(N)
            .max_wait(Duration::from_secs(10))
            .build()
            .unwrap();
        let client = ServiceBuilder::new()
            .layer(BulkheadLayer::new(bh.clone()))
            .service(client(server.addr));

        let requests: Vec<_> = (0..REQUESTS)
            .map(|_| tokio::spawn(client.clone().oneshot(())))
            .collect();
        for request in requests {
            let (status, _) = request
                .await
                .expect("client task panicked")
                .expect("request failed");
            assert_eq!(status, StatusCode::OK);
        }

        assert!(stats.peak() <= N, "the server saw {} at once", stats.peak());
        assert_eq!(
            stats.peak(),
            N,
            "the limit was never reached: a vacuous test"
        );
        assert_eq!(stats.served(), REQUESTS as u64);
        let m = bh.metrics();
        assert_eq!(
            (m.permitted(), m.in_flight(), m.queued()),
            (REQUESTS as u64, 0, 0)
        );
    })
    .await
    .expect("the test hung");
}

/// A fail-fast bulkhead in a hyper client stack: while one request is in
/// flight, the next fails with a `BoxError` that downcasts to `Rejected`
/// with reason `Full`, and never reaches the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_fast_rejection_in_a_client_stack_downcasts_to_rejected() {
    timeout(PATIENCE, async {
        let stats = Arc::new(Stats::default());
        let gate = Arc::new(Gate::new(0));
        let server = serve(tower::service_fn({
            let (stats, gate) = (stats.clone(), gate.clone());
            move |_request: Request<Incoming>| handle(stats.clone(), Work::Gate(gate.clone()))
        }))
        .await;
        let bh = Bulkhead::builder()
            .name("partner")
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let client = ServiceBuilder::new()
            .layer(BulkheadLayer::new(bh.clone()))
            .service(client(server.addr));

        let first = tokio::spawn(client.clone().oneshot(()));
        stats.arrived.notified().await;

        let err: BoxError = client.clone().oneshot(()).await.unwrap_err();
        let rejected = err
            .downcast_ref::<Rejected>()
            .unwrap_or_else(|| panic!("not a rejection: {err:?}"));
        assert_eq!(rejected.reason(), RejectReason::Full);
        assert_eq!(rejected.name(), "partner");
        assert_eq!(rejected.waited(), Duration::ZERO);
        assert_eq!(err.to_string(), r#"bulkhead "partner" is full"#);
        assert!(err.downcast_ref::<hyper::Error>().is_none());
        assert_eq!(
            stats.in_flight(),
            1,
            "the rejected request reached the server"
        );

        gate.add_permits(1);
        let (status, _) = first.await.unwrap().expect("the first request failed");
        assert_eq!(status, StatusCode::OK);
        let m = bh.metrics();
        assert_eq!((m.permitted(), m.rejected_full(), m.in_flight()), (1, 1, 0));
        assert_eq!((stats.peak(), stats.served()), (1, 1));
    })
    .await
    .expect("the test hung");
}

/// A fail-fast bulkhead in a hyper server stack, with rejections turned
/// into `503` above it: the reason reaches the client, and the handler sees
/// only the admitted request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_fast_rejection_in_a_server_stack_becomes_a_503() {
    timeout(PATIENCE, async {
        let bh = Bulkhead::builder()
            .name("server")
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        let gate = Arc::new(Gate::new(0));
        let server = serve_with_bulkhead(&bh, &stats, Work::Gate(gate.clone())).await;

        let first = tokio::spawn(get(server.addr));
        stats.arrived.notified().await;
        let (status, body) = get(server.addr).await.expect("request failed");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(&body[..], br#"bulkhead "server" is full"#);

        gate.add_permits(1);
        let (status, _) = first.await.unwrap().expect("the first request failed");
        assert_eq!(status, StatusCode::OK);
        assert_eq!((stats.peak(), stats.served()), (1, 1));
        let m = bh.metrics();
        assert_eq!((m.permitted(), m.rejected_full(), m.in_flight()), (1, 1, 0));
    })
    .await
    .expect("the test hung");
}

/// A client that hangs up while its request is in a handler: hyper drops
/// the service's response future, and the permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_releases_the_servers_permit() {
    timeout(PATIENCE, async {
        let outcomes = Arc::new(Outcomes::default());
        let bh = Bulkhead::builder()
            .name("server")
            .max_concurrent_calls(1)
            .observer(outcomes.clone())
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        let gate = Arc::new(Gate::new(0)); // never opened
        let server = serve_with_bulkhead(&bh, &stats, Work::Gate(gate)).await;

        let hung_up = tokio::spawn(get(server.addr));
        stats.arrived.notified().await;
        assert_eq!(bh.metrics().in_flight(), 1);
        hung_up.abort(); // drops the client's connection
        let _ = hung_up.await;

        while bh.metrics().in_flight() != 0 {
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(stats.in_flight(), 0);
        assert_eq!(outcomes.take(), [CallOutcome::Cancelled]);
        assert!(bh.try_acquire().is_ok());
    })
    .await
    .expect("the permit was never released");
}

// ---------------------------------------------------------------------------
// No permit while idle
// ---------------------------------------------------------------------------

/// Ten clones of the service that were polled ready and then sit idle hold
/// no permit: the bulkhead shows nothing in flight, a direct `try_acquire`
/// succeeds, and each clone still serves a request when one comes.
/// tower's `ConcurrencyLimit` is the contrast: one ready, idle clone holds
/// its only permit and the next clone cannot become ready.
#[tokio::test]
async fn ready_idle_clones_hold_no_permit() {
    let bh = Bulkhead::builder()
        .name("idle")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()))
        .service(ok_service());
    let mut clones: Vec<_> = (0..10).map(|_| service.clone()).collect();
    for clone in &mut clones {
        ServiceExt::<()>::ready(clone).await.unwrap();
    }
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.permitted()), (0, 0));
    drop(bh.try_acquire().expect("an idle service holds the permit"));

    for clone in &mut clones {
        assert_eq!(clone.call(()).await.unwrap(), "ok");
        ServiceExt::<()>::ready(clone).await.unwrap();
    }
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.permitted(), m.rejected()), (0, 11, 0));

    // tower's ConcurrencyLimit: the permit is taken in `poll_ready`.
    let limited = ConcurrencyLimit::new(ok_service(), 1);
    let mut idle = limited.clone();
    let mut other = limited.clone();
    ServiceExt::<()>::ready(&mut idle).await.unwrap();
    assert!(
        poll_once(&mut ServiceExt::<()>::ready(&mut other)).is_none(),
        "ConcurrencyLimit let a second clone become ready"
    );
    drop(idle);
    assert!(poll_once(&mut ServiceExt::<()>::ready(&mut other)).is_some());
}

/// `poll_ready` delegates to the inner service (so its back-pressure
/// comes through), and `call` calls the very instance that was polled
/// ready: a `ConcurrencyLimit` inside, whose permit belongs to one
/// instance, would panic if a fresh clone were called instead.
#[tokio::test]
async fn readiness_comes_from_the_inner_service_and_the_ready_instance_is_called() {
    let bh = Bulkhead::builder()
        .name("outer")
        .max_concurrent_calls(10)
        .build()
        .unwrap();
    let inner = ConcurrencyLimit::new(ok_service(), 1);
    let mut service = BulkheadService::new(inner, bh.clone());

    for _ in 0..5 {
        ServiceExt::<()>::ready(&mut service).await.unwrap();
        assert_eq!(service.call(()).await.unwrap(), "ok");
    }

    // Another instance holds the inner limit's only permit: not ready.
    let mut holder = service.get_ref().clone();
    ServiceExt::<()>::ready(&mut holder).await.unwrap();
    assert!(poll_once(&mut ServiceExt::<()>::ready(&mut service)).is_none());
    drop(holder);
    ServiceExt::<()>::ready(&mut service).await.unwrap();
    assert_eq!(bh.metrics().in_flight(), 0, "readiness took no permit");
    assert_eq!(service.call(()).await.unwrap(), "ok");
    assert_eq!(bh.metrics().permitted(), 6);
}

// ---------------------------------------------------------------------------
// The wait policy
// ---------------------------------------------------------------------------

/// `max_queue` and waiting: with the only permit taken, one request waits
/// in line, the next finds the line full (`Full`, at once), and the waiter
/// is served when the permit comes back.
#[tokio::test]
async fn requests_wait_in_a_bounded_line() {
    let bh = Bulkhead::builder()
        .name("line")
        .max_concurrent_calls(1)
        .max_queue(1)
        .build()
        .unwrap();
    let mut service = BulkheadService::new(ok_service(), bh.clone());

    let held = bh.try_acquire().unwrap();
    // Boxed to poll it by hand: a waiting response future is pinned.
    let mut waiting = Box::pin(service.call(()));
    assert!(poll_once(&mut waiting).is_none());
    assert_eq!(bh.metrics().queued(), 1);

    let err = service.call(()).await.unwrap_err();
    let rejected = err.downcast_ref::<Rejected>().expect("a rejection");
    assert_eq!(rejected.reason(), RejectReason::Full);

    drop(held);
    assert_eq!(waiting.await.unwrap(), "ok");
    let m = bh.metrics();
    assert_eq!((m.permitted(), m.rejected_full(), m.queued()), (2, 1, 0));
}

/// `max_wait`: a request that gets no permit in time is rejected with
/// `Timeout`, having waited at least `max_wait`.
#[tokio::test]
async fn a_request_that_waits_too_long_is_rejected_with_timeout() {
    const MAX_WAIT: Duration = Duration::from_millis(30);
    let bh = Bulkhead::builder()
        .name("patient")
        .max_concurrent_calls(1)
        .max_wait(MAX_WAIT)
        .build()
        .unwrap();
    let service = BulkheadService::new(ok_service(), bh.clone());

    let _held = bh.try_acquire().unwrap();
    let err = service.oneshot(()).await.unwrap_err();
    let rejected = err.downcast_ref::<Rejected>().expect("a rejection");
    assert_eq!(rejected.reason(), RejectReason::Timeout);
    assert!(
        rejected.waited() >= MAX_WAIT,
        "waited {:?}",
        rejected.waited()
    );
    assert_eq!(bh.metrics().rejected_timeout(), 1);
}

/// A closed bulkhead rejects with `Closed`, and the inner service is never
/// called.
#[tokio::test]
async fn a_closed_bulkhead_rejects_with_closed() {
    let bh = Bulkhead::builder()
        .name("closing")
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let called = Arc::new(AtomicUsize::new(0));
    let service = BulkheadService::new(
        tower::service_fn({
            let called = called.clone();
            move |()| {
                called.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(()) }
            }
        }),
        bh.clone(),
    );
    bh.close();
    let err = service.oneshot(()).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejected>().map(Rejected::reason),
        Some(RejectReason::Closed)
    );
    assert_eq!(called.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Errors and outcomes
// ---------------------------------------------------------------------------

/// The inner service's errors pass through, boxed once (a `BoxError` is not
/// boxed again), and the observer sees a failure.
#[tokio::test]
async fn the_inner_services_errors_pass_through() {
    #[derive(Debug)]
    struct Declined;
    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("declined")
        }
    }
    impl std::error::Error for Declined {}

    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .name("errors")
        .max_concurrent_calls(2)
        .observer(outcomes.clone())
        .build()
        .unwrap();

    let io = BulkheadService::new(
        tower::service_fn(|()| async { Err::<(), _>(std::io::Error::other("boom")) }),
        bh.clone(),
    );
    let err = io.oneshot(()).await.unwrap_err();
    let io_err = err.downcast_ref::<std::io::Error>().expect("an io::Error");
    assert_eq!(io_err.to_string(), "boom");

    let boxed = BulkheadService::new(
        tower::service_fn(|()| async { Err::<(), BoxError>(Box::new(Declined)) }),
        bh.clone(),
    );
    let err = boxed.oneshot(()).await.unwrap_err();
    assert!(err.is::<Declined>(), "boxed twice: {err:?}");

    assert_eq!(
        outcomes.take(),
        [CallOutcome::Failure, CallOutcome::Failure]
    );
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// `call_timeout`: a request that runs too long is dropped, its permit
/// released, and the error downcasts to `CallTimeout`.
#[tokio::test]
async fn a_request_past_call_timeout_fails_with_call_timeout() {
    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .name("slow")
        .max_concurrent_calls(1)
        .call_timeout(Duration::from_millis(20))
        .observer(outcomes.clone())
        .build()
        .unwrap();
    let service = BulkheadService::new(
        tower::service_fn(|()| pending::<Result<(), Infallible>>()),
        bh.clone(),
    );
    let err = service.clone().oneshot(()).await.unwrap_err();
    let timed_out = err.downcast_ref::<CallTimeout>().expect("a call timeout");
    assert_eq!(timed_out.bulkhead_name(), "slow");
    assert_eq!(timed_out.timeout(), Duration::from_millis(20));
    assert_eq!(
        err.to_string(),
        r#"call in bulkhead "slow" timed out after 20ms"#
    );
    assert!(err.downcast_ref::<Rejected>().is_none());

    let m = bh.metrics();
    assert_eq!((m.call_timeouts(), m.in_flight()), (1, 0));
    assert_eq!(outcomes.take(), [CallOutcome::TimedOut]);
    assert!(bh.try_acquire().is_ok());
}

/// Successes are reported as such.
#[tokio::test]
async fn a_success_is_reported_to_the_observer() {
    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .name("ok")
        .max_concurrent_calls(1)
        .observer(outcomes.clone())
        .build()
        .unwrap();
    let service = BulkheadService::new(ok_service(), bh.clone());
    assert_eq!(service.oneshot(()).await.unwrap(), "ok");
    assert_eq!(outcomes.take(), [CallOutcome::Success]);
}

// ---------------------------------------------------------------------------
// Dropping the response future
// ---------------------------------------------------------------------------

/// Dropping a response future whose request is running releases its permit
/// (reported as `Cancelled`); dropping one that waits in line gives up its
/// place and takes nothing.
#[tokio::test]
async fn dropping_the_response_future_releases_the_permit() {
    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .name("dropped")
        .max_concurrent_calls(1)
        .observer(outcomes.clone())
        .build()
        .unwrap();
    let mut service = BulkheadService::new(
        tower::service_fn(|()| pending::<Result<(), Infallible>>()),
        bh.clone(),
    );

    // Running: holds the permit until dropped.
    ServiceExt::<()>::ready(&mut service).await.unwrap();
    // Boxed, so that `drop` drops the future itself.
    let mut running = Box::pin(service.call(()));
    assert!(poll_once(&mut running).is_none());
    assert_eq!(bh.metrics().in_flight(), 1);

    // Waiting behind it: in line until dropped.
    ServiceExt::<()>::ready(&mut service).await.unwrap();
    let mut waiting = Box::pin(service.call(()));
    assert!(poll_once(&mut waiting).is_none());
    assert_eq!(bh.metrics().queued(), 1);
    drop(waiting);
    assert_eq!((bh.metrics().queued(), bh.metrics().in_flight()), (0, 1));

    drop(running);
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued(), m.permitted()), (0, 0, 1));
    assert_eq!(outcomes.take(), [CallOutcome::Cancelled]);
    assert!(bh.try_acquire().is_ok());

    // A response future that was never polled holds nothing either.
    let unpolled = service.call(());
    assert_eq!(bh.metrics().in_flight(), 0);
    drop(unpolled);
}

/// A waiting request that was handed the permit and then dropped before it
/// ran gives the permit back, and `wait_idle` sees the bulkhead empty.
#[tokio::test]
async fn a_request_dropped_after_its_hand_off_leaves_the_bulkhead_idle() {
    let bh = Bulkhead::builder()
        .name("handed")
        .max_concurrent_calls(1)
        .build()
        .unwrap();
    let mut service = BulkheadService::new(ok_service(), bh.clone());

    let held = bh.try_acquire().unwrap();
    let mut waiting = Box::pin(service.call(()));
    assert!(poll_once(&mut waiting).is_none());
    let mut idle = Box::pin(bh.wait_idle());
    assert!(poll_once(&mut idle).is_none());
    // The permit goes to the waiting request, which is never polled again.
    drop(held);
    assert!(poll_once(&mut idle).is_none());
    drop(waiting);

    assert!(poll_once(&mut idle).is_some(), "wait_idle was woken");
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.queued(), m.permitted()), (0, 0, 1));
    assert_eq!(service.call(()).await.unwrap(), "ok");
}

/// An inner service whose `call` panics (once admitted) gives the permit
/// back, and the observer hears `Panicked`.
#[tokio::test]
async fn a_panicking_inner_call_releases_the_permit() {
    let outcomes = Arc::new(Outcomes::default());
    let bh = Bulkhead::builder()
        .name("panics")
        .max_concurrent_calls(1)
        .observer(outcomes.clone())
        .build()
        .unwrap();
    let mut service = BulkheadService::new(
        tower::service_fn(|()| -> std::future::Ready<Result<(), Infallible>> {
            panic!("the inner call panics")
        }),
        bh.clone(),
    );

    let fut = service.call(());
    let caught = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
    assert!(caught.is_err());
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.permitted()), (0, 1));
    assert_eq!(outcomes.take(), [CallOutcome::Panicked]);
}

// ---------------------------------------------------------------------------
// Deadlines (`deadline_from`)
// ---------------------------------------------------------------------------

/// A request of the deadline tests: its deadline, if any, and how long the
/// inner service works on it.
type Timed = (Option<Instant>, Duration);

/// Sleeps for the request's work; counts the requests it was called with.
fn sleeping_service(
    called: Arc<AtomicUsize>,
) -> impl Service<Timed, Response = (), Error = Infallible, Future: Send> + Clone + Send + 'static {
    tower::service_fn(move |(_, work): Timed| {
        called.fetch_add(1, Ordering::SeqCst);
        async move {
            sleep(work).await;
            Ok::<_, Infallible>(())
        }
    })
}

/// A bulkhead of one that waits up to `max_wait`, with an observer (so that
/// every call's hold time is measured), and has learned that a call holds
/// its permit about `hold`.
async fn learned_bulkhead(name: &'static str, max_wait: Duration, hold: Duration) -> Bulkhead {
    let bh = Bulkhead::builder()
        .name(name)
        .max_concurrent_calls(1)
        .max_wait(max_wait)
        .observer(Arc::new(Outcomes::default()))
        .build()
        .unwrap();
    for _ in 0..6 {
        bh.call(async {
            sleep(hold).await;
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    }
    bh
}

fn reason(err: &BoxError) -> RejectReason {
    err.downcast_ref::<Rejected>()
        .unwrap_or_else(|| panic!("not a rejection: {err}"))
        .reason()
}

/// A request whose deadline has passed, or whose deadline is shorter than
/// the expected wait plus the call's hold time, is rejected at once with
/// `WontMakeDeadline`, without reaching the inner service; a request the
/// function reads no deadline from is admitted as before.
#[tokio::test]
async fn a_request_that_cannot_make_its_deadline_is_rejected_at_once() {
    timeout(PATIENCE, async {
        let hold = Duration::from_millis(40);
        let bh = learned_bulkhead("deadlines", Duration::from_secs(10), hold).await;
        let called = Arc::new(AtomicUsize::new(0));
        let service = ServiceBuilder::new()
            .layer(BulkheadLayer::new(bh.clone()).deadline_from(|req: &Timed| req.0))
            .service(sleeping_service(called.clone()));

        // Passed already, with a permit free.
        let passed = Some(Instant::now() - Duration::from_millis(1));
        let err = service.clone().oneshot((passed, Duration::ZERO)).await;
        assert_eq!(reason(&err.unwrap_err()), RejectReason::WontMakeDeadline);

        // The bulkhead is full and a call holds its permit about 40 ms: a
        // request with 10 ms left cannot make it, and does not wait.
        let held = bh.try_acquire().unwrap();
        let start = Instant::now();
        let short = Some(Instant::now() + Duration::from_millis(10));
        let err = service
            .clone()
            .oneshot((short, Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(reason(&err), RejectReason::WontMakeDeadline);
        assert_eq!(
            err.downcast_ref::<Rejected>().unwrap().waited(),
            Duration::ZERO
        );
        // "At once": far from the 10 s of `max_wait`.
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(called.load(Ordering::SeqCst), 0);

        // No deadline: waits in line as without the option.
        let mut waiting = Box::pin(service.clone().oneshot((None, Duration::ZERO)));
        assert!(poll_once(&mut waiting).is_none());
        drop(held);
        waiting.await.unwrap();
        assert_eq!(called.load(Ordering::SeqCst), 1);

        let m = bh.metrics();
        assert_eq!(
            (m.rejected_deadline(), m.rejected(), m.in_flight()),
            (2, 2, 0)
        );
    })
    .await
    .expect("the test hung");
}

/// A request with time to spare is admitted: served if a permit frees in
/// time, else rejected with `WontMakeDeadline` once it could no longer
/// finish, long before `max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_time_is_admitted_and_its_wait_bounded() {
    timeout(PATIENCE, async {
        let hold = Duration::from_millis(30);
        let bh = learned_bulkhead("bounded", Duration::from_secs(10), hold).await;
        let called = Arc::new(AtomicUsize::new(0));
        let service = ServiceBuilder::new()
            .layer(BulkheadLayer::new(bh.clone()).deadline_from(|req: &Timed| req.0))
            .service(sleeping_service(called.clone()));

        // A free permit: admitted at once and served.
        let by = Some(Instant::now() + Duration::from_secs(2));
        service.clone().oneshot((by, hold)).await.unwrap();

        // Full, but the permit comes back within the deadline: served.
        let held = bh.try_acquire().unwrap();
        let by = Some(Instant::now() + Duration::from_secs(2));
        let served = tokio::spawn(service.clone().oneshot((by, hold)));
        sleep(Duration::from_millis(20)).await;
        drop(held);
        served.await.unwrap().unwrap();
        assert_eq!(called.load(Ordering::SeqCst), 2);

        // Full, and the permit never comes back: the request waits at most
        // until its deadline less a call's hold time (about 570 ms here),
        // not the 10 s of `max_wait`.
        let _held = bh.try_acquire().unwrap();
        let start = Instant::now();
        let by = Some(Instant::now() + Duration::from_millis(600));
        let err = service
            .clone()
            .oneshot((by, Duration::ZERO))
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(reason(&err), RejectReason::WontMakeDeadline);
        let waited = err.downcast_ref::<Rejected>().unwrap().waited();
        assert!(
            waited > Duration::from_millis(100),
            "gave up after {waited:?}"
        );
        assert!(took < Duration::from_secs(3), "took {took:?}");
        assert_eq!(called.load(Ordering::SeqCst), 2);
        let m = bh.metrics();
        assert_eq!((m.rejected_deadline(), m.rejected_timeout()), (1, 0));
    })
    .await
    .expect("the test hung");
}

/// Without `deadline_from`, or with a function that reads no deadline, the
/// layer admits as it always did: a full bulkhead makes the request wait
/// out `max_wait` and rejects it with `Timeout`, whatever the request says.
#[tokio::test]
async fn a_layer_without_deadlines_behaves_as_before() {
    const MAX_WAIT: Duration = Duration::from_millis(50);
    let bh = learned_bulkhead("plain", MAX_WAIT, Duration::from_millis(20)).await;
    let called = Arc::new(AtomicUsize::new(0));
    let plain = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()))
        .service(sleeping_service(called.clone()));
    let none = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).deadline_from(|_: &Timed| None))
        .service(sleeping_service(called.clone()));

    // A deadline in the request that nobody reads.
    let passed = Some(Instant::now() - Duration::from_secs(1));
    plain
        .clone()
        .oneshot((passed, Duration::ZERO))
        .await
        .unwrap();
    none.clone()
        .oneshot((passed, Duration::ZERO))
        .await
        .unwrap();

    let _held = bh.try_acquire().unwrap();
    for err in [
        plain.oneshot((passed, Duration::ZERO)).await.unwrap_err(),
        none.oneshot((passed, Duration::ZERO)).await.unwrap_err(),
    ] {
        assert_eq!(reason(&err), RejectReason::Timeout);
        let waited = err.downcast_ref::<Rejected>().unwrap().waited();
        assert!(waited >= MAX_WAIT, "waited {waited:?}");
    }
    assert_eq!(called.load(Ordering::SeqCst), 2);
    let m = bh.metrics();
    assert_eq!((m.rejected_timeout(), m.rejected_deadline()), (2, 0));
}

/// The deadline from an HTTP header, end to end: a hyper server whose
/// layer reads `x-deadline-ms` answers a request with no time left with a
/// 503 `deadline`, and serves one with time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_header_in_a_hyper_server() {
    fn deadline_ms(request: &Request<Incoming>) -> Option<Instant> {
        let ms = request.headers().get("x-deadline-ms")?.to_str().ok()?;
        Some(Instant::now() + Duration::from_millis(ms.parse().ok()?))
    }
    async fn get_by(addr: SocketAddr, ms: u64) -> Result<(StatusCode, Option<String>), BoxError> {
        let stream = TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = Request::get("/")
            .header(header::HOST, addr.to_string())
            .header("x-deadline-ms", ms)
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let reason = response
            .headers()
            .get("x-bulkhead-reject-reason")
            .map(|v| v.to_str().unwrap().to_owned());
        Ok((response.status(), reason))
    }

    timeout(PATIENCE, async {
        let bh = Bulkhead::builder()
            .name("http-deadline")
            .max_concurrent_calls(2)
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        let service = ServiceBuilder::new()
            .map_result(rejection_to_503)
            .layer(BulkheadLayer::new(bh.clone()).deadline_from(deadline_ms))
            .service_fn({
                let stats = stats.clone();
                move |_request: Request<Incoming>| {
                    handle(stats.clone(), Work::Sleep(Duration::from_millis(5)))
                }
            });
        let server = serve(service).await;

        let (status, reason) = get_by(server.addr, 0).await.expect("request failed");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reason.as_deref(), Some("deadline"));
        let (status, _) = get_by(server.addr, 5_000).await.expect("request failed");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(stats.served(), 1);
        assert_eq!(bh.metrics().rejected_deadline(), 1);
    })
    .await
    .expect("the test hung");
}

/// The ready-made readers in a hyper server: `grpc-timeout` (a spent one
/// is answered with a 503 `deadline`, a malformed one is no deadline), a
/// `Deadline` extension an outer layer set, and the earlier of the two.
#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_and_the_deadline_extension_in_a_hyper_server() {
    use watertight::tower::{Deadline, DeadlineExtension, Earliest, GrpcTimeout};

    async fn get(
        addr: SocketAddr,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Option<String>), BoxError> {
        let stream = TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut request = Request::get("/").header(header::HOST, addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = sender
            .send_request(request.body(Empty::<Bytes>::new())?)
            .await?;
        let reason = response
            .headers()
            .get("x-bulkhead-reject-reason")
            .map(|v| v.to_str().unwrap().to_owned());
        Ok((response.status(), reason))
    }

    timeout(PATIENCE, async {
        let bh = Bulkhead::builder()
            .name("http-grpc-timeout")
            .max_concurrent_calls(2)
            .build()
            .unwrap();
        let stats = Arc::new(Stats::default());
        let service = ServiceBuilder::new()
            .map_result(rejection_to_503)
            // An outer layer that sets the extension (here from a header
            // that says the caller's budget is spent).
            .map_request(|mut request: Request<Incoming>| {
                if request.headers().contains_key("x-spent") {
                    let spent = Instant::now() - Duration::from_millis(1);
                    request.extensions_mut().insert(Deadline(spent));
                }
                request
            })
            .layer(
                BulkheadLayer::new(bh.clone())
                    .deadline_from(Earliest(GrpcTimeout, DeadlineExtension)),
            )
            .service_fn({
                let stats = stats.clone();
                move |_request: Request<Incoming>| {
                    handle(stats.clone(), Work::Sleep(Duration::from_millis(5)))
                }
            });
        let server = serve(service).await;

        let cases: [(&[(&str, &str)], StatusCode); 6] = [
            (&[("grpc-timeout", "0n")], StatusCode::SERVICE_UNAVAILABLE),
            (&[("grpc-timeout", "5S")], StatusCode::OK),
            (&[("grpc-timeout", "soon")], StatusCode::OK),
            (&[("grpc-timeout", "123456789m")], StatusCode::OK),
            (&[("x-spent", "1")], StatusCode::SERVICE_UNAVAILABLE),
            (
                &[("grpc-timeout", "5S"), ("x-spent", "1")],
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ];
        for (headers, expected) in cases {
            let (status, reason) = get(server.addr, headers).await.expect("request failed");
            assert_eq!(status, expected, "{headers:?}");
            if expected != StatusCode::OK {
                assert_eq!(reason.as_deref(), Some("deadline"), "{headers:?}");
            }
        }
        assert_eq!(stats.served(), 3);
        assert_eq!(bh.metrics().rejected_deadline(), 3);
    })
    .await
    .expect("the test hung");
}

// ---------------------------------------------------------------------------
// `parse_grpc_timeout`: gRPC's format, and never a panic on bad input
// ---------------------------------------------------------------------------

#[test]
fn every_unit_of_grpc_timeout() {
    let cases: [(&[u8], Duration); 7] = [
        (b"1H", Duration::from_secs(3_600)),
        (b"2M", Duration::from_secs(120)),
        (b"3S", Duration::from_secs(3)),
        (b"4m", Duration::from_millis(4)),
        (b"5u", Duration::from_micros(5)),
        (b"6n", Duration::from_nanos(6)),
        (b"0S", Duration::ZERO),
    ];
    for (value, expected) in cases {
        assert_eq!(
            watertight::tower::parse_grpc_timeout(value),
            Some(expected),
            "{value:?}"
        );
    }
}

#[test]
fn grpc_timeout_takes_up_to_eight_digits() {
    assert_eq!(
        watertight::tower::parse_grpc_timeout(b"99999999H"),
        Some(Duration::from_secs(99_999_999 * 3_600))
    );
    assert_eq!(
        watertight::tower::parse_grpc_timeout(b"00000001n"),
        Some(Duration::from_nanos(1))
    );
    assert_eq!(
        watertight::tower::parse_grpc_timeout(b"100000000n"),
        None,
        "nine digits"
    );
    assert_eq!(
        watertight::tower::parse_grpc_timeout(b"000000001n"),
        None,
        "nine digits"
    );
}

#[test]
fn malformed_grpc_timeouts_carry_no_deadline() {
    let bad: [&[u8]; 20] = [
        b"",
        b"S",
        b"m",
        b"10",
        b"10s",
        b"10h",
        b"10x",
        b"-1S",
        b"+1S",
        b" 1S",
        b"1S ",
        b"1 S",
        b"1.5S",
        b"1SS",
        b"1Sm",
        b"\xff1S",
        b"1\xffS",
        b"1\0S",
        b"\xd9\xa3S",
        b"1e3m",
    ];
    for value in bad {
        assert_eq!(
            watertight::tower::parse_grpc_timeout(value),
            None,
            "{value:?}"
        );
    }
}

/// Every value of up to three bytes from a set that covers each class
/// of byte the parser tells apart: never a panic, and `Some` exactly
/// for digits followed by one unit.
#[test]
fn grpc_timeout_short_inputs_never_panic() {
    let alphabet = b"09HMSmunsx -+\xff";
    let mut values = vec![Vec::new()];
    for len in 1..=3 {
        let mut next = Vec::new();
        for v in values.iter().filter(|v| v.len() == len - 1) {
            for &b in alphabet {
                let mut w = v.clone();
                w.push(b);
                next.push(w);
            }
        }
        values.extend(next);
    }
    for v in &values {
        let valid = v.len() >= 2
            && v[..v.len() - 1].iter().all(u8::is_ascii_digit)
            && b"HMSmun".contains(&v[v.len() - 1]);
        assert_eq!(
            watertight::tower::parse_grpc_timeout(v).is_some(),
            valid,
            "{v:?}"
        );
    }
}

/// What hyper, tonic and axum ask of a layer and its service: the layer and
/// the service are `Send + Sync` (axum's `Router::layer`), the response
/// future is `Send` (spawned on a multi-threaded runtime).
#[test]
fn the_layer_fits_multi_threaded_stacks() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    send_sync::<BulkheadLayer>();
    send_sync::<BulkheadLayer<fn(&()) -> Option<Instant>>>();
    type Inner = tower::util::BoxCloneSyncService<(), (), BoxError>;
    send_sync::<BulkheadService<Inner>>();
    send::<watertight::tower::ResponseFuture<Inner, ()>>();
    send_sync::<CallTimeout>();
}
