//! `monitor manpage [--out DIR]`: the roff manual. Without `--out`, monitor(1) on standard
//! output: every subcommand listed with its summary, each one's own page named. With `--out`,
//! one page per command into DIR (monitor.1, monitor-run.1, monitor-query-peers.1, ...), the
//! set a package installs so that `man monitor-run` shows every flag of `monitor run`.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_mangen::Man;

#[derive(Debug, Args)]
pub struct ManpageArgs {
    /// Write one page per command (monitor.1, monitor-SUBCOMMAND.1, ...) into this directory
    /// instead of printing monitor(1).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// The command as the pages describe it: `help` is clap's, not a command of its own here.
fn command() -> clap::Command {
    let mut command = super::Cli::command().disable_help_subcommand(true);
    command.build();
    command
}

pub fn manpage(args: ManpageArgs) -> anyhow::Result<ExitCode> {
    match args.out {
        None => {
            let mut page = Vec::new();
            Man::new(command()).render(&mut page)?;
            super::completions::print(&page)?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for path in write_pages(command(), &dir)? {
                println!("{}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The page of `command` and of each of its visible subcommands, recursively; their paths.
fn write_pages(command: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        written.extend(write_pages(sub.clone(), dir)?);
    }
    let page = Man::new(command);
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing {}", dir.join(page.get_filename()).display()))?;
    written.insert(0, path);
    Ok(written)
}
