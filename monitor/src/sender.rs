//! A heartbeat sender: what each peer runs (`monitor send`).

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use monitor_common::wire::HeartbeatHeader;

#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub to: SocketAddr,
    pub id: u64,
    pub interval: Duration,
    /// Each send is moved by a uniform random offset in [-jitter, +jitter].
    pub jitter: Duration,
    /// Stop after this many heartbeats (None: forever).
    pub count: Option<u64>,
    pub incarnation: u32,
    pub first_seq: u64,
    /// Sign every heartbeat with this key.
    pub key: Option<monitor_common::auth::AuthKey>,
}

/// Sends heartbeats on a fixed schedule (start + k * interval, plus jitter), so sleeping late
/// once does not shift every later heartbeat. Returns how many were sent.
pub fn run(config: &SenderConfig, mut keep_going: impl FnMut() -> bool) -> io::Result<u64> {
    let bind: SocketAddr = if config.to.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(config.to)?;
    let mut rng = fastrand::Rng::new();
    let start = Instant::now();
    let mut sent = 0u64;
    while config.count.is_none_or(|c| sent < c) && keep_going() {
        let nominal = start + config.interval * u32::try_from(sent).unwrap_or(u32::MAX);
        let due = jittered(nominal, config.jitter, &mut rng);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let mut header =
            HeartbeatHeader::new(config.id, config.incarnation, config.first_seq + sent);
        if let Some(key) = &config.key {
            crate::auth_key::sign(&mut header, key);
        }
        match socket.send(&header.to_bytes()) {
            Ok(_) => {}
            // A transient error (no route yet, ICMP feedback) must not kill a heartbeat sender.
            Err(e) => log::warn!("sending heartbeat {}: {e}", config.first_seq + sent),
        }
        sent += 1;
    }
    Ok(sent)
}

fn jittered(nominal: Instant, jitter: Duration, rng: &mut fastrand::Rng) -> Instant {
    if jitter.is_zero() {
        return nominal;
    }
    let span = jitter.as_nanos() as u64;
    let offset = rng.u64(0..=2 * span);
    if offset >= span {
        nominal + Duration::from_nanos(offset - span)
    } else {
        nominal
            .checked_sub(Duration::from_nanos(span - offset))
            .unwrap_or(nominal)
    }
}
