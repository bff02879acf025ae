//! The bulkhead in front of a real HTTP server on loopback: a server that
//! answers 503 when more than `N` requests arrive at once, and 2,000 clients
//! that reach it through a bulkhead of `N`. The server never sees more than
//! `N`, every client ends in a success or a typed rejection, and the
//! bulkhead's metrics match what the clients saw. A second test widens the
//! bulkhead past the server's limit to show that the 503s then do fire.
#![cfg(not(loom))]

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use watertight::observer::{Finished, Observer, Permitted, Rejection};
use watertight::{Bulkhead, BulkheadError, CallOutcome, RejectReason};

/// Requests the server serves at once; past it, it answers 503.
const N: usize = 8;
/// How long the server works on a request it accepts.
const WORK: Duration = Duration::from_millis(5);
/// A whole test fails, rather than hangs, past this.
const PATIENCE: Duration = Duration::from_secs(15);

type ClientError = Box<dyn Error + Send + Sync>;

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// What the server saw.
#[derive(Debug, Default)]
struct ServerStats {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    served: AtomicU64,
    overloaded: AtomicU64,
}

impl ServerStats {
    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
    fn overloaded(&self) -> u64 {
        self.overloaded.load(Ordering::SeqCst)
    }
}

/// An HTTP/1.1 server on `127.0.0.1`, stopped (no new connections) on drop.
struct Server {
    addr: SocketAddr,
    stats: Arc<ServerStats>,
    accept_loop: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn start_server(limit: usize) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let stats = Arc::new(ServerStats::default());
    let accept_loop = tokio::spawn({
        let stats = stats.clone();
        async move {
            loop {
                let (stream, _) = listener.accept().await.expect("accept");
                let stats = stats.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(request, stats.clone(), limit)
                    });
                    // A client that hangs up shows up in the client's result.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    });
    Server {
        addr,
        stats,
        accept_loop,
    }
}

/// Counts the request in flight; past `limit` answers 503 at once, else
/// works for [`WORK`] and answers 200. The count is dropped before the
/// response leaves, so it is always inside the client's call.
async fn handle(
    _request: Request<Incoming>,
    stats: Arc<ServerStats>,
    limit: usize,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    stats.peak.fetch_max(now, Ordering::SeqCst);
    let response = if now > limit {
        stats.overloaded.fetch_add(1, Ordering::SeqCst);
        let mut busy = Response::new(Full::new(Bytes::from_static(b"too many requests at once")));
        *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        busy
    } else {
        sleep(WORK).await;
        stats.served.fetch_add(1, Ordering::SeqCst);
        Response::new(Full::new(Bytes::from_static(b"ok")))
    };
    stats.in_flight.fetch_sub(1, Ordering::SeqCst);
    Ok(response)
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// A client with a pool of keep-alive connections to one server: it opens a
/// connection only when no idle one is left, so the test does not burn
/// through ephemeral ports.
#[derive(Clone)]
struct Client {
    addr: SocketAddr,
    idle: Arc<Mutex<Vec<SendRequest<Empty<Bytes>>>>>,
}

impl Client {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            idle: Arc::default(),
        }
    }

    /// `GET /` and read the whole answer.
    async fn get(&self) -> Result<StatusCode, ClientError> {
        let mut connection = self.connection().await?;
        let request = Request::get("/")
            .header(header::HOST, self.addr.to_string())
            .body(Empty::new())?;
        let response = connection.send_request(request).await?;
        let status = response.status();
        // Read to the end, so the connection can take the next request.
        response.into_body().collect().await?;
        self.idle.lock().unwrap().push(connection);
        Ok(status)
    }

    async fn connection(&self) -> Result<SendRequest<Empty<Bytes>>, ClientError> {
        loop {
            let Some(mut idle) = self.idle.lock().unwrap().pop() else {
                break;
            };
            if idle.ready().await.is_ok() {
                return Ok(idle);
            }
        }
        let stream = TcpStream::connect(self.addr).await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // Drives the connection; ends when the last sender is dropped.
        tokio::spawn(connection);
        Ok(sender)
    }
}

/// What one request ended as, tallied.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    ok: u64,
    unavailable: u64,
    full: u64,
    timeout: u64,
}

/// Counts the bulkhead's events, as a metrics exporter would: a second
/// account of every call, kept apart from the bulkhead's own counters
/// (whose `finished` is derived, `permitted - in_flight`).
#[derive(Debug, Default)]
struct Events {
    permitted: AtomicU64,
    full: AtomicU64,
    timeout: AtomicU64,
    rejected_otherwise: AtomicU64,
    succeeded: AtomicU64,
    ended_otherwise: AtomicU64,
}

impl Observer for Events {
    fn on_permitted(&self, _: &Permitted<'_>) {
        self.permitted.fetch_add(1, Ordering::SeqCst);
    }
    fn on_rejected(&self, event: &Rejection<'_>) {
        match event.reason {
            RejectReason::Full => &self.full,
            RejectReason::Timeout => &self.timeout,
            _ => &self.rejected_otherwise,
        }
        .fetch_add(1, Ordering::SeqCst);
    }
    fn on_finished(&self, event: &Finished<'_>) {
        match event.outcome {
            CallOutcome::Success => &self.succeeded,
            _ => &self.ended_otherwise,
        }
        .fetch_add(1, Ordering::SeqCst);
    }
}

impl Events {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

/// 2,000 requests arrive over 400 ms, about three times what the server can
/// take, through a bulkhead of `N` with a bounded line and a bounded wait.
/// The server never sees more than `N` at once and never answers 503; each
/// request is served or rejected with a reason, and the bulkhead's totals
/// match the clients' tally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_never_sees_more_than_the_bulkhead_admits() {
    const REQUESTS: usize = 2_000;
    /// One new request every 200 µs: 5 per ms, against a capacity of
    /// `N / WORK` = 1.6 per ms.
    const ARRIVAL_GAP: Duration = Duration::from_micros(200);
    const MAX_QUEUE: usize = 64;
    const MAX_WAIT: Duration = Duration::from_millis(20);

    timeout(PATIENCE, async {
        let server = start_server(N).await;
        let client = Client::new(server.addr);
        let events = Arc::new(Events::default());
        let bh = Bulkhead::builder()
            .name("http-server")
            .max_concurrent_calls(N)
            .max_queue(MAX_QUEUE)
            .max_wait(MAX_WAIT)
            .call_timeout(Duration::from_secs(5))
            .observer(events.clone())
            .build()
            .unwrap();

        let start = Instant::now();
        let requests: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let (bh, client) = (bh.clone(), client.clone());
                tokio::spawn(async move {
                    sleep_until(start + ARRIVAL_GAP * i as u32).await;
                    bh.call(client.get()).await
                })
            })
            .collect();

        let mut seen = Tally::default();
        for request in requests {
            match request.await.expect("client task panicked") {
                Ok(StatusCode::OK) => seen.ok += 1,
                Ok(status) => panic!("the server answered {status}"),
                Err(BulkheadError::Rejected(r)) => {
                    assert_eq!(r.name(), "http-server");
                    match r.reason() {
                        RejectReason::Full => {
                            assert_eq!(r.waited(), Duration::ZERO, "a full line rejects at once");
                            seen.full += 1;
                        }
                        RejectReason::Timeout => {
                            assert!(r.waited() >= MAX_WAIT, "rejected early: {:?}", r.waited());
                            seen.timeout += 1;
                        }
                        other => panic!("unexpected rejection: {other}"),
                    }
                }
                Err(e) => panic!("a request failed: {e}"),
            }
        }
        let elapsed = start.elapsed();

        let stats = &server.stats;
        let m = bh.metrics();
        println!(
            "{REQUESTS} requests in {elapsed:?}: {seen:?}; server peak {}, bulkhead {m:?}",
            stats.peak()
        );

        // The server never saw more than the bulkhead admits.
        assert!(stats.peak() <= N, "server saw {} at once", stats.peak());
        assert_eq!(stats.overloaded(), 0, "the server answered 503");
        assert_eq!(stats.served(), seen.ok, "each success was served once");
        // Some requests got through and some were turned away, for both
        // reasons: arrivals outrun the server three to one, so the line
        // fills (full), and the 64 waiting at that moment need at least
        // 64 / N * WORK = 40 ms to be served, past MAX_WAIT (timeout).
        assert!(seen.ok > 0, "nothing got through");
        assert!(seen.full > 0, "the line never filled");
        assert!(seen.timeout > 0, "nobody waited out max_wait");

        // The metrics add up and match what the clients saw.
        assert_eq!(m.permitted() + m.rejected(), REQUESTS as u64);
        assert_eq!(m.permitted(), seen.ok);
        assert_eq!(m.rejected_full(), seen.full);
        assert_eq!(m.rejected_timeout(), seen.timeout);
        assert_eq!(m.rejected_closed(), 0);
        assert_eq!(m.call_timeouts(), 0);
        assert_eq!(m.finished(), m.permitted());
        assert_eq!((m.in_flight(), m.queued()), (0, 0));

        // The observer saw the same calls, and every permit come back.
        let e = &*events;
        assert_eq!(Events::get(&e.permitted), seen.ok);
        assert_eq!(Events::get(&e.full), seen.full);
        assert_eq!(Events::get(&e.timeout), seen.timeout);
        assert_eq!(Events::get(&e.rejected_otherwise), 0);
        assert_eq!(Events::get(&e.succeeded), seen.ok, "one success per permit");
        assert_eq!(Events::get(&e.ended_otherwise), 0);
    })
    .await
    .expect("the test hung");
}

/// The control experiment: a bulkhead twice as wide as the server lets more
/// than `N` requests arrive at once, and the server's 503s fire. This is what
/// makes "no 503" in the test above mean something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulkhead_wider_than_the_server_lets_it_overload() {
    const REQUESTS: usize = 400;

    timeout(PATIENCE, async {
        let server = start_server(N).await;
        let client = Client::new(server.addr);
        let bh = Bulkhead::builder()
            .name("too-wide")
            .max_concurrent_calls(2 * N)
            .call_timeout(Duration::from_secs(5))
            .build()
            .unwrap();

        let requests: Vec<_> = (0..REQUESTS)
            .map(|_| {
                let (bh, client) = (bh.clone(), client.clone());
                tokio::spawn(async move { bh.call(client.get()).await })
            })
            .collect();

        let mut seen = Tally::default();
        for request in requests {
            match request.await.expect("client task panicked") {
                Ok(StatusCode::OK) => seen.ok += 1,
                Ok(StatusCode::SERVICE_UNAVAILABLE) => seen.unavailable += 1,
                Ok(status) => panic!("the server answered {status}"),
                Err(e) => panic!("a request failed: {e}"),
            }
        }

        let stats = &server.stats;
        println!(
            "{REQUESTS} requests: {seen:?}; server peak {}",
            stats.peak()
        );
        assert!(stats.overloaded() > 0, "the server never answered 503");
        assert!(stats.peak() > N, "server peak {}", stats.peak());
        assert!(
            stats.peak() <= 2 * N,
            "the bulkhead's own limit still holds"
        );
        assert_eq!(stats.overloaded(), seen.unavailable);
        assert_eq!(stats.served(), seen.ok);
        let m = bh.metrics();
        assert_eq!((m.permitted(), m.rejected()), (REQUESTS as u64, 0));
        assert_eq!(
            (m.finished(), m.in_flight(), m.queued()),
            (REQUESTS as u64, 0, 0)
        );
    })
    .await
    .expect("the test hung");
}
