//! The agent under measurement: `monitor run` in the monitor's namespace over a peers file of
//! ids 1..=N, and what its `stats` reply says changed between two reads.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;
use serde_json::Value;

use super::Tools;
use crate::{
    lab::{NetPair, Process, wait_for_socket},
    workspace,
};

pub(crate) struct Agent {
    pub process: Process,
    pub socket: PathBuf,
    monitor: PathBuf,
}

impl Agent {
    /// `binary` (this build's `monitor`, or another one compared with it) as the agent;
    /// this build's queries it.
    pub fn start(
        tools: &Tools,
        binary: &Path,
        net: &NetPair,
        dir: &Path,
        first_id: u64,
        peers: u64,
        extra: &[&str],
    ) -> Result<Self> {
        let peers_file = dir.join(format!("peers-{first_id}-{peers}"));
        let mut text = String::with_capacity(peers as usize * 7);
        for id in first_id..first_id + peers {
            let _ = writeln!(text, "{id}");
        }
        std::fs::write(&peers_file, text)?;
        let socket = dir.join(format!("agent-{peers}.sock"));
        let process = Process::spawn(
            NetPair::in_ns(net.ns_monitor, binary)
                .args(["run", "--iface", net.if_monitor, "--socket"])
                .arg(&socket)
                .arg("--peers")
                .arg(&peers_file)
                .args(["--capacity", &peers.max(1024).to_string()])
                .args(extra)
                .env("RUST_LOG", "warn"),
        )?;
        wait_for_socket(&tools.monitor, &socket, &process)?;
        Ok(Self {
            process,
            socket,
            monitor: tools.monitor.clone(),
        })
    }

    /// The `stats` reply's `stats` object.
    pub fn stats(&self) -> Result<Value> {
        let out = workspace::output(
            Command::new(&self.monitor)
                .args(["query", "--json", "--socket"])
                .arg(&self.socket)
                .arg("stats"),
        )?;
        let v: Value = serde_json::from_str(out.trim())?;
        Ok(v["stats"].clone())
    }
}

/// How much the counter at `path` (`["kernel", "heartbeats"]`) grew between two `stats`
/// replies; a missing counter counts as 0.
pub(super) fn delta(before: &Value, after: &Value, path: [&str; 2]) -> f64 {
    let at = |v: &Value| v[path[0]][path[1]].as_f64().unwrap_or(0.0);
    at(after) - at(before)
}

/// Heartbeats the kernel recorded between two `stats` replies.
pub(super) fn recorded(before: &Value, after: &Value) -> u64 {
    let at = |v: &Value| v["kernel"]["heartbeats"].as_u64().unwrap_or(0);
    at(after) - at(before)
}

/// The attached program's mean ns per run between two `stats` replies (bpf_stats), None if
/// it did not run.
pub(super) fn kernel_ns_per_packet(before: &Value, after: &Value) -> Option<f64> {
    let runs = delta(before, after, ["xdp", "run_count"]);
    (runs > 0.0).then(|| delta(before, after, ["xdp", "run_time_ns"]) / runs)
}

/// As [`kernel_ns_per_packet`], over the heartbeats the kernel recorded instead of the
/// program's runs: at TC a run may record a batch (a tail call's time is its caller's run's).
pub(super) fn kernel_ns_per_heartbeat(before: &Value, after: &Value) -> Option<f64> {
    let heartbeats = delta(before, after, ["kernel", "heartbeats"]);
    (heartbeats > 0.0).then(|| delta(before, after, ["xdp", "run_time_ns"]) / heartbeats)
}
