#!/usr/bin/env python3
"""Run `benches/redis.rs` and print its table (the round trips PERFORMANCE.md quotes).

Usage: python3 benches/redis_report.py [--no-run] [CRITERION_DIR] [-- BENCH_ARGS...]

Without --no-run, first runs (from the repository root)
`cargo bench -p watertight-benches --bench redis --features redis-cluster,tokio -- BENCH_ARGS...`
(its output goes to stderr), then reads what that run wrote: criterion's
estimates for the group `redis`, and `redis_extra.json` (redis-benchmark's
results and the server's script counts) from the same directory.

CRITERION_DIR defaults to $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion,
else the workspace's target/criterion (the places criterion itself writes
to).

Times are criterion's median per iteration. redis-benchmark's requests per
second (the median of its repeats) become ns per call as 1e9 / rps; with one connection and one request
in flight (`-c 1 -P 1`) that is the round trip, the reference of the ratio
column. Standard library only.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Report order, with what one iteration is.
CASES = [
    ("try_acquire_release", "`try_acquire` + `release`, current-thread runtime"),
    ("acquire_release", "`acquire` + `release`, current-thread runtime"),
    ("acquire_release_mt", "`acquire` + `release` in a task, multi-thread runtime (2 workers)"),
    ("contended_t16_p4", "16 tasks, limit 4, multi-thread runtime, fair line: wall time / cycles"),
    ("contended_t16_p4_unfair", "the same with `fair(false)`: wall time / cycles"),
    ("redis_rs_evalsha", "redis-rs alone: one `invoke_async` of the comparable script"),
    ("redis_rs_ours", "redis-rs alone: `invoke_async` of our acquire and release scripts, our keys and arguments"),
    ("cluster_acquire_release", "`acquire` + `release` on a 3-primary Cluster, current-thread runtime"),
    ("cluster_redis_rs_evalsha", "redis-rs alone on the same Cluster: one `invoke_async`"),
    ("cluster_redis_rs_ours", "redis-rs alone on the same Cluster: our two scripts, as `redis_rs_ours`"),
]
REFERENCE = "EVALSHA -c 1 -P 1"


def parse_args(argv):
    run, directory, bench_args = True, None, []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1 :]
    for arg in argv:
        if arg == "--no-run":
            run = False
        elif arg in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        else:
            directory = Path(arg)
    return run, directory, bench_args


def criterion_dir(given):
    if given is not None:
        return given
    if os.environ.get("CRITERION_HOME"):
        return Path(os.environ["CRITERION_HOME"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"
    # The workspace's target directory (this script sits in benches/), which
    # is where criterion writes when neither variable is set.
    return Path(__file__).resolve().parent.parent / "target" / "criterion"


def run_bench(bench_args):
    cmd = ["cargo", "bench", "-p", "watertight-benches", "--bench", "redis", "--features", "redis-cluster,tokio", "--"] + bench_args
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    # The bench's own output (criterion's and the summary) goes to stderr so
    # that stdout holds only the markdown.
    done = subprocess.run(cmd, stdout=sys.stderr, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        sys.exit(f"cargo bench failed with exit code {done.returncode}")


def load_case(root, name):
    """(median ns per iteration, mtime) of criterion's latest result, or None."""
    est_path = root / "redis" / name / "new" / "estimates.json"
    meta_path = est_path.with_name("benchmark.json")
    if not est_path.exists():
        return None
    est = json.loads(est_path.read_text())
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    elements = (meta.get("throughput") or {}).get("Elements") or 1
    return est["median"]["point_estimate"] / elements, est_path.stat().st_mtime


def fmt_ns(ns):
    if ns >= 100_000:
        return f"{ns / 1000:.0f} µs"
    if ns >= 10_000:
        return f"{ns / 1000:.1f} µs"
    return f"{ns / 1000:.2f} µs"


def main():
    run, given, bench_args = parse_args(sys.argv[1:])
    if run:
        run_bench(bench_args)
    root = criterion_dir(given)
    extra_path = root / "redis_extra.json"
    if not extra_path.exists():
        sys.exit(f"{extra_path} not found: run `cargo bench -p watertight-benches --bench redis --features redis-cluster,tokio` first")
    extra = json.loads(extra_path.read_text())
    rb = {r["label"]: r for r in extra["redis_benchmark"]}
    stats = {c["name"]: c for c in extra["cases"]}
    ref = rb.get(REFERENCE)
    ref_ns = 1e9 / ref["rps"] if ref else None

    def server_us(calls, usec):
        return f"{usec / calls:.1f}" if calls else "–"

    def ratio(ns_per_call):
        return f"{ns_per_call / ref_ns:.2f}" if ref_ns else "–"

    mtimes = [extra_path.stat().st_mtime]
    rows = []
    for label, r in rb.items():
        ns = 1e9 / r["rps"]
        what = "PING" if label.startswith("PING") else "comparable script"
        p50 = f", p50 {r['p50_ms'] * 1000:.0f} µs" if r.get("p50_ms") is not None else ""
        runs = r.get("rps_runs") or [r["rps"]]
        spread = f" (runs {min(runs):,.0f} to {max(runs):,.0f})" if len(runs) > 1 else ""
        rows.append(
            f"| redis-benchmark `{label}` | {what}, {r['rps']:,.0f} requests/s{spread}{p50} "
            f"| {fmt_ns(ns)} | 1 | {fmt_ns(ns)} | {ratio(ns)} "
            f"| {server_us(r['script_calls'], r['script_usec'])} |"
        )
    for name, what in CASES:
        found = load_case(root, name)
        if found is None:
            continue
        ns, mtime = found
        mtimes.append(mtime)
        s = stats.get(name)
        if s and s["cycles"]:
            calls = s["script_calls"] / s["cycles"]
            calls_cell = f"{calls:.2f}"
            us = server_us(s["script_calls"], s["script_usec"])
        else:
            calls = 1 if name.endswith("redis_rs_evalsha") else 2
            calls_cell, us = f"{calls} (nominal)", "–"
        per_call = ns / calls
        rows.append(
            f"| criterion `redis/{name}` | {what} | {fmt_ns(ns)} | {calls_cell} "
            f"| {fmt_ns(per_call)} | {ratio(per_call)} | {us} |"
        )

    span = [time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (min(mtimes), max(mtimes))]
    print(f"<!-- generated by benches/redis_report.py from {root}; results written {span[0]} to {span[1]} -->")
    print()
    print(
        f"redis {extra.get('redis_version', '?')} on loopback, persistence off; "
        f"redis-benchmark with `-n {extra.get('requests', '?')} -q`, each configuration "
        f"{extra.get('repeats', 1)} times round robin, median shown. "
        "One criterion iteration is one acquire/release cycle (one script call for "
        "`redis_rs_evalsha`). The ratio is ns per script call divided by "
        f"redis-benchmark's `{REFERENCE}` round trip. Script calls and µs in Redis "
        "come from `INFO commandstats` around each measurement (warm-up included)."
    )
    print()
    print("| measurement | what | time per iteration | script calls per iteration | time per script call | ratio | µs in Redis per script |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    floors = []
    for cycle, floor in [("acquire_release", "redis_rs_evalsha"), ("cluster_acquire_release", "cluster_redis_rs_evalsha")]:
        a, b = load_case(root, cycle), load_case(root, floor)
        if a and b:
            floors.append(f"`{cycle}` is {a[0] / (2 * b[0]):.2f}x two `{floor}` calls")
    if floors:
        print()
        print("Against two bare redis-rs calls of the comparable script on the same connection type: " + "; ".join(floors) + ".")
    same = []
    for cycle, floor in [("acquire_release", "redis_rs_ours"), ("cluster_acquire_release", "cluster_redis_rs_ours")]:
        a, b = load_case(root, cycle), load_case(root, floor)
        if a and b:
            same.append(f"`{cycle}` is {a[0] / b[0]:.2f}x `{floor}`")
    if same:
        print()
        print("Against bare redis-rs calls of our own two scripts (like for like): " + "; ".join(same) + ".")
    if mtimes and max(mtimes) - min(mtimes) > 3600:
        print()
        print("<!-- warning: these results span more than an hour; rerun the whole bench -->")


if __name__ == "__main__":
    main()
