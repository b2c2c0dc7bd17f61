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

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex, RwLock, Weak},
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    fn closed(&self, reason: &'static str) {
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
            // 100 us .. ~3.3 s: events are raised within one sweep (50 ms) of the crossing.
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

/// The limits of the metrics listener (docs/security.md, "/metrics"): what a client that
/// never finishes a request, or many of them, or a flood of scrapes, can hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// A request header not complete this long after the connection began waiting for it is
    /// dropped with its connection; an idle keep-alive connection is closed after as long.
    pub header_timeout: Duration,
    /// A connection this old is asked to finish (no keep-alive after the request in hand),
    /// and dropped `header_timeout` later if it has not (a body or a reply that trickles).
    pub max_age: Duration,
    /// Connections open at once. A newcomer over it closes the oldest connection that has
    /// not sent a request yet; if every one has, the newcomer is closed at once.
    pub max_connections: usize,
    /// A rendered scrape this young is served again instead of rendering anew.
    pub reuse: Duration,
}

impl Limits {
    pub const DEFAULT: Self = Self {
        header_timeout: Duration::from_secs(5),
        max_age: Duration::from_secs(60),
        max_connections: 64,
        reuse: Duration::from_secs(1),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Renders scrapes one at a time off the async workers, and serves a rendering younger than
/// `Limits::reuse` again: concurrent scrapers wait for the one rendering under way and share
/// it, so a flood of scrapes costs at most one walk over the peers per `reuse` per format,
/// on a blocking thread, never on the two workers the agent's socket shares.
struct Renderer {
    registry: Arc<Registry>,
    reuse: Duration,
    /// The last rendering of each format (OpenMetrics, Prometheus), and when it began.
    last: tokio::sync::Mutex<[Option<(Instant, Bytes)>; 2]>,
}

impl Renderer {
    async fn body(self: &Arc<Self>, format: Format) -> Bytes {
        // In a task of its own, so a scraper that goes away mid-way neither cancels the
        // rendering nor lets the next one start beside it.
        let this = self.clone();
        let task = tokio::spawn(async move {
            let mut last = this.last.lock().await;
            let slot = &mut last[format as usize];
            if let Some((at, body)) = slot
                && at.elapsed() <= this.reuse
            {
                return body.clone();
            }
            let began = Instant::now();
            let registry = this.registry.clone();
            let body = tokio::task::spawn_blocking(move || Bytes::from(render(&registry, format)))
                .await
                .unwrap_or_else(|e| Bytes::from(format!("# rendering failed: {e}\n")));
            *slot = Some((began, body.clone()));
            body
        });
        task.await
            .unwrap_or_else(|e| Bytes::from(format!("# rendering failed: {e}\n")))
    }
}

/// The connections open on the listener, and which of them have not sent a request yet (the
/// ones a newcomer over the cap may evict, oldest first).
#[derive(Default)]
struct Connections {
    open: usize,
    next: u64,
    waiting: BTreeMap<u64, CancellationToken>,
}

/// One admitted connection's place; gives it back when the connection ends (unless it was
/// evicted, which gave it to the newcomer).
struct Place {
    id: u64,
    evicted: CancellationToken,
    connections: Arc<Mutex<Connections>>,
    http: HttpMetrics,
}

impl Place {
    /// The connection sent a request: it can no longer be evicted.
    fn requested(&self) {
        self.connections
            .lock()
            .expect("connections lock")
            .waiting
            .remove(&self.id);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut c = self.connections.lock().expect("connections lock");
        c.waiting.remove(&self.id);
        if !self.evicted.is_cancelled() {
            c.open -= 1;
            self.http.connections.set(c.open as i64);
        }
    }
}

/// A place for a new connection, evicting the oldest that has not sent a request if the
/// listener is full; None if every place is held by a connection that has.
fn admit(
    connections: &Arc<Mutex<Connections>>,
    limits: &Limits,
    http: &HttpMetrics,
) -> Option<Place> {
    let mut c = connections.lock().expect("connections lock");
    if c.open >= limits.max_connections {
        if let Some((_, oldest)) = c.waiting.pop_first() {
            oldest.cancel();
            c.open -= 1;
            http.closed("evicted");
        } else {
            http.closed("over_cap");
            return None;
        }
    }
    c.open += 1;
    http.connections.set(c.open as i64);
    let id = c.next;
    c.next += 1;
    let evicted = CancellationToken::new();
    c.waiting.insert(id, evicted.clone());
    Some(Place {
        id,
        evicted,
        connections: connections.clone(),
        http: http.clone(),
    })
}

/// Serves `GET /metrics` forever; anything else is a 404 or 405. One task per connection,
/// HTTP/1.1 with keep-alive, as Prometheus scrapes, within `limits`; `http` counts what
/// the limits closed.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    limits: Limits,
    http: HttpMetrics,
) -> std::io::Result<()> {
    let renderer = Arc::new(Renderer {
        registry,
        reuse: limits.reuse,
        last: tokio::sync::Mutex::new([None, None]),
    });
    let connections = Arc::new(Mutex::new(Connections::default()));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // Scrape requests are a few hundred bytes; this bounds each connection's buffer.
        .max_buf_size(16 * 1024);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("accept on the metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(place) = admit(&connections, &limits, &http) else {
            drop(stream);
            continue;
        };
        let renderer = renderer.clone();
        let builder = builder.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let place = Arc::new(place);
            let evicted = place.evicted.clone();
            let service = {
                let place = place.clone();
                service_fn(move |request: Request<hyper::body::Incoming>| {
                    place.requested();
                    let renderer = renderer.clone();
                    async move { Ok::<_, std::convert::Infallible>(respond(&request, &renderer).await) }
                })
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let age = tokio::time::sleep(limits.max_age);
            tokio::pin!(age);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                // Dropping the connection closes it.
                () = evicted.cancelled() => return,
                () = &mut age => {
                    http.closed("max_age");
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(limits.header_timeout, connection.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => return,
                    }
                }
            };
            if let Err(e) = result {
                if e.is_timeout() {
                    http.closed("header_timeout");
                }
                log::debug!("metrics client: {e}");
            }
        });
    }
}

async fn respond<B>(request: &Request<B>, renderer: &Arc<Renderer>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: Bytes| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
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
                renderer.body(format).await,
            )
        }
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"only GET /metrics\n"),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"the metrics are at /metrics\n"),
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
                    protocol: 1,
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

    fn renderer(registry: Registry, reuse: Duration) -> Arc<Renderer> {
        Arc::new(Renderer {
            registry: Arc::new(registry),
            reuse,
            last: tokio::sync::Mutex::new([None, None]),
        })
    }

    #[tokio::test]
    async fn only_get_metrics_is_served() {
        let renderer = renderer(Registry::default(), Duration::ZERO);
        for (method, path, status) in [
            (Method::GET, "/metrics", StatusCode::OK),
            (Method::HEAD, "/metrics", StatusCode::OK),
            (Method::POST, "/metrics", StatusCode::METHOD_NOT_ALLOWED),
            (Method::GET, "/", StatusCode::NOT_FOUND),
        ] {
            let request = Request::builder()
                .method(method.clone())
                .uri(path)
                .body(())
                .unwrap();
            assert_eq!(
                respond(&request, &renderer).await.status(),
                status,
                "{method} {path}"
            );
        }
    }

    /// A source whose scrape takes 50 ms, counting scrapes and how many ran at once.
    #[derive(Default)]
    struct Slow {
        metrics: AgentMetrics,
        scrapes: std::sync::atomic::AtomicUsize,
        running: std::sync::atomic::AtomicUsize,
        most_at_once: std::sync::atomic::AtomicUsize,
    }

    impl Source for Slow {
        fn scrape(&self, _: &PeerSeries) -> Scrape {
            use std::sync::atomic::Ordering::SeqCst;
            self.scrapes.fetch_add(1, SeqCst);
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most_at_once.fetch_max(now, SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            self.running.fetch_sub(1, SeqCst);
            Scrape::default()
        }

        fn metrics(&self) -> &AgentMetrics {
            &self.metrics
        }
    }

    /// `n` scrapes at once of a fresh `Slow` served with `reuse`; the source, to count.
    async fn concurrent_scrapes(n: usize, reuse: Duration) -> Arc<Slow> {
        let agent = Arc::new(Slow::default());
        let renderer = renderer(registry(&agent, Arc::default()), reuse);
        let scrapers: Vec<_> = (0..n)
            .map(|_| {
                let renderer = renderer.clone();
                tokio::spawn(async move { renderer.body(Format::Prometheus).await })
            })
            .collect();
        for scraper in scrapers {
            let body = scraper.await.unwrap();
            assert!(
                String::from_utf8_lossy(&body).contains("heartbeat_monitor_socket_clients 0"),
                "{body:?}"
            );
        }
        agent
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_scrapes_share_one_rendering() {
        use std::sync::atomic::Ordering::SeqCst;
        // Within the reuse age, eight scrapers at once cause one walk over the peers.
        let agent = concurrent_scrapes(8, Duration::from_secs(1)).await;
        assert_eq!(agent.scrapes.load(SeqCst), 1);
        // Without reuse, each renders, but never two at once.
        let agent = concurrent_scrapes(8, Duration::ZERO).await;
        assert_eq!(agent.scrapes.load(SeqCst), 8);
        assert_eq!(agent.most_at_once.load(SeqCst), 1);
    }

    #[test]
    fn a_full_listener_evicts_the_oldest_connection_without_a_request() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::DEFAULT
        };
        let http = HttpMetrics::default();
        let connections = Arc::new(Mutex::new(Connections::default()));
        let closed = |reason| http.closed.get_or_create(&ReasonLabel { reason }).get();
        let a = admit(&connections, &limits, &http).unwrap();
        let b = admit(&connections, &limits, &http).unwrap();
        b.requested();
        // Full: the newcomer takes the place of `a`, which has sent nothing.
        let c = admit(&connections, &limits, &http).unwrap();
        assert!(a.evicted.is_cancelled() && !b.evicted.is_cancelled());
        assert_eq!(closed("evicted"), 1);
        drop(a);
        assert_eq!(http.connections.get(), 2);
        // `c` has not sent a request either: the next newcomer evicts it.
        let d = admit(&connections, &limits, &http).unwrap();
        assert!(c.evicted.is_cancelled());
        d.requested();
        // Every place is held by a connection that has sent a request: refused.
        assert!(admit(&connections, &limits, &http).is_none());
        assert_eq!(closed("over_cap"), 1);
        drop((b, c));
        assert_eq!(http.connections.get(), 1);
        assert!(admit(&connections, &limits, &http).is_some());
    }
}
