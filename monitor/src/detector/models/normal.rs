//! `normal`: the exact normal tail of Hayashibara et al. (2004), phi = -log10 P(X > t) for X
//! normal with the window's mean (plus the pause) and deviation (floored).

use super::{ModelInfo, PauseAndFloor, PhiModel, mean_plus_k_std, standardised};
use crate::detector::{
    model::{DetectorParams, Estimate},
    tail,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normal(pub PauseAndFloor);

impl ModelInfo for Normal {
    const NAME: &'static str = "normal";

    fn from_params(params: &DetectorParams) -> Self {
        Self(PauseAndFloor::of(params))
    }
}

impl PhiModel for Normal {
    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        standardised(
            silence_ms,
            estimate.mean_ms,
            estimate.std_ms,
            tail::normal_phi,
        )
    }

    /// The standardised deviate at which the tail reaches the level.
    fn level_constant(&self, level: f64) -> f64 {
        tail::invert(tail::normal_phi, level)
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        mean_plus_k_std(k, estimate.mean_ms, estimate.std_ms)
    }

    fn crossing_floor_ms(&self, k: f64, mean_floor_ms: f64, std_floor_ms: f64) -> Option<f64> {
        self.0.standardised_floor(k, mean_floor_ms, std_floor_ms)
    }
}
