//! The expected mistakes of a deadline, from the window: how likely the next anchored interval
//! is to come later than a given aim, with or without loss. The allocation
//! ([`super::alloc`]) weighs them against the time the aim spends.

use crate::detector::tail;

/// The window's anchored intervals under the chosen rule, sorted, with their mean and
/// deviation: the next one is taken as exchangeable with them. `tail_std` is the deviation
/// the tail past the longest is drawn with: the window's, floored as the curve's is
/// (`min_std_ms`), since a window of 128 tells nothing of how often the path does what it
/// did not do within them.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    pub sorted: &'a [f64],
    pub mean: f64,
    pub tail_std: f64,
}

/// The least deviation the tail past the window's longest interval is drawn with (ms): a
/// window of identical intervals still leaves the next a little room.
const MIN_TAIL_STD_MS: f64 = 1e-3;

impl Window<'_> {
    /// P(the next anchored interval > t). Within the window, the share of the n + 1 places the
    /// next one may take among the sorted n that lie beyond t: (#{s > t} + 1) / (n + 1) at a
    /// sample, so 1 / (n + 1) at the longest, not 0 (a window of 128 leaves the next beyond
    /// its longest one time in 129). Past the longest, that 1 / (n + 1) falls off as the
    /// normal of the window's mean and `tail_std` does past it: the shape of the tail is the
    /// normal's, its weight the window's.
    pub fn later(&self, t: f64) -> f64 {
        let n = self.sorted.len();
        let Some(&longest) = self.sorted.last() else {
            return 0.0;
        };
        let beyond = n - self.sorted.partition_point(|&v| v <= t);
        let places = (n + 1) as f64;
        if beyond > 0 {
            return (beyond + 1) as f64 / places;
        }
        let std = self.tail_std.max(MIN_TAIL_STD_MS);
        // log10 P(Z > z_t) - log10 P(Z > z_longest), at most 0.
        let drop = tail::log10_upper_tail((t - self.mean) / std)
            - tail::log10_upper_tail((longest - self.mean) / std);
        10f64.powf(drop.min(0.0)) / places
    }

    /// The expected mistakes of an aim `a` after a heartbeat whose next one comes after a gap
    /// with chance `gap.p` (then after k lost, k periods later, k geometric in `gap.q`):
    /// the chance that the next heartbeat comes later than the deadline.
    pub fn misses(&self, a: f64, gap: Option<&Gap>) -> f64 {
        let Some(gap) = gap.filter(|g| g.p > 0.0 && g.period > 0.0) else {
            return self.later(a);
        };
        let mut total = (1.0 - gap.p) * self.later(a);
        // After k >= 1 losses: P(K = k) = p (1 - q) q^(k-1); the rest counted as misses.
        let mut at_least = gap.p;
        for k in 1..=MAX_LOST {
            let exactly = at_least * (1.0 - gap.q);
            total += exactly * self.later(a - k as f64 * gap.period);
            at_least -= exactly;
            if at_least < 1e-9 {
                break;
            }
        }
        total + at_least.max(0.0)
    }
}

/// Most losses in a row the expected mistakes follow; the chance of more counts as a miss.
const MAX_LOST: usize = 16;

/// The chance that the next heartbeat comes after a gap, in the peer's current state, and
/// the chance that a loss is followed by another (from the kernel's counters:
/// [`super::GapOdds`]), with the period a loss adds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    pub p: f64,
    pub q: f64,
    pub period: f64,
}
