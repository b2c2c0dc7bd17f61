//! Inter-arrival windows: the exact integer sums the kernel keeps, the same window in
//! userspace for replay, and the bootstrap samples of a peer that has few intervals yet.

use monitor_common::maps::{MAX_INTERVAL_US, PeerRecord};

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
        if first_interval_us == 0 {
            return self;
        }
        let std = first_interval_us / 4;
        if self.samples + 2 <= window {
            self.add(first_interval_us - std);
            self.add(first_interval_us + std);
        } else if self.samples + 1 == window {
            self.add(first_interval_us + std);
        }
        self
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

/// The kernel's window, in userspace: a ring of the last `window` intervals with running
/// sums, the same clamping and the same optional cap. Replay runs detectors on it.
#[derive(Debug, Clone)]
pub struct IntervalWindow {
    ring: Vec<u64>,
    head: usize,
    window: usize,
    /// Intervals above this are not counted (None: all are).
    max_interval_us: Option<u64>,
    sums: WindowSums,
}

impl IntervalWindow {
    pub fn new(window: u32, max_interval_us: Option<u64>) -> Self {
        let window = window.max(1) as usize;
        Self {
            ring: Vec::with_capacity(window),
            head: 0,
            window,
            max_interval_us,
            sums: WindowSums::default(),
        }
    }

    pub fn push(&mut self, interval_us: u64) {
        let interval = interval_us.min(MAX_INTERVAL_US);
        if self.max_interval_us.is_some_and(|max| interval > max) {
            return;
        }
        if self.ring.len() < self.window {
            self.ring.push(interval);
            self.sums.add(interval);
            return;
        }
        let old = std::mem::replace(&mut self.ring[self.head], interval);
        self.sums.sum_us = self.sums.sum_us - old + interval;
        self.sums.sum_sq_us =
            self.sums.sum_sq_us - (old as u128).pow(2) + (interval as u128).pow(2);
        self.head = (self.head + 1) % self.window;
    }

    pub fn sums(&self) -> WindowSums {
        self.sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_population_moments() {
        // 2, 4, 4, 4, 5, 5, 7, 9 (ms): mean 5, population std 2 (the textbook example).
        let mut w = IntervalWindow::new(8, None);
        for ms in [2, 4, 4, 4, 5, 5, 7, 9] {
            w.push(ms * 1000);
        }
        assert_eq!(w.sums().moments_ms(), Some((5.0, 2.0)));
        assert_eq!(WindowSums::default().moments_ms(), None);
    }

    #[test]
    fn exact_for_large_equal_intervals() {
        // The naive f64 formula loses everything to cancellation here.
        let mut w = IntervalWindow::new(128, None);
        for _ in 0..300 {
            w.push(MAX_INTERVAL_US);
        }
        let (mean, std) = w.sums().moments_ms().unwrap();
        assert_eq!((mean, std), (MAX_INTERVAL_US as f64 / 1000.0, 0.0));
    }

    #[test]
    fn ring_forgets_the_oldest_and_cap_skips() {
        let mut w = IntervalWindow::new(3, Some(5_000));
        for us in [1_000, 2_000, 9_000, 3_000, 4_000] {
            w.push(us);
        }
        // 9 ms is over the cap; the window holds 2, 3, 4 ms.
        assert_eq!(w.sums().samples, 3);
        assert_eq!(w.sums().moments_ms().unwrap().0, 3.0);
    }

    #[test]
    fn bootstrap_samples_age_out_oldest_first() {
        let first = 1_000_000; // 1 s, as Akka's default first-heartbeat estimate
        let empty = WindowSums::default().with_bootstrap(4, first);
        // Akka: mean = first, std = first / 4.
        assert_eq!(empty.moments_ms(), Some((1000.0, 250.0)));
        let mut w = IntervalWindow::new(4, None);
        w.push(1_000_000);
        w.push(1_000_000);
        assert_eq!(
            w.sums().with_bootstrap(4, first).samples,
            4,
            "both still in"
        );
        w.push(1_000_000);
        let s = w.sums().with_bootstrap(4, first);
        assert_eq!(
            (s.samples, s.sum_us),
            (4, 3_000_000 + 1_250_000),
            "only the newer one"
        );
        w.push(1_000_000);
        assert_eq!(w.sums().with_bootstrap(4, first), w.sums(), "both gone");
    }
}
