//! Starting and running the agent: the program loaded (or adopted from pins) and attached,
//! the socket bound, the sweeper, the unknown-peer reports and key reloads running until
//! shutdown.

use std::{
    future::Future,
    os::fd::AsFd,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::{Context, Result};
use monitor_common::{
    auth::AuthKey,
    config::{XDP_FLAG_PASS_HEARTBEATS, XDP_FLAG_REQUIRE_AUTH, XdpConfig},
};
use tokio::net::{TcpListener, UnixListener};

use super::{
    Agent, AgentParts, LiveProgram,
    notify::{self, Notifier},
    reload,
    sweeper::Sweeper,
};
use crate::{
    agent::{admission::AdmissionPolicy, peers_file},
    detector::{
        levels::Levels,
        model::{DetectorParams, Model},
        tracker::DetectorConfig,
    },
    kernel::clock::monotonic_ns,
    kernel::destination::{Destinations, NetworkFollower},
    kernel::kernel_log,
    kernel::keyring::KeyRing,
    kernel::lifecycle::{self, Kernel, Load, Origin},
    kernel::maps::KernelMaps,
    kernel::peer_table::PeerTable,
    kernel::program::{self, AttachMode},
    kernel::registry::{AdmitError, Registry},
    kernel::ring_reader,
    keys::read_key_file,
    serving::access::{self, AccessPolicy},
    serving::metrics,
    serving::protocol::ProgramOrigin,
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
    let peers = listed_peers(&config)?;
    // Before the socket exists (see cli::run): SIGHUP must never meet its default action.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    // Bind first: a socket already in use is the cheapest error to report.
    let (socket, _socket_guard, metrics_listener, policy) = bind(&config).await?;
    let Started {
        kernel,
        destinations,
        kernel_logger,
        key,
    } = start_program(&config)?;
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
    admit_listed(&table, &mut registry, &peers)?;
    let detector = DetectorConfig::new(config.detector.clone(), config.levels.clone());
    log_start(&config, &detector, &mode, peers.len());
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
        origin: program_origin(origin),
        port: config.port,
        admission: config.admission.clone(),
        expire_after: config.expire_after,
    }));
    let _networks = follow_networks(&agent)?;
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
    let serve_metrics = serve_metrics(metrics_listener, &agent, &series);
    let reload = reload::on_sighup(
        agent.clone(),
        config.clone(),
        series.clone(),
        destinations,
        keyring,
        hup,
    );

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
        r = server::serve(socket, agent.clone(), policy, config.socket_limits) => r.context("serving the socket")?,
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

/// The peers file's ids (none without one), no more than there are slots.
fn listed_peers(config: &AgentConfig) -> Result<Vec<u64>> {
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
    Ok(peers)
}

/// The socket (with the guard that removes its file), the metrics listener, and who may use
/// the socket.
async fn bind(
    config: &AgentConfig,
) -> Result<(
    UnixListener,
    server::SocketGuard,
    Option<TcpListener>,
    AccessPolicy,
)> {
    let group = config
        .socket_group
        .as_deref()
        .map(access::group_id)
        .transpose()?;
    let (listener, socket_guard) = server::bind(&config.socket, group)?;
    server::make_room_for(config.socket_limits.max_clients);
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            metrics::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener on {addr}"))?,
        ),
        None => None,
    };
    Ok((
        listener,
        socket_guard,
        metrics_listener,
        AccessPolicy::current(group),
    ))
}

/// The program running, with what follows it: the destination addresses it accepts
/// heartbeats at, its log, and the auth key it checks (installed once the agent has it).
struct Started {
    kernel: Kernel,
    /// Fills LOCAL_ADDRS and follows the interface's addresses until the agent stops (owned
    /// by the SIGHUP task, which changes it).
    destinations: Destinations,
    kernel_logger: Option<kernel_log::KernelLogger>,
    key: Option<AuthKey>,
}

/// Loads and attaches the program, or adopts it from `--pin-path`.
fn start_program(config: &AgentConfig) -> Result<Started> {
    // Read the key before anything is loaded: a bad key file stops the start cleanly.
    let key = config
        .auth_key_file
        .as_deref()
        .map(read_key_file)
        .transpose()?;
    // The peer index's hash key, new for every load; adopted state keeps the one it was
    // pinned with (`lifecycle::start`).
    let xdp = XdpConfig {
        index_key: crate::kernel::index_key::random()
            .context("drawing the peer index's hash key (getrandom)")?,
        ..xdp_config(config, key.is_some())
    };
    let load = Load {
        iface: &config.iface,
        mode: config.mode,
        hook: config.hook,
        capacity: config.capacity,
        kernel_log: config.kernel_log,
        pin_path: config.pin_path.as_deref(),
    };
    let mut kernel = lifecycle::start(&load, &xdp)?;
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
    Ok(Started {
        kernel,
        destinations,
        kernel_logger,
        key,
    })
}

/// Gives the peers file's ids their slots; adopted state may watch them already.
fn admit_listed(table: &PeerTable, registry: &mut Registry, peers: &[u64]) -> Result<()> {
    let now = monotonic_ns();
    for &id in peers {
        match registry.admit(table, id, now) {
            // Adopted state already watches it, window and all.
            Ok(_) | Err(AdmitError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn log_start(config: &AgentConfig, detector: &DetectorConfig, mode: &str, listed: usize) {
    log::info!(
        "watching UDP port {} on {} ({} mode): {} peers from file, capacity {}, {} model, levels {}, socket {}",
        config.port,
        config.iface,
        mode,
        listed,
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
}

/// How the program came to run, as `stats` says it.
fn program_origin(origin: Origin) -> ProgramOrigin {
    let (start, tag, previous_tag) = match origin {
        Origin::Loaded { tag } => ("loaded", tag, None),
        Origin::Adopted { tag } => ("adopted", tag, None),
        Origin::Upgraded { tag, previous } => ("upgraded", tag, Some(previous.to_string())),
    };
    ProgramOrigin {
        start: start.into(),
        tag: tag.to_string(),
        previous_tag,
    }
}

/// The interface's networks, followed as its addresses change: who a first heartbeat is
/// admitted from unless `--admit-from` says otherwise. Read before the first report.
fn follow_networks(agent: &Arc<Agent>) -> Result<NetworkFollower> {
    let agent = agent.clone();
    let started = std::sync::atomic::AtomicBool::new(false);
    let iface = agent.iface.clone();
    Ok(crate::kernel::destination::follow_networks(
        &iface,
        move |nets| {
            agent.set_connected_networks(nets.iter().copied().collect());
            if started.swap(true, Ordering::Relaxed) {
                log::info!(
                    "addresses of {} changed: {}",
                    agent.iface,
                    agent.admission_policy_line()
                );
            }
        },
    )?)
}

/// Serves `GET /metrics` on `listener`, if there is one; otherwise never completes.
async fn serve_metrics(
    listener: Option<TcpListener>,
    agent: &Arc<Agent>,
    series: &Arc<std::sync::RwLock<metrics::PeerSeries>>,
) -> std::io::Result<()> {
    match listener {
        Some(listener) => {
            log::info!(
                "serving metrics on http://{}/metrics",
                listener.local_addr().map_or("?".into(), |a| a.to_string())
            );
            let registry = Arc::new(metrics::registry(agent, series.clone()));
            metrics::serve(
                listener,
                registry,
                metrics::Limits::default(),
                metrics::Source::metrics(&**agent).http.clone(),
            )
            .await
        }
        None => std::future::pending().await,
    }
}
