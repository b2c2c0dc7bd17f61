//! `monitor record`: capture every arrival of some peers from a running agent, as traces that
//! `monitor replay` reads ("what would detector X have done on my network?").

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, bail};
use clap::Args;
use monitor::{
    DEFAULT_SOCKET,
    offline::trace::{Arrival, format_trace},
    serving::client::Client,
    serving::recording::ArrivalLine,
};
use serde_json::{Value, json};

use super::parse_duration;

fn parse_id(text: &str) -> Result<u64, String> {
    monitor::agent::peers_file::parse_peer_id(text)
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Peer to record (decimal or 0x hex); repeat for several.
    #[arg(long = "peer", value_parser = parse_id, required = true)]
    peers: Vec<u64>,
    /// How long to record.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Where to write the trace; `-` for standard output. With several peers, the path must
    /// contain `{id}`, replaced by each peer's id.
    #[arg(long, default_value = "-")]
    out: String,
    /// The agent's socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
}

pub fn record(args: RecordArgs) -> anyhow::Result<ExitCode> {
    if args.peers.len() > 1 && !args.out.contains("{id}") {
        bail!("--out must contain {{id}} when recording several peers (one trace each)");
    }
    if args.duration.is_zero() {
        bail!("--duration must be greater than zero");
    }
    let mut client = Client::connect(&args.socket)
        .with_context(|| format!("connecting to {}", args.socket.display()))?;
    let request = json!({
        "op": "record",
        "ids": args.peers,
        "duration_ms": args.duration.as_millis() as u64,
    });
    let reply = client.request(&request)?;
    if reply["ok"] != true {
        bail!(
            "the agent refused: {}",
            reply["error"].as_str().unwrap_or("no reason given")
        );
    }
    let origin_ns = reply["origin_ns"]
        .as_u64()
        .context("the agent's reply has no origin_ns")?;
    eprintln!(
        "recording {} peer(s) for {:?}",
        args.peers.len(),
        args.duration
    );
    let mut traces: BTreeMap<u64, Vec<Arrival>> =
        args.peers.iter().map(|&id| (id, Vec::new())).collect();
    // The agent closes the recording itself; allow it a little slack before giving up.
    client.set_read_timeout(Some(args.duration + Duration::from_secs(10)))?;
    let done = loop {
        let line = client.read_line().context("reading arrivals")?;
        let value: Value =
            serde_json::from_str(&line).context("a malformed line from the agent")?;
        if let Some(arrival) = value.get("arrival") {
            let arrival: ArrivalLine = serde_json::from_value(arrival.clone())
                .context("a malformed arrival from the agent")?;
            if let Some(trace) = traces.get_mut(&arrival.id) {
                trace.push(arrival.arrival(origin_ns));
            }
        } else if value.get("done").is_some() {
            break value;
        }
    };
    let missed = done["missed"].as_u64().unwrap_or(0);
    if missed > 0 {
        eprintln!(
            "warning: {missed} arrivals were missed (the agent could not keep up); the traces have gaps"
        );
    }
    for (id, arrivals) in &traces {
        let header = format!(
            "recorded by `monitor record` from peer {id} for {:?}: {} arrivals{}\n\
             times from the start of the recording (the peer counts as heard then)",
            args.duration,
            arrivals.len(),
            if missed > 0 { ", with gaps" } else { "" }
        );
        let text = format_trace(&header, arrivals);
        if args.out == "-" {
            print!("{text}");
        } else {
            let path = args.out.replace("{id}", &id.to_string());
            write(Path::new(&path), &text)?;
            eprintln!("peer {id}: {} arrivals -> {path}", arrivals.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
