//! Socket protocol v1: one JSON object per line each way (docs/socket-protocol.md).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{counters::CounterTotals, peer_view::PeerView};

/// Longest request line the agent reads; longer lines get an error reply and are discarded.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// One peer by id.
    Peer { id: u64 },
    /// Every admitted peer.
    Peers,
    /// Agent and kernel counters.
    Stats,
}

/// Parses one request line into a request or a message saying what is wrong with it.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err("a request must be a JSON object with an \"op\" field".into());
    };
    match object.get("op") {
        None => return Err("missing \"op\" (one of: peer, peers, stats)".into()),
        Some(Value::String(_)) => {}
        Some(_) => return Err("\"op\" must be a string (one of: peer, peers, stats)".into()),
    }
    serde_json::from_value(value).map_err(|e| format!("invalid request: {e}"))
}

/// Agent-level facts reported by `stats`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentStats {
    pub iface: String,
    pub xdp_mode: String,
    pub port: u16,
    pub window: u32,
    pub peers: usize,
    pub capacity: u32,
    pub uptime_s: f64,
    /// What the XDP program decided, summed over CPUs.
    pub kernel: CounterTotals,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_op() {
        assert_eq!(
            parse_request(r#"{"op":"peer","id":7}"#),
            Ok(Request::Peer { id: 7 })
        );
        assert_eq!(parse_request(r#"{"op":"peers"}"#), Ok(Request::Peers));
        assert_eq!(parse_request(r#" {"op":"stats"} "#), Ok(Request::Stats));
        assert_eq!(
            parse_request(r#"{"op":"peer","id":18446744073709551615}"#),
            Ok(Request::Peer { id: u64::MAX })
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
