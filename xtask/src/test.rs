//! Runs every test against the real kernel: unit tests, packet fixtures through
//! BPF_PROG_TEST_RUN, and end-to-end tests across network namespaces.

use anyhow::Result;
use clap::Args;

use crate::{build, fuzz, setup, workspace};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Seconds of fuzzing per target after the tests (0: none).
    #[arg(long, default_value_t = 15)]
    pub fuzz_seconds: u64,
    /// Extra arguments for `cargo test` (e.g. a test name filter), after `--`.
    #[arg(last = true)]
    pub cargo_args: Vec<String>,
}

pub fn run(args: &TestArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("test")?;
    build::build(false)?;
    let mut cmd = workspace::cargo();
    // Default members: every crate but the eBPF one, which only builds for the BPF target.
    cmd.arg("test")
        .env("MONITOR_BIN", build::monitor_bin(false))
        .args(&args.cargo_args);
    workspace::run(&mut cmd)?;
    if args.fuzz_seconds > 0 && args.cargo_args.is_empty() {
        for target in fuzz::TARGETS {
            fuzz::fuzz(target, args.fuzz_seconds)?;
        }
    }
    Ok(())
}
