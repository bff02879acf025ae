//! Month end: issue 10,000 e-invoices through a provider whose contract
//! allows 5 connections at once.
//!
//! The provider runs on loopback as a real HTTP server. Like real providers
//! it answers `503 Service Unavailable` to a sixth request that arrives while
//! five are in progress, and takes 1 to 5 ms per invoice. The job spawns a
//! task for every invoice at once and lets a bulkhead of 5 queue them, so
//! the provider is kept busy but never overloaded.
//!
//! The bulkhead's policy is the exercise's: wait at most 3 s for a
//! connection, then give up with "busy, retry later"
//! ([`RejectReason::Timeout`]). A batch job could wait as long as it takes,
//! but this bulkhead is the gateway every call to the provider goes
//! through, and the bound is how the job notices a provider that stalls
//! (the bulkhead guide, `watertight::guide::bulkhead`, "Wait, time out, or
//! fail fast", weighs the two).
//! With 10,000 invoices in line at once, the ones at the back do wait
//! longer than 3 s, so the job re-queues a busy invoice and tries again, up
//! to [`MAX_ATTEMPTS`] times. A call that ran past `call_timeout`, or that
//! the provider refused, is not retried: the provider may have issued it,
//! and it needs a person to reconcile it.
//!
//! Run with `cargo run --release --example invoices`; it takes about 9 s,
//! bound by the provider's pace (5 at once, 1 to 5 ms each).

use std::convert::Infallible;
use std::fmt;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use watertight::{Bulkhead, BulkheadError, Metrics, RejectReason};

/// Connections the provider's contract allows at once.
const PROVIDER_CONNECTIONS: usize = 5;
/// How long an invoice may wait for a connection before it is "busy".
const MAX_WAIT: Duration = Duration::from_secs(3);
/// Room in line for a whole month's invoices.
const MAX_QUEUE: usize = 10_000;
/// A call to the provider that takes longer than this is abandoned.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries per invoice before the job gives up on it.
const MAX_ATTEMPTS: u32 = 10;

// ---------------------------------------------------------------------------
// The provider: an HTTP server on loopback
// ---------------------------------------------------------------------------

/// What the provider saw.
#[derive(Debug, Default)]
struct ProviderStats {
    requests: AtomicU64,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    unavailable: AtomicU64,
    issued: AtomicU64,
}

/// The e-invoice provider, serving until dropped.
struct Provider {
    addr: SocketAddr,
    stats: Arc<ProviderStats>,
    accept_loop: JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl Provider {
    async fn start(connections: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(ProviderStats::default());
        let accept_loop = tokio::spawn({
            let stats = stats.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let stats = stats.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            Self::handle(request, stats.clone(), connections)
                        });
                        // A client that hangs up is the client's problem.
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Ok(Self {
            addr,
            stats,
            accept_loop,
        })
    }

    /// `POST /invoices`: 503 past `connections` requests at once, else a
    /// short, varying delay and `201 Created` with the invoice number.
    async fn handle(
        request: Request<Incoming>,
        stats: Arc<ProviderStats>,
        connections: usize,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let seq = stats.requests.fetch_add(1, Ordering::SeqCst);
        let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        stats.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let response = if now > connections {
            stats.unavailable.fetch_add(1, Ordering::SeqCst);
            let mut busy = Response::new(Full::from("too many concurrent connections"));
            *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            busy
        } else {
            // Reading the body stands in for validating the invoice.
            let _body = request.into_body().collect().await;
            tokio::time::sleep(Duration::from_millis(1 + mix(seq) % 5)).await;
            let number = stats.issued.fetch_add(1, Ordering::SeqCst) + 1;
            let mut created = Response::new(Full::from(format!("1C25TAA-{number:07}")));
            *created.status_mut() = StatusCode::CREATED;
            created
        };
        stats.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(response)
    }
}

/// A fixed pseudo-random spread (splitmix64), so runs are comparable.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------
// The client and the gateway
// ---------------------------------------------------------------------------

/// One invoice of the month.
#[derive(Debug, Clone)]
struct Invoice {
    id: usize,
    amount_vnd: u64,
}

/// What went wrong talking to the provider.
#[derive(Debug)]
enum ProviderError {
    Connect(std::io::Error),
    Http(hyper::Error),
    Status(StatusCode),
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "cannot connect to the provider: {e}"),
            Self::Http(e) => write!(f, "http error: {e}"),
            Self::Status(status) => write!(f, "the provider answered {status}"),
        }
    }
}

impl std::error::Error for ProviderError {}

impl From<hyper::Error> for ProviderError {
    fn from(e: hyper::Error) -> Self {
        Self::Http(e)
    }
}

/// An HTTP client with a pool of keep-alive connections to the provider.
#[derive(Clone)]
struct ProviderClient {
    addr: SocketAddr,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl ProviderClient {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            idle: Arc::default(),
        }
    }

    /// Sends one invoice; returns the number the provider gave it.
    async fn issue(&self, invoice: &Invoice) -> Result<String, ProviderError> {
        let mut connection = self.connection().await?;
        let request = Request::post("/invoices")
            .header(header::HOST, self.addr.to_string())
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Full::from(format!(
                "invoice={};amount_vnd={}",
                invoice.id, invoice.amount_vnd
            )))
            .expect("a valid request");
        let response = connection.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        self.idle.lock().unwrap().push(connection);
        if status != StatusCode::CREATED {
            return Err(ProviderError::Status(status));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    async fn connection(&self) -> Result<SendRequest<Full<Bytes>>, ProviderError> {
        loop {
            let Some(mut idle) = self.idle.lock().unwrap().pop() else {
                break;
            };
            if idle.ready().await.is_ok() {
                return Ok(idle);
            }
        }
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(ProviderError::Connect)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(sender)
    }
}

/// The exercise's `InvoiceGateway`: every call to the provider goes through
/// the bulkhead.
#[derive(Clone)]
struct InvoiceGateway {
    bulkhead: Bulkhead,
    client: ProviderClient,
}

impl InvoiceGateway {
    async fn issue(&self, invoice: &Invoice) -> Result<String, BulkheadError<ProviderError>> {
        self.bulkhead.call(self.client.issue(invoice)).await
    }

    /// Issues one invoice, re-queueing it while the gateway says "busy";
    /// returns the outcome and the number of attempts.
    async fn issue_with_retries(
        &self,
        invoice: &Invoice,
        requeued: &AtomicU64,
    ) -> (Result<String, BulkheadError<ProviderError>>, u32) {
        let mut attempt = 1;
        loop {
            match self.issue(invoice).await {
                Err(BulkheadError::Rejected(busy))
                    if attempt < MAX_ATTEMPTS
                        && matches!(busy.reason(), RejectReason::Timeout | RejectReason::Full) =>
                {
                    requeued.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                    // Back to the end of the line, after a short pause.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                done => return (done, attempt),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The month-end job
// ---------------------------------------------------------------------------

/// What a run did, as the job, the bulkhead and the provider saw it.
#[derive(Debug)]
struct Report {
    invoices: usize,
    issued: usize,
    /// Invoices the job gave up on, with the last error (first few only).
    failed: Vec<(usize, String)>,
    failed_count: usize,
    requeued: u64,
    /// The most attempts one invoice needed.
    most_attempts: u32,
    bulkhead: Metrics,
    provider_requests: u64,
    provider_peak: usize,
    provider_503: u64,
    elapsed: Duration,
}

async fn run(invoices: usize, show_progress: bool) -> Report {
    let provider = Provider::start(PROVIDER_CONNECTIONS)
        .await
        .expect("start the provider on loopback");
    let gateway = InvoiceGateway {
        bulkhead: Bulkhead::builder()
            .name("invoice-provider")
            .max_concurrent_calls(PROVIDER_CONNECTIONS)
            .max_wait(MAX_WAIT)
            .max_queue(MAX_QUEUE)
            .call_timeout(CALL_TIMEOUT)
            .build()
            .expect("a valid bulkhead"),
        client: ProviderClient::new(provider.addr),
    };
    let requeued = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));

    let progress = if show_progress {
        let bar = ProgressBar::new(invoices as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{bar:36}] {human_pos:>6}/{human_len} issued  {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    // The bar is driven from counters read together, every 50 ms, so the
    // position and the gauges beside it describe the same moment.
    let ticker = tokio::spawn({
        let (progress, bulkhead, requeued, done) = (
            progress.clone(),
            gateway.bulkhead.clone(),
            requeued.clone(),
            done.clone(),
        );
        async move {
            loop {
                let finished = done.load(Ordering::Relaxed);
                let m = bulkhead.metrics();
                progress.set_message(format!(
                    "in flight {} · waiting {:>6} · re-queued {}",
                    m.in_flight(),
                    thousands(m.queued() as u64),
                    thousands(requeued.load(Ordering::Relaxed)),
                ));
                progress.set_position(finished);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    // Spawn every invoice at once; the bulkhead decides who goes when.
    let started = Instant::now();
    let tasks: Vec<_> = (0..invoices)
        .map(|id| {
            let (gateway, requeued, done) = (gateway.clone(), requeued.clone(), done.clone());
            let invoice = Invoice {
                id,
                amount_vnd: 100_000 + mix(id as u64) % 50_000_000,
            };
            tokio::spawn(async move {
                let (issued, attempts) = gateway.issue_with_retries(&invoice, &requeued).await;
                done.fetch_add(1, Ordering::Relaxed);
                (invoice.id, issued, attempts)
            })
        })
        .collect();

    let mut issued = 0;
    let mut failed = Vec::new();
    let mut failed_count = 0;
    let mut most_attempts = 0;
    for task in tasks {
        let (id, outcome, attempts) = task.await.expect("an invoice task panicked");
        most_attempts = most_attempts.max(attempts);
        match outcome {
            Ok(_number) => issued += 1,
            Err(e) => {
                failed_count += 1;
                if failed.len() < 5 {
                    failed.push((id, e.to_string()));
                }
            }
        }
    }
    let elapsed = started.elapsed();
    ticker.abort();
    progress.set_position(done.load(Ordering::Relaxed));
    progress.finish_with_message("done");

    let stats = &provider.stats;
    Report {
        invoices,
        issued,
        failed,
        failed_count,
        requeued: requeued.load(Ordering::Relaxed),
        most_attempts,
        bulkhead: gateway.bulkhead.metrics(),
        provider_requests: stats.requests.load(Ordering::SeqCst),
        provider_peak: stats.peak_in_flight.load(Ordering::SeqCst),
        provider_503: stats.unavailable.load(Ordering::SeqCst),
        elapsed,
    }
}

/// `12345` as `12,345`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.bulkhead;
        let n = thousands;
        let secs = self.elapsed.as_secs_f64();
        let wait = MAX_WAIT.as_secs();
        writeln!(f, "month-end run")?;
        writeln!(
            f,
            "  invoices issued          {:>8} of {}",
            n(self.issued as u64),
            n(self.invoices as u64)
        )?;
        writeln!(
            f,
            "  invoices failed          {:>8}",
            n(self.failed_count as u64)
        )?;
        writeln!(f, "  elapsed                  {secs:>8.2} s")?;
        writeln!(
            f,
            "  throughput               {:>8} invoices/s",
            n((self.issued as f64 / secs) as u64)
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "bulkhead \"{}\": {} at once, max_wait {wait} s, max_queue {}, call_timeout {} s",
            m.name(),
            m.max_concurrent_calls(),
            n(m.max_queue().unwrap_or(0) as u64),
            CALL_TIMEOUT.as_secs(),
        )?;
        writeln!(f, "  calls permitted          {:>8}", n(m.permitted()))?;
        writeln!(f, "  rejected: line full      {:>8}", n(m.rejected_full()))?;
        writeln!(
            f,
            "  rejected: waited {wait} s     {:>8}",
            n(m.rejected_timeout())
        )?;
        writeln!(
            f,
            "  rejected: closed         {:>8}",
            n(m.rejected_closed())
        )?;
        writeln!(f, "  call timeouts            {:>8}", n(m.call_timeouts()))?;
        writeln!(
            f,
            "  in flight / queued now   {:>8}",
            format!("{} / {}", m.in_flight(), m.queued())
        )?;
        writeln!(f)?;
        writeln!(f, "provider (as its server counted)")?;
        writeln!(
            f,
            "  requests received        {:>8}",
            n(self.provider_requests)
        )?;
        writeln!(
            f,
            "  peak requests at once    {:>8}   (the contract allows {PROVIDER_CONNECTIONS})",
            self.provider_peak
        )?;
        write!(f, "  503 answers              {:>8}", n(self.provider_503))?;
        if self.requeued > 0 {
            write!(
                f,
                "\n\nEvery invoice joined the line at once, so the back of the line waited \
                 longer than max_wait:\n{} calls were told \"busy, retry later\" and re-queued \
                 by the job; no invoice needed more\nthan {} attempts.",
                n(self.requeued),
                self.most_attempts,
            )?;
        }
        for (id, error) in &self.failed {
            write!(f, "\n  failed: invoice {id}: {error}")?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let invoices = 10_000;
    println!(
        "issuing {} e-invoices through a provider that allows \
         {PROVIDER_CONNECTIONS} connections at once",
        thousands(invoices as u64)
    );
    let report = run(invoices, true).await;
    if std::io::stderr().is_terminal() {
        // The finished bar leaves the cursor at the end of its line.
        eprintln!();
    }
    println!("\n{report}");
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issues_every_invoice_without_overloading_the_provider() {
        let report =
            tokio::time::timeout(std::time::Duration::from_secs(60), super::run(500, false))
                .await
                .expect("the run hung");
        assert_eq!(report.provider_503, 0, "{report}");
        assert!(
            report.provider_peak <= super::PROVIDER_CONNECTIONS,
            "{report}"
        );
        assert_eq!((report.issued, report.failed_count), (500, 0), "{report}");
        let m = &report.bulkhead;
        assert_eq!(m.permitted(), 500);
        assert_eq!(m.rejected(), report.requeued);
        assert_eq!((m.in_flight(), m.queued(), m.call_timeouts()), (0, 0, 0));
        assert_eq!(report.provider_requests, 500);
    }
}
