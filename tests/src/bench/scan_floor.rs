//! The floor of an agent that learns of heartbeats by scanning: a process that maps the
//! running program's last-heard words (`LAST_HEARD`) and, every interval, does only what any
//! such scan must do for each peer: load its word, compare it with the one it saw, and for a
//! changed one store the word and the deadline one add away from its arrival (16 bytes a
//! peer, as the agent's watch). No tracker, no floor, no heap, no events: the CPU it takes
//! beside the real agent, under the same heartbeats, is what the agent's sweep cannot go
//! below with this design (docs/tuning.md, "What an agent that scans costs").

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use aya::maps::{MapData, loaded_maps};
use monitor::kernel::clock::monotonic_ns;
use monitor_common::last_heard::{self, LAST_HEARD_MAP};
use serde::Serialize;

use super::cpu_seconds;

#[derive(Debug, Clone, Serialize)]
pub struct ScanFloor {
    pub peers: u32,
    pub interval_ms: f64,
    pub scans: u64,
    /// Words that changed between two scans, a second.
    pub changed_per_s: f64,
    /// Peers past their deadline at a scan (none on a steady stream), a second.
    pub due_per_s: f64,
    /// This process's CPU over the run, percent of one core.
    pub cpu_percent: f64,
    /// One scan's duration, microseconds (median).
    pub scan_us_p50: f64,
}

/// What the scan keeps a peer: the word it last saw and the deadline from it.
#[derive(Clone, Copy)]
struct Watch {
    word: u64,
    deadline_ns: u64,
}

/// The newest map named `LAST_HEARD` in the kernel (the running agent's), mapped read-only.
fn newest_last_heard() -> (NonNull<AtomicU64>, usize, u32) {
    let info = loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name() == LAST_HEARD_MAP.as_bytes())
        .max_by_key(|m| m.id())
        .expect("a LAST_HEARD map is loaded (start the agent first)");
    let entries = info.max_entries();
    let data = MapData::from_id(info.id()).expect("the map by its id");
    let fd = data.fd().as_fd();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let bytes = (entries as usize * 8).div_ceil(page) * page;
    // SAFETY: a read-only shared mapping of a BPF_F_MMAPABLE array; the kernel checks the size.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap of LAST_HEARD");
    // The mapping outlives the fd (closed with `data`), as mappings do.
    (NonNull::new(ptr.cast()).unwrap(), bytes, entries)
}

/// Scans the first `peers` words every `interval` for `duration`.
pub fn scan_floor(peers: u32, interval: Duration, duration: Duration) -> ScanFloor {
    let (ptr, bytes, entries) = newest_last_heard();
    let peers = peers.min(entries);
    // SAFETY: the mapping holds `entries` aligned u64, which the kernel stores whole.
    let words = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), peers as usize) };
    let mut watches = vec![
        Watch {
            word: 0,
            deadline_ns: u64::MAX,
        };
        peers as usize
    ];
    // A deadline 1.5 intervals of a 100 ms sender after the arrival: the scan's work is one
    // add and a store whatever the constant.
    const SILENCE_NS: u64 = 150_000_000;
    let (mut scans, mut changed, mut due) = (0u64, 0u64, 0u64);
    let mut scan_us = Vec::new();
    let (cpu0, start) = (cpu_seconds(), Instant::now());
    let mut next = start;
    while start.elapsed() < duration {
        next += interval;
        let began = Instant::now();
        let now = monotonic_ns();
        for (word, watch) in words.iter().zip(watches.iter_mut()) {
            let word = word.load(Ordering::Relaxed);
            if word != watch.word {
                *watch = Watch {
                    word,
                    deadline_ns: last_heard::arrival_near(word, now) + SILENCE_NS,
                };
                changed += 1;
            } else if now >= watch.deadline_ns {
                due += 1;
            }
        }
        scan_us.push(began.elapsed().as_secs_f64() * 1e6);
        scans += 1;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let (cpu, wall) = (cpu_seconds() - cpu0, start.elapsed().as_secs_f64());
    // SAFETY: unmapping what `newest_last_heard` mapped; `words` is not used after.
    unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    scan_us.sort_by(f64::total_cmp);
    ScanFloor {
        peers,
        interval_ms: interval.as_secs_f64() * 1e3,
        scans,
        // The first scan finds every word new.
        changed_per_s: changed.saturating_sub(peers as u64) as f64 / wall,
        due_per_s: due as f64 / wall,
        cpu_percent: cpu / wall * 100.0,
        scan_us_p50: scan_us.get(scan_us.len() / 2).copied().unwrap_or(0.0),
    }
}
