//! `cargo xtask bench` step by step: which measurements a run makes, in which order, and the
//! table it prints and records.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::Value;

use super::{
    BenchArgs, NET, Rig, Tools, Variant,
    agent_cost::{agent_cost, idle_cost, render_agent_cost, render_idle_cost},
    bpf_stats::BpfStats,
    fleet::{fleet_figures, render_fleet},
    floor::floor_table,
    ingest::{Ingest, ingest_run, render_ingest},
    kernel_loadgen,
    lock::BenchLock,
    paths::{Paths, path_comparison, render_paths},
    record::{compared, join, record},
    scale::{ScaleRow, render_scales, scale_rate_hz, scale_run},
    tools::probe_json,
};
use crate::{
    lab::{Interrupt, TempDir},
    setup, workspace,
};

pub fn run(args: &BenchArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("bench")?;
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
    let variants = Variant::all(&args.compare)?;
    let rig = Rig {
        tools: &tools,
        net: &net,
        dir: &dir.0,
        interrupt: &interrupt,
        variants: &variants,
    };

    if args.kernel_loadgen {
        let table = kernel_loadgen::run(&rig, seconds)?;
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
        let table = floor_table(&rig, &scales, seconds, test_run_ns)?;
        println!("\n{table}");
        if !args.no_record {
            record(
                &table,
                &format!(
                    "cargo xtask bench --floor-only --scales {} --seconds {seconds}{}",
                    join(&scales),
                    compared(&args.compare)
                ),
            )?;
        }
        return Ok(());
    }
    println!("==> kernel logging off and on (--kernel-log), BPF_PROG_TEST_RUN");
    let log_cost = probe_json(&tools.probe, &["kernel-log"])?;

    if args.agent_only {
        let peers = largest_up_to_50k(&scales);
        let idle = idle_cost(&rig, peers, seconds.max(10))?;
        let cost = agent_cost(&rig, peers, seconds.max(10), args.quick)?;
        println!(
            "{}{}",
            render_idle_cost(&idle),
            render_agent_cost(peers, &cost)
        );
        return Ok(());
    }

    let mut rows = Vec::new();
    for &peers in &scales {
        interrupt.check()?;
        let rate_hz = scale_rate_hz(peers, args.rate_hz, args.pack);
        for variant in rig.variants {
            println!(
                "==> {peers} peers x {rate_hz} Hz for {seconds} s{}",
                variant.tag()
            );
            rows.push(scale_run(
                &rig,
                variant,
                peers,
                rate_hz,
                seconds,
                args.pack,
                args.realtime_generator,
            )?);
        }
    }
    if args.scales_only {
        let table = render_scales(&rows);
        println!("\n{table}");
        if !args.no_record {
            record(
                &table,
                &format!(
                    "cargo xtask bench --scales-only --scales {} --rate-hz {} --seconds {seconds}{}{}{}",
                    join(&scales),
                    args.rate_hz,
                    if args.pack > 1 {
                        format!(" --pack {}", args.pack)
                    } else {
                        String::new()
                    },
                    if args.realtime_generator {
                        " --realtime-generator"
                    } else {
                        ""
                    },
                    compared(&args.compare)
                ),
            )?;
        }
        return Ok(());
    }

    // Issue 23's 10 ms heartbeats: level 8 within 30 ms of the last heartbeat at 10,000
    // peers, with none of the live ones convicted; 5,000 beside it (half the packets).
    if !args.quick {
        let fast = Variant::this_build().with_label_and_flags(FAST_LABEL, &["--min-std-ms", "2"]);
        for peers in FAST_PEERS {
            interrupt.check()?;
            println!(
                "==> 10 ms heartbeats: {peers} peers x {FAST_RATE_HZ} Hz for {FAST_SECONDS} s"
            );
            rows.push(scale_run(
                &rig,
                &fast,
                peers,
                FAST_RATE_HZ,
                FAST_SECONDS,
                1,
                args.realtime_generator,
            )?);
        }
        // The same targets past what one core sends a heartbeat a packet: the 10 ms
        // heartbeats at 10,000 peers and 200,000 x 10 Hz, packed (`monitor loadgen --pack`),
        // from a generator at a real-time priority, which sleeps between its sends: on this
        // machine's two cores the agent and the receive path otherwise make it late, and a
        // heartbeat an interval late is a real silence (docs/tuning.md, "Past one core: packed
        // datagrams"). The agent's load is the same heartbeats'; the kernel's is its batch
        // path, so these rows' kernel ns are per heartbeat.
        for (variant, peers, rate_hz) in [
            (&fast, PACKED_FAST_PEERS, FAST_RATE_HZ),
            (&Variant::this_build(), PACKED_PEERS, PACKED_RATE_HZ),
        ] {
            interrupt.check()?;
            println!(
                "==> packed {PACK} a datagram: {peers} peers x {rate_hz} Hz for {FAST_SECONDS} s{}",
                variant.tag()
            );
            rows.push(scale_run(
                &rig,
                variant,
                peers,
                rate_hz,
                FAST_SECONDS,
                PACK,
                true,
            )?);
        }
    }

    let ingest_peers = largest_up_to_50k(&scales);
    println!("==> ingest ceiling at {ingest_peers} peers");
    let ingest = ingest_run(&rig, ingest_peers, if args.quick { 2 } else { 3 })?;

    println!("==> the agent's cost at 1, 5 and 10 Hz a peer, {ingest_peers} peers");
    let agent_cost = agent_cost(
        &rig,
        ingest_peers,
        if args.quick { 5 } else { 20 },
        args.quick,
    )?;

    println!("==> the agent idle, with no peers and with {ingest_peers}");
    let idle = idle_cost(&rig, ingest_peers, if args.quick { 5 } else { 10 })?;

    let floor_table = floor_table(&rig, &scales, if args.quick { 3 } else { 10 }, test_run_ns)?;

    println!("==> XDP path against a userspace UDP receiver, same stream");
    let paths = path_comparison(&rig, ingest_peers, if args.quick { 3 } else { 10 })?;

    let mut table = floor_table;
    table.push_str(&render_idle_cost(&idle));
    table.push_str(&render_agent_cost(ingest_peers, &agent_cost));
    table.push_str(&render(test_run_ns, &rows, &ingest, &paths));
    if !args.no_fleet {
        println!("==> the fleet on NATS JetStream: event latency and a 50,000-peer burst");
        table.push_str(&render_fleet(&fleet_figures(&tools)?));
    }
    table.push_str(&render_kernel_log(&log_cost));
    println!("\n{table}");
    if !args.no_record {
        // The command as run, so that a reader can run it again.
        let command = if args.quick {
            "cargo xtask bench --quick".to_string()
        } else {
            format!(
                "cargo xtask bench --scales {} --seconds {seconds}{}{}",
                join(&scales),
                if args.rate_hz == super::RATE_HZ {
                    String::new()
                } else {
                    format!(" --rate-hz {}", args.rate_hz)
                },
                compared(&args.compare)
            )
        };
        record(&table, &command)?;
    }
    Ok(())
}

/// The 10 ms heartbeat rows of a full run: the peer counts, their rate, how long each, and
/// the label of their agent, told the deviation such a stream has (`--min-std-ms 2`; the scale
/// run tells every agent the stream's interval).
const FAST_PEERS: [u64; 2] = [5_000, 10_000];
const FAST_RATE_HZ: f64 = 100.0;
const FAST_SECONDS: u64 = 10;
const FAST_LABEL: &str = "10ms";
/// The packed rows (`monitor loadgen --pack`): heartbeats a datagram, and the streams.
const PACK: usize = 32;
const PACKED_FAST_PEERS: u64 = 10_000;
const PACKED_PEERS: u64 = 200_000;
const PACKED_RATE_HZ: f64 = 10.0;

/// The largest of `scales` up to 50,000 peers (1,000 if none is): the agent-cost and ingest
/// runs' count, where the generator still sends on schedule.
fn largest_up_to_50k(scales: &[u64]) -> u64 {
    scales
        .iter()
        .copied()
        .filter(|&p| p <= 50_000)
        .max()
        .unwrap_or(1000)
}

/// The full run's tables after the floor's and the agent's: TEST_RUN, the scale runs, the
/// ingest ceiling and the receive paths.
fn render(test_run_ns: f64, rows: &[ScaleRow], ingest: &Ingest, paths: &Paths) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Kernel cost, BPF_PROG_TEST_RUN (1e6 runs of one IPv4 heartbeat): {test_run_ns:.0} ns per packet\n"
    );
    t.push_str(&render_scales(rows));
    t.push_str(&render_ingest(ingest));
    t.push_str(&render_paths(paths));
    t
}

/// What `--kernel-log` costs, from the probe's `kernel-log`.
fn render_kernel_log(log_cost: &Value) -> String {
    let ns = |k: &str| log_cost[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "\nKernel logging (`--kernel-log`), BPF_PROG_TEST_RUN, ns per packet: valid heartbeat \
         {:.0} off / {:.0} debug (it logs nothing); malformed heartbeat {:.0} off / {:.0} debug \
         (one warn line)\n",
        ns("heartbeat_off_ns"),
        ns("heartbeat_debug_ns"),
        ns("malformed_off_ns"),
        ns("malformed_debug_ns"),
    )
}
