//! `cargo xtask attack`: every attack of the suite in docs/security.md, against the real agent
//! and kernel, one after another, then one table: what each did, how hard and how long, and
//! what it cost the live peers and other clients. Each attack is an integration test that
//! fails if its protection is removed (the test command runs them all too); this task runs
//! them with their output shown and collects the row each prints (tests/src/attack.rs).

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{build, setup, workspace};

#[derive(Debug, Args)]
pub struct AttackArgs {
    /// Only the attacks whose test name contains this.
    #[arg(long)]
    pub only: Option<String>,
}

/// (test file, test name) of every attack, in the table's order.
pub const SUITE: &[(&str, &str)] = &[
    (
        "admission",
        "one_source_cannot_fill_the_table_and_a_real_peer_still_gets_in",
    ),
    ("admission", "a_packed_flood_gets_one_source_no_more_slots"),
    ("admission", "a_watched_peer_is_never_pushed_out_by_a_flood"),
    (
        "xdp_fixtures",
        "authentication::forgeries_on_another_cpu_never_make_a_signed_heartbeat_meet_a_busy_lock",
    ),
    (
        "socket_abuse",
        "a_thousand_idle_connections_and_a_hundred_mute_subscribers_do_not_stall_root",
    ),
    (
        "metrics_abuse",
        "a_slowloris_stalls_neither_the_scrape_nor_the_socket_and_is_closed",
    ),
    (
        "busy_agent",
        "an_admission_storm_and_detector_changes_at_fifty_thousand_peers_do_not_stall_the_socket",
    ),
    (
        "backwards_restarts",
        "a_sender_restarted_with_a_lower_incarnation_is_heard_again",
    ),
    (
        "backwards_restarts",
        "with_the_key_a_replayed_epoch_revives_nothing_and_a_real_restart_does",
    ),
    (
        "restart",
        "a_slot_lock_left_odd_by_a_killed_agent_is_repaired_on_adoption",
    ),
    (
        "observer_faults",
        "a_link_down_convicts_nobody_and_a_peer_that_died_meanwhile_is_convicted_after",
    ),
    ("fleet", "no_observer_can_forge_another_observers_verdicts"),
];

pub fn run(args: &AttackArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("attack")?;
    build::build(false)?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for &(file, name) in SUITE {
        if args
            .only
            .as_deref()
            .is_some_and(|only| !name.contains(only))
        {
            continue;
        }
        println!("attack: {name}");
        let mut child = workspace::cargo()
            .args(["test", "--test", file, name, "--", "--exact", "--nocapture"])
            .env("MONITOR_BIN", build::monitor_bin(false))
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the test {name}"))?;
        // A test may report several rows (one per variant of its attack).
        let before = rows.len();
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let line = line?;
            match line.strip_prefix("attack-row ") {
                Some(json) => rows.push((name, Some(serde_json::from_str::<Value>(json)?))),
                None => println!("{line}"),
            }
        }
        if !child.wait()?.success() {
            failed.push(name);
        }
        if rows.len() == before {
            rows.push((name, None));
        }
    }
    println!("\n{}", table(&rows));
    if !failed.is_empty() {
        bail!(
            "attacks whose protection did not hold: {}",
            failed.join(", ")
        );
    }
    Ok(())
}

/// The markdown table of the rows, in docs/security.md's columns.
fn table(rows: &[(&str, Option<Value>)]) -> String {
    let mut out = String::from(
        "| attack | load | heartbeats lost | live peers wrongly convicted | real peers refused | query p99 | agent memory |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for (name, row) in rows {
        let Some(row) = row else {
            out.push_str(&format!(
                "| {name} | (no row: the test failed early) | | | | | |\n"
            ));
            continue;
        };
        let num = |key: &str| row[key].as_u64().map_or("-".into(), |n| n.to_string());
        let p99 = row["query_p99_ms"]
            .as_f64()
            .map_or("-".into(), |ms| format!("{ms:.1} ms"));
        let rss = match (row["agent_rss_mib"].as_f64(), row["idle_rss_mib"].as_f64()) {
            (Some(during), Some(idle)) => format!("{during:.0} MiB ({idle:.0} before)"),
            (Some(during), None) => format!("{during:.0} MiB"),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {p99} | {rss} |\n",
            row["attack"].as_str().unwrap_or(name),
            row["load"].as_str().unwrap_or(""),
            num("heartbeats_lost"),
            num("wrongly_convicted"),
            num("real_peers_refused"),
        ));
    }
    out
}
