//! What travels through NATS, as JSON: the events on the stream, the verdicts and liveness
//! records in the bucket, and how keys and subjects are spelled. Everything read back is
//! validated here; a message that fails is a [`WireError`], counted and skipped by the
//! caller, never a crash.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::FleetError;
use crate::serving::event::Event;

/// Subject prefix of the event stream: one subject per observer.
pub const EVENT_SUBJECT_PREFIX: &str = "heartbeat.events.";
/// Bucket key prefix of the observers' liveness records.
pub const OBSERVER_KEY_PREFIX: &str = "observers.";
/// Longest observer name (keys and subjects stay short).
pub const MAX_OBSERVER_LEN: usize = 64;

/// Why a message from NATS was not used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("key {0:?} is neither <peer>.<observer> nor observers.<observer>")]
    Key(String),
    #[error("subject {0:?} is not heartbeat.events.<observer>")]
    Subject(String),
    #[error("{what}: {reason}")]
    Value { what: String, reason: String },
}

fn bad(what: impl Into<String>, reason: impl ToString) -> WireError {
    WireError::Value {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// An observer's name: letters, digits, `-` and `_` (no dots: it is one token of a subject
/// and of a key), 1 to 64 bytes.
pub fn validate_observer(name: &str) -> Result<(), FleetError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_OBSERVER_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(FleetError::Observer(name.to_string()))
    }
}

/// A default observer name from a host name: its first label, other bytes replaced by `-`.
pub fn observer_from_hostname(host: &str) -> String {
    let label = host.split('.').next().unwrap_or_default();
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_OBSERVER_LEN)
        .collect();
    if name.is_empty() {
        "monitor".into()
    } else {
        name
    }
}

/// What a bucket key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `<peer>.<observer>`: that observer's verdict on that peer.
    Verdict { peer: u64, observer: String },
    /// `observers.<observer>`: that observer's liveness record.
    Observer(String),
}

impl Key {
    pub fn verdict(peer: u64, observer: &str) -> String {
        format!("{peer}.{observer}")
    }

    pub fn observer(observer: &str) -> String {
        format!("{OBSERVER_KEY_PREFIX}{observer}")
    }

    pub fn parse(key: &str) -> Result<Self, WireError> {
        let err = || WireError::Key(key.to_string());
        let (head, observer) = key.split_once('.').ok_or_else(err)?;
        validate_observer(observer).map_err(|_| err())?;
        if head == "observers" {
            return Ok(Key::Observer(observer.to_string()));
        }
        // Decimal only, as written: no sign, no leading zeros (one spelling per peer).
        if head.is_empty()
            || !head.bytes().all(|b| b.is_ascii_digit())
            || (head.len() > 1 && head.starts_with('0'))
        {
            return Err(err());
        }
        let peer = head.parse().map_err(|_| err())?;
        Ok(Key::Verdict {
            peer,
            observer: observer.to_string(),
        })
    }
}

/// The observer named by an event subject.
pub fn observer_of_subject(subject: &str) -> Result<&str, WireError> {
    subject
        .strip_prefix(EVENT_SUBJECT_PREFIX)
        .filter(|o| validate_observer(o).is_ok())
        .ok_or_else(|| WireError::Subject(subject.to_string()))
}

fn finite(what: &str, field: &str, v: f64) -> Result<(), WireError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(bad(what, format!("{field} is not a finite number")))
    }
}

/// One observer's current verdict on one peer: the value of `<peer>.<observer>`, present
/// while the peer is suspected at some level, deleted on recovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// The highest level phi has crossed.
    pub level: f64,
    /// phi when that level was crossed (or when the verdict was re-published).
    pub phi: f64,
    /// Unix ms when the peer was last heard: the silence began then.
    pub since: f64,
    /// Unix ms when phi crossed `level` (null when re-published from state).
    #[serde(default)]
    pub crossed_at: Option<f64>,
    /// Unix ms when the observer wrote this.
    pub at: u64,
}

impl Verdict {
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        let what = "verdict";
        let v: Verdict = serde_json::from_slice(bytes).map_err(|e| bad(what, e))?;
        finite(what, "level", v.level)?;
        finite(what, "since", v.since)?;
        if let Some(c) = v.crossed_at {
            finite(what, "crossed_at", c)?;
        }
        // phi may be huge (the fixed model's infinity is written as f64::MAX) but not NaN.
        if v.phi.is_nan() {
            return Err(bad(what, "phi is not a number"));
        }
        if v.level <= 0.0 {
            return Err(bad(what, "level must be positive"));
        }
        Ok(v)
    }
}

/// An observer's liveness record (`observers.<observer>`), rewritten every second; its
/// counters tell how its publishing goes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Liveness {
    /// Unix ms of this write, by the observer's clock.
    pub at: u64,
    /// Unix ms when the observer's publisher started.
    pub started: u64,
    /// The observer's levels.
    pub levels: Vec<f64>,
    /// Peers it suspects now (at its lowest level).
    pub suspects: u64,
    /// Events taken from the agent (each gets the next `seq`).
    pub events: u64,
    /// Events acknowledged by the stream.
    pub published: u64,
    /// Events it had to drop (its buffer overflowed during an outage, or it lagged behind
    /// the agent); each drop is followed by a re-publication of its whole state.
    pub dropped: u64,
    /// Re-publications of its whole state (start, reconnects, after drops).
    pub resyncs: u64,
    /// Events waiting to be published.
    pub buffered: u64,
}

impl Liveness {
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        serde_json::from_slice(bytes).map_err(|e| bad("liveness record", e))
    }
}

/// An event as published on `heartbeat.events.<observer>`: the agent's event (its socket
/// form, so new kinds flow through unchanged) with the observer and its sequence number.
pub fn event_payload(observer: &str, seq: u64, event: &Event) -> Vec<u8> {
    let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("observer".into(), observer.into());
        map.insert("seq".into(), seq.into());
    }
    serde_json::to_vec(&value).unwrap_or_default()
}

/// What an observer publishes when it re-sends its whole state.
pub fn resync_payload(observer: &str, seq: u64, reason: &str, suspects: usize, at: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "event": "resync",
        "observer": observer,
        "seq": seq,
        "reason": reason,
        "suspects": suspects,
        "at": at,
    }))
    .unwrap_or_default()
}

/// An event read from the stream: its kind, observer and sequence number checked, the rest
/// kept as it came (kinds this version does not know pass through).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetEvent {
    pub observer: String,
    pub seq: u64,
    pub kind: String,
    pub id: Option<u64>,
    pub level: Option<f64>,
    pub crossed_at: Option<f64>,
    /// The whole message.
    pub body: Value,
}

impl FleetEvent {
    pub fn parse(subject: &str, bytes: &[u8]) -> Result<Self, WireError> {
        let observer = observer_of_subject(subject)?;
        let what = "event";
        let body: Value = serde_json::from_slice(bytes).map_err(|e| bad(what, e))?;
        let obj = body
            .as_object()
            .ok_or_else(|| bad(what, "not a JSON object"))?;
        let kind = obj
            .get("event")
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| bad(what, "no \"event\" kind"))?
            .to_string();
        let named = obj.get("observer").and_then(Value::as_str);
        if named != Some(observer) {
            return Err(bad(
                what,
                format!("observer {named:?} on the subject of {observer:?}"),
            ));
        }
        let seq = obj
            .get("seq")
            .and_then(Value::as_u64)
            .filter(|&s| s > 0)
            .ok_or_else(|| bad(what, "no positive \"seq\""))?;
        let id = match obj.get("id") {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| bad(what, "\"id\" is not a u64"))?),
        };
        let number = |field: &str| -> Result<Option<f64>, WireError> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => {
                    let x = v
                        .as_f64()
                        .ok_or_else(|| bad(what, format!("\"{field}\" is not a number")))?;
                    finite(what, field, x)?;
                    Ok(Some(x))
                }
            }
        };
        let level = number("level")?;
        let crossed_at = number("crossed_at")?;
        if matches!(kind.as_str(), "suspect" | "recover" | "admit" | "forget") && id.is_none() {
            return Err(bad(what, format!("a {kind} event without \"id\"")));
        }
        Ok(Self {
            observer: observer.to_string(),
            seq,
            kind,
            id,
            level,
            crossed_at,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_the_rest() {
        assert_eq!(
            Key::parse(&Key::verdict(71, "obs-b")),
            Ok(Key::Verdict {
                peer: 71,
                observer: "obs-b".into()
            })
        );
        assert_eq!(
            Key::parse(&Key::observer("obs_c")),
            Ok(Key::Observer("obs_c".into()))
        );
        for bad in [
            "71",
            "71.",
            ".obs",
            "071.obs",
            "-1.obs",
            "x1.obs",
            "71.obs.x",
            "18446744073709551616.obs",
            "observers.",
            "observers.a.b",
        ] {
            assert!(Key::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Key::parse("18446744073709551615.o"),
            Ok(Key::Verdict {
                peer: u64::MAX,
                observer: "o".into()
            })
        );
    }

    #[test]
    fn observer_names() {
        assert!(validate_observer("obs-a_1").is_ok());
        for bad in ["", "a.b", "a b", "a*", "a>", &"x".repeat(65)] {
            assert!(validate_observer(bad).is_err(), "{bad}");
        }
        assert_eq!(observer_from_hostname("mon-3.rack2.example"), "mon-3");
        assert_eq!(observer_from_hostname("h@st"), "h-st");
        assert_eq!(observer_from_hostname(""), "monitor");
    }

    #[test]
    fn verdicts_are_validated() {
        let v = Verdict {
            level: 8.0,
            phi: 8.2,
            since: 1000.5,
            crossed_at: Some(1300.25),
            at: 1301,
        };
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(Verdict::parse(&bytes), Ok(v));
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"level":8}"#,
            br#"{"level":0,"phi":1,"since":1,"at":1}"#,
            br#"{"level":"8","phi":1,"since":1,"at":1}"#,
            br#"{"level":8,"phi":1,"since":1,"at":-1}"#,
            br#"{"level":8,"phi":1,"since":1,"at":1,"extra":true}"#,
        ] {
            assert!(
                Verdict::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn events_carry_observer_and_seq_and_every_kind() {
        let e = Event::Suspect(crate::detector::tracker::Suspicion {
            id: 7,
            level: 8.0,
            phi: 8.5,
            silence_ms: 300.0,
            at: 1,
            crossed_at: 0.5,
        });
        let bytes = event_payload("obs-a", 3, &e);
        let parsed = FleetEvent::parse("heartbeat.events.obs-a", &bytes).unwrap();
        assert_eq!(parsed.kind, "suspect");
        assert_eq!(parsed.seq, 3);
        assert_eq!(parsed.id, Some(7));
        assert_eq!(parsed.crossed_at, Some(0.5));
        assert_eq!(parsed.body["phi"], serde_json::json!(8.5));
        // A kind this version does not know passes through.
        let other = br#"{"event":"bfd_down","observer":"obs-a","seq":4,"id":9}"#;
        let parsed = FleetEvent::parse("heartbeat.events.obs-a", other).unwrap();
        assert_eq!(parsed.kind, "bfd_down");
        let resync = resync_payload("obs-a", 5, "reconnect", 2, 10);
        assert_eq!(
            FleetEvent::parse("heartbeat.events.obs-a", &resync)
                .unwrap()
                .kind,
            "resync"
        );
    }

    #[test]
    fn bad_events_are_errors() {
        let subject = "heartbeat.events.obs-a";
        for bad in [
            &b"{"[..],
            b"42",
            br#"{"observer":"obs-a","seq":1}"#,
            br#"{"event":"suspect","observer":"obs-b","seq":1,"id":1}"#,
            br#"{"event":"suspect","observer":"obs-a","seq":0,"id":1}"#,
            br#"{"event":"suspect","observer":"obs-a","seq":1}"#,
            br#"{"event":"suspect","observer":"obs-a","seq":1,"id":-4}"#,
            br#"{"event":"suspect","observer":"obs-a","seq":1,"id":4,"level":"x"}"#,
        ] {
            assert!(
                FleetEvent::parse(subject, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let ok = br#"{"event":"admit","observer":"obs-a","seq":1,"id":1}"#;
        assert!(FleetEvent::parse("heartbeat.events.a.b", ok).is_err());
        assert!(FleetEvent::parse("other.obs-a", ok).is_err());
    }
}
