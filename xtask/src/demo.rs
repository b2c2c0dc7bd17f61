//! A self-contained demo: two namespaces joined by a veth pair, the agent watching one end,
//! several senders on the other; one sender stops, its phi climbs through the levels, and it
//! recovers when restarted. Everything created here is removed on the way out, also on error
//! or Ctrl-C.

use std::{
    io::{BufRead, BufReader},
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{build, setup, workspace};

const NS_MONITOR: &str = "hbm-demo-mon";
const NS_PEERS: &str = "hbm-demo-peers";
const IF_MONITOR: &str = "hbmdemo0";
const IF_PEERS: &str = "hbmdemo1";
const ADDR_MONITOR: &str = "10.213.0.1";
const ADDR_PEERS: &str = "10.213.0.2";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of heartbeat senders.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    peers: u64,
    /// Interval between each sender's heartbeats.
    #[arg(long, default_value = "100ms")]
    interval: String,
    /// Seconds to watch after one sender stops.
    #[arg(long, default_value_t = 3)]
    watch: u64,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("demo")?;
    build::build(false)?;
    let monitor = build::monitor_bin(false);

    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, interrupted.clone())?;
    }
    let pause = |d: Duration| -> Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if interrupted.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    };

    step(&format!(
        "creating namespaces {NS_MONITOR} ({ADDR_MONITOR}) and {NS_PEERS} ({ADDR_PEERS}) joined by veth {IF_MONITOR}/{IF_PEERS}"
    ));
    let _net = DemoNet::create()?;
    let dir = TempDir::create()?;
    let socket = dir.0.join("agent.sock");

    step(&format!(
        "starting the agent: monitor run --iface {IF_MONITOR} --socket {}",
        socket.display()
    ));
    let agent = Process::spawn(
        in_ns(NS_MONITOR, &monitor)
            .args(["run", "--iface", IF_MONITOR, "--socket"])
            .arg(&socket),
    )?;
    wait_for_socket(&monitor, &socket, &agent)?;

    step("following events: monitor watch (its lines are prefixed with 'event:')");
    let watch = Process::spawn(
        Command::new(&monitor)
            .args(["watch", "--socket"])
            .arg(&socket)
            .stdout(Stdio::piped()),
    )?;
    watch.prefix_output("    event: ");

    let jitters = ["0ms", "5ms", "15ms", "30ms"];
    let mut senders = Vec::new();
    for id in 1..=args.peers {
        let jitter = jitters[(id as usize - 1) % jitters.len()];
        step(&format!(
            "peer {id}: monitor send --to {ADDR_MONITOR}:7946 --id {id} --interval {} --jitter {jitter}",
            args.interval
        ));
        senders.push(Process::spawn(
            in_ns(NS_PEERS, &monitor)
                .args([
                    "send",
                    "--to",
                    &format!("{ADDR_MONITOR}:7946"),
                    "--id",
                    &id.to_string(),
                ])
                .args(["--interval", &args.interval, "--jitter", jitter])
                .env("RUST_LOG", "warn"),
        )?);
    }

    step("letting heartbeats flow for 3 s");
    pause(Duration::from_secs(3))?;
    show(&monitor, &socket, &["peers"])?;

    let victim = args.peers;
    step(&format!(
        "stopping peer {victim}: its phi climbs through the levels (1, 3, 8) while the others stay low"
    ));
    senders.pop().expect("at least one sender").stop();
    for _ in 0..args.watch {
        pause(Duration::from_secs(1))?;
        show(&monitor, &socket, &["peers"])?;
    }
    show(&monitor, &socket, &["suspects"])?;

    step(&format!(
        "restarting peer {victim} with a new incarnation: it recovers"
    ));
    let restarted = Process::spawn(
        in_ns(NS_PEERS, &monitor)
            .args([
                "send",
                "--to",
                &format!("{ADDR_MONITOR}:7946"),
                "--id",
                &victim.to_string(),
            ])
            .args(["--interval", &args.interval])
            // Above the Unix-time default of the first run: a restart, not a replay.
            .args(["--incarnation", &u32::MAX.to_string()])
            .env("RUST_LOG", "warn"),
    )?;
    senders.push(restarted);
    pause(Duration::from_secs(1))?;
    show(&monitor, &socket, &["peers"])?;
    show(&monitor, &socket, &["stats"])?;

    step("cleaning up: stopping the watcher, senders and agent, removing the namespaces");
    drop(watch);
    drop(senders);
    agent.stop();
    Ok(())
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn in_ns(ns: &str, program: &Path) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(program);
    cmd
}

fn show(monitor: &Path, socket: &Path, what: &[&str]) -> Result<()> {
    println!("$ monitor query {}", what.join(" "));
    workspace::run(
        Command::new(monitor)
            .arg("query")
            .arg("--socket")
            .arg(socket)
            .args(what),
    )
}

fn wait_for_socket(monitor: &Path, socket: &Path, agent: &Process) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if agent.exited() {
            bail!("the agent exited during start-up (see its log above)");
        }
        let ok = Command::new(monitor)
            .args(["query", "--socket"])
            .arg(socket)
            .arg("stats")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the agent did not answer on {} within 20 s",
        socket.display()
    )
}

/// The demo's namespaces and veth pair; removed on drop.
struct DemoNet;

impl DemoNet {
    fn create() -> Result<Self> {
        // A demo killed hard earlier may have left its namespaces: they are ours by name.
        Self::remove();
        let net = DemoNet;
        let ip = |args: &[&str]| workspace::run(Command::new("ip").args(args));
        ip(&["netns", "add", NS_MONITOR])?;
        ip(&["netns", "add", NS_PEERS])?;
        ip(&[
            "link", "add", IF_MONITOR, "netns", NS_MONITOR, "type", "veth", "peer", "name",
            IF_PEERS, "netns", NS_PEERS,
        ])?;
        for (ns, iface, addr) in [
            (NS_MONITOR, IF_MONITOR, ADDR_MONITOR),
            (NS_PEERS, IF_PEERS, ADDR_PEERS),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", iface])?;
            ip(&["-n", ns, "link", "set", iface, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn remove() {
        for ns in [NS_MONITOR, NS_PEERS] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for DemoNet {
    fn drop(&mut self) {
        Self::remove();
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("hbm-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process stopped with SIGTERM (then killed) on drop.
struct Process(Option<Child>);

impl Process {
    fn spawn(cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(Self(Some(child)))
    }

    fn exited(&self) -> bool {
        // A zombie or a missing /proc entry: the child is gone.
        self.0.as_ref().is_none_or(|child| {
            std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
                .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
        })
    }

    /// Prints the child's piped stdout line by line behind `prefix`.
    fn prefix_output(&self, prefix: &'static str) {
        let Some(stdout) = self.0.as_ref().and_then(|c| c.stdout.as_ref()) else {
            return;
        };
        // A dup of the pipe, so the reader thread owns its end without taking the Child's.
        let Ok(fd) = stdout.as_fd().try_clone_to_owned() else {
            return;
        };
        std::thread::spawn(move || {
            for line in BufReader::new(std::fs::File::from(fd)).lines() {
                let Ok(line) = line else { break };
                println!("{prefix}{line}");
            }
        });
    }

    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.terminate();
    }
}
