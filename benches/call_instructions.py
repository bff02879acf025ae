#!/usr/bin/env python3
"""Instructions per call on the single-call paths of `Bulkhead`, counted by
callgrind: `benches/call_instructions.rs` runs each path 6,400 and 70,400
times, and the difference over 64,000 is one call, start-up excluded.

Usage: python3 benches/call_instructions.py [PATH ...]

Builds the workload with `cargo bench -p watertight-benches --no-run` (the
bench profile) and needs valgrind on PATH. Standard library only.
"""

import json
import os
import re
import subprocess
import sys

PATHS = ["call", "call_by", "call_queue_delay", "reject_full", "try_acquire", "keyed_call",
         "keyed_call_timed", "keyed_call_queue_delay", "keyed_call_fair", "keyed_call_by", "contended",
         "contended_max_wait"]
RUNS = (6_400, 70_400)


def build():
    out = subprocess.run(
        ["cargo", "bench", "-p", "watertight-benches", "--bench", "call_instructions",
         "--no-run", "--message-format=json"],
        check=True, capture_output=True, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" \
                and msg["target"]["name"] == "call_instructions" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo did not report the call_instructions bench's executable")


def count(exe, path, calls):
    res = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", exe, path, str(calls)],
        capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", res.stderr)
    if res.returncode != 0 or not m:
        sys.exit(f"callgrind failed for {path}:\n{res.stderr[-2000:]}")
    return int(m.group(1))


def main():
    paths = sys.argv[1:] or PATHS
    exe = build()
    print("| path | instructions per call |")
    print("|---|---:|")
    for path in paths:
        lo, hi = (count(exe, path, n) for n in RUNS)
        print(f"| `{path}` | {(hi - lo) / (RUNS[1] - RUNS[0]):.1f} |")


if __name__ == "__main__":
    main()
