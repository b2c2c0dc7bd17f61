//! Offline replay: the agent's detectors run on a trace of heartbeat arrivals, on a virtual
//! clock, with the quality of each reported (Chen, Toueg and Aguilera 2002).
//!
//! Semantics (docs/tuning.md): the clock starts at 0, the peer's registration, which counts as
//! last heard but not as an interval sample. It advances by `tick`; at each tick, first every
//! heartbeat with time <= tick is delivered in order, then each detector is asked whether the
//! peer is suspected. The sender is alive up to its last heartbeat and crashed right after.
//!
//! Each heartbeat goes through `monitor_common::slot::arrive`, the function the XDP program
//! runs, on a slot of replay's own: duplicates and reordered heartbeats are not arrivals, and
//! the window holds exactly what the kernel's would.

use serde::Serialize;

use monitor_common::{
    maps::PeerSlot,
    slot::{Outcome, arrive, window_intervals},
};

use super::trace::Arrival;
use crate::detector::{
    model::{DetectorParams, Estimate, Model},
    spec::format_spec,
};

/// What one detector did on a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub spec: String,
    /// Suspicion episodes while the sender was alive.
    pub false_suspicions: u64,
    /// First suspected tick after the crash minus the last heartbeat; None if never.
    pub detection_ms: Option<f64>,
    /// Detection time averaged over crash times (Chen, Toueg and Aguilera's T_D): for every
    /// accepted heartbeat, the silence after it at which this detector would suspect if the
    /// sender crashed right then (exact, not rounded to a tick), averaged. None if at some
    /// point it would never suspect. One crash is one sample of a detector whose deadline
    /// moves with its state (a loss burst, a jittery spell); this is the mean over all of them.
    pub mean_detection_ms: Option<f64>,
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

/// Runs one detector over the trace (non-empty, in arrival order).
pub fn replay(trace: &[Arrival], params: &DetectorParams, clock: ReplayClock) -> ReplayReport {
    // Integer nanoseconds throughout, as in the kernel: no drift from summing float ticks.
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let last_heartbeat = trace.last().expect("non-empty trace").at_ns;
    let tick = ns(clock.tick_ms).max(1);
    let end = last_heartbeat + ns(clock.tail_ms);

    let config = params.window_config();
    let mut slot = PeerSlot::admitted(1, 0);
    let estimate_of = |slot: &PeerSlot| {
        if params.needs_ring() {
            let ring: Vec<u32> = window_intervals(slot, config.window).collect();
            params.estimate(&slot.record(), &ring)
        } else {
            params.estimate(&slot.record(), &[])
        }
    };
    let mut estimate = estimate_of(&slot);
    let threshold = params.level_silences(&[params.threshold]);
    let crossing =
        |estimate: &Estimate| params.crossing_ms(&threshold, 0, params.threshold, estimate);
    let mut crossing_sum = 0.0f64;
    let mut next = 0usize;
    let mut suspected_since: Option<u64> = None;

    let mut false_suspicions = 0u64;
    let mut mistake_ns = 0u64;
    let mut mistake_starts: Vec<u64> = Vec::new();
    let mut detection: Option<u64> = None;

    let mut now = 0u64;
    while now <= end {
        while next < trace.len() && trace[next].at_ns <= now {
            let a = trace[next];
            next += 1;
            let outcome = arrive(&mut slot, a.at_ns, a.seq, a.incarnation, &config);
            if !matches!(outcome, Outcome::Accepted { .. }) {
                continue;
            }
            estimate = estimate_of(&slot);
            crossing_sum += crossing(&estimate);
            if let Some(since) = suspected_since.take() {
                mistake_ns += a.at_ns - since;
            }
        }
        let silence_ms = (now - slot.record().last_arrival_ns) as f64 / 1e6;
        let suspected = match params.model {
            Model::Fixed => silence_ms >= params.timeout_ms,
            _ => params.phi(&estimate, silence_ms) >= params.threshold,
        };
        if suspected && suspected_since.is_none() {
            suspected_since = Some(now);
            if next < trace.len() {
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
        span as f64 / 1e6 / (mistake_starts.len() - 1) as f64
    });
    ReplayReport {
        spec: format_spec(params),
        false_suspicions,
        detection_ms: detection.map(|d| d as f64 / 1e6),
        mean_detection_ms: {
            let accepted = slot.record().heartbeats;
            let mean = crossing_sum / accepted.max(1) as f64;
            (accepted > 0 && mean.is_finite()).then_some(mean)
        },
        mistake_ms: mistake_ns as f64 / 1e6,
        mistake_recurrence_ms: recurrence,
        query_accuracy: if last_heartbeat == 0 {
            1.0
        } else {
            1.0 - mistake_ns as f64 / last_heartbeat as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::spec::parse_spec;

    fn run(times: &[f64], spec: &str, tick_ms: f64, tail_ms: f64) -> ReplayReport {
        let trace: Vec<Arrival> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| Arrival {
                at_ns: (t * 1e6) as u64,
                seq: i as u64 + 1,
                incarnation: 1,
            })
            .collect();
        replay(
            &trace,
            &parse_spec(spec).unwrap(),
            ReplayClock { tick_ms, tail_ms },
        )
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
    fn mean_detection_is_averaged_over_crash_times() {
        // A timeout suspects the same silence after every heartbeat.
        let trace: Vec<f64> = (1..=20).map(|k| k as f64 * 100.0).collect();
        let r = run(&trace, "fixed:timeout_ms=250", 50.0, 1000.0);
        assert_eq!(r.mean_detection_ms, Some(250.0));
        // Exponential, mean m: phi = t / (m ln 10), so threshold 1 is crossed at m ln 10.
        // Window 2 and first_interval_ms=200 (bootstrap samples 150 and 250, see
        // window::bootstrap_samples): after the first heartbeat m = 200; after the second the
        // window holds 250 and 100, m = 175; after every later one 100 and 100.
        let r = run(
            &trace,
            "phi:model=exponential,threshold=1,window=2,first_interval_ms=200",
            50.0,
            5000.0,
        );
        let ln10 = std::f64::consts::LN_10;
        let expected = (200.0 + 175.0 + 18.0 * 100.0) * ln10 / 20.0;
        let mean = r.mean_detection_ms.unwrap();
        assert!((mean - expected).abs() < 1e-6, "{mean} vs {expected}");
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

    fn generated(kind: crate::offline::generate::TraceKind) -> Vec<Arrival> {
        let text = crate::offline::generate::generate(kind, 3000, 1);
        crate::offline::trace::parse_trace(&text).unwrap()
    }

    /// The seed document's fixed-vs-phi tables (docs/tuning.md) still reproduce exactly, with
    /// the outage rule off as it was then: (false suspicions, detection ms, mistake ms).
    #[test]
    fn the_seed_tables_reproduce() {
        use crate::offline::generate::TraceKind::*;
        let specs = [
            "fixed:timeout_ms=250",
            "fixed:timeout_ms=1400",
            "phi:min_std_ms=25,outage_factor=0",
            "phi:model=akka,min_std_ms=25,outage_factor=0",
            "phi:model=exponential,min_std_ms=25,outage_factor=0",
            "phi:pause_ms=2000,min_std_ms=25,outage_factor=0",
        ];
        // (false suspicions, detection ms, mistake ms) per spec.
        type Row = (u64, f64, f64);
        let expected: [(_, [Row; 6]); 3] = [
            (
                Lan,
                [
                    (0, 299.0, 0.0),
                    (0, 1449.0, 0.0),
                    (0, 249.0, 0.0),
                    (0, 249.0, 0.0),
                    (0, 1849.0, 0.0),
                    (0, 2249.0, 0.0),
                ],
            ),
            (
                Wan,
                [
                    (1, 295.0, 43.0),
                    (0, 1445.0, 0.0),
                    (1, 295.0, 43.0),
                    (1, 295.0, 43.0),
                    (0, 1845.0, 0.0),
                    (0, 2295.0, 0.0),
                ],
            ),
            (
                GcPause,
                [
                    (9, 293.0, 11605.0),
                    (7, 1443.0, 1628.0),
                    (9, 843.0, 11805.0),
                    (9, 793.0, 11855.0),
                    (1, 2093.0, 89.0),
                    (0, 2843.0, 0.0),
                ],
            ),
        ];
        for (kind, rows) in expected {
            let trace = generated(kind);
            for (spec, (false_suspicions, detection, mistake)) in specs.iter().zip(rows) {
                let r = run_arrivals(&trace, spec);
                assert_eq!(
                    (
                        r.false_suspicions,
                        r.detection_ms.map(f64::round),
                        r.mistake_ms.round()
                    ),
                    (false_suspicions, Some(detection), mistake),
                    "{kind:?} {spec}"
                );
            }
        }
    }

    /// Issue target: after one restart, detection is at most 1.2x the clean figure, by
    /// default, whether the trace carries incarnations or not.
    #[test]
    fn a_restart_does_not_slow_the_next_detection() {
        use crate::offline::generate::TraceKind::{Lan, Restart};
        let clean = run_arrivals(&generated(Lan), "phi").detection_ms.unwrap();
        let restart = generated(Restart);
        let times_only: Vec<Arrival> = restart
            .iter()
            .enumerate()
            .map(|(i, a)| Arrival {
                seq: i as u64 + 1,
                incarnation: 1,
                ..*a
            })
            .collect();
        for trace in [&restart, &times_only] {
            let d = run_arrivals(trace, "phi").detection_ms.unwrap();
            assert!(d <= 1.2 * clean, "{d} ms after a restart, {clean} ms clean");
        }
        // Without the rules the restart's gap widens the window (the 6.6x, measured
        // with the floor of the time, 25 ms).
        let clean = run_arrivals(&generated(Lan), "phi:min_std_ms=25")
            .detection_ms
            .unwrap();
        let old = run_arrivals(&times_only, "phi:min_std_ms=25,outage_factor=0")
            .detection_ms
            .unwrap();
        assert!(old > 5.0 * clean, "{old} vs {clean}");
    }

    fn run_arrivals(trace: &[Arrival], spec: &str) -> ReplayReport {
        replay(trace, &parse_spec(spec).unwrap(), ReplayClock::default())
    }

    #[test]
    fn chen_detects_at_expected_arrival_plus_alpha() {
        // (Chen's model, detector/model/chen.rs, run through replay.)
        // Exactly periodic at 100 ms, ticks every 10 ms: with alpha 50 the freshness point is
        // 150 ms after the last heartbeat (EA = 100), no mistakes while alive.
        let trace: Vec<Arrival> = (1..=50u64)
            .map(|k| Arrival {
                at_ns: k * 100_000_000,
                seq: k,
                incarnation: 1,
            })
            .collect();
        let r = replay(
            &trace,
            &parse_spec("phi:model=chen,alpha_ms=50").unwrap(),
            ReplayClock {
                tick_ms: 10.0,
                tail_ms: 1000.0,
            },
        );
        assert_eq!(r.false_suspicions, 0);
        assert_eq!(r.detection_ms, Some(150.0));
    }
}
