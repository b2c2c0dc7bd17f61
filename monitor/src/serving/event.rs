//! The events the socket streams to subscribers (`subscribe`) and the fleet publishes: one
//! JSON object per line, as docs/socket-protocol.md documents them.

use serde::{Deserialize, Serialize};

use crate::detector::tracker::{Recovery, Suspicion, Transition};

/// What subscribers receive, one JSON object per line: `{"event":"suspect",...}` and so on.
/// The detector's transitions carry their own fields (`Suspicion`, `Recovery`); the rest are
/// the agent's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    Suspect(Suspicion),
    Recover(Recovery),
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
    /// The monitored interface lost its link (`state`: its operstate, or "absent"): every
    /// peer falls silent and none of them failed, so new suspicions are held until the link
    /// is back and for `hold_ms` after (`link_up`).
    #[serde(rename = "link_down")]
    LinkDown {
        iface: String,
        state: String,
        at: u64,
    },
    /// The link is back after `down_ms`; new suspicions stay held for `hold_ms` more.
    #[serde(rename = "link_up")]
    LinkUp {
        iface: String,
        down_ms: u64,
        hold_ms: u64,
        at: u64,
    },
    /// `peers` of the `watched` peers crossed the lowest level `level` within `window_ms`:
    /// a fault shared by many (this host, its link, a switch) is likelier than many failures.
    /// Raised once, again only after such crossings subsided. The suspicions themselves are
    /// raised as usual.
    #[serde(rename = "correlated_silence")]
    CorrelatedSilence {
        level: f64,
        peers: u64,
        watched: u64,
        window_ms: u64,
        at: u64,
    },
}

impl Event {
    /// The event's name, its `event` field (`Lagged` is "lagged").
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Suspect(_) => "suspect",
            Event::Recover(_) => "recover",
            Event::Admit { .. } => "admit",
            Event::Forget { .. } => "forget",
            Event::BfdDown { .. } => "bfd_down",
            Event::Lagged { .. } => "lagged",
            Event::LinkDown { .. } => "link_down",
            Event::LinkUp { .. } => "link_up",
            Event::CorrelatedSilence { .. } => "correlated_silence",
        }
    }
}

impl From<Transition> for Event {
    fn from(t: Transition) -> Self {
        match t {
            Transition::Suspect(s) => Event::Suspect(s),
            Transition::Recover(r) => Event::Recover(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kind` is the `event` field each variant is written with.
    #[test]
    fn an_events_kind_is_its_event_field() {
        let events = [
            Event::from(Transition::Suspect(Suspicion {
                id: 1,
                level: 1.0,
                phi: 1.0,
                silence_ms: 1.0,
                at: 1,
                crossed_at: 1.0,
            })),
            Event::from(Transition::Recover(Recovery {
                id: 1,
                level: 1.0,
                silence_ms: 1.0,
                at: 1,
            })),
            Event::Admit { id: 1, at: 1 },
            Event::Forget {
                id: 1,
                reason: "request".into(),
                at: 1,
            },
            Event::BfdDown {
                id: 1,
                state: "down".into(),
                diag: 1,
                diagnostic: "control_detection_time_expired".into(),
                addr: None,
                discriminator: 1,
                at: 1,
            },
            Event::Lagged { missed: 1 },
            Event::LinkDown {
                iface: "eth0".into(),
                state: "down".into(),
                at: 1,
            },
            Event::LinkUp {
                iface: "eth0".into(),
                down_ms: 1,
                hold_ms: 1,
                at: 1,
            },
            Event::CorrelatedSilence {
                level: 1.0,
                peers: 8,
                watched: 10,
                window_ms: 1000,
                at: 1,
            },
        ];
        for event in events {
            let value = serde_json::to_value(&event).unwrap();
            assert_eq!(value["event"], event.kind(), "{event:?}");
        }
    }

    #[test]
    fn events_serialise_as_documented() {
        let e = Event::from(Transition::Suspect(Suspicion {
            id: 7,
            level: 8.0,
            phi: 8.5,
            silence_ms: 300.0,
            at: 1,
            crossed_at: 0.5,
        }));
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"suspect","id":7,"level":8.0,"phi":8.5,"silence_ms":300.0,"at":1,"crossed_at":0.5})
        );
        let e = Event::from(Transition::Recover(Recovery {
            id: 7,
            level: 8.0,
            silence_ms: 900.0,
            at: 2,
        }));
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
