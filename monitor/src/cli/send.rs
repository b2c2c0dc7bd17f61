use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use clap::Args;
use monitor::peer::sender::{self, SenderConfig};

use super::parse_duration;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Where the monitor listens: ADDR:PORT (a host name works too).
    #[arg(long)]
    to: String,
    /// This peer's id (decimal or 0x hex).
    #[arg(long, value_parser = parse_id)]
    id: u64,
    /// Time between heartbeats.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    interval: Duration,
    /// Random offset added to each send, uniform in [-jitter, +jitter].
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    jitter: Duration,
    /// Stop after this many heartbeats (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// Sender epoch (default: the start time in Unix seconds, claimed by waiting that second
    /// out, so no two starts share one). Should grow across restarts; a lower one is taken for
    /// a restart when its sequence starts over (with a key, only when it is within 30 s of
    /// the monitor's clock).
    #[arg(long)]
    incarnation: Option<u32>,
    /// Sign heartbeats with the 128-bit key in this file (32 hex digits, mode 0600).
    #[arg(long)]
    auth_key_file: Option<std::path::PathBuf>,
    /// Send from this source address (one of this host's), instead of the one the route to
    /// --to picks: a second peer on a host with several addresses.
    #[arg(long, value_name = "ADDR")]
    from: Option<std::net::IpAddr>,
}

fn parse_id(text: &str) -> Result<u64, String> {
    let id = monitor::agent::peers_file::parse_peer_id(text)?;
    monitor_common::wire::validate_peer_id(id).map_err(|_| {
        format!("{id} is not a valid peer id: id 0 is reserved (docs/wire-format.md)")
    })?;
    Ok(id)
}

pub fn send(args: SendArgs) -> anyhow::Result<ExitCode> {
    if args.interval.is_zero() {
        anyhow::bail!("--interval must be greater than zero");
    }
    if args.jitter >= args.interval {
        anyhow::bail!("--jitter must be smaller than --interval");
    }
    let to = super::resolve_target(&args.to)?;
    let incarnation = args.incarnation.unwrap_or_else(sender::claim_incarnation);
    let config = SenderConfig {
        to,
        id: args.id,
        interval: args.interval,
        jitter: args.jitter,
        count: args.count,
        incarnation,
        first_seq: 0,
        key: args
            .auth_key_file
            .as_deref()
            .map(monitor::peer::auth_key::read_key_file)
            .transpose()?,
        from: args.from,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing a signal handler")?;
    }
    log::info!(
        "sending heartbeats as peer {} (incarnation {incarnation}) to {to} every {:?}",
        args.id,
        args.interval
    );
    let sent = sender::run(&config, || !stop.load(Ordering::Relaxed))?;
    log::info!("sent {sent} heartbeats");
    Ok(ExitCode::SUCCESS)
}
