//! The agent's handles on the program's maps, the same whether the program was loaded by this
//! agent or adopted from pinned state.

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use monitor_common::{auth::AuthKey, maps::Counters};

use crate::kernel::{peer_table::PeerTable, registry::Registry};

pub struct KernelMaps {
    /// The peer slots and their last-heard words (mmapped).
    pub table: PeerTable,
    /// Slot allocation and the id index.
    pub registry: Registry,
    pub counters: PerCpuArray<MapData, Counters>,
    pub unknown_reports: RingBuf<MapData>,
    /// Arrivals of traced peers (`monitor record`).
    pub arrivals: RingBuf<MapData>,
    pub auth_keys: Array<MapData, AuthKey>,
}
