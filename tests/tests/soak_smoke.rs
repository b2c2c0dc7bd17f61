//! A short soak (the long one is `cargo xtask soak`): 2000 peers, 5% of them churning, for
//! 20 s. Every silent period is detected at phi 8, no steady peer is ever suspected at it,
//! no slot leaks and no heartbeat is lost.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, loadgen},
    netns::NetnsPair,
    require_root, soak,
};
use serde_json::json;

#[test]
fn churn_is_detected_and_steady_peers_are_never_suspected() {
    require_root();
    let pair = NetnsPair::new(70);
    let dir = TempDir::new("hbmsoak");
    let peers = 2000u64;
    let peers_file = dir.peers_file(1..=peers);
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &peers_file,
            "--capacity",
            "2000",
            "--sweep-interval",
            "20ms",
            // No interval cap: the default outage rule keeps the silences out of the windows.
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, watcher) = soak::watch(agent.socket(), 8.0, stop.clone());
    let started = soak::unix_ms();
    let report = loadgen(
        &pair,
        18498,
        &[
            "--peers",
            "2000",
            "--rate",
            "10",
            "--duration",
            "20s",
            "--churn",
            "0.05",
            "--churn-period",
            "2s",
            "--incarnation",
            "1",
        ],
    );
    let ended = soak::unix_ms();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();

    // Skip the first second (bootstrap) and stop before the generator does (then all go silent).
    let verdict = soak::verify(
        &report,
        &seen.lock().unwrap(),
        started + 1000.0,
        ended - 500.0,
    );
    // 100 churners in 4 groups: 25 silent per 2 s period, about 8 whole periods checked.
    assert!(verdict.deaths >= 150, "{verdict:?}");
    assert!(verdict.ok(), "{verdict:?}");
    assert!(verdict.recoveries >= verdict.deaths - 100, "{verdict:?}");

    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(
        stats["peers"],
        json!(peers),
        "no slot leaked or lost: {stats}"
    );
    assert_eq!(
        stats["kernel"]["heartbeats"].as_u64().unwrap(),
        report.sent,
        "{stats}"
    );
    assert_eq!(stats["kernel"]["unknown_peer"], json!(0));
}
