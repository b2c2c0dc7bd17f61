//! The XDP program's per-CPU verdict counters, summed over CPUs.

use aya::maps::{MapData, MapError, PerCpuArray};
use monitor_common::maps::Counters;
use serde::{Deserialize, Serialize};

/// Totals over all CPUs of what the XDP program decided.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CounterTotals {
    pub heartbeats: u64,
    pub not_heartbeat: u64,
    pub malformed: u64,
    pub unknown_peer: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub auth_failures: u64,
    pub contended: u64,
    pub unknown_reported: u64,
    pub unknown_suppressed: u64,
    /// Arrivals of traced peers lost because the ring was full (`monitor record`).
    #[serde(default)]
    pub arrivals_dropped: u64,
    /// Packets to the heartbeat port addressed to another host (passed, not recorded).
    #[serde(default)]
    pub not_local: u64,
    /// BFD control packets recorded in a session's slot (`--bfd`; passed on).
    #[serde(default)]
    pub bfd: u64,
    /// Datagrams to a `--udp-port` port recorded in a flow's slot (passed on).
    #[serde(default)]
    pub flow: u64,
}

impl CounterTotals {
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a Counters>) -> Self {
        per_cpu.into_iter().fold(Self::default(), |t, c| Self {
            heartbeats: t.heartbeats + c.heartbeats,
            not_heartbeat: t.not_heartbeat + c.not_heartbeat,
            malformed: t.malformed + c.malformed,
            unknown_peer: t.unknown_peer + c.unknown_peer,
            duplicates: t.duplicates + c.duplicates,
            out_of_order: t.out_of_order + c.out_of_order,
            auth_failures: t.auth_failures + c.auth_failures,
            contended: t.contended + c.contended,
            unknown_reported: t.unknown_reported + c.unknown_reported,
            unknown_suppressed: t.unknown_suppressed + c.unknown_suppressed,
            arrivals_dropped: t.arrivals_dropped + c.arrivals_dropped,
            not_local: t.not_local + c.not_local,
            bfd: t.bfd + c.bfd,
            flow: t.flow + c.flow,
        })
    }

    /// Reads and sums the COUNTERS map (one syscall).
    pub fn read(map: &PerCpuArray<MapData, Counters>) -> Result<Self, MapError> {
        let values = map.get(&0, 0)?;
        Ok(Self::sum(values.iter()))
    }
}
