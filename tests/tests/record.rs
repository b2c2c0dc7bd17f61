//! `monitor record` against the real kernel, and the proof that replay applies the kernel's
//! window rules exactly: the arrivals the kernel recorded, replayed through the userspace
//! window, give the same samples, sums, ring and loss counters as the kernel's own slot.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender, spawn},
    monitor_bin,
    netns::NetnsPair,
    require_root,
};
use monitor::{detector::model::DetectorParams, offline::trace::parse_trace};
use monitor_common::{
    maps::PeerSlot,
    slot::{arrive, window_intervals},
};
use serde_json::{Value, json};

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(pid as i32, sig) };
}

#[test]
fn recorded_arrivals_replay_to_the_kernels_window() {
    require_root();
    let pair = NetnsPair::new(24);
    let dir = TempDir::new("hbmrec");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([7, 8]),
            "--sweep-interval",
            "20ms",
        ],
    );
    let out = dir.0.join("peer-{id}.trace");
    let mut recorder = Command::new(monitor_bin())
        .args(["record", "--peer", "7", "--duration", "8s", "--socket"])
        .arg(agent.socket())
        .arg("--out")
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn monitor record");
    // The recorder says so once the agent has started tracing: no arrival can be missed after.
    let mut stderr = BufReader::new(recorder.stderr.take().expect("piped"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("recorder output");
    assert!(line.starts_with("recording"), "{line}");

    // Peer 8 is never traced: the kernel must not spend the ring on it.
    let _other = spawn(sender(&pair, 8, "20ms", &["--incarnation", "1"]));
    // Incarnation 1: steady with jitter, then stopped for 600 ms (an outage of 30 intervals,
    // left out of the window), then steady again until it ends.
    let first = spawn(sender(
        &pair,
        7,
        "20ms",
        &["--incarnation", "1", "--jitter", "5ms", "--count", "60"],
    ));
    std::thread::sleep(Duration::from_millis(500));
    signal(first.0.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(600));
    signal(first.0.id(), libc::SIGCONT);
    let mut first = first;
    first.0.wait().expect("first sender");
    // The sender restarts: incarnation 2, the interval across the restart is not a sample.
    let mut second = spawn(sender(
        &pair,
        7,
        "20ms",
        &["--incarnation", "2", "--jitter", "5ms", "--count", "40"],
    ));
    second.0.wait().expect("second sender");

    let status = recorder.wait().expect("recorder");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(status.success(), "monitor record failed: {rest}");

    let text = std::fs::read_to_string(dir.0.join("peer-7.trace")).expect("trace written");
    let trace = parse_trace(&text).expect("the recorded trace parses");
    assert!(!dir.0.join("peer-8.trace").exists());

    let kernel = &agent.ask(json!({"op": "peer", "id": 7, "window": true}))["peer"];
    let window = &kernel["window"];
    // Every heartbeat the kernel accepted was recorded (plus any it rejected).
    assert_eq!(
        kernel["heartbeats"].as_u64().unwrap(),
        100,
        "both senders' heartbeats arrived: {kernel}"
    );
    assert!(trace.len() >= 100, "{} arrivals recorded", trace.len());

    // The same arrivals through the same rules, in userspace.
    let config = DetectorParams::DEFAULT.window_config();
    let mut slot = PeerSlot::admitted(7, 0);
    for a in &trace {
        arrive(&mut slot, a.at_ns, a.seq, a.incarnation, &config);
    }
    let r = &slot.record();
    let ring: Vec<u32> = window_intervals(&slot, config.window).collect();
    let replayed = json!({
        "heartbeats": r.heartbeats,
        "samples": r.samples,
        "lost": r.lost,
        "duplicates": r.duplicates,
        "out_of_order": r.out_of_order,
        "outages": r.outages,
        "restarts": r.restarts,
        "incarnation": r.incarnation,
        "last_seq": r.last_seq,
        "window": {
            "intervals_us": ring,
            "sum_us": r.interval_sum_us,
            "sum_sq_us": r.interval_sum_sq_us,
            "loss_heartbeats": r.loss_heartbeats,
            "loss_gaps": r.loss_gaps,
            "loss_lost": r.loss_lost,
            "burst_heartbeats": r.burst_heartbeats,
            "burst_gaps": r.burst_gaps,
            "outage_run": r.outage_run,
            "missing": r.missing,
            "left_out": r.left_out,
        },
    });
    let from_kernel: Value = json!({
        "heartbeats": kernel["heartbeats"],
        "samples": kernel["samples"],
        "lost": kernel["lost"],
        "duplicates": kernel["duplicates"],
        "out_of_order": kernel["out_of_order"],
        "outages": kernel["outages"],
        "restarts": kernel["restarts"],
        "incarnation": kernel["incarnation"],
        "last_seq": kernel["last_seq"],
        "window": window,
    });
    assert_eq!(replayed, from_kernel, "replay and kernel disagree");
    // And the run did exercise the rules it claims to compare.
    assert_eq!(r.restarts, 1, "one restart");
    assert!(r.outages >= 1, "the stop was left out as an outage");
    assert_eq!(
        r.left_out as u32,
        r.restarts + r.outages,
        "the restart's and the outages' intervals were left out"
    );
    assert_eq!(
        r.samples,
        100 - 2 - r.outages,
        "all but the first, the restart and outages"
    );
}

#[test]
fn record_refuses_what_it_cannot_do() {
    require_root();
    let pair = NetnsPair::new(25);
    let dir = TempDir::new("hbmrec2");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([7])]);
    let reply = agent
        .client()
        .request(&json!({"op": "record", "ids": [99], "duration_ms": 100}))
        .unwrap();
    assert_eq!(reply["ok"], json!(false));
    assert!(
        reply["error"].as_str().unwrap().contains("unknown peer 99"),
        "{reply}"
    );
    let out = Command::new(monitor_bin())
        .args([
            "record", "--peer", "7", "--peer", "8", "--out", "x.trace", "--socket",
        ])
        .arg(agent.socket())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("{id}"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A short recording with no traffic ends by itself with an empty (comment-only) trace.
    let out = Command::new(monitor_bin())
        .args(["record", "--peer", "7", "--duration", "200ms", "--socket"])
        .arg(agent.socket())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().all(|l| l.starts_with('#')), "{text}");
}
