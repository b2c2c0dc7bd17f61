//! The XDP program loaded into the kernel together with userspace handles on its maps: what
//! the agent runs on, and what the packet-fixture tests drive through BPF_PROG_TEST_RUN.

use crate::kernel::maps::KernelMaps;
use std::os::fd::AsFd;

use aya::{
    Ebpf,
    maps::{Array, Map, MapData, MapError, PerCpuArray, RingBuf},
};
use monitor_common::{
    config::XdpConfig,
    last_heard::LAST_HEARD_MAP,
    maps::{
        ARRIVALS_MAP, AUTH_KEYS_MAP, COUNTERS_MAP, META_MAP, PEER_HOT_MAP, PEER_STATE_MAP,
        PinnedMeta, UNKNOWN_PEERS_MAP,
    },
};

use crate::{
    kernel::peer_index::PeerIndex,
    kernel::peer_table::{PeerTable, PeerTableError},
    kernel::program::{self, ProgramLoadError},
    kernel::registry::Registry,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadedError {
    #[error(transparent)]
    Program(#[from] ProgramLoadError),
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error(transparent)]
    Table(#[from] PeerTableError),
    #[error(transparent)]
    Pin(#[from] crate::kernel::pinning::PinError),
}

pub struct LoadedProgram {
    /// Owns the program and whatever it is attached to; dropping it detaches.
    pub ebpf: Ebpf,
    pub maps: KernelMaps,
    pub meta: Array<MapData, PinnedMeta>,
}

impl LoadedProgram {
    /// Loads and verifies the program with `capacity` slots and maps its peer table.
    pub fn load(config: &XdpConfig, capacity: u32) -> Result<Self, LoadedError> {
        Self::load_pinned(config, capacity, None, program::KernelLog::Off)
    }

    /// As `load`, and pins every map under `pin_dir` if given (see `pinning`); the program
    /// logs its cold paths at `log`.
    pub fn load_pinned(
        config: &XdpConfig,
        capacity: u32,
        pin_dir: Option<&std::path::Path>,
        log: program::KernelLog,
    ) -> Result<Self, LoadedError> {
        Self::load_hook(config, capacity, pin_dir, log, program::Hook::Xdp)
    }

    /// As `load_pinned`, loading the program of `hook` (the XDP one or the TC classifier;
    /// both use the same maps).
    pub fn load_hook(
        config: &XdpConfig,
        capacity: u32,
        pin_dir: Option<&std::path::Path>,
        log: program::KernelLog,
        hook: program::Hook,
    ) -> Result<Self, LoadedError> {
        let mut ebpf = program::load_hook(config, capacity, log, hook)?;
        if let Some(dir) = pin_dir {
            crate::kernel::pinning::pin_maps(dir, &ebpf)?;
        }
        let table = match (
            ebpf.map(PEER_HOT_MAP),
            ebpf.map(PEER_STATE_MAP),
            ebpf.map(LAST_HEARD_MAP),
        ) {
            (Some(Map::Array(hot)), Some(Map::Array(state)), Some(Map::Array(words))) => {
                PeerTable::map(
                    hot.fd().as_fd(),
                    state.fd().as_fd(),
                    words.fd().as_fd(),
                    capacity,
                    monitor_common::index::lines_for(capacity),
                )?
            }
            (Some(Map::Array(_)), Some(Map::Array(_)), _) => {
                return Err(LoadedError::MissingMap(LAST_HEARD_MAP));
            }
            (Some(Map::Array(_)), _, _) => return Err(LoadedError::MissingMap(PEER_STATE_MAP)),
            _ => return Err(LoadedError::MissingMap(PEER_HOT_MAP)),
        };
        let index = PeerIndex::new(capacity, config.index_key);
        let counters = take(&mut ebpf, COUNTERS_MAP, PerCpuArray::try_from)?;
        let unknown_reports = take(&mut ebpf, UNKNOWN_PEERS_MAP, RingBuf::try_from)?;
        let arrivals = take(&mut ebpf, ARRIVALS_MAP, RingBuf::try_from)?;
        let auth_keys = take(&mut ebpf, AUTH_KEYS_MAP, Array::try_from)?;
        let meta = take(&mut ebpf, META_MAP, Array::try_from)?;
        Ok(Self {
            ebpf,
            maps: KernelMaps {
                table,
                registry: {
                    let mut registry = Registry::new(index, capacity);
                    registry.reserve_derived_ids(config.has_passive_sources());
                    registry
                },
                counters,
                unknown_reports,
                arrivals,
                auth_keys,
            },
            meta,
        })
    }
}

fn take<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(Map) -> Result<T, MapError>,
) -> Result<T, LoadedError> {
    let map = ebpf.take_map(name).ok_or(LoadedError::MissingMap(name))?;
    convert(map).map_err(|source| LoadedError::Map { name, source })
}
