use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use monitor::kernel::pinning;

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The interface the program was left on.
    #[arg(long, short)]
    iface: String,
    /// Where it is pinned (default: /sys/fs/bpf/heartbeat-monitor/IFACE).
    #[arg(long)]
    pin_path: Option<PathBuf>,
}

pub fn detach(args: DetachArgs) -> anyhow::Result<ExitCode> {
    let dir = args
        .pin_path
        .unwrap_or_else(|| pinning::default_pin_path(&args.iface));
    if pinning::remove(&dir)? {
        println!(
            "detached from {} and removed the pins at {}",
            args.iface,
            dir.display()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("monitor: nothing pinned at {}", dir.display());
        Ok(ExitCode::FAILURE)
    }
}
