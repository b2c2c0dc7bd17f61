//! Prometheus metrics (`monitor run --metrics-addr`): what the agent counts as it works, and
//! what it reads at scrape time, served as OpenMetrics text on `GET /metrics`.
//!
//! Cardinality is bounded by construction: one series per level, verdict, event kind and
//! admission outcome, a fixed set of phi buckets; per-peer series only for the peers an
//! operator asks for (`--metrics-peer ID`, `--metrics-top K`, at most [`MAX_PEER_SERIES`]),
//! as the Prometheus naming and exporter guides ask (50,000 peer series would swamp a server).
//! Names follow them too: `heartbeat_monitor_` prefix, base units, `_total` on counters.
//!
//! The listener keeps to [`Limits`] (header read timeout, connection cap, connection age) and
//! renders scrapes off the async workers, one at a time ([`serve`]; docs/security.md,
//! "/metrics").
//!
//! This file holds what the agent counts and the registry; `collector` encodes what a scrape
//! reads, `listener` serves it over HTTP within its limits.

mod collector;
mod listener;
#[cfg(test)]
mod tests;

use std::sync::{Arc, RwLock};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};

use crate::serving::protocol::AgentStats;
use collector::AgentCollector;
pub use listener::{Format, Limits, bind, render, serve};

/// The most per-peer series a configuration may ask for (ids and top-K together).
pub const MAX_PEER_SERIES: usize = 1000;

/// Upper bounds of `heartbeat_monitor_peers_phi_at_most`: how many peers have phi at most each.
pub const PHI_BUCKETS: [f64; 9] = [0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0, f64::INFINITY];

/// Which peers get series of their own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerSeries {
    /// These peers, always.
    pub ids: Vec<u64>,
    /// And the K peers with the highest phi at scrape time.
    pub top: usize,
}

impl PeerSeries {
    pub fn validate(&self) -> Result<(), String> {
        if self.ids.len() + self.top > MAX_PEER_SERIES {
            return Err(format!(
                "{} per-peer series asked for ({} ids + top {}); at most {MAX_PEER_SERIES}",
                self.ids.len() + self.top,
                self.ids.len(),
                self.top
            ));
        }
        Ok(())
    }
}

/// Event kinds as label values; `kind` is what the socket's events call themselves.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Socket request ops as label values (`Request::op`, and `invalid`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

/// Why a socket client was refused or cut off, or the metrics listener closed a connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// The reasons of [`ReasonLabel`]: over the cap with every place taken by a client that has
/// sent a request (the newcomer is closed at once); evicted (the oldest connection that had
/// not yet sent a request, closed to make room for a newcomer); no complete request header
/// within the header timeout (also what ends an idle keep-alive connection); older than the
/// connection age limit.
pub const CLOSE_REASONS: [&str; 4] = ["over_cap", "evicted", "header_timeout", "max_age"];

/// What the metrics listener counts about its own connections.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    pub connections: Gauge,
    pub closed: Family<ReasonLabel, Counter>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        let closed = Family::<ReasonLabel, Counter>::default();
        for reason in CLOSE_REASONS {
            let _ = closed.get_or_create(&ReasonLabel { reason });
        }
        Self {
            connections: Gauge::default(),
            closed,
        }
    }
}

impl HttpMetrics {
    pub(super) fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// 10 us .. ~1.3 s: a `peer` is answered in tens of us, `suspects` of 50k peers in about 0.1 ms,
/// `peers` of 50k in tens of ms.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 18))
}

/// What the agent records while it works (cheap: a few atomic adds per sweep, per event and
/// per request).
#[derive(Debug)]
pub struct AgentMetrics {
    pub sweep_seconds: Histogram,
    pub event_latency_seconds: Histogram,
    pub events: Family<KindLabel, Counter>,
    pub socket_refusals: Family<ReasonLabel, Counter>,
    pub socket_cutoffs: Family<ReasonLabel, Counter>,
    pub request_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub http: HttpMetrics,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self {
            // 10 us .. ~1.3 s: a sweep of 1k peers takes tens of us, of 50k a few ms.
            sweep_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
            // 100 us .. ~3.3 s: events are raised at their crossing (within one 50 ms scan
            // of it when the deadline was not armed).
            event_latency_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
            events: Family::default(),
            socket_refusals: Family::default(),
            socket_cutoffs: Family::default(),
            request_seconds: Family::new_with_constructor(request_histogram),
            http: HttpMetrics::default(),
        }
    }
}

/// What one scrape reads from the agent (see `Agent::scrape`).
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub stats: Option<AgentStats>,
    /// Levels, ascending, and how many peers have crossed exactly that many of them (index 0:
    /// below the first level), so `peers_at[i]` is the count at level `levels[i - 1]`.
    pub levels: Vec<f64>,
    pub peers_at: Vec<u64>,
    /// For each of `PHI_BUCKETS`, peers whose phi is at most it.
    pub phi_le: Vec<u64>,
    pub selected: Vec<SelectedPeer>,
    pub socket_clients: u64,
    /// Peers whose own schedule is slower than the `--budget` allows (`PeerView::budget_unmet`);
    /// 0 under every other detector.
    pub budget_unmet: u64,
}

/// One of the peers `--metrics-peer` and `--metrics-top` select, as a scrape shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectedPeer {
    pub id: u64,
    pub phi: f64,
    pub silence_s: f64,
    /// The highest level crossed since last heard, or 0.
    pub level: f64,
}

/// Reads a scrape from the agent; the agent implements it.
pub trait Source: Send + Sync + 'static {
    fn scrape(&self, series: &PeerSeries) -> Scrape;
    fn metrics(&self) -> &AgentMetrics;
}

/// The registry served on `/metrics`: the agent's own metrics and a collector that reads the
/// rest when scraped. Holds the agent weakly, so the server never keeps it alive.
pub fn registry<S: Source>(agent: &Arc<S>, series: Arc<RwLock<PeerSeries>>) -> Registry {
    let mut registry = Registry::with_prefix("heartbeat_monitor");
    let m = agent.metrics();
    registry.register(
        "build",
        "Version of the running agent",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    registry.register_with_unit(
        "sweep_duration",
        "Time one sweep over every peer took",
        Unit::Seconds,
        m.sweep_seconds.clone(),
    );
    registry.register_with_unit(
        "event_latency",
        "From the moment phi crossed a level to the event's publication",
        Unit::Seconds,
        m.event_latency_seconds.clone(),
    );
    registry.register(
        "events",
        "Events published, by kind (suspect, recover, admit, forget)",
        m.events.clone(),
    );
    registry.register_with_unit(
        "request_duration",
        "From a socket request's line read to its reply written, by op (invalid: not a request)",
        Unit::Seconds,
        m.request_seconds.clone(),
    );
    registry.register(
        "socket_refusals",
        "Socket clients refused, by reason: the access policy (policy), or a cap on connections (uid_limit, shared_limit, total_limit)",
        m.socket_refusals.clone(),
    );
    registry.register(
        "socket_cutoffs",
        "Socket clients cut off, by reason: no request within the idle timeout (idle), a write not taken within the write timeout (write_timeout)",
        m.socket_cutoffs.clone(),
    );
    registry.register(
        "metrics_connections",
        "Connections open on the metrics listener",
        m.http.connections.clone(),
    );
    registry.register(
        "metrics_connections_closed",
        "Metrics connections the server closed, by reason (over_cap, evicted, header_timeout, max_age)",
        m.http.closed.clone(),
    );
    registry.register_collector(Box::new(AgentCollector {
        agent: Arc::downgrade(agent),
        series,
    }));
    registry
}
