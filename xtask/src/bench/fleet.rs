//! The fleet's figures: event latency through NATS JetStream and a 50,000-peer burst, from
//! the fleet test's measurement (real nats-server and agents).

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::{Tools, tools::number_at};
use crate::workspace;

/// The fleet's measurement (an ignored test: real nats-server and agents), run in release
/// against the agent built here; its figures are the line it prints.
pub(super) fn fleet_figures(tools: &Tools) -> Result<Value> {
    let out = workspace::output(
        workspace::cargo()
            .args([
                "test",
                "--release",
                "-p",
                "integration-tests",
                "--test",
                "fleet",
            ])
            .args(["--", "--ignored", "--nocapture", "--exact", "fleet_figures"])
            .env("MONITOR_BIN", &tools.monitor),
    )?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("FLEET-FIGURES "))
        .context("the fleet measurement printed no FLEET-FIGURES line")?;
    Ok(serde_json::from_str(line)?)
}

/// The fleet's paragraph of the full table.
pub(super) fn render_fleet(fleet: &Value) -> String {
    let mut t = String::new();
    let v = |path: &[&str]| number_at(fleet, path);
    let _ = writeln!(
        t,
        "\nFleet on NATS JetStream (tests/tests/fleet.rs `fleet_figures`, release): event \
         latency from crossing to a stream consumer p50 {:.0} ms, p99 {:.0} ms (n = {}); \
         {} peers suspected at once: {} suspect events published and consumed, {:.2} s from \
         the first crossing to the last event consumed",
        v(&["latency_ms_1000_peers_100_killed", "p50"]),
        v(&["latency_ms_1000_peers_100_killed", "p99"]),
        fleet["latency_ms_1000_peers_100_killed"]["n"],
        fleet["burst"]["peers"],
        fleet["burst"]["suspect_events"],
        v(&["burst", "first_crossing_to_last_consumed_ms"]) / 1000.0,
    );
    t
}
