//! Recordings (`monitor record`): the kernel traces the arrivals of the peers a client
//! records, and the agent hands each arrival to the recording clients.

use std::time::Duration;

use monitor_common::maps::ArrivalRecord;
use serde_json::{Value, json};

use super::Agent;
use crate::{
    kernel::clock::monotonic_ns, kernel::registry::Registry, serving::recording::RecordingGuard,
    serving::server::Recording,
};

impl Agent {
    /// One arrival of a traced peer, from the kernel's ring.
    pub fn on_arrival(&self, arrival: ArrivalRecord) {
        // No recording client left is not an error: tracing stops at the next sweep.
        let _ = self.arrivals.send(arrival);
    }

    /// Starts recording `ids` (each must be admitted) for `duration_ms` or until the client
    /// goes: the reply carries the monotonic origin the client can count times from.
    pub fn record(
        &self,
        ids: &[u64],
        duration_ms: Option<u64>,
    ) -> Result<(Value, Recording), String> {
        let registry = self.registry.read().expect("registry lock");
        let slots = ids
            .iter()
            .map(|&id| registry.slot_of(id).ok_or(format!("unknown peer {id}")))
            .collect::<Result<Vec<u32>, String>>()?;
        // Subscribe before tracing starts, so the first traced arrival is not missed.
        let arrivals = self.arrivals.subscribe();
        let origin_ns = monotonic_ns();
        let new = self.recordings.start(ids);
        for (&id, &slot) in ids.iter().zip(&slots) {
            if new.contains(&id) {
                self.table.set_traced(slot, id, true);
            }
        }
        let guard = RecordingGuard::new(self.recordings.clone(), ids.to_vec());
        let reply = json!({
            "ok": true,
            "recording": ids,
            "origin_ns": origin_ns,
            "duration_ms": duration_ms,
        });
        Ok((
            reply,
            Recording {
                ids: ids.iter().copied().collect(),
                arrivals,
                until: duration_ms
                    .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms)),
                guard,
            },
        ))
    }

    /// Turns off the kernel's tracing of peers no recording wants any more.
    pub(super) fn stop_unwanted_tracing(&self, registry: &Registry) {
        for id in self.recordings.take_unwanted() {
            if let Some(slot) = registry.slot_of(id) {
                self.table.set_traced(slot, id, false);
            }
        }
    }
}
