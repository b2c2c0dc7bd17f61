//! The destination check on the real kernel: heartbeats addressed to another host cross the
//! monitor's interface (as on a router) and are passed, not recorded; an address added to the
//! interface later is followed; `--listen-addr` replaces the interface's addresses, and `any`
//! turns the check off; SIGHUP changes the list live.
//!
//! The sender reaches an address the monitor does not have through a permanent neighbour
//! entry pointing at the monitor's MAC, so the frames arrive on the monitor's interface
//! exactly as routed traffic would.

use std::time::Duration;

use integration_tests::{
    agent_process::{AgentProcess, ChildGuard, TempDir, sender_to, spawn},
    netns::{NetnsPair, ip},
    require_root, wait_for,
};
use monitor_common::wire::DEFAULT_PORT;
use serde_json::{Value, json};

/// The MAC address of `iface` in `ns`.
fn mac_of(ns: &str, iface: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-br", "link", "show", "dev", iface])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find(|w| w.len() == 17 && w.matches(':').count() == 5)
        .unwrap_or_else(|| panic!("no MAC in {text:?}"))
        .to_string()
}

/// Makes the `b` side send frames for `addr` to the monitor's interface, as to a gateway.
fn route_through_monitor(pair: &NetnsPair, addr: &str) {
    let mac = mac_of(&pair.ns_a, &pair.iface_a);
    ip(&[
        "-n",
        &pair.ns_b,
        "neigh",
        "replace",
        addr,
        "lladdr",
        &mac,
        "dev",
        &pair.iface_b,
        "nud",
        "permanent",
    ]);
}

fn other_v4(pair: &NetnsPair) -> String {
    let (net, _) = pair.addr_a.rsplit_once('.').expect("an IPv4 address");
    format!("{net}.99")
}

fn other_v6(pair: &NetnsPair) -> String {
    let net = pair.addr6_a.strip_suffix("::1").expect("an ::1 address");
    format!("{net}::99")
}

/// A sender of peer `id` to `addr` every 20 ms until dropped.
fn send_to(pair: &NetnsPair, addr: &str, id: u64) -> ChildGuard {
    let to = if addr.contains(':') {
        format!("[{addr}]:{DEFAULT_PORT}")
    } else {
        format!("{addr}:{DEFAULT_PORT}")
    };
    spawn(sender_to(pair, &to, id, "20ms", &[]))
}

fn kernel(agent: &AgentProcess) -> Value {
    agent.ask(json!({"op": "stats"}))["stats"]["kernel"].clone()
}

fn heartbeats(agent: &AgentProcess, id: u64) -> u64 {
    agent.ask(json!({"op": "peer", "id": id}))["peer"]["heartbeats"]
        .as_u64()
        .expect("heartbeats")
}

fn not_local(agent: &AgentProcess) -> u64 {
    kernel(agent)["not_local"].as_u64().expect("not_local")
}

#[test]
fn heartbeats_to_another_host_pass_until_the_address_is_added() {
    require_root();
    let pair = NetnsPair::named(41, ["hbdsa", "hbdsb"], ["hbdva", "hbdvb"]);
    let dir = TempDir::new("hbdpeers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([77])]);
    let other = other_v4(&pair);
    route_through_monitor(&pair, &other);
    let _sender = send_to(&pair, &other, 77);

    // They arrive (the kernel counts them) but are not this host's: nothing is recorded.
    wait_for(Duration::from_secs(10), "not_local heartbeats", || {
        (not_local(&agent) >= 10).then_some(())
    });
    assert_eq!(heartbeats(&agent, 77), 0, "{}", kernel(&agent));
    assert_eq!(kernel(&agent)["malformed"], json!(0));

    // The address becomes the interface's: followed within a second or two.
    ip(&[
        "-n",
        &pair.ns_a,
        "addr",
        "add",
        &format!("{other}/32"),
        "dev",
        &pair.iface_a,
    ]);
    let added = std::time::Instant::now();
    wait_for(
        Duration::from_secs(3),
        "heartbeats to the added address",
        || (heartbeats(&agent, 77) >= 5).then_some(()),
    );
    eprintln!("added address accepted after {:?}", added.elapsed());

    // And removed again: passed once more.
    ip(&[
        "-n",
        &pair.ns_a,
        "addr",
        "del",
        &format!("{other}/32"),
        "dev",
        &pair.iface_a,
    ]);
    let before = not_local(&agent);
    wait_for(Duration::from_secs(3), "not_local after removal", || {
        (not_local(&agent) >= before + 10).then_some(())
    });
    let recorded = heartbeats(&agent, 77);
    wait_for(Duration::from_secs(3), "more not_local", || {
        (not_local(&agent) >= before + 20).then_some(())
    });
    assert_eq!(heartbeats(&agent, 77), recorded, "recorded after removal");
}

#[test]
fn listen_addr_replaces_the_interface_addresses() {
    require_root();
    let pair = NetnsPair::named(42, ["hbdla", "hbdlb"], ["hbdwa", "hbdwb"]);
    let dir = TempDir::new("hbdpeers");
    let (v4, v6) = (other_v4(&pair), other_v6(&pair));
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1, 2, 3]),
            "--listen-addr",
            &format!("{v4},{v6}"),
        ],
    );
    route_through_monitor(&pair, &v4);
    route_through_monitor(&pair, &v6);
    let _to_interface = send_to(&pair, &pair.addr_a, 1);
    let _to_v4 = send_to(&pair, &v4, 2);
    let _to_v6 = send_to(&pair, &v6, 3);
    wait_for(Duration::from_secs(10), "listed addresses recorded", || {
        (heartbeats(&agent, 2) >= 10 && heartbeats(&agent, 3) >= 10 && not_local(&agent) >= 10)
            .then_some(())
    });
    // The interface's own address is not listed: its heartbeats pass unrecorded.
    assert_eq!(heartbeats(&agent, 1), 0, "{}", kernel(&agent));
}

#[test]
fn listen_addr_any_records_every_destination() {
    require_root();
    let pair = NetnsPair::named(43, ["hbdya", "hbdyb"], ["hbdxa", "hbdxb"]);
    let dir = TempDir::new("hbdpeers");
    let agent = AgentProcess::start(
        &pair,
        &["--peers", &dir.peers_file([5]), "--listen-addr", "any"],
    );
    let other = other_v4(&pair);
    route_through_monitor(&pair, &other);
    let _sender = send_to(&pair, &other, 5);
    wait_for(Duration::from_secs(10), "heartbeats to any address", || {
        (heartbeats(&agent, 5) >= 10).then_some(())
    });
    assert_eq!(not_local(&agent), 0);
}

#[test]
fn sighup_changes_the_listen_addresses_live() {
    require_root();
    let pair = NetnsPair::named(44, ["hbdra", "hbdrb"], ["hbdqa", "hbdqb"]);
    let dir = TempDir::new("hbdpeers");
    let other = other_v4(&pair);
    let write = |text: &str| dir.config_file(text);
    let config = write(&format!("listen-addr = [\"{other}\"]\n"));
    let peers = dir.peers_file([1, 2]);
    let agent = AgentProcess::start(&pair, &["--config", &config, "--peers", &peers]);
    route_through_monitor(&pair, &other);
    let _to_interface = send_to(&pair, &pair.addr_a, 1);
    let _to_other = send_to(&pair, &other, 2);
    let reloads =
        |agent: &AgentProcess| agent.ask(json!({"op": "stats"}))["stats"]["config_reloads"].clone();
    wait_for(
        Duration::from_secs(10),
        "the listed address recorded",
        || (heartbeats(&agent, 2) >= 10 && not_local(&agent) >= 10).then_some(()),
    );
    assert_eq!(heartbeats(&agent, 1), 0, "{}", kernel(&agent));

    // No list: the interface's own addresses, followed, from now on; the other one passes.
    write("# listen-addr: the interface's addresses\n");
    agent.sighup();
    wait_for(
        Duration::from_secs(5),
        "the interface's address recorded",
        || (heartbeats(&agent, 1) >= 5).then_some(()),
    );
    assert_eq!(reloads(&agent), json!(1));
    let recorded = heartbeats(&agent, 2);
    let before = not_local(&agent);
    wait_for(Duration::from_secs(5), "the other address passed", || {
        (not_local(&agent) >= before + 20).then_some(())
    });
    assert!(heartbeats(&agent, 2) <= recorded + 1, "{}", kernel(&agent));

    // `any` would turn the check off, which only a restart does: nothing changes.
    write("listen-addr = [\"any\"]\n");
    agent.sighup();
    wait_for(Duration::from_secs(5), "the second reload", || {
        (reloads(&agent) == json!(2)).then_some(())
    });
    let recorded = heartbeats(&agent, 2);
    let before = not_local(&agent);
    wait_for(Duration::from_secs(5), "still passed", || {
        (not_local(&agent) >= before + 20).then_some(())
    });
    assert!(heartbeats(&agent, 2) <= recorded + 1, "{}", kernel(&agent));
    assert!(heartbeats(&agent, 1) >= 5);
}
