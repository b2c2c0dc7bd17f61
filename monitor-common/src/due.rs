//! Due buckets: the kernel tells the agent which peers to look at (docs/tuning.md, "An agent
//! the kernel tells when to look").
//!
//! An agent that scans the last-heard words looks at every heartbeat: at 10 Hz, half the peers
//! have a new word at each 50 ms scan, and each moves its watch on, although almost all of them
//! change nothing but the time of the next look. Here the kernel keeps that time instead:
//!
//! - the agent writes each peer's *watch* (`PEER_WATCH`, one `u64` a slot) wherever it sets the
//!   peer's floor: the least silence at which phi can reach the first level, the word's count
//!   at which the floor was set, and how many heartbeats past it the floor covers ([`watch`]);
//! - with each accepted arrival the program stores the *due bucket* (`PEER_DUE`, one `u16` a
//!   slot, [`DUE_PER_LINE`] to a cache line) of the time the agent must look at the peer if it
//!   is not heard again: the arrival plus the floor while the floor covers the arrival, the
//!   arrival itself otherwise ([`due_at`]);
//! - the agent scans the buckets (2 bytes a peer) and looks only at the peers due before its
//!   next scan. A peer heard on time has moved its bucket on before any scan reaches it.
//!
//! A bucket is 2^[`BUCKET_SHIFT`] ns (about 4.2 ms) of the monotonic clock, modulo 2^16: the
//! buckets cover 275 s, so "due" is read within half of that around now ([`is_due`]). The
//! agent also stores buckets itself: after it looks at a peer, the bucket of its next deadline.

use crate::last_heard;

/// Name of the watch array in the eBPF object and of its pin.
pub const PEER_WATCH_MAP: &str = "PEER_WATCH";
/// Name of the due-bucket array in the eBPF object and of its pin.
pub const PEER_DUE_MAP: &str = "PEER_DUE";

/// Buckets in an element of `PEER_DUE`: a cache line. (A BPF array's elements are 8-byte
/// aligned, so an array of `u16` would spread the buckets 8 bytes apart.)
pub const DUE_PER_LINE: usize = 32;
/// An element of `PEER_DUE`.
pub type DueLine = [u16; DUE_PER_LINE];

/// Elements of `PEER_DUE` for `capacity` slots.
pub const fn due_lines_for(capacity: u32) -> u32 {
    capacity.div_ceil(DUE_PER_LINE as u32)
}

/// A bucket is 2^22 ns, about 4.2 ms; 2^16 of them are 275 s.
pub const BUCKET_SHIFT: u32 = 22;
/// A watch's floor is in units of 2^16 ns, about 66 µs (rounded down: never later).
pub const FLOOR_UNIT_SHIFT: u32 = 16;
/// The longest floor a watch holds, in its units (about 78 hours); a longer one is held at it.
const FLOOR_UNITS_MAX: u64 = u32::MAX as u64;
/// A watch's span field: 6 bits, and spans are at most 32 heartbeats.
const SPAN_BITS: u32 = 6;
const SPAN_MASK: u64 = (1 << SPAN_BITS) - 1;
const COUNT_MASK: u64 = (1 << last_heard::COUNT_BITS) - 1;

/// The watch of a peer with no floor: every accepted arrival makes it due at once.
pub const NO_WATCH: u64 = 0;

/// The watch the agent writes for a peer whose floor is `floor_ns` of silence, set when the
/// word's count was `refreshed` (modulo 2^20) and covering the heartbeats whose count is less
/// than `span` past it:
///
/// - bits 31..0: the floor in units of 2^[`FLOOR_UNIT_SHIFT`] ns, rounded down (0: no floor);
/// - bits 51..32: `refreshed`;
/// - bits 57..52: `span` (at most 63).
///
/// A floor shorter than a unit is no floor ([`NO_WATCH`]): the peer is due at each arrival.
#[inline]
pub const fn watch(floor_ns: u64, refreshed: u64, span: u8) -> u64 {
    let units = floor_ns >> FLOOR_UNIT_SHIFT;
    if units == 0 {
        return NO_WATCH;
    }
    let units = if units > FLOOR_UNITS_MAX {
        FLOOR_UNITS_MAX
    } else {
        units
    };
    let span = if span as u64 > SPAN_MASK {
        SPAN_MASK
    } else {
        span as u64
    };
    units | ((refreshed & COUNT_MASK) << 32) | (span << (32 + last_heard::COUNT_BITS))
}

/// The kernel's rule, also the tests' stand-in's: when the peer whose watch is `watch` is due
/// after an accepted arrival at `now_ns` that took the word's count to `count`. While the floor
/// covers the arrival (the count is 1 to `span - 1` past `refreshed`, as the agent's sweep takes
/// a heartbeat in passing) the peer cannot reach the first level before the floor has passed
/// since this arrival; otherwise (no floor, the span used up, an interval the window left out,
/// which moves the count by `last_heard::LEFT_OUT_STEP`) the agent must look now.
#[inline(always)]
pub const fn due_at(watch: u64, count: u64, now_ns: u64) -> u64 {
    let units = watch & FLOOR_UNITS_MAX;
    let refreshed = (watch >> 32) & COUNT_MASK;
    let span = (watch >> (32 + last_heard::COUNT_BITS)) & SPAN_MASK;
    let since = count.wrapping_sub(refreshed) & COUNT_MASK;
    if units == 0 || since == 0 || since >= span {
        now_ns
    } else {
        now_ns.saturating_add(units << FLOOR_UNIT_SHIFT)
    }
}

/// The bucket of `at_ns` (monotonic ns): rounded down, so a look is never later than asked.
#[inline(always)]
pub const fn bucket(at_ns: u64) -> u16 {
    (at_ns >> BUCKET_SHIFT) as u16
}

/// The furthest ahead a bucket is read as the future: half the buckets' range.
pub const AHEAD_MAX: u16 = i16::MAX as u16;

/// The bucket the agent stores for a look due at `at_ns` (u64::MAX: none), at `now_ns`: a
/// time further ahead than half the buckets' range is held at [`AHEAD_MAX`] buckets from now,
/// where the peer is looked at again (and its bucket stored again) about 137 s on.
#[inline]
pub const fn bucket_for(at_ns: u64, now_ns: u64) -> u16 {
    let now = bucket(now_ns);
    if at_ns <= now_ns {
        return now;
    }
    let ahead = (at_ns - now_ns) >> BUCKET_SHIFT;
    if ahead >= AHEAD_MAX as u64 {
        now.wrapping_add(AHEAD_MAX)
    } else {
        bucket(at_ns)
    }
}

/// Whether a peer whose bucket is `b` is due by `by_ns`, at `now_ns`: its bucket is at or
/// before `by_ns`'s, read within half the buckets' range around now (a bucket up to 137 s
/// old is due; one further back reads as the future, which the agent's full scan of the words
/// once a second makes harmless).
#[inline(always)]
pub const fn is_due(b: u16, now_ns: u64, by_ns: u64) -> bool {
    DueBy::new(now_ns, by_ns).holds(b)
}

/// [`is_due`] for one `now_ns` and `by_ns`, worked out once for a scan of every bucket.
#[derive(Debug, Clone, Copy)]
pub struct DueBy {
    now: u16,
    ahead: i16,
}

impl DueBy {
    #[inline]
    pub const fn new(now_ns: u64, by_ns: u64) -> Self {
        let now = bucket(now_ns);
        let ahead = if by_ns <= now_ns {
            0
        } else {
            bucket_for(by_ns, now_ns).wrapping_sub(now) as i16
        };
        Self { now, ahead }
    }

    /// Whether a peer whose bucket is `b` is due.
    #[inline(always)]
    pub const fn holds(&self, b: u16) -> bool {
        (b.wrapping_sub(self.now) as i16) <= self.ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_covered_arrival_is_due_a_floor_later_and_any_other_at_once() {
        let w = watch(138 * MS, 100, 32);
        let floor = ((138 * MS) >> FLOOR_UNIT_SHIFT) << FLOOR_UNIT_SHIFT;
        assert!(floor <= 138 * MS && 138 * MS - floor < 1 << FLOOR_UNIT_SHIFT);
        let now = 5_000 * MS;
        assert_eq!(due_at(w, 100, now), now, "the refresh's own count");
        assert_eq!(due_at(w, 101, now), now + floor);
        assert_eq!(due_at(w, 131, now), now + floor);
        assert_eq!(due_at(w, 132, now), now, "the span used up");
        assert_eq!(
            due_at(w, 101 + last_heard::LEFT_OUT_STEP, now),
            now,
            "an interval left out"
        );
        assert_eq!(due_at(w, 99, now), now, "an older count");
        assert_eq!(due_at(NO_WATCH, 101, now), now);
        assert_eq!(due_at(watch(1000, 100, 32), 101, now), now, "below a unit");
        assert_eq!(due_at(watch(138 * MS, 100, 0), 101, now), now, "span 0");
        // The count wraps at 2^20.
        let w = watch(MS << 4, COUNT_MASK - 1, 4);
        assert_eq!(due_at(w, 1, now), now + (MS << 4) / (1 << 16) * (1 << 16));
        assert_eq!(due_at(w, 2, now), now);
    }

    #[test]
    fn a_bucket_is_due_up_to_the_horizon_and_back_half_the_range() {
        let now = 1_000_000 * MS;
        let b = bucket(now);
        assert!(is_due(b, now, now));
        assert!(is_due(b.wrapping_sub(1000), now, now), "a past one");
        assert!(is_due(b.wrapping_sub(AHEAD_MAX), now, now));
        assert!(is_due(bucket(now + 30 * MS), now, now + 30 * MS));
        assert!(!is_due(bucket(now + 50 * MS), now, now + 30 * MS));
        assert!(!is_due(bucket_for(u64::MAX, now), now, now + 30 * MS));
        assert_eq!(bucket_for(now - MS, now), b);
        assert_eq!(
            bucket_for(now + 200 * 1000 * MS, now),
            b.wrapping_add(AHEAD_MAX)
        );
        // Rounded down: a look asked for at a time is due by that time, at every phase.
        for at in [now + 1, now + 7 * MS + 3, now + 29 * MS, now + 4 * MS] {
            assert!(is_due(bucket_for(at, now), now, at));
            assert!(is_due(bucket_for(at, now), at, at));
        }
    }
}
