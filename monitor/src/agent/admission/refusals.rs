//! Why a reported peer was not admitted: the reasons, counted for `stats`, and the log of
//! refusals, told at most once a second naming the source that caused most of them.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

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

    pub(super) fn counter(self, counters: &mut AdmissionCounters) -> &mut u64 {
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
pub(super) struct RefusalLog {
    last_line: Option<Instant>,
    pending: u64,
    by_reason: [u64; Refusal::ALL.len()],
    /// Refusals by source (None: a report without a source), and the reason of the last one.
    by_source: HashMap<Option<IpAddr>, (u64, Refusal)>,
}

impl RefusalLog {
    pub(super) fn note(&mut self, reason: Refusal, source: Option<IpAddr>) {
        self.pending += 1;
        self.by_reason[reason.index()] += 1;
        if self.by_source.len() < REFUSAL_SOURCES || self.by_source.contains_key(&source) {
            let entry = self.by_source.entry(source).or_insert((0, reason));
            *entry = (entry.0 + 1, reason);
        }
    }

    /// The line to log now, if any: refusals are pending and the last line is at least
    /// [`REFUSAL_LOG_INTERVAL`] old (or there was none).
    pub(super) fn take_line(&mut self, now: Instant, per_source: u32) -> Option<String> {
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
