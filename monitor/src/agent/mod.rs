//! The running agent: owns the peer table, the registry and the per-peer trackers; sweeps for
//! suspicions and answers socket requests. Starting it (loading or adopting the program,
//! binding the socket, the tasks) is `run`'s job.

pub mod admission;
mod notify;
pub mod observer_faults;
pub mod passive;
pub mod peers_file;
mod run;

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use aya::maps::{MapData, PerCpuArray};
use monitor_common::{
    maps::{ArrivalRecord, Counters, PeerRecord, UnknownPeerReport},
    passive::{SOURCE_BFD, SOURCE_HEARTBEAT, bfd_diag_name, bfd_state_name, source_name},
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

pub use self::passive::PassiveSources;
pub use self::run::{AgentConfig, Reload, run};
use crate::{
    agent::admission::{Admission, AdmissionPolicy, Refusal, Verdict},
    detector::{
        levels::Levels,
        model::DetectorParams,
        tracker::{DetectorConfig, Lazy, PeerTracker, SweepStep, SweepTime, Transition, Watch},
    },
    kernel::clock::monotonic_ns,
    kernel::counters::CounterTotals,
    kernel::peer_table::{Busy, PeerTable},
    kernel::program,
    kernel::registry::{AdmitError, ForgetError, Registry},
    serving::event::Event,
    serving::metrics::{
        self, AgentMetrics, KindLabel, OpLabel, PeerSeries, ReasonLabel, Scrape, SelectedPeer,
    },
    serving::peer_view::{PeerView, WindowDetail, ip_addr},
    serving::protocol::{
        AgentStats, LinkStats, PeerError, PeerSource, Request, XdpRunStats,
        error_reply, ok_reply,
    },
    serving::recording::{ARRIVAL_BUFFER, RecordingGuard, Recordings},
    serving::server::{Handler, ListReply, Recording, Response},
};

/// Events buffered per subscriber before a slow one is told it missed some.
pub const EVENT_BUFFER: usize = 65_536;

/// State shared by the socket clients, the sweeper and the admission task.
pub struct Agent {
    table: PeerTable,
    registry: RwLock<Registry>,
    /// Sweep state, indexed by slot.
    trackers: Mutex<Trackers>,
    /// Replaced whole when SIGHUP changes the levels or the detector (`set_detector`), always
    /// while the trackers are locked, so each chunk of a sweep sees one config for all its
    /// peers. Its model says whether a read copies the window (`needs_ring`).
    detector: RwLock<Arc<DetectorConfig>>,
    counters: PerCpuArray<MapData, Counters>,
    events: broadcast::Sender<Event>,
    iface: String,
    mode: String,
    origin: crate::serving::protocol::ProgramOrigin,
    port: u16,
    started: Instant,
    sweeps: AtomicU64,
    /// Slot reads by the sweeps (see `AgentStats::refreshes`).
    refreshes: AtomicU64,
    /// Floors renewed without a slot read (see `AgentStats::refloors`).
    refloors: AtomicU64,
    stalls: AtomicU64,
    events_sent: AtomicU64,
    /// Socket clients connected now.
    clients: AtomicUsize,
    /// SIGHUP re-reads of the configuration file that were applied, and that failed.
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    /// SIGHUP re-reads of the key file that installed a key, and that failed.
    key_rotations: AtomicU64,
    key_rotation_failures: AtomicU64,
    metrics: AgentMetrics,
    program_fd: OwnedFd,
    admission: Mutex<Admission>,
    expire_after_ns: Option<u64>,
    /// When the sweep next checks silent peers against `expire_after_ns`.
    next_expiry_scan_ns: AtomicU64,
    /// Arrivals of traced peers, for recording clients.
    arrivals: broadcast::Sender<ArrivalRecord>,
    recordings: Arc<Recordings>,
    /// The BFD sessions among the peers (`--bfd`), looked at every sweep for a reported Down.
    /// Found when the sweep first reads a slot, so admitted and adopted sessions alike.
    bfd_sessions: Mutex<Vec<passive::BfdSeen>>,
    /// The interface's link as the sweep last saw it (`observer_faults::LinkWatch`).
    link: Mutex<LinkStats>,
    /// Lowest-level crossings of recent sweeps (`observer_faults::CorrelatedSilence`).
    correlated: Mutex<observer_faults::CorrelatedSilence>,
}

/// The sweep's state of every slot, in three dense arrays indexed by slot: what every sweep
/// reads (`Watch`, 16 bytes), what it reads when a word moved or a deadline came (`Lazy`, 16
/// bytes), and the trackers themselves, touched on refreshes, transitions and queries.
struct Trackers {
    watch: Vec<Watch>,
    lazy: Vec<Lazy>,
    peers: Vec<Option<PeerTracker>>,
}

impl Trackers {
    fn new(capacity: usize) -> Self {
        Self {
            watch: vec![Watch::NEW; capacity],
            lazy: vec![Lazy::NONE; capacity],
            peers: vec![None; capacity],
        }
    }

    /// The tracker of `slot` if it watches `id`.
    fn of(&self, slot: u32, id: u64) -> Option<&PeerTracker> {
        self.peers[slot as usize]
            .as_ref()
            .filter(|t| t.peer_id == id)
    }

    fn clear(&mut self, slot: u32) {
        self.peers[slot as usize] = None;
        self.watch[slot as usize] = Watch::NEW;
        self.lazy[slot as usize] = Lazy::NONE;
    }
}

/// Slots a sweep handles per hold of the trackers lock (a few hundred microseconds at most).
const SWEEP_CHUNK: usize = 4096;

/// How often silent peers are checked against `--expire-after`.
const EXPIRY_SCAN_NS: u64 = 1_000_000_000;

/// Unix time in ms, with sub-millisecond precision.
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// What an agent is made of; see `Agent::new`.
pub struct AgentParts {
    pub table: PeerTable,
    pub registry: Registry,
    pub counters: PerCpuArray<MapData, Counters>,
    /// The XDP program, for its run statistics.
    pub program_fd: OwnedFd,
    pub detector: DetectorConfig,
    pub iface: String,
    /// How the program is attached: native, skb, or adopted.
    pub mode: String,
    /// How the running program came to run, and its tag.
    pub origin: crate::serving::protocol::ProgramOrigin,
    pub port: u16,
    pub admission: AdmissionPolicy,
    /// Forget peers silent for longer than this.
    pub expire_after: Option<Duration>,
}

impl Agent {
    pub fn new(parts: AgentParts) -> Self {
        let capacity = parts.registry.capacity() as usize;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Self {
            table: parts.table,
            registry: RwLock::new(parts.registry),
            trackers: Mutex::new(Trackers::new(capacity)),
            detector: RwLock::new(Arc::new(parts.detector)),
            counters: parts.counters,
            events,
            iface: parts.iface,
            mode: parts.mode,
            origin: parts.origin,
            port: parts.port,
            started: Instant::now(),
            sweeps: AtomicU64::new(0),
            refreshes: AtomicU64::new(0),
            refloors: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            events_sent: AtomicU64::new(0),
            clients: AtomicUsize::new(0),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            key_rotations: AtomicU64::new(0),
            key_rotation_failures: AtomicU64::new(0),
            metrics: AgentMetrics::default(),
            program_fd: parts.program_fd,
            admission: Mutex::new(Admission::new(parts.admission)),
            expire_after_ns: parts.expire_after.map(|d| d.as_nanos() as u64),
            next_expiry_scan_ns: AtomicU64::new(0),
            arrivals: broadcast::channel(ARRIVAL_BUFFER).0,
            recordings: Arc::default(),
            bfd_sessions: Mutex::new(Vec::new()),
            link: Mutex::new(LinkStats {
                up: true,
                changes: 0,
                holding: false,
            }),
            correlated: Mutex::default(),
        }
    }

    /// The monitored interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// What the sweep's link watch says now, for `stats` and the metrics.
    pub(crate) fn note_link(&self, link: &observer_faults::LinkWatch) {
        let mut stats = self.link.lock().expect("link lock");
        stats.up = link.is_up();
        stats.changes = link.changes();
    }

    /// The detector configuration in effect (levels change on SIGHUP).
    pub fn detector(&self) -> Arc<DetectorConfig> {
        self.detector.read().expect("detector lock").clone()
    }

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

    /// Replaces the admission policy (SIGHUP); its counters and token bucket carry on.
    pub fn set_admission(&self, policy: AdmissionPolicy) {
        self.admission
            .lock()
            .expect("admission lock")
            .set_policy(policy);
    }

    /// A receiver of every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub(crate) fn publish(&self, event: Event) {
        self.events_sent.fetch_add(1, Ordering::Relaxed);
        let kind = match &event {
            Event::Suspect(s) => {
                let latency_ms = wall_ms() - s.crossed_at;
                self.metrics
                    .event_latency_seconds
                    .observe(latency_ms.max(0.0) / 1000.0);
                "suspect"
            }
            Event::Recover(_) => "recover",
            Event::Admit { .. } => "admit",
            Event::Forget { .. } => "forget",
            Event::BfdDown { .. } => "bfd_down",
            Event::Lagged { .. } => "lagged",
            Event::LinkDown { .. } => "link_down",
            Event::LinkUp { .. } => "link_up",
            Event::CorrelatedSilence { .. } => "correlated_silence",
        };
        self.metrics.events.get_or_create(&KindLabel { kind }).inc();
        // No subscriber is not an error: the event simply has no audience.
        let _ = self.events.send(event);
    }

    /// A slot's record and, `with_ring` (for the models that need them,
    /// `DetectorParams::needs_ring`), its window's intervals: one consistent copy of the slot
    /// for those, the record alone (and no intervals) for the rest.
    fn read(&self, slot: u32, with_ring: bool) -> Option<(PeerRecord, Vec<u32>)> {
        if with_ring {
            self.table.snapshot(slot)
        } else {
            Some((self.table.record(slot)?, Vec::new()))
        }
    }

    /// [`Self::read`] for a client's request: a slot that keeps changing is retried for a
    /// while, then reported busy (never as an unknown peer).
    fn read_for_client(&self, slot: u32, with_ring: bool) -> Result<(PeerRecord, Vec<u32>), Busy> {
        if with_ring {
            self.table.snapshot_patiently(slot)
        } else {
            Ok((self.table.record_patiently(slot)?, Vec::new()))
        }
    }

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
    fn stop_unwanted_tracing(&self, registry: &Registry) {
        for id in self.recordings.take_unwanted() {
            if let Some(slot) = registry.slot_of(id) {
                self.table.set_traced(slot, id, false);
            }
        }
    }

    fn qos(&self, slot: u32, id: u64, now: u64) -> Option<crate::detector::qos::QosReport> {
        let trackers = self.trackers.lock().expect("trackers lock");
        trackers.of(slot, id).map(|t| t.qos(now))
    }

    /// Whether new suspicions are held now (the link is down or just back, or a stall).
    fn holding(&self) -> bool {
        self.link.lock().expect("link lock").holding
    }

    /// The highest level raised for the peer so far (None: none), from its tracker.
    fn raised(trackers: &Trackers, slot: u32, id: u64, levels: &Levels) -> Option<f64> {
        let crossed = trackers.of(slot, id)?.crossed() as usize;
        crossed.checked_sub(1).map(|i| levels.as_slice()[i])
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
        let mut view = PeerView::new(&record, &ring, now, &detector, self.qos(slot, id, now));
        if self.holding() {
            let trackers = self.trackers.lock().expect("trackers lock");
            view.hold(Self::raised(&trackers, slot, id, &detector.levels));
        }
        if window {
            view.window = Some(WindowDetail::new(&record, ring));
        }
        Ok(view)
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
    /// watch, lazy state and last-heard word say whether it is surely below that level, see
    /// `Lazy::below_first_level`), then from its tracker (the silence below which it cannot
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
            let trackers = self.trackers.lock().expect("trackers lock");
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
                        && trackers.lazy[slot].below_first_level(
                            &trackers.watch[slot],
                            words[slot].load(Ordering::Relaxed),
                            now,
                        ))
                })
                .filter_map(|slot| Some((registry.owner(slot as u32)?, slot as u32)))
                .filter(|&(id, slot)| {
                    let floor = trackers.of(slot, id).and_then(|t| {
                        t.threshold_floor(
                            self.table.last_heard(slot),
                            &trackers.lazy[slot as usize],
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
            let estimate = detector.estimate(&record, &ring);
            if !beyond(
                record.last_arrival_ns,
                crossing.silence_ms(0, &estimate),
                now,
            ) {
                continue;
            }
            let view = PeerView::new(&record, &ring, now, &detector, None);
            if view.phi >= threshold {
                suspects.push((slot, view));
            }
        }
        if !suspects.is_empty() {
            let holding = self.holding();
            let trackers = self.trackers.lock().expect("trackers lock");
            for (slot, view) in &mut suspects {
                view.qos = trackers.of(*slot, view.id).map(|t| t.qos(now));
                if holding {
                    view.hold(Self::raised(&trackers, *slot, view.id, &detector.levels));
                }
            }
            // Held: a peer is a suspect only at a level raised before the hold.
            if holding {
                suspects.retain(|(_, v)| v.level.is_some_and(|level| level >= threshold));
            }
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
            peers.push((slot, PeerView::new(&record, &ring, now, &detector, None)));
        }
        {
            let holding = self.holding();
            let trackers = self.trackers.lock().expect("trackers lock");
            for (slot, view) in &mut peers {
                view.qos = trackers.of(*slot, view.id).map(|t| t.qos(now));
                if holding {
                    view.hold(Self::raised(&trackers, *slot, view.id, &detector.levels));
                }
            }
        }
        let mut peers: Vec<PeerView> = peers.into_iter().map(|(_, v)| v).collect();
        peers.sort_unstable_by_key(|p| p.id);
        Ok(peers)
    }

    pub fn stats(&self) -> Result<AgentStats, String> {
        let kernel =
            CounterTotals::read(&self.counters).map_err(|e| format!("reading counters: {e}"))?;
        // Released before the admission lock below: admission takes that lock first and the
        // registry's after it (`on_unknown_peer`), so holding both here in the other order
        // deadlocked the agent under a storm of first heartbeats (tests: fifty_thousand_peers).
        let (peers, capacity) = {
            let registry = self.registry.read().expect("registry lock");
            (registry.len(), registry.capacity())
        };
        let admission = self.admission.lock().expect("admission lock").counters;
        Ok(AgentStats {
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
            stalls: self.stalls.load(Ordering::Relaxed),
            events: self.events_sent.load(Ordering::Relaxed),
            subscribers: self.events.receiver_count(),
            kernel,
            xdp: program::run_stats(self.program_fd.as_fd())
                .unwrap_or_default()
                .into(),
            admission,
            config_reloads: self.reloads.load(Ordering::Relaxed),
            config_reload_failures: self.reload_failures.load(Ordering::Relaxed),
            key_rotations: self.key_rotations.load(Ordering::Relaxed),
            key_rotation_failures: self.key_rotation_failures.load(Ordering::Relaxed),
            program: self.origin.clone(),
            link: *self.link.lock().expect("link lock"),
        })
    }

    pub fn admit(&self, id: u64) -> Result<u32, AdmitError> {
        self.admit_as(id, SOURCE_HEARTBEAT)
    }

    /// Admits a peer of `source`: a heartbeat peer, or a BFD session or UDP flow the kernel
    /// reported (`monitor_common::passive`).
    fn admit_as(&self, id: u64, source: u8) -> Result<u32, AdmitError> {
        let slot = self.registry.write().expect("registry lock").admit_as(
            &self.table,
            id,
            monotonic_ns(),
            source,
        )?;
        self.publish(Event::Admit {
            id,
            at: wall_ms() as u64,
        });
        Ok(slot)
    }

    /// Raises `bfd_down` for each BFD session that reported Down or AdminDown since the last
    /// sweep: a look at the record of each session heard since (its last-heard word moved).
    /// Sessions whose slot went to another peer are dropped.
    fn look_at_bfd_sessions(&self, registry: &Registry) {
        let mut sessions = self.bfd_sessions.lock().expect("bfd sessions lock");
        if sessions.is_empty() {
            return;
        }
        sessions.retain(|s| registry.owner(s.slot) == Some(s.id));
        let words = self.table.last_heard_words();
        for session in sessions.iter_mut() {
            let word = words[session.slot as usize].load(Ordering::Relaxed);
            if word == session.word {
                continue;
            }
            let Some(record) = self.table.record(session.slot) else {
                continue;
            };
            if record.peer_id != session.id {
                continue;
            }
            session.word = word;
            if let Some(fall) = session.look(&record) {
                log::info!(
                    "BFD session {:#x} reports {} ({})",
                    session.id,
                    bfd_state_name(fall.state),
                    bfd_diag_name(fall.diag)
                );
                self.publish(Event::BfdDown {
                    id: session.id,
                    state: bfd_state_name(fall.state).into(),
                    diag: fall.diag,
                    diagnostic: bfd_diag_name(fall.diag).into(),
                    addr: ip_addr(record.src_family, &record.src_addr).map(|a| a.to_string()),
                    discriminator: record.bfd_my_discriminator,
                    at: wall_ms() as u64,
                });
            }
        }
    }

    pub fn forget(&self, id: u64) -> Result<(), ForgetError> {
        self.forget_because(id, "request")
    }

    fn forget_because(&self, id: u64, reason: &str) -> Result<(), ForgetError> {
        // Admission first, then the registry, as `on_unknown_peer` takes them: its source's
        // share is given back in the same step as the slot.
        let mut admission = self.admission.lock().expect("admission lock");
        let mut registry = self.registry.write().expect("registry lock");
        let slot = registry.forget(&self.table, id)?;
        admission.forgotten(id);
        self.trackers.lock().expect("trackers lock").clear(slot);
        drop(registry);
        drop(admission);
        self.publish(Event::Forget {
            id,
            reason: reason.into(),
            at: wall_ms() as u64,
        });
        Ok(())
    }

    fn on_unknown_peer(&self, report: &UnknownPeerReport) {
        let id = report.peer_id;
        // Reports race with admission: the kernel may report a peer again before it sees the
        // new index entry. Those cost no token.
        if self
            .registry
            .read()
            .expect("registry lock")
            .slot_of(id)
            .is_some()
        {
            return;
        }
        let source = ip_addr(report.src_family, &report.src_addr);
        let mut admission = self.admission.lock().expect("admission lock");
        let passive = report.source != SOURCE_HEARTBEAT;
        let now = Instant::now();
        if let Verdict::Refuse(reason) = admission.decide(source, passive, now) {
            log::debug!(
                "not admitting peer {id} from {}: {}",
                shown(source),
                reason.name()
            );
            if let Some(line) = admission.refusal_line(now) {
                log::warn!("{line}");
            }
            return;
        }
        let refused = |admission: &mut Admission, reason: Refusal| {
            admission.refused(reason, source);
            if let Some(line) = admission.refusal_line(now) {
                log::warn!("{line}");
            }
        };
        match self.admit_as(id, report.source) {
            Ok(slot) => {
                admission.admitted(id, source);
                log::debug!(
                    "admitted {} peer {id} (slot {slot}) on its first packet",
                    source_name(report.source)
                );
                if report.source == SOURCE_BFD {
                    log::info!(
                        "watching BFD session {id:#x} from {} (discriminator {}, {})",
                        shown(source),
                        report.discriminator,
                        bfd_state_name(report.bfd_state)
                    );
                }
            }
            Err(AdmitError::Exists(_)) => {}
            Err(e) => {
                log::debug!("not admitting peer {id}: {e}");
                let reason = match e {
                    AdmitError::Full(_) | AdmitError::Exists(_) => Refusal::Full,
                    AdmitError::Index { .. } => Refusal::IndexFull,
                    AdmitError::Reserved(_) => Refusal::Reserved,
                };
                refused(&mut admission, reason);
            }
        }
    }

    /// The interface's networks changed (or were read at start): who `--admit-from`'s
    /// default admits.
    pub fn set_connected_networks(&self, networks: Vec<ipnet::IpNet>) {
        self.admission
            .lock()
            .expect("admission lock")
            .set_connected(networks);
    }

    /// The admission policy in force, in one line (the start and SIGHUP log it).
    pub fn admission_policy_line(&self) -> String {
        let admission = self.admission.lock().expect("admission lock");
        admission
            .policy()
            .describe(&self.iface, admission.connected())
    }

    /// Peers admitted on a first packet from `source` and still watched.
    pub fn admitted_from(&self, source: std::net::IpAddr) -> u32 {
        self.admission
            .lock()
            .expect("admission lock")
            .admitted_from(source)
    }

    /// Logs the refusals of the last second, if any are untold (the sweep calls it, so the
    /// tail of a burst is told although no refusal follows it). Never waits for the lock.
    fn tell_refusals(&self) {
        if let Ok(mut admission) = self.admission.try_lock()
            && let Some(line) = admission.refusal_line(Instant::now())
        {
            log::warn!("{line}");
        }
    }

    /// One pass over every peer: new heartbeats end suspicions, passed deadlines raise them.
    /// A peer costs one load of its last-heard word (eight to a cache line) and a compare of
    /// that word and the clock with its watch (16 bytes in a dense array); only a peer heard
    /// since or at a deadline costs more, and its slot is read only when its tracker asks
    /// (see `PeerTracker::step`): about once a window of heartbeats for a steady sender (its
    /// floor renewed from the words in between), or when its silence nears a level.
    pub fn sweep(&self, now_ns: u64, hold: bool) {
        let started = std::time::Instant::now();
        let time = SweepTime {
            now_ns,
            wall_ms: wall_ms(),
            hold,
        };
        let registry = self.registry.read().expect("registry lock");
        self.stop_unwanted_tracing(&registry);
        self.link.lock().expect("link lock").holding = hold;
        let lowest = self.detector().levels.as_slice()[0];
        let mut lowest_crossed = 0u64;
        let mut emit = |t: Transition| {
            if matches!(&t, Transition::Suspect(s) if s.level == lowest) {
                lowest_crossed += 1;
            }
            self.publish(t.into())
        };
        let (mut refreshes, mut refloors) = (0u64, 0u64);
        let used = registry.slots_in_use() as usize;
        let words = &self.table.last_heard_words()[..used];
        // In chunks, each under the trackers lock: a query that needs the trackers (`suspects`,
        // `peers`' QoS, a metrics scrape) waits for one chunk, not for the whole sweep.
        for start in (0..used).step_by(SWEEP_CHUNK) {
            let end = (start + SWEEP_CHUNK).min(used);
            let mut trackers = self.trackers.lock().expect("trackers lock");
            // Under the trackers lock: the levels cannot change during a chunk (`set_detector`
            // takes it to re-level every peer).
            let detector = self.detector();
            let with_ring = detector.params.needs_ring();
            let Trackers { watch, lazy, peers } = &mut *trackers;
            let chunk = watch[start..end].iter_mut().zip(&words[start..end]);
            for (slot, (watch, word)) in (start..end).zip(chunk) {
                let word = word.load(Ordering::Relaxed);
                if watch.is_quiet(word, now_ns) {
                    continue;
                }
                let lazy = &mut lazy[slot];
                // A heartbeat the estimate's floor covers: no tracker, no slot.
                if lazy.absorb(word, watch, time) {
                    continue;
                }
                let tracker = &mut peers[slot];
                let Some(id) = registry.owner(slot as u32) else {
                    // No peer: nothing to do until an admission resets the slot (and its word).
                    *tracker = None;
                    *watch = Watch::vacant(word);
                    *lazy = Lazy::NONE;
                    continue;
                };
                if let Some(t) = tracker.as_mut().filter(|t| t.peer_id == id) {
                    match t.step(word, watch, lazy, &detector, time, &mut emit) {
                        SweepStep::Done => {}
                        SweepStep::Refloored => refloors += 1,
                        SweepStep::Refresh => {
                            refreshes += 1;
                            if let Some((record, ring)) = self.read(slot as u32, with_ring)
                                && record.peer_id == id
                            {
                                t.observe(&record, &ring, watch, lazy, &detector, time, &mut emit);
                            }
                        }
                    }
                    continue;
                }
                // A peer this slot's tracker has not seen yet.
                refreshes += 1;
                let Some((record, ring)) = self.read(slot as u32, with_ring) else {
                    continue;
                };
                if record.peer_id != id {
                    continue;
                }
                if record.source == SOURCE_BFD {
                    let mut sessions = self.bfd_sessions.lock().expect("bfd sessions lock");
                    sessions.retain(|s| s.slot != slot as u32);
                    sessions.push(passive::BfdSeen::new(slot as u32, id, &record));
                }
                let (mut t, new_watch, new_lazy) = PeerTracker::new(&record, &ring, &detector);
                (*watch, *lazy) = (new_watch, new_lazy);
                t.observe(&record, &ring, watch, lazy, &detector, time, &mut emit);
                *tracker = Some(t);
            }
        }
        let trackers = self.trackers.lock().expect("trackers lock");
        let expired = self.expired(&registry, &trackers, now_ns);
        drop(trackers);
        self.look_at_bfd_sessions(&registry);
        let watched = registry.len() as u64;
        drop(registry);
        let correlated = self.correlated.lock().expect("correlated lock").note(
            lowest_crossed,
            watched,
            lowest,
            now_ns,
            time.wall_ms as u64,
        );
        if let Some(event) = correlated {
            if let Event::CorrelatedSilence { peers, .. } = &event {
                log::warn!(
                    "{peers} of {watched} peers crossed level {lowest} within a second: a shared fault (this host, its link, a switch) is likelier than {peers} failures"
                );
            }
            self.publish(event);
        }
        self.refreshes.fetch_add(refreshes, Ordering::Relaxed);
        self.refloors.fetch_add(refloors, Ordering::Relaxed);
        for id in expired {
            log::info!("forgetting peer {id}: silent longer than the expiry bound");
            if let Err(e) = self.forget_because(id, "expired") {
                log::warn!("expiring peer {id}: {e}");
            }
        }
        self.tell_refusals();
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .sweep_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// Peers silent for longer than `--expire-after`, checked once a second (the bound is
    /// minutes in practice; a scan of every tracker per sweep would cost more than the sweep).
    fn expired(&self, registry: &Registry, trackers: &Trackers, now_ns: u64) -> Vec<u64> {
        let Some(bound) = self.expire_after_ns else {
            return Vec::new();
        };
        if now_ns < self.next_expiry_scan_ns.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.next_expiry_scan_ns
            .store(now_ns + EXPIRY_SCAN_NS, Ordering::Relaxed);
        registry
            .iter()
            .filter(|&(id, slot)| {
                trackers.of(slot, id).is_some_and(|t| {
                    let last = t.last_arrival_ns(&trackers.watch[slot as usize], now_ns);
                    now_ns.saturating_sub(last) > bound
                })
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// What a metrics scrape reads: levels and phi of every peer from the sweep's trackers
    /// (no kernel read per peer), the selected peers, and `stats`.
    fn scrape_now(&self, series: &PeerSeries) -> Scrape {
        let now = monotonic_ns();
        let detector = self.detector();
        let levels = detector.levels.as_slice().to_vec();
        let mut peers_at = vec![0u64; levels.len() + 1];
        let mut phi_le = vec![0u64; metrics::PHI_BUCKETS.len()];
        // (phi, id, silence s, crossed) of the asked-for ids, found in the one pass, and of
        // every tracked peer only when the top K are asked for.
        let wanted: std::collections::HashSet<u64> = series.ids.iter().copied().collect();
        let mut found: std::collections::HashMap<u64, (f64, u64, f64, u8)> =
            std::collections::HashMap::with_capacity(wanted.len());
        let mut all: Vec<(f64, u64, f64, u8)> = Vec::new();
        {
            let trackers = self.trackers.lock().expect("trackers lock");
            for (t, watch) in trackers.peers.iter().zip(&trackers.watch) {
                let Some(t) = t else { continue };
                let crossed = t.crossed();
                peers_at[(crossed as usize).min(levels.len())] += 1;
                // The estimate of the last refresh (at most a window of heartbeats old, see
                // `PeerTracker::refloor`) against the last arrival: the scrape reads no slot.
                let last = t.last_arrival_ns(watch, now);
                let phi = detector.phi(t.estimate(), last, now);
                for (n, &le) in phi_le.iter_mut().zip(&metrics::PHI_BUCKETS) {
                    if phi <= le {
                        *n += 1;
                    }
                }
                let peer = || {
                    let silence = now.saturating_sub(last) as f64 / 1e9;
                    (phi, t.peer_id, silence, crossed)
                };
                if wanted.contains(&t.peer_id) {
                    found.insert(t.peer_id, peer());
                }
                if series.top > 0 {
                    all.push(peer());
                }
            }
        }
        let level_of = |crossed: u8| {
            if crossed == 0 {
                0.0
            } else {
                levels[(crossed as usize - 1).min(levels.len() - 1)]
            }
        };
        let mut shown: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut selected: Vec<SelectedPeer> = Vec::new();
        let select = |p: &(f64, u64, f64, u8)| SelectedPeer {
            id: p.1,
            phi: p.0,
            silence_s: p.2,
            level: level_of(p.3),
        };
        for id in &series.ids {
            if let Some(p) = found.get(id)
                && shown.insert(p.1)
            {
                selected.push(select(p));
            }
        }
        if series.top > 0 && !all.is_empty() {
            let k = series.top.min(all.len());
            all.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
            let top = &mut all[..k];
            top.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for p in top.iter() {
                if shown.insert(p.1) {
                    selected.push(select(p));
                }
            }
        }
        Scrape {
            stats: self
                .stats()
                .map_err(|e| log::warn!("metrics scrape: {e}"))
                .ok(),
            levels,
            peers_at,
            phi_le,
            selected,
            socket_clients: self.clients.load(Ordering::Relaxed) as u64,
        }
    }
}

impl metrics::Source for Agent {
    fn scrape(&self, series: &PeerSeries) -> Scrape {
        self.scrape_now(series)
    }

    fn metrics(&self) -> &AgentMetrics {
        &self.metrics
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

// The kernel side's run statistics into the protocol's type: the agent is the one stage
// that reads both.

impl From<program::RunStats> for XdpRunStats {
    fn from(r: program::RunStats) -> Self {
        // `id` stays on the kernel side: it was never serialised.
        Self {
            run_count: r.run_count,
            run_time_ns: r.run_time_ns,
        }
    }
}

/// An address for a log line: a report may carry none.
fn shown(addr: Option<std::net::IpAddr>) -> String {
    addr.map_or_else(|| "an unknown address".into(), |a| a.to_string())
}
