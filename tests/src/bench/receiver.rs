//! The userspace receive path, for comparison with XDP: a UDP socket feeding the same
//! statistics as the kernel's.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use monitor::{detector::model::DetectorParams, kernel::clock::monotonic_ns};
use monitor_common::{maps::PeerSlot, wire::HeartbeatHeader};
use serde::Serialize;

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
