#!/usr/bin/env python3
"""Summarise several reports of `benches/interleaved.rs` like for like.

Usage: python3 benches/interleaved_report.py REPORT.md...

Each REPORT is the standard output of one
`cargo bench -p watertight-benches --bench interleaved -- run ...`. For every
cell found, it prints the fair `bulkhead` against the fair peers (`tokio`,
`fi_fair`, `maitake`) and `bulkhead_unfair` against the unfair ones
(`async_lock`, `fi_unfair`): the median over the reports of the paired
median ratio each report prints (peer's time / ours, above 1: ours faster),
with the lowest of them in parentheses when there are several reports; then
the geometric mean of those medians per runtime, and the cells whose median
is below 1. Issue 13's targets: every ratio at or above 1. Standard library
only.
"""

import math
import re
import sys

FAIR = ("bulkhead", ["tokio", "fi_fair", "maitake"])
UNFAIR = ("bulkhead_unfair", ["async_lock", "fi_unfair"])
GROUPS = ["contended_mt", "contended_ct"]


def parse(path):
    """{ours: {cell: {peer: ratio}}} from one report."""
    out, ours, columns = {}, None, None
    with open(path) as f:
        for line in f:
            m = re.match(r"Paired ratios for `(\w+)`", line)
            if m:
                ours, columns = m.group(1), None
                out.setdefault(ours, {})
                continue
            if ours is None or not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "scenario":
                columns = [c.strip("`") for c in cells[1:]]
            elif columns and cells[0].startswith("`"):
                cell = cells[0].strip("`")
                out[ours][cell] = {peer: float(v.split()[0]) for peer, v in zip(columns, cells[1:])}
    return out


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    reports = [parse(p) for p in paths]
    cells = []
    for r in reports:
        for c in r.get("bulkhead", {}):
            if c not in cells:
                cells.append(c)
    columns = [(ours, peer) for ours, peers in (FAIR, UNFAIR) for peer in peers]
    several = len(reports) > 1
    med = {}
    print(f"Median over {len(reports)} report(s) of the paired median ratio (peer / ours)"
          + ("; lowest in parentheses" if several else "") + ":")
    print()
    print("| cell | " + " | ".join(
        f"{'fair' if ours == 'bulkhead' else 'unfair'} vs `{peer}`" for ours, peer in columns)
        + " |")
    print("|---|" + "---:|" * len(columns))
    for cell in cells:
        row = []
        for ours, peer in columns:
            vals = [r[ours][cell][peer] for r in reports
                    if cell in r.get(ours, {}) and peer in r[ours][cell]]
            if not vals:
                row.append("-")
                continue
            m = median(vals)
            med[(cell, ours, peer)] = m
            text = f"{m:.2f}" + (f" ({min(vals):.2f})" if several else "")
            row.append(f"**{text}**" if m < 1 else text)
        print(f"| `{cell.replace('contended_', '')}` | " + " | ".join(row) + " |")
    print()
    for group in GROUPS:
        means = []
        for ours, peer in columns:
            logs = [math.log(v) for (cell, o, p), v in med.items()
                    if o == ours and p == peer and cell.startswith(group + "/")]
            if logs:
                means.append(f"{'fair' if ours == 'bulkhead' else 'unfair'} vs `{peer}` "
                             f"{math.exp(sum(logs) / len(logs)):.2f}")
        if means:
            print(f"Geometric means, `{group}`: " + ", ".join(means) + ".")
            print()
    below = sorted((v, cell, ours, peer) for (cell, ours, peer), v in med.items() if v < 1)
    print(f"Below 1 ({len(below)} of {len(med)}): " + (", ".join(
        f"`{cell.replace('contended_', '')}` {'fair' if o == 'bulkhead' else 'unfair'} "
        f"vs `{p}` {v:.2f}" for v, cell, o, p in below) or "none") + ".")


if __name__ == "__main__":
    main()
