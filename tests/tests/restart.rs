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

/// An agent SIGKILLed while it held a hot line's lock (inside a reset) leaves the lock odd:
/// the kernel then drops every heartbeat of that peer as `contended`, and the next agent used
/// to spin on it. Adoption repairs such lines.
#[test]
fn a_slot_lock_left_odd_by_a_killed_agent_is_repaired_on_adoption() {
    use aya::maps::PerCpuArray;
    use monitor_common::maps::{COUNTERS_MAP, Counters, HotLine, LOCK_HELD, PEER_HOT_MAP};
    use std::os::fd::{AsFd, AsRawFd};
    require_root();
    let pair = NetnsPair::new(62);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let dir = TempDir::new("hbmpeers");
    let peers = dir.peers_file([7]);
    let capacity = 64u32;
    let args = [
        "--peers",
        &peers,
        "--pin-path",
        &pins_arg,
        "--capacity",
        "64",
    ];
    let first = AgentProcess::start(&pair, &args);
    let _send = spawn(sender(&pair, 7, "10ms", &["--incarnation", "1"]));
    wait_for(Duration::from_secs(10), "heartbeats of peer 7", || {
        let peer = first.ask(json!({"op": "peer", "id": 7}))["peer"].clone();
        (peer["heartbeats"].as_u64() >= Some(20)).then_some(())
    });
    drop(first); // SIGKILL
    // What a kill inside a line's fill or reset leaves: every hot line's lock odd.
    let state = MapData::from_pin(pins.join(PEER_HOT_MAP)).unwrap();
    let lines = monitor_common::index::lines_for(capacity) as usize;
    let bytes = (lines * size_of::<HotLine>()).next_multiple_of(4096);
    // SAFETY: a shared mapping of the pinned array, unmapped below; only lock words touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            state.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    for line in 0..lines {
        let lock = unsafe {
            &*base
                .cast::<u8>()
                .add(line * size_of::<HotLine>())
                .cast::<std::sync::atomic::AtomicU64>()
        };
        lock.fetch_or(LOCK_HELD, std::sync::atomic::Ordering::SeqCst);
    }
    unsafe { libc::munmap(base, bytes) };
    // The attack holds: the kernel drops the live peer's heartbeats.
    let counters = || {
        let map = Map::from_map_data(MapData::from_pin(pins.join(COUNTERS_MAP)).unwrap()).unwrap();
        let counters: PerCpuArray<MapData, Counters> = map.try_into().unwrap();
        let per_cpu = counters.get(&0, 0).unwrap();
        per_cpu.iter().map(|c| c.contended).sum::<u64>()
    };
    wait_for(
        Duration::from_secs(5),
        "heartbeats dropped as contended",
        || (counters() >= 20).then_some(()),
    );

    let second = AgentProcess::start(&pair, &args);
    let peer = |id: u64| second.ask(json!({"op": "peer", "id": id}))["peer"].clone();
    let contended = || second.ask(json!({"op": "stats"}))["stats"]["kernel"]["contended"].clone();
    // Repaired on adoption: its window starts again, and its heartbeats count.
    let repaired = wait_for(Duration::from_secs(10), "peer 7 recorded again", || {
        let p = peer(7);
        (p["heartbeats"].as_u64() >= Some(20) && p["level"].is_null()).then_some(p)
    });
    let before = contended();
    let more = repaired["heartbeats"].as_u64().unwrap() + 20;
    wait_for(Duration::from_secs(10), "20 more heartbeats", || {
        (peer(7)["heartbeats"].as_u64() >= Some(more)).then_some(())
    });
    assert_eq!(
        contended(),
        before,
        "heartbeats still dropped after adoption"
    );
    integration_tests::attack::AttackRow {
        attack: "an agent SIGKILLed holding slot locks (--persist)",
        load: "every slot's lock left odd, then a new agent adopts".into(),
        heartbeats_lost: Some(contended().as_u64().unwrap() - before.as_u64().unwrap()),
        wrongly_convicted: Some(u64::from(!peer(7)["level"].is_null())),
        ..Default::default()
    }
    .report();
    assert!(second.stop().success());
    let out = detach(&pair, &pins_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
