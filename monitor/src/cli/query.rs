use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use monitor::{
    DEFAULT_SOCKET,
    serving::client::Client,
    serving::peer_view::PeerView,
    serving::protocol::{
        AgentStats, PeerReply, PeersReply, StatsReply, SuspectsReply, into_result,
    },
};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Path of the agent's Unix socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Print the agent's raw JSON reply instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// One peer.
    Peer {
        /// Peer id (decimal or 0x hex).
        #[arg(value_parser = monitor::agent::peers_file::parse_peer_id)]
        id: u64,
    },
    /// Every admitted peer (or those from one address, or of one source).
    Peers {
        /// Only the peers whose packets come from this address (BFD sessions and UDP flows are
        /// found this way: their ids are derived from the packets).
        #[arg(long)]
        addr: Option<std::net::IpAddr>,
        /// Only the peers of this source: heartbeat (`monitor send` and the wire format), bfd
        /// (BFD sessions, `run --bfd`) or udp (flows to a `run --udp-port` port).
        #[arg(long, value_parser = ["heartbeat", "bfd", "udp"])]
        source: Option<String>,
    },
    /// Peers whose phi is at least THRESHOLD (default: the agent's highest level).
    Suspects {
        #[arg(long)]
        threshold: Option<f64>,
    },
    /// Stop watching a peer and free its slot.
    Forget {
        /// Peer id (decimal or 0x hex).
        #[arg(value_parser = monitor::agent::peers_file::parse_peer_id)]
        id: u64,
    },
    /// Agent and kernel counters.
    Stats,
}

/// Retries of a request the agent answered with `"busy": true`, and the pause between them.
const BUSY_RETRIES: usize = 5;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

pub fn query(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let request = match &args.what {
        What::Peer { id } => json!({"op": "peer", "id": id}),
        What::Peers { addr, source } => {
            let mut request = json!({"op": "peers"});
            if let Some(addr) = addr {
                request["addr"] = json!(addr);
            }
            if let Some(source) = source {
                request["source"] = json!(source);
            }
            request
        }
        What::Suspects { threshold: Some(t) } => json!({"op": "suspects", "threshold": t}),
        What::Suspects { threshold: None } => json!({"op": "suspects"}),
        What::Forget { id } => json!({"op": "forget", "id": id}),
        What::Stats => json!({"op": "stats"}),
    };
    let mut client = Client::connect(&args.socket)?;
    let mut reply = client.request(&request)?;
    // A slot that kept changing while the agent read it: a busy moment, not an answer. Ask
    // again a few times before reporting it.
    for _ in 0..BUSY_RETRIES {
        if !monitor::serving::protocol::is_busy(&reply) {
            break;
        }
        std::thread::sleep(BUSY_PAUSE);
        reply = client.request(&request)?;
    }
    if args.json {
        println!("{reply}");
        return Ok(if reply["ok"] == Value::Bool(true) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let reply = into_result(reply).map_err(|e| anyhow::anyhow!("the agent says: {e}"))?;
    match args.what {
        What::Peer { .. } => {
            let PeerReply { peer } = serde_json::from_value(reply)?;
            print_peers(&[peer]);
        }
        What::Peers { .. } => {
            let PeersReply { peers } = serde_json::from_value(reply)?;
            print_peers(&peers);
        }
        What::Suspects { .. } => {
            let SuspectsReply {
                threshold,
                suspects,
            } = serde_json::from_value(reply)?;
            println!("{} peers at phi >= {threshold}", suspects.len());
            print_peers(&suspects);
        }
        What::Forget { id } => println!("forgot peer {id}"),
        What::Stats => {
            let StatsReply { stats } = serde_json::from_value(reply)?;
            print_stats(&stats);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn phi(value: f64) -> String {
    if value >= 1e6 {
        format!("{value:.2e}")
    } else {
        format!("{value:.2}")
    }
}

fn print_peers(peers: &[PeerView]) {
    println!(
        "{:>20} {:<12} {:<22} {:>10} {:>8} {:>7} {:>10} {:>9} {:>5} {:>6} {:>5} {:>5}",
        "ID",
        "SOURCE",
        "ADDR",
        "HEARTBEATS",
        "MEAN_MS",
        "STD_MS",
        "SILENCE_MS",
        "PHI",
        "LEVEL",
        "LOST",
        "DUP",
        "OOO"
    );
    for p in peers {
        println!(
            "{:>20} {:<12} {:<22} {:>10} {:>8} {:>7} {:>10.1} {:>9} {:>5} {:>6} {:>5} {:>5}",
            p.id,
            match &p.bfd_state {
                Some(state) => format!("{}:{state}", p.source),
                None => p.source.clone(),
            },
            p.addr.as_deref().unwrap_or("-"),
            p.heartbeats,
            ms(p.mean_ms),
            ms(p.std_ms),
            p.silence_ms,
            phi(p.phi),
            p.level.map_or_else(|| "-".into(), |l| l.to_string()),
            p.lost,
            p.duplicates,
            p.out_of_order
        );
    }
}

fn print_stats(s: &AgentStats) {
    println!(
        "interface      {} ({} mode), UDP port {}",
        s.iface, s.xdp_mode, s.port
    );
    println!(
        "peers          {} of {} (window {})",
        s.peers, s.capacity, s.window
    );
    let levels: Vec<String> = s.levels.iter().map(|l| l.to_string()).collect();
    println!(
        "detector       {} model, levels {}",
        s.model,
        levels.join(",")
    );
    // Empty from an agent older than the field.
    let o = &s.program;
    match (o.start.as_str(), &o.previous_tag) {
        ("", _) => {}
        (start, Some(previous)) => println!("program        {start}: tag {previous} -> {}", o.tag),
        (start, None) => println!("program        {start}, tag {}", o.tag),
    }
    println!(
        "uptime         {:.1} s, {} sweeps ({} left the words alone), {} stalls, {} slot reads ({} floors renewed without one)",
        s.uptime_s, s.sweeps, s.scans_skipped, s.stalls, s.refreshes, s.refloors
    );
    println!(
        "due passes     {} ({} slots looked at between scans; {} suspected peers heard, as the kernel told them); {:.3} s in scans and due passes",
        s.due_passes, s.due_looks, s.heard_told, s.pass_s
    );
    println!(
        "events         {} published, {} subscribers",
        s.events, s.subscribers
    );
    let k = &s.kernel;
    for (name, value) in [
        ("heartbeats", k.heartbeats),
        ("not_heartbeat", k.not_heartbeat),
        ("not_local", k.not_local),
        ("bfd", k.bfd),
        ("flow", k.flow),
        ("malformed", k.malformed),
        ("unknown_peer", k.unknown_peer),
        ("duplicates", k.duplicates),
        ("out_of_order", k.out_of_order),
        ("auth_failures", k.auth_failures),
        ("contended", k.contended),
        ("unknown_reported", k.unknown_reported),
        ("unknown_suppressed", k.unknown_suppressed),
        ("arrivals_dropped", k.arrivals_dropped),
    ] {
        println!("kernel {name:<19} {value}");
    }
}
