//! Limit how much work touches a scarce resource at once, on any async
//! runtime.
//!
//! [`Semaphore`] is an async counting semaphore: fair (strict FIFO) by
//! default, with an opt-in barging mode; weighted (acquire many permits at
//! once); safe to cancel at any point; with no lock and no allocation when
//! nobody waits, and no allocation per waiter ever (the queue node lives in
//! the [`Acquire`](futures::Acquire) future). Its odd corners follow Java's
//! `java.util.concurrent.Semaphore`: the balance can be raised past the
//! initial count, pushed below zero while permits are held, and drained, and
//! a permit forgotten by one task can be given back by another.
//!
//! It depends on no runtime: the futures work on tokio, async-std, smol or
//! `futures::executor::block_on`, and plain threads can wait in the same
//! line with [`Semaphore::acquire_blocking`] (and [`Bulkhead::call_blocking`]).
//!
//! [`Bulkhead`] wraps the semaphore in the policy people use to guard a
//! downstream dependency: wait (for at most `max_wait`, in a line of at most
//! `max_queue`) or fail fast, bound each call with `call_timeout`, reject
//! with a typed [`RejectReason`], count everything in [`Metrics`], report
//! every call to an [`Observer`], and change the limit at runtime.
//!
//! ```
//! use std::time::Duration;
//! use watertight::Bulkhead;
//!
//! # futures::executor::block_on(async {
//! let provider = Bulkhead::builder()
//!     .name("invoice-provider")
//!     .max_concurrent_calls(5)
//!     .max_wait(Duration::from_secs(3))
//!     .build()?;
//! let number = provider.call(async { Ok::<_, std::io::Error>(1042) }).await.unwrap();
//! assert_eq!(number, 1042);
//! # Ok::<(), watertight::BuildError>(())
//! # }).unwrap();
//! ```
//!
//! ```
//! use std::sync::Arc;
//! use watertight::Semaphore;
//!
//! # futures::executor::block_on(async {
//! // At most three requests to the downstream service at once.
//! let limit = Arc::new(Semaphore::new(3));
//! let permit = limit.acquire().await.unwrap();
//! // ... call the service ...
//! drop(permit); // the permit goes straight to the next waiter, if any
//! # });
//! ```
//!
//! # Features
//!
//! The semaphore needs only `std` and no feature. The features choose the
//! [`timer`] that a bulkhead's `max_wait` and `call_timeout` run on when
//! none is given to its builder, as [`timer::default_timer`] picks it:
//!
//! - `tokio`: `TokioTimer`, on the time driver of the tokio runtime the
//!   bulkhead is built in (it follows `tokio::time::pause`). Picked first,
//!   when the bulkhead is built inside a tokio runtime.
//! - `async-io`: `AsyncIoTimer`, on the reactor that smol and async-std run
//!   on; it works under any executor. Picked next.
//! - `thread-timer` (default): lets `default_timer` fall back to
//!   [`ThreadTimer`](timer::ThreadTimer), one background thread per process,
//!   started on first use, that works under any executor, including
//!   `futures::executor::block_on`. Without this feature the crate never
//!   starts a thread of its own; `ThreadTimer` can still be passed
//!   explicitly.
//!
//! Two features publish what every bulkhead does (turn them off per
//! bulkhead with `BulkheadBuilder::exporters(false)`, or each alone with
//! `export_metrics(false)` / `export_tracing(false)`):
//!
//! - `metrics`: counters, an in-flight gauge and wait/hold-time histograms
//!   through the [`metrics`](https://docs.rs/metrics) facade, labelled by
//!   bulkhead name, rejection reason and call outcome. A bulkhead registers
//!   them on its first call, with the recorder installed then: install it
//!   before the first call (building earlier is fine; see
//!   `BulkheadBuilder::exporters`).
//! - `tracing`: a [`tracing`](https://docs.rs/tracing) event for every
//!   admission, rejection, finished call and suspected leak, each at a
//!   level the builder sets (`trace_levels`: rejections at `DEBUG` by
//!   default, calls cut short and leaks at `WARN`), and each
//!   call of `Bulkhead::call` runs inside a `bulkhead_call` span that names
//!   the bulkhead, so the call's own events say who admitted them.
//!
//! Four features share permits between processes:
//!
//! - `redis`: `watertight::redis`, a semaphore whose permits are leases in
//!   Redis (renewed while held, with fencing tokens) and a bulkhead over it.
//!   Needs `tokio` or `smol` as well, for the `redis` crate's connections
//!   and the background renewals (without either, the build stops with an
//!   error that says so); `smol` also brings the `async-io` timer.
//!   Like the rest of the crate it builds on Rust 1.86: recent `redis`
//!   releases need 1.88, but Cargo's MSRV-aware resolver (the default in
//!   edition 2024 workspaces) picks one that fits an older toolchain (the
//!   lockfile's `redis` 1.2 needs 1.85).
//! - `redis-cluster` (implies `redis`): the same semaphore on a Redis
//!   Cluster, through the `redis` crate's own cluster client
//!   (`redis::cluster::ClusterClient`; wake-ups need Redis 7 and RESP3).
//! - `redis-sentinel` (implies `redis`): the same semaphore on the primary
//!   that Redis Sentinel names, followed across failovers.
//! - `postgres` (implies `tokio`): `watertight::postgres`, a semaphore whose
//!   permits are leases in PostgreSQL (rows of a schema of its own, one
//!   transaction a grant, durable fences) and a bulkhead over it, through
//!   [`tokio-postgres`](https://docs.rs/tokio-postgres).
//!
//! And one puts a bulkhead in a tower stack:
//!
//! - `tower`: `watertight::tower`, a `BulkheadLayer` for tower, hyper, tonic
//!   and axum stacks, which takes a permit per request (never in
//!   `poll_ready`).
//! - `http` (implies `tower`): the layer's ready-made deadline readers
//!   read `http::Request`s: gRPC's `grpc-timeout` header
//!   (`tower::GrpcTimeout`) and a `tower::Deadline` request extension.
//!
//! With `default-features = false` and neither runtime feature there is no
//! default timer, and building a bulkhead that needs one fails with a
//! [`BuildError`] that says so, rather than waiting forever. Any executor's
//! timer can be plugged in through the one-method [`Timer`](timer::Timer)
//! trait.

// On docs.rs (and `.ci/run`'s nightly doc build): label every item that a
// cargo feature gates with that feature. `loom` is the model checker's
// build, which the docs are never made for: no "non-loom" labels.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(docsrs, doc(auto_cfg(hide(loom))))]
#![deny(unsafe_op_in_unsafe_fn)]
// Unsafe code lives in the intrusive list and the semaphore built on it
// (with its wake-up batch), and nowhere else: those two modules opt out
// below.
#![deny(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms,
    clippy::undocumented_unsafe_blocks
)]

#[cfg(not(loom))]
pub mod adaptive;
#[cfg(not(loom))]
mod blocking;
#[cfg(not(loom))]
mod bulkhead;
mod error;
#[cfg(not(loom))]
pub mod guide;
#[cfg(not(loom))]
pub mod keyed;
#[cfg(all(
    not(loom),
    any(
        all(feature = "redis", any(feature = "tokio", feature = "smol")),
        feature = "postgres"
    )
))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "redis", feature = "postgres"))))]
pub mod lease;
#[allow(unsafe_code)]
mod list;
mod loom;
#[cfg(not(loom))]
mod overload;
#[cfg(all(not(loom), feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(all(not(loom), feature = "redis", any(feature = "tokio", feature = "smol")))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[allow(unsafe_code)]
mod semaphore;
mod slots;
#[cfg(all(test, not(loom)))]
mod test_util;
#[cfg(not(loom))]
pub mod timer;
#[cfg(all(not(loom), feature = "tower"))]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

// Without a runtime the module is left out (its errors would bury this
// one), and the redis crate is built without its async half, which fails
// to compile on its own without one.
#[cfg(all(feature = "redis", not(any(feature = "tokio", feature = "smol"))))]
compile_error!(
    "the `redis` feature needs a runtime for its connections and lease renewals: \
     enable `tokio` or `smol` as well (e.g. `features = [\"redis\", \"tokio\"]`)"
);

#[cfg(not(loom))]
pub use bulkhead::{
    BuildError, BuildErrorKind, Bulkhead, BulkheadBuilder, BulkheadError, BulkheadPermit,
    CallOptions, CallOutcome, CallTimeout, ClassSeats, Metrics, Observer, RejectReason, Rejected,
};
pub use error::{AcquireError, LostReason, TryAcquireError};
#[cfg(not(loom))]
pub use keyed::KeyedBulkhead;
pub use semaphore::{OwnedPermit, Permit, Semaphore};

/// Hooks that see every call a [`Bulkhead`] handles, and the events they
/// receive.
#[cfg(not(loom))]
pub mod observer {
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub use crate::bulkhead::export::TraceLevels;
    pub use crate::bulkhead::observer::{
        CallOutcome, Finished, LeakSuspected, Observer, Permitted, Rejection,
    };
}

/// The named future types, so they can be stored in structs and polled by
/// hand.
pub mod futures {
    #[cfg(not(loom))]
    pub use crate::bulkhead::Call;
    pub use crate::semaphore::{Acquire, AcquireOwned};
}
