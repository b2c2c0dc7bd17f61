//! Satzger, Pietzowski, Trumler and Ungerer (2007), "A new adaptive accrual failure detector
//! for dependable distributed systems" (ACM SAC 2007): no distribution is assumed; phi is the
//! empirical tail of the window's intervals,
//!
//!   phi(t) = -log10 P_later(t),   P_later(t) = (#{x in window : x > t} + 1) / (n + 1)
//!
//! Smoothing: one pseudo-sample later than any silence (the +1s), so a silence longer than
//! some but not all samples has a finite phi, and the tail never reaches 0 inside the window
//! (Satzger et al.'s raw fraction would be 0, phi infinite, at the largest sample).
//!
//! Past the largest sample x_max the window says nothing; there the tail decays exponentially
//! from its last value with the window's standard deviation (floored by `min_std_ms`) as scale:
//!
//!   P_later(t) = exp(-(t - x_max) / s) / (n + 1),   phi = log10(n + 1) + (t - x_max) / (s ln 10)
//!
//! continuous at x_max, one more unit of phi every s ln 10 of silence (the tail of an
//! exponential distribution with the window's spread). A silence shorter than every sample has
//! phi 0. The pause shifts every sample (the curve moves right by `pause_ms`). An empty window
//! (no bootstrap) decays from a silence of 0 with n = 0.

use super::{ModelInfo, PauseAndFloor, PhiModel, WindowNeeds, WindowView};
use crate::detector::model::{DetectorParams, Shape};

use std::f64::consts::LN_10;

/// The tail of one window, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct EmpiricalTail {
    /// The window's intervals plus the pause, ascending, ms.
    sorted_ms: Vec<f64>,
    /// Decay scale past the largest sample, ms (the floored deviation).
    scale_ms: f64,
    /// Where the decay starts: the largest sample plus the pause (the pause alone if empty).
    last_ms: f64,
}

impl EmpiricalTail {
    /// From the window's intervals (ms, any order), the decay scale and the pause.
    pub fn new(intervals_ms: impl IntoIterator<Item = f64>, scale_ms: f64, pause_ms: f64) -> Self {
        let mut sorted_ms: Vec<f64> = intervals_ms.into_iter().map(|x| x + pause_ms).collect();
        sorted_ms.sort_by(f64::total_cmp);
        let last_ms = sorted_ms.last().copied().unwrap_or(pause_ms);
        Self {
            sorted_ms,
            scale_ms,
            last_ms,
        }
    }

    pub fn samples(&self) -> usize {
        self.sorted_ms.len()
    }

    /// log10(n + 1): phi at the largest sample, where the decay takes over.
    fn phi_at_last(&self) -> f64 {
        ((self.sorted_ms.len() + 1) as f64).log10()
    }

    /// phi after `silence_ms` without a heartbeat.
    pub fn phi(&self, silence_ms: f64) -> f64 {
        let n = self.sorted_ms.len();
        if n > 0 && silence_ms < self.last_ms {
            let later = n - self.sorted_ms.partition_point(|&x| x <= silence_ms);
            return ((n + 1) as f64 / (later + 1) as f64).log10();
        }
        let beyond = silence_ms - self.last_ms;
        if beyond <= 0.0 {
            return self.phi_at_last().max(0.0);
        }
        if self.scale_ms <= 0.0 {
            // No spread to decay with: certain to have arrived just after the largest sample.
            return f64::INFINITY;
        }
        self.phi_at_last() + beyond / (self.scale_ms * LN_10)
    }

    /// The smallest silence (ms) at which phi >= `level`: a sample (phi steps at each), or on
    /// the decay, its closed form nudged up to the first float where phi reaches the level.
    pub fn crossing_ms(&self, level: f64) -> f64 {
        if level <= 0.0 {
            return 0.0;
        }
        if level <= self.phi_at_last() && !self.sorted_ms.is_empty() {
            // phi is a right-continuous step function that only moves at samples and reaches
            // log10(n + 1) at the largest, so the first sample where phi >= level is the answer.
            let i = self.sorted_ms.partition_point(|&x| self.phi(x) < level);
            return self.sorted_ms[i];
        }
        if self.scale_ms <= 0.0 {
            return self.last_ms.next_up();
        }
        let mut t = self.last_ms + (level - self.phi_at_last()) * self.scale_ms * LN_10;
        while self.phi(t) < level {
            t = t.next_up();
        }
        t
    }
}

/// The `empirical` model: the window's own tail, decaying past its largest sample with the
/// floored deviation as scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Empirical(pub PauseAndFloor);

impl ModelInfo for Empirical {
    const NAME: &'static str = "empirical";
    const ABOUT: Option<&'static str> = Some("Satzger et al.'s empirical tail of the window");

    fn from_params(params: &DetectorParams) -> Self {
        Self(PauseAndFloor::of(params))
    }
}

impl PhiModel for Empirical {
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: false,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        Shape::Empirical(EmpiricalTail::new(
            super::intervals_ms(window),
            window.std_ms.max(self.0.min_std_ms),
            self.0.pause_ms,
        ))
    }
    // phi, the level constants and the crossing: the trait's, by the estimate's shape.
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail() -> EmpiricalTail {
        // 90, 100, 100, 110, 120 ms: n = 5, scale 25 ms (a floor above the 10.2 ms deviation).
        EmpiricalTail::new([100.0, 90.0, 120.0, 100.0, 110.0], 25.0, 0.0)
    }

    #[test]
    fn tail_by_hand() {
        let t = tail();
        // Shorter than every sample: (5 + 1) / 6, phi 0.
        assert_eq!(t.phi(0.0), 0.0);
        assert_eq!(t.phi(89.9), 0.0);
        // At 95: four samples later, (4 + 1) / 6, phi = log10 1.2 = 0.07918124604762482.
        assert!((t.phi(95.0) - 0.079_181_246_047_624_82).abs() < 1e-15);
        // At 100 (a sample is not later than itself): two later, 3/6, phi = log10 2.
        assert!((t.phi(100.0) - 2f64.log10()).abs() < 1e-15);
        // At the largest sample: 1/6, phi = log10 6 = 0.7781512503836436.
        assert!((t.phi(120.0) - 0.778_151_250_383_643_6).abs() < 1e-15);
        // One unit of phi per 25 ln 10 = 57.564627324851145 ms beyond it.
        assert!((t.phi(120.0 + 57.564_627_324_851_145) - 1.778_151_250_383_643_6).abs() < 1e-12);
    }

    #[test]
    fn crossings_are_the_smallest_silences() {
        let t = tail();
        // phi first reaches 0.3 = log10 2 - 0.001 at the sample 100 (3/6 there, 5/6 below).
        assert_eq!(t.crossing_ms(0.3), 100.0);
        assert_eq!(t.crossing_ms(2f64.log10()), 100.0);
        // log10 6 exactly: the largest sample.
        assert_eq!(t.crossing_ms(6f64.log10()), 120.0);
        for level in [0.05, 0.5, 0.78, 1.0, 3.0, 8.0, 40.0] {
            let c = t.crossing_ms(level);
            assert!(t.phi(c) >= level, "level {level}: phi({c}) = {}", t.phi(c));
            assert!(t.phi(c - 1e-6) < level, "level {level} at {c}");
        }
        // phi 8: 120 + (8 - log10 6) 25 ln 10 = 120 + 7.2218487496 * 57.5646273 = 535.7230 ms.
        assert!((t.crossing_ms(8.0) - 535.723_031_868_107_8).abs() < 1e-6);
    }

    #[test]
    fn pause_shifts_and_empty_window_decays_from_zero() {
        let shifted = EmpiricalTail::new([100.0, 90.0, 120.0, 100.0, 110.0], 25.0, 1000.0);
        assert_eq!(shifted.phi(1100.0), tail().phi(100.0));
        assert_eq!(shifted.crossing_ms(0.3), 1100.0);
        let empty = EmpiricalTail::new([], 10.0, 0.0);
        assert_eq!(empty.phi(0.0), 0.0);
        assert!((empty.phi(10.0 * LN_10) - 1.0).abs() < 1e-12);
        let no_spread = EmpiricalTail::new([100.0, 100.0], 0.0, 0.0);
        assert!((no_spread.phi(100.0) - 3f64.log10()).abs() < 1e-15);
        assert!(no_spread.phi(100.001).is_infinite());
        assert_eq!(no_spread.crossing_ms(1.0), 100f64.next_up());
    }

    #[test]
    fn grows_with_silence() {
        let t = tail();
        let mut last = -1.0;
        for i in 0..4000 {
            let phi = t.phi(i as f64 * 0.5);
            assert!(phi >= last && phi.is_finite(), "{i}");
            last = phi;
        }
    }
}
