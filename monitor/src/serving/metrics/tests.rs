//! The metrics' unit tests: a fake source's scrape rendered, the listener's limits.

use std::{
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use hyper::{Method, Request, StatusCode};

use super::{listener::*, *};
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
                due_passes: 0,
                due_looks: 0,
                pass_s: 0.0,
                heard_told: 0,
                scans_skipped: 0,
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
            budget_unmet: 2,
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
        "heartbeat_monitor_peers_budget_unmet 2",
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
