//! The Rust client's `Subscriber` (monitor::serving::client) against the real agent: it
//! follows a restarted agent by itself (one `Disconnected`, then a `Resync` with reason
//! `Reconnected` and the new agent's events); with `every_peer` its resync holds every peer
//! (what `monitor haproxy-agent` and `track-file` keep); and a subscriber that read nothing while the
//! agent raised more events than its buffer holds gets, in place of what it missed, a
//! `Resync` with reason `Lagged` holding the whole suspect set.

use std::{
    path::Path,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender, spawn},
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor::serving::client::{Event, ResyncReason, Subscriber, Update};
use serde_json::json;

/// Points the subscriber's socket path at `agent`'s socket, as a restarted agent would take it.
fn link(path: &Path, agent: &AgentProcess) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(agent.socket(), path).expect("symlink to the agent's socket");
}

/// The subscriber on a thread of its own: every update it yields, in order, on a channel;
/// it starts reading past the first update only when `go` is sent.
fn follow(socket: &Path) -> (mpsc::Receiver<Update>, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let subscriber =
        Subscriber::new(socket).retry(Duration::from_millis(50), Duration::from_millis(200));
    thread::spawn(move || {
        let mut first = true;
        for update in subscriber {
            let update = update.expect("the agent speaks our protocol");
            if tx.send(update).is_err() {
                return;
            }
            if first {
                first = false;
                if go_rx.recv().is_err() {
                    return;
                }
            }
        }
    });
    (rx, go_tx)
}

/// The next update within `limit`.
fn next(rx: &mpsc::Receiver<Update>, limit: Duration, what: &str) -> Update {
    rx.recv_timeout(limit)
        .unwrap_or_else(|e| panic!("no update within {limit:?} while waiting for {what}: {e}"))
}

/// Reads updates until every peer of `ids` is at `level`: in the resync `resync` (what the
/// agent said at the subscription), or by a `suspect` event since.
fn until_suspected(
    rx: &mpsc::Receiver<Update>,
    resync: &Update,
    ids: &[u64],
    level: f64,
) -> Vec<Update> {
    let Update::Resync { suspects, .. } = resync else {
        panic!("not a resync: {resync:?}");
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let mut left: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| {
            !suspects
                .iter()
                .any(|p| p.id == *id && p.level == Some(level))
        })
        .collect();
    while !left.is_empty() {
        let limit = deadline.saturating_duration_since(Instant::now());
        let update = next(rx, limit, &format!("suspicions of {left:?} at {level}"));
        if let Update::Event(Event::Suspect(s)) = &update
            && s.level == level
        {
            left.retain(|&id| id != s.id);
        }
        assert!(
            !matches!(update, Update::Disconnected(_) | Update::Resync { .. }),
            "{update:?} while following a live agent"
        );
        seen.push(update);
    }
    seen
}

#[test]
fn a_subscriber_follows_a_restarted_agent_by_itself() {
    require_root();
    let pair = NetnsPair::named(88, ["hbrsa", "hbrsb"], ["hbrsva", "hbrsvb"]);
    let dir = TempDir::new("hbrsub");
    let socket = dir.0.join("monitor.sock");
    // Peer 1 sends, peer 2 never does: it climbs every level.
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([1, 2])]);
    let _peer1 = spawn(sender(&pair, 1, "20ms", &[]));
    link(&socket, &agent);

    let (rx, go) = follow(&socket);
    let first = next(&rx, Duration::from_secs(10), "the first resync");
    let Update::Resync { reason, stats, .. } = &first else {
        panic!("the first update is not a resync: {first:?}");
    };
    assert_eq!(*reason, ResyncReason::Connected);
    assert_eq!(stats.peers, 2, "{stats:?}");
    // With every_peer, a resync holds the peers below every level too.
    wait_for(Duration::from_secs(10), "peer 1 heard", || {
        let peer = agent.ask(json!({"op": "peer", "id": 1}))["peer"].clone();
        (peer["heartbeats"].as_u64()? > 5 && peer["level"].is_null()).then_some(())
    });
    let every = Subscriber::new(&socket).every_peer().next_update().unwrap();
    let Update::Resync { suspects, .. } = &every else {
        panic!("the first update is not a resync: {every:?}");
    };
    let ids: Vec<u64> = suspects.iter().map(|p| p.id).collect();
    assert_eq!(ids, [1, 2], "{every:?}");
    assert!(suspects[0].level.is_none(), "peer 1 is heard: {every:?}");
    go.send(()).unwrap();
    until_suspected(&rx, &first, &[2], 8.0);

    // The agent dies and another takes its socket path, watching a third silent peer too.
    drop(agent);
    // Events the old agent raised before it died may come first (peer 1's, if its sender
    // started late); then the outage, said once.
    loop {
        match next(&rx, Duration::from_secs(10), "the outage") {
            Update::Disconnected(_) => break,
            Update::Event(_) => {}
            other => panic!("{other:?} before the outage"),
        }
    }
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([1, 2, 3])]);
    link(&socket, &agent);
    let update = next(
        &rx,
        Duration::from_secs(10),
        "the resync with the new agent",
    );
    let Update::Resync { reason, stats, .. } = &update else {
        panic!("after the outage, not a resync: {update:?}");
    };
    assert_eq!(*reason, ResyncReason::Reconnected, "{update:?}");
    assert_eq!(stats.peers, 3, "not the new agent's stats: {stats:?}");
    // And it follows the new agent's events: peers 2 and 3 convicted again, by it.
    until_suspected(&rx, &update, &[2, 3], 8.0);
}

#[test]
fn a_subscriber_that_lagged_gets_the_whole_suspect_set_again() {
    require_root();
    let pair = NetnsPair::named(87, ["hbrla", "hbrlb"], ["hbrlva", "hbrlvb"]);
    let dir = TempDir::new("hbrlag");
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
    let (rx, go) = follow(agent.socket());
    let first = next(&rx, Duration::from_secs(10), "the first resync");
    assert!(
        matches!(
            &first,
            Update::Resync { reason: ResyncReason::Connected, suspects, .. } if suspects.is_empty()
        ),
        "{first:?}"
    );
    // It reads nothing while every peer is convicted.
    wait_for(Duration::from_secs(60), "every suspicion published", || {
        let stats = agent.ask(json!({"op": "stats"}))["stats"].clone();
        (stats["events"].as_u64()? >= 3 * peers).then_some(())
    });
    go.send(()).unwrap();
    let mut events = 0u64;
    let (missed, suspects) = loop {
        match next(&rx, Duration::from_secs(20), "the lagged resync") {
            Update::Event(_) => events += 1,
            Update::Resync {
                reason: ResyncReason::Lagged { missed },
                suspects,
                ..
            } => break (missed, suspects),
            other => panic!("{other:?} after {events} events, before the lagged resync"),
        }
        assert!(events <= 3 * peers, "never told it lagged");
    };
    assert!(missed > 0);
    assert!(
        events + missed <= 3 * peers,
        "{events} events read and {missed} missed: more than the agent raised"
    );
    // What was missed is in the resync: every peer, at the highest level.
    assert_eq!(suspects.len() as u64, peers);
    assert!(suspects.iter().all(|p| p.level == Some(8.0)));
    let ids: Vec<u64> = suspects.iter().map(|p| p.id).collect();
    assert_eq!(ids, (1..=peers).collect::<Vec<_>>());
}
