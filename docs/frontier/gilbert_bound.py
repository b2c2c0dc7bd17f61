#!/usr/bin/env python3
"""How few false suspicions any detector can make on generated bursty-loss traces.

`monitor replay --generate bursty` draws loss from a Gilbert-Elliott chain whose parameters
are known (monitor/src/offline/generate.rs). A detector that knows them exactly, and tracks
the chain's state from the sequence numbers (a forward filter), has the true probability that
a live peer stays silent for t after each heartbeat. Two detectors are built on it:

- exact phi: suspects when that probability falls below 10^-threshold, the rule every phi
  model follows (so the product's levels keep their meaning); its threshold is swept;
- bayes: picks each deadline to minimise expected mistakes + lambda * deadline, the best
  trade between mistakes and mean detection time that any detector can make in expectation;
  lambda is swept.

Both are scored on the trace as `monitor replay --frontier` scores its families (a mistake is
a silence longer than the deadline; the mean detection time is the mean deadline over the
heartbeats), then read at the same budgets as normal (default and with the old 25 ms floor)
and model=loss, summed over the seeds.

Usage: docs/frontier/gilbert_bound.py MONITOR_BINARY [SEEDS [COUNT]]
       (SEEDS default 1,2,3,4,5; COUNT heartbeats a trace, default 3000)
"""
import json, math, subprocess, sys, tempfile, os

# The generator's chain (generate.rs, TraceKind::Bursty) and its timing: 100 ms heartbeats,
# N(0, 2 ms) jitter on each arrival, so intervals have a deviation of 2 sqrt 2 ms.
LOSS_GOOD, GOOD_TO_BAD, LOSS_BAD, BAD_TO_GOOD = 0.001, 0.01, 0.40, 0.10
MEAN, STD = 100.0, 2.0 * math.sqrt(2.0)
BUDGETS = [200, 250, 300, 350, 400, 450, 500]
FAMILIES = ["phi", "phi:min_std_ms=25", "phi:model=loss"]


def predict(bad):
    return bad * (1 - BAD_TO_GOOD) + (1 - bad) * GOOD_TO_BAD


def observe(bad, lost):
    pb = bad * (LOSS_BAD if lost else 1 - LOSS_BAD)
    pg = (1 - bad) * (LOSS_GOOD if lost else 1 - LOSS_GOOD)
    return pb / (pb + pg)


def lost_then_arrival(bad, terms=60):
    """P(K = k) for k < terms: the next k heartbeats lost, then one arrives."""
    out, mass = [], 1.0
    for _ in range(terms):
        ahead = predict(bad)
        arrives = ahead * (1 - LOSS_BAD) + (1 - ahead) * (1 - LOSS_GOOD)
        out.append(mass * arrives)
        mass *= 1 - arrives
        bad = ahead * LOSS_BAD / (1 - arrives)
    return out


def survival(t, k_dist):
    q = lambda z: 0.5 * math.erfc(z / math.sqrt(2.0))
    return sum(w * q((t - (k + 1) * MEAN) / (STD * math.sqrt(k + 1))) for k, w in enumerate(k_dist))


def beliefs_and_gaps(path):
    rows = [l.split() for l in open(path) if l.strip() and not l.startswith("#")]
    t = [float(r[0]) for r in rows]
    s = [int(r[1]) for r in rows]
    bad, beliefs = GOOD_TO_BAD / (GOOD_TO_BAD + BAD_TO_GOOD), []
    for i in range(len(t)):
        if i > 0:
            for _ in range(s[i] - s[i - 1] - 1):
                bad = observe(predict(bad), True)
            bad = observe(predict(bad), False)
        beliefs.append(round(bad, 9))
    return beliefs[:-1], [t[i + 1] - t[i] for i in range(len(t) - 1)]


def frontiers(path):
    beliefs, gaps = beliefs_and_gaps(path)
    grid = [100 + 2 * k for k in range(1000)]
    curves = {b: [survival(d, lost_then_arrival(b)) for d in grid] for b in set(beliefs)}

    def score(deadline_of):
        deadlines = [deadline_of[b] for b in beliefs]
        return (sum(deadlines) / len(deadlines), sum(g > d for g, d in zip(gaps, deadlines)))

    exact_phi, bayes = [], []
    for i in range(80):
        threshold = 0.5 + 0.1 * i
        exact_phi.append(score({b: next((d for d, p in zip(grid, c) if p < 10 ** -threshold), grid[-1])
                                for b, c in curves.items()}))
    lam = 1e-2
    while lam > 1e-8:
        bayes.append(score({b: grid[min(range(len(grid)), key=lambda j: c[j] + lam * grid[j])]
                            for b, c in curves.items()}))
        lam *= 0.8
    return {"exact phi": exact_phi, "bayes": bayes}


def fewest(points, budget):
    within = [f for d, f in points if d is not None and d <= budget]
    return min(within) if within else None


def main():
    monitor = sys.argv[1]
    seeds = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,2,3,4,5").split(",")]
    count = sys.argv[3] if len(sys.argv) > 3 else "3000"
    names = FAMILIES + ["exact phi", "bayes"]
    totals = {n: {b: 0 for b in BUDGETS} for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            path = os.path.join(tmp, f"bursty{seed}.trace")
            with open(path, "w") as f:
                subprocess.run([monitor, "replay", "--generate", "bursty", "--count", count,
                                "--seed", str(seed)], stdout=f, check=True)
            args = [monitor, "replay", path, "--frontier", "--json"]
            for fam in FAMILIES:
                args += ["-d", fam]
            report = json.loads(subprocess.run(args, capture_output=True, check=True).stdout)
            curves = {f["family"]: [(p["detection_ms"], p["false_suspicions"]) for p in f["points"]]
                      for f in report["traces"][0]["families"]}
            curves.update(frontiers(path))
            for n in names:
                for b in BUDGETS:
                    totals[n][b] += fewest(curves[n], b)
    print(f"False suspicions within each mean detection budget, summed over seeds {seeds}")
    print(f"(generated bursty traces, {count} heartbeats each, tick 10 ms):\n")
    print("| budget | " + " | ".join(names) + " | normal (old) / bayes |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for b in BUDGETS:
        cells = [str(totals[n][b]) for n in names]
        ratio = totals["phi:min_std_ms=25"][b] / max(totals["bayes"][b], 1)
        print(f"| {b} ms | " + " | ".join(cells) + f" | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
