//! The tables and the plot of the overload guide
//! (`watertight::guide::overload`), drawn from the simulation (`sim.rs`).
//!
//! The tests here check that `src/guide/overload.svg` and the tables in
//! `src/guide/overload.md` are what the simulation gives now. After
//! changing the simulation or a state machine, redraw them:
//!
//! ```text
//! WATERTIGHT_WRITE_DOCS=1 cargo test --test overload_sim plot
//! ```

use std::fmt::Write as _;

use crate::sim::{
    LOADS, MS, Report, SWEPT, Scenario, Strategy, alone, reservations, standard, sweep,
};

/// The strategy's colour in the plot.
fn colour(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Fifo => "#8c8c8c",
        Strategy::ControlledDelay => "#1f6fd1",
        Strategy::AdaptiveLifo => "#17becf",
        Strategy::Priorities => "#d62728",
        Strategy::Deadline => "#ff7f0e",
        Strategy::FairShare => "#1b9e3e",
    }
}

fn ms(ns: u64) -> String {
    format!("{:.0}", ns as f64 / MS as f64)
}

/// The main table: every strategy at every load.
pub(crate) fn summary_table() -> String {
    let mut out = String::from(
        "| load | strategy | goodput/s | of capacity | p50 ms | p99 ms | wasted | gave up in line | timed out | rejected (deadline) |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for load in LOADS {
        for strategy in Strategy::ALL {
            let r = standard(strategy, load);
            let pct = |n: u64| format!("{:.1}%", 100.0 * n as f64 / r.arrived.max(1) as f64);
            let _ = writeln!(
                out,
                "| {load}x | {} | {:.0} | {:.0}% | {} | {} | {} | {} | {} | {} |",
                strategy.name(),
                r.goodput,
                100.0 * r.goodput_share,
                ms(r.p50),
                ms(r.p99),
                pct(r.wasted),
                pct(r.gave_up),
                pct(r.timed_out),
                pct(r.late),
            );
        }
    }
    out
}

/// Goodput per priority class, per strategy, with the critical class alone.
pub(crate) fn class_table() -> String {
    let s = Scenario::standard(1.0);
    let mut out = String::from("| load | strategy |");
    for c in &s.classes {
        let _ = write!(
            out,
            " {} ({} % of calls, {} % of seats) |",
            c.name,
            c.traffic * 100.0,
            c.share
        );
    }
    out.push_str("\n|---|---|");
    out.push_str(&"--:|".repeat(s.classes.len()));
    out.push('\n');
    for load in LOADS {
        let s = Scenario::standard(load);
        for strategy in [Strategy::Fifo, Strategy::Priorities] {
            let r = standard(strategy, load);
            let _ = write!(out, "| {load}x | {} |", strategy.name());
            for (i, c) in r.classes.iter().enumerate() {
                let _ = write!(
                    out,
                    " {:.0}/s ({:.0}%) |",
                    r.class_goodput(i, &s),
                    100.0 * c.good as f64 / c.arrived.max(1) as f64
                );
            }
            out.push('\n');
        }
        let a = alone(Strategy::Priorities, load);
        let _ = writeln!(
            out,
            "| {load}x | critical alone | {:.0}/s ({:.0}%) | | |",
            a.class_goodput(0, &s),
            100.0 * a.classes[0].good as f64 / a.classes[0].arrived.max(1) as f64
        );
    }
    out
}

/// The critical class at 5x against alone, for two reservations.
pub(crate) fn reservation_table() -> String {
    let mut out = String::from(
        "| shares (critical/normal/batch) | critical's seats | critical at 5x, among the rest | alone | kept | alone, on its seats only |\n\
         |---|--:|--:|--:|--:|--:|\n",
    );
    for r in reservations() {
        let _ = writeln!(
            out,
            "| {}/{}/{} | {} | {:.1}/s | {:.1}/s | {:.1}% | {:.1}/s |",
            r.shares[0],
            r.shares[1],
            r.shares[2],
            r.seats,
            r.mixed,
            r.alone,
            100.0 * r.mixed / r.alone,
            r.own_seats
        );
    }
    out
}

/// Goodput per tenant at 2x and 5x, FIFO against deficit round robin.
pub(crate) fn tenant_table() -> String {
    let s = Scenario::standard(1.0);
    let mut out = String::from("| load | strategy |");
    for t in &s.tenants {
        let _ = write!(
            out,
            " {} ({:.0} %, weight {}) |",
            t.name,
            t.traffic * 100.0,
            t.weight
        );
    }
    out.push_str("\n|---|---|");
    out.push_str(&"--:|".repeat(s.tenants.len()));
    out.push('\n');
    for load in [2.0, 5.0] {
        let s = Scenario::standard(load);
        for strategy in [Strategy::Fifo, Strategy::FairShare] {
            let r = standard(strategy, load);
            let _ = write!(out, "| {load}x | {} |", strategy.name());
            for (i, t) in r.tenants.iter().enumerate() {
                let _ = write!(
                    out,
                    " {:.0}/s ({:.0}%) |",
                    r.tenant_share(i, &s) * s.capacity(),
                    100.0 * t.good as f64 / t.arrived.max(1) as f64
                );
            }
            out.push('\n');
        }
    }
    out
}

/// The `max_wait` sweep at 2x.
pub(crate) fn sweep_table() -> String {
    let mut out = String::from("| callers give up after | max_wait |");
    for st in SWEPT {
        let _ = write!(out, " {} |", st.name());
    }
    out.push_str(" codel / fifo |\n|---|--:|");
    out.push_str(&"--:|".repeat(SWEPT.len() + 1));
    out.push('\n');
    for row in sweep() {
        let _ = write!(
            out,
            "| {} | {} ms |",
            if row.one_timeout {
                "500 ms"
            } else {
                "250 to 750 ms"
            },
            ms(row.max_wait)
        );
        for r in &row.reports {
            let _ = write!(out, " {:.0}% |", 100.0 * r.goodput_share);
        }
        let _ = writeln!(
            out,
            " {:.2} |",
            row.reports[1].goodput / row.reports[0].goodput
        );
    }
    out
}

// --- The plot: grouped bars in panels, as plain SVG. ---

const WIDTH: f64 = 900.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const PANEL: f64 = 170.0;
const GAP: f64 = 90.0;

/// One panel of grouped bars: `values[group][series]`, each bar with an
/// optional mark above it (`marks`, same shape: the p99 over a p50 bar).
struct Bars<'a> {
    title: &'a str,
    groups: Vec<String>,
    series: Vec<(String, &'static str)>,
    values: Vec<Vec<f64>>,
    marks: Option<Vec<Vec<f64>>>,
    max: f64,
    ticks: &'a [f64],
    /// A dashed reference line, with its label.
    reference: Option<(f64, &'a str)>,
}

impl Bars<'_> {
    fn draw(&self, svg: &mut String, top: f64) {
        let y = |v: f64| top + PANEL * (1.0 - v.clamp(0.0, self.max) / self.max);
        let inner = WIDTH - LEFT - RIGHT;
        for &v in self.ticks {
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#e3e3e3"/><text x="{2}" y="{3:.1}" text-anchor="end">{v}</text>"##,
                y(v),
                WIDTH - RIGHT,
                LEFT - 6.0,
                y(v) + 4.0
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{top}" width="{inner}" height="{PANEL}" fill="none" stroke="#666"/><text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"##,
            top - 24.0,
            self.title
        );
        // Legend, above the panel, right of the title line.
        let mut lx = LEFT;
        for (name, colour) in &self.series {
            let _ = writeln!(
                svg,
                r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="10" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="11">{name}</text>"#,
                top - 15.0,
                lx + 16.0,
                top - 6.0
            );
            lx += 26.0 + 6.5 * name.len() as f64;
        }
        if self.marks.is_some() {
            let _ = writeln!(
                svg,
                r##"<line x1="{lx:.1}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#000" stroke-width="2"/><text x="{2:.1}" y="{3:.1}" font-size="11">p99 (bar: p50)</text>"##,
                top - 10.0,
                lx + 12.0,
                lx + 16.0,
                top - 6.0
            );
        }
        let group_w = inner / self.groups.len() as f64;
        let bar_w = (group_w * 0.8) / self.series.len() as f64;
        for (g, name) in self.groups.iter().enumerate() {
            let gx = LEFT + g as f64 * group_w + group_w * 0.1;
            for (i, (_, colour)) in self.series.iter().enumerate() {
                let v = self.values[g][i];
                if v.is_nan() {
                    continue;
                }
                let x = gx + i as f64 * bar_w;
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"/>"#,
                    y(v),
                    bar_w * 0.9,
                    top + PANEL - y(v)
                );
                if let Some(marks) = &self.marks {
                    let m = marks[g][i];
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{x:.1}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#000" stroke-width="2"/><line x1="{2:.1}" y1="{0:.1}" x2="{2:.1}" y2="{3:.1}" stroke="#000" stroke-width="0.8"/>"##,
                        y(m),
                        x + bar_w * 0.9,
                        x + bar_w * 0.45,
                        y(v)
                    );
                }
            }
            // One line per line of the name.
            let cx = LEFT + (g as f64 + 0.5) * group_w;
            for (i, line) in name.lines().enumerate() {
                let _ = writeln!(
                    svg,
                    r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{line}</text>"#,
                    top + PANEL + 16.0 + 14.0 * i as f64
                );
            }
        }
        if let Some((v, label)) = self.reference {
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#000" stroke-width="1.2" stroke-dasharray="4 3"/><text x="{2}" y="{3:.1}" text-anchor="end" font-size="11" fill="#000" stroke="#fff" stroke-width="3" paint-order="stroke">{label}</text>"##,
                y(v),
                WIDTH - RIGHT,
                WIDTH - RIGHT - 4.0,
                y(v) - 4.0
            );
        }
    }
}

fn series(strategies: &[Strategy]) -> Vec<(String, &'static str)> {
    strategies
        .iter()
        .map(|&s| (s.name().to_owned(), colour(s)))
        .collect()
}

fn by_load(value: impl Fn(&Report) -> f64) -> Vec<Vec<f64>> {
    LOADS
        .iter()
        .map(|&load| {
            Strategy::ALL
                .iter()
                .map(|&st| value(standard(st, load)))
                .collect()
        })
        .collect()
}

/// The plot of `src/guide/overload.svg`.
pub(crate) fn to_svg() -> String {
    let loads: Vec<String> = LOADS.iter().map(|l| format!("{l}x the capacity")).collect();
    let s5 = Scenario::standard(5.0);
    let mut panels = vec![
        Bars {
            title: "Goodput (calls finished before their caller gave up), share of the capacity",
            groups: loads.clone(),
            series: series(&Strategy::ALL),
            values: by_load(|r| r.goodput_share * 100.0),
            marks: None,
            max: 100.0,
            ticks: &[0.0, 25.0, 50.0, 75.0, 100.0],
            reference: None,
        },
        Bars {
            title: "Latency of admitted calls, arrival to end (ms)",
            groups: loads,
            series: series(&Strategy::ALL),
            values: by_load(|r| r.p50 as f64 / MS as f64),
            marks: Some(by_load(|r| r.p99 as f64 / MS as f64)),
            max: 800.0,
            ticks: &[0.0, 200.0, 400.0, 600.0, 800.0],
            reference: Some((750.0, "the most patient caller gives up")),
        },
    ];
    // Per class at 5x: goodput per second, FIFO, priorities, and alone.
    let fifo = standard(Strategy::Fifo, 5.0);
    let prio = standard(Strategy::Priorities, 5.0);
    let solo = alone(Strategy::Priorities, 5.0);
    panels.push(Bars {
        title: "At 5x: goodput per priority class (calls/s)",
        groups: s5
            .classes
            .iter()
            .map(|c| {
                format!(
                    "{}\n{:.0} % of calls, {} % of seats",
                    c.name,
                    c.traffic * 100.0,
                    c.share
                )
            })
            .collect(),
        series: vec![
            ("fifo".to_owned(), colour(Strategy::Fifo)),
            ("priorities".to_owned(), colour(Strategy::Priorities)),
            ("critical alone".to_owned(), "#f4a6a6"),
        ],
        values: (0..s5.classes.len())
            .map(|c| {
                vec![
                    fifo.class_goodput(c, &s5),
                    prio.class_goodput(c, &s5),
                    if c == 0 {
                        solo.class_goodput(0, &s5)
                    } else {
                        f64::NAN
                    },
                ]
            })
            .collect(),
        marks: None,
        max: 250.0,
        ticks: &[0.0, 50.0, 100.0, 150.0, 200.0, 250.0],
        reference: None,
    });
    let drr = standard(Strategy::FairShare, 5.0);
    panels.push(Bars {
        title: "At 5x: goodput per tenant (calls/s)",
        groups: s5
            .tenants
            .iter()
            .map(|t| {
                format!(
                    "{}\n{:.0} % of calls, weight {}",
                    t.name,
                    t.traffic * 100.0,
                    t.weight
                )
            })
            .collect(),
        series: vec![
            ("fifo".to_owned(), colour(Strategy::Fifo)),
            ("drr".to_owned(), colour(Strategy::FairShare)),
        ],
        values: (0..s5.tenants.len())
            .map(|t| {
                vec![
                    fifo.tenant_share(t, &s5) * s5.capacity(),
                    drr.tenant_share(t, &s5) * s5.capacity(),
                ]
            })
            .collect(),
        marks: None,
        max: 300.0,
        ticks: &[0.0, 100.0, 200.0, 300.0],
        reference: None,
    });
    panels.push(Bars {
        title: "At 2x, by max_wait and the callers' patience: goodput, share of the capacity",
        groups: sweep()
            .iter()
            .map(|row| {
                format!(
                    "{} ms\n{}",
                    ms(row.max_wait),
                    if row.one_timeout {
                        "500 ms timeout"
                    } else {
                        "250-750 ms"
                    }
                )
            })
            .collect(),
        series: series(&SWEPT),
        values: sweep()
            .iter()
            .map(|row| {
                row.reports
                    .iter()
                    .map(|r| r.goodput_share * 100.0)
                    .collect()
            })
            .collect(),
        marks: None,
        max: 100.0,
        ticks: &[0.0, 25.0, 50.0, 75.0, 100.0],
        reference: None,
    });

    let top = 70.0;
    let height = top + panels.len() as f64 * (PANEL + GAP) + 10.0;
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
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">Overload control: 20 seats, calls of 25-75 ms, callers who give up after 250-750 ms</text>"#
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="40" fill="#555">max_wait 500 ms; controlled delay: target 5 ms, interval 100 ms; 60 simulated seconds per bar</text>"##
    );
    for (i, p) in panels.iter().enumerate() {
        p.draw(&mut svg, top + 10.0 + i as f64 * (PANEL + GAP));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The generated blocks of `src/guide/overload.md`, by name: each sits between
/// `<!-- sim:NAME -->` and `<!-- sim:end -->`.
fn blocks() -> Vec<(&'static str, String)> {
    vec![
        ("summary", summary_table()),
        ("classes", class_table()),
        ("reservations", reservation_table()),
        ("tenants", tenant_table()),
        ("sweep", sweep_table()),
    ]
}

/// `doc` with every generated block replaced by what the simulation gives
/// now; `None` if a marker is missing.
fn refreshed(doc: &str) -> Option<String> {
    let mut out = doc.to_owned();
    for (name, text) in blocks() {
        let open = format!("<!-- sim:{name} -->\n");
        let start = out.find(&open)? + open.len();
        let end = start + out[start..].find("<!-- sim:end -->")?;
        out.replace_range(start..end, &text);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/guide/overload.md");
    const SVG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/guide/overload.svg");

    fn write_docs() -> bool {
        std::env::var_os("WATERTIGHT_WRITE_DOCS").is_some()
    }

    #[test]
    fn the_plot_in_the_docs_is_the_simulation() {
        let svg = to_svg();
        if write_docs() {
            std::fs::write(SVG, &svg).unwrap();
        }
        let committed = std::fs::read_to_string(SVG).unwrap_or_default();
        assert!(
            svg == committed,
            "src/guide/overload.svg is out of date: WATERTIGHT_WRITE_DOCS=1 cargo test --test overload_sim plot"
        );
    }

    #[test]
    fn the_tables_in_the_docs_are_the_simulation() {
        let doc = std::fs::read_to_string(MD).unwrap();
        let fresh = refreshed(&doc).expect("src/guide/overload.md has every sim:NAME marker");
        if write_docs() && fresh != doc {
            std::fs::write(MD, &fresh).unwrap();
            return;
        }
        assert!(
            fresh == doc,
            "the tables in src/guide/overload.md are out of date: WATERTIGHT_WRITE_DOCS=1 cargo test --test overload_sim plot"
        );
    }
}
