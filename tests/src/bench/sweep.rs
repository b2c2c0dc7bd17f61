//! A full pass over every peer: the mmapped table against aya's map iterator, and the
//! agent's own sweep, in one process.

use std::{os::fd::AsFd, time::Instant};

use aya::maps::Array;
use monitor::{
    agent::{Agent, AgentParts, LiveProgram},
    detector::{levels::Levels, model::DetectorParams, tracker::DetectorConfig},
    kernel::{clock::monotonic_ns, loaded::LoadedProgram, maps::KernelMaps, program},
};
use monitor_common::{
    config::XdpConfig,
    maps::{HotLine, PEER_HOT_MAP, PEER_STATE_MAP, PeerSlot, PeerState},
};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct SweepTimings {
    pub peers: u32,
    /// Reading every peer's record through the mmap, ms (median of runs).
    pub mmap_read_ms: f64,
    /// The agent's whole sweep (read, compare deadlines), ms (median of runs).
    pub agent_sweep_ms: f64,
    /// Reading the same peers through aya's map lookups (a syscall per hot line and one per
    /// slot), ms.
    pub aya_iter_ms: f64,
    pub iter_over_mmap: f64,
}

fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A full pass over `peers` peers: mmap against aya's iterator, in the same process and run.
pub fn sweep_timings(peers: u32) -> SweepTimings {
    let loaded = LoadedProgram::load(&XdpConfig::DEFAULT, peers).expect("load");
    let LoadedProgram {
        ebpf,
        maps:
            KernelMaps {
                table,
                mut registry,
                counters,
                ..
            },
        ..
    } = loaded;
    let now = monotonic_ns();
    for id in 0..peers as u64 {
        registry.admit(&table, id + 1, now).expect("admit");
    }
    let mmap_read_ms = median_ms(9, || {
        let mut heartbeats = 0u64;
        for slot in 0..peers {
            heartbeats += table.record(slot).map_or(0, |r| r.heartbeats);
        }
        std::hint::black_box(heartbeats);
    });
    let aya_iter_ms = {
        let lines: Array<_, HotLine> =
            Array::try_from(ebpf.map(PEER_HOT_MAP).expect("map")).expect("array");
        let states: Array<_, PeerState> =
            Array::try_from(ebpf.map(PEER_STATE_MAP).expect("map")).expect("array");
        median_ms(3, || {
            let mut heartbeats = 0u64;
            // Peers 1 to N: each in its own line and its own slot, `slot`.
            for slot in 0..peers {
                let line = lines.get(&slot, 0).expect("read");
                let state = states.get(&slot, 0).expect("read");
                let peer = PeerSlot {
                    hot: line.hot,
                    cold: state.cold,
                    ring_us: state.ring_us,
                };
                heartbeats += peer.record().heartbeats;
            }
            std::hint::black_box(heartbeats);
        })
    };
    let mut ebpf = ebpf;
    let program_fd = program::xdp_mut(&mut ebpf)
        .expect("xdp")
        .fd()
        .expect("fd")
        .as_fd()
        .try_clone_to_owned()
        .expect("dup");
    let agent = Agent::new(AgentParts {
        table,
        registry,
        program: Box::new(LiveProgram {
            counters,
            program_fd,
        }),
        detector: DetectorConfig::new(DetectorParams::DEFAULT, Levels::default()),
        iface: "none".into(),
        mode: "none".into(),
        origin: Default::default(),
        port: 0,
        admission: monitor::agent::admission::AdmissionPolicy {
            auto: false,
            from: monitor::agent::admission::AdmitFrom::Any,
            rate_per_sec: 1,
            per_source: 0,
        },
        expire_after: None,
    });
    agent.sweep(monotonic_ns(), false); // first sweep builds the trackers
    let agent_sweep_ms = median_ms(9, || agent.sweep(monotonic_ns(), false));
    SweepTimings {
        peers,
        mmap_read_ms,
        agent_sweep_ms,
        aya_iter_ms,
        iter_over_mmap: aya_iter_ms / mmap_read_ms,
    }
}
