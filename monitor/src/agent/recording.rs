//! Recordings (`monitor record`): the kernel traces the arrivals of the peers a client
//! records, and the agent hands each arrival to the recording clients.

use std::{sync::atomic::Ordering, time::Duration};

use monitor_common::maps::{ARRIVAL_HEARD, ArrivalRecord};
use serde_json::{Value, json};

use super::Agent;
use crate::{
    kernel::clock::monotonic_ns, kernel::registry::Registry, serving::recording::RecordingGuard,
    serving::server::Recording,
};

impl Agent {
    /// One arrival the kernel told of, from its ring: a traced peer's (for the recording
    /// clients), or the heartbeat of a suspected peer (`ARRIVAL_HEARD`), whose slot the
    /// sweeper looks at now, as it would at a deadline: its recovery is raised at once and its
    /// next deadlines armed, instead of at the next scan.
    pub fn on_arrival(&self, arrival: ArrivalRecord) {
        if arrival.outcome & ARRIVAL_HEARD != 0 {
            self.heard_told.fetch_add(1, Ordering::Relaxed);
            self.look_now(arrival.peer_id);
        }
        // No recording client left is not an error: tracing stops at the next sweep. A
        // recording takes only its own peers', so an untraced peer's told heartbeat is no
        // line of any.
        let _ = self.arrivals.send(arrival);
    }

    /// Has the sweeper look at `id`'s slot as soon as it can (a due pass).
    pub(super) fn look_now(&self, id: u64) {
        let Some(slot) = self.registry.read().expect("registry lock").slot_of(id) else {
            return;
        };
        if self.trackers.lock().due.arm_now(slot) {
            self.sweep_wake.poke();
        }
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
