//! The systems that act on suspicions, for real, in namespaces:
//! - HAProxy 2.6 with `agent-check` answered by `monitor haproxy-agent`: three HTTP backends,
//!   each a heartbeat peer, under steady load; one is killed (its server and its heartbeats
//!   together) and HAProxy marks it DOWN within the detection time plus an agent interval,
//!   sends it nothing after that, and a lost agent changes nothing.
//! - keepalived 2.2, a VRRP pair whose MASTER tracks a peer through `monitor track-file`: the
//!   peer is killed and the BACKUP takes the virtual address.
//!
//! Each prints the figures it measured (docs/consumers.md has them).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender, spawn},
    daemon::{Daemon, enter_netns},
    haproxy::{
        Backend, Outcome, agent_responder, col, get, num, show_stat, up_by_agent, write_backend_py,
    },
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::json;

#[test]
fn haproxy_agent_check_marks_a_dead_backend_down_and_a_lost_agent_changes_nothing() {
    require_root();
    // Declared first, dropped last: every process stops before the namespaces go.
    let pair = NetnsPair::named(97, ["hbha", "hbhb"], ["hbhva", "hbhvb"]);
    let dir = TempDir::new("hbhaproxy");
    let peers = dir.peers_file([1, 2, 3]);
    let agent = AgentProcess::start(&pair, &["--peers", &peers]);
    let agent_port = 19_777;
    let front_port = 18_080;
    let stats = dir.0.join("haproxy.sock");
    let backend_py = write_backend_py(&dir.0);

    // Three backends in the b namespace, each also a heartbeat peer.
    let start_backend = |i: u64| -> (Backend, PathBuf) {
        let log = dir.0.join(format!("backend{i}.log"));
        (Backend::start(&pair, &backend_py, i, &log, "20ms"), log)
    };
    let mut backends: Vec<Option<(Backend, PathBuf)>> =
        (1..=3).map(|i| Some(start_backend(i))).collect();

    let responder = agent_responder(&pair, agent_port, agent.socket());

    let mut cfg = format!(
        "global\n  stats socket {} level admin\n  maxconn 2000\n\
         defaults\n  mode http\n  timeout connect 200ms\n  timeout client 5s\n  timeout server 5s\n  \
         retries 2\n  option redispatch 1\n\
         frontend web\n  bind 127.0.0.1:{front_port}\n  default_backend app\n\
         backend app\n  balance roundrobin\n",
        stats.display()
    );
    for i in 1..=3 {
        cfg.push_str(&format!(
            "  server s{i} {}:{} weight 100 agent-check agent-addr 127.0.0.1 agent-port {agent_port} \
             agent-inter 100ms agent-send \"{i}\\n\"\n",
            pair.addr_b,
            8000 + i
        ));
    }
    // A server named by a peer the agent does not watch: its agent replies change nothing.
    cfg.push_str(&format!(
        "backend spare\n  server s9 {}:8002 weight 100 agent-check agent-addr 127.0.0.1 \
         agent-port {agent_port} agent-inter 100ms agent-send \"99\\n\"\n",
        pair.addr_b
    ));
    let cfg_path = dir.0.join("haproxy.cfg");
    std::fs::write(&cfg_path, cfg).unwrap();
    let mut hap = NetnsPair::command_in(&pair.ns_a, Path::new("haproxy"));
    hap.arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("haproxy.log")).unwrap());
    let _haproxy = Daemon::new(hap.spawn().expect("haproxy"));

    // Every server answered by the agent: up at full weight.
    wait_for(
        Duration::from_secs(20),
        "every server checked by the agent",
        || {
            let s = show_stat(&stats);
            ((1..=3).all(|i| up_by_agent(&s, &format!("app/s{i}")))
                && !col(&s, "spare/s9", "last_agt").is_empty())
            .then_some(())
        },
    );
    let s = show_stat(&stats);
    assert_eq!(
        col(&s, "spare/s9", "last_agt"),
        "agent reports an error : monitor:unknown-peer",
        "{:?}",
        s.get("spare/s9")
    );
    assert!(!col(&s, "spare/s9", "status").starts_with("DOWN"));

    // Steady load through HAProxy from the a namespace: 4 clients, one request each 10 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let ns_a = pair.ns_a.clone();
    let loaders: Vec<_> = (0..4)
        .map(|_| {
            let (stop, outcomes, ns) = (stop.clone(), outcomes.clone(), ns_a.clone());
            thread::spawn(move || {
                enter_netns(&ns);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let body = get(front_port);
                    outcomes.lock().unwrap().push(Outcome {
                        started,
                        ok: body.is_some(),
                        backend: body.unwrap_or_default(),
                    });
                    thread::sleep(Duration::from_millis(10).saturating_sub(started.elapsed()));
                }
            })
        })
        .collect();
    wait_for(Duration::from_secs(10), "every backend serving", || {
        let o = outcomes.lock().unwrap();
        (1..=3)
            .all(|i| o.iter().any(|x| x.backend == format!("b{i}")))
            .then_some(())
    });
    thread::sleep(Duration::from_millis(500));
    // The kill is measured from a healthy start: every backend's peer unsuspected and up at
    // full weight in HAProxy when it comes. In full test runs on this project's VM a backend's
    // sender was seen silent for 0.75 s just before the kill (convicted 2 ms after it, requests
    // failing after its DOWN); a kill on top of such a silence measures the silence, not the
    // kill.
    wait_for(
        Duration::from_secs(10),
        "every backend's peer unsuspected and up at full weight before the kill",
        || {
            let s = show_stat(&stats);
            (1..=3)
                .all(|i| {
                    agent.ask(json!({"op": "peer", "id": i}))["peer"]["level"].is_null()
                        && up_by_agent(&s, &format!("app/s{i}"))
                })
                .then_some(())
        },
    );

    // Kill backend 2: its HTTP server and its heartbeats together.
    let (
        Backend {
            mut server,
            mut heartbeats,
        },
        log2,
    ) = backends[1].take().unwrap();
    let killed = Instant::now();
    let _ = server.child.kill();
    let _ = heartbeats.0.kill();
    let killed_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let _ = server.child.wait();
    let _ = heartbeats.0.wait();

    let mut convicted = None;
    let (down_after, at_down) = wait_for(Duration::from_secs(10), "HAProxy marks s2 DOWN", || {
        if convicted.is_none()
            && agent.ask(json!({"op": "peer", "id": 2}))["peer"]["level"].as_f64() == Some(8.0)
        {
            convicted = Some(killed.elapsed());
        }
        let s = show_stat(&stats);
        col(&s, "app/s2", "status")
            .starts_with("DOWN")
            .then(|| (killed.elapsed(), s))
    });
    let down_at = Instant::now();
    let convicted = convicted.unwrap_or(down_after);
    // More load after the DOWN, then the counters again.
    thread::sleep(Duration::from_millis(1500));
    let later = show_stat(&stats);
    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.join().unwrap();
    }

    let o = outcomes.lock().unwrap().clone();
    let in_outage: Vec<_> = o
        .iter()
        .filter(|x| x.started >= killed && x.started < down_at)
        .collect();
    let after: Vec<_> = o.iter().filter(|x| x.started >= down_at).collect();
    let failed_in_outage = in_outage.iter().filter(|x| !x.ok).count();
    let failed_after = after.iter().filter(|x| !x.ok).count();
    let served_by_dead_after_kill = std::fs::read_to_string(&log2)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse::<f64>().ok())
        .filter(|&t| t > killed_unix)
        .count();
    let sent_at_down = num(&at_down, "app/s2", "stot");
    let sent_later = num(&later, "app/s2", "stot");
    let econ_outage = num(&at_down, "app/s2", "econ");
    let redispatched = num(&at_down, "app/s2", "wredis");
    let retried = num(&at_down, "app/s2", "wretr");
    eprintln!(
        "haproxy: peer 2 at level 8 {convicted:?} after the kill, s2 DOWN {down_after:?} after \
         (HAProxy {:?} after the conviction); requests meanwhile {} (failed {failed_in_outage}, \
         connection errors to s2 {econ_outage}, retries {retried}, redispatched {redispatched}); \
         after the DOWN {} requests (failed {failed_after}), sent to s2 {}; s2 agent status {:?}",
        down_after.saturating_sub(convicted),
        in_outage.len(),
        after.len(),
        sent_later - sent_at_down,
        col(&at_down, "app/s2", "last_agt"),
    );
    assert!(
        down_after < Duration::from_secs(3),
        "s2 DOWN only {down_after:?} after the kill"
    );
    assert!(
        col(&at_down, "app/s2", "last_agt").starts_with("via agent : down (peer 2 level 8"),
        "{:?}",
        col(&at_down, "app/s2", "last_agt")
    );
    assert_eq!(
        sent_later, sent_at_down,
        "HAProxy sent requests to s2 after its DOWN"
    );
    assert_eq!(served_by_dead_after_kill, 0);
    assert_eq!(failed_after, 0, "requests failed after the DOWN");
    assert!(
        after.len() > 100,
        "too little load after the DOWN: {}",
        after.len()
    );
    for i in [1, 3] {
        assert!(!col(&later, &format!("app/s{i}"), "status").starts_with("DOWN"));
    }

    // The agent goes away: the responder says so and HAProxy changes nothing.
    drop(agent);
    wait_for(
        Duration::from_secs(10),
        "replies saying the agent is gone",
        || {
            let s = show_stat(&stats);
            (1..=3)
                .all(|i| {
                    col(&s, &format!("app/s{i}"), "last_agt")
                        == "agent reports an error : monitor:no-agent"
                })
                .then_some(())
        },
    );
    let s = show_stat(&stats);
    assert!(col(&s, "app/s2", "status").starts_with("DOWN"));
    for i in [1, 3] {
        let srv = format!("app/s{i}");
        assert!(
            !col(&s, &srv, "status").starts_with("DOWN"),
            "{srv}: {:?}",
            s.get(&srv)
        );
        assert_eq!(num(&s, &srv, "weight"), 100);
    }
    drop(responder);
    drop(backends);
}

// ---------------------------------------------------------------------------------------
// keepalived

fn has_addr(ns: &str, iface: &str, addr: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns, "-4", "addr", "show", "dev", iface])
        .output()
        .expect("ip addr show");
    String::from_utf8_lossy(&out.stdout).contains(&format!("inet {addr}/"))
}

#[test]
fn keepalived_backup_takes_the_address_when_the_masters_tracked_peer_dies() {
    require_root();
    let pair = NetnsPair::named(98, ["hbka", "hbkb"], ["hbkva", "hbkvb"]);
    let dir = TempDir::new("hbkeepalived");
    let peers = dir.peers_file([7]);
    let agent = AgentProcess::start(&pair, &["--peers", &peers]);
    let mut peer = spawn(sender(&pair, 7, "20ms", &[]));
    wait_for(Duration::from_secs(10), "peer 7 heard", || {
        (agent.ask(json!({"op": "peer", "id": 7}))["peer"]["heartbeats"].as_u64()? > 20)
            .then_some(())
    });

    let track = dir.0.join("peer7.track");
    let mut tracker = Command::new(monitor_bin());
    tracker
        .args(["track-file", "--file"])
        .arg(format!("{}=7", track.display()))
        .arg("--socket")
        .arg(agent.socket())
        .args(["--level", "8", "--weight", "fault"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    let _tracker = Daemon::new(tracker.spawn().expect("monitor track-file"));
    wait_for(Duration::from_secs(10), "the track file at 0", || {
        (std::fs::read_to_string(&track).ok()? == "0\n").then_some(())
    });

    let vip = "10.211.98.100";
    let advert = 0.1;
    let keepalived = |name: &str, ns: &str, iface: &str, state: &str, prio: u32, tracked: bool| {
        let mut conf = format!("global_defs {{\n  router_id {name}\n  vrrp_version 3\n}}\n");
        if tracked {
            conf.push_str(&format!(
                "track_file hb_peer7 {{\n  file \"{}\"\n  weight 1\n}}\n",
                track.display()
            ));
        }
        conf.push_str(&format!(
            "vrrp_instance VI_1 {{\n  state {state}\n  interface {iface}\n  virtual_router_id 51\n  \
             priority {prio}\n  advert_int {advert}\n  virtual_ipaddress {{\n    {vip}/24\n  }}\n"
        ));
        if tracked {
            conf.push_str("  track_file {\n    hb_peer7\n  }\n");
        }
        conf.push_str("}\n");
        let path = dir.0.join(format!("{name}.conf"));
        std::fs::write(&path, conf).unwrap();
        let (pid, vrrp_pid) = (
            dir.0.join(format!("{name}.pid")),
            dir.0.join(format!("{name}.vrrp.pid")),
        );
        let mut cmd = NetnsPair::command_in(ns, Path::new("keepalived"));
        cmd.args(["-n", "-l", "-D", "-P", "-G", "-f"])
            .arg(&path)
            .arg("-p")
            .arg(&pid)
            .arg("-r")
            .arg(&vrrp_pid)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.0.join(format!("{name}.log"))).unwrap())
            .stderr(Stdio::null());
        Daemon {
            child: cmd.spawn().expect("keepalived"),
            extra_pids: vec![vrrp_pid],
            child_name: Some("keepalived".into()),
        }
    };
    let _backup = keepalived("hbk_b", &pair.ns_b, &pair.iface_b, "BACKUP", 100, false);
    let _master = keepalived("hbk_a", &pair.ns_a, &pair.iface_a, "MASTER", 150, true);
    wait_for(
        Duration::from_secs(20),
        "the MASTER holding the address alone",
        || {
            (has_addr(&pair.ns_a, &pair.iface_a, vip) && !has_addr(&pair.ns_b, &pair.iface_b, vip))
                .then_some(())
        },
    );
    // Settled: the BACKUP has heard adverts for a while.
    thread::sleep(Duration::from_millis(500));
    assert!(has_addr(&pair.ns_a, &pair.iface_a, vip));

    let _ = peer.0.kill();
    let killed = Instant::now();
    let _ = peer.0.wait();
    let (mut convicted, mut written) = (None, None);
    let moved = wait_for(
        Duration::from_secs(10),
        "the BACKUP taking the address",
        || {
            if convicted.is_none()
                && agent.ask(json!({"op": "peer", "id": 7}))["peer"]["level"].as_f64() == Some(8.0)
            {
                convicted = Some(killed.elapsed());
            }
            if written.is_none()
                && std::fs::read_to_string(&track).ok().as_deref() == Some("-254\n")
            {
                written = Some(killed.elapsed());
            }
            has_addr(&pair.ns_b, &pair.iface_b, vip).then(|| killed.elapsed())
        },
    );
    let written = written.unwrap_or(moved);
    let convicted = convicted.unwrap_or(written);
    eprintln!(
        "keepalived: peer 7 at level 8 {convicted:?} after the kill, track file -254 at {written:?}, \
         BACKUP holds {vip} at {moved:?} ({:?} after the file; advert_int {advert} s)",
        moved.saturating_sub(written)
    );
    assert!(
        moved < Duration::from_secs(3),
        "address moved only {moved:?} after the kill"
    );
    wait_for(
        Duration::from_secs(5),
        "the MASTER giving the address up",
        || (!has_addr(&pair.ns_a, &pair.iface_a, vip)).then_some(()),
    );
}
