//! Heartbeats sent in batches (`monitor loadgen`'s UDP GSO sends) and the check that a hook
//! counted every one: shared by the hooks that meet a batch whole (TC, XDP in skb mode).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::{agent_process::AgentProcess, netns::NetnsPair};

/// 500 peers at 10 Hz for 2 s from `monitor loadgen`, which sends 64 heartbeats a message with
/// UDP GSO: the heartbeats sent, asserting they were sent as batches.
pub fn send_batches(pair: &NetnsPair) -> u64 {
    send(pair, &[], "udp-gso")
}

/// As [`send_batches`], `pack` heartbeats back to back a datagram (`monitor loadgen --pack`).
pub fn send_packed(pair: &NetnsPair, pack: usize) -> u64 {
    send(pair, &["--pack", &pack.to_string()], "packed")
}

/// The stream of [`send_batches`] with `extra` flags: the heartbeats sent, asserting the
/// generator says it sent them as `sent_by`.
fn send(pair: &NetnsPair, extra: &[&str], sent_by: &str) -> u64 {
    let mut args = vec!["--peers", "500", "--rate", "10", "--duration", "2s"];
    args.extend_from_slice(extra);
    let report = crate::agent_process::loadgen(pair, 18498, &args);
    let report = serde_json::to_value(report).unwrap();
    assert_eq!(report["sent_by"], json!(sent_by), "{report}");
    report["sent"].as_u64().unwrap()
}

/// Asserts that `agent`'s hook (`hook` names it in failures) counted all `sent` heartbeats,
/// none malformed, in far fewer runs than heartbeats (the batches reached it whole, or the
/// test would not be testing them). Needs BPF run statistics enabled.
pub fn assert_every_heartbeat_counted(agent: &AgentProcess, sent: u64, hook: &str) {
    // Every heartbeat sent has crossed the veth once the kernel counted that many (any more
    // would fail the equality below); a hook that misses some never gets there, and the
    // assertion then says what it counted instead.
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = agent.ask(json!({"op": "stats"}))["stats"].clone();
        if stats["kernel"]["heartbeats"].as_u64() >= Some(sent) || Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        stats["kernel"]["heartbeats"],
        json!(sent),
        "heartbeats sent {sent}, counted by the {hook}: {stats}"
    );
    assert_eq!(stats["kernel"]["malformed"], json!(0), "{stats}");
    let runs = stats["xdp"]["run_count"].as_u64().unwrap();
    assert!(
        runs > 0 && runs < sent / 2,
        "{runs} runs of the {hook} for {sent} heartbeats: no batches? {stats}"
    );
}
