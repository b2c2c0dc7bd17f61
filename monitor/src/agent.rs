//! The running agent: owns the loaded program, the peer table, the registry and the per-peer
//! trackers; sweeps for suspicions and answers socket requests.

use std::{
    future::Future,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use aya::maps::{MapData, PerCpuArray};
use monitor_common::{
    config::{XDP_FLAG_PASS_HEARTBEATS, XDP_FLAG_REQUIRE_AUTH, XdpConfig},
    maps::{
        Counters, LAYOUT_VERSION, MAX_INTERVAL_US, META_MAGIC, PeerSlot, PinnedMeta,
        UnknownPeerReport,
    },
};
use serde_json::json;
use tokio::sync::broadcast;

use crate::{
    access::{self, AccessPolicy},
    admission::{self, Admission, AdmissionPolicy, Verdict, consume_reports},
    auth_key::read_key_file,
    clock::monotonic_ns,
    counters::CounterTotals,
    detector::{
        levels::Levels,
        model::{DetectorParams, Estimate, Model},
        tracker::{DetectorConfig, Event, PeerTracker},
    },
    keyring::KeyRing,
    loaded::LoadedProgram,
    peer_table::PeerTable,
    peer_view::{PeerView, ip_addr},
    pinning,
    program::{self, AttachMode},
    protocol::{AgentStats, Request, error_reply, ok_reply},
    registry::{AdmitError, ForgetError, Registry},
    server::{self, Handler, Response},
};

/// Events buffered per subscriber before a slow one is told it missed some.
pub const EVENT_BUFFER: usize = 65_536;

/// Everything `monitor run` is told.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub iface: String,
    pub port: u16,
    pub socket: PathBuf,
    pub peers_file: Option<PathBuf>,
    pub mode: AttachMode,
    pub capacity: u32,
    /// Who is admitted on a first heartbeat.
    pub admission: AdmissionPolicy,
    pub pass_heartbeats: bool,
    pub unknown_reports_per_sec: u32,
    /// The detector; its `window` is the kernel's window.
    pub detector: DetectorParams,
    pub levels: Levels,
    pub sweep_interval: Duration,
    /// Require heartbeats signed with the key in this file (re-read on SIGHUP).
    pub auth_key_file: Option<PathBuf>,
    /// How long the previous key stays valid after a rotation.
    pub auth_grace: Duration,
    /// Forget peers silent for longer than this (their slots are reused).
    pub expire_after: Option<Duration>,
    /// Group allowed to use the socket besides root and the agent's user.
    pub socket_group: Option<String>,
    /// Pin the program and maps here, and adopt what is pinned here at start.
    pub pin_path: Option<PathBuf>,
    /// A sweep that comes this much later than the previous one means the agent itself was
    /// not scheduled; new suspicions are held for as long as the stall lasted.
    pub stall_bound: Duration,
}

/// State shared by the socket clients, the sweeper and the admission task.
pub struct Agent {
    table: PeerTable,
    registry: RwLock<Registry>,
    /// Sweep state, indexed by slot.
    trackers: Mutex<Vec<Option<PeerTracker>>>,
    detector: DetectorConfig,
    counters: PerCpuArray<MapData, Counters>,
    events: broadcast::Sender<Event>,
    iface: String,
    mode: String,
    port: u16,
    started: Instant,
    sweeps: AtomicU64,
    stalls: AtomicU64,
    events_sent: AtomicU64,
    program_fd: OwnedFd,
    admission: Mutex<Admission>,
    expire_after_ns: Option<u64>,
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
    pub counters: PerCpuArray<MapData, Counters>,
    /// The XDP program, for its run statistics.
    pub program_fd: OwnedFd,
    pub detector: DetectorConfig,
    pub iface: String,
    /// How the program is attached: native, skb, or adopted.
    pub mode: String,
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
            trackers: Mutex::new(vec![None; capacity]),
            detector: parts.detector,
            counters: parts.counters,
            events,
            iface: parts.iface,
            mode: parts.mode,
            port: parts.port,
            started: Instant::now(),
            sweeps: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            events_sent: AtomicU64::new(0),
            program_fd: parts.program_fd,
            admission: Mutex::new(Admission::new(parts.admission)),
            expire_after_ns: parts.expire_after.map(|d| d.as_nanos() as u64),
        }
    }

    /// A receiver of every event published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn publish(&self, event: Event) {
        self.events_sent.fetch_add(1, Ordering::Relaxed);
        // No subscriber is not an error: the event simply has no audience.
        let _ = self.events.send(event);
    }

    fn qos(&self, slot: u32, id: u64, now: u64) -> Option<crate::detector::qos::QosReport> {
        let trackers = self.trackers.lock().expect("trackers lock");
        trackers[slot as usize]
            .as_ref()
            .filter(|t| t.peer_id == id)
            .map(|t| t.qos(now))
    }

    pub fn peer(&self, id: u64) -> Option<PeerView> {
        let slot = self.registry.read().expect("registry lock").slot_of(id)?;
        let record = self.table.record(slot)?;
        let now = monotonic_ns();
        Some(PeerView::new(
            &record,
            now,
            &self.detector,
            self.qos(slot, id, now),
        ))
    }

    /// Every admitted peer, sorted by id.
    pub fn peers(&self) -> Vec<PeerView> {
        self.collect()
    }

    /// Peers with phi >= threshold, sorted by id. The silence at which phi reaches the
    /// threshold is found once per request, so most peers cost a compare, not an erfc.
    ///
    /// A peer unchanged since the last sweep is judged from the sweep's cached estimate and one
    /// word read from the mmap; only candidates get their record copied and phi computed.
    pub fn suspects(&self, threshold: f64) -> Vec<PeerView> {
        let crossing = self.detector.params.level_silences(&[threshold]);
        // A hair of slack for the bisection; the exact phi decides at the end.
        let beyond = |last_ns: u64, estimate: &Estimate, now: u64| {
            now.saturating_sub(last_ns) as f64 / 1e6
                >= crossing.silence_ms(0, estimate) * (1.0 - 1e-9)
        };
        let now = monotonic_ns();
        let registry = self.registry.read().expect("registry lock");
        let trackers = self.trackers.lock().expect("trackers lock");
        let mut suspects = Vec::new();
        for (id, slot) in registry.iter() {
            let tracker = trackers[slot as usize].as_ref().filter(|t| t.peer_id == id);
            if let Some(t) = tracker.filter(|t| t.heartbeats() == self.table.heartbeats(slot)) {
                let (last, estimate) = t.last_heard();
                if !beyond(last, estimate, now) {
                    continue;
                }
            }
            let Some(record) = self.table.record(slot).filter(|r| r.peer_id == id) else {
                continue;
            };
            if !beyond(
                record.last_arrival_ns,
                &self.detector.estimate(&record),
                now,
            ) {
                continue;
            }
            let view = PeerView::new(&record, now, &self.detector, tracker.map(|t| t.qos(now)));
            if view.phi >= threshold {
                suspects.push(view);
            }
        }
        drop(trackers);
        drop(registry);
        suspects.sort_unstable_by_key(|p| p.id);
        suspects
    }

    fn collect(&self) -> Vec<PeerView> {
        let now = monotonic_ns();
        let registry = self.registry.read().expect("registry lock");
        let trackers = self.trackers.lock().expect("trackers lock");
        let mut peers: Vec<PeerView> = registry
            .iter()
            .filter_map(|(id, slot)| Some((id, slot, self.table.record(slot)?)))
            .filter(|(id, _, record)| record.peer_id == *id)
            .map(|(id, slot, record)| {
                let qos = trackers[slot as usize]
                    .as_ref()
                    .filter(|t| t.peer_id == id)
                    .map(|t| t.qos(now));
                PeerView::new(&record, now, &self.detector, qos)
            })
            .collect();
        drop(trackers);
        drop(registry);
        peers.sort_unstable_by_key(|p| p.id);
        peers
    }

    pub fn stats(&self) -> Result<AgentStats, String> {
        let kernel =
            CounterTotals::read(&self.counters).map_err(|e| format!("reading counters: {e}"))?;
        let registry = self.registry.read().expect("registry lock");
        Ok(AgentStats {
            iface: self.iface.clone(),
            xdp_mode: self.mode.clone(),
            port: self.port,
            window: self.detector.params.window,
            model: self.detector.params.model.name().into(),
            levels: self.detector.levels.as_slice().to_vec(),
            peers: registry.len(),
            capacity: registry.capacity(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            events: self.events_sent.load(Ordering::Relaxed),
            subscribers: self.events.receiver_count(),
            kernel,
            xdp: program::run_stats(self.program_fd.as_fd()).unwrap_or_default(),
            admission: self.admission.lock().expect("admission lock").counters,
        })
    }

    pub fn admit(&self, id: u64) -> Result<u32, AdmitError> {
        let slot =
            self.registry
                .write()
                .expect("registry lock")
                .admit(&self.table, id, monotonic_ns())?;
        self.publish(Event::Admit {
            id,
            at: wall_ms() as u64,
        });
        Ok(slot)
    }

    pub fn forget(&self, id: u64) -> Result<(), ForgetError> {
        self.forget_because(id, "request")
    }

    fn forget_because(&self, id: u64, reason: &str) -> Result<(), ForgetError> {
        let mut registry = self.registry.write().expect("registry lock");
        let slot = registry.forget(&self.table, id)?;
        self.trackers.lock().expect("trackers lock")[slot as usize] = None;
        drop(registry);
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
        if admission.decide(source, Instant::now()) == Verdict::Refuse {
            log::debug!("not admitting peer {id} from {source:?}: admission policy");
            return;
        }
        match self.admit(id) {
            Ok(slot) => {
                admission.counters.admitted += 1;
                log::debug!("admitted peer {id} (slot {slot}) on its first heartbeat");
            }
            Err(AdmitError::Exists(_)) => {}
            Err(e @ AdmitError::Full(_)) => {
                admission.counters.full += 1;
                log::debug!("not admitting peer {id}: {e}");
            }
            Err(e) => log::warn!("not admitting peer {id}: {e}"),
        }
    }

    /// One pass over every peer: new heartbeats end suspicions, passed deadlines raise them.
    /// A peer whose heartbeat count has not moved costs one load from the mmap and a compare
    /// of the clock with its next deadline; only a changed peer's record is copied.
    pub fn sweep(&self, now_ns: u64, hold: bool) {
        let wall = wall_ms();
        let registry = self.registry.read().expect("registry lock");
        let mut trackers = self.trackers.lock().expect("trackers lock");
        let mut emit = |e| self.publish(e);
        let mut expired = Vec::new();
        for (id, slot) in registry.iter() {
            let tracker = &mut trackers[slot as usize];
            match tracker {
                Some(t) if t.peer_id == id && t.heartbeats() == self.table.heartbeats(slot) => {
                    t.check_deadlines(&self.detector, now_ns, wall, hold, &mut emit);
                    if self
                        .expire_after_ns
                        .is_some_and(|e| now_ns.saturating_sub(t.last_heard().0) > e)
                    {
                        expired.push(id);
                    }
                }
                _ => {
                    let Some(record) = self.table.record(slot) else {
                        continue;
                    };
                    if record.peer_id != id {
                        continue;
                    }
                    if tracker.as_ref().is_none_or(|t| t.peer_id != id) {
                        *tracker = Some(PeerTracker::new(&record, &self.detector));
                    }
                    let t = tracker.as_mut().expect("just set");
                    t.observe(&record, &self.detector, now_ns, wall, hold, &mut emit);
                }
            }
        }
        drop(trackers);
        drop(registry);
        for id in expired {
            log::info!("forgetting peer {id}: silent longer than the expiry bound");
            if let Err(e) = self.forget_because(id, "expired") {
                log::warn!("expiring peer {id}: {e}");
            }
        }
        self.sweeps.fetch_add(1, Ordering::Relaxed);
    }
}

impl Handler for Agent {
    fn handle(&self, request: Request) -> Response {
        Response::Reply(match request {
            Request::Peer { id } => match self.peer(id) {
                Some(peer) => ok_reply("peer", peer),
                None => error_reply(format!("unknown peer {id}")),
            },
            Request::Peers => ok_reply("peers", self.peers()),
            Request::Suspects { threshold } => {
                let threshold = threshold.unwrap_or_else(|| self.detector.levels.highest());
                let mut reply = ok_reply("suspects", self.suspects(threshold));
                reply["threshold"] = json!(threshold);
                reply
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

/// Sweeps forever; detects its own stalls (Cassandra pauses convictions the same way).
async fn sweep_loop(agent: Arc<Agent>, interval: Duration, stall_bound: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = monotonic_ns();
    let mut hold_until = 0u64;
    loop {
        ticker.tick().await;
        let now = monotonic_ns();
        let gap = now.saturating_sub(last);
        last = now;
        if gap > stall_bound.as_nanos() as u64 {
            agent.stalls.fetch_add(1, Ordering::Relaxed);
            hold_until = now + gap;
            log::warn!(
                "the agent was not scheduled for {:.0} ms; holding new suspicions for as long",
                gap as f64 / 1e6
            );
        }
        agent.sweep(now, now < hold_until);
    }
}

fn xdp_config(config: &AgentConfig, require_auth: bool) -> XdpConfig {
    let max_interval_us = config.detector.max_interval_ms.map_or(0, |ms| {
        ((ms * 1000.0) as u64).clamp(1, MAX_INTERVAL_US) as u32
    });
    XdpConfig {
        port: config.port,
        window: config.detector.window,
        flags: if config.pass_heartbeats {
            XDP_FLAG_PASS_HEARTBEATS
        } else {
            0
        } | if require_auth {
            XDP_FLAG_REQUIRE_AUTH
        } else {
            0
        },
        unknown_reports_per_sec: config.unknown_reports_per_sec,
        max_interval_us,
        ..XdpConfig::DEFAULT
    }
}

/// Loads, attaches and serves until `shutdown` completes; detaches and removes the socket on
/// the way out.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    let peers = match &config.peers_file {
        Some(path) => admission::read_peers_file(path)?,
        None => Vec::new(),
    };
    if peers.len() > config.capacity as usize {
        anyhow::bail!(
            "the peers file lists {} peers but --capacity is {}",
            peers.len(),
            config.capacity
        );
    }
    // Before the socket exists (see cli::run): SIGHUP must never meet its default action.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    // Bind first: a socket already in use is the cheapest error to report.
    let group = config
        .socket_group
        .as_deref()
        .map(access::group_id)
        .transpose()?;
    let (listener, _socket_guard) = server::bind(&config.socket, group)?;
    let policy = AccessPolicy::current(group);
    // Read the key before anything is loaded: a bad key file stops the start cleanly.
    let key = config
        .auth_key_file
        .as_deref()
        .map(read_key_file)
        .transpose()?;
    let xdp = xdp_config(&config, key.is_some());
    let expected = PinnedMeta {
        magic: META_MAGIC,
        layout_version: LAYOUT_VERSION,
        slot_size: size_of::<PeerSlot>() as u32,
        capacity: config.capacity,
        window: xdp.window,
        port: xdp.port,
        flags: xdp.flags,
        max_interval_us: xdp.max_interval_us,
        ..PinnedMeta::default()
    };
    let kernel = match &config.pin_path {
        Some(dir) if pinning::has_state(dir) => adopt(dir, &expected)?,
        _ => load_and_attach(&config, &xdp, expected)?,
    };
    let Kernel {
        table,
        mut registry,
        counters,
        unknown_reports,
        auth_keys,
        program_fd,
        mode,
        ebpf,
        pinned,
    } = kernel;
    let keyring = match (key, &config.auth_key_file) {
        (Some(key), Some(path)) => Some(Arc::new(
            KeyRing::new(auth_keys, key, path.clone(), config.auth_grace)
                .context("installing the auth key")?,
        )),
        _ => None,
    };
    let now = monotonic_ns();
    for &id in &peers {
        match registry.admit(&table, id, now) {
            // Adopted state already watches it, window and all.
            Ok(_) | Err(AdmitError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }

    let detector = DetectorConfig::new(config.detector.clone(), config.levels.clone());
    log::info!(
        "watching UDP port {} on {} ({} mode): {} peers from file, capacity {}, {} model, levels {}, socket {}",
        config.port,
        config.iface,
        mode,
        peers.len(),
        config.capacity,
        detector.params.model.name(),
        detector.levels,
        config.socket.display()
    );
    if detector.params.model == Model::Fixed {
        log::info!(
            "fixed model: every level is reached at the {} ms timeout",
            detector.params.timeout_ms
        );
    }

    let agent = Arc::new(Agent::new(AgentParts {
        table,
        registry,
        counters,
        program_fd,
        detector,
        iface: config.iface.clone(),
        mode,
        port: config.port,
        admission: config.admission.clone(),
        expire_after: config.expire_after,
    }));

    let reports = {
        let agent = agent.clone();
        consume_reports(unknown_reports, move |report| {
            agent.on_unknown_peer(&report)
        })
    };

    let reload_keys = async move {
        let mut hup = hup;
        loop {
            hup.recv().await;
            match &keyring {
                Some(ring) => {
                    if let Err(e) = ring.rotate() {
                        log::error!("{e:#}; keeping the current keys");
                    }
                }
                None => log::info!("SIGHUP: no --auth-key-file to reload"),
            }
        }
    };

    tokio::select! {
        () = reload_keys => {}
        r = server::serve(listener, agent.clone(), policy) => r.context("serving the socket")?,
        r = reports => r.context("reading unknown-peer reports")?,
        () = sweep_loop(agent.clone(), config.sweep_interval, config.stall_bound) => {}
        () = shutdown => log::info!("shutting down: detaching from {}", config.iface),
    }
    match &pinned {
        Some(dir) => log::info!(
            "the program stays attached and recording, pinned at {}; `monitor detach --iface {}` removes it",
            dir.display(),
            config.iface
        ),
        // Dropping `ebpf` (with its link) detaches the program.
        None => drop(ebpf),
    }
    // `_socket_guard` removes the socket file.
    Ok(())
}

/// What the agent runs on: a freshly loaded program or adopted pinned state.
struct Kernel {
    table: PeerTable,
    registry: Registry,
    counters: PerCpuArray<MapData, Counters>,
    unknown_reports: aya::maps::RingBuf<MapData>,
    auth_keys: aya::maps::Array<MapData, monitor_common::auth::AuthKey>,
    program_fd: OwnedFd,
    /// "native", "skb", or "adopted".
    mode: String,
    /// Owns the program when it was loaded here; dropping it detaches an unpinned program.
    ebpf: Option<aya::Ebpf>,
    /// Where the state is pinned, if it is.
    pinned: Option<PathBuf>,
}

fn adopt(dir: &std::path::Path, expected: &PinnedMeta) -> Result<Kernel> {
    let a = pinning::adopt(dir, expected)?;
    log::info!(
        "adopted the program pinned at {}: {} peers, their windows kept",
        dir.display(),
        a.registry.len()
    );
    // The pin holds the attachment; the handle is not needed.
    drop(a.link);
    Ok(Kernel {
        table: a.table,
        registry: a.registry,
        counters: a.counters,
        unknown_reports: a.unknown_reports,
        auth_keys: a.auth_keys,
        program_fd: a.program_fd,
        mode: "adopted".into(),
        ebpf: None,
        pinned: Some(dir.into()),
    })
}

fn load_and_attach(config: &AgentConfig, xdp: &XdpConfig, meta: PinnedMeta) -> Result<Kernel> {
    if let Some(dir) = &config.pin_path {
        pinning::prepare(dir)?;
    }
    let loaded = LoadedProgram::load_pinned(xdp, config.capacity, config.pin_path.as_deref());
    let result = (|| {
        let LoadedProgram {
            mut ebpf,
            table,
            registry,
            counters,
            unknown_reports,
            auth_keys,
            meta: mut meta_map,
        } = loaded?;
        let (link, mode) = program::attach(&mut ebpf, &config.iface, config.mode)?;
        let program_fd = program::xdp_mut(&mut ebpf)?
            .fd()
            .context("the XDP program has no fd")?
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating the program fd")?;
        if let Some(dir) = &config.pin_path {
            pinning::pin_program(dir, &mut ebpf, link, meta, &mut meta_map)?;
        }
        Ok(Kernel {
            table,
            registry,
            counters,
            unknown_reports,
            auth_keys,
            program_fd,
            mode: mode.to_string(),
            ebpf: Some(ebpf),
            pinned: config.pin_path.clone(),
        })
    })();
    if result.is_err()
        && let Some(dir) = &config.pin_path
    {
        // Half-pinned state is worse than none: the next start would try to adopt it.
        let _ = pinning::remove(dir);
    }
    result
}
