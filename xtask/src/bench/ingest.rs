//! The ingest ceiling: the userspace generator at rising rates into one agent, what it sent
//! and what the kernel recorded at each.

use std::{fmt::Write as _, time::Duration};

use anyhow::Result;

use super::{Rig, generator::Loadgen};

pub(super) struct Ingest {
    peers: u64,
    /// (target pps, achieved pps, sent, recorded)
    steps: Vec<(f64, f64, u64, u64)>,
}

pub(super) fn ingest_run(rig: &Rig, peers: u64, seconds: u64) -> Result<Ingest> {
    let agent = rig.agent(peers, &[])?;
    let mut steps = Vec::new();
    for target in [50_000.0, 100_000.0, 200_000.0, 300_000.0, 400_000.0, 1e9] {
        let before = agent.stats()?["kernel"]["heartbeats"].as_u64().unwrap_or(0);
        let sent = Loadgen::new(peers, target / peers as f64, seconds as f64).run(rig)?;
        std::thread::sleep(Duration::from_millis(200));
        let after = agent.stats()?["kernel"]["heartbeats"].as_u64().unwrap_or(0);
        steps.push((
            target,
            sent["achieved_pps"].as_f64().unwrap_or(0.0),
            sent["sent"].as_u64().unwrap_or(0),
            after - before,
        ));
    }
    agent.process.stop();
    Ok(Ingest { peers, steps })
}

/// The ingest table, with its heading.
pub(super) fn render_ingest(ingest: &Ingest) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nIngest at {} peers (3 s per step; lost = sent - recorded by the kernel):\n",
        ingest.peers
    );
    let _ = writeln!(t, "| target pps | sent pps | sent | recorded | lost |");
    let _ = writeln!(t, "|---:|---:|---:|---:|---:|");
    for (target, achieved, sent, recorded) in &ingest.steps {
        let target = if *target >= 1e9 {
            "generator max".to_string()
        } else {
            format!("{target:.0}")
        };
        let _ = writeln!(
            t,
            "| {target} | {achieved:.0} | {sent} | {recorded} | {} |",
            *sent as i64 - *recorded as i64
        );
    }
    t
}
