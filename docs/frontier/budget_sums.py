#!/usr/bin/env python3
"""The budget detector of two builds side by side: false suspicions at each budget summed over
20 seeds of every generated kind, and on each recorded trace, with the range of its mean
detection time as a share of the budget. No families, so it takes minutes, not the hour the
frontiers take (docs/tuning.md, "Generated kinds over 20 seeds").

usage: budget_sums.py OLD_MONITOR NEW_MONITOR [SEEDS_DIR] [RECORDED_DIR]
SEEDS_DIR (default /tmp/seeds) gets KIND-SEED.trace, made with OLD_MONITOR where missing;
RECORDED_DIR defaults to tests/traces. A cell reads OLD / NEW, (+) where NEW makes more.
Standard library only.
"""
import collections
import glob
import json
import os
import subprocess
import sys

BUDGETS = [150, 200, 300, 400, 500, 750, 1000, 1500]
KINDS = ["lan", "wan", "gc-pause", "restart", "bursty", "jitter-change", "pareto", "slowdown",
         "clock-step", "asymmetric-loss", "congested-link"]
SEEDS = range(1, 21)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    builds = sys.argv[1:3]
    seeds_dir = sys.argv[3] if len(sys.argv) > 3 else "/tmp/seeds"
    recorded = sys.argv[4] if len(sys.argv) > 4 else "tests/traces"
    os.makedirs(seeds_dir, exist_ok=True)
    traces = []
    for kind in KINDS:
        for seed in SEEDS:
            path = os.path.join(seeds_dir, f"{kind}-{seed}.trace")
            if not os.path.exists(path):
                with open(path, "w") as f:
                    subprocess.run([builds[0], "replay", "--generate", kind, "--count", "3000",
                                    "--seed", str(seed)], stdout=f, check=True)
            traces.append((kind, path))
    for path in sorted(glob.glob(os.path.join(recorded, "*.trace"))):
        traces.append((os.path.basename(path)[:-len(".trace")] + ", recorded", path))
    # (kind, budget) -> per build [false suspicions, least mean / B, most mean / B]
    sums = collections.defaultdict(lambda: [[0, float("inf"), 0.0] for _ in builds])
    for kind, path in traces:
        for i, build in enumerate(builds):
            args = [build, "replay", path, "--json", "--tick-ms", "10"]
            for b in BUDGETS:
                args += ["-d", f"budget:ms={b}"]
            report = json.loads(subprocess.run(args, capture_output=True, check=True).stdout)
            for b, d in zip(BUDGETS, report["detectors"]):
                cell = sums[(kind, b)][i]
                cell[0] += d["false_suspicions"]
                share = d["mean_detection_ms"] / b
                cell[1], cell[2] = min(cell[1], share), max(cell[2], share)
    print("| kind | " + " | ".join(f"{b} ms" for b in BUDGETS) + " |")
    print("|---|" + "---:|" * len(BUDGETS))
    for kind in dict.fromkeys(k for k, _ in traces):
        cells = []
        for b in BUDGETS:
            old, new = sums[(kind, b)][0][0], sums[(kind, b)][1][0]
            cells.append(f"{old} / {new}" + (" (+)" if new > old else ""))
        print(f"| {kind} | " + " | ".join(cells) + " |")
    for i, build in enumerate(builds):
        lo = min(v[i][1] for v in sums.values())
        hi = max(v[i][2] for v in sums.values())
        print(f"\n{build}: mean detection {lo:.3f}-{hi:.3f} B")


if __name__ == "__main__":
    main()
