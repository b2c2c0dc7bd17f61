//! The load generator: `monitor loadgen` (userspace sendmmsg, or `--kernel`'s live frames)
//! from the peers' namespace to the monitor's address.

use std::process::Stdio;

use anyhow::Result;
use serde_json::Value;

use super::{Rig, tools::finish_json};
use crate::lab::{NetPair, Process};

/// The real-time priority of a generator run with `Loadgen::realtime` (SCHED_FIFO): above
/// every normal thread, below the kernel's own real-time threads.
const GENERATOR_PRIORITY: &str = "10";

/// Fraction of peers a kill stops (`--kill`), for event latency.
pub(super) const KILL_FRACTION: f64 = 0.01;

/// One stream: `peers` peers at `rate_hz` each for `seconds`.
pub(super) struct Loadgen {
    /// The first peer's id; the others follow it.
    first_id: u64,
    /// `monitor loadgen --stride`: 1 sends in id order.
    stride: u64,
    peers: u64,
    rate_hz: f64,
    seconds: f64,
    /// Seconds after which `KILL_FRACTION` of the peers stop sending.
    kill_after_s: Option<f64>,
    /// The kernel generator (`--kernel`) instead of the userspace one.
    kernel: bool,
    /// One heartbeat a message (`--no-gso`) instead of batches of 64.
    no_gso: bool,
    /// Heartbeats a datagram (`--pack`); 1: one.
    pack: usize,
    /// Run at a real-time priority (`chrt -f`), so that the agent and the kernel's receive
    /// path beside it on this machine's two cores do not make it late.
    realtime: bool,
}

impl Loadgen {
    pub fn new(peers: u64, rate_hz: f64, seconds: f64) -> Self {
        Self {
            first_id: 1,
            stride: 1,
            peers,
            rate_hz,
            seconds,
            kill_after_s: None,
            kernel: false,
            no_gso: false,
            pack: 1,
            realtime: false,
        }
    }

    /// `KILL_FRACTION` of the peers fall silent `after_s` into the stream.
    pub fn kill_after(self, after_s: f64) -> Self {
        Self {
            kill_after_s: Some(after_s),
            ..self
        }
    }

    /// Peers numbered from `first_id`.
    pub fn first_id(self, first_id: u64) -> Self {
        Self { first_id, ..self }
    }

    /// Consecutive heartbeats `stride` peers apart (`monitor loadgen --stride`).
    pub fn stride(self, stride: u64) -> Self {
        Self { stride, ..self }
    }

    /// Sent by the kernel generator (`--kernel`).
    pub fn kernel_generator(self, kernel: bool) -> Self {
        Self { kernel, ..self }
    }

    /// Sent one heartbeat a message (`--no-gso`): each its own packet all the way, where a
    /// batch crosses the veth whole to a TC hook (the XDP hook makes the veth cut it).
    pub fn no_gso(self, no_gso: bool) -> Self {
        Self { no_gso, ..self }
    }

    /// Sent `pack` heartbeats back to back a datagram (`--pack`), 1 for one.
    pub fn pack(self, pack: usize) -> Self {
        Self { pack, ..self }
    }

    /// Sent at a real-time priority (`chrt -f`).
    pub fn realtime(self, realtime: bool) -> Self {
        Self { realtime, ..self }
    }

    /// Starts the stream; its report is the JSON line the generator prints when done.
    pub fn spawn(&self, rig: &Rig) -> Result<Process> {
        let mut cmd = if self.realtime {
            let mut rt = std::process::Command::new("chrt");
            rt.args([
                "-f",
                GENERATOR_PRIORITY,
                "ip",
                "netns",
                "exec",
                rig.net.ns_peers,
            ])
            .arg(&rig.tools.monitor);
            rt
        } else {
            NetPair::in_ns(rig.net.ns_peers, &rig.tools.monitor)
        };
        cmd.args([
            "loadgen",
            "--to",
            &rig.net.target(),
            "--peers",
            &self.peers.to_string(),
            "--first-id",
            &self.first_id.to_string(),
            "--stride",
            &self.stride.to_string(),
        ])
        .args([
            "--rate",
            &self.rate_hz.to_string(),
            "--duration",
            &ms(self.seconds),
        ])
        .args(self.kernel.then_some("--kernel"))
        .args(self.no_gso.then_some("--no-gso"))
        .args((self.pack > 1).then(|| format!("--pack={}", self.pack)))
        .stdout(Stdio::piped());
        if let Some(after) = self.kill_after_s {
            cmd.args(["--kill", &KILL_FRACTION.to_string(), "--after", &ms(after)]);
        }
        Process::spawn(&mut cmd)
    }

    /// The whole stream, waited for: the generator's report.
    pub fn run(&self, rig: &Rig) -> Result<Value> {
        finish_json(self.spawn(rig)?)
    }
}

/// Seconds as a whole number of milliseconds, the way the CLI reads durations.
fn ms(seconds: f64) -> String {
    format!("{}ms", (seconds * 1000.0).round() as u64)
}
