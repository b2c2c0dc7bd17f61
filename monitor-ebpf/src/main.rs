//! XDP program: recognise heartbeats, timestamp them, update the sender's peer slot.
//!
//! Per packet: parse Ethernet (+ up to two VLAN tags), IPv4 (IHL honoured, fragments skipped)
//! or IPv6, UDP; match the heartbeat port; validate the header with the rules shared with
//! userspace (`monitor_common::wire`); look the peer id up; update its slot under the slot's
//! sequence counter. Everything that is not a valid heartbeat is passed untouched.
#![no_std]
#![no_main]
#![feature(core_intrinsics, asm_experimental_arch)]
#![allow(internal_features)]

mod load;
mod parse;
mod record;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use monitor_common::{
    auth::{AuthKey, KEY_SLOTS},
    config::{XDP_FLAG_PASS_HEARTBEATS, XdpConfig},
    maps::{
        ARRIVALS_BYTES, BPF_F_MMAPABLE, Counters, DEFAULT_CAPACITY, PeerSlot, PinnedMeta,
        UNKNOWN_PEERS_BYTES,
    },
};

use crate::parse::Parsed;

/// Written by the agent before load (aya `override_global`); read-only to the program.
#[unsafe(no_mangle)]
static CONFIG: XdpConfig = XdpConfig::DEFAULT;

#[map]
static PEER_INDEX: HashMap<u64, u32> = HashMap::with_max_entries(DEFAULT_CAPACITY, 0);

#[map]
static PEER_STATE: Array<PeerSlot> = Array::with_max_entries(DEFAULT_CAPACITY, BPF_F_MMAPABLE);

#[map]
static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

#[map]
static UNKNOWN_PEERS: RingBuf = RingBuf::with_byte_size(UNKNOWN_PEERS_BYTES, 0);

/// Arrivals of traced peers (`monitor record`).
#[map]
static ARRIVALS: RingBuf = RingBuf::with_byte_size(ARRIVALS_BYTES, 0);

#[map]
static AUTH_KEYS: Array<AuthKey> = Array::with_max_entries(KEY_SLOTS, 0);

/// Written and read by the agent only (what pinned state is); the program never touches it.
#[map]
static META: Array<PinnedMeta> = Array::with_max_entries(1, 0);

#[inline(always)]
fn config() -> XdpConfig {
    // Volatile so the compiler does not fold the default; the verifier folds the real value.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[xdp]
pub fn monitor(ctx: XdpContext) -> u32 {
    let Some(counters) = COUNTERS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: per-CPU value; XDP runs to completion on this CPU, nothing else writes it.
    let counters = unsafe { &mut *counters };
    let config = config();
    match parse::parse(&ctx, config.port) {
        Parsed::NotHeartbeat => {
            counters.not_heartbeat += 1;
            xdp_action::XDP_PASS
        }
        Parsed::Malformed => {
            counters.malformed += 1;
            // Cold path; the level is fixed at load (`monitor run --kernel-log`), off by default.
            warn!(&ctx, "malformed heartbeat to port {}: passed on", config.port);
            xdp_action::XDP_PASS
        }
        Parsed::Heartbeat(hb) => {
            record::record(&ctx, &hb, &config, counters);
            if config.flags & XDP_FLAG_PASS_HEARTBEATS != 0 {
                xdp_action::XDP_PASS
            } else {
                xdp_action::XDP_DROP
            }
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
