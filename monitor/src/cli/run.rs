use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use monitor::{
    DEFAULT_SOCKET,
    agent::{self, AgentConfig},
    program::AttachMode,
};
use monitor_common::{
    maps::{DEFAULT_CAPACITY, MAX_WINDOW},
    wire::DEFAULT_PORT,
};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Network interface whose incoming heartbeats are watched.
    #[arg(long, short)]
    iface: String,
    /// UDP destination port of heartbeats.
    #[arg(long, short, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Path of the Unix socket that serves queries.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// File listing peer ids to admit at start: one per line, decimal or 0x hex, # comments.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// XDP attach mode: native (driver), skb (generic), or auto (native, else skb).
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    xdp_mode: AttachMode,
    /// Most peers watched at once (kernel memory is reserved for all of them at start).
    #[arg(long, default_value_t = DEFAULT_CAPACITY, value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    capacity: u32,
    /// Inter-arrival samples kept per peer (the statistics window).
    #[arg(long, default_value_t = MAX_WINDOW as u32, value_parser = clap::value_parser!(u32).range(2..=MAX_WINDOW as i64))]
    window: u32,
    /// Do not admit peers on their first heartbeat; only those in --peers are watched.
    #[arg(long)]
    no_auto_admit: bool,
    /// Pass heartbeats on to the network stack after recording them (default: consume them).
    #[arg(long)]
    pass_heartbeats: bool,
    /// Unknown-peer reports each CPU may send the agent per second (caps the cost of floods).
    #[arg(long, default_value_t = 1000)]
    unknown_report_rate: u32,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = AgentConfig {
        iface: args.iface,
        port: args.port,
        socket: args.socket,
        peers_file: args.peers,
        mode: args.xdp_mode,
        capacity: args.capacity,
        window: args.window,
        auto_admit: !args.no_auto_admit,
        pass_heartbeats: args.pass_heartbeats,
        unknown_reports_per_sec: args.unknown_report_rate,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(agent::run(config, shutdown_signal()))?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
