//! The generator of `monitor loadgen --kernel`, not part of the monitor: run by BPF_PROG_RUN
//! with BPF_F_TEST_XDP_LIVE_FRAMES, it gets the same template frame (Ethernet, IPv4, UDP, a
//! heartbeat) over and over, stamps each with the next heartbeat of the plan (peer id,
//! sequence and, with a key, the SipHash tag; the incarnation is in the template) and returns
//! XDP_TX, which the kernel turns into a transmit out of the interface the run names. A
//! heartbeat the plan leaves out (a killed or churning peer's) is dropped and counted.
//!
//! One syscall sends thousands of frames with no copy from userspace and no socket, which is
//! what lets one core send several times what sendmmsg does.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::Array,
    programs::XdpContext,
};
use monitor_common::{
    auth::siphash24_24,
    loadgen::{LG_NEXT_N, LG_SENT, LG_SILENT, LG_STATE_LEN, LoadgenPlan, PAYLOAD_OFFSET},
    wire::HEADER_LEN,
};

/// Set by the loader before load (aya `override_global`).
#[unsafe(no_mangle)]
static PLAN: LoadgenPlan = LoadgenPlan::NONE;

/// The next heartbeat number and what was done with each (see `monitor_common::loadgen`).
#[map]
static LOADGEN_STATE: Array<u64> = Array::with_max_entries(LG_STATE_LEN, 0);

#[xdp]
pub fn loadgen(ctx: XdpContext) -> u32 {
    let start = ctx.data();
    let plan = unsafe { core::ptr::read_volatile(&PLAN) };
    if start + 12 > ctx.data_end() {
        return xdp_action::XDP_PASS;
    }
    // Only the generator's own frames carry the interface's address as their source: anything
    // received on the interface the program is attached to passes untouched.
    let mut i = 0;
    while i < 6 {
        // SAFETY: bytes 6..12 are in the frame (checked above).
        if unsafe { *((start + 6 + i) as *const u8) } != plan.src_mac[i] {
            return xdp_action::XDP_PASS;
        }
        i += 1;
    }
    if start + PAYLOAD_OFFSET + HEADER_LEN > ctx.data_end() {
        return xdp_action::XDP_ABORTED;
    }
    let Some(next) = LOADGEN_STATE.get_ptr_mut(LG_NEXT_N) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: an array element, valid for the program's run; one runner at a time.
    let n = unsafe {
        let n = *next;
        *next = n.wrapping_add(1);
        n
    };
    if plan.silent(n) {
        count(LG_SILENT);
        return xdp_action::XDP_DROP;
    }
    let (Some(index), Some(seq)) = (n.checked_rem(plan.peers), n.checked_div(plan.peers)) else {
        return xdp_action::XDP_ABORTED;
    };
    let id = plan.first_id.wrapping_add(index);
    let payload = (start + PAYLOAD_OFFSET) as *mut u8;
    // Big-endian on the wire; SipHash reads the same bytes as little-endian words.
    let (id_be, seq_be) = (id.to_be(), seq.to_be());
    // SAFETY: bounds checked above (the payload's 32 bytes are in the frame).
    unsafe {
        core::ptr::write_unaligned(payload.add(8) as *mut u64, id_be);
        core::ptr::write_unaligned(payload.add(16) as *mut u64, seq_be);
        let tag = if plan.signed != 0 {
            siphash24_24(
                plan.k0,
                plan.k1,
                [plan.first_word_le, id_be.to_le(), seq_be.to_le()],
            )
        } else {
            0
        };
        core::ptr::write_unaligned(payload.add(24) as *mut u64, tag.to_le());
    }
    count(LG_SENT);
    xdp_action::XDP_TX
}

#[inline(always)]
fn count(index: u32) {
    if let Some(n) = LOADGEN_STATE.get_ptr_mut(index) {
        // SAFETY: an array element; one runner at a time (see `monitor_common::loadgen`).
        unsafe { *n = (*n).wrapping_add(1) };
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
