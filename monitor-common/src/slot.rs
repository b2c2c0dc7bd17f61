//! What one heartbeat does to its peer's slot: the only implementation of the window rules.
//!
//! The XDP program calls [`arrive_at`] under the hot line's sequence counter, on a [`SlotMut`]
//! of its hot line and its slot in PEER_STATE; offline replay calls the very same function on
//! a slot of its own ([`arrive`]), so a trace replayed in userspace builds
//! exactly the window the kernel built from the same arrivals (tests/tests/record.rs checks
//! it against the kernel). Integers only, no loops, no calls: it must pass the BPF verifier.
//!
//! The rules, in order:
//! 1. Classification by (incarnation, sequence): a first heartbeat, or an incarnation above
//!    every one the slot has seen, starts a new sequence (the sender restarted). So does a
//!    *rebirth* ([`is_rebirth`]): a sender that restarted with an incarnation at or below the
//!    ones seen (its clock stepped back, or an explicit one), recognised by its sequence
//!    starting over; with authentication only when it is fresh by the receiver's clock and
//!    not the slot's last two incarnations, so a recorded replay of an older epoch cannot
//!    revive a dead peer (docs/security.md, "Restarts that go backwards"). Any other older
//!    incarnation, or a lower sequence number, is out of order; the same one a duplicate.
//!    Neither of the last two is an arrival.
//! 2. An interval that spans a restart is not an inter-arrival time: not counted.
//! 3. `max_interval_us` (Cassandra's absolute cap), if set: longer intervals are not counted.
//! 4. With [`XDP_FLAG_GAPLESS_WINDOW`], an interval that spans lost heartbeats is not counted
//!    (the loss-aware model weighs loss through the loss counters instead).
//! 5. Outages: with `outage_factor` K, once the window holds [`OUTAGE_MIN_SAMPLES`], an
//!    interval longer than K times the window's running mean (an exponentially weighted mean
//!    of the intervals it took, [`MEAN_SCALE`]; the kernel keeps no sums over the window) is
//!    an outage (a crash, a partition, a
//!    pause), not a sample of the path: not counted, so one outage does not teach the detector
//!    to wait out the next one. A run of more than [`OUTAGE_RUN`] such intervals in a row is
//!    the path itself (the sender slowed down, the route changed): from then on they count,
//!    until an ordinary interval ends the run.
//! 6. Loss: an accepted heartbeat adds the sequence numbers it skipped to `lost`, and marks them
//!    in `missing` (the [`MISSING_SPAN`] numbers below the last accepted one). A late heartbeat
//!    takes one off `lost` only if its number is marked there, and clears the mark: replays,
//!    second copies and numbers older than the span leave `lost` alone.
//!
//! Every interval rules 2-5 leave out is counted in `left_out`, which the last-heard word
//! carries (`crate::last_heard::count`): the agent learns from the word alone whether every
//! interval since it last read the slot entered the window.

use crate::{
    config::{XDP_FLAG_GAPLESS_WINDOW, XDP_FLAG_REQUIRE_AUTH, XdpConfig},
    maps::{
        ARRIVAL_HEARD, MAX_INTERVAL_US, MAX_WINDOW, PeerHot, PeerSlot, SlotMut, TELL_ARRIVALS,
        TELL_HEARD,
    },
};

/// The outage rule applies once the window holds this many samples (a mean of fewer is noise).
pub const OUTAGE_MIN_SAMPLES: u32 = 4;
/// Consecutive outages left out before long intervals are taken as the path's new normal.
pub const OUTAGE_RUN: u8 = 3;
/// A peer is inside a loss burst until this many heartbeats have arrived without a gap since
/// the last gap. Long enough to span the good stretches inside a burst (a path that loses 40%
/// delivers runs of a few), short enough that one stray loss is forgotten within seconds.
pub const BURST_MEMORY: u8 = 16;
/// The loss counters are halved together when `loss_heartbeats` reaches this.
pub const LOSS_MEMORY: u32 = 1024;

const RING_MASK: u32 = (MAX_WINDOW as u32) - 1;

/// A sequence number below this is a sender's sequence starting over (a sender counts from 0;
/// the margin lets the first few heartbeats after a restart be lost).
pub const RESTART_SEQ: u64 = 16;
/// With authentication, an incarnation that went backwards is a restart only if it is within
/// this many seconds of the receiver's wall clock: an incarnation is its sender's start time
/// (Unix seconds), so a restarted sender's is about now, and a recorded epoch's is its age.
pub const FRESH_SECS: u64 = 30;

/// Whether `incarnation` is within [`FRESH_SECS`] of `wall_s` (Unix seconds).
#[inline(always)]
pub const fn fresh_incarnation(incarnation: u32, wall_s: u64) -> bool {
    let inc = incarnation as u64;
    if inc > wall_s {
        inc - wall_s <= FRESH_SECS
    } else {
        wall_s - inc <= FRESH_SECS
    }
}

/// Whether a heartbeat of another incarnation than the current one, but not above every one
/// `slot` has seen, is its sender restarting all the same (rule 1):
/// - its sequence starts over (below [`RESTART_SEQ`]): a straggler of an older epoch carries
///   that epoch's later numbers;
/// - with [`XDP_FLAG_REQUIRE_AUTH`], also: not the incarnation before the current one, and
///   `fresh` (the caller's [`fresh_incarnation`] by its wall clock). A replay of the epoch
///   before, or of any epoch older than [`FRESH_SECS`], is refused; without the key nobody
///   can make a new one. Without authentication anyone can forge any heartbeat, so refusing
///   a restart would protect nothing.
///
/// A sender that reuses its current incarnation is not recognised as restarted (its early
/// numbers look like a replay, or very late heartbeats): `monitor send` never reuses one.
#[inline(always)]
pub fn is_rebirth(
    slot: &SlotMut<'_>,
    seq: u64,
    incarnation: u32,
    fresh: bool,
    config: &XdpConfig,
) -> bool {
    if seq >= RESTART_SEQ || incarnation == slot.hot.incarnation {
        return false;
    }
    config.flags & XDP_FLAG_REQUIRE_AUTH == 0
        || (fresh && incarnation != slot.cold.previous_incarnation)
}

/// What the slot made of a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An arrival: `lost` sequence numbers were skipped since the previous one.
    Accepted { lost: u64 },
    /// Repeats the last accepted sequence number.
    Duplicate,
    /// Older than the last accepted heartbeat (or from an older incarnation).
    OutOfOrder,
}

impl Outcome {
    /// The number `ArrivalRecord::outcome` carries.
    pub const fn code(self) -> u32 {
        match self {
            Outcome::Accepted { .. } => 0,
            Outcome::Duplicate => 1,
            Outcome::OutOfOrder => 2,
        }
    }
}

/// Records a heartbeat with sequence `seq` of `incarnation` that arrived at `now_ns` into
/// `slot` (whose peer id the caller has checked), a whole slot of the caller's own (replay,
/// tests): [`arrive_at`] on its [`PeerSlot::parts`]. Source address and port are the caller's.
/// A caller without a wall clock (replay, whose traces carry none) vouches for every
/// incarnation's freshness: see [`arrive_at`].
#[inline(always)]
pub fn arrive(
    slot: &mut PeerSlot,
    now_ns: u64,
    seq: u64,
    incarnation: u32,
    config: &XdpConfig,
) -> Outcome {
    arrive_at(&mut slot.parts(), now_ns, seq, incarnation, true, config)
}

/// [`arrive`], with `fresh`: whether `incarnation` is within [`FRESH_SECS`] of the caller's
/// wall clock ([`fresh_incarnation`]), which only matters to an incarnation that went
/// backwards under authentication ([`is_rebirth`]).
///
/// An accepted heartbeat of the current incarnation with no gap before it reads and writes
/// `slot.hot` only, and stores its interval into the ring: everything else in `slot.cold` is
/// read or written only by what it counts (a gap, a repeat, a restart, an outage).
#[inline(always)]
pub fn arrive_at(
    slot: &mut SlotMut<'_>,
    now_ns: u64,
    seq: u64,
    incarnation: u32,
    fresh: bool,
    config: &XdpConfig,
) -> Outcome {
    let first = slot.hot.heartbeats == 0;
    let same_epoch = incarnation == slot.hot.incarnation;
    let restarted = !first
        && !same_epoch
        && (incarnation > slot.cold.highest_incarnation
            || is_rebirth(slot, seq, incarnation, fresh, config));
    let last_seq = slot.hot.last_seq;
    let lost = if first || restarted {
        0
    } else if !same_epoch {
        // A straggler or replay from another epoch: that epoch's gaps are no longer tracked.
        slot.cold.out_of_order += 1;
        return Outcome::OutOfOrder;
    } else if seq < last_seq {
        slot.cold.out_of_order += 1;
        // A late heartbeat fills a gap that was counted as lost, once, if the gap is within
        // the MISSING_SPAN sequence numbers below the last accepted one and this number is
        // still missing there. A replay of a number that arrived, a second copy of a late one,
        // or anything older than the tracked span changes nothing.
        let back = last_seq - 1 - seq;
        if back < MISSING_SPAN {
            let bit = 1u64 << back;
            if slot.hot.missing & bit != 0 {
                slot.hot.missing &= !bit;
                slot.cold.lost = slot.cold.lost.saturating_sub(1);
            }
        }
        return Outcome::OutOfOrder;
    } else if seq == last_seq {
        slot.cold.duplicates += 1;
        return Outcome::Duplicate;
    } else {
        seq - last_seq - 1
    };

    if lost > 0 {
        slot.cold.lost += lost;
    }
    slot.hot.missing = if first || restarted {
        0
    } else {
        track_missing(slot.hot.missing, lost)
    };
    if restarted {
        slot.cold.restarts += 1;
        slot.hot.burst_left = 0;
        // Rule 2: the interval across the restart is left out.
        slot.hot.left_out = slot.hot.left_out.wrapping_add(1);
    } else if !first {
        count_loss(slot, lost);
        push_interval(slot, now_ns, lost, config);
    }
    let hot = &mut slot.hot;
    // Zero means "none yet": a count that wraps skips it.
    hot.heartbeats = match hot.heartbeats.wrapping_add(1) {
        0 => 1,
        n => n,
    };
    hot.last_arrival_ns = now_ns;
    hot.last_seq = seq;
    if !same_epoch {
        // The current incarnation is never above the highest: only a new one can be.
        let cold = &mut slot.cold;
        cold.previous_incarnation = hot.incarnation;
        hot.incarnation = incarnation;
        if first || incarnation > cold.highest_incarnation {
            cold.highest_incarnation = incarnation;
        }
    }
    Outcome::Accepted { lost }
}

/// Under the line's lock, after an arrival: what of it the agent asked to be told
/// (`PeerHot::tell`), as `ArrivalRecord::outcome`, if anything. A heartbeat the agent waits
/// for (`TELL_HEARD`, set on a suspected peer) clears the bit it is told by. For almost every
/// peer `tell` is zero: one load of a byte in the line the writer holds, and one branch.
#[inline(always)]
pub fn what_to_tell(hot: &mut PeerHot, outcome: Outcome) -> Option<u32> {
    let tell = hot.tell;
    if tell == 0 {
        return None;
    }
    if tell & TELL_HEARD != 0 && matches!(outcome, Outcome::Accepted { .. }) {
        hot.tell = tell & !TELL_HEARD;
        return Some(outcome.code() | ARRIVAL_HEARD);
    }
    (tell & TELL_ARRIVALS != 0).then_some(outcome.code())
}

/// A packet of a passive source (`crate::passive`): no sequence numbers, so each one is the
/// next, and nothing is lost or out of order; the same rules as [`arrive`] from there.
/// `new_epoch` (a BFD session changed its timers) starts a fresh window: the intervals before
/// are of another rate, and the one across the change is not counted (rule 2).
#[inline(always)]
pub fn arrive_passive(
    slot: &mut SlotMut<'_>,
    now_ns: u64,
    new_epoch: bool,
    config: &XdpConfig,
) -> Outcome {
    let hot = &mut slot.hot;
    let mut incarnation = hot.incarnation;
    if new_epoch && hot.heartbeats != 0 {
        // The window is the ring's first `samples` entries: emptied by its count alone.
        hot.samples = 0;
        hot.ring_head = 0;
        hot.outage_run = 0;
        incarnation += 1;
    }
    let seq = hot.last_seq + 1;
    arrive_at(slot, now_ns, seq, incarnation, true, config)
}

/// Sequence numbers below the last accepted one whose late arrival is recognised as filling a
/// counted gap (the width of `PeerHot::missing`).
pub const MISSING_SPAN: u64 = 64;

/// `PeerHot::missing` after an accepted heartbeat `lost + 1` numbers above the previous
/// one: the old bits move up by that much (numbers that fall out of the span are forgotten),
/// and the `lost` numbers just skipped become the lowest bits. Shifts by 64 or more are
/// spelled out (they are undefined on the BPF target and panic in debug builds).
#[inline(always)]
fn track_missing(missing: u64, lost: u64) -> u64 {
    let moved = if lost >= MISSING_SPAN - 1 {
        0
    } else {
        missing << (lost + 1)
    };
    let skipped = if lost >= MISSING_SPAN {
        u64::MAX
    } else {
        (1u64 << lost) - 1
    };
    moved | skipped
}

/// The loss counts (rule 6's picture of recent loss): the hot ones with every heartbeat, the
/// cold ones only after a gap, and all of them when they are halved.
#[inline(always)]
fn count_loss(slot: &mut SlotMut<'_>, lost: u64) {
    let gapped = lost > 0;
    let hot = &mut slot.hot;
    hot.loss_heartbeats += 1;
    if hot.burst_left != 0 {
        hot.burst_heartbeats += 1;
        if gapped {
            slot.cold.burst_gaps += 1;
        }
    }
    if gapped {
        let cold = &mut slot.cold;
        cold.loss_gaps += 1;
        let lost = if lost > u16::MAX as u64 {
            u16::MAX as u32
        } else {
            lost as u32
        };
        cold.loss_lost = cold.loss_lost.saturating_add(lost);
    }
    hot.burst_left = if gapped {
        BURST_MEMORY
    } else {
        hot.burst_left.saturating_sub(1)
    };
    if hot.loss_heartbeats as u32 >= LOSS_MEMORY {
        hot.loss_heartbeats >>= 1;
        hot.burst_heartbeats >>= 1;
        let cold = &mut slot.cold;
        cold.loss_gaps >>= 1;
        cold.loss_lost >>= 1;
        cold.burst_gaps >>= 1;
    }
}

/// Rules 3-5 (see the module docs), then the ring and the running mean; an interval they
/// leave out is counted in `left_out`.
#[inline(always)]
fn push_interval(slot: &mut SlotMut<'_>, now_ns: u64, lost: u64, config: &XdpConfig) {
    if !window_takes(slot, now_ns, lost, config) {
        slot.hot.left_out = slot.hot.left_out.wrapping_add(1);
    }
}

/// The outage rule's mean (`PeerHot::mean_scaled_us`) is kept in units of 1/MEAN_SCALE µs,
/// as `mean += (interval - mean) / MEAN_SCALE`: an exponentially weighted mean whose weight,
/// a power of two, makes the update a shift. Sixteen weighs about the last sixteen intervals,
/// the window a mean of fewer than [`OUTAGE_MIN_SAMPLES`] would not be trusted below anyway.
pub const MEAN_SCALE: u32 = 16;
const MEAN_SHIFT: u32 = MEAN_SCALE.trailing_zeros();
const _: () = assert!(MEAN_SCALE.is_power_of_two());
// The scaled mean of intervals up to MAX_INTERVAL_US fits its u32.
const _: () = assert!(MAX_INTERVAL_US * (MEAN_SCALE as u64) <= u32::MAX as u64);

/// Pushes the interval that ends at `now_ns` into the window unless rules 3-5 leave it out;
/// whether it did. The ring entry is only stored: the window's sums are the agent's to take.
#[inline(always)]
fn window_takes(slot: &mut SlotMut<'_>, now_ns: u64, lost: u64, config: &XdpConfig) -> bool {
    let hot = &mut slot.hot;
    let mut interval = ns_to_us(now_ns.saturating_sub(hot.last_arrival_ns));
    if interval > MAX_INTERVAL_US {
        interval = MAX_INTERVAL_US;
    }
    if config.max_interval_us != 0 && interval > config.max_interval_us as u64 {
        return false;
    }
    if config.flags & XDP_FLAG_GAPLESS_WINDOW != 0 && lost > 0 {
        return false;
    }
    let samples = hot.samples as u32;
    if config.outage_factor != 0
        && samples >= OUTAGE_MIN_SAMPLES
        // interval > K * mean, without a division. At most 2^28 * 2^4 on the left and
        // 2^10 * 2^32 on the right (outage_factor is at most 1024): no overflow.
        && interval * MEAN_SCALE as u64 > config.outage_factor as u64 * hot.mean_scaled_us as u64
    {
        if hot.outage_run < OUTAGE_RUN {
            hot.outage_run += 1;
            slot.cold.outages += 1;
            return false;
        }
    } else {
        hot.outage_run = 0;
    }

    let window = config.window;
    let head = hot.ring_head as u32 & RING_MASK;
    if samples < window {
        hot.samples = (samples + 1) as u8;
    }
    // The first interval of a window is its mean; later ones move it by 1/MEAN_SCALE of the
    // difference (mean * (1 - 1/S) + interval, in scaled units: never negative).
    let mean = hot.mean_scaled_us;
    hot.mean_scaled_us = if samples == 0 {
        (interval as u32) << MEAN_SHIFT
    } else {
        mean - (mean >> MEAN_SHIFT) + interval as u32
    };
    let next = head + 1;
    hot.ring_head = if next >= window { 0 } else { next as u8 };
    slot.ring[head as usize] = interval as u32;
    true
}

/// `ns / 1000`, the way compilers divide a 32-bit number by 1000 (a multiply and a shift,
/// exact for every `ns` below 2^32), and a real division only for silences of 4.3 s or more:
/// a 64-bit divide takes tens of cycles, and this saved about 5 ns a heartbeat in TEST_RUN.
#[inline(always)]
pub fn ns_to_us(ns: u64) -> u64 {
    if ns < 1 << 32 {
        (ns * 274_877_907) >> 38
    } else {
        ns / 1000
    }
}

/// Largest accepted `XdpConfig::outage_factor` (keeps the rule's products inside a u64).
pub const MAX_OUTAGE_FACTOR: u32 = 1024;

/// The slot's window, oldest interval first (userspace helper; the kernel never needs it).
pub fn window_intervals(slot: &PeerSlot, window: u32) -> impl Iterator<Item = u32> + '_ {
    let samples = (slot.hot.samples as u32).min(window);
    let head = slot.hot.ring_head as u32;
    // The oldest sample sits at `head` when the ring is full, at 0 before.
    let start = if samples >= window { head } else { 0 };
    (0..samples).map(move |i| slot.ring_us[((start + i) % window) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::PeerCold;

    const MS: u64 = 1_000_000;

    fn config() -> XdpConfig {
        XdpConfig {
            window: 8,
            ..XdpConfig::default()
        }
    }

    /// A slot that accepted `seqs` (incarnation 1), 10 ms apart.
    fn after(seqs: impl IntoIterator<Item = u64>) -> PeerSlot {
        let mut slot = PeerSlot::admitted(7, 0);
        for (i, seq) in seqs.into_iter().enumerate() {
            let outcome = arrive(&mut slot, (i as u64 + 1) * 10 * MS, seq, 1, &config());
            assert!(
                matches!(outcome, Outcome::Accepted { .. }),
                "{seq}: {outcome:?}"
            );
        }
        slot
    }

    fn late(slot: &mut PeerSlot, seq: u64) -> Outcome {
        arrive(slot, 1000 * MS, seq, 1, &config())
    }

    /// Every interval rules 2-5 leave out is counted in `left_out`; one the window takes, and
    /// a first heartbeat (no interval), are not.
    #[test]
    fn intervals_left_out_are_counted() {
        let c = XdpConfig {
            window: 8,
            max_interval_us: 500_000,
            outage_factor: 4,
            ..XdpConfig::default()
        };
        // Each heartbeat `ms` after the last: (left_out, samples) after it.
        fn step(slot: &mut PeerSlot, ms: u64, seq: u64, inc: u32, c: &XdpConfig) -> (u16, u32) {
            let at = slot.record().last_arrival_ns + ms * MS;
            arrive(slot, at, seq, inc, c);
            (slot.record().left_out, slot.record().samples)
        }
        let mut slot = PeerSlot::admitted(7, 0);
        assert_eq!(step(&mut slot, 10, 1, 1, &c), (0, 0), "first");
        for seq in 2..=6 {
            assert_eq!(step(&mut slot, 10, seq, 1, &c), (0, seq as u32 - 1));
        }
        assert_eq!(step(&mut slot, 100, 7, 1, &c), (1, 5), "an outage");
        assert_eq!(step(&mut slot, 600, 8, 1, &c), (2, 5), "over the cap");
        assert_eq!(step(&mut slot, 10, 1, 2, &c), (3, 5), "across a restart");
        assert_eq!(step(&mut slot, 10, 3, 2, &c), (3, 6), "a gap, counted");
        let gapless = XdpConfig {
            flags: XDP_FLAG_GAPLESS_WINDOW,
            ..c
        };
        assert_eq!(step(&mut slot, 10, 5, 2, &gapless), (4, 6), "a gapless gap");
        let at = slot.record().last_arrival_ns + 10 * MS;
        arrive_passive(&mut slot.parts(), at, true, &c);
        assert_eq!(
            (slot.record().left_out, slot.record().samples),
            (5, 0),
            "a new epoch"
        );
        slot.hot.left_out = u16::MAX;
        assert_eq!(step(&mut slot, 10, 9, 4, &c), (0, 0), "it wraps");
    }

    /// The one-line promise: an accepted heartbeat of the current incarnation with no gap
    /// before it neither reads nor writes the cold lines. Writes: the cold part is unchanged
    /// byte for byte. Reads: a slot whose cold part is garbage ends with the same hot line
    /// and ring as one whose cold part is not.
    #[test]
    fn an_in_order_heartbeat_touches_the_hot_line_and_one_ring_entry_only() {
        let c = XdpConfig {
            window: 8,
            max_interval_us: 500_000,
            outage_factor: 4,
            ..XdpConfig::default()
        };
        let mut clean = after([1, 2, 4, 5, 6]);
        let mut garbage = clean;
        garbage.cold = PeerCold {
            highest_incarnation: u32::MAX,
            previous_incarnation: 1,
            lost: u64::MAX,
            loss_gaps: u32::MAX,
            loss_lost: u32::MAX,
            burst_gaps: u32::MAX,
            outages: u32::MAX,
            restarts: u32::MAX,
            ..garbage.cold
        };
        for seq in 7..40 {
            let at = clean.hot.last_arrival_ns + (9 + seq % 3) * MS;
            let (cold_before, ring_before) = (clean.cold, clean.ring_us);
            let outcome = arrive(&mut clean, at, seq, 1, &c);
            assert_eq!(outcome, Outcome::Accepted { lost: 0 });
            assert_eq!(clean.cold, cold_before, "seq {seq}: a cold line written");
            let changed = (0..MAX_WINDOW)
                .filter(|&i| clean.ring_us[i] != ring_before[i])
                .count();
            assert!(changed <= 1, "seq {seq}: {changed} ring entries written");
            assert_eq!(arrive(&mut garbage, at, seq, 1, &c), outcome);
            assert_eq!(garbage.hot, clean.hot, "seq {seq}: the cold line was read");
            assert_eq!(garbage.ring_us, clean.ring_us);
        }
    }

    /// The view's sums are the ring's: what the kernel's running sums were before it stopped
    /// keeping them, over a ring that wrapped several times.
    #[test]
    fn the_views_sums_are_the_windows() {
        let mut slot = PeerSlot::admitted(7, 0);
        let c = config();
        const W: usize = 8;
        assert_eq!(c.window as usize, W);
        // The window as it should be, oldest first: the last `len` of the intervals.
        let (mut window, mut len) = ([0u64; W], 0);
        let mut at = 0;
        for seq in 1..60u64 {
            let gap = (seq * 7919) % 13 + 5;
            at += gap * MS;
            arrive(&mut slot, at, seq, 1, &c);
            if seq > 1 {
                if len == W {
                    window.copy_within(1.., 0);
                    len -= 1;
                }
                window[len] = gap * 1000;
                len += 1;
            }
            let expected = &window[..len];
            let r = slot.record();
            assert_eq!(r.samples as usize, len);
            assert_eq!(r.interval_sum_us, expected.iter().sum::<u64>());
            assert_eq!(
                r.interval_sum_sq_us,
                expected.iter().map(|us| us * us).sum::<u64>()
            );
            assert!(
                window_intervals(&slot, c.window)
                    .map(u64::from)
                    .eq(expected.iter().copied())
            );
        }
    }

    #[test]
    fn ns_to_us_is_the_division() {
        // The edges of the multiply's range, and a spread of values inside it (the whole
        // range, 2^32 values, was checked once by hand in release).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let spread = (0..100_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> 32
        });
        let edges = [
            0,
            999,
            1000,
            1001,
            u32::MAX as u64 - 1,
            u32::MAX as u64,
            1 << 32,
            u64::MAX,
        ];
        for ns in spread.chain(edges).chain((0..5000).map(|k| k * 999 + 998)) {
            assert_eq!(ns_to_us(ns), ns / 1000, "{ns}");
        }
    }

    #[test]
    fn a_late_heartbeat_fills_its_counted_gap_once() {
        let mut slot = after([1, 2, 5]);
        assert_eq!(slot.record().lost, 2);
        assert_eq!(slot.record().missing, 0b11);
        assert_eq!(late(&mut slot, 3), Outcome::OutOfOrder);
        assert_eq!((slot.record().lost, slot.record().missing), (1, 0b01));
        assert_eq!(late(&mut slot, 4), Outcome::OutOfOrder);
        assert_eq!((slot.record().lost, slot.record().missing), (0, 0));
        assert_eq!(slot.record().out_of_order, 2);
    }

    #[test]
    fn a_duplicate_of_a_late_heartbeat_fills_nothing() {
        let mut slot = after([1, 2, 5]);
        late(&mut slot, 3);
        assert_eq!(late(&mut slot, 3), Outcome::OutOfOrder);
        assert_eq!(slot.record().lost, 1, "4 is still missing");
        assert_eq!(slot.record().out_of_order, 2);
    }

    #[test]
    fn a_replayed_old_heartbeat_fills_nothing() {
        // 102 arrived; 104 and 105 did not.
        let mut slot = after([101, 102, 103, 106]);
        assert_eq!(slot.record().lost, 2);
        for seq in [101, 102, 103] {
            assert_eq!(late(&mut slot, seq), Outcome::OutOfOrder);
        }
        assert_eq!(slot.record().lost, 2);
        assert_eq!(slot.record().out_of_order, 3);
        // From an older incarnation, even a number that is missing in this one. (A number
        // below RESTART_SEQ would be a sender that restarted backwards: see the rebirth tests.)
        assert_eq!(arrive(&mut slot, 0, 104, 0, &config()), Outcome::OutOfOrder);
        assert_eq!(slot.record().lost, 2);
    }

    #[test]
    fn a_late_heartbeat_below_the_tracked_span_fills_nothing() {
        // 2 is lost, then 3..=67 arrive in order: 67 - 1 - 2 = 64, out of the span.
        let mut slot = after([1].into_iter().chain(3..=3 + MISSING_SPAN));
        assert_eq!((slot.record().lost, slot.record().missing), (1, 0));
        late(&mut slot, 2);
        assert_eq!(slot.record().lost, 1);
        // One fewer in order (up to 66) and it is still inside: bit 63.
        let mut slot = after([1].into_iter().chain(3..3 + MISSING_SPAN));
        assert_eq!(slot.record().missing, 1 << 63);
        late(&mut slot, 2);
        assert_eq!((slot.record().lost, slot.record().missing), (0, 0));
    }

    #[test]
    fn gaps_wider_than_the_span_track_their_newest_numbers() {
        let mut slot = after([1, 102]);
        assert_eq!((slot.record().lost, slot.record().missing), (100, u64::MAX));
        late(&mut slot, 101);
        late(&mut slot, 38); // 102 - 1 - 63: the oldest tracked
        late(&mut slot, 37); // beyond the span
        assert_eq!(slot.record().lost, 98);
        // Exactly 63 and 64 lost: the shifts at the edge.
        let slot = after([1, 65]);
        assert_eq!(
            (slot.record().lost, slot.record().missing),
            (63, u64::MAX >> 1)
        );
        let slot = after([1, 66]);
        assert_eq!((slot.record().lost, slot.record().missing), (64, u64::MAX));
        // Older gaps move up as newer heartbeats arrive, and still fill.
        let mut slot = after([1, 3, 4, 7]);
        assert_eq!(slot.record().missing, 0b1_0011);
        late(&mut slot, 2);
        assert_eq!((slot.record().lost, slot.record().missing), (2, 0b0_0011));
    }

    #[test]
    fn passive_packets_are_each_the_next_and_a_new_epoch_empties_the_window() {
        let mut slot = PeerSlot::admitted(7, 0);
        for i in 1..=5u64 {
            let outcome = arrive_passive(&mut slot.parts(), i * 10 * MS, false, &config());
            assert_eq!(outcome, Outcome::Accepted { lost: 0 });
        }
        assert_eq!(
            (slot.record().samples, slot.record().interval_sum_us),
            (4, 40_000)
        );
        // The timers changed: the interval across the change is not counted, nor the old ones.
        arrive_passive(&mut slot.parts(), 500 * MS, true, &config());
        assert_eq!((slot.record().samples, slot.record().restarts), (0, 1));
        arrive_passive(&mut slot.parts(), 600 * MS, false, &config());
        assert_eq!(
            (slot.record().samples, slot.record().interval_sum_us),
            (1, 100_000)
        );
        assert_eq!(slot.record().lost, 0);
        // A new epoch on the very first packet is just the first packet.
        let mut slot = PeerSlot::admitted(7, 0);
        arrive_passive(&mut slot.parts(), MS, true, &config());
        assert_eq!((slot.record().heartbeats, slot.record().restarts), (1, 0));
    }

    #[test]
    fn a_restart_forgets_the_old_epochs_gaps() {
        let mut slot = after([1, 4]);
        assert_eq!(slot.record().lost, 2);
        arrive(&mut slot, 100 * MS, 10, 2, &config());
        assert_eq!(slot.record().missing, 0);
        late(&mut slot, 2);
        assert_eq!(slot.record().lost, 2);
    }

    fn authenticated() -> XdpConfig {
        XdpConfig {
            flags: XDP_FLAG_REQUIRE_AUTH,
            ..config()
        }
    }

    /// The outcome of each of `steps` (seq, incarnation, fresh), 10 ms apart, on a new slot.
    fn run<const N: usize>(c: &XdpConfig, steps: &[(u64, u32, bool); N]) -> [Outcome; N] {
        let mut slot = PeerSlot::admitted(7, 0);
        core::array::from_fn(|i| {
            let (seq, inc, fresh) = steps[i];
            arrive_at(
                &mut slot.parts(),
                (i as u64 + 1) * 10 * MS,
                seq,
                inc,
                fresh,
                c,
            )
        })
    }

    const OK: Outcome = Outcome::Accepted { lost: 0 };
    const LATE: Outcome = Outcome::OutOfOrder;

    #[test]
    fn a_sender_restarted_backwards_is_heard_again() {
        // Incarnation 100, then the sender restarts as 50 (its clock stepped back, or an
        // explicit flag): its sequence starts over, and it is a restart, without a key.
        let steps = [
            (0, 100, true),
            (1, 100, true),
            (0, 50, false),
            (1, 50, false),
        ];
        assert_eq!(run(&config(), &steps), [OK, OK, OK, OK]);
        // With the key, when the new incarnation is fresh by the receiver's clock.
        let steps = [(0, 100, true), (1, 100, true), (0, 50, true), (1, 50, true)];
        assert_eq!(run(&authenticated(), &steps), [OK, OK, OK, OK]);
        // A few first heartbeats lost after the restart: still recognised.
        let steps = [(7, 100, true), (RESTART_SEQ - 1, 50, true)];
        assert_eq!(run(&authenticated(), &steps), [OK, OK]);
    }

    #[test]
    fn a_straggler_of_an_older_epoch_is_still_out_of_order() {
        // Its numbers are that epoch's later ones, with or without the key.
        for c in [config(), authenticated()] {
            let steps = [
                (40, 5, true),
                (0, 6, true),
                (41, 5, true),
                (RESTART_SEQ, 4, true),
            ];
            assert_eq!(run(&c, &steps), [OK, OK, LATE, LATE]);
        }
    }

    #[test]
    fn with_the_key_a_replayed_old_epoch_revives_nothing() {
        let c = authenticated();
        // A stale epoch (older than FRESH_SECS by the receiver's clock): refused.
        let steps = [
            (0, 100, true),
            (1, 100, true),
            (0, 50, false),
            (1, 50, false),
        ];
        assert_eq!(run(&c, &steps), [OK, OK, LATE, LATE]);
        // The epoch before the current one, however fresh: refused.
        let steps = [
            (0, 100, true),
            (0, 200, true),
            (0, 100, true),
            (1, 100, true),
        ];
        assert_eq!(run(&c, &steps), [OK, OK, LATE, LATE]);
        // The current epoch's first heartbeats again: duplicates and late ones, as ever.
        let steps = [
            (0, 100, true),
            (1, 100, true),
            (0, 100, true),
            (1, 100, true),
        ];
        assert_eq!(run(&c, &steps), [OK, OK, LATE, Outcome::Duplicate]);
    }

    #[test]
    fn after_a_step_back_the_epochs_above_it_are_not_new() {
        // 1000 (a clock that was ahead), then 500 (corrected): 1000 again is no longer above
        // every incarnation seen, so it must look like a restart, and with the key be fresh.
        let c = authenticated();
        let steps = [
            (0, 1000, true),
            (0, 500, true),
            (20, 1000, true),
            (0, 1000, false),
        ];
        assert_eq!(run(&c, &steps), [OK, OK, LATE, LATE]);
        // Above every one seen: a restart, whatever the clock says.
        let steps = [(0, 1000, true), (0, 500, true), (90, 1001, false)];
        assert_eq!(run(&c, &steps), [OK, OK, OK]);
    }

    #[test]
    fn freshness_is_symmetric_around_the_wall_clock() {
        let now = 1_800_000_000;
        for inc in [now, now - FRESH_SECS, now + FRESH_SECS] {
            assert!(fresh_incarnation(inc as u32, now), "{inc}");
        }
        for inc in [now - FRESH_SECS - 1, now + FRESH_SECS + 1, 0] {
            assert!(!fresh_incarnation(inc as u32, now), "{inc}");
        }
    }
}
