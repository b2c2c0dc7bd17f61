//! Per-peer suspicion tracking for events: when a peer's statistics change, the silence at
//! which phi crosses each level is computed once; every sweep then compares the clock with
//! those deadlines (integer compares, no erfc per peer per sweep).
//!
//! The cost is per read, not per heartbeat: a sweep learns that a peer was heard from its
//! last-heard word (`monitor_common::last_heard`), and a peer heard again within a span of
//! up to [`MAX_FLOOR_SPAN`] (at most a quarter of the window) keeps its estimate. Its next
//! deadline is then a floor, the least silence at which phi could reach the first level
//! whatever those heartbeats did to the window (`DetectorParams::mean_floor`). When the span
//! is used up or the clock passes the floor, a full window whose every new interval entered it
//! (the word's count says so) gets a new floor from the time those heartbeats took, without
//! its slot (`PeerTracker::refloor`), for up to a window of heartbeats; only otherwise is the
//! slot read and the exact deadline computed. A floor is never later than the exact deadline,
//! so no crossing is missed or seen late.

//!
//! The parts: [`DetectorConfig`] (`config.rs`) finds floors and crossings for every peer;
//! [`WordWatch`] and [`LevelFloor`] (`sweep_state.rs`) are what the sweep reads of each slot in
//! dense arrays; [`PeerTracker`] (here) is one peer's estimate, levels and QoS, touched only
//! when the dense state says it must be.

mod config;
mod sweep_state;
#[cfg(test)]
mod tests;

use monitor_common::{
    last_heard,
    maps::{MAX_INTERVAL_US, PeerRecord},
};
use serde::{Deserialize, Serialize};

use self::config::RefloorBasis;
use self::sweep_state::{NO_FLOOR, WatchDeadline, exact_gap, floor_ns, word_count};
pub use self::{
    config::DetectorConfig,
    sweep_state::{LevelFloor, MAX_FLOOR_SPAN, WordWatch},
};
use super::{
    model::{DetectorParams, Estimate, LevelSilences},
    qos::{QosCounter, QosReport},
};

/// phi of peer `id` crossed `level` upward: the `suspect` event's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspicion {
    pub id: u64,
    pub level: f64,
    pub phi: f64,
    pub silence_ms: f64,
    /// Unix time of detection, ms.
    pub at: u64,
    /// Unix time at which phi reached `level`, ms with microsecond precision; `at` is the same
    /// moment when the sweep armed the deadline (the agent's due-soon heap), at most one scan
    /// later when it did not.
    pub crossed_at: f64,
}

/// A suspected peer was heard again; `level` is the highest level it had reached: the
/// `recover` event's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    pub id: u64,
    pub level: f64,
    /// The silence that ended.
    pub silence_ms: f64,
    pub at: u64,
}

/// A change in a peer's suspicion, found by a sweep: what the agent publishes as the
/// `suspect` and `recover` events (`serving::event::Event`, which adds the agent's own).
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    Suspect(Suspicion),
    Recover(Recovery),
}

/// When a sweep runs: the monotonic clock deadlines are compared with, the wall clock events
/// are stamped with, and whether new suspicions are held (the agent itself was just stalled).
#[derive(Debug, Clone, Copy)]
pub struct SweepTime {
    pub now_ns: u64,
    pub wall_ms: f64,
    pub hold: bool,
}
/// What a sweep does next for a peer whose watch was not quiet (see `PeerTracker::step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepStep {
    /// Nothing more: the new heartbeat kept the estimate, or passed levels were raised.
    Done,
    /// Nothing more: a new floor was found without the slot (`PeerTracker::refloor`).
    Refloored,
    /// Read its slot and pass the record to `PeerTracker::observe`.
    Refresh,
}

/// One peer's estimate, levels and QoS bookkeeping, touched on refreshes, transitions and
/// queries only; what every sweep reads is its `WordWatch` and `LevelFloor`.
#[derive(Debug, Clone)]
pub struct PeerTracker {
    pub peer_id: u64,
    /// The slot's heartbeat count at the last refresh.
    heartbeats: u64,
    /// The word's count at the last refresh (`last_heard::count`, modulo 2^20).
    count: u32,
    /// The slot's last arrival at the last refresh (later arrivals are in the watch's word).
    last_arrival_ns: u64,
    /// Levels crossed since the peer was last heard (0..=levels); while any is, `LevelFloor` has no
    /// floor, so the next heartbeat is read (its recovery is an event).
    crossed: u8,
    /// The floor under the window's mean over `LevelFloor`'s span, as the refresh or the last
    /// refloor found it (see `DetectorConfig::span_floor`, `refloor`), NaN for none; here
    /// rather than in `RefreshState` because `suspects` reads it for every peer.
    mean_floor_ms: f64,
    /// What `refloor` needs of the last refresh; None where it cannot help. Here rather than
    /// in `RefreshState`: a renewal (one a peer every 32 heartbeats) read it behind the box,
    /// a second miss that waited for the first (the box's address is in the tracker); beside
    /// the tracker's other fields its lines' misses overlap theirs. At 50,000 peers x 10 Hz
    /// that took the sweep's mean scan from 665 to 524 us (docs/tuning.md, "The renewal's
    /// basis beside the tracker"), for 88 bytes more a slot of capacity left empty.
    basis: Option<RefloorBasis>,
    refresh: Box<RefreshState>,
}

#[derive(Debug, Clone)]
struct RefreshState {
    estimate: Estimate,
    admitted_ns: u64,
    counter: QosCounter,
}

impl PeerTracker {
    /// A tracker from the slot's record (and, where the model needs them, `ring`: see
    /// `DetectorConfig::estimate`), with the watch and level floor that go with it.
    pub fn new(
        record: &PeerRecord,
        ring: &[u32],
        config: &DetectorConfig,
    ) -> (Self, WordWatch, LevelFloor) {
        let mut tracker = Self {
            peer_id: record.peer_id,
            heartbeats: record.heartbeats,
            count: word_count(last_heard::of_record(record)),
            last_arrival_ns: record.last_arrival_ns,
            crossed: 0,
            mean_floor_ms: f64::NAN,
            basis: None,
            refresh: Box::new(RefreshState {
                estimate: config.estimate(record, ring),
                admitted_ns: record.last_arrival_ns,
                counter: QosCounter::default(),
            }),
        };
        let (mut watch, mut level_floor) = (WordWatch::NEW, LevelFloor::NONE);
        tracker.refreshed(record, config, &mut watch, &mut level_floor);
        (tracker, watch, level_floor)
    }

    /// The watch and level floor after the estimate was made from `record`.
    fn refreshed(
        &mut self,
        record: &PeerRecord,
        config: &DetectorConfig,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
    ) {
        // The first level's exact crossing, computed once: the deadline while no level is
        // crossed, and what the floor is held against.
        let exact_ms = (self.crossed == 0).then(|| config.crossing_ms(0, &self.refresh.estimate));
        let floor =
            exact_ms.and_then(|exact| config.span_floor(record, &self.refresh.estimate, exact));
        self.mean_floor_ms = floor.as_ref().map_or(f64::NAN, |f| f.mean_ms);
        self.basis = floor.as_ref().and_then(|f| f.basis);
        watch.word = last_heard::of_record(record);
        self.count = word_count(watch.word);
        *level_floor = LevelFloor {
            floor_ns: floor.as_ref().map_or(NO_FLOOR, |f| floor_ns(f.silence_ms)),
            refreshed: self.count,
            heartbeats: floor.as_ref().map_or(0, |f| f.heartbeats),
            deadline: if exact_ms.is_some() {
                WatchDeadline::FirstCrossing
            } else {
                WatchDeadline::LaterCrossing
            },
            // A filling window's estimate moves with every interval (its bootstrap samples
            // weigh less each time), so this one's crossing does not predict the next
            // heartbeats' (it came 25 ms late at the p99 at 1 Hz): its floor is the
            // prediction there, armed like an exact deadline.
            exact_gap: exact_ms
                .zip(
                    floor
                        .as_ref()
                        .filter(|f| f.basis.is_some_and(|b| b.moments.is_full())),
                )
                .map_or(0, |(exact, f)| exact_gap(exact - f.silence_ms)),
        };
        watch.deadline_ns = match exact_ms {
            Some(ms) => self.after_silence(ms),
            None => self.deadline(config),
        };
    }

    /// When phi reaches the first level not yet crossed (a multiply-add for the models with a
    /// closed form, see LevelSilences).
    fn deadline(&self, config: &DetectorConfig) -> u64 {
        let level = self.crossed as usize;
        if level >= config.silences.len() {
            return u64::MAX;
        }
        self.after_silence(config.crossing_ms(level, &self.refresh.estimate))
    }

    /// The time `silence_ms` after the last arrival; u64::MAX for an infinite silence.
    fn after_silence(&self, silence_ms: f64) -> u64 {
        let silence_ns = silence_ms * 1e6;
        if silence_ns.is_finite() {
            self.last_arrival_ns
                .saturating_add(silence_ns.max(0.0) as u64)
        } else {
            u64::MAX
        }
    }

    /// The last arrival known at `now_ns`: the refresh's, or a later one from the watch's word
    /// (up to 1.024 µs early).
    pub fn last_arrival_ns(&self, watch: &WordWatch, now_ns: u64) -> u64 {
        self.last_arrival_ns
            .max(last_heard::arrival_near(watch.word, now_ns))
    }

    /// The estimate of the last refresh (at most a window of heartbeats old: see `refloor`).
    pub fn estimate(&self) -> &Estimate {
        &self.refresh.estimate
    }

    /// For a peer whose watch was not quiet (see `WordWatch::is_quiet`): a heartbeat within the
    /// floor's span keeps the estimate (`LevelFloor::advance_over_covered`); an exact deadline that passed raises
    /// its levels. Anything else (a floor reached, the estimate too old, a suspected peer
    /// heard, a stall) asks for the slot to be read.
    pub fn step(
        &mut self,
        word: u64,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) -> SweepStep {
        if level_floor.advance_over_covered(word, watch, time) {
            return SweepStep::Done;
        }
        if word != watch.word || !level_floor.exact() {
            if !time.hold && self.refloor(word, watch, level_floor, config, time.now_ns) {
                return SweepStep::Refloored;
            }
            return SweepStep::Refresh;
        }
        self.check_deadlines(watch, level_floor, config, time, emit);
        SweepStep::Done
    }

    /// A heard peer whose span is used up, or whose floor came, gets a new floor without its
    /// slot if it can: while no level is crossed, fewer heartbeats came since the refresh than
    /// its window held then, and every interval since entered it (the word's count advanced by less than
    /// `LEFT_OUT_STEP`), those intervals sum to at least the time they took, less a
    /// microsecond each (the kernel rounds each down), and the window's mean stays above
    /// what `MeanFloor::after_heard_ms` says. True if the new floor is not yet reached.
    fn refloor(
        &mut self,
        word: u64,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        config: &DetectorConfig,
        now_ns: u64,
    ) -> bool {
        let Some(basis) = self.basis.filter(|_| self.crossed == 0) else {
            return false;
        };
        let Some(heard) =
            last_heard::heartbeats_since(last_heard::word(0, self.count as u64), word)
                .filter(|&n| n < last_heard::LEFT_OUT_STEP)
        else {
            return false;
        };
        let newest_ns = last_heard::arrival_near(word, now_ns).max(self.last_arrival_ns);
        let took_ns = newest_ns - self.last_arrival_ns;
        // Longer, and an interval among them may have been capped at the kernel's maximum.
        if took_ns > MAX_INTERVAL_US * 1000 {
            return false;
        }
        let heard_us = took_ns as f64 / 1000.0 - heard as f64;
        let Some(floor) = config.heard_floor(&basis, heard, heard_us) else {
            return false;
        };
        let deadline_ns = newest_ns.saturating_add(floor_ns(floor.silence_ms));
        if deadline_ns <= now_ns {
            return false;
        }
        self.mean_floor_ms = floor.mean_ms;
        // The refresh's estimate still predicts the crossing: the heartbeats since took their
        // intervals' worth of time (else no refloor).
        let exact_ms = basis.exact_ms;
        *level_floor = LevelFloor {
            floor_ns: floor_ns(floor.silence_ms),
            refreshed: word_count(word),
            heartbeats: floor.heartbeats,
            deadline: WatchDeadline::Floor,
            // As at a refresh: a filling window's floor is its own prediction.
            exact_gap: if basis.moments.is_full() {
                exact_gap(exact_ms - floor.silence_ms)
            } else {
                0
            },
        };
        *watch = WordWatch { word, deadline_ns };
        true
    }

    /// The least silence (ms) at which this peer's phi can reach the level whose crossing
    /// constants are `threshold` (`DetectorParams::level_silences` of that one level), and the
    /// arrival it counts from, judged from the slot's current `word` without reading the slot:
    /// exact while the estimate is current, a floor within the floor's span; None past it.
    pub fn threshold_floor(
        &self,
        word: u64,
        level_floor: &LevelFloor,
        threshold: &LevelSilences,
        params: &DetectorParams,
        now_ns: u64,
    ) -> Option<(u64, f64)> {
        let current = last_heard::word(0, self.count as u64);
        if last_heard::heartbeats_since(current, word)? == 0 {
            return Some((
                self.last_arrival_ns,
                threshold.silence_ms(0, &self.refresh.estimate),
            ));
        }
        level_floor.covers(word)?;
        let mean_floor = Some(self.mean_floor_ms).filter(|m| !m.is_nan())?;
        // Nothing kept of the deviation's floor: the mean's alone (lower, so still a floor).
        let floor = params.crossing_floor_ms(threshold, 0, mean_floor, 0.0)?;
        let at = last_heard::arrival_near(word, now_ns).max(self.last_arrival_ns);
        Some((at, floor))
    }

    /// A refresh: the slot's `record` (and `ring` where the model needs it). A new heartbeat
    /// ends any suspicion and makes a new estimate; then any level whose deadline has passed
    /// is raised.
    #[expect(
        clippy::too_many_arguments,
        reason = "the watch and the level floor live in separate dense arrays the sweep scans"
    )]
    pub fn observe(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        if record.heartbeats != self.heartbeats {
            self.heard(record, ring, config, time.wall_ms, emit);
            self.refreshed(record, config, watch, level_floor);
        } else if !level_floor.exact() {
            // Nothing new since the estimate: the deadline was a floor, make it exact.
            self.refreshed(record, config, watch, level_floor);
        }
        self.check_deadlines(watch, level_floor, config, time, emit);
    }

    fn heard(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        config: &DetectorConfig,
        wall_ms: f64,
        emit: &mut impl FnMut(Transition),
    ) {
        let levels = config.levels.as_slice();
        let crossed = self.crossed as usize;
        if crossed > 0 {
            emit(Transition::Recover(Recovery {
                id: self.peer_id,
                level: levels[crossed - 1],
                silence_ms: record.last_arrival_ns.saturating_sub(self.last_arrival_ns) as f64
                    / 1e6,
                at: wall_ms as u64,
            }));
            if crossed == levels.len() {
                self.refresh.counter.trust(record.last_arrival_ns);
            }
        }
        self.crossed = 0;
        self.heartbeats = record.heartbeats;
        self.last_arrival_ns = record.last_arrival_ns;
        self.refresh.estimate = config.estimate_after(record, ring, &self.refresh.estimate);
    }

    /// Raises every level whose (exact) deadline has passed, lowest first. With `hold`, none
    /// (the agent itself was just stalled and cannot trust its view of time yet).
    fn check_deadlines(
        &mut self,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        let SweepTime { now_ns, hold, .. } = time;
        let levels = config.levels.as_slice();
        if hold {
            return;
        }
        while now_ns >= watch.deadline_ns {
            let level = levels[self.crossed as usize];
            emit(Transition::Suspect(self.suspicion(
                level,
                watch.deadline_ns,
                &config.params,
                time,
            )));
            self.crossed += 1;
            // A suspected peer heard again is read at once (its recovery is an event).
            level_floor.floor_ns = NO_FLOOR;
            level_floor.deadline = WatchDeadline::LaterCrossing;
            watch.deadline_ns = self.deadline(config);
            if self.crossed as usize == levels.len() {
                self.refresh.counter.suspect(now_ns);
            }
        }
    }

    /// The detector changed from `old` to `new` (SIGHUP; the same window rules, so the slot's
    /// window is one both read): news in the slot is taken under `old`, then the estimate is
    /// made again from the slot under `new` and the peer re-levelled (`relevel`). Without
    /// `record` (its slot could not be read) the estimate stays until the next read.
    #[expect(
        clippy::too_many_arguments,
        reason = "the watch and the level floor live in separate dense arrays the sweep scans"
    )]
    pub fn redetect(
        &mut self,
        slot: Option<(&PeerRecord, &[u32])>,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        old: &DetectorConfig,
        new: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        if let Some((record, ring)) = slot {
            self.observe(record, ring, watch, level_floor, old, time, emit);
            self.refresh.estimate = new.estimate_after(record, ring, &self.refresh.estimate);
            // The floors and the first deadline from the new estimate; `relevel` then finds
            // the levels the peer is past under `new`, against those it was past under `old`.
            let crossed = self.crossed;
            self.crossed = 0;
            self.refreshed(record, new, watch, level_floor);
            self.crossed = crossed;
        }
        self.relevel(watch, level_floor, old, new, time, emit);
    }

    /// The levels changed from `old` to `new`: the peer is past the new levels whose
    /// deadlines have passed. A level it is past now and was not past before (a new level, or
    /// one that moved below its phi) is raised as an event, with the time it was crossed;
    /// levels it was already past raise nothing again. The caller first makes the estimate
    /// current (`observe` with the slot's record where `LevelFloor` says the deadline is a floor).
    pub fn relevel(
        &mut self,
        watch: &mut WordWatch,
        level_floor: &mut LevelFloor,
        old: &DetectorConfig,
        new: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
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
                emit(Transition::Suspect(self.suspicion(
                    level,
                    deadline,
                    &new.params,
                    time,
                )));
            }
            self.crossed += 1;
        }
        watch.deadline_ns = self.deadline(new);
        // The first level moved: the floor goes with it (and none while a level is crossed).
        // The first level's crossing from this estimate, for the watched word only if the
        // estimate is that word's (the caller read the slot): else a later heartbeat the floor
        // covered may have moved the window, and the deadline is not the crossing.
        let current =
            last_heard::heartbeats_since(last_heard::word(0, self.count as u64), watch.word)
                == Some(0);
        level_floor.deadline = if self.crossed == 0 && current {
            WatchDeadline::FirstCrossing
        } else {
            WatchDeadline::LaterCrossing
        };
        level_floor.floor_ns = if self.crossed == 0 && !self.mean_floor_ms.is_nan() {
            new.first_floor_ns(self.mean_floor_ms)
        } else {
            NO_FLOOR
        };
        level_floor.exact_gap = if level_floor.floor_ns == NO_FLOOR {
            0
        } else {
            let floor_ms = level_floor.floor_ns as f64 / 1e6;
            exact_gap(new.crossing_ms(0, &self.refresh.estimate) - floor_ms)
        };
        let convicted = self.crossed as usize == levels.len();
        if convicted && !was_convicted {
            self.refresh.counter.suspect(time.now_ns);
        } else if was_convicted && !convicted {
            self.refresh.counter.trust(time.now_ns);
        }
    }

    /// The suspicion of crossing `level` at `deadline_ns`, seen at `time`.
    fn suspicion(
        &self,
        level: f64,
        deadline_ns: u64,
        params: &DetectorParams,
        time: SweepTime,
    ) -> Suspicion {
        let silence_ms = time.now_ns.saturating_sub(self.last_arrival_ns) as f64 / 1e6;
        let late_ms = time.now_ns.saturating_sub(deadline_ns) as f64 / 1e6;
        Suspicion {
            id: self.peer_id,
            level,
            phi: params.phi(&self.refresh.estimate, silence_ms),
            silence_ms,
            at: time.wall_ms as u64,
            crossed_at: time.wall_ms - late_ms,
        }
    }

    /// Levels crossed since the peer was last heard (0 to the number of levels).
    pub fn crossed(&self) -> u8 {
        self.crossed
    }

    /// QoS at the highest level since admission.
    pub fn qos(&self, now_ns: u64) -> QosReport {
        self.refresh
            .counter
            .report(now_ns.saturating_sub(self.refresh.admitted_ns))
    }
}
