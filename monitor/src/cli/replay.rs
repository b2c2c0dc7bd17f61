use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;
use monitor::detector::{
    generate::{TraceKind, generate},
    replay::{ReplayClock, ReplayReport, replay as run_replay},
    spec::parse_spec,
    trace::parse_trace,
};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Trace file: one heartbeat arrival per line, `TIME_MS [SEQ [INCARNATION]]`, in arrival
    /// order; `#` comments (docs/tuning.md). `-` reads standard input.
    #[arg(required_unless_present = "generate")]
    trace: Option<PathBuf>,
    /// A detector to run, e.g. `fixed:timeout_ms=1400` or
    /// `phi:model=normal,threshold=8,window=128,min_std_ms=25,pause_ms=0,first_interval_ms=100`.
    /// Repeat to compare several.
    #[arg(long = "detector", short, value_parser = parse_spec, required_unless_present = "generate")]
    detectors: Vec<monitor::detector::model::DetectorParams>,
    /// Step of the virtual clock, ms.
    #[arg(long, default_value_t = 50.0, value_parser = positive)]
    tick_ms: f64,
    /// How long the clock runs after the last heartbeat (the crash), ms.
    #[arg(long, default_value_t = 6000.0, value_parser = positive)]
    tail_ms: f64,
    /// Print {"detectors": [...]} as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of replaying, write an example trace of this kind to standard output.
    #[arg(long, value_enum, conflicts_with_all = ["trace", "detectors"])]
    generate: Option<TraceKind>,
    /// Heartbeats in a generated trace.
    #[arg(long, default_value_t = 2000, requires = "generate")]
    count: usize,
    /// Seed of a generated trace (the same seed gives the same trace).
    #[arg(long, default_value_t = 1, requires = "generate")]
    seed: u64,
}

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    if let Some(kind) = args.generate {
        print!("{}", generate(kind, args.count, args.seed));
        return Ok(ExitCode::SUCCESS);
    }
    let path = args.trace.expect("required by clap");
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .context("reading the trace from standard input")?
    } else {
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading trace {}", path.display()))?
    };
    let trace = parse_trace(&text).map_err(|(line, message)| match line {
        0 => anyhow::anyhow!("{}: {message}", path.display()),
        n => anyhow::anyhow!("{}:{n}: {message}", path.display()),
    })?;
    let clock = ReplayClock {
        tick_ms: args.tick_ms,
        tail_ms: args.tail_ms,
    };
    let reports: Vec<ReplayReport> = args
        .detectors
        .iter()
        .map(|d| run_replay(&trace, d, clock))
        .collect();
    if args.json {
        println!("{}", serde_json::json!({ "detectors": reports }));
    } else {
        print_table(&reports, trace.len());
    }
    Ok(ExitCode::SUCCESS)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn print_table(reports: &[ReplayReport], heartbeats: usize) {
    println!("{heartbeats} heartbeats; the sender crashes after the last");
    let width = reports
        .iter()
        .map(|r| r.spec.len())
        .max()
        .unwrap_or(8)
        .max(8);
    println!(
        "{:<width$}  {:>6}  {:>9}  {:>10}  {:>9}  {:>9}",
        "DETECTOR", "FALSE", "DETECT_MS", "MISTAKE_MS", "RECUR_MS", "ACCURACY"
    );
    for r in reports {
        println!(
            "{:<width$}  {:>6}  {:>9}  {:>10.0}  {:>9}  {:>9.6}",
            r.spec,
            r.false_suspicions,
            opt(r.detection_ms),
            r.mistake_ms,
            opt(r.mistake_recurrence_ms),
            r.query_accuracy
        );
    }
}
