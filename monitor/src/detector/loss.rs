//! Loss-aware suspicion: a live peer's silence may span heartbeats that were lost.
//!
//! After an accepted heartbeat, the next one to arrive is the (K+1)-th sent, where K is the
//! number of consecutive heartbeats lost. The window holds only intervals between
//! consecutive sequence numbers for this model, N(mu, sigma^2). A sender keeps a schedule
//! (heartbeat n at n periods from its start, as `monitor send` and the generated traces do),
//! and each arrival strays from it by its own delay: the gap spanning k losses is (k+1)
//! periods plus the next arrival's delay minus the last one's, whose deviation is that of a
//! single interval, whatever k. So the deviation does not widen with the heartbeats lost
//! (as it would, by sqrt(k+1), were each interval drawn afresh after the one before):
//!
//!   P(silence > t) = sum over k >= 0 of P(K = k) * Q((t - pause - (k+1) mu) / sigma)
//!
//! and phi = -log10 of it, so levels keep their meaning. K follows the peer's measured loss as
//! a two-state (Gilbert) chain: P(K >= 1) = p, the chance that a heartbeat is lost after one
//! that arrived, P(K >= k+1 | K >= k) = q, the chance that a loss follows a loss (burstiness).
//! p is conditioned on the peer's state: inside a loss burst (a gap within the last
//! `BURST_MEMORY` heartbeats) it is the rate of gaps seen inside bursts, otherwise the rate seen
//! outside them. That is what makes bursts cheap: a peer in a bad spell is given the slack of a
//! bad spell, one in a good spell is judged almost as the plain normal model judges it (a
//! crash, which ends a good spell more often than not, is detected nearly as fast). With no loss
//! measured the model is exactly `normal`.

use monitor_common::maps::PeerRecord;

use super::tail::log10_upper_tail;

/// Terms of the mixture beyond which the rest of the mass is counted as not yet arrived
/// (a lower bound on the probability, so phi errs on the side of not suspecting).
const MAX_TERMS: u32 = 4096;
/// A term whose mean is this many deviations beyond t counts as certain to be later than t.
const CERTAIN_Z: f64 = -9.0;

/// The loss probabilities of one peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossOdds {
    /// P(the heartbeat after the last accepted one is lost).
    pub p: f64,
    /// P(a heartbeat is lost | the one before it was lost).
    pub q: f64,
}

impl LossOdds {
    pub const NONE: Self = Self { p: 0.0, q: 0.0 };

    /// From the kernel's loss counters (see `PeerRecord::loss_heartbeats`).
    pub fn from_record(r: &PeerRecord) -> Self {
        let ratio = |a: u32, b: u32| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        // p in the peer's state. Outside a burst, with few samples the overall rate stands in
        // (one pseudo-observation at the overall rate). Inside a burst the prior is even odds
        // (Laplace: one loss and one arrival), and so is q: a first loss is taken as the start
        // of a burst until the peer's own bursts say otherwise, so a peer that has not lost
        // anything yet is not suspected for its first burst.
        let overall = ratio(r.loss_gaps, r.loss_heartbeats);
        let p = if r.burst_left != 0 {
            (r.burst_gaps as f64 + 1.0) / (r.burst_heartbeats as f64 + 2.0)
        } else {
            let clean_gaps = r.loss_gaps.saturating_sub(r.burst_gaps);
            let clean = r.loss_heartbeats.saturating_sub(r.burst_heartbeats);
            (clean_gaps as f64 + overall) / (clean as f64 + 1.0)
        };
        // A gap of L lost heartbeats holds L - 1 loss-after-loss steps.
        let q = (r.loss_lost.saturating_sub(r.loss_gaps) as f64 + 1.0) / (r.loss_lost as f64 + 2.0);
        Self {
            p: p.clamp(0.0, 1.0),
            q: q.clamp(0.0, 1.0 - 1e-9),
        }
    }

    pub fn is_lossless(&self) -> bool {
        self.p <= 0.0
    }

    /// phi of a silence of `t` ms for single intervals N(mean, std^2), plus `pause` once.
    pub fn phi(&self, t: f64, mean: f64, std: f64, pause: f64) -> f64 {
        (-self.log10_survival(t, mean, std, pause)).max(0.0)
    }

    /// log10 P(silence > t), summed in log space so that it stays finite far into the tail.
    pub fn log10_survival(&self, t: f64, mean: f64, std: f64, pause: f64) -> f64 {
        let mut acc = f64::NEG_INFINITY;
        // P(K >= k): 1, p, p q, p q^2, ...
        let mut at_least = 1.0f64;
        for k in 0..MAX_TERMS {
            let next = if k == 0 { self.p } else { at_least * self.q };
            let weight = at_least - next;
            // Anchored on the schedule: the (k+1)-th period away, the deviation of one interval.
            let (m, s) = ((k + 1) as f64 * mean + pause, std);
            let z = if s > 0.0 {
                (t - m) / s
            } else if t >= m {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
            if z <= CERTAIN_Z {
                // This term and every later one: later than t for sure.
                return log10_add(acc, at_least.log10());
            }
            if weight > 0.0 {
                acc = log10_add(acc, weight.log10() + log10_upper_tail(z));
            }
            at_least = next;
            if at_least <= 0.0 {
                return acc;
            }
        }
        log10_add(acc, at_least.log10())
    }
}

/// log10(10^a + 10^b) without overflow or underflow.
fn log10_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (10f64.powf(lo - hi)).ln_1p() / std::f64::consts::LN_10
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::tail::normal_phi;

    #[test]
    fn without_loss_it_is_the_normal_model() {
        for t in [0.0, 90.0, 100.0, 150.0, 240.0, 400.0, 2000.0] {
            let ours = LossOdds::NONE.phi(t, 100.0, 25.0, 0.0);
            let normal = normal_phi((t - 100.0) / 25.0).max(0.0);
            assert!((ours - normal).abs() < 1e-12, "t={t}: {ours} vs {normal}");
        }
    }

    #[test]
    fn a_hand_computed_mixture() {
        // p = 0.1, q = 0.5: K = 0 w.p. 0.9, 1 w.p. 0.05, 2 w.p. 0.025, ... With mean 100,
        // std 10 and t = 200: Q((200-100)/10) ~ 7.6e-24, Q((200-200)/10) = 1/2,
        // Q((200-300)/10) ~ 1 - 7.6e-24 and every later term ~1:
        // P = 0.9 * 7.6e-24 + 0.05 * 0.5 + 0.05 * (1 - 7.6e-24) ~ 0.075.
        let odds = LossOdds { p: 0.1, q: 0.5 };
        let p = 10f64.powf(odds.log10_survival(200.0, 100.0, 10.0, 0.0));
        assert!((p - 0.075).abs() < 1e-8, "{p}");
        // The weights sum to one: at t = 0 nothing has arrived.
        let p0 = 10f64.powf(odds.log10_survival(0.0, 100.0, 10.0, 0.0));
        assert!((p0 - 1.0).abs() < 1e-12, "{p0}");
    }

    #[test]
    fn the_deviation_does_not_widen_with_the_losses() {
        // p = 0.2, q = 0.5: K = 0 w.p. 0.8, 1 w.p. 0.1, and P(K >= 2) = 0.1. Mean 100, std
        // 10, t = 210: Q(11) ~ 1.9e-28 for K = 0; Q((210 - 200)/10) = Q(1) = 0.158655 for
        // K = 1 (widened by sqrt 2 it would be Q(0.707) = 0.2398); K >= 2 is due at 300 or
        // later, 9 deviations past t, so it counts whole:
        // P = 0.1 * 0.15865525 + 0.1 = 0.115865525.
        let odds = LossOdds { p: 0.2, q: 0.5 };
        let p = 10f64.powf(odds.log10_survival(210.0, 100.0, 10.0, 0.0));
        assert!((p - 0.115_865_525_393_145_7).abs() < 1e-9, "{p}");
        // With a pause of 30 it is all 30 later: the pause is added once, not per period.
        let paused = 10f64.powf(odds.log10_survival(240.0, 100.0, 10.0, 30.0));
        assert!((paused - p).abs() < 1e-12, "{paused} vs {p}");
        // Just past the second heartbeat's due time by 3 deviations: Q(3) = 0.0013499 for K = 1.
        let late = 10f64.powf(odds.log10_survival(230.0, 100.0, 10.0, 0.0));
        assert!(
            (late - (0.1 * 0.001_349_898_031_630_1 + 0.1)).abs() < 1e-9,
            "{late}"
        );
    }

    #[test]
    fn grows_with_silence_and_stays_finite() {
        let odds = LossOdds { p: 0.3, q: 0.4 };
        let mut last = -1.0;
        for i in 0..4000 {
            let t = i as f64 * 5.0;
            let phi = odds.phi(t, 100.0, 20.0, 0.0);
            assert!(
                phi.is_finite() && phi >= last - 1e-12,
                "t={t}: {phi} after {last}"
            );
            last = phi;
        }
        assert!(last > 8.0, "a 20 s silence is convicted: {last}");
    }

    #[test]
    fn loss_only_ever_lowers_phi() {
        for odds in [LossOdds { p: 0.01, q: 0.0 }, LossOdds { p: 0.2, q: 0.6 }] {
            for t in [120.0, 180.0, 250.0, 600.0] {
                let normal = normal_phi((t - 100.0) / 20.0).max(0.0);
                assert!(
                    odds.phi(t, 100.0, 20.0, 0.0) <= normal + 1e-12,
                    "{odds:?} t={t}"
                );
            }
        }
    }

    #[test]
    fn odds_from_counters() {
        let mut r = PeerRecord::admitted(1, 0);
        assert!(LossOdds::from_record(&r).is_lossless());
        // 100 heartbeats, 10 within a burst (3 of which came after a gap), 25 lost in all.
        r.loss_heartbeats = 100;
        r.loss_gaps = 10;
        r.loss_lost = 25;
        r.burst_heartbeats = 10;
        r.burst_gaps = 3;
        let clean = LossOdds::from_record(&r);
        // Outside a burst: (7 + 0.1) / (90 + 1); q = (15 + 1) / (25 + 2).
        assert!((clean.p - 7.1 / 91.0).abs() < 1e-12);
        assert!((clean.q - 16.0 / 27.0).abs() < 1e-12);
        r.burst_left = 3;
        let burst = LossOdds::from_record(&r);
        // Inside one: (3 + 1) / (10 + 2).
        assert!((burst.p - 4.0 / 12.0).abs() < 1e-12, "{burst:?}");
        // A first loss: even odds of more until the peer's bursts are measured.
        let mut fresh = PeerRecord::admitted(1, 0);
        fresh.loss_heartbeats = 1;
        fresh.loss_gaps = 1;
        fresh.loss_lost = 1;
        fresh.burst_left = 16;
        let first = LossOdds::from_record(&fresh);
        assert_eq!((first.p, first.q), (0.5, 1.0 / 3.0));
    }
}
