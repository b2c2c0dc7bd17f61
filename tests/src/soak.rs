//! A soak run: many peers with churn (peers going silent and coming back) for a long time, and
//! the checks that matter afterwards: every death detected at the top level, no steady peer
//! ever suspected at it, no slot leaked, no heartbeat lost, and the agent still there.

use std::{
    collections::HashMap,
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use monitor::{
    peer::loadgen::{ChurnSchedule, LoadgenReport},
    serving::client::Client,
};
use serde::Serialize;
use serde_json::{Value, json};

/// Top-level suspicions and recoveries seen by a subscriber, per peer.
#[derive(Debug, Default)]
pub struct Seen {
    /// crossed_at (Unix ms) of every suspicion at the top level.
    pub top: HashMap<u64, Vec<f64>>,
    pub recovers: HashMap<u64, u64>,
    pub lagged: u64,
    pub events: u64,
}

/// Subscribes and records events on a thread until `stop`.
pub fn watch(
    socket: &Path,
    top_level: f64,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Seen>>, std::thread::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut client = Client::connect(socket).expect("connect");
    let reply = client
        .request(&json!({"op": "subscribe"}))
        .expect("subscribe");
    assert_eq!(reply["ok"], json!(true));
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let handle = std::thread::spawn({
        let seen = seen.clone();
        move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(line) = client.read_line() else {
                    continue;
                };
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut seen = seen.lock().unwrap();
                seen.events += 1;
                let id = event["id"].as_u64().unwrap_or(0);
                match event["event"].as_str() {
                    Some("suspect") if event["level"].as_f64() == Some(top_level) => {
                        seen.top
                            .entry(id)
                            .or_default()
                            .push(event["crossed_at"].as_f64().unwrap_or(0.0));
                    }
                    Some("recover") => *seen.recovers.entry(id).or_default() += 1,
                    Some("lagged") => seen.lagged += event["missed"].as_u64().unwrap_or(0),
                    _ => {}
                }
            }
        }
    });
    (seen, handle)
}

#[derive(Debug, Clone, Serialize)]
pub struct SoakVerdict {
    /// Silent periods of churning peers fully inside the checked window.
    pub deaths: u64,
    pub detected: u64,
    /// A few undetected (peer, period start, period end, that peer's top-level crossings).
    pub missed: Vec<(u64, f64, f64, Vec<f64>)>,
    /// Steady peers suspected at the top level inside the checked window.
    pub steady_suspected: Vec<u64>,
    pub recoveries: u64,
    pub lagged: u64,
    pub events: u64,
}

impl SoakVerdict {
    pub fn ok(&self) -> bool {
        self.detected == self.deaths && self.steady_suspected.is_empty() && self.lagged == 0
    }
}

/// Checks `seen` against the churn schedule over [from, to] (Unix ms): every silent period of
/// a churning peer inside it has a top-level suspicion, and no steady peer has one.
pub fn verify(report: &LoadgenReport, seen: &Seen, from_ms: f64, to_ms: f64) -> SoakVerdict {
    let churn: &ChurnSchedule = report.churn.as_ref().expect("a churn schedule");
    let period_ms = churn.period_s * 1000.0;
    let mut deaths = 0;
    let mut detected = 0;
    let mut missed = Vec::new();
    let first_epoch = ((from_ms - churn.start_unix_ms) / period_ms)
        .ceil()
        .max(0.0) as u64;
    let mut epoch = first_epoch;
    loop {
        let start = churn.start_unix_ms + epoch as f64 * period_ms;
        let end = start + period_ms;
        if end > to_ms {
            break;
        }
        for c in 0..churn.churners {
            let id = churn.first_churning_id + c;
            if !churn.silent(id, (start - churn.start_unix_ms) / 1000.0 + 1e-6) {
                continue;
            }
            deaths += 1;
            let found = seen
                .top
                .get(&id)
                .is_some_and(|times| times.iter().any(|&t| t >= start && t <= end));
            if found {
                detected += 1;
            } else if missed.len() < 5 {
                missed.push((
                    id,
                    start,
                    end,
                    seen.top.get(&id).cloned().unwrap_or_default(),
                ));
            }
        }
        epoch += 1;
    }
    let mut steady_suspected: Vec<u64> = seen
        .top
        .iter()
        .filter(|(id, times)| {
            **id >= report.first_id
                && **id < churn.first_churning_id
                && times.iter().any(|&t| t >= from_ms && t <= to_ms)
        })
        .map(|(id, _)| *id)
        .collect();
    steady_suspected.sort_unstable();
    SoakVerdict {
        deaths,
        detected,
        missed,
        steady_suspected,
        recoveries: seen.recovers.values().sum(),
        lagged: seen.lagged,
        events: seen.events,
    }
}

/// Runs `monitor loadgen` in namespace `ns` and returns its report.
pub fn loadgen(monitor: &Path, ns: &str, args: &[String]) -> LoadgenReport {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(monitor)
        .arg("loadgen")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("spawn loadgen");
    assert!(
        out.status.success(),
        "loadgen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("loadgen report")
}

pub fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
