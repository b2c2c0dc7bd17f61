//! Names and value layouts of the BPF maps the XDP program and the agent share.

/// Most inter-arrival samples a slot can hold; the window in use is set at load time
/// (`XdpConfig::window`, 2..=MAX_WINDOW). A power of two so the kernel can mask ring indices.
pub const MAX_WINDOW: usize = 128;
const _: () = assert!(MAX_WINDOW.is_power_of_two());

/// Intervals are clamped to this many microseconds (about 268 s) so that the running sum of
/// squares over a full window cannot overflow a u64: 128 * (2^28)^2 = 2^63.
pub const MAX_INTERVAL_US: u64 = (1 << 28) - 1;

/// Peer slots the agent admits unless told otherwise.
pub const DEFAULT_CAPACITY: u32 = 65_536;

/// `BPF_F_MMAPABLE`: the array map can be mmapped by userspace.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// The hot lines (ARRAY of [`HotLine`], BPF_F_MMAPABLE): where the kernel finds a peer by
/// its id, and its lock and hot fields (`crate::index`). Written by the kernel under each
/// line's lock, and by the agent (admission, removal, resets) through its mmap.
pub use crate::index::PEER_HOT_MAP;
/// Slot index -> [`PeerState`] (ARRAY, BPF_F_MMAPABLE; the kernel writes, the agent mmaps).
pub const PEER_STATE_MAP: &str = "PEER_STATE";
/// One per-CPU [`Counters`] (PERCPU_ARRAY with a single entry).
pub const COUNTERS_MAP: &str = "COUNTERS";
/// [`UnknownPeerReport`]s (RINGBUF), rate-limited in the kernel.
pub const UNKNOWN_PEERS_MAP: &str = "UNKNOWN_PEERS";
/// [`crate::auth::AuthKey`] slots (ARRAY of 2: current, previous), written by the agent.
pub const AUTH_KEYS_MAP: &str = "AUTH_KEYS";
/// One [`PinnedMeta`] (ARRAY of 1), written by the agent, read when it adopts pinned state.
pub const META_MAP: &str = "META";
/// [`ArrivalRecord`]s of traced peers (RINGBUF), for `monitor record`.
pub const ARRIVALS_MAP: &str = "ARRIVALS";
/// Size of the arrivals ring buffer in bytes: 256 KiB, 8192 records, a second of 8k
/// heartbeats per second before the agent must have read them.
pub const ARRIVALS_BYTES: u32 = 256 * 1024;
/// Destination addresses heartbeats are accepted at (HASH, 16-byte address -> 1, written by
/// the agent; see [`local_addr_key`]). Read only with `XDP_FLAG_CHECK_DESTINATION`.
pub const LOCAL_ADDRS_MAP: &str = "LOCAL_ADDRS";
/// Most addresses LOCAL_ADDRS holds.
pub const LOCAL_ADDRS_CAPACITY: u32 = 256;
/// The first few destination addresses again, as one [`LocalFast`] (ARRAY of 1), compared
/// inline before LOCAL_ADDRS is looked up: a hash lookup costs a heartbeat more than the rest
/// of its parse, and a host has few addresses.
pub const LOCAL_FAST_MAP: &str = "LOCAL_FAST";
/// Addresses [`LocalFast`] holds.
pub const LOCAL_FAST_ADDRS: usize = 4;

/// The first [`LOCAL_FAST_ADDRS`] addresses of LOCAL_ADDRS, in its key layout as two
/// native-endian words. The kernel compares the first `count` and, finding none equal, looks
/// LOCAL_ADDRS up (so a reader that catches the agent rewriting this only pays the lookup).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalFast {
    pub count: u32,
    pub _pad: u32,
    pub addrs: [[u64; 2]; LOCAL_FAST_ADDRS],
}

/// The LOCAL_ADDRS key of an address: its 16 bytes, IPv4 as the IPv4-mapped IPv6 address
/// (::ffff:a.b.c.d), the layout the kernel builds from a packet's destination.
pub const fn local_addr_key(addr: core::net::IpAddr) -> [u8; 16] {
    match addr {
        core::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// Size of the unknown-peer ring buffer in bytes.
pub const UNKNOWN_PEERS_BYTES: u32 = 64 * 1024;

/// Address family of the last source address recorded in a slot.
pub const FAMILY_NONE: u16 = 0;
pub const FAMILY_IPV4: u16 = 4;
pub const FAMILY_IPV6: u16 = 6;

/// A peer's hot line, one of PEER_HOT's (`crate::index` says where a peer's is): the lock and
/// [`PeerHot`], everything the window rules (`crate::slot`) read and write on an accepted,
/// in-order heartbeat, in one cache line.
///
/// The lock word is two halves:
/// - its high 32 bits are a sequence counter ([`LOCK_SEQ_ONE`] a step). A writer (the XDP
///   program on any CPU, or the agent) moves it from even to odd with a compare-and-swap,
///   writes, and adds one step again; a reader copies what it needs and retries when it was
///   odd or changed meanwhile. A CPU that finds it odd does not wait: it counts the heartbeat
///   as `contended` and moves on (one peer's heartbeats normally land on one RX queue, so this
///   is rare).
/// - its low 32 bits are the link: the peer's slot in PEER_STATE (and LAST_HEARD) + 1, 0 for an
///   empty line. Only the agent changes it, and only in the compare-and-swap that takes the lock
///   (a removal clears it) or the store that gives it back (an insertion sets it): a reader
///   that saw the word unchanged saw one link, and a writer holding the lock has a link that
///   cannot move.
///
/// The line is the lock, the peer's fields, and the line's own `overflow` (in `PeerHot`, the
/// table's, not the peer's).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotLine {
    /// Sequence counter (high half) and link (low half), see above. 64 bits: the BPF target has
    /// no 32-bit atomics.
    pub lock: u64,
    pub hot: PeerHot,
}

/// One step of a hot line's sequence counter (the lock word's high half).
pub const LOCK_SEQ_ONE: u64 = 1 << 32;
/// The bit that is set while a writer holds a hot line (the sequence counter is odd).
pub const LOCK_HELD: u64 = LOCK_SEQ_ONE;

/// The slot a lock word links its line to, if any (see [`HotLine`]).
#[inline(always)]
pub const fn linked_slot(lock: u64) -> Option<u32> {
    let link = lock as u32;
    if link == 0 { None } else { Some(link - 1) }
}

/// The link half of a lock word for `slot` (see [`HotLine`]).
#[inline(always)]
pub const fn link_of(slot: u32) -> u64 {
    slot as u64 + 1
}

/// A peer's slot in PEER_STATE: what its heartbeats store into but do not read (the first cold
/// line), what only the rare paths touch (the cold lines), and its ring of intervals. Found
/// through its hot line's link, and guarded by that line's lock: nothing reaches a slot but
/// through the line that links to it.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// The first two lines.
    pub cold: PeerCold,
    /// The last `hot.samples` intervals in microseconds: a ring ending before `hot.ring_head`
    /// once full, its first `hot.samples` entries while it fills. Written by the kernel, read
    /// by the agent only.
    pub ring_us: [u32; MAX_WINDOW],
}

/// A peer's whole state as the window rules see it: the fields of its hot line, its cold
/// lines and its ring, in one place. The kernel keeps them apart (a [`HotLine`] in PEER_HOT,
/// a [`PeerState`] in PEER_STATE) and hands the rules a [`SlotMut`] of the three; offline replay
/// and the tests keep a `PeerSlot` and hand them [`PeerSlot::parts`]; the agent copies a peer
/// into one to read it ([`PeerSlot::record`]).
///
/// Cache lines, as the kernel lays them out: an accepted, in-order heartbeat reads and writes
/// one line, the hot line (the lock and [`PeerHot`]). It also stores, without reading anything
/// there, the source address in the first cold line and the interval into its ring entry; the
/// kernel keeps no running sums, so nothing of the ring is ever read in the kernel. The agent
/// computes the window's sums from the ring when it reads a peer ([`PeerSlot::record`]), which
/// it does for a few heartbeats in a hundred. [`PeerCold`] holds what only the rare paths
/// touch: duplicates, late heartbeats, gaps, restarts, outages, authentication failures and
/// BFD. (Eleven lines here, as the layout before version 15 kept a peer in one slot: the
/// bench's floor program still lays peers out so to compare.)
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct PeerSlot {
    /// The hot line's fields.
    pub hot: PeerHot,
    /// The slot's cold lines.
    pub cold: PeerCold,
    /// The slot's ring (see [`PeerState::ring_us`]).
    pub ring_us: [u32; MAX_WINDOW],
}

/// What the window rules (`crate::slot`, `crate::passive`) work on: a peer's hot fields, cold
/// fields and ring, wherever they are. Three references, so the kernel hands over its hot line
/// and its slot in PEER_STATE, and replay its own [`PeerSlot`]: one implementation of the
/// rules for both.
pub struct SlotMut<'a> {
    pub hot: &'a mut PeerHot,
    pub cold: &'a mut PeerCold,
    pub ring: &'a mut [u32; MAX_WINDOW],
}

impl PeerSlot {
    /// The rules' view of this slot.
    #[inline(always)]
    pub fn parts(&mut self) -> SlotMut<'_> {
        SlotMut {
            hot: &mut self.hot,
            cold: &mut self.cold,
            ring: &mut self.ring_us,
        }
    }

    /// The slot's cold lines and ring, as PEER_STATE holds them.
    pub const fn state(&self) -> PeerState {
        PeerState {
            cold: self.cold,
            ring_us: self.ring_us,
        }
    }
}

/// What every accepted, in-order heartbeat reads or writes: with the slot's lock, one cache
/// line. Widths are what the rules need, not more: see each field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHot {
    /// Peer id the agent stamped into this slot; the kernel ignores heartbeats whose id differs.
    pub peer_id: u64,
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) of the last accepted heartbeat, or of admission
    /// while `heartbeats` is zero.
    pub last_arrival_ns: u64,
    /// Sequence number of the last accepted heartbeat (the wire's 64 bits).
    pub last_seq: u64,
    /// Which of the [`crate::slot::MISSING_SPAN`] sequence numbers below `last_seq` were
    /// counted in `lost` and have not arrived since: bit i is `last_seq - 1 - i`. Only a late
    /// heartbeat whose bit is set takes one off `lost` (and clears it).
    pub missing: u64,
    /// Heartbeats accepted (in order, not duplicates), modulo 2^32 with 0 skipped: zero means
    /// none yet. 32 bits are 13 years of heartbeats at 10 Hz; the last-heard word keeps only 20
    /// of them, and the agent only ever takes differences.
    pub heartbeats: u32,
    /// Incarnation (sender epoch) of the last accepted heartbeat.
    pub incarnation: u32,
    /// The window's running mean interval for the outage rule (rule 5 of `crate::slot`), in
    /// 1/[`crate::slot::MEAN_SCALE`] µs: an exponentially weighted mean, integers only, so
    /// replay computes the very same. At most `MAX_INTERVAL_US * MEAN_SCALE`, below 2^32.
    pub mean_scaled_us: u32,
    /// Recent loss (`crate::slot`), the counts every heartbeat moves: `loss_heartbeats`
    /// accepted heartbeats that followed another of the same incarnation, `burst_heartbeats`
    /// of them within [`crate::slot::BURST_MEMORY`] heartbeats of a gap. Halved (with the gap
    /// counts in [`PeerCold`]) when `loss_heartbeats` reaches [`crate::slot::LOSS_MEMORY`],
    /// so 16 bits hold them.
    pub loss_heartbeats: u16,
    pub burst_heartbeats: u16,
    /// Intervals in the window (0..=window, at most [`MAX_WINDOW`]: 8 bits).
    pub samples: u8,
    /// Next ring position to write (below [`MAX_WINDOW`]).
    pub ring_head: u8,
    /// Intervals left out of the window since admission (rules 2-5 of `crate::slot`: across a
    /// restart or a new epoch, over the cap, across lost heartbeats in a gapless window, an
    /// outage), modulo 2^16. It advances the last-heard word's count too
    /// (`crate::last_heard::count`), so a reader of the words alone knows whether every
    /// interval since it last read the slot entered the window.
    pub left_out: u16,
    /// Consecutive intervals that were outages (at most [`crate::slot::OUTAGE_RUN`]); a run
    /// of them is the path, not an outage.
    pub outage_run: u8,
    /// Heartbeats left in the current loss burst: set to [`crate::slot::BURST_MEMORY`] by a
    /// heartbeat that came after a gap, counted down by each one that did not; 0 = no recent loss.
    pub burst_left: u8,
    /// What the kernel tells the agent of this peer's arrivals through the ARRIVALS ring
    /// buffer ([`TELL_ARRIVALS`], [`TELL_HEARD`]). Set by the agent under the line's lock;
    /// [`TELL_HEARD`] is cleared by the heartbeat that tells it. Zero for almost every peer,
    /// so a heartbeat pays one test of a byte in a line it holds.
    pub tell: u8,
    /// The line's, not the peer's: how many live entries of PEER_HOT's hashed part probed past
    /// this line (`crate::index`). A lookup that does not find its id in a line whose count is
    /// 0 stops there. Written by the agent only, under the line's lock; resets keep it; the
    /// rules never touch it. At most [`crate::index::PROBE_LINES`] - 1.
    pub overflow: u8,
}

/// What only the rare paths read: the first line takes the source address (stored by every
/// accepted heartbeat, never read by the kernel) and the counts of gaps and repeats; the second
/// restarts, outages, authentication failures (an atomic add from any CPU, kept off the line
/// every heartbeat stores into) and BFD.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCold {
    /// Source address of the last accepted heartbeat; IPv4 as the last 4 bytes of an
    /// IPv4-mapped IPv6 address.
    pub src_addr: [u8; 16],
    /// [`FAMILY_IPV4`], [`FAMILY_IPV6`] or [`FAMILY_NONE`].
    pub src_family: u16,
    /// Source UDP port of the last accepted heartbeat, host order.
    pub src_port: u16,
    /// Of `PeerHot::loss_heartbeats`, those that came after a gap in the sequence; the gaps
    /// lost `loss_lost` heartbeats; `burst_gaps` of the gaps came inside a burst
    /// (`PeerHot::burst_heartbeats`). Written only by a heartbeat after a gap, and halved with
    /// the hot counts.
    pub loss_gaps: u32,
    pub loss_lost: u32,
    pub burst_gaps: u32,
    /// Sequence numbers skipped (net of late arrivals that filled a counted gap).
    pub lost: u64,
    /// Heartbeats repeating the last accepted sequence number.
    pub duplicates: u64,
    /// Heartbeats older than the last accepted one (or from an older incarnation).
    pub out_of_order: u64,
    /// [`crate::passive::SOURCE_HEARTBEAT`], `SOURCE_BFD` or `SOURCE_FLOW`: stamped by the agent
    /// at admission; the kernel records a passive packet only into a slot of its source (which
    /// stores into this line anyway).
    pub source: u8,
    pub _pad0: [u8; 7],
    // The second cold line.
    /// Heartbeats whose authentication failed.
    pub auth_failures: u64,
    /// Intervals left out of the window as outages (`crate::slot`), since admission.
    pub outages: u32,
    /// Times a new incarnation (sender restart) was accepted, since admission.
    pub restarts: u32,
    /// The highest incarnation accepted since admission: one above it is a restart whatever
    /// its sequence number (it cannot be a replay of anything this slot heard).
    pub highest_incarnation: u32,
    /// The incarnation before the current one (0 before the first restart): with
    /// authentication, never taken back by a restart that goes backwards (`crate::slot`).
    pub previous_incarnation: u32,
    /// BFD (`crate::passive`): the session state the peer reported in its last packet
    /// (`crate::passive::BFD_UP`...).
    pub bfd_state: u8,
    /// BFD: the diagnostic code of its last packet.
    pub bfd_diag: u8,
    /// BFD: its Detect Mult.
    pub bfd_detect_mult: u8,
    pub _pad1: u8,
    /// BFD: times the reported state changed, so a reader that looks now and then still sees
    /// a Down that came and went between two looks.
    pub bfd_transitions: u32,
    /// BFD: the peer's Desired Min TX Interval (µs). A change starts a fresh window.
    pub bfd_desired_min_tx_us: u32,
    /// BFD: the peer's Required Min RX Interval (µs).
    pub bfd_required_min_rx_us: u32,
    /// BFD: My Discriminator of the peer (the session's key, with the source address).
    pub bfd_my_discriminator: u32,
    /// BFD: Your Discriminator (ours, as the peer knows it).
    pub bfd_your_discriminator: u32,
    pub _pad2: [u32; 4],
}

impl PeerSlot {
    /// A slot for a heartbeat peer admitted at `now_ns`, with no heartbeat yet: its silence
    /// counts from admission (offline replay keeps one of its own).
    pub const fn admitted(peer_id: u64, now_ns: u64) -> Self {
        Self::admitted_passive(peer_id, now_ns, crate::passive::SOURCE_HEARTBEAT)
    }

    /// A slot for a peer of `source` (`crate::passive`) admitted at `now_ns`.
    pub const fn admitted_passive(peer_id: u64, now_ns: u64, source: u8) -> Self {
        Self {
            hot: PeerHot {
                peer_id,
                last_arrival_ns: now_ns,
                last_seq: 0,
                missing: 0,
                heartbeats: 0,
                incarnation: 0,
                mean_scaled_us: 0,
                loss_heartbeats: 0,
                burst_heartbeats: 0,
                samples: 0,
                ring_head: 0,
                left_out: 0,
                outage_run: 0,
                burst_left: 0,
                tell: 0,
                overflow: 0,
            },
            cold: PeerCold {
                src_addr: [0; 16],
                src_family: FAMILY_NONE,
                src_port: 0,
                loss_gaps: 0,
                loss_lost: 0,
                burst_gaps: 0,
                lost: 0,
                duplicates: 0,
                out_of_order: 0,
                source,
                _pad0: [0; 7],
                auth_failures: 0,
                outages: 0,
                restarts: 0,
                highest_incarnation: 0,
                previous_incarnation: 0,
                bfd_state: 0,
                bfd_diag: 0,
                bfd_detect_mult: 0,
                _pad1: 0,
                bfd_transitions: 0,
                bfd_desired_min_tx_us: 0,
                bfd_required_min_rx_us: 0,
                bfd_my_discriminator: 0,
                bfd_your_discriminator: 0,
                _pad2: [0; 4],
            },
            ring_us: [0; MAX_WINDOW],
        }
    }

    /// The userspace view of the slot: its fields, and the window's sums computed from the
    /// ring (the kernel keeps none). The window is the ring's first `samples` entries whatever
    /// `ring_head` says: while it fills those are the ones written, once full all of them are.
    pub fn record(&self) -> PeerRecord {
        let (h, c) = (&self.hot, &self.cold);
        let samples = (h.samples as usize).min(MAX_WINDOW);
        let (mut sum, mut sum_sq) = (0u64, 0u64);
        for &us in &self.ring_us[..samples] {
            let us = us as u64;
            sum += us;
            sum_sq += us * us;
        }
        PeerRecord {
            peer_id: h.peer_id,
            last_arrival_ns: h.last_arrival_ns,
            last_seq: h.last_seq,
            heartbeats: h.heartbeats as u64,
            interval_sum_us: sum,
            interval_sum_sq_us: sum_sq,
            samples: samples as u32,
            ring_head: h.ring_head as u16,
            left_out: h.left_out,
            missing: h.missing,
            lost: c.lost,
            incarnation: h.incarnation,
            loss_heartbeats: h.loss_heartbeats as u32,
            src_family: c.src_family,
            src_port: c.src_port,
            outage_run: h.outage_run as u16,
            burst_left: h.burst_left,
            tell: h.tell,
            src_addr: c.src_addr,
            loss_gaps: c.loss_gaps,
            loss_lost: c.loss_lost,
            burst_heartbeats: h.burst_heartbeats as u32,
            burst_gaps: c.burst_gaps,
            duplicates: c.duplicates,
            out_of_order: c.out_of_order,
            auth_failures: c.auth_failures,
            outages: c.outages,
            restarts: c.restarts,
            highest_incarnation: c.highest_incarnation,
            previous_incarnation: c.previous_incarnation,
            source: c.source,
            bfd_state: c.bfd_state,
            bfd_diag: c.bfd_diag,
            bfd_detect_mult: c.bfd_detect_mult,
            bfd_transitions: c.bfd_transitions,
            bfd_desired_min_tx_us: c.bfd_desired_min_tx_us,
            bfd_required_min_rx_us: c.bfd_required_min_rx_us,
            bfd_my_discriminator: c.bfd_my_discriminator,
            bfd_your_discriminator: c.bfd_your_discriminator,
        }
    }
}

/// A slot as the agent sees it ([`PeerSlot::record`]): every field of the slot, widened, and
/// the window's sums, which the kernel no longer keeps, filled in from the ring. Nothing
/// stores this in a map; the detector and the socket read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    /// Peer id the agent stamped into this slot.
    pub peer_id: u64,
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) of the last accepted heartbeat, or of admission
    /// while `heartbeats` is zero.
    pub last_arrival_ns: u64,
    /// Sequence number of the last accepted heartbeat.
    pub last_seq: u64,
    /// Heartbeats accepted (in order, not duplicates): `PeerHot::heartbeats`.
    pub heartbeats: u64,
    /// Sum of the intervals in the window, microseconds (from the ring).
    pub interval_sum_us: u64,
    /// Sum of the squared intervals in the window, microseconds squared (from the ring).
    pub interval_sum_sq_us: u64,
    /// Intervals in the window (0..=window).
    pub samples: u32,
    /// Next ring position to write.
    pub ring_head: u16,
    /// `PeerHot::left_out`.
    pub left_out: u16,
    /// `PeerHot::missing`.
    pub missing: u64,
    /// Sequence numbers skipped (net of late arrivals that filled a counted gap).
    pub lost: u64,
    /// Incarnation (sender epoch) of the last accepted heartbeat.
    pub incarnation: u32,
    /// Recent loss, for loss-aware suspicion (`crate::slot`), as a two-state (Gilbert)
    /// picture of the sequence: `loss_heartbeats` accepted heartbeats that followed another of
    /// the same incarnation, `loss_gaps` of them came after a gap in the sequence, and those
    /// gaps lost `loss_lost` heartbeats. `burst_heartbeats` of the accepted heartbeats arrived
    /// within [`crate::slot::BURST_MEMORY`] heartbeats of a gap (inside a loss burst), and
    /// `burst_gaps` of those came after a gap too: the loss rate inside bursts, as against the
    /// rest. All five are halved together every
    /// [`crate::slot::LOSS_MEMORY`] heartbeats, so they describe the last few hundred.
    pub loss_heartbeats: u32,
    /// [`FAMILY_IPV4`], [`FAMILY_IPV6`] or [`FAMILY_NONE`].
    pub src_family: u16,
    /// Source UDP port of the last accepted heartbeat, host order.
    pub src_port: u16,
    /// Consecutive intervals that were outages; a run of them is the path, not an outage.
    pub outage_run: u16,
    /// `PeerHot::burst_left`.
    pub burst_left: u8,
    /// `PeerHot::tell`.
    pub tell: u8,
    /// Source address of the last accepted heartbeat; IPv4 as the last 4 bytes of an
    /// IPv4-mapped IPv6 address.
    pub src_addr: [u8; 16],
    pub loss_gaps: u32,
    pub loss_lost: u32,
    pub burst_heartbeats: u32,
    pub burst_gaps: u32,
    /// Heartbeats repeating the last accepted sequence number.
    pub duplicates: u64,
    /// Heartbeats older than the last accepted one (or from an older incarnation).
    pub out_of_order: u64,
    /// Heartbeats whose authentication failed.
    pub auth_failures: u64,
    /// Intervals left out of the window as outages (`crate::slot`), since admission.
    pub outages: u32,
    /// Times a new incarnation (sender restart) was accepted, since admission.
    pub restarts: u32,
    /// `PeerCold::highest_incarnation`.
    pub highest_incarnation: u32,
    /// `PeerCold::previous_incarnation`.
    pub previous_incarnation: u32,
    /// [`crate::passive::SOURCE_HEARTBEAT`], `SOURCE_BFD` or `SOURCE_FLOW`.
    pub source: u8,
    /// BFD: the session state the peer reported in its last packet (`crate::passive::BFD_UP`...).
    pub bfd_state: u8,
    /// BFD: the diagnostic code of its last packet.
    pub bfd_diag: u8,
    /// BFD: its Detect Mult.
    pub bfd_detect_mult: u8,
    /// BFD: times the reported state changed.
    pub bfd_transitions: u32,
    /// BFD: the peer's Desired Min TX Interval (µs).
    pub bfd_desired_min_tx_us: u32,
    /// BFD: the peer's Required Min RX Interval (µs).
    pub bfd_required_min_rx_us: u32,
    /// BFD: My Discriminator of the peer.
    pub bfd_my_discriminator: u32,
    /// BFD: Your Discriminator (ours, as the peer knows it).
    pub bfd_your_discriminator: u32,
}

impl PeerRecord {
    /// The view of [`PeerSlot::admitted`].
    pub fn admitted(peer_id: u64, now_ns: u64) -> Self {
        PeerSlot::admitted(peer_id, now_ns).record()
    }

    /// The view of [`PeerSlot::admitted_passive`].
    pub fn admitted_passive(peer_id: u64, now_ns: u64, source: u8) -> Self {
        PeerSlot::admitted_passive(peer_id, now_ns, source).record()
    }
}

// The lock and the hot fields fill one line exactly; a slot is two cold lines and eight of ring.
const _: () = assert!(core::mem::size_of::<HotLine>() == 64);
const _: () = assert!(core::mem::offset_of!(HotLine, hot) == 8);
const _: () = assert!(core::mem::size_of::<PeerState>() == 640);
const _: () = assert!(core::mem::offset_of!(PeerCold, auth_failures) == 64);
const _: () = assert!(core::mem::offset_of!(PeerState, ring_us) == 128);
// Eleven lines, the floor program's model of the layout before version 15.
const _: () = assert!(core::mem::size_of::<PeerSlot>() == 704);
// The kernel writes source addresses as two 8-byte words.
const _: () = assert!(core::mem::offset_of!(PeerCold, src_addr) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(UnknownPeerReport, src_addr) % 8 == 0);
// `samples` (up to the window) and `ring_head` are bytes.
const _: () = assert!(MAX_WINDOW <= u8::MAX as usize);

/// Version of everything a restarted agent reads from pinned maps: bump it whenever a map's
/// layout or meaning changes, so an agent never misreads state pinned by another build.
pub const LAYOUT_VERSION: u32 = 15;
/// "HBMPIN\0\0".
pub const META_MAGIC: u64 = u64::from_le_bytes(*b"HBMPIN\0\0");

/// What pinned state is: which layout, and the load-time settings the running program has.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PinnedMeta {
    pub magic: u64,
    pub layout_version: u32,
    /// size_of::<PeerState>() of the build that pinned it (size_of::<PeerSlot>() before layout
    /// 15).
    pub slot_size: u32,
    pub capacity: u32,
    pub window: u32,
    pub port: u16,
    pub _pad: u16,
    pub flags: u32,
    pub max_interval_us: u32,
    /// `XdpConfig::outage_factor` of the build that pinned it.
    pub outage_factor: u32,
    /// `XdpConfig::flow_ports` of the build that pinned it.
    pub flow_ports: [u16; crate::passive::MAX_FLOW_PORTS],
    /// The hot-line table's hash key the pinned program was loaded with (layout 12 on): an agent
    /// adopting the state hashes with it, and loads any program of its own with it.
    pub index_key: crate::index::IndexKey,
}

const _: () = assert!(core::mem::size_of::<PinnedMeta>() == 64);

/// What the XDP program decided, counted per CPU (one lookup per packet, no atomics).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Heartbeats recorded in a peer slot.
    pub heartbeats: u64,
    /// Packets that are not for the heartbeat port (passed untouched).
    pub not_heartbeat: u64,
    /// Packets to the heartbeat port that fail validation (passed untouched).
    pub malformed: u64,
    /// Valid heartbeats from a peer id with no slot.
    pub unknown_peer: u64,
    /// Valid heartbeats repeating the last sequence number.
    pub duplicates: u64,
    /// Valid heartbeats older than the last accepted one.
    pub out_of_order: u64,
    /// Heartbeats whose authentication failed.
    pub auth_failures: u64,
    /// Heartbeats not recorded because another CPU was updating the same slot.
    pub contended: u64,
    /// Unknown-peer reports written to the ring buffer.
    pub unknown_reported: u64,
    /// Unknown-peer reports not written: over the rate limit or ring full.
    pub unknown_suppressed: u64,
    /// Start of this CPU's current rate-limit window (ns), kernel bookkeeping.
    pub report_window_ns: u64,
    /// Reports written in the current window, kernel bookkeeping.
    pub report_window_count: u64,
    /// Arrivals of traced peers not written because the ARRIVALS ring was full.
    pub arrivals_dropped: u64,
    /// Packets to the heartbeat port whose destination address is not in LOCAL_ADDRS (passed
    /// untouched, not recorded; only with `XDP_FLAG_CHECK_DESTINATION`).
    pub not_local: u64,
    /// BFD control packets recorded in a session's slot (`XDP_FLAG_BFD`; always passed on).
    pub bfd: u64,
    /// Datagrams to a `--udp-port` port recorded in a flow's slot (always passed on).
    pub flow: u64,
}

/// A valid heartbeat from a peer id that has no slot, as reported to the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnknownPeerReport {
    pub peer_id: u64,
    pub seq: u64,
    pub incarnation: u32,
    pub src_family: u16,
    pub src_port: u16,
    pub src_addr: [u8; 16],
    /// `crate::passive::SOURCE_*`: what kind of peer to admit.
    pub source: u8,
    /// BFD: the state the session reported.
    pub bfd_state: u8,
    /// The destination port it was sent to.
    pub dst_port: u16,
    /// BFD: My Discriminator; 0 for other sources.
    pub discriminator: u32,
}

/// `PeerHot::tell`: every arrival of this peer, whatever its outcome, is written to the
/// ARRIVALS ring (`monitor record`).
pub const TELL_ARRIVALS: u8 = 1;
/// `PeerHot::tell`: the next accepted heartbeat of this peer is written to the ARRIVALS ring
/// with [`ARRIVAL_HEARD`], once (it clears the bit). The agent sets it on a peer it suspects:
/// otherwise it would see that peer heard again only at its next look (the next scan, for a
/// peer past its last level), and a peer heard and silent again before then would have its
/// next crossings raised that late.
pub const TELL_HEARD: u8 = 2;
/// [`ArrivalRecord::outcome`]'s bit for an arrival told because of [`TELL_HEARD`].
pub const ARRIVAL_HEARD: u32 = 1 << 8;
/// [`ArrivalRecord::outcome`]'s bits that carry the outcome's code.
pub const ARRIVAL_CODE: u32 = 0xff;

/// One heartbeat of a peer whose arrivals the agent asked to be told of (`PeerHot::tell`), as
/// the kernel judged it: every arrival of a peer `monitor record` records, and the heartbeat
/// that ends a suspicion.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrivalRecord {
    pub peer_id: u64,
    /// bpf_ktime_get_ns at arrival.
    pub at_ns: u64,
    pub seq: u64,
    pub incarnation: u32,
    /// [`crate::slot::Outcome`] as a number in the low byte ([`ARRIVAL_CODE`]: 0 accepted,
    /// 1 duplicate, 2 out of order), with [`ARRIVAL_HEARD`] if told because of [`TELL_HEARD`].
    pub outcome: u32,
}
