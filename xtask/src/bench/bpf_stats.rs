//! The kernel's run statistics of BPF programs (run count and run time), on for a bench.

use anyhow::{Context, Result};

/// Turns on kernel.bpf_stats_enabled for the run and restores it after.
pub(super) struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn enable() -> Result<Self> {
        let old =
            std::fs::read_to_string(Self::PATH).context("reading kernel.bpf_stats_enabled")?;
        std::fs::write(Self::PATH, "1").context("enabling kernel.bpf_stats_enabled")?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}
