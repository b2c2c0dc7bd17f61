//! HAProxy's own health checks against the agent-check, side by side in one HAProxy, on one
//! path: three HTTP backends, each also a heartbeat peer; backend `checks` has them with
//! `check inter 100ms fall 3 rise 2`, backend `agent` has the same three with
//! `agent-check agent-inter 100ms` answered by `monitor haproxy-agent`; steady load through
//! both. The backends' path (their namespace's egress) is a 4 Mbit/s TBF with 200 ms of
//! buffer, the congestion of `cargo xtask traces`:
//! - congestion: for a while, bursts of 8 Mbit/s iperf3 UDP cross traffic share that link
//!   with everything else; every backend stays alive, so each DOWN is a false one. HAProxy's
//!   checks time out behind the queue (a check has `inter`, 100 ms, to complete); heartbeats
//!   are only late, and the agent has learnt that lateness. Asserted: no false DOWN through the
//!   agent, and some through the checks (else the congestion did not bite and the run shows
//!   nothing).
//! - kill: then, on the calm path, one backend is killed (its server and its heartbeats
//!   together), and the time from the kill to each backend's DOWN is measured; the agent's
//!   DOWN is asserted within a second (its detection time plus an agent interval).
//!
//! Short by default (`cargo xtask test`); `cargo xtask consumers` runs it for minutes and many
//! kills, through `HBM_CONSUMERS_SECONDS` (congestion), `HBM_CONSUMERS_KILLS` and
//! `HBM_CONSUMERS_SEED`, and makes docs/consumers.md's table from the `consumers-row` lines.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    cross_traffic::{Bursts, bursts, iperf_server, setting},
    daemon::{Daemon, enter_netns},
    haproxy::{Backend, agent_responder, col, get, num, show_stat, write_backend_py},
    netns::{NetnsPair, ip},
    require_root, wait_for,
};
use serde_json::json;

/// Heartbeats every 10 ms and a floor of 20 ms on the deviation put level 8 about 120 ms
/// after the last heartbeat on a calm path; a 10 ms sweep adds little to it.
const HEARTBEAT: &str = "10ms";
const AGENT_ARGS: [&str; 4] = ["--min-std-ms", "20", "--sweep-interval", "10ms"];
const AGENT_PORT: u16 = 19_778;
const FRONT_CHECKS: u16 = 18_081;
const FRONT_AGENT: u16 = 18_082;
const IPERF_PORT: u16 = 5201;

/// One line of HAProxy's log about a server's state, when it was read.
#[derive(Debug, Clone)]
struct Change {
    at: Instant,
    server: String,
    /// `DOWN`, `UP`, or the admin states the agent sets (`DRAIN`, `READY`).
    state: String,
    line: String,
}

/// Server state changes as HAProxy prints them in the foreground (`-db`), e.g.
/// `[WARNING]  (12) : Server agent/a2 is DOWN, reason: ...` or `Server agent/a1 is going
/// DRAIN`, timestamped as they are read.
fn parse_change(line: &str) -> Option<(String, String)> {
    let rest = &line[line.find("Server ")? + "Server ".len()..];
    let (server, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix("is ")?;
    let rest = rest.strip_prefix("going ").unwrap_or(rest);
    let state: String = rest
        .chars()
        .take_while(|c| c.is_ascii_uppercase())
        .collect();
    (!state.is_empty()).then(|| (server.to_string(), state))
}

fn read_changes(child: &mut Child, into: Arc<Mutex<Vec<Change>>>) -> thread::JoinHandle<()> {
    let stderr = child.stderr.take().expect("piped stderr");
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some((server, state)) = parse_change(&line) {
                into.lock().unwrap().push(Change {
                    at: Instant::now(),
                    server,
                    state,
                    line,
                });
            }
        }
    })
}

/// What the load saw through one frontend.
#[derive(Default)]
struct Load {
    sent: u64,
    failed: u64,
}

#[test]
fn under_congestion_the_agent_check_marks_no_live_backend_down_where_haproxys_checks_do() {
    require_root();
    let congested = Duration::from_secs(setting("HBM_CONSUMERS_SECONDS", 10));
    let kills = setting("HBM_CONSUMERS_KILLS", 1);
    let mut rng = fastrand::Rng::with_seed(setting("HBM_CONSUMERS_SEED", 1));

    // Declared first, dropped last: every process stops before the namespaces go.
    let pair = NetnsPair::named(89, ["hbcga", "hbcgb"], ["hbcgva", "hbcgvb"]);
    let dir = TempDir::new("hbcongest");
    let peers = dir.peers_file([1, 2, 3]);
    let mut agent_args = vec!["--peers", peers.as_str()];
    agent_args.extend(AGENT_ARGS);
    let agent = AgentProcess::start(&pair, &agent_args);
    let backend_py = write_backend_py(&dir.0);

    // The backends' egress: what their replies, check answers and heartbeats all cross.
    ip(&[
        "netns",
        "exec",
        &pair.ns_b,
        "tc",
        "qdisc",
        "add",
        "dev",
        &pair.iface_b,
        "root",
        "tbf",
        "rate",
        "4mbit",
        "burst",
        "16kb",
        "latency",
        "200ms",
    ]);

    let start_backend = |i: u64| -> Backend {
        let log = dir.0.join(format!("backend{i}.log"));
        Backend::start(&pair, &backend_py, i, &log, HEARTBEAT)
    };
    let mut backends: Vec<Backend> = (1..=3).map(start_backend).collect();

    let _responder = agent_responder(&pair, AGENT_PORT, agent.socket());

    let stats = dir.0.join("haproxy.sock");
    // A congested path is slow, not dead: requests wait for their connection (1 s), and one
    // that finds its server down is retried on another.
    let mut cfg = format!(
        "global\n  stats socket {} level admin\n  maxconn 2000\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n  \
         retries 2\n  option redispatch 1\n\
         frontend web_checks\n  bind 127.0.0.1:{FRONT_CHECKS}\n  default_backend checks\n\
         frontend web_agent\n  bind 127.0.0.1:{FRONT_AGENT}\n  default_backend agent\n",
        stats.display()
    );
    cfg.push_str("backend checks\n  balance roundrobin\n");
    for i in 1..=3 {
        cfg.push_str(&format!(
            "  server c{i} {}:{} weight 100 check inter 100ms fall 3 rise 2\n",
            pair.addr_b,
            8000 + i
        ));
    }
    cfg.push_str("backend agent\n  balance roundrobin\n");
    for i in 1..=3 {
        cfg.push_str(&format!(
            "  server a{i} {}:{} weight 100 agent-check agent-addr 127.0.0.1 \
             agent-port {AGENT_PORT} agent-inter 100ms agent-send \"{i}\\n\"\n",
            pair.addr_b,
            8000 + i
        ));
    }
    let cfg_path = dir.0.join("haproxy.cfg");
    std::fs::write(&cfg_path, cfg).unwrap();
    let mut hap = NetnsPair::command_in(&pair.ns_a, Path::new("haproxy"));
    hap.arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut haproxy = Daemon::new(hap.spawn().expect("haproxy"));
    let changes = Arc::new(Mutex::new(Vec::<Change>::new()));
    let _reader = read_changes(&mut haproxy.child, changes.clone());

    let all_up = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = show_stat(&stats);
            let up = (1..=3).all(|i| {
                let (c, a) = (format!("checks/c{i}"), format!("agent/a{i}"));
                col(&s, &c, "status") == "UP"
                    && col(&s, &a, "last_agt").starts_with("via agent : up")
                    // A server with no health check of its own is "no check" while up.
                    && col(&s, &a, "status") == "no check"
                    && num(&s, &a, "weight") == 100
            });
            if up {
                return;
            }
            let seen: Vec<String> = (1..=3)
                .flat_map(|i| [format!("checks/c{i}"), format!("agent/a{i}")])
                .map(|srv| {
                    format!(
                        "{srv}: {} {:?} {:?} weight {}",
                        col(&s, &srv, "status"),
                        col(&s, &srv, "last_chk"),
                        col(&s, &srv, "last_agt"),
                        col(&s, &srv, "weight")
                    )
                })
                .collect();
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {seen:#?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    };
    all_up("every server up, by its checks and by the agent");

    // Steady load through each frontend: 2 clients, one request each per 10 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Arc<Mutex<[Load; 2]>> = Arc::default();
    let loaders: Vec<_> = [(0, FRONT_CHECKS), (1, FRONT_AGENT)]
        .into_iter()
        .flat_map(|f| [f, f])
        .map(|(which, port)| {
            let (stop, loads, ns) = (stop.clone(), loads.clone(), pair.ns_a.clone());
            thread::spawn(move || {
                enter_netns(&ns);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ok = get(port).is_some();
                    {
                        let mut l = loads.lock().unwrap();
                        l[which].sent += 1;
                        l[which].failed += u64::from(!ok);
                    }
                    thread::sleep(Duration::from_millis(10).saturating_sub(started.elapsed()));
                }
            })
        })
        .collect();
    wait_for(
        Duration::from_secs(10),
        "load through both frontends",
        || {
            let l = loads.lock().unwrap();
            (l[0].sent > 50 && l[1].sent > 50).then_some(())
        },
    );

    // The agent's own events: how high the live peers' suspicion went (a level below the
    // policy's `down` reduces a weight or drains; it is not a DOWN, but it is not nothing).
    let suspicions = Arc::new(Mutex::new(Vec::<(Instant, u64, f64)>::new()));
    let watcher = {
        let (mut events, stop, into) = (agent.subscribe(), stop.clone(), suspicions.clone());
        events
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(line) = events.read_line() else {
                    continue;
                };
                let event: serde_json::Value = serde_json::from_str(&line).unwrap();
                if event["event"] == "suspect" {
                    into.lock().unwrap().push((
                        Instant::now(),
                        event["id"].as_u64().unwrap(),
                        event["level"].as_f64().unwrap(),
                    ));
                }
            }
        })
    };

    // --- Congestion: bursts of cross traffic; nobody dies, so every DOWN is false.
    let _iperf_server = iperf_server(&pair, IPERF_PORT);
    let load_before = {
        let l = loads.lock().unwrap();
        [(l[0].sent, l[0].failed), (l[1].sent, l[1].failed)]
    };
    let begun = Instant::now();
    // The first burst at once (a short run has room for one or two), the next 2-8 s after
    // each, 1-4 s long, as `cargo xtask traces` schedules them.
    let Bursts {
        count: bursts,
        time: burst_time,
    } = bursts(
        &pair,
        IPERF_PORT,
        congested,
        &mut rng,
        &["-b".into(), "8M".into()],
    );
    // The last burst's queue drains and the checks rise again (rise 2).
    all_up("every server up again after the congestion");
    let ended = Instant::now();
    let load_after = {
        let l = loads.lock().unwrap();
        [(l[0].sent, l[0].failed), (l[1].sent, l[1].failed)]
    };
    let during: Vec<Change> = changes
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.at >= begun && c.at <= ended)
        .cloned()
        .collect();
    let count = |prefix: &str, state: &str| {
        during
            .iter()
            .filter(|c| c.server.starts_with(prefix) && c.state == state)
            .count()
    };
    let (checks_down, agent_down) = (count("checks/", "DOWN"), count("agent/", "DOWN"));
    let agent_drain = count("agent/", "DRAIN");
    let s = show_stat(&stats);
    let chkdown = |prefix: &str| -> u64 {
        (1..=3)
            .map(|i| num(&s, &format!("{prefix}{i}"), "chkdown"))
            .sum()
    };
    // Time with no server at all in the backend: every request of it then failed (503).
    let none_left = |prefix: &str| {
        during
            .iter()
            .filter(|c| c.server.starts_with(prefix) && c.line.contains(" 0 active and"))
            .count()
    };
    let raised = |level: f64| {
        suspicions
            .lock()
            .unwrap()
            .iter()
            .filter(|&&(at, _, l)| at >= begun && at <= ended && l == level)
            .count()
    };
    let (level1, level3, level8) = (raised(1.0), raised(3.0), raised(8.0));
    let failed = |f: usize| load_after[f].1 - load_before[f].1;
    let sent = |f: usize| load_after[f].0 - load_before[f].0;
    eprintln!(
        "congestion: {bursts} bursts, {burst_time:?} of cross traffic in {:?}; false DOWNs: checks \
         {checks_down} (chkdown {}, backend left empty {} times), agent {agent_down} (chkdown {}; \
         drains {agent_drain}; suspicions of live peers at level 1 {level1}, 3 {level3}, \
         8 {level8}); requests failed: checks {} of {}, agent {} of {}",
        ended - begun,
        chkdown("checks/c"),
        none_left("checks/"),
        chkdown("agent/a"),
        failed(0),
        sent(0),
        failed(1),
        sent(1),
    );
    for c in &during {
        eprintln!("  +{:?} {}", c.at - begun, c.line);
    }
    println!(
        "consumers-row {}",
        json!({"phase": "congestion", "seconds": (ended - begun).as_secs_f64(), "bursts": bursts,
               "burst_seconds": burst_time.as_secs_f64(),
               "checks_down": checks_down, "agent_down": agent_down, "agent_drain": agent_drain,
               "level1": level1, "level3": level3, "level8": level8,
               "checks_empty": none_left("checks/"), "agent_empty": none_left("agent/"),
               "checks_failed": failed(0), "checks_sent": sent(0),
               "agent_failed": failed(1), "agent_sent": sent(1)})
    );

    // --- Kills on the calm path: backend 2's server and heartbeats together.
    let mut agent_times = Vec::new();
    for k in 0..kills {
        // Heard for a while: the window holds the calm path again, not the congestion.
        thread::sleep(Duration::from_secs(3));
        let victim = backends.remove(1);
        let killed = Instant::now();
        let Backend {
            mut server,
            mut heartbeats,
        } = victim;
        let _ = server.child.kill();
        let _ = heartbeats.0.kill();
        let _ = server.child.wait();
        let _ = heartbeats.0.wait();
        let down_of = |name: &str| {
            changes
                .lock()
                .unwrap()
                .iter()
                .find(|c| c.at >= killed && c.server == name && c.state == "DOWN")
                .map(|c| (c.at - killed, c.line.clone()))
        };
        let ((checks, _), (agent_t, agent_line)) = wait_for(
            Duration::from_secs(10),
            "both servers of backend 2 DOWN",
            || Some((down_of("checks/c2")?, down_of("agent/a2")?)),
        );
        eprintln!(
            "kill {}: DOWN after {checks:?} by the checks, {agent_t:?} by the agent ({agent_line})",
            k + 1
        );
        println!(
            "consumers-row {}",
            json!({"phase": "kill", "kill": k + 1, "checks_ms": checks.as_secs_f64() * 1e3,
                   "agent_ms": agent_t.as_secs_f64() * 1e3})
        );
        assert!(
            agent_line.contains("via agent : down (peer 2 level 8"),
            "{agent_line}"
        );
        agent_times.push(agent_t);
        // The event watcher that counted none under congestion does see a real conviction.
        wait_for(
            Duration::from_secs(5),
            "the watcher seeing peer 2 at 8",
            || {
                suspicions
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|&(at, id, level)| at >= killed && id == 2 && level == 8.0)
                    .then_some(())
            },
        );
        // Back for the next kill: a new server and a new incarnation of the peer.
        backends.insert(1, start_backend(2));
        all_up("backend 2 up again");
    }

    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.join().unwrap();
    }
    watcher.join().unwrap();
    assert_eq!(
        agent_down, 0,
        "the agent-check marked live backends DOWN under congestion: {during:#?}"
    );
    assert!(
        checks_down > 0,
        "HAProxy's own checks never went DOWN: the congestion did not bite, and the run shows \
         nothing (bursts {bursts}, {burst_time:?})"
    );
    for t in agent_times {
        assert!(
            t < Duration::from_secs(1),
            "the agent-check took {t:?} to mark a dead backend DOWN"
        );
    }
    drop(backends);
}
