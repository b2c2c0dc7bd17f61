//! The running agent: owns the loaded program, the peer table and the registry, and answers
//! socket requests from them.

use std::{
    future::Future,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Instant,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, PerCpuArray};
use monitor_common::{
    config::{XDP_FLAG_PASS_HEARTBEATS, XdpConfig},
    maps::Counters,
};
use serde_json::Value;

use crate::{
    admission::{self, consume_reports},
    clock::monotonic_ns,
    counters::CounterTotals,
    loaded::LoadedProgram,
    peer_table::PeerTable,
    peer_view::PeerView,
    program::{self, AttachMode},
    protocol::{AgentStats, Request, error_reply, ok_reply},
    registry::{AdmitError, Registry},
    server::{self, Handler},
};

/// Everything `monitor run` is told.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub iface: String,
    pub port: u16,
    pub socket: PathBuf,
    pub peers_file: Option<PathBuf>,
    pub mode: AttachMode,
    pub capacity: u32,
    pub window: u32,
    pub auto_admit: bool,
    pub pass_heartbeats: bool,
    pub unknown_reports_per_sec: u32,
}

/// State shared by the socket clients and the admission task.
pub struct Agent {
    table: PeerTable,
    registry: RwLock<Registry>,
    counters: PerCpuArray<MapData, Counters>,
    iface: String,
    mode: AttachMode,
    port: u16,
    window: u32,
    started: Instant,
}

impl Agent {
    pub fn peer(&self, id: u64) -> Option<PeerView> {
        let slot = self.registry.read().expect("registry lock").slot_of(id)?;
        let record = self.table.record(slot)?;
        Some(PeerView::new(&record, monotonic_ns()))
    }

    /// Every admitted peer, sorted by id.
    pub fn peers(&self) -> Vec<PeerView> {
        let now = monotonic_ns();
        let registry = self.registry.read().expect("registry lock");
        let mut peers: Vec<PeerView> = registry
            .iter()
            .filter_map(|(_, slot)| self.table.record(slot))
            .map(|record| PeerView::new(&record, now))
            .collect();
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
            xdp_mode: self.mode.to_string(),
            port: self.port,
            window: self.window,
            peers: registry.len(),
            capacity: registry.capacity(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            kernel,
        })
    }

    pub fn admit(&self, id: u64) -> Result<u32, AdmitError> {
        self.registry
            .write()
            .expect("registry lock")
            .admit(&self.table, id, monotonic_ns())
    }

    fn on_unknown_peer(&self, id: u64) {
        match self.admit(id) {
            Ok(slot) => log::info!("admitted peer {id} (slot {slot}) on its first heartbeat"),
            // Reports race with admission: the kernel may report a peer twice before it sees
            // the new index entry.
            Err(AdmitError::Exists(_)) => {}
            Err(e) => log::warn!("not admitting peer {id}: {e}"),
        }
    }
}

impl Handler for Agent {
    fn handle(&self, request: Request) -> Value {
        match request {
            Request::Peer { id } => match self.peer(id) {
                Some(peer) => ok_reply("peer", peer),
                None => error_reply(format!("unknown peer {id}")),
            },
            Request::Peers => ok_reply("peers", self.peers()),
            Request::Stats => match self.stats() {
                Ok(stats) => ok_reply("stats", stats),
                Err(e) => error_reply(e),
            },
        }
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
    let xdp_config = XdpConfig {
        port: config.port,
        window: config.window,
        flags: if config.pass_heartbeats {
            XDP_FLAG_PASS_HEARTBEATS
        } else {
            0
        },
        unknown_reports_per_sec: config.unknown_reports_per_sec,
        ..XdpConfig::DEFAULT
    };
    // Bind first: a socket already in use is the cheapest error to report.
    let (listener, _socket_guard) = server::bind(&config.socket)?;
    let LoadedProgram {
        mut ebpf,
        table,
        mut registry,
        counters,
        unknown_reports,
    } = LoadedProgram::load(&xdp_config, config.capacity)?;
    let now = monotonic_ns();
    for &id in &peers {
        registry.admit(&table, id, now)?;
    }

    let (_link, mode) = program::attach(&mut ebpf, &config.iface, config.mode)?;
    log::info!(
        "watching UDP port {} on {} ({} mode), {} peers admitted from file, capacity {}, socket {}",
        config.port,
        config.iface,
        mode,
        peers.len(),
        config.capacity,
        config.socket.display()
    );

    let agent = Arc::new(Agent {
        table,
        registry: RwLock::new(registry),
        counters,
        iface: config.iface.clone(),
        mode,
        port: config.port,
        window: config.window,
        started: Instant::now(),
    });

    let reports = {
        let agent = agent.clone();
        let auto_admit = config.auto_admit;
        consume_reports(unknown_reports, move |report| {
            if auto_admit {
                agent.on_unknown_peer(report.peer_id);
            } else {
                log::debug!("heartbeat from unlisted peer {}", report.peer_id);
            }
        })
    };

    tokio::select! {
        r = server::serve(listener, agent.clone()) => r.context("serving the socket")?,
        r = reports => r.context("reading unknown-peer reports")?,
        () = shutdown => log::info!("shutting down: detaching from {}", config.iface),
    }
    // Dropping `ebpf` detaches the program; `_socket_guard` removes the socket file.
    drop(ebpf);
    Ok(())
}
