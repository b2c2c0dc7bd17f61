#!/usr/bin/env python3
"""Scores `monitor replay -d budget:ms=B` against every family's frontier at B over many seeds
of each generated kind. docs/tuning.md, "Generated kinds over 20 seeds", has the commands that
make the traces (KIND-SEED.trace) and their frontier files (KIND-SEED.trace.frontier.json).

usage: budget_over_seeds.py MONITOR DIR
Prints a markdown table: per kind and budget, the budget detector's false suspicions summed
over the seeds / the fewest any one family makes summed over the same seeds (each family read
on its own frontier at B on each trace; a family with no setting within B on some seed is left
out at that B), the family, and on how many seeds the budget detector was on or below every
family; then the budget detector's own mean detection time as a share of B, least and most.
"none": no family has a setting within B on every seed.
"""
import collections
import glob
import json
import os
import re
import subprocess
import sys

BUDGETS = [150, 200, 300, 400, 500, 750, 1000, 1500]


def main():
    monitor, directory = sys.argv[1], sys.argv[2]
    # kind -> budget -> {"ours": [..], "families": {family: [..]}, "best": [..], "mean": [..]}
    table = collections.defaultdict(lambda: collections.defaultdict(
        lambda: {"ours": [], "families": collections.defaultdict(list), "best": [], "mean": []}))
    seeds = collections.defaultdict(int)
    for path in sorted(glob.glob(os.path.join(directory, "*.trace.frontier.json"))):
        trace = path[: -len(".frontier.json")]
        kind = re.match(r"(.+)-\d+\.trace$", os.path.basename(trace)).group(1)
        seeds[kind] += 1
        frontier = json.load(open(path))["traces"][0]
        args = [monitor, "replay", trace, "--tick-ms", str(frontier["tick_ms"]), "--json"]
        for b in BUDGETS:
            args += ["-d", "budget:ms=%d" % b]
        ours = json.loads(subprocess.run(args, capture_output=True, text=True,
                                         check=True).stdout)["detectors"]
        names = [f["family"] for f in frontier["families"]]
        by_budget = {b["budget_ms"]: b["false_suspicions"] for b in frontier["budgets"]}
        for b, r in zip(BUDGETS, ours):
            cell = table[kind][b]
            cell["ours"].append(r["false_suspicions"])
            cell["mean"].append(r["mean_detection_ms"] / b)
            counts = by_budget[b]
            for name, count in zip(names, counts):
                cell["families"][name].append(count)
            reached = [c for c in counts if c is not None]
            cell["best"].append(min(reached) if reached else None)
    print("| kind (seeds) | " + " | ".join("%d ms" % b for b in BUDGETS) + " | mean / B |")
    print("|---|" + "---:|" * (len(BUDGETS) + 1))
    for kind in sorted(table):
        cells, lo, hi = [], float("inf"), 0.0
        for b in BUDGETS:
            cell = table[kind][b]
            n = len(cell["ours"])
            totals = {f: sum(v) for f, v in cell["families"].items()
                      if len(v) == n and None not in v}
            wins = sum(best is None or o <= best for o, best in zip(cell["ours"], cell["best"]))
            if totals:
                family = min(totals, key=totals.get)
                name = family.replace("phi:model=", "").replace("phi", "normal")
                cells.append("%d / %d %s (%d)" % (sum(cell["ours"]), totals[family], name, wins))
            else:
                cells.append("%d / none (%d)" % (sum(cell["ours"]), wins))
            lo, hi = min(lo, min(cell["mean"])), max(hi, max(cell["mean"]))
        print("| %s (%d) | %s | %.3f-%.3f |" % (kind, seeds[kind], " | ".join(cells), lo, hi))


if __name__ == "__main__":
    main()
