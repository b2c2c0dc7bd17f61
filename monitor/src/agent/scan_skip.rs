//! When a scan may leave the words alone: an idle agent's cost, independent of its peers.
//!
//! A scan loads every peer's last-heard word to find those heard since, and compares every
//! watch's deadline with the clock. With no heartbeat anywhere since the last scan and no
//! deadline coming before the next, it finds nothing: 50,000 listed peers and no traffic cost
//! 0.46% of a core where no peers cost 0.14% (docs/tuning.md, "What an agent that scans costs
//! before it does anything"). The program counts every word it stores, after storing it
//! (`ProgramStats::words_stored`); a count read before a scan and unchanged at the next tick
//! says no word moved in between, so that tick's scan is left out when, besides:
//!
//! - no deadline was left unarmed that falls before the scan after it
//!   (`DueSoon::earliest_unarmed`: the ones armed are the due passes', which still run);
//! - the last scan ran whole with no detector change under way (a change re-levels trackers
//!   outside the scans) and no slot was cleared since (an admission or a forget);
//! - the link is not held (`hold`), and a scan ran in the last `FULL_SCAN_AT_LEAST_NS`: a
//!   bound on what any flaw in the above could cost, not a part of the rule.

/// A full scan at least this often, whatever the count says.
pub const FULL_SCAN_AT_LEAST_NS: u64 = 1_000_000_000;

/// What the last full scan saw, for deciding on the next.
#[derive(Debug, Default)]
pub struct ScanSkip {
    /// The program's count of stored words read just before the last full scan (None: none
    /// read, or no full scan yet).
    stored_at_scan: Option<u64>,
    /// When the last full scan ran (monotonic ns).
    scanned_ns: u64,
    /// The last full scan ran with no detector change under way, and no slot was cleared
    /// since it began.
    clean: bool,
    /// A slot was cleared since the last full scan began.
    cleared: bool,
}

impl ScanSkip {
    /// Whether the scan of `now_ns`, the next one at `next_scan_ns`, may leave the words
    /// alone: `stored` is the program's count read now, `earliest_unarmed_ns` the earliest
    /// deadline no due pass will take, `busy` a held link or a detector change under way.
    pub fn may_skip(
        &self,
        stored: Option<u64>,
        now_ns: u64,
        next_scan_ns: u64,
        earliest_unarmed_ns: u64,
        busy: bool,
    ) -> bool {
        !busy
            && self.clean
            && stored.is_some()
            && stored == self.stored_at_scan
            && earliest_unarmed_ns >= next_scan_ns
            && now_ns.saturating_sub(self.scanned_ns) < FULL_SCAN_AT_LEAST_NS
    }

    /// A full scan begins.
    pub fn begin(&mut self) {
        self.cleared = false;
    }

    /// A full scan ran at `now_ns` after the count `stored` was read; `change_free` if no
    /// detector change was under way during it.
    pub fn scanned(&mut self, stored: Option<u64>, now_ns: u64, change_free: bool) {
        self.stored_at_scan = stored;
        self.scanned_ns = now_ns;
        self.clean = change_free && !self.cleared;
    }

    /// A slot's watch was reset outside a scan (an admission or a forget): the next scan runs
    /// whole, also if this one came while a scan was under way (which may have passed the
    /// slot already).
    pub fn slot_cleared(&mut self) {
        self.cleared = true;
        self.clean = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn scanned_at(now_ns: u64, stored: u64) -> ScanSkip {
        let mut s = ScanSkip::default();
        s.begin();
        s.scanned(Some(stored), now_ns, true);
        s
    }

    #[test]
    fn an_unchanged_count_with_nothing_due_leaves_the_words_alone() {
        let s = scanned_at(1_000 * MS, 7);
        assert!(s.may_skip(Some(7), 1_050 * MS, 1_100 * MS, u64::MAX, false));
        assert!(s.may_skip(Some(7), 1_050 * MS, 1_100 * MS, 1_100 * MS, false));
    }

    #[test]
    fn anything_that_may_have_moved_a_word_or_a_deadline_scans() {
        let s = scanned_at(1_000 * MS, 7);
        assert!(
            !s.may_skip(Some(8), 1_050 * MS, 1_100 * MS, u64::MAX, false),
            "a word stored"
        );
        assert!(
            !s.may_skip(None, 1_050 * MS, 1_100 * MS, u64::MAX, false),
            "no count"
        );
        assert!(
            !s.may_skip(Some(7), 1_050 * MS, 1_100 * MS, 1_099 * MS, false),
            "an unarmed deadline before the next scan"
        );
        assert!(
            !s.may_skip(Some(7), 1_050 * MS, 1_100 * MS, u64::MAX, true),
            "busy"
        );
        assert!(
            !s.may_skip(Some(7), 2_000 * MS, 2_050 * MS, u64::MAX, false),
            "a full scan at least once a second"
        );
        let mut cleared = scanned_at(1_000 * MS, 7);
        cleared.slot_cleared();
        assert!(!cleared.may_skip(Some(7), 1_050 * MS, 1_100 * MS, u64::MAX, false));
        // Cleared while a scan was under way: that scan may have passed the slot.
        let mut during = ScanSkip::default();
        during.begin();
        during.slot_cleared();
        during.scanned(Some(7), 1_000 * MS, true);
        assert!(!during.may_skip(Some(7), 1_050 * MS, 1_100 * MS, u64::MAX, false));
        let mut changing = ScanSkip::default();
        changing.scanned(Some(7), 1_000 * MS, false);
        assert!(!changing.may_skip(Some(7), 1_050 * MS, 1_100 * MS, u64::MAX, false));
        assert!(
            !ScanSkip::default().may_skip(None, 0, 50 * MS, u64::MAX, false),
            "before any scan"
        );
    }
}
