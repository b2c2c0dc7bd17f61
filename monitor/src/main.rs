//! `monitor`: the heartbeat failure detector's command line.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        // `kernel` is the XDP program's own lines: `--kernel-log` says which it writes, so
        // whatever RUST_LOG says for the agent, they all pass.
        .filter_module("kernel", log::LevelFilter::Trace)
        .format_timestamp_millis()
        .init();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("monitor: {e:#}");
            ExitCode::FAILURE
        }
    }
}
