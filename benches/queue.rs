//! The semaphore's line when it is long: with `N` acquires queued, what it
//! costs to cancel one of them (drop a queued, never-granted acquire chosen
//! at random, so its neighbours are cold in cache) and to hand a permit to
//! the oldest. Issue 13's targets: at or below the best fair peer, and flat
//! (`N` = 1,000,000 within 1.1x of `N` = 16).
//!
//! The hand-off is timed two ways:
//!
//! * **hand-off cycle** (like for like): the permit held is dropped, as a
//!   task finishing its work drops it, and the oldest acquire is polled to
//!   its grant and keeps the new permit. Every crate's whole hand-off is in
//!   the timed loop, whether it does the work in the release (bulkhead,
//!   tokio, maitake-sync unlink the head there) or leaves part of it to the
//!   woken future's poll (futures-intrusive marks the head notified in the
//!   release; the head unlinks itself and takes the permit in its poll).
//! * **release alone**: `count` permits given back in a row with each
//!   crate's `add_permits` (`release` for futures-intrusive), the grants
//!   polled afterwards, untimed. Not like for like: futures-intrusive's
//!   fair release notifies only the head, so all but the first release of a
//!   row add to a counter and find the head already notified; the other
//!   crates serve one waiter per release.
//!
//! Each acquire future is boxed and pinned once, polled once with a no-op
//! waker (so the waker costs nothing, and the same for every crate: which
//! crate wakes inside its lock and which after it does not show here), and
//! kept in a slot. One sample times `BATCH` operations (fewer at `N` = 16);
//! between samples, untimed, the slots are refilled so `N` stays the same.
//! The crates are interleaved, one sample each in turn, and the median per
//! operation over the samples is reported.
//!
//! Usage: `cargo bench -p watertight-benches --bench queue -- run [REPS]`
//! (markdown on stdout; without `run` it prints this usage).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const SIZES: [usize; 2] = [16, 1_000_000];
const BATCH: usize = 4_000;

/// One crate's long line: the queued acquires, in slots, and the order they
/// joined the line in.
struct Queue<F: Future> {
    slots: Vec<Pin<Box<Option<F>>>>,
    /// Slot indices in line order; a cancelled slot's index stays until it
    /// reaches the front, and is skipped there.
    order: VecDeque<usize>,
    /// Incremented per slot refill, so a stale index in `order` is known.
    generation: Vec<u64>,
    order_gen: VecDeque<u64>,
    make: Box<dyn Fn() -> F>,
    add_one: Box<dyn Fn()>,
    forget: fn(F::Output),
    /// The permit the hand-off cycle gives back next (an acquire's output).
    held: Option<F::Output>,
    rng: u64,
}

impl<F: Future> Queue<F> {
    fn new(
        n: usize,
        make: Box<dyn Fn() -> F>,
        add_one: Box<dyn Fn()>,
        forget: fn(F::Output),
    ) -> Self {
        let mut q = Queue {
            slots: (0..n).map(|_| Box::pin(None)).collect(),
            order: VecDeque::with_capacity(n * 2),
            generation: vec![0; n],
            order_gen: VecDeque::with_capacity(n * 2),
            make,
            add_one,
            forget,
            held: None,
            rng: 0x9e37_79b9_7f4a_7c15,
        };
        // One permit taken before the line forms, for the hand-off cycle.
        (q.add_one)();
        let mut first = Box::pin((q.make)());
        let mut cx = Context::from_waker(Waker::noop());
        match first.as_mut().poll(&mut cx) {
            Poll::Ready(out) => q.held = Some(out),
            Poll::Pending => panic!("the one permit is free"),
        }
        for i in 0..n {
            q.fill(i);
        }
        q
    }

    /// A new acquire in slot `i`, polled once: it joins the back of the line.
    fn fill(&mut self, i: usize) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut slot = self.slots[i].as_mut();
        slot.set(Some((self.make)()));
        let fut = slot.as_pin_mut().unwrap();
        assert!(fut.poll(&mut cx).is_pending(), "no permit is free");
        self.generation[i] += 1;
        self.order.push_back(i);
        self.order_gen.push_back(self.generation[i]);
    }

    fn random(&mut self) -> usize {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as usize % self.slots.len()
    }

    /// Cancels `count` random queued acquires (timed), then refills them.
    fn cancel_sample(&mut self, count: usize) -> Duration {
        let picks: Vec<usize> = {
            let mut seen = std::collections::HashSet::new();
            let mut picks = Vec::with_capacity(count);
            while picks.len() < count {
                let i = self.random();
                if seen.insert(i) {
                    picks.push(i);
                }
            }
            picks
        };
        let took = self.cancel_batch(&picks);
        for &i in &picks {
            self.fill(i);
        }
        took / count as u32
    }

    /// The timed part of a cancel sample (a function of its own, for a
    /// profiler to pick out).
    ///
    /// With `QUEUE_FENCE` set, a full fence follows each cancel, so that
    /// no crate's cancel overlaps the next one's loads with its own pending
    /// stores (a diagnostic of the cancel figures in PERFORMANCE.md, "A long
    /// line").
    #[inline(never)]
    fn cancel_batch(&mut self, picks: &[usize]) -> Duration {
        let fenced = std::env::var_os("QUEUE_FENCE").is_some();
        let start = Instant::now();
        if fenced {
            for &i in picks {
                self.slots[i].set(None);
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            }
        } else {
            for &i in picks {
                self.slots[i].set(None);
            }
        }
        start.elapsed()
    }

    /// Gives `count` permits back one at a time with `add_permits` (timed):
    /// each goes to the oldest acquire. Then polls the granted ones, forgets
    /// their permits and queues new acquires.
    fn release_sample(&mut self, count: usize) -> Duration {
        let took = self.release_batch(count);
        let mut cx = Context::from_waker(Waker::noop());
        for i in self.oldest(count) {
            let fut = self.slots[i].as_mut().as_pin_mut().unwrap();
            match fut.poll(&mut cx) {
                Poll::Ready(out) => (self.forget)(out),
                Poll::Pending => panic!("the oldest acquire was not granted"),
            }
            self.slots[i].set(None);
            self.fill(i);
        }
        took / count as u32
    }

    /// The timed part of a release sample (a function of its own, for a
    /// profiler to pick out).
    #[inline(never)]
    fn release_batch(&mut self, count: usize) -> Duration {
        let start = Instant::now();
        for _ in 0..count {
            (self.add_one)();
        }
        start.elapsed()
    }

    /// `count` hand-off cycles (timed): drop the permit held, which goes
    /// to the oldest acquire; poll that acquire to its grant and hold its
    /// permit. Then queues new acquires in the slots served.
    fn cycle_sample(&mut self, count: usize) -> Duration {
        let oldest = self.oldest(count);
        let took = self.cycle_batch(&oldest);
        for &i in &oldest {
            self.slots[i].set(None);
            self.fill(i);
        }
        took / count as u32
    }

    /// The timed part of a cycle sample (for a profiler, as `cancel_batch`).
    #[inline(never)]
    fn cycle_batch(&mut self, oldest: &[usize]) -> Duration {
        let mut cx = Context::from_waker(Waker::noop());
        let start = Instant::now();
        for &i in oldest {
            drop(self.held.take());
            let fut = self.slots[i].as_mut().as_pin_mut().unwrap();
            match fut.poll(&mut cx) {
                Poll::Ready(out) => self.held = Some(out),
                Poll::Pending => panic!("the oldest acquire was not granted"),
            }
        }
        start.elapsed()
    }

    /// Takes the `count` oldest live acquires off the front of `order`
    /// (skipping the stale indices that cancels left), oldest first.
    fn oldest(&mut self, count: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let i = self.order.pop_front().unwrap();
            let generation = self.order_gen.pop_front().unwrap();
            if generation == self.generation[i] && self.slots[i].is_some() {
                out.push(i);
            }
        }
        out
    }
}

/// Object-safe face of a `Queue`, so the crates sit in one list.
trait Sampled {
    fn cancel_sample(&mut self, count: usize) -> Duration;
    fn release_sample(&mut self, count: usize) -> Duration;
    fn cycle_sample(&mut self, count: usize) -> Duration;
}

impl<F: Future> Sampled for Queue<F> {
    fn cancel_sample(&mut self, count: usize) -> Duration {
        Queue::cancel_sample(self, count)
    }
    fn release_sample(&mut self, count: usize) -> Duration {
        Queue::release_sample(self, count)
    }
    fn cycle_sample(&mut self, count: usize) -> Duration {
        Queue::cycle_sample(self, count)
    }
}

fn leak<T>(t: T) -> &'static T {
    Box::leak(Box::new(t))
}

fn queues(n: usize) -> Vec<(&'static str, Box<dyn Sampled>)> {
    let bh = leak(watertight::Semaphore::new(0));
    let tokio = leak(tokio::sync::Semaphore::new(0));
    let fi = leak(futures_intrusive::sync::Semaphore::new(true, 0));
    let maitake = leak(maitake_sync::Semaphore::new(0));
    vec![
        (
            "bulkhead",
            Box::new(Queue::new(
                n,
                Box::new(move || bh.acquire()),
                Box::new(move || bh.add_permits(1)),
                |out| out.unwrap().forget(),
            )),
        ),
        (
            "tokio",
            Box::new(Queue::new(
                n,
                Box::new(move || tokio.acquire()),
                Box::new(move || tokio.add_permits(1)),
                |out| out.unwrap().forget(),
            )),
        ),
        (
            "futures-intrusive (fair)",
            Box::new(Queue::new(
                n,
                Box::new(move || fi.acquire(1)),
                Box::new(move || fi.release(1)),
                |mut out| {
                    out.disarm();
                },
            )),
        ),
        (
            "maitake-sync",
            Box::new(Queue::new(
                n,
                Box::new(move || maitake.acquire(1)),
                Box::new(move || maitake.add_permits(1)),
                |out| out.unwrap().forget(),
            )),
        ),
    ]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(at) = args.iter().position(|a| a == "run") else {
        println!("usage: cargo bench -p watertight-benches --bench queue -- run [REPS]");
        return;
    };
    fn size<F>(_: &dyn Fn() -> F) -> usize {
        std::mem::size_of::<Option<F>>()
    }
    if std::env::var_os("QUEUE_SIZES").is_some() {
        let bh = leak(watertight::Semaphore::new(0));
        let tokio = leak(tokio::sync::Semaphore::new(0));
        let fi = leak(futures_intrusive::sync::Semaphore::new(true, 0));
        let maitake = leak(maitake_sync::Semaphore::new(0));
        eprintln!(
            "sizes: bulkhead {} tokio {} fi {} maitake {}",
            size(&|| bh.acquire()),
            size(&|| tokio.acquire()),
            size(&|| fi.acquire(1)),
            size(&|| maitake.acquire(1))
        );
    }
    let reps: usize = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(21);
    let mut results: Vec<(usize, &str, [Duration; 3])> = Vec::new();
    for n in SIZES {
        let count = BATCH.min(n / 2);
        let mut qs = queues(n);
        // For a profiler: one crate only.
        if let Ok(only) = std::env::var("QUEUE_ONLY") {
            qs.retain(|(name, _)| name.starts_with(only.as_str()));
        }
        let mut samples = vec![[const { Vec::new() }; 3]; qs.len()];
        for rep in 0..reps {
            // A rotating order, so no crate always goes first.
            for k in 0..qs.len() {
                let i = (k + rep) % qs.len();
                let q = &mut qs[i].1;
                samples[i][0].push(q.cancel_sample(count));
                samples[i][1].push(q.cycle_sample(count));
                samples[i][2].push(q.release_sample(count));
            }
        }
        for (i, (name, _)) in qs.iter().enumerate() {
            let s = &samples[i];
            results.push((
                n,
                name,
                [
                    median(s[0].clone()),
                    median(s[1].clone()),
                    median(s[2].clone()),
                ],
            ));
        }
    }
    println!(
        "| queued | crate | cancel a random queued acquire | hand-off cycle (drop the permit, the oldest polled to its grant) | release alone (`add_permits`, in a row) |"
    );
    println!("|---|---|---|---|---|");
    for (n, name, [cancel, cycle, release]) in &results {
        println!("| {n} | {name} | {cancel:.1?} | {cycle:.1?} | {release:.1?} |");
    }
    let of = |n: usize, name: &str| results.iter().find(|r| r.0 == n && r.1 == name);
    let (Some(big), Some(small)) = (of(1_000_000, "bulkhead"), of(16, "bulkhead")) else {
        return;
    };
    println!();
    println!("bulkhead, 1,000,000 against 16 queued:");
    println!(
        "  cancel {:.2}x, hand-off cycle {:.2}x, release alone {:.2}x",
        big.2[0].as_secs_f64() / small.2[0].as_secs_f64(),
        big.2[1].as_secs_f64() / small.2[1].as_secs_f64(),
        big.2[2].as_secs_f64() / small.2[2].as_secs_f64()
    );
}
