//! What a process and the machine used, from /proc: CPU time, anonymous memory, BPF map
//! memory.

use ::procfs::{CurrentSI, KernelStats, process::Process};
use anyhow::{Context, Result};

/// CPU seconds a process has run, summed over its threads from the scheduler's own
/// nanosecond accounting (`/proc/PID/task/*/schedstat`), not the 10 ms ticks of
/// `/proc/PID/stat`: an agent at half a percent of a core runs 5 ms a second. Threads that
/// ended are not counted (the agent's live for its whole life).
pub(super) fn process_cpu_s(pid: u32) -> Result<f64> {
    let process = Process::new(pid as i32).with_context(|| format!("process {pid}"))?;
    let mut ns = 0u64;
    for task in process.tasks()? {
        // A thread may end between the listing and the read.
        let Ok(schedstat) = task.and_then(|t| t.schedstat()) else {
            continue;
        };
        ns += schedstat.sum_exec_runtime;
    }
    Ok(ns as f64 / 1e9)
}

/// CPU seconds the threads of a process named `name` (their `comm`) have run, as
/// [`process_cpu_s`] counts them.
pub(super) fn thread_cpu_s(pid: u32, name: &str) -> Result<f64> {
    let process = Process::new(pid as i32).with_context(|| format!("process {pid}"))?;
    let mut ns = 0u64;
    for task in process.tasks()? {
        let Ok(task) = task else {
            continue;
        };
        let named = task.stat().is_ok_and(|stat| stat.comm == name);
        if let (true, Ok(schedstat)) = (named, task.schedstat()) {
            ns += schedstat.sum_exec_runtime;
        }
    }
    Ok(ns as f64 / 1e9)
}

/// Busy CPU seconds of the whole machine so far (all CPUs, everything but idle and iowait).
pub(super) fn system_busy_s() -> Result<f64> {
    let cpu = KernelStats::current().context("reading /proc/stat")?.total;
    let ticks = cpu.user
        + cpu.nice
        + cpu.system
        + cpu.irq.unwrap_or(0)
        + cpu.softirq.unwrap_or(0)
        + cpu.steal.unwrap_or(0);
    Ok(ticks as f64 / ::procfs::ticks_per_second() as f64)
}

/// The process's resident anonymous memory (`RssAnon`), MiB.
pub(crate) fn rss_anon_mib(pid: u32) -> Result<f64> {
    let status = Process::new(pid as i32)
        .and_then(|p| p.status())
        .with_context(|| format!("/proc/{pid}/status"))?;
    let kib = status.rssanon.context("no RssAnon in /proc/PID/status")?;
    Ok(kib as f64 / 1024.0)
}

/// Kernel memory of every BPF map the process holds an fd for (fdinfo `memlock`), bytes.
pub(super) fn map_memory_bytes(pid: u32) -> Result<f64> {
    let mut total = 0.0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if !info.contains("map_type:") {
            continue;
        }
        if let Some(line) = info.lines().find(|l| l.starts_with("memlock:")) {
            total += line
                .split_whitespace()
                .nth(1)
                .unwrap_or("0")
                .parse::<f64>()
                .unwrap_or(0.0);
        }
    }
    Ok(total)
}
