#!/usr/bin/env python3
"""A lower bound on the false suspicions of any detector on generated bursty-loss traces.

`monitor replay --generate bursty` (monitor/src/offline/generate.rs, TraceKind::Bursty) sends
heartbeat `s` at INTERVAL * s ms and delivers it at that time plus JITTER * N(0, 1) ms, drawn
independently for each heartbeat, unless a Gilbert-Elliott chain loses it. The chain moves
before each heartbeat (good -> bad 1%, bad -> good 10%, starting good) and then loses the
heartbeat with 0.1% (good) or 40% (bad). A detector that knows all of this and reads the
sequence numbers knows, after each accepted heartbeat i (sequence s_i, arrival a_i):

- b_i, the probability that the chain was bad at s_i (a forward filter over the losses seen);
- the distribution of K, the heartbeats lost before the next arrival, which is linear in b_i;
- that the next arrival is at INTERVAL * (s_i + K + 1) + JITTER * N(0, 1): anchored on the
  schedule, so its deviation does not grow with K, and offset from a_i by u_i = a_i -
  INTERVAL * s_i, this heartbeat's own jitter, which it has seen.

So it knows S_i(t), the probability that a live peer is still silent t ms after a_i. A
detector that suspects after d_i ms makes a mistake after heartbeat i with probability
S_i(d_i) (in continuous time), and its mean detection time over crash times is the mean of
the d_i (how `monitor replay --frontier` scores a family). The fewest expected mistakes at a
mean budget B, over every detector, allowed to randomise (to give a longer deadline to a
fraction of the heartbeats that share one state), is the lower convex hull, whose value is,
by Lagrangian duality,

    bound(B) = max over lambda >= 0 of  sum_i min_{d >= 0} (S_i(d) + lambda d) - lambda n B.

Any lambda gives a lower bound (weak duality), so a finite grid of lambdas errs low.

Families and bound are scored at the same tick, by default 0: continuous time (`monitor
replay --tick-ms 0`). At a tick h > 0 a suspicion is seen at the first tick at or after
a_i + d_i, a mistake if the next heartbeat comes after it, so its chance is at least
S_i(d_i + h): the bound at tick h uses S_i(d + h), a valid but loose bound (with 2 ms of
jitter, a 10 ms tick is worth more than the foot of each step). The families'
mean detection time averages over every accepted heartbeat, the last one (the crash) too; the
bound's mean is over the heartbeats that have a next one, with the budget scaled by n/(n-1),
which errs low again. Beliefs are rounded down onto a grid with a ratio of BELIEF_STEP (S is
linear and increasing in the belief), so that the per-state minima are computed once per
grid point: lower again, by well under 1%.

The script prints, per budget: the bound (expected mistakes); the pure Lagrangian policy
mixed to meet the budget exactly, its expected mistakes at the tick and what it realized on
the traces (the check that the model is the generator: they agree within Poisson error);
and each family's fewest realized false suspicions within the budget (`monitor replay
--frontier` on the same traces at the same tick: every heartbeat of every trace pooled into
one count per setting, so one setting is scored on all of them), with its p99 of the
detection time over crash times. A family below the bound by more than its Poisson error
means the bound is wrong; the script says so and exits 1.

With `--budget-detector` it also replays `-d budget:ms=B` at every budget B on the same
traces and prints its false suspicions against the bound at its own mean detection time. With
`--threshold` (continuous time only) it prints the best a threshold on phi can do knowing all
the bound knows (class Threshold): a deadline where each heartbeat's own survival falls to one
level, the level that meets the budget. That is the cost of a single level across states,
against the hull's allocation.

Usage: docs/frontier/gilbert_bound.py MONITOR [--seeds 1-30] [--count 20000] [--tick-ms 0]
       [--budgets 200,250,...] [-d FAMILY ...] [--budget-detector] [--threshold] [--json]
Standard library only.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# generate.rs, TraceKind::Bursty.
INTERVAL, JITTER = 100.0, 2.0
LOSS_GOOD, GOOD_TO_BAD, LOSS_BAD, BAD_TO_GOOD = 0.001, 0.01, 0.40, 0.10
# Terms of K kept: P(K >= 80) < 0.4^80, dropped (which lowers S, so the bound).
K_TERMS = 80
BELIEF_STEP = 1.005
LAMBDAS = [10 ** (-2.0 - 7.0 * j / 199) for j in range(200)]  # 1e-2 down to 1e-9
BUDGETS = [200, 250, 300, 350, 400, 450, 500]
FAMILIES = ["fixed", "phi", "phi:model=akka", "phi:model=exponential", "phi:model=loss",
            "phi:model=chen", "phi:model=bertier", "phi:model=empirical", "phi:model=2w"]
SQRT2PI = math.sqrt(2.0 * math.pi)


def q(z):
    """P(N(0, 1) > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def predict(bad):
    return bad * (1 - BAD_TO_GOOD) + (1 - bad) * GOOD_TO_BAD


def observe(bad, lost):
    pb = bad * (LOSS_BAD if lost else 1 - LOSS_BAD)
    pg = (1 - bad) * (LOSS_GOOD if lost else 1 - LOSS_GOOD)
    return pb / (pb + pg)


def lost_weights(bad):
    """P(K = k), k < K_TERMS, for a chain bad with probability `bad` at the last arrival."""
    out, mass = [], 1.0
    for _ in range(K_TERMS):
        ahead = predict(bad)
        lost = ahead * LOSS_BAD + (1 - ahead) * LOSS_GOOD
        out.append(mass * (1 - lost))
        mass *= lost
        bad = ahead * LOSS_BAD / lost
    return out


# P(K = k | b) = b W_BAD[k] + (1 - b) W_GOOD[k]: the future depends on the past only through
# the state at the last arrival.
W_BAD, W_GOOD = lost_weights(1.0), lost_weights(0.0)


def weights(b):
    return [b * x + (1 - b) * y for x, y in zip(W_BAD, W_GOOD)]


# P(K >= k) from each state.
TAIL_BAD = [sum(W_BAD[k:]) for k in range(K_TERMS + 1)]
TAIL_GOOD = [sum(W_GOOD[k:]) for k in range(K_TERMS + 1)]


def survival(x, b, jitter=JITTER):
    """F(x) = P(INTERVAL (K+1) + JITTER Z > x) for belief b: S_i(t) = F(t + u_i). Steps more
    than 40 deviations below x count 0, those more than 40 above count whole. `jitter` is the
    deviation of the arrival about its step (JITTER: the schedule's; JITTER sqrt 2 for a
    detector that measures from the last arrival without knowing its own offset)."""
    total = 0.0
    for k in range(max(0, int((x - 40 * jitter) / INTERVAL) - 1), K_TERMS):
        z = (x - INTERVAL * (k + 1)) / jitter
        if z < -40:
            return total + b * TAIL_BAD[k] + (1 - b) * TAIL_GOOD[k]
        total += (b * W_BAD[k] + (1 - b) * W_GOOD[k]) * q(z)
    return total


def belief_floor(b):
    if b <= 1e-12:
        return 0.0
    return BELIEF_STEP ** math.floor(math.log(b) / math.log(BELIEF_STEP))


def best_x(w, lam):
    """min over x of F(x) + lam x, away from x's lower end: (value, x). Near step k (the
    arrival after k losses) F is w_k Q((x - c_k)/JITTER) plus the later steps' mass, so the
    minimum there is where w_k phi(z) / JITTER = lam, z > 0; between steps F is flat and x
    only costs. Steps too small for that point to exist are never worth waiting for."""
    best, arg = math.inf, None
    later, least = 1.0, lam * JITTER * SQRT2PI
    for k, wk in enumerate(w):
        if later <= least:
            break  # no later step is large enough
        later -= wk
        ratio = wk / least
        if ratio > 1.0:
            z = math.sqrt(2.0 * math.log(ratio))
            x = INTERVAL * (k + 1) + JITTER * z
            v = max(later, 0.0) + wk * q(z) + lam * x
            if v < best:
                best, arg = v, x
    return best, arg


def read_trace(path):
    """(arrival ms, sequence) of the accepted heartbeats: sequence numbers rising."""
    out, last = [], 0
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split()
        t, s = float(f[0]), int(f[1])
        if s > last:
            out.append((t, s))
            last = s
    return out


def heartbeats(path, count):
    """Per accepted heartbeat with a next one: (belief, u, arrival, next arrival). The chain
    starts good at every `count` heartbeats (where one seed's trace ends and the next
    begins)."""
    arrivals = read_trace(path)
    rows, bad, seq = [], 0.0, 0
    for i, (t, s) in enumerate(arrivals):
        while seq < s:
            seq += 1
            if (seq - 1) % count == 0:
                bad = 0.0
            bad = observe(predict(bad), seq < s)
        if i + 1 < len(arrivals):
            rows.append((bad, t - INTERVAL * s, t, arrivals[i + 1][0]))
    return rows, len(arrivals)


def ceil_tick(t, h):
    return t if h <= 0 else math.ceil(t / h - 1e-12) * h


class Bound:
    def __init__(self, rows, accepted, tick):
        self.rows, self.tick = rows, tick
        self.scale = accepted  # the families divide by every accepted heartbeat
        bins = {}
        for b, u, _, _ in rows:
            bins.setdefault(belief_floor(b), []).append(u)
        # Per belief grid point and lambda: the best (value, x) past the lower end.
        self.table = {lo: [best_x(weights(lo), lam) for lam in LAMBDAS] for lo in bins}
        self.dual = []  # per lambda: (sum of the per-heartbeat minima, their deadlines' sum)
        for j, lam in enumerate(LAMBDAS):
            total, cost = 0.0, 0.0
            for lo, us in bins.items():
                g, x = self.table[lo][j]
                if x is not None and x - tick - max(us) >= 0 and g - lam * (tick + min(us)) < 1.0:
                    total += len(us) * (g - lam * tick) - lam * sum(us)
                    cost += len(us) * (x - tick) - sum(us)
                    continue
                for u in us:
                    # d = x - tick - u >= 0, or suspect at once (d = 0: a mistake for sure).
                    ok = x is not None and x - tick - u >= 0
                    v = g - lam * (tick + u) if ok else math.inf
                    if v < 1.0:
                        total += v
                        cost += x - tick - u
                    else:
                        total += 1.0
            self.dual.append((total, cost))

    def value(self, budget):
        """max over lambda of the dual at the budget, and the lambda index it is at."""
        return max((t - lam * self.scale * budget, j)
                   for j, (lam, (t, _)) in enumerate(zip(LAMBDAS, self.dual)))

    def policy(self, j):
        """The pure policy at LAMBDAS[j] on the traces at the tick: (mean detection ms,
        expected mistakes, realized mistakes)."""
        cost, expected, realized = 0.0, 0.0, 0
        lam = LAMBDAS[j]
        for b, u, a, nxt in self.rows:
            g, x = self.table[belief_floor(b)][j]
            ok = x is not None and x - self.tick - u >= 0 and g - lam * (self.tick + u) < 1.0
            d = x - self.tick - u if ok else 0.0
            seen = ceil_tick(a + d, self.tick)
            cost += d
            expected += survival(seen - a + u, b) if ok else 1.0
            realized += nxt > seen
        return cost / self.scale, expected, realized

    def mixed(self, budget):
        """The two pure policies around the budget, mixed to meet it exactly."""
        costs = [c / self.scale for _, c in self.dual]
        below = [j for j, c in enumerate(costs) if c <= budget]
        above = [j for j, c in enumerate(costs) if c > budget]
        if not below or not above:
            return None
        lo = self.policy(max(below, key=lambda j: costs[j]))
        hi = self.policy(min(above, key=lambda j: costs[j]))
        f = (budget - lo[0]) / (hi[0] - lo[0])
        return tuple(x + f * (y - x) for x, y in zip(lo[1:], hi[1:]))


class Threshold:
    """The best a threshold on phi can do knowing the chain and its state: every heartbeat's
    deadline where its own survival falls to 10^-level (phi = -log10 S_i(t) reaching one
    level), the level set so that the mean deadline meets the budget. Against the bound this
    is the cost of one level for every state instead of a deadline allocated across them
    (the bound gives a heartbeat in a bad spell a shorter deadline than its survival asks
    for when waiting there is dear). With `anchored` False the detector also does not know
    its heartbeat's offset from the schedule and measures from the arrival (the gap's
    deviation JITTER sqrt 2): what anchoring on the schedule is worth. Continuous time."""

    def __init__(self, rows, accepted, anchored=True):
        self.rows, self.scale, self.anchored = rows, accepted, anchored
        self.jitter = JITTER if anchored else JITTER * math.sqrt(2.0)
        self.bins = {}
        for b, u, _, _ in rows:
            self.bins.setdefault(belief_floor(b), []).append(u if anchored else 0.0)
        self.sums = {lo: (len(us), sum(us)) for lo, us in self.bins.items()}

    def quantile(self, lo, target):
        """The x at which the survival for belief `lo` falls to `target`."""
        a, b = 0.0, INTERVAL * (K_TERMS + 1)
        for _ in range(60):
            m = 0.5 * (a + b)
            if survival(m, lo, self.jitter) > target:
                a = m
            else:
                b = m
        return b

    def mean(self, level):
        target, total = 10.0 ** -level, 0.0
        for lo, (n, su) in self.sums.items():
            total += n * self.quantile(lo, target) - su
        return total / self.scale

    def at(self, budget):
        """(level, expected mistakes, realized mistakes) with the mean deadline at `budget`."""
        a, b = 0.0, 16.0
        for _ in range(40):
            m = 0.5 * (a + b)
            if self.mean(m) < budget:
                a = m
            else:
                b = m
        level, target = a, 10.0 ** -a
        xs = {lo: self.quantile(lo, target) for lo in self.bins}
        expected, realized = 0.0, 0
        for b_, u, t, nxt in self.rows:
            x = xs[belief_floor(b_)]
            d = x - (u if self.anchored else 0.0)
            expected += survival(x, b_, self.jitter)
            realized += nxt > t + max(d, 0.0)
        return level, expected, realized


def families(monitor, path, names, tick, budgets):
    args = [monitor, "replay", path, "--frontier", "--json", "--tick-ms", str(tick),
            "--budgets", ",".join(str(b) for b in budgets)]
    for fam in names:
        args += ["-d", fam]
    report = json.loads(subprocess.run(args, capture_output=True, check=True).stdout)
    out = {}
    for fam in report["traces"][0]["families"]:
        out[fam["family"]] = [(p["detection_ms"], p["false_suspicions"],
                               p.get("p99_detection_ms")) for p in fam["points"]]
    return out


def budget_detector(monitor, path, tick, budget):
    """`-d budget:ms=B` on the trace: (false suspicions, mean detection ms, p99 ms)."""
    args = [monitor, "replay", path, "--json", "--tick-ms", str(tick), "-d", f"budget:ms={budget:g}"]
    d = json.loads(subprocess.run(args, capture_output=True, check=True).stdout)["detectors"][0]
    return d["false_suspicions"], d["mean_detection_ms"], d["p99_detection_ms"]


def fewest(points, budget):
    within = [(f, p99, d) for d, f, p99 in points if d <= budget]
    return min(within, key=lambda x: (x[0], x[2])) if within else None


def plot(result, seeds, count, accepted):
    """An SVG of every detector's mistakes over the bound's at the same mean detection time,
    against the budget: the bound is the line at 1, the target the dashed line at 1.25."""
    series = []  # (name, colour, [(budget, ratio)])
    def ratios(get):
        return [(r["budget_ms"], v) for r in result for v in [get(r)] if v is not None]
    series.append(("budget detector (-d budget:ms=B), at its own mean", "#1f77b4", ratios(
        lambda r: r.get("budget_detector") and r["budget_detector"]["false_suspicions"]
        / r["budget_detector"]["bound_at_mean"])))
    series.append(("best threshold on phi, knowing the chain (expected)", "#d62728", ratios(
        lambda r: r.get("threshold_anchored") and r["bound"] > 0
        and r["threshold_anchored"]["expected"] / r["bound"])))
    families = sorted({fam for r in result for fam in r["families"]})
    palette = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
               "#ff7f0e", "#aec7e8"]
    for fam, colour in zip(families, palette):
        series.append((fam, colour, ratios(
            lambda r, fam=fam: r["families"].get(fam) and r["bound"] > 0
            and r["families"][fam]["false_suspicions"] / r["bound"])))
    series = [s for s in series if s[2]]
    budgets = [r["budget_ms"] for r in result]
    x0, x1 = min(budgets), max(budgets)
    if x1 == x0:
        x1 = x0 + 1
    top = max([1.3] + [v for _, _, pts in series for _, v in pts])
    y0, y1 = 0.9, math.ceil(top * 10) / 10
    w, h, left, right, up, down = 720, 420, 60, 20, 30, 50 + 16 * len(series)
    X = lambda b: left + (b - x0) / (x1 - x0) * (w - left - right)
    Y = lambda v: up + (y1 - min(max(v, y0), y1)) / (y1 - y0) * (h - up - down)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18">Gilbert-Elliott traces, seeds {seeds[0]}-{seeds[-1]}, '
           f'{count} heartbeats each ({accepted} accepted): mistakes / the bound\'s</text>']
    step = 0.1 if y1 - y0 <= 1.2 else 0.25
    v = y0
    while v <= y1 + 1e-9:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                   f'stroke="#eee"/><text x="{left - 6}" y="{Y(v) + 4:.1f}" '
                   f'text-anchor="end">{v:.2f}x</text>')
        v += step
    for b in budgets:
        out.append(f'<text x="{X(b):.1f}" y="{h - down + 16}" text-anchor="middle">'
                   f'{b:g}</text>')
    out.append(f'<text x="{(left + w - right) / 2:.0f}" y="{h - down + 32}" '
               f'text-anchor="middle">mean detection budget, ms</text>')
    for v, dash, label in [(1.0, "", "the bound"), (1.25, "6,4", "target 1.25x")]:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                   f'stroke="black" stroke-dasharray="{dash}"/>'
                   f'<text x="{w - right - 4}" y="{Y(v) - 4:.1f}" text-anchor="end">{label}</text>')
    for i, (name, colour, pts) in enumerate(series):
        path = " ".join(f"{X(b):.1f},{Y(v):.1f}" for b, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{X(b):.1f}" cy="{Y(v):.1f}" r="3" fill="{colour}"/>'
                for b, v in pts]
        ly = h - down + 48 + 16 * i
        out.append(f'<line x1="{left}" x2="{left + 24}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="2"/><text x="{left + 30}" y="{ly}">'
                   f'{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def seeds_of(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("monitor", help="the monitor binary (target/release/monitor)")
    ap.add_argument("--seeds", default="1-30", help="seeds of the generated traces: 1-30 or 1,2,5")
    ap.add_argument("--count", type=int, default=20000, help="heartbeats sent per trace")
    ap.add_argument("--tick-ms", type=float, default=0.0,
                    help="replay's tick for families and bound alike; 0 (default): continuous time")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="mean detection budgets, ms")
    ap.add_argument("-d", dest="families", action="append", help="a family (default: the nine)")
    ap.add_argument("--no-families", action="store_true", help="the bound only, no replay")
    ap.add_argument("--json", action="store_true", help="print JSON, not a table")
    ap.add_argument("--budget-detector", action="store_true",
                    help="also `-d budget:ms=B` at every budget B, against the bound at B and "
                         "at the detector's own mean")
    ap.add_argument("--svg", metavar="FILE",
                    help="also draw each detector's mistakes as a multiple of the bound against "
                         "the budget, with the 1.25x target, into FILE")
    ap.add_argument("--threshold", action="store_true",
                    help="also the best threshold on phi knowing the chain (Threshold), "
                         "anchored on the schedule and not; continuous time only")
    args = ap.parse_args()
    seeds = seeds_of(args.seeds)
    budgets = [float(b) for b in args.budgets.split(",")]
    names = [] if args.no_families else (args.families or FAMILIES)

    with tempfile.TemporaryDirectory() as tmp:
        # One trace of every seed's heartbeats after one another, so that each family setting
        # is scored once on all of them: each seed's trace is shifted past the previous one's
        # end by one interval and numbered on, which the chain and the schedule do not notice
        # beyond one heartbeat at each seam (its jitter and the chain's state carry over).
        path = os.path.join(tmp, "bursty.trace")
        with open(path, "w") as f:
            f.write(f"# bursty seeds {args.seeds}, {args.count} heartbeats each, concatenated\n")
            for n, seed in enumerate(seeds):
                text = subprocess.run([args.monitor, "replay", "--generate", "bursty", "--count",
                                       str(args.count), "--seed", str(seed)],
                                      capture_output=True, check=True, text=True).stdout
                offset_seq = n * args.count
                for line in text.splitlines():
                    if not line.strip() or line.startswith("#"):
                        continue
                    t, s, _ = line.split()
                    f.write(f"{float(t) + INTERVAL * offset_seq:.6f} {int(s) + offset_seq} 1\n")
        rows, accepted = heartbeats(path, args.count)
        bound = Bound(rows, accepted, args.tick_ms)
        curves = families(args.monitor, path, names, args.tick_ms, budgets) if names else {}
        budgeted = ({b: budget_detector(args.monitor, path, args.tick_ms, b) for b in budgets}
                    if args.budget_detector else {})
        thresholds = []
        if args.threshold:
            if args.tick_ms > 0:
                sys.exit("--threshold is computed in continuous time: give --tick-ms 0")
            thresholds = [Threshold(rows, accepted, True), Threshold(rows, accepted, False)]

    result = []
    for b in budgets:
        value, j = bound.value(b)
        mix = bound.mixed(b)
        row = {"budget_ms": b, "bound": value, "lambda": LAMBDAS[j],
               "policy_expected": mix and mix[0], "policy_realized": mix and mix[1],
               "families": {}}
        if b in budgeted:
            fs, mean, p99 = budgeted[b]
            row["budget_detector"] = {"false_suspicions": fs, "mean_detection_ms": mean,
                                      "p99_detection_ms": p99,
                                      "bound_at_mean": bound.value(mean)[0]}
        for name, th in zip(["threshold_anchored", "threshold_from_arrival"], thresholds):
            level, expected, realized = th.at(b)
            row[name] = {"level": level, "expected": expected, "realized": realized}
        for fam, points in curves.items():
            best = fewest(points, b)
            row["families"][fam] = None if best is None else {
                "false_suspicions": best[0], "p99_detection_ms": best[1], "detection_ms": best[2]}
        result.append(row)

    if args.svg:
        with open(args.svg, "w") as f:
            f.write(plot(result, seeds, args.count, accepted))
    wrong = [(r["budget_ms"], fam, v["false_suspicions"]) for r in result
             for fam, v in r["families"].items()
             if v and v["false_suspicions"] < r["bound"] - 2.0 * math.sqrt(max(r["bound"], 1.0))]
    if args.json:
        print(json.dumps({"seeds": seeds, "count": args.count, "tick_ms": args.tick_ms,
                          "accepted": accepted, "budgets": result, "below_bound": wrong}, indent=1))
    else:
        print(f"Generated bursty traces, seeds {args.seeds}, {args.count} heartbeats each "
              f"({accepted} accepted), tick {args.tick_ms:g} ms.\n")
        print("| budget | bound (expected) | policy expected | policy realized | "
              + " | ".join(curves) + " |")
        print("|---:|---:|---:|---:|" + "---:|" * len(curves))
        for r in result:
            pe, pr = r["policy_expected"], r["policy_realized"]
            cells = []
            for fam in curves:
                v = r["families"][fam]
                cells.append("-" if v is None else f"{v['false_suspicions']}"
                             + (f" ({v['false_suspicions'] / r['bound']:.2f}x)" if r["bound"] > 0 else ""))
            print(f"| {r['budget_ms']:g} ms | {r['bound']:.1f} | "
                  + ("-" if pe is None else f"{pe:.1f}") + " | "
                  + ("-" if pr is None else f"{pr:.1f}") + " | " + " | ".join(cells) + " |")
        if budgeted:
            print("\nThe budget detector (`-d budget:ms=B`): false suspicions, its mean "
                  "detection time, the bound there and the ratio; p99 / mean:\n")
            print("| budget | false suspicions | mean | bound at the mean | ratio | p99 / mean |")
            print("|---:|---:|---:|---:|---:|---:|")
            for r in result:
                v = r.get("budget_detector")
                if v:
                    print(f"| {r['budget_ms']:g} ms | {v['false_suspicions']} | "
                          f"{v['mean_detection_ms']:.1f} ms | {v['bound_at_mean']:.1f} | "
                          f"{v['false_suspicions'] / v['bound_at_mean']:.2f}x | "
                          f"{v['p99_detection_ms'] / v['mean_detection_ms']:.2f} |")
        if thresholds:
            print("\nThe best threshold on phi knowing the chain and its state (expected / "
                  "realized, the level, the ratio of expected to the bound): anchored on the "
                  "schedule; measured from the arrival:\n")
            print("| budget | bound | anchored | from the arrival |")
            print("|---:|---:|---:|---:|")
            for r in result:
                cells = [f"{r[k]['expected']:.1f} / {r[k]['realized']} (level {r[k]['level']:.2f}; "
                         f"{r[k]['expected'] / r['bound']:.2f}x)"
                         for k in ("threshold_anchored", "threshold_from_arrival")]
                print(f"| {r['budget_ms']:g} ms | {r['bound']:.1f} | " + " | ".join(cells) + " |")
        if curves:
            print("\np99 of the detection time over crash times / mean, at those points:")
            for r in result:
                print(f"  {r['budget_ms']:g} ms: " + ", ".join(
                    f"{fam} {v['p99_detection_ms'] / v['detection_ms']:.2f}"
                    for fam, v in r["families"].items() if v and v["p99_detection_ms"]))
    if wrong:
        print(f"\nBELOW THE BOUND (the bound is wrong): {wrong}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
