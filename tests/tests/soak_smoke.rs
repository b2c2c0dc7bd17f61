//! A short soak (the long one is `cargo xtask soak`): many peers, some of them churning, for
//! 20 s. Every silent period is detected at phi 8, no steady peer is ever suspected at it,
//! no slot leaks and no heartbeat is lost; also when the agent itself is starved of CPU.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, loadgen},
    cgroup::CpuLimit,
    netns::NetnsPair,
    require_root, soak, unique_name,
};
use serde_json::{Value, json};

/// `peers` peers, a `churn` fraction of them silent a quarter of the time in 2 s periods, for
/// 20 s, against `agent`: the verdict over the run (less its first second and last half
/// second) and the agent's stats after it.
fn soak_against(agent: &AgentProcess, pair: &NetnsPair, peers: u64, churn: &str) -> Value {
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, watcher) = soak::watch(agent.socket(), 8.0, stop.clone());
    let started = soak::unix_ms();
    let report = loadgen(
        pair,
        18498,
        &[
            "--peers",
            &peers.to_string(),
            "--rate",
            "10",
            "--duration",
            "20s",
            "--churn",
            churn,
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
    // A quarter of the churners silent per 2 s period, about 8 whole periods checked.
    let churners = report.churn.as_ref().expect("churn").churners;
    assert!(verdict.deaths >= churners * 3 / 2, "{verdict:?}");
    assert!(verdict.ok(), "{verdict:?}");
    assert!(
        verdict.recoveries >= verdict.deaths - churners,
        "{verdict:?}"
    );

    let stats = agent.ask(json!({"op": "stats"}))["stats"].clone();
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
    stats
}

#[test]
fn churn_is_detected_and_steady_peers_are_never_suspected() {
    require_root();
    let pair = NetnsPair::new(70);
    let dir = TempDir::new("hbmsoak");
    let peers_file = dir.peers_file(1..=2000);
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
    soak_against(&agent, &pair, 2000, "0.05");
}

/// An agent on a host that starves it (a CPU quota it shares with a busy neighbour, as a
/// container's or a systemd unit's CPUQuota= would): it runs in bursts, with gaps of most of
/// the quota's period between them. The kernel still stamps every heartbeat on time, so
/// silences read late are still measured right: no live peer is convicted, and every death
/// still is.
#[test]
fn a_starved_agent_still_detects_every_death_and_convicts_no_live_peer() {
    require_root();
    let pair = NetnsPair::new(71);
    let dir = TempDir::new("hbmstarve");
    let peers_file = dir.peers_file(1..=500);
    let agent = AgentProcess::start(&pair, &["--peers", &peers_file, "--capacity", "500"]);
    // 20 ms of CPU per 100 ms for the agent and a busy loop together.
    let limit = CpuLimit::create(&unique_name("hbmstarve"), 20_000, 100_000).expect("a CPU quota");
    let busy = integration_tests::agent_process::spawn({
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "while :; do :; done"]);
        cmd
    });
    limit
        .add(busy.0.id())
        .expect("the busy loop into the cgroup");
    limit.add(agent.pid()).expect("the agent into the cgroup");
    let stats = soak_against(&agent, &pair, 500, "0.1");
    let throttled = limit.throttled_periods().expect("cpu.stat");
    println!("starved agent: throttled in {throttled} periods of 100 ms; stats {stats}");
    // The starving happened: the quota ran out period after period (20 s are 200 periods).
    assert!(throttled >= 100, "throttled in only {throttled} periods");
}
