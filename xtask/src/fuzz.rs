//! Fuzzing with cargo-fuzz (libFuzzer), of everything that reads input from outside: the
//! heartbeat parser (checked against the kernel's field-wise rules), the socket request
//! parser, the fleet's reader of what other monitors write to NATS, the trace parser, and the
//! budget detector on whatever windows and loss counters the kernel's slots hold.
//! The committed seeds in fuzz/corpus/<target> are only read: a run writes what it finds to
//! its working corpus, target/fuzz-corpus/<target> (libFuzzer writes new inputs to the first
//! corpus directory it is given), so the tree is left as found and later runs start from
//! everything earlier ones found. To grow the seeds, merge the inputs that add coverage into
//! them and commit:
//! `cargo +nightly fuzz run TARGET fuzz/corpus/TARGET target/fuzz-corpus/TARGET -- -merge=1`.

use std::fs;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{setup, workspace};

pub const TARGETS: [&str; 5] = [
    "heartbeat_header",
    "socket_request",
    "fleet_bucket",
    "trace_file",
    "budget_window",
];

/// libFuzzer's companion sanitizer. The fuzzed parsers hold no unsafe code, so AddressSanitizer
/// can only find memory errors in their dependencies; it costs about half again the build's CPU
/// (12.8 against 8.3 minutes for the fuzz crate here), which the short fuzzing of the test
/// command does without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sanitizer {
    Address,
    None,
}

#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// The sanitizer the targets are built with (`cargo xtask test` fuzzes with none).
    #[arg(long, value_enum, default_value_t = Sanitizer::Address)]
    pub sanitizer: Sanitizer,
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
        fuzz(target, args.seconds, args.sanitizer, Build::Optimized)?;
    }
    Ok(())
}

/// How the fuzz targets are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// Optimised (cargo-fuzz's default): many more runs a second, for real fuzzing.
    Optimized,
    /// Unoptimised (`--dev`): for the test command's short runs, whose worth is the replay
    /// of every seed and a few seconds of search, not the rate; the build of the fuzz crate
    /// and its dependencies is then the cheaper half of what it was.
    Dev,
}

/// Runs one target for `seconds`; a crash fails with libFuzzer's report and reproducer.
pub fn fuzz(target: &str, seconds: u64, sanitizer: Sanitizer, build: Build) -> Result<()> {
    println!("fuzz: {target} for {seconds} s");
    let working = workspace::root().join("target/fuzz-corpus").join(target);
    fs::create_dir_all(&working)
        .with_context(|| format!("creating the working corpus {}", working.display()))?;
    let seeds = format!("fuzz/corpus/{target}");
    workspace::run(
        workspace::command("rustup")
            .args(["run", "nightly", "cargo", "fuzz", "run", target])
            .args(match sanitizer {
                Sanitizer::Address => ["--sanitizer", "address"],
                Sanitizer::None => ["--sanitizer", "none"],
            })
            .args((build == Build::Dev).then_some("--dev"))
            // New inputs go to the first directory; the seeds are only read.
            .arg(&working)
            .args([seeds.as_str(), "--"])
            .arg(format!("-max_total_time={seconds}"))
            .args(["-rss_limit_mb=2048", "-print_final_stats=1"])
            // Userspace code only: the XDP object is not needed to fuzz parsers.
            .env("AYA_BUILD_SKIP", "1"),
    )
}
