//! `exponential`: Cassandra's FailureDetector, phi = t / (mean ln 10), the tail of an
//! exponential distribution of the window's mean (plus the pause).

use std::f64::consts::LN_10;

use super::{ModelInfo, PhiModel};
use crate::detector::model::{DetectorParams, Estimate};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exponential {
    pub pause_ms: f64,
}

impl ModelInfo for Exponential {
    const NAME: &'static str = "exponential";

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            pause_ms: params.pause_ms,
        }
    }
}

impl PhiModel for Exponential {
    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        let mean_ms = estimate.mean_ms;
        if mean_ms <= 0.0 {
            return if silence_ms > 0.0 { f64::INFINITY } else { 0.0 };
        }
        (silence_ms / (mean_ms * LN_10)).max(0.0)
    }

    /// The crossing in means: phi reaches `level` at `level ln 10` means of silence.
    fn level_constant(&self, level: f64) -> f64 {
        level * LN_10
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        k * estimate.mean_ms
    }

    fn crossing_floor_ms(&self, k: f64, mean_floor_ms: f64, _std_floor_ms: f64) -> Option<f64> {
        (k >= 0.0).then_some(k * (mean_floor_ms + self.pause_ms))
    }
}
