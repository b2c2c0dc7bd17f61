//! A `monitor run` process inside a namespace, killed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use monitor::serving::client::Client;
use serde_json::{Value, json};

use crate::{monitor_bin, netns::NetnsPair};

pub struct AgentProcess {
    child: Child,
    pub socket: PathBuf,
    _dir: TempDir,
}

/// A directory under /tmp removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(crate::unique_name(tag));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
}

impl TempDir {
    /// Writes a peers file (one id a line) in this directory; returns its path as an argument.
    pub fn peers_file(&self, ids: impl IntoIterator<Item = u64>) -> String {
        let path = self.0.join("peers");
        let text: String = ids.into_iter().map(|id| format!("{id}\n")).collect();
        std::fs::write(&path, format!("# test peers\n{text}")).expect("write peers file");
        path.display().to_string()
    }

    /// Writes `text` as the `--config` file in this directory (again, to change it); returns
    /// its path as an argument.
    pub fn config_file(&self, text: &str) -> String {
        let path = self.0.join("monitor.toml");
        std::fs::write(&path, text).expect("write config file");
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A bpf filesystem mounted on a fresh directory (`ip netns exec` remounts /sys, so tests
/// cannot rely on /sys/fs/bpf), unmounted on drop.
pub struct Bpffs(pub TempDir);

impl Bpffs {
    pub fn mount() -> Self {
        let dir = TempDir::new("hbmbpffs");
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&dir.0)
            .status()
            .expect("spawn mount");
        assert!(status.success(), "mount -t bpf");
        Self(dir)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0.0).status();
    }
}

/// Whether an XDP program is attached to the pair's `a` end (`ip link` shows it).
pub fn xdp_attached(pair: &NetnsPair) -> bool {
    let out = Command::new("ip")
        .args(["-n", &pair.ns_a, "link", "show", &pair.iface_a])
        .output()
        .expect("spawn ip");
    String::from_utf8_lossy(&out.stdout).contains("xdp")
}

/// `monitor detach` of the pair's `a` end and the state pinned at `pins`, as an operator runs
/// it; its output, for the caller to judge.
pub fn detach(pair: &NetnsPair, pins: &str) -> std::process::Output {
    Command::new(monitor_bin())
        .args(["detach", "--iface", &pair.iface_a, "--pin-path", pins])
        .output()
        .expect("spawn monitor detach")
}

/// `monitor run` on the pair's `a` end with `extra` arguments (and a socket of its own), for
/// a start that must be refused: asserts that it failed, and returns what it said on stderr.
pub fn refused_start(pair: &NetnsPair, extra: &[&str]) -> String {
    let dir = TempDir::new("hbmsock");
    let out = NetnsPair::command_in(&pair.ns_a, &monitor_bin())
        .args(["run", "--iface", &pair.iface_a, "--socket"])
        .arg(dir.0.join("s.sock"))
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("spawn monitor run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{extra:?} was accepted: {stderr}");
    stderr
}

impl AgentProcess {
    /// Starts the agent on the pair's `a` side with `extra` arguments, and waits until its
    /// socket answers.
    pub fn start(pair: &NetnsPair, extra: &[&str]) -> Self {
        Self::start_bin(&monitor_bin(), pair, extra)
    }

    /// As `start`, running the `monitor` binary at `bin` (another build of it).
    pub fn start_bin(bin: &Path, pair: &NetnsPair, extra: &[&str]) -> Self {
        Self::start_with(bin, pair, extra, "warn", Stdio::inherit(), |_| {})
    }

    /// As `start`, logging at info into the file at `log` (read it with `std::fs`).
    pub fn start_logging(pair: &NetnsPair, extra: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("creating the agent's log file");
        Self::start_with(&monitor_bin(), pair, extra, "info", file.into(), |_| {})
    }

    /// As `start`, with at most `nofile` open files (RLIMIT_NOFILE, soft and hard), as a
    /// service gets from systemd's default soft limit of 1024.
    pub fn start_with_nofile(pair: &NetnsPair, extra: &[&str], nofile: u64) -> Self {
        use std::os::unix::process::CommandExt;
        Self::start_with(
            &monitor_bin(),
            pair,
            extra,
            "warn",
            Stdio::inherit(),
            |cmd| {
                // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent.
                unsafe {
                    cmd.pre_exec(move || {
                        let limit = libc::rlimit {
                            rlim_cur: nofile,
                            rlim_max: nofile,
                        };
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            },
        )
    }

    fn start_with(
        bin: &Path,
        pair: &NetnsPair,
        extra: &[&str],
        rust_log: &str,
        stderr: Stdio,
        tweak: impl FnOnce(&mut Command),
    ) -> Self {
        let dir = TempDir::new("hbmsock");
        let socket = dir.0.join("agent.sock");
        let mut cmd = NetnsPair::command_in(&pair.ns_a, bin);
        tweak(&mut cmd);
        cmd.args(["run", "--iface", &pair.iface_a, "--socket"])
            .arg(&socket)
            .args(extra)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().expect("spawn monitor run");
        let mut agent = Self {
            child,
            socket,
            _dir: dir,
        };
        agent.wait_ready();
        agent
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("monitor run exited early with {status}");
            }
            if let Ok(mut client) = Client::connect(&self.socket)
                && client.request(&json!({"op": "stats"})).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "monitor run did not answer on {} within 20 s",
            self.socket.display()
        );
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect to agent")
    }

    /// The ids of every peer the agent watches, in its (sorted) order.
    pub fn peer_ids(&self) -> Vec<u64> {
        self.ask(json!({"op": "peers"}))["peers"]
            .as_array()
            .expect("peers array")
            .iter()
            .map(|p| p["id"].as_u64().expect("peer id"))
            .collect()
    }

    /// A connection turned into the agent's event stream.
    pub fn subscribe(&self) -> Client {
        let mut client = self.client();
        let reply = client
            .request(&json!({"op": "subscribe"}))
            .expect("subscribe");
        assert_eq!(reply, json!({"ok": true, "subscribed": true}));
        client
    }

    /// One request, expecting `"ok": true`.
    pub fn ask(&self, request: Value) -> Value {
        let reply = self.client().request(&request).expect("request");
        assert_eq!(reply["ok"], json!(true), "{request} -> {reply}");
        reply
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGHUP: the agent re-reads its `--config` file and its key file.
    pub fn sighup(&self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends SIGTERM and waits for it to exit (`drop` instead kills with SIGKILL).
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not stop within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `monitor send` in the pair's `b` namespace towards the agent's IPv4 address.
pub fn sender(pair: &NetnsPair, id: u64, interval: &str, extra: &[&str]) -> Command {
    let port = monitor_common::wire::DEFAULT_PORT;
    sender_to(
        pair,
        &format!("{}:{port}", pair.addr_a),
        id,
        interval,
        extra,
    )
}

/// `monitor send` in the pair's `b` namespace towards `to`.
pub fn sender_to(pair: &NetnsPair, to: &str, id: u64, interval: &str, extra: &[&str]) -> Command {
    let mut cmd = NetnsPair::command_in(&pair.ns_b, &monitor_bin());
    cmd.args([
        "send",
        "--to",
        to,
        "--id",
        &id.to_string(),
        "--interval",
        interval,
    ])
    .args(extra)
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    cmd
}

/// `cmd` run under SCHED_FIFO (priority 10, `chrt`), its environment kept and its stdin and
/// stdout null, as [`sender`]'s: for a test that claims a live sender is never suspected, the
/// sender must keep its schedule, and on a loaded machine a normal process can be descheduled
/// for longer than a fast sender's interval (a real silence). `chrt` and `ip netns exec` exec
/// into the program, so killing the child kills the sender.
pub fn realtime(cmd: Command) -> Command {
    let mut rt = Command::new("chrt");
    rt.args(["-f", "10"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => rt.env(key, v),
            None => rt.env_remove(key),
        };
    }
    rt
}

/// `monitor loadgen` from the pair's `b` namespace to the agent's address and `port`; its report.
pub fn loadgen(
    pair: &NetnsPair,
    port: u16,
    args: &[&str],
) -> monitor::peer::loadgen::LoadgenReport {
    let mut all = vec!["--to".to_string(), format!("{}:{port}", pair.addr_a)];
    all.extend(args.iter().map(|a| a.to_string()));
    crate::soak::loadgen(&monitor_bin(), &pair.ns_b, &all)
}

/// Runs a command to completion, asserting success.
pub fn run_ok(mut cmd: Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed on drop.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn(mut cmd: Command) -> ChildGuard {
    ChildGuard(cmd.spawn().expect("spawn"))
}

/// The events a subscribed `client` has received so far: read until nothing more comes
/// within `quiet` (which only ends the read; it waits for nothing to happen).
pub fn events_so_far(
    client: &mut monitor::serving::client::Client,
    quiet: std::time::Duration,
) -> Vec<serde_json::Value> {
    client.set_read_timeout(Some(quiet)).unwrap();
    let mut events = Vec::new();
    while let Ok(line) = client.read_line() {
        events.push(serde_json::from_str(&line).expect("event JSON"));
    }
    events
}

/// Reads events from a subscribed `client` until `done` says so, or fails after `within`.
pub fn events_until(
    client: &mut monitor::serving::client::Client,
    within: std::time::Duration,
    mut done: impl FnMut(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + within;
    let mut events = Vec::new();
    while !done(&events) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "timed out; events so far: {events:#?}");
        client.set_read_timeout(Some(left)).unwrap();
        let line = client
            .read_line()
            .unwrap_or_else(|e| panic!("{e}; events so far: {events:#?}"));
        events.push(serde_json::from_str(&line).unwrap());
    }
    events
}
