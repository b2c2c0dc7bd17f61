//! The agent alone under steady streams (1, 5 and 10 Hz a peer, and 10 Hz from half the
//! peers): its CPU, refreshes, floors renewed and events, and its cost solved into a constant,
//! a cost per peer and a cost per packet.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    Rig,
    generator::Loadgen,
    procfs::{process_cpu_s, thread_cpu_s},
    tools::{finish_json, probe_json},
};

/// The scan interval the scan floor is measured at: the agent's default `--sweep-interval`.
const SCAN_FLOOR_INTERVAL_MS: &str = "50";

/// The agent's CPU with no traffic at all, over `peers` listed peers (0: none).
pub(super) struct IdleCost {
    tag: String,
    peers: u64,
    agent_cpu_pct: f64,
    /// Sweeps per second, and those that left the words alone (`scans_skipped`).
    sweeps_per_s: f64,
    skipped_per_s: f64,
}

/// Seconds an idle agent runs before its CPU is measured (its first scans read every listed
/// slot once).
const IDLE_SETTLE_S: u64 = 3;

/// The agent with no traffic, over no peers and over `peers` listed ones: what every sweep
/// costs before a heartbeat arrives, which should not grow with the peers listed.
pub(super) fn idle_cost(rig: &Rig, peers: u64, seconds: u64) -> Result<Vec<IdleCost>> {
    let mut rows = Vec::new();
    for listed in [0, peers] {
        for variant in rig.variants {
            rig.interrupt.check()?;
            let agent = rig.agent_as(variant, listed, &[])?;
            let pid = agent.process.pid();
            rig.interrupt.pause(Duration::from_secs(IDLE_SETTLE_S))?;
            let before = agent.stats()?;
            let (cpu0, t0) = (process_cpu_s(pid)?, Instant::now());
            rig.interrupt.pause(Duration::from_secs(seconds))?;
            let (cpu1, wall) = (process_cpu_s(pid)?, t0.elapsed().as_secs_f64());
            let after = agent.stats()?;
            agent.process.stop();
            let delta = |key: &str| {
                after[key].as_f64().unwrap_or(f64::NAN) - before[key].as_f64().unwrap_or(f64::NAN)
            };
            rows.push(IdleCost {
                tag: variant.tag(),
                peers: listed,
                agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
                sweeps_per_s: delta("sweeps") / wall,
                // 0 for an agent that does not count them.
                skipped_per_s: (delta("scans_skipped") / wall).max(0.0),
            });
        }
    }
    Ok(rows)
}

/// The idle table.
pub(super) fn render_idle_cost(rows: &[IdleCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nThe agent idle (no traffic, from {IDLE_SETTLE_S} s after its start): its cost should not grow \
         with the peers listed (docs/tuning.md, \"An idle agent leaves the words alone\"):\n"
    );
    let _ = writeln!(
        t,
        "| peers listed | agent CPU % of a core | sweeps/s | sweeps that left the words alone/s |"
    );
    let _ = writeln!(t, "|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            t,
            "| {}{} | {:.2} | {:.1} | {:.1} |",
            r.peers, r.tag, r.agent_cpu_pct, r.sweeps_per_s, r.skipped_per_s
        );
    }
    t
}

/// The agent's CPU under a steady stream of `rate` Hz from every peer.
pub(super) struct AgentCost {
    /// The agent's label (`--compare`), with its leading space; empty for this build alone.
    tag: String,
    peers: u64,
    rate_hz: f64,
    achieved_pps: f64,
    agent_cpu_pct: f64,
    /// Slot reads (estimate refreshes) per second, from the agent's stats.
    refreshes_per_s: f64,
    /// Floors renewed without a slot read per second, from the agent's stats.
    refloors_per_s: f64,
    /// Events published per second over the steady part, from the agent's stats (0 while no
    /// peer's silence crosses a level).
    events_per_s: f64,
    /// Wakes between scans for a due slot, and the slots they looked at, per second (0 for
    /// an agent without them).
    due_passes_per_s: f64,
    due_looks_per_s: f64,
    /// The scan floor beside the agent, under the same stream, right after the agent's
    /// window: `hbm-bench scan-floor`'s CPU, percent of a core (a scan of every word every
    /// 50 ms that only compares and stores: what a scanning agent cannot go below).
    scan_floor_pct: f64,
    /// Of the agent's CPU: its sweeper thread's, and the time in its scans and due passes
    /// (`stats.pass_s`), percent of a core; the rest of the sweeper's is waking and sleeping
    /// for them (the syscalls around a pass: the wait, the link's files, the counters).
    sweeper_pct: f64,
    pass_pct: f64,
    /// Of the scan floor's: the time in its scans (their count times the median scan).
    scan_floor_scans_pct: f64,
}

/// The agent alone under 1 Hz, 5 Hz and 10 Hz from `peers` peers, and 10 Hz from half as
/// many: its cost should follow reads (sweeps), not heartbeats. Nothing else touches the agent
/// meanwhile.
pub(super) fn agent_cost(
    rig: &Rig,
    peers: u64,
    seconds: u64,
    quick: bool,
) -> Result<Vec<AgentCost>> {
    let mut rows = Vec::new();
    // 5 Hz is the fastest the generator keeps on schedule at 50,000 peers (250k packets a
    // second); at 10 Hz it sends about 7 Hz, late and in bursts. Half the peers at 10 Hz is
    // that rate on schedule: the agent's work is per peer (a word and a watch per sweep, a
    // refresh every so many heartbeats), so twice its cost estimates the full count's.
    for (peers, rate_hz) in [
        (peers, 1.0f64),
        (peers, 5.0),
        (peers, 10.0),
        (peers / 2, 10.0),
    ] {
        for variant in rig.variants {
            rig.interrupt.check()?;
            let agent = rig.agent_as(variant, peers, &[])?;
            let pid = agent.process.pid();
            // Measured once every window is full (128 intervals: 12.8 s at 10 Hz, 128 s at 1 Hz),
            // the steady state of a long-running agent; a quick run settles for at most 15 s.
            let settle = (130.0 / rate_hz).min(if quick { 15.0 } else { 140.0 });
            // The stream also covers the scan floor's window after the agent's.
            let generator =
                Loadgen::new(peers, rate_hz, settle + 2.0 * seconds as f64 + 2.0).spawn(rig)?;
            rig.interrupt.pause(Duration::from_secs_f64(settle))?;
            let before = agent.stats()?;
            let (cpu0, sweeper0, t0) = (
                process_cpu_s(pid)?,
                thread_cpu_s(pid, SWEEPER_THREAD)?,
                Instant::now(),
            );
            rig.interrupt.pause(Duration::from_secs(seconds))?;
            let (cpu1, sweeper1, wall) = (
                process_cpu_s(pid)?,
                thread_cpu_s(pid, SWEEPER_THREAD)?,
                t0.elapsed().as_secs_f64(),
            );
            let after = agent.stats()?;
            let scan_floor = probe_json(
                &rig.tools.probe,
                &[
                    "scan-floor",
                    "--peers",
                    &peers.to_string(),
                    "--interval-ms",
                    SCAN_FLOOR_INTERVAL_MS,
                    "--seconds",
                    &seconds.to_string(),
                ],
            )?;
            let sent = finish_json(generator)?;
            agent.process.stop();
            let delta = |key: &str| {
                after[key].as_f64().unwrap_or(f64::NAN) - before[key].as_f64().unwrap_or(f64::NAN)
            };
            rows.push(AgentCost {
                tag: variant.tag(),
                peers,
                rate_hz,
                achieved_pps: sent["achieved_pps"].as_f64().unwrap_or(0.0),
                agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
                refreshes_per_s: delta("refreshes") / wall,
                refloors_per_s: delta("refloors") / wall,
                events_per_s: delta("events") / wall,
                due_passes_per_s: delta("due_passes") / wall,
                due_looks_per_s: delta("due_looks") / wall,
                scan_floor_pct: scan_floor["cpu_percent"].as_f64().unwrap_or(f64::NAN),
                sweeper_pct: (sweeper1 - sweeper0) / wall * 100.0,
                // NaN for an agent that does not report it.
                pass_pct: delta("pass_s") / wall * 100.0,
                scan_floor_scans_pct: scan_floor_scans_pct(&scan_floor, seconds),
            });
        }
    }
    Ok(rows)
}

/// The agent's sweeper thread (`monitor/src/agent/sweeper.rs`).
const SWEEPER_THREAD: &str = "sweep";

/// The share of a core a scan-floor run spent in its scans: scans times the median scan over
/// the run's `seconds`.
fn scan_floor_scans_pct(floor: &serde_json::Value, seconds: u64) -> f64 {
    let scans = floor["scans"].as_f64().unwrap_or(f64::NAN);
    let scan_us = floor["scan_us_p50"].as_f64().unwrap_or(f64::NAN);
    scans * scan_us / 1e6 / seconds as f64 * 100.0
}

/// The agent-cost table, and under it each agent's summary (`render_agent_summary`).
pub(super) fn render_agent_cost(peers: u64, rows: &[AgentCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nThe agent alone at {peers} peers (CPU over the steady part of the run, after every \
         window filled; a refresh is one slot read and estimate; the scan floor is `hbm-bench \
         scan-floor` beside the agent under the same stream right after: every word loaded and \
         compared, a changed one's deadline stored, every {SCAN_FLOOR_INTERVAL_MS} ms, nothing \
         else):\n"
    );
    let _ = writeln!(
        t,
        "| peers | rate per peer | sent pps | agent CPU % of a core | scan floor % | agent / scan floor | refreshes/s | refreshes per heartbeat | floors renewed without a read/s | events/s | due passes/s (slots looked at/s) |"
    );
    let _ = writeln!(
        t,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "| {}{} | {} Hz | {:.0} | {:.2} | {:.2} | {:.1}x | {:.0} | {:.3} | {:.0} | {:.0} | {:.0} ({:.0}) |",
            r.peers,
            r.tag,
            r.rate_hz,
            r.achieved_pps,
            r.agent_cpu_pct,
            r.scan_floor_pct,
            r.agent_cpu_pct / r.scan_floor_pct,
            r.refreshes_per_s,
            r.refreshes_per_s / r.achieved_pps.max(1.0),
            r.refloors_per_s,
            r.events_per_s,
            r.due_passes_per_s,
            r.due_looks_per_s,
        );
    }
    t.push_str(&render_where_the_cpu_goes(rows));
    // Each agent's summary, in the order they were measured.
    let mut tags: Vec<&str> = Vec::new();
    for r in rows {
        if !tags.contains(&r.tag.as_str()) {
            tags.push(&r.tag);
        }
    }
    for tag in tags {
        let mine: Vec<&AgentCost> = rows.iter().filter(|r| r.tag == tag).collect();
        t.push_str(&render_agent_summary(peers, tag, &mine));
    }
    t
}

/// The rows' CPU split by where it goes: the agent's sweeper thread into its passes (scans and
/// due passes, timed by the agent) and the rest of that thread (waking for them: the wait and
/// the syscalls around a pass), its other threads; and the scan floor's into its scans and
/// its wakes. A wake costs this machine what it costs whatever is done in it, so the
/// floor's wakes say how much of the agent's is the pace of 20 wakes a second.
fn render_where_the_cpu_goes(rows: &[AgentCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nWhere the CPU goes (percent of a core; \"in passes\" is the agent's own timing of its \
         scans and due passes, `stats.pass_s`; the scan floor's scans are their count times the \
         median scan):\n"
    );
    let _ = writeln!(
        t,
        "| peers | rate per peer | agent | sweeper thread | in passes | sweeper outside passes | other threads | scan floor | its scans | outside its scans |"
    );
    let _ = writeln!(t, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            t,
            "| {}{} | {} Hz | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.peers,
            r.tag,
            r.rate_hz,
            r.agent_cpu_pct,
            r.sweeper_pct,
            r.pass_pct,
            r.sweeper_pct - r.pass_pct,
            r.agent_cpu_pct - r.sweeper_pct,
            r.scan_floor_pct,
            r.scan_floor_scans_pct,
            r.scan_floor_pct - r.scan_floor_scans_pct,
        );
    }
    t
}

/// One agent's rows summed up: 10 Hz against 1 Hz, and its cost solved into a constant, a
/// cost per peer and a cost per packet.
fn render_agent_summary(peers: u64, tag: &str, rows: &[&AgentCost]) -> String {
    let mut t = String::new();
    if !tag.is_empty() {
        let _ = write!(t, "\n{}:", tag.trim());
    }
    if let [one, five, ten, half] = rows {
        let _ = writeln!(
            t,
            "
CPU at 10 Hz over CPU at 1 Hz: {:.2}x; {peers} peers x 10 Hz on schedule, estimated as twice \
             {} peers x 10 Hz: {:.2}% of a core",
            ten.agent_cpu_pct / one.agent_cpu_pct,
            half.peers,
            2.0 * half.agent_cpu_pct,
        );
        if let Some(fit) = AgentCostModel::solve([*one, *five, *half]) {
            let _ = writeln!(
                t,
                "
Solved from the three rows sent on schedule, CPU % = {:.3} (a constant: what every sweep \
                 costs) + {:.3} per 10k peers + {:.3} per 100k packets a second; at {peers} peers \
                 x 10 Hz on schedule: {:.2}% of a core (twice the half-count row counts the \
                 constant twice: an upper bound)
",
                fit.fixed,
                fit.per_peer * 1e4,
                fit.per_pps * 1e5,
                fit.at(peers as f64, peers as f64 * 10.0),
            );
        }
    }
    t
}

/// The agent's CPU as a constant (what every sweep costs whatever the peers: waking, the
/// clock, the metrics), a cost per peer (its word and watch read every sweep) and a cost per
/// packet (heartbeats passed over under a floor, refreshes), through three measured rows.
struct AgentCostModel {
    fixed: f64,
    per_peer: f64,
    per_pps: f64,
}

impl AgentCostModel {
    /// The model solved exactly from three rows (three unknowns, no fit), None if they do not
    /// pin it down (two rows alike).
    fn solve(rows: [&AgentCost; 3]) -> Option<Self> {
        // Cramer's rule on [1, peers, pps] . x = cpu.
        let m: Vec<[f64; 4]> = rows
            .iter()
            .map(|r| [1.0, r.peers as f64, r.achieved_pps, r.agent_cpu_pct])
            .collect();
        let det = |c: [usize; 3]| {
            let e = |i: usize, j: usize| m[i][c[j]];
            e(0, 0) * (e(1, 1) * e(2, 2) - e(1, 2) * e(2, 1))
                - e(0, 1) * (e(1, 0) * e(2, 2) - e(1, 2) * e(2, 0))
                + e(0, 2) * (e(1, 0) * e(2, 1) - e(1, 1) * e(2, 0))
        };
        let d = det([0, 1, 2]);
        if d.abs() < 1e-6 {
            return None;
        }
        Some(Self {
            fixed: det([3, 1, 2]) / d,
            per_peer: det([0, 3, 2]) / d,
            per_pps: det([0, 1, 3]) / d,
        })
    }

    fn at(&self, peers: f64, pps: f64) -> f64 {
        self.fixed + self.per_peer * peers + self.per_pps * pps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_fit_recovers_a_linear_cost() {
        let cost = |peers: u64, pps: f64| AgentCost {
            tag: String::new(),
            peers,
            rate_hz: pps / peers as f64,
            achieved_pps: pps,
            agent_cpu_pct: 0.1 + 2e-6 * peers as f64 + 3e-7 * pps,
            refreshes_per_s: 0.0,
            refloors_per_s: 0.0,
            events_per_s: 0.0,
            due_passes_per_s: 0.0,
            due_looks_per_s: 0.0,
            scan_floor_pct: 0.0,
            sweeper_pct: 0.0,
            pass_pct: 0.0,
            scan_floor_scans_pct: 0.0,
        };
        let rows = [
            cost(50_000, 50_000.0),
            cost(50_000, 250_000.0),
            cost(25_000, 250_000.0),
        ];
        let fit = AgentCostModel::solve([&rows[0], &rows[1], &rows[2]]).unwrap();
        assert!((fit.fixed - 0.1).abs() < 1e-9, "{}", fit.fixed);
        assert!((fit.at(50_000.0, 500_000.0) - (0.1 + 0.1 + 0.15)).abs() < 1e-9);
        // Two rows alike pin nothing down.
        assert!(AgentCostModel::solve([&rows[0], &rows[0], &rows[2]]).is_none());
    }
}
