//! Restarts without loss: with --pin-path the program keeps recording while no agent runs, even
//! after SIGKILL; the next agent adopts the pinned state with its windows, raises no false
//! suspicion, and refuses pinned state it would misread.

use std::time::Duration;

use aya::maps::{Array, Map, MapData};
use integration_tests::{
    agent_process::{
        AgentProcess, Bpffs, TempDir, detach, refused_start, sender, spawn, xdp_attached,
    },
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor_common::maps::{META_MAP, PinnedMeta};
use serde_json::{Value, json};

#[test]
fn a_killed_agent_is_replaced_without_losing_windows_or_raising_suspicion() {
    require_root();
    let pair = NetnsPair::new(60);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let dir = TempDir::new("hbmpeers");
    let peers = dir.peers_file([7]);
    let args = [
        "--peers",
        &peers,
        "--pin-path",
        &pins_arg,
        "--sweep-interval",
        "10ms",
    ];

    let first = AgentProcess::start(&pair, &args);
    let _send = spawn(sender(&pair, 7, "10ms", &["--incarnation", "1"]));
    let before = wait_for(
        Duration::from_secs(20),
        "a full window before the kill",
        || {
            let peer = first.ask(json!({"op": "peer", "id": 7}))["peer"].clone();
            (peer["samples"] == json!(128)).then_some(peer)
        },
    );
    drop(first); // SIGKILL: no chance to clean up
    // The kernel records on its own while no agent runs: this stretch is under test.
    std::thread::sleep(Duration::from_millis(800));
    assert!(xdp_attached(&pair), "the program must survive its agent");

    let second = AgentProcess::start(&pair, &args);
    let mut watcher = second.subscribe();
    let after = second.ask(json!({"op": "peer", "id": 7}))["peer"].clone();
    let (h0, h1) = (
        before["heartbeats"].as_u64().unwrap(),
        after["heartbeats"].as_u64().unwrap(),
    );
    assert!(
        h1 >= h0 + 50,
        "the kernel kept recording while no agent ran: {h0} -> {h1}"
    );
    assert_eq!(after["samples"], json!(128), "the window survived: {after}");
    assert_eq!(after["lost"], json!(0), "{after}");
    let mean = after["mean_ms"].as_f64().unwrap();
    assert!((8.0..=13.0).contains(&mean), "{after}");
    let stats = &second.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["xdp_mode"], json!("adopted"));
    assert_eq!(stats["peers"], json!(1));

    // No burst of false suspicion: a second of events holds nothing about the live peer.
    watcher
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    while let Ok(line) = watcher.read_line() {
        let event: Value = serde_json::from_str(&line).unwrap();
        assert_ne!(
            event["event"],
            json!("suspect"),
            "false suspicion after adoption: {event}"
        );
    }

    // A clean stop leaves it attached too; removal is explicit.
    assert!(second.stop().success());
    assert!(xdp_attached(&pair));
    let out = detach(&pair, &pins_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!xdp_attached(&pair), "detach removes the program");
    assert!(!pins.exists());
    let again = detach(&pair, &pins_arg);
    assert!(
        !again.status.success(),
        "nothing left to detach is an error"
    );
}

#[test]
fn pinned_state_of_another_layout_or_other_settings_is_refused() {
    require_root();
    let pair = NetnsPair::new(61);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let agent = AgentProcess::start(&pair, &["--pin-path", &pins_arg]);
    assert!(agent.stop().success());

    let run = |extra: &[&str]| refused_start(&pair, &[&["--pin-path", &pins_arg], extra].concat());
    let err = run(&["--port", "9000"]);
    assert!(
        err.contains("port = 18498") && err.contains("--port 9000"),
        "{err}"
    );

    // Pretend a future build pinned it.
    let map = Map::from_map_data(MapData::from_pin(pins.join(META_MAP)).unwrap()).unwrap();
    let mut meta: Array<MapData, PinnedMeta> = map.try_into().unwrap();
    let mut value = meta.get(&0, 0).unwrap();
    value.layout_version = 999;
    meta.set(0, value, 0).unwrap();
    let err = run(&[]);
    assert!(
        err.contains("layout v999") && err.contains("monitor detach"),
        "{err}"
    );
    assert!(xdp_attached(&pair), "refusing touches nothing");

    assert!(detach(&pair, &pins_arg).status.success());
}
