//! The detection engine end to end: a sender in one namespace stops, a subscriber on the
//! agent's socket sees the suspicion climb through every level in order, then the recovery
//! when the sender comes back; the suspect set, forgetting, and offline replay.

use std::{process::Command, time::Duration};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, events_until, sender, spawn},
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

#[test]
fn a_stopped_sender_climbs_every_level_in_order_then_recovers() {
    require_root();
    let pair = NetnsPair::new(20);
    let dir = TempDir::new("hbmdet");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([5]),
            "--levels",
            "1,3,8",
            "--sweep-interval",
            "10ms",
        ],
    );
    let send = spawn(sender(&pair, 5, "20ms", &["--incarnation", "1"]));
    let steady = wait_for(Duration::from_secs(15), "50 heartbeats of peer 5", || {
        let peer = &agent.ask(json!({"op": "peer", "id": 5}))["peer"];
        (peer["heartbeats"].as_u64().unwrap() >= 50 && peer["level"].is_null())
            .then(|| peer.clone())
    });
    // Subscribed once the stream is steady: a listed peer is judged from its admission, so
    // a sender that took longer to start than the bootstrap estimate's first level (165 ms,
    // easily, on a loaded machine) was rightly suspected before its first heartbeat, and
    // recovered with it; that start is not what this test is about.
    let mut watcher = agent.subscribe();
    drop(send); // SIGKILL: the sender dies mid-stream

    let suspects = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["event"] == "suspect" && e["id"] == 5)
            .count()
    };
    let events = events_until(&mut watcher, Duration::from_secs(10), |e| suspects(e) == 3);
    let suspicion: Vec<&Value> = events.iter().filter(|e| e["event"] == "suspect").collect();
    let levels: Vec<f64> = suspicion
        .iter()
        .map(|e| e["level"].as_f64().unwrap())
        .collect();
    assert_eq!(levels, vec![1.0, 3.0, 8.0], "{events:#?}");
    let mut last_silence = 0.0;
    for e in &suspicion {
        assert!(
            e["phi"].as_f64().unwrap() >= e["level"].as_f64().unwrap(),
            "{e}"
        );
        let silence = e["silence_ms"].as_f64().unwrap();
        assert!(silence >= last_silence, "{e}");
        last_silence = silence;
        assert!(
            e["at"].as_u64().unwrap() > 1_700_000_000_000,
            "at is Unix ms: {e}"
        );
    }

    // The suspect set at the top level holds exactly this peer, with phi over the threshold.
    let reply = agent.ask(json!({"op": "suspects"}));
    assert_eq!(reply["threshold"], json!(8.0));
    let set = reply["suspects"].as_array().unwrap();
    assert_eq!(set.len(), 1, "{reply}");
    assert_eq!(set[0]["id"], json!(5));
    assert!(set[0]["phi"].as_f64().unwrap() >= 8.0);
    assert_eq!(set[0]["level"], json!(8.0));

    // A restarted sender (new incarnation): one recovery, from the highest level reached.
    let _send = spawn(sender(&pair, 5, "20ms", &["--incarnation", "2"]));
    let events = events_until(&mut watcher, Duration::from_secs(10), |e| {
        e.iter().any(|e| e["event"] == "recover")
    });
    let recover = events.iter().find(|e| e["event"] == "recover").unwrap();
    assert_eq!(recover["id"], json!(5));
    assert_eq!(recover["level"], json!(8.0));
    assert!(
        recover["silence_ms"].as_f64().unwrap() >= last_silence,
        "{recover}"
    );
    let peer = &wait_for(
        Duration::from_secs(10),
        "peer 5 heard in incarnation 2 and below every level",
        || {
            let peer = agent.ask(json!({"op": "peer", "id": 5}))["peer"].clone();
            (peer["incarnation"] == json!(2) && peer["level"].is_null()).then_some(peer)
        },
    );
    // This kill's conviction and its end: one more of each than before it (a slow start may
    // have counted one already, see above).
    let (qos, before) = (&peer["qos"], &steady["qos"]);
    let more = |key: &str| qos[key].as_u64().unwrap() - before[key].as_u64().unwrap();
    assert_eq!(more("s_transitions"), 1, "{peer} after {steady}");
    assert_eq!(more("mistakes"), 1, "{peer} after {steady}");
    assert!(qos["mistake_total_ms"].as_f64().unwrap() > 0.0, "{peer}");
    assert!(
        agent.ask(json!({"op": "suspects"}))["suspects"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn silent_peers_are_suspected_and_can_be_forgotten() {
    require_root();
    let pair = NetnsPair::new(21);
    let dir = TempDir::new("hbmdet");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1, 2]),
            "--sweep-interval",
            "10ms",
        ],
    );
    let mut watcher = agent.subscribe();
    let _send = spawn(sender(&pair, 1, "20ms", &["--incarnation", "1"]));
    // Peer 2 never speaks: its silence runs from admission against the bootstrap estimate
    // (mean 100 ms, deviation 25 ms), so it crosses phi 8 after about 240 ms.
    events_until(&mut watcher, Duration::from_secs(10), |e| {
        e.iter()
            .any(|e| e["event"] == "suspect" && e["id"] == 2 && e["level"] == 8.0)
    });
    let set: Vec<u64> = agent.ask(json!({"op": "suspects", "threshold": 8}))["suspects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(set, vec![2]);
    let low = agent.ask(json!({"op": "suspects", "threshold": 0.000001}));
    assert_eq!(
        low["suspects"].as_array().unwrap().len(),
        2,
        "everyone has some suspicion: {low}"
    );

    assert_eq!(
        agent.ask(json!({"op": "forget", "id": 2})),
        json!({"ok": true, "forgotten": 2})
    );
    let events = events_until(&mut watcher, Duration::from_secs(5), |e| {
        e.iter().any(|e| e["event"] == "forget")
    });
    assert_eq!(
        events.iter().find(|e| e["event"] == "forget").unwrap()["id"],
        json!(2)
    );
    let ids = agent.peer_ids();
    assert_eq!(ids, vec![1]);
    let again = agent
        .client()
        .request(&json!({"op": "forget", "id": 2}))
        .unwrap();
    assert_eq!(again, json!({"ok": false, "error": "unknown peer 2"}));
    assert_eq!(
        agent.ask(json!({"op": "stats"}))["stats"]["peers"],
        json!(1)
    );
}

fn replay(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(monitor_bin())
        .arg("replay")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn replay_compares_a_fixed_timeout_with_phi_on_a_generated_trace() {
    let dir = TempDir::new("hbmreplay");
    let (ok, trace, _) = replay(&["--generate", "gc-pause", "--count", "1200", "--seed", "3"]);
    assert!(ok);
    let path = dir.0.join("gc.trace");
    std::fs::write(&path, &trace).unwrap();
    let path = path.display().to_string();
    let (ok, out, err) = replay(&[
        &path,
        "--detector",
        "fixed:timeout_ms=1400",
        "--detector",
        "phi:model=akka,threshold=8,pause_ms=2000",
        "--json",
    ]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    let detectors = report["detectors"].as_array().unwrap();
    assert_eq!(detectors.len(), 2);
    assert_eq!(detectors[0]["spec"], json!("fixed:timeout_ms=1400"));
    assert!(
        detectors[1]["spec"]
            .as_str()
            .unwrap()
            .starts_with("phi:model=akka,threshold=8,")
    );
    for d in detectors {
        assert!(
            d["detection_ms"].as_f64().is_some(),
            "a crash is always detected here: {d}"
        );
        let accuracy = d["query_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&accuracy), "{d}");
    }
    // The table form names both detectors.
    let (ok, table, _) = replay(&[&path, "-d", "fixed:timeout_ms=1400", "-d", "phi"]);
    assert!(ok);
    assert!(
        table.contains("fixed:timeout_ms=1400") && table.contains("phi:model=normal"),
        "{table}"
    );

    let bad = dir.0.join("bad.trace");
    std::fs::write(&bad, "100\n200\n150\n").unwrap();
    let (ok, _, err) = replay(&[&bad.display().to_string(), "-d", "phi"]);
    assert!(!ok);
    assert!(err.contains("bad.trace:3:"), "{err}");
    let (ok, _, err) = replay(&[&path, "-d", "phi:model=gauss"]);
    assert!(!ok);
    assert!(err.contains("gauss"), "{err}");
}

#[test]
fn a_slow_subscriber_is_told_what_it_missed_and_stalls_no_one() {
    require_root();
    let pair = NetnsPair::new(22);
    let dir = TempDir::new("hbmlag");
    let peers = 30_000u64;
    // Nobody sends: every peer climbs all three levels, 90,000 events in three bursts about a
    // second apart (bootstrap estimate 2 s +/- 0.5 s), more than a subscriber's 65,536 buffer.
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file(1..=peers),
            "--capacity",
            "30000",
            "--first-interval-ms",
            "2000",
        ],
    );
    let mut fast = agent.subscribe();
    let mut slow = agent.subscribe();

    let mut suspects = 0u64;
    fast.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    while suspects < 3 * peers {
        let event: Value = serde_json::from_str(&fast.read_line().unwrap()).unwrap();
        assert_ne!(
            event["event"],
            json!("lagged"),
            "a subscriber that keeps up lost events"
        );
        if event["event"] == "suspect" {
            suspects += 1;
        }
        if suspects == peers {
            // Mid-storm, with one subscriber not reading at all, the agent still answers.
            assert_eq!(agent.ask(json!({"op": "stats"}))["ok"], json!(true));
        }
    }

    // The one that read nothing finds, among what it can still read, how much it missed.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut missed = 0;
    let mut received = 0u64;
    while missed == 0 {
        let event: Value = serde_json::from_str(&slow.read_line().unwrap()).unwrap();
        received += 1;
        if event["event"] == "lagged" {
            missed = event["missed"].as_u64().unwrap();
        }
        assert!(received <= 3 * peers, "never told it lagged");
    }
    assert!(missed > 0);
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["subscribers"], json!(2), "{stats}");
}

#[test]
fn after_the_agent_itself_stalls_new_suspicions_wait() {
    require_root();
    let pair = NetnsPair::new(23);
    let dir = TempDir::new("hbmstall");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1]),
            "--stall-bound",
            "300ms",
            "--first-interval-ms",
            "2000",
        ],
    );
    let mut watcher = agent.subscribe();
    // Freeze the agent (as a paused VM or an overloaded host would) past the peer's phi 8
    // crossing (2 s + 5.6 x 500 ms = 4.8 s after admission: time enough for a loaded machine
    // to get from the start to the stop before it).
    unsafe { libc::kill(agent.pid() as i32, libc::SIGSTOP) };
    // The freeze itself is under test: a sleep, not a wait for something.
    std::thread::sleep(Duration::from_millis(5500));
    unsafe { libc::kill(agent.pid() as i32, libc::SIGCONT) };
    let resumed = std::time::Instant::now();
    let events = events_until(&mut watcher, Duration::from_secs(15), |e| {
        e.iter()
            .any(|e| e["event"] == "suspect" && e["level"] == 8.0)
    });
    // The agent noticed its own stall and held new suspicions for about as long.
    assert!(
        resumed.elapsed() >= Duration::from_millis(2000),
        "suspected {:?} after resuming: {events:?}",
        resumed.elapsed()
    );
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert!(stats["stalls"].as_u64().unwrap() >= 1, "{stats}");
}
