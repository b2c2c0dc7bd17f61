//! Recording an accepted heartbeat into its peer's hot line and slot.

use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd};

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_ktime_get_ns, bpf_ktime_get_tai_ns},
};
use aya_log_ebpf::{debug, warn};
use monitor_common::{
    auth::{KEY_CURRENT, KEY_PREVIOUS, siphash24_24},
    config::{XDP_FLAG_REQUIRE_AUTH, XdpConfig},
    index, last_heard,
    maps::{
        ArrivalRecord, Counters, HotLine, LOCK_HELD, LOCK_SEQ_ONE, PeerHot, PeerState, SlotMut,
        UnknownPeerReport, linked_slot,
    },
    passive::{self, SOURCE_BFD, SOURCE_HEARTBEAT},
    slot::{self, Outcome},
    wire::FLAG_AUTH,
};

use crate::{
    ARRIVALS, AUTH_KEYS, LAST_HEARD, PEER_HOT, PEER_STATE, UNKNOWN_PEERS, parse::Heartbeat,
};
const NS_PER_SEC: u64 = 1_000_000_000;

/// Shared by the XDP and the TC hook; `ctx` only feeds aya-log, which takes any context.
#[inline(always)]
pub fn record<C: EbpfContext>(
    ctx: &C,
    hb: &Heartbeat,
    config: &XdpConfig,
    counters: &mut Counters,
) {
    let peer_id = hb.peer_id;
    let line = lookup(peer_id, config);
    if config.flags & XDP_FLAG_REQUIRE_AUTH != 0 && !authentic(hb) {
        // Forged, replayed under another key, or unsigned: never an arrival, never reported.
        // Counted per CPU, and against the peer with one atomic add on its slot's cold line,
        // never under the hot line's lock: a flood of forgeries carrying a victim's id, on
        // every CPU, must not make the victim's own heartbeats meet a busy lock.
        counters.auth_failures += 1;
        warn!(
            ctx,
            "heartbeat of peer {} (seq {}) failed authentication: dropped", peer_id, hb.seq
        );
        if let Some(line) = line {
            // SAFETY: in the map value. The id (in `lookup`) and the link are read without the
            // lock: a line the agent is handing to another peer at this instant may count one
            // failure that was not its.
            let lock = unsafe { core::ptr::read_volatile(&raw const (*line).lock) };
            if let Some(slot) = linked_slot(lock)
                && let Some(state) = PEER_STATE.get_ptr_mut(slot)
            {
                count_auth_failure(unsafe { &mut (*state).cold.auth_failures });
            }
        }
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(line) = line else {
        counters.unknown_peer += 1;
        debug!(ctx, "heartbeat of unknown peer {}", peer_id);
        let mut report = UnknownPeerReport {
            peer_id,
            seq: hb.seq,
            incarnation: hb.incarnation,
            src_family: hb.src_family,
            src_port: hb.src_port,
            src_addr: [0; 16],
            source: SOURCE_HEARTBEAT,
            bfd_state: 0,
            dst_port: config.port,
            discriminator: 0,
        };
        set_src_addr(&mut report.src_addr, hb.src_words);
        report_unknown(&report, now, config, counters);
        return;
    };
    // SAFETY: the pointer comes from a successful lookup; concurrent writers are excluded by
    // the sequence counter below, readers retry.
    let line = unsafe { &mut *line };
    let Some(locked) = try_lock(&mut line.lock) else {
        counters.contended += 1;
        debug!(
            ctx,
            "peer {}: hot line busy on another CPU, heartbeat not recorded", peer_id
        );
        return;
    };
    // Checked under the lock: the agent may have forgotten this peer and handed the line to
    // another between our lookup and now (it changes lines under the same lock). The link
    // cannot move while the lock is held.
    let Some((slot, state)) = linked_state(line.hot.peer_id == peer_id, locked) else {
        unlock(&mut line.lock);
        counters.unknown_peer += 1;
        return;
    };
    // SAFETY: PEER_STATE's value at the slot the line links to; only a holder of that line's
    // lock writes it (the agent, when it fills or empties a slot, holds it too).
    let state = unsafe { &mut *state };
    let mut parts = SlotMut {
        hot: &mut line.hot,
        cold: &mut state.cold,
        ring: &mut state.ring_us,
    };

    // Only an incarnation that went backwards under authentication asks for the wall clock.
    let fresh = hb.incarnation == parts.hot.incarnation
        || config.flags & XDP_FLAG_REQUIRE_AUTH == 0
        || slot::fresh_incarnation(hb.incarnation, wall_s(config));
    let outcome = slot::arrive_at(&mut parts, now, hb.seq, hb.incarnation, fresh, config);
    match outcome {
        Outcome::Duplicate => counters.duplicates += 1,
        Outcome::OutOfOrder => counters.out_of_order += 1,
        Outcome::Accepted { .. } => {
            // Stores only, into the first cold line: nothing there is read on this path.
            parts.cold.src_family = hb.src_family;
            parts.cold.src_port = hb.src_port;
            set_src_addr(&mut parts.cold.src_addr, hb.src_words);
            store_last_heard(slot, parts.hot);
            count_after_word(&mut counters.heartbeats);
        }
    }
    let told = slot::what_to_tell(&mut line.hot, outcome);
    unlock(&mut line.lock);
    if let Some(told) = told {
        tell_arrival(peer_id, now, hb.seq, hb.incarnation, told, counters);
    }
}

/// A packet of a passive source (a BFD session, a UDP flow): the same lines, lock and window
/// rules as a heartbeat (`slot::arrive_passive`), under the id derived from the packet. No
/// authentication (nothing to verify it with), and the caller passes the packet on.
#[inline(always)]
pub fn record_passive(p: &Heartbeat, config: &XdpConfig, counters: &mut Counters) {
    let line = lookup(p.peer_id, config);
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(line) = line else {
        counters.unknown_peer += 1;
        let mut report = UnknownPeerReport {
            peer_id: p.peer_id,
            seq: 0,
            incarnation: 0,
            src_family: p.src_family,
            src_port: p.src_port,
            src_addr: [0; 16],
            source: p.source,
            bfd_state: p.bfd.state,
            dst_port: p.dst_port,
            discriminator: p.bfd.my_discriminator,
        };
        set_src_addr(&mut report.src_addr, p.src_words);
        report_unknown(&report, now, config, counters);
        return;
    };
    // SAFETY: as in `record`.
    let line = unsafe { &mut *line };
    let Some(locked) = try_lock(&mut line.lock) else {
        counters.contended += 1;
        return;
    };
    let state = linked_state(line.hot.peer_id == p.peer_id, locked)
        // SAFETY: as in `record`.
        .map(|(slot, state)| (slot, unsafe { &mut *state }))
        // The slot must be this source's: a heartbeat peer may have picked the same id.
        .filter(|(_, state)| state.cold.source == p.source);
    let Some((slot, state)) = state else {
        unlock(&mut line.lock);
        counters.unknown_peer += 1;
        return;
    };
    let mut parts = SlotMut {
        hot: &mut line.hot,
        cold: &mut state.cold,
        ring: &mut state.ring_us,
    };
    let new_epoch = p.source == SOURCE_BFD && passive::note_bfd(&mut parts, &p.bfd);
    let outcome = slot::arrive_passive(&mut parts, now, new_epoch, config);
    parts.cold.src_family = p.src_family;
    parts.cold.src_port = p.src_port;
    set_src_addr(&mut parts.cold.src_addr, p.src_words);
    store_last_heard(slot, parts.hot);
    count_after_word(if p.source == SOURCE_BFD {
        &mut counters.bfd
    } else {
        &mut counters.flow
    });
    let told = slot::what_to_tell(&mut line.hot, outcome);
    let (seq, incarnation) = (line.hot.last_seq, line.hot.incarnation);
    unlock(&mut line.lock);
    if let Some(told) = told {
        tell_arrival(p.peer_id, now, seq, incarnation, told, counters);
    }
}

/// The slot a locked line links to and its PEER_STATE value, if the line is still the peer's
/// (`same_id`, checked under the lock) and links to a slot of the map. `locked` is the lock
/// word as this CPU took it.
#[inline(always)]
fn linked_state(same_id: bool, locked: u64) -> Option<(u32, *mut PeerState)> {
    if !same_id {
        return None;
    }
    let slot = linked_slot(locked)?;
    PEER_STATE.get_ptr_mut(slot).map(|state| (slot, state))
}

/// Unix time in seconds: the kernel's TAI clock less the TAI offset the loader measured.
#[inline(always)]
fn wall_s(config: &XdpConfig) -> u64 {
    let tai = unsafe { bpf_ktime_get_tai_ns() } / NS_PER_SEC;
    (tai as i64 - config.tai_offset_s as i64) as u64
}

/// One more authentication failure against a peer, without its slot's lock: an atomic add
/// (the failures may come on every CPU at once).
#[inline(always)]
fn count_auth_failure(count: &mut u64) {
    let count: *mut u64 = count;
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1);
    }
}

/// Counts a stored word, after it: an agent that reads the count first and finds it unchanged
/// since its last scan may leave the words alone (`monitor::agent::scan_skip`), so the count
/// must not become visible before the word. Both stores are volatile, which the compiler keeps
/// in order (BPF has no compiler fence to say so otherwise), and x86-64 makes stores visible
/// in program order.
#[inline(always)]
fn count_after_word(count: &mut u64) {
    let count: *mut u64 = count;
    unsafe { core::ptr::write_volatile(count, core::ptr::read_volatile(count).wrapping_add(1)) };
}

/// Stores the slot's last-heard word after an accepted arrival, the word the agent computes
/// from its view of the slot (`monitor_common::last_heard::of_record`): one store, under the
/// hot line's lock like the hot fields it summarises.
#[inline(always)]
fn store_last_heard(index: u32, hot: &PeerHot) {
    if let Some(word) = LAST_HEARD.get_ptr_mut(index) {
        unsafe { core::ptr::write_volatile(word, last_heard::of_hot(hot)) };
    }
}

/// The hot line of `peer_id` (`monitor_common::index`): its own line if it has one (an id of 1
/// to the capacity), one line read, and nowhere else; otherwise its keyed home in the hashed
/// part, and the next lines only while a line says entries probed past it. A line is the id's
/// if it carries the id and a link. The agent may be changing a line meanwhile; the caller
/// checks the id again under the line's lock, and takes the link from there.
#[inline(always)]
fn lookup(peer_id: u64, config: &XdpConfig) -> Option<*mut HotLine> {
    let holds = |line: *mut HotLine| {
        // SAFETY: in the map value; plain integers the agent stores whole.
        unsafe {
            core::ptr::read_volatile(&raw const (*line).hot.peer_id) == peer_id
                && core::ptr::read_volatile(&raw const (*line).lock) as u32 != 0
        }
    };
    let capacity = config.capacity;
    if let Some(own) = index::own_line(peer_id, capacity) {
        let line = PEER_HOT.get_ptr_mut(own)?;
        return if holds(line) { Some(line) } else { None };
    }
    let bits = config.index_bits;
    let mask = (1u32 << bits) - 1;
    let mut h = index::home(peer_id, bits, &config.index_key);
    for _ in 0..index::PROBE_LINES {
        let line = PEER_HOT.get_ptr_mut(index::hashed_line(h, capacity))?;
        if holds(line) {
            return Some(line);
        }
        // SAFETY: in the map value; a byte the agent stores whole.
        if unsafe { core::ptr::read_volatile(&raw const (*line).hot.overflow) } == 0 {
            return None;
        }
        h = (h + 1) & mask;
    }
    None
}

/// Hands one arrival the agent asked for (`slot::what_to_tell`) to the ARRIVALS ring: each arrival
/// of a peer `monitor record` records, and the heartbeat that ends a suspicion.
#[inline(always)]
fn tell_arrival(
    peer_id: u64,
    now: u64,
    seq: u64,
    incarnation: u32,
    told: u32,
    counters: &mut Counters,
) {
    let record = ArrivalRecord {
        peer_id,
        at_ns: now,
        seq,
        incarnation,
        outcome: told,
    };
    if ARRIVALS.output::<ArrivalRecord>(&record, 0).is_err() {
        counters.arrivals_dropped += 1;
    }
}

// The BPF target's `core` offers no compare-and-swap on its atomic types (it declares no CAS
// support), but the instruction exists since kernel 5.12 (BPF_CMPXCHG), so use the intrinsics.

/// Moves the hot line's sequence counter (the lock word's high half) from even to odd; the
/// lock word as taken (its link cannot move until `unlock`), or None if another CPU holds it.
#[inline(always)]
fn try_lock(lock: &mut u64) -> Option<u64> {
    let lock: *mut u64 = lock;
    unsafe {
        // A plain (volatile) load: BPF before cpu v4 has no atomic load instruction.
        let before = core::ptr::read_volatile(lock);
        if before & LOCK_HELD != 0 {
            return None;
        }
        let locked = before + LOCK_SEQ_ONE;
        let (_, swapped) =
            atomic_cxchg::<u64, { AtomicOrdering::Acquire }, { AtomicOrdering::Relaxed }>(
                lock, before, locked,
            );
        if swapped { Some(locked) } else { None }
    }
}

/// Moves the counter back to even, after every store to the line and the slot. x86-64 keeps
/// stores in program order (TSO), so a plain store is a release there and saves a locked
/// instruction per heartbeat; elsewhere an atomic add, a full barrier in BPF.
#[inline(always)]
fn unlock(lock: &mut u64) {
    #[cfg(bpf_target_arch = "x86_64")]
    unsafe {
        // Compiler barrier (an empty asm that may touch memory): keep the slot's stores before
        // this one. LLVM's BPF backend cannot select a fence instruction.
        core::arch::asm!("", options(nostack, preserves_flags));
        let lock: *mut u64 = lock;
        core::ptr::write_volatile(lock, core::ptr::read_volatile(lock) + LOCK_SEQ_ONE);
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Release }>(lock, LOCK_SEQ_ONE);
    }
}

/// Whether the tag is SipHash-2-4 of bytes 0..24 under the current key, or under the previous
/// one while a rotation's grace period lasts.
#[inline(always)]
fn authentic(hb: &Heartbeat) -> bool {
    if hb.flags & FLAG_AUTH == 0 {
        return false;
    }
    for slot in [KEY_CURRENT, KEY_PREVIOUS] {
        if let Some(key) = AUTH_KEYS.get(slot)
            && key.valid != 0
            && siphash24_24(key.k0, key.k1, hb.authenticated) == hb.tag
        {
            return true;
        }
    }
    false
}

/// Two 8-byte stores instead of sixteen 1-byte ones. Every `src_addr` field sits at an offset
/// that is a multiple of 8 in an 8-aligned struct (asserted in monitor-common).
#[inline(always)]
fn set_src_addr(dst: &mut [u8; 16], words: [u64; 2]) {
    let dst = dst.as_mut_ptr().cast::<u64>();
    unsafe {
        dst.write(words[0]);
        dst.add(1).write(words[1]);
    }
}

/// Tells the agent about a peer id it has no slot for, at most `unknown_reports_per_sec`
/// times per second per CPU, so a flood of forged ids cannot flood the agent.
#[inline(always)]
fn report_unknown(
    report: &UnknownPeerReport,
    now: u64,
    config: &XdpConfig,
    counters: &mut Counters,
) {
    if now.wrapping_sub(counters.report_window_ns) >= NS_PER_SEC {
        counters.report_window_ns = now;
        counters.report_window_count = 0;
    }
    if counters.report_window_count >= config.unknown_reports_per_sec as u64 {
        counters.unknown_suppressed += 1;
        return;
    }
    if UNKNOWN_PEERS.output::<UnknownPeerReport>(report, 0).is_ok() {
        counters.report_window_count += 1;
        counters.unknown_reported += 1;
    } else {
        counters.unknown_suppressed += 1;
    }
}
