//! Checks the tree as a reviewer would first: rustfmt's layout and clippy's lints, as errors.
//! `cargo xtask test` runs it before the tests, so CI fails on either.

use anyhow::Result;

use crate::{setup, workspace};

pub fn run() -> Result<()> {
    setup::ensure()?;
    lint()
}

/// rustfmt on every crate, then clippy on every target of the default members (the eBPF
/// crate builds only for the BPF target; its code is checked by the verifier in the tests).
pub fn lint() -> Result<()> {
    workspace::run(workspace::cargo().args(["fmt", "--all", "--check"]))?;
    workspace::run(workspace::cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))
}
