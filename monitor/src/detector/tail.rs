//! The upper tail of the standard normal distribution in log space, accurate far beyond the
//! point where 1 - CDF underflows, and the inversion of phi-like functions.

use std::f64::consts::{LN_10, PI};

/// Below this |x| (x = z / sqrt 2), libm's erfc is accurate to a few ulps and far from
/// underflow (erfc(14) is about 1e-87); beyond it the continued fraction takes over.
const ERFC_DIRECT_LIMIT: f64 = 14.0;

/// log10 P(Z > z) for Z ~ N(0, 1).
pub fn log10_upper_tail(z: f64) -> f64 {
    if z.is_nan() {
        return f64::NAN;
    }
    let x = z / std::f64::consts::SQRT_2;
    if x < ERFC_DIRECT_LIMIT {
        return (0.5 * libm::erfc(x)).log10();
    }
    // erfc(x) = exp(-x^2) * erfcx(x), so ln P = -x^2 + ln(erfcx(x) / 2): no underflow.
    (-x * x + (erfcx_continued_fraction(x) / 2.0).ln()) / LN_10
}

/// erfcx(x) = exp(x^2) erfc(x) for large x, from the continued fraction
/// erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))).
/// At x >= 14 forty terms are far more than double precision needs.
fn erfcx_continued_fraction(x: f64) -> f64 {
    let mut f = x;
    for k in (1..=40).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    1.0 / (PI.sqrt() * f)
}

/// phi of a standard normal deviate: -log10 P(Z > z).
pub fn normal_phi(z: f64) -> f64 {
    -log10_upper_tail(z)
}

/// The smallest x with f(x) >= target, for f non-decreasing; bisection to full precision.
/// Used once per level (not per peer), so its cost does not matter.
pub fn invert(f: impl Fn(f64) -> f64, target: f64) -> f64 {
    invert_from(f, target, -64.0, 0.0)
}

/// The smallest x >= `lo` with f(x) >= target (`lo` itself when f(lo) already is), for f
/// non-decreasing: a bracket doubled from max(2 lo, 1) until f reaches the target, then
/// bisection until the bracket is no wider than `tolerance` (0: to full precision).
pub fn invert_from(f: impl Fn(f64) -> f64, target: f64, lo: f64, tolerance: f64) -> f64 {
    let mut lo = lo;
    let mut hi = if lo > 0.0 { 2.0 * lo } else { 1.0 };
    while f(hi) < target {
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    if f(lo) >= target {
        return lo;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if hi - lo <= tolerance || mid <= lo || mid >= hi {
            break;
        }
        if f(mid) >= target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    #[test]
    fn matches_reference_tail_values() {
        // Upper-tail probabilities of N(0,1), from standard tables (Abramowitz & Stegun 26.2,
        // and R's pnorm(z, lower.tail = FALSE)).
        let cases = [
            (0.0, 0.5),
            (1.0, 0.158_655_253_931_457_05),
            (2.0, 0.022_750_131_948_179_21),
            (3.0, 0.001_349_898_031_630_094_6),
            (5.0, 2.866_515_718_791_939e-7),
            (10.0, 7.619_853_024_160_527e-24),
            (-1.0, 0.841_344_746_068_542_9),
        ];
        for (z, p) in cases {
            let got = 10f64.powf(log10_upper_tail(z));
            assert!(close(got, p, 1e-12), "z={z}: {got} vs {p}");
        }
    }

    #[test]
    fn far_tail_keeps_going_where_the_probability_underflows() {
        // log10 Q(z) for large z from the asymptotic expansion
        // Q(z) ~ phi(z)/z * (1 - 1/z^2 + 3/z^4 - 15/z^6), evaluated in log space by hand:
        // z = 40: ln Q = -800 - ln(40 sqrt(2 pi)) + ln(1 - 1/z^2 + 3/z^4 - 15/z^6 + 105/z^8).
        let z2: f64 = 1600.0;
        let series = 1.0 - 1.0 / z2 + 3.0 / z2.powi(2) - 15.0 / z2.powi(3) + 105.0 / z2.powi(4);
        let expected = (-800.0 - (40.0 * (2.0 * PI).sqrt()).ln() + series.ln()) / LN_10;
        assert!(
            close(log10_upper_tail(40.0), expected, 1e-12),
            "{}",
            log10_upper_tail(40.0)
        );
        // Where erfc itself underflows to zero (z ~ 38.5 for f64), phi stays finite and grows.
        let mut last = normal_phi(30.0);
        for z in [38.0, 39.0, 50.0, 1e3, 1e6] {
            let phi = normal_phi(z);
            assert!(phi.is_finite() && phi > last, "z={z}: {phi}");
            last = phi;
        }
        // phi ~ z^2 / (2 ln 10) far out.
        assert!(close(normal_phi(1e6), 1e12 / (2.0 * LN_10), 1e-6));
    }

    #[test]
    fn both_branches_agree_at_the_switch() {
        // Both methods at the same points around the switch.
        for x in [
            ERFC_DIRECT_LIMIT - 0.5,
            ERFC_DIRECT_LIMIT,
            ERFC_DIRECT_LIMIT + 0.5,
        ] {
            let direct = (0.5 * libm::erfc(x)).log10();
            let fraction = (-x * x + (erfcx_continued_fraction(x) / 2.0).ln()) / LN_10;
            assert!(
                close(direct, fraction, 1e-13),
                "x={x}: {direct} vs {fraction}"
            );
        }
    }

    #[test]
    fn inversion_recovers_the_deviate() {
        for level in [0.5, 1.0, 3.0, 8.0, 16.0, 100.0, 1000.0] {
            let z = invert(normal_phi, level);
            assert!(close(normal_phi(z), level, 1e-12), "level {level}");
        }
        // 1 - 1e-8 quantile of N(0,1) is 5.612001244174965 (R: qnorm(1e-8, lower.tail=FALSE)).
        assert!(close(invert(normal_phi, 8.0), 5.612_001_244_174_965, 1e-12));
    }
}
