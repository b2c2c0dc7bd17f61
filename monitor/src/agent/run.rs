//! Starting and running the agent: the program loaded (or adopted from pins) and attached,
//! the socket bound, the sweeper, the unknown-peer reports and key reloads running until
//! shutdown.

use crate::kernel::maps::KernelMaps;
use std::{
    future::Future,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::{Context, Result};
use monitor_common::{
    config::{XDP_FLAG_PASS_HEARTBEATS, XDP_FLAG_REQUIRE_AUTH, XdpConfig},
    maps::{LAYOUT_VERSION, META_MAGIC, PeerSlot, PinnedMeta},
};

use crate::serving::protocol::ProgramOrigin;

use super::{
    Agent, AgentParts, LiveProgram,
    notify::{self, Notifier},
    observer_faults::{LinkState, LinkWatch},
};
use crate::{
    agent::{admission::AdmissionPolicy, peers_file},
    detector::{
        levels::Levels,
        model::{DetectorParams, Model},
        spec,
        tracker::DetectorConfig,
    },
    kernel::clock::monotonic_ns,
    kernel::destination::{DestinationError, Destinations},
    kernel::kernel_log,
    kernel::keyring::KeyRing,
    kernel::loaded::LoadedProgram,
    kernel::pinning,
    kernel::program::{self, AttachMode},
    kernel::registry::AdmitError,
    kernel::ring_reader,
    peer::auth_key::read_key_file,
    serving::access::{self, AccessPolicy},
    serving::metrics,
    serving::server,
};

/// Everything `monitor run` is told.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub iface: String,
    pub port: u16,
    pub socket: PathBuf,
    pub peers_file: Option<PathBuf>,
    pub mode: AttachMode,
    /// The XDP hook, or TC ingress (beside another XDP program).
    pub hook: program::Hook,
    pub capacity: u32,
    /// Who is admitted on a first heartbeat.
    pub admission: AdmissionPolicy,
    pub pass_heartbeats: bool,
    /// BFD sessions and UDP flows watched besides heartbeats (`--bfd`, `--udp-port`).
    pub passive: crate::agent::PassiveSources,
    /// Which destination addresses heartbeats are accepted at (`--listen-addr`).
    pub listen: crate::kernel::destination::Listen,
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
    /// Caps on the socket's connections, its idle and write timeouts.
    pub socket_limits: crate::serving::limits::Limits,
    /// Pin the program and maps here, and adopt what is pinned here at start.
    pub pin_path: Option<PathBuf>,
    /// A sweep that comes this much later than the previous one means the agent itself was
    /// not scheduled; new suspicions are held for as long as the stall lasted.
    pub stall_bound: Duration,
    /// New suspicions are held while the interface's link is down and for this long after.
    pub link_grace: Duration,
    /// Serve Prometheus metrics on this address (`GET /metrics`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Peers that get series of their own in the metrics.
    pub metrics_peers: metrics::PeerSeries,
    /// Re-reads the configuration (`--config` file and the same command line) on SIGHUP.
    pub reload: Option<Reload>,
    /// Publish events, verdicts and liveness to a fleet on NATS JetStream (docs/fleet.md).
    pub fleet: Option<crate::fleet::FleetConfig>,
    /// What the XDP program logs on its cold paths (fixed when it is loaded).
    pub kernel_log: program::KernelLog,
}

/// Makes the configuration afresh from its sources, as at start.
#[derive(Clone)]
pub struct Reload {
    /// What is re-read, for the logs.
    pub source: PathBuf,
    pub read: Arc<dyn Fn() -> Result<AgentConfig> + Send + Sync>,
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reload({})", self.source.display())
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
    series: &std::sync::RwLock<metrics::PeerSeries>,
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

/// The sweep's own thread: it wakes once a sweep and nothing else wakes it, where a sweep
/// driven by the async runtime's timer cost a handful of thread switches each (the timer's
/// worker, then the task's thread), and it keeps its pace whatever the socket's clients ask of
/// the runtime.
struct Sweeper {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Sweeper {
    /// Starts sweeping every `interval`; `ended` fires if the thread ever ends by itself.
    fn start(
        agent: Arc<Agent>,
        interval: Duration,
        stall_bound: Duration,
        link_grace: Duration,
        notifier: Notifier,
        ended: tokio::sync::oneshot::Sender<()>,
    ) -> Result<Self> {
        let (stop, stopped) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sweep".into())
            .spawn(move || {
                // Dropped when the thread ends, also by a panic: the agent then stops.
                let _ended = ended;
                sweep_loop(
                    &agent,
                    interval,
                    stall_bound,
                    link_grace,
                    notifier,
                    &stopped,
                );
            })
            .context("starting the sweep thread")?;
        Ok(Self { stop, thread })
    }

    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// Sweeps every `interval` until `stop` is dropped; detects its own stalls (Cassandra pauses
/// convictions the same way) and its interface's link going down (`observer_faults`), and
/// holds new suspicions through either. A tick that comes late is taken at once and the next
/// one an interval after it.
fn sweep_loop(
    agent: &Agent,
    interval: Duration,
    stall_bound: Duration,
    link_grace: Duration,
    mut notifier: Notifier,
    stop: &std::sync::mpsc::Receiver<()>,
) {
    let mut next = std::time::Instant::now() + interval;
    let mut last = monotonic_ns();
    let mut hold_until = 0u64;
    let state = LinkState::read(agent.iface());
    let mut link = LinkWatch::new(agent.iface(), link_grace, &state, last);
    if let LinkState::Down(operstate) = &state {
        log::warn!(
            "{}: link down ({operstate}); holding new suspicions until it is up",
            agent.iface()
        );
    }
    agent.note_link(&link);
    loop {
        match stop.recv_timeout(next.saturating_duration_since(std::time::Instant::now())) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let woke = std::time::Instant::now();
        next = if woke > next + interval {
            woke + interval
        } else {
            next + interval
        };
        // The time since the last sweep ended: a sweep that itself takes long (the first one
        // over a million new peers) is not a stall, since the kernel kept stamping arrivals
        // meanwhile; a thread or a machine that was not running is.
        let now = monotonic_ns();
        let gap = now.saturating_sub(last);
        if gap > stall_bound.as_nanos() as u64 {
            agent.stalls.fetch_add(1, Ordering::Relaxed);
            hold_until = now + gap;
            log::warn!(
                "the agent was not scheduled for {:.0} ms; holding new suspicions for as long",
                gap as f64 / 1e6
            );
        }
        // One read of a sysfs file a sweep: a link change is seen within a sweep.
        let state = LinkState::read(agent.iface());
        if let Some(event) = link.observe(&state, now, super::wall_ms() as u64) {
            match &state {
                LinkState::Down(operstate) => log::warn!(
                    "{}: link down ({operstate}); holding new suspicions until it is up",
                    agent.iface()
                ),
                LinkState::Up => log::warn!(
                    "{}: link up again; new suspicions held for {link_grace:?} more",
                    agent.iface()
                ),
            }
            agent.note_link(&link);
            agent.publish(event);
        }
        agent.sweep(now, now < hold_until || link.holding(now));
        last = monotonic_ns();
        // The watchdog hears from the sweep itself: a stalled sweep stops the pings.
        notifier.tick(agent);
    }
}

fn xdp_config(config: &AgentConfig, require_auth: bool) -> XdpConfig {
    // The window rules come from the detector, the one place replay takes them from too.
    let rules = config.detector.window_config();
    XdpConfig {
        port: config.port,
        flags: rules.flags
            | if config.pass_heartbeats {
                XDP_FLAG_PASS_HEARTBEATS
            } else {
                0
            }
            | if require_auth {
                XDP_FLAG_REQUIRE_AUTH
            } else {
                0
            }
            | config.listen.xdp_flags()
            | config.passive.xdp_flags(),
        unknown_reports_per_sec: config.unknown_reports_per_sec,
        flow_ports: config.passive.flow_ports,
        ..rules
    }
}

/// Loads, attaches and serves until `shutdown` completes; detaches and removes the socket on
/// the way out.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    let peers = match &config.peers_file {
        Some(path) => peers_file::read_peers_file(path)?,
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
    server::make_room_for(config.socket_limits.max_clients);
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            metrics::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener on {addr}"))?,
        ),
        None => None,
    };
    let policy = AccessPolicy::current(group);
    // Read the key before anything is loaded: a bad key file stops the start cleanly.
    let key = config
        .auth_key_file
        .as_deref()
        .map(read_key_file)
        .transpose()?;
    // The peer index's hash key, new for every load; adopted state keeps the one it was
    // pinned with (`adopt`).
    let xdp = XdpConfig {
        index_key: crate::kernel::index_key::random()
            .context("drawing the peer index's hash key (getrandom)")?,
        ..xdp_config(&config, key.is_some())
    };
    let expected = PinnedMeta {
        magic: META_MAGIC,
        layout_version: LAYOUT_VERSION,
        slot_size: size_of::<PeerSlot>() as u32,
        capacity: config.capacity,
        window: xdp.window,
        port: xdp.port,
        flags: xdp.flags,
        max_interval_us: xdp.max_interval_us,
        outage_factor: xdp.outage_factor,
        flow_ports: xdp.flow_ports,
        index_key: xdp.index_key,
        ..PinnedMeta::default()
    };
    let mut kernel = match &config.pin_path {
        Some(dir) if pinning::has_state(dir) => adopt(dir, &expected, &xdp, &config)?,
        _ => load_and_attach(&config, &xdp, expected)?,
    };
    // Fills LOCAL_ADDRS and follows the interface's addresses until the agent stops (owned by
    // the SIGHUP task, which changes it).
    let destinations = crate::kernel::destination::start(
        &config.iface,
        &config.listen,
        kernel.ebpf.as_mut(),
        kernel.pinned.as_deref(),
    )?;
    let kernel_logger = match (config.kernel_log, &mut kernel.ebpf) {
        (program::KernelLog::Off, _) => None,
        (_, Some(ebpf)) => Some(kernel_log::of_loaded(ebpf)?),
        (_, None) => {
            log::warn!(
                "--kernel-log: the adopted program logs at the level it was loaded with; a new level takes effect after `monitor detach`"
            );
            // Off when it was loaded off: then the program has no log lines to read.
            kernel_log::of_adopted(kernel.program_fd.as_fd())
                .map_err(|e| log::warn!("--kernel-log: {e}"))
                .ok()
        }
    };
    let Kernel {
        maps:
            KernelMaps {
                table,
                mut registry,
                counters,
                unknown_reports,
                arrivals,
                auth_keys,
            },
        program_fd,
        mode,
        origin,
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
        program: Box::new(LiveProgram {
            counters,
            program_fd,
        }),
        detector,
        iface: config.iface.clone(),
        mode,
        origin,
        port: config.port,
        admission: config.admission.clone(),
        expire_after: config.expire_after,
    }));

    // The interface's networks, followed as its addresses change: who a first heartbeat is
    // admitted from unless `--admit-from` says otherwise. Read before the first report.
    let _networks = {
        let agent = agent.clone();
        let started = std::sync::atomic::AtomicBool::new(false);
        crate::kernel::destination::follow_networks(&config.iface, move |nets| {
            agent.set_connected_networks(nets.iter().copied().collect());
            if started.swap(true, Ordering::Relaxed) {
                log::info!(
                    "addresses of {} changed: {}",
                    agent.iface,
                    agent.admission_policy_line()
                );
            }
        })?
    };
    log::info!("{}", agent.admission_policy_line());

    // Admission takes the registry's write lock, which waits for a sweep: off the runtime.
    let reports = {
        let agent = agent.clone();
        ring_reader::consume_on_thread(unknown_reports, move |report| {
            agent.on_unknown_peer(&report)
        })
    };

    let arrivals = {
        let agent = agent.clone();
        ring_reader::consume(arrivals, move |arrival| agent.on_arrival(arrival))
    };

    // Subscribed here, before the first sweep; publishes from a task of its own.
    let fleet = crate::fleet::start(agent.clone(), config.fleet.clone());

    let series = Arc::new(std::sync::RwLock::new(config.metrics_peers.clone()));
    let forward_kernel_log = async {
        match kernel_logger {
            Some(logger) => kernel_log::forward(logger).await,
            None => std::future::pending().await,
        }
    };
    let serve_metrics = async {
        match metrics_listener {
            Some(listener) => {
                log::info!(
                    "serving metrics on http://{}/metrics",
                    listener.local_addr().map_or("?".into(), |a| a.to_string())
                );
                let registry = Arc::new(metrics::registry(&agent, series.clone()));
                metrics::serve(
                    listener,
                    registry,
                    metrics::Limits::default(),
                    metrics::Source::metrics(&*agent).http.clone(),
                )
                .await
            }
            None => std::future::pending().await,
        }
    };

    let reload = {
        let agent = agent.clone();
        let series = series.clone();
        let mut current = config.clone();
        async move {
            let mut hup = hup;
            let mut destinations = destinations;
            loop {
                hup.recv().await;
                if let Some(reload) = &current.reload {
                    match (reload.read)() {
                        Ok(new) => {
                            // A detector change re-estimates every peer under the trackers'
                            // lock (milliseconds at 50,000): off the runtime's workers.
                            let (on, series) = (agent.clone(), series.clone());
                            let old = current.clone();
                            let applied = tokio::task::spawn_blocking(move || {
                                let applied =
                                    apply_reload(&on, &old, new, &series, &mut destinations);
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
    };

    // Serving from here on: the socket is bound and the program attached.
    let mut notifier = Notifier::from_env(config.sweep_interval);
    notifier.ready(&agent);
    let (sweep_ended, sweep_end) = tokio::sync::oneshot::channel();
    let sweeper = Sweeper::start(
        agent.clone(),
        config.sweep_interval,
        config.stall_bound,
        config.link_grace,
        notifier,
        sweep_ended,
    )?;
    let outcome: Result<()> = async {
        tokio::select! {
        () = reload => {}
        r = server::serve(listener, agent.clone(), policy, config.socket_limits) => r.context("serving the socket")?,
        r = reports => r.context("reading unknown-peer reports")?,
        r = arrivals => r.context("reading traced arrivals")?,
        r = serve_metrics => r.context("serving metrics")?,
        r = fleet => r.context("publishing to the fleet")?,
        r = forward_kernel_log => r.context("reading the XDP program's log")?,
        _ = sweep_end => anyhow::bail!("the sweep thread ended"),
        () = shutdown => log::info!("shutting down: detaching from {}", config.iface),
        }
        Ok(())
    }
    .await;
    sweeper.stop();
    outcome?;
    notify::stopping();
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
    maps: KernelMaps,
    program_fd: OwnedFd,
    /// "native", "skb", "tc", or "adopted".
    mode: String,
    /// How the running program came to run: loaded here, adopted, or swapped in by an upgrade.
    origin: ProgramOrigin,
    /// Owns the program when it was loaded here; dropping it detaches an unpinned program.
    ebpf: Option<aya::Ebpf>,
    /// Where the state is pinned, if it is.
    pinned: Option<PathBuf>,
}

/// Adopts the state pinned at `dir`. When the pinned link runs another build's program (the
/// kernel's tags differ), this build's program is loaded on the pinned maps and swapped into
/// the link (`pinning::replace_program`): heartbeats keep being recorded throughout, and every
/// map, windows and counters, is kept. Pinned state of other settings or another map layout is
/// refused before anything changes.
fn adopt(
    dir: &std::path::Path,
    expected: &PinnedMeta,
    xdp: &XdpConfig,
    config: &AgentConfig,
) -> Result<Kernel> {
    let a = pinning::adopt(dir, expected)?;
    // The pinned program hashes ids with the key it was loaded with, and the pinned index is
    // laid out by it: the registry (`pinning::adopt`) and any program of ours use it too.
    let xdp = &XdpConfig {
        index_key: a.meta.index_key,
        ..*xdp
    };
    // This build's program on the pinned maps, attached nowhere yet: its tag is what the link
    // would run if this build had loaded it.
    let mut ebpf = program::load_on_pins(xdp, config.capacity, config.kernel_log, dir)
        .with_context(|| {
            format!(
                "loading this build's program on the maps pinned at {} (to compare it with the pinned one)",
                dir.display()
            )
        })?;
    let ours = program::tag(program::program_fd(&mut ebpf, program::Hook::Xdp)?.as_fd())
        .context("reading the tag of this build's program")?;
    // The pin holds the attachment; the handle is not needed.
    drop(a.link);
    if ours == a.tag {
        // The pinned program is this build's: it keeps running; ours is unloaded unused.
        drop(ebpf);
        log::info!(
            "adopted the program pinned at {} (tag {}, this build's): {} peers, their windows kept",
            dir.display(),
            a.tag,
            a.maps.registry.len()
        );
        return Ok(Kernel {
            maps: a.maps,
            program_fd: a.program_fd,
            mode: "adopted".into(),
            origin: ProgramOrigin {
                start: "adopted".into(),
                tag: a.tag.to_string(),
                previous_tag: None,
            },
            ebpf: None,
            pinned: Some(dir.into()),
        });
    }
    let program_fd = pinning::replace_program(dir, &mut ebpf).with_context(|| {
        format!(
            "upgrading the program pinned at {} (tag {}) to this build's (tag {ours})",
            dir.display(),
            a.tag
        )
    })?;
    log::info!(
        "upgraded the program pinned at {}: tag {} -> {ours}, swapped in through the pinned link \
         without detaching; {} peers, every map and window kept",
        dir.display(),
        a.tag,
        a.maps.registry.len()
    );
    Ok(Kernel {
        maps: a.maps,
        program_fd,
        mode: "adopted".into(),
        origin: ProgramOrigin {
            start: "upgraded".into(),
            tag: ours.to_string(),
            previous_tag: Some(a.tag.to_string()),
        },
        // Owns this build's program (its log, LOCAL_ADDRS); the pins keep it attached when it
        // is dropped.
        ebpf: Some(ebpf),
        pinned: Some(dir.into()),
    })
}

fn load_and_attach(config: &AgentConfig, xdp: &XdpConfig, meta: PinnedMeta) -> Result<Kernel> {
    if config.hook == program::Hook::Tc && config.pin_path.is_some() {
        anyhow::bail!(
            "--persist and --pin-path need --hook xdp: with --hook tc the attachment ends with the agent"
        );
    }
    if let Some(dir) = &config.pin_path {
        pinning::prepare(dir)?;
    }
    let loaded = LoadedProgram::load_hook(
        xdp,
        config.capacity,
        config.pin_path.as_deref(),
        config.kernel_log,
        config.hook,
    );
    let result = (|| {
        let LoadedProgram {
            mut ebpf,
            maps,
            meta: mut meta_map,
        } = loaded?;
        let mode = match config.hook {
            program::Hook::Xdp => {
                let (link, mode) = program::attach(&mut ebpf, &config.iface, config.mode)?;
                if let Some(dir) = &config.pin_path {
                    pinning::pin_program(dir, &mut ebpf, link, meta, &mut meta_map)?;
                }
                mode.to_string()
            }
            program::Hook::Tc => {
                // The link is owned by `ebpf`: dropping it detaches.
                program::attach_tc(&mut ebpf, &config.iface)?;
                "tc".to_string()
            }
        };
        // The attached program's: its run statistics are the agent's `xdp` stats.
        let program_fd = program::program_fd(&mut ebpf, config.hook)?;
        let tag = program::tag(program_fd.as_fd()).context("reading the program's tag")?;
        Ok(Kernel {
            maps,
            program_fd,
            origin: ProgramOrigin {
                start: "loaded".into(),
                tag: tag.to_string(),
                previous_tag: None,
            },
            mode,
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
