//! `fixed`: a plain timeout, phi 0 before it and infinite from it on. Its spec is a kind of
//! its own, `fixed:timeout_ms=...`: a timeout never looks at the window.

use super::{ModelInfo, ModelSpec, PhiModel, SpecKey};
use crate::detector::{
    model::{DetectorParams, Estimate},
    spec::positive,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fixed {
    pub timeout_ms: f64,
}

impl ModelInfo for Fixed {
    const NAME: &'static str = "fixed";
    const SPEC: ModelSpec = ModelSpec {
        own_kind: Some(("fixed", &["outage_factor"])),
        keys: &[SpecKey {
            name: "timeout_ms",
            parse: |params, value| {
                params.timeout_ms = positive("timeout_ms", value)?;
                Ok(())
            },
        }],
        finish: |_, _| Ok(()),
        // The outage rule only shows in its counters, so the timeout says what ran.
        format: |params| vec![format!("timeout_ms={}", params.timeout_ms)],
    };

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            timeout_ms: params.timeout_ms,
        }
    }
}

impl PhiModel for Fixed {
    fn phi(&self, _estimate: &Estimate, silence_ms: f64) -> f64 {
        if silence_ms >= self.timeout_ms {
            f64::INFINITY
        } else {
            0.0
        }
    }

    /// The timeout, whatever the level.
    fn level_constant(&self, _level: f64) -> f64 {
        self.timeout_ms
    }

    fn silence_ms(&self, k: f64, _estimate: &Estimate) -> f64 {
        k
    }

    fn crossing_floor_ms(&self, k: f64, _mean_floor_ms: f64, _std_floor_ms: f64) -> Option<f64> {
        Some(k)
    }
}
