#!/usr/bin/env python3
"""Print the tables of the layer bench (benches/layer.rs) and check issue 10's targets.

Usage: python3 benches/layer_report.py [--check] [CRITERION_DIR...]

CRITERION_DIR defaults to $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion,
else the workspace's target/criterion (where criterion writes), as in
benches/report.py. The script reads every `new/benchmark.json` +
`new/estimates.json` pair of the layer bench's groups (the cells) and takes
criterion's median, divided by the benchmark's throughput: nanoseconds per
call in every cell.

Given several directories (copies of the criterion directory from separate
full runs), each value is the median over the runs, and the targets table
says in how many runs each target held. With --check the exit status is 1
when a target fails (on the medians). Standard library only.
"""

import json
import os
import sys
import time
from pathlib import Path

# Report order; any other contender found is appended.
CELLS = ["reject_full", "uncontended",
         "contended/ct", "contended/ct_max_wait", "contended/ct_timeouts",
         "contended/mt", "contended/mt_max_wait", "contended/mt_timeouts", "tower"]
# Criterion groups of the bench; in `contended` the function id is the cell's
# variant and the value the contender, elsewhere the function id is the contender.
GROUPS = {"reject_full", "uncontended", "contended", "tower"}
CRATES = ["bulkhead", "bulkhead_try_acquire", "bulkhead_tower", "tokio", "tokio_try_acquire",
          "tower", "tower_resilience"]
REFERENCE = "bulkhead"
# Issue 10's targets: (cell, subject, peer, most the subject's time may be as a
# multiple of the peer's, what the issue says). `informational` rows are shown
# but do not fail --check.
TARGETS = [("reject_full", "bulkhead", "tokio", 2.0, "rejection through `call` at most 2x the hand-rolled tokio `try_acquire` failure")]
TARGETS += [("uncontended", "bulkhead", "tokio", 1.0, "no slower than the hand-rolled tokio version")]
for _cell in CELLS[2:8]:
    TARGETS += [(_cell, "bulkhead", "tokio", 1.0, "at least the hand-rolled tokio version"),
                (_cell, "bulkhead", "tower", 1.0, "at least tower's stack")]
TARGETS += [("tower", "bulkhead", "tower", 1.0, "`BulkheadLayer` at least tower's ConcurrencyLimit")]
INFORMATIONAL = [("reject_full", "bulkhead", "tokio_try_acquire", 2.0, "the same bound against a bare `Semaphore::try_acquire`"),
                 ("reject_full", "bulkhead_try_acquire", "tokio_try_acquire", 2.0, "`Bulkhead::try_acquire` against `Semaphore::try_acquire`")]

WHAT = {
    "reject_full": "every permit held, one call rejected (fail fast)",
    "uncontended": "one call, admitted at once, ready on its first poll; max_wait and call_timeout 10 s",
    "contended/ct": "256 tasks, 8 permits, work yields once, no timeouts; current-thread",
    "contended/ct_max_wait": "the same with max_wait 10 s",
    "contended/ct_timeouts": "the same with max_wait and call_timeout 10 s (tower: + `Timeout`)",
    "contended/mt": "256 tasks, 8 permits, work yields once, no timeouts; 2 workers",
    "contended/mt_max_wait": "the same with max_wait 10 s",
    "contended/mt_timeouts": "the same with max_wait and call_timeout 10 s (tower: + `Timeout`)",
    "tower": "64 tasks, `ready().await` + `call`, work yields once, 8 permits, no timeouts; 2 workers",
}


def criterion_dirs(args):
    if args:
        return [Path(a) for a in args]
    if os.environ.get("CRITERION_HOME"):
        return [Path(os.environ["CRITERION_HOME"])]
    if os.environ.get("CARGO_TARGET_DIR"):
        return [Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"]
    # The workspace's target directory (this script sits in benches/), which
    # is where criterion writes when neither variable is set.
    return [Path(__file__).resolve().parent.parent / "target" / "criterion"]


def median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def load(root):
    """{cell: {crate: ns per call}} and the results' mtimes."""
    results, mtimes = {}, []
    for meta_path in root.glob("**/new/benchmark.json"):
        est_path = meta_path.with_name("estimates.json")
        if not est_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        group = meta["group_id"]
        if group not in GROUPS:
            continue
        if meta.get("value_str"):
            cell, crate = f"{group}/{meta['function_id']}", meta["value_str"]
        else:
            cell, crate = group, meta["function_id"]
        if cell not in CELLS:
            continue
        est = json.loads(est_path.read_text())
        elements = (meta.get("throughput") or {}).get("Elements") or 1
        results.setdefault(cell, {})[crate] = est["median"]["point_estimate"] / elements
        mtimes.append(est_path.stat().st_mtime)
    return results, mtimes


def fmt_ns(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e4:
        return f"{ns / 1e3:.1f} µs"
    if ns < 10:
        return f"{ns:.2f}"
    if ns < 100:
        return f"{ns:.1f}"
    return f"{ns:.0f}"


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    roots = criterion_dirs(args)
    runs, spans = [], []
    for root in roots:
        results, mtimes = load(root)
        if not results:
            sys.exit(f"no criterion results of the layer bench under {root} "
                     "(cargo bench -p watertight-benches --bench layer --features tokio,tower)")
        runs.append(results)
        spans.append(f"{root}: {time.strftime('%Y-%m-%d %H:%M', time.localtime(min(mtimes)))} to "
                     f"{time.strftime('%H:%M', time.localtime(max(mtimes)))}")
    merged = {}
    for run in runs:
        for cell, row in run.items():
            for crate, ns in row.items():
                merged.setdefault(cell, {}).setdefault(crate, []).append(ns)
    results = {cell: {c: median(v) for c, v in row.items()} for cell, row in merged.items()}
    cells = [c for c in CELLS if c in results]
    found = {c for row in results.values() for c in row}
    crates = [c for c in CRATES if c in found] + sorted(found - set(CRATES))

    print(f"<!-- generated by benches/layer_report.py; results written {'; '.join(spans)} -->")
    print()
    many = f"Median over {len(runs)} full runs of criterion's median" if len(runs) > 1 else "Criterion's median"
    print(f"{many}, ns per call; in parentheses, that crate's time divided by `{REFERENCE}`'s "
          "(>1: bulkhead is faster).")
    print()
    print("| cell | " + " | ".join(f"`{c}`" for c in crates) + " |")
    print("|---|" + "---:|" * len(crates))
    for cell in cells:
        row = results[cell]
        ref = row.get(REFERENCE)
        out = []
        for c in crates:
            if c not in row:
                out.append("-")
            elif c == REFERENCE or ref is None:
                out.append(fmt_ns(row[c]))
            else:
                out.append(f"{fmt_ns(row[c])} ({row[c] / ref:.2f})")
        print(f"| `{cell}` | " + " | ".join(out) + " |")
    print()
    print("Cells: " + "; ".join(f"`{c}`: {WHAT[c]}" for c in cells) + ".")

    print()
    print("Issue 10's targets: the subject's time divided by the peer's, and the most it may be"
          + (f"; `runs` counts the runs in which the target held." if len(runs) > 1 else "."))
    print()
    head = "| cell | target | subject | peer | subject / peer | at most | holds |"
    rule = "|---|---|---|---|---:|---:|---|"
    if len(runs) > 1:
        head += " runs |"
        rule += "---:|"
    print(head)
    print(rule)
    failed = 0
    for informational, rows in ((False, TARGETS), (True, INFORMATIONAL)):
        for cell, subject, peer, bound, what in rows:
            row = results.get(cell, {})
            if subject not in row or peer not in row:
                verdict, ratio = "not measured", "-"
                if not informational:
                    failed += 1
            else:
                r = row[subject] / row[peer]
                ratio = f"{r:.2f}"
                verdict = "yes" if r <= bound else "**no**"
                if informational:
                    verdict += " (informational)"
                elif r > bound:
                    failed += 1
            line = f"| `{cell}` | {what} | `{subject}` | `{peer}` | {ratio} | {bound:g} | {verdict} |"
            if len(runs) > 1:
                held = sum(1 for run in runs
                           if subject in run.get(cell, {}) and peer in run[cell]
                           and run[cell][subject] / run[cell][peer] <= bound)
                had = sum(1 for run in runs if subject in run.get(cell, {}) and peer in run[cell])
                line += f" {held} of {had} |"
            print(line)
    print()
    total = len(TARGETS)
    print(f"{total - failed} of {total} targets hold.")
    if check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
