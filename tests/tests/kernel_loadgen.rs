//! `monitor loadgen --kernel`: the frames its XDP program stamps are heartbeats the monitor's
//! program records (signed and unsigned; through BPF_PROG_TEST_RUN, frame by frame), and a
//! short run across a veth pair sends exactly what the agent then records, peer by peer.

use std::time::Duration;

use integration_tests::{
    agent_process::{AgentProcess, TempDir, loadgen},
    fixture::{Fixture, XDP_DROP, XDP_PASS},
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor::{
    kernel::counters::CounterTotals,
    peer::loadgen::{
        LoadgenConfig,
        frame::{self, Path},
        kernel::{self, Generator},
    },
};
use monitor_common::{
    auth::{AuthKey, KEY_CURRENT},
    config::{XDP_FLAG_REQUIRE_AUTH, XdpConfig},
    loadgen::{LG_SENT, LG_SILENT, PAYLOAD_OFFSET},
    wire::{FLAG_AUTH, HEADER_LEN, HeartbeatHeader},
};
use serde_json::{Value, json};

const XDP_ABORTED: u32 = 0;
const XDP_TX: u32 = 3;
const FIRST_ID: u64 = 100;
const PEERS: u64 = 5;
const INCARNATION: u32 = 9;
const KEY: AuthKey = AuthKey::from_bytes([0x5a; 16]);

fn config(key: Option<AuthKey>) -> LoadgenConfig {
    LoadgenConfig {
        to: "10.0.0.1:18498".parse().unwrap(),
        peers: PEERS,
        first_id: FIRST_ID,
        stride: 1,
        rate_hz: 10.0,
        jitter: Duration::ZERO,
        duration: Duration::from_secs(1),
        kill_fraction: 0.0,
        kill_after: Duration::ZERO,
        churn_fraction: 0.0,
        churn_period: Duration::from_secs(1),
        incarnation: INCARNATION,
        key,
        kernel: true,
        gso: true,
        pack: 1,
    }
}

fn path() -> Path {
    Path {
        iface: "unused".into(),
        ifindex: 1,
        src_mac: [2, 0, 0, 0, 0, 2],
        dst_mac: [2, 0, 0, 0, 0, 1],
        src: "10.0.0.2:40000".parse().unwrap(),
        dst: "10.0.0.1:18498".parse().unwrap(),
    }
}

/// The generator loaded (not attached) with `config`'s plan, and its template frame.
fn generator(config: &LoadgenConfig) -> (Generator, Vec<u8>) {
    require_root();
    let template = frame::template(&path(), config.incarnation, config.key.is_some());
    let plan = kernel::plan(config, path().src_mac, &template);
    (
        Generator::load(&plan, None).expect("load the generator"),
        template,
    )
}

fn header_of(frame: &[u8]) -> HeartbeatHeader {
    assert_eq!(frame.len(), PAYLOAD_OFFSET + HEADER_LEN);
    HeartbeatHeader::decode(&frame[PAYLOAD_OFFSET..]).expect("a valid heartbeat")
}

fn only(f: impl FnOnce(&mut CounterTotals)) -> CounterTotals {
    let mut c = CounterTotals::default();
    f(&mut c);
    c
}

/// Stamps heartbeats 0..n, checks each is the plan's (peer n mod PEERS, sequence n / PEERS)
/// and that the monitor's program (`monitor`) records every one.
fn stamped_frames_are_recorded(key: Option<AuthKey>, mut monitor: Fixture) {
    let (mut generator, template) = generator(&config(key));
    let n = 4 * PEERS;
    for i in 0..n {
        let (verdict, frame) = generator.stamp(&template, i).expect("stamp");
        assert_eq!(verdict, XDP_TX, "heartbeat {i} is transmitted");
        // Only the heartbeat's id, sequence and tag differ from the template.
        assert_eq!(frame[..PAYLOAD_OFFSET + 8], template[..PAYLOAD_OFFSET + 8]);
        let header = header_of(&frame);
        assert_eq!(
            (header.peer_id(), header.seq(), header.incarnation()),
            (FIRST_ID + i % PEERS, i / PEERS, INCARNATION)
        );
        assert_eq!(header.flags, if key.is_some() { FLAG_AUTH } else { 0 });
        if key.is_none() {
            assert_eq!(header.tag, [0; 8]);
        }
        assert_eq!(monitor.run(&frame), XDP_DROP, "heartbeat {i} is consumed");
    }
    assert_eq!(monitor.counters(), only(|c| c.heartbeats = n));
    for id in FIRST_ID..FIRST_ID + PEERS {
        let record = monitor.record(id);
        assert_eq!(record.heartbeats, 4, "peer {id}");
        assert_eq!((record.lost, record.out_of_order), (0, 0), "peer {id}");
    }
    assert_eq!(generator.state(LG_SENT).unwrap(), n);
}

fn peers() -> Vec<u64> {
    (FIRST_ID..FIRST_ID + PEERS).collect()
}

#[test]
fn unsigned_frames_are_heartbeats_the_monitor_records() {
    stamped_frames_are_recorded(None, Fixture::new(XdpConfig::DEFAULT, &peers()));
}

fn requiring(key: AuthKey) -> Fixture {
    let mut fx = Fixture::new(
        XdpConfig {
            flags: XDP_FLAG_REQUIRE_AUTH,
            ..XdpConfig::DEFAULT
        },
        &peers(),
    );
    fx.loaded.maps.auth_keys.set(KEY_CURRENT, key, 0).unwrap();
    fx
}

#[test]
fn signed_frames_carry_the_tag_the_monitor_verifies() {
    stamped_frames_are_recorded(Some(KEY), requiring(KEY));
    // The tag is the key's: a monitor holding another key refuses every frame.
    let (mut generator, template) = generator(&config(Some(KEY)));
    let mut other = requiring(AuthKey::from_bytes([0x33; 16]));
    for i in 0..PEERS {
        let (_, frame) = generator.stamp(&template, i).unwrap();
        other.run(&frame);
    }
    assert_eq!(other.counters(), only(|c| c.auth_failures = PEERS));
}

#[test]
fn killed_and_churning_peers_heartbeats_are_dropped_and_counted() {
    // 10 peers at 10 Hz: 100 heartbeats a second. Peers 0 and 1 stop at 0.5 s (n = 50); the
    // top 4 churn, one at a time, in periods of 1 s (100 heartbeats).
    let config = LoadgenConfig {
        peers: 10,
        kill_fraction: 0.2,
        kill_after: Duration::from_millis(500),
        churn_fraction: 0.4,
        churn_period: Duration::from_secs(1),
        ..config(None)
    };
    let (mut generator, template) = generator(&config);
    let mut sent_ids = Vec::new();
    for n in [0u64, 1, 6, 7, 50, 51, 52, 106, 107] {
        let (verdict, frame) = generator.stamp(&template, n).unwrap();
        if verdict == XDP_TX {
            sent_ids.push(header_of(&frame).peer_id() - FIRST_ID);
        } else {
            assert_eq!(verdict, XDP_DROP, "heartbeat {n}");
        }
    }
    // Period 0 (n < 100): churner 0 (index 6) is silent, churner 1 (index 7) sends; from
    // n = 50 indices 0 and 1 are silent, 2 sends; period 1: churner 1 is silent, 0 sends.
    assert_eq!(sent_ids, vec![0, 1, 7, 2, 6]);
    assert_eq!(generator.state(LG_SENT).unwrap(), 5);
    assert_eq!(generator.state(LG_SILENT).unwrap(), 4);
}

#[test]
fn frames_the_generator_did_not_make_pass_untouched() {
    let (mut generator, template) = generator(&config(None));
    // A frame from another host (its own source address), as the attached program sees what
    // the interface receives.
    let mut foreign = template.clone();
    foreign[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    let (verdict, out) = generator.stamp(&foreign, 3).unwrap();
    assert_eq!((verdict, out), (XDP_PASS, foreign));
    // With the generator's own source but cut short of the heartbeat: never sent.
    let (verdict, _) = generator.stamp(&template[..PAYLOAD_OFFSET + 8], 3).unwrap();
    assert_eq!(verdict, XDP_ABORTED);
    assert_eq!(generator.state(LG_SENT).unwrap(), 0);
}

#[test]
fn the_agent_records_exactly_what_the_kernel_generator_sent() {
    require_root();
    let pair = NetnsPair::named(123, ["hbklga", "hbklgb"], ["hbkva", "hbkvb"]);
    let dir = TempDir::new("hbklgpeers");
    let peers = 200u64;
    if let Some(refusal) = live_frames_refused(&pair) {
        println!("not run: this kernel refuses live frames: {refusal}");
        return;
    }
    // Before the agent: nothing on the other end of the veth takes XDP frames, so it drops
    // every one, and the report says so rather than counting them sent.
    let dropped = serde_json::to_value(loadgen(
        &pair,
        18498,
        &[
            "--kernel",
            "--peers",
            "10",
            "--rate",
            "10",
            "--duration",
            "500ms",
        ],
    ))
    .unwrap();
    assert_eq!(dropped["kernel"]["sent_counted_by_interface"], json!(true));
    assert_eq!(dropped["sent"], json!(0), "{dropped}");
    let handed_over = 50 - dropped["kernel"]["unsent"].as_u64().unwrap();
    assert_eq!(dropped["send_errors"], json!(handed_over), "{dropped}");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file(1..=peers)]);
    let report = serde_json::to_value(loadgen(
        &pair,
        18498,
        &[
            "--kernel",
            "--peers",
            &peers.to_string(),
            "--rate",
            "20",
            "--duration",
            "2s",
        ],
    ))
    .unwrap();
    let kernel = &report["kernel"];
    assert_eq!(kernel["planned"], json!(peers * 20 * 2), "{report}");
    assert_eq!(kernel["silent"], json!(0));
    let sent = report["sent"].as_u64().unwrap();
    assert_eq!(report["send_errors"], json!(0), "{report}");
    // What the schedule left unsent (a machine too busy to keep up) is reported, not lost.
    assert_eq!(sent + kernel["unsent"].as_u64().unwrap(), peers * 40);
    assert!(sent > 0);
    let stats = wait_for(Duration::from_secs(10), "every frame sent recorded", || {
        let stats = agent.ask(json!({"op": "stats"}))["stats"].clone();
        (stats["kernel"]["heartbeats"].as_u64().unwrap() >= sent).then_some(stats)
    });
    assert_eq!(
        stats["kernel"]["heartbeats"].as_u64().unwrap(),
        sent,
        "{stats}"
    );
    for key in [
        "unknown_peer",
        "malformed",
        "auth_failures",
        "duplicates",
        "out_of_order",
    ] {
        assert_eq!(stats["kernel"][key], json!(0), "{key}: {stats}");
    }
    // Peer by peer: heartbeat n is peer n mod peers, sequence n / peers, n from 0 to sent.
    let listed = agent.ask(json!({"op": "peers"}));
    let by_id: Vec<&Value> = listed["peers"].as_array().expect("peers").iter().collect();
    assert_eq!(by_id.len() as u64, peers);
    for peer in by_id {
        let index = peer["id"].as_u64().unwrap() - 1;
        let expected = sent / peers + u64::from(index < sent % peers);
        assert_eq!(peer["heartbeats"], json!(expected), "{peer}");
        assert_eq!(peer["last_seq"], json!(expected - 1), "{peer}");
        assert_eq!(peer["lost"], json!(0), "{peer}");
    }
}

/// Whether this kernel refuses live frames (BPF_F_TEST_XDP_LIVE_FRAMES) to root: some do (a
/// sandboxed 6.18 build answers EPERM while ordinary BPF_PROG_RUN works). There the generator
/// must fail at once, name the refusal and send nothing; any other failure fails the test.
fn live_frames_refused(pair: &NetnsPair) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pair.ns_b])
        .arg(integration_tests::monitor_bin())
        .args(["loadgen", "--kernel", "--to"])
        .arg(format!("{}:18498", pair.addr_a))
        .args(["--peers", "1", "--rate", "10", "--duration", "100ms"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawn loadgen");
    if out.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("live frames")
            && stderr.contains("os error 1)")
            && stderr.contains("without --kernel"),
        "loadgen --kernel failed otherwise than by the kernel's refusal: {stderr}"
    );
    assert!(out.stdout.is_empty(), "a refused run reports no sending");
    Some(stderr.trim().to_string())
}
