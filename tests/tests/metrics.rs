//! `monitor run --metrics-addr` against the real tools: the agent's output passes
//! `promtool check metrics`, a real Prometheus server (Debian's `prometheus`, started here with
//! its own config and data directory) scrapes it and answers a query through its HTTP API, and
//! the shipped alert rules pass `promtool check rules` and `promtool test rules`.

use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, ChildGuard, TempDir, sender, spawn},
    http::get_in,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

const METRICS: &str = "127.0.0.1:9464";
const PROMETHEUS: &str = "127.0.0.1:9090";

fn packaging() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/prometheus")
}

/// The value of the sample `name{labels}` (exact text before the value) in classic text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn prometheus_scrapes_the_agent_and_promtool_accepts_it() {
    require_root();
    let pair = NetnsPair::new(40);
    let dir = TempDir::new("hbmmetrics");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1, 2]),
            "--metrics-addr",
            METRICS,
            "--metrics-peer",
            "2",
        ],
    );
    let _steady = spawn(sender(&pair, 1, "20ms", &[]));
    let mut dying = spawn(sender(&pair, 2, "20ms", &[]));
    let heard = |id: u64| {
        agent.ask(json!({"op": "peer", "id": id}))["peer"]["heartbeats"]
            .as_u64()
            .unwrap_or(0)
            > 20
    };
    wait_for(Duration::from_secs(10), "both peers heard", || {
        (heard(1) && heard(2)).then_some(())
    });
    // Peer 2 dies; wait until the agent has it at the top level.
    let _ = dying.0.kill();
    let _ = dying.0.wait();
    wait_for(Duration::from_secs(10), "peer 2 at level 8", || {
        let s = agent.ask(json!({"op": "suspects", "threshold": 8}));
        (s["suspects"].as_array()?.len() == 1).then_some(())
    });

    let metrics = |headers: &[(&str, &str)]| {
        let (status, body) =
            get_in(&pair.ns_a, METRICS, "/metrics", headers).expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        body
    };
    let text = wait_for(
        Duration::from_secs(5),
        "the sweep to count peer 2 at 8",
        || {
            let text = metrics(&[]);
            (sample(&text, "heartbeat_monitor_peers{level=\"8\"}") == Some(1.0)).then_some(text)
        },
    );
    assert_eq!(
        sample(&text, "heartbeat_monitor_peers{level=\"0\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "heartbeat_monitor_heartbeats_total").unwrap() > 40.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "heartbeat_monitor_packets_total{verdict=\"heartbeat\"}"
        )
        .unwrap()
            > 40.0
    );
    assert!(sample(&text, "heartbeat_monitor_events_total{kind=\"suspect\"}").unwrap() >= 3.0);
    assert!(sample(&text, "heartbeat_monitor_peer_phi{peer=\"2\"}").unwrap() >= 8.0);
    // The socket requests above, each timed under its op.
    for op in ["peer", "suspects"] {
        let series = format!("heartbeat_monitor_request_duration_seconds_count{{op=\"{op}\"}}");
        assert!(
            sample(&text, &series).unwrap_or(0.0) >= 1.0,
            "{series}:\n{text}"
        );
    }
    assert!(
        sample(&text, "heartbeat_monitor_peer_phi{peer=\"1\"}").is_none(),
        "only asked-for peers"
    );
    assert!(
        text.contains("heartbeat_monitor_build_info{version=\""),
        "{text}"
    );
    // What Prometheus asks for first is OpenMetrics, with its end marker.
    let open = metrics(&[(
        "Accept",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )]);
    assert!(open.trim_end().ends_with("# EOF"), "{open}");

    // promtool's linter on the live output.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; cargo xtask setup installs it)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A real Prometheus in the agent's namespace, scraping every 500 ms.
    let config = dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: heartbeat-monitor\n    static_configs:\n      - targets: ['{METRICS}']\n",
            packaging().join("heartbeat-monitor.rules.yml").display()
        ),
    )
    .unwrap();
    let data = dir.0.join("prometheus-data");
    let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
    let _prometheus = ChildGuard(
        Command::new("ip")
            .args(["netns", "exec", &pair.ns_a, "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={PROMETHEUS}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package prometheus)"),
    );
    let query = |q: &str| -> Option<Value> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let (status, body) = get_in(&pair.ns_a, PROMETHEUS, &path, &[]).ok()?;
        (status == 200).then(|| serde_json::from_str(&body).ok())?
    };
    let result = wait_for(
        Duration::from_secs(60),
        "Prometheus to scrape the agent",
        || {
            let reply = query("heartbeat_monitor_peers{level=\"8\"}")?;
            let result = reply["data"]["result"].as_array()?.first()?.clone();
            Some(result)
        },
    );
    assert_eq!(
        result["metric"]["job"],
        json!("heartbeat-monitor"),
        "{result}"
    );
    assert_eq!(result["value"][1], json!("1"), "{result}");
    // The rules loaded and are being evaluated.
    let (status, rules) = get_in(&pair.ns_a, PROMETHEUS, "/api/v1/rules", &[]).expect("rules");
    assert_eq!(status, 200);
    for alert in [
        "HeartbeatPeersSuspected",
        "HeartbeatPeersFlapping",
        "HeartbeatMonitorStalled",
        "HeartbeatMonitorDown",
        "HeartbeatAuthFailures",
        "HeartbeatBudgetUnmet",
    ] {
        assert!(rules.contains(alert), "{alert} not loaded: {rules}");
    }
    drop(agent);
}

/// Percent-encodes a query for a URL (everything but unreserved characters).
fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn the_shipped_alert_rules_pass_promtool() {
    let dir = packaging();
    for args in [
        vec!["check", "rules", "heartbeat-monitor.rules.yml"],
        vec!["test", "rules", "heartbeat-monitor.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian package prometheus; cargo xtask setup installs it)");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
