//! `monitor completions SHELL`: the shell's completion script for `monitor`, on standard
//! output (packaging/systemd/README.md says where each shell looks for it).

use std::{io::Write, process::ExitCode};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for: bash, zsh, fish (also elvish, powershell).
    #[arg(value_enum)]
    shell: Shell,
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(
        args.shell,
        &mut super::Cli::command(),
        "monitor",
        &mut script,
    );
    print(&script)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to standard output; a reader that stops early (`| head`) is not an error.
pub(super) fn print(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result,
    }
}
