use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::atomic::{AtomicUsize, Ordering},
};

use anyhow::Context;
use clap::Args;
use monitor::{
    detector::{model::DetectorParams, spec::parse_spec},
    offline::{
        frontier::{self, Point, Sweep},
        generate::{TraceKind, generate},
        plot,
        replay::{ReplayClock, ReplayReport, replay as run_replay},
        trace::{Arrival, parse_trace},
    },
};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Trace files: one heartbeat arrival per line, `TIME_MS [SEQ [INCARNATION]]`, in arrival
    /// order; `#` comments (docs/tuning.md). `-` reads standard input. Several traces give one
    /// report each.
    #[arg(required_unless_present = "generate")]
    traces: Vec<PathBuf>,
    /// A detector to run, e.g. `fixed:timeout_ms=1400` or
    /// `phi:model=normal,threshold=8,window=128,min_std_ms=25,pause_ms=0,first_interval_ms=100`.
    /// Repeat to compare several. With --frontier, a family: its swept knob is set over a grid.
    #[arg(long = "detector", short, value_name = "SPEC", value_parser = spec_text,
          required_unless_present_any = ["generate", "frontier"])]
    detectors: Vec<String>,
    /// Sweep each detector family's knob and report its Pareto frontier over (mean detection
    /// time over crash times, false suspicions). Knobs and grids, relative to each trace's
    /// median interval M: `fixed:` sweeps timeout_ms over 1.05M..20M; `phi:model=chen|bertier`
    /// sweep alpha_ms over 0 and 0.01M..10M; every other `phi:` model sweeps threshold over
    /// 0.5..64; 60 settings each, geometric. Without -d: fixed and every phi model the build
    /// knows.
    #[arg(long, conflicts_with = "generate")]
    frontier: bool,
    /// With --frontier, also read every family's frontier at these detection budgets (ms,
    /// comma-separated): the fewest false suspicions it makes with a mean detection time
    /// within each budget.
    #[arg(long, requires = "frontier", value_delimiter = ',', value_name = "MS",
          default_values_t = frontier::DEFAULT_BUDGETS_MS, value_parser = budget)]
    budgets: Vec<f64>,
    /// Draw the frontiers into this SVG file: false suspicions per hour (log, 0 at the bottom)
    /// against detection time, one panel per trace, one curve per family.
    #[arg(long, requires = "frontier", value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Step of the virtual clock, ms [default: 50; 10 with --frontier]. 0 scores in
    /// continuous time: each suspicion at the exact silence where phi reaches the threshold
    /// (a mistake if the next heartbeat comes later), one computation a heartbeat instead of
    /// one a tick.
    #[arg(long, value_parser = non_negative)]
    tick_ms: Option<f64>,
    /// How long the clock runs after the last heartbeat (the crash), ms.
    #[arg(long, default_value_t = 6000.0, value_parser = positive)]
    tail_ms: f64,
    /// Print JSON instead of tables: {"detectors": [...]} for one trace, {"traces": [{"trace",
    /// "detectors"}]} for several; with --frontier {"traces": [{"trace", "families":
    /// [{"family", "knob", "points"}]}]}.
    #[arg(long)]
    json: bool,
    /// Instead of replaying, write an example trace of this kind to standard output.
    #[arg(long, value_enum, conflicts_with_all = ["traces", "detectors"])]
    generate: Option<TraceKind>,
    /// Heartbeats in a generated trace.
    #[arg(long, default_value_t = 2000, requires = "generate")]
    count: usize,
    /// Seed of a generated trace (the same seed gives the same trace).
    #[arg(long, default_value_t = 1, requires = "generate")]
    seed: u64,
}

/// Families swept by `--frontier` without `-d`; those the build's `parse_spec` refuses are
/// left out.
const DEFAULT_FAMILIES: [&str; 9] = [
    "fixed",
    "phi:model=normal",
    "phi:model=akka",
    "phi:model=exponential",
    "phi:model=loss",
    "phi:model=chen",
    "phi:model=bertier",
    "phi:model=empirical",
    "phi:model=2w",
];

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number >= 0")),
    }
}

/// A detector spec, checked, kept as text (a frontier family is extended by its knob).
fn budget(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: a budget is a positive number of milliseconds"
        )),
    }
}

fn spec_text(text: &str) -> Result<String, String> {
    parse_spec(text)?;
    Ok(text.trim().to_string())
}

struct LoadedTrace {
    name: String,
    arrivals: Vec<Arrival>,
}

fn load(path: &Path) -> anyhow::Result<LoadedTrace> {
    let stdin = path.as_os_str() == "-";
    let text = if stdin {
        std::io::read_to_string(std::io::stdin())
            .context("reading the trace from standard input")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading trace {}", path.display()))?
    };
    let arrivals = parse_trace(&text).map_err(|(line, message)| match line {
        0 => anyhow::anyhow!("{}: {message}", path.display()),
        n => anyhow::anyhow!("{}:{n}: {message}", path.display()),
    })?;
    Ok(LoadedTrace {
        name: if stdin {
            "stdin".into()
        } else {
            path.display().to_string()
        },
        arrivals,
    })
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    if let Some(kind) = args.generate {
        print!("{}", generate(kind, args.count, args.seed));
        return Ok(ExitCode::SUCCESS);
    }
    if args.traces.iter().filter(|p| p.as_os_str() == "-").count() > 1 {
        anyhow::bail!("standard input (`-`) can be read only once");
    }
    let traces = args
        .traces
        .iter()
        .map(|p| load(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let clock = ReplayClock {
        tick_ms: args
            .tick_ms
            .unwrap_or(if args.frontier { 10.0 } else { 50.0 }),
        tail_ms: args.tail_ms,
    };
    if args.frontier {
        return frontiers(&args, &traces, clock);
    }
    let detectors: Vec<DetectorParams> = args
        .detectors
        .iter()
        .map(|d| parse_spec(d).expect("checked by clap"))
        .collect();
    let per_trace: Vec<Vec<ReplayReport>> = traces
        .iter()
        .map(|t| {
            let jobs: Vec<&DetectorParams> = detectors.iter().collect();
            replay_all(&t.arrivals, &jobs, clock)
        })
        .collect();
    if args.json {
        if let [reports] = per_trace.as_slice() {
            println!("{}", serde_json::json!({ "detectors": reports }));
        } else {
            let traces: Vec<_> = traces
                .iter()
                .zip(&per_trace)
                .map(|(t, r)| serde_json::json!({ "trace": t.name, "detectors": r }))
                .collect();
            println!("{}", serde_json::json!({ "traces": traces }));
        }
    } else {
        for (i, (t, reports)) in traces.iter().zip(&per_trace).enumerate() {
            if traces.len() > 1 {
                if i > 0 {
                    println!();
                }
                println!("== {}", t.name);
            }
            print_table(reports, t.arrivals.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Replays each of `jobs` on the trace, on every core (replays are independent), in order.
fn replay_all(
    trace: &[Arrival],
    jobs: &[&DetectorParams],
    clock: ReplayClock,
) -> Vec<ReplayReport> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<ReplayReport>> = vec![None; jobs.len()];
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(params) = jobs.get(i) else { break };
                        done.push((i, run_replay(trace, params, clock)));
                    }
                    done
                })
            })
            .collect();
        for worker in workers {
            for (i, report) in worker.join().expect("a replay panicked") {
                out[i] = Some(report);
            }
        }
    });
    out.into_iter().map(|r| r.expect("every job ran")).collect()
}

#[derive(Serialize)]
struct FamilyFrontier {
    family: String,
    knob: frontier::Knob,
    /// Settings replayed.
    settings: usize,
    /// Settings that never detected the crash within the tail (left out of the frontier).
    undetected: usize,
    /// The frontier, by detection time.
    points: Vec<Point>,
}

/// Every family's fewest false suspicions within one detection budget (`null`: none of its
/// settings detects that fast), in the order of `families`.
#[derive(Serialize)]
struct BudgetRow {
    budget_ms: f64,
    false_suspicions: Vec<Option<u64>>,
}

#[derive(Serialize)]
struct TraceFrontier {
    trace: String,
    heartbeats: usize,
    median_interval_ms: f64,
    alive_ms: f64,
    tick_ms: f64,
    families: Vec<FamilyFrontier>,
    budgets: Vec<BudgetRow>,
}

fn frontiers(
    args: &ReplayArgs,
    traces: &[LoadedTrace],
    clock: ReplayClock,
) -> anyhow::Result<ExitCode> {
    let mut results = Vec::with_capacity(traces.len());
    for t in traces {
        let alive_ms = t.arrivals.last().expect("non-empty trace").at_ms();
        // One heartbeat only: its arrival is the one interval there is.
        let median = frontier::median_interval_ms(&t.arrivals).unwrap_or(if alive_ms > 0.0 {
            alive_ms
        } else {
            100.0
        });
        let sweeps: Vec<Sweep> = if args.detectors.is_empty() {
            DEFAULT_FAMILIES
                .iter()
                .filter_map(|f| frontier::sweep(f, median).ok())
                .collect()
        } else {
            args.detectors
                .iter()
                .map(|f| frontier::sweep(f, median).map_err(|e| anyhow::anyhow!("-d {f}: {e}")))
                .collect::<anyhow::Result<_>>()?
        };
        let jobs: Vec<&DetectorParams> = sweeps
            .iter()
            .flat_map(|s| s.settings.iter().map(|(_, p)| p))
            .collect();
        let mut reports = replay_all(&t.arrivals, &jobs, clock).into_iter();
        let families: Vec<FamilyFrontier> = sweeps
            .iter()
            .map(|s| {
                let points: Vec<Option<Point>> = s
                    .settings
                    .iter()
                    .map(|(value, _)| {
                        let report = reports.next().expect("one report per setting");
                        Point::of(*value, &report, alive_ms)
                    })
                    .collect();
                let undetected = points.iter().filter(|p| p.is_none()).count();
                let detected: Vec<Point> = points.into_iter().flatten().collect();
                FamilyFrontier {
                    family: s.family.clone(),
                    knob: s.knob,
                    settings: s.settings.len(),
                    undetected,
                    points: frontier::pareto(&detected),
                }
            })
            .collect();
        let budgets = args
            .budgets
            .iter()
            .map(|&budget_ms| BudgetRow {
                budget_ms,
                false_suspicions: families
                    .iter()
                    .map(|f: &FamilyFrontier| frontier::within_budget(&f.points, budget_ms))
                    .collect(),
            })
            .collect();
        results.push(TraceFrontier {
            trace: t.name.clone(),
            heartbeats: t.arrivals.len(),
            median_interval_ms: median,
            alive_ms,
            tick_ms: clock.tick_ms,
            families,
            budgets,
        });
    }
    if let Some(path) = &args.svg {
        let panels: Vec<plot::Panel> = results.iter().map(panel).collect();
        let svg = plot::frontier_svg(&panels).map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::json!({ "traces": results }));
    } else {
        for (i, r) in results.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print_frontier(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn panel(r: &TraceFrontier) -> plot::Panel {
    plot::Panel {
        title: format!(
            "{}: {} heartbeats, median interval {:.1} ms, tick {} ms",
            r.trace, r.heartbeats, r.median_interval_ms, r.tick_ms
        ),
        min_rate: frontier::mistakes_per_hour(1, r.alive_ms),
        curves: r
            .families
            .iter()
            .map(|f| plot::Curve {
                label: format!("{} ({})", f.family, f.knob.key()),
                points: f
                    .points
                    .iter()
                    .map(|p| (p.detection_ms, p.mistakes_per_hour))
                    .collect(),
            })
            .collect(),
    }
}

fn print_frontier(r: &TraceFrontier) {
    println!(
        "== {}: {} heartbeats, median interval {:.3} ms, alive {:.1} s, tick {} ms",
        r.trace,
        r.heartbeats,
        r.median_interval_ms,
        r.alive_ms / 1000.0,
        r.tick_ms
    );
    for f in &r.families {
        println!();
        println!(
            "{}: {} of {} settings of {} on the frontier{}",
            f.family,
            f.points.len(),
            f.settings,
            f.knob.key(),
            match f.undetected {
                0 => String::new(),
                n => format!(" ({n} never detected the crash)"),
            }
        );
        println!(
            "  {:>11}  {:>10}  {:>9}  {:>9}  {:>6}  {:>10}  {:>9}  {:>11}",
            f.knob.key().to_uppercase(),
            "TD_MEAN_MS",
            "TD_P99_MS",
            "DETECT_MS",
            "FALSE",
            "MISTAKE_MS",
            "ACCURACY",
            "FALSE_PER_H"
        );
        for p in &f.points {
            println!(
                "  {:>11}  {:>10.1}  {:>9.0}  {:>9.0}  {:>6}  {:>10.0}  {:>9.6}  {:>11.1}",
                p.value,
                p.detection_ms,
                p.p99_detection_ms,
                p.last_detection_ms,
                p.false_suspicions,
                p.mistake_ms,
                p.query_accuracy,
                p.mistakes_per_hour
            );
        }
    }
    print_budgets(r);
}

/// Budgets down, families across (numbered as listed above), fewest false suspicions in the
/// cells; `-` where a family cannot detect that fast.
fn print_budgets(r: &TraceFrontier) {
    if r.budgets.is_empty() {
        return;
    }
    println!();
    println!("fewest false suspicions within a mean detection budget:");
    for (i, f) in r.families.iter().enumerate() {
        println!("  [{}] {}", i + 1, f.family);
    }
    print!("  {:>9}", "BUDGET_MS");
    for i in 0..r.families.len() {
        print!("  {:>6}", format!("[{}]", i + 1));
    }
    println!();
    for row in &r.budgets {
        print!("  {:>9}", row.budget_ms);
        for cell in &row.false_suspicions {
            print!(
                "  {:>6}",
                cell.map_or_else(|| "-".into(), |n| n.to_string())
            );
        }
        println!();
    }
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
        "{:<width$}  {:>6}  {:>9}  {:>10}  {:>9}  {:>10}  {:>9}  {:>9}",
        "DETECTOR",
        "FALSE",
        "DETECT_MS",
        "TD_MEAN_MS",
        "TD_P99_MS",
        "MISTAKE_MS",
        "RECUR_MS",
        "ACCURACY"
    );
    for r in reports {
        println!(
            "{:<width$}  {:>6}  {:>9}  {:>10}  {:>9}  {:>10.0}  {:>9}  {:>9.6}",
            r.spec,
            r.false_suspicions,
            opt(r.detection_ms),
            opt(r.mean_detection_ms),
            opt(r.p99_detection_ms),
            r.mistake_ms,
            opt(r.mistake_recurrence_ms),
            r.query_accuracy
        );
    }
}
