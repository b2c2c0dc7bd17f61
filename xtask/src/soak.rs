//! `cargo xtask soak`: 50,000 peers for 10 minutes with churn (1% of them going silent and
//! coming back, a quarter of those at a time, in 5 s periods). Afterwards: every silent period
//! detected at phi 8, no steady peer suspected at phi 8, no slot leaked, no heartbeat lost, the
//! agent alive, and its memory before and after. Appends the result to docs/benchmarks-history.md. The agent
//! runs with an interval cap of 4 intervals, so silences do not teach it to wait longer.

use std::{fmt::Write as _, process::Command};

use anyhow::{Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{
    bench::{Agent, Tools, record, rss_anon_mib},
    lab::{NetPair, TempDir},
    setup, workspace,
};

const NET: NetPair = NetPair {
    ns_monitor: "hbm-soak-mon",
    ns_peers: "hbm-soak-gen",
    if_monitor: "hbmsoak0",
    if_peers: "hbmsoak1",
    addr_monitor: "10.215.0.1",
    addr_peers: "10.215.0.2",
};

#[derive(Debug, Args)]
pub struct SoakArgs {
    #[arg(long, default_value_t = 50_000)]
    peers: u64,
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Heartbeats per second per peer (2 keeps the generator well under its ceiling here).
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    /// Fraction of the peers that churn.
    #[arg(long, default_value_t = 0.01)]
    churn: f64,
    /// Do not append the result to docs/benchmarks-history.md.
    #[arg(long)]
    no_record: bool,
}

pub fn run(args: &SoakArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("soak")?;
    let tools = Tools::build()?;
    let net = NET.create()?;
    let dir = TempDir::create("hbm-soak")?;
    let interval_ms = (1000.0 / args.rate).round();
    // Default detector: its outage rule keeps the 5 s silences of churning peers out of their
    // windows, so each silence is judged like the first (docs/tuning.md, window hygiene).
    let agent = Agent::start(
        &tools,
        &tools.monitor,
        &net,
        &dir.0,
        1,
        args.peers,
        &["--first-interval-ms", &interval_ms.to_string()],
    )?;
    let pid = agent.process.pid();
    let rss_before = rss_anon_mib(pid)?;
    println!(
        "==> soak: {} peers x {} Hz for {} min, {}% churning",
        args.peers,
        args.rate,
        args.minutes,
        args.churn * 100.0
    );
    let out = Command::new(&tools.probe)
        .args(["soak", "--socket"])
        .arg(&agent.socket)
        .arg("--monitor")
        .arg(&tools.monitor)
        .args([
            "--ns",
            net.ns_peers,
            "--to",
            &net.target(),
            "--peers",
            &args.peers.to_string(),
        ])
        .args([
            "--rate",
            &args.rate.to_string(),
            "--seconds",
            &(args.minutes * 60).to_string(),
        ])
        .args(["--churn", &args.churn.to_string()])
        .output()?;
    let alive = !agent.process.exited();
    let rss_after = if alive { rss_anon_mib(pid)? } else { f64::NAN };
    let text = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(text.lines().last().unwrap_or("null"))?;
    let v = &result["verdict"];
    let mut table = String::new();
    let _ = writeln!(table, "| figure | value |\n|---|---|");
    for (name, value) in [
        (
            "peers x rate x time",
            format!("{} x {} Hz x {} min", args.peers, args.rate, args.minutes),
        ),
        (
            "heartbeats sent / recorded",
            format!("{} / {}", result["sent"], result["recorded"]),
        ),
        (
            "generator pps",
            format!("{:.0}", result["achieved_pps"].as_f64().unwrap_or(0.0)),
        ),
        (
            "silent periods / detected at phi 8",
            format!("{} / {}", v["deaths"], v["detected"]),
        ),
        (
            "steady peers suspected at phi 8",
            format!("{}", v["steady_suspected"].as_array().map_or(0, Vec::len)),
        ),
        ("recoveries", format!("{}", v["recoveries"])),
        (
            "events seen / missed by the subscriber",
            format!("{} / {}", v["events"], v["lagged"]),
        ),
        ("peers at the end (slots)", format!("{}", result["peers"])),
        ("agent alive at the end", alive.to_string()),
        (
            "agent RssAnon MiB, start / end",
            format!("{rss_before:.1} / {rss_after:.1}"),
        ),
    ] {
        let _ = writeln!(table, "| {name} | {value} |");
    }
    println!("\n{table}");
    if !args.no_record {
        record(
            &table,
            &format!(
                "cargo xtask soak --peers {} --minutes {}",
                args.peers, args.minutes
            ),
        )?;
    }
    agent.process.stop();
    if !out.status.success() || !alive || result["ok"] != Value::Bool(true) {
        bail!("the soak failed: {}", v);
    }
    Ok(())
}
