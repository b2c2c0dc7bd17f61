//! A short run of the benchmark's machinery, for correctness only: the load generator's counts
//! match what the kernel recorded, killed peers are all detected through every level, and each
//! probe returns a measurement. No timing is asserted (the machines are shared and noisy).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    bench,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

/// The agent's metrics address, inside its namespace.
const METRICS: &str = "127.0.0.1:9464";

fn loadgen(pair: &NetnsPair, port: u16, args: &[&str]) -> Value {
    serde_json::to_value(integration_tests::agent_process::loadgen(pair, port, args)).unwrap()
}

#[test]
fn loadgen_counts_match_the_kernel_and_every_killed_peer_is_detected() {
    require_root();
    let pair = NetnsPair::new(40);
    let dir = TempDir::new("hbmsmoke");
    let peers = dir.peers_file(1..=500);
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &peers,
            "--sweep-interval",
            "20ms",
            "--metrics-addr",
            METRICS,
        ],
    );
    let mut watcher = agent.subscribe();

    let report = loadgen(
        &pair,
        18498,
        &[
            "--peers",
            "500",
            "--rate",
            "10",
            "--duration",
            "2s",
            "--kill",
            "0.1",
            "--after",
            "1s",
        ],
    );
    assert_eq!(report["peers"], json!(500));
    assert_eq!(report["killed"], json!(50));
    assert_eq!(report["send_errors"], json!(0));
    // 64 heartbeats a message, cut by the kernel (UDP GSO): each still its own datagram of
    // exactly one heartbeat, or the kernel's count below would not match.
    assert_eq!(report["sent_by"], json!("udp-gso"));
    // How late it sent, against a quarter of the interval.
    let lateness = &report["lateness"];
    assert_eq!(lateness["slack_ms"], json!(25.0), "10 Hz: {report}");
    assert!(lateness["late"].is_u64(), "{report}");
    assert!(lateness["max_late_ms"].as_f64() >= Some(0.0), "{report}");
    let sent = report["sent"].as_u64().unwrap();
    assert!(sent > 0);
    // Everything sent has crossed the veth once the kernel counted that many (any more would
    // fail the equality below).
    let stats = &wait_for(
        Duration::from_secs(10),
        "every heartbeat sent recorded",
        || {
            let stats = agent.ask(json!({"op": "stats"}))["stats"].clone();
            (stats["kernel"]["heartbeats"].as_u64().unwrap() >= sent).then_some(stats)
        },
    );
    assert_eq!(
        stats["kernel"]["heartbeats"].as_u64().unwrap(),
        sent,
        "every heartbeat sent is recorded: {stats}"
    );
    assert_eq!(stats["kernel"]["unknown_peer"], json!(0));

    // Every killed peer (ids 1..=50) climbs to the top level.
    let mut top: HashMap<u64, Vec<f64>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while (1..=50).any(|id| !top.get(&id).is_some_and(|l| l.contains(&8.0))) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "killed peers never reached level 8: {top:?}"
        );
        watcher.set_read_timeout(Some(left)).unwrap();
        let event: Value = serde_json::from_str(&watcher.read_line().unwrap()).unwrap();
        // A recovery is noted as level 0: a live peer may cross level 1 now and then (a one
        // in ten chance of a heartbeat that late is what level 1 means), and a heartbeat in
        // flight at the kill may end a first suspicion; what follows the last recovery is the
        // climb the kill caused.
        let id = event["id"].as_u64();
        match event["event"].as_str() {
            Some("suspect") => top
                .entry(id.unwrap())
                .or_default()
                .push(event["level"].as_f64().unwrap()),
            Some("recover") => top.entry(id.unwrap()).or_default().push(0.0),
            _ => {}
        }
    }
    for id in 1..=50u64 {
        let levels = &top[&id];
        let last_climb: Vec<f64> = levels
            .iter()
            .copied()
            .rev()
            .take_while(|&l| l != 0.0)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert_eq!(last_climb, vec![1.0, 3.0, 8.0], "peer {id}: {levels:?}");
    }

    // The socket probe gets an ok reply for every request it times, and the agent timed each
    // of them too (the test asked nothing else of those ops).
    let latency = bench::socket_latency(&agent.socket, 500, 50, Some((&pair.ns_a, METRICS)));
    assert_eq!(latency.peer_us.count, 50);
    assert_eq!(latency.suspects_us.count, 100, "at least 100 for a p99");
    let agent_peer = latency.agent_peer_us.expect("the agent's timing of peer");
    let agent_suspects = latency
        .agent_suspects_us
        .expect("the agent's timing of suspects");
    assert_eq!((agent_peer.count, agent_suspects.count), (50, 100));
    assert!(agent_suspects.p50_at_most <= agent_suspects.p99_at_most);
}

#[test]
fn the_userspace_receiver_counts_what_loadgen_sent() {
    require_root();
    let pair = NetnsPair::new(41);
    // Port 7947: no XDP program on this pair, the datagrams reach the socket.
    let receiver = std::thread::spawn({
        let ns = pair.ns_a.clone();
        let addr = format!("{}:7947", pair.addr_a);
        move || {
            let out = NetnsPair::command_in(&ns, &integration_tests::bench_bin())
                .args(["receiver", "--bind", &addr, "--duration-s", "2"])
                .output()
                .expect("spawn hbm-bench");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_str::<Value>(
                String::from_utf8_lossy(&out.stdout).lines().last().unwrap(),
            )
            .unwrap()
        }
    });
    // Send only once the receiver's socket is bound (`ss` lists it in the namespace).
    wait_for(
        Duration::from_secs(10),
        "the receiver bound to 7947",
        || {
            let out = NetnsPair::command_in(&pair.ns_a, std::path::Path::new("ss"))
                .args(["-Hunl", "sport = :7947"])
                .output()
                .expect("run ss");
            (!String::from_utf8_lossy(&out.stdout).trim().is_empty()).then_some(())
        },
    );
    let report = loadgen(
        &pair,
        7947,
        &["--peers", "100", "--rate", "10", "--duration", "1s"],
    );
    let received = receiver.join().unwrap();
    assert_eq!(
        received["received"], report["sent"],
        "{received} vs {report}"
    );
    assert_eq!(received["peers"], json!(100));
}

#[test]
fn the_floors_due_bucket_is_where_its_floor_passes_and_the_due_scan_takes_it() {
    require_root();
    // The kernel's half of an agent told when to look (`--touch split-due`): one heartbeat of
    // peer 7 stores, at slot 6, the 4.2 ms bucket 138 ms on (the default floor: the watch is
    // left zero).
    let bucket = |ns: u64| (ns >> 22) as u16;
    let before = monitor::kernel::clock::monotonic_ns();
    let ebpf = bench::floor_after_one_heartbeat(bench::Touch::SplitDue);
    let after = monitor::kernel::clock::monotonic_ns();
    // 32 buckets a line: slot 6 is in the first.
    let due: aya::maps::Array<_, [u16; 32]> =
        aya::maps::Array::try_from(ebpf.map("FLOOR_DUE").expect("FLOOR_DUE")).expect("array");
    let line = due.get(&0, 0).expect("line 0");
    let stored = line[6];
    let (low, high) = (bucket(before + 138_000_000), bucket(after + 138_000_000));
    assert!(
        stored.wrapping_sub(low) <= high.wrapping_sub(low),
        "{stored} outside {low}..={high}"
    );
    assert_eq!(line[5], 0, "a peer not heard");
    // Scanned every 10 ms for 400 ms from now, the bucket comes, and peer 7 is taken once (the
    // six slots never stored hold bucket 0, taken too if the run happens to pass it).
    let scan = bench::due_scan_floor(
        7,
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(400),
    );
    drop(ebpf);
    assert!((1..=7).contains(&scan.taken), "{scan:?}");
    assert!(scan.scans > 0 && scan.cpu_percent.is_finite(), "{scan:?}");
}

#[test]
fn in_process_probes_return_measurements() {
    require_root();
    // The scan floor maps the newest LAST_HEARD in the kernel: this one while it is held (or
    // a newer one another test loaded meanwhile), and scans it at its pace.
    let loaded = monitor::kernel::loaded::LoadedProgram::load(
        &monitor_common::config::XdpConfig::DEFAULT,
        1000,
    )
    .expect("load");
    let floor = bench::scan_floor(
        monitor_common::last_heard::LAST_HEARD_MAP,
        1000,
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(300),
    );
    drop(loaded);
    assert!(floor.peers > 0 && floor.peers <= 1000, "{floor:?}");
    // Paced at 10 ms for 300 ms (fewer if the host stalls the test: no pace is asserted).
    assert!((1..=31).contains(&floor.scans), "{floor:?}");
    assert!(
        floor.cpu_percent.is_finite() && floor.scan_us_p50 > 0.0,
        "{floor:?}"
    );
    assert!(bench::prog_test_run_ns(1000) > 0.0);
    let sweep = bench::sweep_timings(1000);
    assert_eq!(sweep.peers, 1000);
    assert!(
        sweep.mmap_read_ms.is_finite()
            && sweep.aya_iter_ms.is_finite()
            && sweep.agent_sweep_ms.is_finite()
    );
}
