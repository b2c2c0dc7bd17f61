//! Prometheus metrics (`monitor run --metrics-addr`): what the agent counts as it works, and
//! what it reads at scrape time, served as OpenMetrics text on `GET /metrics`.
//!
//! Cardinality is bounded by construction: one series per level, verdict, event kind and
//! admission outcome, a fixed set of phi buckets; per-peer series only for the peers an
//! operator asks for (`--metrics-peer ID`, `--metrics-top K`, at most [`MAX_PEER_SERIES`]),
//! as the Prometheus naming and exporter guides ask (50,000 peer series would swamp a server).
//! Names follow them too: `heartbeat_monitor_` prefix, base units, `_total` on counters.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, RwLock, Weak},
};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};
use tokio::net::TcpListener;

use crate::serving::protocol::AgentStats;

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

/// Why a socket client was refused or cut off (`Refusal::reason`, `CutOff::reason`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
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
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self {
            // 10 us .. ~1.3 s: a sweep of 1k peers takes tens of us, of 50k a few ms.
            sweep_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
            // 100 us .. ~3.3 s: events are raised within one sweep (50 ms) of the crossing.
            event_latency_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
            events: Family::default(),
            socket_refusals: Family::default(),
            socket_cutoffs: Family::default(),
            request_seconds: Family::new_with_constructor(request_histogram),
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
    registry.register_collector(Box::new(AgentCollector {
        agent: Arc::downgrade(agent),
        series,
    }));
    registry
}

struct AgentCollector<S> {
    agent: Weak<S>,
    /// Replaced on SIGHUP.
    series: Arc<RwLock<PeerSeries>>,
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

/// The two text formats a scraper may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, what Prometheus asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4, for everything else (curl, promtool).
    Prometheus,
}

impl Format {
    /// From a request's `Accept` header, as Prometheus negotiates.
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The text of `registry` in `format`.
pub fn render(registry: &Registry, format: Format) -> String {
    let mut text = String::new();
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry),
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)
        }
    };
    if let Err(e) = encoded {
        // Only a formatter error, which writing to a String does not produce.
        let _ = writeln!(text, "# encoding failed: {e}");
    }
    text
}

/// Binds the metrics listener (before anything is loaded, so a taken port stops the start).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `GET /metrics` forever; anything else is a 404 or 405. One task per connection,
/// HTTP/1.1 with keep-alive, as Prometheus scrapes.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) -> std::io::Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("accept on the metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&request, &registry)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                log::debug!("metrics client: {e}");
            }
        });
    }
}

fn respond<B>(request: &Request<B>, registry: &Registry) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let accept = request
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::from_accept(accept);
            reply(
                StatusCode::OK,
                format.content_type(),
                render(registry, format),
            )
        }
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET /metrics\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "the metrics are at /metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::protocol::{AdmissionCounters, KernelCounters, XdpRunStats};

    struct Fake {
        metrics: AgentMetrics,
    }

    impl Source for Fake {
        fn scrape(&self, series: &PeerSeries) -> Scrape {
            Scrape {
                stats: Some(AgentStats {
                    iface: "eth0".into(),
                    xdp_mode: "native".into(),
                    port: 18498,
                    window: 128,
                    model: "normal".into(),
                    levels: vec![1.0, 3.0, 8.0],
                    peers: 4,
                    capacity: 100,
                    uptime_s: 12.5,
                    sweeps: 250,
                    refreshes: 40,
                    refloors: 160,
                    stalls: 1,
                    events: 7,
                    subscribers: 2,
                    kernel: KernelCounters {
                        heartbeats: 1000,
                        auth_failures: 3,
                        ..KernelCounters::default()
                    },
                    xdp: XdpRunStats {
                        run_count: 1003,
                        run_time_ns: 2_000_000,
                    },
                    admission: AdmissionCounters {
                        admitted: 4,
                        ..AdmissionCounters::default()
                    },
                    config_reloads: 0,
                    config_reload_failures: 0,
                    key_rotations: 0,
                    key_rotation_failures: 0,
                    program: Default::default(),
                    link: Default::default(),
                }),
                levels: vec![1.0, 3.0, 8.0],
                peers_at: vec![2, 1, 0, 1],
                phi_le: vec![2, 2, 3, 3, 3, 3, 3, 4, 4],
                selected: series
                    .ids
                    .iter()
                    .map(|&id| SelectedPeer {
                        id,
                        phi: 17.5,
                        silence_s: 2.5,
                        level: 8.0,
                    })
                    .collect(),
                socket_clients: 1,
            }
        }

        fn metrics(&self) -> &AgentMetrics {
            &self.metrics
        }
    }

    #[test]
    fn the_required_families_with_their_values() {
        let agent = Arc::new(Fake {
            metrics: AgentMetrics::default(),
        });
        agent
            .metrics
            .events
            .get_or_create(&KindLabel { kind: "suspect" })
            .inc();
        agent.metrics.sweep_seconds.observe(0.002);
        agent
            .metrics
            .request_seconds
            .get_or_create(&OpLabel { op: "suspects" })
            .observe(0.0003);
        let registry = registry(
            &agent,
            Arc::new(RwLock::new(PeerSeries {
                ids: vec![71],
                top: 0,
            })),
        );
        let text = render(&registry, Format::OpenMetrics);
        for line in [
            "heartbeat_monitor_peers{level=\"0\"} 2",
            "heartbeat_monitor_peers{level=\"8\"} 1",
            "heartbeat_monitor_heartbeats_total 1000",
            "heartbeat_monitor_packets_total{verdict=\"auth_failure\"} 3",
            "heartbeat_monitor_events_total{kind=\"suspect\"} 1",
            "heartbeat_monitor_build_info{version=\"",
            "heartbeat_monitor_peers_phi_at_most{phi=\"+Inf\"} 4",
            "heartbeat_monitor_xdp_run_seconds_total 0.002",
            "heartbeat_monitor_sweep_duration_seconds_count 1",
            "heartbeat_monitor_estimate_refreshes_total 40",
            "heartbeat_monitor_estimate_refloors_total 160",
            "heartbeat_monitor_request_duration_seconds_count{op=\"suspects\"} 1",
            "heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00032\",op=\"suspects\"} 1",
            "heartbeat_monitor_peer_phi{peer=\"71\"} 17.5",
            "heartbeat_monitor_admissions_total{outcome=\"admitted\"} 4",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        // The classic format has the same samples, without the OpenMetrics end marker.
        let classic = render(&registry, Format::Prometheus);
        assert!(
            classic.contains("heartbeat_monitor_peers{level=\"8\"} 1"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"));
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept(Some("*/*")), Format::Prometheus);
    }

    #[test]
    fn per_peer_series_are_capped() {
        assert!(
            PeerSeries {
                ids: vec![1; 10],
                top: 990
            }
            .validate()
            .is_ok()
        );
        let too_many = PeerSeries {
            ids: vec![1; 10],
            top: 991,
        };
        assert!(too_many.validate().unwrap_err().contains("at most 1000"));
    }

    #[test]
    fn only_get_metrics_is_served() {
        let registry = Registry::default();
        let get = |method: Method, path: &str| {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            respond(&request, &registry).status()
        };
        assert_eq!(get(Method::GET, "/metrics"), StatusCode::OK);
        assert_eq!(
            get(Method::POST, "/metrics"),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(get(Method::GET, "/"), StatusCode::NOT_FOUND);
    }
}
