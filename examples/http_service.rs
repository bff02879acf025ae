//! An axum service that calls a slow upstream with reqwest, guarded on
//! both sides, with its metrics on its own router:
//!
//! - the server side: a `BulkheadLayer` on the `/quote` route (bulkhead
//!   `quotes`, 12 requests at once, no line): past that a request is
//!   answered `503` with `Retry-After` by the layer itself
//!   (`http_responses`, no `HandleErrorLayer`);
//! - the client side: the reqwest client wrapped in a `BulkheadLayer`
//!   (bulkhead `upstream`, 4 calls at once, a wait of at most 40 ms, each
//!   call cut off after 500 ms): the upstream never sees more than 4 calls,
//!   and a call that cannot get a slot in time is answered `503` by the
//!   handler from the error (`Refusal::of`);
//! - Prometheus at `/metrics` on the same router
//!   (`metrics-exporter-prometheus`, no listener of its own), and a
//!   `tracing` filter that shows the bulkheads' warnings only.
//!
//! The upstream takes 25 ms a call. 24 clients send 10 requests each; the
//! example prints what they got back, and the bulkheads' series as
//! Prometheus scrapes them. The bulkheads are built, and one is even
//! called, before the recorder is installed: their series are there all
//! the same. `grafana/bulkheads.json` is a dashboard over these series.
//!
//! Run with `cargo run --release --features service --example http_service`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use watertight::Bulkhead;
use watertight::tower::{BoxError, BulkheadLayer, Refusal};

/// Requests the service works on at once.
const SERVED: usize = 12;
/// Calls to the upstream at once.
const UPSTREAM_LIMIT: usize = 4;
/// How long a call waits for an upstream slot.
const UPSTREAM_WAIT: Duration = Duration::from_millis(40);
/// How long the upstream takes.
const UPSTREAM_WORK: Duration = Duration::from_millis(25);
/// The load: clients at once, requests each.
const CLIENTS: usize = 24;
const REQUESTS: usize = 10;

/// The reqwest client behind the `upstream` bulkhead.
type Upstream = BoxCloneSyncService<reqwest::Request, reqwest::Response, BoxError>;

#[derive(Clone)]
struct App {
    upstream: Upstream,
    upstream_url: String,
}

/// What the load saw, and the metrics page after it.
struct Outcome {
    statuses: BTreeMap<u16, usize>,
    page: String,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(Targets::new().with_target("watertight", tracing::Level::WARN))
        .init();
    let outcome = run(CLIENTS, REQUESTS).await?;
    println!(
        "{} requests, by status: {:?}",
        CLIENTS * REQUESTS,
        outcome.statuses
    );
    println!("\nthe bulkheads' series at /metrics:");
    for line in outcome.page.lines() {
        let quantile = line.contains("quantile=") || line.contains("le=");
        if line.starts_with("bulkhead_") && !quantile && !line.ends_with(" 0") {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Starts the upstream and the service, drives the load, and scrapes
/// `/metrics` once it is done.
async fn run(clients: usize, requests: usize) -> Result<Outcome, BoxError> {
    // Built before the recorder is installed, as a service's start-up
    // often does, and the client's bulkhead even used: both publish once
    // the recorder is there.
    let quotes = Bulkhead::builder()
        .name("quotes")
        .max_concurrent_calls(SERVED)
        .max_wait(Duration::ZERO)
        .build()?;
    let upstream_bh = Bulkhead::builder()
        .name("upstream")
        .max_concurrent_calls(UPSTREAM_LIMIT)
        .max_wait(UPSTREAM_WAIT)
        .call_timeout(Duration::from_millis(500))
        .build()?;
    drop(upstream_bh.try_acquire()?); // a warm-up, before any recorder

    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
        )?
        .install_recorder()?;

    let upstream_addr = serve(Router::new().route(
        "/price",
        get(|| async {
            tokio::time::sleep(UPSTREAM_WORK).await;
            "42.00"
        }),
    ))
    .await?;
    let client = ServiceBuilder::new()
        .layer(BulkheadLayer::new(upstream_bh))
        .service(reqwest::Client::new());
    let app = App {
        upstream: BoxCloneSyncService::new(client),
        upstream_url: format!("http://{upstream_addr}/price"),
    };
    let router = Router::new()
        .route("/quote", get(quote))
        .route_layer(BulkheadLayer::new(quotes).http_responses())
        .with_state(app)
        .route("/metrics", get(move || metrics_page(prometheus.clone())));
    let addr = serve(router).await?;

    let http = reqwest::Client::new();
    let load = (0..clients).map(|_| {
        let http = http.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::with_capacity(requests);
            for _ in 0..requests {
                let response = http.get(format!("http://{addr}/quote")).send().await?;
                statuses.push(response.status().as_u16());
            }
            Ok::<_, reqwest::Error>(statuses)
        })
    });
    let mut statuses = BTreeMap::new();
    for client in load.collect::<Vec<_>>() {
        for status in client.await?? {
            *statuses.entry(status).or_insert(0) += 1;
        }
    }
    let page = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(Outcome { statuses, page })
}

/// The quote: the upstream's price, through the client's bulkhead. A call
/// the bulkhead stopped is answered as the bulkhead says (503 with
/// `Retry-After`, or 504); any other failure is a 502.
async fn quote(State(app): State<App>) -> Response {
    let request = reqwest::Request::new(
        reqwest::Method::GET,
        app.upstream_url.parse().expect("a valid URL"),
    );
    match app.upstream.oneshot(request).await {
        Ok(response) => match response.text().await {
            Ok(price) => price.into_response(),
            Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
        },
        Err(error) => match Refusal::of(&*error) {
            Some(refusal) => refusal.response::<axum::body::Body>(),
            None => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
        },
    }
}

async fn metrics_page(prometheus: PrometheusHandle) -> String {
    prometheus.render()
}

/// Serves `router` on a free loopback port, in a task of its own.
async fn serve(router: Router) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `name` with exactly `labels` on the page.
    fn value(page: &str, name: &str, labels: &str) -> Option<f64> {
        let series = format!("{name}{{{labels}}} ");
        page.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map(|v| v.parse().expect("a number"))
    }

    /// The example's load, smaller: every status comes from the bulkheads
    /// or the upstream, and the series on `/metrics` count exactly what the
    /// clients saw. Then every query of the Grafana dashboard names only
    /// series on the page.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_metrics_page_counts_what_the_clients_saw() {
        let (clients, requests) = (24, 4);
        let Outcome { statuses, page } = run(clients, requests).await.unwrap();
        let got = |status| statuses.get(&status).copied().unwrap_or(0) as f64;
        assert_eq!(statuses.values().sum::<usize>(), clients * requests);
        // 504: an upstream call past its 500 ms, on a very slow machine.
        assert!(
            statuses.keys().all(|s| [200, 503, 504].contains(s)),
            "{statuses:?}"
        );
        assert!(got(200) > 0.0, "{statuses:?}");

        let count = |name: &str, labels: &str| value(&page, name, labels).unwrap_or(0.0);
        let permitted = "bulkhead_calls_permitted_total";
        let rejected = "bulkhead_calls_rejected_total";
        let finished = "bulkhead_calls_finished_total";
        // Every 200 and 504 went through both bulkheads; the warm-up call
        // came before the recorder and is not on the page.
        let upstream_permitted = count(permitted, r#"bulkhead="upstream""#);
        assert_eq!(upstream_permitted, got(200) + got(504), "{page}");
        assert_eq!(
            count(finished, r#"bulkhead="upstream",outcome="success""#),
            got(200)
        );
        assert_eq!(
            count(finished, r#"bulkhead="upstream",outcome="timed_out""#),
            got(504)
        );
        // Every 503 is one rejection: by the service, full, or by the
        // client's bulkhead, out of time.
        let refused = count(rejected, r#"bulkhead="quotes",reason="full""#)
            + count(rejected, r#"bulkhead="upstream",reason="timeout""#);
        assert_eq!(refused, got(503), "{page}");
        assert_eq!(
            count(permitted, r#"bulkhead="quotes""#),
            upstream_permitted + count(rejected, r#"bulkhead="upstream",reason="timeout""#)
        );
        // Gauges, with nothing left in flight.
        assert_eq!(
            value(&page, "bulkhead_limit", r#"bulkhead="upstream""#),
            Some(4.0)
        );
        assert_eq!(
            value(&page, "bulkhead_limit", r#"bulkhead="quotes""#),
            Some(12.0)
        );
        for bulkhead in ["quotes", "upstream"] {
            let labels = format!(r#"bulkhead="{bulkhead}""#);
            assert_eq!(value(&page, "bulkhead_calls_in_flight", &labels), Some(0.0));
            assert_eq!(value(&page, "bulkhead_calls_waiting", &labels), Some(0.0));
        }
        assert!(
            page.contains("# HELP bulkhead_calls_rejected_total"),
            "{page}"
        );
        assert!(page.contains("bulkhead_wait_seconds_bucket{bulkhead=\"upstream\",le=\"0.05\"}"));

        // The dashboard's queries.
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("grafana/bulkheads.json")).unwrap();
        let mut queries = Vec::new();
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                queries.push(target["expr"].as_str().unwrap().to_owned());
            }
        }
        assert!(queries.len() >= 5, "{queries:?}");
        for query in &queries {
            let names = query
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("bulkhead_"));
            for name in names {
                assert!(
                    page.lines().any(|line| line.starts_with(name)),
                    "{name} (in {query}) is not on the page"
                );
            }
        }
    }
}
