//! `budget`: a mean detection budget B (ms), met per peer from its own window with the fewest
//! expected mistakes (Chen, Toueg and Aguilera 2002 configure a detector from a QoS
//! requirement; this does it on every estimate refresh, per peer).
//!
//! The rules it chooses among are deadlines after the last heartbeat,
//!
//!   d(lambda) = 0.98 B - lambda o_n,   lambda in {0, 1/4, 1/2, 3/4, 1}
//!
//! (0.98 B, the aim: see [`AIM`]),
//! where o_n is the last arrival's offset from the sending schedule: the residual of a least
//! squares line through the window's arrivals (A_j against j; its slope is the period, as
//! Chen's expected arrival takes the window's mean interval for it). lambda = 0 is a plain
//! timeout; lambda = 1 anchors the deadline on the schedule (a late last heartbeat brings
//! the deadline closer, an early one pushes it out), which is Chen's NFD-E with its margin set
//! to the budget; the ones between follow a delay that persists only partly. The residuals sum
//! to zero over the window, so every rule's deadline averages the aim over the window's
//! heartbeats: each meets the budget as a mean detection time (the silence after a heartbeat
//! at which the peer would be convicted, had it crashed right then, averaged over heartbeats).
//! A window of fewer than [`MIN_INTERVALS`] intervals gets the timeout.
//!
//! Each rule's mistakes are counted on the window: heartbeat j would have been a mistake if
//! its interval was longer than the deadline after heartbeat j - 1, that is if
//! s_j(lambda) = x_j + lambda o_{j-1} > 0.98 B. The rule with the fewest is chosen; of rules with
//! as many, the one whose s has the least deviation (the fewest mistakes in expectation,
//! beyond what the window saw), then the lowest lambda. With independent delays the deviation
//! of s is least at lambda = 1 (offsets, not their differences); with a delay that persists
//! (a queue), at lambda = 0. Where the aim is more than a period past a rule's longest s, its
//! deviation counts as 0 ([`tie_deviation`]): on a calm path every rule is, and the timeout is
//! kept, whose deadline a queue's first delay does not bring closer.
//!
//! phi keeps the levels' order and puts the deadline at the top level (the `threshold`, the
//! agent's highest level): with u = t + lambda o_n the silence anchored as the rule anchors
//! it, m and s the mean and deviation (floored by `min_std_ms`) of the s_j,
//!
//!   phi(t) = top * normal_phi((u - m) / s) / normal_phi((0.98 B - m) / s)
//!
//! so phi = top exactly at the deadline, and a lower level at the silence where the normal
//! phi of the anchored silence is that fraction of its value at the deadline. (Where the
//! budget is less than one deviation above m the curve is moved so that it is one: the
//! deadline stays where the budget puts it.)
//!
//! Cost: the choice is made when the estimate is (a refresh: every heartbeat, as for the other
//! ring models), in five passes over the window; a read of phi is one normal tail, as
//! `normal`'s, and the sweep compares the clock with the precomputed deadline.

use super::{ModelInfo, ModelSpec, PhiModel, SpecKey, WindowNeeds, WindowView};
use crate::detector::{
    model::{DetectorParams, Estimate, Shape},
    tail,
};

use monitor_common::maps::{MAX_INTERVAL_US, PeerRecord};

/// The anchor weights the choice is among, lowest first (the tie-break order).
pub const ANCHORS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Intervals a window needs before a rule other than the plain timeout is considered: a
/// line through fewer arrivals says nothing of the schedule.
pub const MIN_INTERVALS: usize = 8;

/// The longest budget: a deadline past the longest interval a window holds could never be
/// learned from one.
pub const MAX_BUDGET_MS: f64 = MAX_INTERVAL_US as f64 / 1000.0;

/// The share of the budget the deadlines aim at: every rule's deadlines average the aim over
/// the window, and over a trace they wander a little around it (the last offset of one window
/// is not that of the next), so the aim stays under the budget by more than they wander
/// (about 0.3 ms on the corpus) and the mean detection time stays within the budget.
pub const AIM: f64 = 0.98;

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
        let z = (silence_ms - self.center_ms) / self.scale_ms;
        let phi = (self.top * tail::normal_phi(z) / self.top_phi).max(0.0);
        // Exactly the top level from the deadline on, and below it before, whatever the
        // rounding far in the tail: the deadline is the rule, the curve only grades it.
        match silence_ms.total_cmp(&self.deadline_ms) {
            std::cmp::Ordering::Less => phi.min(self.top.next_down()),
            std::cmp::Ordering::Equal => self.top,
            std::cmp::Ordering::Greater => phi.max(self.top),
        }
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
/// heartbeats), a budget and a floor under the curve's scale, with phi `top` at the deadline;
/// with the peer's loss picture, the aim split between its states (see [`LossStates`]).
pub fn choose(
    intervals_ms: &[f64],
    budget_ms: f64,
    min_std_ms: f64,
    top: f64,
    loss: Option<&LossStates>,
) -> BudgetRule {
    let aim = budget_ms * AIM;
    let n = intervals_ms.len();
    // The offsets o_0..o_n of the arrivals from the least squares line A_j = a + b j.
    let offsets = (n >= MIN_INTERVALS).then(|| schedule_offsets(intervals_ms));
    let period = if n == 0 {
        0.0
    } else {
        intervals_ms.iter().sum::<f64>() / n as f64
    };
    // (mistakes, deviation for ties, std, anchor, mean)
    let mut best: Option<(u32, f64, f64, f64, f64)> = None;
    for &anchor in &ANCHORS {
        if anchor > 0.0 && offsets.is_none() {
            break;
        }
        let s = |j: usize| intervals_ms[j] + offsets.as_ref().map_or(0.0, |o| anchor * o[j]);
        let (mut mistakes, mut sum, mut sum_sq, mut longest) = (0u32, 0.0, 0.0, 0.0f64);
        for j in 0..n {
            let v = s(j);
            mistakes += (v > aim) as u32;
            sum += v;
            sum_sq += v * v;
            longest = longest.max(v);
        }
        let (mean, std) = if n == 0 {
            (aim, 0.0)
        } else {
            let mean = sum / n as f64;
            (mean, (sum_sq / n as f64 - mean * mean).max(0.0).sqrt())
        };
        let tie = tie_deviation(std, longest, period, aim);
        let better = best.is_none_or(|(m, t, _, _, _)| mistakes < m || (mistakes == m && tie < t));
        if better {
            best = Some((mistakes, tie, std, anchor, mean));
        }
    }
    let (mistakes, _, std, anchor, mean) = best.expect("the timeout is always a candidate");
    // The last arrival's offset (o_n), by which the rule moves the deadline.
    let shift = offsets.as_ref().map_or(0.0, |o| anchor * o[n]);
    let state_aim = match loss {
        Some(loss) if n >= MIN_INTERVALS => {
            let mut s: Vec<f64> = (0..n)
                .map(|j| intervals_ms[j] + offsets.as_ref().map_or(0.0, |o| anchor * o[j]))
                .collect();
            s.sort_by(f64::total_cmp);
            let split = split_aim(&s, mean, std, period, aim, loss);
            if loss.in_burst { split.1 } else { split.0 }
        }
        _ => aim,
    };
    let deadline_ms = (state_aim - shift).max(0.0);
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

/// The deviation by which rules of as many mistakes are told apart: their own, or 0 where the
/// aim is more than a period past the longest anchored interval of the window. There no rule
/// came near a mistake, the anchoring has nothing to buy, and what would move an anchored
/// deadline is more often a queue's first delay than a schedule's jitter (a path calm until
/// a burst of cross traffic: the late arrival would bring the deadline closer just as the
/// queue grows); so of such rules the one that moves its deadline least, the timeout first,
/// is kept.
pub fn tie_deviation(std: f64, longest: f64, period: f64, aim: f64) -> f64 {
    if aim - longest > period { 0.0 } else { std }
}

/// A peer's loss, as the kernel's counters picture it (`PeerRecord::loss_heartbeats` and the
/// rest): two states, inside a loss burst (a gap within the last `BURST_MEMORY` heartbeats)
/// and outside, each with its own chance that the next heartbeat comes after a gap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossStates {
    /// The share of heartbeats that were followed inside a burst: of the deadlines set, the
    /// share set in the bad state.
    pub bad_share: f64,
    /// P(the next heartbeat comes after a gap), outside a burst and inside one.
    pub p_good: f64,
    pub p_bad: f64,
    /// P(a heartbeat is lost | the one before it was lost).
    pub q: f64,
    /// The last heartbeat left the peer inside a burst.
    pub in_burst: bool,
}

impl LossStates {
    /// From the record's counters; None where no burst has been seen (the split would have
    /// nothing to go on, and the single aim is the rule).
    pub fn from_record(r: &PeerRecord) -> Option<Self> {
        if r.loss_heartbeats == 0 || r.burst_heartbeats == 0 || r.loss_gaps == 0 {
            return None;
        }
        let good = r.loss_heartbeats.saturating_sub(r.burst_heartbeats);
        let good_gaps = r.loss_gaps.saturating_sub(r.burst_gaps);
        Some(Self {
            bad_share: r.burst_heartbeats as f64 / r.loss_heartbeats as f64,
            p_good: if good == 0 {
                0.0
            } else {
                good_gaps as f64 / good as f64
            },
            p_bad: r.burst_gaps as f64 / r.burst_heartbeats as f64,
            q: r.loss_lost.saturating_sub(r.loss_gaps) as f64 / r.loss_lost.max(1) as f64,
            in_burst: r.burst_left != 0,
        })
    }
}

/// Most periods a deadline inside a burst may go past the aim: the split buys fewer mistakes
/// with longer detection inside bursts, and this bounds how much longer.
pub const MAX_BURST_PERIODS: f64 = 8.0;

/// Points of the aims tried outside a burst (from the least the bound allows to the aim).
const SPLIT_POINTS: usize = 32;

/// The aims outside and inside a burst, (good, bad), whose mean over the states' shares is
/// `aim` and whose expected mistakes are the fewest: the next arrival, anchored as the rule
/// anchors it, is one of the window's `sorted` s (plus a pseudo-sample from the normal of
/// `mean`, `std`) after k lost heartbeats, k periods later, with k >= 1 at the state's chance
/// of a gap and then geometric in `q`.
pub fn split_aim(
    sorted: &[f64],
    mean: f64,
    std: f64,
    period: f64,
    aim: f64,
    loss: &LossStates,
) -> (f64, f64) {
    let share = loss.bad_share.clamp(0.0, 1.0);
    if share <= 0.0 || share >= 1.0 || period <= 0.0 {
        return (aim, aim);
    }
    let n = sorted.len() as f64;
    // P(s > t): the window's share beyond t, with one pseudo-sample from the normal.
    let later = |t: f64| {
        let beyond = sorted.len() - sorted.partition_point(|&v| v <= t);
        let normal = if std > 0.0 {
            10f64.powf(-tail::normal_phi((t - mean) / std))
        } else {
            (t < mean) as u8 as f64
        };
        (beyond as f64 + normal) / (n + 1.0)
    };
    let misses = |p: f64, a: f64| {
        let mut total = (1.0 - p) * later(a);
        // After k >= 1 losses: P(K = k) = p (1 - q) q^(k-1); the rest counted as misses.
        let mut at_least = p;
        for k in 1..=16 {
            let exactly = at_least * (1.0 - loss.q);
            total += exactly * later(a - k as f64 * period);
            at_least -= exactly;
            if at_least < 1e-9 {
                break;
            }
        }
        total + at_least.max(0.0)
    };
    let expected = |good: f64, bad: f64| {
        (1.0 - share) * misses(loss.p_good, good) + share * misses(loss.p_bad, bad)
    };
    let most_bad = aim + MAX_BURST_PERIODS * period;
    let least_good = ((aim - share * most_bad) / (1.0 - share)).max(0.0);
    let mut best = (aim, aim, expected(aim, aim));
    for i in 0..SPLIT_POINTS {
        let good = least_good + (aim - least_good) * i as f64 / SPLIT_POINTS as f64;
        let bad = (aim - (1.0 - share) * good) / share;
        let e = expected(good, bad);
        if e < best.2 * (1.0 - 1e-9) {
            best = (good, bad, e);
        }
    }
    (best.0, best.1)
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
            LossStates::from_record(window.record).as_ref(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::{
        models::Model,
        spec::{format_spec, parse_spec},
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn independent_jitter_anchors_on_the_schedule() {
        // A 100 ms schedule, every third arrival 30 ms late: arrivals 0, 130, 200, 300, 430,
        // 500, 600, 730, 800. Offsets 0, 30, 0, 0, 30, 0, 0, 30, 0 average 10 and are
        // symmetric about the middle, so the line has slope 100 and the residuals are
        // -10, 20, -10, -10, 20, -10, -10, 20, -10.
        let x = [130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 130.0, 70.0];
        let o = schedule_offsets(&x);
        for (got, want) in o
            .iter()
            .zip([-10.0, 20.0, -10.0, -10.0, 20.0, -10.0, -10.0, 20.0, -10.0])
        {
            assert!(close(*got, want), "{o:?}");
        }
        // Budget 125, aim 122.5. The timeout (s = x) misses the three 130s; lambda 1/4 and 1/2
        // too (130 - 2.5, 130 - 5); lambda 3/4 and 1 (s = 120 or 90 at 1) none. Of those two,
        // lambda 1 has the least deviation: s is 120 three times and 90 five times,
        // sqrt(3/8 5/8) 30 = 14.52 against 16.95.
        let rule = choose(&x, 125.0, 0.0, 8.0, None);
        assert_eq!((rule.anchor, rule.mistakes), (1.0, 0));
        // The last arrival is 10 ms early against the line: the deadline is 10 ms later.
        assert!(close(rule.deadline_ms, 125.0 * AIM + 10.0), "{rule:?}");
        assert!(close(
            rule.scale_ms,
            (3.0f64 / 8.0 * 5.0 / 8.0).sqrt() * 30.0
        ));
    }

    #[test]
    fn a_delay_that_persists_keeps_the_timeout() {
        // A queue that builds and drains: 6 intervals of 100, 4 of 140, 6 of 100, 4 of 60,
        // 6 of 100. Anchored on a line, the queued arrivals look late and the next deadline
        // short: at budget 120 (aim 117.6) the timeout misses the four 140s, lambda 1/4 ten,
        // 1/2 nine, 3/4 ten, 1 eleven.
        let mut x = vec![100.0; 6];
        x.extend([140.0; 4]);
        x.extend([100.0; 6]);
        x.extend([60.0; 4]);
        x.extend([100.0; 6]);
        let rule = choose(&x, 120.0, 0.0, 8.0, None);
        assert_eq!((rule.anchor, rule.mistakes), (0.0, 4));
        assert!(close(rule.deadline_ms, 120.0 * AIM));
    }

    #[test]
    fn a_queue_s_first_delay_on_a_calm_path_keeps_the_timeout() {
        // Ten intervals of 101 and 99 (a calm path), then one of 220: the last arrival is the
        // first one a queue of cross traffic delays (120 ms), as at the onset of a burst in
        // tests/tests/budget_congestion.rs. The line through arrivals 0, 101, 200, ..., 1000,
        // 1220 has slope 104.60 and leaves the last one 84.29 ms late. At budget 400 (aim
        // 392) no rule makes a mistake on the window, and the least deviation of the anchored
        // intervals is lambda 1's (29.91 against 34.51 for the timeout): by deviation alone the
        // deadline would be 392 - 84.29 = 307.71 ms, where the next heartbeat, one lost and
        // the queue still growing, came 318-356 ms after the last in the recorded runs. But the
        // longest anchored interval of every rule (220 for the timeout, 188.89 for lambda 1)
        // is more than a period (1220 / 11 = 110.9 ms) below the aim: nothing tells the rules
        // apart, and the timeout keeps the deadline at the aim.
        let mut x: Vec<f64> = [101.0, 99.0].repeat(5);
        x.push(220.0);
        let o = schedule_offsets(&x);
        assert!((o[11] - 84.2949).abs() < 1e-4, "{o:?}");
        let rule = choose(&x, 400.0, 0.0, 8.0, None);
        assert_eq!((rule.anchor, rule.mistakes), (0.0, 0));
        assert!(close(rule.deadline_ms, 392.0), "{rule:?}");
        // The same window at a budget whose aim is within a period of its longest interval
        // (budget 300, aim 294: 294 - 220 < 110.9) is told apart by deviation, as before.
        let tight = choose(&x, 300.0, 0.0, 8.0, None);
        assert_eq!(tight.anchor, 1.0, "{tight:?}");
        assert!(close(tight.deadline_ms, 294.0 - o[11]), "{tight:?}");
        // The tie rule itself: the deviation, or 0 past a period of room.
        assert_eq!(tie_deviation(30.0, 220.0, 110.0, 392.0), 0.0);
        assert_eq!(tie_deviation(30.0, 220.0, 110.0, 330.0), 30.0);
    }

    #[test]
    fn equal_mistakes_go_to_the_least_deviation() {
        // Four intervals of 100, one of 150, seven of 100: arrivals 0, 100, 200, 300, 400,
        // 550, ..., 1250. The line's slope is 9600/91 and the last residual -1250/91. At budget
        // 120 (aim 117.6) lambda 0, 1/4 and 1/2 each miss the 150 alone (3/4 two, 1 three),
        // and lambda 1/2 has the least deviation of s (12.05 against 13.82 and 12.56).
        let mut x = vec![100.0; 4];
        x.push(150.0);
        x.extend([100.0; 7]);
        let o = schedule_offsets(&x);
        assert!(close(o[12], -1250.0 / 91.0), "{o:?}");
        assert!(o.iter().sum::<f64>().abs() < 1e-9, "residuals sum to zero");
        let rule = choose(&x, 120.0, 0.0, 8.0, None);
        assert_eq!((rule.anchor, rule.mistakes), (0.5, 1));
        assert!(
            close(rule.deadline_ms, 117.6 + 0.5 * 1250.0 / 91.0),
            "{rule:?}"
        );
    }

    #[test]
    fn a_short_window_gets_the_timeout() {
        let rule = choose(&[75.0, 125.0, 100.0], 500.0, 50.0, 8.0, None);
        assert_eq!(rule.anchor, 0.0);
        assert!(close(rule.deadline_ms, 490.0));
        let empty = choose(&[], 300.0, 50.0, 3.0, None);
        assert!(close(empty.deadline_ms, 294.0));
        assert_eq!(empty.crossing_ms(3.0), empty.deadline_ms);
    }

    #[test]
    fn every_rule_averages_the_aim_over_the_window() {
        // The deadlines after each arrival of the window, d_j = aim - lambda o_j, average the
        // aim: the residuals sum to zero, whatever the window.
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..50 {
            let n = rng.usize(8..128);
            let x: Vec<f64> = (0..n).map(|_| 60.0 + rng.f64() * 90.0).collect();
            let o = schedule_offsets(&x);
            assert_eq!(o.len(), n + 1);
            assert!(o.iter().sum::<f64>().abs() < 1e-6 * n as f64, "{o:?}");
        }
    }

    #[test]
    fn phi_reaches_the_top_level_at_the_deadline_and_lower_ones_before() {
        let x = [
            130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 100.0,
        ];
        for (budget, floor) in [(125.0, 0.0), (300.0, 50.0), (90.0, 5.0), (2000.0, 50.0)] {
            let rule = choose(&x, budget, floor, 8.0, None);
            assert_eq!(rule.phi(rule.deadline_ms), 8.0);
            assert_eq!(rule.crossing_ms(8.0), rule.deadline_ms);
            assert!(rule.phi(rule.deadline_ms.next_down()) < 8.0, "{rule:?}");
            let mut last = 0.0;
            for level in [0.5, 1.0, 3.0, 7.9, 8.0, 12.0] {
                let t = rule.crossing_ms(level);
                assert!(t >= last, "levels in order: {level} at {t}");
                assert!(rule.phi(t) >= level, "{level}: phi({t}) = {}", rule.phi(t));
                if t > 0.0 {
                    assert!(rule.phi(t.next_down()) < level, "{level} at {t}");
                }
                assert_eq!(t < rule.deadline_ms, level < 8.0, "{level} at {t}");
                last = t;
            }
            let mut last = 0.0;
            for i in 0..4000 {
                let phi = rule.phi(i as f64);
                assert!(phi >= last, "grows with the silence");
                last = phi;
            }
        }
    }

    #[test]
    fn inside_bursts_the_deadline_is_bought_from_outside_them() {
        // A steady 100 ms window (no jitter: the next arrival is exactly a period after the
        // last, or k periods after k losses). One deadline in ten is set inside a burst,
        // where the next heartbeat comes after a gap half the time and each loss is followed
        // by another half the time; outside bursts nothing is lost. Aim 196 (budget 200).
        let sorted = [100.0; 64];
        let loss = LossStates {
            bad_share: 0.1,
            p_good: 0.0,
            p_bad: 0.5,
            q: 0.5,
            in_burst: true,
        };
        let (good, bad) = split_aim(&sorted, 100.0, 0.0, 100.0, 196.0, &loss);
        // Outside a burst any deadline of a period or more is never wrong, so the split gives
        // inside bursts all the bound allows, 196 + 8 periods = 996 ms (a miss there needs 9
        // losses in a row: 0.5^9), and outside what is left: (196 - 0.1 996) / 0.9.
        assert!(close(bad, 996.0), "{good} {bad}");
        assert!(close(good, (196.0 - 99.6) / 0.9), "{good} {bad}");
        assert!(close(0.9 * good + 0.1 * bad, 196.0));
        // No burst share, or no loss picture: the one aim.
        let none = LossStates {
            bad_share: 0.0,
            ..loss
        };
        assert_eq!(
            split_aim(&sorted, 100.0, 0.0, 100.0, 196.0, &none),
            (196.0, 196.0)
        );
        // Through `choose`: the deadline is the state's aim (the steady window has no offsets).
        let x = [100.0; 64];
        let inside = choose(&x, 200.0, 0.0, 8.0, Some(&loss));
        assert!(close(inside.deadline_ms, 996.0), "{inside:?}");
        let outside = LossStates {
            in_burst: false,
            ..loss
        };
        let rule = choose(&x, 200.0, 0.0, 8.0, Some(&outside));
        assert!(close(rule.deadline_ms, (196.0 - 99.6) / 0.9), "{rule:?}");
    }

    #[test]
    fn the_split_keeps_the_aim_and_never_expects_more_mistakes() {
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..200 {
            let n = rng.usize(8..128);
            let mut s: Vec<f64> = (0..n).map(|_| 80.0 + rng.f64() * 60.0).collect();
            s.sort_by(f64::total_cmp);
            let loss = LossStates {
                bad_share: rng.f64() * 0.5,
                p_good: rng.f64() * 0.01,
                p_bad: rng.f64() * 0.6,
                q: rng.f64() * 0.6,
                in_burst: false,
            };
            let aim = 100.0 + rng.f64() * 1000.0;
            let (good, bad) = split_aim(&s, 110.0, 15.0, 100.0, aim, &loss);
            let mean = (1.0 - loss.bad_share) * good + loss.bad_share * bad;
            assert!((mean - aim).abs() < 1e-6 * aim, "{good} {bad} {loss:?}");
            assert!(good <= aim + 1e-9 && bad <= aim + MAX_BURST_PERIODS * 100.0 + 1e-6);
        }
    }

    #[test]
    fn specs_and_bad_budgets() {
        let p = parse_spec("budget:ms=500").unwrap();
        assert_eq!(
            (p.model, p.budget_ms, p.threshold),
            (Model::Budget, 500.0, 8.0)
        );
        assert_eq!(parse_spec(&format_spec(&p)).unwrap(), p);
        let p = parse_spec("budget:ms=250,threshold=3,window=64,min_std_ms=10").unwrap();
        assert_eq!((p.budget_ms, p.threshold, p.window), (250.0, 3.0, 64));
        assert_eq!(parse_spec(&format_spec(&p)).unwrap(), p);
        assert_eq!(parse_spec("budget").unwrap().budget_ms, DEFAULT_BUDGET_MS);
        for (spec, expected) in [
            ("budget:ms=0", "greater than 0"),
            ("budget:ms=-5", "greater than 0"),
            ("budget:ms=0.5", "at least 1 ms"),
            ("budget:ms=1e9", "longer than the longest interval"),
            ("budget:ms=abc", "not a finite number"),
            ("budget:pause_ms=5", "unknown key"),
            ("budget:timeout_ms=5", "unknown key"),
            ("phi:model=budget", "one of normal"),
        ] {
            let err = parse_spec(spec).expect_err(spec);
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }

    #[test]
    fn through_the_estimate_of_a_gapless_window() {
        use crate::detector::window::slot_with_intervals;
        let p = parse_spec("budget:ms=125,first_interval_ms=0,outage_factor=0").unwrap();
        assert!(p.needs_ring());
        assert!(p.window_rules().gapless);
        let config = p.window_config();
        let us = [
            130_000, 70_000, 100_000, 130_000, 70_000, 100_000, 130_000, 70_000,
        ];
        let slot = slot_with_intervals(us, &config);
        let ring: Vec<u32> = monitor_common::slot::window_intervals(&slot, config.window).collect();
        let e = p.estimate(&slot.record(), &ring);
        let Shape::Budget(rule) = e.shape else {
            panic!("{e:?}")
        };
        // The window of `independent_jitter_anchors_on_the_schedule`.
        assert_eq!(rule.anchor, 1.0);
        assert!(close(rule.deadline_ms, 122.5 + 10.0), "{rule:?}");
        let levels = p.level_silences(&[p.threshold]);
        assert_eq!(p.crossing_ms(&levels, 0, p.threshold, &e), rule.deadline_ms);
        assert_eq!(p.phi(&e, rule.deadline_ms), 8.0);
    }
}
