//! The FRR BFD harness (integration_tests::frr) on its own, without the monitor: two real bfdd
//! daemons in two namespaces bring a single-hop session Up, and when one of them is killed the
//! other declares the session down by detection timeout.

use std::time::{Duration, Instant};

use integration_tests::{
    frr::{BfdPair, BfdState},
    netns::NetnsPair,
    require_root,
};

#[test]
fn frr_bfd_pair_reaches_up_and_detects_a_killed_peer() {
    require_root();
    // Declared first, dropped last: the daemons stop before their namespaces go.
    let net = NetnsPair::named(90, ["hbfba", "hbfbb"], ["hbfva", "hbfvb"]);
    let mut bfd = BfdPair::on_netns_pair(&net);

    let started = Instant::now();
    let (local, remote) = bfd.wait_up(Duration::from_secs(20));
    eprintln!(
        "BFD session Up on both sides {:?} after start",
        started.elapsed()
    );

    // Each side sees the other's configured timers and its discriminator.
    assert_eq!(local.peer.to_string(), net.addr_b);
    assert_eq!(local.local.map(|a| a.to_string()), Some(net.addr_a.clone()));
    assert!(!local.multihop);
    for session in [&local, &remote] {
        assert_eq!(session.state, BfdState::Up);
        assert_eq!(session.diagnostic, "ok");
        assert_eq!(session.detect_multiplier, 3);
        assert_eq!(session.receive_interval_ms, 100);
        assert_eq!(session.transmit_interval_ms, 100);
        assert_eq!(session.remote_detect_multiplier, 3);
        assert_eq!(session.remote_receive_interval_ms, 100);
        assert_eq!(session.remote_transmit_interval_ms, 100);
        assert_ne!(session.local_discriminator, 0);
    }
    assert_eq!(local.remote_discriminator, remote.local_discriminator);
    assert_eq!(remote.remote_discriminator, local.local_discriminator);
    assert_ne!(local.local_discriminator, remote.local_discriminator);

    // A crash of the remote bfdd: no Down packet, so the local side must time it out.
    let killed = bfd.kill_remote_bfdd();
    let killed_at = Instant::now();
    assert!(bfd.remote.bfdd_pid().is_none());
    assert!(
        !std::path::Path::new(&format!("/proc/{killed}")).exists(),
        "bfdd {killed} still exists after SIGKILL"
    );
    let down = bfd.wait_local_down(Duration::from_secs(10));
    let detected_after = killed_at.elapsed();
    eprintln!(
        "local bfdd declared the session {:?} {detected_after:?} after the kill",
        down.state
    );
    assert_eq!(down.state, BfdState::Down, "{down:?}");
    assert_eq!(
        down.diagnostic, "control detection time expired",
        "{down:?}"
    );
    assert_eq!(down.local_discriminator, local.local_discriminator);
    // The local bfdd itself is fine and keeps the session configured.
    assert!(bfd.local.bfdd_pid().is_some());
    assert_eq!(bfd.local_session().state, BfdState::Down);
}

/// Wall-clock time in ms, as events carry it.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Polls `f` until it gives a value, or panics with `what` after `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The agent's view of the BFD session from `addr` whose My Discriminator is `discriminator`,
/// found by address as an operator would (`monitor query peers --addr`).
fn session_seen(
    agent: &integration_tests::agent_process::AgentProcess,
    addr: &str,
    discriminator: u32,
) -> Option<serde_json::Value> {
    let reply = agent.ask(serde_json::json!({"op": "peers", "addr": addr, "source": "bfd"}));
    reply["peers"]
        .as_array()?
        .iter()
        .find(|p| p["discriminator"] == discriminator)
        .cloned()
}

/// Waits until the agent tracks the IPv4 session from `addr` with `discriminator` as Up, with
/// 10 intervals at the Up rate in its window; returns its view and its id, which must be the
/// one derived from the address and discriminator.
fn up_at_100ms(
    agent: &integration_tests::agent_process::AgentProcess,
    addr: &str,
    discriminator: u32,
) -> (serde_json::Value, u64) {
    let view = wait_for(Duration::from_secs(10), "the session Up at 100 ms", || {
        session_seen(agent, addr, discriminator)
            .filter(|p| p["bfd_state"] == "up" && p["samples"].as_u64() >= Some(10))
    });
    let v4: std::net::Ipv4Addr = addr.parse().unwrap();
    let id = monitor_common::passive::bfd_peer_id(
        monitor_common::passive::addr_words(v4.to_ipv6_mapped().octets()),
        discriminator,
    );
    assert_eq!(view["id"], id, "{view}");
    (view, id)
}

/// Reads events until one satisfies `want`, or panics after `limit`.
fn next_event(
    events: &mut monitor::serving::client::Client,
    limit: Duration,
    what: &str,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        events.set_read_timeout(Some(left)).expect("read timeout");
        let line = events
            .read_line()
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
        let event: serde_json::Value = serde_json::from_str(&line).expect("event JSON");
        if want(&event) {
            return event;
        }
    }
}

#[test]
fn the_agent_watches_a_real_bfd_session_passively_and_detects_its_peers_crash() {
    use integration_tests::agent_process::AgentProcess;
    require_root();
    let net = NetnsPair::named(91, ["hbfma", "hbfmb"], ["hbfwa", "hbfwb"]);
    // The agent first, so it sees the session from its first packet.
    let agent = AgentProcess::start(&net, &["--bfd"]);
    let mut bfd = BfdPair::on_netns_pair(&net);
    let (local, remote) = bfd.wait_up(Duration::from_secs(20));
    let up_at = Instant::now();

    // Tracked: one peer for the session, keyed by the remote's address and discriminator,
    // with the timers it announces, once a few packets at the Up rate are in its window.
    let discriminator = remote.local_discriminator;
    let (view, id) = up_at_100ms(&agent, &net.addr_b, discriminator);
    assert_eq!(view["source"], "bfd");
    assert!(
        view["addr"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}:", net.addr_b)),
        "{view}"
    );
    assert_eq!(
        (view["bfd_tx_ms"].as_f64(), view["bfd_detect_mult"].as_u64()),
        (Some(100.0), Some(3))
    );
    // BFD jitters each interval to 75-100% of it (RFC 5880 6.8.7).
    let mean = view["mean_ms"].as_f64().unwrap();
    assert!((70.0..=105.0).contains(&mean), "{view}");
    assert!(view["phi"].as_f64().unwrap() < 1.0, "{view}");
    // The only peer: the local bfdd's own packets leave by this interface, they do not arrive.
    assert_eq!(agent.peer_ids(), vec![id]);

    // The packets are passed on: the local bfdd stays Up, without a flap, while the agent
    // records another 30 of the session's packets.
    let heartbeats = view["heartbeats"].as_u64().unwrap();
    wait_for(Duration::from_secs(10), "30 more packets", || {
        session_seen(&agent, &net.addr_b, discriminator)
            .filter(|p| p["heartbeats"].as_u64() >= Some(heartbeats + 30))
    });
    let now = bfd.local_session();
    assert_eq!(now.state, BfdState::Up, "{now:?}");
    assert_eq!(now.remote_discriminator, remote.local_discriminator);
    let uptime = now.uptime_s.expect("an Up session has an uptime");
    assert!(
        uptime + 1 >= up_at.elapsed().as_secs(),
        "the local session restarted: up {uptime} s, {:?} since Up",
        up_at.elapsed()
    );
    assert_eq!(local.local_discriminator, now.local_discriminator);
    let kernel = agent.ask(serde_json::json!({"op": "stats"}))["stats"]["kernel"].clone();
    assert!(kernel["bfd"].as_u64() >= Some(heartbeats + 30), "{kernel}");
    assert_eq!(kernel["heartbeats"], 0, "{kernel}");

    // The remote bfdd crashes: phi passes 8; report how long that took next to bfdd's own
    // detection (3 x 100 ms).
    let mut events = agent.subscribe();
    let killed_at = wall_ms();
    bfd.kill_remote_bfdd();
    // Every level's crossing, in order, up to 8: the silence at each.
    let mut crossings = Vec::new();
    let suspect = loop {
        let e = next_event(&mut events, Duration::from_secs(10), "level 8", |e| {
            e["event"] == "suspect" && e["id"] == id
        });
        crossings.push(format!(
            "{} at {:.0} ms",
            e["level"],
            e["silence_ms"].as_f64().unwrap()
        ));
        if e["level"] == 8.0 {
            break e;
        }
    };
    let ours_ms = suspect["at"].as_u64().unwrap().saturating_sub(killed_at);
    let down = bfd.wait_local_down(Duration::from_secs(10));
    let bfdd_ms = wall_ms() - killed_at;
    eprintln!(
        "detection after a crash: monitor phi >= 8 after {ours_ms} ms (levels crossed at silences: {}); \
         local bfdd {:?} seen by polling within {bfdd_ms} ms (detect mult 3 x 100 ms)",
        crossings.join(", "),
        down.state
    );
    assert!(suspect["phi"].as_f64().unwrap() >= 8.0, "{suspect}");
    let peer = agent.ask(serde_json::json!({"op": "peer", "id": id}))["peer"].clone();
    assert!(peer["phi"].as_f64().unwrap() >= 8.0, "{peer}");
    drop(bfd);
    agent.stop();
}

#[test]
fn a_session_that_reports_down_raises_bfd_down_with_its_diagnostic() {
    use integration_tests::agent_process::{AgentProcess, events_so_far};
    require_root();
    let net = NetnsPair::named(92, ["hbfda", "hbfdb"], ["hbfxa", "hbfxb"]);
    let agent = AgentProcess::start(&net, &["--bfd"]);
    let mut bfd = BfdPair::on_netns_pair(&net);
    let (_, remote) = bfd.wait_up(Duration::from_secs(20));
    let discriminator = remote.local_discriminator;
    // Up long enough for its window to be of the Up rate (100 ms) throughout.
    let view = wait_for(
        Duration::from_secs(10),
        "the session Up for 30 intervals",
        || {
            session_seen(&agent, &net.addr_b, discriminator)
                .filter(|p| p["bfd_state"] == "up" && p["samples"].as_u64() >= Some(30))
        },
    );
    let id = view["id"].as_u64().unwrap();
    let mut events = agent.subscribe();
    // The local bfdd dies: the remote one times the session out and says so in its packets
    // (state Down, "control detection time expired"), which keep coming, once a second.
    bfd.local.kill_bfdd();
    let fall = next_event(&mut events, Duration::from_secs(10), "bfd_down", |e| {
        e["event"] == "bfd_down" && e["id"] == id
    });
    assert_eq!(fall["state"], "down", "{fall}");
    assert_eq!(fall["diag"], 1, "{fall}");
    assert_eq!(
        fall["diagnostic"], "control_detection_time_expired",
        "{fall}"
    );
    assert_eq!(fall["addr"], net.addr_b.as_str(), "{fall}");
    assert_eq!(fall["discriminator"], discriminator, "{fall}");
    // The session is still heard (its Down packets) and its view says what it reports.
    let view = wait_for(Duration::from_secs(5), "the Down state in the view", || {
        session_seen(&agent, &net.addr_b, discriminator).filter(|p| p["bfd_state"] == "down")
    });
    assert_eq!(view["bfd_diag"], 1, "{view}");
    // The remote is alive: it now sends once a second (a session that is not Up may not send
    // faster), and that slower rate is a fresh window, so three Down packets later it has
    // never been suspected, although its window held 100 ms intervals before. (FRR also
    // announces 1 s then; a peer that keeps announcing 100 ms gets the fresh window from the
    // state change itself: tests/tests/passive_fixtures.rs.)
    let heard = view["heartbeats"].as_u64().unwrap();
    let view = wait_for(Duration::from_secs(10), "three more Down packets", || {
        session_seen(&agent, &net.addr_b, discriminator)
            .filter(|p| p["heartbeats"].as_u64() >= Some(heard + 3))
    });
    assert!(view["phi"].as_f64().unwrap() < 1.0, "{view}");
    assert!(view["mean_ms"].as_f64().unwrap() > 700.0, "{view}");
    // Every event up to now is in the stream.
    for e in events_so_far(&mut events, Duration::from_millis(300)) {
        assert!(
            !(e["event"] == "suspect" && e["id"] == id),
            "a live session that reports Down was suspected: {e}"
        );
    }
    drop(events);
    drop(bfd);
    agent.stop();
}

#[test]
fn an_ipv6_session_is_watched_under_its_ipv6_address() {
    use integration_tests::agent_process::AgentProcess;
    use monitor_common::passive;
    require_root();
    let net = NetnsPair::named(94, ["hbf6a", "hbf6b"], ["hbf6x", "hbf6y"]);
    let agent = AgentProcess::start(&net, &["--bfd"]);
    let bfd = BfdPair::on_netns_pair_v6(&net);
    let (_, remote) = bfd.wait_up(Duration::from_secs(20));
    let discriminator = remote.local_discriminator;
    let view = wait_for(Duration::from_secs(10), "the IPv6 session Up", || {
        session_seen(&agent, &net.addr6_b, discriminator)
            .filter(|p| p["bfd_state"] == "up" && p["samples"].as_u64() >= Some(5))
    });
    let addr: std::net::Ipv6Addr = net.addr6_b.parse().unwrap();
    assert_eq!(
        view["id"],
        passive::bfd_peer_id(passive::addr_words(addr.octets()), discriminator),
        "{view}"
    );
    assert!(
        view["addr"]
            .as_str()
            .unwrap()
            .starts_with(&format!("[{}]:", net.addr6_b)),
        "{view}"
    );
    // Nothing under the IPv4 address.
    let v4 = agent.ask(serde_json::json!({"op": "peers", "addr": net.addr_b}));
    assert_eq!(v4["peers"], serde_json::json!([]), "{v4}");
    drop(bfd);
    agent.stop();
}

#[test]
fn a_multihop_session_is_watched_like_a_single_hop_one() {
    use integration_tests::{
        agent_process::AgentProcess,
        frr::{BfdEndpoint, BfdTimers},
    };
    require_root();
    let net = NetnsPair::named(96, ["hbfha", "hbfhb"], ["hbfhx", "hbfhy"]);
    let agent = AgentProcess::start(&net, &["--bfd"]);
    // RFC 5883 over the veth: UDP 4784, which the single-hop TTL rule does not cover.
    let mut bfd = BfdPair::start_multihop(
        BfdEndpoint::new(&net.ns_a, &net.addr_a),
        BfdEndpoint::new(&net.ns_b, &net.addr_b),
        BfdTimers::default(),
    );
    let (_, remote) = bfd.wait_up(Duration::from_secs(20));
    assert!(remote.multihop, "{remote:?}");
    let (view, id) = up_at_100ms(&agent, &net.addr_b, remote.local_discriminator);
    let mean = view["mean_ms"].as_f64().unwrap();
    assert!((70.0..=105.0).contains(&mean), "{view}");
    assert_eq!(agent.peer_ids(), vec![id]);
    let kernel = agent.ask(serde_json::json!({"op": "stats"}))["stats"]["kernel"].clone();
    assert_eq!(kernel["malformed"], 0, "{kernel}");

    let mut events = agent.subscribe();
    bfd.kill_remote_bfdd();
    let suspect = next_event(&mut events, Duration::from_secs(10), "level 8", |e| {
        e["event"] == "suspect" && e["id"] == id && e["level"] == 8.0
    });
    assert!(suspect["phi"].as_f64().unwrap() >= 8.0, "{suspect}");
    drop(bfd);
    agent.stop();
}
