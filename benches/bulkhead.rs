//! The cost of the `Bulkhead` policy over a bare semaphore, uncontended.
//!
//! - `bulkhead_call/semaphore`: `Semaphore::acquire()` polled once, then the
//!   permit and future dropped (the floor).
//! - `bulkhead_call/call`: `Bulkhead::call` of a ready future, no observer.
//! - `bulkhead_call/call_observer`: the same with a no-op observer installed
//!   (which turns on the clock readings for wait and hold times).
//! - `bulkhead_call/try_acquire`: `Bulkhead::try_acquire` and drop.
//!
//! Every future is polled once by hand with `Waker::noop()`, so no executor
//! is measured. Run with `cargo bench -p watertight-benches --bench bulkhead`;
//! with `--features metrics` to include the metrics exporter's cost.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use watertight::observer::Observer;
use watertight::{Bulkhead, Semaphore};

/// Polls a future that must be ready at once.
#[inline]
fn ready<F: Future>(fut: F) -> F::Output {
    let fut = pin!(fut);
    match fut.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("uncontended future was not ready"),
    }
}

struct Quiet;
impl Observer for Quiet {}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("bulkhead_call");
    let sem = Semaphore::new(8);
    g.bench_function("semaphore", |b| {
        b.iter(|| drop(black_box(ready(sem.acquire()).unwrap())))
    });
    let bh = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .build()
        .unwrap();
    g.bench_function("call", |b| {
        b.iter(|| black_box(ready(bh.call(async { Ok::<_, ()>(black_box(1u32)) })).unwrap()))
    });
    g.bench_function("try_acquire", |b| {
        b.iter(|| drop(black_box(bh.try_acquire().unwrap())))
    });
    let observed = Bulkhead::builder()
        .name("bench")
        .max_concurrent_calls(8)
        .observer(Arc::new(Quiet))
        .build()
        .unwrap();
    g.bench_function("call_observer", |b| {
        b.iter(|| black_box(ready(observed.call(async { Ok::<_, ()>(black_box(1u32)) })).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
