use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use monitor::{DEFAULT_SOCKET, serving::client::Client, serving::protocol::into_result};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Path of the agent's Unix socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print each event as the agent's raw JSON line.
    #[arg(long)]
    json: bool,
}

pub fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let mut client = Client::connect(&args.socket)?;
    client.set_read_timeout(None)?;
    let reply = client.request(&json!({"op": "subscribe"}))?;
    into_result(reply).map_err(|e| anyhow::anyhow!("the agent says: {e}"))?;
    loop {
        let line = client.read_line()?;
        if args.json {
            println!("{line}");
            continue;
        }
        let event: Value = serde_json::from_str(&line)?;
        println!("{}", describe(&event));
    }
}

fn describe(e: &Value) -> String {
    let id = &e["id"];
    match e["event"].as_str().unwrap_or("?") {
        "suspect" => format!(
            "suspect  peer {id} reached level {} (phi {:.2}) after {:.0} ms of silence",
            e["level"],
            e["phi"].as_f64().unwrap_or(f64::NAN),
            e["silence_ms"].as_f64().unwrap_or(f64::NAN)
        ),
        "recover" => format!(
            "recover  peer {id} heard again after {:.0} ms (had reached level {})",
            e["silence_ms"].as_f64().unwrap_or(f64::NAN),
            e["level"]
        ),
        "admit" => format!("admit    peer {id}"),
        "forget" => format!("forget   peer {id}"),
        "lagged" => format!("lagged   this watcher missed {} events", e["missed"]),
        _ => e.to_string(),
    }
}
