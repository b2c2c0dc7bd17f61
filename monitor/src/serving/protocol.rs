//! Socket protocol v1: one JSON object per line each way (docs/socket-protocol.md).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{
    serving::peer_view::PeerView,
    serving::recording::{MAX_RECORD_MS, MAX_RECORD_PEERS},
};

/// The socket protocol's major version (docs/socket-protocol.md), reported by `stats` as
/// `protocol`. A change that an existing client could misread raises it; new fields, events
/// and requests do not.
pub const PROTOCOL_VERSION: u32 = 1;

/// An agent that does not report `protocol` speaks version 1, the first.
fn protocol_v1() -> u32 {
    1
}

/// Longest request line the agent reads; longer lines get an error reply and are discarded.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// One peer by id; with `window`, also its window's intervals, sums and loss counters.
    Peer {
        id: u64,
        #[serde(default)]
        window: bool,
    },
    /// Every admitted peer; with `addr`, those whose packets come from that address; with
    /// `source` ("heartbeat", "bfd", "udp"), those of that source.
    Peers {
        #[serde(default)]
        addr: Option<std::net::IpAddr>,
        #[serde(default)]
        source: Option<PeerSource>,
    },
    /// Peers whose phi is at least `threshold` (default: the highest level).
    Suspects {
        #[serde(default)]
        threshold: Option<f64>,
    },
    /// Turn this connection into a stream of events.
    Subscribe,
    /// Stop watching a peer and free its slot.
    Forget { id: u64 },
    /// Agent and kernel counters.
    Stats,
    /// Turn this connection into a stream of every arrival of these peers, as the kernel
    /// stamped and judged it, for `duration_ms` (default: until the client hangs up).
    Record {
        ids: Vec<u64>,
        #[serde(default)]
        duration_ms: Option<u64>,
    },
}

/// The `op` label of a line that was no request (see `Request::op`).
pub const INVALID_OP: &str = "invalid";

impl Request {
    /// Its `op` as the wire spells it: the label of the request-duration metric.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Peer { .. } => "peer",
            Request::Peers { .. } => "peers",
            Request::Suspects { .. } => "suspects",
            Request::Subscribe => "subscribe",
            Request::Forget { .. } => "forget",
            Request::Stats => "stats",
            Request::Record { .. } => "record",
        }
    }

    /// `peers` with no filter.
    pub const ALL_PEERS: Request = Request::Peers {
        addr: None,
        source: None,
    };
}

/// What a peer's heartbeats are (`PeerView::source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerSource {
    Heartbeat,
    Bfd,
    Udp,
}

impl PeerSource {
    pub fn name(self) -> &'static str {
        match self {
            PeerSource::Heartbeat => "heartbeat",
            PeerSource::Bfd => "bfd",
            PeerSource::Udp => "udp",
        }
    }
}

const OPS: &str = "peer, peers, suspects, subscribe, forget, stats, record";

/// Parses one request line into a request or a message saying what is wrong with it.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err("a request must be a JSON object with an \"op\" field".into());
    };
    match object.get("op") {
        None => return Err(format!("missing \"op\" (one of: {OPS})")),
        Some(Value::String(_)) => {}
        Some(_) => return Err(format!("\"op\" must be a string (one of: {OPS})")),
    }
    let request: Request =
        serde_json::from_value(value).map_err(|e| format!("invalid request: {e}"))?;
    if let Request::Suspects { threshold: Some(t) } = request
        && !(t.is_finite() && t > 0.0)
    {
        return Err(format!(
            "threshold must be a positive finite number, got {t}"
        ));
    }
    if let Request::Record { ids, duration_ms } = &request {
        if ids.is_empty() || ids.len() > MAX_RECORD_PEERS {
            return Err(format!(
                "record takes 1 to {MAX_RECORD_PEERS} peer ids, got {}",
                ids.len()
            ));
        }
        if let Some(ms) = duration_ms
            && !(1..=MAX_RECORD_MS).contains(ms)
        {
            return Err(format!(
                "duration_ms must be 1..={MAX_RECORD_MS} (a day), got {ms}"
            ));
        }
    }
    Ok(request)
}

/// Why reported peers were or were not admitted (`stats`' `admission`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AdmissionCounters {
    pub admitted: u64,
    pub disabled: u64,
    pub outside_ranges: u64,
    pub rate_limited: u64,
    pub full: u64,
    /// Refused because the source already had `--admit-per-source` peers admitted.
    #[serde(default)]
    pub per_source: u64,
    /// Refused because the id's probe in the kernel's index was full.
    #[serde(default)]
    pub index_full: u64,
    /// Heartbeat ids in the half of the id space that names passive peers (`--bfd`, `--udp-port`).
    #[serde(default)]
    pub reserved: u64,
}

/// Agent-level facts reported by `stats`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentStats {
    /// The socket protocol's major version ([`PROTOCOL_VERSION`]); 1 if the agent does not
    /// say (agents before the field was added speak version 1).
    #[serde(default = "protocol_v1")]
    pub protocol: u32,
    pub iface: String,
    pub xdp_mode: String,
    pub port: u16,
    pub window: u32,
    pub model: String,
    pub levels: Vec<f64>,
    pub peers: usize,
    pub capacity: u32,
    pub uptime_s: f64,
    /// Sweeps run, and sweeps after which new suspicions were held because the agent itself
    /// had not been scheduled for longer than the stall bound.
    pub sweeps: u64,
    pub stalls: u64,
    /// Slot reads the sweeps made to refresh an estimate (a new peer, a heartbeat its floors
    /// do not cover, a silence nearing a level, a suspected peer heard again): the agent's
    /// cost grows with these, not with heartbeats.
    #[serde(default)]
    pub refreshes: u64,
    /// Floors the sweeps renewed from the last-heard words alone, without a slot read (a
    /// full window that took every interval since its refresh: docs/tuning.md).
    #[serde(default)]
    pub refloors: u64,
    /// Passes over the slots due before the next scan (the sweeper woke at a deadline, or
    /// for a peer just admitted), and the slots they looked at: docs/tuning.md, "Events at
    /// their deadline".
    #[serde(default)]
    pub due_passes: u64,
    #[serde(default)]
    pub due_looks: u64,
    /// Seconds spent in scans and due passes, from the pass's start to its end (wall time on
    /// the sweeper's thread): the agent's own work at its sweeps, apart from waking for them
    /// and from its other threads (docs/tuning.md, "Where the agent's CPU goes").
    #[serde(default)]
    pub pass_s: f64,
    /// Heartbeats of suspected peers the kernel told the agent of as they arrived, each looked
    /// at then rather than at the next scan (docs/tuning.md, "A suspected peer heard again").
    #[serde(default)]
    pub heard_told: u64,
    /// Sweeps that left the words alone: no word stored since the last scan and no deadline
    /// before the next (docs/tuning.md, "An idle agent leaves the words alone").
    #[serde(default)]
    pub scans_skipped: u64,
    /// Events published, and subscribers connected now.
    pub events: u64,
    pub subscribers: usize,
    /// What the XDP program decided, summed over CPUs.
    pub kernel: KernelCounters,
    /// The kernel's accounting of the XDP program (zero unless kernel.bpf_stats_enabled=1).
    pub xdp: XdpRunStats,
    /// What became of first heartbeats from unknown peers.
    pub admission: AdmissionCounters,
    /// SIGHUP re-reads of the `--config` file: applied, and refused (the file was bad; the
    /// running configuration was kept).
    #[serde(default)]
    pub config_reloads: u64,
    #[serde(default)]
    pub config_reload_failures: u64,
    /// SIGHUP re-reads of `--auth-key-file` that installed a new key, and that failed (the
    /// keys in use stay).
    #[serde(default)]
    pub key_rotations: u64,
    #[serde(default)]
    pub key_rotation_failures: u64,
    /// How the running XDP program came to run, and its tag.
    #[serde(default)]
    pub program: ProgramOrigin,
    /// The monitored interface's link (docs/socket-protocol.md, `link_down`).
    #[serde(default)]
    pub link: LinkStats,
}

/// The monitored interface's link as the sweep sees it: whether it is up, how often it went
/// down or up since the start, and whether new suspicions are held now (the link is down,
/// within `--link-grace` of its return, or the agent itself just stalled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    pub up: bool,
    pub changes: u64,
    pub holding: bool,
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            up: true,
            changes: 0,
            holding: false,
        }
    }
}

/// How the agent came by the XDP program it runs (docs/operations.md, "Upgrades").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramOrigin {
    /// `loaded` (this agent loaded and attached it), `adopted` (pinned state whose program
    /// is this build's) or `upgraded` (pinned state whose program was another build's,
    /// replaced by this build's through the pinned link, every map kept).
    pub start: String,
    /// The kernel's tag of the running program (as `bpftool prog` shows it).
    pub tag: String,
    /// After an upgrade, the tag of the program it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_tag: Option<String>,
}

/// The XDP program's verdict counters, summed over CPUs, as `stats` carries them: the kernel
/// side's own totals, carried as they are (one type, so a counter the program adds is on the
/// wire with no conversion to keep in step).
pub use crate::kernel::counters::CounterTotals as KernelCounters;

/// The kernel's own accounting of the XDP program, as `stats` carries it: runs and total run
/// time, both zero unless `kernel.bpf_stats_enabled` is 1.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct XdpRunStats {
    pub run_count: u64,
    pub run_time_ns: u64,
}

pub fn ok_reply(key: &str, value: impl Serialize) -> Value {
    let mut map = Map::new();
    map.insert("ok".into(), Value::Bool(true));
    map.insert(
        key.into(),
        serde_json::to_value(value).unwrap_or_else(|e| json!(format!("unserialisable: {e}"))),
    );
    Value::Object(map)
}

pub fn error_reply(message: impl Into<String>) -> Value {
    json!({ "ok": false, "error": message.into() })
}

/// Why a `peer` or `peers` request has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The agent does not watch this id.
    #[error("unknown peer {0}")]
    Unknown(u64),
    /// The peer's slot kept changing through every read the agent tried (its heartbeats were
    /// being recorded on several CPUs at once): the request can simply be repeated.
    #[error("peer {0} busy: its slot kept changing while it was read; retry")]
    Busy(u64),
}

impl PeerError {
    /// The error reply: `{"ok":false,"error":...}`, plus `"busy":true` for [`PeerError::Busy`].
    pub fn reply(&self) -> Value {
        let mut reply = error_reply(self.to_string());
        if matches!(self, PeerError::Busy(_)) {
            reply["busy"] = Value::Bool(true);
        }
        reply
    }
}

/// Whether an error reply says "busy, retry" ([`PeerError::Busy`]).
pub fn is_busy(reply: &Value) -> bool {
    reply.get("busy") == Some(&Value::Bool(true))
}

/// A reply as a client sees it.
pub fn into_result(reply: Value) -> Result<Value, String> {
    match reply.get("ok") {
        Some(Value::Bool(true)) => Ok(reply),
        _ => Err(reply
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("malformed reply from the agent")
            .to_string()),
    }
}

/// Typed views of replies, for clients.
#[derive(Debug, Deserialize)]
pub struct PeerReply {
    pub peer: PeerView,
}

#[derive(Debug, Deserialize)]
pub struct PeersReply {
    pub peers: Vec<PeerView>,
}

#[derive(Debug, Deserialize)]
pub struct StatsReply {
    pub stats: AgentStats,
}

#[derive(Debug, Deserialize)]
pub struct SuspectsReply {
    pub threshold: f64,
    pub suspects: Vec<PeerView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_op_label_is_the_wire_name() {
        for request in [
            Request::Peer {
                id: 1,
                window: false,
            },
            Request::ALL_PEERS,
            Request::Suspects { threshold: None },
            Request::Subscribe,
            Request::Forget { id: 1 },
            Request::Stats,
            Request::Record {
                ids: vec![1],
                duration_ms: None,
            },
        ] {
            let wire = serde_json::to_value(&request).unwrap();
            assert_eq!(wire["op"], json!(request.op()), "{request:?}");
        }
        // And no request takes the name of the label of lines that are none.
        assert!(parse_request(r#"{"op":"invalid"}"#).is_err());
    }

    #[test]
    fn busy_and_unknown_are_told_apart() {
        let busy = PeerError::Busy(7).reply();
        assert_eq!(busy["ok"], json!(false));
        assert!(is_busy(&busy), "{busy}");
        assert!(busy["error"].as_str().unwrap().contains("busy"), "{busy}");
        let unknown = PeerError::Unknown(8).reply();
        assert_eq!(unknown, json!({"ok": false, "error": "unknown peer 8"}));
        assert!(!is_busy(&unknown));
    }

    #[test]
    fn parses_each_op() {
        assert_eq!(
            parse_request(r#"{"op":"peer","id":7}"#),
            Ok(Request::Peer {
                id: 7,
                window: false
            })
        );
        assert_eq!(parse_request(r#"{"op":"peers"}"#), Ok(Request::ALL_PEERS));
        assert_eq!(
            parse_request(r#"{"op":"peers","addr":"fd00::2","source":"bfd"}"#),
            Ok(Request::Peers {
                addr: Some("fd00::2".parse().unwrap()),
                source: Some(PeerSource::Bfd),
            })
        );
        let bad_addr = parse_request(r#"{"op":"peers","addr":"10.0.0"}"#).unwrap_err();
        assert!(bad_addr.contains("invalid"), "{bad_addr}");
        let bad_source = parse_request(r#"{"op":"peers","source":"tcp"}"#).unwrap_err();
        assert!(
            bad_source.contains("heartbeat") && bad_source.contains("udp"),
            "{bad_source}"
        );
        assert_eq!(parse_request(r#" {"op":"stats"} "#), Ok(Request::Stats));
        assert_eq!(
            parse_request(r#"{"op":"suspects"}"#),
            Ok(Request::Suspects { threshold: None })
        );
        assert_eq!(
            parse_request(r#"{"op":"suspects","threshold":3.5}"#),
            Ok(Request::Suspects {
                threshold: Some(3.5)
            })
        );
        // Found by the fuzzer: numbers are parsed correctly rounded, so a request survives a
        // round trip through its own JSON (serde_json's float_roundtrip).
        let line = format!(r#"{{"op":"suspects","threshold":54{}}}"#, "4".repeat(85));
        let request = parse_request(&line).unwrap();
        assert_eq!(
            parse_request(&serde_json::to_string(&request).unwrap()),
            Ok(request)
        );
        assert_eq!(
            parse_request(r#"{"op":"subscribe"}"#),
            Ok(Request::Subscribe)
        );
        assert_eq!(
            parse_request(r#"{"op":"forget","id":3}"#),
            Ok(Request::Forget { id: 3 })
        );
        assert_eq!(
            parse_request(r#"{"op":"record","ids":[3,4],"duration_ms":1500}"#),
            Ok(Request::Record {
                ids: vec![3, 4],
                duration_ms: Some(1500)
            })
        );
        assert_eq!(
            parse_request(r#"{"op":"peer","id":3,"window":true}"#),
            Ok(Request::Peer {
                id: 3,
                window: true
            })
        );
        for bad in [
            r#"{"op":"record","ids":[]}"#,
            r#"{"op":"record","ids":[1],"duration_ms":0}"#,
            r#"{"op":"record","ids":[1],"duration_ms":99999999999}"#,
            r#"{"op":"record"}"#,
        ] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_request(r#"{"op":"peer","id":18446744073709551615}"#),
            Ok(Request::Peer {
                id: u64::MAX,
                window: false
            })
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let cases = [
            ("", "invalid JSON"),
            ("{", "invalid JSON"),
            ("[1]", "JSON object"),
            ("{}", "missing \"op\""),
            (r#"{"op":7}"#, "must be a string"),
            (r#"{"op":"nope"}"#, "unknown variant `nope`"),
            (r#"{"op":"peer"}"#, "missing field `id`"),
            (r#"{"op":"peer","id":-1}"#, "invalid value"),
            (r#"{"op":"peer","id":"7"}"#, "invalid type"),
            (r#"{"op":"peer","id":1e300}"#, "invalid type"),
            (r#"{"op":"peer","id":18446744073709551616}"#, "invalid"),
            (r#"{"op":"peer","id":7,"extra":1}"#, "unknown field `extra`"),
            (r#"{"op":"suspects","threshold":0}"#, "positive finite"),
            (r#"{"op":"suspects","threshold":-2}"#, "positive finite"),
            (r#"{"op":"suspects","threshold":"high"}"#, "invalid type"),
            (r#"{"op":"forget"}"#, "missing field `id`"),
        ];
        for (line, expected) in cases {
            let err = parse_request(line).expect_err(line);
            assert!(
                err.contains(expected),
                "{line:?} -> {err:?}, expected {expected:?}"
            );
        }
    }

    #[test]
    fn replies_have_the_documented_shape() {
        assert_eq!(
            ok_reply("stats", json!({"a":1})),
            json!({"ok":true,"stats":{"a":1}})
        );
        assert_eq!(error_reply("no"), json!({"ok":false,"error":"no"}));
        assert_eq!(into_result(error_reply("no")), Err("no".to_string()));
    }
}
