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
//!
//! `mean_floor` holds the floor under a window's future mean; `estimate` what a model judges
//! a silence by (`Estimate`, its `Shape`) and the level constants (`LevelSilences`).

mod estimate;
mod mean_floor;
#[cfg(test)]
mod tests;

use monitor_common::maps::PeerRecord;

pub use self::{
    estimate::{Estimate, LevelSilences, Shape},
    mean_floor::MeanFloor,
};
pub use super::models::{
    Model, akka::akka_phi, budget::BudgetRule, chen::Freshness, empirical::EmpiricalTail,
    two_windows::ShortWindow,
};
use super::{
    models::{AnyModel, ModelFn, PhiModel, WindowNeeds, WindowView},
    window::WindowSums,
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
        self.estimate_with(record, ring, None)
    }

    /// The peer's next estimate after `previous`, its last: as `estimate`, for a model that
    /// carries state from one to the next (`budget`) with that state.
    pub fn estimate_after(
        &self,
        record: &PeerRecord,
        ring: &[u32],
        previous: &Estimate,
    ) -> Estimate {
        self.estimate_with(record, ring, Some(previous))
    }

    fn estimate_with(
        &self,
        record: &PeerRecord,
        ring: &[u32],
        previous: Option<&Estimate>,
    ) -> Estimate {
        let first_us = self.first_us(record);
        let first_ms = first_us as f64 / 1000.0;
        let sums = WindowSums::from_record(record);
        let (mean, std) = sums
            .with_bootstrap(self.window, first_us)
            .moments_ms()
            .unwrap_or((first_ms, first_ms / 4.0));
        let window = WindowView {
            record,
            ring,
            window: self.window,
            first_us,
            mean_ms: mean,
            std_ms: std,
        };
        let model = self.phi_model();
        let shape = match previous {
            Some(previous) => model.shape_after(&window, previous),
            None => model.shape(&window),
        };
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
        let first_us = self.first_us(record);
        // The window as the estimate takes it, bootstrap samples and all.
        let all = sums.with_bootstrap(self.window, first_us);
        let (_, all_std_ms) = all.moments_ms()?;
        Some(MeanFloor {
            samples: sums.samples as u64,
            window: self.window.max(sums.samples) as u64,
            sum_us: sums.sum_us as f64,
            mean_us: mean_ms * 1000.0,
            std_us: std_ms * 1000.0,
            first_us,
            all_values: all.samples as u64,
            all_std_us: all_std_ms * 1000.0,
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
    /// window mean is at least `mean_floor_ms` and window deviation at least `std_floor_ms`
    /// (see `MeanFloor`; 0 for none known): the deviation is also at least the floor
    /// `min_std_ms`, and loss only ever lowers phi. None where no such bound is cheap (a
    /// level below the mean's phi, the ring models).
    #[inline]
    pub fn crossing_floor_ms(
        &self,
        silences: &LevelSilences,
        index: usize,
        mean_floor_ms: f64,
        std_floor_ms: f64,
    ) -> Option<f64> {
        struct Floor(f64, f64, f64);
        impl ModelFn for Floor {
            type Out = Option<f64>;
            #[inline(always)]
            fn call<M: PhiModel>(self, model: M) -> Option<f64> {
                model.crossing_floor_ms(self.0, self.1, self.2)
            }
        }
        self.model
            .apply(self, Floor(silences.k[index], mean_floor_ms, std_floor_ms))
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
