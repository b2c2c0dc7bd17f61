//! The slots whose watch comes due before the next scan, in order of their deadlines: what
//! lets the sweeper raise an event at its deadline rather than at the next scan.
//!
//! The scan stays the bulk mechanism: sequential, two compares per quiet peer. A slot enters
//! here only when its deadline falls between now and the next scan's start (`arm`), which for
//! a steady sender is rare when the scan interval is below the slack between its interval and
//! its floor (38 ms for a 100 ms sender with the defaults), so what this holds is mostly the
//! peers that really are falling silent, and its cost follows them. An entry is a hint, not a
//! promise: the slot is looked at again at its time, through the same path as the scan
//! (`Agent::look_at_slot`), and a heartbeat that moved its deadline since makes it a
//! quick no-op.

use std::{cmp::Reverse, collections::BinaryHeap};

use crate::detector::tracker::{LevelFloor, WordWatch};

/// Entries due within one tick are taken in one wake: the sweeper sleeps until the earliest
/// deadline rounded up to a tick, so a burst of crossings costs a wake a tick, not a wake an
/// entry, and an event is at most a tick late (plus the wake's own latency).
pub const DUE_TICK_NS: u64 = 250_000;

/// A min-heap of (deadline, slot), with the time of the next scan, before which a deadline
/// must fall to enter.
#[derive(Debug, Default)]
pub struct DueSoon {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// The next scan's start (monotonic ns): a later deadline is the scan's to find.
    horizon_ns: u64,
    /// The earliest deadline a watch was left with unarmed since the last scan began
    /// (`begin_scan`): what a scan that leaves the words alone must not pass over
    /// (`scan_skip`).
    earliest_unarmed_ns: u64,
}

impl DueSoon {
    /// The next scan starts at `horizon_ns`.
    pub fn set_horizon(&mut self, horizon_ns: u64) {
        self.horizon_ns = horizon_ns;
    }

    /// A scan begins: it will look at every watch, so only the deadlines it and later passes
    /// leave unarmed count from now on.
    pub fn begin_scan(&mut self) {
        self.earliest_unarmed_ns = u64::MAX;
    }

    /// The earliest deadline left unarmed since the last scan began (u64::MAX for none, and
    /// 0 before any scan): no scan may be left out that would have reached it.
    pub fn earliest_unarmed(&self) -> u64 {
        self.earliest_unarmed_ns
    }

    /// `slot` is due at `deadline_ns`: kept if that is after `now_ns` and before the next
    /// scan. A deadline already passed is not kept (a held pass leaves it to the scan, which
    /// takes it when the hold ends, rather than spin on it). True if kept.
    #[inline(always)]
    pub fn arm(&mut self, slot: usize, deadline_ns: u64, now_ns: u64) -> bool {
        let soon = deadline_ns < self.horizon_ns && deadline_ns > now_ns;
        if soon {
            self.heap.push(Reverse((deadline_ns, slot as u32)));
        }
        soon
    }

    /// `slot`'s watch, armed for its deadline if that comes before the next scan and so does
    /// the crossing it predicts (`LevelFloor::predicted_crossing_ns`): an exact deadline is
    /// its crossing; a floor whose estimate crosses after the next scan is left to that scan,
    /// which reads the slot once the floor has passed and arms the exact crossing. So a
    /// steady sender, whose floor may come before the next scan but whose crossing does not,
    /// costs nothing here. `floor` is read only when the deadline is that near.
    #[inline(always)]
    pub fn arm_watch(
        &mut self,
        slot: usize,
        watch: &WordWatch,
        floor: &LevelFloor,
        now_ns: u64,
    ) -> bool {
        let armed = watch.deadline_ns < self.horizon_ns
            && floor.predicted_crossing_ns(watch) < self.horizon_ns
            && self.arm(slot, watch.deadline_ns, now_ns);
        if !armed {
            self.earliest_unarmed_ns = self.earliest_unarmed_ns.min(watch.deadline_ns);
        }
        armed
    }

    /// `slot` is to be looked at as soon as the sweeper wakes (a peer just admitted on its
    /// first packet, whose first deadline may come before the next scan). True if nothing
    /// was armed so before: the sweeper needs waking; otherwise a wake is already owed.
    pub fn arm_now(&mut self, slot: u32) -> bool {
        let first = self.earliest() != Some(0);
        self.heap.push(Reverse((0, slot)));
        first
    }

    /// The earliest deadline held, if any.
    pub fn earliest(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((deadline, _))| *deadline)
    }

    /// When the sweeper should wake for the earliest entry: its deadline rounded up to a
    /// `DUE_TICK_NS`, so that the entries of one tick are taken together.
    pub fn wake_ns(&self) -> Option<u64> {
        self.earliest()
            .map(|deadline| deadline.div_ceil(DUE_TICK_NS).saturating_mul(DUE_TICK_NS))
    }

    /// The next slot due at `now_ns`, removed; None when the earliest is later.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<u32> {
        match self.heap.peek() {
            Some(Reverse((deadline, _))) if *deadline <= now_ns => {
                self.heap.pop().map(|Reverse((_, slot))| slot)
            }
            _ => None,
        }
    }

    /// Entries held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deadlines_between_now_and_the_next_scan_enter() {
        let mut due = DueSoon::default();
        due.set_horizon(1_000);
        assert!(!due.arm(1, 100, 100), "due now: the caller takes it");
        assert!(!due.arm(2, 50, 100), "passed");
        assert!(!due.arm(3, 1_000, 100), "the next scan's");
        assert!(!due.arm(4, u64::MAX, 100), "never");
        assert!(due.arm(5, 999, 100));
        assert_eq!(due.len(), 1);
    }

    #[test]
    fn entries_come_out_in_deadline_order_once_due() {
        let mut due = DueSoon::default();
        due.set_horizon(u64::MAX);
        for (slot, deadline) in [(7, 3_000_000), (8, 1_000_000), (9, 2_000_000)] {
            assert!(due.arm(slot, deadline, 0));
        }
        assert_eq!(due.earliest(), Some(1_000_000));
        assert_eq!(due.pop_due(999_999), None, "not yet");
        assert_eq!(due.pop_due(2_500_000), Some(8));
        assert_eq!(due.pop_due(2_500_000), Some(9));
        assert_eq!(due.pop_due(2_500_000), None);
        assert_eq!(due.earliest(), Some(3_000_000));
        assert!(due.arm_now(4), "the first asks for a wake");
        assert!(!due.arm_now(5), "the next is taken by the same wake");
        assert_eq!(due.pop_due(0), Some(4), "an admission is taken at once");
        assert_eq!(due.pop_due(0), Some(5));
    }

    #[test]
    fn the_wake_is_the_earliest_deadline_rounded_up_to_a_tick() {
        let mut due = DueSoon::default();
        due.set_horizon(u64::MAX);
        assert_eq!(due.wake_ns(), None);
        due.arm(1, 10 * DUE_TICK_NS + 1, 0);
        due.arm(2, 10 * DUE_TICK_NS + DUE_TICK_NS / 2, 0);
        assert_eq!(due.wake_ns(), Some(11 * DUE_TICK_NS));
        // Both are due at that wake: one wake for the tick.
        let wake = due.wake_ns().unwrap();
        assert_eq!((due.pop_due(wake), due.pop_due(wake)), (Some(1), Some(2)));
        due.arm(3, 12 * DUE_TICK_NS, 0);
        assert_eq!(due.wake_ns(), Some(12 * DUE_TICK_NS), "on a tick: no later");
    }
}
