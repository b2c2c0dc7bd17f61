//! The frame the kernel generator stamps: Ethernet, IPv4 and UDP headers addressed from this
//! host to the target along the route the kernel would take, and a heartbeat header whose
//! peer id, sequence and tag the XDP program fills in for every frame.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    process::Command,
    time::{Duration, Instant},
};

use monitor_common::{
    loadgen::PAYLOAD_OFFSET,
    wire::{FLAG_AUTH, HEADER_LEN, HeartbeatHeader},
};
use serde_json::Value;

/// How long the next hop's link-layer address may take to resolve.
const NEIGHBOUR_WAIT: Duration = Duration::from_secs(3);
/// UDP discard: where the datagram that makes the kernel resolve the next hop goes (not the
/// heartbeat port, so the monitor never counts it).
const DISCARD_PORT: u16 = 9;

/// The way out to the target: the interface and both ends' addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub iface: String,
    pub ifindex: u32,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
}

/// Finds the route to `to` (`ip route get`), the interface's address, and the next hop's
/// link-layer address (resolving it first if the kernel has none). `socket` is bound to the
/// source address and port the frames will carry.
pub fn path_to(to: SocketAddr, socket: &UdpSocket) -> Result<Path, String> {
    let SocketAddr::V4(dst) = to else {
        return Err(format!(
            "{to}: only IPv4 targets (the frame's UDP checksum is left out, which IPv6 forbids)"
        ));
    };
    let route = ip_json(&["-j", "route", "get", &dst.ip().to_string()])?;
    let route = route
        .get(0)
        .ok_or_else(|| format!("no route to {}", dst.ip()))?;
    let iface = route["dev"]
        .as_str()
        .ok_or_else(|| format!("the route to {} names no interface", dst.ip()))?
        .to_string();
    let next_hop: Ipv4Addr = match route["gateway"].as_str() {
        Some(gw) => gw.parse().map_err(|_| format!("gateway {gw:?}"))?,
        None => *dst.ip(),
    };
    let link = ip_json(&["-j", "link", "show", "dev", &iface])?;
    let link = &link[0];
    if link["link_type"].as_str() != Some("ether") {
        return Err(format!(
            "the route to {} leaves by {iface}, not an Ethernet interface (the kernel generator \
             transmits Ethernet frames; use a veth or a NIC)",
            dst.ip()
        ));
    }
    let src_mac = parse_mac(link["address"].as_str().unwrap_or_default())
        .ok_or_else(|| format!("{iface} has no link-layer address"))?;
    let ifindex = link["ifindex"]
        .as_u64()
        .ok_or_else(|| format!("{iface} has no ifindex"))? as u32;
    socket
        .connect(to)
        .map_err(|e| format!("connecting a UDP socket to {to}: {e}"))?;
    let SocketAddr::V4(src) = socket.local_addr().map_err(|e| e.to_string())? else {
        return Err("an IPv6 source for an IPv4 target".into());
    };
    let dst_mac = neighbour(&iface, next_hop, socket)?;
    Ok(Path {
        iface,
        ifindex,
        src_mac,
        dst_mac,
        src,
        dst,
    })
}

/// The next hop's link-layer address; when the kernel has none yet, a datagram to its discard
/// port makes the kernel resolve it.
fn neighbour(iface: &str, next_hop: Ipv4Addr, socket: &UdpSocket) -> Result<[u8; 6], String> {
    let deadline = Instant::now() + NEIGHBOUR_WAIT;
    let mut asked = false;
    loop {
        let entries = ip_json(&["-j", "neigh", "show", &next_hop.to_string(), "dev", iface])?;
        if let Some(mac) = entries
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e["lladdr"].as_str().and_then(parse_mac))
        {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{next_hop} on {iface} did not answer ARP within {NEIGHBOUR_WAIT:?}"
            ));
        }
        if !asked {
            asked = true;
            socket
                .send_to(&[], (next_hop, DISCARD_PORT))
                .map_err(|e| format!("resolving {next_hop} on {iface}: {e}"))?;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ip_json(args: &[&str]) -> Result<Value, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running `ip` (iproute2) to find the route: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("`ip {}` output: {e}", args.join(" ")))
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The template frame: headers for `path`, and a heartbeat with the constant fields set (the
/// auth flag when `signed`), id, sequence and tag zero.
pub fn template(path: &Path, incarnation: u32, signed: bool) -> Vec<u8> {
    let mut frame = Vec::with_capacity(PAYLOAD_OFFSET + HEADER_LEN);
    frame.extend_from_slice(&path.dst_mac);
    frame.extend_from_slice(&path.src_mac);
    frame.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (20 + 8 + HEADER_LEN) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&path.src.ip().octets());
    ip[16..20].copy_from_slice(&path.dst.ip().octets());
    let checksum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&path.src.port().to_be_bytes());
    frame.extend_from_slice(&path.dst.port().to_be_bytes());
    frame.extend_from_slice(&((8 + HEADER_LEN) as u16).to_be_bytes());
    // No UDP checksum (zero, allowed over IPv4): the payload changes in every frame.
    frame.extend_from_slice(&[0, 0]);
    let mut header = HeartbeatHeader::new(0, incarnation, 0);
    if signed {
        header.flags |= FLAG_AUTH;
    }
    frame.extend_from_slice(&header.to_bytes());
    frame
}

fn ipv4_checksum(header: &[u8; 20]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_is_a_well_formed_ipv4_heartbeat() {
        let path = Path {
            iface: "veth0".into(),
            ifindex: 3,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: "10.0.0.2:40000".parse().unwrap(),
            dst: "10.0.0.1:18498".parse().unwrap(),
        };
        let frame = template(&path, 7, true);
        assert_eq!(frame.len(), PAYLOAD_OFFSET + HEADER_LEN);
        assert_eq!(&frame[0..6], &path.dst_mac);
        assert_eq!(&frame[6..12], &path.src_mac);
        let ip: [u8; 20] = frame[14..34].try_into().unwrap();
        // A header with its checksum in place sums to 0xffff, whose complement is 0.
        assert_eq!(ipv4_checksum(&ip), 0);
        assert_eq!(u16::from_be_bytes([frame[36], frame[37]]), 18498);
        let header = HeartbeatHeader::from_bytes(frame[PAYLOAD_OFFSET..].try_into().unwrap());
        assert_eq!((header.incarnation(), header.flags), (7, FLAG_AUTH));
        assert!(parse_mac("02:00:00:00:00:0a") == Some([2, 0, 0, 0, 0, 10]));
        assert!(parse_mac("02:00:00:00:00").is_none());
    }
}
