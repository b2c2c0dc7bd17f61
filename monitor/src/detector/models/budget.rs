//! `budget`: a mean detection budget B (ms), met per peer from its own window with the fewest
//! expected mistakes (Chen, Toueg and Aguilera 2002 configure a detector from a QoS
//! requirement; this does it on every estimate refresh, per peer).
//!
//! The rules it chooses among are deadlines after the last heartbeat,
//!
//!   d(lambda) = B - lambda o_n,   lambda in {0, 1/4, 1/2, 3/4, 1}
//!
//! where o_n is the last arrival's offset from the sending schedule: the residual of a least
//! squares line through the window's arrivals (A_j against j; its slope is the period, as
//! Chen's expected arrival takes the window's mean interval for it). lambda = 0 is a plain
//! timeout of B; lambda = 1 anchors the deadline on the schedule (a late last heartbeat brings
//! the deadline closer, an early one pushes it out), which is Chen's NFD-E with its margin set
//! to the budget; the ones between follow a delay that persists only partly. The residuals sum
//! to zero over the window, so every rule's deadline averages B over the window's heartbeats:
//! each meets the budget as a mean detection time (the silence after a heartbeat at which the
//! peer would be convicted, had it crashed right then, averaged over heartbeats).
//!
//! Each rule's mistakes are counted on the window: heartbeat j would have been a mistake if
//! its interval was longer than the deadline after heartbeat j - 1, that is if
//! s_j(lambda) = x_j + lambda o_{j-1} > B. The rule with the fewest is chosen; of rules with
//! as many, the one whose s has the least deviation (the fewest mistakes in expectation,
//! beyond what the window saw), then the lowest lambda. With independent delays the deviation
//! of s is least at lambda = 1 (offsets, not their differences); with a delay that persists
//! (a queue), at lambda = 0.
//!
//! phi keeps the levels' order and puts the deadline at the top level (the `threshold`, the
//! agent's highest level): with u = t + lambda o_n the silence anchored as the rule anchors
//! it, m and s the mean and deviation (floored by `min_std_ms`) of the s_j,
//!
//!   phi(t) = top * normal_phi((u - m) / s) / normal_phi((B - m) / s)
//!
//! so phi = top exactly at the deadline, and a lower level at the silence where the normal
//! phi of the anchored silence is that fraction of its value at the deadline. (Where the
//! budget is less than one deviation above m the curve is moved so that it is one: the
//! deadline stays where the budget puts it.)

use super::{ModelInfo, ModelSpec, PhiModel, SpecKey, WindowNeeds, WindowView};
use crate::detector::{
    model::{DetectorParams, Estimate, Shape},
    tail,
};

use monitor_common::maps::MAX_INTERVAL_US;

/// The anchor weights the choice is among, lowest first (the tie-break order).
pub const ANCHORS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Intervals a window needs before a rule other than the plain timeout is considered: a
/// line through fewer arrivals says nothing of the schedule.
pub const MIN_INTERVALS: usize = 8;

/// The longest budget: a deadline past the longest interval a window holds could never be
/// learned from one.
pub const MAX_BUDGET_MS: f64 = MAX_INTERVAL_US as f64 / 1000.0;

/// The budget when a spec names none.
pub const DEFAULT_BUDGET_MS: f64 = 500.0;

/// Checks a budget: positive, finite, at most [`MAX_BUDGET_MS`].
pub fn check_budget_ms(ms: f64) -> Result<f64, String> {
    if !ms.is_finite() || ms < 1.0 {
        return Err(format!(
            "a detection budget must be at least 1 ms, got {ms} ms"
        ));
    }
    if ms > MAX_BUDGET_MS {
        return Err(format!(
            "a detection budget of {ms} ms is longer than the longest interval a window holds \
             ({MAX_BUDGET_MS} ms)"
        ));
    }
    Ok(ms)
}

/// The rule chosen for one window, and the phi curve around its deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetRule {
    /// lambda: 0 a timeout from the last arrival, 1 anchored on the schedule.
    pub anchor: f64,
    /// Silence after the last arrival at which phi reaches `top`: the deadline.
    pub deadline_ms: f64,
    /// Heartbeats of the window the rule would have suspected wrongly.
    pub mistakes: u32,
    /// The curve: phi(t) = top * normal_phi((t - center) / scale) / top_phi.
    pub center_ms: f64,
    pub scale_ms: f64,
    pub top: f64,
    top_phi: f64,
}

impl BudgetRule {
    /// phi after `silence_ms` without a heartbeat.
    pub fn phi(&self, silence_ms: f64) -> f64 {
        if silence_ms == self.deadline_ms {
            return self.top;
        }
        let z = (silence_ms - self.center_ms) / self.scale_ms;
        (self.top * tail::normal_phi(z) / self.top_phi).max(0.0)
    }

    /// The least silence (ms) at which phi reaches `level`: the deadline itself for the top
    /// level, else the normal tail inverted and nudged up to the first float that reaches it.
    pub fn crossing_ms(&self, level: f64) -> f64 {
        if level == self.top {
            return self.deadline_ms;
        }
        if level <= 0.0 {
            return 0.0;
        }
        let z = tail::invert(tail::normal_phi, level * self.top_phi / self.top);
        let mut t = (self.center_ms + z * self.scale_ms).max(0.0);
        if !t.is_finite() {
            return t;
        }
        // The bisection's answer may sit a rounding either side of the level.
        while t > 0.0 && self.phi(t.next_down()) >= level {
            t = t.next_down();
        }
        while self.phi(t) < level {
            t = t.next_up();
        }
        t
    }
}

/// The rule for a window of intervals (ms, oldest first, every one between consecutive
/// heartbeats), a budget and a floor under the curve's scale, with phi `top` at the deadline.
pub fn choose(intervals_ms: &[f64], budget_ms: f64, min_std_ms: f64, top: f64) -> BudgetRule {
    let n = intervals_ms.len();
    // The offsets o_0..o_n of the arrivals from the least squares line A_j = a + b j.
    let offsets = (n >= MIN_INTERVALS).then(|| schedule_offsets(intervals_ms));
    let mut best: Option<(u32, f64, f64, f64)> = None; // (mistakes, std, anchor, mean)
    for &anchor in &ANCHORS {
        if anchor > 0.0 && offsets.is_none() {
            break;
        }
        let s = |j: usize| intervals_ms[j] + offsets.as_ref().map_or(0.0, |o| anchor * o[j]);
        let (mut mistakes, mut sum, mut sum_sq) = (0u32, 0.0, 0.0);
        for j in 0..n {
            let v = s(j);
            mistakes += (v > budget_ms) as u32;
            sum += v;
            sum_sq += v * v;
        }
        let (mean, std) = if n == 0 {
            (budget_ms, 0.0)
        } else {
            let mean = sum / n as f64;
            (mean, (sum_sq / n as f64 - mean * mean).max(0.0).sqrt())
        };
        let better = best.is_none_or(|(m, sd, _, _)| mistakes < m || (mistakes == m && std < sd));
        if better {
            best = Some((mistakes, std, anchor, mean));
        }
    }
    let (mistakes, std, anchor, mean) = best.expect("the timeout is always a candidate");
    // The last arrival's offset (o_n), by which the rule moves the deadline.
    let shift = offsets.as_ref().map_or(0.0, |o| anchor * o[n]);
    let deadline_ms = (budget_ms - shift).max(0.0);
    let scale_ms = std.max(min_std_ms).max(1e-3);
    // The curve in silence after the last arrival, its deadline at least a scale past the
    // center so that phi there is well away from 0.
    let center_ms = (mean - shift).min(deadline_ms - scale_ms);
    let top_phi = tail::normal_phi((deadline_ms - center_ms) / scale_ms);
    BudgetRule {
        anchor,
        deadline_ms,
        mistakes,
        center_ms,
        scale_ms,
        top,
        top_phi,
    }
}

/// The offsets of arrivals 0..=n from the least squares line through them (arrival j at the
/// sum of the first j intervals, against j): n + 1 residuals that sum to zero.
pub fn schedule_offsets(intervals_ms: &[f64]) -> Vec<f64> {
    let n = intervals_ms.len();
    let mut arrivals = Vec::with_capacity(n + 1);
    let mut at = 0.0;
    arrivals.push(at);
    for &x in intervals_ms {
        at += x;
        arrivals.push(at);
    }
    let count = (n + 1) as f64;
    let mean_j = n as f64 / 2.0;
    let mean_a = arrivals.iter().sum::<f64>() / count;
    let (mut cov, mut var) = (0.0, 0.0);
    for (j, &a) in arrivals.iter().enumerate() {
        let dj = j as f64 - mean_j;
        cov += dj * (a - mean_a);
        var += dj * dj;
    }
    let period = if var > 0.0 { cov / var } else { 0.0 };
    arrivals
        .iter()
        .enumerate()
        .map(|(j, &a)| a - mean_a - period * (j as f64 - mean_j))
        .collect()
}

/// The `budget` model: its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub budget_ms: f64,
    /// phi at the deadline: the threshold (the agent's highest level).
    pub top: f64,
    pub min_std_ms: f64,
}

impl ModelInfo for Budget {
    const NAME: &'static str = "budget";
    const ABOUT: Option<&'static str> = Some(
        "a mean detection budget (`ms`) met per peer by the deadline rule with the fewest \
         mistakes on its window; phi reaches the threshold at the deadline",
    );
    const SPEC: ModelSpec = ModelSpec {
        own_kind: Some((
            "budget",
            &[
                "threshold",
                "window",
                "min_std_ms",
                "first_interval_ms",
                "max_interval_ms",
                "outage_factor",
            ],
        )),
        keys: &[SpecKey {
            name: "ms",
            parse: |params, value| {
                let ms = crate::detector::spec::positive("ms", value)?;
                params.budget_ms = check_budget_ms(ms).map_err(|e| format!("ms: {e}"))?;
                Ok(())
            },
        }],
        finish: |_, _| Ok(()),
        format: |params| {
            let mut keys = vec![
                format!("ms={}", params.budget_ms),
                format!("threshold={}", params.threshold),
                format!("window={}", params.window),
                format!("min_std_ms={}", params.min_std_ms),
                format!("first_interval_ms={}", params.first_interval_ms),
                format!("outage_factor={}", params.outage_factor),
            ];
            if let Some(max) = params.max_interval_ms {
                keys.push(format!("max_interval_ms={max}"));
            }
            keys
        },
    };

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            budget_ms: params.budget_ms,
            top: params.threshold,
            min_std_ms: params.min_std_ms,
        }
    }
}

impl PhiModel for Budget {
    /// The window is read as the sending schedule, as `chen` reads it: an interval that spans
    /// lost heartbeats is not a late arrival.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: true,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        Shape::Budget(choose(
            &super::intervals_ms(window),
            self.budget_ms,
            self.min_std_ms,
            self.top,
        ))
    }

    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        match &estimate.shape {
            Shape::Budget(rule) => rule.phi(silence_ms),
            _ => super::phi_by_shape(estimate, silence_ms),
        }
    }

    /// The level itself: the crossing comes from the rule's curve.
    fn level_constant(&self, level: f64) -> f64 {
        level
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        match &estimate.shape {
            Shape::Budget(rule) => rule.crossing_ms(k),
            _ => super::silence_by_shape(k, estimate, false),
        }
    }
}
