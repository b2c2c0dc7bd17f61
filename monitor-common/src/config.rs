//! Load-time configuration of the XDP program, written into its read-only data before the
//! program is verified, so the verifier folds every field to a constant.

use crate::{index::IndexKey, maps::MAX_WINDOW, passive::MAX_FLOW_PORTS, wire::DEFAULT_PORT};

/// Name of the global in the eBPF object.
pub const CONFIG_SYMBOL: &str = "CONFIG";

/// Heartbeats are passed up the stack after being recorded instead of being consumed.
pub const XDP_FLAG_PASS_HEARTBEATS: u32 = 1 << 0;
/// Only heartbeats with a valid SipHash tag (current or previous key in AUTH_KEYS) count.
pub const XDP_FLAG_REQUIRE_AUTH: u32 = 1 << 1;
/// Only intervals between consecutive sequence numbers enter the window: an interval that
/// spans lost heartbeats is counted as loss (`PeerRecord::loss_*`), not as a sample. Set for
/// the loss-aware model, which weighs loss separately.
pub const XDP_FLAG_GAPLESS_WINDOW: u32 = 1 << 2;
/// Only heartbeats whose destination address is in LOCAL_ADDRS (the interface's addresses or
/// `monitor run --listen-addr`) are recorded; others are passed untouched and counted as
/// `not_local`. Without it every destination counts (`--listen-addr any`).
pub const XDP_FLAG_CHECK_DESTINATION: u32 = 1 << 3;
/// BFD control packets (UDP 3784 and 4784) are heartbeats of their session
/// (`crate::passive`); recorded and passed on.
pub const XDP_FLAG_BFD: u32 = 1 << 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// UDP destination port of heartbeats, host order.
    pub port: u16,
    pub _pad: u16,
    /// Inter-arrival samples kept per peer, 2..=MAX_WINDOW.
    pub window: u32,
    /// `XDP_FLAG_*` bits.
    pub flags: u32,
    /// Unknown-peer reports each CPU may write per second.
    pub unknown_reports_per_sec: u32,
    /// Intervals longer than this (microseconds) are not added to the window, as Cassandra
    /// ignores them; 0 keeps every interval.
    pub max_interval_us: u32,
    /// An interval longer than this many times the window's mean is an outage, not a sample
    /// (see `crate::slot`); 0 counts every interval.
    pub outage_factor: u32,
    /// log2 of the hashed part of PEER_HOT (`crate::index::hashed_bits` of the capacity); set
    /// by the loader, which sizes the map.
    pub index_bits: u32,
    /// UDP ports whose every datagram is a heartbeat of its (source address, source port) flow
    /// (`crate::passive`), recorded and passed on; 0 = unused.
    pub flow_ports: [u16; MAX_FLOW_PORTS],
    /// CLOCK_TAI minus CLOCK_REALTIME in seconds when the program was loaded (set by the
    /// loader): the kernel reads wall-clock time as TAI (`bpf_ktime_get_tai_ns`) and takes this
    /// off to compare a sender's incarnation (its start time in Unix seconds) with now.
    pub tai_offset_s: i32,
    /// The key of the hot-line table's hash (`crate::index::home`), drawn at random by the
    /// agent when it loads the program, or the pinned state's when it adopts it.
    pub index_key: IndexKey,
    /// The capacity in slots: PEER_HOT's first `capacity` lines are the own lines of ids 1 to
    /// the capacity (`crate::index::own_line`), the hashed part follows. Set by the loader.
    pub capacity: u32,
    pub _pad1: u32,
}

impl XdpConfig {
    pub const DEFAULT: Self = Self {
        port: DEFAULT_PORT,
        _pad: 0,
        window: MAX_WINDOW as u32,
        flags: 0,
        unknown_reports_per_sec: 1000,
        max_interval_us: 0,
        outage_factor: 0,
        index_bits: 0,
        flow_ports: [0; MAX_FLOW_PORTS],
        tai_offset_s: 0,
        index_key: IndexKey::FIXED,
        capacity: 0,
        _pad1: 0,
    };

    /// Whether any passive source is watched (`--bfd`, `--udp-port`): then heartbeat ids with
    /// [`crate::passive::DERIVED_ID_BIT`] set are refused, since that half names passive peers.
    #[inline(always)]
    pub const fn has_passive_sources(&self) -> bool {
        passive_sources_on(self.flags, &self.flow_ports)
    }
}

/// [`XdpConfig::has_passive_sources`] of these settings (as a pinned program's meta holds them).
#[inline(always)]
pub const fn passive_sources_on(flags: u32, flow_ports: &[u16; MAX_FLOW_PORTS]) -> bool {
    flags & XDP_FLAG_BFD != 0
        || flow_ports[0] != 0
        || flow_ports[1] != 0
        || flow_ports[2] != 0
        || flow_ports[3] != 0
}

// No implicit padding: the loader copies the whole struct into the program's data.
const _: () = assert!(core::mem::size_of::<XdpConfig>() == 64);
const _: () = assert!(core::mem::offset_of!(XdpConfig, index_key) == 40);

// `has_passive_sources` (and the parser's port match) look at the ports one by one.
const _: () = assert!(MAX_FLOW_PORTS == 4);

impl Default for XdpConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}
