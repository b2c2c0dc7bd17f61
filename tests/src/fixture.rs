//! The real XDP program, loaded into the running kernel but attached nowhere, driven packet by
//! packet through BPF_PROG_TEST_RUN.

use aya::programs::{TestRun, TestRunOptions};
use monitor::{
    kernel::clock::monotonic_ns, kernel::counters::CounterTotals, kernel::loaded::LoadedProgram,
    kernel::program,
};
use monitor_common::{
    config::XdpConfig,
    maps::{PeerRecord, UnknownPeerReport},
};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;

/// The TC verdicts (`TC_ACT_OK`, `TC_ACT_SHOT`); a TC fixture reports them as XDP_PASS and
/// XDP_DROP, so the same assertions hold for both hooks.
pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;

pub struct Fixture {
    pub loaded: LoadedProgram,
    /// Which of the object's programs `run` drives: the XDP one or the TC classifier.
    pub hook: program::Hook,
}

impl Fixture {
    /// Loads the program with `config` and admits `peers`.
    pub fn new(config: XdpConfig, peers: &[u64]) -> Self {
        Self::new_hook(config, peers, program::Hook::Xdp)
    }

    /// As `new`, driving the program of `hook` (`--hook tc` loads the TC classifier).
    pub fn new_hook(config: XdpConfig, peers: &[u64], hook: program::Hook) -> Self {
        crate::require_root();
        let mut loaded = LoadedProgram::load_hook(&config, 64, None, program::KernelLog::Off, hook)
            .expect("load the program");
        let now = monotonic_ns();
        for &id in peers {
            loaded
                .maps
                .registry
                .admit(&loaded.maps.table, id, now)
                .expect("admit");
        }
        Self { loaded, hook }
    }

    /// Admits a peer of `source` (`monitor_common::passive`).
    pub fn admit_as(&mut self, id: u64, source: u8) {
        self.loaded
            .maps
            .registry
            .admit_as(&self.loaded.maps.table, id, monotonic_ns(), source)
            .expect("admit");
    }

    /// The agent's registry of this program's maps (admission as the agent does it).
    pub fn registry(&mut self) -> &mut monitor::kernel::registry::Registry {
        &mut self.loaded.maps.registry
    }

    /// Admits `id` as the agent would, returning what the registry said.
    pub fn try_admit_as(
        &mut self,
        id: u64,
        source: u8,
    ) -> Result<u32, monitor::kernel::registry::AdmitError> {
        self.loaded
            .maps
            .registry
            .admit_as(&self.loaded.maps.table, id, monotonic_ns(), source)
    }

    pub fn with_peers(peers: &[u64]) -> Self {
        Self::new(XdpConfig::DEFAULT, peers)
    }

    /// Runs one packet; returns the XDP verdict.
    pub fn run(&mut self, packet: &[u8]) -> u32 {
        self.try_run(packet).expect("BPF_PROG_TEST_RUN")
    }

    pub fn try_run(&mut self, packet: &[u8]) -> Result<u32, aya::programs::ProgramError> {
        let options = TestRunOptions {
            data_in: Some(packet),
            ..TestRunOptions::default()
        };
        match self.hook {
            program::Hook::Xdp => {
                let xdp = program::xdp_mut(&mut self.loaded.ebpf).expect("xdp program");
                Ok(xdp.test_run(options)?.return_value)
            }
            program::Hook::Tc => {
                let tc = program::tc_mut(&mut self.loaded.ebpf).expect("tc program");
                Ok(match tc.test_run(options)?.return_value {
                    TC_ACT_OK => XDP_PASS,
                    TC_ACT_SHOT => XDP_DROP,
                    other => panic!("unexpected TC verdict {other}"),
                })
            }
        }
    }

    /// Runs one packet through the TC classifier as a batch: an skb of `segments` datagrams of
    /// `segment_size` bytes of payload each, as UDP GSO or GRO leave one (the skb test run takes
    /// `gso_segs` and `gso_size` in its `__sk_buff` context). Returns the verdict as `run` does.
    pub fn run_batch(&mut self, packet: &[u8], segments: u32, segment_size: u32) -> u32 {
        assert_eq!(
            self.hook,
            program::Hook::Tc,
            "only the TC hook meets batches"
        );
        // struct __sk_buff (192 bytes): gso_segs at 164, gso_size at 176; every other field 0.
        let mut ctx = [0u8; 192];
        ctx[164..168].copy_from_slice(&segments.to_ne_bytes());
        ctx[176..180].copy_from_slice(&segment_size.to_ne_bytes());
        let options = TestRunOptions {
            data_in: Some(packet),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        };
        let tc = program::tc_mut(&mut self.loaded.ebpf).expect("tc program");
        match tc
            .test_run(options)
            .expect("BPF_PROG_TEST_RUN")
            .return_value
        {
            TC_ACT_OK => XDP_PASS,
            TC_ACT_SHOT => XDP_DROP,
            other => panic!("unexpected TC verdict {other}"),
        }
    }

    pub fn counters(&self) -> CounterTotals {
        CounterTotals::read(&self.loaded.maps.counters).expect("read counters")
    }

    /// The slot the registry gave `id`.
    pub fn slot(&self, id: u64) -> u32 {
        self.loaded
            .maps
            .registry
            .slot_of(id)
            .expect("peer admitted")
    }

    pub fn record(&self, id: u64) -> PeerRecord {
        let slot = self.slot(id);
        self.loaded
            .maps
            .table
            .record(slot)
            .expect("consistent read")
    }

    pub fn intervals(&self, id: u64) -> Vec<u32> {
        let slot = self.slot(id);
        self.loaded
            .maps
            .table
            .intervals(slot)
            .expect("consistent read")
    }

    /// Every (id, slot) the kernel's hot lines (PEER_HOT) link, sorted, found through the
    /// program's map ids: what the kernel would find ids in, not the agent's registry.
    pub fn kernel_index(&self) -> Vec<(u64, u32)> {
        use aya::maps::{Array, Map, MapData};
        use monitor_common::maps::{HotLine, linked_slot};
        let name = match self.hook {
            program::Hook::Xdp => program::PROGRAM_NAME,
            program::Hook::Tc => program::TC_PROGRAM_NAME,
        };
        let info = self
            .loaded
            .ebpf
            .program(name)
            .expect("the program")
            .info()
            .expect("program info");
        let ids = info
            .map_ids()
            .expect("map ids")
            .expect("the kernel reports map ids");
        for id in ids {
            let data = MapData::from_id(id).expect("map by id");
            let info = data.info().expect("map info");
            if info.name() == monitor_common::maps::PEER_HOT_MAP.as_bytes() {
                let lines = Array::<MapData, HotLine>::try_from(Map::Array(data))
                    .expect("PEER_HOT is an array of hot lines");
                let mut entries: Vec<(u64, u32)> = lines
                    .iter()
                    .map(|line| line.expect("hot line"))
                    .filter_map(|line| Some((line.hot.peer_id, linked_slot(line.lock)?)))
                    .collect();
                entries.sort_unstable();
                return entries;
            }
        }
        panic!("the program uses no map named PEER_HOT");
    }

    /// Drains the arrivals ring buffer (`monitor record`'s, and the told heartbeats of
    /// suspected peers).
    pub fn arrivals(&mut self) -> Vec<monitor_common::maps::ArrivalRecord> {
        let mut out = Vec::new();
        while let Some(item) = self.loaded.maps.arrivals.next() {
            out.push(
                monitor::kernel::ring_reader::decode::<monitor_common::maps::ArrivalRecord>(&item)
                    .expect("arrival size"),
            );
        }
        out
    }

    /// Drains the unknown-peer ring buffer.
    pub fn unknown_reports(&mut self) -> Vec<UnknownPeerReport> {
        let mut out = Vec::new();
        while let Some(item) = self.loaded.maps.unknown_reports.next() {
            out.push(
                monitor::kernel::ring_reader::decode::<UnknownPeerReport>(&item)
                    .expect("report size"),
            );
        }
        out
    }
}
