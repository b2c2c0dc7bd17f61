//! The floor program (monitor-ebpf/src/floor.rs: parse to the UDP port and drop), the least
//! any XDP program pays: loaded, timed by BPF_PROG_TEST_RUN, or attached for a while; and the
//! same, touching per-peer state line by line as a heartbeat does ([`Touch`]).

use std::{os::fd::AsFd, time::Duration};

use monitor::kernel::program;

use super::test_run::test_run_ns;
use crate::packet::Packet;

/// Per-peer state the floor touches for each heartbeat besides reading the clock (its
/// `FLOOR_TOUCH`, `FLOOR_LAYOUT`, `FLOOR_PEERS`): the lines of the peer the heartbeat names, so
/// the bench shows what each line costs in the monitor's stream, and what another layout of
/// them would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Touch {
    /// Nothing: the floor (+ clock).
    None,
    /// The peer's hot line, read and written back, in 704-byte slots (the monitor's layout
    /// before version 15): one dependent line per heartbeat, the least state a heartbeat can
    /// touch.
    Hot,
    /// The hot line and the three lines a heartbeat stores into (source address, ring entry at
    /// the hot line's head, last-heard word), in 704-byte slots (the layout before 15).
    Stores,
    /// `hot`, with the hot lines in a dense table of their own (64 bytes a peer): the monitor's
    /// layout since version 15 for a fleet numbered 1 to N (their own lines).
    SplitHot,
    /// `stores`, with the hot lines in a dense table of their own and the rest after it.
    SplitStores,
    /// `split-stores`, with the hot line taken as the monitor takes its lock (a locked
    /// compare-and-swap, which on x86 waits for the stores before it) and given back with a
    /// plain store: what the lock adds to the lines.
    SplitLocked,
    /// `split-locked`, and the kernel's half of an agent that does not scan the words: the
    /// peer's watch loaded (an agent-written floor and span) and the 4 ms bucket in which its
    /// floor passes stored, two bytes a peer (`FLOOR_DUE`, scanned by `due-scan-floor`).
    SplitDue,
    /// `split-hot` with a peer's hot state in 32 bytes, two to a line (1.6 MB at 50,000 peers,
    /// within this machine's 2 MiB L2): what a hot line half the monitor's would cost.
    Packed32,
    /// `packed32` and the three stores, into the peer's other lines after the packed table:
    /// what the stores' lines leave of a hot state that would fit.
    Packed32Stores,
    /// The same in 16 bytes, four to a line.
    Packed16,
}

impl Touch {
    /// (FLOOR_TOUCH, FLOOR_LAYOUT).
    fn globals(self) -> (u8, u8) {
        match self {
            Touch::None => (0, 0),
            Touch::Hot => (1, 0),
            Touch::Stores => (2, 0),
            Touch::SplitHot => (1, 1),
            Touch::SplitStores => (2, 1),
            Touch::SplitLocked => (3, 1),
            Touch::SplitDue => (4, 1),
            Touch::Packed32 => (1, 2),
            Touch::Packed32Stores => (2, 2),
            Touch::Packed16 => (1, 3),
        }
    }
}

/// Due buckets in an element of the floor's `FLOOR_DUE` (monitor-ebpf/src/floor.rs,
/// `DUE_PER_LINE`): a line of 32 two-byte buckets.
pub const DUE_PER_LINE: u32 = 32;

/// Lines of per-peer state in the floor's table (monitor-ebpf/src/floor.rs, `LINES_PER_PEER`):
/// a `PeerSlot`, eleven lines, as the monitor kept a peer before layout 15.
pub const LINES_PER_PEER: u32 = (std::mem::size_of::<monitor_common::maps::PeerSlot>() / 64) as u32;

/// The floor program (monitor-ebpf/src/floor.rs) loaded and verified, matching `port`; not
/// attached. With `clock`, it reads the clock for every packet it drops.
pub fn load_floor(port: u16, clock: bool) -> aya::Ebpf {
    load_floor_touching(port, clock, Touch::None, 0)
}

/// [`load_floor`], touching `touch` of the state of `peers` peers (ids 1 to `peers`) for each
/// heartbeat; the clock is read whenever state is touched.
pub fn load_floor_touching(port: u16, clock: bool, touch: Touch, peers: u32) -> aya::Ebpf {
    assert!(
        !program::FLOOR_OBJECT.is_empty(),
        "built without the eBPF programs"
    );
    let (touch_level, layout) = touch.globals();
    let peers = if touch == Touch::None {
        0
    } else {
        peers.max(1)
    };
    let mut ebpf = aya::EbpfLoader::new()
        .override_global("FLOOR_PORT", &port, true)
        .override_global("FLOOR_CLOCK", &u8::from(clock), true)
        .override_global("FLOOR_TOUCH", &touch_level, true)
        .override_global("FLOOR_LAYOUT", &layout, true)
        .override_global("FLOOR_PEERS", &peers, true)
        .map_max_entries("FLOOR_STATE", (peers * LINES_PER_PEER).max(1))
        .map_max_entries("FLOOR_LAST_HEARD", peers.max(1))
        .map_max_entries("FLOOR_WATCH", peers.max(1))
        .map_max_entries("FLOOR_DUE", peers.div_ceil(DUE_PER_LINE).max(1))
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

/// The floor's cost per packet by BPF_PROG_TEST_RUN, on the heartbeat `prog_test_run_ns` uses
/// (peer 7: with `touch`, the state of 7 peers is touched, peer 7's each time).
pub fn floor_test_run_ns(repeat: u32, clock: bool, touch: Touch) -> f64 {
    let mut ebpf = load_floor_touching(monitor_common::wire::DEFAULT_PORT, clock, touch, 7);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(floor_xdp(&mut ebpf), &packet, repeat)
}

/// The floor program touching `touch` of 7 peers' state, after one heartbeat of peer 7 through
/// BPF_PROG_TEST_RUN: loaded (not attached), its maps holding what that heartbeat stored.
pub fn floor_after_one_heartbeat(touch: Touch) -> aya::Ebpf {
    let mut ebpf = load_floor_touching(monitor_common::wire::DEFAULT_PORT, true, touch, 7);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(floor_xdp(&mut ebpf), &packet, 1);
    ebpf
}

/// Attaches the floor to `iface` (in the caller's namespace), calls `attached`, keeps it there
/// for `duration`, and returns the kernel's run statistics of that time (bpf_stats).
pub fn floor_attached(
    iface: &str,
    port: u16,
    (clock, touch, peers): (bool, Touch, u32),
    duration: Duration,
    attached: impl FnOnce(),
) -> program::RunStats {
    let mut ebpf = load_floor_touching(port, clock, touch, peers);
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
