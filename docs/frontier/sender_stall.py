#!/usr/bin/env python3
"""Traces of a 20 ms sender that stalls for 300 ms every 400 heartbeats (a stopped process, a
paused VM), resumed two ways: `burst` sends every missed heartbeat at once on waking (10 us
apart, as the senders did before they started their schedule again: tests/tests/senders.rs
measured 3-34 us), `restart` starts the schedule again from the wake-up (what `monitor send`,
examples/c/hb_send.c and examples/python/hb_send.py do now). 3000 heartbeats, arrival = nominal
time + |N(0, 1 ms)|, sequence numbers as sent. Writes DIR/burst<seed>.trace and
DIR/restart<seed>.trace for seeds 0-4.

    python3 docs/frontier/sender_stall.py /tmp/stall
    monitor replay --tick-ms 1 -d phi:threshold=8,min_std_ms=2,first_interval_ms=20 /tmp/stall/burst*.trace
"""
import random
import sys

INTERVAL_MS, STALL_MS, EVERY, COUNT = 20.0, 300.0, 400, 3000


def trace(variant, seed):
    rng = random.Random(seed)
    out, seq, nominal = [], 0, 0.0
    while seq < COUNT:
        if seq and seq % EVERY == 0:
            wake = nominal + STALL_MS
            if variant == "burst":
                n = 0
                while nominal < wake and seq < COUNT:
                    out.append((wake + 0.01 * n, seq))
                    seq, nominal, n = seq + 1, nominal + INTERVAL_MS, n + 1
                continue
            nominal = wake
        out.append((nominal + abs(rng.gauss(0, 1)), seq))
        seq, nominal = seq + 1, nominal + INTERVAL_MS
    out.sort()
    return "".join(f"{at:.3f} {s}\n" for at, s in out)


if __name__ == "__main__":
    for variant in ("burst", "restart"):
        for seed in range(5):
            with open(f"{sys.argv[1]}/{variant}{seed}.trace", "w") as f:
                f.write(trace(variant, seed))
