//! Tomsic, Sens, Garcia, Arantes and Sopena (2015), "2W-FD: A failure detector algorithm with
//! QoS" (IPDPS 2015): two windows over the same arrivals, a short one that follows a sudden
//! change of the network at once and a long one that keeps the estimate stable, and the more
//! conservative of the two judges. The paper takes the later of two freshness points
//! (Chen's estimate on each window); here each window gives a normal estimate, as `normal`
//! does, and the more conservative one is the lower phi:
//!
//!   phi(t) = min(phi_N(t; mean_long, std_long), phi_N(t; mean_short, std_short))
//!
//! Both estimates get the pause and the deviation floor. The short window is the newest
//! `window_short` intervals of the long one (bootstrap samples included while they are still
//! among them). Since phi_N is monotone in t, phi reaches a level at the later of the two
//! windows' crossings: mean + k std with the same k = phi_N^{-1}(level) for both.

use monitor_common::maps::MAX_WINDOW;

use super::{
    ModelInfo, ModelSpec, PauseAndFloor, PhiModel, SpecKey, WindowNeeds, WindowView, standardised,
};
use crate::detector::{
    model::{DetectorParams, Estimate, Shape},
    tail::{self, normal_phi},
    window::WindowSums,
};

/// The short window's estimate, after pause and floor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShortWindow {
    pub mean_ms: f64,
    pub std_ms: f64,
}

/// phi of a silence: the lower of the two windows' normal phis.
pub fn phi(long_mean_ms: f64, long_std_ms: f64, short: &ShortWindow, silence_ms: f64) -> f64 {
    let long = standardised(silence_ms, long_mean_ms, long_std_ms, normal_phi);
    let short = standardised(silence_ms, short.mean_ms, short.std_ms, normal_phi);
    long.min(short)
}

/// The silence at which phi reaches the level whose standardised crossing is `k`: the later
/// of the two windows' crossings.
pub fn crossing_ms(k: f64, long_mean_ms: f64, long_std_ms: f64, short: &ShortWindow) -> f64 {
    let one = |mean: f64, std: f64| if std <= 0.0 { mean } else { mean + k * std };
    one(long_mean_ms, long_std_ms).max(one(short.mean_ms, short.std_ms))
}

/// The `2w` model: the lower phi of a short window (the newest `window_short` intervals) and
/// the long one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwoWindows {
    /// Intervals in the short window (more than the window are taken as the window).
    pub window_short: u32,
    pub floors: PauseAndFloor,
}

impl ModelInfo for TwoWindows {
    const NAME: &'static str = "2w";
    const ABOUT: Option<&'static str> = Some("2W-FD: the lower phi of a short and a long window");
    const SPEC: ModelSpec = ModelSpec {
        own_kind: None,
        keys: &[SpecKey {
            name: "window_short",
            parse: |params, value| {
                let w: u32 = value
                    .parse()
                    .map_err(|_| format!("window_short {value:?} is not an integer"))?;
                if !(1..=MAX_WINDOW as u32).contains(&w) {
                    return Err(format!("window_short must be 1..=window, got {w}"));
                }
                params.window_short = w;
                Ok(())
            },
        }],
        // 1..=window; omitted and larger than `window`, it is taken as `window`.
        finish: |params, given| {
            if params.window_short > params.window {
                if given.contains(&"window_short") {
                    return Err(format!(
                        "window_short must be 1..=window ({}), got {}",
                        params.window, params.window_short
                    ));
                }
                params.window_short = params.window;
            }
            Ok(())
        },
        format: |params| {
            vec![format!(
                "window_short={}",
                params.window_short.min(params.window)
            )]
        },
    };

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            window_short: params.window_short,
            floors: PauseAndFloor::of(params),
        }
    }
}

impl PhiModel for TwoWindows {
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: false,
        }
    }

    fn shape(&self, window: &WindowView<'_>) -> Shape {
        let window_us = window.intervals_us();
        let short = self.window_short.clamp(1, window.window.max(1)) as usize;
        let newest = &window_us[window_us.len().saturating_sub(short)..];
        let (m, s) = WindowSums::of(newest.iter().copied())
            .moments_ms()
            .unwrap_or((window.mean_ms, window.std_ms));
        Shape::TwoWindows(ShortWindow {
            mean_ms: m + self.floors.pause_ms,
            std_ms: s.max(self.floors.min_std_ms),
        })
    }

    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        super::phi_by_shape(estimate, silence_ms)
    }

    /// The normal deviate at which each window's tail reaches the level.
    fn level_constant(&self, level: f64) -> f64 {
        tail::invert(tail::normal_phi, level)
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        super::silence_by_shape(k, estimate, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::{tail::invert, window::WindowSums};

    #[test]
    fn moments_by_hand() {
        // 2, 4, 4, 4, 5, 5, 7, 9 ms: mean 5, population std 2.
        let xs = [2000, 4000, 4000, 4000, 5000, 5000, 7000, 9000];
        assert_eq!(WindowSums::of(xs).moments_ms(), Some((5.0, 2.0)));
        assert_eq!(WindowSums::of([]).moments_ms(), None);
    }

    #[test]
    fn the_lower_phi_judges() {
        // Long window N(100, 10), short N(150, 20) (the path just slowed down). At t = 130 the
        // long window is 3 deviations late, P = 0.0013498980316300946 (A&S 26.2), phi 2.8697;
        // the short one is 1 deviation early, P = 0.8413447460685429, phi 0.0750: the short
        // window judges.
        let short = ShortWindow {
            mean_ms: 150.0,
            std_ms: 20.0,
        };
        let p = phi(100.0, 10.0, &short, 130.0);
        assert!(
            (p - -(0.841_344_746_068_542_9f64).log10()).abs() < 1e-12,
            "{p}"
        );
        // Once the short window is back at the long one's level, the long window judges.
        let calm = ShortWindow {
            mean_ms: 90.0,
            std_ms: 10.0,
        };
        let p = phi(100.0, 10.0, &calm, 130.0);
        assert!(
            (p - -(0.001_349_898_031_630_094_6f64).log10()).abs() < 1e-12,
            "{p}"
        );
    }

    #[test]
    fn crossing_is_the_later_one() {
        // phi 8 at mean + 5.612001244174965 std (R: qnorm(1e-8, lower.tail = FALSE)):
        // long 100 + 56.12 = 156.12, short 150 + 112.24 = 262.24 ms.
        let k = invert(normal_phi, 8.0);
        let short = ShortWindow {
            mean_ms: 150.0,
            std_ms: 20.0,
        };
        let t = crossing_ms(k, 100.0, 10.0, &short);
        assert!(
            (t - (150.0 + 20.0 * 5.612_001_244_174_965)).abs() < 1e-9,
            "{t}"
        );
        assert!((phi(100.0, 10.0, &short, t) - 8.0).abs() < 1e-9);
        assert!(phi(100.0, 10.0, &short, t - 1e-3) < 8.0);
    }
}
