//! The parameters of a detector and what every model shares: the estimate of a window, the
//! level crossings, the floors under the mean.
//!
//! - `normal`: the exact normal tail of Hayashibara et al. (2004).
//! - `akka`: Akka's PhiAccrualFailureDetector (logistic approximation of the normal CDF).
//! - `exponential`: Cassandra's FailureDetector, phi = t / (mean ln 10).
//! - `fixed`: a plain timeout (phi 0 before it, infinite from it on).
//! - `loss`: loss-aware normal (see `loss`): the silence may span lost heartbeats, weighted
//!   by the peer's measured loss and burstiness.
//! - `chen`: Chen, Toueg and Aguilera (2002), expected arrival plus a margin (binary; `chen`).
//! - `bertier`: Bertier, Marin and Sens (2002), Chen's expected arrival plus Jacobson's margin
//!   (binary; `bertier`).
//! - `empirical`: Satzger et al. (2007), the empirical tail of the window (`empirical`).
//! - `2w`: Tomsic et al. (2015), the lower phi of a short and a long window (`two_windows`).
//! - `budget`: a mean detection budget met per peer by the deadline rule with the fewest
//!   mistakes on its window (`budget`).
//!
//! Each model is a type of its own in `detector::models`, behind the `PhiModel` trait; this
//! module holds the flat parameters (what a spec, a config file and a reload compare), the
//! estimate every model starts from, and hands each question to the model the parameters
//! name.
//!
//! Common to the phi models (as in Akka): the acceptable pause is added to the mean, the
//! standard deviation has a floor, and the window starts with two bootstrap samples around
//! the first-interval estimate (see `window::WindowSums::with_bootstrap`). Which intervals
//! enter the window at all is the kernel's rule set (`monitor_common::slot`), configured by
//! `DetectorParams::window_rules` (the kernel side turns them into its load-time config:
//! `kernel::window_rules`).

use monitor_common::maps::PeerRecord;

pub use super::models::{
    Model, akka::akka_phi, budget::BudgetRule, chen::Freshness, empirical::EmpiricalTail,
    two_windows::ShortWindow,
};
use super::{
    loss::LossOdds,
    models::{AnyModel, ModelFn, PhiModel, WindowNeeds, WindowView},
    window::{WindowSums, bootstrap_samples},
};

/// Everything that decides how a silence is judged. Defaults in `DetectorParams::DEFAULT`,
/// justified in docs/tuning.md. Each model takes the fields it uses as parameters of its own
/// type (`ModelInfo::from_params`).
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorParams {
    pub model: Model,
    /// Suspected when phi >= threshold (replay; the agent has levels instead).
    pub threshold: f64,
    /// Intervals kept per peer.
    pub window: u32,
    /// Floor on the standard deviation (normal, akka, loss, both windows of 2w, and the
    /// decay scale of empirical).
    pub min_std_ms: f64,
    /// Acceptable heartbeat pause, added to the mean (phi models; chen and bertier: to the
    /// freshness point; empirical: to every sample).
    pub pause_ms: f64,
    /// First-interval estimate; the window starts with two samples around it. 0: none.
    pub first_interval_ms: f64,
    /// Intervals longer than this are not counted (Cassandra's cap). None: all are.
    pub max_interval_ms: Option<f64>,
    /// Intervals longer than this many window means are outages, not samples; 0: none are.
    pub outage_factor: u32,
    /// The timeout of the `fixed` model.
    pub timeout_ms: f64,
    /// Safety margin added to the expected arrival (`chen`; `bertier`, on top of Jacobson's
    /// margin). None: the model's default (`Model::default_alpha_ms`).
    pub alpha_ms: Option<f64>,
    /// Intervals in the short window of `2w` (at most `window`; more are taken as `window`).
    pub window_short: u32,
    /// The mean detection time the `budget` model meets per peer, ms.
    pub budget_ms: f64,
}

/// Which intervals enter a peer's window: the rules the kernel applies (`monitor_common::slot`)
/// as a detector's parameters set them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowRules {
    /// Intervals kept per peer.
    pub window: u32,
    /// Intervals longer than this are not counted; None: all are.
    pub max_interval_ms: Option<f64>,
    /// Intervals longer than this many window means are outages; 0: none are.
    pub outage_factor: u32,
    /// Only intervals between consecutive heartbeats enter (`WindowNeeds::gapless`).
    pub gapless: bool,
}

impl DetectorParams {
    pub const DEFAULT: Self = Self {
        model: Model::Normal,
        threshold: 8.0,
        window: 128,
        // From the frontier over the generated and recorded traces (docs/tuning.md, "Defaults
        // from evidence"): 50 ms is on or below the fixed, akka and exponential frontiers at
        // every budget from 300 ms on, where 25 ms was not.
        min_std_ms: 50.0,
        pause_ms: 0.0,
        first_interval_ms: 100.0,
        max_interval_ms: None,
        outage_factor: 4,
        timeout_ms: 1000.0,
        alpha_ms: None,
        window_short: 5,
        budget_ms: super::models::budget::DEFAULT_BUDGET_MS,
    };

    /// The model these parameters name, with its parameters.
    #[inline]
    pub fn phi_model(&self) -> AnyModel {
        self.model.with_params(self)
    }

    /// The window's rules for these parameters: the agent loads them into the XDP program,
    /// replay runs the same rules with them.
    pub fn window_rules(&self) -> WindowRules {
        WindowRules {
            window: self.window,
            max_interval_ms: self.max_interval_ms,
            outage_factor: self.outage_factor,
            gapless: self.phi_model().window_needs().gapless,
        }
    }

    /// Whether `estimate` needs the window's intervals themselves, not only their sums.
    #[inline]
    pub fn needs_ring(&self) -> bool {
        struct Needs;
        impl ModelFn for Needs {
            type Out = WindowNeeds;
            #[inline(always)]
            fn call<M: PhiModel>(self, model: M) -> WindowNeeds {
                model.window_needs()
            }
        }
        self.model.apply(self, Needs).ring
    }

    /// The safety margin in effect: `alpha_ms`, else the model's default, else 0.
    pub fn alpha(&self) -> f64 {
        self.alpha_ms
            .or(self.model.default_alpha_ms())
            .unwrap_or(0.0)
    }

    /// The window as the ring models see it (µs, oldest first): see `WindowView::intervals_us`.
    #[cfg(test)]
    fn window_us(&self, ring: &[u32], first_us: u64) -> Vec<u64> {
        super::models::intervals_us(self.window, ring, first_us)
    }

    /// The distribution a peer's silence is judged against, from its record and, for the
    /// models that `needs_ring`, the window's intervals (µs, oldest first; else empty).
    pub fn estimate(&self, record: &PeerRecord, ring: &[u32]) -> Estimate {
        let first_us = self.first_us(record);
        let first_ms = first_us as f64 / 1000.0;
        let sums = WindowSums::from_record(record);
        let (mean, std) = sums
            .with_bootstrap(self.window, first_us)
            .moments_ms()
            .unwrap_or((first_ms, first_ms / 4.0));
        let shape = self.phi_model().shape(&WindowView {
            record,
            ring,
            window: self.window,
            first_us,
            mean_ms: mean,
            std_ms: std,
        });
        Estimate {
            mean_ms: mean + self.pause_ms,
            std_ms: std.max(self.min_std_ms),
            pause_ms: self.pause_ms,
            shape,
        }
    }

    /// phi after `silence_ms` without a heartbeat.
    #[inline]
    pub fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        struct Phi<'a>(&'a Estimate, f64);
        impl ModelFn for Phi<'_> {
            type Out = f64;
            #[inline(always)]
            fn call<M: PhiModel>(self, model: M) -> f64 {
                model.phi(self.0, self.1)
            }
        }
        self.model.apply(self, Phi(estimate, silence_ms))
    }

    /// Per-level constants for finding, without evaluating phi, the silence at which phi
    /// reaches each level (see `LevelSilences`). For `loss` they give the normal model's
    /// crossing, a lower bound of its own (see `crossing_ms`).
    pub fn level_silences(&self, levels: &[f64]) -> LevelSilences {
        let model = self.phi_model();
        let k = levels
            .iter()
            .map(|&level| model.level_constant(level))
            .collect();
        LevelSilences { model, k }
    }

    /// What bounds the window's mean from below over the next few intervals, from the record's
    /// sums alone (see `MeanFloor`). None with fewer than 4 intervals, or for the models whose
    /// estimate is not a function of the mean alone (`needs_ring`).
    pub fn mean_floor(&self, record: &PeerRecord) -> Option<MeanFloor> {
        if self.needs_ring() || record.samples < 4 {
            return None;
        }
        let sums = WindowSums::from_record(record);
        let (mean_ms, std_ms) = sums.moments_ms()?;
        Some(MeanFloor {
            samples: sums.samples as u64,
            window: self.window.max(sums.samples) as u64,
            sum_us: sums.sum_us as f64,
            mean_us: mean_ms * 1000.0,
            std_us: std_ms * 1000.0,
            first_us: self.first_us(record),
        })
    }

    /// The interval the bootstrap samples stand around (µs): the one the peer announces it
    /// sends at, where its packets say so (a BFD session: `PeerRecord::announced_interval_us`,
    /// whose rules are the passive side's), else `first_interval_ms`.
    pub fn first_us(&self, record: &PeerRecord) -> u64 {
        record
            .announced_interval_us()
            .unwrap_or_else(|| (self.first_interval_ms * 1000.0).round() as u64)
    }

    /// The least silence (ms) at which phi can reach `levels[index]` for any estimate whose
    /// window mean is at least `mean_floor_ms` (see `MeanFloor`): the deviation is at
    /// least the floor `min_std_ms`, and loss only ever lowers phi. None where no such bound is
    /// cheap (a level below the mean's phi, the ring models).
    #[inline]
    pub fn crossing_floor_ms(
        &self,
        silences: &LevelSilences,
        index: usize,
        mean_floor_ms: f64,
    ) -> Option<f64> {
        struct Floor(f64, f64);
        impl ModelFn for Floor {
            type Out = Option<f64>;
            #[inline(always)]
            fn call<M: PhiModel>(self, model: M) -> Option<f64> {
                model.crossing_floor_ms(self.0, self.1)
            }
        }
        self.model
            .apply(self, Floor(silences.k[index], mean_floor_ms))
    }

    /// The silence (ms) at which phi reaches `levels[index]` for this estimate: exact for
    /// every model. Closed form where the model has one (`chen`, `bertier`: the freshness
    /// point; `2w`: the later of its windows' crossings; `empirical`: a sample, or on the decay
    /// past the largest its closed form); for `loss`, a bisection between the
    /// normal crossing (phi_loss <= phi_normal: losing heartbeats only makes a silence more
    /// likely) and a bracket doubled until phi reaches the level.
    pub fn crossing_ms(
        &self,
        silences: &LevelSilences,
        index: usize,
        level: f64,
        estimate: &Estimate,
    ) -> f64 {
        self.phi_model()
            .crossing_ms(silences.k[index], level, estimate)
    }
}

impl Default for DetectorParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A window's intervals as far as a floor under its future mean needs them: count, sum,
/// moments, and the bootstrap rule (`DetectorParams::mean_floor`).
#[derive(Debug, Clone, Copy)]
pub struct MeanFloor {
    samples: u64,
    window: u64,
    sum_us: f64,
    mean_us: f64,
    std_us: f64,
    first_us: u64,
}

impl MeanFloor {
    /// A floor under the window's mean (ms, before pause, bootstrap samples included as the
    /// estimate includes them) that holds until `more` further intervals have entered the
    /// window. Each new interval is at least 0; once the window is full it pushes out the
    /// oldest, and the e oldest of n samples of mean m and deviation s cannot sum to more than
    /// `e m + s sqrt(e (n - e))` (Cauchy-Schwarz on deviations that sum to zero). The floor is
    /// the least such mean over 0..=`more` new intervals.
    pub fn after_ms(&self, more: u64) -> f64 {
        let (n, window, sum) = (self.samples, self.window, self.sum_us);
        let mut floor_us = f64::INFINITY;
        // In a full window each new interval pushes one out, and the mean's floor only falls
        // with every one: the last is the least (the common case, one evaluation).
        let from = if n == window { more } else { 0 };
        for j in from..=more {
            let kept = window.min(n + j);
            let evicted = n + j - kept;
            let evicted_us = if evicted == 0 {
                0.0
            } else if evicted >= n {
                sum
            } else {
                let e = evicted as f64;
                (e * self.mean_us + self.std_us * (e * (n - evicted) as f64).sqrt()).min(sum)
            };
            let (boot_n, boot_us) = bootstrap_samples(window as u32, kept as u32, self.first_us)
                .fold((0u64, 0u64), |(c, s), x| (c + 1, s + x));
            let mean = ((sum - evicted_us).max(0.0) + boot_us as f64) / (kept + boot_n) as f64;
            floor_us = floor_us.min(mean);
        }
        // A relative hair for rounding, always downwards.
        floor_us * (1.0 - 1e-9) / 1000.0
    }

    /// The window's length in intervals.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// A floor under a full window's mean (ms, before pause) that holds until `more` further
    /// intervals have entered it, once `heard` intervals have entered it since these moments
    /// were taken and summed to at least `heard_us` (every one entered: the last-heard word
    /// says so, see `monitor_common::last_heard::LEFT_OUT_STEP`). As in
    /// [`Self::after_ms`], with what the heard intervals brought in counted: after j of them
    /// in all (j up to `heard + more`, at most the window), the window holds the n - j newest
    /// of its intervals, which sum to at least `sum - j m - s sqrt(j (n - j))`, and the j new
    /// ones, which sum to at least `heard_us`. None for a window that is not full, or past it.
    pub fn after_heard_ms(&self, heard: u64, heard_us: f64, more: u64) -> Option<f64> {
        let n = self.samples;
        let last = heard + more;
        if n != self.window || last > n {
            return None;
        }
        // sqrt(j (n - j)) is largest at n / 2: its largest over heard..=last.
        let widest = (n / 2).clamp(heard, last) as f64;
        let evicted_us = (last as f64 * self.mean_us
            + self.std_us * (widest * (n as f64 - widest)).sqrt())
        .min(self.sum_us);
        let mean_us = ((self.sum_us - evicted_us).max(0.0) + heard_us.max(0.0)) / n as f64;
        Some(mean_us * (1.0 - 1e-9) / 1000.0)
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
    /// The freshness point (`chen`, `bertier`): expected arrival and margin.
    Freshness(Freshness),
    /// The window's intervals, sorted (`empirical`).
    Empirical(EmpiricalTail),
    /// The short window's estimate (`2w`); the long one is the estimate's mean and deviation.
    TwoWindows(ShortWindow),
    /// The deadline rule chosen for the window and its phi curve (`budget`).
    Budget(BudgetRule),
}

/// For each level, the constant k from which the crossing silence follows in a multiply-add:
/// normal and akka: mean + k std; exponential: k mean; fixed: k; 2w: the later of
/// mean + k std over its two windows. For chen, bertier and empirical k is the level itself and
/// the crossing comes from the estimate's shape (the freshness point; the first sample or point
/// of the decay where phi reaches the level). Each model says its own (`PhiModel`).
#[derive(Debug, Clone, PartialEq)]
pub struct LevelSilences {
    /// The model the constants are for, which finds the silences from them.
    model: AnyModel,
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
    #[inline(always)]
    pub fn silence_ms(&self, index: usize, estimate: &Estimate) -> f64 {
        self.model.silence_ms(self.k[index], estimate)
    }
}

#[cfg(test)]
mod tests {
    use monitor_common::{
        config::{XDP_FLAG_GAPLESS_WINDOW, XdpConfig},
        passive::{BFD_UP, SOURCE_BFD},
    };

    use super::*;
    use crate::detector::window::slot_with_intervals;

    /// The estimate of a window holding `intervals_us`, every interval counted.
    fn estimate_of(p: &DetectorParams, intervals_us: impl IntoIterator<Item = u64>) -> Estimate {
        let c = XdpConfig {
            window: 128,
            ..XdpConfig::DEFAULT
        };
        p.estimate(&slot_with_intervals(intervals_us, &c).record(), &[])
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

    /// The estimate of a window holding `intervals_us`, with its ring, as replay makes it.
    fn ring_estimate_of(p: &DetectorParams, intervals_us: &[u64]) -> Estimate {
        let c = p.window_config();
        let slot = slot_with_intervals(intervals_us.iter().copied(), &c);
        let ring: Vec<u32> = monitor_common::slot::window_intervals(&slot, c.window).collect();
        assert!(p.needs_ring());
        p.estimate(&slot.record(), &ring)
    }

    const RING_MODELS: [Model; 4] = [
        Model::Chen,
        Model::Bertier,
        Model::Empirical,
        Model::TwoWindows,
    ];

    #[test]
    fn ring_models_are_named_for_the_cli_and_serde() {
        for (model, name) in RING_MODELS
            .into_iter()
            .zip(["chen", "bertier", "empirical", "2w"])
        {
            assert_eq!(model.name(), name);
            assert_eq!(Model::from_name(name), Some(model));
            assert_eq!(
                serde_json::to_string(&model).unwrap(),
                format!("\"{name}\"")
            );
            assert!(params(model).needs_ring());
        }
        assert!(!params(Model::Normal).needs_ring());
        // Chen's schedule is the heartbeats': intervals that span a loss stay out of it.
        for (model, gapless) in RING_MODELS.into_iter().zip([true, true, false, false]) {
            let flags = params(model).window_config().flags;
            assert_eq!(flags & XDP_FLAG_GAPLESS_WINDOW != 0, gapless, "{model:?}");
        }
    }

    #[test]
    fn chen_and_bertier_through_the_estimate() {
        // 100, 100, 100, 130 ms: Chen's EA is 98.5 ms after the last arrival (see chen.rs).
        let window = [100_000, 100_000, 100_000, 130_000];
        let chen = DetectorParams {
            alpha_ms: Some(40.0),
            pause_ms: 10.0,
            ..params(Model::Chen)
        };
        let e = ring_estimate_of(&chen, &window);
        let Shape::Freshness(f) = e.shape else {
            panic!("{e:?}")
        };
        assert!((f.at_ms() - (98.5 + 40.0 + 10.0)).abs() < 1e-9, "{f:?}");
        assert_eq!(chen.phi(&e, 148.4), 0.0);
        assert!(chen.phi(&e, 148.5).is_infinite());
        // Bertier on 100, 100, 130, 100: EA 104.5, Jacobson margin 15.45 (see bertier.rs),
        // plus alpha 0 by default.
        let bertier = params(Model::Bertier);
        let e = ring_estimate_of(&bertier, &[100_000, 100_000, 130_000, 100_000]);
        let Shape::Freshness(f) = e.shape else {
            panic!("{e:?}")
        };
        assert!((f.at_ms() - (104.5 + 15.45)).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn bootstrap_samples_lead_the_ring() {
        // No interval yet: the two bootstrap samples 75 and 125 ms are the window, and Chen's
        // EA of them is 2/3 75 + 1/3 125 = 91.67 ms.
        let p = DetectorParams {
            first_interval_ms: 100.0,
            alpha_ms: Some(0.0),
            ..params(Model::Chen)
        };
        let e = ring_estimate_of(&p, &[]);
        let Shape::Freshness(f) = e.shape else {
            panic!("{e:?}")
        };
        assert!((f.expected_ms - (50.0 + 125.0 / 3.0)).abs() < 1e-9, "{f:?}");
        assert_eq!(
            p.window_us(&[90_000], 100_000),
            vec![75_000, 125_000, 90_000]
        );
        let small = DetectorParams { window: 3, ..p };
        assert_eq!(small.window_us(&[1, 2], 100_000), vec![125_000, 1, 2]);
        assert_eq!(small.window_us(&[1, 2, 3], 100_000), vec![1, 2, 3]);
    }

    #[test]
    fn a_bfd_session_is_seeded_with_the_interval_it_announces() {
        let p = params(Model::Normal);
        let mut record = PeerRecord::admitted_passive(1, 0, SOURCE_BFD);
        record.bfd_desired_min_tx_us = 300_000;
        record.bfd_state = BFD_UP;
        let e = p.estimate(&record, &[]);
        assert!((e.mean_ms - 300.0).abs() < 1e-9, "{e:?}");
        // Not Up: once a second at the fastest, whatever it announces.
        record.bfd_state = monitor_common::passive::BFD_DOWN;
        let e = p.estimate(&record, &[]);
        assert!((e.mean_ms - 1000.0).abs() < 1e-9, "{e:?}");
        record.bfd_desired_min_tx_us = 2_000_000;
        let e = p.estimate(&record, &[]);
        assert!((e.mean_ms - 2000.0).abs() < 1e-9, "{e:?}");
        record.bfd_state = BFD_UP;
        // Before its first packet (no timers yet), and for other peers: first_interval_ms.
        record.bfd_desired_min_tx_us = 0;
        let e = p.estimate(&record, &[]);
        assert!((e.mean_ms - p.first_interval_ms).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn two_windows_through_the_estimate() {
        // Twenty intervals of 100 ms, then five of 200 ms: the short window (5) is N(200, 0),
        // floored to 10; the long one is N(120, 40) (mean (2000 + 1000) / 25, variance
        // 20/25 * 20^2 + 5/25 * 80^2 = 1600).
        let p = DetectorParams {
            min_std_ms: 10.0,
            outage_factor: 0,
            ..params(Model::TwoWindows)
        };
        let mut window = vec![100_000; 20];
        window.extend([200_000; 5]);
        let e = ring_estimate_of(&p, &window);
        assert!((e.mean_ms - 120.0).abs() < 1e-9 && (e.std_ms - 40.0).abs() < 1e-9);
        assert_eq!(
            e.shape,
            Shape::TwoWindows(ShortWindow {
                mean_ms: 200.0,
                std_ms: 10.0
            })
        );
        // At 210 ms the long window says 2.25 deviations late (phi 1.91), the short one 1
        // deviation late (P = 0.15865525393145705): the short one, lower, judges.
        let phi = p.phi(&e, 210.0);
        assert!(
            (phi - -(0.158_655_253_931_457_05f64).log10()).abs() < 1e-12,
            "{phi}"
        );
        // window_short = 1: the last interval alone.
        let one = DetectorParams {
            window_short: 1,
            ..p.clone()
        };
        let Shape::TwoWindows(s) = ring_estimate_of(&one, &[100_000, 100_000, 150_000]).shape
        else {
            panic!()
        };
        assert_eq!((s.mean_ms, s.std_ms), (150.0, 10.0));
    }

    #[test]
    fn empirical_through_the_estimate() {
        let p = DetectorParams {
            min_std_ms: 25.0,
            ..params(Model::Empirical)
        };
        let e = ring_estimate_of(&p, &[90_000, 100_000, 100_000, 110_000, 120_000]);
        // The hand-computed values of empirical.rs: 3/6 later at 100 ms, 1/6 at 120.
        assert!((p.phi(&e, 100.0) - 2f64.log10()).abs() < 1e-15);
        assert!((p.phi(&e, 120.0) - 6f64.log10()).abs() < 1e-15);
    }

    /// Windows on which every ring model is checked.
    fn test_windows() -> Vec<Vec<u64>> {
        vec![
            vec![],
            vec![100_000],
            vec![100_000, 100_000, 130_000, 100_000],
            (0..128u64).map(|i| 80_000 + (i * 7919) % 50_000).collect(),
            (0..60u64)
                .map(|i| if i % 10 == 9 { 290_000 } else { 100_000 })
                .collect(),
        ]
    }

    #[test]
    fn crossings_are_exact_for_the_ring_models() {
        let levels = [0.5, 1.0, 3.0, 8.0, 12.0, 40.0];
        for model in RING_MODELS {
            for first in [0.0, 100.0] {
                for window in test_windows() {
                    let p = DetectorParams {
                        first_interval_ms: first,
                        min_std_ms: 5.0,
                        pause_ms: if first > 0.0 { 20.0 } else { 0.0 },
                        ..params(model)
                    };
                    let e = ring_estimate_of(&p, &window);
                    let table = p.level_silences(&levels);
                    for (i, &level) in levels.iter().enumerate() {
                        let t = p.crossing_ms(&table, i, level, &e);
                        assert_eq!(t, table.silence_ms(i, &e), "{model:?}");
                        let at = p.phi(&e, t);
                        assert!(at >= level - 1e-9, "{model:?} {level}: phi({t}) = {at}");
                        if t > 1e-3 {
                            let before = p.phi(&e, t - 1e-3);
                            assert!(
                                before < level,
                                "{model:?} {level}: phi({t} - 1us) = {before}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ring_models_grow_with_silence() {
        for model in RING_MODELS {
            for window in test_windows() {
                let p = DetectorParams {
                    min_std_ms: 5.0,
                    ..params(model)
                };
                let e = ring_estimate_of(&p, &window);
                let mut last = 0.0;
                for i in 0..4000 {
                    let phi = p.phi(&e, i as f64 * 0.5);
                    assert!(phi >= last, "{model:?} at {} ms", i as f64 * 0.5);
                    last = phi;
                }
                assert!(
                    last >= 8.0,
                    "{model:?}: 2 s of silence is convicted ({last})"
                );
            }
        }
    }

    /// The parameters of the floor tests' case `case`: windows of 8, 32 and 128, deviation
    /// floors of 0, 5 and 50 ms, and a pause in one case of five.
    fn floor_case(model: Model, case: usize) -> DetectorParams {
        DetectorParams {
            model,
            window: [8, 32, 128][case % 3],
            min_std_ms: [0.0, 5.0, 50.0][case % 3],
            pause_ms: if case.is_multiple_of(5) { 30.0 } else { 0.0 },
            ..DetectorParams::DEFAULT
        }
    }

    /// The floor of `MeanFloor::after_ms` and `crossing_floor_ms` holds: whatever the next `more`
    /// heartbeats bring (kept or refused by the kernel's rules, short, long, after losses),
    /// the exact crossing of the first level never comes before it, for every model that
    /// offers one, in full windows and in windows still filling (with their bootstrap
    /// samples); and with no further heartbeat the floor is at most the exact crossing.
    #[test]
    fn crossing_floors_hold_for_the_next_heartbeats() {
        let mut rng = fastrand::Rng::with_seed(7);
        let levels = [1.0, 3.0, 8.0];
        let mut checked = 0;
        for model in [
            Model::Normal,
            Model::Akka,
            Model::Loss,
            Model::Exponential,
            Model::Fixed,
        ] {
            for case in 0..300 {
                let p = floor_case(model, case);
                let config = p.window_config();
                let silences = p.level_silences(&levels);
                let base = [10_000u64, 100_000, 1_000_000][rng.usize(0..3)];
                let jitter = |rng: &mut fastrand::Rng| match rng.u8(0..10) {
                    0 => rng.u64(0..base * 20),
                    1 => rng.u64(0..base / 10 + 1),
                    _ => base + rng.u64(0..base / 5 + 1) - base / 10,
                };
                let count = if case % 4 == 0 {
                    rng.usize(0..p.window as usize)
                } else {
                    p.window as usize + rng.usize(0..40)
                };
                let intervals: Vec<u64> = (0..count).map(|_| jitter(&mut rng)).collect();
                let mut slot = slot_with_intervals(intervals, &config);
                let more = 1 + rng.u64(0..32);
                let Some(floor) = p.mean_floor(&slot.record()).map(|f| f.after_ms(more)) else {
                    continue;
                };
                checked += 1;
                let crossing = |slot: &monitor_common::maps::PeerSlot, index: usize| {
                    let est = p.estimate(&slot.record(), &[]);
                    p.crossing_ms(&silences, index, levels[index], &est)
                };
                for index in 0..levels.len() {
                    let Some(bound) = p.crossing_floor_ms(&silences, index, floor) else {
                        continue;
                    };
                    assert!(
                        bound <= crossing(&slot, index) + 1e-9,
                        "{model:?} case {case}"
                    );
                }
                let mut at = slot.record().last_arrival_ns;
                let mut seq = slot.record().last_seq;
                for step in 0..more {
                    at += jitter(&mut rng) * 1000;
                    seq += 1 + (rng.u8(0..8) == 0) as u64 * rng.u64(1..4);
                    monitor_common::slot::arrive(&mut slot, at, seq, 1, &config);
                    let bound = p.crossing_floor_ms(&silences, 0, floor).unwrap();
                    let exact = crossing(&slot, 0);
                    assert!(
                        bound <= exact + 1e-9,
                        "{model:?} case {case} step {step}: floor {bound} > crossing {exact}"
                    );
                }
            }
        }
        // Most windows had 4 intervals or more (fewer have no floor).
        assert!(checked > 1000, "{checked} of 1500 cases checked");
    }

    /// The floor of `MeanFloor::after_heard_ms` holds: after some heartbeats whose intervals
    /// all entered a full window, counted by their elapsed time as the agent counts them (the
    /// arrivals' difference in ns, less 1 µs an interval), and whatever the next `more` bring
    /// while every interval enters, the first level's exact crossing never comes before it.
    #[test]
    fn floors_from_heard_heartbeats_hold() {
        let mut rng = fastrand::Rng::with_seed(11);
        let mut checked = 0;
        for model in [Model::Normal, Model::Akka, Model::Loss, Model::Exponential] {
            for case in 0..300 {
                let p = floor_case(model, case);
                let config = p.window_config();
                let silences = p.level_silences(&[1.0]);
                let base = [10_000u64, 100_000, 1_000_000][rng.usize(0..3)];
                // One case in four is a steady sender with no deviation to hide behind: there
                // the floor is within a hair of the exact crossing.
                let steady = case % 4 == 1;
                let jitter = |rng: &mut fastrand::Rng| match rng.u8(0..10) {
                    _ if steady => base,
                    0 => rng.u64(0..base * 3),
                    1 => rng.u64(0..base / 10 + 1),
                    _ => base + rng.u64(0..base / 5 + 1) - base / 10,
                } * 1000
                    // Some nanoseconds, so that intervals are rounded down to microseconds.
                    + rng.u64(0..1000);
                let count = p.window as usize + rng.usize(0..40);
                let spread = if steady { 1 } else { base / 2 };
                let intervals: Vec<u64> = (0..count).map(|_| base + rng.u64(0..spread)).collect();
                let mut slot = slot_with_intervals(intervals, &config);
                let floor = p.mean_floor(&slot.record()).unwrap();
                let (t0, left_out) = (slot.record().last_arrival_ns, slot.record().left_out);
                let mut seq = slot.record().last_seq;
                let mut arrive = |slot: &mut monitor_common::maps::PeerSlot, rng: &mut _| {
                    seq += 1;
                    let at = slot.record().last_arrival_ns + jitter(rng);
                    monitor_common::slot::arrive(slot, at, seq, 1, &config);
                    slot.record().left_out == left_out
                };
                let heard = rng.u64(0..p.window as u64);
                if !(0..heard).all(|_| arrive(&mut slot, &mut rng)) {
                    continue;
                }
                let heard_us = (slot.record().last_arrival_ns - t0) as f64 / 1000.0 - heard as f64;
                let more = rng.u64(0..33);
                let Some(mean) = floor.after_heard_ms(heard, heard_us, more) else {
                    assert!(heard + more > p.window as u64);
                    continue;
                };
                checked += 1;
                let bound = p.crossing_floor_ms(&silences, 0, mean).unwrap();
                for step in 0..=more {
                    let est = p.estimate(&slot.record(), &[]);
                    let exact = p.crossing_ms(&silences, 0, 1.0, &est);
                    assert!(
                        bound <= exact + 1e-9,
                        "{model:?} case {case} heard {heard} step {step}: floor {bound} > {exact}"
                    );
                    if step < more && !arrive(&mut slot, &mut rng) {
                        break;
                    }
                }
            }
        }
        assert!(checked > 600, "{checked} of 1200 cases checked");
    }
}
