//! The events the socket streams to subscribers (`subscribe`) and the fleet publishes: one
//! JSON object per line, as docs/socket-protocol.md documents them.

use serde::Serialize;

use crate::detector::tracker::Transition;

/// What subscribers receive, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// phi crossed `level` upward.
    Suspect {
        id: u64,
        level: f64,
        phi: f64,
        silence_ms: f64,
        /// Unix time of detection, ms.
        at: u64,
        /// Unix time at which phi reached `level`, ms with microsecond precision; `at` is at
        /// most one sweep later.
        crossed_at: f64,
    },
    /// A suspected peer was heard again; `level` is the highest level it had reached.
    Recover {
        id: u64,
        level: f64,
        /// The silence that ended.
        silence_ms: f64,
        at: u64,
    },
    Admit {
        id: u64,
        at: u64,
    },
    Forget {
        id: u64,
        /// "request" (the `forget` op) or "expired" (silent beyond --expire-after).
        reason: String,
        at: u64,
    },
    /// A BFD session (`--bfd`) reported Down or AdminDown after being up: the peer says so
    /// itself, before its silence could. `state` and `diagnostic` as RFC 5880 names them.
    #[serde(rename = "bfd_down")]
    BfdDown {
        id: u64,
        /// "down" or "admin_down".
        state: String,
        /// The diagnostic code, and its name ("control_detection_time_expired", ...).
        diag: u8,
        diagnostic: String,
        /// The session's source address and My Discriminator.
        addr: Option<String>,
        discriminator: u32,
        at: u64,
    },
    /// This subscriber fell behind and missed `missed` events.
    Lagged {
        missed: u64,
    },
}

impl From<Transition> for Event {
    fn from(t: Transition) -> Self {
        match t {
            Transition::Suspect {
                id,
                level,
                phi,
                silence_ms,
                at,
                crossed_at,
            } => Event::Suspect {
                id,
                level,
                phi,
                silence_ms,
                at,
                crossed_at,
            },
            Transition::Recover {
                id,
                level,
                silence_ms,
                at,
            } => Event::Recover {
                id,
                level,
                silence_ms,
                at,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialise_as_documented() {
        let e = Event::from(Transition::Suspect {
            id: 7,
            level: 8.0,
            phi: 8.5,
            silence_ms: 300.0,
            at: 1,
            crossed_at: 0.5,
        });
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"suspect","id":7,"level":8.0,"phi":8.5,"silence_ms":300.0,"at":1,"crossed_at":0.5})
        );
        let e = Event::from(Transition::Recover {
            id: 7,
            level: 8.0,
            silence_ms: 900.0,
            at: 2,
        });
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"recover","id":7,"level":8.0,"silence_ms":900.0,"at":2})
        );
        let e = Event::Lagged { missed: 3 };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"lagged","missed":3})
        );
    }
}
