//! `akka`: Akka's PhiAccrualFailureDetector, the normal tail by a logistic approximation
//! (`akka_phi`), on the same estimate as `normal`.

use std::f64::consts::LN_10;

use super::{ModelInfo, PauseAndFloor, PhiModel, mean_plus_k_std, standardised};
use crate::detector::{
    model::{DetectorParams, Estimate},
    tail,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Akka(pub PauseAndFloor);

impl ModelInfo for Akka {
    const NAME: &'static str = "akka";

    fn from_params(params: &DetectorParams) -> Self {
        Self(PauseAndFloor::of(params))
    }
}

impl PhiModel for Akka {
    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        standardised(silence_ms, estimate.mean_ms, estimate.std_ms, akka_phi)
    }

    /// The standardised deviate at which Akka's phi reaches the level.
    fn level_constant(&self, level: f64) -> f64 {
        tail::invert(akka_phi, level)
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        mean_plus_k_std(k, estimate.mean_ms, estimate.std_ms)
    }

    fn crossing_floor_ms(&self, k: f64, mean_floor_ms: f64, std_floor_ms: f64) -> Option<f64> {
        self.0.standardised_floor(k, mean_floor_ms, std_floor_ms)
    }
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
