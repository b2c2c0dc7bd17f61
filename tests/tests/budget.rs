//! `monitor run --budget` end to end: a sender in one namespace stops, and the agent raises
//! every level in order, the highest at the peer's own deadline, near the budget.

use std::time::Duration;

use integration_tests::{
    agent_process::{AgentProcess, TempDir, events_until, sender, spawn},
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

/// The budget the agent is given, ms.
const BUDGET_MS: f64 = 300.0;

#[test]
fn a_stopped_sender_is_convicted_at_its_deadline() {
    require_root();
    let pair = NetnsPair::named(124, ["hbmbudgeta", "hbmbudgetb"], ["hbvbudga", "hbvbudgb"]);
    let dir = TempDir::new("hbmbudget");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([9]),
            "--budget",
            "300ms",
            "--levels",
            "1,3,8",
            "--sweep-interval",
            "10ms",
        ],
    );
    let mut watcher = agent.subscribe();
    let send = spawn(sender(&pair, 9, "20ms", &["--incarnation", "1"]));
    // More than the 8 intervals a window needs before the schedule is read.
    wait_for(Duration::from_secs(15), "60 heartbeats of peer 9", || {
        let peer = &agent.ask(json!({"op": "peer", "id": 9}))["peer"];
        (peer["heartbeats"].as_u64().unwrap() >= 60).then_some(())
    });
    drop(send); // SIGKILL: the sender dies mid-stream

    let events = events_until(&mut watcher, Duration::from_secs(10), |e| {
        e.iter()
            .any(|e| e["event"] == "suspect" && e["id"] == 9 && e["level"] == json!(8.0))
    });
    // The climb after the sender's death: a live sender descheduled on a loaded machine may
    // cross the first level before it (a level-1 mistake, ended by its next heartbeat).
    let climb = events
        .iter()
        .rposition(|e| e["event"] == "recover" && e["id"] == 9)
        .map_or(0, |i| i + 1);
    let suspicion: Vec<&Value> = events[climb..]
        .iter()
        .filter(|e| e["event"] == "suspect" && e["id"] == 9)
        .collect();
    let levels: Vec<f64> = suspicion
        .iter()
        .map(|e| e["level"].as_f64().unwrap())
        .collect();
    assert_eq!(levels, vec![1.0, 3.0, 8.0], "{events:#?}");
    // The silence at which each level was crossed, from the kernel's timestamps: the event's
    // `at` less its silence is the last arrival (Unix ms), `crossed_at` the exact crossing.
    let crossed: Vec<f64> = suspicion
        .iter()
        .map(|e| {
            let heard = e["at"].as_f64().unwrap() - e["silence_ms"].as_f64().unwrap();
            e["crossed_at"].as_f64().unwrap() - heard
        })
        .collect();
    assert!(
        crossed.windows(2).all(|w| w[0] <= w[1]),
        "levels in order: {crossed:?}"
    );
    // Level 8 at the deadline: the aim (0.98 of the budget) moved by the last heartbeat's
    // offset from the sender's schedule. The budget bounds the mean of the deadlines over
    // heartbeats (tests in monitor/tests/budget_replay.rs); one deadline moves with its last
    // offset, a few ms on a veth, more when a loaded machine delays the sender.
    let deadline = crossed[2];
    println!("levels 1, 3, 8 crossed after {crossed:?} ms of silence");
    assert!(
        (0.85 * BUDGET_MS..=1.15 * BUDGET_MS).contains(&deadline),
        "level 8 crossed after {deadline} ms of silence: {events:#?}"
    );
    let peer = &agent.ask(json!({"op": "peer", "id": 9}))["peer"];
    assert!(peer["phi"].as_f64().unwrap() >= 8.0, "{peer}");
}
