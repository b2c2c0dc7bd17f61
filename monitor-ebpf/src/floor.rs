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
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action, helpers::bpf_ktime_get_ns, macros::xdp, programs::XdpContext,
};
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

#[xdp]
pub fn floor(ctx: XdpContext) -> u32 {
    let port = unsafe { core::ptr::read_volatile(&FLOOR_PORT) };
    if !is_heartbeat_port(&ctx, port) {
        return xdp_action::XDP_PASS;
    }
    // The reading decides the verdict (it is never zero), so nothing can drop the call.
    if unsafe { core::ptr::read_volatile(&FLOOR_CLOCK) } != 0 && unsafe { bpf_ktime_get_ns() } == 0
    {
        return xdp_action::XDP_PASS;
    }
    xdp_action::XDP_DROP
}

#[inline(always)]
fn is_heartbeat_port(ctx: &XdpContext, port: u16) -> bool {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + EthHdr::LEN > end {
        return false;
    }
    let eth = unsafe { &*(start as *const EthHdr) };
    let udp_at = if eth.ether_type == EtherType::Ipv4 as u16 {
        if start + EthHdr::LEN + Ipv4Hdr::LEN > end {
            return false;
        }
        let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv4Hdr) };
        if ip.proto != IpProto::Udp as u8 {
            return false;
        }
        let ihl = ((ip.vihl & 0x0f) as usize) * 4;
        if ihl < Ipv4Hdr::LEN {
            return false;
        }
        EthHdr::LEN + ihl
    } else if eth.ether_type == EtherType::Ipv6 as u16 {
        if start + EthHdr::LEN + Ipv6Hdr::LEN > end {
            return false;
        }
        let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv6Hdr) };
        if ip.next_hdr != IpProto::Udp as u8 {
            return false;
        }
        EthHdr::LEN + Ipv6Hdr::LEN
    } else {
        return false;
    };
    // Bound the offset so the verifier can track the packet pointer (IHL is at most 60).
    if udp_at > EthHdr::LEN + 60 {
        return false;
    }
    if start + udp_at + UdpHdr::LEN > end {
        return false;
    }
    let udp = unsafe { &*((start + udp_at) as *const UdpHdr) };
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
