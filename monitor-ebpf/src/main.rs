//! XDP program (and the same logic as a TC classifier, `monitor_tc`): recognise heartbeats,
//! timestamp them, update the sender's peer slot.
//!
//! Per packet: parse Ethernet (+ up to two VLAN tags), IPv4 (IHL honoured, fragments skipped)
//! or IPv6, UDP; match the heartbeat port (or, for passive sources, the BFD ports and the
//! `--udp-port` ports: those packets are recorded under an id derived from them and always
//! passed on); (with `XDP_FLAG_CHECK_DESTINATION`) check that
//! the destination address is this host's (LOCAL_ADDRS); validate the header with the rules
//! shared with userspace (`monitor_common::wire`); look the peer id up; update its slot under
//! the slot's sequence counter. Everything that is not a valid heartbeat is passed untouched.
#![no_std]
#![no_main]
#![feature(core_intrinsics, asm_experimental_arch)]
#![allow(internal_features)]

mod load;
mod parse;
mod record;

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, TC_ACT_OK, TC_ACT_SHOT, xdp_action, xdp_md},
    cty::c_void,
    helpers::generated::{bpf_loop, bpf_skb_load_bytes, bpf_xdp_load_bytes},
    macros::{classifier, map, xdp},
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::{TcContext, XdpContext},
};
use aya_log_ebpf::warn;
use monitor_common::{
    auth::{AuthKey, KEY_SLOTS},
    config::{XDP_FLAG_PASS_HEARTBEATS, XdpConfig},
    index,
    maps::{
        ARRIVALS_BYTES, BPF_F_MMAPABLE, Counters, DEFAULT_CAPACITY, HotLine, LOCAL_ADDRS_CAPACITY,
        LOCAL_FAST_ADDRS, LocalFast, PeerState, PinnedMeta, UNKNOWN_PEERS_BYTES,
    },
    wire::HEADER_LEN,
};

use crate::parse::{Heartbeat, Packet, Parsed, Sender};

/// Written by the agent before load (aya `override_global`); read-only to the program.
#[unsafe(no_mangle)]
static CONFIG: XdpConfig = XdpConfig::DEFAULT;

/// The hot lines (`monitor_common::index`): the peer ids, each with its lock, its hot fields
/// and the link to its slot; the agent writes ids and links through its mmap.
#[map]
static PEER_HOT: Array<HotLine> =
    Array::with_max_entries(index::lines_for(DEFAULT_CAPACITY), BPF_F_MMAPABLE);

/// Each peer's cold lines and ring, at the slot its hot line links to.
#[map]
static PEER_STATE: Array<PeerState> = Array::with_max_entries(DEFAULT_CAPACITY, BPF_F_MMAPABLE);

/// One word per slot, the arrival and count of its last accepted heartbeat
/// (`monitor_common::last_heard`): what the agent's sweep scans instead of the slots.
#[map]
static LAST_HEARD: Array<u64> = Array::with_max_entries(DEFAULT_CAPACITY, BPF_F_MMAPABLE);

#[map]
static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

#[map]
static UNKNOWN_PEERS: RingBuf = RingBuf::with_byte_size(UNKNOWN_PEERS_BYTES, 0);

/// Arrivals of traced peers (`monitor record`).
#[map]
static ARRIVALS: RingBuf = RingBuf::with_byte_size(ARRIVALS_BYTES, 0);

#[map]
static AUTH_KEYS: Array<AuthKey> = Array::with_max_entries(KEY_SLOTS, 0);

/// Destination addresses of this host (IPv4-mapped for IPv4, as two native-endian words of
/// the 16 bytes), written by the agent; read with `XDP_FLAG_CHECK_DESTINATION` only.
#[map]
static LOCAL_ADDRS: HashMap<[u64; 2], u8> = HashMap::with_max_entries(LOCAL_ADDRS_CAPACITY, 0);

/// The first few of LOCAL_ADDRS, compared before it is looked up (`LocalFast`).
#[map]
static LOCAL_FAST: Array<LocalFast> = Array::with_max_entries(1, 0);

/// Whether `addr` is one of this host's destination addresses: one of the first few (an
/// array lookup the verifier inlines, and up to four compares), else in LOCAL_ADDRS.
#[inline(always)]
fn is_local(addr: &[u64; 2]) -> bool {
    if let Some(fast) = LOCAL_FAST.get_ptr(0) {
        // SAFETY: in the map value; the agent rewrites it whole, and a torn read only sends
        // this packet on to the lookup below.
        let fast = unsafe { &*fast };
        let count = unsafe { core::ptr::read_volatile(&fast.count) } as usize;
        for i in 0..LOCAL_FAST_ADDRS {
            if i < count && fast.addrs[i] == *addr {
                return true;
            }
        }
    }
    // SAFETY: the value is only tested for presence, never read.
    unsafe { LOCAL_ADDRS.get(addr) }.is_some()
}

/// Written and read by the agent only (what pinned state is); the program never touches it.
#[map]
static META: Array<PinnedMeta> = Array::with_max_entries(1, 0);

#[inline(always)]
fn config() -> XdpConfig {
    // Volatile so the compiler does not fold the default; the verifier folds the real value.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

/// What the hooks answer when COUNTERS has no entry 0, which cannot happen (a one-entry
/// per-CPU array always has it): `Pass`. A build with `MONITOR_EBPF_VARIANT` set answers `Drop`
/// there instead, so its instructions, and the program's tag, differ from the normal build's
/// while it behaves the same and uses the same maps: the second build of the program that the
/// live-upgrade test (tests/tests/upgrade.rs) swaps in through the pinned link.
const UNREACHABLE_VERDICT: Verdict = match option_env!("MONITOR_EBPF_VARIANT") {
    Some(_) => Verdict::Drop,
    None => Verdict::Pass,
};

/// What a hook does with the packet it was given.
enum Verdict {
    Pass,
    Drop,
}

/// What differs between the hooks once a packet is parsed.
trait Hook: Packet + EbpfContext + Sized {
    /// Records an accepted heartbeat (`record::record`).
    fn record(&self, hb: &Heartbeat, config: &XdpConfig, counters: &mut Counters);
    /// Records a packet's heartbeats after the first (`Parsed::FirstOfBatch`) and says whether
    /// every one was a heartbeat: hands them to the hook's batch program (`call_batch_program`),
    /// which gives the packet its verdict and does not come back.
    fn rest_of_batch(&self, first: &Heartbeat, counters: &mut Counters) -> bool;
}

impl Hook for XdpContext {
    #[inline(always)]
    fn record(&self, hb: &Heartbeat, config: &XdpConfig, counters: &mut Counters) {
        record::record(self, hb, config, counters);
    }
    #[inline(always)]
    fn rest_of_batch(&self, first: &Heartbeat, counters: &mut Counters) -> bool {
        call_batch_program(self, &XDP_BATCH_PROGRAMS, first, counters)
    }
}

/// The one path of both hooks: parse, count, record.
#[inline(always)]
fn handle<C: Hook>(ctx: &C) -> Verdict {
    let config = config();
    let parsed = parse::parse(ctx, &config);
    // Looked up once the packet is parsed: the parser's registers are free by then.
    let Some(counters) = COUNTERS.get_ptr_mut(0) else {
        return UNREACHABLE_VERDICT;
    };
    // SAFETY: per-CPU value; XDP and TC programs run to completion on this CPU, nothing else
    // writes it.
    let counters = unsafe { &mut *counters };
    let batch = matches!(parsed, Parsed::FirstOfBatch(_));
    match parsed {
        Parsed::NotHeartbeat => {
            counters.not_heartbeat += 1;
            Verdict::Pass
        }
        Parsed::NotLocal => {
            counters.not_local += 1;
            Verdict::Pass
        }
        Parsed::Malformed => {
            counters.malformed += 1;
            // Cold path; the level is fixed at load (`monitor run --kernel-log`), off by default.
            warn!(
                ctx,
                "malformed heartbeat to port {}: passed on", config.port
            );
            Verdict::Pass
        }
        // Never consumed: the host's BFD daemon or service is the packet's real receiver.
        Parsed::Passive(packet) => {
            record::record_passive(&packet, &config, counters);
            Verdict::Pass
        }
        Parsed::Heartbeat(hb) | Parsed::FirstOfBatch(hb) => {
            ctx.record(&hb, &config, counters);
            // A batch with anything but heartbeats in it goes on to the stack whole, as a
            // malformed heartbeat does.
            let all_heartbeats = !batch || ctx.rest_of_batch(&hb, counters);
            if config.flags & XDP_FLAG_PASS_HEARTBEATS != 0 || !all_heartbeats {
                Verdict::Pass
            } else {
                Verdict::Drop
            }
        }
    }
}

#[xdp]
pub fn monitor(ctx: XdpContext) -> u32 {
    match handle(&ctx) {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

/// The deepest byte the parser reads: Ethernet, two VLAN tags and IP options end by byte 128
/// (`parse` refuses a UDP header further in), then UDP (8) and the heartbeat header (32).
const PULL_BYTES: u32 = 128 + 8 + 32;

/// The same logic at TC ingress (`monitor run --hook tc`; attached as a TCX link), so the
/// monitor runs beside another XDP program on the interface. For TCX, TC_ACT_OK is TCX_PASS
/// (the next program, or the stack) and TC_ACT_SHOT is TCX_DROP.
#[classifier]
pub fn monitor_tc(ctx: TcContext) -> i32 {
    // An skb may be non-linear: make the headers the parser reads directly accessible. Most
    // are already (the helper may copy a cloned skb), so only call it when they are not.
    let want = if ctx.len() < PULL_BYTES {
        ctx.len()
    } else {
        PULL_BYTES
    };
    if ctx.data_end() - ctx.data() < want as usize && ctx.pull_data(want).is_err() {
        return TC_ACT_OK as i32;
    }
    match handle(&ctx) {
        Verdict::Pass => TC_ACT_OK as i32,
        Verdict::Drop => TC_ACT_SHOT as i32,
    }
}

/// What a packet's heartbeats after the first share, left by the hook (`monitor`,
/// `monitor_tc`) for its batch program, and how many of them were not heartbeats. Per CPU: a
/// tail call keeps the CPU, and nothing else runs on it in between.
#[repr(C)]
struct Batch {
    sender: Sender,
    /// Heartbeats in the packet, and where the first one starts (`note_batch`).
    segments: u32,
    payload_offset: u32,
    /// Heartbeats after the first that failed a check.
    malformed: u32,
    /// A batch step's scratch: the heartbeat's bytes and the heartbeat they make, kept here,
    /// where the record path's frame and these would not fit in the verifier's 512 bytes.
    words: [u64; 4],
    heartbeat: Heartbeat,
}

/// Called by the parser for a packet of several heartbeats: how many and where they start,
/// kept for the batch program (the first heartbeat's record leaves no room for them on the
/// stack).
#[inline(always)]
pub fn note_batch(segments: u32, payload_offset: u32) {
    if let Some(batch) = BATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU value; only this CPU's programs use it.
        unsafe {
            (*batch).segments = segments;
            (*batch).payload_offset = payload_offset;
        }
    }
}

#[map]
static BATCH: PerCpuArray<Batch> = PerCpuArray::with_max_entries(1, 0);

/// `monitor_tc_batch`, at index 0, put there by the agent when it loads the TC hook. Where
/// the slot is empty, a packet's heartbeats after the first are counted as malformed.
#[map]
static BATCH_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

impl Hook for TcContext {
    #[inline(always)]
    fn record(&self, hb: &Heartbeat, config: &XdpConfig, counters: &mut Counters) {
        record::record(self, hb, config, counters);
    }
    #[inline(always)]
    fn rest_of_batch(&self, first: &Heartbeat, counters: &mut Counters) -> bool {
        call_batch_program(self, &BATCH_PROGRAMS, first, counters)
    }
}

/// `monitor_xdp_batch`, at index 0, put there by the agent when it loads the XDP hook (and
/// pinned beside the program with `--pin-path`: the kernel empties a program array when its
/// last user reference closes). Where the slot is empty, a packet's heartbeats after the first
/// are counted as malformed. A program array of its own: one takes programs of one type.
#[map]
static XDP_BATCH_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Leaves in `BATCH` what the heartbeats of `first`'s packet after it share, and tail-calls
/// the hook's batch program (index 0 of `programs`), which gives the packet its verdict and
/// does not come back. Returns only if the call fails (no program there), with the rest
/// counted as malformed.
#[inline(always)]
fn call_batch_program<C: EbpfContext>(
    ctx: &C,
    programs: &ProgramArray,
    first: &Heartbeat,
    counters: &mut Counters,
) -> bool {
    let Some(batch) = BATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU value; only this program and the one it calls use it.
    let segments = unsafe {
        (*batch).sender = Sender {
            dst_port: first.dst_port,
            src_family: first.src_family,
            src_port: first.src_port,
            src_words: first.src_words,
        };
        (*batch).segments
    };
    // SAFETY: the context is this program's own.
    unsafe { programs.tail_call(ctx, 0) };
    counters.malformed += u64::from(segments.saturating_sub(1));
    false
}

/// A batch program's context for the record path: a type of its own, so that the record
/// path's helpers are compiled apart for it. Shared with `monitor_tc`, LLVM stopped
/// inlining some of them there the same way, and that program's frame went from 400 to 528
/// bytes, past the verifier's 512.
struct BatchContext<'a, C>(&'a C);

impl<C: EbpfContext> EbpfContext for BatchContext<'_, C> {
    fn as_ptr(&self) -> *mut c_void {
        self.0.as_ptr()
    }
}

/// The heartbeats of a packet after its first (the hook recorded that one, then called its
/// batch program, whose verdict is the packet's), one `bpf_loop` step each (kernel 5.17+):
/// the verifier checks a step once, where a loop over the record path here ran past its
/// million instructions. A tail call starts a new stack frame: the hook's (the record path
/// inlined, 400 of the verifier's 512 bytes) has no room for a step's. `raw_ctx` is the
/// hook's context pointer, which the steps get through this frame's stack (a context
/// pointer cannot be kept in a map). True if every step recorded a heartbeat and the packet
/// is to be consumed.
#[inline(always)]
fn run_batch(mut raw_ctx: *mut c_void, step: *mut c_void) -> bool {
    let Some(batch) = BATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU value, written by the hook just before it called this program;
    // nothing else runs on this CPU.
    let steps = unsafe {
        (*batch).malformed = 0;
        (*batch).segments.saturating_sub(1)
    };
    // SAFETY: `step` is a static function of this program; `raw_ctx` outlives the call.
    let ran = unsafe { bpf_loop(steps, step, (&raw mut raw_ctx).cast(), 0) };
    // SAFETY: as above; read after the steps wrote it.
    let malformed = unsafe { core::ptr::read_volatile(&raw const (*batch).malformed) };
    ran == i64::from(steps) && malformed == 0 && config().flags & XDP_FLAG_PASS_HEARTBEATS == 0
}

/// The TC hook's batch program (`run_batch`).
#[classifier]
pub fn monitor_tc_batch(ctx: TcContext) -> i32 {
    if run_batch(ctx.skb.skb.cast(), tc_batch_heartbeat as *mut c_void) {
        TC_ACT_SHOT as i32
    } else {
        TC_ACT_OK as i32
    }
}

/// The XDP hook's batch program (`run_batch`).
#[xdp]
pub fn monitor_xdp_batch(ctx: XdpContext) -> u32 {
    if run_batch(ctx.ctx.cast(), xdp_batch_heartbeat as *mut c_void) {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// One heartbeat of a batch at TC: read from wherever it lies in the skb (a GSO batch is
/// mostly in pages, past what `bpf_skb_pull_data` made direct).
#[inline(never)]
extern "C" fn tc_batch_heartbeat(index: u64, raw_ctx: *mut c_void) -> i64 {
    // SAFETY: the skb pointer `run_batch` left on its stack for the whole loop.
    let ctx = TcContext::new(unsafe { *raw_ctx.cast::<*mut __sk_buff>() });
    batch_heartbeat(&BatchContext(&ctx), index, |offset, to| {
        // The helper itself, with the length a constant: aya's `load_bytes` clamps it to
        // what is left of the skb, which the verifier reads as possibly 0 and refuses.
        // SAFETY: 32 bytes into the map value's four words.
        unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), offset, to, HEADER_LEN as u32) }
    })
}

/// One heartbeat of a batch at XDP.
#[inline(never)]
extern "C" fn xdp_batch_heartbeat(index: u64, raw_ctx: *mut c_void) -> i64 {
    // SAFETY: the xdp_md pointer `run_batch` left on its stack for the whole loop.
    let ctx = XdpContext::new(unsafe { *raw_ctx.cast::<*mut xdp_md>() });
    batch_heartbeat(&BatchContext(&ctx), index, |offset, to| {
        // SAFETY: 32 bytes into the map value's four words.
        unsafe { bpf_xdp_load_bytes(ctx.ctx, offset, to, HEADER_LEN as u32) }
    })
}

/// One heartbeat of a batch, the `index`-th after the first, its bytes read by `load` (at an
/// offset into the packet, to a place for `HEADER_LEN` bytes; 0 on success). The bytes and
/// the heartbeat they make go to `Batch`'s scratch, not this step's frame.
#[inline(always)]
fn batch_heartbeat<C: EbpfContext>(
    ctx: &C,
    index: u64,
    load: impl FnOnce(u32, *mut c_void) -> i64,
) -> i64 {
    let (Some(batch), Some(counters)) = (BATCH.get_ptr_mut(0), COUNTERS.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: per-CPU values; nothing else runs on this CPU.
    let (batch, counters) = unsafe { (&mut *batch, &mut *counters) };
    let config = config();
    let offset = batch.payload_offset as usize + (index as usize + 1) * HEADER_LEN;
    let read = load(offset as u32, batch.words.as_mut_ptr().cast());
    if read == 0
        && parse::heartbeat_into(&batch.words, &config, &batch.sender, &mut batch.heartbeat)
    {
        record::record(ctx, &batch.heartbeat, &config, counters);
    } else {
        counters.malformed += 1;
        batch.malformed += 1;
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
