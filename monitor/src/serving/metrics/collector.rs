//! The collector a scrape runs: what the agent reads at scrape time (`Source::scrape`),
//! encoded as constant counters, gauges and labelled families.

use std::sync::{Arc, RwLock, Weak};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

use super::{PHI_BUCKETS, PeerSeries, SelectedPeer, Source};

pub(super) struct AgentCollector<S> {
    pub agent: Weak<S>,
    /// Replaced on SIGHUP.
    pub series: Arc<RwLock<PeerSeries>>,
}

impl<S> std::fmt::Debug for AgentCollector<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCollector")
            .field("series", &self.series)
            .finish()
    }
}

/// A level as a label value: `1`, `2.5`, `0` for below the first level.
fn level_label(level: f64) -> String {
    format!("{level}")
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, unit, c.metric_type())?)
}

fn gauge<N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: N,
) -> std::fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, unit, g.metric_type())?)
}

/// A labelled family of constant counters or gauges: `(label values, value)`.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    members: Vec<(String, M)>,
) -> std::fmt::Result {
    let Some((_, first)) = members.first() else {
        return Ok(());
    };
    let mut metric = encoder.encode_descriptor(name, help, unit, first.metric_type())?;
    for (value, m) in &members {
        m.encode(metric.encode_family(&[(label, value.as_str())])?)?;
    }
    Ok(())
}

impl<S: Source> Collector for AgentCollector<S> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(agent) = self.agent.upgrade() else {
            return Ok(());
        };
        let series = self.series.read().expect("series lock").clone();
        let scrape = agent.scrape(&series);
        let e = &mut encoder;

        family(
            e,
            "peers",
            "Peers at each level (the highest crossed since last heard; 0: below the first)",
            None,
            "level",
            std::iter::once(0.0)
                .chain(scrape.levels.iter().copied())
                .zip(&scrape.peers_at)
                .map(|(level, &n)| (level_label(level), ConstGauge::new(n as i64)))
                .collect(),
        )?;
        family(
            e,
            "peers_phi_at_most",
            "Peers whose phi is at most the label's value, at scrape time",
            None,
            "phi",
            PHI_BUCKETS
                .iter()
                .zip(&scrape.phi_le)
                .map(|(&le, &n)| {
                    let label = if le.is_infinite() {
                        "+Inf".to_string()
                    } else {
                        format!("{le}")
                    };
                    (label, ConstGauge::new(n as i64))
                })
                .collect(),
        )?;
        gauge(
            e,
            "peers_budget_unmet",
            "Peers whose own heartbeats come slower than the detection budget allows (--budget): \
             convicted just past their schedule, later than the budget",
            None,
            scrape.budget_unmet as i64,
        )?;
        gauge(
            e,
            "socket_clients",
            "Clients connected to the agent's socket",
            None,
            scrape.socket_clients as i64,
        )?;

        if let Some(stats) = &scrape.stats {
            let k = &stats.kernel;
            gauge(
                e,
                "peer_capacity",
                "Peer slots",
                None,
                stats.capacity as i64,
            )?;
            gauge(
                e,
                "uptime",
                "Time since the agent started",
                Some(&Unit::Seconds),
                stats.uptime_s,
            )?;
            counter(
                e,
                "heartbeats",
                "Heartbeats accepted by the XDP program",
                None,
                k.heartbeats,
            )?;
            family(
                e,
                "packets",
                "Packets the XDP program saw, by what it decided",
                None,
                "verdict",
                [
                    ("heartbeat", k.heartbeats),
                    ("not_heartbeat", k.not_heartbeat),
                    ("not_local", k.not_local),
                    ("bfd", k.bfd),
                    ("flow", k.flow),
                    ("malformed", k.malformed),
                    ("unknown_peer", k.unknown_peer),
                    ("duplicate", k.duplicates),
                    ("out_of_order", k.out_of_order),
                    ("auth_failure", k.auth_failures),
                    ("contended", k.contended),
                ]
                .into_iter()
                .map(|(v, n)| (v.to_string(), ConstCounter::new(n)))
                .collect(),
            )?;
            counter(
                e,
                "auth_failures",
                "Heartbeats dropped for a bad or missing signature",
                None,
                k.auth_failures,
            )?;
            family(
                e,
                "unknown_peer_reports",
                "First heartbeats of unknown peers: reported to the agent or suppressed by the kernel's rate limit",
                None,
                "outcome",
                [
                    ("reported", k.unknown_reported),
                    ("suppressed", k.unknown_suppressed),
                ]
                .into_iter()
                .map(|(v, n)| (v.to_string(), ConstCounter::new(n)))
                .collect(),
            )?;
            counter(
                e,
                "arrivals_dropped",
                "Arrivals of recorded peers lost to a full ring buffer",
                None,
                k.arrivals_dropped,
            )?;
            let a = &stats.admission;
            family(
                e,
                "admissions",
                "Unknown peers' first heartbeats, by what admission decided",
                None,
                "outcome",
                [
                    ("admitted", a.admitted),
                    ("disabled", a.disabled),
                    ("outside_ranges", a.outside_ranges),
                    ("rate_limited", a.rate_limited),
                    ("full", a.full),
                    ("per_source", a.per_source),
                    ("index_full", a.index_full),
                    ("reserved", a.reserved),
                ]
                .into_iter()
                .map(|(v, n)| (v.to_string(), ConstCounter::new(n)))
                .collect(),
            )?;
            counter(e, "sweeps", "Sweeps run", None, stats.sweeps)?;
            counter(
                e,
                "estimate_refreshes",
                "Peer slots the sweeps read to refresh an estimate (the agent's cost per peer)",
                None,
                stats.refreshes,
            )?;
            counter(
                e,
                "estimate_refloors",
                "Floors the sweeps renewed from the last-heard words alone, without a slot read",
                None,
                stats.refloors,
            )?;
            counter(
                e,
                "heard_told",
                "Heartbeats of suspected peers the kernel told as they arrived, each peer looked at then rather than at the next scan",
                None,
                stats.heard_told,
            )?;
            family(
                e,
                "config_reloads",
                "SIGHUP re-reads of the --config file, by result (a failed one keeps the running configuration)",
                None,
                "result",
                [
                    ("applied", stats.config_reloads),
                    ("failed", stats.config_reload_failures),
                ]
                .into_iter()
                .map(|(v, n)| (v.to_string(), ConstCounter::new(n)))
                .collect(),
            )?;
            counter(
                e,
                "stalls",
                "Sweeps after the agent itself was not scheduled for longer than the stall bound",
                None,
                stats.stalls,
            )?;
            gauge(
                e,
                "link_up",
                "Whether the monitored interface's link is up (1) or down (0)",
                None,
                i64::from(stats.link.up),
            )?;
            counter(
                e,
                "link_changes",
                "Times the monitored interface's link went down or came up",
                None,
                stats.link.changes,
            )?;
            gauge(
                e,
                "suspicions_held",
                "Whether new suspicions are held now (link down or just back, or the agent just stalled)",
                None,
                i64::from(stats.link.holding),
            )?;
            gauge(
                e,
                "event_subscribers",
                "Socket clients subscribed to events",
                None,
                stats.subscribers as i64,
            )?;
            counter(
                e,
                "xdp_runs",
                "Runs of the XDP program (kernel.bpf_stats_enabled=1 only)",
                None,
                stats.xdp.run_count,
            )?;
            let run = ConstCounter::new(stats.xdp.run_time_ns as f64 / 1e9);
            run.encode(e.encode_descriptor(
                "xdp_run",
                "Time spent in the XDP program (kernel.bpf_stats_enabled=1 only)",
                Some(&Unit::Seconds),
                run.metric_type(),
            )?)?;
        }

        if !scrape.selected.is_empty() {
            let ids = |f: &dyn Fn(&SelectedPeer) -> f64| {
                scrape
                    .selected
                    .iter()
                    .map(|p| (p.id.to_string(), ConstGauge::new(f(p))))
                    .collect::<Vec<_>>()
            };
            family(
                e,
                "peer_phi",
                "phi of a selected peer",
                None,
                "peer",
                ids(&|p| p.phi),
            )?;
            family(
                e,
                "peer_silence",
                "Time since a selected peer was last heard",
                Some(&Unit::Seconds),
                "peer",
                ids(&|p| p.silence_s),
            )?;
            family(
                e,
                "peer_level",
                "Highest level a selected peer has crossed since last heard (0: none)",
                None,
                "peer",
                ids(&|p| p.level),
            )?;
        }
        Ok(())
    }
}
