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
`cargo bench -p watertight-benches --bench redis_client --features
redis-cluster,tokio --no-run` and needs valgrind on PATH. Standard library
only. With `strace` on PATH, also the client's system calls per cycle
(`strace -f -c`, the same difference of two runs).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CASES = ["ours", "bare_ours", "bare_cmp", "cluster_ours", "cluster_bare_ours", "cluster_bare_cmp"]
RUNS = (200, 1200)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build():
    out = subprocess.run(
        ["cargo", "bench", "-p", "watertight-benches", "--bench", "redis_client",
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


def syscalls(exe, case, cycles):
    """System calls of the client (every thread) by name, from `strace -c`."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        res = subprocess.run(["strace", "-f", "-c", "-o", out.name, exe, "count", case, str(cycles)],
                             capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            sys.exit(f"strace failed for {case}:\n{res.stderr[-3000:]}")
        calls = {}
        for line in out.read().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                calls[m.group(2)] = int(m.group(1))
        return calls


def main():
    cases = sys.argv[1:] or CASES
    exe = build()
    have_strace = shutil.which("strace") is not None
    print("| case | instructions per cycle (client) | allocations per cycle | system calls per cycle |")
    print("|---|--:|--:|---|")
    span = RUNS[1] - RUNS[0]
    for case in cases:
        (lo, alo), (hi, ahi) = (count(exe, case, n) for n in RUNS)
        sys_cell = "(no strace)"
        if have_strace:
            a, b = (syscalls(exe, case, n) for n in RUNS)
            per = {k: (b[k] - a.get(k, 0)) / span for k in b}
            per = {k: v for k, v in per.items() if v >= 0.05}
            sys_cell = f"{sum(per.values()):.1f}: " + ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"| `{case}` | {(hi - lo) / span:,.0f} | {(ahi - alo) / span:.1f} | {sys_cell} |", flush=True)


if __name__ == "__main__":
    main()
