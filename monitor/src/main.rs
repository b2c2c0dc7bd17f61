//! `monitor`: the heartbeat failure detector's command line.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::parse();
    if !args.serves() {
        // A one-shot command piped into `head` should end quietly when the pipe closes, as
        // other CLI tools do. Not the agent: a client that hangs up must never kill it.
        // SAFETY: setting a signal disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        // `kernel` is the XDP program's own lines: `--kernel-log` says which it writes, so
        // whatever RUST_LOG says for the agent, they all pass.
        .filter_module("kernel", log::LevelFilter::Trace)
        .format_timestamp_millis()
        .init();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("monitor: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each said once: many error types already include
/// their source in their own message, and `{:#}` would repeat it.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}
