//! The detector configuration every peer shares, and what it finds from a peer's estimate:
//! the silence at which each level is crossed, and the floors under the first level that let
//! the sweep pass over heartbeats without reading the slot.

use monitor_common::maps::PeerRecord;

use super::sweep_state::{MAX_FLOOR_SPAN, NO_FLOOR, floor_ns};
use crate::detector::{
    levels::Levels,
    model::{DetectorParams, Estimate, LevelSilences, MeanFloor},
};

/// The spans a floor may cover, longest first. A span of 0 covers only the heartbeat it is
/// set at: the next one is refloored from the time it took (`PeerTracker::refloor`) rather
/// than read, which is what a window too short for a longer span (the first minutes after a
/// start at 1 Hz) gets.
const SPANS: [u8; 7] = [32, 16, 8, 4, 2, 1, 0];

/// The detector configuration shared by every peer.
#[derive(Debug, Clone)]
pub struct DetectorConfig {
    pub params: DetectorParams,
    pub levels: Levels,
    pub(super) silences: LevelSilences,
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

    /// The peer's next estimate after its last, `previous` (see
    /// `DetectorParams::estimate_after`).
    pub fn estimate_after(
        &self,
        record: &PeerRecord,
        ring: &[u32],
        previous: &Estimate,
    ) -> Estimate {
        self.params.estimate_after(record, ring, previous)
    }

    /// phi of a peer last heard at `last_arrival_ns`, at `now_ns` (computed on read).
    pub fn phi(&self, estimate: &Estimate, last_arrival_ns: u64, now_ns: u64) -> f64 {
        let silence_ms = now_ns.saturating_sub(last_arrival_ns) as f64 / 1e6;
        self.params.phi(estimate, silence_ms)
    }

    /// How many heartbeats the estimate of `record` may go unrefreshed, the floor under the
    /// window's mean over that many (`MeanFloor`), and the first level's floor for it: the
    /// most of 32, 16, ..., 1, 0 (at most a quarter of the window's intervals) whose floor
    /// keeps half the exact margin (`exact_ms`, the first level's crossing) above the mean.
    /// None: refresh with every heartbeat.
    pub(super) fn span_floor(
        &self,
        record: &PeerRecord,
        estimate: &Estimate,
        exact_ms: f64,
    ) -> Option<SpanFloor> {
        let want = estimate.mean_ms + (exact_ms - estimate.mean_ms) / 2.0;
        if !want.is_finite() || exact_ms <= estimate.mean_ms {
            return None;
        }
        let most = (record.samples / 4).min(MAX_FLOOR_SPAN as u32) as u64;
        let mean_floor = self.params.mean_floor(record)?;
        let mut floor = self.longest_span(
            most,
            want,
            |j| Some(mean_floor.after_ms(j)),
            |j| mean_floor.std_floor_ms(j),
        )?;
        floor.basis = Some(RefloorBasis {
            moments: mean_floor,
            want_ms: want,
            exact_ms,
        });
        Some(floor)
    }

    /// A new floor for a peer `heard` heartbeats after its refresh, all of whose intervals
    /// entered its window and took `heard_us` at least (see `MeanFloor::after_heard_ms`):
    /// the longest span that keeps the refresh's half margin (`RefloorBasis::want_ms`). None if
    /// no span does, or the span would reach past as many heartbeats as the window held.
    pub(super) fn heard_floor(
        &self,
        basis: &RefloorBasis,
        heard: u64,
        heard_us: f64,
    ) -> Option<SpanFloor> {
        let most = (basis.moments.window() / 4).min(MAX_FLOOR_SPAN as u64);
        let std_after = |j: u64| basis.moments.std_floor_ms(heard + j);
        if basis.moments.is_full() {
            return self.longest_span(
                most,
                basis.want_ms,
                |j| basis.moments.after_heard_ms(heard, heard_us, j),
                std_after,
            );
        }
        // A filling window: the floors of every span in one pass, not one pass a span.
        let mut floors = [f64::NAN; MAX_FLOOR_SPAN as usize + 1];
        basis
            .moments
            .filling_floors_ms(heard, heard_us, &mut floors);
        self.longest_span(
            most,
            basis.want_ms,
            |j| Some(floors[j as usize]).filter(|f| !f.is_nan()),
            std_after,
        )
    }

    /// The longest of the spans of at most `most` heartbeats whose floor keeps the first
    /// level's least silence at `want_ms` or more, `mean_after` giving the floor under the
    /// window's mean over a span (None: no floor for it) and `std_after` the floor under its
    /// deviation (0: none known).
    fn longest_span(
        &self,
        most: u64,
        want_ms: f64,
        mean_after: impl Fn(u64) -> Option<f64>,
        std_after: impl Fn(u64) -> f64,
    ) -> Option<SpanFloor> {
        SPANS
            .into_iter()
            .filter(|&j| j as u64 <= most)
            .find_map(|heartbeats| {
                let mean_ms = mean_after(heartbeats as u64)?;
                let std_ms = std_after(heartbeats as u64);
                let silence_ms =
                    self.params
                        .crossing_floor_ms(&self.silences, 0, mean_ms, std_ms)?;
                (silence_ms >= want_ms).then_some(SpanFloor {
                    heartbeats,
                    mean_ms,
                    silence_ms,
                    basis: None,
                })
            })
    }

    /// The least silence (ns) at which phi can reach the first level for a window mean of at
    /// least `mean_floor_ms`, or NO_FLOOR.
    pub(super) fn first_floor_ns(&self, mean_floor_ms: f64) -> u64 {
        self.params
            .crossing_floor_ms(&self.silences, 0, mean_floor_ms, 0.0)
            .map_or(NO_FLOOR, floor_ns)
    }

    /// Silence (ms) at which phi reaches level `index` for this estimate.
    pub(super) fn crossing_ms(&self, index: usize, estimate: &Estimate) -> f64 {
        self.params.crossing_ms(
            &self.silences,
            index,
            self.levels.as_slice()[index],
            estimate,
        )
    }
}

/// What `DetectorConfig::span_floor` found for a refreshed estimate (or `heard_floor` for one
/// heard since).
pub(super) struct SpanFloor {
    /// Heartbeats the floor covers.
    pub(super) heartbeats: u8,
    /// The floor under the window's mean over those heartbeats.
    pub(super) mean_ms: f64,
    /// The least silence at which phi can reach the first level meanwhile.
    pub(super) silence_ms: f64,
    /// What later floors are found from (`PeerTracker::refloor`), from a refresh.
    pub(super) basis: Option<RefloorBasis>,
}

/// What a refresh leaves for later floors: the window's moments, and the least floor worth
/// keeping (the mean plus half the exact margin: a lower floor would be reached too often).
#[derive(Debug, Clone, Copy)]
pub(super) struct RefloorBasis {
    pub(super) moments: MeanFloor,
    pub(super) want_ms: f64,
    /// The first level's exact crossing for the refresh's estimate (what a refloor's
    /// `LevelFloor::exact_gap` is measured from), kept rather than computed again at each.
    pub(super) exact_ms: f64,
}
