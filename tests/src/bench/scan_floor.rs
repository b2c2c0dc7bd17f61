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
use monitor_common::last_heard;
use serde::Serialize;

use super::{cpu_seconds, floor::DUE_PER_LINE};

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

/// The newest mappable array in the kernel whose name is `name` (the kernel keeps 15 bytes of
/// a name: a longer one matches on those), with values of `T`, mapped read-only.
fn newest_array<T>(name: &str) -> (NonNull<T>, usize, u32) {
    let kept = &name.as_bytes()[..name.len().min(15)];
    let info = loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name() == kept)
        .max_by_key(|m| m.id())
        .unwrap_or_else(|| panic!("a {name} map is loaded (start its program first)"));
    assert_eq!(
        info.value_size() as usize,
        size_of::<T>(),
        "{name}'s values"
    );
    let entries = info.max_entries();
    let data = MapData::from_id(info.id()).expect("the map by its id");
    let fd = data.fd().as_fd();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let bytes = (entries as usize * size_of::<T>()).div_ceil(page) * page;
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
    assert_ne!(ptr, libc::MAP_FAILED, "mmap of {name}");
    // The mapping outlives the fd (closed with `data`), as mappings do.
    (NonNull::new(ptr.cast()).unwrap(), bytes, entries)
}

/// What `paced_scans` measured: scans run, the median scan, this process's CPU (percent of a
/// core) and the wall time, s.
struct Paced {
    scans: u64,
    scan_us_p50: f64,
    cpu_percent: f64,
    wall_s: f64,
}

/// Runs `scan` every `interval` for `duration`, each timed, sleeping between them.
fn paced_scans(interval: Duration, duration: Duration, mut scan: impl FnMut()) -> Paced {
    let mut scan_us = Vec::new();
    let (cpu0, start) = (cpu_seconds(), Instant::now());
    let mut next = start;
    while start.elapsed() < duration {
        next += interval;
        let began = Instant::now();
        scan();
        scan_us.push(began.elapsed().as_secs_f64() * 1e6);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let (cpu, wall_s) = (cpu_seconds() - cpu0, start.elapsed().as_secs_f64());
    scan_us.sort_by(f64::total_cmp);
    Paced {
        scans: scan_us.len() as u64,
        scan_us_p50: scan_us.get(scan_us.len() / 2).copied().unwrap_or(0.0),
        cpu_percent: cpu / wall_s * 100.0,
        wall_s,
    }
}

/// Scans the first `peers` words of the newest map named `map` (the agent's `LAST_HEARD`, or
/// the floor program's words) every `interval` for `duration`.
pub fn scan_floor(map: &str, peers: u32, interval: Duration, duration: Duration) -> ScanFloor {
    let (ptr, bytes, entries) = newest_array::<AtomicU64>(map);
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
    let (mut changed, mut due) = (0u64, 0u64);
    let paced = paced_scans(interval, duration, || {
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
    });
    // SAFETY: unmapping what `newest_array` mapped; `words` is not used after.
    unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    let wall = paced.wall_s;
    ScanFloor {
        peers,
        interval_ms: interval.as_secs_f64() * 1e3,
        scans: paced.scans,
        // The first scan finds every word new.
        changed_per_s: changed.saturating_sub(peers as u64) as f64 / wall,
        due_per_s: due as f64 / wall,
        cpu_percent: paced.cpu_percent,
        scan_us_p50: paced.scan_us_p50,
    }
}

/// The agent's half of a design in which the kernel tells it when to look (the floor program's
/// `FLOOR_TOUCH` 4, monitor-ebpf/src/floor.rs): the kernel stores, with each heartbeat, the
/// 4 ms bucket in which the peer's floor passes (`FLOOR_DUE`, two bytes a peer), and the agent,
/// every interval, scans the buckets for those that come before its next scan and takes those
/// peers (here: their slot numbers, into a list its due heap would arm). A peer heard on time
/// has moved its bucket on before the agent reaches it, so on a steady stream almost none is
/// taken: the scan of two bytes a peer is what such an agent cannot go below.
#[derive(Debug, Clone, Serialize)]
pub struct DueScanFloor {
    pub peers: u32,
    pub interval_ms: f64,
    pub scans: u64,
    /// Peers whose bucket came before the next scan (the ones such an agent looks at).
    pub taken: u64,
    /// The same, a second.
    pub taken_per_s: f64,
    /// This process's CPU over the run, percent of one core.
    pub cpu_percent: f64,
    /// One scan's duration, microseconds (median).
    pub scan_us_p50: f64,
}

/// The width of a due bucket (monitor-ebpf/src/floor.rs, `DUE_BUCKET_SHIFT`).
const DUE_BUCKET_SHIFT: u32 = 22;

/// Scans the first `peers` due buckets of the newest `FLOOR_DUE` map every `interval` for
/// `duration`, taking the peers whose bucket falls after the last scan's horizon and no later
/// than this one's (the bucket of the next scan).
pub fn due_scan_floor(peers: u32, interval: Duration, duration: Duration) -> DueScanFloor {
    let (ptr, bytes, lines) = newest_array::<[u16; DUE_PER_LINE as usize]>("FLOOR_DUE");
    let peers = peers.min(lines * DUE_PER_LINE);
    // SAFETY: the mapping holds `entries` aligned u16, which the kernel stores whole; a torn
    // read is not possible for an aligned 2-byte load, and a stale one is what a scan sees.
    let due = unsafe { std::slice::from_raw_parts(ptr.as_ptr().cast::<u16>(), peers as usize) };
    let bucket = |ns: u64| (ns >> DUE_BUCKET_SHIFT) as u16;
    // Buckets up to this one were taken (wrapping: 2^16 buckets are 275 s).
    let mut taken_to = bucket(monotonic_ns());
    let mut taken = 0u64;
    let mut slots: Vec<u32> = Vec::new();
    const CHUNK: usize = 32;
    let paced = paced_scans(interval, duration, || {
        let horizon = bucket(monotonic_ns() + interval.as_nanos() as u64);
        if horizon == taken_to {
            return;
        }
        // A bucket b is new when b - (taken_to + 1) <= horizon - (taken_to + 1), wrapping.
        let first = taken_to.wrapping_add(1);
        let span = horizon.wrapping_sub(first);
        slots.clear();
        for (c, chunk) in due.chunks(CHUNK).enumerate() {
            // A branch-free test of the chunk first (vectorized), the slots of a hit after.
            // SAFETY: see above; read volatile, as the kernel stores into them.
            let read = |d: &u16| unsafe { std::ptr::read_volatile(d) };
            if chunk
                .iter()
                .fold(false, |any, d| any | (read(d).wrapping_sub(first) <= span))
            {
                for (i, d) in chunk.iter().enumerate() {
                    if read(d).wrapping_sub(first) <= span {
                        slots.push((c * CHUNK + i) as u32);
                    }
                }
            }
        }
        taken += slots.len() as u64;
        taken_to = horizon;
    });
    // SAFETY: unmapping what `newest_array` mapped; `due` is not used after.
    unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    DueScanFloor {
        peers,
        interval_ms: interval.as_secs_f64() * 1e3,
        scans: paced.scans,
        taken,
        taken_per_s: taken as f64 / paced.wall_s,
        cpu_percent: paced.cpu_percent,
        scan_us_p50: paced.scan_us_p50,
    }
}
