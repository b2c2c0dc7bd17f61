//! Project tasks: `cargo xtask setup | build | test | lint | demo | ...`. One module per task;
//! every task runs whatever part of `setup` is missing first, so a fresh machine needs no hand
//! steps.

mod attack;
mod bench;
mod build;
mod consumers;
mod demo;
mod frr;
mod fuzz;
mod lab;
mod lint;
mod package;
mod setup;
mod soak;
mod test;
mod traces;
mod workspace;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, test and demo the heartbeat monitor"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what building and testing need (nightly rust-src, bpf-linker, iproute2).
    Setup,
    /// Build the agent with its XDP program.
    Build(build::BuildArgs),
    /// Build the Debian package under target/debian/ (cargo-deb): binary, unit, config, man pages.
    Package,
    /// Run every test: lints, unit, packet fixtures (BPF_PROG_TEST_RUN) and namespace integration.
    Test(test::TestArgs),
    /// Check formatting (rustfmt) and lints (clippy, warnings as errors).
    Lint,
    /// Watch heartbeats cross a veth pair between two namespaces, then stop a peer.
    Demo(demo::DemoArgs),
    /// 50,000 peers for 10 minutes with churn; checks detection, false suspicion, leaks.
    Soak(soak::SoakArgs),
    /// Fuzz the heartbeat and request parsers for a while (cargo-fuzz).
    Fuzz(fuzz::FuzzArgs),
    /// Measure kernel cost, ingest, sweeps, socket and event latency, CPU and memory at scale.
    Bench(bench::BenchArgs),
    /// Record the corpus of real traces (tests/traces/) through impaired veth paths.
    Traces(traces::TracesArgs),
    /// HAProxy's own checks against the agent-check for minutes: false DOWNs under congestion, time to DOWN after kills.
    Consumers(consumers::ConsumersArgs),
    /// Run every attack of the security suite against the real agent and kernel; one table.
    Attack(attack::AttackArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build(args) => build::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Lint => lint::run(),
        Task::Package => package::run(),
        Task::Demo(args) => demo::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::Soak(args) => soak::run(&args),
        Task::Traces(args) => traces::run(&args),
        Task::Attack(args) => attack::run(&args),
        Task::Consumers(args) => consumers::run(&args),
    }
}
