#!/usr/bin/env python3
"""Server time of one uncontended release, by script variant (docs/benchmarks.md).

Starts a scratch redis-server on 127.0.0.1:7999 (no persistence), loads each variant with
SCRIPT LOAD, drives it with redis-benchmark (16 connections, 200,000 calls per round) and
reads the server's own time per call from INFO commandstats (cmdstat_evalsha
usec_per_call). Every variant first SETs the lock key to the token, so the release always
finds its own token and deletes it, as an uncontended release does; `set_only` is that SET
alone, to subtract. Variants:

  set_only       the SET alone
  rslock         rslock's compare-and-delete: one key, one argument
  rslock_5keys   the same script given quorumlock's five keys and four arguments
  ours           quorumlock's release (release_one.lua + queue.lua + handoff.lua): its
                 uncontended path, first in the script
  ours_general   the same with that path cut out: the general path, which looks for
                 waiting state per resource (the release as it was before that path)
  two_keys       a compare-and-delete given only the lock key and the leases key
                 (EXISTS, GET, DEL): the first step of a two-step release, measured and
                 not used (it costs a round trip more before a hand-off)

Medians of 5 interleaved rounds. Needs redis-server, redis-cli and redis-benchmark
(Debian's redis-server package; scripts/install-deps.sh installs it).
"""

import os
import re
import subprocess
import sys
import time

PORT = "7999"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
KEYS = [
    "quorumlock:lock:{orders:42}",
    "quorumlock:queue:{orders:42}",
    "quorumlock:leases:{orders:42}",
    "quorumlock:attrs:{orders:42}",
    "quorumlock:fence:{orders:42}",
]
TOKEN = "0123456789abcdef0123456789abcdef"
ARGS = [TOKEN, "", "quorumlock:chan:{orders:42}", "0"]


def cli(*args, stdin=None):
    return subprocess.run(
        ["redis-cli", "-p", PORT, *args], capture_output=True, text=True, input=stdin
    ).stdout.strip()


def source(name):
    with open(os.path.join(ROOT, "src", "scripts", name)) as f:
        return f.read()


def main():
    server = subprocess.Popen(
        ["redis-server", "--port", PORT, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            if cli("PING") == "PONG":
                break
            time.sleep(0.1)
        ours = "\n".join(source(n) for n in ["release_one.lua", "queue.lua", "handoff.lua"])
        # Cut out by making the script take every release for one of several resources:
        # its general path then looks for waiting state in its loop, as it did before.
        fast = "local single = #KEYS == 5 and #ARGV == 4"
        if fast not in ours:
            sys.exit("release_one.lua no longer starts with the uncontended path this script expects")
        rslock = (
            'if redis.call("get",KEYS[1]) == ARGV[1] then '
            'return redis.call("del",KEYS[1]) else return 0 end'
        )
        two_keys = (
            "if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end "
            "if redis.call('GET', KEYS[1]) == ARGV[1] then "
            "redis.call('DEL', KEYS[1]) return 1 end return 0"
        )
        set_first = "redis.call('SET', KEYS[1], ARGV[1])\n"
        variants = {
            "set_only": (set_first + "return 1", 1),
            "rslock": (set_first + rslock, 1),
            "rslock_5keys": (set_first + rslock, 5),
            "ours": (set_first + ours, 5),
            "ours_general": (set_first + ours.replace(fast, "local single = false"), 5),
            "two_keys": (set_first + two_keys, 2),
        }
        times = {name: [] for name in variants}
        for _ in range(5):
            for name, (body, nkeys) in variants.items():
                sha = cli("-x", "SCRIPT", "LOAD", stdin=body)
                keys, args = {
                    1: (KEYS[:1], ARGS[:1]),
                    2: ([KEYS[0], KEYS[2]], ARGS[:1]),
                    5: (KEYS, ARGS),
                }[nkeys]
                cli("CONFIG", "RESETSTAT")
                subprocess.run(
                    ["redis-benchmark", "-p", PORT, "-n", "200000", "-c", "16", "-q",
                     "EVALSHA", sha, str(len(keys)), *keys, *args],
                    capture_output=True, check=True,
                )
                stats = cli("INFO", "commandstats")
                m = re.search(r"cmdstat_evalsha:calls=\d+,usec=\d+,usec_per_call=([\d.]+)", stats)
                if not m:
                    sys.exit(f"{name}: no EVALSHA in INFO commandstats")
                times[name].append(float(m.group(1)))
        base = sorted(times["set_only"])[2]
        print(f"{'variant':15s} {'µs per call':>12s} {'release alone':>14s}")
        for name, ts in times.items():
            median = sorted(ts)[2]
            print(f"{name:15s} {median:12.2f} {median - base:14.2f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
