//! `cargo xtask consumers`: HAProxy's own checks (`check inter 100ms fall 3`) against the
//! agent-check (`monitor haproxy-agent`, `agent-inter 100ms`), for minutes: the integration
//! test tests/tests/haproxy_congestion.rs run long (its settings through the environment),
//! with its output shown, and its `consumers-row` lines made into docs/consumers.md's tables.
//! The test asserts the same claims as in the short run the test command makes.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader},
    process::Stdio,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{build, setup, workspace};

const TEST_FILE: &str = "haproxy_congestion";
const TEST_NAME: &str =
    "under_congestion_the_agent_check_marks_no_live_backend_down_where_haproxys_checks_do";

#[derive(Debug, Args)]
pub struct ConsumersArgs {
    /// How long the backends' path is congested (bursts of cross traffic), seconds.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(5..=3600))]
    seconds: u64,
    /// How many times a backend is killed (and started again) on the calm path afterwards.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=200))]
    kills: u64,
    /// Seed of the cross traffic's on/off schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(args: &ConsumersArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("consumers")?;
    build::build(false)?;
    println!(
        "consumers: {} s of congestion, then {} kills (seed {})",
        args.seconds, args.kills, args.seed
    );
    let mut child = workspace::cargo()
        .args(["test", "--test", TEST_FILE, TEST_NAME])
        .args(["--", "--exact", "--nocapture"])
        .env("MONITOR_BIN", build::monitor_bin(false))
        .env("HBM_CONSUMERS_SECONDS", args.seconds.to_string())
        .env("HBM_CONSUMERS_KILLS", args.kills.to_string())
        .env("HBM_CONSUMERS_SEED", args.seed.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the comparison's test")?;
    let mut rows = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        match line.strip_prefix("consumers-row ") {
            Some(json) => rows.push(serde_json::from_str::<Value>(json)?),
            None => println!("{line}"),
        }
    }
    let passed = child.wait()?.success();
    println!(
        "\n`cargo xtask consumers --seconds {} --kills {} --seed {}`\n\n{}",
        args.seconds,
        args.kills,
        args.seed,
        tables(&rows)
    );
    if !passed {
        bail!("the comparison's claims did not hold (the test failed; its output is above)");
    }
    Ok(())
}

/// The congestion row and the kills, as markdown tables.
fn tables(rows: &[Value]) -> String {
    let mut out = String::new();
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let n = |v: &Value| v.as_u64().map_or("-".into(), |n| n.to_string());
    for row in rows.iter().filter(|r| r["phase"] == "congestion") {
        let _ = writeln!(
            out,
            "| | HAProxy's checks | agent-check |\n|---|---:|---:|\n\
             | false DOWNs of live servers | {} | {} |\n\
             | times the backend had no server left | {} | {} |\n\
             | drains (agent policy level 3) | - | {} |\n\
             | suspicions of live peers at level 1 / 3 / 8 | - | {} / {} / {} |\n\
             | requests failed / sent | {} / {} | {} / {} |\n\n\
             {:.0} s with {} bursts of cross traffic, {:.0} s of them in all.\n",
            n(&row["checks_down"]),
            n(&row["agent_down"]),
            n(&row["checks_empty"]),
            n(&row["agent_empty"]),
            n(&row["agent_drain"]),
            n(&row["level1"]),
            n(&row["level3"]),
            n(&row["level8"]),
            n(&row["checks_failed"]),
            n(&row["checks_sent"]),
            n(&row["agent_failed"]),
            n(&row["agent_sent"]),
            f(&row["seconds"]),
            n(&row["bursts"]),
            f(&row["burst_seconds"]),
        );
    }
    let kills: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r["phase"] == "kill")
        .map(|r| (f(&r["checks_ms"]), f(&r["agent_ms"])))
        .collect();
    if kills.is_empty() {
        out.push_str("(no kill measured: the test failed before)\n");
        return out;
    }
    let stats = |pick: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = kills.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        let median = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        (v[0], median, v[v.len() - 1])
    };
    let (c, a) = (stats(|k| k.0), stats(|k| k.1));
    let faster = kills.iter().filter(|k| k.1 <= k.0).count();
    let _ = writeln!(
        out,
        "| kill to DOWN, {} kills | min | median | max |\n|---|---:|---:|---:|\n\
         | HAProxy's checks | {:.0} ms | {:.0} ms | {:.0} ms |\n\
         | agent-check | {:.0} ms | {:.0} ms | {:.0} ms |\n\n\
         The agent-check was first (or level) in {faster} of {} kills.",
        kills.len(),
        c.0,
        c.1,
        c.2,
        a.0,
        a.1,
        a.2,
        kills.len()
    );
    out
}
