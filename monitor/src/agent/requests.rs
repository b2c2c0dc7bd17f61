//! Where the socket's requests are answered (docs/socket-protocol.md): `peer`, `peers`,
//! `suspects`, `stats`, `forget`, `record` and `subscribe`, each read from the peer table and
//! the sweep's trackers.

use std::sync::atomic::Ordering;

use monitor_common::{maps::PeerRecord, passive::source_name};
use serde_json::json;

use super::{Agent, Trackers};
use crate::{
    detector::{
        levels::Levels,
        model::{Estimate, Model},
        tracker::DetectorConfig,
    },
    kernel::clock::monotonic_ns,
    serving::metrics::{OpLabel, ReasonLabel},
    serving::peer_view::{PeerView, WindowDetail, ip_addr},
    serving::protocol::{AgentStats, PeerError, PeerSource, Request, error_reply, ok_reply},
    serving::server::{Handler, ListReply, Response},
};

impl Agent {
    fn qos(&self, slot: u32, id: u64, now: u64) -> Option<crate::detector::qos::QosReport> {
        let trackers = self.trackers.lock();
        trackers.of(slot, id).map(|t| t.qos(now))
    }

    /// The peer's tracker's estimate where the model carries state from one estimate to the
    /// next (`budget`: see `PeerView::new_after`); None for every other model.
    fn carried(
        trackers: &Trackers,
        slot: u32,
        id: u64,
        detector: &DetectorConfig,
    ) -> Option<Estimate> {
        (detector.params.model == Model::Budget)
            .then(|| trackers.of(slot, id).map(|t| t.estimate().clone()))
            .flatten()
    }

    /// The highest level raised for the peer so far (None: none), from its tracker.
    fn raised(trackers: &Trackers, slot: u32, id: u64, levels: &Levels) -> Option<f64> {
        let crossed = trackers.of(slot, id)?.crossed() as usize;
        // A tracker a detector change has not reached yet counts the old levels.
        let levels = levels.as_slice();
        crossed
            .checked_sub(1)
            .map(|i| levels[i.min(levels.len() - 1)])
    }

    /// What the trackers add to each view, in one pass under their lock: its QoS and, while
    /// new suspicions are held, the level raised before the hold. Returns whether they are.
    fn add_tracked(&self, views: &mut [(u32, PeerView)], levels: &Levels, now: u64) -> bool {
        let holding = self.holding();
        let trackers = self.trackers.lock();
        for (slot, view) in views.iter_mut() {
            view.qos = trackers.of(*slot, view.id).map(|t| t.qos(now));
            if holding {
                view.hold(Self::raised(&trackers, *slot, view.id, levels));
            }
        }
        holding
    }

    /// One peer; with `window`, its window's contents too (one consistent copy of the slot).
    pub fn peer(&self, id: u64, window: bool) -> Result<PeerView, PeerError> {
        let slot = self
            .registry
            .read()
            .expect("registry lock")
            .slot_of(id)
            .ok_or(PeerError::Unknown(id))?;
        // The read and the view under one detector: its model says whether to copy the window.
        let detector = self.detector();
        let (record, ring) = if window {
            self.table.snapshot_patiently(slot)
        } else {
            self.read_for_client(slot, detector.params.needs_ring())
        }
        .map_err(|_| PeerError::Busy(id))?;
        if record.peer_id != id {
            // Forgotten (and its slot perhaps reused) since the registry said otherwise.
            return Err(PeerError::Unknown(id));
        }
        let now = monotonic_ns();
        let previous = Self::carried(&self.trackers.lock(), slot, id, &detector);
        let mut view = PeerView::new_after(
            &record,
            &ring,
            now,
            &detector,
            self.qos(slot, id, now),
            previous.as_ref(),
        );
        if self.holding() {
            let trackers = self.trackers.lock();
            view.hold(Self::raised(&trackers, slot, id, &detector.levels));
        }
        if window {
            view.window = Some(WindowDetail::new(&record, ring));
        }
        Ok(view)
    }

    /// `peer` without its window, answered where it was read when nothing it needs is held:
    /// every lock tried rather than waited for, the slot copied once. `None` sends it to a
    /// blocking thread as every other request (`serving::server`): that hand-over costs tens
    /// of microseconds of wake-ups on two cores, most of a `peer` answer (p50 67-87 us against
    /// 24 us answered on the worker, an idle agent of 50,000 peers, 2026-12-06), while a
    /// `peer` rarely finds anything held. So a worker never waits here, as before.
    pub fn try_peer(&self, id: u64) -> Option<Result<PeerView, PeerError>> {
        let Some(slot) = self.registry.try_read().ok()?.slot_of(id) else {
            return Some(Err(PeerError::Unknown(id)));
        };
        let detector = self.detector.try_read().ok()?.clone();
        // One attempt: a slot the kernel is writing is left to the patient path.
        let (record, ring) = self.read(slot, detector.params.needs_ring())?;
        if record.peer_id != id {
            return Some(Err(PeerError::Unknown(id)));
        }
        let now = monotonic_ns();
        let holding = self.link.try_lock().ok()?.holding;
        let (qos, raised, previous) = {
            let trackers = self.trackers.try_lock()?;
            (
                trackers.of(slot, id).map(|t| t.qos(now)),
                holding.then(|| Self::raised(&trackers, slot, id, &detector.levels)),
                Self::carried(&trackers, slot, id, &detector),
            )
        };
        let mut view = PeerView::new_after(&record, &ring, now, &detector, qos, previous.as_ref());
        if let Some(raised) = raised {
            view.hold(raised);
        }
        Some(Ok(view))
    }

    /// Every admitted peer, sorted by id; busy if a slot kept changing through every retry.
    pub fn peers(&self) -> Result<Vec<PeerView>, PeerError> {
        self.collect(|_| true)
    }

    /// The peers whose packets come from `addr` and are of `source` (either filter optional):
    /// how an operator finds a BFD session or a flow, whose ids are derived.
    pub fn peers_matching(
        &self,
        addr: Option<std::net::IpAddr>,
        source: Option<PeerSource>,
    ) -> Result<Vec<PeerView>, PeerError> {
        self.collect(|record| {
            addr.is_none_or(|a| ip_addr(record.src_family, &record.src_addr) == Some(a))
                && source.is_none_or(|s| s.name() == source_name(record.source))
        })
    }

    /// Peers with phi >= threshold, sorted by id. The silence at which phi reaches the
    /// threshold is found once per request, so most peers cost a compare, not an erfc.
    ///
    /// A peer is first judged from the sweep's dense arrays (at or above the first level: its
    /// watch, level floor and last-heard word say whether it is surely below that level, see
    /// `LevelFloor::below_first_level`), then from its tracker (the silence below which it cannot
    /// be at the threshold: see `PeerTracker::threshold_floor`), under the trackers' lock;
    /// only the candidates get their record copied and phi computed, after the lock is let
    /// go, so a request never holds up the sweep for longer than that pass.
    pub fn suspects(&self, threshold: f64) -> Vec<PeerView> {
        let detector = self.detector();
        let crossing = detector.params.level_silences(&[threshold]);
        // A hair of slack for the bisection; the exact phi decides at the end.
        let beyond = |last_ns: u64, silence_ms: f64, now: u64| {
            now.saturating_sub(last_ns) as f64 / 1e6 >= silence_ms * (1.0 - 1e-9)
        };
        let now = monotonic_ns();
        let candidates: Vec<(u64, u32)> = {
            let registry = self.registry.read().expect("registry lock");
            let trackers = self.trackers.lock();
            // At or above the first level, a peer whose dense state says it is below that
            // level is passed over without its tracker (under half the bytes a peer costs
            // otherwise). The levels are read under the trackers lock, which `set_detector`
            // holds while it re-levels: the floors and the first level always agree.
            let above_first = self
                .detector()
                .levels
                .as_slice()
                .first()
                .is_some_and(|&first| threshold >= first);
            let words = self.table.last_heard_words();
            let used = registry.slots_in_use() as usize;
            (0..used)
                .filter(|&slot| {
                    !(above_first
                        && !trackers.pending(slot)
                        && trackers.level_floors[slot].below_first_level(
                            &trackers.watches[slot],
                            words[slot].load(Ordering::Relaxed),
                            now,
                        ))
                })
                .filter_map(|slot| Some((registry.owner(slot as u32)?, slot as u32)))
                .filter(|&(id, slot)| {
                    // An estimate of the old detector says nothing of the new one's floors.
                    if trackers.pending(slot as usize) {
                        return true;
                    }
                    let floor = trackers.of(slot, id).and_then(|t| {
                        t.threshold_floor(
                            self.table.last_heard(slot),
                            &trackers.level_floors[slot as usize],
                            &crossing,
                            &detector.params,
                            now,
                        )
                    });
                    floor.is_none_or(|(last, floor_ms)| beyond(last, floor_ms, now))
                })
                .collect()
        };
        let mut suspects: Vec<(u32, PeerView)> = Vec::new();
        for (id, slot) in candidates {
            let Some((record, ring)) = self
                .read(slot, detector.params.needs_ring())
                .filter(|(r, _)| r.peer_id == id)
            else {
                continue;
            };
            let previous = Self::carried(&self.trackers.lock(), slot, id, &detector);
            let estimate = match &previous {
                Some(previous) => detector.estimate_after(&record, &ring, previous),
                None => detector.estimate(&record, &ring),
            };
            if !beyond(
                record.last_arrival_ns,
                crossing.silence_ms(0, &estimate),
                now,
            ) {
                continue;
            }
            let view = PeerView::new_after(&record, &ring, now, &detector, None, previous.as_ref());
            if view.phi >= threshold {
                suspects.push((slot, view));
            }
        }
        // Held: a peer is a suspect only at a level raised before the hold.
        if !suspects.is_empty() && self.add_tracked(&mut suspects, &detector.levels, now) {
            suspects.retain(|(_, v)| v.level.is_some_and(|level| level >= threshold));
        }
        let mut suspects: Vec<PeerView> = suspects.into_iter().map(|(_, v)| v).collect();
        suspects.sort_unstable_by_key(|p| p.id);
        suspects
    }

    /// Every admitted peer: the records are read with no lock held (a slot forgotten meanwhile
    /// shows as another peer's or a free one and is left out), then the QoS of all of them in
    /// one pass under the trackers' lock.
    fn collect(&self, wanted: impl Fn(&PeerRecord) -> bool) -> Result<Vec<PeerView>, PeerError> {
        let now = monotonic_ns();
        let slots: Vec<(u64, u32)> = self
            .registry
            .read()
            .expect("registry lock")
            .iter()
            .collect();
        let detector = self.detector();
        let mut peers = Vec::with_capacity(slots.len());
        for (id, slot) in slots {
            // A slot that stays busy through the retries fails the request (the client can
            // repeat it): leaving the peer out would read as "not watched".
            let (record, ring) = self
                .read_for_client(slot, detector.params.needs_ring())
                .map_err(|_| PeerError::Busy(id))?;
            if record.peer_id != id || !wanted(&record) {
                continue;
            }
            let previous = Self::carried(&self.trackers.lock(), slot, id, &detector);
            peers.push((
                slot,
                PeerView::new_after(&record, &ring, now, &detector, None, previous.as_ref()),
            ));
        }
        self.add_tracked(&mut peers, &detector.levels, now);
        let mut peers: Vec<PeerView> = peers.into_iter().map(|(_, v)| v).collect();
        peers.sort_unstable_by_key(|p| p.id);
        Ok(peers)
    }

    pub fn stats(&self) -> Result<AgentStats, String> {
        let kernel = self.program.counters()?;
        // Released before the admission lock below: admission takes that lock first and the
        // registry's after it (`on_unknown_peer`), so holding both here in the other order
        // deadlocked the agent under a storm of first heartbeats (tests: fifty_thousand_peers).
        let (peers, capacity) = {
            let registry = self.registry.read().expect("registry lock");
            (registry.len(), registry.capacity())
        };
        let admission = self.admission.lock().expect("admission lock").counters;
        Ok(AgentStats {
            protocol: crate::serving::protocol::PROTOCOL_VERSION,
            iface: self.iface.clone(),
            xdp_mode: self.mode.clone(),
            port: self.port,
            window: self.detector().params.window,
            model: self.detector().params.model.name().into(),
            levels: self.detector().levels.as_slice().to_vec(),
            peers,
            capacity,
            uptime_s: self.started.elapsed().as_secs_f64(),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            refreshes: self.refreshes.load(Ordering::Relaxed),
            refloors: self.refloors.load(Ordering::Relaxed),
            due_passes: self.due_passes.load(Ordering::Relaxed),
            due_looks: self.due_looks.load(Ordering::Relaxed),
            pass_s: self.pass_ns.load(Ordering::Relaxed) as f64 / 1e9,
            heard_told: self.heard_told.load(Ordering::Relaxed),
            scans_skipped: self.scans_skipped.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            events: self.events_sent.load(Ordering::Relaxed),
            subscribers: self.events.receiver_count(),
            kernel,
            xdp: self.program.run_stats(),
            admission,
            config_reloads: self.reloads.load(Ordering::Relaxed),
            config_reload_failures: self.reload_failures.load(Ordering::Relaxed),
            key_rotations: self.key_rotations.load(Ordering::Relaxed),
            key_rotation_failures: self.key_rotation_failures.load(Ordering::Relaxed),
            program: self.origin.clone(),
            link: *self.link.lock().expect("link lock"),
        })
    }
}

impl Handler for Agent {
    fn client(&self, connected: bool) {
        if connected {
            self.clients.fetch_add(1, Ordering::Relaxed);
        } else {
            self.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn refused(&self, why: crate::serving::limits::Refusal) {
        self.metrics
            .socket_refusals
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .inc();
    }

    fn cut_off(&self, why: crate::serving::limits::CutOff) {
        self.metrics
            .socket_cutoffs
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .inc();
    }

    fn answered(&self, op: &'static str, took: std::time::Duration) {
        self.metrics
            .request_seconds
            .get_or_create(&OpLabel { op })
            .observe(took.as_secs_f64());
    }

    fn try_handle(&self, request: &Request) -> Option<Response> {
        match *request {
            Request::Peer { id, window: false } => {
                Some(Response::Reply(match self.try_peer(id)? {
                    Ok(peer) => ok_reply("peer", peer),
                    Err(e) => e.reply(),
                }))
            }
            _ => None,
        }
    }

    fn handle(&self, request: Request) -> Response {
        Response::Reply(match request {
            Request::Record { ids, duration_ms } => match self.record(&ids, duration_ms) {
                Ok((reply, recording)) => return Response::Record(reply, recording),
                Err(e) => error_reply(e),
            },
            Request::Peer { id, window } => match self.peer(id, window) {
                Ok(peer) => ok_reply("peer", peer),
                Err(e) => e.reply(),
            },
            Request::Peers { addr, source } => match self.peers_matching(addr, source) {
                Ok(peers) => {
                    return Response::List(ListReply::new(json!({"ok": true}), "peers", peers));
                }
                Err(e) => e.reply(),
            },
            Request::Suspects { threshold } => {
                let threshold = threshold.unwrap_or_else(|| self.detector().levels.highest());
                let envelope = json!({"ok": true, "threshold": threshold});
                return Response::List(ListReply::new(
                    envelope,
                    "suspects",
                    self.suspects(threshold),
                ));
            }
            Request::Subscribe => {
                return Response::Subscribe(
                    json!({"ok": true, "subscribed": true}),
                    self.subscribe(),
                );
            }
            Request::Forget { id } => match self.forget(id) {
                Ok(()) => json!({"ok": true, "forgotten": id}),
                Err(e) => error_reply(e.to_string()),
            },
            Request::Stats => match self.stats() {
                Ok(stats) => ok_reply("stats", stats),
                Err(e) => error_reply(e),
            },
        })
    }
}
