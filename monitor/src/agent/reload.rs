//! What a SIGHUP changes in the running agent: the configuration read afresh and what of it
//! can change live applied (levels, the detector, admission, metric series, destinations),
//! and the auth key file re-read.

use std::{
    sync::{Arc, RwLock, atomic::Ordering},
    time::Instant,
};

use tokio::signal::unix::Signal;

use super::{Agent, AgentConfig, Trackers, wall_ms};
use crate::{
    detector::{
        levels::Levels,
        model::DetectorParams,
        spec,
        tracker::{DetectorConfig, SweepTime, Transition},
    },
    kernel::clock::monotonic_ns,
    kernel::destination::{DestinationError, Destinations},
    kernel::keyring::KeyRing,
    serving::metrics,
};
use monitor_common::maps::PeerRecord;

/// Waits for SIGHUPs, forever: each re-reads the configuration (`AgentConfig::reload`) and
/// applies what changed, then re-reads the key file.
pub(super) async fn on_sighup(
    agent: Arc<Agent>,
    mut current: AgentConfig,
    series: Arc<RwLock<metrics::PeerSeries>>,
    mut destinations: Destinations,
    keyring: Option<Arc<KeyRing>>,
    mut hup: Signal,
) {
    loop {
        hup.recv().await;
        if let Some(reload) = &current.reload {
            match (reload.read)() {
                Ok(new) => {
                    // A detector change re-estimates every peer under the trackers' lock
                    // (milliseconds at 50,000): off the runtime's workers.
                    let (on, series) = (agent.clone(), series.clone());
                    let old = current.clone();
                    let applied = tokio::task::spawn_blocking(move || {
                        let applied = apply_reload(&on, &old, new, &series, &mut destinations);
                        (applied, destinations)
                    })
                    .await
                    .expect("the reload does not panic");
                    (current, destinations) = applied;
                    agent.reloads.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    log::error!("SIGHUP: {e:#}; keeping the running configuration");
                    agent.reload_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match &keyring {
            Some(ring) => {
                let rotated = ring.rotate();
                if let Err(e) = &rotated {
                    log::error!("{e:#}; keeping the current keys");
                }
                agent.note_key_rotation(rotated.is_ok());
            }
            None => log::info!("SIGHUP: no --auth-key-file to reload"),
        }
    }
}

/// The parameters but for the threshold, which follows the levels.
fn without_threshold(params: &DetectorParams) -> DetectorParams {
    DetectorParams {
        threshold: 0.0,
        ..params.clone()
    }
}

/// What a SIGHUP changed, applied to the running agent: levels, the detector's parameters
/// (but for its window rules), admission, per-peer metric series, the destination addresses
/// and the auth key change live; anything else is named in a log line and waits for a
/// restart. Returns the configuration now in effect.
fn apply_reload(
    agent: &Agent,
    current: &AgentConfig,
    new: AgentConfig,
    series: &RwLock<metrics::PeerSeries>,
    destinations: &mut Destinations,
) -> AgentConfig {
    let mut effective = current.clone();
    // Whether the kernel checks destinations at all is fixed at load: to or from `any` waits.
    let mut listen_fixed = false;
    if new.listen != current.listen {
        match destinations.set(&new.listen) {
            Ok(()) => effective.listen = new.listen.clone(),
            Err(DestinationError::CheckFixed) => listen_fixed = true,
            Err(e) => log::error!("SIGHUP: listen-addr: {e}; keeping the current destinations"),
        }
    }
    // The detector's parameters change live where the kernel's window rules stay the same
    // (window, max-interval-ms, outage-factor, and whether the model's window skips gaps).
    let params_changed = without_threshold(&new.detector) != without_threshold(&current.detector);
    let rules_kept = new.detector.window_config() == current.detector.window_config();
    let params_live = params_changed && rules_kept;
    if new.levels != current.levels || params_live {
        if new.levels != current.levels {
            log::info!("SIGHUP: levels {} -> {}", current.levels, new.levels);
        }
        let params = if params_live {
            log::info!(
                "SIGHUP: detector {} -> {}",
                spec::format_spec(&current.detector),
                spec::format_spec(&new.detector)
            );
            new.detector.clone()
        } else {
            current.detector.clone()
        };
        agent.set_detector(params.clone(), new.levels.clone());
        effective.levels = new.levels.clone();
        effective.detector = DetectorParams {
            threshold: new.levels.highest(),
            ..params
        };
    }
    if new.admission != current.admission {
        agent.set_admission(new.admission.clone());
        log::info!(
            "SIGHUP: admission policy changed: {}",
            agent.admission_policy_line()
        );
        effective.admission = new.admission.clone();
    }
    if new.metrics_peers != current.metrics_peers {
        log::info!(
            "SIGHUP: per-peer metric series: {} ids, top {}",
            new.metrics_peers.ids.len(),
            new.metrics_peers.top
        );
        *series.write().expect("series lock") = new.metrics_peers.clone();
        effective.metrics_peers = new.metrics_peers.clone();
    }
    // What cannot change under a running program and socket.
    let mut fixed = Vec::new();
    let mut check = |name: &str, same: bool| {
        if !same {
            fixed.push(name.to_string());
        }
    };
    check("iface", new.iface == current.iface);
    check("port", new.port == current.port);
    check("socket", new.socket == current.socket);
    check("socket-group", new.socket_group == current.socket_group);
    check(
        "socket-max-clients, socket-max-per-uid, socket-idle-timeout, socket-write-timeout",
        new.socket_limits == current.socket_limits,
    );
    check("peers", new.peers_file == current.peers_file);
    check("xdp-mode", new.mode == current.mode);
    check("hook", new.hook == current.hook);
    check("capacity", new.capacity == current.capacity);
    check(
        "pass-heartbeats",
        new.pass_heartbeats == current.pass_heartbeats,
    );
    check("listen-addr (to or from any)", !listen_fixed);
    check("bfd", new.passive.bfd == current.passive.bfd);
    check(
        "udp-port",
        new.passive.flow_ports == current.passive.flow_ports,
    );
    if new.unknown_reports_per_sec != current.unknown_reports_per_sec {
        // The agent's bucket changed above; the kernel's report limit is a load-time constant.
        log::warn!(
            "SIGHUP: admit-rate now {}/s for admissions; the kernel keeps reporting at most {}/s per CPU until a restart",
            new.admission.rate_per_sec,
            current.unknown_reports_per_sec
        );
    }
    check(
        "the detector, with its window rules (window, max-interval-ms, outage-factor, or a model whose window skips gaps for one whose window does not)",
        !params_changed || rules_kept,
    );
    check(
        "sweep-interval",
        new.sweep_interval == current.sweep_interval,
    );
    check("auth-key-file", new.auth_key_file == current.auth_key_file);
    check("auth-grace", new.auth_grace == current.auth_grace);
    check("expire-after", new.expire_after == current.expire_after);
    check("pin-path", new.pin_path == current.pin_path);
    check("stall-bound", new.stall_bound == current.stall_bound);
    check("link-grace", new.link_grace == current.link_grace);
    check("metrics-addr", new.metrics_addr == current.metrics_addr);
    for name in crate::fleet::FleetConfig::changed(&current.fleet, &new.fleet) {
        check(name, false);
    }
    check("kernel-log", new.kernel_log == current.kernel_log);
    if !fixed.is_empty() {
        log::warn!(
            "SIGHUP: {} changed; not applied until a restart",
            fixed.join(", ")
        );
    }
    effective
}

impl Agent {
    /// Replaces the levels and the detector's parameters (SIGHUP), which must keep the window
    /// rules (`DetectorParams::window_config`): those are the kernel's, fixed at load. Each
    /// peer's estimate is made again from its slot under the new parameters; a level it is
    /// now past and was not before is raised as an event, as it would have been had the new
    /// detector been set all along; a level it is no longer past (gone, or now above its phi)
    /// is simply gone until it is heard again.
    pub fn set_detector(&self, params: DetectorParams, levels: Levels) {
        self.set_detector_at(params, levels, || SweepTime {
            now_ns: monotonic_ns(),
            wall_ms: wall_ms(),
            hold: false,
        });
    }

    /// `set_detector` on the clock `time` reads (the tests' own).
    pub(super) fn set_detector_at(
        &self,
        params: DetectorParams,
        levels: Levels,
        time: impl Fn() -> SweepTime,
    ) {
        let started = Instant::now();
        let mut emit = |t: Transition| self.publish(t.into());
        // Under the lock for a moment: the new detector in place, every tracker marked.
        let (new, slots, peers) = {
            let mut trackers = self.trackers.lock();
            let old = self.detector();
            // One change at a time (reloads come one after another): finish any left over.
            for slot in 0..trackers.peers.len() {
                let read = |ring| self.read(slot as u32, ring);
                trackers.catch_up(slot, &old, read, time(), &mut emit);
            }
            let params = DetectorParams {
                threshold: levels.highest(),
                ..params
            };
            debug_assert_eq!(params.window_config(), old.params.window_config());
            let new = Arc::new(DetectorConfig::new(params, levels));
            *self.detector.write().expect("detector lock") = new.clone();
            let pending: Vec<bool> = trackers.peers.iter().map(Option::is_some).collect();
            let left = pending.iter().filter(|&&p| p).count();
            if left > 0 {
                trackers.change = Some(DetectorChange { old, pending, left });
            }
            (new, trackers.peers.len(), left)
        };
        // Then a chunk at a time, the lock released in between: queries and the sweep (which
        // passes over the trackers not reached yet) wait for one chunk at most.
        for start in (0..slots).step_by(REDETECT_CHUNK) {
            // The registry before the trackers, as the sweep takes them: a peer the change
            // suspects is asked for its next heartbeat (`tell_when_heard`), which needs its
            // line's owner to hold still.
            let _registry = self.registry.read().expect("registry lock");
            let mut trackers = self.trackers.lock();
            if trackers.change.is_none() {
                break;
            }
            let time = time();
            let armed_before = trackers.due.earliest();
            for slot in start..(start + REDETECT_CHUNK).min(slots) {
                let read = |ring| self.read_for_client(slot as u32, ring).ok();
                let was_suspected = trackers.peers[slot].as_ref().map(|t| t.crossed() > 0);
                trackers.catch_up(slot, &new, read, time, &mut emit);
                if was_suspected == Some(false)
                    && let Some(t) = trackers.peers[slot].as_ref().filter(|t| t.crossed() > 0)
                {
                    let (id, word) = (t.peer_id, trackers.watches[slot].word);
                    self.tell_when_heard(&mut trackers.due, slot, id, word);
                }
            }
            // A deadline brought before any the sweeper was to wake for: it wakes to plan again.
            let nearer = trackers.due.earliest() != armed_before;
            // To a waiting query first (see `sweep`): released unfairly, the lock went straight
            // back to this loop, and another client's `peer` waited out most of the change.
            parking_lot::MutexGuard::unlock_fair(trackers);
            if nearer {
                self.sweep_wake.poke();
            }
        }
        log::info!(
            "detector set: {peers} peers re-estimated and re-levelled in {:.1} ms, {REDETECT_CHUNK} at a time",
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

/// Trackers a detector change re-estimates per hold of the trackers lock: each copies its
/// slot, sums its window (the kernel keeps no sums) and estimates again, about 2 µs in the
/// debug build, so a query waits a quarter of a millisecond at most (the lock is handed over
/// fairly between chunks).
const REDETECT_CHUNK: usize = 128;

/// A detector change under way: the trackers not yet re-estimated under the new detector, and
/// the detector they were made under. `set_detector` works through them a chunk at a time
/// (`Trackers::catch_up`), releasing the trackers' lock in between, and the sweep passes over
/// those it has not reached yet: no peer is ever judged under a detector its estimate was not
/// made for, and nobody waits for all 50,000 at once (another client's `peer` p99 during
/// eight changes at 50,000 peers fell from 52-57 ms to 16 ms, debug build).
pub(super) struct DetectorChange {
    old: Arc<DetectorConfig>,
    pending: Vec<bool>,
    left: usize,
}

impl DetectorChange {
    /// Which trackers wait for it, by slot.
    pub(super) fn pending(&self) -> &[bool] {
        &self.pending
    }
}

impl Trackers {
    /// Whether `slot`'s tracker still waits to be re-estimated under a new detector.
    pub(super) fn pending(&self, slot: usize) -> bool {
        self.change.as_ref().is_some_and(|c| c.pending[slot])
    }

    /// `slot` is cleared: nothing left to re-estimate there.
    pub(super) fn forget_pending(&mut self, slot: usize) {
        if let Some(c) = &mut self.change
            && std::mem::take(&mut c.pending[slot])
        {
            c.left -= 1;
            if c.left == 0 {
                self.change = None;
            }
        }
    }

    /// Re-estimates `slot`'s tracker under `new` if a detector change left it pending (`read`
    /// reads its slot, with the window or not); news in the slot is taken under the old one.
    fn catch_up(
        &mut self,
        slot: usize,
        new: &DetectorConfig,
        read: impl FnOnce(bool) -> Option<(PeerRecord, Vec<u32>)>,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        let Trackers {
            watches,
            level_floors,
            peers,
            change,
            due,
            ..
        } = self;
        let Some(c) = change else { return };
        if !std::mem::take(&mut c.pending[slot]) {
            return;
        }
        c.left -= 1;
        if let Some(t) = &mut peers[slot] {
            let with_ring = new.params.needs_ring() || c.old.params.needs_ring();
            let read = read(with_ring).filter(|(record, _)| record.peer_id == t.peer_id);
            let record = read.as_ref().map(|(r, ring)| (r, ring.as_slice()));
            t.redetect(
                record,
                &mut watches[slot],
                &mut level_floors[slot],
                &c.old,
                new,
                time,
                emit,
            );
            // A new detector may bring the deadline before the next scan.
            due.arm_watch(slot, &watches[slot], &level_floors[slot], time.now_ns);
        }
        if c.left == 0 {
            *change = None;
        }
    }
}
