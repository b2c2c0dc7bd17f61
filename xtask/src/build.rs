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

/// Builds, in release, the agent and these binaries of the integration-tests crate (the
/// probes and loaders the bench and the traces run), and returns the directory they are in:
/// CARGO_TARGET_DIR's when it is set (relative to the workspace root), else target/.
pub fn release_with_tools(tools: &[&str]) -> Result<std::path::PathBuf> {
    let mut cmd = workspace::cargo();
    cmd.args(["build", "--release", "--package", "monitor", "--package"])
        .arg("integration-tests")
        .args(["--bin", "monitor"]);
    for tool in tools {
        cmd.args(["--bin", tool]);
    }
    workspace::run(&mut cmd)?;
    Ok(std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || workspace::root().join("target"),
            |dir| workspace::root().join(dir),
        )
        .join("release"))
}
