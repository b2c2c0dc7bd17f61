//! Chen, Toueg and Aguilera (2002), "On the quality of service of failure detectors" (IEEE
//! Transactions on Computers 51(5)), the NFD-E detector: the next heartbeat's expected
//! arrival, estimated from the last n arrivals, plus a constant safety margin alpha;
//! suspected from that freshness point on.
//!
//!   EA_{n+1} = (1/(n+1)) * sum_{i=0..n} (A_i - i eta) + (n+1) eta,   tau = EA_{n+1} + alpha
//!
//! The window holds n consecutive intervals x_1..x_n (oldest first), that is n + 1 arrivals
//! A_0..A_n; the sending period eta is not known here, so the window's mean interval stands in
//! for it. Measured from the last arrival A_n this is
//!
//!   EA - A_n = eta (n/2 + 1) - (1/(n+1)) * sum_{j=1..n} j x_j,   eta = (1/n) sum_j x_j
//!
//! a weighted mean of the intervals (the weights sum to 1): equal intervals x give x, and a late
//! last arrival brings the next expected one closer, as the sending schedule does. An interval
//! the window rules left out (`monitor_common::slot`) is simply absent: the window's intervals
//! are taken as consecutive.

use super::{ModelInfo, ModelSpec, PhiModel, SpecKey, WindowNeeds, WindowView};
use crate::detector::{
    model::{DetectorParams, Shape},
    spec::non_negative,
};

/// Where the binary models (`chen`, `bertier`) put the freshness point, relative to the last
/// arrival: phi is 0 before `at_ms()` and infinite from it on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Freshness {
    /// Expected arrival of the next heartbeat after the last one, ms (Chen's EA - A_n).
    pub expected_ms: f64,
    /// Everything added to it: the model's margin, `alpha_ms` and the pause, ms.
    pub margin_ms: f64,
}

impl Freshness {
    /// The freshness point: the silence (ms) from which the peer is suspected. Never
    /// negative (a last heartbeat that came after its successor's freshness point leaves the
    /// peer suspected at once, as in Chen's NFD-E).
    pub fn at_ms(&self) -> f64 {
        (self.expected_ms + self.margin_ms).max(0.0)
    }

    /// phi of a silence: 0 before the freshness point, infinite from it on.
    pub fn phi(&self, silence_ms: f64) -> f64 {
        if silence_ms >= self.at_ms() {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

/// Running sums of a window prefix, from which Chen's expected arrival follows in O(1):
/// `bertier` walks the window with it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArrivalSums {
    /// Intervals so far (n).
    pub n: u32,
    /// sum_j x_j, ms.
    pub sum_ms: f64,
    /// sum_j j x_j, ms (j = 1 for the oldest).
    pub weighted_ms: f64,
}

impl ArrivalSums {
    pub fn push(&mut self, interval_ms: f64) {
        self.n += 1;
        self.sum_ms += interval_ms;
        self.weighted_ms += self.n as f64 * interval_ms;
    }

    /// EA - A_n (ms) for the intervals pushed so far; None before the first.
    pub fn expected_ms(&self) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let n = self.n as f64;
        let eta = self.sum_ms / n;
        Some(eta * (n / 2.0 + 1.0) - self.weighted_ms / (n + 1.0))
    }
}

/// Chen's expected arrival after the last one (ms) for a window of intervals (ms, oldest
/// first); None for an empty window.
pub fn expected_arrival_ms(intervals_ms: &[f64]) -> Option<f64> {
    let mut sums = ArrivalSums::default();
    for &x in intervals_ms {
        sums.push(x);
    }
    sums.expected_ms()
}

/// The `chen` model: the freshness point is Chen's expected arrival plus `alpha_ms` and the
/// pause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chen {
    /// The safety margin in effect (`DetectorParams::alpha`).
    pub alpha_ms: f64,
    pub pause_ms: f64,
}

/// `alpha_ms` when not given (docs/tuning.md).
pub const DEFAULT_ALPHA_MS: f64 = 150.0;

/// The safety margin, a key of `chen` and `bertier`.
pub const ALPHA_KEY: SpecKey = SpecKey {
    name: "alpha_ms",
    parse: |params, value| {
        params.alpha_ms = Some(non_negative("alpha_ms", value)?);
        Ok(())
    },
};

/// The margin in effect, as the canonical spec prints it (parameters built without a spec,
/// `monitor run --model chen`, print the model's default, which parses back the same).
pub(crate) fn format_alpha(params: &DetectorParams) -> Vec<String> {
    vec![format!("alpha_ms={}", params.alpha())]
}

impl ModelInfo for Chen {
    const NAME: &'static str = "chen";
    const ABOUT: Option<&'static str> =
        Some("Chen et al.'s expected arrival plus `alpha_ms` (binary)");
    const SPEC: ModelSpec = ModelSpec {
        own_kind: None,
        keys: &[ALPHA_KEY],
        finish: |params, _| {
            params.alpha_ms.get_or_insert(DEFAULT_ALPHA_MS);
            Ok(())
        },
        format: format_alpha,
    };
    const DEFAULT_ALPHA_MS: Option<f64> = Some(DEFAULT_ALPHA_MS);

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            alpha_ms: params.alpha(),
            pause_ms: params.pause_ms,
        }
    }
}

impl PhiModel for Chen {
    /// It reads the window as the sending schedule, on which a lost heartbeat is not a late
    /// one.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: true,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        let window_ms = super::intervals_ms(window);
        Shape::Freshness(Freshness {
            expected_ms: expected_arrival_ms(&window_ms).unwrap_or(window.mean_ms),
            margin_ms: self.alpha_ms + self.pause_ms,
        })
    }
    // phi, the level constants and the crossing: the trait's, by the estimate's shape.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_arrival_by_hand() {
        // Arrivals at 0, 100, 200, 300, 430 ms: eta = 430 / 4 = 107.5, offsets from the
        // schedule A_i - i eta: 0, -7.5, -15, -22.5, 0; their mean is -9, so
        // EA_5 = -9 + 5 * 107.5 = 528.5, that is 98.5 ms after the last arrival (430).
        let ea = expected_arrival_ms(&[100.0, 100.0, 100.0, 130.0]).unwrap();
        assert!((ea - 98.5).abs() < 1e-12, "{ea}");
        // The same through the weights 3/4 - j/5 = 0.55, 0.35, 0.15, -0.05.
        let weighted = 0.55 * 100.0 + 0.35 * 100.0 + 0.15 * 100.0 - 0.05 * 130.0;
        assert!((ea - weighted).abs() < 1e-12);
        // A steady sender: the next is one interval away.
        assert!((expected_arrival_ms(&[250.0; 128]).unwrap() - 250.0).abs() < 1e-9);
        // One interval: it is the estimate (n = 1: weight 3/2 - 1/2 = 1).
        assert_eq!(expected_arrival_ms(&[70.0]), Some(70.0));
        assert_eq!(expected_arrival_ms(&[]), None);
    }

    #[test]
    fn an_early_last_arrival_pushes_the_next_expected_one_out() {
        // Arrivals at 0, 100, 200, 300, 370: the last came 30 ms early against a 92.5 ms
        // schedule; offsets 0, 7.5, 15, 22.5, 0 average 9, EA_5 = 9 + 5 * 92.5 = 471.5,
        // 101.5 ms after 370.
        let ea = expected_arrival_ms(&[100.0, 100.0, 100.0, 70.0]).unwrap();
        assert!((ea - 101.5).abs() < 1e-12, "{ea}");
    }

    #[test]
    fn freshness_is_a_step() {
        let f = Freshness {
            expected_ms: 100.0,
            margin_ms: 50.0,
        };
        assert_eq!(f.phi(149.999), 0.0);
        assert!(f.phi(150.0).is_infinite());
        let late = Freshness {
            expected_ms: -30.0,
            margin_ms: 10.0,
        };
        assert_eq!(late.at_ms(), 0.0);
        assert!(late.phi(0.0).is_infinite());
    }
}
