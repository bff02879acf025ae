//! A deterministic simulation of one bulkhead under overload, driving the
//! very state machines of this module: the numbers and the plot of the
//! overload guide (`src/guide/overload.md` and `overload.svg`, written by
//! `plot.rs`), and what the guide says of them asserted in its tests.
//!
//! # The model
//!
//! Discrete events in virtual time (nanoseconds as `u64`), no threads, no
//! clock; a seeded xorshift generator draws every random number, with no
//! transcendental functions, so a run is the same on every machine.
//!
//! - **Seats**: the bulkhead admits `limit` calls at once; the dependency
//!   serves each admitted call in its own time (uniform between
//!   `service.0` and `service.1`), without slowing down: the limit *is*
//!   the capacity, `limit / mean service` calls a second.
//! - **Arrivals** are open loop at `load` times the capacity (gaps drawn
//!   uniformly from 0 to twice the mean: Poisson-ish). Each call has a
//!   priority class and a tenant, drawn by their traffic shares, and a
//!   caller that gives up after its patience (uniform in `patience`).
//!   Every attribute is drawn for every call whatever the strategy, so
//!   all strategies see exactly the same calls.
//! - **A caller that gives up while waiting leaves the line** (its future
//!   is dropped). **An admitted call runs to the end** even if its caller
//!   has gone (the dependency does not hear of it, as with a client-side
//!   timeout): finishing after the caller gave up, it is *wasted*;
//!   finishing before, it is *good*. Goodput is good calls per second.
//! - **The bulkhead** waits for at most `max_wait`, in a line of at most
//!   `max_queue`, and the strategy decides the rest (see [`Strategy`]).
//!   Its hold-time estimate (for deadlines) learns from every call.
//!
//! Latency is what the caller of an admitted call would have seen: from
//! arrival to the end of the call, wasted calls included.

#[path = "../../examples/sim/rng.rs"]
mod rng;
use rng::Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::overload::{Change, Drr, HoldEstimate, Join, QueueDelay, Seats, Verdict};

/// A millisecond in nanoseconds.
pub(crate) const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// Controlled delay's target and interval in every strategy that uses it
/// (Fail at Scale's values).
pub(crate) const TARGET: u64 = 5 * MS;
pub(crate) const INTERVAL: u64 = 100 * MS;

/// A priority class of the traffic (class 0 the most important).
#[derive(Debug, Clone)]
pub(crate) struct Class {
    pub(crate) name: &'static str,
    /// Its share of the seats, with [`Strategy::Priorities`].
    pub(crate) share: u32,
    /// Its share of the calls.
    pub(crate) traffic: f64,
}

/// A tenant (a key of a keyed bulkhead's global stage).
#[derive(Debug, Clone)]
pub(crate) struct Tenant {
    pub(crate) name: &'static str,
    /// Its weight, with [`Strategy::FairShare`].
    pub(crate) weight: u32,
    /// Its share of the calls.
    pub(crate) traffic: f64,
}

/// The bulkhead and the traffic.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// Virtual time to simulate (ns).
    pub(crate) duration: u64,
    /// Calls admitted at once.
    pub(crate) limit: usize,
    /// Service time, uniform in this range (ns).
    pub(crate) service: (u64, u64),
    /// Offered calls as a multiple of the capacity.
    pub(crate) load: f64,
    /// How long a caller waits for its answer, uniform in this range (ns).
    pub(crate) patience: (u64, u64),
    /// The bulkhead's `max_wait` (ns; `None`: unbounded).
    pub(crate) max_wait: Option<u64>,
    /// The bulkhead's `max_queue`.
    pub(crate) max_queue: Option<usize>,
    pub(crate) classes: Vec<Class>,
    pub(crate) tenants: Vec<Tenant>,
    /// Keep only the calls of this class (the same calls as in the full
    /// traffic, the others left out): "what it gets alone".
    pub(crate) only_class: Option<usize>,
    pub(crate) seed: u64,
}

impl Scenario {
    /// The overload guide's scenario at `load` times the capacity:
    /// 20 seats, calls of 25 to 75 ms (400 a second at capacity), callers
    /// who give up after 250 to 750 ms, `max_wait` 500 ms (the callers'
    /// mean patience), no `max_queue`, 60 simulated seconds. Three
    /// classes, critical (10 % of the calls, half the seats), normal
    /// (30 %, 30 %) and batch (60 %, 20 %); five tenants, a noisy one
    /// with 70 % of the calls, a paying one (15 %, weight 3) and three
    /// quiet ones (5 % each).
    pub(crate) fn standard(load: f64) -> Self {
        Self {
            duration: 60 * SEC,
            limit: 20,
            service: (25 * MS, 75 * MS),
            load,
            patience: (250 * MS, 750 * MS),
            max_wait: Some(500 * MS),
            max_queue: None,
            classes: vec![
                Class {
                    name: "critical",
                    share: 50,
                    traffic: 0.1,
                },
                Class {
                    name: "normal",
                    share: 30,
                    traffic: 0.3,
                },
                Class {
                    name: "batch",
                    share: 20,
                    traffic: 0.6,
                },
            ],
            tenants: vec![
                Tenant {
                    name: "noisy",
                    weight: 1,
                    traffic: 0.70,
                },
                Tenant {
                    name: "paying",
                    weight: 3,
                    traffic: 0.15,
                },
                Tenant {
                    name: "quiet 1",
                    weight: 1,
                    traffic: 0.05,
                },
                Tenant {
                    name: "quiet 2",
                    weight: 1,
                    traffic: 0.05,
                },
                Tenant {
                    name: "quiet 3",
                    weight: 1,
                    traffic: 0.05,
                },
            ],
            only_class: None,
            seed: 0x0b5e_55ed_2026,
        }
    }

    /// Calls the seats serve a second.
    pub(crate) fn capacity(&self) -> f64 {
        let mean = (self.service.0 + self.service.1) as f64 / 2.0 / SEC as f64;
        self.limit as f64 / mean
    }
}

/// How the bulkhead decides who waits, how long, and who is served next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// One line, oldest first, `max_wait` for everyone.
    Fifo,
    /// FIFO with controlled delay ([`QueueDelay`], target 5 ms, interval
    /// 100 ms).
    ControlledDelay,
    /// Controlled delay with adaptive LIFO.
    AdaptiveLifo,
    /// Priority classes with reserved seats ([`Seats`]); oldest first
    /// within a class, `max_wait` for everyone.
    Priorities,
    /// FIFO, and callers carry their deadline ([`HoldEstimate::admit`]).
    Deadline,
    /// One line per tenant, served by deficit round robin by weight
    /// ([`Drr`]); oldest first within a tenant, `max_wait` for everyone.
    FairShare,
}

impl Strategy {
    /// The strategies the overload guide compares.
    pub(crate) const ALL: [Strategy; 6] = [
        Strategy::Fifo,
        Strategy::ControlledDelay,
        Strategy::AdaptiveLifo,
        Strategy::Priorities,
        Strategy::Deadline,
        Strategy::FairShare,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::Fifo => "fifo",
            Strategy::ControlledDelay => "codel",
            Strategy::AdaptiveLifo => "codel+lifo",
            Strategy::Priorities => "priorities",
            Strategy::Deadline => "deadline",
            Strategy::FairShare => "drr",
        }
    }
}

/// Calls of one class or tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Served {
    pub(crate) arrived: u64,
    pub(crate) good: u64,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    pub(crate) strategy: Strategy,
    pub(crate) load: f64,
    pub(crate) arrived: u64,
    /// Finished before their caller gave up.
    pub(crate) good: u64,
    /// Finished after their caller gave up.
    pub(crate) wasted: u64,
    /// Left the line because their caller gave up.
    pub(crate) gave_up: u64,
    /// Rejected when their wait budget ran out (or cut by controlled
    /// delay).
    pub(crate) timed_out: u64,
    /// Rejected for a full line, or displaced by a more important caller.
    pub(crate) shed: u64,
    /// Rejected at once for a deadline they could not make.
    pub(crate) late: u64,
    /// Good calls a second.
    pub(crate) goodput: f64,
    /// Goodput as a share of the capacity.
    pub(crate) goodput_share: f64,
    /// Latency percentiles of admitted calls (ns).
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) classes: Vec<Served>,
    pub(crate) tenants: Vec<Served>,
    /// The longest any call admitted from the line waited while the line
    /// was overloaded (controlled delay), ns.
    pub(crate) overloaded_wait: u64,
    /// The share of the time the line was overloaded.
    pub(crate) overloaded_time: f64,
}

impl Report {
    /// Goodput of a class, calls a second.
    pub(crate) fn class_goodput(&self, class: usize, s: &Scenario) -> f64 {
        self.classes[class].good as f64 / (s.duration as f64 / SEC as f64)
    }

    /// Goodput of a tenant, as a share of the capacity.
    pub(crate) fn tenant_share(&self, tenant: usize, s: &Scenario) -> f64 {
        self.tenants[tenant].good as f64 / (s.duration as f64 / SEC as f64) / s.capacity()
    }
}

/// Uniform in `lo..=hi` from `rng`, near enough.
fn between(rng: &mut Rng, (lo, hi): (u64, u64)) -> u64 {
    lo + ((hi - lo) as f64 * rng.next_f64()) as u64
}

/// An index drawn from `rng` by `weights` (which add up to about 1).
fn pick(rng: &mut Rng, weights: impl Iterator<Item = f64>) -> usize {
    let u = rng.next_f64();
    let mut sum = 0.0;
    let mut last = 0;
    for (i, w) in weights.enumerate() {
        sum += w;
        last = i;
        if u < sum {
            return i;
        }
    }
    last
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival,
    Finish(usize),
    GiveUp(usize),
    Budget(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Gone,
}

#[derive(Debug, Clone)]
struct Call {
    arrival: u64,
    service: u64,
    give_up_at: u64,
    class: usize,
    tenant: usize,
    state: State,
    enqueued: u64,
    /// When its wait budget runs out (`u64::MAX`: never).
    deadline: u64,
}

struct Sim<'a> {
    s: &'a Scenario,
    strategy: Strategy,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    calls: Vec<Call>,
    /// The line: one lane, or one per class or tenant. Holds ids of calls
    /// that may have left it since (skipped when met); `queued` counts the
    /// ones still waiting.
    lanes: Vec<VecDeque<usize>>,
    queued: usize,
    in_use: usize,
    codel: Option<QueueDelay>,
    seats: Option<Seats>,
    drr: Option<Drr<usize>>,
    hold: HoldEstimate,
    latencies: Vec<u64>,
    overloaded_since: Option<u64>,
    overloaded_total: u64,
    report: Report,
}

/// Runs `strategy` on `scenario`.
pub(crate) fn run(scenario: &Scenario, strategy: Strategy) -> Report {
    let s = scenario;
    let codel = match strategy {
        Strategy::ControlledDelay => Some(QueueDelay::new(TARGET, INTERVAL)),
        Strategy::AdaptiveLifo => Some(QueueDelay::new(TARGET, INTERVAL).adaptive_lifo(true)),
        _ => None,
    };
    let lanes = match strategy {
        Strategy::Priorities => s.classes.len(),
        Strategy::FairShare => s.tenants.len(),
        _ => 1,
    };
    let shares: Vec<u32> = s.classes.iter().map(|c| c.share).collect();
    let mut sim = Sim {
        s,
        strategy,
        now: 0,
        seq: 0,
        events: BinaryHeap::new(),
        calls: Vec::new(),
        lanes: vec![VecDeque::new(); lanes],
        queued: 0,
        in_use: 0,
        codel,
        seats: (strategy == Strategy::Priorities)
            .then(|| Seats::new(s.limit, &shares, s.max_queue)),
        drr: (strategy == Strategy::FairShare).then(|| Drr::new(1)),
        hold: HoldEstimate::new(),
        latencies: Vec::new(),
        overloaded_since: None,
        overloaded_total: 0,
        report: Report {
            strategy,
            load: s.load,
            arrived: 0,
            good: 0,
            wasted: 0,
            gave_up: 0,
            timed_out: 0,
            shed: 0,
            late: 0,
            goodput: 0.0,
            goodput_share: 0.0,
            p50: 0,
            p99: 0,
            classes: vec![Served::default(); s.classes.len()],
            tenants: vec![Served::default(); s.tenants.len()],
            overloaded_wait: 0,
            overloaded_time: 0.0,
        },
    };
    sim.go();
    sim.report
}

impl Sim<'_> {
    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    fn go(&mut self) {
        let mut rng = Rng::new(self.s.seed);
        let rate = self.s.load * self.s.capacity();
        let gap = |rng: &mut Rng| (2.0 * rng.next_f64() * SEC as f64 / rate) as u64;
        let first = gap(&mut rng);
        self.at(first, Event::Arrival);
        while let Some(Reverse((time, _, event))) = self.events.pop() {
            if time >= self.s.duration {
                break;
            }
            self.now = time;
            match event {
                Event::Arrival => {
                    // Every draw for every call, so that all strategies
                    // see the same calls.
                    let service = between(&mut rng, self.s.service);
                    let patience = between(&mut rng, self.s.patience);
                    let class = pick(&mut rng, self.s.classes.iter().map(|c| c.traffic));
                    let tenant = pick(&mut rng, self.s.tenants.iter().map(|t| t.traffic));
                    if self.s.only_class.is_none_or(|only| only == class) {
                        self.arrive(service, patience, class, tenant);
                    }
                    let next = time + gap(&mut rng);
                    self.at(next, Event::Arrival);
                }
                Event::Finish(id) => self.finish(id),
                Event::GiveUp(id) => {
                    if self.calls[id].state == State::Waiting {
                        self.report.gave_up += 1;
                        self.remove(id);
                        self.check_empty();
                    }
                }
                Event::Budget(id) => {
                    let call = &self.calls[id];
                    if call.state == State::Waiting && call.deadline == time {
                        self.report.timed_out += 1;
                        let waited = time - call.enqueued;
                        self.remove(id);
                        self.sample(waited);
                        self.check_empty();
                    }
                }
            }
        }
        self.end();
    }

    fn arrive(&mut self, service: u64, patience: u64, class: usize, tenant: usize) {
        let id = self.calls.len();
        let now = self.now;
        self.calls.push(Call {
            arrival: now,
            service,
            give_up_at: now + patience,
            class,
            tenant,
            state: State::Gone,
            enqueued: now,
            deadline: u64::MAX,
        });
        self.report.arrived += 1;
        self.report.classes[class].arrived += 1;
        self.report.tenants[tenant].arrived += 1;
        let limit = self.s.limit;
        let mut budget = self.s.max_wait;
        if self.strategy == Strategy::Deadline {
            let free = limit.saturating_sub(self.in_use);
            match self
                .hold
                .admit(patience, self.queued, free, limit, self.s.max_wait)
            {
                Verdict::Reject { .. } => {
                    self.report.late += 1;
                    return;
                }
                Verdict::Admit { budget: b } => budget = b,
            }
        }
        let seat_now = match &mut self.seats {
            Some(seats) => seats.try_take(class),
            None => self.in_use < limit && self.queued == 0,
        };
        if seat_now {
            self.start(id);
            return;
        }
        if let Some(codel) = &self.codel {
            budget = codel.budget(budget);
        }
        if let Some(seats) = &mut self.seats {
            match seats.join(class) {
                Join::Queued => {}
                Join::Displaced(victim) => {
                    // The newest waiter of the victim class goes; the
                    // seats counted it out already.
                    let gone = self.pop_live(victim, true);
                    self.calls[gone].state = State::Gone;
                    self.queued -= 1;
                    self.report.shed += 1;
                }
                Join::Full => {
                    self.report.shed += 1;
                    return;
                }
            }
        } else if self.s.max_queue.is_some_and(|max| self.queued >= max) {
            self.report.shed += 1;
            return;
        }
        if let Some(drr) = &mut self.drr {
            drr.join(tenant, self.s.tenants[tenant].weight);
        }
        let lane = self.lane(id);
        self.lanes[lane].push_back(id);
        self.queued += 1;
        let call = &mut self.calls[id];
        call.state = State::Waiting;
        call.enqueued = now;
        let give_up_at = call.give_up_at;
        self.at(give_up_at, Event::GiveUp(id));
        if let Some(budget) = budget {
            self.calls[id].deadline = now + budget;
            self.at(now + budget, Event::Budget(id));
        }
    }

    fn lane(&self, id: usize) -> usize {
        match self.strategy {
            Strategy::Priorities => self.calls[id].class,
            Strategy::FairShare => self.calls[id].tenant,
            _ => 0,
        }
    }

    /// The oldest (or newest) call still waiting in `lane`, taken out of
    /// it. The counts say there is one.
    fn pop_live(&mut self, lane: usize, newest: bool) -> usize {
        loop {
            let lane = &mut self.lanes[lane];
            let id = if newest {
                lane.pop_back()
            } else {
                lane.pop_front()
            }
            .expect("the counts say someone waits in this lane");
            if self.calls[id].state == State::Waiting {
                return id;
            }
        }
    }

    /// A waiter leaves the line without a seat (then `check_empty`).
    fn remove(&mut self, id: usize) {
        let call = &mut self.calls[id];
        debug_assert_eq!(call.state, State::Waiting);
        call.state = State::Gone;
        let (class, tenant) = (call.class, call.tenant);
        self.queued -= 1;
        if let Some(seats) = &mut self.seats {
            seats.leave(class);
        }
        if let Some(drr) = &mut self.drr {
            drr.leave(&tenant);
        }
    }

    /// Tells controlled delay if the line is empty.
    fn check_empty(&mut self) {
        if self.queued == 0 {
            if let Some(codel) = &mut self.codel {
                if codel.emptied() == Change::Cleared {
                    self.cleared();
                }
            }
        }
    }

    fn start(&mut self, id: usize) {
        let call = &mut self.calls[id];
        call.state = State::Running;
        let end = self.now + call.service;
        self.in_use += 1;
        self.at(end, Event::Finish(id));
    }

    fn finish(&mut self, id: usize) {
        let now = self.now;
        let call = &mut self.calls[id];
        call.state = State::Gone;
        let (class, tenant) = (call.class, call.tenant);
        self.in_use -= 1;
        if let Some(seats) = &mut self.seats {
            seats.release(class);
        }
        self.hold.record(call.service);
        self.latencies.push(now - call.arrival);
        if now <= call.give_up_at {
            self.report.good += 1;
            self.report.classes[class].good += 1;
            self.report.tenants[tenant].good += 1;
        } else {
            self.report.wasted += 1;
        }
        self.serve();
    }

    /// Hands free seats to waiters.
    fn serve(&mut self) {
        while self.queued > 0 {
            let (lane, newest) = match self.strategy {
                Strategy::Priorities => match self.seats.as_mut().and_then(Seats::pick) {
                    Some(class) => (class, false),
                    None => return,
                },
                _ if self.in_use >= self.s.limit => return,
                Strategy::FairShare => match self.drr.as_mut().and_then(|d| d.next(|_| 1)) {
                    Some(tenant) => (tenant, false),
                    None => return,
                },
                _ => (0, self.codel.as_ref().is_some_and(QueueDelay::serve_newest)),
            };
            let id = self.pop_live(lane, newest);
            self.queued -= 1;
            let waited = self.now - self.calls[id].enqueued;
            if self.codel.as_ref().is_some_and(QueueDelay::is_overloaded) {
                self.report.overloaded_wait = self.report.overloaded_wait.max(waited);
            }
            if self.seats.is_some() {
                // `pick` counted the seat in already.
                self.in_use += 1;
                let call = &mut self.calls[id];
                call.state = State::Running;
                let end = self.now + call.service;
                self.at(end, Event::Finish(id));
            } else {
                self.start(id);
            }
            self.sample(waited);
            self.check_empty();
        }
    }

    /// A waiter left the line after `waited`: controlled delay's sample.
    fn sample(&mut self, waited: u64) {
        let Some(codel) = &mut self.codel else {
            return;
        };
        if codel.sample(self.now, waited) == Change::Overloaded {
            self.overloaded_since = Some(self.now);
            self.cut();
        }
    }

    /// The line just became overloaded: the waiters past the target are
    /// rejected, the rest get the target in all.
    fn cut(&mut self) {
        let target = self.codel.as_ref().map_or(u64::MAX, QueueDelay::target);
        let waiting: Vec<usize> = self.lanes[0]
            .iter()
            .copied()
            .filter(|&id| self.calls[id].state == State::Waiting)
            .collect();
        for id in waiting {
            if self.calls[id].state != State::Waiting {
                continue;
            }
            let until = self.calls[id].enqueued + target;
            if until <= self.now {
                self.report.timed_out += 1;
                self.remove(id);
            } else if until < self.calls[id].deadline {
                self.calls[id].deadline = until;
                self.at(until, Event::Budget(id));
            }
        }
        self.check_empty();
    }

    fn cleared(&mut self) {
        if let Some(since) = self.overloaded_since.take() {
            self.overloaded_total += self.now - since;
        }
    }

    fn end(&mut self) {
        self.now = self.s.duration;
        self.cleared();
        let r = &mut self.report;
        let seconds = self.s.duration as f64 / SEC as f64;
        r.goodput = r.good as f64 / seconds;
        r.goodput_share = r.goodput / self.s.capacity();
        r.overloaded_time = self.overloaded_total as f64 / self.s.duration as f64;
        self.latencies.sort_unstable();
        let percentile = |p: f64| {
            if self.latencies.is_empty() {
                0
            } else {
                self.latencies[((self.latencies.len() - 1) as f64 * p).round() as usize]
            }
        };
        r.p50 = percentile(0.50);
        r.p99 = percentile(0.99);
    }
}

/// The loads the overload guide compares.
pub(crate) const LOADS: [f64; 3] = [1.0, 2.0, 5.0];

/// Every strategy at every load of [`LOADS`], on [`Scenario::standard`].
pub(crate) fn standard_reports() -> &'static [Report] {
    static REPORTS: std::sync::OnceLock<Vec<Report>> = std::sync::OnceLock::new();
    REPORTS.get_or_init(|| {
        LOADS
            .iter()
            .flat_map(|&load| Strategy::ALL.map(|st| run(&Scenario::standard(load), st)))
            .collect()
    })
}

/// The report of `strategy` at `load` among [`standard_reports`].
pub(crate) fn standard(strategy: Strategy, load: f64) -> &'static Report {
    standard_reports()
        .iter()
        .find(|r| r.strategy == strategy && r.load == load)
        .expect("a standard strategy and load")
}

/// Class 0's calls alone, with `strategy`, at `load`.
pub(crate) fn alone(strategy: Strategy, load: f64) -> Report {
    let mut s = Scenario::standard(load);
    s.only_class = Some(0);
    run(&s, strategy)
}

/// [`Scenario::standard`] with every caller giving up after the same
/// 500 ms (one client timeout), instead of 250 to 750 ms.
pub(crate) fn one_timeout(load: f64) -> Scenario {
    let mut s = Scenario::standard(load);
    s.patience = (500 * MS, 500 * MS);
    s
}

/// One row of the `max_wait` sweep: the goodput shares of FIFO,
/// controlled delay, adaptive LIFO and deadlines at 2x.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SweepRow {
    /// Whether the callers share one timeout ([`one_timeout`]).
    pub(crate) one_timeout: bool,
    pub(crate) max_wait: u64,
    pub(crate) reports: Vec<Report>,
}

/// The strategies of the sweep.
pub(crate) const SWEPT: [Strategy; 4] = [
    Strategy::Fifo,
    Strategy::ControlledDelay,
    Strategy::AdaptiveLifo,
    Strategy::Deadline,
];

/// `max_wait` of 100 ms to 1 s at 2x, for callers with 250 to 750 ms of
/// patience and for callers with one 500 ms timeout.
pub(crate) fn sweep() -> &'static [SweepRow] {
    static ROWS: std::sync::OnceLock<Vec<SweepRow>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| {
        let mut rows = Vec::new();
        for one in [false, true] {
            for max_wait in [100 * MS, 250 * MS, 500 * MS, 1000 * MS] {
                let mut s = if one {
                    one_timeout(2.0)
                } else {
                    Scenario::standard(2.0)
                };
                s.max_wait = Some(max_wait);
                rows.push(SweepRow {
                    one_timeout: one,
                    max_wait,
                    reports: SWEPT.iter().map(|&st| run(&s, st)).collect(),
                });
            }
        }
        rows
    })
}

/// The critical class's goodput at 5x for one reservation: see
/// [`reservations`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reservation {
    /// Critical, normal and batch shares (percent of the seats).
    pub(crate) shares: [u32; 3],
    /// The seats the critical share reserves.
    pub(crate) seats: usize,
    /// Calls a second, with priorities, among the other classes.
    pub(crate) mixed: f64,
    /// Calls a second, with priorities, its calls alone (every seat
    /// idle for it to borrow): "what it gets alone".
    pub(crate) alone: f64,
    /// Calls a second, its calls alone on a FIFO bulkhead of only
    /// `seats` seats: what its reservation is worth by itself.
    pub(crate) own_seats: f64,
}

/// The critical class's goodput (calls a second) with priorities at 5x,
/// among the others, alone, and alone on its reserved seats only, for
/// the standard shares (50/30/20) and for a reservation with headroom
/// (60/25/15).
pub(crate) fn reservations() -> &'static [Reservation] {
    static ROWS: std::sync::OnceLock<Vec<Reservation>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| {
        [[50, 30, 20], [60, 25, 15]]
            .into_iter()
            .map(|shares| {
                let mut s = Scenario::standard(5.0);
                for (class, share) in s.classes.iter_mut().zip(shares) {
                    class.share = share;
                }
                let seats = s.limit * shares[0] as usize / 100;
                let mixed = run(&s, Strategy::Priorities).class_goodput(0, &s);
                s.only_class = Some(0);
                let alone = run(&s, Strategy::Priorities).class_goodput(0, &s);
                // The same calls: the offered rate is `load` times the
                // capacity, which the fewer seats lower.
                s.load *= s.limit as f64 / seats as f64;
                s.limit = seats;
                let own_seats = run(&s, Strategy::Fifo).class_goodput(0, &s);
                Reservation {
                    shares,
                    seats,
                    mixed,
                    alone,
                    own_seats,
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Controlled delay's promise, where FIFO serves callers who have given
    /// up: every caller has the same 500 ms timeout, and `max_wait` is
    /// that timeout.
    #[test]
    fn at_2x_controlled_delay_and_adaptive_lifo_give_half_again_fifos_goodput() {
        let s = one_timeout(2.0);
        let fifo = run(&s, Strategy::Fifo);
        for strategy in [Strategy::ControlledDelay, Strategy::AdaptiveLifo] {
            let r = run(&s, strategy);
            assert!(
                r.goodput >= 1.5 * fifo.goodput,
                "{}: {:.0}/s against fifo's {:.0}/s",
                strategy.name(),
                r.goodput,
                fifo.goodput
            );
        }
    }

    /// Where callers' patience is spread (the standard scenario), FIFO
    /// serves mostly the patient ones, and the gain is smaller: the
    /// target is *not* met there (the overload guide says why). This
    /// pins the number the guide gives.
    #[test]
    fn with_spread_patience_the_gain_is_smaller() {
        let fifo = standard(Strategy::Fifo, 2.0);
        for strategy in [Strategy::ControlledDelay, Strategy::AdaptiveLifo] {
            let ratio = standard(strategy, 2.0).goodput / fifo.goodput;
            assert!((1.2..1.5).contains(&ratio), "{}: {ratio}", strategy.name());
            // Both serve the whole capacity, and waste nothing.
            assert!(standard(strategy, 2.0).goodput_share > 0.99);
            assert_eq!(standard(strategy, 2.0).wasted, 0);
        }
    }

    /// Priority classes' promise: met with a reservation that covers the
    /// critical class's demand at 5x with headroom (60 % of the seats for
    /// a demand of 50 %); 94 % with a reservation of exactly its demand.
    #[test]
    fn at_5x_the_critical_class_keeps_95_percent_of_what_it_gets_alone() {
        let rows = reservations();
        let Reservation { mixed, alone, .. } = rows[1];
        assert!(
            mixed >= 0.95 * alone,
            "critical: {mixed:.1}/s among the rest, {alone:.1}/s alone"
        );
        // With a reservation of exactly its demand it keeps what those
        // seats serve on their own: the classes take nothing from it.
        let r = rows[0];
        assert!(r.mixed >= 0.9 * r.alone, "{r:?}");
        assert!(r.mixed >= 0.99 * r.own_seats, "{r:?}");
        let alone = r.alone;
        // Without priorities it does not come near.
        let s = Scenario::standard(5.0);
        let fifo = standard(Strategy::Fifo, 5.0).class_goodput(0, &s);
        assert!(fifo < 0.5 * alone, "fifo: {fifo:.1}/s");
        // At 2x, the standard shares keep all of it.
        let alone = super::alone(Strategy::Priorities, 2.0).class_goodput(0, &s);
        let mixed = standard(Strategy::Priorities, 2.0).class_goodput(0, &s);
        assert!(mixed >= 0.99 * alone, "{mixed} / {alone}");
    }

    #[test]
    fn the_simulation_is_deterministic() {
        let mut s = Scenario::standard(2.0);
        s.duration = 5 * SEC;
        for strategy in Strategy::ALL {
            assert_eq!(run(&s, strategy), run(&s, strategy));
        }
        // And a different seed makes different calls.
        let a = run(&s, Strategy::Fifo);
        s.seed += 1;
        assert_ne!(a.arrived, run(&s, Strategy::Fifo).arrived);
    }

    #[test]
    fn every_call_is_accounted_for() {
        for r in standard_reports() {
            let ended = r.good + r.wasted + r.gave_up + r.timed_out + r.shed + r.late;
            // The rest were still waiting or running at the end.
            let open = r.arrived - ended;
            assert!(
                open < 2_000,
                "{} at {}x: {open} open",
                r.strategy.name(),
                r.load
            );
            assert_eq!(r.classes.iter().map(|c| c.arrived).sum::<u64>(), r.arrived);
            assert_eq!(r.tenants.iter().map(|c| c.good).sum::<u64>(), r.good);
        }
    }

    #[test]
    fn under_controlled_delay_nobody_admitted_while_overloaded_waited_past_the_target() {
        for load in LOADS {
            for strategy in [Strategy::ControlledDelay, Strategy::AdaptiveLifo] {
                let r = standard(strategy, load);
                assert!(
                    r.overloaded_wait <= TARGET,
                    "{} at {load}x: {r:?}",
                    strategy.name()
                );
            }
        }
        // At 5x the line is overloaded nearly all the time; at 1x hardly.
        assert!(standard(Strategy::ControlledDelay, 5.0).overloaded_time > 0.95);
        assert!(standard(Strategy::ControlledDelay, 1.0).overloaded_time < 0.05);
    }

    #[test]
    fn deadline_aware_admission_wastes_little() {
        for load in LOADS {
            let r = standard(Strategy::Deadline, load);
            let fifo = standard(Strategy::Fifo, load);
            assert!(r.wasted * 50 < r.good, "at {load}x: {r:?}");
            assert!(r.goodput_share > 0.97, "at {load}x: {r:?}");
            assert!(r.goodput >= fifo.goodput, "at {load}x: {r:?}");
        }
        // Callers it cannot serve in time hear so at once, not after
        // waiting: nobody gives up in line.
        assert_eq!(standard(Strategy::Deadline, 5.0).gave_up, 0);
        assert!(standard(Strategy::Deadline, 5.0).late > 0);
    }

    #[test]
    fn fair_shares_protect_the_quiet_tenants() {
        let s = Scenario::standard(5.0);
        let drr = standard(Strategy::FairShare, 5.0);
        let fifo = standard(Strategy::Fifo, 5.0);
        // Weights 1, 3, 1, 1, 1 of 7: the paying tenant gets three times
        // the noisy one's share, the quiet ones as much as the noisy one.
        let noisy = drr.tenant_share(0, &s);
        let paying = drr.tenant_share(1, &s);
        assert!((2.5..3.5).contains(&(paying / noisy)), "{paying} / {noisy}");
        for quiet in 2..5 {
            let q = drr.tenant_share(quiet, &s);
            assert!(
                (0.8..1.25).contains(&(q / noisy)),
                "quiet {quiet}: {q} / {noisy}"
            );
            assert!(q > 2.0 * fifo.tenant_share(quiet, &s));
        }
    }
}
