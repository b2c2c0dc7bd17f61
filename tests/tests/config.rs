//! `monitor run --config FILE` on the real agent: settings come from the file, flags override
//! it, a bad file stops the start with the file, line and key named, and SIGHUP applies what
//! can change live (levels, the detector but for its window rules, per-peer metric series) and
//! keeps the rest.

use std::{process::Command, time::Duration};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender, spawn},
    http::get_in,
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

#[test]
fn a_bad_file_stops_the_start_and_names_the_line() {
    let dir = TempDir::new("hbmcfgbad");
    let file = dir.0.join("monitor.toml");
    std::fs::write(
        &file,
        "iface = \"lo\"\nlevels = [1, 3, 8]\nsweep-interval = \"fast\"\n",
    )
    .unwrap();
    let out = Command::new(monitor_bin())
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:3: key `sweep-interval`: invalid value 'fast'",
            file.display()
        )),
        "{err}"
    );
    // --print-config reads the file and prints it back with the command line's overrides.
    std::fs::write(&file, "iface = \"lo\"\nlevels = [1, 3]\n").unwrap();
    let out = Command::new(monitor_bin())
        .args(["run", "--port", "9000", "--print-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "iface = \"lo\"\n",
        "levels = [1, 3]\n",
        "port = 9000\n",
        "# window = 128   (default)\n",
    ] {
        assert!(printed.contains(line), "{line:?} not in {printed}");
    }
}

#[test]
fn sighup_applies_new_levels_and_keeps_what_needs_a_restart() {
    require_root();
    let pair = NetnsPair::new(41);
    let dir = TempDir::new("hbmcfg");
    let write = |text: &str| dir.config_file(text);
    let config = write("levels = [1, 3]\nmetrics-addr = \"127.0.0.1:9464\"\nport = 18498\n");
    let peers = dir.peers_file([1, 2]);
    let agent = AgentProcess::start(&pair, &["--config", &config, "--peers", &peers]);
    let stats = |agent: &AgentProcess| agent.ask(json!({"op": "stats"}))["stats"].clone();
    assert_eq!(stats(&agent)["levels"], json!([1.0, 3.0]));
    let _steady = spawn(sender(&pair, 1, "20ms", &[]));
    let mut dying = spawn(sender(&pair, 2, "20ms", &[]));
    wait_for(Duration::from_secs(10), "peer 2 heard", || {
        let hb = agent.ask(json!({"op": "peer", "id": 2}))["peer"]["heartbeats"].as_u64()?;
        (hb > 20).then_some(())
    });
    let mut events = agent.subscribe();
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = dying.0.kill();
    let _ = dying.0.wait();
    // Past level 3, the highest for now.
    let next_suspect = |events: &mut monitor::serving::client::Client| loop {
        let line = events.read_line().expect("an event within 10 s");
        let e: Value = serde_json::from_str(&line).unwrap();
        if e["event"] == "suspect" && e["id"] == 2 {
            break e;
        }
    };
    assert_eq!(next_suspect(&mut events)["level"], json!(1.0));
    assert_eq!(next_suspect(&mut events)["level"], json!(3.0));

    // Level 8 added, a per-peer series asked for, and a port change that must wait.
    write(
        "levels = [1, 3, 8]\nmetrics-addr = \"127.0.0.1:9464\"\nmetrics-peer = [2]\nport = 7999\n",
    );
    agent.sighup();
    wait_for(Duration::from_secs(5), "the new levels", || {
        (stats(&agent)["levels"] == json!([1.0, 3.0, 8.0])).then_some(())
    });
    // Peer 2 is raised to 8 (now, or when its phi gets there), and only to 8.
    let e = next_suspect(&mut events);
    assert_eq!(e["level"], json!(8.0), "{e}");
    assert!(e["phi"].as_f64().unwrap() >= 8.0, "{e}");
    assert_eq!(
        stats(&agent)["port"],
        json!(18498),
        "the port needs a restart"
    );
    let (status, text) = get_in(&pair.ns_a, "127.0.0.1:9464", "/metrics", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains("heartbeat_monitor_peer_phi{peer=\"2\"}"),
        "{text}"
    );

    assert_eq!(stats(&agent)["config_reloads"], json!(1));

    // A broken file on SIGHUP: refused, counted, and the agent keeps what it runs with.
    write("levels = [8, 3]\n");
    agent.sighup();
    wait_for(Duration::from_secs(5), "the refused reload", || {
        (stats(&agent)["config_reload_failures"] == json!(1)).then_some(())
    });
    assert_eq!(stats(&agent)["levels"], json!([1.0, 3.0, 8.0]));
    assert_eq!(stats(&agent)["config_reloads"], json!(1));
}

#[test]
fn sighup_changes_the_detector_live_but_not_its_window_rules() {
    require_root();
    let pair = NetnsPair::new(42);
    let dir = TempDir::new("hbmcfg");
    let write = |text: &str| dir.config_file(text);
    // A timeout nobody reaches: a stopped peer stays below every level.
    let config = write("model = \"fixed\"\ntimeout-ms = 100000\n");
    let peers = dir.peers_file([1, 2]);
    let agent = AgentProcess::start(&pair, &["--config", &config, "--peers", &peers]);
    let stats = |agent: &AgentProcess| agent.ask(json!({"op": "stats"}))["stats"].clone();
    let peer =
        |agent: &AgentProcess, id: u64| agent.ask(json!({"op": "peer", "id": id}))["peer"].clone();
    let _steady = spawn(sender(&pair, 1, "20ms", &[]));
    let mut dying = spawn(sender(&pair, 2, "20ms", &[]));
    wait_for(Duration::from_secs(10), "peer 2 heard", || {
        (peer(&agent, 2)["heartbeats"].as_u64()? > 20).then_some(())
    });
    let mut events = agent.subscribe();
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = dying.0.kill();
    let _ = dying.0.wait();
    wait_for(Duration::from_secs(10), "peer 2 silent for 1.5 s", || {
        (peer(&agent, 2)["silence_ms"].as_f64()? > 1500.0).then_some(())
    });
    assert_eq!(peer(&agent, 2)["level"], Value::Null);

    // A 1 s timeout, live: peer 2 is past it, so every level is raised now, lowest first.
    write("model = \"fixed\"\ntimeout-ms = 1000\n");
    agent.sighup();
    for level in [1.0, 3.0, 8.0] {
        let line = events.read_line().expect("an event within 10 s");
        let e: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (&e["event"], &e["id"], &e["level"]),
            (&json!("suspect"), &json!(2), &json!(level)),
            "{e}"
        );
        assert!(e["silence_ms"].as_f64().unwrap() > 1500.0, "{e}");
    }
    assert_eq!(peer(&agent, 2)["level"], json!(8.0));
    assert_eq!(peer(&agent, 1)["level"], Value::Null);
    assert_eq!(stats(&agent)["config_reloads"], json!(1));

    // The window is the kernel's rule: it waits for a restart, and the rest stays as it is.
    write("model = \"fixed\"\ntimeout-ms = 1000\nwindow = 64\n");
    agent.sighup();
    wait_for(Duration::from_secs(5), "the second reload", || {
        (stats(&agent)["config_reloads"] == json!(2)).then_some(())
    });
    assert_eq!(stats(&agent)["window"], json!(128));
    assert_eq!(stats(&agent)["model"], json!("fixed"));
    assert_eq!(peer(&agent, 2)["level"], json!(8.0));
}
