//! Quality of service of a failure detector in the failure-free case (Chen, Toueg and
//! Aguilera 2002): every suspicion of a live peer is a mistake.
//!
//! An S-transition is a move from trust to suspicion, a T-transition the move back. Mistake
//! duration T_M runs from an S-transition to the next T-transition; mistake recurrence time
//! T_MR from one S-transition to the next. Query accuracy P_A, the chance that a query at a
//! random time gets a correct answer, is estimated as 1 - (time wrongly suspected) / (time
//! observed), which in steady state equals 1 - E(T_M)/E(T_MR).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default)]
pub struct QosCounter {
    s_transitions: u64,
    mistakes: u64,
    mistake_total_ns: u64,
    first_s_ns: Option<u64>,
    last_s_ns: Option<u64>,
    suspected_since_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QosReport {
    /// Mean mistake duration E(T_M), ms; null without a mistake.
    pub mistake_mean_ms: Option<f64>,
    /// Mean time between S-transitions E(T_MR), ms; null with fewer than two.
    pub mistake_recurrence_ms: Option<f64>,
    /// Total time wrongly suspected, ms.
    pub mistake_total_ms: f64,
    /// Suspicions that ended because the peer was heard again.
    pub mistakes: u64,
    /// 1 - (time wrongly suspected) / (time observed).
    pub query_accuracy: f64,
    /// Moves from trusted to suspected.
    pub s_transitions: u64,
}

impl QosCounter {
    /// Trust -> suspect at `at_ns`.
    pub fn suspect(&mut self, at_ns: u64) {
        if self.suspected_since_ns.is_some() {
            return;
        }
        self.s_transitions += 1;
        self.first_s_ns.get_or_insert(at_ns);
        self.last_s_ns = Some(at_ns);
        self.suspected_since_ns = Some(at_ns);
    }

    /// Suspect -> trust at `at_ns`: the suspicion was a mistake.
    pub fn trust(&mut self, at_ns: u64) {
        if let Some(since) = self.suspected_since_ns.take() {
            self.mistakes += 1;
            self.mistake_total_ns += at_ns.saturating_sub(since);
        }
    }

    pub fn report(&self, observed_ns: u64) -> QosReport {
        let total_ms = self.mistake_total_ns as f64 / 1e6;
        let recurrence = match (self.first_s_ns, self.last_s_ns) {
            (Some(first), Some(last)) if self.s_transitions >= 2 => {
                Some((last - first) as f64 / 1e6 / (self.s_transitions - 1) as f64)
            }
            _ => None,
        };
        QosReport {
            s_transitions: self.s_transitions,
            mistakes: self.mistakes,
            mistake_total_ms: total_ms,
            mistake_mean_ms: (self.mistakes > 0).then(|| total_ms / self.mistakes as f64),
            mistake_recurrence_ms: recurrence,
            query_accuracy: if observed_ns == 0 {
                1.0
            } else {
                (1.0 - self.mistake_total_ns as f64 / observed_ns as f64).clamp(0.0, 1.0)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mistakes_by_hand() {
        let ms = 1_000_000;
        let mut q = QosCounter::default();
        q.suspect(1000 * ms);
        q.suspect(1001 * ms); // already suspected: not a new transition
        q.trust(1200 * ms);
        q.suspect(5000 * ms);
        q.trust(5100 * ms);
        let r = q.report(10_000 * ms);
        assert_eq!((r.s_transitions, r.mistakes), (2, 2));
        assert_eq!(r.mistake_total_ms, 300.0);
        assert_eq!(r.mistake_mean_ms, Some(150.0));
        assert_eq!(r.mistake_recurrence_ms, Some(4000.0));
        assert!((r.query_accuracy - 0.97).abs() < 1e-12);
    }

    #[test]
    fn nothing_yet() {
        let r = QosCounter::default().report(0);
        assert_eq!(
            (r.mistake_mean_ms, r.mistake_recurrence_ms, r.query_accuracy),
            (None, None, 1.0)
        );
    }
}
