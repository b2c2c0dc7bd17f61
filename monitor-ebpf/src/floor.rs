//! The floor program of `cargo xtask bench`, not part of the monitor: the least an XDP program
//! can do with a heartbeat stream. It parses Ethernet, IPv4 (IHL honoured) or IPv6, and UDP,
//! matches the destination port and drops; everything else passes. The monitor's cost is
//! reported as a multiple of this one's, measured on the same stream in the same run, since
//! absolute times on a shared machine mean little.
//!
//! With `FLOOR_CLOCK` set it also reads the clock (`bpf_ktime_get_ns`) for every packet it
//! drops: the least a program that timestamps heartbeats pays, since the monitor reads the
//! clock once per heartbeat and the clock is not free (on this project's VMs it costs half to
//! three quarters of what this program costs per packet without it).
//!
//! With `FLOOR_TOUCH` set it also touches per-peer state the way an accepted heartbeat of a
//! peer in its own slot does, and nothing else: the heartbeat's id names a peer, whose hot
//! line is read and written back (1), and whose source address line, ring entry (at the
//! position the hot line holds) and last-heard word are stored into (2). `FLOOR_LAYOUT`
//! places that state as the monitor's slots did before layout 15 (0: a peer's hot line, cold
//! lines and ring together, 704 bytes apart) or split, as it does since (1: the hot lines in a
//! dense table of their own, the rest after it), so the bench shows, in the same stream, what
//! each line costs in either layout.
//!
//! `FLOOR_TOUCH` 4 is the kernel's half of an agent that does not scan the last-heard words:
//! besides what 3 does, the program loads the peer's watch (its floor and the heartbeat count
//! the floor covers up to, which such an agent would write at each refresh) and stores the
//! 4 ms bucket in which the peer's floor passes (`FLOOR_DUE`, two bytes a peer), or the bucket
//! of now once the count passed the floor's span. The agent would then scan the buckets, a
//! quarter of the words' bytes, for the ones about to come, and look only at those peers
//! (`hbm-bench due-scan-floor`): what that design costs the kernel per heartbeat and the agent
//! per scan, measured on the monitor's stream (docs/tuning.md, "An agent the kernel tells").
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_ktime_get_ns,
    macros::{map, xdp},
    maps::Array,
    programs::XdpContext,
};
use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    mem::size_of,
};

use monitor_common::maps::{BPF_F_MMAPABLE, MAX_WINDOW, PeerCold, PeerSlot};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{IpProto, Ipv4Hdr, Ipv6Hdr},
    udp::UdpHdr,
};

/// Set by the loader before load (aya `override_global`).
#[unsafe(no_mangle)]
static FLOOR_PORT: u16 = 0;
/// Non-zero: read the clock for every packet dropped. Set before load like the port.
#[unsafe(no_mangle)]
static FLOOR_CLOCK: u8 = 0;
/// Per-peer state touched for each heartbeat: 0 none, 1 the hot line, 2 the hot line and the
/// lines a heartbeat stores into, 3 the same with the hot line taken as the monitor takes it
/// (a locked compare-and-swap of its first word, given back with a plain store), 4 the same
/// with the due bucket stored (the module docs). Set before load; needs `FLOOR_PEERS` and
/// FLOOR_STATE sized.
#[unsafe(no_mangle)]
static FLOOR_TOUCH: u8 = 0;
/// Where the state lies: [`LAYOUT_SLOTS`] or [`LAYOUT_SPLIT`]. Set before load.
#[unsafe(no_mangle)]
static FLOOR_LAYOUT: u8 = LAYOUT_SLOTS;
/// Peers (ids 1 to this); FLOOR_STATE holds `FLOOR_PEERS * LINES_PER_PEER` lines.
#[unsafe(no_mangle)]
static FLOOR_PEERS: u32 = 0;

/// As the monitor kept a peer before layout 15 (a `PeerSlot`): the hot line, two cold lines,
/// eight ring lines.
pub const LAYOUT_SLOTS: u8 = 0;
/// The hot lines of all peers first, one after another; each peer's other ten lines after them
/// (the monitor's layout since 15, for ids 1 to N: their own hot lines, then their slots).
pub const LAYOUT_SPLIT: u8 = 1;
/// A peer's hot state in 32 bytes, two peers to a line in a dense table (with `FLOOR_TOUCH`
/// 1 or 2): what a hot line half the monitor's would cost, 1.6 MB at 50,000 peers, which
/// this machine's 2 MiB L2 could hold.
pub const LAYOUT_PACKED_32: u8 = 2;
/// The same in 16 bytes, four to a line: 0.8 MB at 50,000 peers.
pub const LAYOUT_PACKED_16: u8 = 3;
const LINE: usize = 64;
/// Lines of a `PeerSlot`: the hot line, the cold lines, the ring.
pub const LINES_PER_PEER: u32 = (size_of::<PeerSlot>() / LINE) as u32;
/// Lines of `PeerCold`, between a peer's hot line and its ring.
const COLD_LINES: u32 = (size_of::<PeerCold>() / LINE) as u32;
/// Ring entries (u32) per line, and lines of the ring.
const RING_PER_LINE: u32 = (LINE / size_of::<u32>()) as u32;
const RING_LINES: u32 = MAX_WINDOW as u32 / RING_PER_LINE;
const _: () = assert!(LINES_PER_PEER == 1 + COLD_LINES + RING_LINES);

/// One cache line of per-peer state. In the hot line: word 0 the lock's place, 1 the id, 2
/// the last arrival, 3 the ring's head.
#[repr(C, align(64))]
pub struct Line {
    pub words: [u64; 8],
}

/// The state `FLOOR_TOUCH` touches; the loader sets its size (`FLOOR_PEERS` x
/// [`LINES_PER_PEER`] lines).
#[map]
static FLOOR_STATE: Array<Line> = Array::with_max_entries(1, 0);

/// One word per peer, as the monitor's LAST_HEARD; sized by the loader (`FLOOR_PEERS`).
/// Mappable, so the bench's scan floor can scan it as it scans the monitor's.
#[map]
static FLOOR_LAST_HEARD: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// `FLOOR_TOUCH` 4: per peer, what an agent would write at each refresh: the floor's silence
/// in units of 2^[`DUE_UNIT_SHIFT`] ns (low 32 bits; 0 for [`DEFAULT_FLOOR_NS`]) and the
/// heartbeat count past which the floor no longer holds (high 32 bits; 0 for never). Sized by
/// the loader; the bench leaves it zero, which costs the program the same load.
#[map]
static FLOOR_WATCH: Array<u64> = Array::with_max_entries(1, 0);

/// `FLOOR_TOUCH` 4: per peer, the bucket (2^[`DUE_BUCKET_SHIFT`] ns, modulo 2^16) in which its
/// floor passes, [`DUE_PER_LINE`] peers a line: an array's elements are 8-byte aligned, so
/// an array of single buckets would spread them 8 bytes apart. Mappable, for the agent's scan.
/// Sized by the loader.
#[map]
static FLOOR_DUE: Array<[u16; DUE_PER_LINE]> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Due buckets in an element of `FLOOR_DUE`: a cache line.
pub const DUE_PER_LINE: usize = 32;

/// A due bucket: 2^22 ns, about 4.2 ms; 2^16 of them are 275 s.
pub const DUE_BUCKET_SHIFT: u32 = 22;
/// The unit of a watch's floor: 2^16 ns, about 66 us.
pub const DUE_UNIT_SHIFT: u32 = 16;
/// The floor of a watch left zero: a 10 Hz sender's with the defaults.
pub const DEFAULT_FLOOR_NS: u64 = 138_000_000;

#[xdp]
pub fn floor(ctx: XdpContext) -> u32 {
    let port = unsafe { core::ptr::read_volatile(&FLOOR_PORT) };
    let Some(payload_at) = heartbeat_payload(&ctx, port) else {
        return xdp_action::XDP_PASS;
    };
    let touch = unsafe { core::ptr::read_volatile(&FLOOR_TOUCH) };
    // The reading decides the verdict (it is never zero), so nothing can drop the call.
    if (touch != 0 || unsafe { core::ptr::read_volatile(&FLOOR_CLOCK) } != 0)
        && touch_state(&ctx, payload_at, touch, unsafe { bpf_ktime_get_ns() }) == 0
    {
        return xdp_action::XDP_PASS;
    }
    xdp_action::XDP_DROP
}

/// Touches the state of the peer the heartbeat at `payload_at` names (nothing when `touch` is
/// 0 or the id is not 1 to `FLOOR_PEERS`); `now` unless it read something that made it 0.
#[inline(always)]
fn touch_state(ctx: &XdpContext, payload_at: usize, touch: u8, now: u64) -> u64 {
    if touch == 0 {
        return now;
    }
    let start = ctx.data();
    // The id, big-endian, at bytes 8..16 of the heartbeat header (`monitor_common::wire`).
    if start + payload_at + 16 > ctx.data_end() {
        return now;
    }
    let id =
        u64::from_be(unsafe { core::ptr::read_unaligned((start + payload_at + 8) as *const u64) });
    let peers = unsafe { core::ptr::read_volatile(&FLOOR_PEERS) } as u64;
    if id == 0 || id > peers {
        return now;
    }
    let peer = (id - 1) as u32;
    let layout = unsafe { core::ptr::read_volatile(&FLOOR_LAYOUT) };
    if layout == LAYOUT_PACKED_32 || layout == LAYOUT_PACKED_16 {
        let words = if layout == LAYOUT_PACKED_32 { 4 } else { 2 };
        return touch_packed(peer, peers as u32, words, touch, now);
    }
    let split = layout == LAYOUT_SPLIT;
    // The hot line, then the first of the peer's other lines (the cold ones, then the ring).
    let (hot_at, rest_at) = if split {
        (peer, peers as u32 + peer * (LINES_PER_PEER - 1))
    } else {
        (peer * LINES_PER_PEER, peer * LINES_PER_PEER + 1)
    };
    let Some(hot) = FLOOR_STATE.get_ptr_mut(hot_at) else {
        return now;
    };
    // SAFETY: in the map value; the bench sends each peer's heartbeats from one flow, and a
    // race between CPUs would only make a measurement's stored values wrong.
    let hot = unsafe { &mut *hot };
    let locked = touch >= 3;
    if locked {
        // As the monitor's `try_lock`: on x86 a locked instruction, which waits for every
        // store before it (the previous heartbeat's, to lines that missed) to complete.
        let lock: *mut u64 = &mut hot.words[0];
        let before = unsafe { core::ptr::read_volatile(lock) };
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::Acquire }, { AtomicOrdering::Relaxed }>(
                lock,
                before,
                before | 1,
            )
        };
        if !swapped {
            return now;
        }
    } else {
        hot.words[0] = hot.words[0].wrapping_add(2);
    }
    let interval = now.wrapping_sub(hot.words[2]);
    let head = hot.words[3] as u32 % (RING_PER_LINE * RING_LINES);
    hot.words[1] = id;
    hot.words[2] = now;
    hot.words[3] = (head + 1) as u64;
    if touch >= 2 {
        store_the_rest(peer, rest_at, head, interval, now);
    }
    if touch >= 4 {
        // The heartbeats counted in the hot line's fifth word (the ring's head wraps).
        let count = hot.words[4].wrapping_add(1);
        hot.words[4] = count;
        let line = peer / DUE_PER_LINE as u32;
        if let (Some(watch), Some(due)) = (FLOOR_WATCH.get(peer), FLOOR_DUE.get_ptr_mut(line)) {
            let watch = *watch;
            let units = watch & 0xffff_ffff;
            let floor_ns = if units == 0 {
                DEFAULT_FLOOR_NS
            } else {
                units << DUE_UNIT_SHIFT
            };
            let until = watch >> 32;
            let at = if until != 0 && (count & 0xffff_ffff) > until {
                now
            } else {
                now + floor_ns
            };
            unsafe {
                (*due)[(peer % DUE_PER_LINE as u32) as usize] = (at >> DUE_BUCKET_SHIFT) as u16
            };
        }
    }
    if locked {
        // Given back as the monitor's `unlock` does on x86: a plain store after the others.
        let lock: *mut u64 = &mut hot.words[0];
        unsafe { core::ptr::write_volatile(lock, (core::ptr::read_volatile(lock) | 1) + 1) };
    }
    now
}

/// The packed layouts: `peer`'s `words` words (4 or 2) of hot state, `8 / words` peers to a
/// line, read and written back as the hot line is: a count (the ring's head), the id (4 words
/// only), the last arrival. With `touch` 2, also the three stores of `touch_state`, into the
/// peer's other lines after the packed table.
#[inline(always)]
fn touch_packed(peer: u32, peers: u32, words: u32, touch: u8, now: u64) -> u64 {
    let per_line = 8 / words;
    let Some(line) = FLOOR_STATE.get_ptr_mut(peer / per_line) else {
        return now;
    };
    // SAFETY: in the map value; as in `touch_state`, a race would only store wrong values.
    let line = unsafe { &mut *line };
    let base = ((peer % per_line) * words) as usize;
    let count = line.words[base & 7].wrapping_add(1);
    line.words[base & 7] = count;
    if words == 4 {
        line.words[(base + 1) & 7] = peer as u64 + 1;
    }
    let last = (base + words as usize - 1) & 7;
    let interval = now.wrapping_sub(line.words[last]);
    line.words[last] = now;
    if touch >= 2 {
        let head = (count as u32).wrapping_sub(1) % (RING_PER_LINE * RING_LINES);
        let rest_at = peers.div_ceil(per_line) + peer * (LINES_PER_PEER - 1);
        store_the_rest(peer, rest_at, head, interval, now);
    }
    now
}

/// The three stores of an accepted heartbeat beyond its hot state, as the monitor's (stores
/// only, nothing read first): the source address in the peer's first line at `rest_at`, the
/// ring entry at `head`, the last-heard word.
#[inline(always)]
fn store_the_rest(peer: u32, rest_at: u32, head: u32, interval: u64, now: u64) {
    // SAFETY: in the map values; as in `touch_state`, a race would only store wrong values.
    if let Some(cold) = FLOOR_STATE.get_ptr_mut(rest_at) {
        let cold = unsafe { &mut *cold };
        cold.words[0] = peer as u64 + 1;
        cold.words[1] = now;
    }
    if let Some(ring) = FLOOR_STATE.get_ptr_mut(rest_at + COLD_LINES + head / RING_PER_LINE) {
        let ring = unsafe { &mut *(ring as *mut [u32; 16]) };
        ring[(head % RING_PER_LINE) as usize] = interval as u32;
    }
    if let Some(word) = FLOOR_LAST_HEARD.get_ptr_mut(peer) {
        unsafe { *word = now };
    }
}

/// Where the UDP payload starts, if the packet is UDP to `port`.
#[inline(always)]
fn heartbeat_payload(ctx: &XdpContext, port: u16) -> Option<usize> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + EthHdr::LEN > end {
        return None;
    }
    let eth = unsafe { &*(start as *const EthHdr) };
    let udp_at = if eth.ether_type == EtherType::Ipv4 as u16 {
        if start + EthHdr::LEN + Ipv4Hdr::LEN > end {
            return None;
        }
        let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv4Hdr) };
        if ip.proto != IpProto::Udp as u8 {
            return None;
        }
        let ihl = ((ip.vihl & 0x0f) as usize) * 4;
        if ihl < Ipv4Hdr::LEN {
            return None;
        }
        EthHdr::LEN + ihl
    } else if eth.ether_type == EtherType::Ipv6 as u16 {
        if start + EthHdr::LEN + Ipv6Hdr::LEN > end {
            return None;
        }
        let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv6Hdr) };
        if ip.next_hdr != IpProto::Udp as u8 {
            return None;
        }
        EthHdr::LEN + Ipv6Hdr::LEN
    } else {
        return None;
    };
    // Bound the offset so the verifier can track the packet pointer (IHL is at most 60).
    if udp_at > EthHdr::LEN + 60 {
        return None;
    }
    if start + udp_at + UdpHdr::LEN > end {
        return None;
    }
    let udp = unsafe { &*((start + udp_at) as *const UdpHdr) };
    (u16::from_be_bytes(udp.dst) == port).then_some(udp_at + UdpHdr::LEN)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
