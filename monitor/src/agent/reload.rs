//! What a SIGHUP changes in the running agent.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use super::{Agent, Trackers, wall_ms};
use crate::{
    detector::{
        levels::Levels,
        model::DetectorParams,
        tracker::{DetectorConfig, SweepTime, Transition},
    },
    kernel::clock::monotonic_ns,
};

impl Agent {
    /// Replaces the levels and the detector's parameters (SIGHUP), which must keep the window
    /// rules (`DetectorParams::window_config`): those are the kernel's, fixed at load. Each
    /// peer's estimate is made again from its slot under the new parameters; a level it is
    /// now past and was not before is raised as an event, as it would have been had the new
    /// detector been set all along; a level it is no longer past (gone, or now above its phi)
    /// is simply gone until it is heard again.
    pub fn set_detector(&self, params: DetectorParams, levels: Levels) {
        let started = Instant::now();
        let mut trackers = self.trackers.lock().expect("trackers lock");
        let old = self.detector();
        let params = DetectorParams {
            threshold: levels.highest(),
            ..params
        };
        debug_assert_eq!(params.window_config(), old.params.window_config());
        let new = Arc::new(DetectorConfig::new(params, levels));
        // The slots are read with their windows where either detector reads them: news is
        // taken under the old one, the estimate made under the new one.
        let with_ring = new.params.needs_ring() || old.params.needs_ring();
        *self.detector.write().expect("detector lock") = new.clone();
        let time = SweepTime {
            now_ns: monotonic_ns(),
            wall_ms: wall_ms(),
            hold: false,
        };
        let mut emit = |t: Transition| self.publish(t.into());
        let Trackers { watch, lazy, peers } = &mut *trackers;
        for (slot, t) in peers.iter_mut().enumerate() {
            let Some(t) = t else { continue };
            let (watch, lazy) = (&mut watch[slot], &mut lazy[slot]);
            let read = self
                .read_for_client(slot as u32, with_ring)
                .ok()
                .filter(|(record, _)| record.peer_id == t.peer_id);
            let slot = read
                .as_ref()
                .map(|(record, ring)| (record, ring.as_slice()));
            t.redetect(slot, watch, lazy, &old, &new, time, &mut emit);
        }
        let peers = peers.iter().flatten().count();
        drop(trackers);
        // The sweep waited this long: it needs the trackers' lock.
        log::info!(
            "detector set: {peers} peers re-estimated and re-levelled in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    }

    /// Counts a SIGHUP re-read of the key file (`stats`: `key_rotations`, `key_rotation_failures`).
    pub fn note_key_rotation(&self, ok: bool) {
        let counter = if ok {
            &self.key_rotations
        } else {
            &self.key_rotation_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
