#!/usr/bin/env python3
"""Every family's frontier at a budget B, held to what the budget detector holds itself to.

A family's frontier point meets B as a mean over the whole trace: it may spend a calm stretch's
savings on a later lossy or jittery one, however long. The budget detector (`-d budget:ms=B`)
meets B on every stretch from a peer's first heartbeat, less what its reserve carries (64
budgets: `RESERVE_BUDGETS` in monitor/src/detector/models/budget/alloc.rs). This script scores
both ways over the seeds of a generated kind: each family's best point within B over the trace,
and its best point that also spends no more than 64 budgets over B on any run of the trace's
segments (the trace cut into SEGMENTS equal parts; a prefix's replay gives each part's mean
detection time, so a stretch inside one part is not seen: lenient to the families).

usage: stretch_frontier.py MONITOR [--kinds K,...] [--budgets MS,...] [--segments N]
                           [--seeds N] [--seeds-dir DIR]
SEEDS_DIR (default /tmp/seeds) holds KIND-SEED.trace, made with MONITOR where missing.
Prints a markdown table; a cell reads: the budget detector's false suspicions summed over the
seeds (the most it spent over B on a stretch, in budgets) / the fewest any one family makes
within B over the trace, summed the same way (the most one of those points spent over B on a
stretch) / the fewest any one family makes held to the reserve on every stretch (`none`: no
family has such a point on every seed).
Standard library only; minutes per kind.
"""
import argparse
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

FAMILIES = ["fixed", "phi", "phi:model=akka", "phi:model=exponential", "phi:model=loss",
            "phi:model=chen", "phi:model=bertier", "phi:model=empirical", "phi:model=2w"]
RESERVE_BUDGETS = 64.0


def replay(monitor, path, spec):
    out = subprocess.run([monitor, "replay", path, "-d", spec, "--tick-ms", "10", "--json"],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)["detectors"][0]
    return d["mean_detection_ms"], d["false_suspicions"]


def most_over(monitor, prefixes, spec, budget):
    """The most any run of consecutive segments spends over `budget`, in budgets."""
    spent = []
    prev_n, prev_sum = 0, 0.0
    for path, n in prefixes:
        mean, _ = replay(monitor, path, spec)
        spent.append((mean * n - prev_sum) - (n - prev_n) * budget)
        prev_n, prev_sum = n, mean * n
    best = run = 0.0
    for e in spent:
        run = max(0.0, run + e)
        best = max(best, run)
    return best / budget


def one_seed(monitor, kind, seed, budgets, segments, seeds_dir):
    path = os.path.join(seeds_dir, f"{kind}-{seed}.trace")
    if not os.path.exists(path):
        with open(path, "w") as f:
            subprocess.run([monitor, "replay", "--generate", kind, "--count", "3000",
                            "--seed", str(seed)], stdout=f, check=True)
    lines = open(path).read().splitlines()
    head = [l for l in lines if l.startswith("#")]
    body = [l for l in lines if not l.startswith("#")]
    prefixes = []
    for i in range(1, segments + 1):
        n = len(body) * i // segments
        p = path if i == segments else f"{path}.prefix{i}of{segments}"
        if i < segments:
            with open(p, "w") as f:
                f.write("\n".join(head + body[:n]) + "\n")
        prefixes.append((p, n))
    result = {}
    frontier = json.loads(subprocess.run(
        [monitor, "replay", path, "--frontier"] + sum([["-d", f] for f in FAMILIES], [])
        + ["--budgets", ",".join(str(b) for b in budgets), "--json"],
        capture_output=True, text=True, check=True).stdout)
    families = frontier["traces"][0]["families"] if "traces" in frontier else frontier["families"]
    for b in budgets:
        cell = {"budget": 0, "budget_over": 0.0, "families": {}}
        _, cell["budget"] = replay(monitor, path, f"budget:ms={b}")
        cell["budget_over"] = most_over(monitor, prefixes, f"budget:ms={b}", b)
        for fam in families:
            within = sorted([p for p in fam["points"] if p["detection_ms"] <= b],
                            key=lambda p: (p["false_suspicions"], -p["detection_ms"]))
            if not within:
                cell["families"][fam["family"]] = None
                continue
            best = within[0]
            held = next((p for p in within
                         if most_over(monitor, prefixes, p["spec"], b) <= RESERVE_BUDGETS), None)
            cell["families"][fam["family"]] = (
                best["false_suspicions"], most_over(monitor, prefixes, best["spec"], b),
                None if held is None else held["false_suspicions"])
        result[b] = cell
    for p, _ in prefixes[:-1]:
        os.remove(p)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("monitor")
    ap.add_argument("--kinds", default="asymmetric-loss,jitter-change,slowdown")
    ap.add_argument("--budgets", default="150,200,300,400,500")
    ap.add_argument("--segments", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seeds-dir", default="/tmp/seeds")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    os.makedirs(args.seeds_dir, exist_ok=True)
    print("| kind | " + " | ".join(f"{b} ms" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for kind in args.kinds.split(","):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            runs = list(pool.map(lambda s: one_seed(args.monitor, kind, s, budgets,
                                                    args.segments, args.seeds_dir),
                                 range(1, args.seeds + 1)))
        cells = []
        for b in budgets:
            ours = sum(r[b]["budget"] for r in runs)
            ours_over = max(r[b]["budget_over"] for r in runs)
            whole, held = {}, {}
            for fam in runs[0][b]["families"]:
                got = [r[b]["families"].get(fam) for r in runs]
                if all(g is not None for g in got):
                    whole[fam] = (sum(g[0] for g in got), max(g[1] for g in got))
                    if all(g[2] is not None for g in got):
                        held[fam] = sum(g[2] for g in got)
            def name(f):
                return f.split("=")[-1] if "=" in f else f
            w = min(whole.items(), key=lambda kv: kv[1][0]) if whole else None
            h = min(held.items(), key=lambda kv: kv[1]) if held else None
            cells.append(
                f"{ours} ({ours_over:.0f}) / "
                + (f"{w[1][0]} {name(w[0])} ({w[1][1]:.0f})" if w else "none") + " / "
                + (f"{h[1]} {name(h[0])}" if h else "none"))
        print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
