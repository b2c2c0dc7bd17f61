//! `loss`: loss-aware normal. The silence may span lost heartbeats, weighted by the peer's
//! measured loss and burstiness (the maths: `detector::loss`); its window holds only the
//! intervals between consecutive heartbeats, the loss being counted apart.

use super::{
    ModelInfo, PauseAndFloor, PhiModel, WindowNeeds, WindowView, mean_plus_k_std, phi_as_normal,
};
use crate::detector::{
    loss::LossOdds,
    model::{DetectorParams, Estimate, Shape},
    tail,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loss(pub PauseAndFloor);

impl ModelInfo for Loss {
    const NAME: &'static str = "loss";
    const ABOUT: Option<&'static str> =
        Some("Loss-aware normal: a mixture over the number of consecutive lost heartbeats");

    fn from_params(params: &DetectorParams) -> Self {
        Self(PauseAndFloor::of(params))
    }
}

impl PhiModel for Loss {
    /// It weighs lost heartbeats through its counters, not as long intervals.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: false,
            gapless: true,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        Shape::Loss(LossOdds::from_record(window.record))
    }

    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        match &estimate.shape {
            Shape::Loss(odds) => odds.phi(
                silence_ms,
                estimate.mean_ms - estimate.pause_ms,
                estimate.std_ms,
                estimate.pause_ms,
            ),
            _ => phi_as_normal(estimate, silence_ms),
        }
    }

    /// The normal model's constant: its crossing is a lower bound of this model's
    /// (`crossing_ms`).
    fn level_constant(&self, level: f64) -> f64 {
        tail::invert(tail::normal_phi, level)
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        mean_plus_k_std(k, estimate.mean_ms, estimate.std_ms)
    }

    /// A bisection between the normal crossing (phi_loss <= phi_normal: losing heartbeats
    /// only makes a silence more likely) and a bracket doubled until phi reaches the level.
    fn crossing_ms(&self, k: f64, level: f64, estimate: &Estimate) -> f64 {
        let lower = self.silence_ms(k, estimate);
        match &estimate.shape {
            Shape::Loss(odds) if !odds.is_lossless() => {
                // To a microsecond: deadlines are kept in nanoseconds, sweeps are milliseconds.
                tail::invert_from(|t| self.phi(estimate, t), level, lower.max(0.0), 1e-3)
            }
            _ => lower,
        }
    }

    /// As `normal`'s: loss only ever lowers phi.
    fn crossing_floor_ms(&self, k: f64, mean_floor_ms: f64, std_floor_ms: f64) -> Option<f64> {
        self.0.standardised_floor(k, mean_floor_ms, std_floor_ms)
    }
}
