//! A load generator: many simulated peers from one process, for benchmarks and soak tests.
//!
//! Heartbeat n (counting over all peers) is due at n / (peers x rate): peer n mod peers, with
//! sequence number n / peers. So every peer sends exactly every 1/rate seconds, the peers are
//! spread evenly over the period, and the stream is as smooth as a real fleet. Packets go out in
//! sendmmsg batches from one connected socket.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_common::wire::{HEADER_LEN, HeartbeatHeader};
use serde::{Deserialize, Serialize};

/// Packets per sendmmsg call.
pub const BATCH: usize = 256;

#[derive(Debug, Clone)]
pub struct LoadgenConfig {
    pub to: SocketAddr,
    pub peers: u64,
    pub first_id: u64,
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
    #[error("--churn must be a fraction between 0 and 1, with a non-zero --churn-period")]
    Churn,
    #[error("sending to {to}: {source}")]
    Io { to: SocketAddr, source: io::Error },
}

struct Batch {
    packets: Vec<[u8; HEADER_LEN]>,
}

impl Batch {
    /// Sends every packet; returns (sent, refused).
    fn flush(&mut self, fd: i32) -> (u64, u64) {
        let mut iovecs: Vec<libc::iovec> = self
            .packets
            .iter_mut()
            .map(|p| libc::iovec {
                iov_base: p.as_mut_ptr().cast(),
                iov_len: HEADER_LEN,
            })
            .collect();
        let mut headers: Vec<libc::mmsghdr> = iovecs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero msghdr is valid (no name, no control data).
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let (mut sent, mut refused, mut done) = (0u64, 0u64, 0usize);
        while done < headers.len() {
            let left = &mut headers[done..];
            // SAFETY: headers and the iovecs/packets they point at outlive the call.
            let n = unsafe { libc::sendmmsg(fd, left.as_mut_ptr(), left.len() as u32, 0) };
            if n < 0 {
                // The first packet of the rest was refused (ENOBUFS, ECONNREFUSED...): skip it.
                refused += 1;
                done += 1;
            } else {
                sent += n as u64;
                done += n as usize;
            }
        }
        self.packets.clear();
        (sent, refused)
    }
}

pub fn run(config: &LoadgenConfig, stop: &AtomicBool) -> Result<LoadgenReport, LoadgenError> {
    if config.peers == 0 {
        return Err(LoadgenError::NoPeers);
    }
    if monitor_common::wire::validate_peer_id(config.first_id).is_err() {
        return Err(LoadgenError::ZeroId);
    }
    if !(config.rate_hz.is_finite() && config.rate_hz > 0.0) {
        return Err(LoadgenError::Rate);
    }
    let interval = Duration::from_secs_f64(1.0 / config.rate_hz);
    if config.jitter * 2 >= interval {
        return Err(LoadgenError::Jitter(interval));
    }
    if !(0.0..=1.0).contains(&config.churn_fraction)
        || (config.churn_fraction > 0.0 && config.churn_period.is_zero())
    {
        return Err(LoadgenError::Churn);
    }
    if !(0.0..=1.0).contains(&config.kill_fraction) {
        return Err(LoadgenError::Kill);
    }
    let io_err = |source| LoadgenError::Io {
        to: config.to,
        source,
    };
    let bind: SocketAddr = if config.to.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal");
    let socket = UdpSocket::bind(bind).map_err(io_err)?;
    socket.connect(config.to).map_err(io_err)?;
    let fd = socket.as_raw_fd();
    let sndbuf: libc::c_int = 8 << 20;
    // SAFETY: setting an int socket option on our own socket. Best effort.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const sndbuf).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };

    let total_rate = config.peers as f64 * config.rate_hz;
    let killed = (config.kill_fraction * config.peers as f64).round() as u64;
    let kill_at_n = (config.kill_after.as_secs_f64() * total_rate) as u64;
    let jitter_ns = config.jitter.as_nanos() as u64;
    let mut rng = fastrand::Rng::new();
    let mut pending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut batch = Batch {
        packets: Vec::with_capacity(BATCH),
    };
    let (mut sent, mut refused) = (0u64, 0u64);
    let mut next_n = 0u64;
    let mut killed_at = None;
    let start = Instant::now();
    let churners = (config.churn_fraction * config.peers as f64).round() as u64;
    let churn = (churners > 0).then(|| ChurnSchedule {
        first_churning_id: config.first_id + config.peers - churners,
        churners,
        groups: CHURN_GROUPS,
        period_s: config.churn_period.as_secs_f64(),
        start_unix_ms: unix_ms(),
    });

    let push = |batch: &mut Batch, n: u64| {
        let mut header = HeartbeatHeader::new(
            config.first_id + n % config.peers,
            config.incarnation,
            n / config.peers,
        );
        if let Some(key) = &config.key {
            crate::peer::auth_key::sign(&mut header, key);
        }
        batch.packets.push(header.to_bytes());
    };

    while !stop.load(Ordering::Relaxed) {
        let elapsed = start.elapsed();
        if elapsed >= config.duration {
            break;
        }
        let elapsed_ns = elapsed.as_nanos() as u64;
        // At most a few batches per pass, so time and the stop flag are checked often even when
        // the generator cannot keep up with the rate asked of it.
        let due = ((elapsed.as_secs_f64() * total_rate) as u64).min(next_n + 4 * BATCH as u64);
        while next_n < due {
            let n = next_n;
            next_n += 1;
            if let Some(churn) = &churn
                && churn.silent(config.first_id + n % config.peers, n as f64 / total_rate)
            {
                continue;
            }
            if killed > 0 && n >= kill_at_n {
                if killed_at.is_none() {
                    killed_at = Some(unix_ms());
                }
                if n % config.peers < killed {
                    continue;
                }
            }
            if jitter_ns == 0 {
                push(&mut batch, n);
                if batch.packets.len() == BATCH {
                    let (s, r) = batch.flush(fd);
                    sent += s;
                    refused += r;
                }
            } else {
                let nominal = (n as f64 / total_rate * 1e9) as u64;
                pending.push(Reverse((nominal + rng.u64(0..=jitter_ns), n)));
            }
        }
        while let Some(&Reverse((at, n))) = pending.peek() {
            if at > elapsed_ns {
                break;
            }
            pending.pop();
            push(&mut batch, n);
            if batch.packets.len() == BATCH {
                let (s, r) = batch.flush(fd);
                sent += s;
                refused += r;
            }
        }
        if !batch.packets.is_empty() {
            let (s, r) = batch.flush(fd);
            sent += s;
            refused += r;
        }
        // Caught up: sleep until about a batch is due (at most 1 ms, so the stream stays smooth).
        let next_due = Duration::from_secs_f64((next_n as f64 + BATCH as f64 / 2.0) / total_rate);
        let wait = next_due
            .saturating_sub(start.elapsed())
            .min(Duration::from_millis(1));
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    Ok(LoadgenReport {
        peers: config.peers,
        first_id: config.first_id,
        rate_hz: config.rate_hz,
        sent,
        send_errors: refused,
        duration_s,
        achieved_pps: sent as f64 / duration_s,
        killed: if killed_at.is_some() { killed } else { 0 },
        churn,
        killed_at_unix_ms: killed_at,
    })
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
