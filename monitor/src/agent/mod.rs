//! The running agent: owns the peer table, the registry and the per-peer trackers. Each of its
//! jobs has a file: the sweep (`sweep`), first packets to slots (`admission`), the socket's
//! requests (`requests`), recordings (`recording`), the metrics scrape (`metrics_source`),
//! SIGHUP (`reload`), and starting and running it all (`run`, `sweeper`).

pub mod admission;
mod due_soon;
mod metrics_source;
mod notify;
pub mod observer_faults;
pub mod passive;
pub mod peers_file;
mod program_stats;
mod recording;
mod reload;
mod requests;
mod run;
mod scan_skip;
mod sweep;
mod sweep_wake;
mod sweeper;
#[cfg(test)]
mod tests;

use std::{
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_common::maps::{ArrivalRecord, PeerRecord};
use tokio::sync::broadcast;

pub use self::passive::PassiveSources;
pub use self::program_stats::{LiveProgram, ProgramStats};
pub use self::run::{AgentConfig, Reload, run};
use crate::{
    agent::admission::{Admission, AdmissionPolicy},
    agent::due_soon::DueSoon,
    agent::sweep_wake::SweepWake,
    detector::tracker::{DetectorConfig, LevelFloor, PeerTracker, WordWatch},
    kernel::peer_table::{Busy, PeerTable},
    kernel::registry::Registry,
    serving::event::Event,
    serving::metrics::{AgentMetrics, KindLabel},
    serving::protocol::LinkStats,
    serving::recording::{ARRIVAL_BUFFER, Recordings},
};

/// Events buffered per subscriber before a slow one is told it missed some.
pub const EVENT_BUFFER: usize = 65_536;

/// State shared by the socket clients, the sweeper and the admission task.
pub struct Agent {
    table: PeerTable,
    registry: RwLock<Registry>,
    /// Sweep state, indexed by slot.
    trackers: parking_lot::Mutex<Trackers>,
    /// Replaced whole when SIGHUP changes the levels or the detector (`set_detector`), always
    /// while the trackers are locked, so each chunk of a sweep sees one config for all its
    /// peers. Its model says whether a read copies the window (`needs_ring`).
    detector: RwLock<Arc<DetectorConfig>>,
    /// The running program's counters and run statistics.
    program: Box<dyn ProgramStats>,
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
    /// Wakes the sweeper before its planned time when a deadline may have come nearer.
    sweep_wake: SweepWake,
    /// Passes over the slots due before the next scan (`Agent::run_due`), and the slots they
    /// looked at.
    due_passes: AtomicU64,
    due_looks: AtomicU64,
    /// Time spent in scans and due passes, ns: with the process's CPU, what the sweeper's wakes
    /// and everything else cost (`AgentStats::pass_s`).
    pass_ns: AtomicU64,
    /// Heartbeats of suspected peers the kernel told (`on_arrival`, `TELL_HEARD`).
    heard_told: AtomicU64,
    /// Scans that left the words alone (`scan_skip`).
    scans_skipped: AtomicU64,
}

/// The sweep's state of every slot, in three dense arrays indexed by slot: what every sweep
/// reads (`WordWatch`, 16 bytes), what it reads when a word moved or a deadline came
/// (`LevelFloor`, 16 bytes), and the trackers themselves, touched on refreshes, transitions
/// and queries; and the slots due before the next scan.
struct Trackers {
    watches: Vec<WordWatch>,
    level_floors: Vec<LevelFloor>,
    peers: Vec<Option<PeerTracker>>,
    /// A detector change in progress (`reload::DetectorChange`).
    change: Option<reload::DetectorChange>,
    due: DueSoon,
    /// Whether the next scan may leave the words alone (`scan_skip`).
    skip: scan_skip::ScanSkip,
}

impl Trackers {
    fn new(capacity: usize) -> Self {
        Self {
            watches: vec![WordWatch::NEW; capacity],
            level_floors: vec![LevelFloor::NONE; capacity],
            peers: vec![None; capacity],
            change: None,
            due: DueSoon::default(),
            skip: scan_skip::ScanSkip::default(),
        }
    }

    /// The tracker of `slot` if it watches `id`.
    fn of(&self, slot: u32, id: u64) -> Option<&PeerTracker> {
        self.peers[slot as usize]
            .as_ref()
            .filter(|t| t.peer_id == id)
    }

    fn clear(&mut self, slot: u32) {
        self.forget_pending(slot as usize);
        self.peers[slot as usize] = None;
        self.watches[slot as usize] = WordWatch::NEW;
        self.level_floors[slot as usize] = LevelFloor::NONE;
        self.skip.slot_cleared();
    }
}

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
    /// The running program's counters and run statistics (`LiveProgram`).
    pub program: Box<dyn ProgramStats>,
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
            trackers: parking_lot::Mutex::new(Trackers::new(capacity)),
            detector: RwLock::new(Arc::new(parts.detector)),
            program: parts.program,
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
            sweep_wake: SweepWake::default(),
            due_passes: AtomicU64::new(0),
            due_looks: AtomicU64::new(0),
            pass_ns: AtomicU64::new(0),
            heard_told: AtomicU64::new(0),
            scans_skipped: AtomicU64::new(0),
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

    /// A receiver of every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub(crate) fn publish(&self, event: Event) {
        self.publish_all(std::iter::once(event));
    }

    /// Publishes `events` in their order (a pass drains its batch into it, keeping the batch's
    /// room for the next one): the events a pass raised together (a mass failure raises thousands) are
    /// handed over at once, before the pass lets go of the trackers, with one clock read and one
    /// count per kind for all of them rather than one each.
    pub(crate) fn publish_all(&self, events: impl ExactSizeIterator<Item = Event>) {
        if events.len() == 0 {
            return;
        }
        self.events_sent
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        let now_ms = wall_ms();
        // Runs of one kind (a burst is mostly one), each counted once.
        let mut run: Option<(&'static str, u64)> = None;
        for event in events {
            if let Event::Suspect(s) = &event {
                self.metrics
                    .event_latency_seconds
                    .observe((now_ms - s.crossed_at).max(0.0) / 1000.0);
            }
            let kind = event.kind();
            match &mut run {
                Some((of, n)) if *of == kind => *n += 1,
                _ => {
                    if let Some((of, n)) = run.replace((kind, 1)) {
                        self.count_events(of, n);
                    }
                }
            }
            // No subscriber is not an error: the event simply has no audience.
            let _ = self.events.send(event);
        }
        if let Some((of, n)) = run {
            self.count_events(of, n);
        }
    }

    fn count_events(&self, kind: &'static str, n: u64) {
        self.metrics
            .events
            .get_or_create(&KindLabel { kind })
            .inc_by(n);
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

    /// Whether new suspicions are held now (the link is down or just back, or a stall).
    fn holding(&self) -> bool {
        self.link.lock().expect("link lock").holding
    }
}
