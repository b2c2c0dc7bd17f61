//! The scale runs: `peers` x `rate_hz` for a while, then the socket probe and a kill: what was
//! sent and recorded, the agent's CPU and memory, a sweep's cost, query and event latency.

use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde_json::Value;

use super::{
    Rig, Variant, agent,
    generator::{KILL_FRACTION, Loadgen},
    procfs::{map_memory_bytes, process_cpu_s, rss_anon_mib},
    tools::{finish_json, number_at as f, probe_json},
};
use crate::lab::Process;

/// Packets a second the generator sends on schedule on this machine's two cores: with UDP GSO
/// (64 heartbeats a message) one core sends about 1,000,000 (2026-12-07: 1,000,000 peers x
/// 1 Hz, 19,946,371 sent and recorded in 20 s, none more than a quarter interval late). A late
/// heartbeat is a silence to the detector: at 200,000 peers asked for 10 Hz the generator of
/// before GSO sent 1.8 Hz, late and in bursts, not the stream the row was labelled with, and
/// the agent raised a million suspect events in 10 s. Above 50,000 peers the scale runs send at
/// most this many: 200,000 x 5 Hz, 1,000,000 x 1 Hz.
const STEADY_PPS: f64 = 1_000_000.0;

/// Where the scale runs' agent serves its metrics, in the monitor's namespace: the socket
/// probe reads the agent's own timing of its requests there.
const AGENT_METRICS: &str = "127.0.0.1:9464";

/// The rate per peer of a scale run: `rate_hz`, lowered above 50,000 peers to what the
/// generator sends on schedule (50,000 x 10 Hz, the load the product is sized for, stays as
/// asked), `pack` heartbeats a datagram.
pub(super) fn scale_rate_hz(peers: u64, rate_hz: f64, pack: usize) -> f64 {
    if peers <= 50_000 {
        rate_hz
    } else {
        rate_hz.min(STEADY_PPS * pack as f64 / peers as f64)
    }
}

pub(super) struct ScaleRow {
    peers: u64,
    /// Heartbeats a datagram the generator packed (`monitor loadgen --pack`); 1: one. Packed
    /// rows' kernel ns are per heartbeat, through the program's batch path.
    pack: usize,
    /// The agent's label (`--compare`), with its leading space; empty for this build alone.
    tag: String,
    requested_pps: f64,
    achieved_pps: f64,
    sent: u64,
    recorded: u64,
    kernel_ns: f64,
    agent_cpu_pct: f64,
    rss_mib: f64,
    maps_mib: f64,
    sweep: Value,
    socket: Value,
    events: Value,
    /// Slots the agent looked at between scans, at their deadlines (`due_looks`), slot reads
    /// (`refreshes`) and floors renewed without one (`refloors`), a second over the whole run.
    due_looks_per_s: f64,
    refreshes_per_s: f64,
    refloors_per_s: f64,
    /// The generator's report of how late it sent (`lateness`: `late`, `slack_ms`,
    /// `max_late_ms`), null when it has none.
    lateness: Value,
}

pub(super) fn scale_run(
    rig: &Rig,
    variant: &Variant,
    peers: u64,
    rate_hz: f64,
    seconds: u64,
    pack: usize,
    realtime_generator: bool,
) -> Result<ScaleRow> {
    let probe = &rig.tools.probe;
    let sweep = probe_json(probe, &["sweep", "--peers", &peers.to_string()])?;
    // Told the stream's interval, as an operator tells it the peers' one: with the default
    // (100 ms) and peers sending every 800 ms, every peer crosses all three levels before its
    // second heartbeat: at 200,000 peers a start-up flood of 600k suspect events, after which
    // the kill's events reached the subscriber 35 ms after publication (p50), against 2 ms
    // when the agent was told.
    let first_interval_ms = format!("{:.0}", 1000.0 / rate_hz);
    let agent = rig.agent_as(
        variant,
        peers,
        &[
            "--metrics-addr",
            AGENT_METRICS,
            "--first-interval-ms",
            &first_interval_ms,
        ],
    )?;
    let killed = ((peers as f64 * KILL_FRACTION).round() as u64).max(1);
    // Timeline: 2 s to settle, `seconds` of steady load over which CPU is measured (nothing
    // else touches the agent then), the socket probe, the kill, 4 s for the events to land.
    let settle = 2.0;
    let seconds_f = seconds as f64;
    let probe_at = settle + seconds_f;
    let kill_at = probe_at + 4.0;
    let total = kill_at + 4.0;
    // The kill comes `kill_at` after the generator starts, which is after now: a suspicion of
    // a killed peer that crossed before this is not its death's (its first heartbeat came
    // after the agent's first look, and it was convicted at the start, say).
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64()
        * 1e3;
    let not_before_kill_ms = now_ms + kill_at * 1e3;
    // Peers listed before they first send are convicted at the start when the generator's
    // first round comes after the agent's first look: true suspicions, counted apart from
    // the steady stream's (after `settle`).
    let steady_ms = now_ms + settle * 1e3;
    let mut events = Process::spawn(
        Command::new(probe)
            .args(["events", "--socket"])
            .arg(&agent.socket)
            .args(["--expected", &(killed * 3).to_string()])
            .args(["--first-id", "1", "--last-id", &(killed + 1).to_string()])
            .args(["--timeout-s", &(seconds + 40).to_string()])
            .args([
                "--crossed-after-unix-ms",
                &not_before_kill_ms.floor().to_string(),
                "--steady-after-unix-ms",
                &steady_ms.floor().to_string(),
            ])
            .stdout(Stdio::piped()),
    )?;
    let subscribed = events.read_line()?;
    if !subscribed.contains("subscribed") {
        bail!("event probe: {subscribed}");
    }
    let before = agent.stats()?;
    let stats_from = Instant::now();
    let pid = agent.process.pid();
    let generator = Loadgen::new(peers, rate_hz, total)
        .kill_after(kill_at)
        .pack(pack)
        .realtime(realtime_generator)
        .spawn(rig)?;
    rig.interrupt.pause(Duration::from_secs_f64(settle))?;
    let (cpu0, t0) = (process_cpu_s(pid)?, Instant::now());
    rig.interrupt.pause(Duration::from_secs_f64(seconds_f))?;
    let (cpu1, wall) = (process_cpu_s(pid)?, t0.elapsed().as_secs_f64());
    let rss_mib = rss_anon_mib(pid)?;
    let maps_mib = map_memory_bytes(pid)? / (1 << 20) as f64;
    let socket = probe_json(
        probe,
        &[
            "socket",
            "--socket",
            &agent.socket.display().to_string(),
            "--peers",
            &peers.to_string(),
            "--metrics-addr",
            AGENT_METRICS,
            "--metrics-ns",
            rig.net.ns_monitor,
        ],
    )?;
    let sent = finish_json(generator)?;
    // Let the last heartbeats land before counting.
    std::thread::sleep(Duration::from_millis(200));
    let after = agent.stats()?;
    let stats_s = stats_from.elapsed().as_secs_f64();
    let per_s = |key: &str| {
        let at = |v: &Value| v[key].as_f64().unwrap_or(0.0);
        (at(&after) - at(&before)) / stats_s
    };
    let events = finish_json(events)?;
    agent.process.stop();

    Ok(ScaleRow {
        peers,
        pack,
        tag: variant.tag(),
        requested_pps: peers as f64 * rate_hz,
        achieved_pps: sent["achieved_pps"].as_f64().unwrap_or(0.0),
        lateness: sent["lateness"].clone(),
        sent: sent["sent"].as_u64().unwrap_or(0),
        recorded: agent::recorded(&before, &after),
        kernel_ns: if pack > 1 {
            agent::kernel_ns_per_heartbeat(&before, &after)
        } else {
            agent::kernel_ns_per_packet(&before, &after)
        }
        .unwrap_or(f64::NAN),
        agent_cpu_pct: (cpu1 - cpu0) / wall * 100.0,
        rss_mib,
        maps_mib,
        sweep,
        socket,
        events,
        due_looks_per_s: per_s("due_looks"),
        refreshes_per_s: per_s("refreshes"),
        refloors_per_s: per_s("refloors"),
    })
}

/// The scale runs' table: what was sent and recorded, the agent's cost, sweeps, queries, events.
pub(super) fn render_scales(rows: &[ScaleRow]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| peers | requested pps | sent pps | sent | recorded | lost | kernel ns/pkt (bpf_stats) | agent CPU % | agent RssAnon MiB | maps MiB | sweep mmap ms | sweep aya iter ms | iter/mmap | agent sweep ms | peer p50/p99 us | peer in the agent p50/p99 us | suspects p50/p99 us (n) | suspects in the agent p50/p99 us | event p50/p99 ms (n) |"
    );
    let _ = writeln!(
        t,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        // Bucket bounds of the agent's histogram (line read to reply written): the quantile is
        // at most this. Beside the client's round trip, the rest of it is the socket's two
        // wake-ups and the waits for a core.
        let in_agent = |key: &str| match &r.socket[key] {
            Value::Null => "-".to_string(),
            q => format!(
                "<= {} / <= {}",
                f(q, &["p50_at_most"]),
                f(q, &["p99_at_most"])
            ),
        };
        let (agent_peer, agent_suspects) =
            (in_agent("agent_peer_us"), in_agent("agent_suspects_us"));
        let _ = writeln!(
            t,
            "| {}{}{} | {:.0} | {:.0} | {} | {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.3} | {:.1} | {:.0}x | {:.3} | {:.0} / {:.0} | {agent_peer} | {:.0} / {:.0} ({}) | {agent_suspects} | {:.2} / {:.2} ({}) |",
            r.peers,
            r.tag,
            if r.pack > 1 {
                format!(" (packed {} a datagram: kernel ns a heartbeat)", r.pack)
            } else {
                String::new()
            },
            r.requested_pps,
            r.achieved_pps,
            r.sent,
            r.recorded,
            r.sent as i64 - r.recorded as i64,
            r.kernel_ns,
            r.agent_cpu_pct,
            r.rss_mib,
            r.maps_mib,
            f(&r.sweep, &["mmap_read_ms"]),
            f(&r.sweep, &["aya_iter_ms"]),
            f(&r.sweep, &["iter_over_mmap"]),
            f(&r.sweep, &["agent_sweep_ms"]),
            f(&r.socket, &["peer_us", "p50"]),
            f(&r.socket, &["peer_us", "p99"]),
            f(&r.socket, &["suspects_us", "p50"]),
            f(&r.socket, &["suspects_us", "p99"]),
            r.socket["suspects_us"]["count"],
            f(&r.events, &["latency_ms", "p50"]),
            f(&r.events, &["latency_ms", "p99"]),
            r.events["latency_ms"]["count"],
        );
    }
    // Where the event latency goes: raised by the sweep (`at` less `crossed_at`, ms
    // resolution) or on its way to the subscriber (received less `at`).
    let _ = writeln!(
        t,
        "\nEvent latency split: detection (the event's `at` less its `crossed_at`: the sweep; `at` is in whole ms, so this reads up to 1 ms low) and delivery (received less `at`: the socket and the subscriber), ms:\n\n\
         | peers | detection p50/p99 | delivery p50/p99 | killed peers' silence at their top level p50/p99 (level) | suspect events received, all peers (timed: the killed ones'; lagged: the times the agent told the probe it had missed events) | live peers' suspicions by level, steady (at the start: listed peers not yet sending) | heartbeats the generator sent over a quarter interval late (max ms late) | slots looked at between scans / slot reads / floors renewed, a second |\n|---:|---:|---:|---:|---:|---|---:|---:|"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "| {}{} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} ({}) | {} ({}) | {} | {} | {:.0} / {:.0} / {:.0} |",
            r.peers,
            r.tag,
            f(&r.events, &["detection_ms", "p50"]),
            f(&r.events, &["detection_ms", "p99"]),
            f(&r.events, &["delivery_ms", "p50"]),
            f(&r.events, &["delivery_ms", "p99"]),
            f(&r.events, &["silence_at_top_ms", "p50"]),
            f(&r.events, &["silence_at_top_ms", "p99"]),
            r.events["top_level"],
            r.events["events"]["suspect"],
            timed_and_lagged(&r.events),
            live_suspicions(&r.events["events"]),
            generator_late(&r.lateness),
            r.due_looks_per_s,
            r.refreshes_per_s,
            r.refloors_per_s,
        );
    }
    t
}

/// The timed events, and how often the agent told the probe it had missed events (`lagged`).
fn timed_and_lagged(events: &serde_json::Value) -> String {
    let timed = &events["latency_ms"]["count"];
    match events["events"]["lagged"].as_u64() {
        Some(n) if n > 0 => format!("{timed}; lagged {n}"),
        _ => timed.to_string(),
    }
}

/// How late the generator sent: what a live peer's suspicion may be, rather than the path's
/// or the agent's doing.
fn generator_late(lateness: &Value) -> String {
    match (lateness["late"].as_u64(), lateness["max_late_ms"].as_f64()) {
        (Some(late), Some(max)) => format!("{late} ({max:.1})"),
        _ => "-".into(),
    }
}

/// The live peers' suspicions by level in the steady stream (`live@LEVEL` in the probe's
/// counts), as `1: n, 8: m`, `none` when no live peer was suspected; then those at the start
/// (`start@LEVEL`: peers convicted before they first sent), if any.
fn live_suspicions(kinds: &serde_json::Value) -> String {
    let by_level = |prefix: &str| {
        let mut by_level: Vec<(f64, u64)> = kinds
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.parse().ok()?, v.as_u64()?)))
            .collect();
        by_level.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_level
            .iter()
            .map(|(l, n)| format!("{l}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (live, start) = (by_level("live@"), by_level("start@"));
    let live = if live.is_empty() { "none".into() } else { live };
    if start.is_empty() {
        live
    } else {
        format!("{live} (at the start {start})")
    }
}
