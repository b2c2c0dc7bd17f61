//! Which peers get a slot: those listed in a peers file, and (unless disabled) those the
//! kernel reports as unknown, while slots remain.

use std::{collections::HashMap, fs, path::Path};

use monitor_common::maps::UnknownPeerReport;

#[derive(Debug, thiserror::Error)]
pub enum PeersFileError {
    #[error("reading peers file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
}

/// Reads a peers file: one peer id per line, decimal or `0x` hex; blank lines and `#`
/// comments (whole-line or trailing) are ignored. Any bad line is an error naming the line.
pub fn read_peers_file(path: &Path) -> Result<Vec<u64>, PeersFileError> {
    let text = fs::read_to_string(path).map_err(|source| PeersFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_peers(&text).map_err(|(line, message)| PeersFileError::Parse {
        path: path.display().to_string(),
        line,
        message,
    })
}

pub fn parse_peers(text: &str) -> Result<Vec<u64>, (usize, String)> {
    let mut first_seen = HashMap::new();
    let mut ids = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let id = parse_peer_id(line).map_err(|m| (line_no, m))?;
        if let Some(first) = first_seen.insert(id, line_no) {
            return Err((
                line_no,
                format!("peer id {id} is listed twice (first on line {first})"),
            ));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// A peer id: decimal or `0x` hexadecimal u64.
pub fn parse_peer_id(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    };
    parsed.map_err(|e| format!("{text:?} is not a peer id (a u64, decimal or 0x hex): {e}"))
}

/// Decodes one unknown-peer report from the kernel's ring; None if it is too short.
pub fn decode_report(bytes: &[u8]) -> Option<UnknownPeerReport> {
    crate::kernel::ring_reader::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_file_accepts_comments_hex_and_blanks() {
        let text = "# cluster A\n1\n\n0x10  # sixteen\n  42 \n18446744073709551615\n";
        assert_eq!(parse_peers(text), Ok(vec![1, 16, 42, u64::MAX]));
    }

    #[test]
    fn peers_file_names_the_bad_line() {
        let (line, msg) = parse_peers("1\n2\nbanana\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(msg.contains("banana"), "{msg}");
        let (line, msg) = parse_peers("7\n-1\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(msg.contains("-1"), "{msg}");
        let (line, msg) = parse_peers("5\n6\n5\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(msg.contains("first on line 1"), "{msg}");
        assert!(parse_peers("18446744073709551616").is_err());
    }
}

/// Who may be admitted on a first heartbeat (`--peers` files are always admitted).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionPolicy {
    pub auto: bool,
    /// Only sources in these ranges (empty: any).
    pub from: Vec<ipnet::IpNet>,
    /// Admissions per second, with a burst of one second's worth.
    pub rate_per_sec: u32,
}

/// What admission decided, as `stats` reports it (the type is the protocol's).
pub use crate::serving::protocol::AdmissionCounters;

/// The policy with its token bucket.
#[derive(Debug)]
pub struct Admission {
    policy: AdmissionPolicy,
    tokens: f64,
    refilled: std::time::Instant,
    pub counters: AdmissionCounters,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    Refuse,
}

impl Admission {
    pub fn new(policy: AdmissionPolicy) -> Self {
        Self {
            tokens: policy.rate_per_sec as f64,
            refilled: std::time::Instant::now(),
            policy,
            counters: AdmissionCounters::default(),
        }
    }

    /// A new policy (SIGHUP); the counters carry on, the bucket is capped at the new rate.
    pub fn set_policy(&mut self, policy: AdmissionPolicy) {
        self.tokens = self.tokens.min(policy.rate_per_sec as f64);
        self.policy = policy;
    }

    /// Whether a peer first heard from `source` may take a slot now. `passive`: a BFD session
    /// or UDP flow, whose derived id no `--peers` file can list; without auto-admission such a
    /// peer is admitted from the `--admit-from` ranges only (none without ranges), so the
    /// ranges are how an operator lists them.
    pub fn decide(
        &mut self,
        source: Option<std::net::IpAddr>,
        passive: bool,
        now: std::time::Instant,
    ) -> Verdict {
        let listed_by_ranges = passive && !self.policy.from.is_empty();
        if !self.policy.auto && !listed_by_ranges {
            self.counters.disabled += 1;
            return Verdict::Refuse;
        }
        if !self.policy.from.is_empty()
            && !source.is_some_and(|ip| self.policy.from.iter().any(|net| net.contains(&ip)))
        {
            self.counters.outside_ranges += 1;
            return Verdict::Refuse;
        }
        let rate = self.policy.rate_per_sec as f64;
        self.tokens =
            (self.tokens + now.duration_since(self.refilled).as_secs_f64() * rate).min(rate);
        self.refilled = now;
        if self.tokens < 1.0 {
            self.counters.rate_limited += 1;
            return Verdict::Refuse;
        }
        self.tokens -= 1.0;
        Verdict::Admit
    }
}

#[cfg(test)]
mod policy_tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn admission(from: &[&str], rate: u32) -> Admission {
        Admission::new(AdmissionPolicy {
            auto: true,
            from: from.iter().map(|c| c.parse().unwrap()).collect(),
            rate_per_sec: rate,
        })
    }

    #[test]
    fn ranges_filter_sources() {
        let mut a = admission(&["10.0.0.0/8", "fd00::/8"], 100);
        let now = Instant::now();
        assert_eq!(
            a.decide(Some("10.1.2.3".parse().unwrap()), false, now),
            Verdict::Admit
        );
        assert_eq!(
            a.decide(Some("fd00::7".parse().unwrap()), false, now),
            Verdict::Admit
        );
        assert_eq!(
            a.decide(Some("192.0.2.1".parse().unwrap()), false, now),
            Verdict::Refuse
        );
        assert_eq!(a.decide(None, false, now), Verdict::Refuse);
        assert_eq!(a.counters.outside_ranges, 2);
    }

    #[test]
    fn the_rate_is_a_token_bucket() {
        let mut a = admission(&[], 10);
        let t0 = Instant::now();
        let admitted = (0..50)
            .filter(|_| a.decide(None, false, t0) == Verdict::Admit)
            .count();
        assert_eq!(admitted, 10, "a burst of one second's worth");
        assert_eq!(
            a.decide(None, false, t0 + Duration::from_millis(100)),
            Verdict::Admit
        );
        assert_eq!(
            a.decide(None, false, t0 + Duration::from_millis(100)),
            Verdict::Refuse
        );
        assert_eq!(a.counters.rate_limited, 41);
    }

    #[test]
    fn disabled_admits_nobody() {
        let mut a = Admission::new(AdmissionPolicy {
            auto: false,
            from: vec![],
            rate_per_sec: 10,
        });
        assert_eq!(a.decide(None, false, Instant::now()), Verdict::Refuse);
        // Passive peers cannot be listed: without ranges none is admitted either.
        assert_eq!(a.decide(None, true, Instant::now()), Verdict::Refuse);
        assert_eq!(a.counters.disabled, 2);
    }

    #[test]
    fn without_auto_admission_the_ranges_list_passive_peers() {
        let mut a = Admission::new(AdmissionPolicy {
            auto: false,
            from: vec!["10.0.0.0/8".parse().unwrap()],
            rate_per_sec: 10,
        });
        let now = Instant::now();
        let inside = Some("10.1.2.3".parse().unwrap());
        assert_eq!(a.decide(inside, true, now), Verdict::Admit);
        assert_eq!(
            a.decide(Some("192.0.2.1".parse().unwrap()), true, now),
            Verdict::Refuse
        );
        // A heartbeat peer from the same range still has to be listed.
        assert_eq!(a.decide(inside, false, now), Verdict::Refuse);
        assert_eq!(
            (
                a.counters.admitted,
                a.counters.outside_ranges,
                a.counters.disabled
            ),
            (0, 1, 1)
        );
    }
}
