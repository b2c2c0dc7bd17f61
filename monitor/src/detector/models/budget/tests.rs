//! The budget detector against hand-derived windows.

use super::*;
use crate::detector::{
    models::Model,
    spec::{format_spec, parse_spec},
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn independent_jitter_anchors_on_the_schedule() {
    // A 100 ms schedule, every third arrival 30 ms late: arrivals 0, 130, 200, 300, 430,
    // 500, 600, 730, 800. Offsets 0, 30, 0, 0, 30, 0, 0, 30, 0 average 10 and are
    // symmetric about the middle, so the line has slope 100 and the residuals are
    // -10, 20, -10, -10, 20, -10, -10, 20, -10.
    let x = [130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 130.0, 70.0];
    let o = schedule_offsets(&x);
    for (got, want) in o
        .iter()
        .zip([-10.0, 20.0, -10.0, -10.0, 20.0, -10.0, -10.0, 20.0, -10.0])
    {
        assert!(close(*got, want), "{o:?}");
    }
    // Budget 125, aim 122.5. The timeout (s = x) misses the three 130s; lambda 1/4 and 1/2
    // too (130 - 2.5, 130 - 5); lambda 3/4 and 1 (s = 120 or 90 at 1) none. Of those two,
    // lambda 1 has the least deviation: s is 120 three times and 90 five times,
    // sqrt(3/8 5/8) 30 = 14.52 against 16.95.
    let rule = choose(&x, 125.0, 0.0, 8.0, None);
    assert_eq!((rule.anchor, rule.mistakes), (1.0, 0));
    // The last arrival is 10 ms early against the line: the deadline is 10 ms later.
    assert!(close(rule.deadline_ms, 125.0 * AIM + 10.0), "{rule:?}");
    assert!(close(
        rule.scale_ms,
        (3.0f64 / 8.0 * 5.0 / 8.0).sqrt() * 30.0
    ));
}

#[test]
fn a_delay_that_persists_keeps_the_timeout() {
    // A queue that builds and drains: 6 intervals of 100, 4 of 140, 6 of 100, 4 of 60,
    // 6 of 100. Anchored on a line, the queued arrivals look late and the next deadline
    // short: at budget 120 (aim 117.6) the timeout misses the four 140s, lambda 1/4 ten,
    // 1/2 nine, 3/4 ten, 1 eleven.
    let mut x = vec![100.0; 6];
    x.extend([140.0; 4]);
    x.extend([100.0; 6]);
    x.extend([60.0; 4]);
    x.extend([100.0; 6]);
    let rule = choose(&x, 120.0, 0.0, 8.0, None);
    assert_eq!((rule.anchor, rule.mistakes), (0.0, 4));
    assert!(close(rule.deadline_ms, 120.0 * AIM));
}

#[test]
fn a_queue_s_first_delay_on_a_calm_path_keeps_the_timeout() {
    // Ten intervals of 101 and 99 (a calm path), then one of 220: the last arrival is the
    // first one a queue of cross traffic delays (120 ms), as at the onset of a burst in
    // tests/tests/budget_congestion.rs. The line through arrivals 0, 101, 200, ..., 1000,
    // 1220 has slope 104.60 and leaves the last one 84.29 ms late. At budget 400 (aim
    // 392) no rule makes a mistake on the window, and the least deviation of the anchored
    // intervals is lambda 1's (29.91 against 34.51 for the timeout): by deviation alone the
    // deadline would be 392 - 84.29 = 307.71 ms, where the next heartbeat, one lost and
    // the queue still growing, came 318-356 ms after the last in the recorded runs. But the
    // longest anchored interval of every rule (220 for the timeout, 188.89 for lambda 1)
    // is more than a period (1220 / 11 = 110.9 ms) below the aim: nothing tells the rules
    // apart, and the timeout keeps the deadline at the aim.
    let mut x: Vec<f64> = [101.0, 99.0].repeat(5);
    x.push(220.0);
    let o = schedule_offsets(&x);
    assert!((o[11] - 84.2949).abs() < 1e-4, "{o:?}");
    let rule = choose(&x, 400.0, 0.0, 8.0, None);
    assert_eq!((rule.anchor, rule.mistakes), (0.0, 0));
    assert!(close(rule.deadline_ms, 392.0), "{rule:?}");
    // The same window at a budget whose aim is within a period of its longest interval
    // (budget 300, aim 294: 294 - 220 < 110.9) is told apart by deviation, as before.
    let tight = choose(&x, 300.0, 0.0, 8.0, None);
    assert_eq!(tight.anchor, 1.0, "{tight:?}");
    assert!(close(tight.deadline_ms, 294.0 - o[11]), "{tight:?}");
    // The tie rule itself: the deviation, or 0 past a period of room.
    assert_eq!(tie_deviation(30.0, 220.0, 110.0, 392.0), 0.0);
    assert_eq!(tie_deviation(30.0, 220.0, 110.0, 330.0), 30.0);
}

#[test]
fn equal_mistakes_go_to_the_least_deviation() {
    // Four intervals of 100, one of 150, seven of 100: arrivals 0, 100, 200, 300, 400,
    // 550, ..., 1250. The line's slope is 9600/91 and the last residual -1250/91. At budget
    // 120 (aim 117.6) lambda 0, 1/4 and 1/2 each miss the 150 alone (3/4 two, 1 three),
    // and lambda 1/2 has the least deviation of s (12.05 against 13.82 and 12.56).
    let mut x = vec![100.0; 4];
    x.push(150.0);
    x.extend([100.0; 7]);
    let o = schedule_offsets(&x);
    assert!(close(o[12], -1250.0 / 91.0), "{o:?}");
    assert!(o.iter().sum::<f64>().abs() < 1e-9, "residuals sum to zero");
    let rule = choose(&x, 120.0, 0.0, 8.0, None);
    assert_eq!((rule.anchor, rule.mistakes), (0.5, 1));
    assert!(
        close(rule.deadline_ms, 117.6 + 0.5 * 1250.0 / 91.0),
        "{rule:?}"
    );
}

#[test]
fn a_short_window_gets_the_timeout() {
    let rule = choose(&[75.0, 125.0, 100.0], 500.0, 50.0, 8.0, None);
    assert_eq!(rule.anchor, 0.0);
    assert!(close(rule.deadline_ms, 490.0));
    let empty = choose(&[], 300.0, 50.0, 3.0, None);
    assert!(close(empty.deadline_ms, 294.0));
    assert_eq!(empty.crossing_ms(3.0), empty.deadline_ms);
}

#[test]
fn every_rule_averages_the_aim_over_the_window() {
    // The deadlines after each arrival of the window, d_j = aim - lambda o_j, average the
    // aim: the residuals sum to zero, whatever the window.
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..50 {
        let n = rng.usize(8..128);
        let x: Vec<f64> = (0..n).map(|_| 60.0 + rng.f64() * 90.0).collect();
        let o = schedule_offsets(&x);
        assert_eq!(o.len(), n + 1);
        assert!(o.iter().sum::<f64>().abs() < 1e-6 * n as f64, "{o:?}");
    }
}

#[test]
fn phi_reaches_the_top_level_at_the_deadline_and_lower_ones_before() {
    let x = [
        130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 130.0, 70.0, 100.0, 100.0,
    ];
    for (budget, floor) in [(125.0, 0.0), (300.0, 50.0), (90.0, 5.0), (2000.0, 50.0)] {
        let rule = choose(&x, budget, floor, 8.0, None);
        assert_eq!(rule.phi(rule.deadline_ms), 8.0);
        assert_eq!(rule.crossing_ms(8.0), rule.deadline_ms);
        assert!(rule.phi(rule.deadline_ms.next_down()) < 8.0, "{rule:?}");
        let mut last = 0.0;
        for level in [0.5, 1.0, 3.0, 7.9, 8.0, 12.0] {
            let t = rule.crossing_ms(level);
            assert!(t >= last, "levels in order: {level} at {t}");
            assert!(rule.phi(t) >= level, "{level}: phi({t}) = {}", rule.phi(t));
            if t > 0.0 {
                assert!(rule.phi(t.next_down()) < level, "{level} at {t}");
            }
            assert_eq!(t < rule.deadline_ms, level < 8.0, "{level} at {t}");
            last = t;
        }
        let mut last = 0.0;
        for i in 0..4000 {
            let phi = rule.phi(i as f64);
            assert!(phi >= last, "grows with the silence");
            last = phi;
        }
    }
}

#[test]
fn inside_bursts_the_deadline_is_bought_from_outside_them() {
    // A steady 100 ms window (no jitter: the next arrival is exactly a period after the
    // last, or k periods after k losses). One deadline in ten is set inside a burst,
    // where the next heartbeat comes after a gap half the time and each loss is followed
    // by another half the time; outside bursts nothing is lost. Aim 196 (budget 200).
    let sorted = [100.0; 64];
    let loss = LossStates {
        bad_share: 0.1,
        p_good: 0.0,
        p_bad: 0.5,
        q: 0.5,
        in_burst: true,
    };
    let (good, bad) = split_aim(&sorted, 100.0, 0.0, 100.0, 196.0, &loss);
    // Outside a burst any deadline of a period or more is never wrong, so the split gives
    // inside bursts all the bound allows, 196 + 8 periods = 996 ms (a miss there needs 9
    // losses in a row: 0.5^9), and outside what is left: (196 - 0.1 996) / 0.9.
    assert!(close(bad, 996.0), "{good} {bad}");
    assert!(close(good, (196.0 - 99.6) / 0.9), "{good} {bad}");
    assert!(close(0.9 * good + 0.1 * bad, 196.0));
    // No burst share, or no loss picture: the one aim.
    let none = LossStates {
        bad_share: 0.0,
        ..loss
    };
    assert_eq!(
        split_aim(&sorted, 100.0, 0.0, 100.0, 196.0, &none),
        (196.0, 196.0)
    );
    // Through `choose`: the deadline is the state's aim (the steady window has no offsets).
    let x = [100.0; 64];
    let inside = choose(&x, 200.0, 0.0, 8.0, Some(&loss));
    assert!(close(inside.deadline_ms, 996.0), "{inside:?}");
    let outside = LossStates {
        in_burst: false,
        ..loss
    };
    let rule = choose(&x, 200.0, 0.0, 8.0, Some(&outside));
    assert!(close(rule.deadline_ms, (196.0 - 99.6) / 0.9), "{rule:?}");
}

#[test]
fn the_split_keeps_the_aim_and_never_expects_more_mistakes() {
    let mut rng = fastrand::Rng::with_seed(5);
    for _ in 0..200 {
        let n = rng.usize(8..128);
        let mut s: Vec<f64> = (0..n).map(|_| 80.0 + rng.f64() * 60.0).collect();
        s.sort_by(f64::total_cmp);
        let loss = LossStates {
            bad_share: rng.f64() * 0.5,
            p_good: rng.f64() * 0.01,
            p_bad: rng.f64() * 0.6,
            q: rng.f64() * 0.6,
            in_burst: false,
        };
        let aim = 100.0 + rng.f64() * 1000.0;
        let (good, bad) = split_aim(&s, 110.0, 15.0, 100.0, aim, &loss);
        let mean = (1.0 - loss.bad_share) * good + loss.bad_share * bad;
        assert!((mean - aim).abs() < 1e-6 * aim, "{good} {bad} {loss:?}");
        assert!(good <= aim + 1e-9 && bad <= aim + MAX_BURST_PERIODS * 100.0 + 1e-6);
    }
}

#[test]
fn specs_and_bad_budgets() {
    let p = parse_spec("budget:ms=500").unwrap();
    assert_eq!(
        (p.model, p.budget_ms, p.threshold),
        (Model::Budget, 500.0, 8.0)
    );
    assert_eq!(parse_spec(&format_spec(&p)).unwrap(), p);
    let p = parse_spec("budget:ms=250,threshold=3,window=64,min_std_ms=10").unwrap();
    assert_eq!((p.budget_ms, p.threshold, p.window), (250.0, 3.0, 64));
    assert_eq!(parse_spec(&format_spec(&p)).unwrap(), p);
    assert_eq!(parse_spec("budget").unwrap().budget_ms, DEFAULT_BUDGET_MS);
    for (spec, expected) in [
        ("budget:ms=0", "greater than 0"),
        ("budget:ms=-5", "greater than 0"),
        ("budget:ms=0.5", "at least 1 ms"),
        ("budget:ms=1e9", "longer than the longest interval"),
        ("budget:ms=abc", "not a finite number"),
        ("budget:pause_ms=5", "unknown key"),
        ("budget:timeout_ms=5", "unknown key"),
        ("phi:model=budget", "one of normal"),
    ] {
        let err = parse_spec(spec).expect_err(spec);
        assert!(err.contains(expected), "{spec}: {err}");
    }
}

#[test]
fn through_the_estimate_of_a_gapless_window() {
    use crate::detector::window::slot_with_intervals;
    let p = parse_spec("budget:ms=125,first_interval_ms=0,outage_factor=0").unwrap();
    assert!(p.needs_ring());
    assert!(p.window_rules().gapless);
    let config = p.window_config();
    let us = [
        130_000, 70_000, 100_000, 130_000, 70_000, 100_000, 130_000, 70_000,
    ];
    let slot = slot_with_intervals(us, &config);
    let ring: Vec<u32> = monitor_common::slot::window_intervals(&slot, config.window).collect();
    let e = p.estimate(&slot.record(), &ring);
    let Shape::Budget(rule) = e.shape else {
        panic!("{e:?}")
    };
    // The window of `independent_jitter_anchors_on_the_schedule`.
    assert_eq!(rule.anchor, 1.0);
    assert!(close(rule.deadline_ms, 122.5 + 10.0), "{rule:?}");
    let levels = p.level_silences(&[p.threshold]);
    assert_eq!(p.crossing_ms(&levels, 0, p.threshold, &e), rule.deadline_ms);
    assert_eq!(p.phi(&e, rule.deadline_ms), 8.0);
}

#[test]
fn the_recent_burst_share_from_the_missing_numbers() {
    // Nothing lost in the span: 64 heartbeats, the first 15 of unknown state (a gap just
    // before the span would still hold the peer inside a burst), 49 known, none inside.
    assert_eq!(recent_burst_share(0), Some(0.0));
    // Only the number just below the last heartbeat lost: 62 heartbeats before it with no
    // gap (47 known, outside), then the last, after the gap: inside. 1 of 48.
    assert_eq!(recent_burst_share(1), Some(1.0 / 48.0));
    // Only the number 32 below the last lost (bit 31): 31 heartbeats before it (16 known,
    // outside), the one after the gap and the 15 after it inside (16), the 16 after those
    // outside again (16). 16 of 48.
    assert_eq!(recent_burst_share(1 << 31), Some(1.0 / 3.0));
    // Every fourth number lost (4, 8, ..., 64 below the last): every heartbeat comes within
    // three of a gap, and the first one after a gap (bit 63 is the number below it): all
    // 49 inside.
    assert_eq!(recent_burst_share(0x8888_8888_8888_8888), Some(1.0));
    // Every number of the span lost: one heartbeat, too few to say.
    assert_eq!(recent_burst_share(u64::MAX), None);
}

/// A peer slot after heartbeats numbered `seqs`, 100 ms apart, through the kernel's rules.
fn slot_after(seqs: impl IntoIterator<Item = u64>) -> monitor_common::maps::PeerSlot {
    let p = parse_spec("budget:ms=300").unwrap();
    let config = p.window_config();
    let mut slot = monitor_common::maps::PeerSlot::admitted(1, 0);
    for (i, seq) in seqs.into_iter().enumerate() {
        let at = 1_000_000_000 + i as u64 * 100_000_000;
        monitor_common::slot::arrive(&mut slot, at, seq, 1, &config);
    }
    slot
}

#[test]
fn the_split_waits_for_bursts_and_leaves_steady_loss_alone() {
    // 600 heartbeats without loss, then one number in 30 lost: a burst every 30 numbers
    // that ends after 16 heartbeats, so half the heartbeats come inside a burst (short of
    // the steady share), and the split applies once the counters hold 32 of them.
    let calm = 1..=600u64;
    let bursts = |last: u64| (601..=last).filter(|s| s % 30 != 0);
    let first = slot_after(calm.clone().chain(bursts(650))).record();
    assert!(first.burst_heartbeats > 0 && first.burst_heartbeats < MIN_BURST_HEARTBEATS);
    assert_eq!(LossStates::from_record(&first), None, "{first:?}");
    let later = slot_after(calm.clone().chain(bursts(1200))).record();
    let share = recent_burst_share(later.missing).unwrap();
    assert!(share < STEADY_SHARE, "{share}");
    assert!(later.burst_heartbeats >= MIN_BURST_HEARTBEATS);
    assert!(LossStates::from_record(&later).is_some(), "{later:?}");
    // One number in 4 lost from 601 on, for good: 150 numbers later the counters, which
    // remember the calm 600, put about a fifth of the heartbeats inside a burst, where every
    // recent one is: steady loss, the one aim.
    let steady = slot_after(calm.chain((601..=750).filter(|s| s % 4 != 0))).record();
    let counted = steady.burst_heartbeats as f64 / steady.loss_heartbeats as f64;
    assert!(counted < 0.25, "{counted}");
    assert_eq!(recent_burst_share(steady.missing), Some(1.0));
    assert_eq!(LossStates::from_record(&steady), None);
}

/// The upper normal quantiles the levels below use, from tables (R: qnorm(p, lower.tail =
/// FALSE)): phi 1 is P = 0.1, phi 3 is P = 0.001, phi 8 is P = 1e-8.
const Z_PHI_1: f64 = 1.281_551_565_544_600_4;
const Z_PHI_3: f64 = 3.090_232_306_167_813_5;
const Z_PHI_8: f64 = 5.612_001_244_174_965;

#[test]
fn a_floor_wider_than_the_budget_leaves_a_fast_sender_unsuspected() {
    // A 5 ms sender on a veth: 64 intervals of 4.9 and 5.1 ms in turn (mean 5, deviation
    // 0.1), the default floor of 50 ms, a 40 ms budget (aim 39.2), levels up to 8. No rule
    // comes near a mistake (every anchored interval is within 0.2 ms of 5, the aim 34 ms
    // past it, more than a period), so the timeout is kept: the deadline is the aim.
    let x: Vec<f64> = [4.9, 5.1].repeat(32);
    let rule = choose(&x, 40.0, 50.0, 8.0, None);
    assert_eq!((rule.anchor, rule.mistakes), (0.0, 0), "{rule:?}");
    assert!(close(rule.deadline_ms, 39.2), "{rule:?}");
    // The floor would put the deadline (39.2 - 5) / 50 = 0.684 scales past the mean, where
    // the top level needs 5.612 (phi 8 is P = 1e-8): spread over a scale that wide, the
    // curve had to be moved a scale before the deadline, to -10.8 ms, and it put phi at
    // 8 * normal_phi(0.216) / normal_phi(1) = 3.83 at the heartbeat itself, levels 1 and 3
    // at 0 ms of silence. The floor yields instead: the scale is the one that puts the top
    // level at the deadline, 34.2 / 5.612 = 6.094 ms, and phi is the normal phi of the
    // silence around the mean, log10 2 at the mean.
    let scale = 34.2 / Z_PHI_8;
    assert!((rule.scale_ms - scale).abs() < 1e-9, "{rule:?}");
    assert!((rule.center_ms - 5.0).abs() < 1e-9, "{rule:?}");
    assert!(
        (rule.phi(5.0) - 2f64.log10()).abs() < 1e-9,
        "{}",
        rule.phi(5.0)
    );
    // Level 1 at 5 + 1.2816 scales = 12.81 ms, level 3 at 5 + 3.0902 scales = 23.83 ms:
    // more than a period after the next heartbeat was due.
    assert!((rule.crossing_ms(1.0) - (5.0 + Z_PHI_1 * scale)).abs() < 1e-9);
    assert!((rule.crossing_ms(3.0) - (5.0 + Z_PHI_3 * scale)).abs() < 1e-9);
    assert_eq!(rule.crossing_ms(8.0), rule.deadline_ms);
    // Below level 1 at every silence up to a heartbeat missed (two periods): far past the
    // window's spread (5 +/- 0.1 ms).
    for i in 0..=1000 {
        let t = i as f64 * 0.01;
        assert!(rule.phi(t) < 1.0, "phi({t}) = {}", rule.phi(t));
    }
}

#[test]
fn a_peer_heard_once_under_a_budget_shorter_than_the_estimate_gets_a_timeout() {
    use crate::detector::window::slot_with_intervals;
    // The first heartbeat of a peer under `--budget 40ms`: its window holds no interval, only
    // the first-interval estimate's two samples (75 and 125 ms, mean 100, deviation 25), past
    // the deadline (the aim, 39.2 ms). Their deviation is assumed, as the floor's is, and
    // yields: no curve around the expected arrival reaches the top at the deadline, so every
    // level comes at it, within microseconds (a plain timeout). The curve moved a scale (50
    // ms, the floor) before the deadline put phi at 8 * normal_phi(0.216) / normal_phi(1) =
    // 3.83 at the heartbeat, and the next heartbeat, 5 ms later, ended two suspicions.
    let p = parse_spec("budget:ms=40").unwrap();
    let config = p.window_config();
    let slot = slot_with_intervals([], &config);
    let e = p.estimate(&slot.record(), &[]);
    let Shape::Budget(rule) = e.shape else {
        panic!("{e:?}")
    };
    assert_eq!(rule, choose_unheard(&[75.0, 125.0], 40.0, 50.0, 8.0));
    assert!(close(rule.deadline_ms, 39.2), "{rule:?}");
    for level in [1.0, 3.0] {
        let t = rule.crossing_ms(level);
        assert!((39.19..39.2).contains(&t), "level {level} at {t}: {rule:?}");
    }
    assert!(rule.phi(39.0) < 1e-6, "{}", rule.phi(39.0));
    // Under the default budget (500 ms, aim 490) the estimate's curve stands as it was: the
    // floor puts the aim (490 - 100) / 50 = 7.8 scales past its mean, more than z_top.
    let wide = choose_unheard(&[75.0, 125.0], 500.0, 50.0, 8.0);
    assert_eq!((wide.center_ms, wide.scale_ms), (100.0, 50.0));
    // The peer's own intervals of 75 and 125 ms are a spread, not an assumption: it does not
    // yield, and the curve ends a deviation (25 ms) before the deadline, as before.
    let own = choose(&[75.0, 125.0], 40.0, 50.0, 8.0, None);
    assert!(
        close(own.scale_ms, 25.0) && close(own.center_ms, 39.2 - 25.0),
        "{own:?}"
    );
}

#[test]
fn the_first_interval_estimate_is_not_an_arrival() {
    use crate::detector::window::slot_with_intervals;
    // `monitor run --budget 40ms` (the default first_interval_ms of 100 and window of 128)
    // after 61 heartbeats of a sender every 5 ms exactly: the window holds 60 intervals of
    // 5 ms. Every arrival is on the line through them, so every rule's deadline is the aim,
    // 39.2 ms, and phi is the normal phi of the silence around 5 ms that reaches 8 there.
    // Read with the first-interval estimate's two samples (75 and 125 ms) in front, as if
    // they were arrivals, the line's slope was 5.46 ms and the last arrival 9.20 ms early on
    // it: the schedule-anchored rule, the only one with no mistake on that window (the
    // others counted the 75 and 125), put the deadline at 39.2 + 9.2 = 48.4 ms (1.21 B).
    let p = parse_spec("budget:ms=40").unwrap();
    assert_eq!((p.first_interval_ms, p.window), (100.0, 128));
    let config = p.window_config();
    let slot = slot_with_intervals([5_000; 60], &config);
    let ring: Vec<u32> = monitor_common::slot::window_intervals(&slot, config.window).collect();
    assert_eq!(ring.len(), 60);
    let e = p.estimate(&slot.record(), &ring);
    let Shape::Budget(rule) = e.shape else {
        panic!("{e:?}")
    };
    assert_eq!(rule.mistakes, 0, "{rule:?}");
    assert!(close(rule.deadline_ms, 39.2), "{rule:?}");
    assert!((rule.phi(5.0) - 2f64.log10()).abs() < 1e-9, "{rule:?}");
    let levels = p.level_silences(&[1.0, 3.0, 8.0]);
    let scale = 34.2 / Z_PHI_8;
    for (i, (level, z)) in [(1.0, Z_PHI_1), (3.0, Z_PHI_3)].into_iter().enumerate() {
        let t = p.crossing_ms(&levels, i, level, &e);
        assert!((t - (5.0 + z * scale)).abs() < 1e-9, "level {level} at {t}");
    }
    assert!(close(p.crossing_ms(&levels, 2, 8.0, &e), 39.2));
}
