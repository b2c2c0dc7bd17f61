//! Event latency: a subscriber timing each suspect event from the crossing to its receipt.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use monitor::serving::client::Client;
use serde::Serialize;
use serde_json::{Value, json};

use super::Percentiles;
use crate::soak::unix_ms;

/// A subscriber that records, for every suspect event, how long after phi crossed its level
/// the event reached it (ms), until `expected` events or `timeout`; and that time split in
/// two: detection (the event's `at`, when the sweep raised it, less `crossed_at`; inside the
/// agent, to the millisecond `at` has) and delivery (received less `at`).
pub struct EventProbe {
    client: Client,
}

impl EventProbe {
    pub fn subscribe(socket: &Path) -> Self {
        let mut client = Client::connect(socket).expect("connect");
        let reply = client
            .request(&json!({"op": "subscribe"}))
            .expect("subscribe");
        assert_eq!(reply["ok"], json!(true));
        Self { client }
    }

    /// Collects until `expected` suspect events about ids in `ids` (others are counted by kind
    /// but not timed), or `timeout`.
    pub fn collect(
        mut self,
        expected: usize,
        ids: std::ops::Range<u64>,
        timeout: Duration,
    ) -> (EventLatency, HashMap<String, usize>) {
        let deadline = Instant::now() + timeout;
        // The loop only reads, stamps and sorts out the lines: each is stamped as it is read,
        // so the time this probe spends on one event never counts against the next ones
        // (parsing a whole event in the loop added 20 us an event, 40 ms to a 2,000-event
        // burst). The lines are parsed after the last one.
        #[derive(serde::Deserialize)]
        struct Kind<'a> {
            event: &'a str,
            id: Option<u64>,
            level: Option<f64>,
        }
        let mut timed: Vec<(f64, String)> = Vec::with_capacity(expected);
        let mut kinds: HashMap<String, usize> = HashMap::new();
        while timed.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.client.set_read_timeout(Some(left)).expect("timeout");
            let Ok(line) = self.client.read_line() else {
                break;
            };
            let received = unix_ms();
            let kind: Kind = serde_json::from_str(&line).expect("event json");
            *kinds.entry(kind.event.to_string()).or_default() += 1;
            if kind.event == "suspect" && kind.id.is_some_and(|id| ids.contains(&id)) {
                timed.push((received, line));
            } else if kind.event == "suspect" {
                // A peer that was not killed, suspected: counted by level (`live@8`), so a
                // false conviction stands apart from the lower levels' expected share.
                let level = kind.level.map_or("-".into(), |l| l.to_string());
                *kinds.entry(format!("live@{level}")).or_default() += 1;
            }
        }
        let mut latencies = Vec::new();
        let mut detection = Vec::new();
        let mut delivery = Vec::new();
        for (received, line) in &timed {
            let event: Value = serde_json::from_str(line).expect("event json");
            let crossed = event["crossed_at"].as_f64().expect("crossed_at");
            let at = event["at"].as_f64().expect("at");
            latencies.push(received - crossed);
            detection.push(at - crossed);
            delivery.push(received - at);
        }
        let latency = EventLatency {
            total: Percentiles::of(latencies),
            detection: Percentiles::of(detection),
            delivery: Percentiles::of(delivery),
        };
        (latency, kinds)
    }
}

/// Event latency, crossing to receipt, and its two parts (see `EventProbe`).
#[derive(Debug, Clone, Serialize)]
pub struct EventLatency {
    pub total: Percentiles,
    pub detection: Percentiles,
    pub delivery: Percentiles,
}
