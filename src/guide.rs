//! User guides: what each part of the crate is for, how to use it, what
//! it guarantees as measured, and where its limits are.
//!
//! The API pages say what each item does; these pages say how the items
//! fit together for a job. Their examples are compiled and run as tests,
//! so they stay true to the code.
//!
//! | page | read it to |
//! |---|---|
//! | [`semaphore`] | limit concurrent work with the bare [`Semaphore`](crate::Semaphore): fair or unfair, weighted, cancellation, Java's odd corners, blocking threads |
//! | [`bulkhead`] | guard a dependency with a [`Bulkhead`](crate::Bulkhead): waiting, timeouts, rejections, retry hints, metrics, shutdown, tower stacks |
//! | [`keyed`] | give each tenant or host its own limit under a global one with a [`KeyedBulkhead`](crate::KeyedBulkhead) |
//! | [`overload`] | keep serving under overload: deadlines, controlled delay, adaptive LIFO, priority classes, fair shares, with a simulation |
//! | [`adaptive`] | let the limit follow the dependency's capacity (AIMD, gradient), with a simulation |
//! | [`distributed`] | share one limit between processes through leases in Redis or PostgreSQL (features `redis`, `postgres`) |
//!
//! The [crate documentation](crate) lists the cargo features.

#[doc = include_str!("guide/semaphore.md")]
pub mod semaphore {}

#[doc = include_str!("guide/bulkhead.md")]
pub mod bulkhead {}

#[doc = include_str!("guide/keyed.md")]
pub mod keyed {}

#[doc = include_str!("guide/overload.md")]
#[doc = ""]
#[doc = include_str!("guide/overload.svg")]
pub mod overload {}

#[doc = include_str!("guide/adaptive.md")]
#[doc = ""]
#[doc = include_str!("guide/adaptive.svg")]
pub mod adaptive {}

#[doc = include_str!("guide/distributed.md")]
pub mod distributed {}
