//! Whether a peer first heard from a source may take a slot now: the policy, its token
//! bucket, the interface's networks and the share of peers each source has had admitted.

use std::{collections::HashMap, net::IpAddr, time::Instant};

use super::{
    policy::{AdmissionPolicy, AdmitFrom},
    refusals::{AdmissionCounters, Refusal, RefusalLog, Verdict},
};

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
    use crate::agent::admission::policy::{AdmitFromValue, parse_per_source};

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
