//! The monitor's program timed by BPF_PROG_TEST_RUN: one heartbeat, and what kernel logging
//! costs on the hot and a cold path.

use aya::programs::{TestRun, TestRunOptions};
use monitor::kernel::{clock::monotonic_ns, loaded::LoadedProgram, program};
use monitor_common::config::XdpConfig;
use serde::Serialize;

use crate::packet::Packet;

/// Mean ns of one run of `xdp` on `packet`, by BPF_PROG_TEST_RUN (the kernel times `repeat`
/// runs of the same packet and reports the mean).
pub(super) fn test_run_ns(xdp: &mut aya::programs::Xdp, packet: &[u8], repeat: u32) -> f64 {
    xdp.test_run(TestRunOptions {
        data_in: Some(packet),
        repeat,
        ..TestRunOptions::default()
    })
    .expect("BPF_PROG_TEST_RUN")
    .duration
    .as_nanos() as f64
}

/// The monitor's program loaded with logging at `log`, peer 7 admitted (the peer of the
/// heartbeat every TEST_RUN figure here sends).
fn monitor_with_peer_7(log: program::KernelLog) -> LoadedProgram {
    let mut loaded = LoadedProgram::load_pinned(&XdpConfig::DEFAULT, 16, None, log).expect("load");
    loaded
        .maps
        .registry
        .admit(&loaded.maps.table, 7, monotonic_ns())
        .expect("admit");
    loaded
}

/// Average cost of one heartbeat through the XDP program, by BPF_PROG_TEST_RUN.
pub fn prog_test_run_ns(repeat: u32) -> f64 {
    let mut loaded = monitor_with_peer_7(program::KernelLog::Off);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(
        program::xdp_mut(&mut loaded.ebpf).expect("xdp"),
        &packet,
        repeat,
    )
}

/// What `--kernel-log` costs, by BPF_PROG_TEST_RUN: ns per run of a valid heartbeat (the hot
/// path, which logs nothing) and of a malformed one (a cold path that logs at warn), with the
/// program loaded with logging off and at debug.
#[derive(Debug, Clone, Serialize)]
pub struct KernelLogCost {
    pub heartbeat_off_ns: f64,
    pub heartbeat_debug_ns: f64,
    pub malformed_off_ns: f64,
    pub malformed_debug_ns: f64,
}

pub fn kernel_log_cost(repeat: u32) -> KernelLogCost {
    let run = |log: program::KernelLog, malformed: bool| {
        let mut loaded = monitor_with_peer_7(log);
        let mut packet = Packet::heartbeat_v4(7, 1).build();
        if malformed {
            // The UDP payload cut to 3 bytes: addressed to the port, too short for a header.
            packet.truncate(packet.len() - monitor_common::wire::HEADER_LEN + 3);
        }
        test_run_ns(
            program::xdp_mut(&mut loaded.ebpf).expect("xdp"),
            &packet,
            repeat,
        )
    };

    use program::KernelLog::{Debug, Off};
    KernelLogCost {
        heartbeat_off_ns: run(Off, false),
        heartbeat_debug_ns: run(Debug, false),
        malformed_off_ns: run(Off, true),
        malformed_debug_ns: run(Debug, true),
    }
}
