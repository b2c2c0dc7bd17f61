//! Per-peer suspicion tracking for events: when a peer's statistics change, the silence at
//! which phi crosses each level is computed once; every sweep then compares the clock with
//! those deadlines (integer compares, no erfc per peer per sweep).
//!
//! The cost is per read, not per heartbeat: a sweep learns that a peer was heard from its
//! last-heard word (`monitor_common::last_heard`), and a peer heard again within
//! [`LAZY_HEARTBEATS`] (at most a quarter of the window) of its last estimate keeps it. Its next deadline is then a
//! floor, the least silence at which phi could reach the first level whatever those
//! heartbeats did to the window (`DetectorParams::mean_floor_ms`); only when the clock passes
//! the floor, or every `LAZY_HEARTBEATS`, is the slot read and the exact deadline computed.
//! A floor is never later than the exact deadline, so no crossing is missed or seen late.

use monitor_common::{last_heard, maps::PeerRecord};
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

/// Most heartbeats a peer's estimate may go without being refreshed from its slot (see the
/// module docs), and never more than a quarter of the window. More means fewer slot reads and
/// a lower floor: with 128 intervals around 100 ms and the default 50 ms floor of the
/// deviation, 32 heartbeats put the first level's floor at 138 ms of silence against an exact
/// 164 ms, which a live peer seldom reaches.
pub const LAZY_HEARTBEATS: u64 = 32;

/// Heartbeats an estimate over a window of `window` intervals may go unrefreshed.
fn lazy_heartbeats(window: u32) -> u64 {
    (window as u64 / 4).clamp(1, LAZY_HEARTBEATS)
}

/// `PeerTracker::floor_ns` of a peer whose estimate is refreshed with every heartbeat.
const NO_FLOOR: u64 = u64::MAX;

/// The detector configuration shared by every peer.
#[derive(Debug, Clone)]
pub struct DetectorConfig {
    pub params: DetectorParams,
    pub levels: Levels,
    silences: LevelSilences,
    /// Heartbeats an estimate may go unrefreshed (`lazy_heartbeats`).
    lazy: u64,
}

impl DetectorConfig {
    pub fn new(params: DetectorParams, levels: Levels) -> Self {
        let silences = params.level_silences(levels.as_slice());
        let lazy = lazy_heartbeats(params.window);
        Self {
            params,
            levels,
            silences,
            lazy,
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

    /// A floor under the window's mean valid for the next `lazy` heartbeats (see
    /// `DetectorParams::mean_floor_ms`), None if the model or the window has none.
    fn mean_floor_ms(&self, record: &PeerRecord) -> Option<f64> {
        self.params.mean_floor_ms(record, self.lazy)
    }

    /// The least silence (ns) at which phi can reach the first level before the estimate is
    /// refreshed, or NO_FLOOR.
    fn first_floor_ns(&self, mean_floor_ms: Option<f64>) -> u64 {
        mean_floor_ms
            .and_then(|floor| self.params.crossing_floor_ms(&self.silences, 0, floor))
            .filter(|ms| ms.is_finite())
            .map_or(NO_FLOOR, |ms| (ms.max(0.0) * 1e6) as u64)
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
/// every sweep); the estimate and the QoS bookkeeping, touched when the estimate is refreshed,
/// on transitions and on queries only, live behind a pointer.
#[derive(Debug, Clone)]
pub struct PeerTracker {
    pub peer_id: u64,
    /// The slot's heartbeat count when the estimate was last refreshed from it.
    heartbeats: u64,
    /// The last arrival known: the slot's at the refresh, or a later one from the last-heard
    /// word (up to 1.024 µs early, which only makes deadlines earlier).
    last_arrival_ns: u64,
    /// Monotonic time at which phi reaches the next level not yet crossed (`exact`), or before
    /// which it cannot reach the first level (a floor); u64::MAX for never.
    next_deadline_ns: u64,
    /// The last-heard word last accounted for.
    seen_word: u64,
    /// Least silence (ns) at which phi can reach the first level until `LAZY_HEARTBEATS` more
    /// heartbeats, or NO_FLOOR: every heartbeat refreshes the estimate.
    floor_ns: u64,
    /// Levels crossed since the peer was last heard (0..=levels).
    crossed: u8,
    /// `next_deadline_ns` is the exact crossing of the current estimate, not a floor.
    exact: bool,
    cold: Box<Cold>,
}

#[derive(Debug, Clone)]
struct Cold {
    estimate: Estimate,
    /// The floor under the window's mean the refresh found (see `DetectorConfig::mean_floor_ms`).
    mean_floor_ms: Option<f64>,
    admitted_ns: u64,
    counter: QosCounter,
}

/// What a sweep needs next for a peer (see `PeerTracker::sweep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepStep {
    /// Nothing: the peer was checked from its word and its deadline.
    Done,
    /// Read its slot and pass the record to `PeerTracker::observe`.
    Refresh,
}

impl PeerTracker {
    /// `ring`: the window's intervals when the model needs them (see `DetectorConfig::estimate`).
    pub fn new(record: &PeerRecord, ring: &[u32], config: &DetectorConfig) -> Self {
        let mean_floor_ms = config.mean_floor_ms(record);
        let mut tracker = Self {
            peer_id: record.peer_id,
            heartbeats: record.heartbeats,
            last_arrival_ns: record.last_arrival_ns,
            next_deadline_ns: u64::MAX,
            seen_word: last_heard::word(record.last_arrival_ns, record.heartbeats),
            floor_ns: config.first_floor_ns(mean_floor_ms),
            crossed: 0,
            exact: true,
            cold: Box::new(Cold {
                estimate: config.estimate(record, ring),
                mean_floor_ms,
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

    /// Whether the next deadline is exact (else a floor: see the module docs).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// One sweep from the peer's last-heard `word`: a heartbeat within `LAZY_HEARTBEATS` of
    /// the estimate moves the deadline to the floor past it; an exact deadline that passed
    /// raises its levels. Anything else (a floor reached, the estimate too old, a suspected
    /// peer heard, a stall) asks for the slot to be read.
    pub fn sweep(
        &mut self,
        word: u64,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Event),
    ) -> SweepStep {
        if word != self.seen_word
            && let (Some(new), Some(at)) = (
                last_heard::heartbeats_since(self.seen_word, word),
                last_heard::arrival_after(word, self.last_arrival_ns),
            )
            && new > 0
        {
            let since_refresh =
                last_heard::heartbeats_since(last_heard::word(0, self.heartbeats), word);
            if self.crossed > 0
                || self.floor_ns == NO_FLOOR
                || time.hold
                || since_refresh.is_none_or(|n| n >= config.lazy)
            {
                return SweepStep::Refresh;
            }
            self.seen_word = word;
            self.last_arrival_ns = at;
            self.next_deadline_ns = at.saturating_add(self.floor_ns);
            self.exact = false;
        }
        if time.now_ns >= self.next_deadline_ns {
            if !self.exact {
                return SweepStep::Refresh;
            }
            self.check_deadlines(config, time, emit);
        }
        SweepStep::Done
    }

    /// The least silence (ms) at which this peer's phi can reach the level whose crossing
    /// constants are `threshold` (`DetectorParams::level_silences` of that one level), and the
    /// arrival it counts from, judged from its last-heard `word` without reading the slot:
    /// exact while the estimate is current, a floor within `LAZY_HEARTBEATS` of it; None past
    /// that.
    pub fn threshold_floor(
        &self,
        word: u64,
        threshold: &LevelSilences,
        params: &DetectorParams,
    ) -> Option<(u64, f64)> {
        let at =
            last_heard::arrival_after(word, self.last_arrival_ns).unwrap_or(self.last_arrival_ns);
        match last_heard::heartbeats_since(last_heard::word(0, self.heartbeats), word)? {
            0 => Some((
                self.last_arrival_ns,
                threshold.silence_ms(0, &self.cold.estimate),
            )),
            n if n <= lazy_heartbeats(params.window) => {
                let floor = params.crossing_floor_ms(threshold, 0, self.cold.mean_floor_ms?)?;
                Some((at, floor))
            }
            _ => None,
        }
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
        } else if !self.exact {
            // Nothing new since the estimate: the deadline was a floor, make it exact.
            self.last_arrival_ns = record.last_arrival_ns;
            self.seen_word = last_heard::word(record.last_arrival_ns, record.heartbeats);
            self.exact = true;
            self.next_deadline_ns = self.deadline(config);
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
        self.seen_word = last_heard::word(record.last_arrival_ns, record.heartbeats);
        self.cold.estimate = config.estimate(record, ring);
        self.cold.mean_floor_ms = config.mean_floor_ms(record);
        self.floor_ns = config.first_floor_ns(self.cold.mean_floor_ms);
        self.exact = true;
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
    /// levels it was already past raise nothing again. The caller first makes the estimate
    /// current (`observe` with the slot's record where `is_exact` is false).
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
        self.exact = true;
        self.floor_ns = new.first_floor_ns(self.cold.mean_floor_ms);
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

    /// The lazy sweep (last-heard words, estimates refreshed only when asked) raises exactly
    /// the events of a tracker that reads the slot at every sweep, on a stream with jitter,
    /// losses, late heartbeats, silences past every level and recoveries; and it reads the
    /// slot far less often.
    #[test]
    fn the_lazy_sweep_raises_what_reading_every_sweep_raises() {
        for model in [Model::Normal, Model::Loss, Model::Exponential, Model::Akka] {
            let params = DetectorParams {
                model,
                ..DetectorParams::DEFAULT
            };
            let cfg =
                DetectorConfig::new(params.clone(), Levels::new(vec![1.0, 3.0, 8.0]).unwrap());
            let xdp = params.window_config();
            let mut rng = fastrand::Rng::with_seed(11);
            let mut slot = monitor_common::maps::PeerSlot::admitted(5, 0);
            let (mut eager_events, mut lazy_events) = (Vec::new(), Vec::new());
            let mut eager = PeerTracker::new(&slot.record, &[], &cfg);
            let mut lazy = eager.clone();
            let mut word = last_heard::word(0, 0);
            let mut next_send = 100 * MS;
            let mut seq = 0;
            let mut reads = 0;
            let sweeps = 60_000u64;
            for step in 1..=sweeps {
                let now = step * 10 * MS;
                while next_send <= now {
                    seq += 1;
                    // 2% lost, a silence of 1-3 s every 500 heartbeats or so.
                    let lost = rng.u8(0..50) == 0;
                    if !lost {
                        let at = next_send + rng.u64(0..5 * MS);
                        if let monitor_common::slot::Outcome::Accepted { .. } =
                            monitor_common::slot::arrive(&mut slot, at, seq, 1, &xdp)
                        {
                            word = last_heard::word(at, slot.record.heartbeats);
                        }
                    }
                    next_send += if rng.u16(0..500) == 0 {
                        rng.u64(1000..3000) * MS
                    } else {
                        100 * MS + rng.u64(0..20 * MS)
                    };
                }
                let time = at(now, now as f64 / 1e6, false);
                eager.observe(&slot.record, &[], &cfg, time, &mut |e| eager_events.push(e));
                if lazy.sweep(word, &cfg, time, &mut |e| lazy_events.push(e)) == SweepStep::Refresh
                {
                    reads += 1;
                    lazy.observe(&slot.record, &[], &cfg, time, &mut |e| lazy_events.push(e));
                }
            }
            assert!(
                eager_events
                    .iter()
                    .filter(|e| matches!(e, Event::Suspect { .. }))
                    .count()
                    > 20,
                "{model:?}: the stream crossed levels"
            );
            assert_eq!(lazy_events, eager_events, "{model:?}");
            let heartbeats = slot.record.heartbeats;
            assert!(
                reads * 8 < heartbeats,
                "{model:?}: {reads} slot reads for {heartbeats} heartbeats"
            );
        }
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
