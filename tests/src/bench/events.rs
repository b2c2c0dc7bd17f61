//! Event latency: a subscriber timing each suspect event from the crossing to its receipt.

use std::{
    collections::{HashMap, HashSet},
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::Value;

use super::Percentiles;
use crate::soak::unix_ms;

/// A subscriber that records, for every suspect event, how long after phi crossed its level
/// the event reached it (ms), until `expected` events or `timeout`; and that time split in
/// two: detection (the event's `at`, when the sweep raised it, less `crossed_at`; inside the
/// agent, to the millisecond `at` has) and delivery (received less `at`).
///
/// An event is received when the read that returned its line returned: every line of one
/// read is stamped with that read's time. The probe's own work on a line (finding it,
/// parsing it) is done after the read is stamped, and the lines are parsed after the last
/// one, so it never counts against the events that arrived with it or after it. (Stamping
/// each line as a buffered reader handed it out, after a syscall per line to set its read
/// timeout and a parse, counted about 0.6 us a line of this probe's own work against every
/// later line of a burst: over a millisecond for 2,000 events.)
pub struct EventProbe {
    stream: UnixStream,
}

/// Bytes asked for by each read: a burst of thousands of events in a few reads.
const READ_CHUNK: usize = 256 * 1024;

impl EventProbe {
    pub fn subscribe(socket: &Path) -> Self {
        let mut stream = UnixStream::connect(socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream
            .write_all(b"{\"op\":\"subscribe\"}\n")
            .expect("subscribe");
        // The reply, a byte at a time: nothing past its newline is taken from the socket.
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while byte[0] != b'\n' {
            stream.read_exact(&mut byte).expect("the subscribe reply");
            reply.push(byte[0]);
        }
        let reply: Value = serde_json::from_slice(&reply).expect("reply json");
        assert_eq!(reply["ok"], Value::Bool(true), "{reply}");
        Self { stream }
    }

    /// Collects until suspect events about ids in `ids`, crossed at or after
    /// `crossed_after_unix_ms`, at `expected` distinct (id, level) pairs (others are counted by
    /// kind but not timed), or `timeout`; each pair's last event is timed. The other peers'
    /// suspicions are counted by level, as `live@LEVEL` from `steady_after_unix_ms` on and as
    /// `start@LEVEL` before.
    pub fn collect(
        mut self,
        expected: usize,
        ids: std::ops::Range<u64>,
        crossed_after_unix_ms: f64,
        steady_after_unix_ms: f64,
        timeout: Duration,
    ) -> (EventLatency, HashMap<String, usize>) {
        let deadline = Instant::now() + timeout;
        // Every byte received, and each line's span in it with its read's stamp.
        let mut data: Vec<u8> = Vec::with_capacity(expected * 160);
        let mut lines: Vec<(usize, usize, f64)> = Vec::with_capacity(expected);
        let mut chunk = vec![0u8; READ_CHUNK];
        // The timed peers' (id, level) pairs seen since each peer was last heard, crossed at or
        // after the kill: a peer to be killed may be suspected while still alive (briefly at a
        // low level, or convicted at every level at the start, its first heartbeat after the
        // agent's first look), and those events must not stand in for the ones its death
        // raises. Such a suspicion crossed before the kill; one just before it whose silence
        // then ended is dropped by the peer's `recover`. So the probe waits for `expected`
        // pairs raised by silences that did not end, and keeps each pair's last. Each pair
        // maps to the end of its latest line.
        let mut timed: HashMap<(u64, u64), usize> = HashMap::with_capacity(expected);
        let mut line_start = 0;
        while timed.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let n = match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let received = unix_ms();
            let scanned = data.len();
            data.extend_from_slice(&chunk[..n]);
            for newline in memchr_all(b'\n', &data[scanned..]) {
                let end = scanned + newline;
                let line = &data[line_start..end];
                match timed_event(line, &ids) {
                    Some(Timed::Suspect(id, level))
                        if crossed_at(line).is_some_and(|at| at >= crossed_after_unix_ms) =>
                    {
                        timed.insert((id, level), end);
                    }
                    Some(Timed::Recover(id)) => timed.retain(|&(of, _), _| of != id),
                    // Crossed before the kill: counted apart below.
                    Some(Timed::Suspect(..)) | None => {}
                }
                lines.push((line_start, end, received));
                line_start = end + 1;
            }
        }
        // The lines are sorted out after the last one (see the type's comment).
        #[derive(serde::Deserialize)]
        struct Kind<'a> {
            event: &'a str,
            id: Option<u64>,
            level: Option<f64>,
            crossed_at: Option<f64>,
        }
        // Each timed pair's last event: the line it ends at.
        let last_of_pair: HashSet<usize> = timed.into_values().collect();
        let mut kinds: HashMap<String, usize> = HashMap::new();
        let mut latencies = Vec::with_capacity(expected);
        let mut detection = Vec::with_capacity(expected);
        let mut delivery = Vec::with_capacity(expected);
        // The timed peers' silence when the event was raised (`silence_ms`), by level.
        let mut silences: Vec<(f64, f64)> = Vec::with_capacity(expected);
        for &(start, end, received) in &lines {
            let line = &data[start..end];
            let kind: Kind = serde_json::from_slice(line).expect("event json");
            *kinds.entry(kind.event.to_string()).or_default() += 1;
            let timed_id = kind.id.is_some_and(|id| ids.contains(&id));
            if kind.event == "suspect" && timed_id && !last_of_pair.contains(&end) {
                // An earlier suspicion of a peer to be killed, while it was alive (it was
                // heard again after it, or the same level was raised again later): counted
                // apart, not timed.
                *kinds
                    .entry("timed_peer_before_its_last".into())
                    .or_default() += 1;
            } else if kind.event == "suspect" && timed_id {
                let event: Value = serde_json::from_slice(line).expect("event json");
                let crossed = event["crossed_at"].as_f64().expect("crossed_at");
                let at = event["at"].as_f64().expect("at");
                latencies.push(received - crossed);
                detection.push(at - crossed);
                delivery.push(received - at);
                if let (Some(level), Some(silence)) = (kind.level, event["silence_ms"].as_f64()) {
                    silences.push((level, silence));
                }
            } else if kind.event == "suspect" {
                // A peer that was not killed, suspected: counted by level (`live@8`), so a
                // false conviction stands apart from the lower levels' expected share.
                let level = kind.level.map_or("-".into(), |l| l.to_string());
                let when = if kind.crossed_at.is_some_and(|at| at < steady_after_unix_ms) {
                    "start"
                } else {
                    "live"
                };
                *kinds.entry(format!("{when}@{level}")).or_default() += 1;
            }
        }
        // The highest level any timed peer reached: what its conviction took after its last
        // heartbeat.
        let top = silences
            .iter()
            .map(|&(level, _)| level)
            .max_by(f64::total_cmp);
        let latency = EventLatency {
            total: Percentiles::of(latencies),
            detection: Percentiles::of(detection),
            delivery: Percentiles::of(delivery),
            top_level: top,
            silence_at_top: Percentiles::of(
                silences
                    .iter()
                    .filter(|&&(level, _)| Some(level) == top)
                    .map(|&(_, silence)| silence)
                    .collect(),
            ),
        };
        (latency, kinds)
    }
}

/// The offsets of `byte` in `bytes`.
fn memchr_all(byte: u8, bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    bytes
        .iter()
        .enumerate()
        .filter(move |&(_, &b)| b == byte)
        .map(|(i, _)| i)
}

/// A suspect event's `crossed_at` (a parse: only the timed peers' lines, a few).
fn crossed_at(line: &[u8]) -> Option<f64> {
    #[derive(serde::Deserialize)]
    struct Crossed {
        crossed_at: f64,
    }
    serde_json::from_slice::<Crossed>(line)
        .ok()
        .map(|c| c.crossed_at)
}

/// What the probe times of a line: a suspicion of a timed peer, or its recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timed {
    /// Id and level (its bits).
    Suspect(u64, u64),
    Recover(u64),
}

/// What `line` is to the probe if it is a suspect or recover event about an id in `ids`: a
/// look at the line's head as the agent writes it (docs/socket-protocol.md), a parse only for
/// a line that starts otherwise.
fn timed_event(line: &[u8], ids: &std::ops::Range<u64>) -> Option<Timed> {
    const SUSPECT: &[u8] = b"{\"event\":\"suspect\",\"id\":";
    const RECOVER: &[u8] = b"{\"event\":\"recover\",\"id\":";
    const LEVEL: &[u8] = b",\"level\":";
    let id_of = |rest: &[u8]| {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let id = std::str::from_utf8(&rest[..digits])
            .ok()
            .and_then(|d| d.parse::<u64>().ok());
        (id, digits)
    };
    if let Some(rest) = line.strip_prefix(SUSPECT) {
        let (id, digits) = id_of(rest);
        let level = rest[digits..].strip_prefix(LEVEL).and_then(|r| {
            let len = r.iter().take_while(|&&b| b != b',' && b != b'}').count();
            std::str::from_utf8(&r[..len]).ok()?.parse::<f64>().ok()
        });
        if let (Some(id), Some(level)) = (id, level) {
            return ids
                .contains(&id)
                .then_some(Timed::Suspect(id, level.to_bits()));
        }
    } else if let Some(rest) = line.strip_prefix(RECOVER)
        && let (Some(id), _) = id_of(rest)
    {
        return ids.contains(&id).then_some(Timed::Recover(id));
    }
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        event: &'a str,
        id: Option<u64>,
        level: Option<f64>,
    }
    let head = serde_json::from_slice::<Head>(line).ok()?;
    match (head.event, head.id, head.level) {
        ("suspect", Some(id), Some(level)) if ids.contains(&id) => {
            Some(Timed::Suspect(id, level.to_bits()))
        }
        ("recover", Some(id), _) if ids.contains(&id) => Some(Timed::Recover(id)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspect_or_recover_of_a_timed_id_is_told_by_its_head_or_by_a_parse() {
        let ids = 1..3;
        let line = br#"{"event":"suspect","id":2,"level":1.0,"phi":1.02,"silence_ms":150.3,"at":1,"crossed_at":0.5}"#;
        assert_eq!(
            timed_event(line, &ids),
            Some(Timed::Suspect(2, 1.0f64.to_bits()))
        );
        let other = br#"{"event":"suspect","id":3,"level":1.0,"phi":1.02,"silence_ms":150.3,"at":1,"crossed_at":0.5}"#;
        assert_eq!(timed_event(other, &ids), None);
        // Fields in another order: parsed.
        let reordered = br#"{"id":1,"event":"suspect","level":8.0}"#;
        assert_eq!(
            timed_event(reordered, &ids),
            Some(Timed::Suspect(1, 8.0f64.to_bits()))
        );
        let recover = br#"{"event":"recover","id":1,"level":8.0,"silence_ms":5120.0,"at":1}"#;
        assert_eq!(timed_event(recover, &ids), Some(Timed::Recover(1)));
        let reordered = br#"{"id":2,"event":"recover"}"#;
        assert_eq!(timed_event(reordered, &ids), Some(Timed::Recover(2)));
        let untimed = br#"{"event":"recover","id":7,"level":8.0,"silence_ms":5120.0,"at":1}"#;
        assert_eq!(timed_event(untimed, &ids), None);
        assert_eq!(timed_event(br#"{"event":"lagged","missed":3}"#, &ids), None);
    }

    /// A peer to be killed, convicted at the start (its first heartbeat came after the agent's
    /// first look) and heard again, has those events stand for nothing: they crossed before the
    /// kill, so the probe waits for the ones its death raises, and times those. The startup's
    /// three levels once completed the probe's pairs and ended it at the start, timing them
    /// (40 ms after their crossings, 55 ms into the silence: the bench's "late" 10 ms runs).
    #[test]
    fn suspicions_of_a_peer_heard_since_are_not_its_death() {
        let (ours, mut agent) = UnixStream::pair().unwrap();
        let suspect = |level: f64, at: u64| {
            format!(
                r#"{{"event":"suspect","id":1,"level":{level:?},"phi":9.0,"silence_ms":55.0,"at":{at},"crossed_at":{}}}"#,
                at as f64 - 40.0
            )
        };
        let mut start: Vec<String> = [1.0, 3.0, 8.0].iter().map(|&l| suspect(l, 1000)).collect();
        start.push(r#"{"event":"recover","id":1,"level":8.0,"silence_ms":60.0,"at":1001}"#.into());
        // A peer not killed, suspected at the start (listed before it sent) and in the steady
        // stream (after 2,000 here).
        for crossed in [960.0, 2500.0] {
            start.push(format!(
                r#"{{"event":"suspect","id":5,"level":1.0,"phi":1.1,"silence_ms":13.0,"at":{crossed},"crossed_at":{crossed}}}"#
            ));
        }
        // Its death: the same levels, each raised as it crossed.
        let death: Vec<String> = [1.0, 3.0, 8.0]
            .iter()
            .map(|level| {
                format!(
                    r#"{{"event":"suspect","id":1,"level":{level:?},"phi":9.0,"silence_ms":21.0,"at":5000,"crossed_at":4999.9}}"#
                )
            })
            .collect();
        // A probe that stopped early has closed its end: what it missed is its failure.
        let write = |agent: &mut UnixStream, lines: &[String]| {
            for line in lines {
                let _ = agent.write_all(format!("{line}\n").as_bytes());
            }
        };
        write(&mut agent, &start);
        let writer = std::thread::spawn(move || {
            // The death comes after the probe read the start: once nothing is left unread.
            let unread = || {
                let mut n: libc::c_int = 0;
                // SAFETY: SIOCOUTQ writes one int, the bytes the peer has not read yet.
                let ok = unsafe {
                    libc::ioctl(
                        std::os::fd::AsRawFd::as_raw_fd(&agent),
                        libc::TIOCOUTQ,
                        &mut n,
                    )
                };
                assert_eq!(ok, 0, "SIOCOUTQ");
                n
            };
            while unread() > 0 {
                std::thread::yield_now();
            }
            write(&mut agent, &death);
            agent
        });
        let probe = EventProbe { stream: ours };
        // The kill, between the start's crossings (960 ms) and the death's (4999.9 ms).
        let (latency, kinds) = probe.collect(3, 1..2, 4000.0, 2000.0, Duration::from_secs(10));
        drop(writer.join().unwrap());
        assert_eq!(latency.detection.count, 3, "{latency:?}");
        assert!(
            latency.detection.max < 1.0,
            "the death's events timed, not the start's: {latency:?}"
        );
        assert_eq!(kinds["timed_peer_before_its_last"], 3, "{kinds:?}");
        assert_eq!(kinds["recover"], 1, "{kinds:?}");
        assert_eq!((kinds["start@1"], kinds["live@1"]), (1, 1), "{kinds:?}");
    }
}

/// Event latency, crossing to receipt, and its two parts (see `EventProbe`).
#[derive(Debug, Clone, Serialize)]
pub struct EventLatency {
    pub total: Percentiles,
    pub detection: Percentiles,
    pub delivery: Percentiles,
    /// The highest level the timed peers' events reached, if any was timed.
    pub top_level: Option<f64>,
    /// The timed peers' silence (since their last heartbeat) when that level was raised, ms:
    /// how long after the last heartbeat a killed peer was convicted.
    pub silence_at_top: Percentiles,
}
