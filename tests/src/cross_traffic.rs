//! Cross traffic for the congestion tests: an iperf3 server in one namespace of a pair, and
//! bursts of iperf3 UDP from the other, 1-4 s long, the first at once and the next 2-8 s after
//! each (as `cargo xtask traces` schedules them), for as long as a test asks.

use std::{
    path::Path,
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use crate::{daemon::Daemon, netns::NetnsPair, wait_for};

/// A test's setting from the environment (`HBM_...`), else its default.
pub fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

/// `iperf3 -s` on `pair.addr_a:port` in `pair.ns_a`, listening when this returns; stopped
/// when dropped.
pub fn iperf_server(pair: &NetnsPair, port: u16) -> Daemon {
    let mut server = NetnsPair::command_in(&pair.ns_a, Path::new("iperf3"));
    server
        .args(["-s", "-B", &pair.addr_a, "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let daemon = Daemon::new(server.spawn().expect("iperf3 -s"));
    wait_for(Duration::from_secs(10), "iperf3 listening", || {
        let out = NetnsPair::command_in(&pair.ns_a, Path::new("ss"))
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
            .ok()?;
        (!out.stdout.is_empty()).then_some(())
    });
    daemon
}

/// What [`bursts`] sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bursts {
    pub count: u32,
    /// Time the bursts took, each from its client's start to its end.
    pub time: Duration,
}

/// Bursts of UDP from `pair.ns_b` to the server on `pair.addr_a:port` until `congested` has
/// passed since the call, each `iperf3 -c ... -u` with `rate_args` (`-b RATE`, `-P STREAMS`).
pub fn bursts(
    pair: &NetnsPair,
    port: u16,
    congested: Duration,
    rng: &mut fastrand::Rng,
    rate_args: &[String],
) -> Bursts {
    let begun = Instant::now();
    let mut next_burst = begun;
    let mut sent = Bursts::default();
    while begun.elapsed() < congested {
        let now = Instant::now();
        if now < next_burst {
            thread::sleep((next_burst - now).min(congested.saturating_sub(begun.elapsed())));
            continue;
        }
        let secs = rng
            .u64(1..=4)
            .min(congested.saturating_sub(begun.elapsed()).as_secs().max(1));
        let burst_start = Instant::now();
        let status = NetnsPair::command_in(&pair.ns_b, Path::new("iperf3"))
            .args(["-c", &pair.addr_a, "-p", &port.to_string(), "-u"])
            .args(rate_args)
            .args(["-t", &secs.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("iperf3 -c");
        assert!(status.success(), "iperf3 -c failed: {status}");
        sent.count += 1;
        sent.time += burst_start.elapsed();
        next_burst = Instant::now() + Duration::from_millis(rng.u64(2_000..8_000));
    }
    sent
}
