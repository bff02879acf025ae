#!/usr/bin/env python3
"""The client's instructions per uncontended Redis cycle, counted by
callgrind: `benches/redis_client.rs count CASE N` runs one case for N
cycles (after its set-up and 200 warm-up cycles) under valgrind, at two N;
the difference over the extra cycles is one cycle, start-up excluded. The
Redis server runs outside valgrind (it is a child process that valgrind
does not follow), so only the client's work is counted.

Usage: python3 benches/redis_client.py [CASE ...]

CASEs: ours, bare_ours, bare_cmp, and with a cluster the same with a
`cluster_` prefix (default: all six). Builds the bench with
`cargo bench -p bulkhead-benches --bench redis_client --features
redis-cluster,tokio --no-run` and needs valgrind on PATH. Standard library
only.
"""

import json
import os
import re
import subprocess
import sys

CASES = ["ours", "bare_ours", "bare_cmp", "cluster_ours", "cluster_bare_ours", "cluster_bare_cmp"]
RUNS = (200, 1200)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build():
    out = subprocess.run(
        ["cargo", "bench", "-p", "bulkhead-benches", "--bench", "redis_client",
         "--features", "redis-cluster,tokio", "--no-run", "--message-format=json"],
        check=True, capture_output=True, text=True, cwd=ROOT).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" \
                and msg["target"]["name"] == "redis_client" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo did not report the redis_client bench's executable")


def count(exe, case, cycles):
    res = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         exe, "count", case, str(cycles)],
        capture_output=True, text=True, cwd=ROOT)
    m = re.search(r"Collected : (\d+)", res.stderr)
    a = re.search(r": \d+ cycles, (\d+) allocations", res.stderr)
    if res.returncode != 0 or not m or not a:
        sys.exit(f"callgrind failed for {case}:\n{res.stderr[-3000:]}")
    return int(m.group(1)), int(a.group(1))


def main():
    cases = sys.argv[1:] or CASES
    exe = build()
    print("| case | instructions per cycle (client) | allocations per cycle |")
    print("|---|--:|--:|")
    span = RUNS[1] - RUNS[0]
    for case in cases:
        (lo, alo), (hi, ahi) = (count(exe, case, n) for n in RUNS)
        print(f"| `{case}` | {(hi - lo) / span:,.0f} | {(ahi - alo) / span:.1f} |", flush=True)


if __name__ == "__main__":
    main()
