//! `monitor replay -d budget:ms=B` on every trace of the corpus: the generated kinds (3000
//! heartbeats, seed 1) and the recorded traces under tests/traces/.
//! At every budget the detector's own mean detection time (over crash times, exact) is within
//! 0.9 B and B (where the sender's own schedule allows it: `slowdown` below 250 ms is held to
//! few false suspicions instead), the crash at the end is detected, and it is scored on the same clock as the
//! fixed timeout of the same budget. How it compares with every family's frontier is
//! docs/tuning.md's table ("A detection budget, met per peer"), not asserted here: that is a
//! target with misses, and a test that asserts it would have to be weakened to pass.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

const BUDGETS_MS: [f64; 6] = [150.0, 200.0, 300.0, 500.0, 1000.0, 1500.0];
/// The interval `slowdown` moves to for good, halfway: a budget below it cannot be met
/// (docs/tuning.md, "A budget the peer's schedule cannot meet").
const SLOWDOWN_PERIOD_MS: f64 = 250.0;
/// Every generated kind. `asymmetric-loss` was left out while its mean detection time went
/// up to 1.29 B (the split of the aim made for the kernel counters' share of heartbeats inside
/// bursts, which lags a loss that starts and stays); the split now waits for bursts and leaves
/// steady loss to the one aim (docs/tuning.md, "Generated kinds over 20 seeds").
const GENERATED: [&str; 11] = [
    "lan",
    "wan",
    "gc-pause",
    "restart",
    "bursty",
    "jitter-change",
    "pareto",
    "slowdown",
    "clock-step",
    "asymmetric-loss",
    "congested-link",
];

fn monitor(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_monitor"))
        .args(args)
        .output()
        .expect("running the monitor binary");
    assert!(
        out.status.success(),
        "monitor {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The corpus as (name, path); generated traces are written into a directory of this test's
/// own, removed at the end.
struct Corpus {
    dir: PathBuf,
    traces: Vec<(String, String)>,
}

impl Corpus {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("budget-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut traces = Vec::new();
        for kind in GENERATED {
            let text = monitor(&[
                "replay",
                "--generate",
                kind,
                "--count",
                "3000",
                "--seed",
                "1",
            ]);
            let path = dir.join(format!("{kind}.trace"));
            std::fs::write(&path, text).unwrap();
            traces.push((format!("{kind} (generated)"), path.display().to_string()));
        }
        let recorded = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/traces");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&recorded)
            .expect("tests/traces exists")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "trace"))
            .collect();
        files.sort();
        assert!(files.len() >= 6, "the recorded corpus: {files:?}");
        for path in files {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            traces.push((format!("{name} (recorded)"), path.display().to_string()));
        }
        Self { dir, traces }
    }
}

impl Drop for Corpus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn every_corpus_trace_meets_every_budget() {
    let corpus = Corpus::new();
    for (name, path) in &corpus.traces {
        let mut args = vec![
            "replay".to_string(),
            path.clone(),
            "--tick-ms".into(),
            "10".into(),
            "--json".into(),
        ];
        for budget in BUDGETS_MS {
            args.push("-d".into());
            args.push(format!("budget:ms={budget}"));
            args.push("-d".into());
            args.push(format!("fixed:timeout_ms={budget}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report: Value = serde_json::from_str(&monitor(&args)).unwrap();
        let detectors = report["detectors"].as_array().unwrap();
        assert_eq!(detectors.len(), 2 * BUDGETS_MS.len());
        for (pair, budget) in detectors.chunks(2).zip(BUDGETS_MS) {
            let (ours, fixed) = (&pair[0], &pair[1]);
            assert!(
                ours["spec"].as_str().unwrap().starts_with("budget:"),
                "{ours}"
            );
            let mean = ours["mean_detection_ms"].as_f64().unwrap();
            let false_suspicions = ours["false_suspicions"].as_u64().unwrap();
            if name.starts_with("slowdown ") && budget < SLOWDOWN_PERIOD_MS {
                // The sender's second half comes every 250 ms: no deadline meets a shorter
                // budget without convicting the live sender at each of its 1500 slow
                // heartbeats (1425 at 200 ms before the detector said so). It is convicted
                // just past its schedule there instead: a handful of false suspicions (the
                // first slow heartbeats, before most of the last 8 intervals are slow), and
                // a mean of the budget over the first half and at most 1.1 periods over the
                // second.
                assert!(
                    false_suspicions <= 30,
                    "{name}, budget {budget} ms (unmet): {false_suspicions} false suspicions"
                );
                let most = (budget + 1.1 * SLOWDOWN_PERIOD_MS) / 2.0;
                assert!(
                    (0.9 * budget..=most).contains(&mean),
                    "{name}, budget {budget} ms (unmet): mean detection {mean} ms"
                );
            } else {
                assert!(
                    (0.9 * budget..=budget).contains(&mean),
                    "{name}, budget {budget} ms: mean detection {mean} ms"
                );
            }
            let p99 = ours["p99_detection_ms"].as_f64().unwrap();
            assert!(p99.is_finite() && p99 >= mean * 0.5, "{name}: p99 {p99}");
            let detected = ours["detection_ms"].as_f64();
            assert!(
                detected.is_some_and(|d| d > 0.0),
                "{name}, budget {budget}: the crash at the end was not detected"
            );
            // The fixed timeout of the budget, replayed beside it on the same clock, is
            // exactly the budget.
            assert_eq!(fixed["mean_detection_ms"].as_f64(), Some(budget), "{fixed}");
            println!(
                "{name:28} budget {budget:6}: false {:4} (fixed {:4}), mean detection {mean:7.1} ms, p99 {p99:7.1} ms",
                ours["false_suspicions"], fixed["false_suspicions"]
            );
        }
    }
}
