//! `hbm-bench`, the probes `cargo xtask bench` runs: each subcommand measures one thing and
//! prints one JSON object. Needs root (loads the XDP program) for `kernel` and `sweep`.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::bench;

#[derive(Parser)]
#[command(name = "hbm-bench", about = "Measurement probes for cargo xtask bench")]
struct Cli {
    #[command(subcommand)]
    probe: Probe,
}

#[derive(Subcommand)]
enum Probe {
    /// Mean cost of one heartbeat through BPF_PROG_TEST_RUN, ns.
    Kernel {
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
    },
    /// The floor program's cost per heartbeat through BPF_PROG_TEST_RUN, ns.
    FloorTestRun {
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// The floor that also reads the clock for every packet it drops.
        #[arg(long)]
        clock: bool,
        /// Per-peer state it touches for each heartbeat, as the monitor's lines.
        #[arg(long, value_enum, default_value_t = bench::Touch::None)]
        touch: bench::Touch,
    },
    /// Attach the floor program to IFACE for a while; prints `{"attached":true}`, then its run
    /// statistics (kernel.bpf_stats_enabled must be 1).
    Floor {
        #[arg(long)]
        iface: String,
        #[arg(long, default_value_t = monitor_common::wire::DEFAULT_PORT)]
        port: u16,
        #[arg(long)]
        duration_s: f64,
        /// The floor that also reads the clock for every packet it drops.
        #[arg(long)]
        clock: bool,
        /// Per-peer state it touches for each heartbeat (the clock is then read too).
        #[arg(long, value_enum, default_value_t = bench::Touch::None)]
        touch: bench::Touch,
        /// Peers whose state it holds (ids 1 to this), with --touch.
        #[arg(long, default_value_t = 0)]
        peers: u32,
    },
    /// What kernel logging costs (TEST_RUN): hot and cold path, logging off and at debug.
    KernelLog {
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
    },
    /// One full pass over N peers: mmap vs aya's map iterator, and the agent's sweep.
    Sweep {
        #[arg(long)]
        peers: u32,
    },
    /// The floor of a scan of the running agent's last-heard words: every interval, each
    /// peer's word loaded and compared, a changed one's deadline stored; this process's CPU.
    ScanFloor {
        /// The words' map: the agent's, or the floor program's (`FLOOR_LAST_HEARD`).
        #[arg(long, default_value = monitor_common::last_heard::LAST_HEARD_MAP)]
        map: String,
        #[arg(long)]
        peers: u32,
        #[arg(long, default_value_t = 50.0)]
        interval_ms: f64,
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// The agent's half of a kernel that marks when to look: every interval, the floor
    /// program's due buckets (`--touch split-due`) scanned for the peers due before the next
    /// scan; this process's CPU.
    DueScanFloor {
        #[arg(long)]
        peers: u32,
        #[arg(long, default_value_t = 20.0)]
        interval_ms: f64,
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// `peer` and `suspects` round trips against a running agent.
    Socket {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        peers: u64,
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        /// The agent's metrics address, to read its own timing of the requests from.
        #[arg(long, requires = "metrics_ns")]
        metrics_addr: Option<String>,
        /// The network namespace the metrics address is in.
        #[arg(long, requires = "metrics_addr")]
        metrics_ns: Option<String>,
    },
    /// Subscribe and measure, for each suspect event, crossing-to-delivery latency, ms.
    Events {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        expected: usize,
        /// Time only events about ids FIRST..LAST (exclusive), e.g. the killed peers.
        #[arg(long, default_value_t = 0)]
        first_id: u64,
        #[arg(long, default_value_t = u64::MAX)]
        last_id: u64,
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
        /// Time only suspicions that crossed at or after this Unix time (ms): the kill, for a
        /// peer to be killed may be suspected before it, as at the start (convicted at every
        /// level if its first heartbeat came after the agent's first look).
        #[arg(long)]
        crossed_after_unix_ms: Option<f64>,
        /// Count the other peers' suspicions that crossed before this Unix time (ms) apart
        /// (`start@LEVEL`, not `live@LEVEL`): peers listed before they first sent, convicted
        /// at the start, are not false suspicions of a steady stream.
        #[arg(long)]
        steady_after_unix_ms: Option<f64>,
    },
    /// A soak: loadgen with churn from namespace NS against a running agent, watched and
    /// checked (every silent period detected at phi 8, no steady peer suspected).
    Soak {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        monitor: PathBuf,
        #[arg(long)]
        ns: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        peers: u64,
        #[arg(long, default_value_t = 2.0)]
        rate: f64,
        #[arg(long)]
        seconds: u64,
        #[arg(long, default_value_t = 0.01)]
        churn: f64,
        #[arg(long, default_value_t = 5)]
        period_s: u64,
    },
    /// One dependent memory miss over a table the size of N peers' kernel state (a pointer
    /// chase), ns, and what per-peer state one heartbeat touches: the limit's third term.
    Limit {
        #[arg(long)]
        peers: u64,
    },
    /// A userspace UDP receiver feeding the same statistics, for comparison with XDP.
    Receiver {
        #[arg(long, default_value = "0.0.0.0:18498")]
        bind: String,
        #[arg(long, default_value_t = 10)]
        duration_s: u64,
    },
}

/// `hbm-bench`'s main: runs the probe asked for and prints its JSON line; exits 1 when the
/// measurement says it failed (`"ok": false`).
pub fn main() {
    let out = match Cli::parse().probe {
        Probe::Kernel { repeat } => {
            serde_json::json!({ "ns_per_packet": bench::prog_test_run_ns(repeat) })
        }
        Probe::FloorTestRun {
            repeat,
            clock,
            touch,
        } => {
            serde_json::json!({ "ns_per_packet": bench::floor_test_run_ns(repeat, clock, touch) })
        }
        Probe::Floor {
            iface,
            port,
            duration_s,
            clock,
            touch,
            peers,
        } => {
            let stats = bench::floor_attached(
                &iface,
                port,
                (clock, touch, peers),
                Duration::from_secs_f64(duration_s),
                || {
                    println!("{{\"attached\":true}}");
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                },
            );
            serde_json::json!({ "run_count": stats.run_count, "run_time_ns": stats.run_time_ns })
        }
        Probe::KernelLog { repeat } => {
            serde_json::to_value(bench::kernel_log_cost(repeat)).unwrap()
        }
        Probe::Sweep { peers } => serde_json::to_value(bench::sweep_timings(peers)).unwrap(),
        Probe::ScanFloor {
            map,
            peers,
            interval_ms,
            seconds,
        } => serde_json::to_value(bench::scan_floor(
            &map,
            peers,
            Duration::from_secs_f64(interval_ms / 1e3),
            Duration::from_secs_f64(seconds),
        ))
        .unwrap(),
        Probe::DueScanFloor {
            peers,
            interval_ms,
            seconds,
        } => serde_json::to_value(bench::due_scan_floor(
            peers,
            Duration::from_secs_f64(interval_ms / 1e3),
            Duration::from_secs_f64(seconds),
        ))
        .unwrap(),
        Probe::Socket {
            socket,
            peers,
            requests,
            metrics_addr,
            metrics_ns,
        } => {
            let metrics = metrics_ns.as_deref().zip(metrics_addr.as_deref());
            serde_json::to_value(bench::socket_latency(&socket, peers, requests, metrics)).unwrap()
        }
        Probe::Events {
            socket,
            expected,
            first_id,
            last_id,
            timeout_s,
            crossed_after_unix_ms,
            steady_after_unix_ms,
        } => {
            let probe = bench::EventProbe::subscribe(&socket);
            // Tell the caller we are subscribed before any kill happens.
            println!("{{\"subscribed\":true}}");
            let (latency, kinds) = probe.collect(
                expected,
                first_id..last_id,
                crossed_after_unix_ms.unwrap_or(f64::NEG_INFINITY),
                steady_after_unix_ms.unwrap_or(f64::NEG_INFINITY),
                Duration::from_secs(timeout_s),
            );
            serde_json::json!({
                "latency_ms": latency.total,
                "detection_ms": latency.detection,
                "delivery_ms": latency.delivery,
                "top_level": latency.top_level,
                "silence_at_top_ms": latency.silence_at_top,
                "events": kinds,
            })
        }
        Probe::Soak {
            socket,
            monitor,
            ns,
            to,
            peers,
            rate,
            seconds,
            churn,
            period_s,
        } => soak(
            &socket, &monitor, &ns, &to, peers, rate, seconds, churn, period_s,
        ),
        Probe::Limit { peers } => bench::limit::limit_report(peers),
        Probe::Receiver { bind, duration_s } => serde_json::to_value(bench::udp_receiver(
            &bind,
            Duration::from_secs(duration_s),
            Duration::from_secs(2),
        ))
        .unwrap(),
    };
    println!("{out}");
    if out["ok"] == serde_json::json!(false) {
        std::process::exit(1);
    }
}

#[allow(clippy::too_many_arguments)]
fn soak(
    socket: &std::path::Path,
    monitor: &std::path::Path,
    ns: &str,
    to: &str,
    peers: u64,
    rate: f64,
    seconds: u64,
    churn: f64,
    period_s: u64,
) -> serde_json::Value {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use crate::soak;
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, watcher) = soak::watch(socket, 8.0, stop.clone());
    let started = soak::unix_ms();
    let args: Vec<String> = vec![
        "--to".into(),
        to.into(),
        "--peers".into(),
        peers.to_string(),
        "--rate".into(),
        rate.to_string(),
        "--duration".into(),
        format!("{seconds}s"),
        "--churn".into(),
        churn.to_string(),
        "--churn-period".into(),
        format!("{period_s}s"),
        "--incarnation".into(),
        "1".into(),
    ];
    let report = soak::loadgen(monitor, ns, &args);
    let ended = soak::unix_ms();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let verdict = soak::verify(
        &report,
        &seen.lock().expect("seen"),
        started + 2.0 * period_s as f64 * 1000.0,
        ended - 1000.0,
    );
    let stats = monitor::serving::client::Client::connect(socket)
        .and_then(|mut c| c.request(&serde_json::json!({"op": "stats"})))
        .map(|v| v["stats"].clone())
        .unwrap_or(serde_json::Value::Null);
    let recorded = stats["kernel"]["heartbeats"].as_u64().unwrap_or(0);
    let ok = verdict.ok() && stats["peers"].as_u64() == Some(peers) && recorded == report.sent;
    serde_json::json!({ "ok": ok, "verdict": verdict, "sent": report.sent, "recorded": recorded,
        "achieved_pps": report.achieved_pps, "peers": stats["peers"], "stats": stats })
}
