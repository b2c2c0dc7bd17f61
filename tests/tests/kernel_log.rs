//! `monitor run --kernel-log`: the XDP program's own lines (aya-log) reach the agent's log under
//! the target `kernel` when asked for, and nothing is written when off (the default).

use std::{
    io::Read,
    net::UdpSocket,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::TempDir, http::in_netns, monitor_bin, netns::NetnsPair, require_root,
};
use monitor::serving::client::Client;
use serde_json::json;

/// Starts the agent with `extra`, sends one malformed heartbeat (3 bytes to the heartbeat
/// port) and one from an unknown peer, waits until the kernel has counted both, stops the
/// agent and returns what it logged.
fn agent_log_after_bad_input(extra: &[&str], subnet: u8) -> String {
    let pair = NetnsPair::new(subnet);
    let dir = TempDir::new("hbmklog");
    let socket = dir.0.join("agent.sock");
    let log = dir.0.join("agent.log");
    let mut agent = Command::new("ip")
        .args(["netns", "exec", &pair.ns_a])
        .arg(monitor_bin())
        .args([
            "run",
            "--iface",
            &pair.iface_a,
            "--no-auto-admit",
            "--socket",
        ])
        .arg(&socket)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stats = || -> Option<serde_json::Value> {
        let reply = Client::connect(&socket)
            .ok()?
            .request(&json!({"op": "stats"}))
            .ok()?;
        Some(reply["stats"].clone())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats().is_none() {
        assert!(Instant::now() < deadline, "the agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let to = format!("{}:18498", pair.addr_a);
    in_netns(&pair.ns_b, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.send_to(b"bad", &to).unwrap();
        let heartbeat = monitor_common::wire::HeartbeatHeader::new(77, 1, 1).to_bytes();
        udp.send_to(&heartbeat, &to).unwrap();
    })
    .unwrap();
    while {
        let s = stats().unwrap();
        s["kernel"]["malformed"] != json!(1) || s["kernel"]["unknown_peer"] != json!(1)
    } {
        assert!(
            Instant::now() < deadline,
            "the kernel did not count the packets: {:?}",
            stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The log ring is read as soon as it is written; give the forwarder its turn, then stop.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    agent.wait().unwrap();
    let mut text = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn kernel_lines_appear_at_the_level_asked_for() {
    require_root();
    let warn = agent_log_after_bad_input(&["--kernel-log", "warn"], 70);
    assert!(
        warn.lines()
            .any(|l| l.contains(" kernel]") && l.contains("malformed heartbeat to port 18498")),
        "{warn}"
    );
    assert!(
        !warn.contains("unknown peer 77"),
        "debug lines at warn: {warn}"
    );
    let debug = agent_log_after_bad_input(&["--kernel-log", "debug"], 71);
    assert!(debug.contains("heartbeat of unknown peer 77"), "{debug}");
    let off = agent_log_after_bad_input(&[], 72);
    assert!(!off.contains(" kernel]"), "kernel lines while off: {off}");
}
