//! The last-heard words: one `u64` per slot in a dense array (`LAST_HEARD`, ARRAY,
//! BPF_F_MMAPABLE) that the kernel writes with every accepted heartbeat and the agent's sweep
//! scans. Eight peers share a cache line, so a sweep over 50,000 peers reads 400 KiB in
//! order instead of one line of each slot; only a peer whose word says its estimate
//! may have to change costs a read of its slot (see the agent's tracker).
//!
//! A word packs the arrival time and the heartbeat count, written with one store so a reader
//! never sees one without the other:
//!
//! - bits 63..20: `arrival_ns >> 10`, the arrival in units of 1.024 µs (wraps after 204 days
//!   of uptime; readers reconstruct the full time from the clock, see
//!   [`arrival_near`]);
//! - bits 19..0: the slot's [`count`], modulo 2^20: its `heartbeats`, plus
//!   [`LEFT_OUT_STEP`] for each interval the window left out (`PeerRecord::left_out`).
//!
//! The agent only ever needs differences: how many heartbeats since it last read the slot,
//! whether every interval since entered the window (a difference below `LEFT_OUT_STEP`), and
//! when the newest arrived. The arrival it reconstructs is at most 1.024 µs early, which only
//! makes a deadline computed from it earlier (conservative).

/// Name of the map in the eBPF object and of its pin.
pub const LAST_HEARD_MAP: &str = "LAST_HEARD";

/// Bits of the heartbeat count kept in a word.
pub const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Arrival units: 2^10 ns.
const UNIT_SHIFT: u32 = 10;
/// Bits of the arrival units kept in a word.
const UNIT_BITS: u32 = 64 - COUNT_BITS;
const UNIT_MASK: u64 = (1 << UNIT_BITS) - 1;

/// What a word's count advances by for an interval the window left out, on top of the one
/// for its heartbeat: a reader that sees the count advance by less than this since it read the
/// slot knows every interval since entered the window (and how many did). A peer would have to
/// leave out 512 intervals between two reads for its count to wrap into the other half.
pub const LEFT_OUT_STEP: u64 = 1 << 10;

/// The count a word carries for a slot with `heartbeats` accepted heartbeats of which
/// `left_out` intervals the window left out (modulo 2^16, as `PeerRecord::left_out` keeps it).
#[inline(always)]
pub const fn count(heartbeats: u64, left_out: u16) -> u64 {
    heartbeats.wrapping_add((left_out as u64) * LEFT_OUT_STEP)
}

/// The word of a slot whose last accepted heartbeat arrived at `arrival_ns`, with [`count`]
/// `count`. The kernel writes it; the agent computes it from a record to compare.
#[inline(always)]
pub const fn word(arrival_ns: u64, count: u64) -> u64 {
    ((arrival_ns >> UNIT_SHIFT) << COUNT_BITS) | (count & COUNT_MASK)
}

/// The word the kernel stores for a slot whose hot line is `hot`.
#[inline(always)]
pub const fn of_hot(hot: &crate::maps::PeerHot) -> u64 {
    word(
        hot.last_arrival_ns,
        count(hot.heartbeats as u64, hot.left_out),
    )
}

/// The same word, from the agent's view of the slot.
#[inline(always)]
pub const fn of_record(record: &crate::maps::PeerRecord) -> u64 {
    word(
        record.last_arrival_ns,
        count(record.heartbeats, record.left_out),
    )
}

/// The count a word carries: [`count`] modulo 2^20.
#[inline(always)]
pub const fn count_of(w: u64) -> u64 {
    w & COUNT_MASK
}

/// How far the count advanced from the word `from` to the word `to`, if `to` is not older
/// (counts modulo 2^20: a difference of more than 2^19 is taken as `to` being the older): the
/// heartbeats between them if below [`LEFT_OUT_STEP`].
#[inline]
pub const fn heartbeats_since(from: u64, to: u64) -> Option<u64> {
    let d = (to & COUNT_MASK).wrapping_sub(from & COUNT_MASK) & COUNT_MASK;
    if d > COUNT_MASK / 2 { None } else { Some(d) }
}

/// The arrival time a word carries: the time nearest `now_ns` with its low bits, rounded down
/// to 1.024 µs. Nearest, not "at or before": a sweep reads the clock once and then words the
/// kernel may store meanwhile, with arrivals a little after that reading. (Words 102 days or
/// more away from `now_ns` read wrongly; none the agent compares is that old.)
#[inline]
pub const fn arrival_near(w: u64, now_ns: u64) -> u64 {
    let now = now_ns >> UNIT_SHIFT;
    let units = w >> COUNT_BITS;
    let back = now.wrapping_sub(units) & UNIT_MASK;
    let at = if back > UNIT_MASK / 2 {
        now.saturating_add(UNIT_MASK + 1 - back)
    } else {
        now.saturating_sub(back)
    };
    at << UNIT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_arrivals_round_trip() {
        let t0 = 5_000_000_123_456u64;
        let a = word(t0, 41);
        let b = word(t0 + 250_000_000, 44);
        assert_eq!(heartbeats_since(a, b), Some(3));
        assert_eq!(heartbeats_since(b, a), None, "an older word");
        let now = t0 + 900_000_000;
        let at = arrival_near(b, now);
        assert!(
            at <= t0 + 250_000_000 && t0 + 250_000_000 - at < 1024,
            "{at}"
        );
        // At the very time of the arrival, and a little before it (a clock read before the
        // kernel stored the word).
        for now in [t0 + 250_000_000, t0 + 249_000_000] {
            let at = arrival_near(b, now);
            assert!(
                at <= t0 + 250_000_000 && t0 + 250_000_000 - at < 1024,
                "{at}"
            );
        }
    }

    #[test]
    fn counts_wrap() {
        let a = word(1 << 30, COUNT_MASK - 1);
        let b = word(1 << 31, COUNT_MASK + 3);
        assert_eq!(heartbeats_since(a, b), Some(4));
    }

    #[test]
    fn arrivals_wrap_past_the_units() {
        // 1.024 µs units in 44 bits: the clock fills in the high bits.
        let span = 1u64 << (UNIT_BITS + UNIT_SHIFT);
        let arrival = 3 * span + 7_000_000;
        let at = arrival_near(word(arrival, 9), arrival + 5_000_000);
        assert!(at <= arrival && arrival - at < 1024, "{at} vs {arrival}");
        let before_wrap = 3 * span - 2_000;
        let at = arrival_near(word(before_wrap, 9), 3 * span + 1_000_000);
        assert!(
            at <= before_wrap && before_wrap - at < 1024,
            "{at} vs {before_wrap}"
        );
    }
}
