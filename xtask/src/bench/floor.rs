//! The floor comparison: the same stream into the floor program (a parse-to-UDP-port-and-drop XDP
//! program, alone and with a clock read per packet), the monitor (at XDP, at TC ingress, without
//! the destination check, and with ids found through the keyed hash rather than in their own hot
//! lines) and
//! the userspace socket path, beside the floor + clock touching per-peer state line by line as a
//! heartbeat does (the first of them, one line read and written, is the limit), by
//! BPF_PROG_TEST_RUN and live.

use std::{fmt::Write as _, process::Stdio, time::Duration};

use anyhow::{Result, bail};
use serde_json::Value;

use super::{
    RATE_HZ, Rig, Variant, agent,
    generator::Loadgen,
    procfs::system_busy_s,
    tools::{finish_json, probe_json},
};
use crate::lab::{NetPair, Process};

/// Per peer, in the floor comparison's hot row at 1,000 peers: 300 Hz keeps the stream (300k
/// packets a second) under what the generator sends on two cores. At this rate every slot is touched often enough to stay in cache, so the row
/// measures the program's own work. At 10 Hz (10k packets a second) a packet comes every
/// 100 us and finds its slot, the index line and the program's maps cold, whichever program
/// it is: that row measures cache misses between packets as much as the program.
const HOT_RATE_HZ: f64 = 300.0;

/// Per peer, in the floor comparison's row at 1,000,000 peers (with `--scales 1000000`): a
/// million packets a second, what the userspace generator sends on schedule here with UDP GSO
/// (8.0M of 8.0M in 8 s for every receiver, 2026-12-07). Each peer's state is touched every
/// second, by then long gone from every cache, as at 10 Hz.
const MILLION_RATE_HZ: f64 = 1.0;

/// How far apart consecutive heartbeats of the floor comparison's stream are, in peers
/// (`monitor loadgen --stride`; a prime that divides neither peer count): real senders'
/// phases scatter their heartbeats over the peers' slots, where a stream in id order walks
/// them in order and lets the CPU's prefetchers fetch the next slot ahead.
const STRIDE: u64 = 7919;

/// The first id of `FloorRow::monitor_indexed`'s peers: past 2^32, so none has a hot line of
/// its own (`monitor_common::index::own_line`) and each is found through the keyed hash.
const INDEXED_FIRST_ID: u64 = (1 << 32) + 1;

/// One receiver of the floor comparison: what it cost per packet.
struct Receiver {
    sent: u64,
    /// Kernel ns per packet from bpf_stats (XDP programs only).
    kernel_ns: Option<f64>,
    /// Busy CPU seconds of the whole machine per million packets sent (sender included, the
    /// same for every receiver).
    machine_s_per_m: f64,
}

/// The floor + clock touching per-peer state as a heartbeat does (`hbm-bench floor --touch`):
/// the probe's name for it and the row's.
const TOUCHES: [(&str, &str); 9] = [
    (
        "hot",
        "floor + clock + the hot line (read and written), 704-byte slots (the monitor's layout before 15)",
    ),
    (
        "stores",
        "floor + clock + the hot line + the monitor's three stores, 704-byte slots (layout before 15)",
    ),
    (
        "split-hot",
        "floor + clock + the hot line, hot lines in a table of their own (the monitor's layout since 15)",
    ),
    (
        "split-stores",
        "floor + clock + the hot line + the three stores, hot lines in a table of their own (layout 15)",
    ),
    (
        "split-locked",
        "the same, the hot line taken with a locked compare-and-swap as the monitor's lock is (layout 15)",
    ),
    (
        "packed32",
        "floor + clock + 32 bytes of hot state a peer, two to a line (half the monitor's hot line: 1.6 MB at 50,000 peers)",
    ),
    (
        "packed32-stores",
        "floor + clock + 32 bytes of hot state a peer and the three stores into the peer's other lines",
    ),
    (
        "packed16",
        "floor + clock + 16 bytes of hot state a peer, four to a line (0.8 MB at 50,000 peers)",
    ),
    (
        TOLD_TOUCH,
        "the same, and the kernel's half of an agent told when to look: the peer's watch loaded, its due bucket stored (2 bytes a peer)",
    ),
];

/// The entry of [`TOUCHES`] whose stream also measures the agent's half of a design in which
/// the kernel tells the agent when to look (`FloorRow::told`).
const TOLD_TOUCH: &str = "split-due";

/// How often the agent told when to look scans the due buckets: under the 38 ms a 10 Hz
/// sender's floor (138 ms with the defaults, the floor program's) leaves past its next
/// heartbeat, so a peer heard on time has moved its bucket on before any scan takes it.
const TOLD_SCAN_MS: u32 = 30;

/// The scans beside the stream of [`TOLD_TOUCH`], each `hbm-bench`'s report: the words
/// scanned every 50 ms as the agent does today (`scan-floor` over the floor program's words),
/// and the due buckets every [`TOLD_SCAN_MS`] (`due-scan-floor`).
struct Told {
    words: Value,
    due: Value,
}

struct FloorRow {
    peers: u64,
    pps: f64,
    floor: Receiver,
    /// The floor that also reads the clock for each packet it drops.
    floor_clock: Receiver,
    /// The floor + clock touching state, one receiver per entry of [`TOUCHES`].
    touching: Vec<Receiver>,
    /// At 10 Hz, the scans beside the stream of [`TOLD_TOUCH`].
    told: Option<Told>,
    monitor: Receiver,
    /// The monitor at TC ingress (`--hook tc`), kernel ns from its TC program's run stats, on
    /// the same stream sent one heartbeat a packet (`--no-gso`), as a NIC delivers it: a veth
    /// with no XDP program passes a GSO batch whole, which the TC hook records in one run.
    monitor_tc: Receiver,
    /// The same on the stream as sent to the others (GSO batches of 64, whole at TC), kernel
    /// ns per heartbeat: the first recorded by `monitor_tc`, the rest by `monitor_tc_batch`
    /// (a tail call, one bpf_loop step each), both in the run's time.
    monitor_tc_batched: Receiver,
    /// The monitor without the destination check (`--listen-addr any`): what the check costs
    /// is the difference to `monitor`, which checks against the interface's addresses.
    monitor_any: Receiver,
    /// The monitor on the same peers sent to in id order (stride 1): what a stream the
    /// prefetchers can follow flatters.
    monitor_in_order: Receiver,
    /// The monitor with peers whose ids have no hot line of their own (`INDEXED_FIRST_ID` on):
    /// every heartbeat probes the hashed lines from its home (one line in most cases, and the
    /// lines are scattered over a table twice the capacity). `monitor`'s peers are
    /// numbered from 1, each in its own line, dense: what the own lines save is the difference.
    monitor_indexed: Receiver,
    /// The agents of `--compare` (another build, or this one with flags), each on the same
    /// stream as `monitor`: (label, receiver).
    compared: Vec<(String, Receiver)>,
    socket: Receiver,
    /// The probe's `limit` at this row's peers: one dependent miss over their state timed in
    /// userspace, and what a heartbeat touches of it.
    limit: Value,
}

impl FloorRow {
    /// One dependent miss over this row's peers' state, ns.
    fn miss_ns(&self) -> Option<f64> {
        self.limit["ns_per_miss"].as_f64()
    }

    /// The limit of a heartbeat at this row: the floor + clock reading and writing back the
    /// hot line of the peer each heartbeat names, in the same stream (`TOUCHES[0]`). The
    /// least a detector that keeps a line of state per peer can do with a heartbeat: parse,
    /// read the clock, update the peer's line. (The userspace chase, `miss_ns`, is reported
    /// beside it: it times the miss alone, but as a CPU's thread, not the kernel's program.)
    fn limit_ns(&self) -> Option<f64> {
        self.touching.first()?.kernel_ns
    }
}

/// The floor program's TEST_RUN and live rows beside the monitor's, rendered: 1,000 peers
/// twice (at the hot-cache rate and at the scale runs' 10 Hz), 50,000 peers and 1,000,000,
/// those of them that are among `scales`.
pub(super) fn floor_table(
    rig: &Rig,
    scales: &[u64],
    seconds: u64,
    monitor_test_run_ns: f64,
) -> Result<String> {
    println!("==> the floor program, the monitor and the socket path, same stream");
    let test_run_ns = |args: &[&str]| -> Result<f64> {
        Ok(probe_json(&rig.tools.probe, args)?["ns_per_packet"]
            .as_f64()
            .unwrap_or(f64::NAN))
    };
    let floor_test_run_ns = test_run_ns(&["floor-test-run"])?;
    let floor_clock_test_run_ns = test_run_ns(&["floor-test-run", "--clock"])?;
    let touching_test_run_ns = TOUCHES
        .iter()
        .map(|(touch, _)| test_run_ns(&["floor-test-run", "--clock", "--touch", touch]))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    for (peers, rate_hz) in [
        (1000u64, HOT_RATE_HZ),
        (1000, RATE_HZ),
        (50_000, RATE_HZ),
        (1_000_000, MILLION_RATE_HZ),
    ] {
        if scales.contains(&peers) {
            rig.interrupt.check()?;
            rows.push(floor_comparison(rig, peers, rate_hz, seconds)?);
        }
    }
    Ok(render_floor(
        [
            floor_test_run_ns,
            floor_clock_test_run_ns,
            monitor_test_run_ns,
        ],
        &touching_test_run_ns,
        &rows,
    ))
}

/// The same stream (`peers` x `rate_hz` for `seconds`) into the floor program (alone and with
/// a clock read per packet), the monitor (at XDP, at TC ingress with `--hook tc`, and at XDP
/// without the destination check) and the userspace socket path, one after another in this
/// run: the monitor's cost as a multiple of the least any XDP program pays, and of what the
/// socket path pays.
fn floor_comparison(rig: &Rig, peers: u64, rate_hz: f64, seconds: u64) -> Result<FloorRow> {
    let (tools, net) = (rig.tools, rig.net);
    let stream = Loadgen::new(peers, rate_hz, seconds as f64).stride(STRIDE);
    let pps = peers as f64 * rate_hz;
    let per_m = |busy: f64, sent: u64| busy / sent.max(1) as f64 * 1e6;

    // The floor, attached by the probe for the stream's length and a little more; for
    // `TOLD_TOUCH` at 10 Hz, with the two scans beside the stream from 1 s in.
    let told_scans = rate_hz == RATE_HZ && seconds >= 3;
    let floor_with = |clock: bool, touch: &str| -> Result<(Receiver, Option<Told>)> {
        let mut probe = Process::spawn(
            NetPair::in_ns(net.ns_monitor, &tools.probe)
                .args(["floor", "--iface", net.if_monitor, "--duration-s"])
                .arg((seconds as f64 + 1.5).to_string())
                .args(clock.then_some("--clock"))
                .args(["--touch", touch, "--peers", &peers.to_string()])
                .stdout(Stdio::piped()),
        )?;
        let line = probe.read_line()?;
        if !line.contains("attached") {
            bail!("floor probe: {line}");
        }
        let busy0 = system_busy_s()?;
        let generator = stream.spawn(rig)?;
        let told = if touch == TOLD_TOUCH && told_scans {
            std::thread::sleep(Duration::from_secs(1));
            let scan = |args: &[&str], interval_ms: u32| {
                Process::spawn(
                    std::process::Command::new(&tools.probe)
                        .args(args)
                        .args(["--peers", &peers.to_string(), "--interval-ms"])
                        .arg(interval_ms.to_string())
                        .args(["--seconds", &(seconds - 2).to_string()])
                        .stdout(Stdio::piped()),
                )
            };
            let words = scan(&["scan-floor", "--map", "FLOOR_LAST_HEARD"], 50)?;
            let due = scan(&["due-scan-floor"], TOLD_SCAN_MS)?;
            Some(Told {
                words: finish_json(words)?,
                due: finish_json(due)?,
            })
        } else {
            None
        };
        let sent = finish_json(generator)?;
        let busy1 = system_busy_s()?;
        let stats = finish_json(probe)?;
        let sent_n = sent["sent"].as_u64().unwrap_or(0);
        let runs = stats["run_count"].as_f64().unwrap_or(0.0);
        let receiver = Receiver {
            sent: sent_n,
            kernel_ns: (runs > 0.0).then(|| stats["run_time_ns"].as_f64().unwrap_or(0.0) / runs),
            machine_s_per_m: per_m(busy1 - busy0, sent_n),
        };
        Ok((receiver, told))
    };
    let (floor, _) = floor_with(false, "none")?;
    let (floor_clock, _) = floor_with(true, "none")?;
    let mut told = None;
    let mut touching = Vec::new();
    for (touch, _) in TOUCHES {
        let (receiver, scans) = floor_with(true, touch)?;
        touching.push(receiver);
        told = told.or(scans);
    }

    // The agent's `xdp` stats are the attached program's: the TC classifier with --hook tc.
    // `no_gso`: sent one heartbeat a message; `per_heartbeat`: kernel ns over the heartbeats
    // recorded, not over the program's runs (a batch is one run).
    let monitor_with = |variant: &Variant,
                        first_id: u64,
                        stride: u64,
                        extra: &[&str],
                        no_gso: bool,
                        per_heartbeat: bool| {
        let agent = rig.agent_from(variant, first_id, peers, extra)?;
        let before = agent.stats()?;
        let busy0 = system_busy_s()?;
        let sent = Loadgen::new(peers, rate_hz, seconds as f64)
            .first_id(first_id)
            .stride(stride)
            .no_gso(no_gso)
            .run(rig)?;
        std::thread::sleep(Duration::from_millis(200));
        let busy1 = system_busy_s()?;
        let after = agent.stats()?;
        agent.process.stop();
        let sent_n = sent["sent"].as_u64().unwrap_or(0);
        let kernel_ns = if per_heartbeat {
            agent::kernel_ns_per_heartbeat(&before, &after)
        } else {
            agent::kernel_ns_per_packet(&before, &after)
        };
        Ok::<_, anyhow::Error>(Receiver {
            sent: sent_n,
            kernel_ns,
            machine_s_per_m: per_m(busy1 - busy0, sent_n),
        })
    };
    let monitor_as = |variant: &Variant, first_id: u64, stride: u64, extra: &[&str]| {
        monitor_with(variant, first_id, stride, extra, false, false)
    };
    let monitor_from = |first_id: u64, stride: u64, extra: &[&str]| {
        monitor_as(&Variant::this_build(), first_id, stride, extra)
    };
    let monitor = monitor_from(1, STRIDE, &[])?;
    let tc = ["--hook", "tc"];
    let monitor_tc = monitor_with(&Variant::this_build(), 1, STRIDE, &tc, true, false)?;
    let monitor_tc_batched = monitor_with(&Variant::this_build(), 1, STRIDE, &tc, false, true)?;
    let monitor_any = monitor_from(1, STRIDE, &["--listen-addr", "any"])?;
    let monitor_in_order = monitor_from(1, 1, &[])?;
    let monitor_indexed = monitor_from(INDEXED_FIRST_ID, STRIDE, &[])?;
    // Run without --compare, `variants` is this build alone, already measured as `monitor`.
    let compared = rig
        .variants
        .iter()
        .filter(|v| !v.label.is_empty())
        .map(|v| Ok((v.label.clone(), monitor_as(v, 1, STRIDE, &[])?)))
        .collect::<Result<Vec<_>>>()?;

    let receiver = Process::spawn(
        NetPair::in_ns(net.ns_monitor, &tools.probe)
            .args(["receiver", "--bind", &net.target(), "--duration-s"])
            .arg((seconds + 1).to_string())
            .stdout(Stdio::piped()),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let busy0 = system_busy_s()?;
    let sent = stream.run(rig)?;
    let busy1 = system_busy_s()?;
    let _ = finish_json(receiver)?;
    let sent_n = sent["sent"].as_u64().unwrap_or(0);
    let socket = Receiver {
        sent: sent_n,
        kernel_ns: None,
        machine_s_per_m: per_m(busy1 - busy0, sent_n),
    };
    let limit = probe_json(&tools.probe, &["limit", "--peers", &peers.to_string()])?;
    Ok(FloorRow {
        peers,
        pps,
        floor,
        floor_clock,
        touching,
        told,
        monitor,
        monitor_tc,
        monitor_tc_batched,
        monitor_any,
        monitor_in_order,
        monitor_indexed,
        compared,
        socket,
        limit,
    })
}

/// Rows of the floor table with names of their own.
fn plain<'a>(rows: &[(&str, &'a Receiver)]) -> Vec<(String, &'a Receiver)> {
    rows.iter()
        .map(|(name, x)| (name.to_string(), *x))
        .collect()
}

/// `test_run_ns`: the floor's, the floor's with the clock, and the monitor's; `touching_ns`:
/// the floor + clock's touching state, one per entry of [`TOUCHES`].
fn render_floor(test_run_ns: [f64; 3], touching_ns: &[f64], rows: &[FloorRow]) -> String {
    let [floor, clock, monitor] = test_run_ns;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Against the floor (a parse-to-UDP-port-and-drop XDP program) and the floor + clock (the \
         same, reading the clock for each packet it drops, as the monitor does for each \
         heartbeat), same stream, same run (consecutive heartbeats {STRIDE} peers apart, as \
         senders' phases scatter them, but for the row in id order):\n\n\
         BPF_PROG_TEST_RUN, one IPv4 heartbeat: floor {floor:.0} ns, floor + clock {clock:.0} ns \
         ({:.1}x), monitor {monitor:.0} ns ({:.1}x the floor, {:.1}x the floor + clock)\n",
        clock / floor,
        monitor / floor,
        monitor / clock,
    );
    let _ = writeln!(
        t,
        "BPF_PROG_TEST_RUN, the floor + clock touching one peer's state as a heartbeat does \
         (hot caches: the instructions alone): {}\n",
        TOUCHES
            .iter()
            .zip(touching_ns)
            .map(|((touch, _), ns)| format!("{touch} {ns:.0} ns"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        t,
        "The rows \"floor + clock + ...\" are the floor program touching the per-peer state \
         of the peer each heartbeat names, line by line as an accepted heartbeat does and \
         nothing else (`hbm-bench floor --touch`): what each line costs in this stream, in the \
         monitor's layout before version 15 (a peer in one 704-byte slot) and in its layout \
         since (the hot lines in a table of their own, the rest in slots after it).\n"
    );
    let _ = writeln!(
        t,
        "The limit: the floor + clock reading and writing back one line of per-peer state, the \
         hot line of the peer each heartbeat names, in 704-byte slots (the layout before 15), on the same \
         stream (the row \"floor + clock + the hot line\"); \"x limit\" is each receiver \
         against it. Beside it, one dependent miss timed in userspace over a table the size of \
         the peers' kernel state (a pointer chase over 4 KiB pages, `hbm-bench limit`).\n"
    );
    let _ = writeln!(
        t,
        "| peers | pps | receiver | sent | kernel ns/pkt (bpf_stats) | x floor | x floor + clock | x limit | machine CPU-s per 1M pkts | x floor |"
    );
    let _ = writeln!(t, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        if let (Some(clock), Some(miss)) = (r.floor_clock.kernel_ns, r.miss_ns()) {
            let mib = r.limit["table_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
            let chase = clock + miss;
            let _ = writeln!(
                t,
                "| {} | {:.0} | floor + clock + one miss timed in userspace ({miss:.0} ns over {mib:.1} MiB) | - | {chase:.0} | {} | {:.1}x | {} | - | - |",
                r.peers,
                r.pps,
                r.floor
                    .kernel_ns
                    .map_or("-".into(), |f| format!("{:.1}x", chase / f)),
                chase / clock,
                r.limit_ns()
                    .map_or("-".into(), |l| format!("{:.1}x", chase / l)),
            );
        }
        let touching = TOUCHES
            .iter()
            .zip(&r.touching)
            .map(|((_, name), x)| (name.to_string(), x));
        let compared = r
            .compared
            .iter()
            .map(|(label, x)| (format!("monitor ({label})"), x));
        for (name, x) in plain(&[("floor", &r.floor), ("floor + clock", &r.floor_clock)])
            .into_iter()
            .chain(touching)
            .chain(plain(&[("monitor", &r.monitor)]))
            .chain(compared)
            .chain(plain(&[
                (
                    "monitor --hook tc (one heartbeat a packet, `loadgen --no-gso`: its sender's CPU is not the others')",
                    &r.monitor_tc,
                ),
                (
                    "monitor --hook tc, GSO batches of 64 (ns per heartbeat)",
                    &r.monitor_tc_batched,
                ),
                ("monitor --listen-addr any", &r.monitor_any),
                ("monitor, peers sent to in id order", &r.monitor_in_order),
                ("monitor, ids through the index", &r.monitor_indexed),
                ("socket path", &r.socket),
            ]))
        {
            let ns = x.kernel_ns.map_or("-".into(), |v| format!("{v:.0}"));
            let ns_ratio = |to: &Receiver| match (x.kernel_ns, to.kernel_ns) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                _ => "-".into(),
            };
            let limit_ratio = match (x.kernel_ns, r.limit_ns()) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                _ => "-".into(),
            };
            let _ = writeln!(
                t,
                "| {} | {:.0} | {name} | {} | {ns} | {} | {} | {limit_ratio} | {:.3} | {:.2}x |",
                r.peers,
                r.pps,
                x.sent,
                ns_ratio(&r.floor),
                ns_ratio(&r.floor_clock),
                x.machine_s_per_m,
                x.machine_s_per_m / r.floor.machine_s_per_m,
            );
        }
    }
    render_told(&mut t, rows);
    if let Some(touched) = rows.first().map(|r| &r.limit["touched"]) {
        let n = |k: &str| touched[k].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "\nPer-peer state one accepted, in-order heartbeat touches: {} lines read ({} bytes: \
             the peer's hot line, each peer in its own line), {} lines written ({} bytes; {} of them \
             stored into without being read: the source address, the ring entry, the last-heard \
             word); the hot state is {} bytes a peer ({:.1} MiB at 50,000 peers).",
            n("lines_read"),
            n("bytes_read"),
            n("lines_written"),
            n("bytes_written"),
            n("lines_stored_only"),
            n("hot_bytes_per_peer"),
            n("hot_bytes_per_peer") as f64 * 50_000.0 / (1 << 20) as f64,
        );
    }
    t.push('\n');
    t
}

/// The scans beside the stream of [`TOLD_TOUCH`]: what an agent told by the kernel when to look
/// pays to find the peers to look at, against the scan of the words every agent that is not
/// told pays, with the kernel's cost of telling beside them.
fn render_told(t: &mut String, rows: &[FloorRow]) {
    if rows.iter().all(|r| r.told.is_none()) {
        return;
    }
    let _ = writeln!(
        t,
        "\nAn agent the kernel tells when to look (docs/tuning.md, \"An agent the kernel tells \
         when to look\"), on the stream of the row \"{TOLD_TOUCH}\": the kernel stores with \
         each heartbeat the 4 ms bucket in which the peer's floor passes (138 ms, a 10 Hz \
         sender's), and the agent scans those buckets every {TOLD_SCAN_MS} ms for the peers \
         due before its next scan (`hbm-bench due-scan-floor`), against the scan of the \
         last-heard words every 50 ms that the agent does today (`hbm-bench scan-floor`, on \
         the floor program's words). Both scans ran at once beside the stream; CPU is each \
         process's own. \"taken\" are the peers a scan hands on to be looked at: for the words, \
         every one heard since the last scan; for the buckets, only those whose floor comes \
         before the next scan.\n"
    );
    let _ = writeln!(
        t,
        "| peers | pps | scan | every | CPU % of a core | scan p50 us | taken/s | kernel ns/pkt: split-locked, {TOLD_TOUCH} |"
    );
    let _ = writeln!(t, "|---:|---:|---|---:|---:|---:|---:|---|");
    let locked = TOUCHES.iter().position(|(n, _)| *n == "split-locked");
    let told_at = TOUCHES.iter().position(|(n, _)| *n == TOLD_TOUCH);
    for r in rows {
        let Some(told) = &r.told else { continue };
        let ns = |i: Option<usize>| {
            i.and_then(|i| r.touching.get(i)?.kernel_ns)
                .map_or("-".into(), |v| format!("{v:.0}"))
        };
        let kernel = format!("{}, {}", ns(locked), ns(told_at));
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        for (name, v, taken) in [
            (
                "last-heard words, 8 bytes a peer",
                &told.words,
                "changed_per_s",
            ),
            ("due buckets, 2 bytes a peer", &told.due, "taken_per_s"),
        ] {
            let _ = writeln!(
                t,
                "| {} | {:.0} | {name} | {:.0} ms | {:.2} | {:.0} | {:.0} | {kernel} |",
                r.peers,
                r.pps,
                f(v, "interval_ms"),
                f(v, "cpu_percent"),
                f(v, "scan_us_p50"),
                f(v, taken),
            );
        }
    }
}
