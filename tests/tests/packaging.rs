//! Packaging, with the real tools: the systemd unit passes `systemd-analyze verify` without a
//! diagnostic and `systemd-analyze security --offline=true` at an exposure of 4.0 or lower,
//! every point it leaves exposed explained in the unit; the real agent speaks systemd's
//! notification protocol (READY=1 once serving, STATUS=, WATCHDOG=1, STOPPING=1) to a datagram
//! socket bound here, and starts with exactly the unit's capabilities and with none fewer;
//! bash, groff and man accept what `monitor completions` and `monitor manpage` print.

use std::{
    collections::BTreeSet,
    os::unix::{fs::MetadataExt, net::UnixDatagram},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{Bpffs, TempDir},
    monitor_bin,
    netns::ip,
    require_root, unique_name,
};
use monitor::serving::client::Client;
use serde_json::json;

/// The unit as shipped.
fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/systemd/heartbeat-monitor.service")
        .canonicalize()
        .expect("packaging/systemd/heartbeat-monitor.service")
}

fn unit_text() -> String {
    std::fs::read_to_string(unit_path()).expect("read the unit")
}

/// Where the unit expects the binary (README: `install -m 0755 ... /usr/local/bin/monitor`).
const UNIT_BINARY: &str = "/usr/local/bin/monitor";

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e} (cargo xtask setup installs it)"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `systemd-analyze verify` on a copy of `unit` in a directory of its own, with `man` looking
/// in `manpath` for the pages of the unit's Documentation=; everything it said.
fn verify(unit: &str, manpath: &Path) -> (Output, String) {
    let dir = TempDir::new("hbmpkgunit");
    let path = dir.0.join("heartbeat-monitor.service");
    std::fs::write(&path, unit).unwrap();
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", manpath));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    (out, said)
}

#[test]
fn the_unit_verifies_without_a_diagnostic() {
    let unit = unit_text();
    // verify checks that ExecStart's binary exists and is executable: point it at the binary
    // under test, the one change made to the unit. Everything else is checked as shipped.
    let bin = monitor_bin().canonicalize().expect("the monitor binary");
    let exec = format!("ExecStart={UNIT_BINARY} ");
    assert_eq!(
        unit.matches(&exec).count(),
        1,
        "the unit should start {UNIT_BINARY} once"
    );
    let testable = unit.replace(&exec, &format!("ExecStart={} ", bin.display()));
    // verify also runs `man` on each man: page of Documentation=: the pages are those
    // `monitor manpage --out` writes (README: installed under /usr/local/share/man/man1).
    let manpath = TempDir::new("hbmpkgmanpath");
    let man1 = manpath.0.join("man1");
    monitor_output(&["manpage", "--out", &man1.display().to_string()]);
    let (out, said) = verify(&testable, &manpath.0);
    println!("systemd-analyze verify: {}, said {said:?}", out.status);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert!(said.is_empty(), "systemd-analyze verify reported: {said}");

    // The same check does catch a bad unit: verify exits 0 on unknown keys and bad values,
    // so the silence above is what counts.
    let broken = testable
        .replace("Type=notify", "Tpye=notify")
        .replace("WatchdogSec=10s", "WatchdogSec=ten");
    let (_, said) = verify(&broken, &manpath.0);
    assert!(
        said.contains("Unknown key") && said.contains("Tpye") && said.contains("ten"),
        "verify should report both mistakes: {said:?}"
    );
    // And the binary's path is checked: a unit whose binary is missing is reported.
    let missing = unit.replace(&exec, "ExecStart=/nonexistent/hbm-pkg/monitor ");
    let (_, said) = verify(&missing, &manpath.0);
    assert!(
        said.contains("/nonexistent/hbm-pkg/monitor"),
        "verify should report the missing binary: {said:?}"
    );
}

#[test]
fn the_units_exposure_is_at_most_4_and_every_exposed_point_is_explained() {
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit_path()));
    let report = text(&out.stdout);
    println!("{report}{}", text(&out.stderr));
    assert!(out.status.success(), "systemd-analyze security failed");
    let exposure: f64 = report
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for heartbeat-monitor.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|score| score.parse().ok())
        .expect("an \"Overall exposure level\" line with a number");
    println!("exposure {exposure}");
    assert!(exposure <= 4.0, "exposure {exposure} is above 4.0");

    // Each point still exposed (✗) is named in an "Exposure left:" comment of the unit.
    let unit = unit_text();
    let explained: String = unit
        .lines()
        .filter(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let exposed: Vec<&str> = report
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("✗"))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert!(!exposed.is_empty(), "no ✗ line parsed from the report");
    for name in exposed {
        assert!(
            explained.contains(&format!("Exposure left: \"{name}\"")),
            "{name} is exposed but no comment in the unit says why"
        );
    }
}

/// A network namespace of this test's own (prefix hbm-pkg) holding a veth pair, pkg0 and
/// pkg1, both up; removed on drop. No traffic is sent: the agent only needs an interface.
struct Namespace(String);

impl Namespace {
    fn new() -> Self {
        let ns = Self(unique_name("hbm-pkg"));
        ip(&["netns", "add", &ns.0]);
        ip(&[
            "-n", &ns.0, "link", "add", "pkg0", "type", "veth", "peer", "name", "pkg1",
        ]);
        for iface in ["pkg0", "pkg1", "lo"] {
            ip(&["-n", &ns.0, "link", "set", iface, "up"]);
        }
        ns
    }

    fn xdp_attached(&self) -> bool {
        let out = run(Command::new("ip").args(["-n", &self.0, "link", "show", "pkg0"]));
        text(&out.stdout).contains("xdp")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The notification socket a service manager would listen on, bound here.
struct NotifySocket {
    socket: UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn bind(dir: &TempDir) -> Self {
        let path = dir.0.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Self { socket, path }
    }

    /// The next datagram before `deadline` (at least one 50 ms wait), with when it came.
    fn recv_until(&self, deadline: Instant) -> Option<(String, Instant)> {
        let mut buf = [0u8; 4096];
        loop {
            match self.socket.recv(&mut buf) {
                Ok(n) => return Some((text(&buf[..n]), Instant::now())),
                // A signal to this process (a child's exit) ends a recv with a receive timeout
                // early even under SA_RESTART (signal(7)): nothing was lost, wait again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("receiving on the notify socket: {e}"),
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Throws away whatever is queued.
    fn drain(&self) {
        while self.recv_until(Instant::now()).is_some() {}
    }
}

/// `monitor run` on pkg0 in `ns`, its socket in `dir`, optionally under `setpriv`, with
/// NOTIFY_SOCKET pointing at `notify`; killed on drop.
struct Agent {
    child: Child,
    socket: PathBuf,
}

impl Agent {
    fn start(
        ns: &Namespace,
        dir: &TempDir,
        notify: &NotifySocket,
        setpriv: &[String],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let socket = dir.0.join("agent.sock");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.0]);
        if !setpriv.is_empty() {
            cmd.arg("setpriv").args(setpriv).arg("--");
        }
        cmd.arg(monitor_bin())
            .args(["run", "--iface", "pkg0", "--socket"])
            .arg(&socket)
            .args(extra)
            .env("NOTIFY_SOCKET", &notify.path)
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn monitor run");
        Self { child, socket }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn answers(&self) -> bool {
        Client::connect(&self.socket)
            .and_then(|mut c| c.request(&json!({"op": "stats"})))
            .is_ok_and(|reply| reply["ok"] == json!(true))
    }

    /// Waits for READY=1 (20 s at most); returns the datagram that carried it.
    fn wait_ready(&mut self, notify: &NotifySocket) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Some((message, _)) = notify.recv_until(deadline) {
            if message.lines().any(|l| l == "READY=1") {
                return message;
            }
        }
        let _ = self.child.kill();
        panic!(
            "no READY=1 within 20 s; the agent said: {}",
            stderr_of(&mut self.child)
        );
    }

    /// SIGTERM, then its exit status (10 s at most).
    fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the agent ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits for an exited (or killed) child; what it wrote to stderr.
fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut said = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut said);
    }
    let _ = child.wait();
    said
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_agent_reports_ready_once_serving_then_status_watchdog_and_stopping() {
    require_root();
    let ns = Namespace::new();
    let dir = TempDir::new("hbmpkg");
    let notify = NotifySocket::bind(&dir);
    // The watchdog at 200 ms: the agent must ping every 100 ms from its sweep loop.
    let mut agent = Agent::start(&ns, &dir, &notify, &[], &[], &[("WATCHDOG_USEC", "200000")]);
    let ready = agent.wait_ready(&notify);
    println!("READY datagram: {ready:?}");
    // READY=1 means serving: the socket answers and the program is attached, already.
    assert!(agent.answers(), "READY=1 came before the socket answered");
    assert!(ns.xdp_attached(), "READY=1 came before XDP was attached");
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=0 peers, 0 suspected")),
        "READY=1 should come with a status line: {ready:?}"
    );

    // Pings, and the status line again (it is refreshed every 5 s).
    let since = Instant::now();
    let deadline = since + Duration::from_secs(8);
    let mut pings = Vec::new();
    let mut status = None;
    while let Some((message, at)) = notify.recv_until(deadline) {
        for line in message.lines() {
            if line == "WATCHDOG=1" {
                pings.push(at);
            } else if line.starts_with("STATUS=") {
                status = Some(line.to_string());
            } else {
                panic!("unexpected notification {line:?}");
            }
        }
        if status.is_some() {
            break;
        }
    }
    let elapsed = since.elapsed();
    let status = status.expect("no STATUS= refresh within 8 s");
    println!("{status}; {} pings in {elapsed:?}", pings.len());
    assert!(status.starts_with("STATUS=0 peers"), "{status}");
    let gaps: Vec<u128> = pings
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    println!("gaps between pings (ms): {gaps:?}");
    // Every 100 ms ideally; a loaded machine may delay some, never most.
    let ideal = elapsed.as_millis() / 100;
    assert!(
        pings.len() as u128 >= ideal / 3,
        "{} pings in {elapsed:?}, expected about {ideal}",
        pings.len()
    );
    // And not after every 50 ms sweep.
    assert!(
        pings.len() as u128 <= ideal * 3 / 2 + 2,
        "{} pings in {elapsed:?}: about one per sweep, not per 100 ms",
        pings.len()
    );

    // A stalled agent stops pinging (SIGSTOP stops the sweep loop), and resumes.
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(agent.pid(), libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(100));
    notify.drain();
    let quiet = notify.recv_until(Instant::now() + Duration::from_millis(500));
    // SAFETY: as above.
    unsafe { libc::kill(agent.pid(), libc::SIGCONT) };
    assert_eq!(quiet, None, "a stopped agent cannot ping");
    let resumed = notify.recv_until(Instant::now() + Duration::from_secs(2));
    assert!(
        resumed.is_some_and(|(m, _)| m.contains("WATCHDOG=1")),
        "pings resume after SIGCONT"
    );

    let status = agent.stop();
    assert!(status.success(), "the agent exited with {status}");
    let mut stopping = false;
    while let Some((message, _)) = notify.recv_until(Instant::now() + Duration::from_millis(200)) {
        stopping |= message.lines().any(|l| l == "STOPPING=1");
    }
    assert!(stopping, "no STOPPING=1 on SIGTERM");
}

/// `CapabilityBoundingSet=` of the unit, as capability names.
fn unit_capabilities() -> Vec<String> {
    let unit = unit_text();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet=");
    line.split_whitespace().map(String::from).collect()
}

/// setpriv arguments for a root process holding exactly `caps` and nothing else (bounding,
/// inheritable and ambient sets as systemd leaves them for CapabilityBoundingSet= with no
/// AmbientCapabilities=), with no_new_privs (NoNewPrivileges=yes) and `groups` as
/// supplementary groups (SupplementaryGroups=).
fn setpriv(caps: &[String], groups: &str) -> Vec<String> {
    let keep: Vec<String> = caps
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    vec![
        "--inh-caps=-all".into(),
        "--ambient-caps=-all".into(),
        format!("--bounding-set=-all,{}", keep.join(",")),
        "--no-new-privs".into(),
        format!("--groups={groups}"),
    ]
}

/// The effective capability mask of a process, from /proc.
fn effective_caps(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

fn capability_bit(name: &str) -> u32 {
    match name {
        "CAP_NET_ADMIN" => 12,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => panic!("add {other}'s number here"),
    }
}

/// The gid the agent's socket is handed to (numeric: no group need exist).
const SOCKET_GROUP: &str = "4242";

#[test]
fn the_agent_serves_with_exactly_the_units_capabilities() {
    require_root();
    let caps = unit_capabilities();
    println!("CapabilityBoundingSet={}", caps.join(" "));
    let ns = Namespace::new();
    let dir = TempDir::new("hbmpkg");
    let notify = NotifySocket::bind(&dir);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("pkg0");
    let pins_arg = pins.display().to_string();
    // As the README's example runs it: pinned (--persist), the socket handed to a group.
    let extra = ["--pin-path", &pins_arg, "--socket-group", SOCKET_GROUP];
    let mut agent = Agent::start(
        &ns,
        &dir,
        &notify,
        &setpriv(&caps, SOCKET_GROUP),
        &extra,
        &[],
    );
    agent.wait_ready(&notify);
    let wanted: u64 = caps.iter().map(|c| 1u64 << capability_bit(c)).sum();
    assert_eq!(
        effective_caps(agent.pid()),
        wanted,
        "the agent should hold exactly {caps:?}"
    );
    assert!(agent.answers(), "the socket answers");
    assert!(ns.xdp_attached());
    assert!(
        pins.join("link").exists(),
        "pinned under {}",
        pins.display()
    );
    let gid = std::fs::metadata(&agent.socket).unwrap().gid();
    assert_eq!(gid.to_string(), SOCKET_GROUP, "the socket's group");
    // No WATCHDOG_USEC, no pings.
    let later = notify.recv_until(Instant::now() + Duration::from_millis(700));
    assert!(
        later.as_ref().is_none_or(|(m, _)| !m.contains("WATCHDOG")),
        "pinged without a watchdog: {later:?}"
    );
    let status = agent.stop();
    assert!(status.success(), "the agent exited with {status}");
    // Pinned: still attached after the agent; detach, as an operator would.
    let detach = run(Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(monitor_bin())
        .args(["detach", "--iface", "pkg0", "--pin-path", &pins_arg]));
    assert!(detach.status.success(), "{}", text(&detach.stderr));

    // With any one of them missing the agent does not start.
    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| c != &missing).cloned().collect();
        let mut agent = Agent::start(&ns, &dir, &notify, &setpriv(&fewer, "0"), &[], &[]);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = agent.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "still running without {missing}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let said = stderr_of(&mut agent.child);
        println!("without {missing}: {status}: {}", said.trim());
        assert!(!status.success(), "the agent ran without {missing}");
        assert!(
            said.contains("permission denied") || said.contains("Operation not permitted"),
            "without {missing}: {said}"
        );
        while let Some((message, _)) = notify.recv_until(Instant::now()) {
            assert!(!message.contains("READY=1"), "READY=1 without {missing}");
        }
        // Nothing of it left attached or pinned.
        assert!(!ns.xdp_attached(), "attached without {missing}");
    }
}

/// The subcommands `monitor --help` lists (but clap's `help`).
fn subcommands() -> BTreeSet<String> {
    let out = run(Command::new(monitor_bin()).arg("--help"));
    let help = text(&out.stdout);
    let names: BTreeSet<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect();
    for expected in ["run", "query", "completions", "manpage"] {
        assert!(
            names.contains(expected),
            "{expected} missing from {names:?}"
        );
    }
    names
}

fn monitor_output(args: &[&str]) -> String {
    let out = run(Command::new(monitor_bin()).args(args));
    assert!(
        out.status.success(),
        "monitor {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a bash snippet with the completion script sourced; its stdout.
fn bash_with(script: &Path, snippet: &str) -> String {
    let out = run(Command::new("bash")
        .arg("-c")
        .arg(format!("source {}\n{snippet}", script.display())));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "bash: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn bash_accepts_the_completion_script_and_completes_with_it() {
    let dir = TempDir::new("hbmpkgcomp");
    let script = dir.0.join("monitor.bash");
    std::fs::write(&script, monitor_output(&["completions", "bash"])).unwrap();
    let check = run(Command::new("bash").arg("-n").arg(&script));
    assert!(check.status.success(), "bash -n: {}", text(&check.stderr));

    let registered = bash_with(&script, "complete -p monitor");
    println!("{registered}");
    assert!(
        registered.contains("-F _monitor") && registered.trim_end().ends_with(" monitor"),
        "{registered}"
    );
    // The function completes: every subcommand from `monitor `, a flag of `run`.
    let complete = |words: &[&str]| {
        let snippet = format!(
            "COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}\n\
             _monitor monitor '{cur}' '{prev}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
            words = words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            cword = words.len() - 1,
            line = words.join(" "),
            point = words.join(" ").len(),
            cur = words[words.len() - 1],
            prev = words[words.len() - 2],
        );
        bash_with(&script, &snippet)
            .lines()
            .map(String::from)
            .collect::<BTreeSet<String>>()
    };
    let offered = complete(&["monitor", ""]);
    for sub in subcommands() {
        assert!(
            offered.contains(&sub),
            "`monitor <TAB>` lacks {sub}: {offered:?}"
        );
    }
    let flags = complete(&["monitor", "run", "--so"]);
    assert!(
        flags.contains("--socket") && flags.contains("--socket-group"),
        "`monitor run --so<TAB>`: {flags:?}"
    );
}

#[test]
fn zsh_and_fish_scripts_name_every_subcommand() {
    let subcommands = subcommands();
    for (shell, marker) in [("zsh", "#compdef monitor"), ("fish", "complete -c monitor")] {
        let script = monitor_output(&["completions", shell]);
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        for sub in &subcommands {
            // zsh lists them as 'run:...' / fish as -a "run".
            assert!(
                script.contains(&format!("'{sub}:")) || script.contains(&format!("\"{sub}\"")),
                "{shell} script lacks {sub}"
            );
        }
    }
}

/// groff's rendering of a page as plain text, and its complaints.
fn groff(page: &Path) -> (Output, String) {
    let out = run(Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
        .arg(page));
    let complaints = text(&out.stderr);
    (out, complaints)
}

#[test]
fn the_man_page_renders_cleanly_with_every_subcommand() {
    let dir = TempDir::new("hbmpkgman");
    let page = dir.0.join("monitor.1");
    std::fs::write(&page, monitor_output(&["manpage"])).unwrap();
    // groff with every warning on, then man as an operator runs it.
    let (out, complaints) = groff(&page);
    assert!(
        out.status.success() && complaints.is_empty(),
        "groff: {complaints}"
    );
    let rendered = text(&out.stdout);
    let man = run(Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80"));
    assert!(
        man.status.success() && man.stderr.is_empty(),
        "man -l: {}",
        text(&man.stderr)
    );
    println!("{}", text(&man.stdout));
    for rendered in [&rendered, &text(&man.stdout)] {
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "SUBCOMMANDS"] {
            assert!(
                rendered.lines().any(|l| l == section),
                "no {section} section"
            );
        }
        for sub in subcommands() {
            assert!(
                rendered.contains(&format!("monitor-{sub}(1)")),
                "monitor(1) does not name monitor-{sub}(1)"
            );
        }
    }
}

#[test]
fn manpage_out_writes_a_page_per_subcommand() {
    let dir = TempDir::new("hbmpkgmans");
    let listed = monitor_output(&["manpage", "--out", &dir.0.display().to_string()]);
    let mut expected: BTreeSet<String> = subcommands()
        .into_iter()
        .map(|s| format!("monitor-{s}.1"))
        .collect();
    expected.insert("monitor.1".into());
    let written: BTreeSet<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        expected.is_subset(&written),
        "{expected:?} not all in {written:?}"
    );
    assert_eq!(
        listed.lines().count(),
        written.len(),
        "it lists what it wrote"
    );
    for name in &written {
        let (out, complaints) = groff(&dir.0.join(name));
        let rendered = text(&out.stdout);
        assert!(out.status.success(), "{name}: {complaints}");
        for section in ["NAME", "SYNOPSIS"] {
            assert!(
                rendered.lines().any(|l| l == section),
                "{name}: no {section}"
            );
        }
        // A help text with a word longer than the line (replay's detector spec example) makes
        // groff say it cannot justify that line; any other complaint is a broken page.
        for complaint in complaints.lines() {
            println!("{name}: {complaint}");
            assert!(
                complaint.ends_with("cannot adjust line"),
                "{name}: {complaint}"
            );
        }
    }
    let run_page = groff(&dir.0.join("monitor-run.1")).0;
    let run_page = text(&run_page.stdout);
    for flag in ["--iface", "--socket", "--persist", "--auth-key-file"] {
        assert!(run_page.contains(flag), "monitor-run(1) lacks {flag}");
    }
}

/// What runs in the container once the unit has started: a line `HBM key=value` per fact,
/// then power off. The watchdog is put to work: the agent is stopped for longer than
/// WatchdogSec=, so systemd must kill it and start a new one, which adopts the pinned program.
const BOOT_REPORT: &str = r#"#!/bin/sh
unit=heartbeat-monitor
sock=/run/heartbeat-monitor/monitor.sock
facts() {
    systemctl show -p ActiveState -p SubState -p NRestarts -p StatusText -p Result "$unit" | sed "s/^/HBM $1./"
}
sleep 12   # longer than WatchdogSec=10s: the pings must have reached systemd
facts first
pid=$(systemctl show -p MainPID --value "$unit")
echo "HBM first.capeff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/$pid/status)"
echo "HBM first.nonewprivs=$(sed -n 's/^NoNewPrivs:[[:space:]]*//p' /proc/$pid/status)"
echo "HBM first.seccomp=$(sed -n 's/^Seccomp:[[:space:]]*//p' /proc/$pid/status)"
test -S "$sock" && echo "HBM first.socket=yes"
/opt/hbm/monitor query --socket "$sock" --json stats | sed 's/^/HBM first.stats=/'
ls /sys/fs/bpf/heartbeat-monitor/pkg0 | tr '\n' ' ' | sed 's/^/HBM first.pins=/'; echo
ip link show pkg0 | grep -q 'prog/xdp' && echo "HBM first.xdp=yes"
systemctl reload "$unit"; echo "HBM reload.exit=$?"
facts reload
kill -STOP "$pid"; sleep 12; kill -CONT "$pid"
i=0; while [ $i -lt 40 ]; do
    [ "$(systemctl show -p ActiveState --value "$unit")" = active ] && [ "$(systemctl show -p MainPID --value "$unit")" != "$pid" ] && break
    sleep 0.25; i=$((i+1))
done
facts restarted
/opt/hbm/monitor query --socket "$sock" --json stats | sed 's/^/HBM restarted.stats=/'
journalctl --no-pager -o cat -u "$unit" | sed 's/^/HBM journal: /'
systemctl stop "$unit"
facts stopped
echo "HBM done=yes"
"#;

/// systemd 252 as PID 1 of a container booted from this machine's /usr (systemd-nspawn, an
/// empty /etc, a network namespace of its own with a veth pair) runs the unit as shipped,
/// bar one drop-in that points ExecStart= at the binary under test: it becomes active once
/// READY=1 arrives, shows the STATUS= line, keeps the service alive past WatchdogSec= on the
/// pings, and restarts it when the agent stalls; the sandbox leaves the agent exactly its three
/// capabilities, no_new_privs, a seccomp filter, its socket and its pins on bpffs.
#[test]
fn the_unit_runs_under_systemd_with_its_sandbox_and_watchdog() {
    require_root();
    let dir = TempDir::new("hbmpkgboot");
    let d = |name: &str| dir.0.join(name);
    let unit = unit_text();
    std::fs::write(d("heartbeat-monitor.service"), &unit).unwrap();
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .expect("ExecStart=")
        .replace(UNIT_BINARY, "/opt/hbm/monitor");
    std::fs::create_dir(d("dropin")).unwrap();
    std::fs::write(
        d("dropin/binary.conf"),
        format!("[Service]\nExecStart=\n{exec}\n"),
    )
    .unwrap();
    std::fs::write(d("default"), "IFACE=pkg0\nMONITOR_ARGS=--persist\n").unwrap();
    let ip = std::fs::canonicalize(
        ["/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip"]
            .iter()
            .find(|p| Path::new(p).exists())
            .expect("ip"),
    )
    .unwrap();
    let ip = ip.display();
    std::fs::write(
        d("hbm-veth.service"),
        format!(
            "[Unit]\nBefore=heartbeat-monitor.service\n[Service]\nType=oneshot\n\
             RemainAfterExit=yes\nExecStart={ip} link add pkg0 type veth peer name pkg1\n\
             ExecStart={ip} link set pkg0 up\nExecStart={ip} link set pkg1 up\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d("hbm-report.service"),
        "[Unit]\nAfter=heartbeat-monitor.service\n[Service]\nType=oneshot\n\
         StandardOutput=journal+console\nExecStart=/bin/sh /opt/hbm/report.sh\n\
         ExecStartPost=/bin/systemctl --no-block poweroff\n",
    )
    .unwrap();
    std::fs::write(
        d("hbm-test.target"),
        "[Unit]\nWants=hbm-veth.service heartbeat-monitor.service hbm-report.service\n",
    )
    .unwrap();
    std::fs::write(d("report.sh"), BOOT_REPORT).unwrap();
    // A booted host has bpffs at /sys/fs/bpf (systemd mounts it); a container gets none.
    let fs = Bpffs::mount();

    let bind = |from: PathBuf, to: &str| format!("--bind-ro={}:{to}", from.display());
    let etc = "/etc/systemd/system";
    let machine = unique_name("hbm-pkg-boot");
    let mut nspawn = Command::new("systemd-nspawn");
    nspawn
        .args(["--directory=/", "--volatile=yes", "--private-network"])
        .arg(format!("--machine={machine}"))
        // No systemd on this host to register with or to allocate a scope from.
        .args(["--register=no", "--keep-unit"])
        // The container's own limits, not the unit's: nspawn keeps CAP_BPF and CAP_PERFMON
        // and bpf() from containers unless told.
        .args([
            "--capability=CAP_BPF,CAP_PERFMON",
            "--system-call-filter=bpf",
        ])
        .arg(bind(
            d("heartbeat-monitor.service"),
            &format!("{etc}/heartbeat-monitor.service"),
        ))
        .arg(bind(
            d("dropin"),
            &format!("{etc}/heartbeat-monitor.service.d"),
        ))
        .arg(bind(
            d("hbm-veth.service"),
            &format!("{etc}/hbm-veth.service"),
        ))
        .arg(bind(
            d("hbm-report.service"),
            &format!("{etc}/hbm-report.service"),
        ))
        .arg(bind(
            d("hbm-test.target"),
            &format!("{etc}/hbm-test.target"),
        ))
        .arg(bind(d("default"), "/etc/default/heartbeat-monitor"))
        .arg(bind(d("report.sh"), "/opt/hbm/report.sh"))
        .arg(bind(
            monitor_bin().canonicalize().unwrap(),
            "/opt/hbm/monitor",
        ))
        .arg(format!("--bind={}:/sys/fs/bpf", fs.0.0.display()))
        .args([
            "--boot",
            "--",
            "--unit=hbm-test.target",
            "systemd.firstboot=off",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = nspawn
        .spawn()
        .expect("systemd-nspawn (cargo xtask setup installs systemd-container)");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut all = String::new();
        let _ = std::io::BufReader::new(stdout).read_to_string(&mut all);
        all
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = reader.join().unwrap();
    let stderr = stderr_of(&mut child);
    let facts: Vec<&str> = console
        .lines()
        .filter_map(|l| l.split_once("HBM ").map(|(_, fact)| fact))
        .collect();
    for fact in &facts {
        println!("{fact}");
    }
    let has = |fact: &str| facts.iter().any(|f| f == &fact);
    let value = |key: &str| {
        facts
            .iter()
            .find_map(|f| f.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in the container's report"))
    };
    assert!(
        has("done=yes"),
        "the container did not finish its report ({status:?}); console:\n{console}\n{stderr}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "nspawn: {status:?} {stderr}"
    );

    // Started on READY=1, with the agent's status line, alive past the watchdog period.
    assert_eq!(value("first.ActiveState"), "active");
    assert_eq!(value("first.SubState"), "running");
    assert_eq!(value("first.NRestarts"), "0", "restarted before the stall");
    assert!(
        value("first.StatusText").starts_with("0 peers, 0 suspected (phi >= 8) on pkg0"),
        "{}",
        value("first.StatusText")
    );
    // The sandbox: exactly CAP_NET_ADMIN (12), CAP_PERFMON (38), CAP_BPF (39).
    let wanted: u64 = unit_capabilities()
        .iter()
        .map(|c| 1u64 << capability_bit(c))
        .sum();
    assert_eq!(
        u64::from_str_radix(value("first.capeff"), 16).unwrap(),
        wanted
    );
    assert_eq!(value("first.nonewprivs"), "1");
    assert_eq!(value("first.seccomp"), "2", "a seccomp filter");
    assert!(has("first.socket=yes"));
    assert!(has("first.xdp=yes"));
    let stats: serde_json::Value = serde_json::from_str(value("first.stats")).unwrap();
    assert_eq!(stats["stats"]["xdp_mode"], json!("native"), "{stats}");
    let pins = value("first.pins");
    assert!(
        pins.contains("link") && pins.contains("prog"),
        "pins: {pins}"
    );
    // ExecReload= signals the agent, which stays.
    assert_eq!(value("reload.exit"), "0");
    assert_eq!(value("reload.ActiveState"), "active");
    // Stalled past WatchdogSec=: killed, restarted, the pinned program adopted.
    assert!(
        has("journal: heartbeat-monitor.service: Watchdog timeout (limit 10s)!"),
        "no watchdog timeout in the journal"
    );
    assert_eq!(value("restarted.NRestarts"), "1");
    assert_eq!(value("restarted.ActiveState"), "active");
    let stats: serde_json::Value = serde_json::from_str(value("restarted.stats")).unwrap();
    assert_eq!(stats["stats"]["xdp_mode"], json!("adopted"), "{stats}");
    // And it stops cleanly.
    assert_eq!(value("stopped.ActiveState"), "inactive");
    assert_eq!(value("stopped.Result"), "success");
}
