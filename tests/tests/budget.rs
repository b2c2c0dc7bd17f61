//! `monitor run --budget` end to end: a sender in one namespace stops, and the agent raises
//! every level in order, the highest at the peer's own deadline, near the budget.

use std::time::Duration;

use integration_tests::{
    agent_process::{AgentProcess, TempDir, events_so_far, events_until, realtime, sender, spawn},
    http::get_in,
    netns::NetnsPair,
    require_root,
    soak::unix_ms,
    wait_for,
};
use serde_json::{Value, json};

#[test]
fn a_stopped_sender_is_convicted_at_its_deadline() {
    require_root();
    let pair = NetnsPair::named(124, ["hbmbudgeta", "hbmbudgetb"], ["hbvbua", "hbvbub"]);
    let budget_ms = 300.0;
    let deadline = convicted_after(&pair, budget_ms, "20ms", &["--sweep-interval", "10ms"]);
    // Level 8 at the deadline: the aim (0.99 of the budget) moved by the last heartbeat's
    // offset from the sender's schedule, never past the aim with no credit to spend. The
    // budget bounds the mean of the deadlines over heartbeats (tests in
    // monitor/tests/budget_replay.rs); one deadline moves with its last offset, a few ms on a
    // veth, more when a loaded machine delays the sender. The window is not full after 60
    // heartbeats, so the allocation over time has saved nothing yet (a full window on a calm
    // path with no loss counted may save up to 0.12 of the aim, one with loss 0.3:
    // docs/tuning.md, "Allocated over time").
    assert!(
        (0.85 * budget_ms..=1.15 * budget_ms).contains(&deadline.crossed_after_ms),
        "{deadline:?}"
    );
    assert!(deadline.raised_late_ms < 10.0, "{deadline:?}");
}

/// A budget shorter than the scan interval (40 ms against the default 50 ms scans): the
/// crossings are raised at their time by the due passes between scans, not by the next scan.
/// Level 8, the budget's own level, is checked: its crossing comes about 39 ms after the last
/// heartbeat, so the due passes that follow the peer between scans have it armed (the scans
/// alone would raise it 0-50 ms late), and it is the budget's deadline. And the fast sender is
/// never suspected while it lives (`convicted_after`): the model once put levels 1 and 3 at
/// the very heartbeat of this 5 ms sender (its 50 ms deviation floor, wider than the budget,
/// moved the curve before it) and level 8 at 48-49 ms (1.2 B: the first-interval estimate's
/// samples read as arrivals bent the schedule's line), and suspected it 19 times in its
/// first 300 ms (docs/tuning.md, "Fast senders with short budgets").
#[test]
fn a_budget_shorter_than_the_scan_is_met_between_scans() {
    require_root();
    let pair = NetnsPair::named(125, ["hbmbudgetc", "hbmbudgetd"], ["hbvbuc", "hbvbud"]);
    let budget_ms = 40.0;
    let deadline = convicted_after(&pair, budget_ms, "5ms", &[]);
    assert!(
        deadline.raised_late_ms < 10.0,
        "level 8 raised {} ms after its crossing, with scans 50 ms apart: {deadline:?}",
        deadline.raised_late_ms
    );
    // At the aim (0.99 B), or the aim moved by the last heartbeat's offset from the schedule
    // where a delay of the sender's made the rule anchor on it: a few ms at most on a loaded
    // machine. (The first-interval estimate's samples once moved it to 48.4 ms.)
    assert!(
        (0.9 * budget_ms..=1.1 * budget_ms).contains(&deadline.crossed_after_ms),
        "{deadline:?}"
    );
}

/// A sender slower than its budget: every 150 ms under `--budget 100ms`. No deadline meets
/// that budget without convicting the live sender at its heartbeats, and the detector used to
/// do just that: levels 1, 3 and 8 after each heartbeat, a recovery at the next. Once most of
/// its last 8 intervals are over the aim (judged from its first: its 2nd heartbeat), the
/// peer's view says `budget_unmet` and the deadline is past its own schedule, every level at
/// it (docs/tuning.md, "A budget the peer's schedule cannot meet"): over the next 20
/// heartbeats the live sender is convicted at no more than one.
#[test]
fn a_sender_slower_than_its_budget_is_not_convicted_at_every_heartbeat() {
    require_root();
    let pair = NetnsPair::named(126, ["hbmbudgete", "hbmbudgetf"], ["hbvbue", "hbvbuf"]);
    let dir = TempDir::new("hbmbudget");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([9]),
            "--budget",
            "100ms",
            "--levels",
            "1,3,8",
            "--metrics-addr",
            "127.0.0.1:9464",
        ],
    );
    let mut watcher = agent.subscribe();
    let _send = spawn(realtime(sender(&pair, 9, "150ms", &["--incarnation", "1"])));
    let peer = || agent.ask(json!({"op": "peer", "id": 9}))["peer"].clone();
    let unmet = wait_for(
        Duration::from_secs(15),
        "peer 9 reported over its budget",
        || {
            let view = peer();
            (view["budget_unmet"] == json!(true)).then_some(view)
        },
    );
    // Its 2nd heartbeat, read by a poll every 20 ms (one heartbeat late on a loaded machine).
    let said_at = unmet["heartbeats"].as_u64().unwrap();
    assert!(said_at <= 3, "`budget_unmet` only at heartbeat {said_at}");
    // Before: its first intervals, each heartbeat convicted at the aim (99 ms) and cleared by
    // the next; the last of those recoveries is published once the next heartbeat is read,
    // so the count starts one on.
    let from = said_at + 1;
    wait_for(
        Duration::from_secs(5),
        "one more heartbeat of peer 9",
        || (peer()["heartbeats"].as_u64().unwrap() >= from).then_some(()),
    );
    let before = events_so_far(&mut watcher, Duration::from_millis(20));
    wait_for(
        Duration::from_secs(15),
        "20 more heartbeats of peer 9",
        || {
            let view = peer();
            assert_eq!(view["budget_unmet"], json!(true), "{view}");
            (view["heartbeats"].as_u64().unwrap() >= from + 20).then_some(())
        },
    );
    let after = events_so_far(&mut watcher, Duration::from_millis(20));
    // The gauge an operator alerts on counts it.
    let (status, metrics) = get_in(&pair.ns_a, "127.0.0.1:9464", "/metrics", &[]).unwrap();
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "heartbeat_monitor_peers_budget_unmet 1"),
        "{metrics}"
    );
    let recovered = after
        .iter()
        .filter(|e| e["event"] == "recover" && e["id"] == 9)
        .count();
    println!(
        "--budget 100ms, a sender every 150ms: `budget_unmet` from heartbeat {}, {} events up to heartbeat {from}, {} in the 20 heartbeats after, {recovered} recoveries",
        from - 1,
        before.len(),
        after.len()
    );
    assert!(
        recovered <= 1,
        "the live sender was convicted and cleared {recovered} times in 20 heartbeats: {after:#?}"
    );
    // Every level at the deadline: none crossed alone, below the top, while it lived.
    let partial = after
        .iter()
        .filter(|e| e["event"] == "suspect" && e["id"] == 9 && e["level"] != json!(8.0));
    assert!(partial.count() <= 2 * recovered, "{after:#?}");
}

/// When level 8 came for a stopped sender: the silence at which phi crossed it, and how long
/// after that crossing the event was raised (the event's `at`, whole ms, less its
/// `crossed_at`).
#[derive(Debug)]
struct Conviction {
    crossed_after_ms: f64,
    raised_late_ms: f64,
}

/// Runs an agent with `--budget budget_ms`, levels 1, 3 and 8 and `extra` flags, a sender of
/// peer 9 every `interval` that is killed after 60 heartbeats; checks that the sender was
/// never suspected, at any level, while it lived, and that every level is raised in order
/// after its death, and returns when level 8 came.
///
/// The premise is a path that delivers the live sender's heartbeats on schedule, which the
/// real-time sender alone cannot promise on a shared VM: the host may stop the virtual CPU
/// that sends or receives for tens of milliseconds (seen here: 43 to 60 ms gaps in a 5 ms
/// sender's arrivals, in 4 of about 20 runs, in step with the VM's steal time). A gap of the
/// budget or more is a silence the detector must report, up to conviction; no model avoids
/// it, so a run with one (a recovery from a silence at least as long as the budget, its
/// `silence_ms`) did not test the premise and is run again, up to three times. A suspicion
/// after any shorter gap is the model's mistake and fails the test at once.
fn convicted_after(pair: &NetnsPair, budget_ms: f64, interval: &str, extra: &[&str]) -> Conviction {
    let mut stalls = Vec::new();
    for _ in 0..3 {
        match run_to_conviction(pair, budget_ms, interval, extra) {
            Ok(conviction) => return conviction,
            Err(stall) => {
                println!("the path stalled the live sender (run again): {stall}");
                stalls.push(stall);
            }
        }
    }
    panic!("the path stalled the live sender in every run, no clean run to judge: {stalls:#?}");
}

/// One run of [`convicted_after`]; the recovery that shows the path stalled, if it did.
fn run_to_conviction(
    pair: &NetnsPair,
    budget_ms: f64,
    interval: &str,
    extra: &[&str],
) -> Result<Conviction, Value> {
    let dir = TempDir::new("hbmbudget");
    let budget = format!("{budget_ms}ms");
    let mut flags = vec![
        "--peers".to_string(),
        dir.peers_file([9]),
        "--budget".to_string(),
        budget,
        "--levels".to_string(),
        "1,3,8".to_string(),
    ];
    flags.extend(extra.iter().map(|f| f.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = AgentProcess::start(pair, &flags);
    let mut watcher = agent.subscribe();
    // On schedule even on a loaded machine: a 5 ms sender descheduled for 13 ms would be
    // really silent past level 1 (docs/tuning.md, "Fast senders with short budgets").
    let send = spawn(realtime(sender(pair, 9, interval, &["--incarnation", "1"])));
    // More than the 8 intervals a window needs before the schedule is read.
    wait_for(Duration::from_secs(15), "60 heartbeats of peer 9", || {
        let peer = &agent.ask(json!({"op": "peer", "id": 9}))["peer"];
        (peer["heartbeats"].as_u64().unwrap() >= 60).then_some(())
    });
    // Whole Unix ms, as the events' `at`: an event stamped earlier was raised before the kill.
    let killed_at_ms = unix_ms().floor();
    drop(send); // SIGKILL: the sender dies mid-stream

    let mut events = events_until(&mut watcher, Duration::from_secs(10), |e| {
        e.iter()
            .any(|e| e["event"] == "suspect" && e["id"] == 9 && e["level"] == json!(8.0))
    });
    // A stall that reached level 8 before the kill ends with a recovery after it: whatever
    // comes until the events go quiet for a budget and more.
    events.extend(events_so_far(
        &mut watcher,
        Duration::from_secs_f64(2.0 * budget_ms / 1e3 + 0.1),
    ));
    if let Some(stall) = events.iter().find(|e| {
        e["id"] == 9 && e["event"] == "recover" && e["silence_ms"].as_f64().unwrap() >= budget_ms
    }) {
        return Err(stall.clone());
    }
    // Every suspicion of the sender while it lived was a mistake: one raised before the kill,
    // or one its next heartbeat ended (a recover).
    let mistakes: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["id"] == 9
                && (e["event"] == "recover"
                    || (e["event"] == "suspect" && e["at"].as_f64().unwrap() < killed_at_ms))
        })
        .collect();
    assert!(
        mistakes.is_empty(),
        "--budget {budget_ms}ms, a sender every {interval}: suspected while it lived: {mistakes:#?}"
    );
    let suspicion: Vec<&Value> = events
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
    // How late level 8 was raised after its crossing (`at` is in whole ms, so this reads up
    // to 1 ms low).
    let late: Vec<f64> = suspicion
        .iter()
        .map(|e| e["at"].as_f64().unwrap() - e["crossed_at"].as_f64().unwrap())
        .collect();
    println!(
        "--budget {budget_ms}ms: levels 1, 3, 8 crossed after {crossed:?} ms of silence, raised {late:?} ms after their crossings"
    );
    let raised_late_ms = late[2];
    let peer = &agent.ask(json!({"op": "peer", "id": 9}))["peer"];
    assert!(peer["phi"].as_f64().unwrap() >= 8.0, "{peer}");
    Ok(Conviction {
        crossed_after_ms: crossed[2],
        raised_late_ms,
    })
}
