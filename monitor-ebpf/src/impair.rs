//! Path impairment for recording real traces (`cargo xtask traces`), not part of the monitor:
//! a TC egress program that drops UDP datagrams to one port per a Gilbert-Elliott model (a good
//! and a bad state, each with its own loss probability, a Markov step per datagram). This
//! kernel has no netem; this is the bursty loss it would have given. Loaded by `hbm-impair`.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_get_prandom_u32,
    macros::{classifier, map},
    maps::Array,
    programs::TcContext,
};
use monitor_common::impair::{GE_BAD, GE_DROPPED, GE_PASSED, GE_STATE_LEN, GilbertElliott};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{IpProto, Ipv4Hdr},
    udp::UdpHdr,
};

/// Set by the loader before load (aya `override_global`).
#[unsafe(no_mangle)]
static MODEL: GilbertElliott = GilbertElliott::NONE;

/// The chain's state (`GE_BAD`: 0 good, 1 bad) and what it did. One sender per interface in
/// the trace set-ups, so the unsynchronised update is exact there.
#[map]
static GE_STATE: Array<u64> = Array::with_max_entries(GE_STATE_LEN, 0);

#[classifier]
pub fn impair(ctx: TcContext) -> i32 {
    let model = unsafe { core::ptr::read_volatile(&MODEL) };
    if !matches_port(&ctx, model.port) {
        return TC_ACT_OK;
    }
    let Some(bad) = GE_STATE.get_ptr_mut(GE_BAD) else {
        return TC_ACT_OK;
    };
    // SAFETY: an array element, valid for the program's run.
    let bad = unsafe { &mut *bad };
    let step = unsafe { bpf_get_prandom_u32() };
    *bad = if *bad != 0 {
        (step >= model.to_good) as u64
    } else {
        (step < model.to_bad) as u64
    };
    let loss = if *bad != 0 {
        model.loss_bad
    } else {
        model.loss_good
    };
    let drop = unsafe { bpf_get_prandom_u32() } < loss;
    let counter = if drop { GE_DROPPED } else { GE_PASSED };
    if let Some(n) = GE_STATE.get_ptr_mut(counter) {
        unsafe { *n += 1 };
    }
    if drop { TC_ACT_SHOT } else { TC_ACT_OK }
}

/// Whether the frame is IPv4/UDP to `port` (unfragmented, as heartbeats are).
#[inline(always)]
fn matches_port(ctx: &TcContext, port: u16) -> bool {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + EthHdr::LEN + Ipv4Hdr::LEN > end {
        return false;
    }
    let eth = unsafe { &*(start as *const EthHdr) };
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return false;
    }
    let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv4Hdr) };
    if ip.proto != IpProto::Udp as u8 || ip.vihl != 0x45 {
        return false;
    }
    let udp = start + EthHdr::LEN + Ipv4Hdr::LEN;
    if udp + UdpHdr::LEN > end {
        return false;
    }
    let udp = unsafe { &*(udp as *const UdpHdr) };
    u16::from_be_bytes(udp.dst) == port
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
