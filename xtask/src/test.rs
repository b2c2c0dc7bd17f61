//! Builds the Debian package, runs the lints, then every test against the real kernel: unit tests, packet fixtures through
//! BPF_PROG_TEST_RUN, and end-to-end tests across network namespaces.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{build, fuzz, lint, package, setup, workspace};

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
    let mut phases = Phases::start();
    phases.time("setup", setup::ensure)?;
    workspace::require_root("test")?;
    phases.time("build", || build::build(false))?;
    // tests/tests/deb_package.rs checks the .deb, made of the debug build just built (see
    // `package::Build::Test`). A run limited to other test files (`-- --test NAME`) does not
    // need it.
    let only_files: Vec<&str> = args
        .cargo_args
        .windows(2)
        .filter(|w| w[0] == "--test")
        .map(|w| w[1].as_str())
        .chain(
            args.cargo_args
                .iter()
                .filter_map(|a| a.strip_prefix("--test=")),
        )
        .collect();
    let deb = if only_files.is_empty() || only_files.contains(&"deb_package") {
        Some(phases.time("package", || package::package(package::Build::Test))?)
    } else {
        None
    };
    // A test filter asks for some tests, not for a review of the tree.
    if args.cargo_args.is_empty() {
        phases.time("lint", lint::lint)?;
    }
    let mut cmd = workspace::cargo();
    // Default members: every crate but the eBPF one, which only builds for the BPF target.
    cmd.arg("test")
        .env("MONITOR_BIN", build::monitor_bin(false))
        .args(&args.cargo_args);
    if let Some(deb) = &deb {
        cmd.env("HEARTBEAT_MONITOR_DEB", deb);
    }
    let (passed, failed) = phases.time("tests (build and run)", || run_counting(&mut cmd))?;
    if args.fuzz_seconds > 0 && args.cargo_args.is_empty() {
        phases.time("fuzz (build and run)", || {
            fuzz::TARGETS.iter().try_for_each(|target| {
                fuzz::fuzz(
                    target,
                    args.fuzz_seconds,
                    fuzz::Sanitizer::None,
                    fuzz::Build::Dev,
                )
            })
        })?;
    }
    // One closing line for the whole run (cargo's own last line is a crate's doc-tests).
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// How long each phase of a run took, printed when the run ends (also when a phase fails), so
/// a slow CI run says where its time went.
struct Phases {
    started: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Self {
        Self {
            started: Instant::now(),
            done: Vec::new(),
        }
    }

    fn time<T>(&mut self, phase: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let result = f();
        self.done.push((phase, started.elapsed()));
        result
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        let phases: Vec<String> = self
            .done
            .iter()
            .map(|(phase, took)| format!("{phase} {:.0} s", took.as_secs_f64()))
            .collect();
        println!(
            "phases: {} (all {:.0} s)",
            phases.join(", "),
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Runs `cargo test`, echoing its output, and sums its `test result:` lines.
fn run_counting(cmd: &mut Command) -> Result<(u64, u64)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|part| {
                        part.trim().strip_suffix(word).map(|n| {
                            n.trim()
                                .rsplit(' ')
                                .next()
                                .unwrap_or("0")
                                .parse::<u64>()
                                .unwrap_or(0)
                        })
                    })
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        println!("tests: {passed} passed, {failed} failed");
        bail!("{cmd:?} failed: {status}");
    }
    Ok((passed, failed))
}
