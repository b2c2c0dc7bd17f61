//! The socket under abuse by a local user it serves (issue 21): connections held idle by the
//! thousand, subscribers that never read, clients that never read a long reply. Root keeps
//! being answered promptly, the agent's memory stays bounded, and whoever is over a cap, idle
//! or not reading is told or cut off. Each test runs the real agent on a real Unix socket; the
//! attacker is `hbm-sockhog` running as another uid (in the socket's group).

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::{fs::PermissionsExt, net::UnixStream, process::CommandExt},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    http::get_in,
    netns::NetnsPair,
    require_root, wait_for,
};
use serde_json::{Value, json};

/// nobody:nogroup, and a stranger in nogroup: two uids the socket serves with
/// `--socket-group nogroup`.
const NOBODY: u32 = 65534;
/// What a request of root's may take before it counts as stalled behind an attacker: a fifth
/// of the socket's write timeout, the shortest wait an attacker could impose.
const STALL_MS: f64 = 2_000.0;
const NOGROUP: u32 = 65534;
const STRANGER: u32 = 4242;

/// An `hbm-sockhog` holding connections as `uid`; they are let go when it is dropped.
struct Hog {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Hog {
    fn start(agent: &AgentProcess, uid: u32, idle: usize, subscribers: usize) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hbm-sockhog"))
            .arg(agent.socket())
            .args([idle.to_string(), subscribers.to_string()])
            .uid(uid)
            .gid(NOGROUP)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hbm-sockhog");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Its next report line (`subscribers ...`, then `idle ...`), as `key=value` pairs.
    fn report(&self, what: &str, limit: Duration) -> std::collections::HashMap<String, String> {
        let line = self.lines.recv_timeout(limit).unwrap_or_else(|_| {
            panic!("hbm-sockhog gave no `{what}` report within {limit:?}: its connections stalled")
        });
        assert!(line.starts_with(what), "expected `{what} ...`, got {line}");
        let mut fields = std::collections::HashMap::new();
        let mut rest = line[what.len()..].trim_start();
        // `refusal=` comes last and is a whole JSON line with spaces in it.
        while !rest.is_empty() {
            let (key, value) = rest.split_once('=').expect("key=value");
            if key == "refusal" {
                fields.insert(key.to_string(), value.to_string());
                break;
            }
            let (value, next) = value.split_once(' ').unwrap_or((value, ""));
            fields.insert(key.to_string(), value.to_string());
            rest = next;
        }
        fields
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(fields: &std::collections::HashMap<String, String>, key: &str) -> usize {
    fields[key].parse().expect("a count")
}

/// An agent serving `nogroup` too, with its socket's directory open to other users.
fn start(pair: &NetnsPair, extra: &[&str]) -> AgentProcess {
    let mut args = vec!["--socket-group", "nogroup"];
    args.extend_from_slice(extra);
    let agent = AgentProcess::start(pair, &args);
    std::fs::set_permissions(
        agent.socket().parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    agent
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Root asks `request` `n` times, each on a connection of its own (so each goes through
/// accept too); the answers' times, sorted, in ms.
fn root_latencies(agent: &AgentProcess, request: &Value, n: usize) -> Vec<f64> {
    let mut took: Vec<f64> = (0..n)
        .map(|_| {
            let started = Instant::now();
            let reply = agent.ask(request.clone());
            let ms = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(reply["ok"], json!(true), "{reply}");
            ms
        })
        .collect();
    took.sort_by(f64::total_cmp);
    took
}

fn p99(sorted: &[f64]) -> f64 {
    let rank = ((sorted.len() as f64) * 0.99).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One attack: `idle` connections and `subscribers` mute subscribers from nobody, then root's
/// `peer` and `stats`, 50 of each. Returns what the hog reported.
fn attack(
    agent: &AgentProcess,
    idle: usize,
    subscribers: usize,
) -> (
    Hog,
    std::collections::HashMap<String, String>,
    std::collections::HashMap<String, String>,
) {
    // Warm: the first requests fault in what every request touches.
    root_latencies(agent, &json!({"op": "peer", "id": 7}), 50);
    root_latencies(agent, &json!({"op": "stats"}), 50);
    let idle_rss = rss_kib(agent.pid());
    let hog = Hog::start(agent, NOBODY, idle, subscribers);
    let subs = hog.report("subscribers", Duration::from_secs(60));
    let held = hog.report("idle", Duration::from_secs(10));
    let peer = root_latencies(agent, &json!({"op": "peer", "id": 7}), 50);
    let stats = root_latencies(agent, &json!({"op": "stats"}), 50);
    let rss = rss_kib(agent.pid());
    println!(
        "{idle} idle + {subscribers} mute subscribers from uid {NOBODY}: subscribers {subs:?}, idle {held:?}; \
         root's peer p99 {:.2} ms (max {:.2}), stats p99 {:.2} ms (max {:.2}); agent RSS {idle_rss} KiB idle, {rss} KiB under attack",
        p99(&peer),
        peer[peer.len() - 1],
        p99(&stats),
        stats[stats.len() - 1],
    );
    // A stall here is root waiting for an attacker's connection to give up its place: a
    // write timeout (10 s) or an idle timeout (60 s). Every one of root's requests finishes
    // far inside the shorter of those; how fast it is, on a machine others share, is the
    // attack table's figure (`cargo xtask attack`), not an assertion.
    for (what, took) in [("peer", &peer), ("stats", &stats)] {
        let slowest = took[took.len() - 1];
        assert!(
            slowest < STALL_MS,
            "root's {what} took {slowest:.0} ms: it waited on the attacker's connections"
        );
    }
    assert!(
        rss <= 2 * idle_rss,
        "the agent's RSS grew from {idle_rss} KiB to {rss} KiB"
    );
    integration_tests::attack::AttackRow {
        attack: "idle connections and subscribers that never read, one local uid",
        load: format!(
            "{idle} idle + {subscribers} mute subscribers, {} held",
            count(&held, "open") + count(&subs, "subscribed")
        ),
        query_p99_ms: Some(p99(&peer).max(p99(&stats))),
        agent_rss_mib: Some(rss as f64 / 1024.0),
        idle_rss_mib: Some(idle_rss as f64 / 1024.0),
        ..Default::default()
    }
    .report();
    (hog, subs, held)
}

/// 1,000 idle connections and 100 subscribers that never read, from one uid the socket serves:
/// with the default caps it gets 64 and is told why for the rest, at once; with caps raised
/// to let all of them in, root's answers are as prompt and the agent's memory as bounded.
/// Before the caps (256 clients at once, waited for *before* accept), the hog's connections
/// stalled in the backlog and root's `stats` got no answer at all.
#[test]
fn a_thousand_idle_connections_and_a_hundred_mute_subscribers_do_not_stall_root() {
    require_root();
    let pair = NetnsPair::new(57);
    let dir = TempDir::new("hbmhog");
    let peers = dir.peers_file(1..=100);

    let agent = start(&pair, &["--peers", &peers]);
    let (hog, subs, held) = attack(&agent, 1000, 100);
    // Accept is in order: the 64 first idle connections are held, every later one refused.
    assert_eq!(count(&held, "open"), 64, "{held:?}");
    assert_eq!(count(&held, "refused"), 936, "{held:?}");
    assert_eq!(
        held["refusal"],
        r#"{"error":"too many connections from uid 65534 (limit 64)","ok":false}"#
    );
    assert_eq!(count(&subs, "refused"), 100, "{subs:?}");
    assert_eq!(held["refusal"], subs["refusal"]);
    drop(hog);
    drop(agent);

    // Room for all of them: still no stall, and memory stays bounded.
    let agent = start(
        &pair,
        &[
            "--peers",
            &peers,
            "--socket-max-clients",
            "4096",
            "--socket-max-per-uid",
            "2000",
        ],
    );
    let (hog, subs, held) = attack(&agent, 1000, 100);
    assert_eq!(count(&held, "open"), 1000, "{held:?}");
    assert_eq!(count(&subs, "subscribed"), 100, "{subs:?}");
    let stats = agent.ask(json!({"op": "stats"}));
    assert_eq!(stats["stats"]["subscribers"], json!(100), "{stats}");
    drop(hog);
}

/// A connection over a cap is answered with an error line naming the cap, at once, and closed;
/// other uids keep theirs, root keeps its reserve, and a connection given back is reusable.
#[test]
fn connections_over_a_cap_are_told_which_at_once_and_closed() {
    require_root();
    let pair = NetnsPair::new(58);
    // 80 at once, of which 70 for the uids other than root; 64 for each of them.
    let agent = start(
        &pair,
        &[
            "--socket-max-clients",
            "80",
            "--socket-max-per-uid",
            "64",
            "--metrics-addr",
            "127.0.0.1:9464",
        ],
    );
    // Each hog's last connection (a subscriber) is answered after every one before it.
    let nobody = Hog::start(&agent, NOBODY, 100, 1);
    let subs = nobody.report("subscribers", Duration::from_secs(30));
    let held = nobody.report("idle", Duration::from_secs(10));
    assert_eq!(
        (count(&held, "open"), count(&held, "refused")),
        (64, 36),
        "{held:?}"
    );
    assert_eq!(
        held["refusal"],
        r#"{"error":"too many connections from uid 65534 (limit 64)","ok":false}"#
    );
    assert_eq!(count(&subs, "refused"), 1);

    let stranger = Hog::start(&agent, STRANGER, 10, 1);
    let subs = stranger.report("subscribers", Duration::from_secs(30));
    let held = stranger.report("idle", Duration::from_secs(10));
    assert_eq!(
        (count(&held, "open"), count(&held, "refused")),
        (6, 4),
        "{held:?}"
    );
    assert_eq!(
        held["refusal"],
        r#"{"error":"too many connections from users other than root and uid 0 (limit 70)","ok":false}"#
    );
    assert_eq!(count(&subs, "refused"), 1);

    // Root's reserve: ten more connections, each answered, then the total.
    let mut root: Vec<_> = (0..10).map(|_| agent.client()).collect();
    for client in &mut root {
        let reply = client.request(&json!({"op": "stats"})).expect("stats");
        assert_eq!(reply["ok"], json!(true));
    }
    let mut over = UnixStream::connect(agent.socket()).expect("connect");
    let mut line = String::new();
    over.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    BufReader::new(&over).read_line(&mut line).expect("read");
    assert_eq!(
        line,
        "{\"error\":\"too many connections (limit 80)\",\"ok\":false}\n"
    );
    let mut rest = Vec::new();
    assert_eq!(over.read_to_end(&mut rest).expect("EOF"), 0, "then closed");

    // Connections given back are taken again.
    drop(nobody);
    wait_for(Duration::from_secs(10), "a place given back", || {
        let reply = agent.client().request(&json!({"op": "stats"})).ok()?;
        (reply["ok"] == json!(true)).then_some(())
    });
    let (_, metrics) = get_in(&pair.ns_a, "127.0.0.1:9464", "/metrics", &[]).expect("metrics");
    for (reason, n) in [("uid_limit", 37), ("shared_limit", 5)] {
        let series = format!("heartbeat_monitor_socket_refusals_total{{reason=\"{reason}\"}} {n}");
        assert!(metrics.contains(&series), "no {series} in\n{metrics}");
    }
    assert!(
        metrics.contains("heartbeat_monitor_socket_refusals_total{reason=\"total_limit\"}"),
        "{metrics}"
    );
    drop((stranger, root));
}

/// Whether the other end of `stream` has closed, waiting at most `limit` (poll for POLLRDHUP,
/// which is set however much unread data is left).
fn closed_within(stream: &UnixStream, limit: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut fd, 1, limit.as_millis() as i32) };
    n == 1 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// A connection that sends no request for the idle timeout is told so and closed, while a
/// subscriber that hears nothing for longer is not idle; a client that never reads a long
/// reply is cut off after the write timeout, having pinned at most a chunk of it.
#[test]
fn idle_connections_are_closed_and_clients_that_never_read_are_cut_off() {
    require_root();
    let pair = NetnsPair::new(59);
    let dir = TempDir::new("hbmidle");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file(1..=5000),
            // A timeout of ten minutes: the silent peers raise no events, and the subscriber
            // below hears nothing for longer than the idle timeout.
            "--model",
            "fixed",
            "--timeout-ms",
            "600000",
            "--socket-idle-timeout",
            "300ms",
            "--socket-write-timeout",
            "300ms",
            "--metrics-addr",
            "127.0.0.1:9464",
        ],
    );
    let mut events = agent.subscribe();
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    let mut idle = agent.client();
    // Timed from before the request is sent: the agent's idle clock starts once it has
    // written the reply, which is after this and before the reply reaches us (timed from the
    // reply read, the close came 298.6 ms "after" it once: the reply's transit short).
    let asked = Instant::now();
    assert_eq!(
        idle.request(&json!({"op": "stats"})).unwrap()["ok"],
        json!(true)
    );
    let said = idle.read_line().expect("a line before closing");
    let after = asked.elapsed();
    assert_eq!(
        said,
        r#"{"error":"idle: no request for 300 ms, closing","ok":false}"#
    );
    assert!(
        matches!(
            idle.read_line(),
            Err(monitor::serving::client::ClientError::Closed)
        ),
        "then closed"
    );
    assert!(
        after >= Duration::from_millis(300) && after < Duration::from_secs(5),
        "closed {after:?} after the last request"
    );
    // The subscriber has been quiet for longer than that, and is still served.
    agent.ask(json!({"op": "forget", "id": 1}));
    let event: Value = serde_json::from_str(&events.read_line().expect("an event")).unwrap();
    assert_eq!(event["event"], json!("forget"), "{event}");

    // `peers` of 5,000 (about 2 MB) to a client that never reads: cut off.
    let mut mute = UnixStream::connect(agent.socket()).expect("connect");
    mute.write_all(b"{\"op\":\"peers\"}\n").unwrap();
    let asked = Instant::now();
    assert!(
        closed_within(&mute, Duration::from_secs(10)),
        "a client that never reads its reply was not cut off"
    );
    let after = asked.elapsed();
    let mut got = Vec::new();
    mute.read_to_end(&mut got).expect("what was sent");
    assert!(
        !got.is_empty() && !got.ends_with(b"\n") && got.len() < 2_000_000,
        "{} bytes of the reply, then the end",
        got.len()
    );
    println!(
        "a client that never read its 5,000-peer reply was cut off after {after:?}, {} bytes sent",
        got.len()
    );
    // A client that reads gets the whole reply, byte for byte what it always was.
    let peers = agent.ask(json!({"op": "peers"}));
    assert_eq!(peers["peers"].as_array().map(Vec::len), Some(4999));

    let (_, metrics) = get_in(&pair.ns_a, "127.0.0.1:9464", "/metrics", &[]).expect("metrics");
    for reason in ["idle", "write_timeout"] {
        let series = format!("heartbeat_monitor_socket_cutoffs_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&series), "no {series} in\n{metrics}");
    }
}
