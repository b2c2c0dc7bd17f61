//! `cargo xtask bench`: builds in release, makes its own namespaces, runs the agent and the
//! load generator, and prints one table (appended, with date, kernel and command, to
//! docs/benchmarks-history.md; BENCHMARKS.md keeps the current figures). Ratios are measured
//! within one run; nothing here asserts a timing.
//!
//! `run` is the sequence; each measurement is a file that runs it and renders its table
//! (`floor`, `scale`, `agent_cost`, `ingest`, `paths`, `fleet`, `kernel_loadgen`); the
//! processes they drive are `agent`, `generator` and `tools` (the probe); `procfs` reads the
//! CPU and memory they use; `lock` and `bpf_stats` hold the machine for the run; `record`
//! appends the result to the history.

mod agent;
mod agent_cost;
mod bpf_stats;
mod fleet;
mod floor;
mod generator;
mod ingest;
mod kernel_loadgen;
mod lock;
mod paths;
mod procfs;
mod record;
mod run;
mod scale;
mod tools;
mod variant;

use std::path::Path;

use clap::Args;

use crate::lab::{Interrupt, NetPair};

pub(crate) use self::procfs::rss_anon_mib;
pub(crate) use agent::Agent;
pub(crate) use record::record;
pub use run::run;
pub(crate) use tools::Tools;
use variant::Variant;

const NET: NetPair = NetPair {
    ns_monitor: "hbm-bench-mon",
    ns_peers: "hbm-bench-gen",
    if_monitor: "hbmbench0",
    if_peers: "hbmbench1",
    addr_monitor: "10.214.0.1",
    addr_peers: "10.214.0.2",
};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Peer counts to measure at.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000,200000")]
    scales: Vec<u64>,
    /// Seconds of steady load per scale (CPU share and memory are measured over it).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// A short run (3 s per step, scales 1000 and 50000) to check the benchmark itself.
    #[arg(long)]
    quick: bool,
    /// Do not append the results to docs/benchmarks-history.md.
    #[arg(long)]
    no_record: bool,
    /// Leave out the fleet's figures (NATS JetStream; about a minute).
    #[arg(long)]
    no_fleet: bool,
    /// Only the agent's cost: idle (no traffic) with no peers and with the largest scale up to
    /// 50,000 listed, then at 1, 5 and 10 Hz from that many, each beside the scan floor
    /// (`hbm-bench scan-floor`: every word scanned every 50 ms, nothing else); nothing is
    /// recorded.
    #[arg(long)]
    agent_only: bool,
    /// Only the scale runs (for example `--scales 200000,1000000 --rate-hz 1`), recorded
    /// unless --no-record.
    #[arg(long)]
    scales_only: bool,
    /// Only the floor comparison (BPF_PROG_TEST_RUN and the live rows of the scales given,
    /// `--seconds` each), for iterating on the kernel program; recorded unless --no-record.
    #[arg(long)]
    floor_only: bool,
    /// Heartbeats per second per peer in the scale runs (the generator tops out near 350k
    /// packets per second on 2 cores; the table shows what it sent). Above 50,000 peers, at
    /// most 250k packets a second in all, which the generator sends on schedule.
    #[arg(long, default_value_t = RATE_HZ)]
    rate_hz: f64,
    /// The scale runs' generator puts this many heartbeats back to back in each datagram
    /// (`monitor loadgen --pack`, at most 45): one packet for many, so a stream can pass the
    /// million a second one core sends a heartbeat a packet (200,000 x 10 Hz). The agent's
    /// load is the same; the kernel's is its batch path, so those rows' kernel ns are per
    /// heartbeat, not per packet. 1: one heartbeat a datagram.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pack: usize,
    /// The scale runs' generator at a real-time priority (`chrt -f 10`): on this machine's
    /// two cores the agent and the kernel's receive path otherwise delay it by up to an
    /// interval of 10 ms heartbeats, and a heartbeat sent an interval late is a real silence,
    /// not a clean path. Its lateness is in the table either way.
    #[arg(long)]
    realtime_generator: bool,
    /// Only the kernel generator's rows (`monitor loadgen --kernel`): its ceiling beside the
    /// userspace generator's, and 200,000 peers x 10 Hz, 1,000,000 x 1 Hz and 1,000,000 x
    /// 10 Hz (as far as the machine allows), `--seconds` each; recorded unless --no-record.
    #[arg(long)]
    kernel_loadgen: bool,
    /// An agent measured beside the others in --agent-only and --scales-only runs, row by
    /// row under the same load (in --floor-only runs, a row "monitor (LABEL)" of each on the
    /// same stream as this build's "monitor" row): `LABEL=BINARY [FLAGS]`, BINARY `.` for this build, e.g.
    /// `--compare 'main=/tmp/monitor-main' --compare 'new=.' --compare 'new20=. --sweep-interval
    /// 20ms'`. Its flags win over those the run gives every agent (the scale runs'
    /// `--first-interval-ms`, say). Repeatable; without it, this build alone.
    #[arg(long, value_name = "LABEL=BINARY [FLAGS]")]
    compare: Vec<String>,
}

/// Heartbeats per second per peer in the scale runs.
const RATE_HZ: f64 = 10.0;

/// What every measurement runs on: the release binaries, the namespace pair, a scratch
/// directory for peers files and sockets, the Ctrl-C flag long waits check, and the agents
/// compared (`--compare`).
struct Rig<'a> {
    tools: &'a Tools,
    net: &'a NetPair,
    dir: &'a Path,
    interrupt: &'a Interrupt,
    variants: &'a [Variant],
}

impl Rig<'_> {
    /// This build's agent over peers 1..=`peers`, with `extra` flags.
    fn agent(&self, peers: u64, extra: &[&str]) -> anyhow::Result<Agent> {
        self.agent_as(&Variant::this_build(), peers, extra)
    }

    /// `variant`'s agent over peers 1..=`peers`, with its flags and `extra`.
    fn agent_as(&self, variant: &Variant, peers: u64, extra: &[&str]) -> anyhow::Result<Agent> {
        self.agent_from(variant, 1, peers, extra)
    }

    /// `variant`'s agent over peers `first_id..first_id + peers`.
    fn agent_from(
        &self,
        variant: &Variant,
        first_id: u64,
        peers: u64,
        extra: &[&str],
    ) -> anyhow::Result<Agent> {
        let binary = variant.binary.as_deref().unwrap_or(&self.tools.monitor);
        let mut flags: Vec<&str> = variant.flags.iter().map(String::as_str).collect();
        flags.extend(variant.run_flags(extra));
        Agent::start(
            self.tools, binary, self.net, self.dir, first_id, peers, &flags,
        )
    }
}
