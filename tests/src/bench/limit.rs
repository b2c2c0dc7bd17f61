//! The physical limit of a heartbeat, for `cargo xtask bench`: what one dependent miss over a
//! table the size of the peers' state costs on this machine, and what per-peer state one
//! accepted heartbeat touches (from the layout itself, `monitor_common::maps`).
//!
//! The kernel's work per heartbeat cannot go below the floor program's (parse and drop), plus
//! the clock it reads, plus one miss: the peer's state has to come from memory once, and for
//! a stream over more peers than the caches hold it comes from DRAM. The chase here is that
//! miss alone: a walk over the table's lines in a random cycle, each load's address the
//! previous load's value, so no two misses overlap (4 KiB pages, as the kernel's array maps
//! use, so the walk pays the TLB misses the program pays too).

use std::{hint::black_box, mem::size_of};

use monitor_common::maps::{HotLine, PeerCold, PeerHot, PeerState};
use serde::Serialize;

const LINE: usize = 64;

/// One cache line of the chase: the index of the next line to load, and padding.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line {
    next: u64,
    _pad: [u64; 7],
}

/// The kernel's state for `peers` peers as they use it: their hot lines, their slots and
/// their last-heard words. (PEER_HOT also holds the empty lines of its hashed part, four per
/// slot of capacity, which a peer numbered 1 to the capacity never touches.)
pub fn state_bytes(peers: u64) -> u64 {
    peers * (size_of::<HotLine>() + size_of::<PeerState>() + size_of::<u64>()) as u64
}

/// `lines` lines linked into one cycle through all of them, in a random order.
fn random_cycle(lines: usize) -> Vec<Line> {
    let mut order: Vec<usize> = (0..lines).collect();
    fastrand::Rng::with_seed(0x5eed).shuffle(&mut order);
    let mut table = vec![
        Line {
            next: 0,
            _pad: [0; 7]
        };
        lines
    ];
    for (i, &line) in order.iter().enumerate() {
        table[line].next = order[(i + 1) % lines] as u64;
    }
    table
}

fn walk(table: &[Line], from: usize, steps: u64) -> usize {
    let mut at = from;
    for _ in 0..steps {
        at = table[at].next as usize;
    }
    black_box(at)
}

/// Mean ns of one dependent load over a table of `bytes` (at least two lines), each load a
/// line the walk has not touched for a whole cycle of the table.
pub fn dependent_miss_ns(bytes: u64, steps: u64) -> f64 {
    let lines = (bytes as usize / LINE).max(2);
    let table = random_cycle(lines);
    // Once round the table first: its pages are mapped and as warm as the caches keep them.
    let start = walk(&table, 0, lines as u64);
    let t = thread_cpu_ns();
    black_box(walk(&table, start, steps));
    (thread_cpu_ns() - t) as f64 / steps as f64
}

/// This thread's CPU time, ns: the chase's own time, stalls on memory included, but not the
/// time the thread was not running (on a shared machine the wall clock counted that too, and
/// the limit came out above the monitor's own cost).
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; this clock exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// What one accepted, in-order heartbeat of a known peer touches of the kernel's per-peer
/// state: the lines it reads (and so may miss on) and the lines it stores into without
/// reading them.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Touched {
    /// The peer's hot line: the bench numbers its peers from 1, so each has its own line
    /// (`index::own_line`), the one the lookup reads.
    pub lines_read: u32,
    pub bytes_read: u64,
    /// The hot line (read first), and three lines stored into only: the source address in
    /// the slot's first cold line, the ring entry, the last-heard word.
    pub lines_written: u32,
    pub bytes_written: u64,
    /// Of the lines written, those the heartbeat does not read (a store, though the CPU still
    /// fetches the line to write part of it).
    pub lines_stored_only: u32,
    /// The state the common path touches for each peer: its hot line and its last-heard word.
    pub hot_bytes_per_peer: u64,
}

pub fn touched() -> Touched {
    // The hot line is written in full (lock twice, the fields it changes).
    let hot_line = size_of::<HotLine>() as u64;
    debug_assert_eq!(hot_line as usize, size_of::<u64>() + size_of::<PeerHot>());
    let source = (size_of::<[u8; 16]>() + 2 * size_of::<u16>()) as u64;
    let ring_entry = size_of::<u32>() as u64;
    let word = size_of::<u64>() as u64;
    debug_assert!(size_of::<PeerCold>() >= source as usize);
    Touched {
        lines_read: 1,
        bytes_read: LINE as u64,
        lines_written: 4,
        bytes_written: hot_line + source + ring_entry + word,
        lines_stored_only: 3,
        hot_bytes_per_peer: hot_line + word,
    }
}

/// The probe's answer: the miss at `peers`' state size and what a heartbeat touches.
pub fn limit_report(peers: u64) -> serde_json::Value {
    let bytes = state_bytes(peers);
    // Enough steps for a tenth of a second or so at DRAM latency, and every line several times.
    let steps = (4 * bytes / LINE as u64).max(2_000_000);
    serde_json::json!({
        "peers": peers,
        "table_bytes": bytes,
        "ns_per_miss": dependent_miss_ns(bytes, steps),
        "touched": touched(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chase_is_one_cycle_through_every_line() {
        let lines = 1000;
        let table = random_cycle(lines);
        let mut seen = vec![false; lines];
        let mut at = 0;
        for _ in 0..lines {
            assert!(!seen[at], "line {at} visited twice in one cycle");
            seen[at] = true;
            at = table[at].next as usize;
        }
        assert_eq!(at, 0, "back at the start after every line");
        assert!(dependent_miss_ns(64 * lines as u64, 1000) > 0.0);
    }

    #[test]
    fn fifty_thousand_peers_state_is_beyond_an_l2() {
        assert_eq!(state_bytes(0), 0);
        assert!(state_bytes(50_000) > 4 << 20);
    }
}
