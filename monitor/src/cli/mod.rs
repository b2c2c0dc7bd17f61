//! One module per subcommand.

mod detach;
mod loadgen;
mod query;
mod record;
mod replay;
mod run;
mod send;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "monitor",
    version,
    about = "Heartbeat failure detector: XDP timestamps heartbeats in the kernel, the agent \
             serves phi accrual suspicion over a Unix socket."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the XDP program on an interface and serve the socket until SIGINT/SIGTERM.
    Run(run::RunArgs),
    /// Detach a program left running by `monitor run --persist` and remove its pins.
    Detach(detach::DetachArgs),
    /// Send heartbeats to a monitor (run this on each peer).
    Send(send::SendArgs),
    /// Ask a running agent about its peers.
    Query(query::QueryArgs),
    /// Simulate many peers sending heartbeats (for benchmarks and soak tests).
    Loadgen(loadgen::LoadgenArgs),
    /// Follow a running agent's events: suspicions, recoveries, admissions.
    Watch(watch::WatchArgs),
    /// Run detectors offline on a trace of heartbeat arrivals and report their quality.
    Replay(replay::ReplayArgs),
    /// Record every arrival of some peers from a running agent, as traces for `replay`.
    Record(record::RecordArgs),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Send(args) => send::send(args),
        Command::Detach(args) => detach::detach(args),
        Command::Query(args) => query::query(args),
        Command::Watch(args) => watch::watch(args),
        Command::Loadgen(args) => loadgen::loadgen(args),
        Command::Replay(args) => replay::replay(args),
        Command::Record(args) => record::record(args),
    }
}

/// Resolves `--to ADDR:PORT` (a host name works too) to its first address.
pub fn resolve_target(to: &str) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    use std::net::ToSocketAddrs;
    to.to_socket_addrs()
        .with_context(|| format!("--to {to:?}: expected ADDR:PORT"))?
        .next()
        .with_context(|| format!("--to {to:?} resolves to no address"))
}

/// Parses durations such as `100ms`, `1.5s`, `2m`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 100ms, 1.5s, 2m)"))
}
