//! Nothing the agent does for itself stalls its socket: an admission storm of 50,000 first
//! heartbeats and detector changes at 50,000 peers (each re-estimates every peer) go on while
//! another client's `peer` and `stats` keep answering.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::json;

/// Answer times of `request` asked one after another on one connection for `during`.
fn answer_times(
    socket: &std::path::Path,
    request: &serde_json::Value,
    during: Duration,
) -> Vec<Duration> {
    let stream = UnixStream::connect(socket).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut times = Vec::new();
    let until = Instant::now() + during;
    let mut line = String::new();
    while Instant::now() < until {
        let asked = Instant::now();
        writeln!(writer, "{request}").expect("send");
        line.clear();
        reader.read_line(&mut line).expect("answer");
        times.push(asked.elapsed());
        assert!(line.starts_with('{'), "{line}");
        std::thread::sleep(Duration::from_millis(5));
    }
    times
}

fn p99(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[(times.len() * 99).div_ceil(100) - 1]
}

#[test]
fn an_admission_storm_and_detector_changes_at_fifty_thousand_peers_do_not_stall_the_socket() {
    require_root();
    let pair = NetnsPair::new(180);
    let dir = TempDir::new("hbmbusy");
    let config = |min_std: u32| dir.config_file(&format!("min-std-ms = {min_std}\n"));
    let config_path = config(50);
    let agent = AgentProcess::start(
        &pair,
        &["--config", &config_path, "--admit-per-source", "unlimited"],
    );
    // 50,000 peers' first heartbeats at once, then their heartbeats, for the whole test.
    let load = std::thread::spawn({
        let (ns_b, target) = (pair.ns_b.clone(), format!("{}:18498", pair.addr_a));
        move || {
            let args: Vec<String> = [
                "--to",
                &target,
                "--peers",
                "50000",
                "--rate",
                "2",
                "--duration",
                "25s",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            integration_tests::soak::loadgen(&monitor_bin(), &ns_b, &args)
        }
    });
    let peer = json!({"op": "peer", "id": 1});
    let stats = json!({"op": "stats"});
    // The storm: answers while the peers are admitted.
    let storm = std::thread::scope(|s| {
        let peers = s.spawn(|| answer_times(agent.socket(), &peer, Duration::from_secs(4)));
        let stats = s.spawn(|| answer_times(agent.socket(), &stats, Duration::from_secs(4)));
        (peers.join().unwrap(), stats.join().unwrap())
    });
    wait_for(Duration::from_secs(20), "50,000 peers admitted", || {
        (agent.ask(json!({"op": "stats"}))["stats"]["peers"] == json!(50_000)).then_some(())
    });
    // Detector changes, one after another, each re-estimating 50,000 peers.
    let changes = std::thread::scope(|s| {
        let hup = s.spawn(|| {
            for k in 0..8 {
                config(if k % 2 == 0 { 60 } else { 50 });
                agent.sighup();
                let want = k + 1;
                wait_for(Duration::from_secs(10), "the reload applied", || {
                    (agent.ask(json!({"op": "stats"}))["stats"]["config_reloads"].as_u64()
                        >= Some(want))
                    .then_some(())
                });
            }
        });
        let peers = s.spawn(|| answer_times(agent.socket(), &peer, Duration::from_secs(3)));
        let stats = s.spawn(|| answer_times(agent.socket(), &stats, Duration::from_secs(3)));
        hup.join().unwrap();
        (peers.join().unwrap(), stats.join().unwrap())
    });
    for (what, (peers, stats)) in [
        ("an admission storm at 50,000 peers", storm),
        ("detector changes at 50,000 peers", changes),
    ] {
        let (n, p, s) = (peers.len() + stats.len(), p99(peers), p99(stats));
        println!("during {what}: {n} answers, peer p99 {p:?}, stats p99 {s:?}");
        integration_tests::attack::AttackRow {
            attack: what,
            load: if what.contains("storm") {
                "50,000 first heartbeats at once, then 2 Hz each".into()
            } else {
                "8 SIGHUPs changing the detector, one after another".into()
            },
            query_p99_ms: Some(p.max(s).as_secs_f64() * 1e3),
            agent_rss_mib: Some(integration_tests::attack::rss_mib(agent.pid())),
            ..Default::default()
        }
        .report();
        assert!(p < Duration::from_millis(50), "{what}: peer p99 {p:?}");
        assert!(s < Duration::from_millis(50), "{what}: stats p99 {s:?}");
    }
    drop(agent);
    let _ = load.join();
}
