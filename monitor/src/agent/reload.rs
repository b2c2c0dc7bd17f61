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
