//! The example senders in other languages (examples/c/hb_send.c, examples/python/hb_send.py)
//! against the real agent and its XDP program: their heartbeats are recorded with the right
//! count and sequence, signed ones are accepted under the agent's key and rejected under
//! another, and their datagrams are byte for byte those of the Rust encoder and signer.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, run_ok},
    netns::NetnsPair,
    require_root,
};
use monitor_common::wire::HeartbeatHeader;
use serde_json::{Value, json};

const KEY_A: &str = "000102030405060708090a0b0c0d0e0f";
const KEY_B: &str = "f0e0d0c0b0a090807060504030201000";

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Whether `cc` and `python3` run; if not, says which is missing (the only reason to skip).
fn tools_present() -> bool {
    for (program, package) in [("cc", "gcc"), ("python3", "python3")] {
        let runs = Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !runs {
            eprintln!(
                "SKIPPED: `{program}` is not installed, so the example senders cannot run \
                 (`cargo xtask setup` installs the {package} package)"
            );
            return false;
        }
    }
    true
}

/// Both example senders, ready to run: the C one compiled into a temporary directory.
struct Senders {
    dir: TempDir,
    c: PathBuf,
    python: PathBuf,
}

impl Senders {
    /// Compiles the C sender exactly as examples/README.md says, and insists on no warnings.
    fn build() -> Self {
        let dir = TempDir::new("hbm-snd-cc");
        let c = dir.0.join("hb_send");
        let out = Command::new("cc")
            .args(["-O2", "-Wall", "-Wextra", "-o"])
            .arg(&c)
            .arg(examples_dir().join("c/hb_send.c"))
            .output()
            .expect("running cc");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "cc failed: {stderr}");
        assert!(stderr.trim().is_empty(), "cc warned: {stderr}");
        Self {
            dir,
            c,
            python: examples_dir().join("python/hb_send.py"),
        }
    }

    /// The C sender, run in the pair's `b` namespace (`ns: None`: here, with no network).
    fn c(&self, ns: Option<&str>, args: &[&str]) -> Command {
        let mut cmd = match ns {
            Some(ns) => NetnsPair::command_in(ns, &self.c),
            None => Command::new(&self.c),
        };
        cmd.args(args).stdin(Stdio::null());
        cmd
    }

    /// The Python sender, likewise.
    fn python(&self, ns: Option<&str>, args: &[&str]) -> Command {
        let mut cmd = match ns {
            Some(ns) => NetnsPair::command_in(ns, Path::new("python3")),
            None => Command::new("python3"),
        };
        cmd.arg(&self.python).args(args).stdin(Stdio::null());
        cmd
    }

    fn both(&self, ns: Option<&str>, args: &[&str]) -> [(&'static str, Command); 2] {
        [("C", self.c(ns, args)), ("Python", self.python(ns, args))]
    }

    /// A key file (mode 0600, as the senders and the agent require) in the temp directory.
    fn key_file(&self, name: &str, hex: &str) -> String {
        let path = self.dir.0.join(name);
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path.display().to_string()
    }
}

/// A pair of namespaces and veth ends named for this test (`hbm-snd*`, `hbsnd*`).
fn pair(subnet: u8) -> NetnsPair {
    NetnsPair::named(subnet, ["hbm-snd-a", "hbm-snd-b"], ["hbsnda", "hbsndb"])
}

/// Polls the agent's `peer` reply for `id` until `done` holds (at most 10 s); returns it.
fn wait_for_peer(agent: &AgentProcess, id: u64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let peer = agent.ask(json!({"op": "peer", "id": id}))["peer"].clone();
        if done(&peer) {
            return peer;
        }
        assert!(
            Instant::now() < deadline,
            "peer {id} did not get there within 10 s: {peer}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn count(peer: &Value, field: &str) -> u64 {
    peer[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} of {peer}"))
}

#[test]
fn self_tests_pass_and_datagrams_match_the_rust_encoder_and_signer() {
    if !tools_present() {
        return;
    }
    let senders = Senders::build();
    for (name, mut cmd) in senders.both(None, &["--self-test"]) {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{name} self-test: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let key_file = senders.key_file("a.key", KEY_A);
    let key = monitor::peer::auth_key::read_key_file(Path::new(&key_file)).unwrap();
    let (id, incarnation) = (0xfedc_ba98_7654_3210_u64, 0xdead_beef_u32);
    for signed in [false, true] {
        let expected: Vec<String> = (0..5)
            .map(|seq| {
                let mut header = HeartbeatHeader::new(id, incarnation, seq);
                if signed {
                    monitor::peer::auth_key::sign(&mut header, &key);
                }
                header
                    .to_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            })
            .collect();
        let mut args = vec![
            "--dry-run",
            "--id",
            "0xfedcba9876543210",
            "--incarnation",
            "3735928559",
            "--count",
            "5",
        ];
        if signed {
            args.extend(["--auth-key-file", &key_file]);
        }
        for (name, mut cmd) in senders.both(None, &args) {
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got: Vec<String> = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            assert_eq!(got, expected, "{name} sender, signed: {signed}");
        }
    }

    // A key file others can read is refused, as `monitor send` refuses it.
    let open = senders.key_file("open.key", KEY_A);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (name, mut cmd) in senders.both(
        None,
        &[
            "--dry-run",
            "--id",
            "1",
            "--count",
            "1",
            "--auth-key-file",
            &open,
        ],
    ) {
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{name} accepted a readable key file");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("chmod 600") && !err.contains(KEY_A),
            "{name}: {err}"
        );
    }
}

#[test]
fn heartbeats_from_c_and_python_are_recorded_by_the_xdp_program() {
    require_root();
    if !tools_present() {
        return;
    }
    let senders = Senders::build();
    let pair = pair(90);
    let dir = TempDir::new("hbm-snd-peers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([101, 102, 103, 104])]);
    let v4 = format!("{}:18498", pair.addr_a);
    let v6 = format!("[{}]:18498", pair.addr6_a);
    let ns = Some(pair.ns_b.as_str());
    // (peer id, sender, destination, heartbeats, interval in ms)
    let runs: [(u64, &str, &str, u64, u64); 4] = [
        (101, "C", &v4, 30, 20),
        (102, "Python", &v4, 30, 20),
        (103, "C", &v6, 20, 20),
        (104, "Python", &v6, 20, 20),
    ];
    for &(id, sender, to, n, interval) in &runs {
        let (id, n, interval) = (id.to_string(), n.to_string(), interval.to_string());
        let args = [
            "--to",
            to,
            "--id",
            &id,
            "--count",
            &n,
            "--interval",
            &interval,
            "--incarnation",
            "7",
        ];
        run_ok(match sender {
            "C" => senders.c(ns, &args),
            _ => senders.python(ns, &args),
        });
    }

    for &(id, sender, to, n, interval) in &runs {
        let peer = wait_for_peer(&agent, id, |p| count(p, "heartbeats") >= n);
        let what = format!("{sender} sender to {to}: {peer}");
        // Every heartbeat landed in the peer's slot, in order, none lost: the sequence ran
        // 0..n within incarnation 7.
        assert_eq!(count(&peer, "heartbeats"), n, "{what}");
        assert_eq!(count(&peer, "samples"), n - 1, "{what}");
        assert_eq!(peer["last_seq"], json!(n - 1), "{what}");
        assert_eq!(peer["incarnation"], json!(7), "{what}");
        for field in ["lost", "duplicates", "out_of_order", "auth_failures"] {
            assert_eq!(count(&peer, field), 0, "{field}: {what}");
        }
        // --interval is in milliseconds and the schedule is fixed, so the mean holds.
        let mean = peer["mean_ms"].as_f64().unwrap();
        let nominal = interval as f64;
        assert!(
            (nominal * 0.8..=nominal * 1.2).contains(&mean),
            "mean interval {mean} ms, sent every {interval} ms: {what}"
        );
        let from = if to.starts_with('[') {
            format!("[{}]:", pair.addr6_b)
        } else {
            format!("{}:", pair.addr_b)
        };
        assert!(peer["addr"].as_str().unwrap().starts_with(&from), "{what}");
    }
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    let kernel = &stats["kernel"];
    assert_eq!(kernel["heartbeats"], json!(100), "{stats}");
    assert_eq!(kernel["malformed"], json!(0), "{stats}");
    assert_eq!(kernel["unknown_peer"], json!(0), "{stats}");
}

#[test]
fn signed_heartbeats_count_under_the_agents_key_and_not_under_another() {
    require_root();
    if !tools_present() {
        return;
    }
    let senders = Senders::build();
    let pair = pair(91);
    let agent_key = senders.key_file("agent.key", KEY_A);
    let key_a = senders.key_file("a.key", KEY_A);
    let key_b = senders.key_file("b.key", KEY_B);
    let dir = TempDir::new("hbm-snd-peers");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([201, 202, 203, 204]),
            "--auth-key-file",
            &agent_key,
        ],
    );
    let to = format!("{}:18498", pair.addr_a);
    let ns = Some(pair.ns_b.as_str());
    // (peer id, sender, key file, heartbeats)
    let runs: [(u64, &str, &str, u64); 4] = [
        (201, "C", &key_a, 20),
        (202, "Python", &key_a, 20),
        (203, "C", &key_b, 10),
        (204, "Python", &key_b, 10),
    ];
    for &(id, sender, key, n) in &runs {
        let (id, n) = (id.to_string(), n.to_string());
        let args = [
            "--to",
            &to,
            "--id",
            &id,
            "--count",
            &n,
            "--interval",
            "10",
            "--incarnation",
            "1",
            "--auth-key-file",
            key,
        ];
        run_ok(match sender {
            "C" => senders.c(ns, &args),
            _ => senders.python(ns, &args),
        });
    }

    for &(id, sender, key, n) in &runs {
        if key == key_a {
            let peer = wait_for_peer(&agent, id, |p| count(p, "heartbeats") >= n);
            assert_eq!(count(&peer, "heartbeats"), n, "{sender}, right key: {peer}");
            assert_eq!(
                peer["last_seq"],
                json!(n - 1),
                "{sender}, right key: {peer}"
            );
            assert_eq!(
                count(&peer, "auth_failures"),
                0,
                "{sender}, right key: {peer}"
            );
        } else {
            let peer = wait_for_peer(&agent, id, |p| count(p, "auth_failures") >= n);
            assert_eq!(
                count(&peer, "auth_failures"),
                n,
                "{sender}, wrong key: {peer}"
            );
            assert_eq!(
                count(&peer, "heartbeats"),
                0,
                "{sender}, wrong key: never recorded: {peer}"
            );
        }
    }
    let stats = &agent.ask(json!({"op": "stats"}))["stats"];
    assert_eq!(stats["kernel"]["heartbeats"], json!(40), "{stats}");
    assert_eq!(stats["kernel"]["auth_failures"], json!(20), "{stats}");
    assert_eq!(stats["kernel"]["malformed"], json!(0), "{stats}");
}

/// One heartbeat as a socket on loopback took it: its sequence number and the kernel's
/// receive time (SO_TIMESTAMPNS, so the test's own scheduling does not move it).
struct Arrival {
    seq: u64,
    at: Duration,
}

/// A UDP socket on 127.0.0.1 that asks the kernel to stamp each datagram as it arrives.
fn stamped_socket() -> std::net::UdpSocket {
    use std::os::fd::AsRawFd;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_TIMESTAMPNS: {}", std::io::Error::last_os_error());
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    socket
}

/// The next heartbeat on `socket` with its kernel receive time; None after 5 s of silence.
fn next_arrival(socket: &std::net::UdpSocket) -> Option<Arrival> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 256];
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    // SAFETY: as above.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut msg, 0) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        assert!(
            matches!(err.kind(), std::io::ErrorKind::WouldBlock),
            "recvmsg: {err}"
        );
        return None;
    }
    let header = HeartbeatHeader::decode(&buf[..n as usize]).expect("a heartbeat");
    // SAFETY: walking the control buffer recvmsg filled, with the kernel's own macros.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !cmsg.is_null() {
        // SAFETY: a header CMSG_FIRSTHDR/CMSG_NXTHDR returned is inside `control`.
        let (level, kind) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type) };
        if level == libc::SOL_SOCKET && kind == libc::SCM_TIMESTAMPNS {
            // SAFETY: SCM_TIMESTAMPNS carries one timespec, possibly unaligned.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
            return Some(Arrival {
                seq: header.seq(),
                at: Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
            });
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const msg, cmsg) };
    }
    panic!("a datagram without its SCM_TIMESTAMPNS");
}

/// A sender stalled for 300 ms (SIGSTOP, as a paused VM, a frozen cgroup or a starved CPU
/// stalls it) sends nothing for the slots it missed: it starts its schedule again from the
/// moment it runs. Sending them in a burst, as the senders did, put a run of near-zero
/// intervals in the receiver's window, which widens it for a window's length (docs/tuning.md,
/// "A sender after a stall"); and numbering heartbeats it never sent would make the stall look
/// like loss. So,
/// for the Rust, C and Python senders: after the stall no heartbeat comes less than half an
/// interval after the one before, and the sequence has no gap.
#[test]
fn a_stalled_sender_resumes_on_a_new_schedule_without_a_burst() {
    if !tools_present() {
        return;
    }
    let senders = Senders::build();
    const INTERVAL_MS: u64 = 20;
    let socket = stamped_socket();
    let to = socket.local_addr().unwrap().to_string();
    let (interval, interval_ms) = (INTERVAL_MS.to_string(), format!("{INTERVAL_MS}ms"));
    let common = ["--to", &to, "--id", "5", "--incarnation", "9", "--interval"];
    let mut rust = Command::new(integration_tests::monitor_bin());
    rust.arg("send")
        .args(common)
        .arg(&interval_ms)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    let with_interval: Vec<&str> = common.iter().copied().chain([interval.as_str()]).collect();
    let [(_, c), (_, python)] = senders.both(None, &with_interval);
    for (name, cmd) in [("Rust", rust), ("C", c), ("Python", python)] {
        let sender = integration_tests::agent_process::spawn(cmd);
        let pid = sender.0.id() as libc::pid_t;
        let mut arrivals = Vec::new();
        let take = |arrivals: &mut Vec<Arrival>, n: usize| {
            for _ in 0..n {
                let a = next_arrival(&socket)
                    .unwrap_or_else(|| panic!("{name} sender: no heartbeat within 5 s"));
                arrivals.push(a);
            }
        };
        take(&mut arrivals, 5);
        // SAFETY: signalling our own child, which is alive (it just sent).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        // The stall itself is the input: 15 slots missed.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        take(&mut arrivals, 40);
        drop(sender);

        let gaps: Vec<(u64, Duration)> = arrivals
            .windows(2)
            .map(|w| (w[1].seq, w[1].at.saturating_sub(w[0].at)))
            .collect();
        let seqs: Vec<u64> = arrivals.iter().map(|a| a.seq).collect();
        let first = seqs[0];
        assert_eq!(
            seqs,
            (first..first + seqs.len() as u64).collect::<Vec<_>>(),
            "{name} sender: the sequence has a gap or a repeat"
        );
        let stall = gaps
            .iter()
            .position(|&(_, gap)| gap >= Duration::from_millis(250))
            .unwrap_or_else(|| panic!("{name} sender: no stall in the gaps {gaps:?}"));
        let half = Duration::from_millis(INTERVAL_MS / 2);
        let short: Vec<_> = gaps[stall + 1..]
            .iter()
            .filter(|&&(_, gap)| gap < half)
            .collect();
        assert!(
            short.is_empty(),
            "{name} sender: after the stall {} heartbeats (of {}) came less than {half:?} after \
             the one before, (seq, gap): {short:?}",
            short.len(),
            gaps.len() - stall - 1
        );
    }
}
