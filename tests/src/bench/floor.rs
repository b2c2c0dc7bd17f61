//! The floor program (monitor-ebpf/src/floor.rs: parse to the UDP port and drop), the least
//! any XDP program pays: loaded, timed by BPF_PROG_TEST_RUN, or attached for a while.

use std::{os::fd::AsFd, time::Duration};

use monitor::kernel::program;

use super::test_run::test_run_ns;
use crate::packet::Packet;

/// The floor program (monitor-ebpf/src/floor.rs) loaded and verified, matching `port`; not
/// attached. With `clock`, it reads the clock for every packet it drops.
pub fn load_floor(port: u16, clock: bool) -> aya::Ebpf {
    assert!(
        !program::FLOOR_OBJECT.is_empty(),
        "built without the eBPF programs"
    );
    let mut ebpf = aya::EbpfLoader::new()
        .override_global("FLOOR_PORT", &port, true)
        .override_global("FLOOR_CLOCK", &u8::from(clock), true)
        .load(program::FLOOR_OBJECT)
        .expect("load the floor program");
    let xdp: &mut aya::programs::Xdp = ebpf
        .program_mut("floor")
        .expect("floor in the object")
        .try_into()
        .expect("an XDP program");
    xdp.load().expect("verify the floor program");
    ebpf
}

fn floor_xdp(ebpf: &mut aya::Ebpf) -> &mut aya::programs::Xdp {
    ebpf.program_mut("floor")
        .expect("floor")
        .try_into()
        .expect("XDP")
}

/// The floor's cost per packet by BPF_PROG_TEST_RUN, on the heartbeat `prog_test_run_ns` uses.
pub fn floor_test_run_ns(repeat: u32, clock: bool) -> f64 {
    let mut ebpf = load_floor(monitor_common::wire::DEFAULT_PORT, clock);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(floor_xdp(&mut ebpf), &packet, repeat)
}

/// Attaches the floor to `iface` (in the caller's namespace), calls `attached`, keeps it there
/// for `duration`, and returns the kernel's run statistics of that time (bpf_stats).
pub fn floor_attached(
    iface: &str,
    port: u16,
    clock: bool,
    duration: Duration,
    attached: impl FnOnce(),
) -> program::RunStats {
    let mut ebpf = load_floor(port, clock);
    let xdp = floor_xdp(&mut ebpf);
    xdp.attach(iface, aya::programs::XdpMode::default())
        .expect("attach the floor");
    let fd = xdp
        .fd()
        .expect("fd")
        .as_fd()
        .try_clone_to_owned()
        .expect("dup");
    attached();
    std::thread::sleep(duration);
    program::run_stats(fd.as_fd()).expect("run stats")
}
