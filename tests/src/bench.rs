//! Measurements for `cargo xtask bench`, run by the `hbm-bench` binary (and, at small scale
//! and for correctness only, by the smoke test). Each returns numbers; the xtask prints them.

use std::{
    collections::HashMap,
    os::fd::AsFd,
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    maps::Array,
    programs::{TestRun, TestRunOptions},
};
use monitor::{
    agent::{Agent, AgentParts, LiveProgram},
    detector::{levels::Levels, model::DetectorParams, tracker::DetectorConfig},
    kernel::clock::monotonic_ns,
    kernel::loaded::LoadedProgram,
    kernel::maps::KernelMaps,
    kernel::program,
    serving::client::Client,
};
use monitor_common::{
    config::XdpConfig,
    maps::{PEER_STATE_MAP, PeerSlot},
    wire::HeartbeatHeader,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::packet::Packet;

/// p50 and p99 of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if values.is_empty() {
                f64::NAN
            } else {
                values[((values.len() as f64 - 1.0) * q).round() as usize]
            }
        };
        Self {
            count: values.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// Mean ns of one run of `xdp` on `packet`, by BPF_PROG_TEST_RUN (the kernel times `repeat`
/// runs of the same packet and reports the mean).
fn test_run_ns(xdp: &mut aya::programs::Xdp, packet: &[u8], repeat: u32) -> f64 {
    xdp.test_run(TestRunOptions {
        data_in: Some(packet),
        repeat,
        ..TestRunOptions::default()
    })
    .expect("BPF_PROG_TEST_RUN")
    .duration
    .as_nanos() as f64
}

/// The monitor's program loaded with logging at `log`, peer 7 admitted (the peer of the
/// heartbeat every TEST_RUN figure here sends).
fn monitor_with_peer_7(log: program::KernelLog) -> LoadedProgram {
    let mut loaded = LoadedProgram::load_pinned(&XdpConfig::DEFAULT, 16, None, log).expect("load");
    loaded
        .maps
        .registry
        .admit(&loaded.maps.table, 7, monotonic_ns())
        .expect("admit");
    loaded
}

/// Average cost of one heartbeat through the XDP program, by BPF_PROG_TEST_RUN.
pub fn prog_test_run_ns(repeat: u32) -> f64 {
    let mut loaded = monitor_with_peer_7(program::KernelLog::Off);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(
        program::xdp_mut(&mut loaded.ebpf).expect("xdp"),
        &packet,
        repeat,
    )
}

/// The floor program (monitor-ebpf/src/floor.rs) loaded and verified, matching `port`; not
/// attached. With `clock`, it reads the clock for every packet it drops.
pub fn load_floor(port: u16, clock: bool) -> aya::Ebpf {
    assert!(
        !program::FLOOR_OBJECT.is_empty(),
        "built without the eBPF programs"
    );
    let mut ebpf = aya::EbpfLoader::new()
        .override_global("FLOOR_PORT", &port, true)
        .override_global("FLOOR_CLOCK", &u8::from(clock), true)
        .load(program::FLOOR_OBJECT)
        .expect("load the floor program");
    let xdp: &mut aya::programs::Xdp = ebpf
        .program_mut("floor")
        .expect("floor in the object")
        .try_into()
        .expect("an XDP program");
    xdp.load().expect("verify the floor program");
    ebpf
}

fn floor_xdp(ebpf: &mut aya::Ebpf) -> &mut aya::programs::Xdp {
    ebpf.program_mut("floor")
        .expect("floor")
        .try_into()
        .expect("XDP")
}

/// The floor's cost per packet by BPF_PROG_TEST_RUN, on the heartbeat `prog_test_run_ns` uses.
pub fn floor_test_run_ns(repeat: u32, clock: bool) -> f64 {
    let mut ebpf = load_floor(monitor_common::wire::DEFAULT_PORT, clock);
    let packet = Packet::heartbeat_v4(7, 1).build();
    test_run_ns(floor_xdp(&mut ebpf), &packet, repeat)
}

/// Attaches the floor to `iface` (in the caller's namespace), calls `attached`, keeps it there
/// for `duration`, and returns the kernel's run statistics of that time (bpf_stats).
pub fn floor_attached(
    iface: &str,
    port: u16,
    clock: bool,
    duration: Duration,
    attached: impl FnOnce(),
) -> program::RunStats {
    let mut ebpf = load_floor(port, clock);
    let xdp = floor_xdp(&mut ebpf);
    xdp.attach(iface, aya::programs::XdpMode::default())
        .expect("attach the floor");
    let fd = xdp
        .fd()
        .expect("fd")
        .as_fd()
        .try_clone_to_owned()
        .expect("dup");
    attached();
    std::thread::sleep(duration);
    program::run_stats(fd.as_fd()).expect("run stats")
}

/// What `--kernel-log` costs, by BPF_PROG_TEST_RUN: ns per run of a valid heartbeat (the hot
/// path, which logs nothing) and of a malformed one (a cold path that logs at warn), with the
/// program loaded with logging off and at debug.
#[derive(Debug, Clone, Serialize)]
pub struct KernelLogCost {
    pub heartbeat_off_ns: f64,
    pub heartbeat_debug_ns: f64,
    pub malformed_off_ns: f64,
    pub malformed_debug_ns: f64,
}

pub fn kernel_log_cost(repeat: u32) -> KernelLogCost {
    let run = |log: program::KernelLog, malformed: bool| {
        let mut loaded = monitor_with_peer_7(log);
        let mut packet = Packet::heartbeat_v4(7, 1).build();
        if malformed {
            // The UDP payload cut to 3 bytes: addressed to the port, too short for a header.
            packet.truncate(packet.len() - monitor_common::wire::HEADER_LEN + 3);
        }
        test_run_ns(
            program::xdp_mut(&mut loaded.ebpf).expect("xdp"),
            &packet,
            repeat,
        )
    };

    use program::KernelLog::{Debug, Off};
    KernelLogCost {
        heartbeat_off_ns: run(Off, false),
        heartbeat_debug_ns: run(Debug, false),
        malformed_off_ns: run(Off, true),
        malformed_debug_ns: run(Debug, true),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepTimings {
    pub peers: u32,
    /// Reading every peer's record through the mmap, ms (median of runs).
    pub mmap_read_ms: f64,
    /// The agent's whole sweep (read, compare deadlines), ms (median of runs).
    pub agent_sweep_ms: f64,
    /// Reading the same array through aya's map iterator (a syscall per entry), ms.
    pub aya_iter_ms: f64,
    pub iter_over_mmap: f64,
}

fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A full pass over `peers` peers: mmap against aya's iterator, in the same process and run.
pub fn sweep_timings(peers: u32) -> SweepTimings {
    let loaded = LoadedProgram::load(&XdpConfig::DEFAULT, peers).expect("load");
    let LoadedProgram {
        ebpf,
        maps:
            KernelMaps {
                table,
                mut registry,
                counters,
                ..
            },
        ..
    } = loaded;
    let now = monotonic_ns();
    for id in 0..peers as u64 {
        registry.admit(&table, id + 1, now).expect("admit");
    }
    let mmap_read_ms = median_ms(9, || {
        let mut heartbeats = 0u64;
        for slot in 0..peers {
            heartbeats += table.record(slot).map_or(0, |r| r.heartbeats);
        }
        std::hint::black_box(heartbeats);
    });
    let aya_iter_ms = {
        let array: Array<_, PeerSlot> =
            Array::try_from(ebpf.map(PEER_STATE_MAP).expect("map")).expect("array");
        median_ms(3, || {
            let mut heartbeats = 0u64;
            for slot in array.iter() {
                heartbeats += slot.expect("read").record().heartbeats;
            }
            std::hint::black_box(heartbeats);
        })
    };
    let mut ebpf = ebpf;
    let program_fd = program::xdp_mut(&mut ebpf)
        .expect("xdp")
        .fd()
        .expect("fd")
        .as_fd()
        .try_clone_to_owned()
        .expect("dup");
    let agent = Agent::new(AgentParts {
        table,
        registry,
        program: Box::new(LiveProgram {
            counters,
            program_fd,
        }),
        detector: DetectorConfig::new(DetectorParams::DEFAULT, Levels::default()),
        iface: "none".into(),
        mode: "none".into(),
        origin: Default::default(),
        port: 0,
        admission: monitor::agent::admission::AdmissionPolicy {
            auto: false,
            from: monitor::agent::admission::AdmitFrom::Any,
            rate_per_sec: 1,
            per_source: 0,
        },
        expire_after: None,
    });
    agent.sweep(monotonic_ns(), false); // first sweep builds the trackers
    let agent_sweep_ms = median_ms(9, || agent.sweep(monotonic_ns(), false));
    SweepTimings {
        peers,
        mmap_read_ms,
        agent_sweep_ms,
        aya_iter_ms,
        iter_over_mmap: aya_iter_ms / mmap_read_ms,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SocketLatency {
    /// `peer` round trips, microseconds.
    pub peer_us: Percentiles,
    /// `suspects` round trips (default threshold), microseconds.
    pub suspects_us: Percentiles,
    pub suspects_returned: usize,
    /// The same requests as the agent timed them (`heartbeat_monitor_request_duration_seconds`,
    /// line read to reply written), when its metrics were asked for.
    pub agent_peer_us: Option<BucketQuantiles>,
    pub agent_suspects_us: Option<BucketQuantiles>,
}

/// Quantiles read off a Prometheus histogram: the upper bound of the bucket each falls in.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BucketQuantiles {
    pub count: u64,
    pub p50_at_most: f64,
    pub p99_at_most: f64,
}

/// The request-duration histogram of `op` in the agent's metrics `text`, in microseconds.
pub fn request_quantiles_us(text: &str, op: &str) -> Option<BucketQuantiles> {
    let prefix = "heartbeat_monitor_request_duration_seconds_bucket{";
    let label = format!("op=\"{op}\"");
    // (upper bound in us, cumulative count), in the order the exposition lists them.
    let buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix)?;
            let (labels, value) = rest.split_once("} ")?;
            if !labels.split(',').any(|l| l == label) {
                return None;
            }
            let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?;
            let le = le.trim_end_matches('"');
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse::<f64>().ok()? * 1e6
            };
            Some((bound, value.trim().parse::<f64>().ok()? as u64))
        })
        .collect();
    let count = buckets.last()?.1;
    if count == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = (q * count as f64).ceil() as u64;
        buckets
            .iter()
            .find(|&&(_, cumulative)| cumulative >= rank)
            .map_or(f64::INFINITY, |&(bound, _)| bound)
    };
    Some(BucketQuantiles {
        count,
        p50_at_most: at(0.5),
        p99_at_most: at(0.99),
    })
}

/// Most time the `suspects` round trips may take together, once `MIN_SUSPECTS` are done: at
/// 200,000 peers one takes milliseconds, at a million tens, and the scale runs kill peers 4 s
/// after this probe starts (queries still running then would slow the events measured).
const SUSPECTS_BUDGET: Duration = Duration::from_secs(2);
/// Fewest `suspects` round trips a p99 is taken from (then the second largest: a poor p99,
/// and only where one round trip takes 20 ms or more).
const MIN_SUSPECTS: usize = 100;

/// Round trips of `peer` (random admitted ids 1..=peers) and `suspects`, one client, in turn:
/// `requests` of each, fewer `suspects` if they take longer than `SUSPECTS_BUDGET`. With
/// `metrics` (the agent's namespace and metrics address), also the agent's own timing of them.
pub fn socket_latency(
    socket: &Path,
    peers: u64,
    requests: usize,
    metrics: Option<(&str, &str)>,
) -> SocketLatency {
    let mut client = Client::connect(socket).expect("connect");
    let mut rng = fastrand::Rng::with_seed(7);
    let time = |client: &mut Client, request: &Value| {
        let line = request.to_string();
        let t = Instant::now();
        let reply = client.request_line(&line).expect("request");
        (t.elapsed().as_secs_f64() * 1e6, reply)
    };
    let peer_us = (0..requests)
        .map(|_| {
            let (us, reply) = time(
                &mut client,
                &json!({"op": "peer", "id": rng.u64(1..=peers)}),
            );
            assert!(reply.starts_with("{\"ok\":true"), "{reply}");
            us
        })
        .collect();
    let mut returned = 0;
    let started = Instant::now();
    let suspects_us = (0..requests.max(MIN_SUSPECTS))
        .take_while(|&i| i < MIN_SUSPECTS || started.elapsed() < SUSPECTS_BUDGET)
        .map(|_| {
            let (us, reply) = time(&mut client, &json!({"op": "suspects"}));
            let v: Value = serde_json::from_str(&reply).expect("json");
            returned = v["suspects"].as_array().map_or(0, Vec::len);
            us
        })
        .collect();
    let text = metrics.map(
        |(ns, addr)| match crate::http::get_in(ns, addr, "/metrics", &[]) {
            Ok((200, text)) => text,
            other => panic!("GET /metrics from {addr} in {ns}: {other:?}"),
        },
    );
    SocketLatency {
        peer_us: Percentiles::of(peer_us),
        suspects_us: Percentiles::of(suspects_us),
        suspects_returned: returned,
        agent_peer_us: text
            .as_deref()
            .and_then(|t| request_quantiles_us(t, "peer")),
        agent_suspects_us: text
            .as_deref()
            .and_then(|t| request_quantiles_us(t, "suspects")),
    }
}

/// A subscriber that records, for every suspect event, how long after phi crossed its level
/// the event reached it (ms), until `expected` events or `timeout`; and that time split in
/// two: detection (the event's `at`, when the sweep raised it, less `crossed_at`; inside the
/// agent, to the millisecond `at` has) and delivery (received less `at`).
pub struct EventProbe {
    client: Client,
}

impl EventProbe {
    pub fn subscribe(socket: &Path) -> Self {
        let mut client = Client::connect(socket).expect("connect");
        let reply = client
            .request(&json!({"op": "subscribe"}))
            .expect("subscribe");
        assert_eq!(reply["ok"], json!(true));
        Self { client }
    }

    /// Collects until `expected` suspect events about ids in `ids` (others are counted by kind
    /// but not timed), or `timeout`.
    pub fn collect(
        mut self,
        expected: usize,
        ids: std::ops::Range<u64>,
        timeout: Duration,
    ) -> (EventLatency, HashMap<String, usize>) {
        let deadline = Instant::now() + timeout;
        // The loop only reads, stamps and sorts out the lines: each is stamped as it is read,
        // so the time this probe spends on one event never counts against the next ones
        // (parsing a whole event in the loop added 20 us an event, 40 ms to a 2,000-event
        // burst). The lines are parsed after the last one.
        #[derive(serde::Deserialize)]
        struct Kind<'a> {
            event: &'a str,
            id: Option<u64>,
        }
        let mut timed: Vec<(f64, String)> = Vec::with_capacity(expected);
        let mut kinds: HashMap<String, usize> = HashMap::new();
        while timed.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.client.set_read_timeout(Some(left)).expect("timeout");
            let Ok(line) = self.client.read_line() else {
                break;
            };
            let received = unix_ms();
            let kind: Kind = serde_json::from_str(&line).expect("event json");
            *kinds.entry(kind.event.to_string()).or_default() += 1;
            if kind.event == "suspect" && kind.id.is_some_and(|id| ids.contains(&id)) {
                timed.push((received, line));
            }
        }
        let mut latencies = Vec::new();
        let mut detection = Vec::new();
        let mut delivery = Vec::new();
        for (received, line) in &timed {
            let event: Value = serde_json::from_str(line).expect("event json");
            let crossed = event["crossed_at"].as_f64().expect("crossed_at");
            let at = event["at"].as_f64().expect("at");
            latencies.push(received - crossed);
            detection.push(at - crossed);
            delivery.push(received - at);
        }
        let latency = EventLatency {
            total: Percentiles::of(latencies),
            detection: Percentiles::of(detection),
            delivery: Percentiles::of(delivery),
        };
        (latency, kinds)
    }
}

/// Event latency, crossing to receipt, and its two parts (see `EventProbe`).
#[derive(Debug, Clone, Serialize)]
pub struct EventLatency {
    pub total: Percentiles,
    pub detection: Percentiles,
    pub delivery: Percentiles,
}

fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[derive(Debug, Clone, Serialize)]
pub struct ReceiverReport {
    pub received: u64,
    pub peers: usize,
    /// CPU time of this process (user + system) while receiving, seconds.
    pub cpu_s: f64,
}

/// The userspace alternative to the XDP path: a tokio UDP socket that parses each heartbeat
/// with the same rules and feeds the same windowed statistics, for `duration` after the first
/// packet (or until `idle` passes without one).
pub fn udp_receiver(bind: &str, duration: Duration, idle: Duration) -> ReceiverReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let socket = tokio::net::UdpSocket::bind(bind).await.expect("bind");
        // The same slot and the same rules as the kernel's, so both paths do the same work.
        let rules = DetectorParams::DEFAULT.window_config();
        let mut peers: HashMap<u64, Box<PeerSlot>> = HashMap::new();
        let mut buf = [0u8; 2048];
        let mut received = 0u64;
        let cpu_before = cpu_seconds();
        let mut end: Option<Instant> = None;
        loop {
            let wait = match end {
                Some(end) => end.saturating_duration_since(Instant::now()).min(idle),
                None => Duration::from_secs(60),
            };
            let Ok(Ok((n, _))) = tokio::time::timeout(wait, socket.recv_from(&mut buf)).await
            else {
                break;
            };
            end.get_or_insert_with(|| Instant::now() + duration);
            let Ok(header) = HeartbeatHeader::decode(&buf[..n]) else {
                continue;
            };
            received += 1;
            let now = monotonic_ns();
            let slot = peers
                .entry(header.peer_id())
                .or_insert_with(|| Box::new(PeerSlot::admitted(header.peer_id(), now)));
            monitor_common::slot::arrive(slot, now, header.seq(), header.incarnation(), &rules);
            if end.is_some_and(|e| Instant::now() >= e) {
                break;
            }
        }
        ReceiverReport {
            received,
            peers: peers.len(),
            cpu_s: cpu_seconds() - cpu_before,
        }
    })
}

/// User + system CPU time of this process, seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_quantiles_are_read_off_the_buckets() {
        let text = "\
# TYPE heartbeat_monitor_request_duration_seconds histogram
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00001\",op=\"peer\"} 0
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00002\",op=\"peer\"} 60
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00004\",op=\"peer\"} 99
heartbeat_monitor_request_duration_seconds_bucket{le=\"+Inf\",op=\"peer\"} 100
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00001\",op=\"suspects\"} 0
heartbeat_monitor_request_duration_seconds_bucket{le=\"+Inf\",op=\"suspects\"} 0
";
        let peer = request_quantiles_us(text, "peer").unwrap();
        assert_eq!(peer.count, 100);
        assert!((peer.p50_at_most - 20.0).abs() < 1e-9, "{peer:?}");
        assert!((peer.p99_at_most - 40.0).abs() < 1e-9, "{peer:?}");
        assert_eq!(request_quantiles_us(text, "suspects"), None, "none asked");
        assert_eq!(request_quantiles_us(text, "stats"), None, "no series");
    }
}
