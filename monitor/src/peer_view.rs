//! What the agent says about one peer: the kernel's record turned into statistics.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use monitor_common::maps::{FAMILY_IPV4, FAMILY_IPV6, PeerRecord};
use serde::{Deserialize, Serialize};

/// Window statistics of inter-arrival times, from the kernel's exact integer sums.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalStats {
    pub samples: u32,
    pub mean_us: f64,
    /// Population standard deviation (the window is the population).
    pub std_us: f64,
}

impl IntervalStats {
    pub fn from_record(record: &PeerRecord) -> Option<Self> {
        let n = record.samples as u128;
        if n == 0 {
            return None;
        }
        let sum = record.interval_sum_us as u128;
        let sum_sq = record.interval_sum_sq_us as u128;
        // n^2 * variance = n * sum_sq - sum^2, computed exactly in integers: no cancellation.
        let scaled_var = (n * sum_sq).saturating_sub(sum * sum);
        Some(Self {
            samples: record.samples,
            mean_us: sum as f64 / n as f64,
            std_us: (scaled_var as f64).sqrt() / n as f64,
        })
    }
}

/// One peer as reported on the socket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerView {
    pub id: u64,
    /// Source of the last accepted heartbeat, `ip:port`; null before the first.
    pub addr: Option<String>,
    pub incarnation: u32,
    /// Heartbeats accepted by the kernel.
    pub heartbeats: u64,
    /// Intervals in the window.
    pub samples: u32,
    /// Mean interval over the window, ms; null with no interval yet.
    pub mean_ms: Option<f64>,
    /// Population standard deviation of the window, ms; null with no interval yet.
    pub std_ms: Option<f64>,
    /// Time since the last accepted heartbeat (or since admission, before the first), ms.
    pub silence_ms: f64,
    pub last_seq: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
}

impl PeerView {
    pub fn new(record: &PeerRecord, now_ns: u64) -> Self {
        let stats = IntervalStats::from_record(record);
        Self {
            id: record.peer_id,
            addr: source_addr(record).map(|a| a.to_string()),
            incarnation: record.incarnation,
            heartbeats: record.heartbeats,
            samples: record.samples,
            mean_ms: stats.map(|s| s.mean_us / 1000.0),
            std_ms: stats.map(|s| s.std_us / 1000.0),
            silence_ms: now_ns.saturating_sub(record.last_arrival_ns) as f64 / 1e6,
            last_seq: record.last_seq,
            lost: record.lost,
            duplicates: record.duplicates,
            out_of_order: record.out_of_order,
        }
    }
}

pub fn source_addr(record: &PeerRecord) -> Option<SocketAddr> {
    let ip = match record.src_family {
        FAMILY_IPV4 => {
            let b = &record.src_addr;
            IpAddr::from([b[12], b[13], b[14], b[15]])
        }
        FAMILY_IPV6 => IpAddr::V6(Ipv6Addr::from(record.src_addr)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, record.src_port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_with(intervals: &[u64]) -> PeerRecord {
        let mut r = PeerRecord::admitted(1, 0);
        r.samples = intervals.len() as u32;
        r.interval_sum_us = intervals.iter().sum();
        r.interval_sum_sq_us = intervals.iter().map(|i| i * i).sum();
        r
    }

    #[test]
    fn stats_are_population_moments() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, population std 2 (the textbook example).
        let s = IntervalStats::from_record(&record_with(&[2, 4, 4, 4, 5, 5, 7, 9])).unwrap();
        assert_eq!(s.mean_us, 5.0);
        assert_eq!(s.std_us, 2.0);
    }

    #[test]
    fn no_samples_no_stats() {
        assert!(IntervalStats::from_record(&record_with(&[])).is_none());
    }

    #[test]
    fn exact_for_large_equal_intervals() {
        // Large equal values: the naive f64 formula loses everything to cancellation here.
        let s = IntervalStats::from_record(&record_with(&[268_435_455; 128])).unwrap();
        assert_eq!(s.std_us, 0.0);
        assert_eq!(s.mean_us, 268_435_455.0);
    }

    #[test]
    fn ipv4_source_is_mapped() {
        let mut r = PeerRecord::admitted(1, 0);
        r.src_family = FAMILY_IPV4;
        r.src_addr[12..].copy_from_slice(&[10, 0, 0, 2]);
        r.src_port = 5000;
        assert_eq!(source_addr(&r).unwrap().to_string(), "10.0.0.2:5000");
    }
}
