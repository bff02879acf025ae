//! `BulkheadLayer::http_responses`: a rejected request answers `503` with
//! `Retry-After` (whole seconds, rounded up, at least 1) and the reason, a
//! call cut off by `call_timeout` answers `504`, the inner service's
//! errors pass through unboxed (an infallible service stays infallible),
//! and the user can make the responses.

#![cfg(all(not(loom), feature = "http", feature = "tokio"))]

use std::convert::Infallible;
use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, ServiceExt};
use watertight::Bulkhead;
use watertight::tower::{BulkheadLayer, Refusal};

/// A request that holds its permit for `hold` (on the runtime's clock).
fn request(hold: Duration) -> Request<Duration> {
    Request::new(hold)
}

async fn handler(req: Request<Duration>) -> Result<Response<String>, Infallible> {
    tokio::time::sleep(*req.body()).await;
    Ok(Response::new("done".to_owned()))
}

/// Runs calls that hold their permit `hold` each, for a hold time to
/// estimate the retry hint from.
async fn hold_times<S>(service: &S, hold: Duration)
where
    S: Service<Request<Duration>, Response = Response<String>, Error = Infallible> + Clone,
{
    for _ in 0..32 {
        let ok = service.clone().oneshot(request(hold)).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
}

/// What an axum router asks of a layered service: that it cannot fail.
fn infallible<S: Service<Request<Duration>, Error = Infallible>>(service: S) -> S {
    service
}

/// On tokio's paused clock, so that hold times of seconds take none: a
/// rejection answers 503 with the reason, `Retry-After` the hint rounded
/// up (1.5 s of hold time: 2), none before any hold time is known, none
/// when closed; a call past `call_timeout` answers 504.
#[tokio::test(start_paused = true)]
async fn rejections_answer_503_with_retry_after_and_timeouts_504() {
    let bh = Bulkhead::builder()
        .name("api")
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .call_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let service = infallible(
        ServiceBuilder::new()
            .layer(BulkheadLayer::new(bh.clone()).http_responses())
            .service_fn(handler),
    );

    // No hold time known yet: no `Retry-After`.
    let held = bh.try_acquire().unwrap();
    let busy = service
        .clone()
        .oneshot(request(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.body(), r#"bulkhead "api" is full"#);
    assert_eq!(busy.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
    assert!(busy.headers().get(RETRY_AFTER).is_none(), "{busy:?}");
    drop(held);

    // Calls that hold their permit 1.5 s each.
    hold_times(&service, Duration::from_millis(1_500)).await;
    let held = bh.try_acquire().unwrap();
    let busy = service
        .clone()
        .oneshot(request(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    let hint = bh.try_acquire().unwrap_err();
    let secs = hint.retry_after().unwrap();
    assert!(
        secs > Duration::from_secs(1) && secs <= Duration::from_secs(2),
        "{secs:?}"
    );
    assert_eq!(hint.retry_after_secs(), Some(2));
    assert_eq!(busy.headers()[RETRY_AFTER], "2", "{busy:?}");
    drop(held);

    // Cut off by `call_timeout`.
    let late = service
        .clone()
        .oneshot(request(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(late.body(), r#"call in bulkhead "api" timed out after 5s"#);
    assert!(late.headers().get(RETRY_AFTER).is_none());
    assert_eq!(bh.metrics().call_timeouts(), 1);

    // Closed: 503, and no time to come back at.
    bh.close();
    let closed = service.oneshot(request(Duration::ZERO)).await.unwrap();
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(closed.body(), r#"bulkhead "api" is closed"#);
    assert!(closed.headers().get(RETRY_AFTER).is_none());
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// A hint well under a second still says 1: `Retry-After` counts whole
/// seconds, and 0 would mean "now".
#[tokio::test(start_paused = true)]
async fn a_hint_under_a_second_says_one() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).http_responses())
        .service_fn(handler);
    hold_times(&service, Duration::from_millis(20)).await;
    let _held = bh.try_acquire().unwrap();
    let busy = service.oneshot(request(Duration::ZERO)).await.unwrap();
    assert_eq!(busy.headers()[RETRY_AFTER], "1", "{busy:?}");
}

/// The inner service's own error passes through as itself, not boxed.
#[tokio::test]
async fn the_inner_services_errors_pass_through_unboxed() {
    #[derive(Debug, PartialEq)]
    struct Upstream(&'static str);

    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).http_responses())
        .service_fn(|_: Request<()>| async { Err::<Response<String>, _>(Upstream("refused")) });
    let err: Upstream = service.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(err, Upstream("refused"));
    assert_eq!(bh.metrics().in_flight(), 0);
}

/// `http_responses_with` makes the responses: here JSON with a status of
/// its own for a full line, built on the default response.
#[tokio::test]
async fn the_user_can_make_the_responses() {
    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let json = |refusal: Refusal<'_>| {
        let mut response = refusal.response::<String>();
        if let Refusal::Rejected(rejected) = refusal {
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            *response.body_mut() = format!(r#"{{"reason":"{}"}}"#, rejected.reason());
        }
        response
    };
    let service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).http_responses_with(json))
        .service_fn(handler);
    let _held = bh.try_acquire().unwrap();
    let busy = service.oneshot(request(Duration::ZERO)).await.unwrap();
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.body(), r#"{"reason":"full"}"#);
}

/// A response maker that panics: the panic comes out of the request's
/// future, the permit of a call cut off by `call_timeout` is back before
/// the maker runs, and the bulkhead serves the next request.
#[tokio::test(start_paused = true)]
async fn a_response_maker_that_panics_loses_no_permit() {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;

    let bh = Bulkhead::builder()
        .max_concurrent_calls(1)
        .max_wait(Duration::ZERO)
        .call_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let panics = |refusal: Refusal<'_>| -> Response<String> {
        panic!("the response maker panics on {}", refusal.status())
    };
    let service = ServiceBuilder::new()
        .layer(BulkheadLayer::new(bh.clone()).http_responses_with(panics))
        .service_fn(handler);
    // Cut off by `call_timeout`, then rejected when full.
    let timed_out = AssertUnwindSafe(service.clone().oneshot(request(Duration::from_secs(1))));
    let caught = timed_out.catch_unwind().await;
    assert!(caught.is_err(), "the maker's panic comes out of the future");
    let m = bh.metrics();
    assert_eq!((m.in_flight(), m.call_timeouts()), (0, 1));
    let held = bh.try_acquire().unwrap();
    let full = AssertUnwindSafe(service.clone().oneshot(request(Duration::ZERO)));
    assert!(full.catch_unwind().await.is_err());
    assert_eq!(bh.metrics().rejected_full(), 1);
    drop(held);
    let ok = service.oneshot(request(Duration::ZERO)).await.unwrap();
    assert_eq!((ok.status(), bh.metrics().in_flight()), (StatusCode::OK, 0));
}
