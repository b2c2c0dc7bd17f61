//! A load generator: many simulated peers from one process, for benchmarks and soak tests.
//!
//! Heartbeat n (counting over all peers) is due at n / (peers x rate): peer n mod peers, with
//! sequence number n / peers. So every peer sends exactly every 1/rate seconds, the peers are
//! spread evenly over the period, and the stream is as smooth as a real fleet. Two ways to send
//! it: sendmmsg batches from one connected socket, 64 heartbeats a message through UDP GSO
//! (`socket`), or, with `kernel`, an XDP program that stamps and transmits frames through
//! BPF_PROG_RUN in live-frame mode (`kernel`).

mod ethtool;
pub mod frame;
pub mod kernel;
mod socket;

use std::{
    io,
    net::SocketAddr,
    sync::atomic::AtomicBool,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

pub use kernel::KernelSchedule;
pub use socket::BATCH;

#[derive(Debug, Clone)]
pub struct LoadgenConfig {
    pub to: SocketAddr,
    pub peers: u64,
    pub first_id: u64,
    /// Heartbeat i of a round goes to peer index `i x stride mod peers` (coprime to `peers`,
    /// so each peer once a round): 1 sends in id order; a larger stride sends consecutive
    /// heartbeats to peers far apart, as real senders' phases do, where id order lets a
    /// receiver's prefetchers follow its slots.
    pub stride: u64,
    /// Heartbeats per second per peer.
    pub rate_hz: f64,
    /// Each heartbeat is sent up to this much late, uniformly (must be under half the interval).
    pub jitter: Duration,
    pub duration: Duration,
    /// The first `kill_fraction x peers` peers stop sending at `kill_after`.
    pub kill_fraction: f64,
    pub kill_after: Duration,
    /// This fraction of the peers (the highest ids) churn: split into `CHURN_GROUPS` groups,
    /// group `e mod CHURN_GROUPS` is silent throughout period `e` of `churn_period`, then
    /// comes back (same incarnation, sequence numbers skipping the silent stretch).
    pub churn_fraction: f64,
    pub churn_period: Duration,
    pub incarnation: u32,
    /// Sign every heartbeat with this key.
    pub key: Option<monitor_common::auth::AuthKey>,
    /// Send with the kernel generator (an XDP program run by BPF_PROG_RUN) instead of
    /// sendmmsg.
    pub kernel: bool,
    /// The userspace generator hands the kernel many heartbeats a message (UDP GSO); false
    /// sends one a message, as a sender without GSO does (see `socket`).
    pub gso: bool,
    /// Heartbeats back to back in each datagram (1: one a datagram, as senders send them;
    /// up to [`MAX_PACK`]): the receiver records each (docs/wire-format.md), one packet for
    /// many, so a stream can pass what one core sends one heartbeat a packet.
    pub pack: usize,
}

/// The most heartbeats `--pack` puts in a datagram: 45 x 32 bytes of payload fit a 1,500-byte
/// MTU unfragmented over IPv4 and IPv6 alike (1,472 and 1,452 bytes).
pub const MAX_PACK: usize = 45;

impl LoadgenConfig {
    /// Peers that stop at `kill_after`: ids `first_id .. first_id + killed()`.
    pub fn killed(&self) -> u64 {
        (self.kill_fraction * self.peers as f64).round() as u64
    }

    /// The churn schedule, starting now, if any peer churns.
    pub fn churn_schedule(&self) -> Option<ChurnSchedule> {
        let churners = (self.churn_fraction * self.peers as f64).round() as u64;
        (churners > 0).then(|| ChurnSchedule {
            first_churning_id: self.first_id + self.peers - churners,
            churners,
            groups: CHURN_GROUPS,
            period_s: self.churn_period.as_secs_f64(),
            start_unix_ms: unix_ms(),
        })
    }

    /// The index (0..peers, the id less `first_id`) of the peer heartbeat `n` goes to.
    #[inline]
    pub fn peer_index(&self, n: u64) -> u64 {
        ((n % self.peers) as u128 * self.stride as u128 % self.peers as u128) as u64
    }

    /// Heartbeats a second, all peers together.
    pub fn total_rate(&self) -> f64 {
        self.peers as f64 * self.rate_hz
    }

    fn validate(&self) -> Result<(), LoadgenError> {
        if self.peers == 0 {
            return Err(LoadgenError::NoPeers);
        }
        if monitor_common::wire::validate_peer_id(self.first_id).is_err() {
            return Err(LoadgenError::ZeroId);
        }
        if !(self.rate_hz.is_finite() && self.rate_hz > 0.0) {
            return Err(LoadgenError::Rate);
        }
        let interval = Duration::from_secs_f64(1.0 / self.rate_hz);
        if self.jitter * 2 >= interval {
            return Err(LoadgenError::Jitter(interval));
        }
        if !(0.0..=1.0).contains(&self.churn_fraction)
            || (self.churn_fraction > 0.0 && self.churn_period.is_zero())
        {
            return Err(LoadgenError::Churn);
        }
        // The kernel generator sends one heartbeat a frame.
        if !(1..=MAX_PACK).contains(&self.pack) || (self.kernel && self.pack > 1) {
            return Err(LoadgenError::Pack);
        }
        if !(0.0..=1.0).contains(&self.kill_fraction) {
            return Err(LoadgenError::Kill);
        }
        if self.stride == 0 || gcd(self.stride, self.peers) != 1 {
            return Err(LoadgenError::Stride(self.stride, self.peers));
        }
        if self.kernel && self.stride != 1 {
            return Err(LoadgenError::Kernel(
                "--stride is the userspace generator's (the kernel one sends in id order)".into(),
            ));
        }
        Ok(())
    }
}

/// What was sent: what a benchmark compares with what the monitor counted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadgenReport {
    pub peers: u64,
    pub first_id: u64,
    pub rate_hz: f64,
    /// Heartbeats the kernel accepted for sending.
    pub sent: u64,
    /// Heartbeats a send call refused (not counted in `sent`).
    pub send_errors: u64,
    pub duration_s: f64,
    /// `sent / duration_s`.
    pub achieved_pps: f64,
    /// Peers that stopped: ids first_id .. first_id + killed.
    pub killed: u64,
    /// Unix time (ms) of the kill, if any peer was killed.
    pub killed_at_unix_ms: Option<f64>,
    /// The churn schedule, if any: what a checker needs to know who was silent when.
    pub churn: Option<ChurnSchedule>,
    /// With `--kernel`: the plan, how closely it was kept, and what the kernel spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSchedule>,
    /// How the heartbeats were sent: rates differ several times between the three.
    #[serde(default)]
    pub sent_by: SentBy,
    /// The userspace generator's: how late heartbeats went out against their schedule (the
    /// kernel generator's is in `kernel`). A receiver that suspects a live peer may be seeing
    /// this, not the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness: Option<Lateness>,
}

/// How late the userspace generator sent its heartbeats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lateness {
    /// The latest a heartbeat went out after it was due (its send call's return), ms.
    pub max_late_ms: f64,
    /// A quarter of the interval, ms.
    pub slack_ms: f64,
    /// Heartbeats that went out later than the slack after they were due.
    pub late: u64,
}

/// How a run sent its heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SentBy {
    /// sendmmsg, up to 64 heartbeats a message cut into datagrams by the kernel (UDP GSO).
    #[default]
    UdpGso,
    /// sendmmsg, one heartbeat a message (a kernel that refuses UDP GSO).
    Sendmmsg,
    /// The kernel generator (`--kernel`).
    Kernel,
    /// sendmmsg, several heartbeats back to back in each datagram (`--pack`).
    Packed,
}

/// What a run sent, as both generators count it.
pub(super) struct Sent {
    /// Heartbeats accepted for sending.
    pub sent: u64,
    /// Heartbeats refused.
    pub send_errors: u64,
    pub duration_s: f64,
    /// Unix time (ms) of the kill, if it came.
    pub killed_at_unix_ms: Option<f64>,
    pub by: SentBy,
}

impl LoadgenReport {
    /// The report of a run of `config`: what it sent, the churn it followed, and the kernel
    /// generator's schedule where that one sent it.
    pub(super) fn of(
        config: &LoadgenConfig,
        sent: Sent,
        churn: Option<ChurnSchedule>,
        kernel: Option<KernelSchedule>,
    ) -> Self {
        Self {
            peers: config.peers,
            first_id: config.first_id,
            rate_hz: config.rate_hz,
            sent: sent.sent,
            send_errors: sent.send_errors,
            duration_s: sent.duration_s,
            achieved_pps: sent.sent as f64 / sent.duration_s,
            killed: if sent.killed_at_unix_ms.is_some() {
                config.killed()
            } else {
                0
            },
            killed_at_unix_ms: sent.killed_at_unix_ms,
            churn,
            kernel,
            sent_by: sent.by,
            lateness: None,
        }
    }
}

/// Groups of churning peers: one group is silent in each period, in turn.
pub const CHURN_GROUPS: u64 = 4;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChurnSchedule {
    /// Churning peers are ids first_churning_id .. first_churning_id + churners.
    pub first_churning_id: u64,
    pub churners: u64,
    pub groups: u64,
    pub period_s: f64,
    /// Unix time (ms) of the schedule's time zero.
    pub start_unix_ms: f64,
}

impl ChurnSchedule {
    /// Whether peer `id` is silent at `t_s` seconds into the schedule.
    pub fn silent(&self, id: u64, t_s: f64) -> bool {
        if id < self.first_churning_id || id >= self.first_churning_id + self.churners {
            return false;
        }
        let epoch = (t_s / self.period_s).floor() as u64;
        (id - self.first_churning_id) % self.groups == epoch % self.groups
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error("--peers must be at least 1")]
    NoPeers,
    #[error("--first-id 0: peer id 0 is reserved (docs/wire-format.md); start at 1")]
    ZeroId,
    #[error("--rate must be a positive number")]
    Rate,
    #[error("--jitter must be under half the interval ({0:?})")]
    Jitter(Duration),
    #[error("--kill must be a fraction between 0 and 1")]
    Kill,
    #[error("--pack must be between 1 and 45 heartbeats a datagram, and 1 with --kernel")]
    Pack,
    #[error("--churn must be a fraction between 0 and 1, with a non-zero --churn-period")]
    Churn,
    #[error(
        "--stride {0} shares a factor with --peers {1}: some peers would never be sent to; pick a stride coprime to it (a prime that does not divide it)"
    )]
    Stride(u64, u64),
    #[error("sending to {to}: {source}")]
    Io { to: SocketAddr, source: io::Error },
    #[error("--kernel: {0}")]
    Kernel(String),
}

/// Sends the configured stream, by sendmmsg or (`config.kernel`) by the kernel generator.
pub fn run(config: &LoadgenConfig, stop: &AtomicBool) -> Result<LoadgenReport, LoadgenError> {
    config.validate()?;
    if config.kernel {
        kernel::run(config, stop)
    } else {
        socket::run(config, stop)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod stride_tests {
    use super::*;

    fn config(peers: u64, stride: u64) -> LoadgenConfig {
        LoadgenConfig {
            to: "127.0.0.1:9".parse().unwrap(),
            peers,
            first_id: 1,
            stride,
            rate_hz: 10.0,
            jitter: Duration::ZERO,
            duration: Duration::from_secs(1),
            kill_fraction: 0.0,
            kill_after: Duration::ZERO,
            churn_fraction: 0.0,
            churn_period: Duration::ZERO,
            incarnation: 1,
            key: None,
            kernel: false,
            gso: true,
            pack: 1,
        }
    }

    #[test]
    fn a_stride_sends_to_every_peer_once_a_round_far_apart() {
        let c = config(1000, 7919);
        c.validate().unwrap();
        let round: Vec<u64> = (0..1000).map(|n| c.peer_index(n)).collect();
        let mut sorted = round.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "a permutation");
        assert_eq!(&round[..3], [0, 919, 838], "7919 mod 1000 apart");
        // The next round is the same order.
        assert_eq!(c.peer_index(1001), round[1]);
        assert_eq!(config(1000, 1).peer_index(5), 5, "stride 1: id order");
    }

    #[test]
    fn a_stride_that_shares_a_factor_with_the_peers_is_refused() {
        for stride in [0, 2, 1000, 2500] {
            let e = config(1000, stride).validate().unwrap_err();
            assert!(matches!(e, LoadgenError::Stride(..)), "{stride}: {e}");
        }
        let kernel = LoadgenConfig {
            kernel: true,
            ..config(1000, 7)
        };
        assert!(matches!(kernel.validate(), Err(LoadgenError::Kernel(_))));
        for pack in [0, 46] {
            let c = LoadgenConfig {
                pack,
                ..config(1000, 7)
            };
            assert!(matches!(c.validate(), Err(LoadgenError::Pack)), "{pack}");
        }
        let packed_kernel = LoadgenConfig {
            pack: 2,
            kernel: true,
            ..config(1000, 7)
        };
        assert!(matches!(packed_kernel.validate(), Err(LoadgenError::Pack)));
    }
}
