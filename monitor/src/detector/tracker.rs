//! Per-peer suspicion tracking for events: when a peer's statistics change, the silence at
//! which phi crosses each level is computed once; every sweep then compares the clock with
//! those deadlines (integer compares, no erfc per peer per sweep).
//!
//! The cost is per read, not per heartbeat: a sweep learns that a peer was heard from its
//! last-heard word (`monitor_common::last_heard`), and a peer heard again within a span of
//! up to [`LAZY_HEARTBEATS`] (at most a quarter of the window) keeps its estimate. Its next
//! deadline is then a floor, the least silence at which phi could reach the first level
//! whatever those heartbeats did to the window (`DetectorParams::mean_floor`). When the span
//! is used up or the clock passes the floor, a full window whose every new interval entered it
//! (the word's count says so) gets a new floor from the time those heartbeats took, without
//! its slot (`PeerTracker::refloor`), for up to a window of heartbeats; only otherwise is the
//! slot read and the exact deadline computed. A floor is never later than the exact deadline,
//! so no crossing is missed or seen late.

use monitor_common::{
    last_heard,
    maps::{MAX_INTERVAL_US, PeerRecord},
};
use serde::{Deserialize, Serialize};

use super::{
    levels::Levels,
    model::{DetectorParams, Estimate, LevelSilences, MeanFloor},
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
    /// Unix time at which phi reached `level`, ms with microsecond precision; `at` is at most
    /// one sweep later.
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

/// Most heartbeats one floor covers (see the module docs). A peer gets the most of 32, 16, 8,
/// 4, 2 or 1, and never more than a quarter of the intervals in its window, for which the floor
/// keeps at least half of the exact margin above the mean (see `DetectorConfig::lazy_floor`):
/// 32 for a 100 ms sender with the defaults (floor 138 ms of silence against an exact 164 ms),
/// 4 for a 1 s one. Below `last_heard::LEFT_OUT_STEP`, so a span never covers a heartbeat
/// whose interval the window left out.
pub const LAZY_HEARTBEATS: u8 = 32;
const _: () = assert!((LAZY_HEARTBEATS as u64) < last_heard::LEFT_OUT_STEP);

/// The spans a floor may cover, longest first.
const SPANS: [u8; 6] = [32, 16, 8, 4, 2, 1];

/// `Lazy::floor_ns` of a peer whose estimate is refreshed with every heartbeat.
const NO_FLOOR: u64 = u64::MAX;

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

    /// How many heartbeats the estimate of `record` may go unrefreshed, the floor under the
    /// window's mean over that many (`MeanFloor`), and the first level's floor for it: the
    /// most of 32, 16, ..., 1 (at most a quarter of the window's intervals) whose floor keeps
    /// half the exact margin (`exact_ms`, the first level's crossing) above the mean. None:
    /// refresh with every heartbeat.
    fn lazy_floor(
        &self,
        record: &PeerRecord,
        estimate: &Estimate,
        exact_ms: f64,
    ) -> Option<LazyFloor> {
        let want = estimate.mean_ms + (exact_ms - estimate.mean_ms) / 2.0;
        if !want.is_finite() || exact_ms <= estimate.mean_ms {
            return None;
        }
        let most = (record.samples / 4).min(LAZY_HEARTBEATS as u32) as u64;
        let mean_floor = self.params.mean_floor(record)?;
        let mut floor = self.longest_span(most, want, |j| Some(mean_floor.after_ms(j)))?;
        floor.basis = Some(HeardBasis {
            moments: mean_floor,
            want_ms: want,
        });
        Some(floor)
    }

    /// A new floor for a peer `heard` heartbeats after its refresh, all of whose intervals
    /// entered its full window and took `heard_us` at least (see `MeanFloor::after_heard_ms`):
    /// the longest span that keeps the refresh's half margin (`HeardBasis::want_ms`). None if
    /// no span does, or the window is not full or would be outgrown.
    fn heard_floor(&self, basis: &HeardBasis, heard: u64, heard_us: f64) -> Option<LazyFloor> {
        let most = (basis.moments.window() / 4).min(LAZY_HEARTBEATS as u64);
        self.longest_span(most, basis.want_ms, |j| {
            basis.moments.after_heard_ms(heard, heard_us, j)
        })
    }

    /// The longest of the spans of at most `most` heartbeats whose floor keeps the first
    /// level's least silence at `want_ms` or more, `mean_after` giving the floor under the
    /// window's mean over a span (None: no floor for it).
    fn longest_span(
        &self,
        most: u64,
        want_ms: f64,
        mean_after: impl Fn(u64) -> Option<f64>,
    ) -> Option<LazyFloor> {
        SPANS
            .into_iter()
            .filter(|&j| j as u64 <= most)
            .find_map(|heartbeats| {
                let mean_ms = mean_after(heartbeats as u64)?;
                let silence_ms = self.params.crossing_floor_ms(&self.silences, 0, mean_ms)?;
                (silence_ms >= want_ms).then_some(LazyFloor {
                    heartbeats,
                    mean_ms,
                    silence_ms,
                    basis: None,
                })
            })
    }

    /// The least silence (ns) at which phi can reach the first level for a window mean of at
    /// least `mean_floor_ms`, or NO_FLOOR.
    fn first_floor_ns(&self, mean_floor_ms: f64) -> u64 {
        self.params
            .crossing_floor_ms(&self.silences, 0, mean_floor_ms)
            .map_or(NO_FLOOR, floor_ns)
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

/// What `DetectorConfig::lazy_floor` found for a refreshed estimate (or `heard_floor` for one
/// heard since).
struct LazyFloor {
    /// Heartbeats the floor covers.
    heartbeats: u8,
    /// The floor under the window's mean over those heartbeats.
    mean_ms: f64,
    /// The least silence at which phi can reach the first level meanwhile.
    silence_ms: f64,
    /// What later floors are found from (`PeerTracker::refloor`), from a refresh.
    basis: Option<HeardBasis>,
}

/// What a refresh leaves for later floors: the window's moments, and the least floor worth
/// keeping (the mean plus half the exact margin: a lower floor would be reached too often).
#[derive(Debug, Clone, Copy)]
struct HeardBasis {
    moments: MeanFloor,
    want_ms: f64,
}

/// The count a word carries (see `last_heard::count`), as `Lazy` and the tracker keep it.
fn word_count(word: u64) -> u32 {
    last_heard::count_of(word) as u32
}

/// A floor's silence in ns, or NO_FLOOR if it is not finite.
fn floor_ns(silence_ms: f64) -> u64 {
    if silence_ms.is_finite() {
        (silence_ms.max(0.0) * 1e6) as u64
    } else {
        NO_FLOOR
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

/// What every sweep reads of a slot, 16 bytes in a dense array (with the kernel's words, 24
/// bytes a peer a sweep): a slot whose word has not moved and whose deadline has not come is
/// done with one compare of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Watch {
    /// The last-heard word last accounted for.
    pub word: u64,
    /// When phi reaches the next level not yet crossed (`Lazy::exact`), or the floor before
    /// which it cannot reach the first level; u64::MAX for never.
    pub deadline_ns: u64,
}

impl Watch {
    /// A slot no tracker watches yet: any word is news.
    pub const NEW: Self = Self {
        word: u64::MAX,
        deadline_ns: u64::MAX,
    };

    /// A slot with no peer: nothing to do until its word changes (an admission resets it).
    pub fn vacant(word: u64) -> Self {
        Self {
            word,
            deadline_ns: u64::MAX,
        }
    }

    /// Nothing to do this sweep: no heartbeat since, no deadline reached.
    #[inline(always)]
    pub fn is_quiet(&self, word: u64, now_ns: u64) -> bool {
        word == self.word && now_ns < self.deadline_ns
    }
}

/// What a sweep reads of a slot whose word moved or whose deadline came: whether a heard peer
/// can keep its estimate. 16 bytes, in a second dense array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Lazy {
    /// Least silence (ns) at which phi can reach the first level until `heartbeats` more
    /// heartbeats after `refreshed` (a refresh or a refloor), or NO_FLOOR (also while a level
    /// is crossed). Set only by the tracker, so a slot with a floor has a tracker of its
    /// current peer.
    floor_ns: u64,
    /// The word's count (`last_heard::count`, modulo 2^20) when the floor was set: at a
    /// refresh, or at a refloor.
    refreshed: u32,
    /// Heartbeats the floor covers.
    heartbeats: u8,
    /// `Watch::deadline_ns` is the exact crossing of the current estimate, not a floor.
    exact: bool,
}

impl Lazy {
    pub const NONE: Self = Self {
        floor_ns: NO_FLOOR,
        refreshed: 0,
        heartbeats: 0,
        exact: true,
    };

    /// A sweep's look at a slot whose watch was not quiet, without its tracker: a new
    /// heartbeat the floor covers moves the deadline to the floor past it. True if nothing
    /// more is needed; false if the tracker is (a heartbeat the floor does not cover, a
    /// deadline reached, a stall, a word that does not read as newer).
    #[inline]
    pub fn absorb(&mut self, word: u64, watch: &mut Watch, time: SweepTime) -> bool {
        if word != watch.word {
            // A count that does not read as advanced (it wrapped past half its range, or the
            // slot was reset) is news too: the slot decides.
            if time.hold
                || last_heard::heartbeats_since(watch.word, word).is_none_or(|n| n == 0)
                || self
                    .covers(word)
                    .is_none_or(|n| n >= self.heartbeats as u64)
            {
                return false;
            }
            watch.word = word;
            watch.deadline_ns =
                last_heard::arrival_near(word, time.now_ns).saturating_add(self.floor_ns);
            self.exact = false;
        }
        time.now_ns < watch.deadline_ns
    }

    /// Whether phi is surely below the first level at `now_ns`, from the dense arrays alone
    /// (no tracker, no slot): what lets `suspects` pass over most peers. A floor is only
    /// ever set while no level is crossed (`refreshed`, `check_deadlines` and `relevel` clear
    /// it otherwise). With the slot's word unchanged since the sweep, the watch's deadline is
    /// the first level's exact crossing or a floor under it; with newer heartbeats the
    /// floor's span still covers, the floor past the newest arrival holds, as in `absorb`.
    #[inline]
    pub fn below_first_level(&self, watch: &Watch, word: u64, now_ns: u64) -> bool {
        if self.floor_ns == NO_FLOOR {
            return false;
        }
        if word == watch.word {
            return now_ns < watch.deadline_ns;
        }
        last_heard::heartbeats_since(watch.word, word).is_some_and(|n| n > 0)
            && self.covers(word).is_some()
            && now_ns < last_heard::arrival_near(word, now_ns).saturating_add(self.floor_ns)
    }

    /// Heartbeats between the refresh and `word`, if within the floor's span.
    fn covers(&self, word: u64) -> Option<u64> {
        let since = last_heard::heartbeats_since(last_heard::word(0, self.refreshed as u64), word)?;
        (self.floor_ns != NO_FLOOR && since <= self.heartbeats as u64).then_some(since)
    }
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
/// queries only; what every sweep reads is its `Watch` and `Lazy`.
#[derive(Debug, Clone)]
pub struct PeerTracker {
    pub peer_id: u64,
    /// The slot's heartbeat count at the last refresh.
    heartbeats: u64,
    /// The word's count at the last refresh (`last_heard::count`, modulo 2^20).
    count: u32,
    /// The slot's last arrival at the last refresh (later arrivals are in the watch's word).
    last_arrival_ns: u64,
    /// Levels crossed since the peer was last heard (0..=levels); while any is, `Lazy` has no
    /// floor, so the next heartbeat is read (its recovery is an event).
    crossed: u8,
    /// The floor under the window's mean over `Lazy`'s span, as the refresh or the last
    /// refloor found it (see `DetectorConfig::lazy_floor`, `refloor`), NaN for none; here
    /// rather than in `Cold` because `suspects` reads it for every peer.
    mean_floor_ms: f64,
    cold: Box<Cold>,
}

#[derive(Debug, Clone)]
struct Cold {
    estimate: Estimate,
    admitted_ns: u64,
    counter: QosCounter,
    /// What `refloor` needs of the last refresh; None where it cannot help.
    basis: Option<HeardBasis>,
}

impl PeerTracker {
    /// A tracker from the slot's record (and, where the model needs them, `ring`: see
    /// `DetectorConfig::estimate`), with the watch and lazy state that go with it.
    pub fn new(record: &PeerRecord, ring: &[u32], config: &DetectorConfig) -> (Self, Watch, Lazy) {
        let mut tracker = Self {
            peer_id: record.peer_id,
            heartbeats: record.heartbeats,
            count: word_count(last_heard::of_record(record)),
            last_arrival_ns: record.last_arrival_ns,
            crossed: 0,
            mean_floor_ms: f64::NAN,
            cold: Box::new(Cold {
                estimate: config.estimate(record, ring),
                admitted_ns: record.last_arrival_ns,
                counter: QosCounter::default(),
                basis: None,
            }),
        };
        let (mut watch, mut lazy) = (Watch::NEW, Lazy::NONE);
        tracker.refreshed(record, config, &mut watch, &mut lazy);
        (tracker, watch, lazy)
    }

    /// The watch and lazy state after the estimate was made from `record`.
    fn refreshed(
        &mut self,
        record: &PeerRecord,
        config: &DetectorConfig,
        watch: &mut Watch,
        lazy: &mut Lazy,
    ) {
        // The first level's exact crossing, computed once: the deadline while no level is
        // crossed, and what the floor is held against.
        let exact_ms = (self.crossed == 0).then(|| config.crossing_ms(0, &self.cold.estimate));
        let floor =
            exact_ms.and_then(|exact| config.lazy_floor(record, &self.cold.estimate, exact));
        self.mean_floor_ms = floor.as_ref().map_or(f64::NAN, |f| f.mean_ms);
        self.cold.basis = floor.as_ref().and_then(|f| f.basis);
        watch.word = last_heard::of_record(record);
        self.count = word_count(watch.word);
        *lazy = Lazy {
            floor_ns: floor.as_ref().map_or(NO_FLOOR, |f| floor_ns(f.silence_ms)),
            refreshed: self.count,
            heartbeats: floor.as_ref().map_or(0, |f| f.heartbeats),
            exact: true,
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
        self.after_silence(config.crossing_ms(level, &self.cold.estimate))
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
    pub fn last_arrival_ns(&self, watch: &Watch, now_ns: u64) -> u64 {
        self.last_arrival_ns
            .max(last_heard::arrival_near(watch.word, now_ns))
    }

    /// The estimate of the last refresh (at most a window of heartbeats old: see `refloor`).
    pub fn estimate(&self) -> &Estimate {
        &self.cold.estimate
    }

    /// For a peer whose watch was not quiet (see `Watch::is_quiet`): a heartbeat within the
    /// floor's span keeps the estimate (`Lazy::absorb`); an exact deadline that passed raises
    /// its levels. Anything else (a floor reached, the estimate too old, a suspected peer
    /// heard, a stall) asks for the slot to be read.
    pub fn step(
        &mut self,
        word: u64,
        watch: &mut Watch,
        lazy: &mut Lazy,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) -> SweepStep {
        if lazy.absorb(word, watch, time) {
            return SweepStep::Done;
        }
        if word != watch.word || !lazy.exact {
            if !time.hold && self.refloor(word, watch, lazy, config, time.now_ns) {
                return SweepStep::Refloored;
            }
            return SweepStep::Refresh;
        }
        self.check_deadlines(watch, lazy, config, time, emit);
        SweepStep::Done
    }

    /// A heard peer whose span is used up, or whose floor came, gets a new floor without its
    /// slot if it can: while no level is crossed, the window was full at the refresh, and
    /// every interval since entered it (the word's count advanced by less than
    /// `LEFT_OUT_STEP`), those intervals sum to at least the time they took, less a
    /// microsecond each (the kernel rounds each down), and the window's mean stays above
    /// what `MeanFloor::after_heard_ms` says. True if the new floor is not yet reached.
    fn refloor(
        &mut self,
        word: u64,
        watch: &mut Watch,
        lazy: &mut Lazy,
        config: &DetectorConfig,
        now_ns: u64,
    ) -> bool {
        let Some(basis) = self.cold.basis.filter(|_| self.crossed == 0) else {
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
        *lazy = Lazy {
            floor_ns: floor_ns(floor.silence_ms),
            refreshed: word_count(word),
            heartbeats: floor.heartbeats,
            exact: false,
        };
        *watch = Watch { word, deadline_ns };
        true
    }

    /// The least silence (ms) at which this peer's phi can reach the level whose crossing
    /// constants are `threshold` (`DetectorParams::level_silences` of that one level), and the
    /// arrival it counts from, judged from the slot's current `word` without reading the slot:
    /// exact while the estimate is current, a floor within the lazy span; None past it.
    pub fn threshold_floor(
        &self,
        word: u64,
        lazy: &Lazy,
        threshold: &LevelSilences,
        params: &DetectorParams,
        now_ns: u64,
    ) -> Option<(u64, f64)> {
        let current = last_heard::word(0, self.count as u64);
        if last_heard::heartbeats_since(current, word)? == 0 {
            return Some((
                self.last_arrival_ns,
                threshold.silence_ms(0, &self.cold.estimate),
            ));
        }
        lazy.covers(word)?;
        let mean_floor = Some(self.mean_floor_ms).filter(|m| !m.is_nan())?;
        let floor = params.crossing_floor_ms(threshold, 0, mean_floor)?;
        let at = last_heard::arrival_near(word, now_ns).max(self.last_arrival_ns);
        Some((at, floor))
    }

    /// A refresh: the slot's `record` (and `ring` where the model needs it). A new heartbeat
    /// ends any suspicion and makes a new estimate; then any level whose deadline has passed
    /// is raised.
    #[expect(
        clippy::too_many_arguments,
        reason = "watch and lazy live in separate dense arrays the sweep scans"
    )]
    pub fn observe(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        watch: &mut Watch,
        lazy: &mut Lazy,
        config: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        if record.heartbeats != self.heartbeats {
            self.heard(record, ring, config, time.wall_ms, emit);
            self.refreshed(record, config, watch, lazy);
        } else if !lazy.exact {
            // Nothing new since the estimate: the deadline was a floor, make it exact.
            self.refreshed(record, config, watch, lazy);
        }
        self.check_deadlines(watch, lazy, config, time, emit);
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
                self.cold.counter.trust(record.last_arrival_ns);
            }
        }
        self.crossed = 0;
        self.heartbeats = record.heartbeats;
        self.last_arrival_ns = record.last_arrival_ns;
        self.cold.estimate = config.estimate(record, ring);
    }

    /// Raises every level whose (exact) deadline has passed, lowest first. With `hold`, none
    /// (the agent itself was just stalled and cannot trust its view of time yet).
    fn check_deadlines(
        &mut self,
        watch: &mut Watch,
        lazy: &mut Lazy,
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
            lazy.floor_ns = NO_FLOOR;
            watch.deadline_ns = self.deadline(config);
            if self.crossed as usize == levels.len() {
                self.cold.counter.suspect(now_ns);
            }
        }
    }

    /// The detector changed from `old` to `new` (SIGHUP; the same window rules, so the slot's
    /// window is one both read): news in the slot is taken under `old`, then the estimate is
    /// made again from the slot under `new` and the peer re-levelled (`relevel`). Without
    /// `record` (its slot could not be read) the estimate stays until the next read.
    #[expect(
        clippy::too_many_arguments,
        reason = "watch and lazy live in separate dense arrays the sweep scans"
    )]
    pub fn redetect(
        &mut self,
        slot: Option<(&PeerRecord, &[u32])>,
        watch: &mut Watch,
        lazy: &mut Lazy,
        old: &DetectorConfig,
        new: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        if let Some((record, ring)) = slot {
            self.observe(record, ring, watch, lazy, old, time, emit);
            self.cold.estimate = new.estimate(record, ring);
            // The floors and the first deadline from the new estimate; `relevel` then finds
            // the levels the peer is past under `new`, against those it was past under `old`.
            let crossed = self.crossed;
            self.crossed = 0;
            self.refreshed(record, new, watch, lazy);
            self.crossed = crossed;
        }
        self.relevel(watch, lazy, old, new, time, emit);
    }

    /// The levels changed from `old` to `new`: the peer is past the new levels whose
    /// deadlines have passed. A level it is past now and was not past before (a new level, or
    /// one that moved below its phi) is raised as an event, with the time it was crossed;
    /// levels it was already past raise nothing again. The caller first makes the estimate
    /// current (`observe` with the slot's record where `Lazy` says the deadline is a floor).
    pub fn relevel(
        &mut self,
        watch: &mut Watch,
        lazy: &mut Lazy,
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
        lazy.exact = true;
        lazy.floor_ns = if self.crossed == 0 && !self.mean_floor_ms.is_nan() {
            new.first_floor_ns(self.mean_floor_ms)
        } else {
            NO_FLOOR
        };
        let convicted = self.crossed as usize == levels.len();
        if convicted && !was_convicted {
            self.cold.counter.suspect(time.now_ns);
        } else if was_convicted && !convicted {
            self.cold.counter.trust(time.now_ns);
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
            phi: params.phi(&self.cold.estimate, silence_ms),
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

    /// A tracker with its watch and lazy state, as the agent keeps them.
    #[derive(Clone)]
    struct Tracked {
        t: PeerTracker,
        watch: Watch,
        lazy: Lazy,
    }

    impl Tracked {
        fn new(record: &PeerRecord, cfg: &DetectorConfig) -> Self {
            let (t, watch, lazy) = PeerTracker::new(record, &[], cfg);
            Self { t, watch, lazy }
        }

        fn observe(
            &mut self,
            record: &PeerRecord,
            ring: &[u32],
            cfg: &DetectorConfig,
            time: SweepTime,
            emit: &mut impl FnMut(Transition),
        ) {
            self.t.observe(
                record,
                ring,
                &mut self.watch,
                &mut self.lazy,
                cfg,
                time,
                emit,
            );
        }

        /// A sweep from the slot's word: the quiet check, then the tracker's step.
        fn step(
            &mut self,
            word: u64,
            cfg: &DetectorConfig,
            time: SweepTime,
            emit: &mut impl FnMut(Transition),
        ) -> SweepStep {
            if self.watch.is_quiet(word, time.now_ns) {
                return SweepStep::Done;
            }
            self.t
                .step(word, &mut self.watch, &mut self.lazy, cfg, time, emit)
        }

        fn qos(&self, now_ns: u64) -> QosReport {
            self.t.qos(now_ns)
        }
    }

    /// A sender every 100-120 ms, each heartbeat 0-5 ms late, 2% lost, a silence of 1-3 s
    /// every 500 heartbeats or so, and a restart (its interval left out of the window, however
    /// short) every 700 or so, recorded by `slot::arrive` as the kernel would, with the
    /// last-heard word the kernel would store.
    struct Stream {
        rng: fastrand::Rng,
        slot: monitor_common::maps::PeerSlot,
        xdp: monitor_common::config::XdpConfig,
        word: u64,
        next_send: u64,
        seq: u64,
        incarnation: u32,
        /// Its own, so that the rest of the stream is as it was without restarts.
        restarts: fastrand::Rng,
    }

    impl Stream {
        fn new(seed: u64, xdp: monitor_common::config::XdpConfig) -> Self {
            Self {
                rng: fastrand::Rng::with_seed(seed),
                slot: monitor_common::maps::PeerSlot::admitted(5, 0),
                xdp,
                word: last_heard::word(0, 0),
                next_send: 100 * MS,
                seq: 0,
                incarnation: 1,
                restarts: fastrand::Rng::with_seed(seed + 1),
            }
        }

        /// Every heartbeat sent up to `now_ns`.
        fn until(&mut self, now_ns: u64) {
            let rng = &mut self.rng;
            while self.next_send <= now_ns {
                self.seq += 1;
                if self.restarts.u16(0..700) == 0 {
                    (self.incarnation, self.seq) = (self.incarnation + 1, 1);
                }
                let lost = rng.u8(0..50) == 0;
                if !lost {
                    let at = self.next_send + rng.u64(0..5 * MS);
                    if let monitor_common::slot::Outcome::Accepted { .. } =
                        monitor_common::slot::arrive(
                            &mut self.slot,
                            at,
                            self.seq,
                            self.incarnation,
                            &self.xdp,
                        )
                    {
                        self.word = last_heard::of_hot(&self.slot.hot);
                    }
                }
                self.next_send += if rng.u16(0..500) == 0 {
                    rng.u64(1000..3000) * MS
                } else {
                    100 * MS + rng.u64(0..20 * MS)
                };
            }
        }
    }

    /// The models whose sweep keeps floors, each with levels 1, 3 and 8 and its window rules.
    fn models_with_floors() -> Vec<(Model, DetectorConfig, monitor_common::config::XdpConfig)> {
        [Model::Normal, Model::Loss, Model::Exponential, Model::Akka]
            .into_iter()
            .map(|model| {
                let params = DetectorParams {
                    model,
                    ..DetectorParams::DEFAULT
                };
                let xdp = params.window_config();
                let levels = Levels::new(vec![1.0, 3.0, 8.0]).unwrap();
                (model, DetectorConfig::new(params, levels), xdp)
            })
            .collect()
    }

    fn at(now_ns: u64, wall_ms: f64, hold: bool) -> SweepTime {
        SweepTime {
            now_ns,
            wall_ms,
            hold,
        }
    }

    /// The default detector with levels 1, 3 and 8, and its window rules.
    fn defaults() -> (DetectorConfig, monitor_common::config::XdpConfig) {
        let params = DetectorParams::DEFAULT;
        let xdp = params.window_config();
        let levels = Levels::new(vec![1.0, 3.0, 8.0]).unwrap();
        (DetectorConfig::new(params, levels), xdp)
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
        let mut t = Tracked::new(&record, &cfg);
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
                Transition::Suspect(Suspicion {
                    level,
                    phi,
                    crossed_at,
                    ..
                }) => {
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
            vec![Transition::Recover(Recovery {
                id: 9,
                level: 8.0,
                silence_ms: 2100.0,
                at: 0
            })]
        );
        let q = t.qos(3100 * MS);
        assert_eq!((q.s_transitions, q.mistakes), (1, 1));
    }

    #[test]
    fn a_stall_holds_suspicions_but_not_recoveries() {
        let cfg = config();
        let mut record = PeerRecord::admitted(1, 0);
        let mut t = Tracked::new(&record, &cfg);
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
        assert!(matches!(events[..], [Transition::Recover(_)]));
    }

    #[test]
    fn no_repeat_events_while_silence_continues() {
        let cfg = config();
        let record = PeerRecord::admitted(1, 0);
        let mut t = Tracked::new(&record, &cfg);
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
        for (model, cfg, xdp) in models_with_floors() {
            let mut stream = Stream::new(11, xdp);
            let (mut eager_events, mut lazy_events) = (Vec::new(), Vec::new());
            let mut eager = Tracked::new(&stream.slot.record(), &cfg);
            let mut lazy = eager.clone();
            let mut reads = 0;
            let sweeps = 60_000u64;
            for step in 1..=sweeps {
                let now = step * 10 * MS;
                stream.until(now);
                let (record, word) = (&stream.slot.record(), stream.word);
                let time = at(now, now as f64 / 1e6, false);
                eager.observe(record, &[], &cfg, time, &mut |e| eager_events.push(e));
                if lazy.step(word, &cfg, time, &mut |e| lazy_events.push(e)) == SweepStep::Refresh {
                    reads += 1;
                    lazy.observe(record, &[], &cfg, time, &mut |e| lazy_events.push(e));
                }
            }
            assert!(
                eager_events
                    .iter()
                    .filter(|e| matches!(e, Transition::Suspect(_)))
                    .count()
                    > 20,
                "{model:?}: the stream crossed levels"
            );
            assert_eq!(lazy_events, eager_events, "{model:?}");
            let heartbeats = stream.slot.record().heartbeats;
            // 211 of 5209 with refloors, 449 without (for normal).
            assert!(
                reads * 16 < heartbeats,
                "{model:?}: {reads} slot reads for {heartbeats} heartbeats"
            );
        }
    }

    /// A detector set live (SIGHUP) raises, from then on, exactly what a tracker that had it
    /// all along raises; at the switch it raises the levels the peer is now past and was not
    /// before, and nothing else. For each model with floors, from the default to a lower
    /// deviation floor, a pause and another first interval (the same window rules), switched
    /// in the middle of a silence, where the two detectors disagree on the levels passed.
    #[test]
    fn a_detector_set_live_raises_what_it_would_have_raised_all_along() {
        let mut raised_at_switches = 0;
        for (model, old, xdp) in models_with_floors() {
            let new = DetectorConfig::new(
                DetectorParams {
                    min_std_ms: 5.0,
                    pause_ms: 20.0,
                    first_interval_ms: 110.0,
                    ..old.params.clone()
                },
                old.levels.clone(),
            );
            assert_eq!(new.params.window_config(), xdp);
            let mut stream = Stream::new(13, xdp);
            let mut live = Tracked::new(&stream.slot.record(), &old);
            let mut all_along = Tracked::new(&stream.slot.record(), &new);
            let (mut live_events, mut all_along_events) = (Vec::new(), Vec::new());
            let mut switched = None;
            for step in 1..=60_000u64 {
                let now = step * 10 * MS;
                stream.until(now);
                let (record, word) = (&stream.slot.record(), stream.word);
                let time = at(now, now as f64 / 1e6, false);
                let silent = now.saturating_sub(record.last_arrival_ns) >= 300 * MS;
                if switched.is_none() && step >= 20_000 && silent {
                    let (before, mut raised) = (live.t.crossed, Vec::new());
                    live.t.redetect(
                        Some((record, &[])),
                        &mut live.watch,
                        &mut live.lazy,
                        &old,
                        &new,
                        time,
                        &mut |e| raised.push(e),
                    );
                    // Only the levels past now and not before, lowest first.
                    for (n, e) in raised.iter().enumerate() {
                        let Transition::Suspect(s) = e else {
                            panic!("{model:?}: {e:?} at the switch")
                        };
                        assert_eq!(s.level, new.levels.as_slice()[before as usize + n]);
                    }
                    raised_at_switches += raised.len();
                    switched = Some(step);
                }
                let cfg = if switched.is_some() { &new } else { &old };
                let sink = if switched.is_some() {
                    &mut live_events
                } else {
                    &mut Vec::new()
                };
                if live.step(word, cfg, time, &mut |e| sink.push(e)) == SweepStep::Refresh {
                    live.observe(record, &[], cfg, time, &mut |e| sink.push(e));
                }
                let sink = if switched.is_some() {
                    &mut all_along_events
                } else {
                    &mut Vec::new()
                };
                if all_along.step(word, &new, time, &mut |e| sink.push(e)) == SweepStep::Refresh {
                    all_along.observe(record, &[], &new, time, &mut |e| sink.push(e));
                }
                if switched == Some(step) {
                    assert_eq!(
                        live.t.crossed, all_along.t.crossed,
                        "{model:?} at the switch"
                    );
                }
            }
            assert!(switched.is_some(), "{model:?}: no silence to switch in");
            assert!(live_events.len() > 20, "{model:?}: events after the switch");
            assert_eq!(live_events, all_along_events, "{model:?}");
        }
        // The switches fell where the detectors disagree: the new one was past more levels.
        assert!(raised_at_switches > 0);
    }

    /// `suspects` passes over a peer when its dense state says phi is below the first level:
    /// checked against the exact phi of the slot's current record, at query times between
    /// sweeps, with heartbeats the last sweep has not seen yet among them.
    #[test]
    fn below_first_level_is_never_wrong_and_usually_answers() {
        for (model, cfg, xdp) in models_with_floors() {
            let mut stream = Stream::new(12, xdp);
            let mut tracked = Tracked::new(&stream.slot.record(), &cfg);
            let (mut asked, mut passed) = (0u64, 0u64);
            for step in 1..=30_000u64 {
                let now = step * 10 * MS;
                stream.until(now);
                let (slot, word) = (&stream.slot, stream.word);
                // A query between two sweeps, a little after this tick's heartbeats.
                let query = now + stream.rng.u64(0..10 * MS);
                asked += 1;
                if tracked.lazy.below_first_level(&tracked.watch, word, query) {
                    passed += 1;
                    let estimate = cfg.estimate(&slot.record(), &[]);
                    let silence = query.saturating_sub(slot.record().last_arrival_ns) as f64 / 1e6;
                    let phi = cfg.params.phi(&estimate, silence);
                    assert!(phi < 1.0, "{model:?} at {query}: phi {phi} passed over");
                }
                let time = at(now, now as f64 / 1e6, false);
                if tracked.step(word, &cfg, time, &mut |_| {}) == SweepStep::Refresh {
                    tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
                }
            }
            assert!(
                passed * 2 > asked,
                "{model:?}: only {passed} of {asked} queries passed over"
            );
        }
    }

    /// A steady sender with a full window is read once a window of heartbeats (refloors carry
    /// it between), not once a span; a heartbeat whose interval the window left out (across a
    /// restart, however short) is read at once.
    #[test]
    fn a_steady_full_window_is_read_once_a_window() {
        let (cfg, xdp) = defaults();
        let mut slot = crate::detector::window::slot_with_intervals(
            (0..200).map(|i| 100_000 + i % 7 * 1000),
            &xdp,
        );
        let mut tracked = Tracked::new(&slot.record(), &cfg);
        let (mut arrival, mut seq, mut incarnation) = (slot.record().last_arrival_ns, 201, 1);
        let mut reads = 0;
        let sweep = |slot: &monitor_common::maps::PeerSlot, tracked: &mut Tracked| {
            let word = last_heard::of_record(&slot.record());
            let time = at(slot.record().last_arrival_ns + MS, 0.0, false);
            let read = tracked.step(word, &cfg, time, &mut |_| {}) == SweepStep::Refresh;
            if read {
                tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
            }
            read
        };
        for i in 0..1280u64 {
            arrival += (100 + i % 7) * MS;
            seq += 1;
            monitor_common::slot::arrive(&mut slot, arrival, seq, incarnation, &xdp);
            reads += sweep(&slot, &mut tracked) as u32;
        }
        assert_eq!(slot.record().left_out, 0);
        // Once every 128 heartbeats (32 with a read at the end of every span).
        assert!((10..=12).contains(&reads), "{reads} reads");
        arrival += 100 * MS;
        incarnation += 1;
        monitor_common::slot::arrive(&mut slot, arrival, 1, incarnation, &xdp);
        assert!(sweep(&slot, &mut tracked), "a restart is read");
    }

    /// A BFD session whose timers change starts a fresh window (a new epoch), and its next
    /// deadline must come from the new rate: the packet that starts the epoch is read from the
    /// slot, never absorbed under a floor of the old rate (which held the deadline more than
    /// half a second late here, before the word counted intervals left out).
    #[test]
    fn a_bfd_timer_change_is_read() {
        use monitor_common::{
            maps::PeerSlot,
            passive::{BFD_UP, SOURCE_BFD},
            slot::arrive_passive,
        };
        let (cfg, xdp) = defaults();
        let mut slot = PeerSlot::admitted_passive(9, 0, SOURCE_BFD);
        slot.cold.bfd_state = BFD_UP;
        slot.cold.bfd_desired_min_tx_us = 1_000_000;
        let mut arrival = 0;
        for _ in 0..200 {
            arrival += 1000 * MS;
            arrive_passive(&mut slot, arrival, false, &xdp);
        }
        let mut tracked = Tracked::new(&slot.record(), &cfg);
        assert_ne!(tracked.lazy.floor_ns, NO_FLOOR, "a 1 s session has a floor");
        // The session now sends every 300 ms: a new epoch, its window emptied.
        slot.cold.bfd_desired_min_tx_us = 300_000;
        arrival += 300 * MS;
        arrive_passive(&mut slot, arrival, true, &xdp);
        let time = at(arrival + MS, 0.0, false);
        let word = last_heard::of_record(&slot.record());
        assert_eq!(
            tracked.step(word, &cfg, time, &mut |_| {}),
            SweepStep::Refresh
        );
        tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
        // 300 ms and a deviation of 75 (the bootstrap): the first level at about 396 ms.
        let deadline_ms = (tracked.watch.deadline_ns - arrival) as f64 / 1e6;
        assert!(
            deadline_ms < 400.0,
            "first level {deadline_ms} ms after the packet"
        );
    }

    /// A word whose count does not read as advanced (it moved by more than half its range,
    /// as 512 intervals left out between two sweeps would move it) is read from the slot, not
    /// taken for an older word and ignored.
    #[test]
    fn a_word_that_reads_older_is_read() {
        let (cfg, xdp) = defaults();
        let slot = crate::detector::window::slot_with_intervals([100_000; 200], &xdp);
        let mut tracked = Tracked::new(&slot.record(), &cfg);
        let word = last_heard::of_record(&slot.record());
        let arrival = slot.record().last_arrival_ns + 100 * MS;
        let count = last_heard::count_of(word) + (1 << (last_heard::COUNT_BITS - 1)) + 1;
        let later = last_heard::word(arrival, count);
        assert_eq!(last_heard::heartbeats_since(word, later), None);
        let time = at(arrival + MS, 0.0, false);
        assert_eq!(
            tracked.step(later, &cfg, time, &mut |_| {}),
            SweepStep::Refresh
        );
    }

    #[test]
    fn what_every_sweep_reads_is_small() {
        assert_eq!(std::mem::size_of::<Watch>(), 16);
        assert_eq!(std::mem::size_of::<Lazy>(), 16);
    }
}
