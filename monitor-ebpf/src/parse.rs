//! Packet parsing: from the start of the frame to a validated heartbeat header.

use core::mem::size_of;

use aya_ebpf::programs::{TcContext, XdpContext};
use monitor_common::{
    config::{XDP_FLAG_BFD, XDP_FLAG_CHECK_DESTINATION, XdpConfig},
    maps::{FAMILY_IPV4, FAMILY_IPV6},
    passive::{
        self, BFD_CONTROL_LEN, BFD_MULTIHOP_PORT, BFD_SINGLE_HOP_PORT, BfdControl, SOURCE_BFD,
        SOURCE_FLOW, SOURCE_HEARTBEAT,
    },
    wire::{HEADER_LEN, HeartbeatHeader, split_first_word, validate_fields, validate_peer_id},
};

use crate::load;
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{IpProto, Ipv4Hdr, Ipv6Hdr},
    udp::UdpHdr,
    vlan::VlanHdr,
};

/// A packet that passed every check, decoded, with where it came from: a heartbeat, or a packet
/// of a passive source (`monitor_common::passive`: a BFD control packet or a datagram of a
/// watched UDP flow) under the id derived from it. One type for both, every field written on
/// every path: an enum whose variants carry different payloads gets copied with uninitialised
/// bytes, which LLVM may turn into reads of registers the verifier has never seen written.
pub struct Heartbeat {
    pub peer_id: u64,
    /// `SOURCE_HEARTBEAT`, `SOURCE_BFD` or `SOURCE_FLOW`.
    pub source: u8,
    pub dst_port: u16,
    /// Heartbeats only (0 for passive sources).
    pub seq: u64,
    pub incarnation: u32,
    pub flags: u8,
    /// Bytes 0..24 as three little-endian words (SipHash's message words) and the tag.
    pub authenticated: [u64; 3],
    pub tag: u64,
    pub src_family: u16,
    pub src_port: u16,
    /// Source address as the two native-endian words of its 16 bytes; IPv4 in the
    /// IPv4-mapped IPv6 layout (::ffff:a.b.c.d).
    pub src_words: [u64; 2],
    /// BFD only (all zero otherwise).
    pub bfd: BfdControl,
}

const NO_BFD: BfdControl = BfdControl {
    diag: 0,
    state: 0,
    poll: false,
    final_: false,
    detect_mult: 0,
    my_discriminator: 0,
    your_discriminator: 0,
    desired_min_tx_us: 0,
    required_min_rx_us: 0,
};

pub enum Parsed {
    NotHeartbeat,
    /// Of a passive source: recorded, and always passed on.
    Passive(Heartbeat),
    /// To the heartbeat port, but addressed to another host (see `LOCAL_ADDRS`).
    NotLocal,
    Malformed,
    Heartbeat(Heartbeat),
    /// The first heartbeat of a packet holding several (`Packet::gso`, or a datagram of whole
    /// heartbeats), the others `HEADER_LEN` bytes apart after it (their number and place are in
    /// `BATCH`: `crate::note_batch`).
    FirstOfBatch(Heartbeat),
}

const ETH_P_IPV4: u16 = EtherType::Ipv4 as u16;
const ETH_P_IPV6: u16 = EtherType::Ipv6 as u16;
const ETH_P_8021Q: u16 = EtherType::Ieee8021q as u16;
const ETH_P_8021AD: u16 = EtherType::Ieee8021ad as u16;
/// IPv4 "more fragments" flag and fragment offset, in host order of the 16-bit field.
const IPV4_MF_OR_OFFSET: u16 = 0x3fff;

/// Direct packet access, the one thing the parser needs from its hook's context: XDP and TC
/// run the same parser (and the same record path) on their own contexts.
pub trait Packet {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// The packet's length from its first byte, whether direct access reaches it all or not.
    fn len(&self) -> usize;
    /// For a batch of datagrams carried as one packet (GSO: the sender's kernel cuts it only
    /// where a device needs it): how many, and each one's UDP payload length. None for one.
    fn gso(&self) -> Option<(u32, u32)>;
}

impl Packet for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
    /// The program does not take fragmented buffers (no `xdp.frags`): the kernel hands it
    /// every frame linear, so direct access reaches all of it.
    #[inline(always)]
    fn len(&self) -> usize {
        self.data_end() - self.data()
    }
    /// XDP's context says nothing of GSO. In native mode a device hands over frames as they
    /// came (a veth with an XDP program turns GSO off on its peer); in skb (generic) mode the
    /// program runs after GRO on an skb a sender's UDP GSO send may still be whole: a frame of
    /// many datagrams, which only its length tells (the parser reads it as a datagram of whole
    /// heartbeats).
    #[inline(always)]
    fn gso(&self) -> Option<(u32, u32)> {
        None
    }
}

/// The caller makes the headers linear first (`bpf_skb_pull_data`, see `monitor_tc`): a
/// non-linear skb's direct-access window may end before the heartbeat does.
impl Packet for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
    #[inline(always)]
    fn len(&self) -> usize {
        TcContext::len(self) as usize
    }
    /// A veth without an XDP program passes a sender's GSO batch on uncut, to the socket that
    /// cuts it; so does GRO where UDP is merged (`rx-udp-gro-forwarding`, `rx-gro-list`).
    #[inline(always)]
    fn gso(&self) -> Option<(u32, u32)> {
        // SAFETY: the context's own __sk_buff, which the program may read.
        let (segs, size) = unsafe { ((*self.skb.skb).gso_segs, (*self.skb.skb).gso_size) };
        (segs > 1).then_some((segs, size))
    }
}

/// A pointer to a `T` at `offset`, if the whole `T` lies inside the packet.
#[inline(always)]
fn ptr_at<C: Packet, T>(ctx: &C, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// With `XDP_FLAG_CHECK_DESTINATION`, a packet to one of our ports whose destination address
/// is not in `LOCAL_ADDRS` is `NotLocal` (one hash lookup, after the port matched).
#[inline(always)]
pub fn parse<C: Packet>(ctx: &C, config: &XdpConfig) -> Parsed {
    match parse_inner(ctx, config) {
        Some(parsed) => parsed,
        None => Parsed::NotHeartbeat,
    }
}

/// Which source a destination port belongs to, if any. The configuration is folded to
/// constants by the verifier, so the tests for sources that are off cost nothing.
#[inline(always)]
fn source_of(dst_port: u16, config: &XdpConfig) -> Option<u8> {
    if dst_port == config.port {
        return Some(SOURCE_HEARTBEAT);
    }
    if config.flags & XDP_FLAG_BFD != 0
        && (dst_port == BFD_SINGLE_HOP_PORT || dst_port == BFD_MULTIHOP_PORT)
    {
        return Some(SOURCE_BFD);
    }
    // Unrolled; an unused entry is 0, which no datagram we get here is sent to.
    let ports = config.flow_ports;
    if dst_port != 0
        && (dst_port == ports[0]
            || dst_port == ports[1]
            || dst_port == ports[2]
            || dst_port == ports[3])
    {
        return Some(SOURCE_FLOW);
    }
    None
}

#[inline(always)]
fn parse_inner<C: Packet>(ctx: &C, config: &XdpConfig) -> Option<Parsed> {
    let check_destination = config.flags & XDP_FLAG_CHECK_DESTINATION != 0;
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    let mut ether_type = unsafe { (*eth).ether_type };
    let mut offset = EthHdr::LEN;
    // Up to two VLAN tags (802.1ad outer, 802.1Q inner), unrolled.
    if ether_type == ETH_P_8021AD || ether_type == ETH_P_8021Q {
        let vlan: *const VlanHdr = ptr_at(ctx, offset)?;
        ether_type = unsafe { (*vlan).ether_type };
        offset += VlanHdr::LEN;
        if ether_type == ETH_P_8021Q {
            let vlan: *const VlanHdr = ptr_at(ctx, offset)?;
            ether_type = unsafe { (*vlan).ether_type };
            offset += VlanHdr::LEN;
        }
    }

    let src_words: [u64; 2];
    let src_family;
    // IPv4 TTL or IPv6 Hop Limit: single-hop BFD must arrive with 255 (RFC 5881 section 5).
    let ttl;
    // The destination address inside the (bounds-checked) IP header, read only when checked.
    let dst: *const u8;
    if ether_type == ETH_P_IPV4 {
        let ip: *const Ipv4Hdr = ptr_at(ctx, offset)?;
        let ip = unsafe { &*ip };
        if ip.proto != IpProto::Udp as u8 {
            return None;
        }
        // Only the first fragment carries the UDP header and a later fragment carries none;
        // a heartbeat is never fragmented, so any fragment is not ours.
        if u16::from_be_bytes(ip.frags) & IPV4_MF_OR_OFFSET != 0 {
            return None;
        }
        let ihl = ((ip.vihl & 0x0f) as usize) * 4;
        if ihl < Ipv4Hdr::LEN || ip.vihl >> 4 != 4 {
            return None;
        }
        // Bytes 8..16 of ::ffff:a.b.c.d are 00 00 ff ff a b c d.
        let v4 = unsafe { load::u32_at(ip.src_addr.as_ptr()) };
        src_words = [0, 0xffff_0000 | (v4 << 32)];
        src_family = FAMILY_IPV4;
        ttl = ip.ttl;
        dst = ip.dst_addr.as_ptr();
        offset += ihl;
    } else if ether_type == ETH_P_IPV6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, offset)?;
        let ip = unsafe { &*ip };
        // Extension headers are not walked: heartbeats are sent without them.
        if ip.next_hdr != IpProto::Udp as u8 {
            return None;
        }
        let src = ip.src_addr.as_ptr();
        src_words = unsafe { [load::u64_at(src), load::u64_at(src.add(8))] };
        src_family = FAMILY_IPV6;
        ttl = ip.hop_limit;
        dst = ip.dst_addr.as_ptr();
        offset += Ipv6Hdr::LEN;
    } else {
        return None;
    }

    // `offset` now depends on IHL; bound it so the verifier can track packet pointers.
    if offset > 128 {
        return None;
    }
    let udp: *const UdpHdr = ptr_at(ctx, offset)?;
    let udp = unsafe { &*udp };
    let dst_port = u16::from_be_bytes(udp.dst);
    let source = source_of(dst_port, config)?;
    // Addressed to another host (this one routes or forwards it): not ours to record or
    // consume, whatever it carries. The same 16-byte layout as the source address.
    if check_destination {
        let key = if src_family == FAMILY_IPV4 {
            [0, 0xffff_0000 | (unsafe { load::u32_at(dst) } << 32)]
        } else {
            unsafe { [load::u64_at(dst), load::u64_at(dst.add(8))] }
        };
        if !crate::is_local(&key) {
            return Some(Parsed::NotLocal);
        }
    }
    // From here on it is addressed to us: anything wrong is malformed, not foreign.
    let payload_len = (u16::from_be_bytes(udp.len) as usize).wrapping_sub(UdpHdr::LEN);
    let src_port = u16::from_be_bytes(udp.src);
    if source != SOURCE_HEARTBEAT {
        // A flow is its source; a BFD session is its source and My Discriminator.
        let (peer_id, bfd) = if source == SOURCE_BFD {
            // The Generalized TTL Security Mechanism: a single-hop session's packets are sent
            // with 255, so anything less crossed a router and is not the neighbour's.
            if dst_port == BFD_SINGLE_HOP_PORT && ttl != 255 {
                return Some(Parsed::Malformed);
            }
            let Some(control) = ptr_at::<C, [u8; BFD_CONTROL_LEN]>(ctx, offset + UdpHdr::LEN)
            else {
                return Some(Parsed::Malformed);
            };
            let p = control.cast::<u8>();
            let words = unsafe {
                [
                    u64::from_be(load::u64_at(p)),
                    u64::from_be(load::u64_at(p.add(8))),
                    u64::from_be(load::u64_at(p.add(16))),
                ]
            };
            let Ok(bfd) = passive::decode_bfd(words, payload_len) else {
                return Some(Parsed::Malformed);
            };
            (passive::bfd_peer_id(src_words, bfd.my_discriminator), bfd)
        } else {
            (passive::flow_peer_id(src_words, src_port), NO_BFD)
        };
        return Some(Parsed::Passive(Heartbeat {
            peer_id,
            source,
            dst_port,
            seq: 0,
            incarnation: 0,
            flags: 0,
            authenticated: [0; 3],
            tag: 0,
            src_family,
            src_port,
            src_words,
            bfd,
        }));
    }
    // Several heartbeats in one packet: a datagram of whole heartbeats back to back, or a GSO
    // batch of such datagrams (the UDP length is then the batch's). Each is checked and
    // recorded on its own (`monitor_tc_batch`, `monitor_xdp_batch`).
    let payload_offset = offset + UdpHdr::LEN;
    // A GSO batch's datagrams are whole heartbeats, as many as its UDP length makes (the last
    // may be shorter than the segment size).
    if let Some((segs, size)) = ctx.gso()
        && (size == 0
            || size as usize % HEADER_LEN != 0
            || segs as usize != payload_len.div_ceil(size as usize))
    {
        return Some(Parsed::Malformed);
    }
    // (A UDP length under 8 wraps `payload_len` past 65,535: never a batch.)
    let batch = payload_len > HEADER_LEN && payload_len <= 0xffff && payload_len % HEADER_LEN == 0;
    let segment_len = if batch {
        // A UDP length past the packet's end is a lie, not a short batch.
        if payload_offset + payload_len > ctx.len() {
            return Some(Parsed::Malformed);
        }
        crate::note_batch((payload_len / HEADER_LEN) as u32, payload_offset as u32);
        HEADER_LEN
    } else {
        payload_len
    };
    let Some(header) = ptr_at::<C, HeartbeatHeader>(ctx, payload_offset) else {
        return Some(Parsed::Malformed);
    };
    // Three 8-byte loads for the whole header (see `load`), decoded from network order.
    let p = header.cast::<u8>();
    let (first, peer_id, seq, tag) = unsafe {
        (
            load::u64_at(p),
            load::u64_at(p.add(8)),
            load::u64_at(p.add(16)),
            load::u64_at(p.add(24)),
        )
    };
    let Some((flags, incarnation)) = checked_header(first, peer_id, segment_len, config) else {
        return Some(Parsed::Malformed);
    };
    let hb = Heartbeat {
        peer_id: u64::from_be(peer_id),
        source,
        dst_port,
        seq: u64::from_be(seq),
        incarnation,
        flags,
        // Native loads on a little-endian target are SipHash's little-endian words.
        authenticated: [first, peer_id, seq],
        tag,
        src_family,
        src_port,
        src_words,
        bfd: NO_BFD,
    };
    Some(if batch {
        Parsed::FirstOfBatch(hb)
    } else {
        Parsed::Heartbeat(hb)
    })
}

/// The receiver's checks of a heartbeat's first word and id (both as loaded, network order)
/// and its UDP payload's length (docs/wire-format.md, "What the receiver checks"): its flags
/// and incarnation if it passes them.
#[inline(always)]
fn checked_header(
    first: u64,
    peer_id: u64,
    payload_len: usize,
    config: &XdpConfig,
) -> Option<(u8, u32)> {
    let (magic, version, flags, incarnation) = split_first_word(u64::from_be(first));
    let id = u64::from_be(peer_id);
    let valid = validate_fields(magic, version, flags, payload_len).is_ok()
        && validate_peer_id(id).is_ok()
        && !(config.has_passive_sources() && passive::is_derived_id(id));
    valid.then_some((flags, incarnation))
}

/// What every heartbeat of a packet shares: where it came from.
#[derive(Clone, Copy)]
pub struct Sender {
    pub dst_port: u16,
    pub src_family: u16,
    pub src_port: u16,
    pub src_words: [u64; 2],
}

/// Decodes a batch's heartbeat (one of `HEADER_LEN` bytes) into `out` from its header's four
/// words as loaded (network order) and its packet's `sender`; false, and `out` unspecified,
/// where a rule fails.
#[inline(always)]
pub fn heartbeat_into(
    words: &[u64; 4],
    config: &XdpConfig,
    sender: &Sender,
    out: &mut Heartbeat,
) -> bool {
    let [first, peer_id, seq, tag] = *words;
    let Some((flags, incarnation)) = checked_header(first, peer_id, HEADER_LEN, config) else {
        return false;
    };
    *out = Heartbeat {
        peer_id: u64::from_be(peer_id),
        source: SOURCE_HEARTBEAT,
        dst_port: sender.dst_port,
        seq: u64::from_be(seq),
        incarnation,
        flags,
        // Native loads on a little-endian target are SipHash's little-endian words.
        authenticated: [first, peer_id, seq],
        tag,
        src_family: sender.src_family,
        src_port: sender.src_port,
        src_words: sender.src_words,
        bfd: NO_BFD,
    };
    true
}
