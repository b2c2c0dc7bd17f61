//! `monitor run --udp-port`: every datagram of an existing UDP service counts as a heartbeat of
//! its flow (source address, source port), through the real kernel path, while the service
//! itself still gets every datagram.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, ChildGuard, TempDir, refused_start, spawn},
    netns::NetnsPair,
    require_root,
};
use monitor_common::passive;
use serde_json::json;

const SERVICE_PORT: u16 = 5353;
const CLIENT_PORT: u16 = 40_123;

/// A UDP service in `ns` on SERVICE_PORT that prints one line per datagram it receives.
fn service(ns: &str, addr: &str) -> ChildGuard {
    let script = format!(
        "import socket,sys\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('{addr}',{SERVICE_PORT}))\n\
         print('ready',flush=True)\n\
         while True:\n    d,a=s.recvfrom(2048)\n    print(a[1],len(d),flush=True)\n"
    );
    let mut cmd = NetnsPair::command_in(ns, Path::new("python3"));
    cmd.args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    spawn(cmd)
}

/// A client in `ns` that sends a small datagram to `to` from CLIENT_PORT every 100 ms.
fn client(ns: &str, to: &str) -> ChildGuard {
    let script = format!(
        "import socket,time\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('',{CLIENT_PORT}))\n\
         while True:\n    s.sendto(b'ping',('{to}',{SERVICE_PORT}))\n    time.sleep(0.1)\n"
    );
    let mut cmd = NetnsPair::command_in(ns, Path::new("python3"));
    cmd.args(["-c", &script]).stdin(Stdio::null());
    spawn(cmd)
}

#[test]
fn datagrams_to_a_watched_port_are_heartbeats_of_their_flow_and_still_reach_the_service() {
    require_root();
    let net = NetnsPair::named(93, ["hbufa", "hbufb"], ["hbuva", "hbuvb"]);
    // Admission off but for the client's address: a flow's derived id cannot be listed in
    // --peers, so the ranges are what lists it.
    let agent = AgentProcess::start(
        &net,
        &[
            "--udp-port",
            &SERVICE_PORT.to_string(),
            "--no-auto-admit",
            "--admit-from",
            &format!("{}/32", net.addr_b),
        ],
    );
    let mut server = service(&net.ns_a, &net.addr_a);
    let mut lines = BufReader::new(server.0.stdout.take().expect("service stdout")).lines();
    assert_eq!(
        lines.next().expect("service output").expect("line"),
        "ready"
    );
    let sender = client(&net.ns_b, &net.addr_a);

    let addr: std::net::Ipv4Addr = net.addr_b.parse().unwrap();
    let id = passive::flow_peer_id(
        passive::addr_words(addr.to_ipv6_mapped().octets()),
        CLIENT_PORT,
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let view = loop {
        let reply = agent.ask(json!({"op": "peers", "addr": net.addr_b, "source": "udp"}));
        let peers = reply["peers"].as_array().expect("peers").clone();
        if let Some(p) = peers.iter().find(|p| p["samples"].as_u64() >= Some(20)) {
            break p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no flow with 20 intervals: {reply}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(view["id"], id, "{view}");
    assert_eq!(view["source"], "udp");
    assert_eq!(view["addr"], format!("{}:{CLIENT_PORT}", net.addr_b));
    assert!(view.get("bfd_state").is_none(), "{view}");
    let mean = view["mean_ms"].as_f64().unwrap();
    assert!((95.0..=130.0).contains(&mean), "{view}");
    assert_eq!(agent.peer_ids(), vec![id]);

    // The service got every datagram the kernel recorded (and the ones since).
    let recorded = agent.ask(json!({"op": "stats"}))["stats"]["kernel"]["flow"]
        .as_u64()
        .unwrap();
    let mut served = 0;
    while served < recorded {
        let line = lines.next().expect("service output").expect("line");
        assert_eq!(line, format!("{CLIENT_PORT} 4"));
        served += 1;
    }

    // The client stops: phi of its flow passes 8.
    let mut events = agent.subscribe();
    drop(sender);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no level-8 suspicion of the flow");
        events.set_read_timeout(Some(left)).unwrap();
        let event: serde_json::Value =
            serde_json::from_str(&events.read_line().expect("event")).unwrap();
        if event["event"] == "suspect" && event["id"] == id && event["level"] == 8.0 {
            break;
        }
    }
    drop(events);
    drop(server);
    agent.stop();
}

#[test]
fn bad_udp_port_lists_are_refused_with_the_reason() {
    for (ports, reason) in [
        ("5353,5353", "listed twice"),
        ("1,2,3,4,5", "at most 4"),
        ("18498", "heartbeat port"),
        ("0", "0"),
        ("3784", "BFD port"),
    ] {
        let out = std::process::Command::new(integration_tests::monitor_bin())
            // An interface that does not exist: should the list pass, nothing gets attached.
            .args([
                "run",
                "--iface",
                "hbm-no-such",
                "--bfd",
                "--udp-port",
                ports,
            ])
            .output()
            .expect("run monitor");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{ports}: accepted");
        assert!(stderr.contains(reason), "{ports}: {stderr}");
    }
}

#[test]
fn a_peers_file_heartbeat_id_in_the_derived_half_is_refused_with_passive_sources() {
    require_root();
    let net = NetnsPair::named(95, ["hbufc", "hbufd"], ["hbuvc", "hbuvd"]);
    let dir = TempDir::new("hbmderived");
    let reserved = passive::DERIVED_ID_BIT | 5;
    let peers = dir.peers_file([7, reserved]);
    let stderr = refused_start(&net, &["--udp-port", "5353", "--peers", &peers]);
    assert!(
        stderr.contains(&format!("{reserved:#x}")) && stderr.contains("below 2^63"),
        "{stderr}"
    );
}
