//! XDP in skb (generic) mode (`--xdp-mode skb`, and where `auto` falls back to it): the program
//! runs on the kernel's skb after GRO, so a sender's UDP GSO batch that crossed a veth uncut, or
//! datagrams merged by UDP GRO, reach it as one frame of many heartbeats. Each is recorded, also
//! by a pinned program while no agent runs.

use std::time::{Duration, Instant};

use aya::maps::{Map, MapData, PerCpuArray};
use integration_tests::{
    agent_process::{AgentProcess, Bpffs, TempDir, detach},
    batches::{assert_every_heartbeat_counted, send_batches},
    netns::NetnsPair,
    require_root,
};
use monitor_common::maps::{COUNTERS_MAP, Counters};
use serde_json::json;

#[test]
fn skb_mode_xdp_counts_every_heartbeat_of_a_gso_batch() {
    require_root();
    let pair = NetnsPair::named(84, ["hbgxa", "hbgxb"], ["hbgva", "hbgvb"]);
    // Run statistics while this fd lives: the program's run count says batches reached it.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable bpf stats");
    let dir = TempDir::new("hbgxgso");
    let agent = AgentProcess::start(
        &pair,
        &["--xdp-mode", "skb", "--peers", &dir.peers_file(1..=500)],
    );
    assert_eq!(
        agent.ask(json!({"op": "stats"}))["stats"]["xdp_mode"],
        json!("skb")
    );
    let sent = send_batches(&pair);
    assert_every_heartbeat_counted(&agent, sent, "skb-mode XDP hook");
}

/// The program outlives its agent (`--pin-path`), and so must its batch path: the program it
/// calls for a batch's heartbeats after the first sits in a program array, which the kernel
/// empties when the last user reference to it closes, unless it is pinned.
#[test]
fn a_pinned_skb_mode_program_counts_batches_while_no_agent_runs() {
    require_root();
    let pair = NetnsPair::named(85, ["hbgpa", "hbgpb"], ["hbgwa", "hbgwb"]);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let dir = TempDir::new("hbgxpin");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--xdp-mode",
            "skb",
            "--peers",
            &dir.peers_file(1..=500),
            "--pin-path",
            &pins_arg,
        ],
    );
    drop(agent); // SIGKILL: the pins alone keep the program and its maps
    let counters = || {
        let map = Map::from_map_data(MapData::from_pin(pins.join(COUNTERS_MAP)).unwrap()).unwrap();
        let counters: PerCpuArray<MapData, Counters> = map.try_into().unwrap();
        let per_cpu = counters.get(&0, 0).unwrap();
        (
            per_cpu.iter().map(|c| c.heartbeats).sum::<u64>(),
            per_cpu.iter().map(|c| c.malformed).sum::<u64>(),
        )
    };
    let (before, _) = counters();
    let sent = send_batches(&pair);
    // As in the test above: wait for the count expected, or for anything malformed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let counted = loop {
        let (heartbeats, malformed) = counters();
        if heartbeats - before >= sent || malformed > 0 || Instant::now() > deadline {
            break (heartbeats, malformed);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        counted,
        (before + sent, 0),
        "(heartbeats, malformed) counted by the pinned program for {sent} heartbeats sent"
    );
    let out = detach(&pair, &pins_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!pins.exists(), "detach removes every pin");
}
