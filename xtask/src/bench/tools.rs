//! The binaries the bench runs, built in release, and the JSON line each prints last.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::{build, lab::Process, workspace};

pub(crate) struct Tools {
    pub monitor: PathBuf,
    pub probe: PathBuf,
}

impl Tools {
    /// Builds the agent and the probes in release.
    pub fn build() -> Result<Self> {
        let release = build::release_with_tools(&["hbm-bench"])?;
        Ok(Self {
            monitor: release.join("monitor"),
            probe: release.join("hbm-bench"),
        })
    }
}

/// Runs `hbm-bench` with `args` to the end: its measurement.
pub(super) fn probe_json(probe: &Path, args: &[&str]) -> Result<Value> {
    let out = workspace::output(Command::new(probe).args(args))?;
    let last = out.lines().last().context("probe printed nothing")?;
    serde_json::from_str(last).with_context(|| format!("probe output {last:?}"))
}

/// Waits for `process` to end: the JSON line it printed last.
pub(super) fn finish_json(process: Process) -> Result<Value> {
    let out = process.finish()?;
    let last = out.lines().last().context("no output")?;
    Ok(serde_json::from_str(last)?)
}

/// The number at `path` in `v`, NaN where there is none.
pub(super) fn number_at(v: &Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .unwrap_or(f64::NAN)
}
