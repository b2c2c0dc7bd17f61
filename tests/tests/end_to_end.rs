//! The whole path on the real kernel: `monitor send` in one namespace, a veth pair, the XDP
//! program and `monitor run` in the other, answers read back through the Unix socket.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    process::Stdio,
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, run_ok, sender, sender_to, spawn},
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn heartbeats_cross_the_veth_and_match_what_was_sent() {
    require_root();
    let pair = NetnsPair::new(1);
    let dir = TempDir::new("hbmpeers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([42])]);
    run_ok(sender(&pair, 42, "20ms", &["--count", "60"]));

    let peer = &agent.ask(json!({"op": "peer", "id": 42}))["peer"];
    assert_eq!(peer["id"], json!(42));
    assert_eq!(peer["heartbeats"], json!(60), "{peer}");
    assert_eq!(peer["samples"], json!(59), "{peer}");
    assert_eq!(peer["lost"], json!(0), "{peer}");
    assert_eq!(peer["duplicates"], json!(0), "{peer}");
    assert_eq!(peer["out_of_order"], json!(0), "{peer}");
    assert_eq!(peer["last_seq"], json!(59), "{peer}");
    // The sender keeps a fixed schedule, so the mean holds even on a noisy machine.
    let mean = f(&peer["mean_ms"]);
    assert!(
        (16.0..=24.0).contains(&mean),
        "mean interval {mean} ms, sent every 20 ms"
    );
    // The deviation is what the window's exact sums say, not merely a number.
    let window = &agent.ask(json!({"op": "peer", "id": 42, "window": true}))["peer"]["window"];
    let intervals: Vec<f64> = window["intervals_us"]
        .as_array()
        .expect("intervals")
        .iter()
        .map(|i| f(i) / 1000.0)
        .collect();
    assert_eq!(intervals.len(), 59, "{window}");
    let n = intervals.len() as f64;
    let m = intervals.iter().sum::<f64>() / n;
    let std = (intervals.iter().map(|i| (i - m).powi(2)).sum::<f64>() / n).sqrt();
    let reported = f(&peer["std_ms"]);
    assert!(
        (reported - std).abs() <= 0.01 + std * 1e-6,
        "std_ms {reported}, the window's intervals give {std}"
    );
    let addr = peer["addr"].as_str().unwrap();
    assert!(addr.starts_with(&format!("{}:", pair.addr_b)), "{addr}");

    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["kernel"]["heartbeats"], json!(60), "{stats}");
    assert_eq!(stats["peers"], json!(1));
    assert_eq!(stats["kernel"]["malformed"], json!(0));

    // Silence grows while nobody sends. The sleep is the silence under test, not a wait.
    let before = f(&agent.ask(json!({"op": "peer", "id": 42}))["peer"]["silence_ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let after = f(&agent.ask(json!({"op": "peer", "id": 42}))["peer"]["silence_ms"]);
    assert!(after >= before + 250.0, "silence {before} -> {after}");
}

#[test]
fn ipv6_heartbeats_are_recorded() {
    require_root();
    let pair = NetnsPair::new(2);
    let dir = TempDir::new("hbmpeers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([6])]);
    run_ok(sender_to(
        &pair,
        &format!("[{}]:18498", pair.addr6_a),
        6,
        "10ms",
        &["--count", "20"],
    ));
    let peer = &agent.ask(json!({"op": "peer", "id": 6}))["peer"];
    assert_eq!(peer["heartbeats"], json!(20), "{peer}");
    assert!(
        peer["addr"]
            .as_str()
            .unwrap()
            .starts_with(&format!("[{}]:", pair.addr6_b)),
        "{peer}"
    );
}

#[test]
fn unknown_peers_are_admitted_on_first_heartbeat() {
    require_root();
    let pair = NetnsPair::new(3);
    let agent = AgentProcess::start(&pair, &[]);
    run_ok(sender(&pair, 1001, "50ms", &["--count", "30"]));
    run_ok(sender(&pair, 1002, "50ms", &["--count", "30"]));
    let peers = agent.ask(json!({"op": "peers"}))["peers"]
        .as_array()
        .unwrap()
        .clone();
    let ids: Vec<u64> = peers.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1001, 1002]);
    for p in &peers {
        // The first heartbeat is the report that admits the peer; it has no slot to land in
        // yet. Later ones all count (at 50 ms apart, admission has 200 ms to catch up on a
        // loaded machine).
        let n = p["heartbeats"].as_u64().unwrap();
        assert!((25..=29).contains(&n), "{p}");
    }
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert!(
        stats["kernel"]["unknown_reported"].as_u64().unwrap() >= 2,
        "{stats}"
    );
}

#[test]
fn without_auto_admission_unlisted_peers_stay_out() {
    require_root();
    let pair = NetnsPair::new(4);
    let agent = AgentProcess::start(&pair, &["--no-auto-admit"]);
    run_ok(sender(&pair, 5, "10ms", &["--count", "10"]));
    assert_eq!(agent.ask(json!({"op": "peers"}))["peers"], json!([]));
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["kernel"]["unknown_peer"], json!(10), "{stats}");
}

#[test]
fn bad_requests_get_errors_and_the_connection_survives() {
    require_root();
    let pair = NetnsPair::new(5);
    let agent = AgentProcess::start(&pair, &[]);
    let mut client = agent.client();
    for (line, expected) in [
        ("not json", "invalid JSON"),
        ("{\"op\":\"frobnicate\"}", "unknown variant"),
        ("{\"op\":\"peer\"}", "missing field `id`"),
        ("{\"op\":\"peer\",\"id\":-5}", "invalid value"),
        ("{\"op\":\"peer\",\"id\":123}", "unknown peer 123"),
        ("[]", "JSON object"),
    ] {
        let reply: Value = serde_json::from_str(&client.request_line(line).unwrap()).unwrap();
        assert_eq!(reply["ok"], json!(false), "{line}");
        let error = reply["error"].as_str().unwrap();
        assert!(error.contains(expected), "{line} -> {error}");
    }

    // Invalid UTF-8 and an over-long line, on a raw stream.
    let mut raw = UnixStream::connect(agent.socket()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"{\"op\":\"st\xffats\"}\n").unwrap();
    raw.write_all(&vec![b'x'; 100_000]).unwrap();
    raw.write_all(b"\n{\"op\":\"stats\"}\n").unwrap();
    let mut replies = String::new();
    let mut buf = [0u8; 4096];
    while replies.lines().count() < 3 {
        let n = raw.read(&mut buf).unwrap();
        assert!(n > 0, "agent closed the connection; got {replies}");
        replies.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    let replies: Vec<Value> = replies
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        replies[0]["error"].as_str().unwrap().contains("UTF-8"),
        "{}",
        replies[0]
    );
    assert!(
        replies[1]["error"]
            .as_str()
            .unwrap()
            .contains("longer than"),
        "{}",
        replies[1]
    );
    assert_eq!(replies[2]["ok"], json!(true), "{}", replies[2]);

    // The agent still serves everyone.
    assert_eq!(
        client.request(&json!({"op": "stats"})).unwrap()["ok"],
        json!(true)
    );
}

#[test]
fn stop_detaches_and_removes_the_socket() {
    require_root();
    let pair = NetnsPair::new(6);
    let agent = AgentProcess::start(&pair, &[]);
    let socket = agent.socket().to_path_buf();
    let link = |pair: &NetnsPair| {
        let out = std::process::Command::new("ip")
            .args(["-n", &pair.ns_a, "link", "show", &pair.iface_a])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        link(&pair).contains("xdp"),
        "XDP not attached: {}",
        link(&pair)
    );
    let status = agent.stop();
    assert!(status.success(), "{status}");
    assert!(
        !link(&pair).contains("xdp"),
        "XDP still attached: {}",
        link(&pair)
    );
    assert!(!socket.exists(), "socket file left behind");
}

#[test]
fn startup_errors_are_clear() {
    require_root();
    let pair = NetnsPair::new(7);
    let agent = AgentProcess::start(&pair, &[]);
    let run = |args: &[&str]| {
        let mut cmd = NetnsPair::command_in(&pair.ns_a, &monitor_bin());
        let out = cmd
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let socket = agent.socket().display().to_string();
    let err = run(&["--iface", &pair.iface_a, "--socket", &socket]);
    assert!(err.contains("in use"), "{err}");

    let dir = TempDir::new("hbmerr");
    let other = dir.0.join("s.sock").display().to_string();
    let err = run(&["--iface", "nosuchif0", "--socket", &other]);
    assert!(err.contains("does not exist"), "{err}");

    let bad = dir.0.join("peers");
    std::fs::write(&bad, "1\nbanana\n").unwrap();
    let err = run(&[
        "--iface",
        &pair.iface_a,
        "--socket",
        &other,
        "--peers",
        &bad.display().to_string(),
    ]);
    assert!(err.contains(":2:") && err.contains("banana"), "{err}");

    let err = run(&["--iface", &pair.iface_a, "--window", "1"]);
    assert!(err.contains("--window"), "{err}");

    // Without privileges (an unprivileged uid, no capabilities): a clear word, no socket left.
    let unprivileged = std::env::temp_dir().join(format!("hbm-noperm-{}.sock", std::process::id()));
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(monitor_bin())
        .args(["run", "--iface", "lo", "--socket"])
        .arg(&unprivileged)
        .output()
        .expect("setpriv (util-linux)");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied") && err.contains("run as root"),
        "{err}"
    );
    assert!(!unprivileged.exists(), "socket left behind");
}

#[test]
fn query_cli_prints_a_table_and_raw_json() {
    require_root();
    let pair = NetnsPair::new(8);
    let dir = TempDir::new("hbmpeers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([77])]);
    let _sender = spawn(sender(&pair, 77, "10ms", &[]));
    wait_for(
        Duration::from_secs(10),
        "peer 77's first heartbeats",
        || {
            let peer = &agent.ask(json!({"op": "peer", "id": 77}))["peer"];
            (peer["samples"].as_u64() >= Some(2)).then_some(())
        },
    );
    let query = |args: &[&str]| {
        let out = std::process::Command::new(monitor_bin())
            .arg("query")
            .arg("--socket")
            .arg(agent.socket())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, table) = query(&["peers"]);
    assert!(ok);
    assert!(
        table.lines().next().unwrap().contains("HEARTBEATS"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap()
            .trim_start()
            .starts_with("77 "),
        "{table}"
    );
    let (ok, raw) = query(&["--json", "peer", "77"]);
    assert!(ok);
    let v: Value = serde_json::from_str(raw.trim()).unwrap();
    assert!(v["peer"]["heartbeats"].as_u64().unwrap() > 0, "{v}");
    let (ok, _) = query(&["peer", "78"]);
    assert!(!ok, "an unknown peer is an error");
}
