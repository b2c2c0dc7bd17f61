//! Building Ethernet frames for packet fixtures, one header at a time, so each test states
//! exactly which byte it breaks.

use monitor_common::wire::{DEFAULT_PORT, HeartbeatHeader};

pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const ETH_P_ARP: u16 = 0x0806;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_TCP: u8 = 6;

#[derive(Debug, Clone)]
pub enum Ip {
    V4 {
        /// Bytes of IPv4 options (a multiple of 4, at most 40).
        options: Vec<u8>,
        /// The 16-bit flags + fragment offset field.
        frags: u16,
        /// Overrides the IHL nibble (header length in 32-bit words).
        ihl: Option<u8>,
        proto: u8,
    },
    V6 {
        next_hdr: u8,
    },
}

#[derive(Debug, Clone)]
pub struct Packet {
    /// VLAN tags, outermost first: (TPID, VLAN id).
    pub vlans: Vec<(u16, u16)>,
    /// Ethertype after the tags; None picks the one that matches `ip`.
    pub ether_type: Option<u16>,
    pub ip: Ip,
    pub src_port: u16,
    pub dst_port: u16,
    /// Overrides the UDP length field.
    pub udp_len: Option<u16>,
    /// IPv4 TTL or IPv6 Hop Limit.
    pub ttl: u8,
    pub payload: Vec<u8>,
}

pub const SRC_V4: [u8; 4] = [192, 0, 2, 7];
pub const DST_V4: [u8; 4] = [192, 0, 2, 1];
pub const SRC_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
pub const DST_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const SRC_PORT: u16 = 40_000;

impl Packet {
    /// A valid IPv4 heartbeat from peer `id`.
    pub fn heartbeat_v4(id: u64, seq: u64) -> Self {
        Self {
            vlans: vec![],
            ether_type: None,
            ip: Ip::V4 {
                options: vec![],
                frags: 0x4000, // DF
                ihl: None,
                proto: IPPROTO_UDP,
            },
            src_port: SRC_PORT,
            dst_port: DEFAULT_PORT,
            udp_len: None,
            ttl: 64,
            payload: HeartbeatHeader::new(id, 1, seq).to_bytes().to_vec(),
        }
    }

    /// A valid IPv6 heartbeat from peer `id`.
    pub fn heartbeat_v6(id: u64, seq: u64) -> Self {
        Self {
            ip: Ip::V6 {
                next_hdr: IPPROTO_UDP,
            },
            ..Self::heartbeat_v4(id, seq)
        }
    }

    pub fn with_header(mut self, header: HeartbeatHeader) -> Self {
        self.payload = header.to_bytes().to_vec();
        self
    }

    pub fn with_vlans(mut self, vlans: &[(u16, u16)]) -> Self {
        self.vlans = vlans.to_vec();
        self
    }

    /// Byte offsets where each header starts: [ip, udp, payload], and the total length.
    pub fn boundaries(&self) -> Vec<usize> {
        let l2 = 14 + 4 * self.vlans.len();
        let l3 = match &self.ip {
            Ip::V4 { options, .. } => 20 + options.len(),
            Ip::V6 { .. } => 40,
        };
        vec![l2, l2 + l3, l2 + l3 + 8, l2 + l3 + 8 + self.payload.len()]
    }

    pub fn build(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]); // dst MAC
        b.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]); // src MAC
        for &(tpid, vid) in &self.vlans {
            b.extend_from_slice(&tpid.to_be_bytes());
            b.extend_from_slice(&vid.to_be_bytes());
        }
        let udp_len = self.udp_len.unwrap_or(8 + self.payload.len() as u16);
        let default_type = match self.ip {
            Ip::V4 { .. } => ETH_P_IPV4,
            Ip::V6 { .. } => ETH_P_IPV6,
        };
        b.extend_from_slice(&self.ether_type.unwrap_or(default_type).to_be_bytes());
        match &self.ip {
            Ip::V4 {
                options,
                frags,
                ihl,
                proto,
            } => {
                let header_len = 20 + options.len();
                let ihl = ihl.unwrap_or((header_len / 4) as u8);
                b.push(0x40 | (ihl & 0x0f));
                b.push(0);
                b.extend_from_slice(&((header_len as u16) + udp_len).to_be_bytes());
                b.extend_from_slice(&[0, 1]); // id
                b.extend_from_slice(&frags.to_be_bytes());
                b.push(self.ttl);
                b.push(*proto);
                b.extend_from_slice(&[0, 0]); // checksum: XDP does not check it
                b.extend_from_slice(&SRC_V4);
                b.extend_from_slice(&DST_V4);
                b.extend_from_slice(options);
            }
            Ip::V6 { next_hdr } => {
                b.extend_from_slice(&[0x60, 0, 0, 0]);
                b.extend_from_slice(&udp_len.to_be_bytes());
                b.push(*next_hdr);
                b.push(self.ttl);
                b.extend_from_slice(&SRC_V6);
                b.extend_from_slice(&DST_V6);
            }
        }
        b.extend_from_slice(&self.src_port.to_be_bytes());
        b.extend_from_slice(&self.dst_port.to_be_bytes());
        b.extend_from_slice(&udp_len.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.payload);
        b
    }
}
