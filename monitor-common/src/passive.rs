//! Passive sources: packets that already flow and count as heartbeats without any sender of
//! ours (`monitor run --bfd`, `monitor run --udp-port`). They are recorded and always passed on,
//! so the host's own BFD daemon or service still gets them.
//!
//! A passive peer has no id on the wire, so both sides derive one from the packet, with the
//! same function (the kernel to look the slot up, the agent to admit it and to find it by
//! address): the two top bits say the source, the address is folded into the middle bits and
//! the session's own key (BFD's My Discriminator, a flow's source port) fills the low bits.
//! Two sources whose folded addresses collide and whose keys are equal share an id; with 30
//! (BFD) or 46 (flows) bits of address that needs about 2^15 (2^23) sessions with equal keys.
//! A heartbeat peer may pick any id, including one of these: the slot's `source` (checked by the
//! kernel under the slot lock on the passive path) keeps a passive packet out of a heartbeat
//! peer's slot, and the agent refuses to admit an id twice.

/// `PeerRecord::source` and `UnknownPeerReport::source`: a peer of our own wire format.
pub const SOURCE_HEARTBEAT: u8 = 0;
/// A BFD session (RFC 5880 control packets).
pub const SOURCE_BFD: u8 = 1;
/// A UDP flow (source address, source port) to one of the `--udp-port` ports.
pub const SOURCE_FLOW: u8 = 2;

/// The name of a source in replies and metrics.
pub const fn source_name(source: u8) -> &'static str {
    match source {
        SOURCE_BFD => "bfd",
        SOURCE_FLOW => "udp",
        _ => "heartbeat",
    }
}

/// BFD control packets, single hop (RFC 5881).
pub const BFD_SINGLE_HOP_PORT: u16 = 3784;
/// BFD control packets, multihop (RFC 5883).
pub const BFD_MULTIHOP_PORT: u16 = 4784;
/// The mandatory part of a BFD control packet.
pub const BFD_CONTROL_LEN: usize = 24;
/// Most `--udp-port` ports (`XdpConfig::flow_ports`).
pub const MAX_FLOW_PORTS: usize = 4;

/// BFD session states (RFC 5880 4.1), as `PeerRecord::bfd_state` holds them.
pub const BFD_ADMIN_DOWN: u8 = 0;
pub const BFD_DOWN: u8 = 1;
pub const BFD_INIT: u8 = 2;
pub const BFD_UP: u8 = 3;

pub const fn bfd_state_name(state: u8) -> &'static str {
    match state {
        BFD_ADMIN_DOWN => "admin_down",
        BFD_DOWN => "down",
        BFD_INIT => "init",
        _ => "up",
    }
}

/// RFC 5880 4.1 diagnostic codes, for `bfd_down` events.
pub const fn bfd_diag_name(diag: u8) -> &'static str {
    match diag {
        0 => "no_diagnostic",
        1 => "control_detection_time_expired",
        2 => "echo_function_failed",
        3 => "neighbor_signaled_session_down",
        4 => "forwarding_plane_reset",
        5 => "path_down",
        6 => "concatenated_path_down",
        7 => "administratively_down",
        8 => "reverse_concatenated_path_down",
        _ => "reserved",
    }
}

/// The fields of a BFD control packet the monitor uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfdControl {
    pub diag: u8,
    pub state: u8,
    pub poll: bool,
    pub final_: bool,
    pub detect_mult: u8,
    pub my_discriminator: u32,
    pub your_discriminator: u32,
    pub desired_min_tx_us: u32,
    pub required_min_rx_us: u32,
}

/// Why a packet to a BFD port is not a BFD control packet the monitor records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BfdError {
    /// Shorter than 24 bytes, or its Length field says more than the datagram holds.
    Length,
    /// Not version 1.
    Version,
    /// Detect Mult 0, the Multipoint bit, or My Discriminator 0 (RFC 5880 6.8.6 discards these).
    Invalid,
}

/// Decodes a control packet from its first 24 bytes read as three big-endian words, the way
/// the XDP program loads them; `payload_len` is the UDP payload length. The checks are RFC
/// 5880 6.8.6's reception checks that need no session state. Authentication (the A bit) is
/// not verified: the monitor only watches, the host's BFD daemon decides.
#[inline(always)]
pub fn decode_bfd(words: [u64; 3], payload_len: usize) -> Result<BfdControl, BfdError> {
    let [w0, w1, w2] = words;
    let version = (w0 >> 61) as u8;
    let diag = ((w0 >> 56) & 0x1f) as u8;
    let flags = (w0 >> 48) as u8;
    let detect_mult = (w0 >> 40) as u8;
    let length = ((w0 >> 32) & 0xff) as usize;
    if version != 1 {
        return Err(BfdError::Version);
    }
    if length < BFD_CONTROL_LEN || length > payload_len {
        return Err(BfdError::Length);
    }
    let my_discriminator = w0 as u32;
    // Flags byte: Sta(2) P F C A D M.
    if detect_mult == 0 || flags & 0x01 != 0 || my_discriminator == 0 {
        return Err(BfdError::Invalid);
    }
    Ok(BfdControl {
        diag,
        state: flags >> 6,
        poll: flags & 0x20 != 0,
        final_: flags & 0x10 != 0,
        detect_mult,
        my_discriminator,
        your_discriminator: (w1 >> 32) as u32,
        desired_min_tx_us: w1 as u32,
        required_min_rx_us: (w2 >> 32) as u32,
    })
}

/// Records what a control packet says about its session in the session's record, under the
/// slot lock, before the packet's arrival; returns whether it starts a new epoch, a fresh
/// window: the session's transmit rate may have changed. That is when its state changes (RFC
/// 5880 6.8.3 keeps a session that is not Up at 1 s or slower, so coming Up and going Down
/// both change the rate), when the peer's Desired Min TX Interval changes, and when the peer
/// answers a Poll with Final (our side changed its Required Min RX Interval, which bounds the
/// peer's rate too).
#[inline(always)]
pub fn note_bfd(slot: &mut crate::maps::SlotMut<'_>, c: &BfdControl) -> bool {
    let heard = slot.hot.heartbeats != 0;
    let cold = &mut slot.cold;
    let changed = heard && cold.bfd_state != c.state;
    let new_epoch =
        heard && (changed || cold.bfd_desired_min_tx_us != c.desired_min_tx_us || c.final_);
    if changed {
        cold.bfd_transitions += 1;
    }
    cold.bfd_state = c.state;
    cold.bfd_diag = c.diag;
    cold.bfd_detect_mult = c.detect_mult;
    cold.bfd_desired_min_tx_us = c.desired_min_tx_us;
    cold.bfd_required_min_rx_us = c.required_min_rx_us;
    cold.bfd_my_discriminator = c.my_discriminator;
    cold.bfd_your_discriminator = c.your_discriminator;
    new_epoch
}

/// RFC 5880 6.8.3: the least transmit interval of a BFD session that is not Up (µs).
const BFD_SLOW_TX_US: u64 = 1_000_000;

impl crate::maps::PeerRecord {
    /// The interval (µs) the peer says it sends at, where its packets say one: for a BFD
    /// session the Desired Min TX Interval it announces, the rate it says it sends at (the real
    /// one is the larger of that and our Required Min RX, less up to 25% jitter), and at least
    /// 1 s while the session is not Up (RFC 5880 6.8.3: a session that is not Up sends once a
    /// second or slower, whatever it announces, as FRR does). None for other peers, and for a
    /// session before its first packet (no timers yet). The detector's first-interval estimate
    /// for the peer.
    pub fn announced_interval_us(&self) -> Option<u64> {
        if self.source != SOURCE_BFD || self.bfd_desired_min_tx_us == 0 {
            return None;
        }
        let announced = self.bfd_desired_min_tx_us as u64;
        Some(if self.bfd_state == BFD_UP {
            announced
        } else {
            announced.max(BFD_SLOW_TX_US)
        })
    }
}

/// The 24 bytes of a control packet (for tests and tools; `decode_bfd` reads them back).
pub fn encode_bfd(c: &BfdControl) -> [u8; BFD_CONTROL_LEN] {
    let mut b = [0u8; BFD_CONTROL_LEN];
    b[0] = (1 << 5) | (c.diag & 0x1f);
    b[1] = (c.state << 6) | if c.poll { 0x20 } else { 0 } | if c.final_ { 0x10 } else { 0 };
    b[2] = c.detect_mult;
    b[3] = BFD_CONTROL_LEN as u8;
    b[4..8].copy_from_slice(&c.my_discriminator.to_be_bytes());
    b[8..12].copy_from_slice(&c.your_discriminator.to_be_bytes());
    b[12..16].copy_from_slice(&c.desired_min_tx_us.to_be_bytes());
    b[16..20].copy_from_slice(&c.required_min_rx_us.to_be_bytes());
    b
}

/// The source address as the kernel holds it: the two native-endian words of its 16 bytes
/// (IPv4 as ::ffff:a.b.c.d).
pub fn addr_words(addr: [u8; 16]) -> [u64; 2] {
    [
        u64::from_ne_bytes(addr[..8].try_into().unwrap_or([0; 8])),
        u64::from_ne_bytes(addr[8..].try_into().unwrap_or([0; 8])),
    ]
}

/// A 64-bit mix of the address (the multiplier is the golden ratio's, as in Fibonacci
/// hashing); only its low bits are used.
#[inline(always)]
pub const fn fold_addr(words: [u64; 2]) -> u64 {
    let h = (words[0] ^ words[1].rotate_left(31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

const BFD_TAG: u64 = 0b10 << 62;
const FLOW_TAG: u64 = 0b11 << 62;

/// Every derived id (a BFD session's, a flow's) has the top bit set. With passive sources on,
/// heartbeat peers keep to the lower half of the id space, so a heartbeat can never name a
/// passive slot: the heartbeat path does not read a slot's source, which lies off the line
/// every heartbeat touches.
pub const DERIVED_ID_BIT: u64 = 1 << 63;

/// Whether `id` lies in the half of the id space that derived ids use.
#[inline(always)]
pub const fn is_derived_id(id: u64) -> bool {
    id & DERIVED_ID_BIT != 0
}

/// The peer id of the BFD session from `addr_words` whose My Discriminator is `discriminator`.
#[inline(always)]
pub const fn bfd_peer_id(addr_words: [u64; 2], discriminator: u32) -> u64 {
    BFD_TAG | ((fold_addr(addr_words) & 0x3fff_ffff) << 32) | discriminator as u64
}

/// The peer id of the UDP flow from (`addr_words`, `src_port`).
#[inline(always)]
pub const fn flow_peer_id(addr_words: [u64; 2], src_port: u16) -> u64 {
    FLOW_TAG | ((fold_addr(addr_words) & 0x3fff_ffff_ffff) << 16) | src_port as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> BfdControl {
        BfdControl {
            diag: 0,
            state: BFD_UP,
            poll: false,
            final_: true,
            detect_mult: 3,
            my_discriminator: 0x1234_5678,
            your_discriminator: 9,
            desired_min_tx_us: 100_000,
            required_min_rx_us: 200_000,
        }
    }

    fn words(b: &[u8; BFD_CONTROL_LEN]) -> [u64; 3] {
        [0, 8, 16].map(|i| u64::from_be_bytes(b[i..i + 8].try_into().unwrap()))
    }

    #[test]
    fn a_session_announces_its_interval_and_once_a_second_while_not_up() {
        use crate::maps::PeerSlot;
        let mut slot = PeerSlot::admitted_passive(1, 0, SOURCE_BFD);
        // No packet yet: no timers to go by.
        assert_eq!(slot.record().announced_interval_us(), None);
        note_bfd(&mut slot.parts(), &control());
        let mut record = slot.record();
        assert_eq!(record.announced_interval_us(), Some(100_000));
        // Not Up: 1 s at the fastest (RFC 5880 6.8.3), slower if it says so.
        record.bfd_state = BFD_DOWN;
        assert_eq!(record.announced_interval_us(), Some(1_000_000));
        record.bfd_desired_min_tx_us = 2_000_000;
        assert_eq!(record.announced_interval_us(), Some(2_000_000));
        // A flow, or a heartbeat peer, announces nothing.
        let mut flow = PeerSlot::admitted_passive(2, 0, SOURCE_FLOW).record();
        flow.bfd_desired_min_tx_us = 100_000;
        assert_eq!(flow.announced_interval_us(), None);
    }

    #[test]
    fn derived_ids_lie_in_the_upper_half_and_heartbeat_ids_need_not() {
        for addr in [
            [0, 0xffff_0000 | (0xc000_0207 << 32)],
            [0x2001_0db8, 7],
            [0, 0],
        ] {
            for key in [0u32, 1, 0xffff_ffff] {
                assert!(is_derived_id(bfd_peer_id(addr, key)));
                assert!(is_derived_id(flow_peer_id(addr, key as u16)));
            }
        }
        assert!(!is_derived_id(1) && !is_derived_id(DERIVED_ID_BIT - 1));
        assert!(is_derived_id(DERIVED_ID_BIT) && is_derived_id(u64::MAX));
    }

    #[test]
    fn control_packets_round_trip() {
        let c = control();
        assert_eq!(decode_bfd(words(&encode_bfd(&c)), 24), Ok(c));
        let down = BfdControl {
            state: BFD_DOWN,
            diag: 1,
            poll: true,
            final_: false,
            ..c
        };
        assert_eq!(decode_bfd(words(&encode_bfd(&down)), 24), Ok(down));
    }

    #[test]
    fn what_rfc_5880_discards_is_refused() {
        let good = encode_bfd(&control());
        let mut b = good;
        b[0] = 2 << 5; // version 2
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Version));
        let mut b = good;
        b[2] = 0;
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Invalid));
        let mut b = good;
        b[1] |= 0x01;
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Invalid));
        let mut b = good;
        b[4..8].copy_from_slice(&[0; 4]);
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Invalid));
        let mut b = good;
        b[3] = 23;
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Length));
        // Length 26 (an authentication section) in a 24-byte datagram.
        let mut b = good;
        b[3] = 26;
        assert_eq!(decode_bfd(words(&b), 24), Err(BfdError::Length));
        assert!(decode_bfd(words(&b), 26).is_ok());
    }

    #[test]
    fn a_session_records_its_state_changes_and_new_timers() {
        let mut slot = crate::maps::PeerSlot::admitted_passive(1, 0, SOURCE_BFD);
        let slow = BfdControl {
            state: BFD_DOWN,
            desired_min_tx_us: 1_000_000,
            final_: false,
            ..control()
        };
        assert!(
            !note_bfd(&mut slot.parts(), &slow),
            "the first packet is no new epoch"
        );
        slot.hot.heartbeats = 1;
        assert!(
            note_bfd(
                &mut slot.parts(),
                &BfdControl {
                    state: BFD_INIT,
                    ..slow
                }
            ),
            "a state change"
        );
        assert!(
            note_bfd(&mut slot.parts(), &control()),
            "Up at 100 ms: new timers"
        );
        let up = BfdControl {
            final_: false,
            ..control()
        };
        assert!(!note_bfd(&mut slot.parts(), &up));
        assert_eq!(slot.cold.bfd_transitions, 2);
        assert_eq!(
            (slot.cold.bfd_state, slot.cold.bfd_desired_min_tx_us),
            (BFD_UP, 100_000)
        );
        // Every state change, with the timers it had while Down (FRR announces its
        // configured interval throughout, and sends once a second until Up): the first packet
        // is admission's, then Down, Init, Up and Down again.
        let mut slot = crate::maps::PeerSlot::admitted_passive(1, 0, SOURCE_BFD);
        let down = BfdControl {
            state: BFD_DOWN,
            ..up
        };
        assert!(!note_bfd(&mut slot.parts(), &down), "the first packet");
        slot.hot.heartbeats = 1;
        assert!(!note_bfd(&mut slot.parts(), &down), "still Down");
        assert!(note_bfd(
            &mut slot.parts(),
            &BfdControl {
                state: BFD_INIT,
                ..up
            }
        ));
        assert!(note_bfd(&mut slot.parts(), &up), "Init to Up");
        assert!(!note_bfd(&mut slot.parts(), &up));
        // A Final answers our side's Poll: our Required Min RX changed.
        assert!(note_bfd(
            &mut slot.parts(),
            &BfdControl { final_: true, ..up }
        ));
        // Going Down: once a second from now on.
        assert!(note_bfd(&mut slot.parts(), &down));
    }

    #[test]
    fn ids_keep_source_address_and_key_apart() {
        let a = addr_words(
            core::net::Ipv4Addr::new(10, 0, 0, 1)
                .to_ipv6_mapped()
                .octets(),
        );
        let b = addr_words(
            core::net::Ipv4Addr::new(10, 0, 0, 2)
                .to_ipv6_mapped()
                .octets(),
        );
        assert_eq!(bfd_peer_id(a, 7) >> 62, 0b10);
        assert_eq!(flow_peer_id(a, 7) >> 62, 0b11);
        assert_eq!(bfd_peer_id(a, 7) as u32, 7);
        assert_eq!(flow_peer_id(a, 4000) as u16, 4000);
        assert_ne!(bfd_peer_id(a, 7), bfd_peer_id(b, 7));
        assert_ne!(flow_peer_id(a, 7), flow_peer_id(b, 7));
        assert_ne!(bfd_peer_id(a, 7), bfd_peer_id(a, 8));
    }
}
