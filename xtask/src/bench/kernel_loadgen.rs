//! `cargo xtask bench --kernel-loadgen`: the kernel generator (`monitor loadgen --kernel`)
//! beside the userspace one into the same agent, and the scale rows only the kernel generator
//! sends: 200,000 peers x 10 Hz, 1,000,000 x 1 Hz and 1,000,000 x 10 Hz (as far as the
//! machine allows). Each row shows what was sent and recorded, whether the generator kept the
//! schedule, the kernel's cost per packet on both sides and the agent's CPU beside it.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::Value;

use super::{Rig, agent, generator::Loadgen, procfs::process_cpu_s, tools::finish_json};

/// Peers of the generators' ceiling row (the userspace ingest ceiling's count).
const CEILING_PEERS: u64 = 50_000;
/// Seconds each generator sends flat out in the ceiling row.
const CEILING_SECONDS: f64 = 3.0;
/// The scale rows: (peers, Hz per peer).
const SCALES: [(u64, f64); 3] = [(200_000, 10.0), (1_000_000, 1.0), (1_000_000, 10.0)];
/// Load before the agent's CPU is measured (every peer heard a few times).
const SETTLE_S: f64 = 3.0;

struct Ceiling {
    kernel: bool,
    sent: u64,
    recorded: u64,
    achieved_pps: f64,
    /// The receiving monitor's ns per packet (bpf_stats).
    monitor_ns: f64,
}

/// Each generator as fast as it goes, one after the other, into one agent.
fn ceiling(rig: &Rig) -> Result<Vec<Ceiling>> {
    let agent = rig.agent(CEILING_PEERS, &[])?;
    let mut rows = Vec::new();
    for kernel in [false, true] {
        let before = agent.stats()?;
        // A rate no generator reaches: each sends what it can.
        let rate = 1e9 / CEILING_PEERS as f64;
        let report = Loadgen::new(CEILING_PEERS, rate, CEILING_SECONDS)
            .kernel_generator(kernel)
            .run(rig)?;
        std::thread::sleep(Duration::from_millis(300));
        let after = agent.stats()?;
        rows.push(Ceiling {
            kernel,
            sent: report["sent"].as_u64().unwrap_or(0),
            recorded: agent::recorded(&before, &after),
            achieved_pps: report["achieved_pps"].as_f64().unwrap_or(0.0),
            monitor_ns: agent::kernel_ns_per_packet(&before, &after).unwrap_or(0.0),
        });
    }
    agent.process.stop();
    Ok(rows)
}

struct ScaleRow {
    peers: u64,
    rate_hz: f64,
    report: Value,
    recorded: u64,
    monitor_ns: f64,
    agent_cpu_pct: f64,
}

/// `peers` x `rate_hz` from the kernel generator for the settle time and `seconds`; the
/// agent's CPU over the `seconds`.
fn scale_row(rig: &Rig, peers: u64, rate_hz: f64, seconds: u64) -> Result<ScaleRow> {
    // Told the stream's interval, as the other scale runs tell it (see `scale_run`).
    let first_interval_ms = format!("{:.0}", 1000.0 / rate_hz);
    let agent = rig.agent(peers, &["--first-interval-ms", &first_interval_ms])?;
    let pid = agent.process.pid();
    let before = agent.stats()?;
    let sending = Loadgen::new(peers, rate_hz, SETTLE_S + seconds as f64 + 0.5)
        .kernel_generator(true)
        .spawn(rig)?;
    rig.interrupt.pause(Duration::from_secs_f64(SETTLE_S))?;
    let (cpu0, t0) = (process_cpu_s(pid)?, Instant::now());
    rig.interrupt.pause(Duration::from_secs(seconds))?;
    let (cpu1, wall) = (process_cpu_s(pid)?, t0.elapsed().as_secs_f64());
    let report = finish_json(sending)?;
    std::thread::sleep(Duration::from_millis(300));
    let after = agent.stats()?;
    agent.process.stop();
    Ok(ScaleRow {
        peers,
        rate_hz,
        report,
        recorded: agent::recorded(&before, &after),
        monitor_ns: agent::kernel_ns_per_packet(&before, &after).unwrap_or(0.0),
        agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
    })
}

/// The ceiling row and the scale rows, rendered.
pub(super) fn run(rig: &Rig, seconds: u64) -> Result<String> {
    if let Some(refusal) = live_frames_refused(rig)? {
        println!("==> the kernel generator: {refusal}");
        return Ok(format!(
            "The kernel generator (`monitor loadgen --kernel`) could not run: this kernel \
             refuses live frames (BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES) to root. \
             Nothing measured. The generator said: {refusal}\n"
        ));
    }
    println!("==> the generators' ceiling: userspace, then kernel, {CEILING_PEERS} peers");
    let ceiling = ceiling(rig)?;
    let mut scales = Vec::new();
    for (peers, rate_hz) in SCALES {
        rig.interrupt.check()?;
        println!("==> {peers} peers x {rate_hz} Hz from the kernel generator, {seconds} s");
        scales.push(scale_row(rig, peers, rate_hz, seconds)?);
    }
    Ok(render(&ceiling, &scales))
}

fn render(ceiling: &[Ceiling], scales: &[ScaleRow]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "The generators flat out into the monitor, {CEILING_PEERS} peers, {CEILING_SECONDS} s \
         each, same run (lost = sent - recorded):\n\n\
         | generator | sent pps | sent | recorded | lost | monitor kernel ns/pkt (bpf_stats) |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for c in ceiling {
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} | {} | {} | {:.0} |",
            if c.kernel {
                "kernel (`--kernel`)"
            } else {
                "userspace (sendmmsg)"
            },
            c.achieved_pps,
            c.sent,
            c.recorded,
            c.sent as i64 - c.recorded as i64,
            c.monitor_ns,
        );
    }
    if let [user, kernel] = ceiling {
        let _ = writeln!(
            t,
            "\nKernel generator over userspace generator: {:.1}x the packets a second",
            kernel.achieved_pps / user.achieved_pps.max(1.0)
        );
    }
    let _ = writeln!(
        t,
        "\nScale runs from the kernel generator (on schedule: every heartbeat sent within a \
         quarter of its interval of when it was due, none left; agent CPU over the steady \
         part after {SETTLE_S} s):\n\n\
         | peers | rate | requested pps | sent pps | sent | recorded | lost | on schedule (max late ms) | monitor kernel ns/pkt (bpf_stats) | generator kernel ns/frame | generator CPU % | agent CPU % |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    );
    for r in scales {
        let k = &r.report["kernel"];
        let sent = r.report["sent"].as_u64().unwrap_or(0);
        let duration = r.report["duration_s"].as_f64().unwrap_or(f64::NAN);
        let _ = writeln!(
            t,
            "| {} | {} Hz | {:.0} | {:.0} | {sent} | {} | {} | {} ({:.1}) | {:.0} | {:.0} | {:.1} | {:.2} |",
            r.peers,
            r.rate_hz,
            r.peers as f64 * r.rate_hz,
            r.report["achieved_pps"].as_f64().unwrap_or(0.0),
            r.recorded,
            sent as i64 - r.recorded as i64,
            if k["on_schedule"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            k["max_late_ms"].as_f64().unwrap_or(f64::NAN),
            r.monitor_ns,
            k["kernel_ns_per_frame"].as_f64().unwrap_or(f64::NAN),
            k["cpu_s"].as_f64().unwrap_or(f64::NAN) / duration * 100.0,
            r.agent_cpu_pct,
        );
    }
    t
}

/// The generator's refusal, where this kernel refuses live frames even to root (a sandboxed
/// 6.18 build answers EPERM; `monitor loadgen --kernel` then fails at once and says so): one
/// peer for 100 ms, nothing on the other end. Any other failure is an error of the run.
fn live_frames_refused(rig: &Rig) -> Result<Option<String>> {
    let out = crate::lab::NetPair::in_ns(rig.net.ns_peers, &rig.tools.monitor)
        .args(["loadgen", "--kernel", "--to", &rig.net.target()])
        .args(["--peers", "1", "--rate", "10", "--duration", "100ms"])
        .stdin(std::process::Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(None);
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if stderr.contains("refuses live frames") {
        return Ok(Some(stderr));
    }
    anyhow::bail!("monitor loadgen --kernel failed: {stderr}")
}
