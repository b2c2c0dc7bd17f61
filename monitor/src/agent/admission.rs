//! Which peers get a slot: those listed in a peers file (`peers_file`), and (unless disabled) those the
//! kernel reports as unknown, while slots remain: from the interface's own networks by
//! default (`--admit-from`), at most `--admit-per-source` of them from one source address,
//! at most `--admit-rate` a second. Refusals are counted by reason and logged at most once a
//! second, naming the source that caused most of them.

use std::{
    collections::HashMap,
    fmt,
    net::IpAddr,
    str::FromStr,
    time::{Duration, Instant},
};

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

/// What admission decided, as `stats` reports it (the type is the protocol's).
pub use crate::serving::protocol::AdmissionCounters;

/// Why a reported peer was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Auto-admission is off (`--no-auto-admit`) and no range lists it.
    Disabled,
    /// Its source is outside `--admit-from` (or the interface's networks).
    OutsideRanges,
    /// Its source already has its share of peers (`--admit-per-source`).
    PerSource,
    /// Over `--admit-rate`.
    RateLimited,
    /// Every slot is taken (`--capacity`).
    Full,
    /// Its id's probe in the kernel's index is full (rare at a load of one half).
    IndexFull,
    /// A heartbeat id in the half that names passive peers (with `--bfd` or `--udp-port`).
    Reserved,
}

impl Refusal {
    const ALL: [Refusal; 7] = [
        Refusal::Disabled,
        Refusal::OutsideRanges,
        Refusal::PerSource,
        Refusal::RateLimited,
        Refusal::Full,
        Refusal::IndexFull,
        Refusal::Reserved,
    ];

    /// Its name in `stats.admission` and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Disabled => "disabled",
            Refusal::OutsideRanges => "outside_ranges",
            Refusal::PerSource => "per_source",
            Refusal::RateLimited => "rate_limited",
            Refusal::Full => "full",
            Refusal::IndexFull => "index_full",
            Refusal::Reserved => "reserved",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|&r| r == self).expect("listed")
    }

    fn counter(self, counters: &mut AdmissionCounters) -> &mut u64 {
        match self {
            Refusal::Disabled => &mut counters.disabled,
            Refusal::OutsideRanges => &mut counters.outside_ranges,
            Refusal::PerSource => &mut counters.per_source,
            Refusal::RateLimited => &mut counters.rate_limited,
            Refusal::Full => &mut counters.full,
            Refusal::IndexFull => &mut counters.index_full,
            Refusal::Reserved => &mut counters.reserved,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    Refuse(Refusal),
}

/// How often, at most, refusals are logged.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Sources whose refusals are told apart within one log interval; the others are counted
/// together (bounded memory under a flood from spoofed sources).
const REFUSAL_SOURCES: usize = 1024;

/// Refusals since the last log line.
#[derive(Debug, Default)]
struct RefusalLog {
    last_line: Option<Instant>,
    pending: u64,
    by_reason: [u64; Refusal::ALL.len()],
    /// Refusals by source (None: a report without a source), and the reason of the last one.
    by_source: HashMap<Option<IpAddr>, (u64, Refusal)>,
}

impl RefusalLog {
    fn note(&mut self, reason: Refusal, source: Option<IpAddr>) {
        self.pending += 1;
        self.by_reason[reason.index()] += 1;
        if self.by_source.len() < REFUSAL_SOURCES || self.by_source.contains_key(&source) {
            let entry = self.by_source.entry(source).or_insert((0, reason));
            *entry = (entry.0 + 1, reason);
        }
    }

    /// The line to log now, if any: refusals are pending and the last line is at least
    /// [`REFUSAL_LOG_INTERVAL`] old (or there was none).
    fn take_line(&mut self, now: Instant, per_source: u32) -> Option<String> {
        if self.pending == 0
            || self
                .last_line
                .is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_INTERVAL)
        {
            return None;
        }
        let since = match self.last_line {
            Some(at) => format!("in the last {:.1} s", now.duration_since(at).as_secs_f64()),
            None => "since the start".to_string(),
        };
        let (source, (from_it, reason)) = self
            .by_source
            .iter()
            .max_by_key(|(_, (n, _))| *n)
            .map(|(s, v)| (*s, *v))
            .unwrap_or((None, (0, Refusal::Full)));
        let why = match reason {
            Refusal::PerSource => {
                format!("it has its share of {per_source} peers already (--admit-per-source)")
            }
            Refusal::OutsideRanges => "outside the admitted networks (--admit-from)".to_string(),
            Refusal::RateLimited => "over --admit-rate".to_string(),
            Refusal::Full => "every slot is taken (--capacity)".to_string(),
            Refusal::Disabled => "auto-admission is off (--no-auto-admit)".to_string(),
            Refusal::IndexFull => "the id's probe in the kernel's index is full".to_string(),
            Refusal::Reserved => {
                "a heartbeat id in the passive sources' half of the id space".to_string()
            }
        };
        let reasons = Refusal::ALL
            .iter()
            .filter(|r| self.by_reason[r.index()] > 0)
            .map(|r| format!("{} {}", r.name(), self.by_reason[r.index()]))
            .collect::<Vec<_>>()
            .join(", ");
        let line = format!(
            "not admitting {} unknown peer(s) {since}: {from_it} from {} ({why}); by reason: {reasons}",
            self.pending,
            source.map_or_else(|| "an unknown source".to_string(), |s| s.to_string()),
        );
        *self = Self {
            last_line: Some(now),
            ..Self::default()
        };
        Some(line)
    }
}

/// The policy with its token bucket, the interface's networks, the peers each source has
/// had admitted, and the refusals not yet logged.
#[derive(Debug)]
pub struct Admission {
    policy: AdmissionPolicy,
    tokens: f64,
    refilled: Instant,
    pub counters: AdmissionCounters,
    /// The interface's networks (`AdmitFrom::Connected`), as last read.
    connected: Vec<ipnet::IpNet>,
    /// Peers admitted on a first packet, with their source: at most one entry per slot.
    sources: HashMap<u64, IpAddr>,
    /// How many of them each source has: at most one entry per admitted peer.
    per_source: HashMap<IpAddr, u32>,
    refusals: RefusalLog,
}

impl Admission {
    pub fn new(policy: AdmissionPolicy) -> Self {
        Self {
            tokens: policy.rate_per_sec as f64,
            refilled: Instant::now(),
            policy,
            counters: AdmissionCounters::default(),
            connected: Vec::new(),
            sources: HashMap::new(),
            per_source: HashMap::new(),
            refusals: RefusalLog::default(),
        }
    }

    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// A new policy (SIGHUP); the counters carry on, the bucket is capped at the new rate.
    pub fn set_policy(&mut self, policy: AdmissionPolicy) {
        self.tokens = self.tokens.min(policy.rate_per_sec as f64);
        self.policy = policy;
    }

    /// The interface's networks now (the follower of its addresses calls this).
    pub fn set_connected(&mut self, networks: Vec<ipnet::IpNet>) {
        self.connected = networks;
    }

    pub fn connected(&self) -> &[ipnet::IpNet] {
        &self.connected
    }

    /// Peers admitted on a first packet from `source` that are still watched.
    pub fn admitted_from(&self, source: IpAddr) -> u32 {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// Whether a peer first heard from `source` may take a slot now. `passive`: a BFD session
    /// or UDP flow, whose derived id no `--peers` file can list; without auto-admission such a
    /// peer is admitted from the `--admit-from` ranges only (none without ranges), so the
    /// ranges are how an operator lists them. A refusal is counted (and noted for the log).
    pub fn decide(&mut self, source: Option<IpAddr>, passive: bool, now: Instant) -> Verdict {
        let verdict = self.judge(source, passive, now);
        if let Verdict::Refuse(reason) = verdict {
            self.refused(reason, source);
        }
        verdict
    }

    fn judge(&mut self, source: Option<IpAddr>, passive: bool, now: Instant) -> Verdict {
        let listed_by_ranges = passive && matches!(self.policy.from, AdmitFrom::Ranges(_));
        if !self.policy.auto && !listed_by_ranges {
            return Verdict::Refuse(Refusal::Disabled);
        }
        let inside = |nets: &[ipnet::IpNet]| {
            source.is_some_and(|ip| nets.iter().any(|net| net.contains(&ip)))
        };
        let allowed = match &self.policy.from {
            AdmitFrom::Any => true,
            AdmitFrom::Ranges(nets) => inside(nets),
            AdmitFrom::Connected => inside(&self.connected),
        };
        if !allowed {
            return Verdict::Refuse(Refusal::OutsideRanges);
        }
        // Before the bucket: a source over its share spends no token another one needs.
        if self.policy.per_source > 0
            && let Some(ip) = source
            && self.admitted_from(ip) >= self.policy.per_source
        {
            return Verdict::Refuse(Refusal::PerSource);
        }
        let rate = self.policy.rate_per_sec as f64;
        self.tokens =
            (self.tokens + now.duration_since(self.refilled).as_secs_f64() * rate).min(rate);
        self.refilled = now;
        if self.tokens < 1.0 {
            return Verdict::Refuse(Refusal::RateLimited);
        }
        self.tokens -= 1.0;
        Verdict::Admit
    }

    /// Counts a refusal decided after [`Self::decide`] admitted (no slot, say).
    pub fn refused(&mut self, reason: Refusal, source: Option<IpAddr>) {
        *reason.counter(&mut self.counters) += 1;
        self.refusals.note(reason, source);
    }

    /// `id`, first heard from `source`, took a slot.
    pub fn admitted(&mut self, id: u64, source: Option<IpAddr>) {
        self.counters.admitted += 1;
        let Some(ip) = source else { return };
        if let Some(old) = self.sources.insert(id, ip) {
            // Cannot happen (an id is admitted once until forgotten); keep the counts right.
            self.release(old);
        }
        *self.per_source.entry(ip).or_insert(0) += 1;
    }

    /// `id` was forgotten (a request or `--expire-after`): its source's share has room again.
    pub fn forgotten(&mut self, id: u64) {
        if let Some(ip) = self.sources.remove(&id) {
            self.release(ip);
        }
    }

    fn release(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
    }

    /// The refusal line to log now, if refusals are pending and the last line is at least a
    /// second old: called on each refusal and by the sweep, so the tail of a burst is told
    /// within about a second.
    pub fn refusal_line(&mut self, now: Instant) -> Option<String> {
        self.refusals.take_line(now, self.policy.per_source)
    }
}

#[cfg(test)]
mod policy_tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn policy(from: AdmitFrom, rate: u32, per_source: u32) -> AdmissionPolicy {
        AdmissionPolicy {
            auto: true,
            from,
            rate_per_sec: rate,
            per_source,
        }
    }

    fn ranges(from: &[&str]) -> AdmitFrom {
        AdmitFrom::Ranges(from.iter().map(|c| c.parse().unwrap()).collect())
    }

    fn admission(from: &[&str], rate: u32) -> Admission {
        let from = if from.is_empty() {
            AdmitFrom::Any
        } else {
            ranges(from)
        };
        Admission::new(policy(from, rate, 0))
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    const REFUSE_RANGES: Verdict = Verdict::Refuse(Refusal::OutsideRanges);

    #[test]
    fn ranges_filter_sources() {
        let mut a = admission(&["10.0.0.0/8", "fd00::/8"], 100);
        let now = Instant::now();
        assert_eq!(a.decide(ip("10.1.2.3"), false, now), Verdict::Admit);
        assert_eq!(a.decide(ip("fd00::7"), false, now), Verdict::Admit);
        assert_eq!(a.decide(ip("192.0.2.1"), false, now), REFUSE_RANGES);
        assert_eq!(a.decide(None, false, now), REFUSE_RANGES);
        assert_eq!(a.counters.outside_ranges, 2);
    }

    #[test]
    fn by_default_only_the_connected_networks_are_admitted() {
        let mut a = Admission::new(policy(AdmitFrom::Connected, 100, 0));
        let now = Instant::now();
        // No address yet: nobody.
        assert_eq!(a.decide(ip("10.211.5.2"), false, now), REFUSE_RANGES);
        a.set_connected(vec![
            "10.211.5.0/24".parse().unwrap(),
            "fd00:211:5::/64".parse().unwrap(),
        ]);
        assert_eq!(a.decide(ip("10.211.5.2"), false, now), Verdict::Admit);
        assert_eq!(a.decide(ip("fd00:211:5::9"), false, now), Verdict::Admit);
        assert_eq!(a.decide(ip("10.211.6.2"), false, now), REFUSE_RANGES);
        assert_eq!(a.decide(ip("203.0.113.9"), false, now), REFUSE_RANGES);
        assert_eq!(a.decide(None, false, now), REFUSE_RANGES);
        // The networks change: so does who is admitted.
        a.set_connected(vec!["10.211.6.0/24".parse().unwrap()]);
        assert_eq!(a.decide(ip("10.211.5.2"), false, now), REFUSE_RANGES);
        assert_eq!(a.decide(ip("10.211.6.2"), false, now), Verdict::Admit);
        assert_eq!((a.counters.outside_ranges, a.counters.admitted), (5, 0));
    }

    #[test]
    fn one_source_gets_its_share_and_no_more() {
        let mut a = Admission::new(policy(AdmitFrom::Any, 1_000_000, 3));
        let now = Instant::now();
        let (greedy, other) = (ip("10.0.0.2"), ip("10.0.0.3"));
        for id in 1..=3 {
            assert_eq!(a.decide(greedy, false, now), Verdict::Admit);
            a.admitted(id, greedy);
        }
        for _ in 0..100 {
            assert_eq!(
                a.decide(greedy, false, now),
                Verdict::Refuse(Refusal::PerSource)
            );
        }
        // Another source is not held back by it.
        assert_eq!(a.decide(other, false, now), Verdict::Admit);
        a.admitted(10, other);
        assert_eq!(a.admitted_from(greedy.unwrap()), 3);
        assert_eq!(a.counters.per_source, 100);
        // A forgotten peer gives its source room for one more.
        a.forgotten(2);
        assert_eq!(a.admitted_from(greedy.unwrap()), 2);
        assert_eq!(a.decide(greedy, false, now), Verdict::Admit);
        a.admitted(4, greedy);
        assert_eq!(
            a.decide(greedy, false, now),
            Verdict::Refuse(Refusal::PerSource)
        );
        // Forgetting a peer not admitted on a first packet (a listed one) changes nothing.
        a.forgotten(999);
        assert_eq!(a.admitted_from(greedy.unwrap()), 3);
        // Every peer of a source forgotten: its entry goes (bounded memory).
        for id in [1, 3, 4, 10] {
            a.forgotten(id);
        }
        assert!(a.per_source.is_empty() && a.sources.is_empty());
    }

    #[test]
    fn unlimited_per_source_admits_a_whole_fleet_from_one_address() {
        let mut a = Admission::new(policy(AdmitFrom::Any, 1_000_000, 0));
        let now = Instant::now();
        for id in 0..10_000 {
            assert_eq!(a.decide(ip("10.0.0.2"), false, now), Verdict::Admit);
            a.admitted(id, ip("10.0.0.2"));
        }
        assert_eq!(parse_per_source("unlimited"), Ok(0));
        assert_eq!(parse_per_source("0"), Ok(0));
        assert_eq!(parse_per_source("17"), Ok(17));
        assert!(parse_per_source("-1").is_err());
    }

    /// A source over its share spends no token: the real peer that comes next still finds one.
    #[test]
    fn a_source_over_its_share_does_not_drain_the_bucket() {
        let mut a = Admission::new(policy(AdmitFrom::Any, 10, 2));
        let now = Instant::now();
        for id in 0..2 {
            assert_eq!(a.decide(ip("10.0.0.2"), false, now), Verdict::Admit);
            a.admitted(id, ip("10.0.0.2"));
        }
        for _ in 0..1000 {
            a.decide(ip("10.0.0.2"), false, now);
        }
        assert_eq!(a.decide(ip("10.0.0.3"), false, now), Verdict::Admit);
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
            Verdict::Refuse(Refusal::RateLimited)
        );
        assert_eq!(a.counters.rate_limited, 41);
    }

    #[test]
    fn disabled_admits_nobody() {
        let mut a = Admission::new(AdmissionPolicy {
            auto: false,
            ..policy(AdmitFrom::Any, 10, 0)
        });
        let refused = Verdict::Refuse(Refusal::Disabled);
        assert_eq!(a.decide(None, false, Instant::now()), refused);
        // Passive peers cannot be listed: without ranges none is admitted either.
        assert_eq!(a.decide(None, true, Instant::now()), refused);
        assert_eq!(a.counters.disabled, 2);
    }

    #[test]
    fn without_auto_admission_the_ranges_list_passive_peers() {
        let mut a = Admission::new(AdmissionPolicy {
            auto: false,
            ..policy(ranges(&["10.0.0.0/8"]), 10, 0)
        });
        let now = Instant::now();
        let inside = ip("10.1.2.3");
        assert_eq!(a.decide(inside, true, now), Verdict::Admit);
        assert_eq!(a.decide(ip("192.0.2.1"), true, now), REFUSE_RANGES);
        // A heartbeat peer from the same range still has to be listed.
        assert_eq!(
            a.decide(inside, false, now),
            Verdict::Refuse(Refusal::Disabled)
        );
        assert_eq!(
            (
                a.counters.admitted,
                a.counters.outside_ranges,
                a.counters.disabled
            ),
            (0, 1, 1)
        );
        // The connected networks list nobody's passive peers: only explicit ranges do.
        let mut a = Admission::new(AdmissionPolicy {
            auto: false,
            ..policy(AdmitFrom::Connected, 10, 0)
        });
        a.set_connected(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(
            a.decide(inside, true, now),
            Verdict::Refuse(Refusal::Disabled)
        );
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_naming_the_source() {
        let mut a = Admission::new(policy(AdmitFrom::Any, 1_000_000, 1));
        let t0 = Instant::now();
        let greedy = ip("10.0.0.2");
        a.decide(greedy, false, t0);
        a.admitted(1, greedy);
        assert_eq!(a.refusal_line(t0), None, "nothing refused yet");
        a.decide(greedy, false, t0);
        // The first refusal is told at once.
        let line = a.refusal_line(t0).expect("a line");
        assert!(line.contains("not admitting 1 unknown peer(s)"), "{line}");
        assert!(line.contains("1 from 10.0.0.2"), "{line}");
        assert!(line.contains("per_source 1"), "{line}");
        assert!(line.contains("--admit-per-source"), "{line}");
        // Then at most once a second, with everything since.
        for _ in 0..500 {
            a.decide(greedy, false, t0 + Duration::from_millis(10));
            assert_eq!(a.refusal_line(t0 + Duration::from_millis(10)), None);
        }
        a.refused(Refusal::Full, ip("10.0.0.9"));
        assert_eq!(a.refusal_line(t0 + Duration::from_millis(999)), None);
        let line = a
            .refusal_line(t0 + Duration::from_millis(1000))
            .expect("a line");
        assert!(
            line.contains("not admitting 501 unknown peer(s) in the last 1.0 s"),
            "{line}"
        );
        assert!(line.contains("500 from 10.0.0.2"), "{line}");
        assert!(line.contains("per_source 500, full 1"), "{line}");
        // Nothing since: no line.
        assert_eq!(a.refusal_line(t0 + Duration::from_secs(5)), None);
        assert_eq!((a.counters.per_source, a.counters.full), (501, 1));
    }

    #[test]
    fn admit_from_values() {
        let parse = |v: &[&str]| {
            let values: Vec<AdmitFromValue> = v.iter().map(|s| s.parse().unwrap()).collect();
            AdmitFrom::from_args(&values)
        };
        assert_eq!(parse(&[]), Ok(AdmitFrom::Connected));
        assert_eq!(parse(&["any"]), Ok(AdmitFrom::Any));
        assert_eq!(parse(&["ANY"]), Ok(AdmitFrom::Any));
        assert!(parse(&["any", "10.0.0.0/8"]).is_err());
        assert_eq!(
            parse(&["10.1.2.3/8", "192.0.2.7"]),
            Ok(ranges(&["10.0.0.0/8", "192.0.2.7/32"]))
        );
        assert!("10.0.0".parse::<AdmitFromValue>().is_err());
    }

    #[test]
    fn the_policy_says_itself_in_one_line() {
        let p = policy(AdmitFrom::Connected, 20_000, 256);
        let line = p.describe("vb", &["10.211.5.0/24".parse().unwrap()]);
        assert_eq!(
            line,
            "admitting first heartbeats from 10.211.5.0/24 (the networks of vb, followed as they change), at most 256 per source, 20000/s"
        );
        assert!(p.describe("vb", &[]).contains("nowhere yet"));
        let any = policy(AdmitFrom::Any, 5, 0).describe("vb", &[]);
        assert!(
            any.contains("any source") && any.contains("any number per source"),
            "{any}"
        );
    }
}
