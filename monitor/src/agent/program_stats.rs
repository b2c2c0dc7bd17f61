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

    fn run_stats(&self) -> XdpRunStats {
        let r = program::run_stats(self.program_fd.as_fd()).unwrap_or_default();
        // `id` stays on the kernel side: it was never serialised.
        XdpRunStats {
            run_count: r.run_count,
            run_time_ns: r.run_time_ns,
        }
    }
}
