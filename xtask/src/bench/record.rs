//! The benchmark history: each recorded run appended to docs/benchmarks-history.md with the
//! date, the kernel and the command that made it (BENCHMARKS.md keeps the current figures).

use std::process::Command;

use anyhow::Result;

use crate::workspace;

/// Appends a dated section with `table` and the command that made it to the benchmark history.
pub(crate) fn record(table: &str, command: &str) -> Result<()> {
    let path = workspace::root().join("docs/benchmarks-history.md");
    let kernel = workspace::output(Command::new("uname").arg("-r"))?;
    let date = workspace::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    let entry = format!(
        "\n## {} (kernel {}), `{command}`\n\n{table}",
        date.trim(),
        kernel.trim()
    );
    let mut text =
        std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmark history\n".into());
    text.push_str(&entry);
    std::fs::write(&path, text)?;
    println!("appended to {}", path.display());
    Ok(())
}

/// The `--compare` options as the command line took them (empty without any, else with a
/// leading space), so that a recorded command reproduces the run.
pub(super) fn compared(compare: &[String]) -> String {
    compare
        .iter()
        .map(|c| format!(" --compare '{c}'"))
        .collect()
}

/// Peer counts as the command line takes them (`1000,50000`).
pub(super) fn join(scales: &[u64]) -> String {
    scales
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
