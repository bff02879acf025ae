#!/usr/bin/env python3
"""Server time and commands per call of each Redis script, path by path.

Usage: python3 benches/redis_script_cost.py [--calls N] [--repeat R] [SCRIPTS_RS...]

Reads the Lua of src/redis/scripts.rs (or of each SCRIPTS_RS: give another
checkout's too, to compare; the runs go round robin), starts its own `redis-server` (free port, persistence off,
`WATERTIGHT_REDIS_SERVER` overrides the binary) and drives the scripts with
`redis-cli` exactly as the client would send them (the same keys and
arguments), one call at a time, N times per path (default 2000), R runs
(default 3):

- `uncontended`: acquire a free permit, release it (nobody waits).
- `contended`: limit 1, the holder releases while one waiter is in the
  fair line: the waiter's acquire (joins the line), the holder's release
  (grants the head), then the roles swap.
- `renew`: one lease renewed per call, empty line.

For every path: `SLOWLOG` with a threshold of 0 gives each script call's
own duration in Redis (µs, median and mean per script), and
`INFO commandstats` the commands the scripts ran (commands a script runs
are counted there) per script call. Standard library only; the numbers
are the server's own, so they are much less noisy than round trips, but
still shared-CPU timings: compare two runs made back to back.
"""

import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "bulkhead:{cost}"
KEYS = [
    f"{NAME}:leases",
    f"{NAME}:info",
    f"{NAME}:fence",
    f"{NAME}:limit",
    f"{NAME}:wake",
    f"{NAME}:quarantine",
    f"{NAME}:queue",
    f"{NAME}:queue:beat",
    f"{NAME}:queue:info",
    f"{NAME}:queue:seq",
]
EPOCH_KEY = f"{NAME}:epoch"
TTL = 30000
TOKEN = "0f0f0f0f"


def scripts(path):
    text = Path(path).read_text()
    found = dict(re.findall(r'const ([A-Z_]+): &str = r"\n(.*?)\n";', text, re.S))
    prelude = "local PUBLISH = 'PUBLISH'\n" + found["PRELUDE"] + "\n"
    return {name.lower(): prelude + found[name] for name in ("ACQUIRE", "RELEASE", "RENEW")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args):
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, errors="replace", check=True
    )
    return out.stdout


def send(port, lines):
    """Sends one command per line: with `PIPE=1` in the environment
    pipelined (`redis-cli --pipe`: the server runs them back to back, with
    fewer wake-ups between calls to disturb its timings), else each waiting
    for its reply."""
    pipe = ["--pipe"] if os.environ.get("PIPE") == "1" else []
    subprocess.run(
        ["redis-cli", "-p", str(port), *pipe],
        input="\r\n".join(lines) + "\r\n",
        capture_output=True,
        text=True,
        check=True,
    )


def evalsha(sha, keys, args):
    return " ".join(["EVALSHA", sha, str(len(keys)), *keys, *map(str, args)])


def acquire(sha, pid, fair):
    # id, ttl, default limit, label, fence seen, quarantine ms, fair,
    # process token, epoch seen, loss flag, new id (each id here is used for
    # one acquire only, as the client's are; a script older than the flag
    # ignores it)
    return evalsha(sha, KEYS + [EPOCH_KEY], [pid, TTL, 1, "bench", 0, TTL, fair, TOKEN, "e1", 0, 1])


def release(sha, pid):
    return evalsha(sha, KEYS, [pid])


def renew(sha, pid):
    return evalsha(sha, KEYS, [TTL, pid])


def measure(port, shas, setup, lines):
    cli(port, "FLUSHALL")
    cli(port, "SET", EPOCH_KEY, "e1")
    if setup:
        send(port, setup)
    cli(port, "CONFIG", "SET", "slowlog-log-slower-than", "-1")
    cli(port, "CONFIG", "RESETSTAT")
    send(port, lines)
    calls, evalsha = {}, None
    for line in cli(port, "INFO", "commandstats").splitlines():
        m = re.match(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+)", line)
        if m and m.group(1) == "evalsha":
            evalsha = (int(m.group(2)), int(m.group(3)))
        elif m and m.group(1).split("|")[0] not in ("config", "slowlog", "info", "command"):
            calls[m.group(1)] = int(m.group(2))
    # Again, logging every call (the log's own cost inflates these): who took what.
    cli(port, "FLUSHALL")
    cli(port, "SET", EPOCH_KEY, "e1")
    if setup:
        send(port, setup)
    cli(port, "CONFIG", "SET", "slowlog-log-slower-than", "0")
    cli(port, "SLOWLOG", "RESET")
    send(port, lines)
    per_sha = {}
    log = cli(port, "SLOWLOG", "GET", str(30 * len(lines) + 1000)).split("\n")
    # redis-cli prints each entry as: id, timestamp, duration, then the args.
    i = 0
    while i < len(log):
        if log[i] == "EVALSHA" and i >= 3:
            per_sha.setdefault(log[i + 1], []).append(int(log[i - 1]))
        i += 1
    names = {sha: name for name, sha in shas.items()}
    return {names[s]: d for s, d in per_sha.items() if s in names}, calls, evalsha


def run_paths(port, path, n):
    """One measurement of every path with `path`'s scripts."""
    cli(port, "SCRIPT", "FLUSH")
    shas = {name: cli(port, "SCRIPT", "LOAD", body).strip()
            for name, body in scripts(path).items()}
    a, r, w = shas["acquire"], shas["release"], shas["renew"]
    paths = {
        "uncontended": ([], [l for i in range(n) for l in
                             (acquire(a, f"u{i}", 1), release(r, f"u{i}"))]),
        # p0 holds; each round the next joins the line, and the holder's
        # release grants it.
        "contended": ([acquire(a, "p0", 1)],
                      [l for i in range(n) for l in
                       (acquire(a, f"p{i + 1}", 1), release(r, f"p{i}"))]),
        "renew": ([acquire(a, "h", 1)], [renew(w, "h") for _ in range(n)]),
    }
    return {label: measure(port, shas, setup, lines) for label, (setup, lines) in paths.items()}


def main():
    args = sys.argv[1:]
    n, repeat = 2000, 3
    while args and args[0].startswith("--"):
        flag, value = args[0], int(args[1])
        args = args[2:]
        if flag == "--calls":
            n = value
        elif flag == "--repeat":
            repeat = value
    files = args or [str(ROOT / "src/redis/scripts.rs")]
    port = free_port()
    server = os.environ.get("WATERTIGHT_REDIS_SERVER", "redis-server")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [server, "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", tmp, "--slowlog-log-slower-than", "0",
             "--slowlog-max-len", str(60 * n + 1000)],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                try:
                    cli(port, "PING")
                    break
                except subprocess.CalledProcessError:
                    time.sleep(0.05)
            # Round robin over the files, so load from elsewhere hits each alike.
            runs = {f: [] for f in files}
            for _ in range(repeat):
                for f in files:
                    runs[f].append(run_paths(port, f, n))
            print(f"{n} rounds per path, {repeat} runs per file round robin; "
                  "µs per script call in Redis: median of the runs' means (commandstats, "
                  "log off), runs' range in brackets; per script: median of every call "
                  "with SLOWLOG on (the log's own cost included)")
            for f in files:
                print(f"== {f}")
                for label in runs[f][0]:
                    means = sorted(r[label][2][1] / r[label][2][0] for r in runs[f])
                    total = runs[f][0][label][2][0]
                    calls = runs[f][0][label][1]
                    per = {}
                    for r in runs[f]:
                        for name, d in r[label][0].items():
                            per.setdefault(name, []).extend(d)
                    parts = ", ".join(f"{name} {statistics.median(d):.0f}"
                                      for name, d in sorted(per.items()))
                    inner = " ".join(f"{c}={v / total:.2f}" for c, v in sorted(calls.items())
                                     if v / total >= 0.005)
                    print(f"{label}: {statistics.median(means):.1f} µs "
                          f"[{means[0]:.1f}-{means[-1]:.1f}]; SLOWLOG median: {parts}")
                    print(f"  commands per script call {sum(calls.values()) / total:.2f}: {inner}")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
