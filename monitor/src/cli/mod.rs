//! One module per subcommand.

mod completions;
mod config_file;
mod detach;
mod fleet;
mod haproxy_agent;
mod loadgen;
mod manpage;
mod peer_cache;
mod query;
mod record;
mod replay;
mod run;
mod send;
mod top;
mod track_file;
mod watch;

use std::process::ExitCode;

use std::ffi::{OsStr, OsString};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "monitor",
    version,
    about = "Heartbeat failure detector: XDP timestamps heartbeats in the kernel, the agent \
             serves phi accrual suspicion over a Unix socket."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the XDP program on an interface and serve the socket until SIGINT/SIGTERM.
    // Boxed: its flags are most of the enum's size, and the other commands need not carry it.
    Run(Box<run::RunArgs>),
    /// Detach a program left running by `monitor run --persist` and remove its pins.
    Detach(detach::DetachArgs),
    /// Send heartbeats to a monitor (run this on each peer).
    Send(send::SendArgs),
    /// Ask a running agent about its peers.
    Query(query::QueryArgs),
    /// Simulate many peers sending heartbeats (for benchmarks and soak tests).
    Loadgen(loadgen::LoadgenArgs),
    /// Follow a running agent's events: suspicions, recoveries, admissions.
    Watch(watch::WatchArgs),
    /// Run detectors offline on a trace of heartbeat arrivals and report their quality.
    Replay(replay::ReplayArgs),
    /// Record every arrival of some peers from a running agent, as traces for `replay`.
    Record(record::RecordArgs),
    /// Print the completion script of a shell (bash, zsh, fish) for `monitor`.
    Completions(completions::CompletionsArgs),
    /// Print the man page monitor(1), or with --out DIR write one page per subcommand.
    Manpage(manpage::ManpageArgs),
    /// A live terminal view of a running agent: peers by suspicion, counts per level, events.
    Top(top::TopArgs),
    /// The fleet's view on NATS JetStream: peers enough live monitors hold down, each
    /// monitor's view of a peer, fleet events (monitors publish with `run --nats`).
    Fleet(fleet::FleetArgs),
    /// Answer HAProxy's agent checks (`agent-check`) from the agent's view of each server's
    /// peer: up, a reduced weight, drain or down by level.
    HaproxyAgent(haproxy_agent::HaproxyAgentArgs),
    /// Keep keepalived `track_file`s up to date: 0 while the named peers are below a level,
    /// a weight (or fault) otherwise.
    TrackFile(track_file::TrackFileArgs),
}

impl Cli {
    /// Whether this is the long-running agent (`monitor run`), as against a one-shot command.
    pub fn serves(&self) -> bool {
        matches!(self.command, Command::Run(_))
    }
}

/// The command line, with `monitor run --config FILE`'s settings placed before the command
/// line's own (see `config_file`); `monitor run --print-config` prints and exits here.
pub fn parse() -> Cli {
    let argv = match with_config_file(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("monitor: {e}");
            std::process::exit(2);
        }
    };
    let cmd = Cli::command();
    let matches = cmd.clone().get_matches_from(&argv);
    if let Some(run) = matches.subcommand_matches("run")
        && run.get_flag("print_config")
    {
        let run_cmd = cmd.find_subcommand("run").expect("run is a subcommand");
        print!("{}", config_file::print(run_cmd, run));
        std::process::exit(0);
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `argv` with the settings of `monitor run --config FILE` inserted after `run`.
pub fn with_config_file(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // Only `run` reads a file, and the subcommand is the first argument (no global options).
    if argv.get(1).map(OsString::as_os_str) != Some(OsStr::new("run")) {
        return Ok(argv);
    }
    let command_line = &argv[2..];
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("run is a subcommand");
    let Some(matches) = config_file::command_line(run, command_line) else {
        return Ok(argv);
    };
    let Some(path) = config_file::config_path(&matches) else {
        return Ok(argv);
    };
    let file = config_file::file_args(&path, run, &matches).map_err(|e| e.to_string())?;
    let mut out = argv[..2].to_vec();
    out.extend(file);
    out.extend_from_slice(command_line);
    Ok(out)
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Send(args) => send::send(args),
        Command::Detach(args) => detach::detach(args),
        Command::Query(args) => query::query(args),
        Command::Watch(args) => watch::watch(args),
        Command::Loadgen(args) => loadgen::loadgen(args),
        Command::Replay(args) => replay::replay(args),
        Command::Record(args) => record::record(args),
        Command::Completions(args) => completions::completions(args),
        Command::Manpage(args) => manpage::manpage(args),
        Command::Top(args) => top::top(args),
        Command::Fleet(args) => fleet::fleet(args),
        Command::HaproxyAgent(args) => haproxy_agent::haproxy_agent(args),
        Command::TrackFile(args) => track_file::track_file(args),
    }
}

/// Resolves `--to ADDR:PORT` (a host name works too) to its first address.
pub fn resolve_target(to: &str) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    use std::net::ToSocketAddrs;
    to.to_socket_addrs()
        .with_context(|| format!("--to {to:?}: expected ADDR:PORT"))?
        .next()
        .with_context(|| format!("--to {to:?} resolves to no address"))
}

/// Parses durations such as `100ms`, `1.5s`, `2m`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 100ms, 1.5s, 2m)"))
}
