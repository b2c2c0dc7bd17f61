//! Bertier, Marin and Sens (2002), "Implementation and performance evaluation of an adaptable
//! failure detector" (DSN 2002): Chen's expected arrival plus a margin that follows the
//! network, Jacobson's RTT estimator applied to the arrival errors:
//!
//!   error_k = A_k - EA_k - delay_k
//!   delay_{k+1} = delay_k + gamma error_k
//!   var_{k+1} = var_k + gamma (|error_k| - var_k)
//!   alpha_{k+1} = beta delay_{k+1} + phi var_{k+1},   tau_{k+1} = EA_{k+1} + alpha_{k+1}
//!
//! with the published gamma = 0.1, beta = 1, phi = 4. Here it is a pure function of the
//! window: the recursion starts at delay = var = 0 with the oldest interval and runs over the
//! window in order, each EA_k being Chen's estimate from the intervals before k in the window
//! (`chen::ArrivalSums`), so the kernel's ring is all the state it needs.

use super::{
    ModelInfo, ModelSpec, PhiModel, WindowNeeds, WindowView,
    chen::{ALPHA_KEY, Freshness, format_alpha},
};
use crate::detector::model::{DetectorParams, Shape};

use super::chen::ArrivalSums;

/// Gain of both recursions (Bertier et al.'s gamma).
pub const GAMMA: f64 = 0.1;
/// Weight of the mean error in the margin (beta).
pub const BETA: f64 = 1.0;
/// Weight of the mean absolute error in the margin (Bertier et al.'s phi, not suspicion phi).
pub const PHI: f64 = 4.0;

/// Jacobson's estimator after the whole window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Margin {
    /// Chen's expected arrival after the last heartbeat, ms (EA - A_n); None for an empty
    /// window.
    pub expected_ms: Option<f64>,
    /// Smoothed error of the arrivals against their expected times, ms.
    pub delay_ms: f64,
    /// Smoothed absolute deviation of that error, ms.
    pub var_ms: f64,
}

impl Margin {
    /// beta delay + phi var, ms.
    pub fn alpha_ms(&self) -> f64 {
        BETA * self.delay_ms + PHI * self.var_ms
    }
}

/// Runs the recursion over a window of intervals (ms, oldest first).
pub fn margin(intervals_ms: &[f64]) -> Margin {
    let mut sums = ArrivalSums::default();
    let (mut delay, mut var) = (0.0f64, 0.0f64);
    for &x in intervals_ms {
        // A_k - EA_k: the interval just ended minus the expected one from the intervals
        // before it; the first interval has no expectation yet.
        if let Some(expected) = sums.expected_ms() {
            let error = x - expected - delay;
            delay += GAMMA * error;
            var += GAMMA * (error.abs() - var);
        }
        sums.push(x);
    }
    Margin {
        expected_ms: sums.expected_ms(),
        delay_ms: delay,
        var_ms: var,
    }
}

/// The `bertier` model: Chen's expected arrival plus Jacobson's margin, `alpha_ms` (0 by
/// default: the margin is Jacobson's, as published) and the pause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bertier {
    /// The safety margin in effect on top of Jacobson's (`DetectorParams::alpha`).
    pub alpha_ms: f64,
    pub pause_ms: f64,
}

impl ModelInfo for Bertier {
    const NAME: &'static str = "bertier";
    const ABOUT: Option<&'static str> =
        Some("Chen's expected arrival plus Bertier et al.'s Jacobson margin (binary)");
    const SPEC: ModelSpec = ModelSpec {
        own_kind: None,
        keys: &[ALPHA_KEY],
        finish: |params, _| {
            params.alpha_ms.get_or_insert(0.0);
            Ok(())
        },
        format: format_alpha,
    };
    const DEFAULT_ALPHA_MS: Option<f64> = Some(0.0);

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            alpha_ms: params.alpha(),
            pause_ms: params.pause_ms,
        }
    }
}

impl PhiModel for Bertier {
    /// As `chen`: the window is the sending schedule.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: true,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        let jacobson = margin(&super::intervals_ms(window));
        Shape::Freshness(Freshness {
            expected_ms: jacobson.expected_ms.unwrap_or(window.mean_ms),
            margin_ms: jacobson.alpha_ms() + self.alpha_ms + self.pause_ms,
        })
    }
    // phi, the level constants and the crossing: the trait's, by the estimate's shape.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_window_has_no_margin() {
        let m = margin(&[100.0; 64]);
        assert!((m.expected_ms.unwrap() - 100.0).abs() < 1e-9);
        assert!(m.delay_ms.abs() < 1e-9 && m.var_ms.abs() < 1e-9, "{m:?}");
        assert_eq!(margin(&[]), Margin::default());
    }

    #[test]
    fn recursion_by_hand() {
        // Intervals 100, 100, 130, 100 ms (arrivals at 0, 100, 200, 330, 430).
        // k = 2: EA from [100] is 100; error = 100 - 100 - 0 = 0: delay 0, var 0.
        // k = 3: EA from [100, 100] is 100; error = 130 - 100 - 0 = 30:
        //        delay = 3, var = 0 + 0.1 (30 - 0) = 3.
        // k = 4: EA from [100, 100, 130]: eta = 110, 110 * 2.5 - (100 + 200 + 390) / 4 = 102.5;
        //        error = 100 - 102.5 - 3 = -5.5: delay = 3 - 0.55 = 2.45,
        //        var = 3 + 0.1 (5.5 - 3) = 3.25.
        // EA after the window, from all four: eta = 107.5, 107.5 * 3 - (100 + 200 + 390 + 400) / 5
        // = 322.5 - 218 = 104.5. alpha = 1 * 2.45 + 4 * 3.25 = 15.45.
        let m = margin(&[100.0, 100.0, 130.0, 100.0]);
        assert!((m.delay_ms - 2.45).abs() < 1e-12, "{m:?}");
        assert!((m.var_ms - 3.25).abs() < 1e-12, "{m:?}");
        assert!((m.expected_ms.unwrap() - 104.5).abs() < 1e-12, "{m:?}");
        assert!((m.alpha_ms() - 15.45).abs() < 1e-12);
    }

    #[test]
    fn a_constant_lateness_is_learnt_at_rate_gamma() {
        // One step of the recursion from delay = var = 0 with error e gives delay = var = 0.1 e:
        // after the first late arrival the margin is (beta + phi) 0.1 e = 0.5 e.
        let m = margin(&[100.0, 100.0, 140.0]);
        assert!((m.delay_ms - 4.0).abs() < 1e-12 && (m.var_ms - 4.0).abs() < 1e-12);
        assert!((m.alpha_ms() - 20.0).abs() < 1e-12);
    }
}
