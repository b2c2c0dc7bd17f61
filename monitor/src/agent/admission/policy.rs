//! Who may be admitted on a first packet (`--admit-from`, `--admit-per-source`,
//! `--admit-rate`, `--no-auto-admit`): the policy as configured, and its one-line account.

use std::{fmt, net::IpAddr, str::FromStr};

/// Where first heartbeats are admitted from (`--admit-from`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AdmitFrom {
    /// The networks of the interface's own addresses (each address's prefix: 10.211.5.1/24
    /// admits 10.211.5.0/24), followed as addresses come and go. The default: a stranger
    /// elsewhere on the Internet is not admitted, a host on the link is.
    #[default]
    Connected,
    /// Exactly these ranges (`--admit-from CIDR,...`). Also what lists BFD sessions and UDP
    /// flows under `--no-auto-admit`.
    Ranges(Vec<ipnet::IpNet>),
    /// Any source (`--admit-from any`).
    Any,
}

/// One `--admit-from` value: a CIDR range, or `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitFromValue {
    Any,
    Net(ipnet::IpNet),
}

impl FromStr for AdmitFromValue {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("any") {
            return Ok(Self::Any);
        }
        if let Ok(net) = text.parse::<ipnet::IpNet>() {
            return Ok(Self::Net(net.trunc()));
        }
        // A bare address is a range of one.
        text.parse::<IpAddr>()
            .map(|ip| Self::Net(ipnet::IpNet::from(ip)))
            .map_err(|_| format!("{text:?} is not a CIDR range (10.0.0.0/8, fd00::/8) nor `any`"))
    }
}

impl fmt::Display for AdmitFromValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("any"),
            Self::Net(net) => net.fmt(f),
        }
    }
}

impl AdmitFrom {
    /// From the `--admit-from` values: none is the interface's networks; `any` stands alone.
    pub fn from_args(values: &[AdmitFromValue]) -> Result<Self, String> {
        if values.is_empty() {
            return Ok(Self::Connected);
        }
        if values.contains(&AdmitFromValue::Any) {
            if values.len() > 1 {
                return Err("--admit-from any stands alone (it admits every source)".into());
            }
            return Ok(Self::Any);
        }
        Ok(Self::Ranges(
            values
                .iter()
                .filter_map(|v| match v {
                    AdmitFromValue::Net(net) => Some(*net),
                    AdmitFromValue::Any => None,
                })
                .collect(),
        ))
    }
}

/// `--admit-per-source`: a number, or `unlimited` (also `0`).
pub fn parse_per_source(text: &str) -> Result<u32, String> {
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    text.parse::<u32>()
        .map_err(|_| format!("{text:?} is not a number of peers (nor `unlimited`)"))
}

/// Peers one source address may have admitted on their first packet, by default. A host
/// runs one peer, or a few dozen behind one address (containers, NAT); 256 leaves room for
/// that and bounds what one stranger takes to 256 of the 65,536 default slots (0.4%), so
/// filling the table takes 256 sources. Benchmarks and hosts that really run thousands of
/// peers behind one address lift it (`--admit-per-source unlimited`).
pub const DEFAULT_PER_SOURCE: u32 = 256;

/// Who may be admitted on a first heartbeat (`--peers` files are always admitted).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionPolicy {
    pub auto: bool,
    pub from: AdmitFrom,
    /// Admissions per second, with a burst of one second's worth.
    pub rate_per_sec: u32,
    /// Peers admitted on a first packet from one source address, at most; 0: no limit.
    pub per_source: u32,
}

impl AdmissionPolicy {
    /// The policy in one line, for the log: what is admitted from where, how many per source,
    /// how fast. `connected` is the interface's networks now.
    pub fn describe(&self, iface: &str, connected: &[ipnet::IpNet]) -> String {
        let from = match &self.from {
            AdmitFrom::Any => "any source (--admit-from any)".to_string(),
            AdmitFrom::Ranges(nets) => format!("{} (--admit-from)", nets_text(nets)),
            AdmitFrom::Connected if connected.is_empty() => format!(
                "nowhere yet: {iface} has no address, so no network of its own (followed as addresses come; --admit-from names sources)"
            ),
            AdmitFrom::Connected => format!(
                "{} (the networks of {iface}, followed as they change)",
                nets_text(connected)
            ),
        };
        let share = match self.per_source {
            0 => "any number per source".to_string(),
            n => format!("at most {n} per source"),
        };
        if self.auto {
            format!(
                "admitting first heartbeats from {from}, {share}, {}/s",
                self.rate_per_sec
            )
        } else {
            let passive = match &self.from {
                AdmitFrom::Ranges(nets) => format!(
                    "; BFD sessions and UDP flows from {}, {share}, {}/s",
                    nets_text(nets),
                    self.rate_per_sec
                ),
                _ => String::new(),
            };
            format!("admitting only the peers listed (--no-auto-admit){passive}")
        }
    }
}

fn nets_text(nets: &[ipnet::IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
