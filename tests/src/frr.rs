//! A real pair of FRR BFD daemons (zebra + bfdd from the Debian package `frr`, 8.4), one in
//! each of two existing network namespaces, with a single-hop BFD session between them: a
//! peer the monitor can watch passively, and a crash (SIGKILL of one side's bfdd) it should
//! notice.
//!
//! Each side gets its own FRR pathspace (`-N`, a [`unique_name`]) and its own directory under
//! the temp dir for configuration, pid files, vty and zebra sockets and logs, so tests can run
//! in parallel and nothing under /etc/frr is touched. FRR insists on creating
//! /var/run/frr/<pathspace> even when every socket is placed elsewhere: the harness creates
//! that directory itself and removes it. Dropping a [`BfdPair`] (also when the test panics)
//! stops every daemon it started by its PID and removes both directories; it does not delete
//! the namespaces, which belong to the caller (e.g. a [`NetnsPair`]).
//!
//! The daemons run as root (`-u root`) with the vty group `frrvty` as their group (`-g
//! frrvty`): FRR refuses to start as `-u root -g root` because root is not in the vty group
//! it was built with. vtysh is pointed at the side's directory with `--vty_socket`.
//!
//! What the wire shows (FRR 8.4.4, default [`BfdTimers`]): control packets are UDP from source
//! port 49152 (the first of bfdd's 49152-65535 range, one per session) to port 3784, IP TTL
//! 255, TOS 0xc0, 24 bytes, both directions. While Down, a side sends every 1 s (desired min
//! TX 1 s, as RFC 5880 requires), so the session takes about 1 s to come Up after both
//! daemons run (Down -> Init -> Up, then a Poll/Final exchange moves to 100 ms). Up, packets
//! leave every 75-100 ms (RFC 5880 jitter). A SIGKILLed peer is declared down 300 ms
//! (3 x 100 ms) after its last packet, with diagnostic "control detection time expired"; the
//! survivor then sends Down packets (diag 1, Your Discriminator 0) every 1 s. bfdd 8.4 stopped
//! by SIGTERM does not send AdminDown either: to its peer it looks the same as a crash.
//!
//! bfdd evidently seeds `random()` with the time in whole seconds and draws its discriminators
//! (and its jitter) from it: two bfdd started in the same second picked the same discriminator
//! and sent in lockstep. The harness starts the remote bfdd in a later second than the local.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::NetnsPair;
use crate::unique_name;

const ZEBRA: &str = "/usr/lib/frr/zebra";
const BFDD: &str = "/usr/lib/frr/bfdd";
const VTYSH: &str = "vtysh";
/// Where FRR 8.4 (Debian) creates a pathspace's directory, whatever the socket options say.
const FRR_RUN_DIR: &str = "/var/run/frr";

/// The session's timers, as configured on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfdTimers {
    /// Desired minimum transmit interval, ms (`transmit-interval`).
    pub transmit_interval_ms: u32,
    /// Required minimum receive interval, ms (`receive-interval`).
    pub receive_interval_ms: u32,
    /// `detect-multiplier`.
    pub detect_multiplier: u8,
}

impl Default for BfdTimers {
    /// 100 ms each way, multiplier 3: a peer is declared down 300 ms after its last packet.
    fn default() -> Self {
        Self {
            transmit_interval_ms: 100,
            receive_interval_ms: 100,
            detect_multiplier: 3,
        }
    }
}

/// One side's place: the namespace its daemons run in and its address there.
#[derive(Clone, Debug)]
pub struct BfdEndpoint {
    pub netns: String,
    pub addr: IpAddr,
}

impl BfdEndpoint {
    pub fn new(netns: &str, addr: &str) -> Self {
        Self {
            netns: netns.to_owned(),
            addr: addr
                .parse()
                .unwrap_or_else(|e| panic!("BFD endpoint address {addr:?}: {e}")),
        }
    }
}

/// A session's state as bfdd reports it (`status` in `show bfd peers json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BfdState {
    /// `shutdown`: administratively down.
    AdminDown,
    Down,
    Init,
    Up,
    Other(String),
}

impl BfdState {
    fn parse(status: &str) -> Self {
        match status {
            "shutdown" => Self::AdminDown,
            "down" => Self::Down,
            "init" => Self::Init,
            "up" => Self::Up,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// One entry of `show bfd peers json`, as seen from the side that was asked. Intervals are in
/// milliseconds, as bfdd prints them.
#[derive(Clone, Debug)]
pub struct BfdSession {
    pub peer: IpAddr,
    pub local: Option<IpAddr>,
    pub multihop: bool,
    pub state: BfdState,
    /// This side's "My Discriminator" (`id`).
    pub local_discriminator: u32,
    /// The peer's "My Discriminator" as last received (`remote-id`); bfdd resets it to 0 when
    /// the session goes down.
    pub remote_discriminator: u32,
    /// E.g. `ok`, `control detection time expired`, `neighbor signaled session down`.
    pub diagnostic: String,
    pub remote_diagnostic: String,
    pub receive_interval_ms: u32,
    pub transmit_interval_ms: u32,
    pub detect_multiplier: u32,
    pub remote_receive_interval_ms: u32,
    pub remote_transmit_interval_ms: u32,
    pub remote_detect_multiplier: u32,
    /// Seconds in the current state: `uptime` when up, `downtime` otherwise (absent until the
    /// session was first up).
    pub uptime_s: Option<u64>,
    pub downtime_s: Option<u64>,
    /// The whole JSON object, for fields not copied above.
    pub raw: serde_json::Value,
}

impl BfdSession {
    /// Parses one object of `show bfd peers json`.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, String> {
        let str_field = |key: &str| -> Result<&str, String> {
            value
                .get(key)
                .and_then(|v| v.as_str())
                .ok_or_else(|| format!("no string {key:?} in {value}"))
        };
        let u64_field = |key: &str| -> Result<u64, String> {
            value
                .get(key)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| format!("no integer {key:?} in {value}"))
        };
        let u32_field = |key: &str| -> Result<u32, String> {
            u64_field(key).and_then(|v| u32::try_from(v).map_err(|e| format!("{key}: {e}")))
        };
        let addr = |text: &str| -> Result<IpAddr, String> {
            text.parse()
                .map_err(|e| format!("address {text:?} in {value}: {e}"))
        };
        Ok(Self {
            peer: addr(str_field("peer")?)?,
            local: match value.get("local").and_then(|v| v.as_str()) {
                Some(text) => Some(addr(text)?),
                None => None,
            },
            multihop: value
                .get("multihop")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            state: BfdState::parse(str_field("status")?),
            local_discriminator: u32_field("id")?,
            remote_discriminator: u32_field("remote-id")?,
            diagnostic: str_field("diagnostic")?.to_owned(),
            remote_diagnostic: str_field("remote-diagnostic")?.to_owned(),
            receive_interval_ms: u32_field("receive-interval")?,
            transmit_interval_ms: u32_field("transmit-interval")?,
            detect_multiplier: u32_field("detect-multiplier")?,
            remote_receive_interval_ms: u32_field("remote-receive-interval")?,
            remote_transmit_interval_ms: u32_field("remote-transmit-interval")?,
            remote_detect_multiplier: u32_field("remote-detect-multiplier")?,
            uptime_s: value.get("uptime").and_then(|v| v.as_u64()),
            downtime_s: value.get("downtime").and_then(|v| v.as_u64()),
            raw: value.clone(),
        })
    }
}

/// A daemon this harness started: stopped by its PID when dropped.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Daemon {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, up to 3 s to exit, then SIGKILL; always reaped.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: kill has no memory preconditions; the PID is our own unreaped child, so it
        // cannot have been reused.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILL, as a crash would, and reap it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A directory this harness created: removed (with its contents) when dropped.
struct OwnedDir(PathBuf);

impl OwnedDir {
    fn create(path: PathBuf) -> Self {
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn unix_second() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Polls `check` every 20 ms until it gives a value; `Err(last reason)` once `limit` passes.
fn poll<T>(limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(reason) if Instant::now() >= deadline => return Err(reason),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One side: zebra and bfdd in one namespace, with one configured BFD peer.
pub struct FrrNode {
    // Fields drop in declaration order: daemons first, then their directories.
    bfdd: Option<Daemon>,
    zebra: Option<Daemon>,
    /// Killed bfdd processes, kept for the logs' sake (their PIDs).
    killed_bfdd: Vec<u32>,
    /// The Unix second at which the running bfdd was known to have seeded its discriminator.
    bfdd_ready_second: u64,
    pub endpoint: BfdEndpoint,
    pub peer: IpAddr,
    /// A multihop session (RFC 5883, UDP 4784) rather than a single-hop one (3784).
    pub multihop: bool,
    /// The FRR pathspace (`-N`).
    pub pathspace: String,
    /// Configuration, pid files, sockets and logs of this side.
    pub dir: PathBuf,
    _run_dir: OwnedDir,
    _dir: OwnedDir,
}

impl FrrNode {
    /// Starts zebra, then bfdd, in `endpoint.netns`, with a single-hop session to `peer`;
    /// returns once both answer on their vty socket.
    pub fn start(root: &Path, endpoint: BfdEndpoint, peer: IpAddr, timers: BfdTimers) -> Self {
        Self::start_after(root, endpoint, peer, timers, false, None)
    }

    /// [`start`](Self::start), with bfdd started only once the wall clock's Unix second is
    /// past `after` (see [`start_bfdd_after`](Self::start_bfdd_after)).
    fn start_after(
        root: &Path,
        endpoint: BfdEndpoint,
        peer: IpAddr,
        timers: BfdTimers,
        multihop: bool,
        after: Option<u64>,
    ) -> Self {
        assert_eq!(
            endpoint.addr.is_ipv4(),
            peer.is_ipv4(),
            "BFD peer {peer} and local address {} are of different families",
            endpoint.addr
        );
        let pathspace = unique_name("hbfrr");
        let dir = OwnedDir::create(root.join(&pathspace));
        assert!(
            Path::new(FRR_RUN_DIR).is_dir(),
            "{FRR_RUN_DIR} is missing: install FRR (`cargo xtask setup` does)"
        );
        let run_dir = OwnedDir::create(Path::new(FRR_RUN_DIR).join(&pathspace));
        fs::write(dir.0.join("zebra.conf"), "!\n").expect("writing zebra.conf");
        fs::write(
            dir.0.join("bfdd.conf"),
            format!(
                "debug bfd peer\n\
                 !\n\
                 bfd\n \
                 peer {peer}{multihop} local-address {local}\n  \
                 detect-multiplier {mult}\n  \
                 receive-interval {rx}\n  \
                 transmit-interval {tx}\n \
                 !\n\
                 !\n",
                local = endpoint.addr,
                multihop = if multihop { " multihop" } else { "" },
                mult = timers.detect_multiplier,
                rx = timers.receive_interval_ms,
                tx = timers.transmit_interval_ms,
            ),
        )
        .expect("writing bfdd.conf");
        let mut node = Self {
            bfdd: None,
            zebra: None,
            killed_bfdd: Vec::new(),
            bfdd_ready_second: 0,
            endpoint,
            peer,
            multihop,
            pathspace,
            dir: dir.0.clone(),
            _run_dir: run_dir,
            _dir: dir,
        };
        let mut zebra = node.spawn("zebra", ZEBRA, &[]);
        node.wait_ready(&mut zebra);
        node.zebra = Some(zebra);
        node.start_bfdd_after(after);
        node
    }

    /// Starts bfdd (again, after [`kill_bfdd`](Self::kill_bfdd)); returns once it answers on
    /// its vty socket. A restarted bfdd picks a new local discriminator.
    pub fn start_bfdd(&mut self) {
        self.start_bfdd_after(None)
    }

    /// [`start_bfdd`](Self::start_bfdd), once the wall clock's Unix second is past `after`.
    ///
    /// bfdd evidently draws its local discriminator from `random()` seeded with the time in
    /// whole seconds: two bfdd started in the same second picked the same discriminator (seen
    /// here: both sides had 4273450574). Legal (discriminators are per system), but a test
    /// that tells the two directions apart by discriminator needs them distinct.
    pub fn start_bfdd_after(&mut self, after: Option<u64>) {
        assert!(self.bfdd.is_none(), "bfdd is already running");
        if let Some(after) = after {
            // Waiting on the clock itself: at most one second.
            while unix_second() <= after {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let ctl = self.dir.join("bfdd.sock");
        let ctl = ctl.to_str().expect("UTF-8 temp dir").to_owned();
        let _ = fs::remove_file(self.dir.join("bfdd.vty"));
        let mut bfdd = self.spawn("bfdd", BFDD, &["--bfdctl", &ctl]);
        self.wait_ready(&mut bfdd);
        self.bfdd = Some(bfdd);
        self.bfdd_ready_second = unix_second();
    }

    fn spawn(&self, name: &'static str, program: &str, extra: &[&str]) -> Daemon {
        let path = |file: &str| self.dir.join(file);
        // Appended to: a restarted bfdd's output follows the killed one's.
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path(&format!("{name}.out")))
            .expect("creating daemon output");
        let err = out.try_clone().expect("dup daemon output");
        let mut cmd = Command::new("ip");
        // `ip netns exec` execs the daemon in place: the child's PID is the daemon's.
        cmd.args(["netns", "exec", &self.endpoint.netns, program])
            .args(["-N", &self.pathspace])
            .arg("-f")
            .arg(path(&format!("{name}.conf")))
            .arg("-i")
            .arg(path(&format!("{name}.pid")))
            .arg("-z")
            .arg(path("zserv.api"))
            .arg("--vty_socket")
            .arg(&self.dir)
            // No TCP vty.
            .args(["-P", "0"])
            .args(["-u", "root", "-g", "frrvty"])
            .arg("--log")
            .arg(format!("file:{}", path(&format!("{name}.log")).display()))
            .args(["--log-level", "debug"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program} in {}: {e}", self.endpoint.netns));
        Daemon { name, child }
    }

    /// Waits until `daemon` has written its own PID to its pid file and answers vtysh (if it
    /// does not, `daemon` is stopped as the panic unwinds).
    fn wait_ready(&self, daemon: &mut Daemon) {
        let name = daemon.name;
        let pid_file = self.dir.join(format!("{name}.pid"));
        let result = poll(Duration::from_secs(10), || {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                return Err(format!("{name} exited: {status}"));
            }
            let pid = daemon.pid();
            let written = fs::read_to_string(&pid_file).unwrap_or_default();
            if written.trim() != pid.to_string() {
                return Err(format!(
                    "{} holds {written:?}, not {pid}",
                    pid_file.display()
                ));
            }
            self.vtysh(name, "show version").map(|_| ())
        });
        if let Err(reason) = result {
            panic!(
                "{name} (pid {}) in {} did not come up: {reason}\n{}",
                daemon.pid(),
                self.endpoint.netns,
                self.logs()
            );
        }
    }

    /// Runs one vtysh command against daemon `daemon` (`zebra` or `bfdd`) of this side.
    pub fn vtysh(&self, daemon: &str, command: &str) -> Result<String, String> {
        let out = Command::new(VTYSH)
            .arg("--vty_socket")
            .arg(&self.dir)
            .args(["-d", daemon, "-c", command])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running vtysh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "vtysh -d {daemon} -c {command:?}: {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every session bfdd knows (`show bfd peers json`).
    pub fn sessions(&self) -> Result<Vec<BfdSession>, String> {
        let text = self.vtysh("bfdd", "show bfd peers json")?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{e} in {text:?}"))?;
        json.as_array()
            .ok_or_else(|| format!("not a JSON array: {text}"))?
            .iter()
            .map(BfdSession::from_json)
            .collect()
    }

    /// The configured session to [`peer`](Self::peer), as this side's bfdd reports it.
    pub fn session(&self) -> Result<BfdSession, String> {
        self.sessions()?
            .into_iter()
            .find(|s| s.peer == self.peer && s.multihop == self.multihop)
            .ok_or_else(|| format!("bfdd has no session to {}", self.peer))
    }

    /// Waits until the session satisfies `accept`, returning it; panics with `what` and every
    /// log of this side after `limit`.
    pub fn wait_session(
        &self,
        limit: Duration,
        what: &str,
        mut accept: impl FnMut(&BfdSession) -> bool,
    ) -> BfdSession {
        poll(limit, || {
            let session = self.session()?;
            if accept(&session) {
                Ok(session)
            } else {
                Err(format!("last seen: {session:?}"))
            }
        })
        .unwrap_or_else(|reason| {
            panic!(
                "timed out after {limit:?} waiting for {what} in {}: {reason}\n{}",
                self.endpoint.netns,
                self.logs()
            )
        })
    }

    /// bfdd's PID, while it runs.
    pub fn bfdd_pid(&self) -> Option<u32> {
        self.bfdd.as_ref().map(Daemon::pid)
    }

    /// zebra's PID.
    pub fn zebra_pid(&self) -> Option<u32> {
        self.zebra.as_ref().map(Daemon::pid)
    }

    /// Kills bfdd with SIGKILL (a crash: no final Down packet) and reaps it; returns its PID.
    /// zebra keeps running.
    pub fn kill_bfdd(&mut self) -> u32 {
        let mut bfdd = self.bfdd.take().expect("bfdd is not running");
        let pid = bfdd.pid();
        bfdd.kill();
        self.killed_bfdd.push(pid);
        pid
    }

    /// The daemons' log files and captured output, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = format!(
            "--- FRR side {} in {} (pathspace {}, bfdd pid {:?}, killed bfdd {:?}, zebra pid \
             {:?})\n",
            self.endpoint.addr,
            self.endpoint.netns,
            self.pathspace,
            self.bfdd_pid(),
            self.killed_bfdd,
            self.zebra_pid(),
        );
        for file in [
            "bfdd.conf",
            "zebra.out",
            "zebra.log",
            "bfdd.out",
            "bfdd.log",
        ] {
            let content = fs::read_to_string(self.dir.join(file))
                .unwrap_or_else(|e| format!("(unreadable: {e})\n"));
            text.push_str(&format!("--- {file}:\n{content}"));
        }
        text
    }
}

/// zebra + bfdd in two namespaces, each configured with the other as its BFD peer. "Local" is
/// the side whose session a test watches (where the monitor runs); "remote" is the side a test
/// crashes.
pub struct BfdPair {
    // Dropped in this order: the remote side, the local side, then the shared temp dir.
    pub remote: FrrNode,
    pub local: FrrNode,
    pub timers: BfdTimers,
    _root: OwnedDir,
}

impl BfdPair {
    /// Starts both sides: `local` peers with `remote.addr`, `remote` with `local.addr`. Does not
    /// wait for the session: see [`wait_up`](Self::wait_up).
    pub fn start(local: BfdEndpoint, remote: BfdEndpoint, timers: BfdTimers) -> Self {
        Self::start_session(local, remote, timers, false)
    }

    /// As [`start`](Self::start), a multihop session (RFC 5883: UDP 4784, no TTL rule).
    pub fn start_multihop(local: BfdEndpoint, remote: BfdEndpoint, timers: BfdTimers) -> Self {
        Self::start_session(local, remote, timers, true)
    }

    fn start_session(
        local: BfdEndpoint,
        remote: BfdEndpoint,
        timers: BfdTimers,
        multihop: bool,
    ) -> Self {
        crate::require_root();
        for program in [ZEBRA, BFDD] {
            assert!(
                Path::new(program).is_file(),
                "{program} not found: install FRR (`cargo xtask setup` does)"
            );
        }
        let root = OwnedDir::create(std::env::temp_dir().join(unique_name("hbfrr")));
        let (local_addr, remote_addr) = (local.addr, remote.addr);
        // Declared in this order so that a panic while starting `remote_node` drops (stops)
        // `local_node` before `root` is removed.
        let local_node = FrrNode::start_after(&root.0, local, remote_addr, timers, multihop, None);
        // In a later second than the local bfdd, for distinct discriminators.
        let after = Some(local_node.bfdd_ready_second);
        let remote_node =
            FrrNode::start_after(&root.0, remote, local_addr, timers, multihop, after);
        Self {
            remote: remote_node,
            local: local_node,
            timers,
            _root: root,
        }
    }

    /// IPv4 session over `pair`'s veth: local side in `ns_a` (where the agent listens),
    /// remote side in `ns_b`, default timers.
    pub fn on_netns_pair(pair: &NetnsPair) -> Self {
        Self::start(
            BfdEndpoint::new(&pair.ns_a, &pair.addr_a),
            BfdEndpoint::new(&pair.ns_b, &pair.addr_b),
            BfdTimers::default(),
        )
    }

    /// The same over IPv6 (`addr6_a`, `addr6_b`).
    pub fn on_netns_pair_v6(pair: &NetnsPair) -> Self {
        Self::start(
            BfdEndpoint::new(&pair.ns_a, &pair.addr6_a),
            BfdEndpoint::new(&pair.ns_b, &pair.addr6_b),
            BfdTimers::default(),
        )
    }

    /// Waits until both sides report the session Up and have learned each other's configured
    /// timers, and returns (local, remote) sessions.
    ///
    /// Up alone is not enough: a session comes Up at the slow pre-Up rate (1 s, RFC 5880
    /// 6.8.3) and only the Poll sequence that follows moves it to the configured one, so a
    /// side read at Up may still show its peer's 1000 ms.
    pub fn wait_up(&self, limit: Duration) -> (BfdSession, BfdSession) {
        let timers = self.timers;
        let settled = |s: &BfdSession| {
            s.state == BfdState::Up
                && s.remote_receive_interval_ms == timers.receive_interval_ms
                && s.remote_transmit_interval_ms == timers.transmit_interval_ms
        };
        let result = poll(limit, || {
            let local = self.local.session()?;
            let remote = self.remote.session()?;
            if settled(&local) && settled(&remote) {
                Ok((local, remote))
            } else {
                Err(format!("local {local:?}\nremote {remote:?}"))
            }
        });
        result.unwrap_or_else(|reason| {
            panic!(
                "timed out after {limit:?} waiting for the BFD session to be Up on both sides at \
                 its configured timers: \
                 {reason}\n{}",
                self.logs()
            )
        })
    }

    /// The local side's session now.
    pub fn local_session(&self) -> BfdSession {
        self.local
            .session()
            .unwrap_or_else(|e| panic!("reading the local BFD session: {e}\n{}", self.logs()))
    }

    /// The remote side's session now.
    pub fn remote_session(&self) -> BfdSession {
        self.remote
            .session()
            .unwrap_or_else(|e| panic!("reading the remote BFD session: {e}\n{}", self.logs()))
    }

    /// SIGKILLs the remote side's bfdd (a crash); returns its PID.
    pub fn kill_remote_bfdd(&mut self) -> u32 {
        self.remote.kill_bfdd()
    }

    /// Restarts the remote side's bfdd after [`kill_remote_bfdd`](Self::kill_remote_bfdd).
    /// Its new discriminator differs from the local one (and, in practice, from the killed
    /// one).
    pub fn restart_remote_bfdd(&mut self) {
        let after = Some(self.local.bfdd_ready_second);
        self.remote.start_bfdd_after(after)
    }

    /// Waits until the local side no longer reports the session Up, and returns it.
    pub fn wait_local_down(&self, limit: Duration) -> BfdSession {
        poll(limit, || {
            let session = self.local.session()?;
            if session.state == BfdState::Up {
                Err(format!("last seen: {session:?}"))
            } else {
                Ok(session)
            }
        })
        .unwrap_or_else(|reason| {
            panic!(
                "timed out after {limit:?} waiting for the local BFD session to leave Up: \
                 {reason}\n{}",
                self.logs()
            )
        })
    }

    /// Both sides' logs.
    pub fn logs(&self) -> String {
        format!("{}{}", self.local.logs(), self.remote.logs())
    }
}
