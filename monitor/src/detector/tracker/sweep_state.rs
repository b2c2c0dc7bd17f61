//! What the sweep reads of each slot, in two dense arrays beside the kernel's last-heard
//! words: the watch (the word last accounted for and the next deadline) and the level floor
//! (whether heartbeats since can be taken without the tracker).

use monitor_common::last_heard;

use super::SweepTime;

/// Most heartbeats one floor covers (see the module docs). A peer gets the most of 32, 16, 8,
/// 4, 2 or 1, and never more than a quarter of the intervals in its window, for which the floor
/// keeps at least half of the exact margin above the mean (see `DetectorConfig::span_floor`):
/// 32 for a 100 ms sender with the defaults (floor 138 ms of silence against an exact 164 ms),
/// 4 for a 1 s one. Below `last_heard::LEFT_OUT_STEP`, so a span never covers a heartbeat
/// whose interval the window left out.
pub const MAX_FLOOR_SPAN: u8 = 32;
const _: () = assert!((MAX_FLOOR_SPAN as u64) < last_heard::LEFT_OUT_STEP);

/// `LevelFloor::floor_ns` of a peer whose estimate is refreshed with every heartbeat.
pub(super) const NO_FLOOR: u64 = u64::MAX;

/// The unit of `LevelFloor::exact_gap` (2^16 ns, about 66 µs; the gap holds up to 4.3 s).
const GAP_UNIT_NS: u64 = 1 << 16;

/// A gap in ms as `LevelFloor::exact_gap`: rounded down (a prediction early, never late) and
/// held at the most it can say.
pub(super) fn exact_gap(gap_ms: f64) -> u16 {
    if gap_ms.is_nan() || gap_ms <= 0.0 {
        0
    } else {
        ((gap_ms * 1e6) as u64 / GAP_UNIT_NS).min(u16::MAX as u64) as u16
    }
}

/// The count a word carries (see `last_heard::count`), as `LevelFloor` and the tracker keep it.
pub(super) fn word_count(word: u64) -> u32 {
    last_heard::count_of(word) as u32
}

/// A floor's silence in ns, or NO_FLOOR if it is not finite.
pub(super) fn floor_ns(silence_ms: f64) -> u64 {
    if silence_ms.is_finite() {
        (silence_ms.max(0.0) * 1e6) as u64
    } else {
        NO_FLOOR
    }
}

/// What every sweep reads of a slot, 16 bytes in a dense array (with the kernel's words, 24
/// bytes a peer a sweep): a slot whose word has not moved and whose deadline has not come is
/// done with one compare of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct WordWatch {
    /// The last-heard word last accounted for.
    pub word: u64,
    /// When phi reaches the next level not yet crossed (`LevelFloor::exact`), or the floor before
    /// which it cannot reach the first level; u64::MAX for never.
    pub deadline_ns: u64,
}

impl WordWatch {
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

/// What a watch's deadline is (`LevelFloor::deadline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WatchDeadline {
    /// A floor: the least silence at which phi can reach the first level over the floor's span.
    Floor,
    /// The first level's exact crossing for the current estimate: no level is crossed.
    FirstCrossing,
    /// Exact, but not known to be the first level's crossing for the watched word: a later
    /// level's (a level is crossed), one from an estimate older than the word, or none.
    LaterCrossing,
}

/// What a sweep reads of a slot whose word moved or whose deadline came: whether a heard peer
/// can keep its estimate. 16 bytes, in a second dense array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct LevelFloor {
    /// Least silence (ns) at which phi can reach the first level until `heartbeats` more
    /// heartbeats after `refreshed` (a refresh or a refloor), or NO_FLOOR (also while a level
    /// is crossed). Set only by the tracker, so a slot with a floor has a tracker of its
    /// current peer.
    pub(super) floor_ns: u64,
    /// The word's count (`last_heard::count`, modulo 2^20) when the floor was set: at a
    /// refresh, or at a refloor.
    pub(super) refreshed: u32,
    /// Heartbeats the floor covers.
    pub(super) heartbeats: u8,
    /// What `WordWatch::deadline_ns` is: a floor, or an exact crossing of the current
    /// estimate (the first level's, or a later one's).
    pub(super) deadline: WatchDeadline,
    /// How much later than the floor the last estimate crosses the first level, in units of
    /// `GAP_UNIT_NS`: what the sweep predicts the crossing from when the deadline is a floor
    /// (`predicted_crossing_ns`). In the two bytes the layout had spare.
    pub(super) exact_gap: u16,
}

impl LevelFloor {
    pub const NONE: Self = Self {
        floor_ns: NO_FLOOR,
        refreshed: 0,
        heartbeats: 0,
        deadline: WatchDeadline::LaterCrossing,
        exact_gap: 0,
    };

    /// The watch's deadline is an exact crossing of the current estimate, not a floor.
    #[inline(always)]
    pub(super) fn exact(&self) -> bool {
        self.deadline != WatchDeadline::Floor
    }

    /// When the watched peer crosses the first level not yet crossed if it is not heard
    /// again: the watch's deadline if exact; if a floor, the floor plus the gap the last
    /// estimate had above it. A prediction, not a bound: heartbeats the floor covered may
    /// have brought the crossing nearer (down to the floor, never below it). The sweep arms a
    /// floor for before the next scan only when the crossing it predicts also falls before
    /// the next scan (`Agent::look_at_slot`).
    #[inline]
    pub fn predicted_crossing_ns(&self, watch: &WordWatch) -> u64 {
        if self.exact() {
            watch.deadline_ns
        } else {
            watch
                .deadline_ns
                .saturating_add(self.exact_gap as u64 * GAP_UNIT_NS)
        }
    }

    /// A sweep's look at a slot whose watch was not quiet, without its tracker: a new
    /// heartbeat the floor covers moves the deadline to the floor past it. True if nothing
    /// more is needed; false if the tracker is (a heartbeat the floor does not cover, a
    /// deadline reached, a stall, a word that does not read as newer).
    #[inline]
    pub fn advance_over_covered(
        &mut self,
        word: u64,
        watch: &mut WordWatch,
        time: SweepTime,
    ) -> bool {
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
            self.deadline = WatchDeadline::Floor;
        }
        time.now_ns < watch.deadline_ns
    }

    /// Whether phi is surely below the first level at `now_ns`, from the dense arrays alone
    /// (no tracker, no slot): what lets `suspects` pass over most peers. A floor is only
    /// ever set while no level is crossed (`refreshed`, `check_deadlines` and `relevel` clear
    /// it otherwise). With the slot's word unchanged since the sweep, the watch's deadline is
    /// the first level's exact crossing or a floor under it; with newer heartbeats the
    /// floor's span still covers, the floor past the newest arrival holds, as in `advance_over_covered`.
    #[inline]
    pub fn below_first_level(&self, watch: &WordWatch, word: u64, now_ns: u64) -> bool {
        // No floor, but no level crossed either: a word unchanged since the sweep still has
        // the first level's exact crossing for its deadline (a peer whose window is too short
        // for a floor, as every peer's is in the first minutes after a start at 1 Hz).
        if word == watch.word && self.deadline == WatchDeadline::FirstCrossing {
            return now_ns < watch.deadline_ns;
        }
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
    pub(super) fn covers(&self, word: u64) -> Option<u64> {
        let since = last_heard::heartbeats_since(last_heard::word(0, self.refreshed as u64), word)?;
        (self.floor_ns != NO_FLOOR && since <= self.heartbeats as u64).then_some(since)
    }
}
