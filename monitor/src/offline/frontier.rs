//! The frontier of a detector family on a trace: one knob swept over a grid, each setting
//! replayed, and only the settings that no other beats on both detection time and false
//! suspicions kept (`monitor replay --frontier`, docs/tuning.md "The frontier").
//!
//! Which knob a family sweeps follows from its spec:
//! - `fixed:...`: `timeout_ms`, from 1.05x to 20x the trace's median interval, 60 points
//!   spaced geometrically;
//! - `phi:model=chen` and `phi:model=bertier` (a safety margin added to an expected arrival):
//!   `alpha_ms`, 0 and then 0.01x to 10x the median interval, 60 points in all, geometric
//!   after the 0;
//! - every other `phi:` model (accrual): `threshold`, 0.5 to 64, 60 points spaced
//!   geometrically;
//! - `budget:...`: the budget `ms`, over the grid of `fixed`'s timeout (a budget is a mean
//!   detection time, as a timeout is).
//!
//! Everything here is pure: the replays themselves are the caller's.

use serde::Serialize;

use super::{replay::ReplayReport, trace::Arrival};
use crate::detector::{model::DetectorParams, spec::parse_spec};

/// Points in every grid.
pub const GRID_POINTS: usize = 60;
/// Threshold grid of the accrual models: `THRESHOLD_RANGE.0..=THRESHOLD_RANGE.1`.
pub const THRESHOLD_RANGE: (f64, f64) = (0.5, 64.0);
/// Timeout grid of `fixed`, in multiples of the median interval.
pub const TIMEOUT_RANGE: (f64, f64) = (1.05, 20.0);
/// Non-zero part of the safety-margin grid of `chen` and `bertier`, in multiples of the
/// median interval (the grid starts at 0).
pub const ALPHA_RANGE: (f64, f64) = (0.01, 10.0);

/// The parameter a family sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// phi >= threshold: the accrual models.
    Threshold,
    /// silence >= timeout: `fixed`.
    TimeoutMs,
    /// The safety margin of Chen et al.'s and Bertier et al.'s estimators.
    AlphaMs,
    /// The mean detection budget of `budget`.
    BudgetMs,
}

impl Knob {
    /// The spec key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Knob::Threshold => "threshold",
            Knob::TimeoutMs => "timeout_ms",
            Knob::AlphaMs => "alpha_ms",
            Knob::BudgetMs => "ms",
        }
    }

    /// The knob of the family whose spec parsed to `params`, decided by the model's name so
    /// that models added later are swept without a change here.
    pub fn of(params: &DetectorParams) -> Knob {
        match params.model.name() {
            "fixed" => Knob::TimeoutMs,
            "chen" | "bertier" => Knob::AlphaMs,
            "budget" => Knob::BudgetMs,
            _ => Knob::Threshold,
        }
    }

    /// The grid of this knob for a trace whose median interval is `median_ms`, ascending.
    pub fn grid(self, median_ms: f64) -> Vec<f64> {
        match self {
            Knob::Threshold => geometric(THRESHOLD_RANGE.0, THRESHOLD_RANGE.1, GRID_POINTS),
            Knob::TimeoutMs | Knob::BudgetMs => geometric(
                TIMEOUT_RANGE.0 * median_ms,
                TIMEOUT_RANGE.1 * median_ms,
                GRID_POINTS,
            ),
            Knob::AlphaMs => std::iter::once(0.0)
                .chain(geometric(
                    ALPHA_RANGE.0 * median_ms,
                    ALPHA_RANGE.1 * median_ms,
                    GRID_POINTS - 1,
                ))
                .collect(),
        }
    }
}

/// `n` points from `lo` to `hi` (both included, 0 < lo < hi) with a constant ratio, each
/// rounded to 4 significant digits so that specs and tables stay readable.
pub fn geometric(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![round_sig(lo)];
    }
    let ratio = (hi / lo).ln() / (n - 1) as f64;
    (0..n)
        .map(|i| round_sig(lo * (ratio * i as f64).exp()))
        .collect()
}

fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(3 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// The spec of `family` with its knob set to `value`: the family's own setting of the knob,
/// if any, is overridden (a later key wins in `parse_spec`).
pub fn spec_with(family: &str, knob: Knob, value: f64) -> String {
    let family = family.trim();
    let sep = if !family.contains(':') {
        ":"
    } else if family.ends_with(':') {
        ""
    } else {
        ","
    };
    format!("{family}{sep}{}={value}", knob.key())
}

/// A family ready to sweep on one trace: every grid point parsed.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub family: String,
    pub knob: Knob,
    /// (knob value, parameters), in grid order.
    pub settings: Vec<(f64, DetectorParams)>,
}

/// Parses `family` and each of its grid points for a trace with median interval `median_ms`.
pub fn sweep(family: &str, median_ms: f64) -> Result<Sweep, String> {
    let knob = Knob::of(&parse_spec(family)?);
    let settings = knob
        .grid(median_ms)
        .into_iter()
        .map(|v| parse_spec(&spec_with(family, knob, v)).map(|p| (v, p)))
        .collect::<Result<_, _>>()?;
    Ok(Sweep {
        family: family.trim().to_string(),
        knob,
        settings,
    })
}

/// The median of the positive gaps between consecutive arrivals, ms; None with fewer than
/// two distinct arrival times.
pub fn median_interval_ms(trace: &[Arrival]) -> Option<f64> {
    let mut gaps: Vec<u64> = trace
        .windows(2)
        .map(|w| w[1].at_ns.saturating_sub(w[0].at_ns))
        .filter(|&g| g > 0)
        .collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    let n = gaps.len();
    let median = if n % 2 == 1 {
        gaps[n / 2] as f64
    } else {
        (gaps[n / 2 - 1] as f64 + gaps[n / 2] as f64) / 2.0
    };
    Some(median / 1e6)
}

/// False suspicions per hour of the time the sender was alive (`alive_ms`); 0 if it never was.
pub fn mistakes_per_hour(false_suspicions: u64, alive_ms: f64) -> f64 {
    if alive_ms <= 0.0 {
        0.0
    } else {
        false_suspicions as f64 / (alive_ms / 3_600_000.0)
    }
}

/// One setting of a family and how it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// The knob's value.
    pub value: f64,
    pub spec: String,
    /// Mean detection time over crash times (`ReplayReport::mean_detection_ms`): the axis the
    /// frontier is drawn on, as Chen, Toueg and Aguilera define T_D.
    pub detection_ms: f64,
    /// The 99th percentile of the detection time over crash times.
    pub p99_detection_ms: f64,
    /// Detection of the one crash at the end of the trace, to the tick.
    pub last_detection_ms: f64,
    pub false_suspicions: u64,
    pub mistake_ms: f64,
    pub query_accuracy: f64,
    pub mistakes_per_hour: f64,
}

impl Point {
    /// The point of a replay of the setting `value`; None if it never detected the crash
    /// (within the replay's tail) or would never detect one at some point of the trace, which
    /// puts it out of the frontier.
    pub fn of(value: f64, report: &ReplayReport, alive_ms: f64) -> Option<Point> {
        Some(Point {
            value,
            spec: report.spec.clone(),
            detection_ms: report.mean_detection_ms?,
            p99_detection_ms: report.p99_detection_ms?,
            last_detection_ms: report.detection_ms?,
            false_suspicions: report.false_suspicions,
            mistake_ms: report.mistake_ms,
            query_accuracy: report.query_accuracy,
            mistakes_per_hour: mistakes_per_hour(report.false_suspicions, alive_ms),
        })
    }

    /// Whether `self` is at least as good as `other` on both detection time and false
    /// suspicions and better on one.
    pub fn dominates(&self, other: &Point) -> bool {
        self.detection_ms <= other.detection_ms
            && self.false_suspicions <= other.false_suspicions
            && (self.detection_ms < other.detection_ms
                || self.false_suspicions < other.false_suspicions)
    }
}

/// The Pareto frontier of `points` over (detection_ms, false_suspicions), both lower better:
/// the points no other dominates. Of points equal on both, the one with the least
/// `mistake_ms` is kept (the first given, on a tie there too). Sorted by detection time, so
/// false suspicions strictly fall along it.
pub fn pareto(points: &[Point]) -> Vec<Point> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| {
        let (p, q) = (&points[a], &points[b]);
        p.detection_ms
            .total_cmp(&q.detection_ms)
            .then(p.false_suspicions.cmp(&q.false_suspicions))
            .then(p.mistake_ms.total_cmp(&q.mistake_ms))
            .then(a.cmp(&b))
    });
    let mut frontier: Vec<Point> = Vec::new();
    for i in order {
        let p = &points[i];
        // Everything before is at least as fast: only fewer mistakes earns a place.
        if frontier
            .last()
            .is_none_or(|best| p.false_suspicions < best.false_suspicions)
        {
            frontier.push(p.clone());
        }
    }
    frontier
}

/// Detection budgets (ms) the frontier is read at by default (`--budgets`): from the fastest
/// a 100 ms heartbeat allows to the slowest docs/tuning.md's defaults are judged over.
pub const DEFAULT_BUDGETS_MS: [f64; 7] = [150.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0];

/// The fewest false suspicions a family reaches within a detection budget: the last frontier
/// point (sorted by detection time, false suspicions falling) at or under `budget_ms`. None if
/// even the family's fastest setting is slower than the budget.
pub fn within_budget(frontier: &[Point], budget_ms: f64) -> Option<u64> {
    frontier
        .iter()
        .take_while(|p| p.detection_ms <= budget_ms)
        .last()
        .map(|p| p.false_suspicions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(value: f64, detection_ms: f64, false_suspicions: u64, mistake_ms: f64) -> Point {
        Point {
            value,
            spec: format!("fixed:timeout_ms={value}"),
            detection_ms,
            p99_detection_ms: detection_ms,
            last_detection_ms: detection_ms,
            false_suspicions,
            mistake_ms,
            query_accuracy: 1.0,
            mistakes_per_hour: 0.0,
        }
    }

    #[test]
    fn budgets_read_the_staircase() {
        let frontier = pareto(&[
            pt(1.0, 120.0, 9, 0.0),
            pt(2.0, 200.0, 4, 0.0),
            pt(3.0, 480.0, 0, 0.0),
        ]);
        assert_eq!(within_budget(&frontier, 100.0), None);
        assert_eq!(within_budget(&frontier, 120.0), Some(9));
        assert_eq!(within_budget(&frontier, 479.0), Some(4));
        assert_eq!(within_budget(&frontier, 1500.0), Some(0));
    }

    #[test]
    fn frontier_of_a_hand_built_set() {
        let points = vec![
            pt(1.0, 100.0, 10, 500.0),
            pt(2.0, 150.0, 12, 100.0), // slower and more mistakes than 1: dominated
            pt(3.0, 200.0, 4, 300.0),
            pt(4.0, 200.0, 4, 200.0), // ties 3 on both, fewer mistake_ms: kept instead
            pt(5.0, 200.0, 6, 0.0),   // as fast as 4, more mistakes: dominated
            pt(6.0, 300.0, 4, 0.0),   // slower than 4, no fewer mistakes: dominated
            pt(7.0, 400.0, 0, 0.0),
            pt(8.0, 500.0, 0, 0.0), // slower than 7 for nothing
            pt(9.0, 90.0, 20, 900.0),
        ];
        let kept: Vec<f64> = pareto(&points).iter().map(|p| p.value).collect();
        assert_eq!(kept, vec![9.0, 1.0, 4.0, 7.0]);
        let frontier = pareto(&points);
        for a in &frontier {
            for b in &frontier {
                assert!(!a.dominates(b), "{a:?} dominates {b:?}");
            }
        }
        // Every point left out is dominated by, or ties with, one kept.
        for p in &points {
            assert!(frontier.iter().any(|f| f == p
                || f.dominates(p)
                || (f.detection_ms == p.detection_ms && f.false_suspicions == p.false_suspicions)));
        }
        assert!(pareto(&[]).is_empty());
        // Identical points: the first one stays.
        let same = pareto(&[pt(1.0, 5.0, 0, 0.0), pt(2.0, 5.0, 0, 0.0)]);
        assert_eq!(same.len(), 1);
        assert_eq!(same[0].value, 1.0);
    }

    #[test]
    fn grids_ascend_and_span_their_ranges() {
        for (knob, median) in [
            (Knob::Threshold, 100.0),
            (Knob::TimeoutMs, 100.0),
            (Knob::TimeoutMs, 3.7),
            (Knob::AlphaMs, 100.0),
            (Knob::AlphaMs, 1000.0),
            (Knob::BudgetMs, 100.0),
        ] {
            let grid = knob.grid(median);
            assert_eq!(grid.len(), GRID_POINTS, "{knob:?}");
            assert!(
                grid.windows(2).all(|w| w[0] < w[1]),
                "{knob:?} not strictly ascending: {grid:?}"
            );
            let (lo, hi) = match knob {
                Knob::Threshold => THRESHOLD_RANGE,
                Knob::TimeoutMs | Knob::BudgetMs => {
                    (TIMEOUT_RANGE.0 * median, TIMEOUT_RANGE.1 * median)
                }
                Knob::AlphaMs => (0.0, ALPHA_RANGE.1 * median),
            };
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs().max(1e-9);
            assert!(close(grid[0], lo), "{knob:?}: {} vs {lo}", grid[0]);
            assert!(close(grid[GRID_POINTS - 1], hi), "{knob:?}");
        }
        assert_eq!(Knob::AlphaMs.grid(100.0)[0], 0.0);
        // Geometric: consecutive ratios all about the same.
        let g = Knob::Threshold.grid(0.0);
        let r: Vec<f64> = g.windows(2).map(|w| w[1] / w[0]).collect();
        assert!(r.iter().all(|x| (x / r[0] - 1.0).abs() < 0.01), "{r:?}");
    }

    #[test]
    fn knob_and_spec_follow_the_family() {
        for (family, knob, expected) in [
            ("fixed", Knob::TimeoutMs, "fixed:timeout_ms=250"),
            ("fixed:", Knob::TimeoutMs, "fixed:timeout_ms=250"),
            ("phi", Knob::Threshold, "phi:threshold=250"),
            ("budget", Knob::BudgetMs, "budget:ms=250"),
            (
                "phi:model=akka,threshold=3",
                Knob::Threshold,
                "phi:model=akka,threshold=3,threshold=250",
            ),
        ] {
            assert_eq!(Knob::of(&parse_spec(family).unwrap()), knob, "{family}");
            assert_eq!(spec_with(family, knob, 250.0), expected);
        }
        // The swept value overrides the family's.
        let s = sweep("phi:model=akka,threshold=3", 100.0).unwrap();
        assert_eq!(s.settings[0].1.threshold, THRESHOLD_RANGE.0);
        let f = sweep("fixed", 100.0).unwrap();
        assert_eq!(f.knob, Knob::TimeoutMs);
        assert_eq!(f.settings[0].1.timeout_ms, 105.0);
        let b = sweep("budget:threshold=3", 100.0).unwrap();
        assert_eq!(
            (b.settings[0].1.budget_ms, b.settings[0].1.threshold),
            (105.0, 3.0)
        );
        assert!(sweep("phi:model=gauss", 100.0).is_err());
    }

    #[test]
    fn median_and_rate() {
        let at = |ms: &[u64]| -> Vec<Arrival> {
            ms.iter()
                .map(|&m| Arrival {
                    at_ns: m * 1_000_000,
                    seq: 0,
                    incarnation: 1,
                })
                .collect()
        };
        assert_eq!(median_interval_ms(&at(&[100, 200, 300, 900])), Some(100.0));
        assert_eq!(median_interval_ms(&at(&[100, 200, 400, 700])), Some(200.0));
        assert_eq!(median_interval_ms(&at(&[0, 10, 10, 40])), Some(20.0));
        assert_eq!(median_interval_ms(&at(&[5])), None);
        assert_eq!(mistakes_per_hour(3, 1_800_000.0), 6.0);
        assert_eq!(mistakes_per_hour(3, 0.0), 0.0);
    }
}
