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
    /// The values the estimate's deviation is taken over (the intervals and the bootstrap
    /// samples), and that deviation before `min_std_ms`.
    pub(super) all_values: u64,
    pub(super) all_std_us: f64,
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

    /// A floor under the window's deviation (ms, as the estimate takes it: over its intervals
    /// and bootstrap samples) once `new` more intervals have entered it, where none of its
    /// own is pushed out meanwhile (it is filling, and they fit). The values it keeps keep
    /// their squared deviations from any mean at least what they sum to about their own
    /// mean: its n intervals, n s^2, over at most n + `new` + 2 values; and while it stays at
    /// least 2 short of full, its two bootstrap samples too (the same two values), the
    /// estimate's own deviation over its m values, m s^2 over m + `new`. 0 otherwise. A
    /// window whose deviation is wide (bootstrap samples far from the sender's rate, in the
    /// first minutes) keeps it while it fills, and a floor that took the deviation at
    /// `min_std_ms` would fall too far below the crossing to be worth keeping.
    pub fn std_floor_ms(&self, new: u64) -> f64 {
        let (n, m) = (self.samples, self.all_values);
        if n + new > self.window {
            return 0.0;
        }
        let own = self.std_us * (n as f64 / (n + new + 2) as f64).sqrt();
        let with_bootstrap = if n + new + 2 <= self.window {
            self.all_std_us * (m as f64 / (m + new) as f64).sqrt()
        } else {
            0.0
        };
        // A relative hair for rounding, always downwards.
        own.max(with_bootstrap) * (1.0 - 1e-9) / 1000.0
    }

    /// The window was full when these moments were taken.
    pub fn is_full(&self) -> bool {
        self.samples == self.window
    }

    /// [`Self::after_heard_ms`] of a filling window for every `more` that fits `floors` (at
    /// index `more`), in one pass: the floor over a span is the least mean over its counts,
    /// so each is the running least. Left as they are past the samples the window held, or
    /// past its filling.
    pub fn filling_floors_ms(&self, heard: u64, heard_us: f64, floors: &mut [f64]) {
        let mut least_us = f64::INFINITY;
        for (more, floor) in floors.iter_mut().enumerate() {
            let j = heard + more as u64;
            if j > self.samples || self.samples + j > self.window {
                break;
            }
            least_us = least_us.min(self.filling_mean_us(j, heard_us));
            *floor = least_us * (1.0 - 1e-9) / 1000.0;
        }
    }

    /// The least mean (µs) of a filling window once j intervals entered it, the first ones
    /// summing to `heard_us` and the rest to 0 or more (the window not yet full: all kept,
    /// its bootstrap samples going as it fills).
    fn filling_mean_us(&self, j: u64, heard_us: f64) -> f64 {
        let kept = self.samples + j;
        debug_assert!(kept <= self.window);
        let (boot_n, boot_us) = bootstrap_samples(self.window as u32, kept as u32, self.first_us)
            .fold((0u64, 0u64), |(c, s), x| (c + 1, s + x));
        (self.sum_us + heard_us.max(0.0) + boot_us as f64) / (kept + boot_n) as f64
    }

    /// A floor under a window's mean (ms, before pause) that holds until `more` further
    /// intervals have entered it, once `heard` intervals have entered it since these moments
    /// were taken and summed to at least `heard_us` (every one entered: the last-heard word
    /// says so, see `monitor_common::last_heard::LEFT_OUT_STEP`). As in
    /// [`Self::after_ms`], with what the heard intervals brought in counted: after j of them
    /// in all (j up to `heard + more`, at most the n samples the moments were taken over),
    /// the window holds the newest of its n intervals, which sum to at least
    /// `sum - e m - s sqrt(e (n - e))` with e of them pushed out, and the j new ones, which sum
    /// to at least `heard_us`. A full window pushes one out with each (e = j); a filling one
    /// keeps them all (its bootstrap samples go as it fills). None past n, and for a filling
    /// window past its filling.
    pub fn after_heard_ms(&self, heard: u64, heard_us: f64, more: u64) -> Option<f64> {
        let n = self.samples;
        let last = heard + more;
        if last > n {
            return None;
        }
        if n != self.window {
            // A filling window is read again once it would be full, so that its floors from
            // then on come from a full window's moments (the tighter bound, and one a span
            // of up to `MAX_FLOOR_SPAN`): until then none of its intervals is pushed out.
            return (n + last <= self.window)
                .then(|| self.filling_after_heard_ms(heard, heard_us, last));
        }
        // sqrt(j (n - j)) is largest at n / 2: its largest over heard..=last.
        let widest = (n / 2).clamp(heard, last) as f64;
        let evicted_us = (last as f64 * self.mean_us
            + self.std_us * (widest * (n as f64 - widest)).sqrt())
        .min(self.sum_us);
        let mean_us = ((self.sum_us - evicted_us).max(0.0) + heard_us.max(0.0)) / n as f64;
        Some(mean_us * (1.0 - 1e-9) / 1000.0)
    }

    /// [`Self::after_heard_ms`] for a window that was not full: the least mean over every
    /// count j of new intervals from `heard` to `last` (the mean need not fall monotonically
    /// while the window grows and its bootstrap samples go, so each is evaluated; a window of
    /// n samples is read again after n heartbeats, so at most n of them).
    fn filling_after_heard_ms(&self, heard: u64, heard_us: f64, last: u64) -> f64 {
        let floor_us = (heard..=last)
            .map(|j| self.filling_mean_us(j, heard_us))
            .fold(f64::INFINITY, f64::min);
        // A relative hair for rounding, always downwards.
        floor_us * (1.0 - 1e-9) / 1000.0
    }
}
