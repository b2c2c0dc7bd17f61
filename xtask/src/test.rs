//! Runs every test against the real kernel: unit tests, packet fixtures through
//! BPF_PROG_TEST_RUN, and end-to-end tests across network namespaces.

use anyhow::Result;
use clap::Args;

use crate::{build, setup, workspace};

#[derive(Debug, Args)]
pub struct TestArgs {
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
    workspace::run(&mut cmd)
}
