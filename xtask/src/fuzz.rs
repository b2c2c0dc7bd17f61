//! Fuzzing with cargo-fuzz (libFuzzer): the heartbeat parser (checked against the kernel's
//! field-wise rules) and the socket request parser. Seeds live in fuzz/corpus/<target>; a run
//! adds what it finds there, so a long local run followed by a commit keeps the corpus growing.

use anyhow::{Result, bail};
use clap::Args;

use crate::{setup, workspace};

pub const TARGETS: [&str; 2] = ["heartbeat_header", "socket_request"];

#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Targets to run (default: all).
    pub targets: Vec<String>,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    setup::ensure()?;
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    for target in targets {
        if !TARGETS.contains(&target) {
            bail!(
                "unknown fuzz target {target:?} (known: {})",
                TARGETS.join(", ")
            );
        }
        fuzz(target, args.seconds)?;
    }
    Ok(())
}

/// Runs one target for `seconds`; a crash fails with libFuzzer's report and reproducer.
pub fn fuzz(target: &str, seconds: u64) -> Result<()> {
    println!("fuzz: {target} for {seconds} s");
    let corpus = format!("fuzz/corpus/{target}");
    workspace::run(
        workspace::command("rustup")
            .args([
                "run", "nightly", "cargo", "fuzz", "run", target, &corpus, "--",
            ])
            .arg(format!("-max_total_time={seconds}"))
            .args(["-rss_limit_mb=2048", "-print_final_stats=1"])
            // Userspace code only: the XDP object is not needed to fuzz parsers.
            .env("AYA_BUILD_SKIP", "1"),
    )
}
