//! A fleet in namespaces, for tests/tests/fleet.rs and the fleet benchmark probe.
//!
//! Topology (all namespaces made here and removed on drop, even when a test panics):
//!
//! ```text
//!   senders ns "S"                 observer ns "O1".."On"              NATS ns "N"
//!   veth 10.211.(60+i).2  <---->  10.211.(60+i).1 (XDP watches)
//!                                 10.211.(65+i).1  <---------------->  10.211.(65+i).2
//! ```
//!
//! Each observer namespace has two links: one to the senders (the interface its agent
//! watches) and one to the NATS namespace, where every nats-server listens on all of its
//! addresses. The senders namespace sends each peer's heartbeats to every observer (one
//! `monitor send` per peer and observer), so cutting one peer off from one observer is
//! stopping one process. `monitor fleet` runs in the NATS namespace against 127.0.0.1. No
//! traffic leaves these namespaces. At most 4 observers (subnets 61..=64 and 66..=69).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use monitor::serving::client::Client;
use monitor_common::wire::DEFAULT_PORT;
use serde_json::{Value, json};

use crate::{
    agent_process::{ChildGuard, TempDir},
    monitor_bin,
    netns::ip,
    unique_name,
};

/// One observer's namespace and addresses.
pub struct ObserverNet {
    /// The observer's fleet name (`obs-a`, `obs-b`, ...).
    pub name: String,
    pub ns: String,
    /// The interface its agent watches.
    pub iface: String,
    /// Where senders send its heartbeats.
    pub addr: String,
    /// The NATS namespace's address on this observer's link.
    pub nats_addr: String,
}

pub struct FleetNet {
    pub senders_ns: String,
    pub nats_ns: String,
    pub observers: Vec<ObserverNet>,
    namespaces: Vec<String>,
}

fn link(ns_a: &str, ns_b: &str, addr_a: &str, addr_b: &str) -> (String, String) {
    let (a, b) = (unique_name("hbfa"), unique_name("hbfb"));
    ip(&[
        "link", "add", &a, "netns", ns_a, "type", "veth", "peer", "name", &b, "netns", ns_b,
    ]);
    for (ns, iface, addr) in [(ns_a, &a, addr_a), (ns_b, &b, addr_b)] {
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", iface]);
        ip(&["-n", ns, "link", "set", iface, "up"]);
    }
    (a, b)
}

impl FleetNet {
    /// Makes the namespaces and links for `observers` observers (1 to 4).
    pub fn new(observers: usize) -> Self {
        assert!((1..=4).contains(&observers));
        let mut net = Self {
            senders_ns: unique_name("hbfs"),
            nats_ns: unique_name("hbfn"),
            observers: Vec::new(),
            namespaces: Vec::new(),
        };
        for ns in [net.senders_ns.clone(), net.nats_ns.clone()] {
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            net.namespaces.push(ns);
        }
        for i in 1..=observers {
            let ns = unique_name("hbfo");
            ip(&["netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let addr = format!("10.211.{}.1", 60 + i);
            let (iface, _) = link(&ns, &net.senders_ns, &addr, &format!("10.211.{}.2", 60 + i));
            let nats_addr = format!("10.211.{}.2", 65 + i);
            link(
                &ns,
                &net.nats_ns,
                &format!("10.211.{}.1", 65 + i),
                &nats_addr,
            );
            net.observers.push(ObserverNet {
                name: format!("obs-{}", (b'a' + i as u8 - 1) as char),
                ns,
                iface,
                addr,
                nats_addr,
            });
        }
        net
    }

    /// `program` run inside namespace `ns`.
    pub fn command_in(ns: &str, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// `monitor send` of peer `id` to observer `i`, every 20 ms.
    pub fn sender(&self, id: u64, i: usize) -> ChildGuard {
        let mut cmd = Self::command_in(&self.senders_ns, &monitor_bin());
        cmd.args([
            "send",
            "--to",
            &format!("{}:{DEFAULT_PORT}", self.observers[i].addr),
            "--id",
            &id.to_string(),
            "--interval",
            "20ms",
        ])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        ChildGuard(cmd.spawn().expect("spawn monitor send"))
    }

    /// `monitor fleet --nats URLS ARGS...` in the NATS namespace: its stdout, parsed as JSON.
    pub fn fleet(&self, urls: &str, args: &[&str]) -> Value {
        self.fleet_as(urls, &[], args)
    }

    /// [`FleetNet::fleet`] with credentials (`--nats-user ... --nats-password-file ...`).
    pub fn fleet_as(&self, urls: &str, auth: &[&str], args: &[&str]) -> Value {
        let out = Self::command_in(&self.nats_ns, &monitor_bin())
            .args(["fleet", "--nats", urls])
            .args(auth)
            .args(args)
            .arg("--json")
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .output()
            .expect("spawn monitor fleet");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "monitor fleet {args:?}: {e}: stdout {text:?} stderr {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// A long-running `monitor fleet ... watch` whose JSON lines are collected.
    pub fn watch(&self, urls: &str, args: &[&str]) -> LineCollector {
        self.watch_as(urls, &[], args)
    }

    /// [`FleetNet::watch`] with credentials.
    pub fn watch_as(&self, urls: &str, auth: &[&str], args: &[&str]) -> LineCollector {
        let mut cmd = Self::command_in(&self.nats_ns, &monitor_bin());
        cmd.args(["fleet", "--nats", urls])
            .args(auth)
            .args(["watch", "--json"])
            .args(args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // What interrupts it (a lost node) shows next to the agents' warnings.
            .stderr(Stdio::inherit());
        LineCollector::spawn(cmd)
    }

    /// The NATS client port that observer `i` is connected to now (read with `ss` in the
    /// NATS namespace), if any.
    pub fn connected_port(&self, i: usize, ports: &[u16]) -> Option<u16> {
        let text = self.sockets();
        let peer_prefix = format!("10.211.{}.1:", 65 + i + 1);
        text.lines().find_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // nats-server listens on both families: IPv4 peers look like [::ffff:a.b.c.d]:p.
            let plain = |c: &str| c.replace("[::ffff:", "").replace(']', "");
            let (local, peer) = (plain(cols.get(2)?), plain(cols.get(3)?));
            let port: u16 = local.rsplit(':').next()?.parse().ok()?;
            (peer.starts_with(&peer_prefix) && ports.contains(&port)).then_some(port)
        })
    }

    /// Established TCP connections in the NATS namespace, as `ss -Htn` prints them.
    pub fn sockets(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.nats_ns,
                "ss",
                "-Htn",
                "state",
                "established",
            ])
            .output()
            .expect("ss (iproute2)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Publishes raw bytes on `subject` with the plain NATS protocol, from a thread that
    /// enters the NATS namespace (for bad input: JetStream stores what lands on its
    /// subjects, parsed or not).
    pub fn publish_raw(&self, port: u16, subject: &str, payload: &[u8]) {
        if let Err(e) = self.publish_raw_as(port, None, subject, &[], payload) {
            panic!("{e}");
        }
    }

    /// [`FleetNet::publish_raw`] as a user (`(user, password)`) with `headers`: `Err` with the
    /// server's `-ERR` line (a permissions violation) when it refuses.
    pub fn publish_raw_as(
        &self,
        port: u16,
        user: Option<(&str, &str)>,
        subject: &str,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> Result<(), String> {
        let ns = self.nats_ns.clone();
        let subject = subject.to_string();
        let payload = payload.to_vec();
        let user = user.map(|(u, p)| (u.to_string(), p.to_string()));
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        std::thread::spawn(move || {
            enter_netns(&ns);
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut info = String::new();
            reader.read_line(&mut info).unwrap();
            assert!(info.starts_with("INFO"), "{info}");
            let mut connect = json!({"verbose": false, "pedantic": false, "headers": true});
            if let Some((u, p)) = &user {
                connect["user"] = json!(u);
                connect["pass"] = json!(p);
            }
            write!(s, "CONNECT {connect}\r\nPING\r\n").unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if !line.starts_with("PONG") {
                return Err(line.trim().to_string());
            }
            if headers.is_empty() {
                write!(s, "PUB {subject} {}\r\n", payload.len()).unwrap();
            } else {
                let mut h = String::from("NATS/1.0\r\n");
                for (k, v) in &headers {
                    h.push_str(&format!("{k}: {v}\r\n"));
                }
                h.push_str("\r\n");
                write!(
                    s,
                    "HPUB {subject} {} {}\r\n{h}",
                    h.len(),
                    h.len() + payload.len()
                )
                .unwrap();
            }
            s.write_all(&payload).unwrap();
            s.write_all(b"\r\nPING\r\n").unwrap();
            loop {
                line.clear();
                reader.read_line(&mut line).unwrap();
                if line.starts_with("-ERR") {
                    return Err(line.trim().to_string());
                }
                if line.starts_with("PONG") {
                    return Ok(());
                }
            }
        })
        .join()
        .expect("raw publish")
    }
}

impl FleetNet {
    /// Publishes every `(subject, payload)` in order on one connection, without credentials,
    /// and waits for the server to have taken them all (a PING answered after the last).
    pub fn publish_many_raw(&self, port: u16, messages: Vec<(String, Vec<u8>)>) {
        let ns = self.nats_ns.clone();
        std::thread::spawn(move || {
            enter_netns(&ns);
            let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert!(line.starts_with("INFO"), "{line}");
            let mut out = std::io::BufWriter::new(s);
            write!(out, "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\n").unwrap();
            for (subject, payload) in &messages {
                write!(out, "PUB {subject} {}\r\n", payload.len()).unwrap();
                out.write_all(payload).unwrap();
                out.write_all(b"\r\n").unwrap();
            }
            out.write_all(b"PING\r\n").unwrap();
            out.flush().unwrap();
            loop {
                line.clear();
                assert!(
                    reader.read_line(&mut line).unwrap() > 0,
                    "connection closed"
                );
                assert!(!line.starts_with("-ERR"), "{line}");
                if line.starts_with("PONG") {
                    return;
                }
            }
        })
        .join()
        .expect("raw publish");
    }
}

/// Moves this thread into the network namespace `ns`.
pub fn enter_netns(ns: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    // SAFETY: setns on a namespace fd we hold, for this thread only.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

impl Drop for FleetNet {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Lines of a child's stdout, parsed as JSON, gathered by a thread; the child is killed on
/// drop.
pub struct LineCollector {
    child: Child,
    pub lines: Arc<Mutex<Vec<Value>>>,
}

impl LineCollector {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value =
                    serde_json::from_str(&line).unwrap_or_else(|_| json!({"unparsed": line}));
                sink.lock().unwrap().push(value);
            }
        });
        Self { child, lines }
    }

    pub fn snapshot(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// Whether the child still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for LineCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A nats-server with JetStream in namespace `ns`, its store in a directory of its own;
/// killed (by its pid) on drop.
pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl NatsServer {
    /// A single server on `port`.
    pub fn start(ns: &str, port: u16) -> Self {
        Self::spawn(ns, port, &[], None)
    }

    /// A single server on `port` with `config` (nats-server's configuration syntax, e.g. an
    /// `authorization` block) in a file of its own; the flags still set port and store.
    pub fn start_with_config(ns: &str, port: u16, config: &str) -> Self {
        Self::spawn(ns, port, &[], Some(config))
    }

    /// Node `n` (0-based) of a 3-node cluster on client ports `base..base+3` and cluster
    /// ports `base+1000..`.
    pub fn cluster_node(ns: &str, base: u16, n: u16) -> Self {
        let routes: Vec<String> = (0..3)
            .filter(|&k| k != n)
            .map(|k| format!("nats://127.0.0.1:{}", base + 1000 + k))
            .collect();
        let name = format!("node{n}");
        let cluster = format!("nats://0.0.0.0:{}", base + 1000 + n);
        let routes = routes.join(",");
        let http = (base + 4000 + n).to_string();
        Self::spawn(
            ns,
            base + n,
            &[
                "-m",
                &http,
                "-n",
                &name,
                "--cluster_name",
                "hbm-fleet",
                "--cluster",
                &cluster,
                "--routes",
                &routes,
            ],
            None,
        )
    }

    fn spawn(ns: &str, port: u16, extra: &[&str], config: Option<&str>) -> Self {
        let dir = TempDir::new("hbmnats");
        let log = dir.0.join("nats.log");
        let mut cmd = FleetNet::command_in(ns, std::path::Path::new("nats-server"));
        if let Some(config) = config {
            let path = dir.0.join("nats.conf");
            std::fs::write(&path, config).expect("write nats.conf");
            cmd.arg("-c").arg(path);
        }
        let child = cmd
            .args(["-js", "-a", "0.0.0.0", "-p", &port.to_string(), "-sd"])
            .arg(dir.0.join("store"))
            .args(extra)
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server (cargo xtask setup installs it)");
        let mut server = Self {
            child: Some(child),
            port,
            log,
            _dir: dir,
        };
        server.wait_for_log("Server is ready", Duration::from_secs(10));
        server
    }

    /// The server's JetStream report (`/jsz` of its monitoring port, `base + 4000 + n` for
    /// a cluster node): streams, their leaders and replicas, and consumers, as JSON.
    pub fn jsz(ns: &str, http_port: u16) -> Value {
        let out = FleetNet::command_in(ns, std::path::Path::new("curl"))
            .args(["-s", "-m", "2"])
            .arg(format!(
                "http://127.0.0.1:{http_port}/jsz?consumers=true&config=false"
            ))
            .output();
        out.ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    /// Waits until the server's log has `text`.
    pub fn wait_for_log(&mut self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait().expect("try_wait")
            {
                panic!("nats-server exited with {status}: {}", self.log_text());
            }
            if self.log_text().contains(text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server: no {text:?} in its log within {within:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// Kills the server at once (SIGKILL), as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log_text();
            // The whole log outlives the store's temp dir, for a look at the elections.
            let kept = std::env::temp_dir().join(format!(
                "hbm-nats-{}-{}.log",
                std::process::id(),
                self.port
            ));
            if std::fs::write(&kept, &log).is_ok() {
                eprintln!(
                    "--- nats-server on port {}: whole log in {}",
                    self.port,
                    kept.display()
                );
            }
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- nats-server on port {} (last lines, newest first):",
                self.port
            );
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

/// A `monitor run --nats ...` in an observer's namespace; killed on drop.
pub struct Observer {
    child: Option<Child>,
    pub socket: PathBuf,
    _dir: TempDir,
}

impl Observer {
    /// Starts the agent on the observer's link with `--nats URLS --observer NAME` and
    /// `extra`, and waits until its socket answers.
    pub fn start(o: &ObserverNet, urls: &str, extra: &[&str]) -> Self {
        let dir = TempDir::new("hbmfleet");
        let socket = dir.0.join("agent.sock");
        let mut cmd = FleetNet::command_in(&o.ns, &monitor_bin());
        cmd.args(["run", "--iface", &o.iface, "--socket"])
            .arg(&socket)
            .args(["--nats", urls, "--observer", &o.name])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("FLEET_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        let mut observer = Self {
            child: Some(cmd.spawn().expect("spawn monitor run")),
            socket,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(observer.alive(), "monitor run {} exited early", o.name);
            if observer.ask(json!({"op": "stats"})).is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "{} did not answer", o.name);
            std::thread::sleep(Duration::from_millis(50));
        }
        observer
    }

    /// One request on the agent's socket; `None` when it does not answer.
    pub fn ask(&self, request: Value) -> Option<Value> {
        Client::connect(&self.socket)
            .ok()?
            .request(&request)
            .ok()
            .filter(|r| r["ok"] == json!(true))
    }

    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("try_wait").is_none())
    }

    /// Kills the agent at once (SIGKILL), as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `crate::wait_for` with the arguments in the order the fleet tests read best.
pub fn wait_for<T>(what: &str, within: Duration, check: impl FnMut() -> Option<T>) -> T {
    crate::wait_for(within, what, check)
}

/// The ids in a `query suspects --json` reply.
pub fn suspect_ids(reply: &Value) -> Vec<u64> {
    reply["suspects"]
        .as_array()
        .unwrap_or_else(|| panic!("no suspects in {reply}"))
        .iter()
        .map(|s| s["id"].as_u64().expect("id"))
        .collect()
}

/// Events from `watch --events --json`, grouped by observer: (seq, event) in arrival order.
pub fn events_by_observer(lines: &[Value]) -> BTreeMap<String, Vec<(u64, Value)>> {
    let mut out: BTreeMap<String, Vec<(u64, Value)>> = BTreeMap::new();
    for l in lines {
        if let (Some(o), Some(seq)) = (l["observer"].as_str(), l["seq"].as_u64()) {
            out.entry(o.to_string()).or_default().push((seq, l.clone()));
        }
    }
    out
}
