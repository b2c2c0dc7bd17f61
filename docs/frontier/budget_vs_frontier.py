#!/usr/bin/env python3
"""Scores `monitor replay -d budget:ms=B` against every family's frontier at B (the fewest
false suspicions with a mean detection time within B, `--frontier --json`'s "budgets"), per
trace, on the same clock. docs/tuning.md, "A detection budget, met per peer", has the
commands that make the frontier files.

usage: budget_vs_frontier.py MONITOR DIR=FRONTIER.json [DIR=FRONTIER.json ...]
  DIR: where the frontier's replay ran (its trace paths are relative to it).
Prints a markdown table (budget's false suspicions / the best family's, and the budget's own
mean detection time) and, last, the cells where the budget is not on or below every family's
frontier or its mean is outside 0.9 B..B.
"""
import json
import os
import subprocess
import sys

BUDGETS = [150, 200, 300, 400, 500, 750, 1000, 1500]


def main():
    monitor = sys.argv[1]
    rows, misses = [], []
    for arg in sys.argv[2:]:
        cwd, path = arg.split("=", 1)
        frontier = json.load(open(path))
        for t in frontier["traces"]:
            args = [monitor, "replay", t["trace"], "--tick-ms", str(t["tick_ms"]), "--json"]
            for b in BUDGETS:
                args += ["-d", "budget:ms=%d" % b]
            out = json.loads(
                subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=True).stdout
            )
            best = {b["budget_ms"]: b["false_suspicions"] for b in t["budgets"]}
            families = [f["family"] for f in t["families"]]
            cells = []
            for b, r in zip(BUDGETS, out["detectors"]):
                counts = best[b]
                least = min(v for v in counts if v is not None)
                winner = families[counts.index(least)]
                mean = r["mean_detection_ms"]
                ok = r["false_suspicions"] <= least and 0.9 * b <= mean <= b
                mark = "" if ok else " (!)"
                cells.append("%d / %d%s" % (r["false_suspicions"], least, mark))
                if not ok:
                    misses.append(
                        "%s at %d ms: %d against %d (%s), mean detection %.1f ms"
                        % (t["trace"], b, r["false_suspicions"], least, winner, mean)
                    )
            rows.append((os.path.basename(t["trace"]), t["heartbeats"], cells))
    print("| trace | " + " | ".join("%d ms" % b for b in BUDGETS) + " |")
    print("|---|" + "---:|" * len(BUDGETS))
    for name, heartbeats, cells in rows:
        print("| %s (%d) | %s |" % (name, heartbeats, " | ".join(cells)))
    cells = len(rows) * len(BUDGETS)
    print("\n%d of %d cells on or below every family's frontier, mean within 0.9 B..B"
          % (cells - len(misses), cells))
    for m in misses:
        print("- " + m)


if __name__ == "__main__":
    main()
