//! Builds the workspace (agent and XDP program).

use anyhow::Result;
use clap::Args;

use crate::{setup, workspace};

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Build with optimisations.
    #[arg(long)]
    pub release: bool,
}

pub fn run(args: &BuildArgs) -> Result<()> {
    setup::ensure()?;
    build(args.release)
}

/// Builds the `monitor` binary; the XDP program is built into it by monitor/build.rs.
pub fn build(release: bool) -> Result<()> {
    let mut cmd = workspace::cargo();
    cmd.args(["build", "--package", "monitor"]);
    if release {
        cmd.arg("--release");
    }
    workspace::run(&mut cmd)
}

/// Path of the built `monitor` binary.
pub fn monitor_bin(release: bool) -> std::path::PathBuf {
    workspace::root()
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("monitor")
}
