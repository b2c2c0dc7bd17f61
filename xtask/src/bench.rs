//! `cargo xtask bench`: builds in release, makes its own namespaces, runs the agent and the
//! load generator, and prints one table (appended, with date, kernel and command, to
//! docs/benchmarks-history.md; BENCHMARKS.md keeps the current figures). Ratios are measured within one run; nothing here asserts a timing.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{
    build,
    lab::{Interrupt, NetPair, Process, TempDir, wait_for_socket},
    setup, workspace,
};

#[path = "bench_kernel_loadgen.rs"]
mod kernel_loadgen;

const NET: NetPair = NetPair {
    ns_monitor: "hbm-bench-mon",
    ns_peers: "hbm-bench-gen",
    if_monitor: "hbmbench0",
    if_peers: "hbmbench1",
    addr_monitor: "10.214.0.1",
    addr_peers: "10.214.0.2",
};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Peer counts to measure at.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000,200000")]
    scales: Vec<u64>,
    /// Seconds of steady load per scale (CPU share and memory are measured over it).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// A short run (3 s per step, scales 1000 and 50000) to check the benchmark itself.
    #[arg(long)]
    quick: bool,
    /// Do not append the results to docs/benchmarks-history.md.
    #[arg(long)]
    no_record: bool,
    /// Leave out the fleet's figures (NATS JetStream; about a minute).
    #[arg(long)]
    no_fleet: bool,
    /// Only the agent's cost at 1, 5 and 10 Hz (at the largest scale up to 50,000 peers);
    /// nothing is recorded.
    #[arg(long)]
    agent_only: bool,
    /// Only the scale runs (for example `--scales 200000,1000000 --rate-hz 1`), recorded
    /// unless --no-record.
    #[arg(long)]
    scales_only: bool,
    /// Only the floor comparison (BPF_PROG_TEST_RUN and the live rows of the scales given,
    /// `--seconds` each), for iterating on the kernel program; recorded unless --no-record.
    #[arg(long)]
    floor_only: bool,
    /// Heartbeats per second per peer in the scale runs (the generator tops out near 350k
    /// packets per second on 2 cores; the table shows what it sent). Above 50,000 peers, at
    /// most 250k packets a second in all, which the generator sends on schedule.
    #[arg(long, default_value_t = RATE_HZ)]
    rate_hz: f64,
    /// Only the kernel generator's rows (`monitor loadgen --kernel`): its ceiling beside the
    /// userspace generator's, and 200,000 peers x 10 Hz, 1,000,000 x 1 Hz and 1,000,000 x
    /// 10 Hz (as far as the machine allows), `--seconds` each; recorded unless --no-record.
    #[arg(long)]
    kernel_loadgen: bool,
}

/// Heartbeats per second per peer in the scale runs.
const RATE_HZ: f64 = 10.0;
/// Packets a second the generator sends on schedule on this machine's two cores (it tops out
/// near 350k and falls behind in bursts before that). A late heartbeat is a silence to the
/// detector: at 200,000 peers asked for 10 Hz the generator sent 1.8 Hz, late and in bursts,
/// not the stream the row was labelled with, and the agent raised a million suspect events in
/// 10 s. Above 50,000 peers the scale runs send at most this many.
const STEADY_PPS: f64 = 250_000.0;

/// The rate per peer of a scale run: `rate_hz`, lowered above 50,000 peers to what the
/// generator sends on schedule (50,000 x 10 Hz, the load the product is sized for, stays as
/// asked).
fn scale_rate_hz(peers: u64, rate_hz: f64) -> f64 {
    if peers <= 50_000 {
        rate_hz
    } else {
        rate_hz.min(STEADY_PPS / peers as f64)
    }
}

/// Where the scale runs' agent serves its metrics, in the monitor's namespace: the socket
/// probe reads the agent's own timing of its requests there.
const AGENT_METRICS: &str = "127.0.0.1:9464";
/// Per peer, in the floor comparison's hot row at 1,000 peers: 300 Hz keeps the stream (300k
/// packets a second) under what the generator sends on two cores. At this rate every slot is touched often enough to stay in cache, so the row
/// measures the program's own work. At 10 Hz (10k packets a second) a packet comes every
/// 100 us and finds its slot, the index line and the program's maps cold, whichever program
/// it is: that row measures cache misses between packets as much as the program.
const HOT_RATE_HZ: f64 = 300.0;
/// Fraction of peers killed near the end of each scale run, for event latency.
const KILL_FRACTION: f64 = 0.01;

pub(crate) struct Tools {
    pub monitor: PathBuf,
    pub probe: PathBuf,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("bench")?;
    // One bench at a time on a machine: they share namespace names (a second one would remove
    // the first one's), and two at once would measure each other.
    let _one_at_a_time = BenchLock::acquire()?;
    let tools = Tools::build()?;
    let (scales, seconds) = if args.quick {
        (vec![1000, 50_000], 3)
    } else {
        (args.scales.clone(), args.seconds.max(5))
    };
    let interrupt = Interrupt::install()?;
    let _stats = BpfStats::enable()?;
    let net = NET.create()?;
    let dir = TempDir::create("hbm-bench")?;

    if args.kernel_loadgen {
        let table = kernel_loadgen::run(&tools, &net, &dir.0, seconds, &interrupt)?;
        println!("\n{table}");
        if !args.no_record {
            record(
                &table,
                &format!("cargo xtask bench --kernel-loadgen --seconds {seconds}"),
            )?;
        }
        return Ok(());
    }

    println!("==> kernel cost through BPF_PROG_TEST_RUN");
    let test_run = probe_json(&tools.probe, &["kernel"])?;
    let test_run_ns = test_run["ns_per_packet"].as_f64().unwrap_or(f64::NAN);
    if args.floor_only {
        let table = floor_table(
            &tools,
            &net,
            &dir.0,
            &scales,
            seconds,
            test_run_ns,
            &interrupt,
        )?;
        println!("\n{table}");
        if !args.no_record {
            record(
                &table,
                &format!(
                    "cargo xtask bench --floor-only --scales {} --seconds {seconds}",
                    join(&scales)
                ),
            )?;
        }
        return Ok(());
    }
    println!("==> kernel logging off and on (--kernel-log), BPF_PROG_TEST_RUN");
    let log_cost = probe_json(&tools.probe, &["kernel-log"])?;

    if args.agent_only {
        let peers = scales
            .iter()
            .copied()
            .filter(|&p| p <= 50_000)
            .max()
            .unwrap_or(1000);
        let cost = agent_cost(
            &tools,
            &net,
            &dir.0,
            peers,
            seconds.max(10),
            args.quick,
            &interrupt,
        )?;
        println!("{}", render_agent_cost(peers, &cost));
        return Ok(());
    }

    let mut rows = Vec::new();
    for &peers in &scales {
        interrupt.check()?;
        let rate_hz = scale_rate_hz(peers, args.rate_hz);
        println!("==> {peers} peers x {rate_hz} Hz for {seconds} s");
        rows.push(scale_run(
            &tools, &net, &dir.0, peers, rate_hz, seconds, &interrupt,
        )?);
    }
    if args.scales_only {
        let table = render_scales(&rows);
        println!("\n{table}");
        if !args.no_record {
            record(
                &table,
                &format!(
                    "cargo xtask bench --scales-only --scales {} --rate-hz {} --seconds {seconds}",
                    join(&scales),
                    args.rate_hz
                ),
            )?;
        }
        return Ok(());
    }

    let ingest_peers = scales
        .iter()
        .copied()
        .filter(|&p| p <= 50_000)
        .max()
        .unwrap_or(1000);
    println!("==> ingest ceiling at {ingest_peers} peers");
    let ingest = ingest_run(
        &tools,
        &net,
        &dir.0,
        ingest_peers,
        if args.quick { 2 } else { 3 },
    )?;

    println!("==> the agent's cost at 1, 5 and 10 Hz a peer, {ingest_peers} peers");
    let agent_cost = agent_cost(
        &tools,
        &net,
        &dir.0,
        ingest_peers,
        if args.quick { 5 } else { 20 },
        args.quick,
        &interrupt,
    )?;

    let floor_table = floor_table(
        &tools,
        &net,
        &dir.0,
        &scales,
        if args.quick { 3 } else { 10 },
        test_run_ns,
        &interrupt,
    )?;

    println!("==> XDP path against a userspace UDP receiver, same stream");
    let paths = path_comparison(
        &tools,
        &net,
        &dir.0,
        ingest_peers,
        if args.quick { 3 } else { 10 },
    )?;

    let mut table = floor_table;
    table.push_str(&render_agent_cost(ingest_peers, &agent_cost));
    table.push_str(&render(test_run_ns, &rows, &ingest, &paths));
    if !args.no_fleet {
        println!("==> the fleet on NATS JetStream: event latency and a 50,000-peer burst");
        let fleet = fleet_figures(&tools)?;
        let v = |path: &[&str]| f(&fleet, path);
        let _ = writeln!(
            table,
            "\nFleet on NATS JetStream (tests/tests/fleet.rs `fleet_figures`, release): event \
             latency from crossing to a stream consumer p50 {:.0} ms, p99 {:.0} ms (n = {}); \
             {} peers suspected at once: {} suspect events published and consumed, {:.2} s from \
             the first crossing to the last event consumed",
            v(&["latency_ms_1000_peers_100_killed", "p50"]),
            v(&["latency_ms_1000_peers_100_killed", "p99"]),
            fleet["latency_ms_1000_peers_100_killed"]["n"],
            fleet["burst"]["peers"],
            fleet["burst"]["suspect_events"],
            v(&["burst", "first_crossing_to_last_consumed_ms"]) / 1000.0,
        );
    }
    let ns = |k: &str| log_cost[k].as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        table,
        "\nKernel logging (`--kernel-log`), BPF_PROG_TEST_RUN, ns per packet: valid heartbeat \
         {:.0} off / {:.0} debug (it logs nothing); malformed heartbeat {:.0} off / {:.0} debug \
         (one warn line)",
        ns("heartbeat_off_ns"),
        ns("heartbeat_debug_ns"),
        ns("malformed_off_ns"),
        ns("malformed_debug_ns"),
    );
    println!("\n{table}");
    if !args.no_record {
        record(
            &table,
            if args.quick {
                "cargo xtask bench --quick"
            } else {
                "cargo xtask bench"
            },
        )?;
    }
    Ok(())
}

impl Tools {
    /// Builds the agent and the probes in release.
    pub fn build() -> Result<Self> {
        let release = build::release_with_tools(&["hbm-bench"])?;
        Ok(Self {
            monitor: release.join("monitor"),
            probe: release.join("hbm-bench"),
        })
    }
}

/// An exclusive lock on a file in /run for as long as a bench runs; a second bench waits.
struct BenchLock {
    /// Held (and the lock with it) until dropped.
    _file: std::fs::File,
}

impl BenchLock {
    const PATH: &'static str = "/run/heartbeat-monitor-bench.lock";

    fn acquire() -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::PATH)
            .with_context(|| format!("opening {}", Self::PATH))?;
        if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock() {
            println!("==> another `cargo xtask bench` is running; waiting for it to finish");
        }
        file.lock()
            .with_context(|| format!("locking {}", Self::PATH))?;
        Ok(Self { _file: file })
    }
}

/// Turns on kernel.bpf_stats_enabled for the run and restores it after.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Result<Self> {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(path).context("reading kernel.bpf_stats_enabled")?;
        std::fs::write(path, "1").context("enabling kernel.bpf_stats_enabled")?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

fn probe_json(probe: &Path, args: &[&str]) -> Result<Value> {
    let out = workspace::output(Command::new(probe).args(args))?;
    let last = out.lines().last().context("probe printed nothing")?;
    serde_json::from_str(last).with_context(|| format!("probe output {last:?}"))
}

pub(crate) struct Agent {
    pub process: Process,
    pub socket: PathBuf,
    monitor: PathBuf,
}

impl Agent {
    pub fn start(
        tools: &Tools,
        net: &NetPair,
        dir: &Path,
        peers: u64,
        extra: &[&str],
    ) -> Result<Self> {
        let peers_file = dir.join(format!("peers-{peers}"));
        let mut text = String::with_capacity(peers as usize * 7);
        for id in 1..=peers {
            let _ = writeln!(text, "{id}");
        }
        std::fs::write(&peers_file, text)?;
        let socket = dir.join(format!("agent-{peers}.sock"));
        let process = Process::spawn(
            NetPair::in_ns(net.ns_monitor, &tools.monitor)
                .args(["run", "--iface", net.if_monitor, "--socket"])
                .arg(&socket)
                .arg("--peers")
                .arg(&peers_file)
                .args(["--capacity", &peers.max(1024).to_string()])
                .args(extra)
                .env("RUST_LOG", "warn"),
        )?;
        wait_for_socket(&tools.monitor, &socket, &process)?;
        Ok(Self {
            process,
            socket,
            monitor: tools.monitor.clone(),
        })
    }

    pub fn stats(&self) -> Result<Value> {
        let out = workspace::output(
            Command::new(&self.monitor)
                .args(["query", "--json", "--socket"])
                .arg(&self.socket)
                .arg("stats"),
        )?;
        let v: Value = serde_json::from_str(out.trim())?;
        Ok(v["stats"].clone())
    }
}

fn loadgen(
    tools: &Tools,
    net: &NetPair,
    peers: u64,
    rate: f64,
    seconds: f64,
    kill: Option<f64>,
) -> Result<Process> {
    let mut cmd = NetPair::in_ns(net.ns_peers, &tools.monitor);
    cmd.args([
        "loadgen",
        "--to",
        &net.target(),
        "--peers",
        &peers.to_string(),
    ])
    .args(["--rate", &rate.to_string(), "--duration", &ms(seconds)])
    .stdout(Stdio::piped());
    if let Some(after) = kill {
        cmd.args(["--kill", &KILL_FRACTION.to_string(), "--after", &ms(after)]);
    }
    Process::spawn(&mut cmd)
}

/// Seconds as a whole number of milliseconds, the way the CLI reads durations.
fn ms(seconds: f64) -> String {
    format!("{}ms", (seconds * 1000.0).round() as u64)
}

fn finish_json(process: Process) -> Result<Value> {
    let out = process.finish()?;
    let last = out.lines().last().context("no output")?;
    Ok(serde_json::from_str(last)?)
}

/// CPU seconds a process has run, summed over its threads from the scheduler's own
/// nanosecond accounting (`/proc/PID/task/*/schedstat`), not the 10 ms ticks of
/// `/proc/PID/stat`: an agent at half a percent of a core runs 5 ms a second. Threads that
/// ended are not counted (the agent's live for its whole life).
fn process_cpu_s(pid: u32) -> Result<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread may end between the listing and the read.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        ns += text
            .split_whitespace()
            .next()
            .context("empty schedstat")?
            .parse::<u64>()?;
    }
    Ok(ns as f64 / 1e9)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Busy CPU seconds of the whole machine so far (all CPUs, everything but idle and iowait).
fn system_busy_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu: Vec<f64> = stat
        .lines()
        .next()
        .context("empty /proc/stat")?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = cpu.iter().take(8).sum();
    Ok((total - cpu[3] - cpu[4]) / clock_ticks())
}

pub(crate) fn status_kib(pid: u32, key: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key}"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("odd status")?
        .parse()?)
}

/// Kernel memory of every BPF map the process holds an fd for (fdinfo `memlock`), bytes.
fn map_memory_bytes(pid: u32) -> Result<f64> {
    let mut total = 0.0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if !info.contains("map_type:") {
            continue;
        }
        if let Some(line) = info.lines().find(|l| l.starts_with("memlock:")) {
            total += line
                .split_whitespace()
                .nth(1)
                .unwrap_or("0")
                .parse::<f64>()
                .unwrap_or(0.0);
        }
    }
    Ok(total)
}

struct ScaleRow {
    peers: u64,
    requested_pps: f64,
    achieved_pps: f64,
    sent: u64,
    recorded: u64,
    kernel_ns: f64,
    agent_cpu_pct: f64,
    rss_mib: f64,
    maps_mib: f64,
    sweep: Value,
    socket: Value,
    events: Value,
}

fn scale_run(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    peers: u64,
    rate_hz: f64,
    seconds: u64,
    interrupt: &Interrupt,
) -> Result<ScaleRow> {
    let sweep = probe_json(&tools.probe, &["sweep", "--peers", &peers.to_string()])?;
    // Told the stream's interval, as an operator tells it the peers' one: with the default
    // (100 ms) and peers sending every 800 ms, every peer crosses all three levels before its
    // second heartbeat: at 200,000 peers a start-up flood of 600k suspect events, after which
    // the kill's events reached the subscriber 35 ms after publication (p50), against 2 ms
    // when the agent was told.
    let first_interval_ms = format!("{:.0}", 1000.0 / rate_hz);
    let agent = Agent::start(
        tools,
        net,
        dir,
        peers,
        &[
            "--metrics-addr",
            AGENT_METRICS,
            "--first-interval-ms",
            &first_interval_ms,
        ],
    )?;
    let killed = ((peers as f64 * KILL_FRACTION).round() as u64).max(1);
    let mut events = Process::spawn(
        Command::new(&tools.probe)
            .args(["events", "--socket"])
            .arg(&agent.socket)
            .args(["--expected", &(killed * 3).to_string()])
            .args(["--first-id", "1", "--last-id", &(killed + 1).to_string()])
            .args(["--timeout-s", &(seconds + 40).to_string()])
            .stdout(Stdio::piped()),
    )?;
    let subscribed = events.read_line()?;
    if !subscribed.contains("subscribed") {
        bail!("event probe: {subscribed}");
    }
    // Timeline: 2 s to settle, `seconds` of steady load over which CPU is measured (nothing
    // else touches the agent then), the socket probe, the kill, 4 s for the events to land.
    let settle = 2.0;
    let seconds_f = seconds as f64;
    let probe_at = settle + seconds_f;
    let kill_at = probe_at + 4.0;
    let total = kill_at + 4.0;
    let before = agent.stats()?;
    let pid = agent.process.pid();
    let generator = loadgen(tools, net, peers, rate_hz, total, Some(kill_at))?;
    interrupt.pause(Duration::from_secs_f64(settle))?;
    let (cpu0, t0) = (process_cpu_s(pid)?, Instant::now());
    interrupt.pause(Duration::from_secs_f64(seconds_f))?;
    let (cpu1, wall) = (process_cpu_s(pid)?, t0.elapsed().as_secs_f64());
    let rss_mib = status_kib(pid, "RssAnon:")? / 1024.0;
    let maps_mib = map_memory_bytes(pid)? / (1 << 20) as f64;
    let socket = probe_json(
        &tools.probe,
        &[
            "socket",
            "--socket",
            &agent.socket.display().to_string(),
            "--peers",
            &peers.to_string(),
            "--metrics-addr",
            AGENT_METRICS,
            "--metrics-ns",
            net.ns_monitor,
        ],
    )?;
    let sent = finish_json(generator)?;
    // Let the last heartbeats land before counting.
    std::thread::sleep(Duration::from_millis(200));
    let after = agent.stats()?;
    let events = finish_json(events)?;
    agent.process.stop();

    let delta = |key: &str| {
        after["kernel"][key].as_u64().unwrap_or(0) - before["kernel"][key].as_u64().unwrap_or(0)
    };
    let runs = after["xdp"]["run_count"].as_f64().unwrap_or(0.0)
        - before["xdp"]["run_count"].as_f64().unwrap_or(0.0);
    let time = after["xdp"]["run_time_ns"].as_f64().unwrap_or(0.0)
        - before["xdp"]["run_time_ns"].as_f64().unwrap_or(0.0);
    Ok(ScaleRow {
        peers,
        requested_pps: peers as f64 * rate_hz,
        achieved_pps: sent["achieved_pps"].as_f64().unwrap_or(0.0),
        sent: sent["sent"].as_u64().unwrap_or(0),
        recorded: delta("heartbeats"),
        kernel_ns: if runs > 0.0 { time / runs } else { f64::NAN },
        agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
        rss_mib,
        maps_mib,
        sweep,
        socket,
        events,
    })
}

/// The agent's CPU under a steady stream of `rate` Hz from every peer.
struct AgentCost {
    peers: u64,
    rate_hz: f64,
    achieved_pps: f64,
    agent_cpu_pct: f64,
    /// Slot reads (estimate refreshes) per second, from the agent's stats.
    refreshes_per_s: f64,
    /// Floors renewed without a slot read per second, from the agent's stats.
    refloors_per_s: f64,
    /// Events published per second over the steady part, from the agent's stats (0 while no
    /// peer's silence crosses a level).
    events_per_s: f64,
}

/// The agent alone under 1 Hz, 5 Hz and 10 Hz from `peers` peers, and 10 Hz from half as
/// many: its cost should follow reads (sweeps), not heartbeats. Nothing else touches the agent
/// meanwhile.
fn agent_cost(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    peers: u64,
    seconds: u64,
    quick: bool,
    interrupt: &Interrupt,
) -> Result<Vec<AgentCost>> {
    let mut rows = Vec::new();
    // 5 Hz is the fastest the generator keeps on schedule at 50,000 peers (250k packets a
    // second); at 10 Hz it sends about 7 Hz, late and in bursts. Half the peers at 10 Hz is
    // that rate on schedule: the agent's work is per peer (a word and a watch per sweep, a
    // refresh every so many heartbeats), so twice its cost estimates the full count's.
    for (peers, rate_hz) in [
        (peers, 1.0f64),
        (peers, 5.0),
        (peers, 10.0),
        (peers / 2, 10.0),
    ] {
        interrupt.check()?;
        let agent = Agent::start(tools, net, dir, peers, &[])?;
        let pid = agent.process.pid();
        // Measured once every window is full (128 intervals: 12.8 s at 10 Hz, 128 s at 1 Hz),
        // the steady state of a long-running agent; a quick run settles for at most 15 s.
        let settle = (130.0 / rate_hz).min(if quick { 15.0 } else { 140.0 });
        let generator = loadgen(tools, net, peers, rate_hz, settle + seconds as f64, None)?;
        interrupt.pause(Duration::from_secs_f64(settle))?;
        let before = agent.stats()?;
        let (cpu0, t0) = (process_cpu_s(pid)?, Instant::now());
        interrupt.pause(Duration::from_secs(seconds))?;
        let (cpu1, wall) = (process_cpu_s(pid)?, t0.elapsed().as_secs_f64());
        let after = agent.stats()?;
        let sent = finish_json(generator)?;
        agent.process.stop();
        let delta = |key: &str| {
            after[key].as_f64().unwrap_or(f64::NAN) - before[key].as_f64().unwrap_or(f64::NAN)
        };
        rows.push(AgentCost {
            peers,
            rate_hz,
            achieved_pps: sent["achieved_pps"].as_f64().unwrap_or(0.0),
            agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
            refreshes_per_s: delta("refreshes") / wall,
            refloors_per_s: delta("refloors") / wall,
            events_per_s: delta("events") / wall,
        });
    }
    Ok(rows)
}

fn render_agent_cost(peers: u64, rows: &[AgentCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nThe agent alone at {peers} peers (CPU over the steady part of the run, after every \
         window filled; a refresh is one slot read and estimate):\n"
    );
    let _ = writeln!(
        t,
        "| peers | rate per peer | sent pps | agent CPU % of a core | refreshes/s | refreshes per heartbeat | floors renewed without a read/s | events/s |"
    );
    let _ = writeln!(t, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} Hz | {:.0} | {:.2} | {:.0} | {:.3} | {:.0} | {:.0} |",
            r.peers,
            r.rate_hz,
            r.achieved_pps,
            r.agent_cpu_pct,
            r.refreshes_per_s,
            r.refreshes_per_s / r.achieved_pps.max(1.0),
            r.refloors_per_s,
            r.events_per_s,
        );
    }
    if let [one, five, ten, half] = rows {
        let _ = writeln!(
            t,
            "
CPU at 10 Hz over CPU at 1 Hz: {:.2}x; {peers} peers x 10 Hz on schedule, estimated as twice \
             {} peers x 10 Hz: {:.2}% of a core",
            ten.agent_cpu_pct / one.agent_cpu_pct,
            half.peers,
            2.0 * half.agent_cpu_pct,
        );
        if let Some(fit) = AgentCostModel::solve([one, five, half]) {
            let _ = writeln!(
                t,
                "
Solved from the three rows sent on schedule, CPU % = {:.3} (a constant: what every sweep \
                 costs) + {:.3} per 10k peers + {:.3} per 100k packets a second; at {peers} peers \
                 x 10 Hz on schedule: {:.2}% of a core (twice the half-count row counts the \
                 constant twice: an upper bound)
",
                fit.fixed,
                fit.per_peer * 1e4,
                fit.per_pps * 1e5,
                fit.at(peers as f64, peers as f64 * 10.0),
            );
        }
    }
    t
}

/// The agent's CPU as a constant (what every sweep costs whatever the peers: waking, the
/// clock, the metrics), a cost per peer (its word and watch read every sweep) and a cost per
/// packet (absorbing heartbeats, refreshes), through three measured rows.
struct AgentCostModel {
    fixed: f64,
    per_peer: f64,
    per_pps: f64,
}

impl AgentCostModel {
    /// The model solved exactly from three rows (three unknowns, no fit), None if they do not
    /// pin it down (two rows alike).
    fn solve(rows: [&AgentCost; 3]) -> Option<Self> {
        // Cramer's rule on [1, peers, pps] . x = cpu.
        let m: Vec<[f64; 4]> = rows
            .iter()
            .map(|r| [1.0, r.peers as f64, r.achieved_pps, r.agent_cpu_pct])
            .collect();
        let det = |c: [usize; 3]| {
            let e = |i: usize, j: usize| m[i][c[j]];
            e(0, 0) * (e(1, 1) * e(2, 2) - e(1, 2) * e(2, 1))
                - e(0, 1) * (e(1, 0) * e(2, 2) - e(1, 2) * e(2, 0))
                + e(0, 2) * (e(1, 0) * e(2, 1) - e(1, 1) * e(2, 0))
        };
        let d = det([0, 1, 2]);
        if d.abs() < 1e-6 {
            return None;
        }
        Some(Self {
            fixed: det([3, 1, 2]) / d,
            per_peer: det([0, 3, 2]) / d,
            per_pps: det([0, 1, 3]) / d,
        })
    }

    fn at(&self, peers: f64, pps: f64) -> f64 {
        self.fixed + self.per_peer * peers + self.per_pps * pps
    }
}

struct Ingest {
    peers: u64,
    /// (target pps, achieved pps, sent, recorded)
    steps: Vec<(f64, f64, u64, u64)>,
}

fn ingest_run(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    peers: u64,
    seconds: u64,
) -> Result<Ingest> {
    let agent = Agent::start(tools, net, dir, peers, &[])?;
    let mut steps = Vec::new();
    for target in [50_000.0, 100_000.0, 200_000.0, 300_000.0, 400_000.0, 1e9] {
        let before = agent.stats()?["kernel"]["heartbeats"].as_u64().unwrap_or(0);
        let sent = finish_json(loadgen(
            tools,
            net,
            peers,
            target / peers as f64,
            seconds as f64,
            None,
        )?)?;
        std::thread::sleep(Duration::from_millis(200));
        let after = agent.stats()?["kernel"]["heartbeats"].as_u64().unwrap_or(0);
        steps.push((
            target,
            sent["achieved_pps"].as_f64().unwrap_or(0.0),
            sent["sent"].as_u64().unwrap_or(0),
            after - before,
        ));
    }
    agent.process.stop();
    Ok(Ingest { peers, steps })
}

struct Paths {
    pps: f64,
    xdp: (u64, u64, f64, f64),
    socket: (u64, u64, f64, f64),
}

/// The same stream into (a) the XDP path and the agent, (b) a userspace UDP receiver feeding
/// the same statistics. Receive-side CPU: for XDP the program's own run time (bpf_stats) plus
/// the agent's CPU; for the socket path the receiver process's CPU (its syscalls, copies,
/// parsing, statistics). The kernel's softirq work before either is charged to the sender here
/// (no IRQ time accounting) and is left out of both; the socket path's is the larger of the two,
/// so the ratio is conservative. Machine-wide busy time is reported beside it.
fn path_comparison(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    peers: u64,
    seconds: u64,
) -> Result<Paths> {
    let pps = 200_000.0_f64.min(peers as f64 * 10.0);
    let rate = pps / peers as f64;

    let agent = Agent::start(tools, net, dir, peers, &[])?;
    let before = agent.stats()?;
    let pid = agent.process.pid();
    let (cpu0, busy0) = (process_cpu_s(pid)?, system_busy_s()?);
    let sent = finish_json(loadgen(tools, net, peers, rate, seconds as f64, None)?)?;
    std::thread::sleep(Duration::from_millis(200));
    let (cpu1, busy1) = (process_cpu_s(pid)?, system_busy_s()?);
    let after = agent.stats()?;
    agent.process.stop();
    let runtime_s = (after["xdp"]["run_time_ns"].as_f64().unwrap_or(0.0)
        - before["xdp"]["run_time_ns"].as_f64().unwrap_or(0.0))
        / 1e9;
    let xdp_recorded = after["kernel"]["heartbeats"].as_u64().unwrap_or(0)
        - before["kernel"]["heartbeats"].as_u64().unwrap_or(0);
    let xdp = (
        sent["sent"].as_u64().unwrap_or(0),
        xdp_recorded,
        runtime_s + (cpu1 - cpu0),
        busy1 - busy0,
    );

    let busy0 = system_busy_s()?;
    let receiver = Process::spawn(
        NetPair::in_ns(net.ns_monitor, &tools.probe)
            .args([
                "receiver",
                "--bind",
                &net.target(),
                "--duration-s",
                &seconds.to_string(),
            ])
            .stdout(Stdio::piped()),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let sent = finish_json(loadgen(tools, net, peers, rate, seconds as f64, None)?)?;
    let received = finish_json(receiver)?;
    let busy1 = system_busy_s()?;
    let socket = (
        sent["sent"].as_u64().unwrap_or(0),
        received["received"].as_u64().unwrap_or(0),
        received["cpu_s"].as_f64().unwrap_or(f64::NAN),
        busy1 - busy0,
    );
    Ok(Paths { pps, xdp, socket })
}

/// One receiver of the floor comparison: what it cost per packet.
struct Receiver {
    sent: u64,
    /// Kernel ns per packet from bpf_stats (XDP programs only).
    kernel_ns: Option<f64>,
    /// Busy CPU seconds of the whole machine per million packets sent (sender included, the
    /// same for every receiver).
    machine_s_per_m: f64,
}

struct FloorRow {
    peers: u64,
    pps: f64,
    floor: Receiver,
    /// The floor that also reads the clock for each packet it drops.
    floor_clock: Receiver,
    monitor: Receiver,
    /// The monitor at TC ingress (`--hook tc`), kernel ns from its TC program's run stats.
    monitor_tc: Receiver,
    /// The monitor without the destination check (`--listen-addr any`): what the check costs
    /// is the difference to `monitor`, which checks against the interface's addresses.
    monitor_any: Receiver,
    socket: Receiver,
    /// The probe's `limit` at this row's peers: one dependent miss over their state, and what
    /// a heartbeat touches of it.
    limit: Value,
}

impl FloorRow {
    /// One dependent miss over this row's peers' state, ns.
    fn miss_ns(&self) -> Option<f64> {
        self.limit["ns_per_miss"].as_f64()
    }

    /// The physical limit of a heartbeat at this row: the floor + clock's kernel ns in the
    /// same stream, plus one dependent miss.
    fn limit_ns(&self) -> Option<f64> {
        Some(self.floor_clock.kernel_ns? + self.miss_ns()?)
    }
}

/// The floor program's TEST_RUN and live rows beside the monitor's, rendered: 1,000 peers
/// twice (at the hot-cache rate and at the scale runs' 10 Hz) and 50,000 peers, those
/// of them that are among `scales`.
fn floor_table(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    scales: &[u64],
    seconds: u64,
    monitor_test_run_ns: f64,
    interrupt: &Interrupt,
) -> Result<String> {
    println!("==> the floor program, the monitor and the socket path, same stream");
    let test_run_ns = |args: &[&str]| -> Result<f64> {
        Ok(probe_json(&tools.probe, args)?["ns_per_packet"]
            .as_f64()
            .unwrap_or(f64::NAN))
    };
    let floor_test_run_ns = test_run_ns(&["floor-test-run"])?;
    let floor_clock_test_run_ns = test_run_ns(&["floor-test-run", "--clock"])?;
    let mut rows = Vec::new();
    for (peers, rate_hz) in [(1000u64, HOT_RATE_HZ), (1000, RATE_HZ), (50_000, RATE_HZ)] {
        if scales.contains(&peers) {
            interrupt.check()?;
            rows.push(floor_comparison(tools, net, dir, peers, rate_hz, seconds)?);
        }
    }
    Ok(render_floor(
        [
            floor_test_run_ns,
            floor_clock_test_run_ns,
            monitor_test_run_ns,
        ],
        &rows,
    ))
}

fn join(scales: &[u64]) -> String {
    scales
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The same stream (`peers` x 10 Hz for `seconds`) into the floor program (alone and with a
/// clock read per packet), the monitor (at XDP,
/// at TC ingress with `--hook tc`, and at XDP without the destination check) and the userspace
/// socket path, one after another in this
/// run: the monitor's cost as a multiple of the least any XDP program pays, and of what the
/// socket path pays.
fn floor_comparison(
    tools: &Tools,
    net: &NetPair,
    dir: &Path,
    peers: u64,
    rate_hz: f64,
    seconds: u64,
) -> Result<FloorRow> {
    let pps = peers as f64 * rate_hz;
    let per_m = |busy: f64, sent: u64| busy / sent.max(1) as f64 * 1e6;

    // The floor, attached by the probe for the stream's length and a little more.
    let floor_with = |clock: bool| -> Result<Receiver> {
        let mut probe = Process::spawn(
            NetPair::in_ns(net.ns_monitor, &tools.probe)
                .args(["floor", "--iface", net.if_monitor, "--duration-s"])
                .arg((seconds as f64 + 1.5).to_string())
                .args(clock.then_some("--clock"))
                .stdout(Stdio::piped()),
        )?;
        let line = probe.read_line()?;
        if !line.contains("attached") {
            bail!("floor probe: {line}");
        }
        let busy0 = system_busy_s()?;
        let sent = finish_json(loadgen(tools, net, peers, rate_hz, seconds as f64, None)?)?;
        let busy1 = system_busy_s()?;
        let stats = finish_json(probe)?;
        let sent_n = sent["sent"].as_u64().unwrap_or(0);
        let runs = stats["run_count"].as_f64().unwrap_or(0.0);
        Ok(Receiver {
            sent: sent_n,
            kernel_ns: (runs > 0.0).then(|| stats["run_time_ns"].as_f64().unwrap_or(0.0) / runs),
            machine_s_per_m: per_m(busy1 - busy0, sent_n),
        })
    };
    let floor = floor_with(false)?;
    let floor_clock = floor_with(true)?;

    // The agent's `xdp` stats are the attached program's: the TC classifier with --hook tc.
    let monitor_with = |extra: &[&str]| -> Result<Receiver> {
        let agent = Agent::start(tools, net, dir, peers, extra)?;
        let before = agent.stats()?;
        let busy0 = system_busy_s()?;
        let sent = finish_json(loadgen(tools, net, peers, rate_hz, seconds as f64, None)?)?;
        std::thread::sleep(Duration::from_millis(200));
        let busy1 = system_busy_s()?;
        let after = agent.stats()?;
        agent.process.stop();
        let d = |k: &str| {
            after["xdp"][k].as_f64().unwrap_or(0.0) - before["xdp"][k].as_f64().unwrap_or(0.0)
        };
        let sent_n = sent["sent"].as_u64().unwrap_or(0);
        Ok(Receiver {
            sent: sent_n,
            kernel_ns: (d("run_count") > 0.0).then(|| d("run_time_ns") / d("run_count")),
            machine_s_per_m: per_m(busy1 - busy0, sent_n),
        })
    };
    let monitor = monitor_with(&[])?;
    let monitor_tc = monitor_with(&["--hook", "tc"])?;
    let monitor_any = monitor_with(&["--listen-addr", "any"])?;

    let receiver = Process::spawn(
        NetPair::in_ns(net.ns_monitor, &tools.probe)
            .args(["receiver", "--bind", &net.target(), "--duration-s"])
            .arg((seconds + 1).to_string())
            .stdout(Stdio::piped()),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let busy0 = system_busy_s()?;
    let sent = finish_json(loadgen(tools, net, peers, rate_hz, seconds as f64, None)?)?;
    let busy1 = system_busy_s()?;
    let _ = finish_json(receiver)?;
    let sent_n = sent["sent"].as_u64().unwrap_or(0);
    let socket = Receiver {
        sent: sent_n,
        kernel_ns: None,
        machine_s_per_m: per_m(busy1 - busy0, sent_n),
    };
    let limit = probe_json(&tools.probe, &["limit", "--peers", &peers.to_string()])?;
    Ok(FloorRow {
        peers,
        pps,
        floor,
        floor_clock,
        monitor,
        monitor_tc,
        monitor_any,
        socket,
        limit,
    })
}

/// `test_run_ns`: the floor's, the floor's with the clock, and the monitor's.
fn render_floor(test_run_ns: [f64; 3], rows: &[FloorRow]) -> String {
    let [floor, clock, monitor] = test_run_ns;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Against the floor (a parse-to-UDP-port-and-drop XDP program) and the floor + clock (the \
         same, reading the clock for each packet it drops, as the monitor does for each \
         heartbeat), same stream, same run:\n\n\
         BPF_PROG_TEST_RUN, one IPv4 heartbeat: floor {floor:.0} ns, floor + clock {clock:.0} ns \
         ({:.1}x), monitor {monitor:.0} ns ({:.1}x the floor, {:.1}x the floor + clock)\n",
        clock / floor,
        monitor / floor,
        monitor / clock,
    );
    let _ = writeln!(
        t,
        "The limit: floor + clock, plus one dependent miss over a table the size of the peers' \
         kernel state (a pointer chase in userspace over 4 KiB pages, `hbm-bench limit`), in the \
         same run; \"x limit\" is each receiver against it.\n"
    );
    let _ = writeln!(
        t,
        "| peers | pps | receiver | sent | kernel ns/pkt (bpf_stats) | x floor | x floor + clock | x limit | machine CPU-s per 1M pkts | x floor |"
    );
    let _ = writeln!(t, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        if let (Some(limit), Some(miss)) = (r.limit_ns(), r.miss_ns()) {
            let mib = r.limit["table_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
            let _ = writeln!(
                t,
                "| {} | {:.0} | limit (floor + clock + one miss, {miss:.0} ns over {mib:.1} MiB) | - | {limit:.0} | {} | {} | 1.0x | - | - |",
                r.peers,
                r.pps,
                r.floor
                    .kernel_ns
                    .map_or("-".into(), |f| format!("{:.1}x", limit / f)),
                r.floor_clock
                    .kernel_ns
                    .map_or("-".into(), |c| format!("{:.1}x", limit / c)),
            );
        }
        for (name, x) in [
            ("floor", &r.floor),
            ("floor + clock", &r.floor_clock),
            ("monitor", &r.monitor),
            ("monitor --hook tc", &r.monitor_tc),
            ("monitor --listen-addr any", &r.monitor_any),
            ("socket path", &r.socket),
        ] {
            let ns = x.kernel_ns.map_or("-".into(), |v| format!("{v:.0}"));
            let ns_ratio = |to: &Receiver| match (x.kernel_ns, to.kernel_ns) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                _ => "-".into(),
            };
            let limit_ratio = match (x.kernel_ns, r.limit_ns()) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                _ => "-".into(),
            };
            let _ = writeln!(
                t,
                "| {} | {:.0} | {name} | {} | {ns} | {} | {} | {limit_ratio} | {:.3} | {:.2}x |",
                r.peers,
                r.pps,
                x.sent,
                ns_ratio(&r.floor),
                ns_ratio(&r.floor_clock),
                x.machine_s_per_m,
                x.machine_s_per_m / r.floor.machine_s_per_m,
            );
        }
    }
    if let Some(touched) = rows.first().map(|r| &r.limit["touched"]) {
        let n = |k: &str| touched[k].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "\nPer-peer state one accepted, in-order heartbeat touches: {} lines read ({} bytes: \
             the index bucket and the slot's hot line), {} lines written ({} bytes; {} of them \
             stored into without being read: the source address, the ring entry, the last-heard \
             word); the hot state is {} bytes a peer ({:.1} MiB at 50,000 peers).",
            n("lines_read"),
            n("bytes_read"),
            n("lines_written"),
            n("bytes_written"),
            n("lines_stored_only"),
            n("hot_bytes_per_peer"),
            n("hot_bytes_per_peer") as f64 * 50_000.0 / (1 << 20) as f64,
        );
    }
    t.push('\n');
    t
}

/// The fleet's measurement (an ignored test: real nats-server and agents), run in release
/// against the agent built here; its figures are the line it prints.
fn fleet_figures(tools: &Tools) -> Result<Value> {
    let out = workspace::output(
        workspace::cargo()
            .args([
                "test",
                "--release",
                "-p",
                "integration-tests",
                "--test",
                "fleet",
            ])
            .args(["--", "--ignored", "--nocapture", "--exact", "fleet_figures"])
            .env("MONITOR_BIN", &tools.monitor),
    )?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("FLEET-FIGURES "))
        .context("the fleet measurement printed no FLEET-FIGURES line")?;
    Ok(serde_json::from_str(line)?)
}

fn f(v: &Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// The scale runs' table: what was sent and recorded, the agent's cost, sweeps, queries, events.
fn render_scales(rows: &[ScaleRow]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| peers | requested pps | sent pps | sent | recorded | lost | kernel ns/pkt (bpf_stats) | agent CPU % | agent RssAnon MiB | maps MiB | sweep mmap ms | sweep aya iter ms | iter/mmap | agent sweep ms | peer p50/p99 us | suspects p50/p99 us (n) | suspects in the agent p50/p99 us | event p50/p99 ms (n) |"
    );
    let _ = writeln!(
        t,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        // Bucket bounds of the agent's histogram: the quantile is at most this.
        let agent_suspects = match &r.socket["agent_suspects_us"] {
            Value::Null => "-".to_string(),
            q => format!(
                "<= {} / <= {}",
                f(q, &["p50_at_most"]),
                f(q, &["p99_at_most"])
            ),
        };
        let _ = writeln!(
            t,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.3} | {:.1} | {:.0}x | {:.3} | {:.0} / {:.0} | {:.0} / {:.0} ({}) | {agent_suspects} | {:.2} / {:.2} ({}) |",
            r.peers,
            r.requested_pps,
            r.achieved_pps,
            r.sent,
            r.recorded,
            r.sent as i64 - r.recorded as i64,
            r.kernel_ns,
            r.agent_cpu_pct,
            r.rss_mib,
            r.maps_mib,
            f(&r.sweep, &["mmap_read_ms"]),
            f(&r.sweep, &["aya_iter_ms"]),
            f(&r.sweep, &["iter_over_mmap"]),
            f(&r.sweep, &["agent_sweep_ms"]),
            f(&r.socket, &["peer_us", "p50"]),
            f(&r.socket, &["peer_us", "p99"]),
            f(&r.socket, &["suspects_us", "p50"]),
            f(&r.socket, &["suspects_us", "p99"]),
            r.socket["suspects_us"]["count"],
            f(&r.events, &["latency_ms", "p50"]),
            f(&r.events, &["latency_ms", "p99"]),
            r.events["latency_ms"]["count"],
        );
    }
    // Where the event latency goes: raised by the sweep (`at` less `crossed_at`, ms
    // resolution) or on its way to the subscriber (received less `at`).
    let _ = writeln!(
        t,
        "\nEvent latency split: detection (the event's `at` less its `crossed_at`: the sweep) and delivery (received less `at`: the socket and the subscriber), ms:\n\n\
         | peers | detection p50/p99 | delivery p50/p99 | suspect events received, all peers (timed: the killed ones') |\n|---:|---:|---:|---:|"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {:.1} / {:.1} | {:.1} / {:.1} | {} ({}) |",
            r.peers,
            f(&r.events, &["detection_ms", "p50"]),
            f(&r.events, &["detection_ms", "p99"]),
            f(&r.events, &["delivery_ms", "p50"]),
            f(&r.events, &["delivery_ms", "p99"]),
            r.events["events"]["suspect"],
            r.events["latency_ms"]["count"],
        );
    }
    t
}

fn render(test_run_ns: f64, rows: &[ScaleRow], ingest: &Ingest, paths: &Paths) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Kernel cost, BPF_PROG_TEST_RUN (1e6 runs of one IPv4 heartbeat): {test_run_ns:.0} ns per packet\n"
    );
    t.push_str(&render_scales(rows));
    let _ = writeln!(
        t,
        "\nIngest at {} peers (3 s per step; lost = sent - recorded by the kernel):\n",
        ingest.peers
    );
    let _ = writeln!(t, "| target pps | sent pps | sent | recorded | lost |");
    let _ = writeln!(t, "|---:|---:|---:|---:|---:|");
    for (target, achieved, sent, recorded) in &ingest.steps {
        let target = if *target >= 1e9 {
            "generator max".to_string()
        } else {
            format!("{target:.0}")
        };
        let _ = writeln!(
            t,
            "| {target} | {achieved:.0} | {sent} | {recorded} | {} |",
            *sent as i64 - *recorded as i64
        );
    }
    let per_m = |cpu: f64, n: u64| cpu / n.max(1) as f64 * 1e6;
    let (xs, xr, xcpu, xbusy) = paths.xdp;
    let (ss, sr, scpu, sbusy) = paths.socket;
    let _ = writeln!(
        t,
        "\nThe same stream ({:.0} pps) into each receive path:\n",
        paths.pps
    );
    let _ = writeln!(
        t,
        "| path | sent | received | receive-side CPU s per 1M | machine busy CPU s per 1M |"
    );
    let _ = writeln!(t, "|---|---:|---:|---:|---:|");
    let _ = writeln!(
        t,
        "| XDP + agent | {xs} | {xr} | {:.3} | {:.3} |",
        per_m(xcpu, xr),
        per_m(xbusy, xs)
    );
    let _ = writeln!(
        t,
        "| UDP socket + same statistics | {ss} | {sr} | {:.3} | {:.3} |",
        per_m(scpu, sr),
        per_m(sbusy, ss)
    );
    let _ = writeln!(
        t,
        "\nReceive-side CPU per heartbeat, socket path over XDP path: {:.1}x",
        per_m(scpu, sr) / per_m(xcpu, xr)
    );
    t
}

/// Appends a dated section with `table` and the command that made it to the benchmark history
/// (docs/benchmarks-history.md; BENCHMARKS.md keeps the current figures).
pub(crate) fn record(table: &str, command: &str) -> Result<()> {
    let path = workspace::root().join("docs/benchmarks-history.md");
    let kernel = workspace::output(Command::new("uname").arg("-r"))?;
    let date = workspace::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    let entry = format!(
        "\n## {} (kernel {}), `{command}`\n\n{table}",
        date.trim(),
        kernel.trim()
    );
    let mut text =
        std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmark history\n".into());
    text.push_str(&entry);
    std::fs::write(&path, text)?;
    println!("appended to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_fit_recovers_a_linear_cost() {
        let cost = |peers: u64, pps: f64| AgentCost {
            peers,
            rate_hz: pps / peers as f64,
            achieved_pps: pps,
            agent_cpu_pct: 0.1 + 2e-6 * peers as f64 + 3e-7 * pps,
            refreshes_per_s: 0.0,
            refloors_per_s: 0.0,
            events_per_s: 0.0,
        };
        let rows = [
            cost(50_000, 50_000.0),
            cost(50_000, 250_000.0),
            cost(25_000, 250_000.0),
        ];
        let fit = AgentCostModel::solve([&rows[0], &rows[1], &rows[2]]).unwrap();
        assert!((fit.fixed - 0.1).abs() < 1e-9, "{}", fit.fixed);
        assert!((fit.at(50_000.0, 500_000.0) - (0.1 + 0.1 + 0.15)).abs() < 1e-9);
        // Two rows alike pin nothing down.
        assert!(AgentCostModel::solve([&rows[0], &rows[0], &rows[2]]).is_none());
    }
}
