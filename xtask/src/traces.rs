//! `cargo xtask traces`: records the corpus of real traces under tests/traces/ through the real
//! kernel path. Each scenario gets its own pair of namespaces joined by a veth, an agent with
//! its XDP program on the monitor's end, one `monitor send` on the other end, an impairment of
//! the sender's side, and `monitor record` capturing every arrival; at the end the sender is
//! stopped (the crash every trace ends with). The scenarios run side by side.
//!
//! This kernel has no netem and no fq, so the impairments are what is real here: a TBF rate
//! limit shared with bursts of iperf3 cross traffic (congestion), a TC egress BPF program that
//! drops per a Gilbert-Elliott model (bursty loss), a CPU quota on the sender's cgroup with a
//! busy neighbour in it (a starved sender), a sender restart, a path that gains a congested
//! bottleneck halfway (a path change), and the sender's own timer jitter.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::{
    build,
    lab::{Interrupt, NetPair, Process, TempDir, wait_for_socket},
    setup, workspace,
};

/// Heartbeat port (the agent's default) and the cross traffic's.
const HEARTBEAT_PORT: u16 = 18498;
const IPERF_PORT: u16 = 5201;
/// Every scenario's one peer.
const PEER: u64 = 1;
const INTERVAL: &str = "100ms";

#[derive(Debug, Args)]
pub struct TracesArgs {
    /// How long each sender runs before it is stopped (the crash at the end of each trace).
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(10..=3600))]
    seconds: u64,
    /// Directory the traces are written into.
    #[arg(long, default_value = "tests/traces")]
    out: PathBuf,
    /// Record only these scenarios (repeat; default: all).
    #[arg(long = "only", value_enum)]
    only: Vec<Scenario>,
    /// Seed of the cross traffic's on/off schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The sender's own jitter: `--jitter 20ms` on an unimpaired path.
    Jitter,
    /// A 4 Mbit/s TBF with 200 ms of buffer on the sender's egress, shared with 1-4 s bursts of
    /// 8 Mbit/s iperf3 UDP.
    Congestion,
    /// Gilbert-Elliott loss at TC egress (good 0.1%, bad 40%, to bad 1%, to good 10%).
    BurstyLoss,
    /// The sender in a cgroup with a 10% CPU quota (23 ms per 230 ms), shared with a busy loop.
    CpuStarved,
    /// The sender restarts halfway (stopped, 3 s of silence, a new incarnation).
    Restart,
    /// Halfway, the path gains a 1 Mbit/s bottleneck with 100 ms of buffer, kept full by a
    /// steady 1.2 Mbit/s UDP flow.
    PathChange,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::Jitter,
        Scenario::Congestion,
        Scenario::BurstyLoss,
        Scenario::CpuStarved,
        Scenario::Restart,
        Scenario::PathChange,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Jitter => "jitter",
            Scenario::Congestion => "congestion",
            Scenario::BurstyLoss => "bursty-loss",
            Scenario::CpuStarved => "cpu-starved",
            Scenario::Restart => "restart",
            Scenario::PathChange => "path-change",
        }
    }

    /// Its own namespaces and addresses, so that all can run at once.
    fn net(self) -> NetPair {
        const NETS: [NetPair; 6] = [
            net(
                "hbm-tr0-mon",
                "hbm-tr0-snd",
                "hbmtr0m",
                "hbmtr0s",
                "10.214.0.1",
                "10.214.0.2",
            ),
            net(
                "hbm-tr1-mon",
                "hbm-tr1-snd",
                "hbmtr1m",
                "hbmtr1s",
                "10.214.1.1",
                "10.214.1.2",
            ),
            net(
                "hbm-tr2-mon",
                "hbm-tr2-snd",
                "hbmtr2m",
                "hbmtr2s",
                "10.214.2.1",
                "10.214.2.2",
            ),
            net(
                "hbm-tr3-mon",
                "hbm-tr3-snd",
                "hbmtr3m",
                "hbmtr3s",
                "10.214.3.1",
                "10.214.3.2",
            ),
            net(
                "hbm-tr4-mon",
                "hbm-tr4-snd",
                "hbmtr4m",
                "hbmtr4s",
                "10.214.4.1",
                "10.214.4.2",
            ),
            net(
                "hbm-tr5-mon",
                "hbm-tr5-snd",
                "hbmtr5m",
                "hbmtr5s",
                "10.214.5.1",
                "10.214.5.2",
            ),
        ];
        NETS[Self::ALL.iter().position(|&s| s == self).expect("listed")]
    }
}

const fn net(
    ns_monitor: &'static str,
    ns_peers: &'static str,
    if_monitor: &'static str,
    if_peers: &'static str,
    addr_monitor: &'static str,
    addr_peers: &'static str,
) -> NetPair {
    NetPair {
        ns_monitor,
        ns_peers,
        if_monitor,
        if_peers,
        addr_monitor,
        addr_peers,
    }
}

pub fn run(args: &TracesArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("traces")?;
    let tools = Tools::build()?;
    let interrupt = Interrupt::install()?;
    let out = workspace::root().join(&args.out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let scenarios: Vec<Scenario> = if args.only.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.only.clone()
    };
    println!(
        "traces: recording {} scenario(s) for {} s each, side by side, into {}",
        scenarios.len(),
        args.seconds,
        out.display()
    );
    let results: Vec<(Scenario, Result<PathBuf>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = scenarios
            .iter()
            .map(|&s| {
                let (tools, interrupt, out) = (&tools, &interrupt, &out);
                (
                    s,
                    scope.spawn(move || record_scenario(s, args, tools, interrupt, out)),
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|(s, h)| {
                (
                    s,
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the scenario's thread panicked"))),
                )
            })
            .collect()
    });
    let mut failed = 0;
    for (s, result) in &results {
        match result {
            Ok(path) => println!("traces: {} -> {}", s.name(), path.display()),
            Err(e) => {
                failed += 1;
                eprintln!("traces: {} failed: {e:#}", s.name());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} scenario(s) failed");
    }
    Ok(())
}

/// The agent and the impairment loader, built in release.
struct Tools {
    monitor: PathBuf,
    impair: PathBuf,
}

impl Tools {
    fn build() -> Result<Self> {
        let release = build::release_with_tools(&["hbm-impair"])?;
        Ok(Self {
            monitor: release.join("monitor"),
            impair: release.join("hbm-impair"),
        })
    }
}

/// What a scenario did to the path, for the trace's header.
struct Log(Vec<String>);

impl Log {
    fn note(&mut self, line: impl Into<String>) {
        self.0.push(line.into());
    }

    /// Runs `cmd` (logged as `shown`), failing on a non-zero exit.
    fn run(&mut self, shown: &str, cmd: &mut Command) -> Result<()> {
        self.note(format!("$ {shown}"));
        workspace::run(cmd)
    }
}

fn record_scenario(
    scenario: Scenario,
    args: &TracesArgs,
    tools: &Tools,
    interrupt: &Interrupt,
    out: &Path,
) -> Result<PathBuf> {
    let name = scenario.name();
    let net = scenario.net().create()?;
    let dir = TempDir::create(&format!("hbm-traces-{name}"))?;
    let socket = dir.0.join("agent.sock");
    let monitor = &tools.monitor;
    let mut log = Log(Vec::new());
    let target = format!("{}:{HEARTBEAT_PORT}", net.addr_monitor);
    log.note(format!(
        "namespaces {} (agent, {}) and {} (sender, {}) joined by veth {}/{}",
        net.ns_monitor,
        net.addr_monitor,
        net.ns_peers,
        net.addr_peers,
        net.if_monitor,
        net.if_peers
    ));
    log.note(format!(
        "$ monitor run --iface {} --socket agent.sock   # in {}",
        net.if_monitor, net.ns_monitor
    ));
    let agent = Process::spawn(
        NetPair::in_ns(net.ns_monitor, monitor)
            .args(["run", "--iface", net.if_monitor, "--socket"])
            .arg(&socket)
            .env("RUST_LOG", "warn"),
    )?;
    wait_for_socket(monitor, &socket, &agent)?;

    let in_sender_ns = |program: &str| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", net.ns_peers, program]);
        cmd
    };
    let sender_args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["send", "--to", &target, "--id", &PEER.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(["--interval".into(), INTERVAL.into()]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let spawn_sender = |log: &mut Log, extra: &[&str]| -> Result<Process> {
        let argv = sender_args(extra);
        log.note(format!(
            "$ monitor {}   # in {}",
            argv.join(" "),
            net.ns_peers
        ));
        Process::spawn(
            NetPair::in_ns(net.ns_peers, monitor)
                .args(&argv)
                .env("RUST_LOG", "error")
                .stdout(Stdio::null()),
        )
    };

    // Impairments that hold for the whole run go on before the sender starts.
    let mut _impair: Option<Process> = None;
    let mut _iperf_server: Option<Process> = None;
    let mut cpu: Option<CpuLimit> = None;
    let mut _burner: Option<Process> = None;
    let mut sender_extra: Vec<&str> = Vec::new();
    match scenario {
        Scenario::Jitter => sender_extra.extend(["--jitter", "20ms"]),
        Scenario::Congestion => {
            log.run(
                &format!(
                    "tc qdisc add dev {} root tbf rate 4mbit burst 16kb latency 200ms   # in {}",
                    net.if_peers, net.ns_peers
                ),
                in_sender_ns("tc").args([
                    "qdisc",
                    "add",
                    "dev",
                    net.if_peers,
                    "root",
                    "tbf",
                    "rate",
                    "4mbit",
                    "burst",
                    "16kb",
                    "latency",
                    "200ms",
                ]),
            )?;
            _iperf_server = Some(iperf_server(&net, &mut log)?);
        }
        Scenario::BurstyLoss => {
            let argv = [
                "--iface",
                net.if_peers,
                "--port",
                "18498",
                "--to-bad",
                "0.01",
                "--to-good",
                "0.10",
                "--loss-good",
                "0.001",
                "--loss-bad",
                "0.40",
            ];
            log.note(format!(
                "$ hbm-impair {}   # in {}",
                argv.join(" "),
                net.ns_peers
            ));
            let mut p = Process::spawn(
                NetPair::in_ns(net.ns_peers, &tools.impair)
                    .args(argv)
                    .stdout(Stdio::piped()),
            )?;
            let line = p.read_line()?;
            if !line.contains("attached") {
                bail!("hbm-impair did not attach: {line:?}");
            }
            _impair = Some(p);
        }
        Scenario::CpuStarved => {
            // A period that is not a multiple of the heartbeat interval: with 100 ms the sender
            // phase-locks to the quota's refill and is never (or always equally) delayed.
            let limit = CpuLimit::create(
                &format!("hbm-traces-{}", std::process::id()),
                23_000,
                230_000,
            )?;
            log.note(format!(
                "a cgroup with a CPU quota of 23 ms per 230 ms ({}), holding the sender and `sh -c 'while :; do :; done'`",
                limit.describe()
            ));
            let burner = Process::spawn(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdout(Stdio::null()),
            )?;
            limit.add(burner.pid())?;
            _burner = Some(burner);
            cpu = Some(limit);
        }
        Scenario::Restart | Scenario::PathChange => {}
    }

    let mut sender = spawn_sender(&mut log, &sender_extra)?;
    if let Some(limit) = &cpu {
        // `ip netns exec` execs the sender in place: this pid is the sender.
        limit.add(sender.pid())?;
    }
    wait_for_peer(monitor, &socket, interrupt)?;
    let record_for = Duration::from_secs(args.seconds + 3);
    let trace_tmp = dir.0.join("trace");
    log.note(format!(
        "$ monitor record --socket agent.sock --peer {PEER} --duration {}s --out {name}.trace",
        record_for.as_secs()
    ));
    let recorder = Process::spawn(
        Command::new(monitor)
            .args(["record", "--socket"])
            .arg(&socket)
            .args(["--peer", &PEER.to_string(), "--duration"])
            .arg(format!("{}s", record_for.as_secs()))
            .arg("--out")
            .arg(&trace_tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    )?;
    let start = Instant::now();
    let half = Duration::from_secs(args.seconds / 2);
    let end = Duration::from_secs(args.seconds);
    let mut rng = fastrand::Rng::with_seed(args.seed);
    let mut _bottleneck_flow: Option<Process> = None;
    let mut halfway_done = false;
    let mut cross: Option<(Process, Instant)> = None;
    let mut next_burst = start + Duration::from_millis(rng.u64(2_000..8_000));
    let mut bursts = 0u32;
    while start.elapsed() < end {
        interrupt.pause(Duration::from_millis(50))?;
        let now = Instant::now();
        if scenario == Scenario::Congestion {
            if let Some((_, until)) = &cross
                && now >= *until
            {
                cross.take().expect("running").0.stop();
                next_burst = now + Duration::from_millis(rng.u64(2_000..8_000));
            }
            if cross.is_none()
                && now >= next_burst
                && start.elapsed() + Duration::from_secs(1) < end
            {
                let secs = rng.u64(1..=4);
                bursts += 1;
                cross = Some((
                    iperf_client(&net, "8M", secs + 1, None)?,
                    now + Duration::from_secs(secs),
                ));
            }
        }
        if !halfway_done && start.elapsed() >= half {
            halfway_done = true;
            match scenario {
                Scenario::Restart => {
                    log.note(format!(
                        "at {} s: the sender is stopped, 3 s of silence, started again (a new incarnation)",
                        half.as_secs()
                    ));
                    sender.stop();
                    interrupt.pause(Duration::from_secs(3))?;
                    // The incarnation is the start time in seconds: it grows across the restart.
                    sender = spawn_sender(&mut log, &sender_extra)?;
                }
                Scenario::PathChange => {
                    log.note(format!("at {} s the path changes:", half.as_secs()));
                    log.run(
                        &format!(
                            "tc qdisc add dev {} root tbf rate 1mbit burst 8kb latency 100ms   # in {}",
                            net.if_peers, net.ns_peers
                        ),
                        in_sender_ns("tc").args([
                            "qdisc", "add", "dev", net.if_peers, "root", "tbf", "rate", "1mbit",
                            "burst", "8kb", "latency", "100ms",
                        ]),
                    )?;
                    _iperf_server = Some(iperf_server(&net, &mut log)?);
                    let rest = args.seconds - half.as_secs() + 2;
                    _bottleneck_flow = Some(iperf_client(&net, "1200K", rest, Some(&mut log))?);
                }
                _ => {}
            }
        }
    }
    if scenario == Scenario::Congestion {
        log.note(format!(
            "{bursts} bursts of `iperf3 -c {} -p {IPERF_PORT} -u -b 8M -t 2..5` (in {}), \
             1-4 s each, 2-8 s apart (seed {})",
            net.addr_monitor, net.ns_peers, args.seed
        ));
    }
    if let Some((p, _)) = cross.take() {
        p.stop();
    }
    log.note(format!(
        "at {} s the sender is stopped: the crash the trace ends with",
        args.seconds
    ));
    sender.stop();
    let impair_report = match _impair.take() {
        Some(p) => {
            let _ = Command::new("kill")
                .args(["-TERM", &p.pid().to_string()])
                .status();
            Some(p.finish()?.trim().to_string())
        }
        None => None,
    };
    if let Some(report) = impair_report {
        log.note(format!("hbm-impair at exit: {report}"));
    }
    recorder.finish().context("monitor record")?;
    drop(_burner.take());
    drop(cpu);
    drop(agent);

    let recorded = std::fs::read_to_string(&trace_tmp)
        .with_context(|| format!("reading {}", trace_tmp.display()))?;
    let mut text = String::new();
    let about = scenario
        .to_possible_value()
        .and_then(|v| v.get_help().map(|h| h.to_string()))
        .unwrap_or_default();
    let _ = writeln!(
        text,
        "# scenario {name}: {about}\n# made by `cargo xtask traces --seconds {} --seed {} --only {name}` \
         on Linux {}; 100 ms heartbeats from `monitor send`, arrivals timestamped by the XDP program",
        args.seconds,
        args.seed,
        kernel_release()
    );
    for line in &log.0 {
        let _ = writeln!(text, "# {line}");
    }
    text.push_str(&recorded);
    let path = out.join(format!("{name}.trace"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn iperf_server(net: &NetPair, log: &mut Log) -> Result<Process> {
    log.note(format!(
        "$ iperf3 -s -B {} -p {IPERF_PORT}   # in {}",
        net.addr_monitor, net.ns_monitor
    ));
    let server = Process::spawn(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                net.ns_monitor,
                "iperf3",
                "-s",
                "-B",
                net.addr_monitor,
            ])
            .args(["-p", &IPERF_PORT.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    // Listening: a client can connect (its control connection is TCP).
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let up = Command::new("ip")
            .args(["netns", "exec", net.ns_monitor, "ss", "-Hltn"])
            .arg(format!("sport = :{IPERF_PORT}"))
            .output()
            .is_ok_and(|o| !o.stdout.is_empty());
        if up {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("iperf3 -s did not start listening in {}", net.ns_monitor)
}

fn iperf_client(net: &NetPair, rate: &str, secs: u64, log: Option<&mut Log>) -> Result<Process> {
    let argv = [
        "-c",
        net.addr_monitor,
        "-p",
        &IPERF_PORT.to_string(),
        "-u",
        "-b",
        rate,
        "-t",
        &secs.to_string(),
    ]
    .map(str::to_string);
    if let Some(log) = log {
        log.note(format!(
            "$ iperf3 {}   # in {}",
            argv.join(" "),
            net.ns_peers
        ));
    }
    Process::spawn(
        Command::new("ip")
            .args(["netns", "exec", net.ns_peers, "iperf3"])
            .args(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Waits until the agent has admitted the peer (recording needs its slot).
fn wait_for_peer(monitor: &Path, socket: &Path, interrupt: &Interrupt) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let known = Command::new(monitor)
            .args(["query", "--socket"])
            .arg(socket)
            .args(["peer", &PEER.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if known {
            return Ok(());
        }
        interrupt.pause(Duration::from_millis(100))?;
    }
    bail!("peer {PEER} was not admitted within 20 s")
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The cgroup with a CPU quota the tests use too: one implementation, included by path (xtask
/// does not depend on the tests' crate).
#[path = "../../tests/src/cgroup.rs"]
mod cgroup;
use cgroup::CpuLimit;
