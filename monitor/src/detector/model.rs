//! The phi models and their parameters.
//!
//! - `normal`: the exact normal tail of Hayashibara et al. (2004).
//! - `akka`: Akka's PhiAccrualFailureDetector (logistic approximation of the normal CDF).
//! - `exponential`: Cassandra's FailureDetector, phi = t / (mean ln 10).
//! - `fixed`: a plain timeout (phi 0 before it, infinite from it on).
//! - `loss`: loss-aware normal (see `loss`): the silence may span lost heartbeats, weighted
//!   by the peer's measured loss and burstiness.
//!
//! Common to the phi models (as in Akka): the acceptable pause is added to the mean, the
//! standard deviation has a floor, and the window starts with two bootstrap samples around
//! the first-interval estimate (see `window::WindowSums::with_bootstrap`). Which intervals
//! enter the window at all is the kernel's rule set (`monitor_common::slot`), configured by
//! `DetectorParams::window_config`.

use std::f64::consts::LN_10;

use monitor_common::{
    config::{XDP_FLAG_GAPLESS_WINDOW, XdpConfig},
    maps::{MAX_INTERVAL_US, PeerRecord},
};
use serde::{Deserialize, Serialize};

use super::{loss::LossOdds, tail, window::WindowSums};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Model {
    Normal,
    Akka,
    Exponential,
    Fixed,
    /// Loss-aware normal: a mixture over the number of consecutive lost heartbeats.
    Loss,
}

impl Model {
    pub fn name(self) -> &'static str {
        match self {
            Model::Normal => "normal",
            Model::Akka => "akka",
            Model::Exponential => "exponential",
            Model::Fixed => "fixed",
            Model::Loss => "loss",
        }
    }

    /// Every model, in the order help texts list them.
    pub const ALL: [Model; 5] = [
        Model::Normal,
        Model::Akka,
        Model::Exponential,
        Model::Fixed,
        Model::Loss,
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Everything that decides how a silence is judged. Defaults in `DetectorParams::DEFAULT`,
/// justified in docs/tuning.md.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorParams {
    pub model: Model,
    /// Suspected when phi >= threshold (replay; the agent has levels instead).
    pub threshold: f64,
    /// Intervals kept per peer.
    pub window: u32,
    /// Floor on the standard deviation (normal, akka, loss).
    pub min_std_ms: f64,
    /// Acceptable heartbeat pause, added to the mean (phi models).
    pub pause_ms: f64,
    /// First-interval estimate; the window starts with two samples around it. 0: none.
    pub first_interval_ms: f64,
    /// Intervals longer than this are not counted (Cassandra's cap). None: all are.
    pub max_interval_ms: Option<f64>,
    /// Intervals longer than this many window means are outages, not samples; 0: none are.
    pub outage_factor: u32,
    /// The timeout of the `fixed` model.
    pub timeout_ms: f64,
}

impl DetectorParams {
    pub const DEFAULT: Self = Self {
        model: Model::Normal,
        threshold: 8.0,
        window: 128,
        min_std_ms: 25.0,
        pause_ms: 0.0,
        first_interval_ms: 100.0,
        max_interval_ms: None,
        outage_factor: 4,
        timeout_ms: 1000.0,
    };

    /// The kernel's window rules for these parameters (`monitor_common::slot`): the agent
    /// loads them into the XDP program, replay runs the same rules with them.
    pub fn window_config(&self) -> XdpConfig {
        let max_interval_us = self.max_interval_ms.map_or(0, |ms| {
            ((ms * 1000.0) as u64).clamp(1, MAX_INTERVAL_US) as u32
        });
        XdpConfig {
            window: self.window,
            max_interval_us,
            outage_factor: self.outage_factor,
            flags: if self.model == Model::Loss {
                XDP_FLAG_GAPLESS_WINDOW
            } else {
                0
            },
            ..XdpConfig::DEFAULT
        }
    }

    /// Whether `estimate` needs the window's intervals themselves, not only their sums.
    pub fn needs_ring(&self) -> bool {
        false
    }

    /// The distribution a peer's silence is judged against, from its record and, for the
    /// models that `needs_ring`, the window's intervals (µs, oldest first; else empty).
    pub fn estimate(&self, record: &PeerRecord, ring: &[u32]) -> Estimate {
        let _ = ring;
        let first_us = (self.first_interval_ms * 1000.0).round() as u64;
        let sums = WindowSums::from_record(record);
        let (mean, std) = sums
            .with_bootstrap(self.window, first_us)
            .moments_ms()
            .unwrap_or((self.first_interval_ms, self.first_interval_ms / 4.0));
        let shape = match self.model {
            Model::Loss => Shape::Loss(LossOdds::from_record(record)),
            _ => Shape::Plain,
        };
        Estimate {
            mean_ms: mean + self.pause_ms,
            std_ms: std.max(self.min_std_ms),
            pause_ms: self.pause_ms,
            shape,
        }
    }

    /// phi after `silence_ms` without a heartbeat.
    pub fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        let Estimate {
            mean_ms, std_ms, ..
        } = *estimate;
        match self.model {
            Model::Normal => standardised(silence_ms, mean_ms, std_ms, tail::normal_phi),
            Model::Akka => standardised(silence_ms, mean_ms, std_ms, akka_phi),
            Model::Exponential => {
                if mean_ms <= 0.0 {
                    return if silence_ms > 0.0 { f64::INFINITY } else { 0.0 };
                }
                (silence_ms / (mean_ms * LN_10)).max(0.0)
            }
            Model::Fixed => {
                if silence_ms >= self.timeout_ms {
                    f64::INFINITY
                } else {
                    0.0
                }
            }
            Model::Loss => match &estimate.shape {
                Shape::Loss(odds) => odds.phi(
                    silence_ms,
                    mean_ms - estimate.pause_ms,
                    std_ms,
                    estimate.pause_ms,
                ),
                _ => standardised(silence_ms, mean_ms, std_ms, tail::normal_phi),
            },
        }
    }

    /// Per-level constants for finding, without evaluating phi, the silence at which phi
    /// reaches each level (see `LevelSilences`). For `loss` they give the normal model's
    /// crossing, a lower bound of its own (see `crossing_ms`).
    pub fn level_silences(&self, levels: &[f64]) -> LevelSilences {
        let k = levels
            .iter()
            .map(|&level| match self.model {
                Model::Normal | Model::Loss => tail::invert(tail::normal_phi, level),
                Model::Akka => tail::invert(akka_phi, level),
                Model::Exponential => level * LN_10,
                Model::Fixed => self.timeout_ms,
            })
            .collect();
        LevelSilences {
            model: self.model,
            k,
        }
    }

    /// The silence (ms) at which phi reaches `levels[index]` for this estimate: exact for
    /// every model. Closed form where the model has one; for `loss`, a bisection between the
    /// normal crossing (phi_loss <= phi_normal: losing heartbeats only makes a silence more
    /// likely) and a bracket doubled until phi reaches the level.
    pub fn crossing_ms(
        &self,
        silences: &LevelSilences,
        index: usize,
        level: f64,
        estimate: &Estimate,
    ) -> f64 {
        let lower = silences.silence_ms(index, estimate);
        match (&estimate.shape, self.model) {
            (Shape::Loss(odds), Model::Loss) if !odds.is_lossless() => {
                let phi = |t: f64| self.phi(estimate, t);
                let mut lo = lower.max(0.0);
                if phi(lo) >= level {
                    return lo;
                }
                let mut hi = lo.max(estimate.mean_ms).max(1.0) * 2.0;
                while phi(hi) < level {
                    lo = hi;
                    hi *= 2.0;
                    if hi > 1e12 {
                        return f64::INFINITY;
                    }
                }
                // To a microsecond: deadlines are kept in nanoseconds, sweeps are milliseconds.
                while hi - lo > 1e-3 {
                    let mid = 0.5 * (lo + hi);
                    if phi(mid) >= level {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                hi
            }
            _ => lower,
        }
    }
}

impl Default for DetectorParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Mean and standard deviation after bootstrap, pause and floor, and what else the model
/// judges a silence by.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Mean interval plus the acceptable pause.
    pub mean_ms: f64,
    pub std_ms: f64,
    /// The pause included in `mean_ms`.
    pub pause_ms: f64,
    pub shape: Shape,
}

/// Model-specific parts of an estimate.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Mean and deviation are all the model needs.
    Plain,
    /// Loss odds of the peer (`loss` model).
    Loss(LossOdds),
}

fn standardised(silence: f64, mean: f64, std: f64, phi_of: fn(f64) -> f64) -> f64 {
    if std <= 0.0 {
        // Only reachable with a zero floor and identical intervals: a step at the mean.
        return if silence > mean { f64::INFINITY } else { 0.0 };
    }
    phi_of((silence - mean) / std).max(0.0)
}

/// Akka's phi of a standardised deviate y:
/// e = exp(-y (1.5976 + 0.070566 y^2)); phi = -log10(e / (1 + e)) (both of Akka's branches
/// are this same quantity). Written as log10(1 + 1/e) = softplus(a) / ln 10 with
/// a = y (1.5976 + 0.070566 y^2), which equals Akka's value wherever Akka's is finite and
/// keeps growing where Akka's exp underflows to 0 and its phi saturates at infinity.
pub fn akka_phi(y: f64) -> f64 {
    let a = y * (1.5976 + 0.070566 * y * y);
    let softplus = a.max(0.0) + (-a.abs()).exp().ln_1p();
    softplus / LN_10
}

/// For each level, the constant k from which the crossing silence follows in a multiply-add:
/// normal and akka: mean + k std; exponential: k mean; fixed: k.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelSilences {
    model: Model,
    k: Vec<f64>,
}

impl LevelSilences {
    pub fn len(&self) -> usize {
        self.k.len()
    }

    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    /// Silence (ms) at which phi reaches level `index`, for this estimate.
    pub fn silence_ms(&self, index: usize, estimate: &Estimate) -> f64 {
        let k = self.k[index];
        match self.model {
            Model::Normal | Model::Akka | Model::Loss => {
                if estimate.std_ms <= 0.0 {
                    estimate.mean_ms
                } else {
                    estimate.mean_ms + k * estimate.std_ms
                }
            }
            Model::Exponential => k * estimate.mean_ms,
            Model::Fixed => k,
        }
    }
}

#[cfg(test)]
mod tests {
    use monitor_common::config::XdpConfig;

    use super::*;
    use crate::detector::window::slot_with_intervals;

    /// The estimate of a window holding `intervals_us`, every interval counted.
    fn estimate_of(p: &DetectorParams, intervals_us: impl IntoIterator<Item = u64>) -> Estimate {
        let c = XdpConfig {
            window: 128,
            ..XdpConfig::DEFAULT
        };
        p.estimate(&slot_with_intervals(intervals_us, &c).record, &[])
    }

    fn params(model: Model) -> DetectorParams {
        DetectorParams {
            model,
            min_std_ms: 0.0,
            first_interval_ms: 0.0,
            ..DetectorParams::DEFAULT
        }
    }

    fn est(mean_ms: f64, std_ms: f64) -> Estimate {
        Estimate {
            mean_ms,
            std_ms,
            pause_ms: 0.0,
            shape: Shape::Plain,
        }
    }

    #[test]
    fn normal_matches_the_normal_tail() {
        let p = params(Model::Normal);
        // Silence one std above the mean: P = 0.15865525393145705 (A&S 26.2), phi = 0.79955...
        let phi = p.phi(&est(100.0, 10.0), 110.0);
        assert!(
            (phi - -(0.158_655_253_931_457_05f64).log10()).abs() < 1e-12,
            "{phi}"
        );
        // At the mean: P = 1/2.
        assert!((p.phi(&est(100.0, 10.0), 100.0) - 2f64.log10()).abs() < 1e-15);
    }

    #[test]
    fn akka_matches_akka_formula_where_akka_is_finite() {
        // Akka's own code, transcribed: both branches.
        fn akka_reference(time_diff: f64, mean: f64, std: f64) -> f64 {
            let y = (time_diff - mean) / std;
            let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
            if time_diff > mean {
                -(e / (1.0 + e)).log10()
            } else {
                -(1.0 - 1.0 / (1.0 + e)).log10()
            }
        }
        let p = params(Model::Akka);
        for t in [0.0, 50.0, 99.0, 100.0, 101.0, 150.0, 200.0, 300.0, 400.0] {
            let ours = p.phi(&est(100.0, 25.0), t);
            let theirs = akka_reference(t, 100.0, 25.0);
            assert!(
                (ours - theirs).abs() <= 1e-9 * theirs.max(1.0),
                "t={t}: {ours} vs {theirs}"
            );
        }
        // Where Akka saturates (exp underflows, phi = inf), ours stays finite and monotone.
        assert!(akka_reference(3000.0, 100.0, 25.0).is_infinite());
        let far = p.phi(&est(100.0, 25.0), 3000.0);
        assert!(far.is_finite() && far > p.phi(&est(100.0, 25.0), 2000.0));
    }

    #[test]
    fn akka_parameters_act_as_in_akka() {
        // Akka's test "use the acceptable heartbeat pause and min std deviation": a pause
        // moves the curve right; the floor replaces a tiny deviation.
        let with = DetectorParams {
            pause_ms: 3000.0,
            min_std_ms: 100.0,
            ..params(Model::Akka)
        };
        let e = estimate_of(&with, [1_000_000; 10]);
        assert_eq!((e.mean_ms, e.std_ms), (4000.0, 100.0));
        assert!(with.phi(&e, 1500.0) < 0.01);
    }

    #[test]
    fn exponential_matches_cassandra() {
        // Cassandra: phi = PHI_FACTOR * t / mean, PHI_FACTOR = 1 / ln 10.
        let p = params(Model::Exponential);
        assert!((p.phi(&est(1000.0, 0.0), 2_302.585_092_994_046) - 1.0).abs() < 1e-12);
        assert_eq!(p.phi(&est(1000.0, 0.0), 0.0), 0.0);
    }

    #[test]
    fn fixed_is_a_step() {
        let p = DetectorParams {
            timeout_ms: 500.0,
            ..params(Model::Fixed)
        };
        assert_eq!(p.phi(&est(100.0, 1.0), 499.9), 0.0);
        assert!(p.phi(&est(100.0, 1.0), 500.0).is_infinite());
    }

    #[test]
    fn phi_grows_with_silence_in_every_model() {
        for model in [Model::Normal, Model::Akka, Model::Exponential] {
            let p = params(model);
            let mut last = -1.0;
            for i in 0..2000 {
                let phi = p.phi(&est(100.0, 20.0), i as f64 * 5.0);
                assert!(phi >= last, "{model:?} at {} ms", i * 5);
                assert!(phi.is_finite(), "{model:?} at {} ms", i * 5);
                last = phi;
            }
        }
    }

    #[test]
    fn the_same_silence_is_less_suspicious_on_a_jittery_peer() {
        for model in [Model::Normal, Model::Akka] {
            let p = params(model);
            let steady = (0..100u64).map(|i| 100_000 + (i % 3) * 1_000);
            let jittery = (0..100u64).map(|i| if i % 2 == 0 { 60_000 } else { 140_000 });
            let (s, j) = (estimate_of(&p, steady), estimate_of(&p, jittery));
            // 200 ms is a hundred deviations late for the steady peer (mean 101, std 0.8) and
            // 2.5 deviations for the jittery one (mean 100, std 40).
            let silence = 200.0;
            assert!(p.phi(&s, silence) > 8.0, "{model:?}: steady peer at 200 ms");
            assert!(
                p.phi(&j, silence) < 3.0,
                "{model:?}: jittery peer at 200 ms"
            );
        }
    }

    #[test]
    fn bootstrap_gives_a_usable_estimate_before_any_interval() {
        let p = DetectorParams {
            first_interval_ms: 1000.0,
            ..params(Model::Akka)
        };
        let e = estimate_of(&p, []);
        assert_eq!(e, est(1000.0, 250.0));
        // First real interval joins the two bootstrap samples: (750 + 1250 + 400) / 3.
        assert!((estimate_of(&p, [400_000]).mean_ms - 800.0).abs() < 1e-9);
    }

    #[test]
    fn level_silences_invert_phi() {
        let levels = [1.0, 3.0, 8.0, 12.0];
        for model in [Model::Normal, Model::Akka, Model::Exponential] {
            let p = params(model);
            let e = est(100.0, 20.0);
            let table = p.level_silences(&levels);
            for (i, &level) in levels.iter().enumerate() {
                let t = table.silence_ms(i, &e);
                let phi = p.phi(&e, t);
                assert!(
                    (phi - level).abs() < 1e-9,
                    "{model:?} level {level}: phi({t}) = {phi}"
                );
                assert!(p.phi(&e, t - 1e-3) < level);
            }
        }
        let fixed = DetectorParams {
            timeout_ms: 700.0,
            ..params(Model::Fixed)
        };
        assert_eq!(
            fixed.level_silences(&levels).silence_ms(2, &est(1.0, 1.0)),
            700.0
        );
    }
}
