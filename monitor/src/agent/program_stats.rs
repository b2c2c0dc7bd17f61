//! What the agent reads of the running program besides its peer table: the verdict counters
//! and the kernel's run statistics, for `stats`. Behind a trait so the agent's logic can be
//! unit-tested with no program loaded.

use std::os::fd::{AsFd, OwnedFd};

use aya::maps::{MapData, PerCpuArray};
use monitor_common::maps::Counters;

use crate::{
    kernel::{counters::CounterTotals, program},
    serving::protocol::XdpRunStats,
};

pub trait ProgramStats: Send + Sync {
    /// The program's counters, summed over CPUs.
    fn counters(&self) -> Result<CounterTotals, String>;
    /// The kernel's run statistics of the program (zero unless `kernel.bpf_stats_enabled`).
    fn run_stats(&self) -> XdpRunStats;
    /// How many times the program has stored a last-heard word (heartbeats, BFD packets and
    /// flow datagrams recorded, each counted after its word is stored), if it can say: the
    /// count `scan_skip` compares between scans. None leaves every scan to run.
    fn words_stored(&self) -> Option<u64> {
        None
    }
}

/// The loaded or adopted program: its COUNTERS map and its fd.
pub struct LiveProgram {
    pub counters: PerCpuArray<MapData, Counters>,
    /// The attached program, for its run statistics.
    pub program_fd: OwnedFd,
}

impl ProgramStats for LiveProgram {
    fn counters(&self) -> Result<CounterTotals, String> {
        CounterTotals::read(&self.counters).map_err(|e| format!("reading counters: {e}"))
    }

    fn words_stored(&self) -> Option<u64> {
        // The program counts after it stores (monitor-ebpf `record`), and x86-64 makes stores
        // visible in program order: a count read here covers every word stored before it. Other
        // targets give no such order without a barrier the program does not have.
        if !cfg!(target_arch = "x86_64") {
            return None;
        }
        let c = self.counters().ok()?;
        Some(c.heartbeats.wrapping_add(c.bfd).wrapping_add(c.flow))
    }

    fn run_stats(&self) -> XdpRunStats {
        let r = program::run_stats(self.program_fd.as_fd()).unwrap_or_default();
        // `id` stays on the kernel side: it was never serialised.
        XdpRunStats {
            run_count: r.run_count,
            run_time_ns: r.run_time_ns,
        }
    }
}
