//! Adaptive limits against fixed ones, in a simulation: a dependency that
//! serves 20 calls at once in 50 ms (400 calls a second) and queues past
//! that, offered 500 calls a second. From 40 s to 70 s it loses half its
//! capacity. Calls time out after 250 ms. The bulkhead fails fast.
//!
//! Five strategies run the same traffic: AIMD and the gradient, both
//! starting at 10, and fixed limits of 5, 20 and 100. Everything runs in
//! virtual time with seeded random numbers, so every run prints the same
//! table, in about a second (`watertight::adaptive::sim` has the model).
//!
//! ```text
//! cargo run --release --example adaptive_sim
//! cargo run --release --example adaptive_sim -- --svg src/guide/adaptive.svg --csv adaptive.csv
//! ```
//!
//! The plot (`--svg`) shows the limit, the latency and the goodput of each
//! strategy over time, against the dependency's real capacity; the CSV
//! (`--csv`) has the same series, one row per strategy and half second.
//! `tests/adaptive.rs` checks that `src/guide/adaptive.svg` (the plot in the
//! adaptive guide, `watertight::guide::adaptive`) is what this prints.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::{env, fs, process};

/// The simulation, shared with the tests (`tests/adaptive.rs`).
#[path = "sim/adaptive.rs"]
pub mod sim;

use sim::{Bucket, Report, Scenario, run, standard_strategies};

fn main() {
    let (svg, csv) = parse_args();
    let scenario = Scenario::standard();
    let reports: Vec<Report> = standard_strategies()
        .into_iter()
        .map(|(name, mut algorithm)| run(&scenario, name, algorithm.as_mut()))
        .collect();

    println!(
        "{} s; capacity {}; {} calls/s offered; {} ms base latency, {} ms timeout\n",
        scenario.duration,
        capacity_story(&scenario),
        scenario.arrival_rate,
        scenario.base_latency * 1e3,
        scenario.timeout * 1e3,
    );
    print!("{}", table(&scenario, &reports));
    println!(
        "\nThe most any limit could serve: {:.0} calls/s. The limit columns are the median \
         over the second half of each phase.",
        best_goodput(&scenario)
    );

    if let Some(path) = csv {
        write(&path, &to_csv(&reports));
    }
    if let Some(path) = svg {
        write(&path, &to_svg(&scenario, &reports));
    }
}

fn parse_args() -> (Option<PathBuf>, Option<PathBuf>) {
    let (mut svg, mut csv) = (None, None);
    let mut args = env::args().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--svg" => &mut svg,
            "--csv" => &mut csv,
            _ => {
                eprintln!("usage: adaptive_sim [--svg FILE] [--csv FILE]");
                process::exit(2);
            }
        };
        match args.next() {
            Some(path) => *slot = Some(PathBuf::from(path)),
            None => {
                eprintln!("{arg} needs a file name");
                process::exit(2);
            }
        }
    }
    (svg, csv)
}

fn write(path: &PathBuf, contents: &str) {
    if let Err(e) = fs::write(path, contents) {
        eprintln!("cannot write {}: {e}", path.display());
        process::exit(1);
    }
    println!("wrote {}", path.display());
}

/// The goodput of a dependency kept busy at its capacity all the time.
fn best_goodput(s: &Scenario) -> f64 {
    let mut served = 0.0;
    for (i, &(from, c)) in s.capacity.iter().enumerate() {
        let to = s.capacity.get(i + 1).map_or(s.duration, |&(t, _)| t);
        served += (to - from) * c as f64 / s.base_latency;
    }
    served / s.duration
}

/// "20 from 0 s, 10 from 40 s, 20 from 70 s".
fn capacity_story(s: &Scenario) -> String {
    let parts: Vec<String> = s
        .capacity
        .iter()
        .map(|(t, c)| format!("{c} from {t} s"))
        .collect();
    parts.join(", ")
}

/// The summary table, with the limit's median per phase (its second half,
/// once settled) next to the capacity of that phase.
pub(crate) fn table(s: &Scenario, reports: &[Report]) -> String {
    let mut phases = s.capacity.clone();
    phases.push((s.duration, 0));
    let mut out = String::new();
    let _ = write!(
        out,
        "| strategy  | goodput/s | p50 ms | p99 ms | timed out | rejected | final limit |"
    );
    for w in phases.windows(2) {
        let (from, to) = (w[0].0, w[1].0);
        let _ = write!(
            out,
            " limit {:.0}-{:.0} s, C={} |",
            (from + to) / 2.0,
            to,
            w[0].1
        );
    }
    out.push('\n');
    out.push_str("|---|--:|--:|--:|--:|--:|--:|");
    out.push_str(&"--:|".repeat(phases.len() - 1));
    out.push('\n');
    for r in reports {
        let m = &r.summary;
        let _ = write!(
            out,
            "| {:9} | {:9.0} | {:6.0} | {:6.0} | {:8.1}% | {:7.1}% | {:11} |",
            r.name,
            m.goodput,
            m.p50 * 1e3,
            m.p99 * 1e3,
            m.error_rate * 100.0,
            m.reject_rate * 100.0,
            m.final_limit,
        );
        for w in phases.windows(2) {
            let (from, to) = (w[0].0, w[1].0);
            let median = r.median_limit((from + to) / 2.0, to);
            let _ = write!(out, " {median:>17.1} |");
        }
        out.push('\n');
    }
    out
}

fn to_csv(reports: &[Report]) -> String {
    let mut out = String::from(
        "strategy,start_s,capacity,limit,in_flight,latency_ms,goodput_per_s,timed_out,rejected\n",
    );
    for r in reports {
        for b in &r.buckets {
            let latency = if b.latency.is_nan() {
                String::new()
            } else {
                format!("{:.2}", b.latency * 1e3)
            };
            let _ = writeln!(
                out,
                "{},{:.1},{},{:.2},{:.2},{},{:.1},{},{}",
                r.name,
                b.start,
                b.capacity,
                b.limit,
                b.in_flight,
                latency,
                b.goodput,
                b.timed_out,
                b.rejected
            );
        }
    }
    out
}

// --- The plot: three panels over a shared time axis, as plain SVG. ---

const WIDTH: f64 = 900.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 70.0;
const PANEL: f64 = 190.0;
const GAP: f64 = 45.0;

/// Line colour and dash pattern of each strategy.
fn style(name: &str) -> (&'static str, &'static str, f64) {
    match name {
        "aimd" => ("#1f6fd1", "", 2.0),
        "gradient" => ("#1b9e3e", "", 2.0),
        "fixed 5" => ("#8c8c8c", "6 3", 1.6),
        "fixed 20" => ("#8e44ad", "2 3", 1.8),
        _ => ("#d62728", "6 3", 1.6),
    }
}

struct Panel {
    title: &'static str,
    top: f64,
    max: f64,
    ticks: &'static [f64],
}

impl Panel {
    fn y(&self, v: f64) -> f64 {
        self.top + PANEL * (1.0 - v.clamp(0.0, self.max) / self.max)
    }
}

pub(crate) fn to_svg(s: &Scenario, reports: &[Report]) -> String {
    let x = |t: f64| LEFT + (WIDTH - LEFT - RIGHT) * t / s.duration;
    let panels = [
        Panel {
            title: "Limit (calls in flight allowed)",
            top: TOP,
            max: 40.0,
            ticks: &[0.0, 10.0, 20.0, 30.0, 40.0],
        },
        Panel {
            title: "Mean latency of admitted calls (ms)",
            top: TOP + PANEL + GAP,
            max: 300.0,
            ticks: &[0.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0],
        },
        Panel {
            title: "Goodput (calls that succeeded, per second)",
            top: TOP + 2.0 * (PANEL + GAP),
            max: 500.0,
            ticks: &[0.0, 100.0, 200.0, 300.0, 400.0, 500.0],
        },
    ];
    let height = TOP + 3.0 * PANEL + 2.0 * GAP + 50.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">Adaptive and fixed limits before a dependency that queues past its capacity</text>"#
    );

    // Legend.
    let mut lx = LEFT;
    for r in reports {
        let (colour, dash, w) = style(&r.name);
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="44" x2="{}" y2="44" stroke="{colour}" stroke-width="{}" stroke-dasharray="{dash}"/>"#,
            lx + 24.0,
            w + 0.5
        );
        let _ = writeln!(svg, r#"<text x="{}" y="48">{}</text>"#, lx + 30.0, r.name);
        lx += 40.0 + 8.0 * r.name.len() as f64 + 20.0;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{lx}" y1="44" x2="{}" y2="44" stroke="#000" stroke-width="1.2" stroke-dasharray="3 3"/><text x="{}" y="48">real capacity</text>"##,
        lx + 24.0,
        lx + 30.0
    );

    for (i, p) in panels.iter().enumerate() {
        // Shade the phases where the capacity is reduced.
        for w in s.capacity.windows(2).chain(std::iter::once(
            &[*s.capacity.last().unwrap(), (s.duration, 0)][..],
        )) {
            if w[0].1 < s.capacity[0].1 {
                let _ = writeln!(
                    svg,
                    r##"<rect x="{}" y="{}" width="{}" height="{PANEL}" fill="#f3efe4"/>"##,
                    x(w[0].0),
                    p.top,
                    x(w[1].0) - x(w[0].0)
                );
                if i == 0 {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{}" y="{}" text-anchor="middle" fill="#8a7a50">capacity halved</text>"##,
                        (x(w[0].0) + x(w[1].0)) / 2.0,
                        p.top + 14.0
                    );
                }
            }
        }
        // Grid, axes and labels.
        for &v in p.ticks {
            let y = p.y(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#e3e3e3"/><text x="{}" y="{}" text-anchor="end">{v}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let mut t = 0.0;
        while t <= s.duration {
            let _ = writeln!(
                svg,
                r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#999"/><text x="{0}" y="{3}" text-anchor="middle">{t}</text>"##,
                x(t),
                p.top + PANEL,
                p.top + PANEL + 4.0,
                p.top + PANEL + 16.0
            );
            t += 10.0;
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{}" width="{}" height="{PANEL}" fill="none" stroke="#666"/><text x="{LEFT}" y="{}" font-weight="bold">{}</text>"##,
            p.top,
            WIDTH - LEFT - RIGHT,
            p.top - 7.0,
            p.title
        );

        // The reference line of the panel: capacity, timeout, or the
        // throughput the capacity allows.
        let reference = |c: usize| match i {
            0 => c as f64,
            1 => s.timeout * 1e3,
            _ => c as f64 / s.base_latency,
        };
        let mut points = Vec::new();
        for w in s
            .capacity
            .iter()
            .map(|&(t, c)| (t, c))
            .chain(std::iter::once((s.duration, s.capacity.last().unwrap().1)))
            .collect::<Vec<_>>()
            .windows(2)
        {
            let v = reference(w[0].1);
            points.push(format!("{:.1},{:.1}", x(w[0].0), p.y(v)));
            points.push(format!("{:.1},{:.1}", x(w[1].0), p.y(v)));
        }
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="#000" stroke-width="1.2" stroke-dasharray="3 3"/>"##,
            points.join(" ")
        );
        if i == 1 {
            let _ = writeln!(
                svg,
                r##"<text x="{}" y="{}" text-anchor="end">timeout</text>"##,
                WIDTH - RIGHT - 4.0,
                p.y(s.timeout * 1e3) - 4.0
            );
        }

        // The strategies; fixed 100 last (it is the one off the scale).
        for r in reports {
            let (colour, dash, w) = style(&r.name);
            let value = |b: &Bucket| match i {
                0 => b.limit,
                1 => b.latency * 1e3,
                _ => b.goodput,
            };
            let mut segments: Vec<Vec<String>> = vec![Vec::new()];
            for b in &r.buckets {
                let v = value(b);
                if v.is_nan() {
                    segments.push(Vec::new());
                    continue;
                }
                let mid = b.start + s.bucket / 2.0;
                segments.last_mut().unwrap().push(format!(
                    "{:.1},{:.1}",
                    x(mid.min(s.duration)),
                    p.y(v)
                ));
            }
            for seg in segments.iter().filter(|seg| seg.len() > 1) {
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="{w}" stroke-dasharray="{dash}" stroke-linejoin="round"/>"#,
                    seg.join(" ")
                );
            }
            if i == 0 && r.name == "gradient" {
                // Mark the baseline probes: dips well below both neighbours.
                for w in r.buckets.windows(3) {
                    if w[1].limit < 0.9 * w[0].limit.min(w[2].limit) {
                        let _ = writeln!(
                            svg,
                            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="{colour}" stroke="#fff" stroke-width="3" paint-order="stroke">probe</text>"##,
                            x(w[1].start + s.bucket / 2.0),
                            p.y(w[1].limit) + 12.0
                        );
                    }
                }
            }
            if i == 0 && r.summary.mean_limit > p.max {
                let _ = writeln!(
                    svg,
                    r#"<text x="{}" y="{}" text-anchor="end" fill="{colour}">{}: limit {:.0}, off the scale</text>"#,
                    WIDTH - RIGHT - 4.0,
                    p.top + 14.0,
                    r.name,
                    r.summary.mean_limit
                );
            }
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">time (s, simulated); each point is the mean over {} s</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        height - 12.0,
        s.bucket
    );
    svg.push_str("</svg>\n");
    svg
}
