//! `monitor`: the heartbeat failure detector's command line.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
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
