//! The real XDP program, loaded into the running kernel but attached nowhere, driven packet by
//! packet through BPF_PROG_TEST_RUN.

use aya::programs::{TestRun, TestRunOptions};
use monitor::{clock::monotonic_ns, counters::CounterTotals, loaded::LoadedProgram, program};
use monitor_common::{
    config::XdpConfig,
    maps::{PeerRecord, UnknownPeerReport},
};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;

pub struct Fixture {
    pub loaded: LoadedProgram,
}

impl Fixture {
    /// Loads the program with `config` and admits `peers`.
    pub fn new(config: XdpConfig, peers: &[u64]) -> Self {
        crate::require_root();
        let mut loaded = LoadedProgram::load(&config, 64).expect("load XDP program");
        let now = monotonic_ns();
        for &id in peers {
            loaded
                .registry
                .admit(&loaded.table, id, now)
                .expect("admit");
        }
        Self { loaded }
    }

    pub fn with_peers(peers: &[u64]) -> Self {
        Self::new(XdpConfig::DEFAULT, peers)
    }

    /// Runs one packet; returns the XDP verdict.
    pub fn run(&mut self, packet: &[u8]) -> u32 {
        self.try_run(packet).expect("BPF_PROG_TEST_RUN")
    }

    pub fn try_run(&mut self, packet: &[u8]) -> Result<u32, aya::programs::ProgramError> {
        let xdp = program::xdp_mut(&mut self.loaded.ebpf).expect("xdp program");
        let result = xdp.test_run(TestRunOptions {
            data_in: Some(packet),
            ..TestRunOptions::default()
        })?;
        Ok(result.return_value)
    }

    pub fn counters(&self) -> CounterTotals {
        CounterTotals::read(&self.loaded.counters).expect("read counters")
    }

    pub fn record(&self, id: u64) -> PeerRecord {
        let slot = self.loaded.registry.slot_of(id).expect("peer admitted");
        self.loaded.table.record(slot).expect("consistent read")
    }

    pub fn intervals(&self, id: u64) -> Vec<u32> {
        let slot = self.loaded.registry.slot_of(id).expect("peer admitted");
        self.loaded.table.intervals(slot).expect("consistent read")
    }

    /// Drains the unknown-peer ring buffer.
    pub fn unknown_reports(&mut self) -> Vec<UnknownPeerReport> {
        let mut out = Vec::new();
        while let Some(item) = self.loaded.unknown_reports.next() {
            out.push(monitor::admission::decode_report(&item).expect("report size"));
        }
        out
    }
}
