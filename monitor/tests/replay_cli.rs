//! `monitor replay` as a command, without root or an agent: generated traces, several traces at
//! once, and `--frontier` with its JSON and SVG.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

fn monitor(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_monitor"))
        .args(args)
        .output()
        .expect("running the monitor binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A directory of this test's own, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn generated(&self, kind: &str, count: &str) -> String {
        let (ok, trace, err) = monitor(&["replay", "--generate", kind, "--count", count]);
        assert!(ok, "{err}");
        let path = self.0.join(format!("{kind}.trace"));
        std::fs::write(&path, trace).unwrap();
        path.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn frontier_json_and_svg() {
    let dir = Scratch::new("replay-frontier");
    let lan = dir.generated("lan", "500");
    let wan = dir.generated("wan", "500");
    let svg = dir.0.join("frontier.svg");
    let (ok, out, err) = monitor(&[
        "replay",
        &lan,
        &wan,
        "--frontier",
        "-d",
        "fixed",
        "-d",
        "phi",
        "--json",
        "--svg",
        &svg.display().to_string(),
    ]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).expect("JSON on stdout");
    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[0]["trace"].as_str(), Some(lan.as_str()));
    for trace in traces {
        let families = trace["families"].as_array().unwrap();
        let names: Vec<&str> = families
            .iter()
            .map(|f| f["family"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["fixed", "phi"]);
        assert_eq!(families[0]["knob"], "timeout_ms");
        assert_eq!(families[1]["knob"], "threshold");
        for family in families {
            let points = family["points"].as_array().unwrap();
            assert!(!points.is_empty(), "empty frontier: {family}");
            let coords: Vec<(f64, u64)> = points
                .iter()
                .map(|p| {
                    let accuracy = p["query_accuracy"].as_f64().unwrap();
                    assert!((0.0..=1.0).contains(&accuracy), "{p}");
                    assert!(p["mistakes_per_hour"].as_f64().unwrap() >= 0.0, "{p}");
                    (
                        p["detection_ms"].as_f64().unwrap(),
                        p["false_suspicions"].as_u64().unwrap(),
                    )
                })
                .collect();
            for (i, a) in coords.iter().enumerate() {
                for (j, b) in coords.iter().enumerate() {
                    let dominates = a.0 <= b.0 && a.1 <= b.1 && (a.0 < b.0 || a.1 < b.1);
                    assert!(
                        i == j || (!dominates && a != b),
                        "{a:?} vs {b:?} in {family}"
                    );
                }
            }
            // By detection time, so false suspicions fall along it.
            assert!(
                coords
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 > w[1].1)
            );
        }
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(text.contains("fixed (timeout_ms)") && text.contains("phi (threshold)"));

    // The table form: one block per trace and family.
    let (ok, table, err) = monitor(&["replay", &lan, "--frontier", "-d", "fixed"]);
    assert!(ok, "{err}");
    assert!(
        table.contains("TIMEOUT_MS") && table.contains("on the frontier"),
        "{table}"
    );
}

#[test]
fn frontier_without_families_sweeps_the_defaults_and_rejects_bad_ones() {
    let dir = Scratch::new("replay-defaults");
    let lan = dir.generated("lan", "300");
    let (ok, out, err) = monitor(&["replay", &lan, "--frontier", "--json"]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    let families: Vec<&str> = report["traces"][0]["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["family"].as_str().unwrap())
        .collect();
    for f in [
        "fixed",
        "phi:model=normal",
        "phi:model=akka",
        "phi:model=exponential",
    ] {
        assert!(families.contains(&f), "{f} missing from {families:?}");
    }
    let (ok, _, err) = monitor(&["replay", &lan, "--frontier", "-d", "phi:model=gauss"]);
    assert!(!ok);
    assert!(err.contains("gauss"), "{err}");
    let (ok, _, err) = monitor(&["replay", &lan, "-d", "phi", "--svg", "x.svg"]);
    assert!(!ok && err.contains("--frontier"), "{err}");
}

#[test]
fn several_traces_without_frontier_give_one_report_each() {
    let dir = Scratch::new("replay-many");
    let lan = dir.generated("lan", "300");
    let wan = dir.generated("wan", "300");
    let (ok, out, err) = monitor(&["replay", &lan, &wan, "-d", "phi", "-d", "fixed", "--json"]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[1]["trace"].as_str(), Some(wan.as_str()));
    assert_eq!(traces[1]["detectors"].as_array().unwrap().len(), 2);
    // One trace keeps the older shape.
    let (ok, out, _) = monitor(&["replay", &lan, "-d", "phi", "--json"]);
    assert!(ok);
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["detectors"].as_array().unwrap().len(), 1);
    let (ok, table, _) = monitor(&["replay", &lan, &wan, "-d", "phi"]);
    assert!(ok);
    assert!(table.contains(&format!("== {wan}")), "{table}");
}

/// The corpus of real traces under tests/traces/ (made by `cargo xtask traces`) stays valid
/// input: every file is one of the recorded scenarios, says in its header how it was made,
/// parses, and replays with the crash at its end detected.
#[test]
fn the_recorded_corpus_replays() {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/traces");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .expect("tests/traces exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    traces.sort();
    let names: Vec<String> = traces
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "jitter",
        "congestion",
        "bursty-loss",
        "cpu-starved",
        "restart",
        "path-change",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    for path in &traces {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with("# made by `cargo xtask traces")),
            "{}: no command in the header",
            path.display()
        );
        let file = path.display().to_string();
        let (ok, out, err) = monitor(&[
            "replay",
            &file,
            "-d",
            "phi",
            "-d",
            "fixed:timeout_ms=1000",
            "--json",
        ]);
        assert!(ok, "{file}: {err}");
        let report: Value = serde_json::from_str(&out).unwrap();
        for d in report["detectors"].as_array().unwrap() {
            assert!(d["detection_ms"].as_f64().is_some(), "{file}: {d}");
        }
        let arrivals = text.lines().filter(|l| !l.starts_with('#')).count();
        assert!(arrivals >= 1000, "{file}: only {arrivals} arrivals");
    }
}
