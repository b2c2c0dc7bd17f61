//! A heartbeat sender: what each peer runs (`monitor send`), and what a service embeds to
//! send its own heartbeats.
//!
//! Three levels, pick the one that fits:
//!
//! - [`run`] is the whole sending loop on a blocking thread: fixed schedule, optional jitter
//!   and signing, transient send errors logged and survived.
//! - [`heartbeat`] builds (and with a key, signs) the 32 bytes of one heartbeat, for a
//!   service that sends from its own socket or event loop (tokio, mio, ...).
//! - [`monitor_common::wire::HeartbeatHeader`] and [`crate::peer::auth_key::sign`] are the pieces
//!   underneath, as docs/wire-format.md describes them byte by byte.
//!
//! Keys are read with [`crate::peer::auth_key::read_key_file`] (32 hex digits, mode 0600) or parsed
//! with [`crate::peer::auth_key::parse_key`].
//!
//! ```no_run
//! use std::{
//!     sync::{Arc, atomic::{AtomicBool, Ordering}},
//!     time::Duration,
//! };
//!
//! use monitor::peer::sender::{self, SenderConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Heartbeats as peer 17 every 100 ms, signed, on a thread of their own until told to stop.
//! let mut config = SenderConfig::new("192.0.2.1:18498".parse()?, 17);
//! config.interval = Duration::from_millis(100);
//! config.key = Some(monitor::peer::auth_key::read_key_file("/etc/heartbeat/key".as_ref())?);
//! let stop = Arc::new(AtomicBool::new(false));
//! let sending = std::thread::spawn({
//!     let stop = stop.clone();
//!     move || sender::run(&config, || !stop.load(Ordering::Relaxed))
//! });
//! // ... the service runs ...
//! stop.store(true, Ordering::Relaxed);
//! let sent = sending.join().expect("sender thread")?;
//! println!("sent {sent} heartbeats");
//!
//! // Or one datagram at a time, from a socket of the service's own.
//! let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
//! let incarnation = sender::unix_time_incarnation();
//! for seq in 0..3 {
//!     socket.send_to(&sender::heartbeat(17, incarnation, seq, None), "192.0.2.1:18498")?;
//!     std::thread::sleep(Duration::from_millis(100));
//! }
//! # Ok(())
//! # }
//! ```

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub use monitor_common::auth::AuthKey;
use monitor_common::wire::{HEADER_LEN, HeartbeatHeader};

/// What [`run`] sends, where and how often. [`SenderConfig::new`] fills in the defaults of
/// `monitor send`.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// The monitor's address and heartbeat port (default port 18498).
    pub to: SocketAddr,
    /// This peer's id: what the monitor knows it by.
    pub id: u64,
    /// Time between heartbeats (nominal: the schedule is start + k * interval).
    pub interval: Duration,
    /// Each send is moved by a uniform random offset in [-jitter, +jitter].
    pub jitter: Duration,
    /// Stop after this many heartbeats (None: forever).
    pub count: Option<u64>,
    /// Sender epoch: must grow across restarts, or the monitor takes the new heartbeats for
    /// stragglers of the old epoch ([`unix_time_incarnation`] does, for restarts more than a
    /// second apart).
    pub incarnation: u32,
    /// Sequence number of the first heartbeat; +1 per heartbeat after it.
    pub first_seq: u64,
    /// Sign every heartbeat with this key.
    pub key: Option<AuthKey>,
    /// Send from this source address (one of the host's), not the one the route picks.
    pub from: Option<std::net::IpAddr>,
}

impl SenderConfig {
    /// Heartbeats to `to` as peer `id`, with `monitor send`'s defaults: every 100 ms, no
    /// jitter, forever, incarnation from the clock, sequence from 0, unsigned.
    pub fn new(to: SocketAddr, id: u64) -> Self {
        Self {
            to,
            id,
            interval: Duration::from_millis(100),
            jitter: Duration::ZERO,
            count: None,
            incarnation: unix_time_incarnation(),
            first_seq: 0,
            key: None,
            from: None,
        }
    }
}

/// Seconds since the Unix epoch as an incarnation: grows across restarts more than a second
/// apart (see [`claim_incarnation`] for restarts within one).
pub fn unix_time_incarnation() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// The incarnation of a sender starting now: the current Unix second, returned once that
/// second is over (at most a second's wait). So no later start on this host can get the same
/// one, even a crash loop restarting within the second: a monitor takes a reused incarnation's
/// first heartbeats for a replay. A clock stepped back gives a lower one, which the monitor
/// takes for a restart (docs/security.md, "Restarts that go backwards").
pub fn claim_incarnation() -> u32 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let claimed = u32::try_from(now.as_secs()).unwrap_or(u32::MAX);
    let into_second = Duration::from_nanos(u64::from(now.subsec_nanos()));
    std::thread::sleep(Duration::from_secs(1).saturating_sub(into_second));
    // A clock stepped back during the wait leaves the second unfinished: wait a little more,
    // but not for as long as the step (a restart backwards is heard all the same).
    let waited = Instant::now();
    while unix_time_incarnation() <= claimed
        && claimed != u32::MAX
        && waited.elapsed() < Duration::from_secs(1)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    claimed
}

/// The 32 bytes of one heartbeat, ready to send as a UDP payload; with a key, signed (auth
/// flag set, SipHash-2-4 tag over bytes 0..24).
pub fn heartbeat(id: u64, incarnation: u32, seq: u64, key: Option<&AuthKey>) -> [u8; HEADER_LEN] {
    let mut header = HeartbeatHeader::new(id, incarnation, seq);
    if let Some(key) = key {
        crate::peer::auth_key::sign(&mut header, key);
    }
    header.to_bytes()
}

/// Sends heartbeats on a fixed schedule (start + k * interval, plus jitter), so sleeping late
/// once does not shift every later heartbeat, until `config.count` are sent or `keep_going`
/// (asked before each heartbeat) returns false. A stall (see [`Schedule`]) starts the schedule
/// again from the heartbeat it delayed, rather than sending the missed ones at once. Blocks the
/// calling thread; returns how many were sent. Fails only if the socket cannot be set up; an
/// error sending one heartbeat (no route yet, ICMP feedback) is logged and the next one goes
/// out on time.
pub fn run(config: &SenderConfig, mut keep_going: impl FnMut() -> bool) -> io::Result<u64> {
    let bind: SocketAddr = match config.from {
        Some(ip) => SocketAddr::new(ip, 0),
        None if config.to.is_ipv4() => "0.0.0.0:0".parse().expect("literal"),
        None => "[::]:0".parse().expect("literal"),
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(config.to)?;
    let mut rng = fastrand::Rng::new();
    let mut schedule = Schedule::new(Instant::now(), config.interval);
    let mut sent = 0u64;
    while config.count.is_none_or(|c| sent < c) && keep_going() {
        let due = jittered(schedule.nominal(), config.jitter, &mut rng);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let datagram = heartbeat(
            config.id,
            config.incarnation,
            config.first_seq + sent,
            config.key.as_ref(),
        );
        match socket.send(&datagram) {
            Ok(_) => {}
            // A transient error (no route yet, ICMP feedback) must not kill a heartbeat sender.
            Err(e) => log::warn!("sending heartbeat {}: {e}", config.first_seq + sent),
        }
        // Read after the send: a stop between a read before it and the send would go unseen,
        // and the next heartbeat, found late, would follow this one at once.
        schedule.sent(due, Instant::now());
        sent += 1;
    }
    Ok(sent)
}

/// When each heartbeat is due: start + k * interval while the sender keeps up, so a late
/// wake-up does not shift the heartbeats after it.
///
/// A heartbeat sent more than half an interval after it was due is a stall (a stopped process,
/// a paused VM, a frozen cgroup, a starved CPU), and the schedule starts again from it: the
/// slots the stall took are not made up. Sending them at once, as a fixed schedule would, puts
/// a run of near-zero intervals in the receiver's window, which widens it for a window's
/// length (replayed in docs/tuning.md, "A sender after a stall": a 20 ms sender's level-8
/// detection p99 went from 31 to 54 ms), and the stall itself is a silence that no catch-up
/// hides. So no heartbeat goes out less than half an interval after the one before (less the
/// jitter asked for), and the sequence numbers count only heartbeats sent: a stall does not
/// look like loss.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    nominal: Instant,
    interval: Duration,
}

impl Schedule {
    /// The first heartbeat is due at `start`.
    pub fn new(start: Instant, interval: Duration) -> Self {
        Self {
            nominal: start,
            interval,
        }
    }

    /// When the next heartbeat is due (before jitter).
    pub fn nominal(&self) -> Instant {
        self.nominal
    }

    /// The next heartbeat, due at `due` (its nominal time plus jitter), has gone out: `now` is
    /// read after the send returned, so it is never before the heartbeat left. Moves the
    /// schedule on to the one after it.
    pub fn sent(&mut self, due: Instant, now: Instant) {
        if now.saturating_duration_since(due) > self.interval / 2 {
            self.nominal = now;
        }
        self.nominal += self.interval;
    }
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

#[cfg(test)]
mod tests {
    use monitor_common::{
        auth::tag,
        wire::{FLAG_AUTH, HeartbeatHeader},
    };

    use super::*;

    /// Where each of `wakes` (ms after the start) puts the heartbeats: the schedule's nominal
    /// time for each, as ms after the start.
    fn nominals(interval_ms: u64, wakes: &[u64]) -> Vec<u64> {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut schedule = Schedule::new(start, ms(interval_ms));
        wakes
            .iter()
            .map(|&wake| {
                let due = schedule.nominal();
                let sent_at = (start + ms(wake)).max(due);
                schedule.sent(due, sent_at);
                (schedule.nominal() - start).as_millis() as u64
            })
            .collect()
    }

    #[test]
    fn a_late_wake_up_keeps_the_schedule() {
        // Woken 30 ms late for the third heartbeat (under half of 100 ms): the fourth is still
        // due at 300 ms, not 330.
        assert_eq!(nominals(100, &[0, 100, 230, 300]), [100, 200, 300, 400]);
    }

    #[test]
    fn a_stall_starts_the_schedule_again_instead_of_a_burst() {
        // Stalled from 150 to 520 ms: the heartbeat due at 200 goes out at 520, and the next
        // is due 100 ms after it, not at once for the slots 300, 400 and 500.
        assert_eq!(nominals(100, &[0, 100, 520, 600]), [100, 200, 620, 720]);
        // Just over half an interval late is a stall; exactly half is not.
        assert_eq!(nominals(100, &[0, 151]), [100, 251]);
        assert_eq!(nominals(100, &[0, 150]), [100, 200]);
    }

    #[test]
    fn no_heartbeat_follows_the_one_before_within_half_an_interval() {
        // Whatever the wake-ups, two sends (each at its wake or its due time, whichever is
        // later) are at least half an interval apart.
        let mut rng = fastrand::Rng::with_seed(7);
        let start = Instant::now();
        let interval = Duration::from_millis(20);
        let mut schedule = Schedule::new(start, interval);
        let mut clock = start;
        let mut last: Option<Instant> = None;
        for _ in 0..10_000 {
            let due = schedule.nominal();
            // Woken on time, a little late, or after a stall of up to ten intervals.
            let late = match rng.u8(0..10) {
                0 => Duration::from_micros(rng.u64(0..200_000)),
                1..=3 => Duration::from_micros(rng.u64(0..15_000)),
                _ => Duration::ZERO,
            };
            clock = clock.max(due) + late;
            schedule.sent(due, clock);
            if let Some(last) = last {
                assert!(clock - last >= interval / 2, "{:?} apart", clock - last);
            }
            last = Some(clock);
        }
    }

    #[test]
    fn a_heartbeat_is_the_header_and_signed_with_a_key() {
        let plain = heartbeat(7, 1, 42, None);
        assert_eq!(plain, HeartbeatHeader::new(7, 1, 42).to_bytes());
        assert_eq!(plain[24..], [0; 8]);
        let key = crate::peer::auth_key::parse_key("000102030405060708090a0b0c0d0e0f").unwrap();
        let signed = heartbeat(7, 1, 42, Some(&key));
        let header = HeartbeatHeader::decode(&signed).unwrap();
        assert_eq!(
            (header.peer_id(), header.incarnation(), header.seq()),
            (7, 1, 42)
        );
        assert_eq!(header.flags, FLAG_AUTH);
        assert_eq!(
            u64::from_le_bytes(header.tag),
            tag(&key, signed[..24].try_into().unwrap())
        );
        // The known answer the C and Python senders check in --self-test.
        let hex: String = signed.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "48420101000000010000000000000007000000000000002a40aad048c3a11742"
        );
    }
}
