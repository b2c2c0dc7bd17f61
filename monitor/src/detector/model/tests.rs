//! The parameters' and the shared estimate's unit tests: the seed table, the Akka and
//! Cassandra parity, the crossings and the floors.

use monitor_common::{
    config::{XDP_FLAG_GAPLESS_WINDOW, XdpConfig},
    passive::{BFD_UP, SOURCE_BFD},
};

use super::*;
use crate::detector::window::slot_with_intervals;

/// The estimate of a window holding `intervals_us`, every interval counted.
fn estimate_of(p: &DetectorParams, intervals_us: impl IntoIterator<Item = u64>) -> Estimate {
    let c = XdpConfig {
        window: 128,
        ..XdpConfig::DEFAULT
    };
    p.estimate(&slot_with_intervals(intervals_us, &c).record(), &[])
}

fn params(model: Model) -> DetectorParams {
    DetectorParams {
        model,
        min_std_ms: 0.0,
        first_interval_ms: 0.0,
        ..DetectorParams::DEFAULT
    }
}

fn est(mean_ms: f64, std_ms: f64) -> Estimate {
    Estimate {
        mean_ms,
        std_ms,
        pause_ms: 0.0,
        shape: Shape::Plain,
    }
}

#[test]
fn normal_matches_the_normal_tail() {
    let p = params(Model::Normal);
    // Silence one std above the mean: P = 0.15865525393145705 (A&S 26.2), phi = 0.79955...
    let phi = p.phi(&est(100.0, 10.0), 110.0);
    assert!(
        (phi - -(0.158_655_253_931_457_05f64).log10()).abs() < 1e-12,
        "{phi}"
    );
    // At the mean: P = 1/2.
    assert!((p.phi(&est(100.0, 10.0), 100.0) - 2f64.log10()).abs() < 1e-15);
}

#[test]
fn akka_matches_akka_formula_where_akka_is_finite() {
    // Akka's own code, transcribed: both branches.
    fn akka_reference(time_diff: f64, mean: f64, std: f64) -> f64 {
        let y = (time_diff - mean) / std;
        let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
        if time_diff > mean {
            -(e / (1.0 + e)).log10()
        } else {
            -(1.0 - 1.0 / (1.0 + e)).log10()
        }
    }
    let p = params(Model::Akka);
    for t in [0.0, 50.0, 99.0, 100.0, 101.0, 150.0, 200.0, 300.0, 400.0] {
        let ours = p.phi(&est(100.0, 25.0), t);
        let theirs = akka_reference(t, 100.0, 25.0);
        assert!(
            (ours - theirs).abs() <= 1e-9 * theirs.max(1.0),
            "t={t}: {ours} vs {theirs}"
        );
    }
    // Where Akka saturates (exp underflows, phi = inf), ours stays finite and monotone.
    assert!(akka_reference(3000.0, 100.0, 25.0).is_infinite());
    let far = p.phi(&est(100.0, 25.0), 3000.0);
    assert!(far.is_finite() && far > p.phi(&est(100.0, 25.0), 2000.0));
}

#[test]
fn akka_parameters_act_as_in_akka() {
    // Akka's test "use the acceptable heartbeat pause and min std deviation": a pause
    // moves the curve right; the floor replaces a tiny deviation.
    let with = DetectorParams {
        pause_ms: 3000.0,
        min_std_ms: 100.0,
        ..params(Model::Akka)
    };
    let e = estimate_of(&with, [1_000_000; 10]);
    assert_eq!((e.mean_ms, e.std_ms), (4000.0, 100.0));
    assert!(with.phi(&e, 1500.0) < 0.01);
}

#[test]
fn exponential_matches_cassandra() {
    // Cassandra: phi = PHI_FACTOR * t / mean, PHI_FACTOR = 1 / ln 10.
    let p = params(Model::Exponential);
    assert!((p.phi(&est(1000.0, 0.0), 2_302.585_092_994_046) - 1.0).abs() < 1e-12);
    assert_eq!(p.phi(&est(1000.0, 0.0), 0.0), 0.0);
}

#[test]
fn fixed_is_a_step() {
    let p = DetectorParams {
        timeout_ms: 500.0,
        ..params(Model::Fixed)
    };
    assert_eq!(p.phi(&est(100.0, 1.0), 499.9), 0.0);
    assert!(p.phi(&est(100.0, 1.0), 500.0).is_infinite());
}

#[test]
fn phi_grows_with_silence_in_every_model() {
    for model in [Model::Normal, Model::Akka, Model::Exponential] {
        let p = params(model);
        let mut last = -1.0;
        for i in 0..2000 {
            let phi = p.phi(&est(100.0, 20.0), i as f64 * 5.0);
            assert!(phi >= last, "{model:?} at {} ms", i * 5);
            assert!(phi.is_finite(), "{model:?} at {} ms", i * 5);
            last = phi;
        }
    }
}

#[test]
fn the_same_silence_is_less_suspicious_on_a_jittery_peer() {
    for model in [Model::Normal, Model::Akka] {
        let p = params(model);
        let steady = (0..100u64).map(|i| 100_000 + (i % 3) * 1_000);
        let jittery = (0..100u64).map(|i| if i % 2 == 0 { 60_000 } else { 140_000 });
        let (s, j) = (estimate_of(&p, steady), estimate_of(&p, jittery));
        // 200 ms is a hundred deviations late for the steady peer (mean 101, std 0.8) and
        // 2.5 deviations for the jittery one (mean 100, std 40).
        let silence = 200.0;
        assert!(p.phi(&s, silence) > 8.0, "{model:?}: steady peer at 200 ms");
        assert!(
            p.phi(&j, silence) < 3.0,
            "{model:?}: jittery peer at 200 ms"
        );
    }
}

#[test]
fn bootstrap_gives_a_usable_estimate_before_any_interval() {
    let p = DetectorParams {
        first_interval_ms: 1000.0,
        ..params(Model::Akka)
    };
    let e = estimate_of(&p, []);
    assert_eq!(e, est(1000.0, 250.0));
    // First real interval joins the two bootstrap samples: (750 + 1250 + 400) / 3.
    assert!((estimate_of(&p, [400_000]).mean_ms - 800.0).abs() < 1e-9);
}

#[test]
fn level_silences_invert_phi() {
    let levels = [1.0, 3.0, 8.0, 12.0];
    for model in [Model::Normal, Model::Akka, Model::Exponential] {
        let p = params(model);
        let e = est(100.0, 20.0);
        let table = p.level_silences(&levels);
        for (i, &level) in levels.iter().enumerate() {
            let t = table.silence_ms(i, &e);
            let phi = p.phi(&e, t);
            assert!(
                (phi - level).abs() < 1e-9,
                "{model:?} level {level}: phi({t}) = {phi}"
            );
            assert!(p.phi(&e, t - 1e-3) < level);
        }
    }
    let fixed = DetectorParams {
        timeout_ms: 700.0,
        ..params(Model::Fixed)
    };
    assert_eq!(
        fixed.level_silences(&levels).silence_ms(2, &est(1.0, 1.0)),
        700.0
    );
}

/// The estimate of a window holding `intervals_us`, with its ring, as replay makes it.
fn ring_estimate_of(p: &DetectorParams, intervals_us: &[u64]) -> Estimate {
    let c = p.window_config();
    let slot = slot_with_intervals(intervals_us.iter().copied(), &c);
    let ring: Vec<u32> = monitor_common::slot::window_intervals(&slot, c.window).collect();
    assert!(p.needs_ring());
    p.estimate(&slot.record(), &ring)
}

const RING_MODELS: [Model; 4] = [
    Model::Chen,
    Model::Bertier,
    Model::Empirical,
    Model::TwoWindows,
];

#[test]
fn ring_models_are_named_for_the_cli_and_serde() {
    for (model, name) in RING_MODELS
        .into_iter()
        .zip(["chen", "bertier", "empirical", "2w"])
    {
        assert_eq!(model.name(), name);
        assert_eq!(Model::from_name(name), Some(model));
        assert_eq!(
            serde_json::to_string(&model).unwrap(),
            format!("\"{name}\"")
        );
        assert!(params(model).needs_ring());
    }
    assert!(!params(Model::Normal).needs_ring());
    // Chen's schedule is the heartbeats': intervals that span a loss stay out of it.
    for (model, gapless) in RING_MODELS.into_iter().zip([true, true, false, false]) {
        let flags = params(model).window_config().flags;
        assert_eq!(flags & XDP_FLAG_GAPLESS_WINDOW != 0, gapless, "{model:?}");
    }
}

#[test]
fn chen_and_bertier_through_the_estimate() {
    // 100, 100, 100, 130 ms: Chen's EA is 98.5 ms after the last arrival (see chen.rs).
    let window = [100_000, 100_000, 100_000, 130_000];
    let chen = DetectorParams {
        alpha_ms: Some(40.0),
        pause_ms: 10.0,
        ..params(Model::Chen)
    };
    let e = ring_estimate_of(&chen, &window);
    let Shape::Freshness(f) = e.shape else {
        panic!("{e:?}")
    };
    assert!((f.at_ms() - (98.5 + 40.0 + 10.0)).abs() < 1e-9, "{f:?}");
    assert_eq!(chen.phi(&e, 148.4), 0.0);
    assert!(chen.phi(&e, 148.5).is_infinite());
    // Bertier on 100, 100, 130, 100: EA 104.5, Jacobson margin 15.45 (see bertier.rs),
    // plus alpha 0 by default.
    let bertier = params(Model::Bertier);
    let e = ring_estimate_of(&bertier, &[100_000, 100_000, 130_000, 100_000]);
    let Shape::Freshness(f) = e.shape else {
        panic!("{e:?}")
    };
    assert!((f.at_ms() - (104.5 + 15.45)).abs() < 1e-9, "{f:?}");
}

#[test]
fn bootstrap_samples_lead_the_ring() {
    // No interval yet: the two bootstrap samples 75 and 125 ms are the window, and Chen's
    // EA of them is 2/3 75 + 1/3 125 = 91.67 ms.
    let p = DetectorParams {
        first_interval_ms: 100.0,
        alpha_ms: Some(0.0),
        ..params(Model::Chen)
    };
    let e = ring_estimate_of(&p, &[]);
    let Shape::Freshness(f) = e.shape else {
        panic!("{e:?}")
    };
    assert!((f.expected_ms - (50.0 + 125.0 / 3.0)).abs() < 1e-9, "{f:?}");
    assert_eq!(
        p.window_us(&[90_000], 100_000),
        vec![75_000, 125_000, 90_000]
    );
    let small = DetectorParams { window: 3, ..p };
    assert_eq!(small.window_us(&[1, 2], 100_000), vec![125_000, 1, 2]);
    assert_eq!(small.window_us(&[1, 2, 3], 100_000), vec![1, 2, 3]);
}

#[test]
fn a_bfd_session_is_seeded_with_the_interval_it_announces() {
    let p = params(Model::Normal);
    let mut record = PeerRecord::admitted_passive(1, 0, SOURCE_BFD);
    record.bfd_desired_min_tx_us = 300_000;
    record.bfd_state = BFD_UP;
    let e = p.estimate(&record, &[]);
    assert!((e.mean_ms - 300.0).abs() < 1e-9, "{e:?}");
    // Not Up: once a second at the fastest, whatever it announces.
    record.bfd_state = monitor_common::passive::BFD_DOWN;
    let e = p.estimate(&record, &[]);
    assert!((e.mean_ms - 1000.0).abs() < 1e-9, "{e:?}");
    record.bfd_desired_min_tx_us = 2_000_000;
    let e = p.estimate(&record, &[]);
    assert!((e.mean_ms - 2000.0).abs() < 1e-9, "{e:?}");
    record.bfd_state = BFD_UP;
    // Before its first packet (no timers yet), and for other peers: first_interval_ms.
    record.bfd_desired_min_tx_us = 0;
    let e = p.estimate(&record, &[]);
    assert!((e.mean_ms - p.first_interval_ms).abs() < 1e-9, "{e:?}");
}

#[test]
fn two_windows_through_the_estimate() {
    // Twenty intervals of 100 ms, then five of 200 ms: the short window (5) is N(200, 0),
    // floored to 10; the long one is N(120, 40) (mean (2000 + 1000) / 25, variance
    // 20/25 * 20^2 + 5/25 * 80^2 = 1600).
    let p = DetectorParams {
        min_std_ms: 10.0,
        outage_factor: 0,
        ..params(Model::TwoWindows)
    };
    let mut window = vec![100_000; 20];
    window.extend([200_000; 5]);
    let e = ring_estimate_of(&p, &window);
    assert!((e.mean_ms - 120.0).abs() < 1e-9 && (e.std_ms - 40.0).abs() < 1e-9);
    assert_eq!(
        e.shape,
        Shape::TwoWindows(ShortWindow {
            mean_ms: 200.0,
            std_ms: 10.0
        })
    );
    // At 210 ms the long window says 2.25 deviations late (phi 1.91), the short one 1
    // deviation late (P = 0.15865525393145705): the short one, lower, judges.
    let phi = p.phi(&e, 210.0);
    assert!(
        (phi - -(0.158_655_253_931_457_05f64).log10()).abs() < 1e-12,
        "{phi}"
    );
    // window_short = 1: the last interval alone.
    let one = DetectorParams {
        window_short: 1,
        ..p.clone()
    };
    let Shape::TwoWindows(s) = ring_estimate_of(&one, &[100_000, 100_000, 150_000]).shape else {
        panic!()
    };
    assert_eq!((s.mean_ms, s.std_ms), (150.0, 10.0));
}

#[test]
fn empirical_through_the_estimate() {
    let p = DetectorParams {
        min_std_ms: 25.0,
        ..params(Model::Empirical)
    };
    let e = ring_estimate_of(&p, &[90_000, 100_000, 100_000, 110_000, 120_000]);
    // The hand-computed values of empirical.rs: 3/6 later at 100 ms, 1/6 at 120.
    assert!((p.phi(&e, 100.0) - 2f64.log10()).abs() < 1e-15);
    assert!((p.phi(&e, 120.0) - 6f64.log10()).abs() < 1e-15);
}

/// Windows on which every ring model is checked.
fn test_windows() -> Vec<Vec<u64>> {
    vec![
        vec![],
        vec![100_000],
        vec![100_000, 100_000, 130_000, 100_000],
        (0..128u64).map(|i| 80_000 + (i * 7919) % 50_000).collect(),
        (0..60u64)
            .map(|i| if i % 10 == 9 { 290_000 } else { 100_000 })
            .collect(),
    ]
}

#[test]
fn crossings_are_exact_for_the_ring_models() {
    let levels = [0.5, 1.0, 3.0, 8.0, 12.0, 40.0];
    for model in RING_MODELS {
        for first in [0.0, 100.0] {
            for window in test_windows() {
                let p = DetectorParams {
                    first_interval_ms: first,
                    min_std_ms: 5.0,
                    pause_ms: if first > 0.0 { 20.0 } else { 0.0 },
                    ..params(model)
                };
                let e = ring_estimate_of(&p, &window);
                let table = p.level_silences(&levels);
                for (i, &level) in levels.iter().enumerate() {
                    let t = p.crossing_ms(&table, i, level, &e);
                    assert_eq!(t, table.silence_ms(i, &e), "{model:?}");
                    let at = p.phi(&e, t);
                    assert!(at >= level - 1e-9, "{model:?} {level}: phi({t}) = {at}");
                    if t > 1e-3 {
                        let before = p.phi(&e, t - 1e-3);
                        assert!(
                            before < level,
                            "{model:?} {level}: phi({t} - 1us) = {before}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn ring_models_grow_with_silence() {
    for model in RING_MODELS {
        for window in test_windows() {
            let p = DetectorParams {
                min_std_ms: 5.0,
                ..params(model)
            };
            let e = ring_estimate_of(&p, &window);
            let mut last = 0.0;
            for i in 0..4000 {
                let phi = p.phi(&e, i as f64 * 0.5);
                assert!(phi >= last, "{model:?} at {} ms", i as f64 * 0.5);
                last = phi;
            }
            assert!(
                last >= 8.0,
                "{model:?}: 2 s of silence is convicted ({last})"
            );
        }
    }
}

/// The parameters of the floor tests' case `case`: windows of 8, 32 and 128, each with
/// deviation floors of 0, 5, 50 and 2 ms (the 10 ms heartbeats of issue 23's target run
/// with `--min-std-ms 2`), and a pause in one case of five.
fn floor_case(model: Model, case: usize) -> DetectorParams {
    DetectorParams {
        model,
        window: [8, 32, 128][case % 3],
        min_std_ms: [0.0, 5.0, 50.0, 2.0][(case / 3) % 4],
        pause_ms: if case.is_multiple_of(5) { 30.0 } else { 0.0 },
        ..DetectorParams::DEFAULT
    }
}

/// The floor of `MeanFloor::after_ms` and `crossing_floor_ms` holds: whatever the next `more`
/// heartbeats bring (kept or refused by the kernel's rules, short, long, after losses),
/// the exact crossing of the first level never comes before it, for every model that
/// offers one, in full windows and in windows still filling (with their bootstrap
/// samples); and with no further heartbeat the floor is at most the exact crossing.
#[test]
fn crossing_floors_hold_for_the_next_heartbeats() {
    let mut rng = fastrand::Rng::with_seed(7);
    let levels = [1.0, 3.0, 8.0];
    let mut checked = 0;
    for model in [
        Model::Normal,
        Model::Akka,
        Model::Loss,
        Model::Exponential,
        Model::Fixed,
    ] {
        for case in 0..300 {
            let p = floor_case(model, case);
            let config = p.window_config();
            let silences = p.level_silences(&levels);
            let base = [10_000u64, 100_000, 1_000_000][rng.usize(0..3)];
            let jitter = |rng: &mut fastrand::Rng| match rng.u8(0..10) {
                0 => rng.u64(0..base * 20),
                1 => rng.u64(0..base / 10 + 1),
                _ => base + rng.u64(0..base / 5 + 1) - base / 10,
            };
            let count = if case % 4 == 0 {
                rng.usize(0..p.window as usize)
            } else {
                p.window as usize + rng.usize(0..40)
            };
            let intervals: Vec<u64> = (0..count).map(|_| jitter(&mut rng)).collect();
            let mut slot = slot_with_intervals(intervals, &config);
            let more = 1 + rng.u64(0..32);
            let Some((floor, std_floor)) = p
                .mean_floor(&slot.record())
                .map(|f| (f.after_ms(more), f.std_floor_ms(more)))
            else {
                continue;
            };
            checked += 1;
            let crossing = |slot: &monitor_common::maps::PeerSlot, index: usize| {
                let est = p.estimate(&slot.record(), &[]);
                p.crossing_ms(&silences, index, levels[index], &est)
            };
            for index in 0..levels.len() {
                let Some(bound) = p.crossing_floor_ms(&silences, index, floor, std_floor) else {
                    continue;
                };
                assert!(
                    bound <= crossing(&slot, index) + 1e-9,
                    "{model:?} case {case}"
                );
            }
            let mut at = slot.record().last_arrival_ns;
            let mut seq = slot.record().last_seq;
            for step in 0..more {
                at += jitter(&mut rng) * 1000;
                seq += 1 + (rng.u8(0..8) == 0) as u64 * rng.u64(1..4);
                monitor_common::slot::arrive(&mut slot, at, seq, 1, &config);
                let bound = p.crossing_floor_ms(&silences, 0, floor, std_floor).unwrap();
                let exact = crossing(&slot, 0);
                assert!(
                    bound <= exact + 1e-9,
                    "{model:?} case {case} step {step}: floor {bound} > crossing {exact}"
                );
            }
        }
    }
    // Most windows had 4 intervals or more (fewer have no floor).
    assert!(checked > 1000, "{checked} of 1500 cases checked");
}

/// The floor of `MeanFloor::after_heard_ms` holds: after some heartbeats whose intervals
/// all entered a window, full or still filling (one case in three, with its bootstrap
/// samples), counted by their elapsed time as the agent counts them (the
/// arrivals' difference in ns, less 1 µs an interval), and whatever the next `more` bring
/// while every interval enters, the first level's exact crossing never comes before it.
#[test]
fn floors_from_heard_heartbeats_hold() {
    let mut rng = fastrand::Rng::with_seed(11);
    let (mut checked, mut filled) = (0, 0u32);
    for model in [Model::Normal, Model::Akka, Model::Loss, Model::Exponential] {
        for case in 0..300 {
            let p = floor_case(model, case);
            let config = p.window_config();
            let silences = p.level_silences(&[1.0]);
            let base = [10_000u64, 100_000, 1_000_000][rng.usize(0..3)];
            // One case in four is a steady sender with no deviation to hide behind: there
            // the floor is within a hair of the exact crossing.
            let steady = case % 4 == 1;
            let jitter = |rng: &mut fastrand::Rng| match rng.u8(0..10) {
                _ if steady => base,
                0 => rng.u64(0..base * 3),
                1 => rng.u64(0..base / 10 + 1),
                _ => base + rng.u64(0..base / 5 + 1) - base / 10,
            } * 1000
                // Some nanoseconds, so that intervals are rounded down to microseconds.
                + rng.u64(0..1000);
            let filling = case % 3 == 2;
            let count = if filling {
                4 + rng.usize(0..p.window as usize - 4)
            } else {
                p.window as usize + rng.usize(0..40)
            };
            let spread = if steady { 1 } else { base / 2 };
            let intervals: Vec<u64> = (0..count).map(|_| base + rng.u64(0..spread)).collect();
            let mut slot = slot_with_intervals(intervals, &config);
            let floor = p.mean_floor(&slot.record()).unwrap();
            let (t0, left_out) = (slot.record().last_arrival_ns, slot.record().left_out);
            let mut seq = slot.record().last_seq;
            let mut arrive = |slot: &mut monitor_common::maps::PeerSlot, rng: &mut _| {
                seq += 1;
                let at = slot.record().last_arrival_ns + jitter(rng);
                monitor_common::slot::arrive(slot, at, seq, 1, &config);
                slot.record().left_out == left_out
            };
            let samples = slot.record().samples as u64;
            // Heard within the filling, for a filling window (past it, the floor is None).
            let heard = if filling {
                rng.u64(0..samples.min(p.window as u64 - samples) + 1)
            } else {
                rng.u64(0..samples)
            };
            if !(0..heard).all(|_| arrive(&mut slot, &mut rng)) {
                continue;
            }
            let heard_us = (slot.record().last_arrival_ns - t0) as f64 / 1000.0 - heard as f64;
            // A filling window's span is at most the heartbeats it held, and ends where it
            // would be full (past either, None).
            let window = p.window as u64;
            let more = if filling {
                rng.u64(0..=(samples - heard).min(window - samples - heard).min(32))
            } else {
                rng.u64(0..33)
            };
            let Some(mean) = floor.after_heard_ms(heard, heard_us, more) else {
                assert!(
                    heard + more > samples || (filling && samples + heard + more > p.window as u64)
                );
                continue;
            };
            checked += 1;
            filled += filling as u32;
            if filling {
                // The one-pass floors of every span are the same as one span's at a time.
                let mut floors = [f64::NAN; 33];
                floor.filling_floors_ms(heard, heard_us, &mut floors);
                assert_eq!(
                    floors[more as usize], mean,
                    "case {case} heard {heard} more {more}"
                );
            }
            let std_floor = floor.std_floor_ms(heard + more);
            let bound = p.crossing_floor_ms(&silences, 0, mean, std_floor).unwrap();
            for step in 0..=more {
                let est = p.estimate(&slot.record(), &[]);
                let exact = p.crossing_ms(&silences, 0, 1.0, &est);
                assert!(
                    bound <= exact + 1e-9,
                    "{model:?} case {case} heard {heard} step {step}: floor {bound} > {exact}"
                );
                if step < more && !arrive(&mut slot, &mut rng) {
                    break;
                }
            }
        }
    }
    assert!(checked > 600, "{checked} of 1200 cases checked");
    assert!(filled > 150, "{filled} filling windows checked");
}
