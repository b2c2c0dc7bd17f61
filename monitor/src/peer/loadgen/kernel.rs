//! The kernel generator (`monitor loadgen --kernel`): the XDP program of
//! `monitor-ebpf/src/loadgen.rs`, run by BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES. Each
//! run hands the kernel one template frame and a count; the kernel runs the program on that
//! many copies, and every copy the program stamps and returns XDP_TX leaves by the interface
//! the run names, as if forwarded there. No socket, no copy per packet from userspace.
//!
//! Pacing: every `SLICE` the loop runs as many frames as have come due since the last run
//! (against the monotonic clock), so the stream is as smooth as the userspace generator's at a
//! millisecond's resolution. The report says how late the latest frame of any run was.

use std::{
    net::UdpSocket,
    os::fd::AsFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{ProgramError, TestRun, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};
use monitor_common::loadgen::{LG_NEXT_N, LG_SENT, LG_SILENT, LoadgenPlan, PAYLOAD_OFFSET};
use serde::{Deserialize, Serialize};

use super::{
    LoadgenConfig, LoadgenError, LoadgenReport, Sent, SentBy, ethtool::XmitCount, frame, unix_ms,
};

/// The generator's XDP object, built with the monitor's by build.rs (empty when bpf-linker
/// was missing at build time).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/loadgen"));
const PROGRAM: &str = "loadgen";
const STATE_MAP: &str = "LOADGEN_STATE";

/// How often the loop sends what has come due.
pub const SLICE: Duration = Duration::from_millis(1);
/// Frames the kernel runs before it flushes the transmits: the kernel's default, which a veth
/// peer's ring (256 frames) takes whole.
const BATCH: u32 = 64;
/// Most frames in one run: 10 ms of the stream, and never more than `MAX_RUN_FRAMES`, so the
/// clock and the stop flag are looked at often when the generator cannot keep up.
const MAX_RUN: Duration = Duration::from_millis(10);
const MAX_RUN_FRAMES: u64 = 1 << 16;
/// A heartbeat sent more than this fraction of its peer's interval after it was due is off the
/// schedule: the detector would see that interval a quarter longer than it was meant to be.
const SLACK_OF_INTERVAL: f64 = 0.25;

/// What the kernel generator adds to the loadgen report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelSchedule {
    /// The interface the frames left by.
    pub iface: String,
    /// Heartbeats in the schedule (duration x peers x rate).
    pub planned: u64,
    /// Left out by the schedule (killed or churning peers).
    pub silent: u64,
    /// Still due when the duration ran out (the generator fell behind) or the run was stopped.
    pub unsent: u64,
    /// The latest any run ended after the first frame in it was due, ms: an upper bound on
    /// how late any heartbeat went out.
    pub max_late_ms: f64,
    /// How late a heartbeat may be and still be on schedule: a quarter of the interval, ms.
    pub slack_ms: f64,
    /// Heartbeats in runs that ended later than the slack after their first was due.
    pub late: u64,
    /// Nothing went out later than the slack, and nothing was left unsent.
    pub on_schedule: bool,
    /// BPF_PROG_RUN calls.
    pub runs: u64,
    /// The kernel's own time per frame (BPF_PROG_RUN's duration): the program, the transmit,
    /// and whatever the receiving side did on this CPU before the run returned (on a veth,
    /// the peer's XDP program runs in the same softirq).
    pub kernel_ns_per_frame: f64,
    /// CPU time of the generator (user + system), seconds.
    pub cpu_s: f64,
    /// Whether the interface counts the XDP frames it transmitted (a veth does): then `sent`
    /// is its count and `send_errors` what the program handed over that it dropped; otherwise
    /// `sent` is what the program handed over, and only the receiver can say what arrived.
    pub sent_counted_by_interface: bool,
}

pub(super) fn run(
    config: &LoadgenConfig,
    stop: &AtomicBool,
) -> Result<LoadgenReport, LoadgenError> {
    let fail = |what: String| LoadgenError::Kernel(what);
    if !config.jitter.is_zero() {
        return Err(fail(
            "--jitter is not supported (the schedule is exact)".into(),
        ));
    }
    let bind = if config.to.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).map_err(|source| LoadgenError::Io {
        to: config.to,
        source,
    })?;
    let path = frame::path_to(config.to, &socket).map_err(fail)?;
    let template = frame::template(&path, config.incarnation, config.key.is_some());
    let total_rate = config.total_rate();
    let mut churn = config.churn_schedule();
    let plan = plan(config, path.src_mac, &template);
    let mut generator = Generator::load(&plan, Some(&path.iface)).map_err(fail)?;

    let planned = (config.duration.as_secs_f64() * total_rate) as u64;
    let max_run =
        ((MAX_RUN.as_secs_f64() * total_rate) as u64).clamp(u64::from(BATCH), MAX_RUN_FRAMES);
    let slack = Duration::from_secs_f64(SLACK_OF_INTERVAL / config.rate_hz);
    let mut late = 0u64;
    let xmit = XmitCount::of(socket.as_fd(), &path.iface);
    let xmit_before = xmit
        .as_ref()
        .map_or(Ok(0), |x| x.read(socket.as_fd()))
        .map_err(fail)?;
    let cpu0 = cpu_seconds();
    if let Some(churn) = &mut churn {
        churn.start_unix_ms = unix_ms();
    }
    let start = Instant::now();
    let (mut next_n, mut runs, mut kernel_ns) = (0u64, 0u64, 0.0f64);
    let mut max_late = Duration::ZERO;
    let mut killed_at = None;
    let mut last_pass = false;
    while next_n < planned && !stop.load(Ordering::Relaxed) {
        let elapsed = start.elapsed();
        if elapsed >= config.duration {
            // One last pass sends what came due by the end; after it, what is left was late.
            if last_pass {
                break;
            }
            last_pass = true;
        }
        let due = ((elapsed.as_secs_f64() * total_rate) as u64).min(planned);
        if due > next_n {
            let count = (due - next_n).min(max_run);
            if killed_at.is_none() && next_n + count > plan.kill_at_n {
                killed_at = Some(unix_ms());
            }
            let ns = generator
                .run_live(&template, path.ifindex, count as u32)
                .map_err(fail)?;
            kernel_ns += ns * count as f64;
            runs += 1;
            let first_due = Duration::from_secs_f64(next_n as f64 / total_rate);
            let late_by = start.elapsed().saturating_sub(first_due);
            max_late = max_late.max(late_by);
            // The program counts what it stamped: a run a signal cut short stamped fewer.
            let stamped_to = generator.state(LG_NEXT_N).map_err(fail)?;
            if late_by > slack {
                late += stamped_to - next_n;
            }
            next_n = stamped_to;
            continue;
        }
        // Caught up: wait for the next slice (or the end).
        let next_slice = (elapsed + SLICE).min(config.duration);
        std::thread::sleep(
            next_slice
                .saturating_sub(start.elapsed())
                .max(Duration::from_micros(50)),
        );
    }
    let duration_s = start.elapsed().as_secs_f64();
    let handed_over = generator.state(LG_SENT).map_err(fail)?;
    let sent = match &xmit {
        Some(x) => x
            .read(socket.as_fd())
            .map_err(fail)?
            .saturating_sub(xmit_before)
            .min(handed_over),
        None => handed_over,
    };
    let refused = handed_over - sent;
    let silent = generator.state(LG_SILENT).map_err(fail)?;
    let unsent = planned - next_n;
    let sent = Sent {
        sent,
        send_errors: refused,
        duration_s,
        killed_at_unix_ms: killed_at,
        by: SentBy::Kernel,
    };
    let schedule = KernelSchedule {
        iface: path.iface,
        planned,
        silent,
        unsent,
        max_late_ms: max_late.as_secs_f64() * 1000.0,
        slack_ms: slack.as_secs_f64() * 1000.0,
        late,
        on_schedule: unsent == 0 && late == 0,
        runs,
        kernel_ns_per_frame: if next_n > 0 {
            kernel_ns / next_n as f64
        } else {
            0.0
        },
        cpu_s: cpu_seconds() - cpu0,
        sent_counted_by_interface: xmit.is_some(),
    };
    Ok(LoadgenReport::of(config, sent, churn, Some(schedule)))
}

/// The plan the program stamps `config`'s stream by, for frames like `template` leaving an
/// interface whose address is `src_mac`.
pub fn plan(config: &LoadgenConfig, src_mac: [u8; 6], template: &[u8]) -> LoadgenPlan {
    let total_rate = config.total_rate();
    let killed = config.killed();
    let churn = config.churn_schedule();
    LoadgenPlan {
        src_mac,
        _pad: [0; 2],
        first_id: config.first_id,
        peers: config.peers,
        first_word_le: u64::from_le_bytes(
            template[PAYLOAD_OFFSET..][..8].try_into().expect("8 bytes"),
        ),
        k0: config.key.map_or(0, |k| k.k0),
        k1: config.key.map_or(0, |k| k.k1),
        signed: u64::from(config.key.is_some()),
        kill_at_n: if killed > 0 {
            (config.kill_after.as_secs_f64() * total_rate) as u64
        } else {
            u64::MAX
        },
        killed,
        churners: churn.as_ref().map_or(0, |c| c.churners),
        churn_groups: churn.as_ref().map_or(1, |c| c.groups),
        churn_n_per_period: churn.as_ref().map_or(u64::MAX, |c| {
            ((c.period_s * total_rate).round() as u64).max(1)
        }),
    }
}

/// The loaded generator program and its state map.
pub struct Generator {
    ebpf: Ebpf,
}

impl Generator {
    /// Loads the program and, with `attach_to`, attaches it (generic mode) to that interface,
    /// where it passes every frame it did not make: attached, it stays in the kernel's XDP
    /// dispatcher between runs, where BPF_PROG_RUN would otherwise put it and take it out
    /// again, waiting out an RCU grace period each time (tens of ms a run). Where it cannot
    /// be attached (the interface has a program of its own), runs are that much slower.
    pub fn load(plan: &LoadgenPlan, attach_to: Option<&str>) -> Result<Self, String> {
        if OBJECT.is_empty() {
            return Err(
                "this binary was built without the eBPF programs (bpf-linker was not on PATH \
                 at build time); build it with `cargo xtask build`"
                    .into(),
            );
        }
        let mut ebpf = EbpfLoader::new()
            .override_global("PLAN", plan, true)
            .load(OBJECT)
            .map_err(|e| format!("loading the generator program: {e}"))?;
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or("the generator program is missing from its object")?
            .try_into()
            .map_err(|e| format!("the generator program: {e}"))?;
        program
            .load()
            .map_err(|e| format!("verifying the generator program: {e}"))?;
        if let Some(iface) = attach_to
            && let Err(e) = program.attach(iface, XdpMode::Skb)
        {
            log::warn!(
                "could not attach the generator to {iface} ({e}): every run waits for the \
                 kernel's XDP dispatcher, the schedule is kept in coarser steps"
            );
        }
        Ok(Self { ebpf })
    }

    fn program(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM)
            .expect("loaded")
            .try_into()
            .expect("XDP")
    }

    /// Runs `count` frames of `template` in live mode, entering on interface `ifindex` (so
    /// XDP_TX sends them out of it); the kernel's mean ns per frame.
    pub fn run_live(&mut self, template: &[u8], ifindex: u32, count: u32) -> Result<f64, String> {
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        let ctx: Vec<u8> = [0, template.len() as u32, 0, ifindex, 0, 0]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        match self.program().test_run(TestRunOptions {
            data_in: Some(template),
            ctx_in: Some(&ctx),
            repeat: count,
            attrs: TestRunAttrs::new().xdp_live_frames(BATCH),
            ..TestRunOptions::default()
        }) {
            Ok(result) => Ok(result.duration.as_nanos() as f64),
            // A signal (the stop) cut the run short: the state says how far it got.
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EINTR) =>
            {
                Ok(0.0)
            }
            // Some kernels refuse live frames even to root (a sandboxed 6.18 build answers
            // EPERM to the first call, while ordinary BPF_PROG_RUN works): say what to use.
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EPERM) =>
            {
                Err(format!(
                    "BPF_PROG_RUN (live frames): {}: {}: this kernel refuses live frames to \
                     this process; the default (userspace) sender works without --kernel",
                    e.call, e.io_error
                ))
            }
            // aya's error says which call failed; the errno is in its source.
            Err(ProgramError::SyscallError(e)) => Err(format!(
                "BPF_PROG_RUN (live frames): {}: {}",
                e.call, e.io_error
            )),
            Err(e) => Err(format!("BPF_PROG_RUN (live frames): {e}")),
        }
    }

    /// Heartbeat `n` stamped on `frame` by one ordinary BPF_PROG_RUN (nothing is sent): the
    /// program's verdict and the frame it made.
    pub fn stamp(&mut self, frame: &[u8], n: u64) -> Result<(u32, Vec<u8>), String> {
        self.set_state(LG_NEXT_N, n)?;
        let mut out = vec![0u8; frame.len()];
        let result = self
            .program()
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })
            .map_err(|e| format!("BPF_PROG_RUN: {e}"))?;
        out.truncate(result.data_size_out as usize);
        Ok((result.return_value, out))
    }

    /// One of the program's counters (`monitor_common::loadgen::LG_*`).
    pub fn state(&self, index: u32) -> Result<u64, String> {
        let map = self.ebpf.map(STATE_MAP).ok_or("no state map")?;
        let array: Array<_, u64> = Array::try_from(map).map_err(|e| e.to_string())?;
        array
            .get(&index, 0)
            .map_err(|e| format!("reading the generator's state: {e}"))
    }

    fn set_state(&mut self, index: u32, value: u64) -> Result<(), String> {
        let map = self.ebpf.map_mut(STATE_MAP).ok_or("no state map")?;
        let mut array: Array<_, u64> = Array::try_from(map).map_err(|e| e.to_string())?;
        array
            .set(index, value, 0)
            .map_err(|e| format!("setting the generator's state: {e}"))
    }
}

/// User + system CPU time of this process, seconds.
fn cpu_seconds() -> f64 {
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
    fn the_plan_puts_kill_and_churn_at_the_userspace_schedule_s_heartbeats() {
        let config = LoadgenConfig {
            to: "10.0.0.1:18498".parse().unwrap(),
            peers: 1000,
            first_id: 5,
            stride: 1,
            rate_hz: 10.0,
            jitter: Duration::ZERO,
            duration: Duration::from_secs(10),
            kill_fraction: 0.1,
            kill_after: Duration::from_secs(3),
            churn_fraction: 0.2,
            churn_period: Duration::from_millis(500),
            incarnation: 7,
            key: None,
            kernel: true,
            gso: true,
            pack: 1,
        };
        let template = vec![0u8; PAYLOAD_OFFSET + 32];
        let plan = plan(&config, [2, 0, 0, 0, 0, 1], &template);
        // 10,000 heartbeats a second: the kill at 3 s is heartbeat 30,000, a churn period
        // 5,000 heartbeats; 100 killed, the top 200 churning.
        assert_eq!((plan.kill_at_n, plan.killed), (30_000, 100));
        assert_eq!((plan.churners, plan.churn_n_per_period), (200, 5_000));
        assert_eq!((plan.first_id, plan.peers, plan.signed), (5, 1000, 0));
        // Where the userspace generator's schedule says a peer is silent, so does the plan.
        let churn = config.churn_schedule().unwrap();
        for n in (0..100_000u64).step_by(7) {
            let id = config.first_id + n % config.peers;
            let user = churn.silent(id, n as f64 / config.total_rate())
                || (n >= plan.kill_at_n && n % config.peers < plan.killed);
            assert_eq!(plan.silent(n), user, "heartbeat {n}");
        }
    }
}
