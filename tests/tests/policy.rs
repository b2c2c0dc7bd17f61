//! The example consumer (examples/python/hb_policy.py) against the real agent: started after a
//! peer was convicted it acts on the suspect set, lowest level first; it then acts on events
//! in order and once each, runs the recovery when the peer is heard again, and after the
//! agent restarts it reconnects by itself and follows the new agent's events. Stopped while
//! the agent raises more events than a subscriber's buffer holds, it is told `lagged` and
//! still acts on every peer exactly once.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, ChildGuard, TempDir, sender, spawn},
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor_common::wire::DEFAULT_PORT;
use serde_json::json;

fn policy_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python/hb_policy.py")
}

fn level(agent: &AgentProcess, id: u64) -> Option<f64> {
    agent.ask(json!({"op": "peer", "id": id}))["peer"]["level"].as_f64()
}

/// Points the consumer's socket path at `agent`'s socket, as a restarted agent would take it.
fn link(path: &Path, agent: &AgentProcess) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(agent.socket(), path).expect("symlink to the agent's socket");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn the_example_policy_acts_once_per_level_resyncs_and_reconnects() {
    require_root();
    let pair = NetnsPair::named(45, ["hbpa", "hbpb"], ["hbpva", "hbpvb"]);
    let dir = TempDir::new("hbpolicy");
    let peers = dir.peers_file([1, 2]);
    let socket = dir.0.join("monitor.sock");
    let actions = dir.0.join("actions");
    let out = dir.0.join("out");

    let agent = AgentProcess::start(&pair, &["--peers", &peers]);
    link(&socket, &agent);
    let _one = spawn(sender(&pair, 1, "20ms", &[]));
    let mut two = spawn(sender(&pair, 2, "20ms", &[]));
    wait_for(Duration::from_secs(10), "both peers heard", || {
        let heard =
            |id: u64| agent.ask(json!({"op": "peer", "id": id}))["peer"]["heartbeats"].as_u64();
        (heard(1)? > 20 && heard(2)? > 20).then_some(())
    });
    // Peer 2 is convicted before the consumer starts.
    let _ = two.0.kill();
    let _ = two.0.wait();
    wait_for(Duration::from_secs(10), "peer 2 at level 8", || {
        (level(&agent, 2) == Some(8.0)).then_some(())
    });

    let write = |what: &str| format!("echo {what} >> {}", actions.display());
    let mut cmd = Command::new("python3");
    cmd.arg(policy_script())
        .args(["--socket", socket.to_str().unwrap(), "--retry", "0.2"])
        .arg("--on")
        .arg(format!("3={}", write("drain $HB_PEER")))
        .arg("--on")
        .arg(format!("8={}", write("evict $HB_PEER phi=$HB_PHI")))
        .arg("--on-recover")
        .arg(write("recover $HB_PEER from $HB_LEVEL"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::inherit());
    let _policy: ChildGuard = spawn(cmd);

    // From the suspect set: both of peer 2's levels, lowest first, with phi past 8.
    let lines = |n: usize| {
        let text = read(&actions);
        (text.lines().count() >= n).then(|| text.lines().map(str::to_string).collect::<Vec<_>>())
    };
    let got = wait_for(Duration::from_secs(10), "peer 2 acted on", || lines(2));
    assert_eq!(got[0], "drain 2", "{got:?}");
    let (what, phi) = got[1].split_once(" phi=").expect("evict with phi");
    assert_eq!(what, "evict 2", "{got:?}");
    assert!(phi.parse::<f64>().unwrap() >= 8.0, "{got:?}");

    // From events: peer 1's levels in order; then peer 2 heard again, its recovery.
    drop(_one);
    let got = wait_for(Duration::from_secs(10), "peer 1 acted on", || lines(4));
    assert_eq!(got[2], "drain 1", "{got:?}");
    assert!(got[3].starts_with("evict 1 phi="), "{got:?}");
    let _two = spawn(sender(&pair, 2, "20ms", &[]));
    let got = wait_for(Duration::from_secs(10), "peer 2 recovered", || lines(5));
    assert_eq!(got[4], "recover 2 from 8", "{got:?}");
    let _one = spawn(sender(&pair, 1, "20ms", &[]));
    let got = wait_for(Duration::from_secs(10), "peer 1 recovered", || lines(6));
    assert_eq!(got[5], "recover 1 from 8", "{got:?}");

    // The agent restarts: the consumer says so once, reconnects, and follows the new agent.
    agent.stop();
    wait_for(Duration::from_secs(10), "the outage noticed", || {
        read(&out).contains("not following").then_some(())
    });
    let agent = AgentProcess::start(&pair, &["--peers", &peers]);
    link(&socket, &agent);
    let connections = || {
        read(&out)
            .lines()
            .filter(|l| l.starts_with("following "))
            .count()
    };
    wait_for(Duration::from_secs(10), "reconnected", || {
        (connections() == 2).then_some(())
    });
    wait_for(Duration::from_secs(10), "both peers heard again", || {
        let heard =
            |id: u64| agent.ask(json!({"op": "peer", "id": id}))["peer"]["heartbeats"].as_u64();
        (heard(1)? > 20 && heard(2)? > 20).then_some(())
    });
    drop(_two);
    let got = wait_for(Duration::from_secs(10), "peer 2 acted on again", || {
        lines(8)
    });
    assert_eq!(got[6], "drain 2", "{got:?}");
    assert!(got[7].starts_with("evict 2 phi="), "{got:?}");
    let log = read(&out);
    assert_eq!(log.matches("not following").count(), 1, "{log}");
    // Every action once: nothing but the eight lines above.
    assert_eq!(read(&actions).lines().count(), 8, "{}", read(&actions));
}

/// `monitor loadgen` of `peers` peers from `first_id` at 1 Hz, from the pair's `b` side.
fn loadgen(pair: &NetnsPair, first_id: u64, peers: u64) -> ChildGuard {
    let mut cmd = NetnsPair::command_in(&pair.ns_b, &monitor_bin());
    cmd.args([
        "loadgen",
        "--to",
        &format!("{}:{DEFAULT_PORT}", pair.addr_a),
    ])
    .args([
        "--first-id",
        &first_id.to_string(),
        "--peers",
        &peers.to_string(),
    ])
    .args(["--rate", "1", "--duration", "300s"])
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    spawn(cmd)
}

/// The ids in the consumer's lines after `from` that start with `prefix`, each once (asserted).
fn acted_on(out: &Path, from: usize, prefix: &str) -> Vec<u64> {
    let text = read(out);
    let mut ids: Vec<u64> = text[from.min(text.len())..]
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "a peer acted on twice: {prefix}");
    ids
}

#[test]
fn a_consumer_that_lagged_still_acts_on_every_peer_once() {
    require_root();
    // While the consumer is stopped: B's suspicions fill what the socket holds, A (convicted
    // before) is heard again, and C's suspicions, more than a subscriber's buffer (65,536),
    // push A's recoveries out of it. Only a resync can tell the consumer that A recovered.
    const A: u64 = 1_000;
    const B: u64 = 3_000;
    const C: u64 = 23_000;
    let pair = NetnsPair::named(46, ["hbpla", "hbplb"], ["hbplva", "hbplvb"]);
    let dir = TempDir::new("hbpolicylag");
    let out = dir.0.join("out");
    // 1 Hz senders, and a first interval to match (no suspicion before a second heartbeat).
    // 27,000 peers from one loadgen address: the share per source is lifted.
    let agent = AgentProcess::start(
        &pair,
        &[
            "--first-interval-ms",
            "1000",
            "--admit-per-source",
            "unlimited",
        ],
    );
    let group_a = loadgen(&pair, 1, A);
    let group_b = loadgen(&pair, A + 1, B);
    let group_c = loadgen(&pair, A + B + 1, C);
    let stats = || agent.ask(json!({"op": "stats"}))["stats"].clone();
    let events = || stats()["events"].as_u64().unwrap();
    let all = A + B + C;
    wait_for(
        Duration::from_secs(30),
        "every peer admitted and heard twice",
        || {
            let s = stats();
            (s["peers"] == json!(all) && s["kernel"]["heartbeats"].as_u64()? >= 2 * all)
                .then_some(())
        },
    );

    // Print-only actions: no command to wait for, one line an action.
    let mut cmd = Command::new("python3");
    cmd.arg(policy_script())
        .args(["--socket", agent.socket().to_str().unwrap(), "--on", "8="])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::inherit());
    let policy = spawn(cmd);
    wait_for(Duration::from_secs(10), "the consumer following", || {
        read(&out).contains("following ").then_some(())
    });
    // What it printed so far (a live peer late enough to reach 8 on a busy machine) is not
    // part of what is checked.
    let start = read(&out).len();
    drop(group_a);
    wait_for(Duration::from_secs(30), "A convicted and acted on", || {
        (acted_on(&out, start, "suspect peer ").len() as u64 >= A).then_some(())
    });

    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(policy.0.id() as i32, libc::SIGSTOP) };
    let stopped = read(&out).len();
    let before = events();
    drop(group_b);
    wait_for(Duration::from_secs(30), "B's suspicions published", || {
        (events() >= before + 3 * B).then_some(())
    });
    let _group_a = loadgen(&pair, 1, A);
    wait_for(Duration::from_secs(30), "A's recoveries published", || {
        (events() >= before + 3 * B + A).then_some(())
    });
    drop(group_c);
    wait_for(Duration::from_secs(30), "C's suspicions published", || {
        (events() >= before + 3 * B + A + 3 * C).then_some(())
    });
    // SAFETY: as above.
    unsafe { libc::kill(policy.0.id() as i32, libc::SIGCONT) };

    // Every peer of A recovered and every peer of B and C acted on, each once.
    wait_for(
        Duration::from_secs(60),
        "A recovered, B and C acted on",
        || {
            (acted_on(&out, stopped, "recover peer ").len() as u64 == A
                && acted_on(&out, stopped, "suspect peer ").len() as u64 == B + C)
                .then_some(())
        },
    );
    assert!(read(&out).contains("lagged: "), "never told it lagged");
    assert_eq!(
        acted_on(&out, stopped, "recover peer "),
        (1..=A).collect::<Vec<_>>()
    );
    assert_eq!(
        acted_on(&out, stopped, "suspect peer "),
        (A + 1..=all).collect::<Vec<_>>()
    );
}
