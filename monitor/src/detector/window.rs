//! Inter-arrival windows: the exact integer sums the kernel keeps and the bootstrap samples
//! of a peer that has few intervals yet. Which intervals enter a window is decided in one
//! place, `monitor_common::slot`, for the kernel and replay alike.

use monitor_common::maps::PeerRecord;

/// The sufficient statistics of a window: count, sum and sum of squares, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowSums {
    pub samples: u32,
    pub sum_us: u64,
    pub sum_sq_us: u128,
}

impl WindowSums {
    pub fn from_record(record: &PeerRecord) -> Self {
        Self {
            samples: record.samples,
            sum_us: record.interval_sum_us,
            sum_sq_us: record.interval_sum_sq_us as u128,
        }
    }

    fn add(&mut self, interval_us: u64) {
        self.samples += 1;
        self.sum_us += interval_us;
        self.sum_sq_us += (interval_us as u128) * (interval_us as u128);
    }

    /// Adds the bootstrap samples that would still be in a window of `window` samples.
    ///
    /// Like Akka, a peer starts with two made-up intervals around `first_interval_us`
    /// (first -/+ first/4: mean `first`, deviation `first/4`), as the oldest entries of its
    /// window. Real intervals push them out: both stay while `samples <= window - 2`, the
    /// newer one while `samples == window - 1`. The kernel never stores them; adding them here
    /// gives exactly the window a userspace Akka detector would hold.
    pub fn with_bootstrap(mut self, window: u32, first_interval_us: u64) -> Self {
        for sample in bootstrap_samples(window, self.samples, first_interval_us) {
            self.add(sample);
        }
        self
    }

    /// The sums of these intervals (µs).
    pub fn of(intervals_us: impl IntoIterator<Item = u64>) -> Self {
        let mut sums = Self::default();
        for interval in intervals_us {
            sums.add(interval);
        }
        sums
    }

    /// Mean and population standard deviation in milliseconds, None for an empty window.
    /// `n^2 var = n sum_sq - sum^2` is exact in integers: no cancellation however large.
    pub fn moments_ms(&self) -> Option<(f64, f64)> {
        if self.samples == 0 {
            return None;
        }
        let n = self.samples as u128;
        let sum = self.sum_us as u128;
        let scaled_var = (n * self.sum_sq_us).saturating_sub(sum * sum);
        let mean_us = sum as f64 / n as f64;
        let std_us = (scaled_var as f64).sqrt() / n as f64;
        Some((mean_us / 1000.0, std_us / 1000.0))
    }
}

/// The bootstrap samples (oldest first) still in a window of `window` intervals that holds
/// `samples` real ones: first -/+ first/4 while `samples <= window - 2`, the newer alone while
/// `samples == window - 1`, none after (see `WindowSums::with_bootstrap`); none with no estimate.
pub fn bootstrap_samples(
    window: u32,
    samples: u32,
    first_interval_us: u64,
) -> impl Iterator<Item = u64> {
    let std = first_interval_us / 4;
    let kept = if first_interval_us == 0 {
        0
    } else {
        window.saturating_sub(samples).min(2) as usize
    };
    [first_interval_us - std, first_interval_us + std]
        .into_iter()
        .skip(2 - kept)
}

/// A slot whose window holds `intervals_us` (in order) under `config`'s rules, built by
/// the kernel's own `arrive`: for tests and benchmarks that need a window with given contents.
pub fn slot_with_intervals(
    intervals_us: impl IntoIterator<Item = u64>,
    config: &monitor_common::config::XdpConfig,
) -> monitor_common::maps::PeerSlot {
    let mut slot = monitor_common::maps::PeerSlot::admitted(1, 0);
    let mut at = 1_000_000u64;
    let mut seq = 1;
    monitor_common::slot::arrive(&mut slot, at, seq, 1, config);
    for us in intervals_us {
        at += us * 1000;
        seq += 1;
        monitor_common::slot::arrive(&mut slot, at, seq, 1, config);
    }
    slot
}

#[cfg(test)]
mod tests {
    use monitor_common::{config::XdpConfig, maps::MAX_INTERVAL_US};

    use super::*;

    fn config(window: u32, max_interval_us: u32, outage_factor: u32) -> XdpConfig {
        XdpConfig {
            window,
            max_interval_us,
            outage_factor,
            ..XdpConfig::DEFAULT
        }
    }

    fn sums(intervals: &[u64], c: &XdpConfig) -> WindowSums {
        WindowSums::from_record(&slot_with_intervals(intervals.iter().copied(), c).record())
    }

    #[test]
    fn moments_are_population_moments() {
        // 2, 4, 4, 4, 5, 5, 7, 9 (ms): mean 5, population std 2 (the textbook example).
        let s = sums(
            &[2000, 4000, 4000, 4000, 5000, 5000, 7000, 9000],
            &config(8, 0, 0),
        );
        assert_eq!(s.moments_ms(), Some((5.0, 2.0)));
        assert_eq!(WindowSums::default().moments_ms(), None);
    }

    #[test]
    fn exact_for_large_equal_intervals() {
        // The naive f64 formula loses everything to cancellation here.
        let s = sums(&[MAX_INTERVAL_US; 300], &config(128, 0, 0));
        let (mean, std) = s.moments_ms().unwrap();
        assert_eq!((mean, std), (MAX_INTERVAL_US as f64 / 1000.0, 0.0));
    }

    #[test]
    fn ring_forgets_the_oldest_and_cap_skips() {
        let s = sums(&[1_000, 2_000, 9_000, 3_000, 4_000], &config(3, 5_000, 0));
        // 9 ms is over the cap; the window holds 2, 3, 4 ms.
        assert_eq!(s.samples, 3);
        assert_eq!(s.moments_ms().unwrap().0, 3.0);
    }

    #[test]
    fn an_outage_is_not_a_sample_but_a_run_of_them_is_the_path() {
        let c = config(128, 0, 4);
        // Ten 100 ms intervals, then a 3 s silence: left out.
        let mut intervals = vec![100_000; 10];
        intervals.push(3_000_000);
        let slot = slot_with_intervals(intervals.iter().copied(), &c);
        assert_eq!((slot.record().samples, slot.record().outages), (10, 1));
        assert_eq!(
            WindowSums::from_record(&slot.record()).moments_ms(),
            Some((100.0, 0.0))
        );
        // The sender slows to one a second: three left out, then the path has changed.
        intervals.extend([
            100_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000,
        ]);
        let slot = slot_with_intervals(intervals.iter().copied(), &c);
        assert_eq!((slot.record().samples, slot.record().outages), (13, 4));
        assert_eq!(slot.record().outage_run, 3);
        // Below OUTAGE_MIN_SAMPLES everything counts.
        let slot = slot_with_intervals([100_000, 3_000_000], &c);
        assert_eq!(slot.record().samples, 2);
    }

    #[test]
    fn bootstrap_samples_age_out_oldest_first() {
        let first = 1_000_000; // 1 s, as Akka's default first-heartbeat estimate
        let empty = WindowSums::default().with_bootstrap(4, first);
        // Akka: mean = first, std = first / 4.
        assert_eq!(empty.moments_ms(), Some((1000.0, 250.0)));
        let c = config(4, 0, 0);
        let two = sums(&[1_000_000, 1_000_000], &c);
        assert_eq!(two.with_bootstrap(4, first).samples, 4, "both still in");
        let three = sums(&[1_000_000; 3], &c);
        let s = three.with_bootstrap(4, first);
        assert_eq!(
            (s.samples, s.sum_us),
            (4, 3_000_000 + 1_250_000),
            "only the newer one"
        );
        let four = sums(&[1_000_000; 4], &c);
        assert_eq!(four.with_bootstrap(4, first), four, "both gone");
    }
}
