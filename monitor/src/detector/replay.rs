//! Offline replay: the agent's detectors run on a trace of heartbeat arrivals, on a virtual
//! clock, with the quality of each reported (Chen, Toueg and Aguilera 2002).
//!
//! Semantics (docs/tuning.md): the clock starts at 0, the peer's registration, which counts as
//! last heard but not as an interval sample. It advances by `tick`; at each tick, first every
//! heartbeat with time <= tick is delivered in order, then each detector is asked whether the
//! peer is suspected. The sender is alive up to its last heartbeat and crashed right after.

use serde::Serialize;

use super::{
    model::{DetectorParams, Model},
    spec::format_spec,
    window::IntervalWindow,
};

/// Parses a trace: one arrival time in ms per line, ascending; blank lines and lines starting
/// with `#` ignored. Errors carry the line number.
pub fn parse_trace(text: &str) -> Result<Vec<f64>, (usize, String)> {
    let mut times: Vec<f64> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let t: f64 = line
            .parse()
            .map_err(|_| (n + 1, format!("{line:?} is not a time in milliseconds")))?;
        if !t.is_finite() || t < 0.0 {
            return Err((
                n + 1,
                format!("{line:?}: times must be finite and not negative"),
            ));
        }
        if let Some(&prev) = times.last()
            && t < prev
        {
            return Err((
                n + 1,
                format!("{t} comes after {prev}: times must be ascending"),
            ));
        }
        times.push(t);
    }
    if times.is_empty() {
        return Err((0, "the trace holds no heartbeat".into()));
    }
    Ok(times)
}

/// What one detector did on a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub spec: String,
    /// Suspicion episodes while the sender was alive.
    pub false_suspicions: u64,
    /// First suspected tick after the crash minus the last heartbeat; None if never.
    pub detection_ms: Option<f64>,
    /// Total time wrongly suspected: for each episode, the heartbeat that ended it minus the
    /// tick that began it.
    pub mistake_ms: f64,
    /// Mean time between the starts of consecutive mistakes; None with fewer than two.
    pub mistake_recurrence_ms: Option<f64>,
    /// 1 - mistake_ms / (time alive, 0 to the last heartbeat).
    pub query_accuracy: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct ReplayClock {
    pub tick_ms: f64,
    pub tail_ms: f64,
}

impl Default for ReplayClock {
    fn default() -> Self {
        Self {
            tick_ms: 50.0,
            tail_ms: 6000.0,
        }
    }
}

/// Runs one detector over the trace (times in ms, ascending, non-empty).
pub fn replay(trace: &[f64], params: &DetectorParams, clock: ReplayClock) -> ReplayReport {
    // Integer microseconds throughout, as in the kernel: no drift from summing float ticks.
    let us = |ms: f64| (ms * 1000.0).round() as u64;
    let arrivals: Vec<u64> = trace.iter().map(|&t| us(t)).collect();
    let last_heartbeat = *arrivals.last().expect("non-empty trace");
    let tick = us(clock.tick_ms).max(1);
    let end = last_heartbeat + us(clock.tail_ms);

    let mut window = IntervalWindow::new(params.window, params.max_interval_ms.map(us));
    let mut estimate = params.estimate(window.sums());
    let mut last_heard = 0u64;
    let mut heard_any = false;
    let mut next = 0usize;
    let mut suspected_since: Option<u64> = None;

    let mut false_suspicions = 0u64;
    let mut mistake_us = 0u64;
    let mut mistake_starts: Vec<u64> = Vec::new();
    let mut detection: Option<u64> = None;

    let mut now = 0u64;
    while now <= end {
        while next < arrivals.len() && arrivals[next] <= now {
            let at = arrivals[next];
            if heard_any {
                window.push(at - last_heard);
                estimate = params.estimate(window.sums());
            }
            heard_any = true;
            last_heard = at;
            next += 1;
            if let Some(since) = suspected_since.take() {
                mistake_us += at - since;
            }
        }
        let silence_ms = (now - last_heard) as f64 / 1000.0;
        let suspected = match params.model {
            Model::Fixed => silence_ms >= params.timeout_ms,
            _ => params.phi(&estimate, silence_ms) >= params.threshold,
        };
        if suspected && suspected_since.is_none() {
            suspected_since = Some(now);
            if next < arrivals.len() {
                false_suspicions += 1;
                mistake_starts.push(now);
            } else if detection.is_none() {
                detection = Some(now - last_heartbeat);
            }
        }
        now += tick;
    }

    let recurrence = (mistake_starts.len() >= 2).then(|| {
        let span = mistake_starts[mistake_starts.len() - 1] - mistake_starts[0];
        span as f64 / 1000.0 / (mistake_starts.len() - 1) as f64
    });
    ReplayReport {
        spec: format_spec(params),
        false_suspicions,
        detection_ms: detection.map(|d| d as f64 / 1000.0),
        mistake_ms: mistake_us as f64 / 1000.0,
        mistake_recurrence_ms: recurrence,
        query_accuracy: if last_heartbeat == 0 {
            1.0
        } else {
            1.0 - mistake_us as f64 / last_heartbeat as f64
        },
    }
}

/// Kinds of example traces `--generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceKind {
    /// 100 ms heartbeats, 2 ms of Gaussian jitter.
    Lan,
    /// 100 ms heartbeats over a path with 40 ms base delay, exponential extra delay (mean
    /// 15 ms), delay spikes and 0.5% loss.
    Wan,
    /// LAN heartbeats from a sender that stops the world for 0.8-2 s every 20-40 s.
    GcPause,
}

/// Writes an example trace of `count` heartbeats (as text, with a comment header).
pub fn generate(kind: TraceKind, count: usize, seed: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    let gaussian = |rng: &mut fastrand::Rng| {
        // Box-Muller.
        let (u1, u2) = (rng.f64().max(f64::MIN_POSITIVE), rng.f64());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let interval = 100.0;
    let mut times: Vec<f64> = Vec::with_capacity(count);
    let header = match kind {
        TraceKind::Lan => {
            for k in 0..count {
                times.push(interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng));
            }
            "LAN: 100 ms heartbeats, N(0, 2 ms) jitter"
        }
        TraceKind::Wan => {
            for k in 0..count {
                if rng.f64() < 0.005 {
                    continue;
                }
                let mut delay = 40.0 - 15.0 * (1.0 - rng.f64()).ln();
                if rng.f64() < 0.01 {
                    delay += 200.0 + 400.0 * rng.f64();
                }
                times.push(interval * (k + 1) as f64 + delay);
            }
            "WAN: 100 ms heartbeats, 40 ms + Exp(15 ms) delay, 1% spikes of 200-600 ms, 0.5% loss"
        }
        TraceKind::GcPause => {
            let mut t = 0.0;
            let mut next_pause = 20_000.0 + 20_000.0 * rng.f64();
            while times.len() < count {
                t += interval;
                if t >= next_pause {
                    // The sender is frozen: nothing is sent until the pause ends.
                    t += 800.0 + 1200.0 * rng.f64();
                    next_pause = t + 20_000.0 + 20_000.0 * rng.f64();
                }
                times.push(t + 2.0 * gaussian(&mut rng));
            }
            "GC pauses: 100 ms heartbeats, N(0, 2 ms) jitter, a 0.8-2 s stop every 20-40 s"
        }
    };
    times.sort_by(f64::total_cmp);
    let mut out = format!(
        "# {header}\n# {} heartbeats, seed {seed}; arrival times in ms; the sender crashes after the last\n",
        times.len()
    );
    for t in times {
        out.push_str(&format!("{:.3}\n", t.max(0.0)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::spec::parse_spec;

    fn run(trace: &[f64], spec: &str, tick_ms: f64, tail_ms: f64) -> ReplayReport {
        replay(
            trace,
            &parse_spec(spec).unwrap(),
            ReplayClock { tick_ms, tail_ms },
        )
    }

    #[test]
    fn trace_parsing() {
        assert_eq!(
            parse_trace("# c\n\n100\n200.5\n 300 \n"),
            Ok(vec![100.0, 200.0 + 0.5, 300.0])
        );
        assert_eq!(parse_trace("100\nx\n").unwrap_err().0, 2);
        assert_eq!(parse_trace("100\n50\n").unwrap_err().0, 2);
        assert_eq!(parse_trace("-5\n").unwrap_err().0, 1);
        assert!(parse_trace("# nothing\n").is_err());
    }

    #[test]
    fn fixed_timeout_by_hand() {
        // Heartbeats at 100..=1000 every 100 ms, then a 600 ms gap, then 1700 and 1800.
        let mut trace: Vec<f64> = (1..=10).map(|k| k as f64 * 100.0).collect();
        trace.extend([1700.0, 1800.0]);
        let r = run(&trace, "fixed:timeout_ms=250", 50.0, 1000.0);
        // Alive gap 1000 -> 1700: silence reaches 250 at tick 1250, suspected until the
        // heartbeat at 1700: one mistake of 450 ms.
        assert_eq!(r.false_suspicions, 1);
        assert_eq!(r.mistake_ms, 450.0);
        assert_eq!(r.mistake_recurrence_ms, None);
        // Crash after 1800: suspected at tick 2050.
        assert_eq!(r.detection_ms, Some(250.0));
        assert!((r.query_accuracy - (1.0 - 450.0 / 1800.0)).abs() < 1e-12);
    }

    #[test]
    fn registration_counts_as_heard_not_as_a_sample() {
        // First heartbeat only at 900: the fixed detector suspects from tick 300 (silence since
        // registration at 0) until 900, a mistake of 600 ms.
        let r = run(&[900.0, 1000.0], "fixed:timeout_ms=300", 100.0, 500.0);
        assert_eq!((r.false_suspicions, r.mistake_ms), (1, 600.0));
        assert_eq!(r.detection_ms, Some(300.0));
    }

    #[test]
    fn two_mistakes_give_a_recurrence_time() {
        let trace = [100.0, 200.0, 900.0, 1000.0, 1700.0, 1800.0];
        let r = run(&trace, "fixed:timeout_ms=300", 100.0, 400.0);
        // Gaps 200->900 and 1000->1700: suspected at ticks 500 and 1300, for 400 ms each.
        assert_eq!((r.false_suspicions, r.mistake_ms), (2, 800.0));
        assert_eq!(r.mistake_recurrence_ms, Some(800.0));
        assert_eq!(r.detection_ms, Some(300.0));
    }

    #[test]
    fn never_detected_within_the_tail() {
        let r = run(&[100.0, 200.0], "fixed:timeout_ms=5000", 50.0, 1000.0);
        assert_eq!(r.detection_ms, None);
    }

    #[test]
    fn phi_on_a_steady_trace_detects_quickly_without_mistakes() {
        // Exactly periodic at 100 ms with a 10 ms floor on the deviation: the crossing of
        // phi = 8 is at mean + 5.612 std = 156.12 ms of silence, first tick at or after it
        // (ticks every 10 ms, last heartbeat at 5000): 160 ms.
        let trace: Vec<f64> = (1..=50).map(|k| k as f64 * 100.0).collect();
        let r = run(
            &trace,
            "phi:model=normal,threshold=8,min_std_ms=10,first_interval_ms=100",
            10.0,
            2000.0,
        );
        assert_eq!(r.false_suspicions, 0);
        assert_eq!(r.detection_ms, Some(160.0));
        assert_eq!(r.query_accuracy, 1.0);
    }

    #[test]
    fn generated_traces_parse_and_are_reproducible() {
        for kind in [TraceKind::Lan, TraceKind::Wan, TraceKind::GcPause] {
            let a = generate(kind, 500, 7);
            assert_eq!(a, generate(kind, 500, 7));
            let times = parse_trace(&a).unwrap();
            assert!(times.len() >= 480, "{kind:?}: {}", times.len());
        }
    }
}
