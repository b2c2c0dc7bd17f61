//! The same stream into the XDP path with the agent and into a userspace UDP receiver doing
//! the same statistics: receive-side and machine CPU per heartbeat of each.

use std::{fmt::Write as _, process::Stdio, time::Duration};

use anyhow::Result;

use super::{
    Rig, agent,
    generator::Loadgen,
    procfs::{process_cpu_s, system_busy_s},
    tools::finish_json,
};
use crate::lab::{NetPair, Process};

pub(super) struct Paths {
    pps: f64,
    xdp: (u64, u64, f64, f64),
    socket: (u64, u64, f64, f64),
}

/// The same stream into (a) the XDP path and the agent, (b) a userspace UDP receiver feeding
/// the same statistics. Receive-side CPU: for XDP the program's own run time (bpf_stats) plus
/// the agent's CPU; for the socket path the receiver process's CPU (its syscalls, copies,
/// parsing, statistics). The kernel's softirq work before either is charged to the sender here
/// (no IRQ time accounting) and is left out of both; the socket path's is the larger of the two,
/// so the ratio is conservative. Machine-wide busy time is reported beside it.
pub(super) fn path_comparison(rig: &Rig, peers: u64, seconds: u64) -> Result<Paths> {
    let pps = 200_000.0_f64.min(peers as f64 * 10.0);
    let rate = pps / peers as f64;

    let agent = rig.agent(peers, &[])?;
    let before = agent.stats()?;
    let pid = agent.process.pid();
    let (cpu0, busy0) = (process_cpu_s(pid)?, system_busy_s()?);
    let sent = Loadgen::new(peers, rate, seconds as f64).run(rig)?;
    std::thread::sleep(Duration::from_millis(200));
    let (cpu1, busy1) = (process_cpu_s(pid)?, system_busy_s()?);
    let after = agent.stats()?;
    agent.process.stop();
    let runtime_s = agent::delta(&before, &after, ["xdp", "run_time_ns"]) / 1e9;
    let xdp = (
        sent["sent"].as_u64().unwrap_or(0),
        agent::recorded(&before, &after),
        runtime_s + (cpu1 - cpu0),
        busy1 - busy0,
    );

    let busy0 = system_busy_s()?;
    let receiver = Process::spawn(
        NetPair::in_ns(rig.net.ns_monitor, &rig.tools.probe)
            .args([
                "receiver",
                "--bind",
                &rig.net.target(),
                "--duration-s",
                &seconds.to_string(),
            ])
            .stdout(Stdio::piped()),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let sent = Loadgen::new(peers, rate, seconds as f64).run(rig)?;
    let received = finish_json(receiver)?;
    let busy1 = system_busy_s()?;
    let socket = (
        sent["sent"].as_u64().unwrap_or(0),
        received["received"].as_u64().unwrap_or(0),
        received["cpu_s"].as_f64().unwrap_or(f64::NAN),
        busy1 - busy0,
    );
    Ok(Paths { pps, xdp, socket })
}

/// The receive paths' table, with its heading.
pub(super) fn render_paths(paths: &Paths) -> String {
    let mut t = String::new();
    let per_m = |cpu: f64, n: u64| cpu / n.max(1) as f64 * 1e6;
    let (xs, xr, xcpu, xbusy) = paths.xdp;
    let (ss, sr, scpu, sbusy) = paths.socket;
    let _ = writeln!(
        t,
        "\nThe same stream ({:.0} pps) into each receive path:\n",
        paths.pps
    );
    let _ = writeln!(
        t,
        "| path | sent | received | receive-side CPU s per 1M | machine busy CPU s per 1M |"
    );
    let _ = writeln!(t, "|---|---:|---:|---:|---:|");
    let _ = writeln!(
        t,
        "| XDP + agent | {xs} | {xr} | {:.3} | {:.3} |",
        per_m(xcpu, xr),
        per_m(xbusy, xs)
    );
    let _ = writeln!(
        t,
        "| UDP socket + same statistics | {ss} | {sr} | {:.3} | {:.3} |",
        per_m(scpu, sr),
        per_m(sbusy, ss)
    );
    let _ = writeln!(
        t,
        "\nReceive-side CPU per heartbeat, socket path over XDP path: {:.1}x",
        per_m(scpu, sr) / per_m(xcpu, xr)
    );
    t
}
