//! Per-peer suspicion tracking for events: when a peer's statistics change, the silence at
//! which phi crosses each level is computed once; every sweep then compares the clock with
//! those deadlines (integer compares, no erfc per peer per sweep).

use monitor_common::maps::PeerRecord;
use serde::Serialize;

use super::{
    levels::Levels,
    model::{DetectorParams, Estimate, LevelSilences},
    qos::{QosCounter, QosReport},
};

/// What subscribers receive, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// phi crossed `level` upward.
    Suspect {
        id: u64,
        level: f64,
        phi: f64,
        silence_ms: f64,
        /// Unix time of detection, ms.
        at: u64,
        /// Unix time at which phi reached `level`, ms with microsecond precision; `at` is at
        /// most one sweep later.
        crossed_at: f64,
    },
    /// A suspected peer was heard again; `level` is the highest level it had reached.
    Recover {
        id: u64,
        level: f64,
        /// The silence that ended.
        silence_ms: f64,
        at: u64,
    },
    Admit {
        id: u64,
        at: u64,
    },
    Forget {
        id: u64,
        /// "request" (the `forget` op) or "expired" (silent beyond --expire-after).
        reason: String,
        at: u64,
    },
    /// This subscriber fell behind and missed `missed` events.
    Lagged {
        missed: u64,
    },
}

/// The detector configuration shared by every peer.
#[derive(Debug, Clone)]
pub struct DetectorConfig {
    pub params: DetectorParams,
    pub levels: Levels,
    silences: LevelSilences,
}

impl DetectorConfig {
    pub fn new(params: DetectorParams, levels: Levels) -> Self {
        let silences = params.level_silences(levels.as_slice());
        Self {
            params,
            levels,
            silences,
        }
    }

    /// The estimate of a peer from its record and, for models that need it (see
    /// `DetectorParams::needs_ring`), its window's intervals, oldest first.
    pub fn estimate(&self, record: &PeerRecord, ring: &[u32]) -> Estimate {
        self.params.estimate(record, ring)
    }

    /// phi of a peer last heard at `last_arrival_ns`, at `now_ns` (computed on read).
    pub fn phi(&self, estimate: &Estimate, last_arrival_ns: u64, now_ns: u64) -> f64 {
        let silence_ms = now_ns.saturating_sub(last_arrival_ns) as f64 / 1e6;
        self.params.phi(estimate, silence_ms)
    }

    /// Silence (ms) at which phi reaches level `index` for this estimate.
    fn crossing_ms(&self, index: usize, estimate: &Estimate) -> f64 {
        self.params.crossing_ms(
            &self.silences,
            index,
            self.levels.as_slice()[index],
            estimate,
        )
    }
}

/// When a sweep runs: the monotonic clock deadlines are compared with, the wall clock events
/// are stamped with, and whether new suspicions are held (the agent itself was just stalled).
#[derive(Debug, Clone, Copy)]
pub struct SweepTime {
    pub now_ns: u64,
    pub wall_ms: f64,
    pub hold: bool,
}

/// One peer's sweep state: one cache line of hot fields (the sweep touches it for every peer
/// every sweep); the estimate and the QoS bookkeeping, touched when the peer is heard, on
/// transitions and on queries only, live behind a pointer.
#[derive(Debug, Clone)]
pub struct PeerTracker {
    pub peer_id: u64,
    heartbeats: u64,
    last_arrival_ns: u64,
    /// Monotonic time at which phi reaches the next level not yet crossed; u64::MAX for never.
    next_deadline_ns: u64,
    /// Levels crossed since the peer was last heard (0..=levels).
    crossed: u8,
    cold: Box<Cold>,
}

#[derive(Debug, Clone)]
struct Cold {
    estimate: Estimate,
    admitted_ns: u64,
    counter: QosCounter,
}

impl PeerTracker {
    /// `ring`: the window's intervals when the model needs them (see `DetectorConfig::estimate`).
    pub fn new(record: &PeerRecord, ring: &[u32], config: &DetectorConfig) -> Self {
        let mut tracker = Self {
            peer_id: record.peer_id,
            heartbeats: record.heartbeats,
            last_arrival_ns: record.last_arrival_ns,
            next_deadline_ns: u64::MAX,
            crossed: 0,
            cold: Box::new(Cold {
                estimate: config.estimate(record, ring),
                admitted_ns: record.last_arrival_ns,
                counter: QosCounter::default(),
            }),
        };
        tracker.next_deadline_ns = tracker.deadline(config);
        tracker
    }

    /// When phi reaches the first level not yet crossed (a multiply-add for the models with a
    /// closed form, see LevelSilences).
    fn deadline(&self, config: &DetectorConfig) -> u64 {
        let level = self.crossed as usize;
        if level >= config.silences.len() {
            return u64::MAX;
        }
        let silence_ns = config.crossing_ms(level, &self.cold.estimate) * 1e6;
        if silence_ns.is_finite() {
            self.last_arrival_ns
                .saturating_add(silence_ns.max(0.0) as u64)
        } else {
            u64::MAX
        }
    }

    /// Accepted heartbeats when last observed: the sweep compares the kernel's count with
    /// this before it reads the whole record.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats
    }

    /// Levels crossed since the peer was last heard (0 to the number of levels).
    pub fn crossed(&self) -> u8 {
        self.crossed
    }

    /// Arrival of the last heartbeat seen, and the estimate made from the window then.
    pub fn last_heard(&self) -> (u64, &Estimate) {
        (self.last_arrival_ns, &self.cold.estimate)
    }

    /// One sweep with a fresh record: notices a new heartbeat (recovery, new deadlines), then
    /// any level whose deadline has passed.
    pub fn observe(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Event),
    ) {
        if record.heartbeats != self.heartbeats {
            self.heard(record, ring, config, time.wall_ms, emit);
        }
        self.check_deadlines(config, time, emit);
    }

    fn heard(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        config: &DetectorConfig,
        wall_ms: f64,
        emit: &mut impl FnMut(Event),
    ) {
        let levels = config.levels.as_slice();
        let crossed = self.crossed as usize;
        if crossed > 0 {
            emit(Event::Recover {
                id: self.peer_id,
                level: levels[crossed - 1],
                silence_ms: record.last_arrival_ns.saturating_sub(self.last_arrival_ns) as f64
                    / 1e6,
                at: wall_ms as u64,
            });
            if crossed == levels.len() {
                self.cold.counter.trust(record.last_arrival_ns);
            }
        }
        self.crossed = 0;
        self.heartbeats = record.heartbeats;
        self.last_arrival_ns = record.last_arrival_ns;
        self.cold.estimate = config.estimate(record, ring);
        self.next_deadline_ns = self.deadline(config);
    }

    /// Raises every level whose deadline has passed, lowest first. With `hold`, none (the
    /// agent itself was just stalled and cannot trust its view of time yet).
    pub fn check_deadlines(
        &mut self,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Event),
    ) {
        let SweepTime {
            now_ns,
            wall_ms,
            hold,
        } = time;
        let levels = config.levels.as_slice();
        if hold {
            return;
        }
        while now_ns >= self.next_deadline_ns {
            let silence_ms = now_ns.saturating_sub(self.last_arrival_ns) as f64 / 1e6;
            let late_ms = (now_ns - self.next_deadline_ns) as f64 / 1e6;
            emit(Event::Suspect {
                id: self.peer_id,
                level: levels[self.crossed as usize],
                phi: config.params.phi(&self.cold.estimate, silence_ms),
                silence_ms,
                at: wall_ms as u64,
                crossed_at: wall_ms - late_ms,
            });
            self.crossed += 1;
            self.next_deadline_ns = self.deadline(config);
            if self.crossed as usize == levels.len() {
                self.cold.counter.suspect(now_ns);
            }
        }
    }

    /// The levels changed from `old` to `new`: the peer is past the new levels whose
    /// deadlines have passed. A level it is past now and was not past before (a new level, or
    /// one that moved below its phi) is raised as an event, with the time it was crossed;
    /// levels it was already past raise nothing again.
    pub fn relevel(
        &mut self,
        old: &DetectorConfig,
        new: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Event),
    ) {
        let was_past: Vec<f64> = old.levels.as_slice()[..self.crossed as usize].to_vec();
        let was_convicted = self.crossed as usize == old.levels.as_slice().len();
        let levels = new.levels.as_slice();
        self.crossed = 0;
        loop {
            let deadline = self.deadline(new);
            if deadline > time.now_ns {
                break;
            }
            let level = levels[self.crossed as usize];
            if !was_past.contains(&level) {
                let silence_ms = time.now_ns.saturating_sub(self.last_arrival_ns) as f64 / 1e6;
                let late_ms = (time.now_ns - deadline) as f64 / 1e6;
                emit(Event::Suspect {
                    id: self.peer_id,
                    level,
                    phi: new.params.phi(&self.cold.estimate, silence_ms),
                    silence_ms,
                    at: time.wall_ms as u64,
                    crossed_at: time.wall_ms - late_ms,
                });
            }
            self.crossed += 1;
        }
        self.next_deadline_ns = self.deadline(new);
        let convicted = self.crossed as usize == levels.len();
        if convicted && !was_convicted {
            self.cold.counter.suspect(time.now_ns);
        } else if was_convicted && !convicted {
            self.cold.counter.trust(time.now_ns);
        }
    }

    /// QoS at the highest level since admission.
    pub fn qos(&self, now_ns: u64) -> QosReport {
        self.cold
            .counter
            .report(now_ns.saturating_sub(self.cold.admitted_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::model::Model;

    const MS: u64 = 1_000_000;

    fn at(now_ns: u64, wall_ms: f64, hold: bool) -> SweepTime {
        SweepTime {
            now_ns,
            wall_ms,
            hold,
        }
    }

    fn config() -> DetectorConfig {
        let params = DetectorParams {
            model: Model::Fixed,
            timeout_ms: 100.0,
            ..DetectorParams::DEFAULT
        };
        DetectorConfig::new(params, Levels::new(vec![1.0, 3.0]).unwrap())
    }

    fn heard(record: &mut PeerRecord, at_ns: u64) {
        record.heartbeats += 1;
        record.last_arrival_ns = at_ns;
    }

    #[test]
    fn suspects_in_level_order_then_recovers() {
        let cfg = DetectorConfig::new(
            DetectorParams {
                model: Model::Exponential,
                first_interval_ms: 100.0,
                ..DetectorParams::DEFAULT
            },
            Levels::new(vec![1.0, 3.0, 8.0]).unwrap(),
        );
        let mut record = PeerRecord::admitted(9, 1000 * MS);
        let mut t = PeerTracker::new(&record, &[], &cfg);
        let mut events = Vec::new();
        // Bootstrap mean 100 ms: exponential crossings at 230, 691, 1842 ms of silence.
        t.observe(&record, &[], &cfg, at(1200 * MS, 0.0, false), &mut |e| {
            events.push(e)
        });
        assert!(events.is_empty());
        t.observe(&record, &[], &cfg, at(3000 * MS, 0.0, false), &mut |e| {
            events.push(e)
        });
        let levels: Vec<f64> = events
            .iter()
            .map(|e| match e {
                Event::Suspect {
                    level,
                    phi,
                    crossed_at,
                    ..
                } => {
                    assert!(phi >= level);
                    // Crossing at 1000 ms + level * 100 ln 10 ms, seen at 3000 ms, wall 0.
                    let expected = 1000.0 + level * 100.0 * std::f64::consts::LN_10 - 3000.0;
                    assert!(
                        (crossed_at - expected).abs() < 1e-3,
                        "{crossed_at} vs {expected}"
                    );
                    *level
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            levels,
            vec![1.0, 3.0, 8.0],
            "all crossed levels, lowest first"
        );
        events.clear();
        heard(&mut record, 3100 * MS);
        t.observe(&record, &[], &cfg, at(3100 * MS, 0.0, false), &mut |e| {
            events.push(e)
        });
        assert_eq!(
            events,
            vec![Event::Recover {
                id: 9,
                level: 8.0,
                silence_ms: 2100.0,
                at: 0
            }]
        );
        let q = t.qos(3100 * MS);
        assert_eq!((q.s_transitions, q.mistakes), (1, 1));
    }

    #[test]
    fn a_stall_holds_suspicions_but_not_recoveries() {
        let cfg = config();
        let mut record = PeerRecord::admitted(1, 0);
        let mut t = PeerTracker::new(&record, &[], &cfg);
        let mut events = Vec::new();
        t.observe(&record, &[], &cfg, at(500 * MS, 0.0, true), &mut |e| {
            events.push(e)
        });
        assert!(events.is_empty(), "held");
        t.observe(&record, &[], &cfg, at(510 * MS, 0.0, false), &mut |e| {
            events.push(e)
        });
        assert_eq!(events.len(), 2);
        events.clear();
        heard(&mut record, 520 * MS);
        t.observe(&record, &[], &cfg, at(520 * MS, 0.0, true), &mut |e| {
            events.push(e)
        });
        assert!(matches!(events[..], [Event::Recover { .. }]));
    }

    #[test]
    fn no_repeat_events_while_silence_continues() {
        let cfg = config();
        let record = PeerRecord::admitted(1, 0);
        let mut t = PeerTracker::new(&record, &[], &cfg);
        let mut n = 0;
        for ms in (0..2000).step_by(50) {
            t.observe(&record, &[], &cfg, at(ms * MS, 0.0, false), &mut |_| n += 1);
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn the_hot_state_of_a_peer_fits_one_cache_line() {
        assert!(std::mem::size_of::<Option<PeerTracker>>() <= 64);
    }

    #[test]
    fn events_serialise_as_documented() {
        let e = Event::Suspect {
            id: 7,
            level: 8.0,
            phi: 8.5,
            silence_ms: 300.0,
            at: 1,
            crossed_at: 0.5,
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"suspect","id":7,"level":8.0,"phi":8.5,"silence_ms":300.0,"at":1,"crossed_at":0.5})
        );
        let e = Event::Lagged { missed: 3 };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event":"lagged","missed":3})
        );
    }
}
