//! Coexistence (`monitor run --hook tc`): another XDP program owns the interface's XDP hook;
//! the default hook refuses and names the way out, the TC hook records heartbeats that the other
//! program passed, leaves it attached and running, and leaves nothing behind when it stops. And
//! what the TC hook meets where native XDP does not: a batch of heartbeats in one packet (UDP
//! GSO), counted whole (tests/tests/generic_xdp.rs for XDP's skb mode).

use std::{
    os::fd::{AsFd, AsRawFd},
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use integration_tests::{
    agent_process::{AgentProcess, TempDir, refused_start, sender, spawn},
    bench::load_floor,
    monitor_bin,
    netns::NetnsPair,
    require_root,
};
use monitor::kernel::program;
use serde_json::json;

/// The other XDP program's port: it drops datagrams to it and passes everything else, so
/// heartbeats (18498) go through it to the TC hook.
const OTHER_PORT: u16 = 9999;

/// Runs `f` on a thread that has entered network namespace `ns` (by its /var/run/netns name).
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("open the netns");
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: a valid namespace fd; only this thread changes namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("netns thread")
    })
}

/// Names of the programs attached at `iface`'s TCX ingress in `ns`.
fn tcx_ingress(ns: &str, iface: &str) -> Vec<String> {
    in_netns(ns, || {
        let (_, programs) =
            SchedClassifier::query_tcx(iface, TcAttachType::Ingress).expect("query tcx");
        programs
            .iter()
            .map(|p| p.name_as_str().unwrap_or("?").to_string())
            .collect()
    })
}

fn ip_link_show(ns: &str, iface: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", iface])
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tc_hook_runs_beside_another_xdp_program() {
    require_root();
    let pair = NetnsPair::named(82, ["hbcoa", "hbcob"], ["hbcva", "hbcvb"]);
    // Run statistics while this fd lives (BPF_ENABLE_STATS), without touching the sysctl.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable bpf stats");

    // The other XDP program, attached first and kept attached for the whole test.
    let iface = pair.iface_a.clone();
    let (other, other_fd) = in_netns(&pair.ns_a, || {
        let mut ebpf = load_floor(OTHER_PORT, false);
        let xdp: &mut aya::programs::Xdp = ebpf
            .program_mut("floor")
            .expect("floor")
            .try_into()
            .expect("XDP");
        xdp.attach(&iface, aya::programs::XdpMode::default())
            .expect("attach the other XDP program");
        let fd = xdp
            .fd()
            .expect("fd")
            .as_fd()
            .try_clone_to_owned()
            .expect("dup");
        (ebpf, fd)
    });
    let other_id = program::run_stats(other_fd.as_fd()).expect("stats").id;
    let xdp_attached = format!("prog/xdp id {other_id}");
    assert!(
        ip_link_show(&pair.ns_a, &pair.iface_a).contains(&xdp_attached),
        "{}",
        ip_link_show(&pair.ns_a, &pair.iface_a)
    );

    // (1) The default hook cannot attach, and says what to do.
    let stderr = refused_start(&pair, &[]);
    eprintln!("monitor run (default hook) said: {stderr}");
    assert!(
        stderr.contains("--hook tc"),
        "stderr does not name --hook tc: {stderr}"
    );
    assert!(tcx_ingress(&pair.ns_a, &pair.iface_a).is_empty());

    // (2) The TC hook records heartbeats the other program passed.
    let dir = TempDir::new("hbcopeers");
    let agent = AgentProcess::start(&pair, &["--hook", "tc", "--peers", &dir.peers_file([42])]);
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["xdp_mode"], json!("tc"), "{stats}");
    assert_eq!(
        tcx_ingress(&pair.ns_a, &pair.iface_a),
        vec![program::TC_PROGRAM_NAME.to_string()]
    );
    let runs_before = program::run_stats(other_fd.as_fd())
        .expect("stats")
        .run_count;
    let _sender = spawn(sender(&pair, 42, "10ms", &["--count", "30"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    let peer = loop {
        let peer = agent.ask(json!({"op": "peer", "id": 42}))["peer"].clone();
        if peer["heartbeats"] == json!(30) {
            break peer;
        }
        assert!(
            Instant::now() < deadline,
            "30 heartbeats not recorded: {peer}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(peer["last_seq"], json!(29), "{peer}");
    assert_eq!(peer["lost"], json!(0), "{peer}");
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["kernel"]["heartbeats"], json!(30), "{stats}");
    // The agent's program stats are its TC program's: it ran once per heartbeat at least.
    assert!(
        stats["xdp"]["run_count"].as_u64().unwrap_or(0) >= 30,
        "{stats}"
    );
    // The other program is still there, and saw every heartbeat first.
    assert!(
        ip_link_show(&pair.ns_a, &pair.iface_a).contains(&xdp_attached),
        "the other XDP program was detached"
    );
    let runs_after = program::run_stats(other_fd.as_fd())
        .expect("stats")
        .run_count;
    assert!(
        runs_after >= runs_before + 30,
        "other program ran {runs_before} -> {runs_after}"
    );

    // (3) Stopping the agent removes its TC attachment and nothing else.
    assert!(agent.stop().success());
    assert!(
        tcx_ingress(&pair.ns_a, &pair.iface_a).is_empty(),
        "a TC program was left attached"
    );
    assert!(ip_link_show(&pair.ns_a, &pair.iface_a).contains(&xdp_attached));
    drop(other);
}

#[test]
fn persist_is_refused_with_the_tc_hook() {
    let out = std::process::Command::new(monitor_bin())
        .args(["run", "--iface", "lo", "--hook", "tc", "--persist"])
        .output()
        .expect("run monitor");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hook xdp"), "{stderr}");
}

/// A sender that hands the kernel many heartbeats in one send (UDP GSO, as `monitor loadgen`
/// does, 64 a message) crosses a veth as one skb of 64 datagrams: with no XDP program on the
/// interface nothing cuts it before the TC hook, which runs once for it. Every heartbeat in it
/// must count, or its peers fall silent to the detector while they send.
#[test]
fn tc_hook_counts_every_heartbeat_of_a_gso_batch() {
    require_root();
    let pair = NetnsPair::named(83, ["hbcoc", "hbcod"], ["hbcvc", "hbcvd"]);
    // Run statistics while this fd lives: the program's run count says batches reached it.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable bpf stats");
    let dir = TempDir::new("hbcogso");
    let agent = AgentProcess::start(
        &pair,
        &["--hook", "tc", "--peers", &dir.peers_file(1..=500)],
    );
    let sent = integration_tests::batches::send_batches(&pair);
    integration_tests::batches::assert_every_heartbeat_counted(&agent, sent, "TC hook");
}
