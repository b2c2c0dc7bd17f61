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
    config::XdpConfig,
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
    /// The 99th percentile of those detection times (nearest rank): the slow tail a mean
    /// hides, such as long deadlines given inside loss bursts. None where the mean is.
    pub p99_detection_ms: Option<f64>,
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
    /// Step of the virtual clock; 0 scores in continuous time: a suspicion at the exact
    /// silence where the detector's phi reaches its threshold (`crossing_ms`), a mistake if
    /// the next heartbeat comes later than that.
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
    if clock.tick_ms <= 0.0 {
        return replay_exact(trace, params, clock.tail_ms);
    }
    // Integer nanoseconds throughout, as in the kernel: no drift from summing float ticks.
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let last_heartbeat = trace.last().expect("non-empty trace").at_ns;
    let tick = ns(clock.tick_ms).max(1);
    let end = last_heartbeat + ns(clock.tail_ms);

    let config = params.window_config();
    let mut slot = PeerSlot::admitted(1, 0);
    let mut estimate = slot_estimate(params, &config, &slot, None);
    let threshold = params.level_silences(&[params.threshold]);
    let crossing =
        |estimate: &Estimate| params.crossing_ms(&threshold, 0, params.threshold, estimate);
    let mut crossings: Vec<f64> = Vec::with_capacity(trace.len());
    let mut next = 0usize;
    let mut suspected_since: Option<u64> = None;

    let mut mistakes = Mistakes::default();
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
            estimate = slot_estimate(params, &config, &slot, Some(&estimate));
            crossings.push(crossing(&estimate));
            if let Some(since) = suspected_since.take() {
                mistakes.total_ns += a.at_ns - since;
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
                mistakes.began(now);
            } else if detection.is_none() {
                detection = Some(now - last_heartbeat);
            }
        }
        now += tick;
    }

    let detection_ms = detection.map(|d| d as f64 / 1e6);
    report(params, &mistakes, detection_ms, crossings, last_heartbeat)
}

/// The estimate replay's slot gives: with the window's intervals for the models that need
/// them, after the last one (`previous`, none at registration), as the agent's tracker makes
/// them.
fn slot_estimate(
    params: &DetectorParams,
    config: &XdpConfig,
    slot: &PeerSlot,
    previous: Option<&Estimate>,
) -> Estimate {
    let ring: Vec<u32> = if params.needs_ring() {
        window_intervals(slot, config.window).collect()
    } else {
        Vec::new()
    };
    match previous {
        Some(previous) => params.estimate_after(&slot.record(), &ring, previous),
        None => params.estimate(&slot.record(), &ring),
    }
}

/// The mistakes of one run: how many, when each began (ns), and how long they lasted in all.
#[derive(Debug, Default)]
struct Mistakes {
    count: u64,
    starts: Vec<u64>,
    total_ns: u64,
}

impl Mistakes {
    fn began(&mut self, at_ns: u64) {
        self.count += 1;
        self.starts.push(at_ns);
    }
}

/// What a run of either clock reports: its mistakes, its detection of the crash after the
/// last heartbeat, and the detection time at each accepted heartbeat (`crossings`).
fn report(
    params: &DetectorParams,
    mistakes: &Mistakes,
    detection_ms: Option<f64>,
    crossings: Vec<f64>,
    last_heartbeat: u64,
) -> ReplayReport {
    let (mean_detection_ms, p99_detection_ms) = detection_stats(crossings);
    ReplayReport {
        spec: format_spec(params),
        false_suspicions: mistakes.count,
        detection_ms,
        mean_detection_ms,
        p99_detection_ms,
        mistake_ms: mistakes.total_ns as f64 / 1e6,
        mistake_recurrence_ms: recurrence_ms(&mistakes.starts),
        query_accuracy: if last_heartbeat == 0 {
            1.0
        } else {
            1.0 - mistakes.total_ns as f64 / last_heartbeat as f64
        },
    }
}

/// Mean time between the starts of consecutive mistakes (ns in, ms out).
fn recurrence_ms(starts: &[u64]) -> Option<f64> {
    (starts.len() >= 2).then(|| {
        let span = starts[starts.len() - 1] - starts[0];
        span as f64 / 1e6 / (starts.len() - 1) as f64
    })
}

/// The mean and the 99th percentile (nearest rank) of the detection times over crash times,
/// one per accepted heartbeat; None if there is none or one is infinite.
fn detection_stats(mut crossings: Vec<f64>) -> (Option<f64>, Option<f64>) {
    if crossings.is_empty() || crossings.iter().any(|c| !c.is_finite()) {
        return (None, None);
    }
    let mean = crossings.iter().sum::<f64>() / crossings.len() as f64;
    crossings.sort_by(f64::total_cmp);
    let rank = (0.99 * crossings.len() as f64).ceil() as usize;
    (
        Some(mean),
        Some(crossings[rank.clamp(1, crossings.len()) - 1]),
    )
}

/// `replay` in continuous time (tick 0). Every model's phi only grows with the silence until
/// the next heartbeat, so the detector suspects exactly at its crossing: a mistake if the
/// next accepted heartbeat comes later (a heartbeat at the crossing itself is in time, as a
/// heartbeat due at a tick is delivered before the tick's check), the crash detected at the
/// last heartbeat's crossing. One crossing a heartbeat, no clock: far faster than ticks.
fn replay_exact(trace: &[Arrival], params: &DetectorParams, tail_ms: f64) -> ReplayReport {
    let last_heartbeat = trace.last().expect("non-empty trace").at_ns;
    let config = params.window_config();
    let mut slot = PeerSlot::admitted(1, 0);
    let threshold = params.level_silences(&[params.threshold]);
    let crossing =
        |estimate: &Estimate| params.crossing_ms(&threshold, 0, params.threshold, estimate);
    // Registration counts as heard; its silence is judged by the first estimate.
    let mut estimate = slot_estimate(params, &config, &slot, None);
    let (mut since_ns, mut deadline_ms) = (0u64, crossing(&estimate));
    let mut crossings: Vec<f64> = Vec::with_capacity(trace.len());
    let mut mistakes = Mistakes::default();
    for a in trace {
        let outcome = arrive(&mut slot, a.at_ns, a.seq, a.incarnation, &config);
        if !matches!(outcome, Outcome::Accepted { .. }) {
            continue;
        }
        let silence_ms = (a.at_ns - since_ns) as f64 / 1e6;
        if silence_ms > deadline_ms {
            let start = since_ns + (deadline_ms * 1e6).ceil() as u64;
            mistakes.began(start);
            mistakes.total_ns += a.at_ns.saturating_sub(start);
        }
        since_ns = a.at_ns;
        estimate = slot_estimate(params, &config, &slot, Some(&estimate));
        deadline_ms = crossing(&estimate);
        crossings.push(deadline_ms);
    }
    // From the trace's last line, as with ticks (a duplicate may come after the last accepted
    // heartbeat).
    let d = (since_ns as f64 - last_heartbeat as f64) / 1e6 + deadline_ms;
    let detection_ms = (d <= tail_ms).then_some(d.max(0.0));
    report(params, &mistakes, detection_ms, crossings, last_heartbeat)
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
    fn continuous_time_by_hand() {
        // The trace of `fixed_timeout_by_hand` at tick 0: the gap 1000 -> 1700 is suspected
        // at exactly 1250, until 1700; the crash after 1800 is detected at 250.
        let mut trace: Vec<f64> = (1..=10).map(|k| k as f64 * 100.0).collect();
        trace.extend([1700.0, 1800.0]);
        let r = run(&trace, "fixed:timeout_ms=250", 0.0, 1000.0);
        assert_eq!((r.false_suspicions, r.mistake_ms), (1, 450.0));
        assert_eq!(r.detection_ms, Some(250.0));
        assert_eq!(
            (r.mean_detection_ms, r.p99_detection_ms),
            (Some(250.0), Some(250.0))
        );
        // A heartbeat exactly at the deadline is in time, as at a tick.
        let r = run(&[100.0, 350.0], "fixed:timeout_ms=250", 0.0, 1000.0);
        assert_eq!(r.false_suspicions, 0);
        // A deadline past the tail: not detected.
        let r = run(&[100.0, 200.0], "fixed:timeout_ms=5000", 0.0, 1000.0);
        assert_eq!(r.detection_ms, None);
    }

    #[test]
    fn continuous_time_counts_every_mistake_ticks_count() {
        // A tick sees a suspicion at or after the exact crossing, so every mistake it counts is
        // one in continuous time too; the mean detection time is the same exact crossing.
        let trace = crate::offline::trace::parse_trace(&crate::offline::generate::generate(
            crate::offline::generate::TraceKind::Bursty,
            1000,
            3,
        ))
        .unwrap();
        for spec in [
            "fixed:timeout_ms=150",
            "phi:threshold=1",
            "phi:model=2w,threshold=2",
        ] {
            let params = parse_spec(spec).unwrap();
            let exact = replay(
                &trace,
                &params,
                ReplayClock {
                    tick_ms: 0.0,
                    tail_ms: 6000.0,
                },
            );
            let ticked = replay(
                &trace,
                &params,
                ReplayClock {
                    tick_ms: 10.0,
                    tail_ms: 6000.0,
                },
            );
            assert!(
                ticked.false_suspicions > 0,
                "{spec}: the test needs mistakes"
            );
            assert!(exact.false_suspicions >= ticked.false_suspicions, "{spec}");
            assert!(exact.mistake_ms >= ticked.mistake_ms, "{spec}");
            assert_eq!(exact.mean_detection_ms, ticked.mean_detection_ms, "{spec}");
            assert_eq!(exact.p99_detection_ms, ticked.p99_detection_ms, "{spec}");
        }
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        assert_eq!(detection_stats(values), (Some(50.5), Some(99.0)));
        assert_eq!(detection_stats(vec![5.0]), (Some(5.0), Some(5.0)));
        assert_eq!(detection_stats(vec![]), (None, None));
        assert_eq!(detection_stats(vec![1.0, f64::INFINITY]), (None, None));
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

    /// After one restart, detection is at most 1.2x the clean figure, by default, whether the
    /// trace carries incarnations or not: the window rules leave the restart's gap out.
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
        // Without the rules the restart's gap widens the window and slows the next detection
        // several times over (shown with a low deviation floor, 25 ms, where it is plainest).
        let clean = run_arrivals(&generated(Lan), "phi:min_std_ms=25")
            .detection_ms
            .unwrap();
        let old = run_arrivals(&times_only, "phi:min_std_ms=25,outage_factor=0")
            .detection_ms
            .unwrap();
        assert!(old > 5.0 * clean, "{old} vs {clean}");
    }

    /// A sender whose clock stepped back an hour while it was down restarts with a lower
    /// incarnation: replay (which, like the kernel without authentication, takes a sequence
    /// that starts over as a restart) hears its new heartbeats, where taking them for
    /// stragglers of an older epoch would leave it silent, convicted while alive, and the
    /// crash that follows would be detected no later than after an ordinary restart.
    #[test]
    fn a_sender_whose_clock_stepped_back_is_heard_after_its_restart() {
        use crate::offline::generate::TraceKind::{ClockStep, Restart};
        let restart = run_arrivals(&generated(Restart), "phi");
        let stepped = run_arrivals(&generated(ClockStep), "phi");
        println!("restart {restart:?}\nclock step {stepped:?}");
        assert_eq!(stepped.false_suspicions, restart.false_suspicions);
        assert_eq!(stepped.detection_ms, restart.detection_ms);
    }

    /// A sender that slows down for good (100 ms, then 250 ms) is a new normal: no model
    /// convicts it at level 8 while its window learns the new rate, and its crash is detected
    /// as that of a sender that always sent every 250 ms (the second half of the trace alone).
    #[test]
    fn a_sender_that_slows_down_for_good_is_learned() {
        use crate::offline::generate::TraceKind::Slowdown;
        let trace = generated(Slowdown);
        let half = trace.len() / 2;
        let start = trace[half].at_ns;
        let always_slow: Vec<Arrival> = trace[half..]
            .iter()
            .map(|a| Arrival {
                at_ns: a.at_ns - start + 250_000_000,
                ..*a
            })
            .collect();
        for spec in [
            "phi",
            "phi:model=akka",
            "phi:model=exponential",
            "phi:model=loss",
        ] {
            let r = run_arrivals(&trace, spec);
            let clean = run_arrivals(&always_slow, spec);
            let at_1 = if spec.contains(':') { "," } else { ":" };
            let level_1 = run_arrivals(&trace, &format!("{spec}{at_1}threshold=1"));
            println!(
                "{spec}: {} false at 8 ({} at 1), detection {:?} ms ({:?} always slow)",
                r.false_suspicions, level_1.false_suspicions, r.detection_ms, clean.detection_ms
            );
            assert_eq!(r.false_suspicions, 0, "{spec}: {r:?}");
            let (d, c) = (r.detection_ms.unwrap(), clean.detection_ms.unwrap());
            assert!(
                d <= 1.2 * c && d >= 250.0,
                "{spec}: {d} ms, {c} ms always slow"
            );
        }
    }

    fn run_arrivals(trace: &[Arrival], spec: &str) -> ReplayReport {
        replay(trace, &parse_spec(spec).unwrap(), ReplayClock::default())
    }

    #[test]
    fn chen_detects_at_expected_arrival_plus_alpha() {
        // (Chen's model, detector/models/chen.rs, run through replay.)
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
