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
//! line with [`Semaphore::acquire_blocking`].
//!
//! ```
//! use std::sync::Arc;
//! use bulkhead::Semaphore;
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
//! The crate has no cargo features yet; the semaphore needs only `std`.
//! Runtime integrations (timers for the bulkhead) and exporters will come
//! behind features named after the crate they use (`tokio`, `metrics`, ...).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms,
    clippy::undocumented_unsafe_blocks
)]

#[cfg(not(loom))]
mod blocking;
mod error;
mod list;
mod loom;
mod semaphore;
mod wake_list;

pub use error::{AcquireError, TryAcquireError};
pub use semaphore::{OwnedPermit, Permit, Semaphore};

/// The named future types, so they can be stored in structs and polled by
/// hand.
pub mod futures {
    pub use crate::semaphore::{Acquire, AcquireOwned};
}
