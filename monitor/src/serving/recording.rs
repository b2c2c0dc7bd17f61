//! `monitor record`: every arrival of chosen peers, as the kernel timestamped and judged it.
//!
//! A peer is traced while at least one recording wants it: its slot's `traced` byte makes the
//! XDP program copy each of its heartbeats (time, sequence, incarnation, verdict) into the
//! ARRIVALS ring buffer. Untraced peers cost nothing more than that byte's load. The agent reads
//! the ring into a broadcast channel; each recording client keeps the arrivals of its own ids.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use monitor_common::maps::{ARRIVAL_CODE, ArrivalRecord};
use serde::{Deserialize, Serialize};

/// Arrivals buffered per recording client before it is told it missed some.
pub const ARRIVAL_BUFFER: usize = 65_536;
/// Longest recording one request may ask for.
pub const MAX_RECORD_MS: u64 = 24 * 3600 * 1000;
/// Most peers one recording may trace.
pub const MAX_RECORD_PEERS: usize = 1024;

/// One arrival as a recording client receives it (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrivalLine {
    pub id: u64,
    /// CLOCK_MONOTONIC ns, as bpf_ktime_get_ns stamped it.
    pub at_ns: u64,
    pub seq: u64,
    pub incarnation: u32,
    /// "accepted", "duplicate" or "out_of_order".
    pub outcome: String,
}

impl ArrivalLine {
    pub fn from_record(r: &ArrivalRecord) -> Self {
        Self {
            id: r.peer_id,
            at_ns: r.at_ns,
            seq: r.seq,
            incarnation: r.incarnation,
            outcome: match r.outcome & ARRIVAL_CODE {
                0 => "accepted",
                1 => "duplicate",
                _ => "out_of_order",
            }
            .into(),
        }
    }
}

/// Which peers are being recorded, by how many recordings each.
#[derive(Default)]
pub struct Recordings {
    wanted: Mutex<HashMap<u64, u32>>,
    /// Set when a recording ends: the sweep then turns off tracing nobody wants any more.
    ended: AtomicBool,
}

impl Recordings {
    /// Counts one more recording of each id; returns the ids nobody recorded before.
    pub fn start(&self, ids: &[u64]) -> Vec<u64> {
        let mut wanted = self.wanted.lock().expect("recordings lock");
        ids.iter()
            .copied()
            .filter(|id| {
                let n = wanted.entry(*id).or_insert(0);
                *n += 1;
                *n == 1
            })
            .collect()
    }

    fn stop(&self, ids: &[u64]) {
        let mut wanted = self.wanted.lock().expect("recordings lock");
        for id in ids {
            if let Some(n) = wanted.get_mut(id) {
                *n = n.saturating_sub(1);
            }
        }
        self.ended.store(true, Ordering::Release);
    }

    /// Ids no recording wants any more (forgotten here); call after a recording ended.
    pub fn take_unwanted(&self) -> Vec<u64> {
        if !self.ended.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        let mut wanted = self.wanted.lock().expect("recordings lock");
        let done: Vec<u64> = wanted
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in &done {
            wanted.remove(id);
        }
        done
    }

    /// Whether any recording wants `id`.
    #[cfg(test)]
    pub fn wants(&self, id: u64) -> bool {
        self.wanted
            .lock()
            .expect("recordings lock")
            .get(&id)
            .is_some_and(|n| *n > 0)
    }
}

/// Held by a recording client; when it goes (done or hung up), its ids stop counting.
pub struct RecordingGuard {
    recordings: Arc<Recordings>,
    ids: Vec<u64>,
}

impl RecordingGuard {
    pub fn new(recordings: Arc<Recordings>, ids: Vec<u64>) -> Self {
        Self { recordings, ids }
    }
}

impl Drop for RecordingGuard {
    fn drop(&mut self) {
        self.recordings.stop(&self.ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_is_counted_per_recording() {
        let r = Arc::new(Recordings::default());
        assert_eq!(r.start(&[1, 2]), vec![1, 2]);
        let first = RecordingGuard::new(r.clone(), vec![1, 2]);
        assert_eq!(r.start(&[2, 3]), vec![3], "2 is already traced");
        let second = RecordingGuard::new(r.clone(), vec![2, 3]);
        assert!(r.take_unwanted().is_empty(), "nothing ended yet");
        drop(first);
        assert_eq!(
            r.take_unwanted(),
            vec![1],
            "2 is still wanted by the second"
        );
        assert!(r.wants(2) && !r.wants(1));
        drop(second);
        let mut done = r.take_unwanted();
        done.sort();
        assert_eq!(done, vec![2, 3]);
    }
}
