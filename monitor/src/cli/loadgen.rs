use std::{
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use anyhow::Context;
use clap::Args;
use monitor::peer::loadgen::{self, LoadgenConfig};

use super::parse_duration;

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// Where the monitor listens: ADDR:PORT.
    #[arg(long)]
    to: String,
    /// Number of simulated peers.
    #[arg(long, default_value_t = 1000)]
    peers: u64,
    /// Id of the first peer; the others follow consecutively.
    #[arg(long, default_value_t = 1, value_parser = monitor::agent::peers_file::parse_peer_id)]
    first_id: u64,
    /// Send heartbeat i of each round to peer i x N mod --peers: consecutive heartbeats go to
    /// peers N apart (N coprime to --peers, e.g. a prime that does not divide it), as real
    /// senders' phases scatter them; 1 sends in id order, which a receiver's prefetchers can
    /// follow (the userspace generator only).
    #[arg(long, value_name = "N", default_value_t = 1)]
    stride: u64,
    /// Heartbeats per second per peer.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Each heartbeat is sent up to this much late, uniformly (under half the interval).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    jitter: Duration,
    /// How long to send.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Fraction of the peers (the lowest ids) that stop sending at --after.
    #[arg(long, default_value_t = 0.0)]
    kill: f64,
    /// Fraction of the peers (the highest ids) that churn: in each --churn-period one quarter
    /// of them is silent, then comes back.
    #[arg(long, default_value_t = 0.0)]
    churn: f64,
    /// Length of a churn period.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    churn_period: Duration,
    /// When the --kill fraction stops.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    after: Duration,
    /// Sender epoch of every simulated peer (default: seconds since the Unix epoch).
    #[arg(long)]
    incarnation: Option<u32>,
    /// Sign heartbeats with the 128-bit key in this file (32 hex digits, mode 0600).
    #[arg(long)]
    auth_key_file: Option<std::path::PathBuf>,
    /// Send from the kernel: an XDP program stamps and transmits the frames (BPF_PROG_RUN with
    /// live frames, Linux 5.18+), faster than the default sender (sendmmsg, 64 heartbeats a
    /// message through UDP GSO: about a million a second on one core here).
    /// IPv4 targets over Ethernet (a veth or NIC) only; needs root (CAP_BPF, CAP_NET_ADMIN)
    /// and, on a veth, an XDP program or GRO on the receiving end. Not with --jitter.
    #[arg(long)]
    kernel: bool,
    /// Send one heartbeat a message (plain sendmmsg) instead of 64 through UDP GSO: slower,
    /// but each heartbeat is a packet of its own all the way, as from real senders. A batch
    /// crosses a veth uncut where no XDP program is on it, so the TC hook meets it whole.
    #[arg(long, conflicts_with = "kernel")]
    no_gso: bool,
    /// Put this many heartbeats back to back in each datagram (up to 45, a 1,500-byte MTU's
    /// worth), sent by plain sendmmsg: the receiver records each (docs/wire-format.md), so one
    /// packet carries many and a stream can pass what one core sends a heartbeat a packet.
    /// The receiver's batch path, not its one-heartbeat-a-packet path: for load on the agent,
    /// not for the kernel's per-packet cost. 1: one heartbeat a datagram.
    #[arg(long, default_value_t = 1, value_name = "N", conflicts_with_all = ["kernel", "no_gso"])]
    pack: usize,
}

pub fn loadgen(args: LoadgenArgs) -> anyhow::Result<ExitCode> {
    let to = super::resolve_target(&args.to)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing a signal handler")?;
    }
    let config = LoadgenConfig {
        to,
        peers: args.peers,
        first_id: args.first_id,
        stride: args.stride,
        rate_hz: args.rate,
        jitter: args.jitter,
        duration: args.duration,
        kill_fraction: args.kill,
        kill_after: args.after,
        churn_fraction: args.churn,
        churn_period: args.churn_period,
        incarnation: args
            .incarnation
            .unwrap_or_else(monitor::peer::sender::unix_time_incarnation),
        key: args
            .auth_key_file
            .as_deref()
            .map(monitor::peer::auth_key::read_key_file)
            .transpose()?,
        kernel: args.kernel,
        gso: !args.no_gso,
        pack: args.pack,
    };
    let report = loadgen::run(&config, &stop)?;
    // One JSON line on stdout: what was sent, for whoever checks the other end.
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}
