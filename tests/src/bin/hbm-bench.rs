//! Benchmark probes for `cargo xtask bench`: each subcommand measures one thing and prints one
//! JSON object. Needs root (loads the XDP program) for `kernel` and `sweep`.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use integration_tests::bench;

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
    /// One full pass over N peers: mmap vs aya's map iterator, and the agent's sweep.
    Sweep {
        #[arg(long)]
        peers: u32,
    },
    /// `peer` and `suspects` round trips against a running agent.
    Socket {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        peers: u64,
        #[arg(long, default_value_t = 2000)]
        requests: usize,
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
    },
    /// A userspace UDP receiver feeding the same statistics, for comparison with XDP.
    Receiver {
        #[arg(long, default_value = "0.0.0.0:7946")]
        bind: String,
        #[arg(long, default_value_t = 10)]
        duration_s: u64,
    },
}

fn main() {
    let out = match Cli::parse().probe {
        Probe::Kernel { repeat } => {
            serde_json::json!({ "ns_per_packet": bench::prog_test_run_ns(repeat) })
        }
        Probe::Sweep { peers } => serde_json::to_value(bench::sweep_timings(peers)).unwrap(),
        Probe::Socket {
            socket,
            peers,
            requests,
        } => serde_json::to_value(bench::socket_latency(&socket, peers, requests)).unwrap(),
        Probe::Events {
            socket,
            expected,
            first_id,
            last_id,
            timeout_s,
        } => {
            let probe = bench::EventProbe::subscribe(&socket);
            // Tell the caller we are subscribed before any kill happens.
            println!("{{\"subscribed\":true}}");
            let (latency, kinds) =
                probe.collect(expected, first_id..last_id, Duration::from_secs(timeout_s));
            serde_json::json!({ "latency_ms": latency, "events": kinds })
        }
        Probe::Receiver { bind, duration_s } => serde_json::to_value(bench::udp_receiver(
            &bind,
            Duration::from_secs(duration_s),
            Duration::from_secs(2),
        ))
        .unwrap(),
    };
    println!("{out}");
}
