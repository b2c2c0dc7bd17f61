//! A floor under a window's mean over the next few intervals, from its sums alone: what lets
//! a sweep renew a peer's deadlines without reading its slot.

use super::super::window::bootstrap_samples;

/// A window's intervals as far as a floor under its future mean needs them: count, sum,
/// moments, and the bootstrap rule (`DetectorParams::mean_floor`).
#[derive(Debug, Clone, Copy)]
pub struct MeanFloor {
    pub(super) samples: u64,
    pub(super) window: u64,
    pub(super) sum_us: f64,
    pub(super) mean_us: f64,
    pub(super) std_us: f64,
    pub(super) first_us: u64,
}

impl MeanFloor {
    /// A floor under the window's mean (ms, before pause, bootstrap samples included as the
    /// estimate includes them) that holds until `more` further intervals have entered the
    /// window. Each new interval is at least 0; once the window is full it pushes out the
    /// oldest, and the e oldest of n samples of mean m and deviation s cannot sum to more than
    /// `e m + s sqrt(e (n - e))` (Cauchy-Schwarz on deviations that sum to zero). The floor is
    /// the least such mean over 0..=`more` new intervals.
    pub fn after_ms(&self, more: u64) -> f64 {
        let (n, window, sum) = (self.samples, self.window, self.sum_us);
        let mut floor_us = f64::INFINITY;
        // In a full window each new interval pushes one out, and the mean's floor only falls
        // with every one: the last is the least (the common case, one evaluation).
        let from = if n == window { more } else { 0 };
        for j in from..=more {
            let kept = window.min(n + j);
            let evicted = n + j - kept;
            let evicted_us = if evicted == 0 {
                0.0
            } else if evicted >= n {
                sum
            } else {
                let e = evicted as f64;
                (e * self.mean_us + self.std_us * (e * (n - evicted) as f64).sqrt()).min(sum)
            };
            let (boot_n, boot_us) = bootstrap_samples(window as u32, kept as u32, self.first_us)
                .fold((0u64, 0u64), |(c, s), x| (c + 1, s + x));
            let mean = ((sum - evicted_us).max(0.0) + boot_us as f64) / (kept + boot_n) as f64;
            floor_us = floor_us.min(mean);
        }
        // A relative hair for rounding, always downwards.
        floor_us * (1.0 - 1e-9) / 1000.0
    }

    /// The window's length in intervals.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// A floor under a full window's mean (ms, before pause) that holds until `more` further
    /// intervals have entered it, once `heard` intervals have entered it since these moments
    /// were taken and summed to at least `heard_us` (every one entered: the last-heard word
    /// says so, see `monitor_common::last_heard::LEFT_OUT_STEP`). As in
    /// [`Self::after_ms`], with what the heard intervals brought in counted: after j of them
    /// in all (j up to `heard + more`, at most the window), the window holds the n - j newest
    /// of its intervals, which sum to at least `sum - j m - s sqrt(j (n - j))`, and the j new
    /// ones, which sum to at least `heard_us`. None for a window that is not full, or past it.
    pub fn after_heard_ms(&self, heard: u64, heard_us: f64, more: u64) -> Option<f64> {
        let n = self.samples;
        let last = heard + more;
        if n != self.window || last > n {
            return None;
        }
        // sqrt(j (n - j)) is largest at n / 2: its largest over heard..=last.
        let widest = (n / 2).clamp(heard, last) as f64;
        let evicted_us = (last as f64 * self.mean_us
            + self.std_us * (widest * (n as f64 - widest)).sqrt())
        .min(self.sum_us);
        let mean_us = ((self.sum_us - evicted_us).max(0.0) + heard_us.max(0.0)) / n as f64;
        Some(mean_us * (1.0 - 1e-9) / 1000.0)
    }
}
