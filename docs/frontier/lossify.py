#!/usr/bin/env python3
"""Drops heartbeats of a trace per a Gilbert-Elliott chain, keeping the survivors' sequence
numbers, so that a recorded trace's real delays (a starved sender, a queue, timer jitter) can
be replayed with the loss counters counting: the chain of `monitor replay --generate bursty`
(good -> bad 1%, bad -> good 10% before each heartbeat, then lost with 0.1% or 40%). The first
and last heartbeats are kept (the last is the crash every trace ends with).

usage: lossify.py TRACE SEED > LOSSY_TRACE     (standard library only)

docs/tuning.md, "Loss-aware suspicion" ("200 ms closed"), replays ten seeds of each recorded
trace so with two builds of the budget detector.
"""
import random
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rng = random.Random(int(sys.argv[2]))
    lines = open(sys.argv[1]).read().splitlines()
    data = [l for l in lines if l.strip() and not l.startswith("#")]
    out = [l for l in lines if l.startswith("#")]
    out.append(f"# every heartbeat but the first and last lost per a Gilbert-Elliott chain, seed {sys.argv[2]}")
    bad = False
    for i, line in enumerate(data):
        bad = rng.random() >= 0.10 if bad else rng.random() < 0.01
        if 0 < i < len(data) - 1 and rng.random() < (0.40 if bad else 0.001):
            continue
        out.append(line)
    print("\n".join(out))


if __name__ == "__main__":
    main()
