//! Senders that restart backwards (a clock stepped back, an explicit lower incarnation) are
//! heard again at once, and with authentication a recorded epoch replayed after the peer died
//! revives nothing (docs/security.md, "Restarts that go backwards").

use std::{os::unix::fs::PermissionsExt, time::Duration};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, run_ok, sender, spawn},
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

const KEY: &str = "00112233445566778899aabbccddeeff";

fn peer(agent: &AgentProcess, id: u64) -> Value {
    agent.ask(json!({"op": "peer", "id": id}))["peer"].clone()
}

fn count(peer: &Value, field: &str) -> u64 {
    peer[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field}: {peer}"))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The user's report: `--incarnation 100`, then `--incarnation 50`. All the new heartbeats
/// were refused as out of order and the live peer was convicted at phi 369 for good.
#[test]
fn a_sender_restarted_with_a_lower_incarnation_is_heard_again() {
    require_root();
    let pair = NetnsPair::new(160);
    let dir = TempDir::new("hbmback");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([7])]);
    run_ok(sender(
        &pair,
        7,
        "20ms",
        &["--incarnation", "100", "--count", "30"],
    ));
    let _restarted = spawn(sender(&pair, 7, "20ms", &["--incarnation", "50"]));
    let heard = wait_for(
        Duration::from_secs(10),
        "peer 7 heard in incarnation 50",
        || {
            let p = peer(&agent, 7);
            (p["incarnation"] == json!(50) && count(&p, "heartbeats") >= 40).then_some(p)
        },
    );
    assert_eq!(count(&heard, "out_of_order"), 0, "none refused: {heard}");
    assert_eq!(count(&heard, "restarts"), 1, "{heard}");
    assert!(heard["level"].is_null(), "not suspected: {heard}");
    integration_tests::attack::AttackRow {
        attack: "a sender restarted with a lower incarnation",
        load: "incarnation 100, then 50 (a clock stepped back), 50 Hz".into(),
        heartbeats_lost: heard["out_of_order"].as_u64(),
        wrongly_convicted: Some(u64::from(!heard["level"].is_null())),
        ..Default::default()
    }
    .report();
}

/// With the key: a restart backwards is heard again; once the peer is dead, heartbeats of the
/// epochs it was heard in before (a stale one, and the one before the last) are replayed byte
/// for byte (the tag is a function of the header) and revive nothing; a real restart does.
#[test]
fn with_the_key_a_replayed_epoch_revives_nothing_and_a_real_restart_does() {
    require_root();
    let pair = NetnsPair::new(161);
    let dir = TempDir::new("hbmback");
    let key = dir.0.join("hb.key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = key.display().to_string();
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([7]),
            "--auth-key-file",
            &key,
            "--sweep-interval",
            "10ms",
        ],
    );
    let signed = |incarnation: Option<u64>, count: Option<u32>| {
        let mut extra = vec!["--auth-key-file".to_string(), key.clone()];
        if let Some(inc) = incarnation {
            extra.extend(["--incarnation".into(), inc.to_string()]);
        }
        if let Some(n) = count {
            extra.extend(["--count".into(), n.to_string()]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        sender(&pair, 7, "20ms", &extra)
    };
    // Two epochs an attacker records: one from 100 s ago, then one from a clock 20 s ahead.
    let (stale, ahead) = (unix_now() - 100, unix_now() + 20);
    run_ok(signed(Some(stale), Some(20)));
    run_ok(signed(Some(ahead), Some(20)));
    // The clock is corrected and the sender restarts: its incarnation is now, lower than the
    // one before, and it is heard again.
    let live = spawn(signed(None, None));
    let heard = wait_for(
        Duration::from_secs(10),
        "peer 7 heard after the step back",
        || {
            let p = peer(&agent, 7);
            (p["incarnation"].as_u64() < Some(ahead) && count(&p, "heartbeats") >= 50).then_some(p)
        },
    );
    assert_eq!(count(&heard, "out_of_order"), 0, "{heard}");
    assert_eq!(count(&heard, "restarts"), 2, "{heard}");
    // It dies, and is convicted.
    drop(live);
    let dead = wait_for(Duration::from_secs(10), "peer 7 convicted", || {
        let p = peer(&agent, 7);
        (p["level"].as_f64() >= Some(8.0)).then_some(p)
    });
    // The recorded epochs, replayed: refused, every one.
    for epoch in [stale, ahead] {
        run_ok(signed(Some(epoch), Some(20)));
    }
    let after = peer(&agent, 7);
    assert_eq!(
        count(&after, "heartbeats"),
        count(&dead, "heartbeats"),
        "a replay was recorded: {after}"
    );
    assert_eq!(
        count(&after, "out_of_order"),
        count(&dead, "out_of_order") + 40,
        "{after}"
    );
    assert!(after["level"].as_f64() >= Some(8.0), "revived: {after}");
    // A real restart: a new incarnation of now, heard again.
    let _again = spawn(signed(None, None));
    let back = wait_for(Duration::from_secs(10), "peer 7 heard again", || {
        let p = peer(&agent, 7);
        (count(&p, "heartbeats") >= count(&after, "heartbeats") + 10 && p["level"].is_null())
            .then_some(p)
    });
    assert_eq!(count(&back, "restarts"), 3, "{back}");
    integration_tests::attack::AttackRow {
        attack: "recorded signed epochs replayed after the peer died",
        load: "2 epochs x 20 heartbeats, byte for byte, with --auth-key-file".into(),
        wrongly_convicted: Some(count(&after, "heartbeats") - count(&dead, "heartbeats")),
        ..Default::default()
    }
    .report();
}
