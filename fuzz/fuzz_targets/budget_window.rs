//! The budget detector (`monitor run --budget`, `-d budget:ms=B`) on any window, budget, loss
//! counters and credit: it never panics, its deadline and credit stay finite and in range,
//! and its curve grows with the silence and reaches the top level at the deadline. The loss
//! counters come from the kernel's slot and the intervals from its ring, so a slot written
//! under a bug, halved at odd moments or read torn is input here too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor::detector::models::budget::{Allocation, GapOdds, OverTime, RESERVE_BUDGETS, choose};
use monitor_common::maps::PeerRecord;

/// Bytes before the intervals: the budget, the floor, the top level, flags and the counters.
const HEAD: usize = 40;
/// The longest interval a window holds (the ring's 28 bits of microseconds).
const LONGEST_US: u32 = 1 << 28;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEAD {
        return;
    }
    let (head, rest) = data.split_at(HEAD);
    let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().unwrap());
    // What `--budget` accepts (1 ms to 268 s) and a floor of 0 to 100 ms.
    let budget_ms = f64::from(1 + word(0) % 268_000);
    let min_std_ms = f64::from(word(4) % 100_000) / 1000.0;
    let top = 0.5 + f64::from(head[8] % 40) / 2.0;
    let flags = head[9];
    let mut record = PeerRecord::admitted(1, 0);
    record.burst_left = head[10];
    record.loss_heartbeats = word(12);
    record.loss_gaps = word(16);
    record.loss_lost = word(20);
    record.burst_heartbeats = word(24);
    record.burst_gaps = word(28);
    let credit_ms = f64::from(word(32)) / 16.0;
    let heartbeats = u64::from(word(36));
    let intervals: Vec<f64> = rest
        .chunks_exact(4)
        .take(128)
        .map(|c| f64::from(u32::from_le_bytes(c.try_into().unwrap()) % LONGEST_US) / 1000.0)
        .collect();
    let gaps = GapOdds::from_record(&record);
    if let Some(g) = gaps {
        for p in [g.p_good, g.p_bad, g.q, g.p_next()] {
            assert!((0.0..=1.0).contains(&p), "{g:?}");
        }
    }
    let over_time = OverTime {
        allocation: Allocation {
            credit_ms,
            heartbeats,
        },
        gaps,
        full: flags & 1 != 0,
    };
    let rule = choose(
        &intervals,
        budget_ms,
        min_std_ms,
        top,
        (flags & 2 != 0).then_some(&over_time),
    );
    let deadline = rule.deadline_ms;
    assert!(deadline.is_finite() && deadline >= 0.0, "{rule:?}");
    let credit = rule.allocation.credit_ms;
    assert!(
        credit.is_finite() && (0.0..=RESERVE_BUDGETS * budget_ms).contains(&credit),
        "{rule:?}"
    );
    // The curve: never NaN, growing with the silence, at the top level by the deadline.
    let mut last = 0.0;
    for i in 0..=64 {
        let silence = deadline * 2.0 * f64::from(i) / 64.0;
        let phi = rule.phi(silence);
        assert!(
            !phi.is_nan() && phi >= last,
            "phi({silence}) = {phi} after {last}: {rule:?}"
        );
        last = phi;
    }
    assert!(rule.phi(deadline) >= top * (1.0 - 1e-9), "{rule:?}");
    for level in [0.5, 1.0, 3.0, top, 2.0 * top] {
        let t = rule.crossing_ms(level);
        assert!(!t.is_nan() && t >= 0.0, "level {level} at {t}: {rule:?}");
    }
});
