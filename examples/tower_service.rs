//! A hyper server with a bulkhead in its tower stack: a checkout endpoint
//! that can work on 4 requests at once (say, the payment provider allows
//! 4 connections). A request waits at most 75 ms for a slot, in a line of
//! at most 8; past that it is answered `503 Service Unavailable` with
//! `Retry-After`, instead of piling onto the provider.
//!
//! 40 clients arrive at once, each on a connection of its own, on loopback.
//! Each admitted request takes 50 ms, so 4 are served at once, 4 more from
//! the line after 50 ms, the 4 at the back of the line are still waiting
//! when their 75 ms are up (`timeout`), and the 28 that found the line full
//! are turned away at once (`full`). The handler counts the requests it
//! works on and never sees more than 4.
//!
//! The stack, outermost first:
//!
//! 1. `map_result`: a rejection (a `watertight::Rejected` inside the
//!    `BoxError`) becomes a 503 with the reason; without it, hyper would
//!    close the connection on the error.
//! 2. `BulkheadLayer`: a permit per request, under the bulkhead's policy.
//!    No permit is held by a connection that is open but idle.
//! 3. the handler.
//!
//! Run with `cargo run --example tower_service --features tower`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower::{ServiceBuilder, ServiceExt};
use watertight::tower::{BoxError, BulkheadLayer};
use watertight::{Bulkhead, Rejected};

/// Requests the checkout works on at once.
const LIMIT: usize = 4;
/// How long a request waits for a slot.
const MAX_WAIT: Duration = Duration::from_millis(75);
/// How many may wait.
const MAX_QUEUE: usize = 8;
/// How long the checkout works on a request.
const WORK: Duration = Duration::from_millis(50);
/// Clients arriving together.
const CLIENTS: usize = 40;

type Body = Full<Bytes>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let bh = Bulkhead::builder()
        .name("checkout")
        .max_concurrent_calls(LIMIT)
        .max_wait(MAX_WAIT)
        .max_queue(MAX_QUEUE)
        .call_timeout(Duration::from_secs(5))
        .build()?;

    // What the handler sees: requests in its hands now, and the most ever.
    let working = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));

    let service = ServiceBuilder::new()
        .map_result(rejection_to_503)
        .layer(BulkheadLayer::new(bh.clone()))
        .service_fn({
            let (working, peak) = (working.clone(), peak.clone());
            move |request: Request<Incoming>| checkout(request, working.clone(), peak.clone())
        });

    // The server: every connection gets a clone of the stack; all clones
    // share the one bulkhead.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                // hyper 1 has a `Service` trait of its own: hand each request
                // to the tower stack (`hyper_util::service::TowerToHyperService`,
                // with hyper-util's `service` feature, does the same).
                let service =
                    hyper::service::service_fn(move |request| service.clone().oneshot(request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    println!(
        "checkout on http://{addr}: {LIMIT} at once, waiting at most {MAX_WAIT:?} \
         in a line of at most {MAX_QUEUE}; {CLIENTS} clients arrive together\n"
    );
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS).map(|_| tokio::spawn(get(addr))).collect();
    let mut answers = Vec::new();
    for client in clients {
        answers.push(client.await??);
    }
    let elapsed = start.elapsed();

    let mut served = Vec::new();
    let (mut full, mut timeout) = (0, 0);
    for (status, reason, took) in &answers {
        match (*status, reason.as_deref()) {
            (StatusCode::OK, _) => served.push(*took),
            (StatusCode::SERVICE_UNAVAILABLE, Some("full")) => full += 1,
            (StatusCode::SERVICE_UNAVAILABLE, Some("timeout")) => timeout += 1,
            (status, reason) => return Err(format!("unexpected {status} ({reason:?})").into()),
        }
    }
    served.sort();
    println!(
        "{} served (in {:?} .. {:?}), {timeout} waited {MAX_WAIT:?} in vain (503 timeout), \
         {full} found the line full (503 full), all in {elapsed:?}",
        served.len(),
        served.first().copied().unwrap_or_default(),
        served.last().copied().unwrap_or_default(),
    );
    let peak = peak.load(Ordering::SeqCst);
    println!("the handler never worked on more than {peak} at once (limit {LIMIT})");
    println!("{:?}", bh.metrics());
    assert!(peak <= LIMIT, "the bulkhead let {peak} through at once");
    assert_eq!(served.len() + full + timeout, CLIENTS);

    // Graceful shutdown: turn new requests away, let those in flight end.
    bh.close();
    bh.wait_idle().await;
    server.abort();
    Ok(())
}

/// The endpoint: counts itself in, works for [`WORK`], answers 200.
async fn checkout(
    _request: Request<Incoming>,
    working: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
) -> Result<Response<Body>, Infallible> {
    let now = working.fetch_add(1, Ordering::SeqCst) + 1;
    peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(WORK).await;
    working.fetch_sub(1, Ordering::SeqCst);
    Ok(Response::new(Full::new(Bytes::from_static(b"paid\n"))))
}

/// Turns a rejection into `503 Service Unavailable` with `Retry-After` and
/// the reason; any other error goes on (and hyper closes the connection).
fn rejection_to_503(result: Result<Response<Body>, BoxError>) -> Result<Response<Body>, BoxError> {
    let err = match result {
        Ok(response) => return Ok(response),
        Err(err) => err,
    };
    let Some(rejected) = err.downcast_ref::<Rejected>() else {
        return Err(err);
    };
    let mut busy = Response::new(Full::new(Bytes::from(format!("{rejected}\n"))));
    *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    // The bulkhead's own estimate of when a permit frees up (recent hold
    // times, the line ahead, the limit); HTTP wants whole seconds.
    let hint = rejected.retry_after();
    let secs = hint.map_or(1, |d| d.as_secs_f64().ceil().max(1.0) as u64);
    let headers = busy.headers_mut();
    headers.insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    if let Some(hint) = hint {
        headers.insert(
            "x-bulkhead-retry-after-ms",
            header::HeaderValue::from(hint.as_millis() as u64),
        );
    }
    headers.insert(
        "x-bulkhead-reject-reason",
        header::HeaderValue::from_static(rejected.reason().as_str()),
    );
    Ok(busy)
}

/// One client: `GET /checkout` on a connection of its own. The status, the
/// rejection reason if any, and how long the answer took.
async fn get(addr: SocketAddr) -> Result<(StatusCode, Option<String>, Duration), BoxError> {
    let start = Instant::now();
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = Request::get("/checkout")
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let reason = response
        .headers()
        .get("x-bulkhead-reject-reason")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    response.into_body().collect().await?;
    Ok((status, reason, start.elapsed()))
}
