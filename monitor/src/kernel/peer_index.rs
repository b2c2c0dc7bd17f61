//! The writer of the kernel's hot-line table (`monitor_common::index`): where a peer's hot line
//! goes when it is admitted, and what its removal gives back, through the table's mmap
//! (`PeerTable`): a few stores under the lines' locks, no syscall.
//!
//! The agent is the only writer; the kernel reads concurrently on any CPU. The order of the
//! stores below is what makes that safe (see `monitor_common::index`).

use monitor_common::{
    index::{IndexKey, PROBE_LINES, hashed_bits, hashed_line, home as keyed_home, own_line},
    maps::PeerSlot,
};

use crate::kernel::peer_table::PeerTable;

/// No empty line where an id may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the hot-line table has no room for this id within {PROBE_LINES} lines of its hash")]
pub struct IndexFull;

/// Where ids go in the hot lines of a program loaded for a capacity with a hash key.
pub struct PeerIndex {
    capacity: u32,
    bits: u32,
    /// The hash key the kernel's program was loaded with (`XdpConfig::index_key`).
    key: IndexKey,
}

impl PeerIndex {
    /// The index of a program loaded for `capacity` slots with hash key `key`.
    pub fn new(capacity: u32, key: IndexKey) -> Self {
        Self {
            capacity,
            bits: hashed_bits(capacity),
            key,
        }
    }

    /// An index under the fixed key (unit tests).
    #[cfg(test)]
    pub(crate) fn anonymous(capacity: u32) -> Self {
        Self::new(capacity, IndexKey::FIXED)
    }

    /// The home of a hashed `id` in the hashed part, as the kernel computes it.
    fn home(&self, id: u64) -> u32 {
        keyed_home(id, self.bits, &self.key)
    }

    fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    /// The line `k` lines into the probe of a hashed id whose home is `home`.
    fn probe_line(&self, home: u32, k: u32) -> u32 {
        hashed_line(home.wrapping_add(k) & self.mask(), self.capacity)
    }

    /// Where `id` is: (line, lines probed before it), as the kernel looks.
    fn find(&self, table: &PeerTable, id: u64) -> Option<(u32, u32)> {
        let holds = |line| table.linked(line).is_some() && table.line_id(line) == id;
        if let Some(own) = own_line(id, self.capacity) {
            return holds(own).then_some((own, 0));
        }
        let home = self.home(id);
        for k in 0..PROBE_LINES {
            let line = self.probe_line(home, k);
            if holds(line) {
                return Some((line, k));
            }
            if table.overflow(line) == 0 {
                return None;
            }
        }
        None
    }

    /// The slot of `id` as the kernel would find it.
    pub fn get(&self, table: &PeerTable, id: u64) -> Option<u32> {
        self.find(table, id)
            .and_then(|(line, _)| table.linked(line))
    }

    /// Gives the peer `fresh` (whose id must not be in the table: the registry checks) a line
    /// linked to `slot`, and fills both; returns the line. An id of 1 to the capacity takes its
    /// own line, always free; any other the first empty line of its probe, after raising the
    /// `overflow` of the lines it passed, so a reader that sees the line can reach it.
    pub fn insert(
        &mut self,
        table: &PeerTable,
        slot: u32,
        fresh: &PeerSlot,
    ) -> Result<u32, IndexFull> {
        let id = fresh.hot.peer_id;
        debug_assert!(self.find(table, id).is_none(), "peer {id} is already in");
        if let Some(own) = own_line(id, self.capacity) {
            table.fill(own, slot, fresh);
            return Ok(own);
        }
        let home = self.home(id);
        let k = (0..PROBE_LINES)
            .find(|&k| table.linked(self.probe_line(home, k)).is_none())
            .ok_or(IndexFull)?;
        for passed in 0..k {
            table.add_overflow(self.probe_line(home, passed), 1);
        }
        let line = self.probe_line(home, k);
        table.fill(line, slot, fresh);
        Ok(line)
    }

    /// Takes `id`'s line from it (the kernel stops finding it there), then lowers the
    /// `overflow` of the lines its probe passed; returns its slot, if it was there.
    pub fn remove(&mut self, table: &PeerTable, id: u64) -> Option<u32> {
        let (line, k) = self.find(table, id)?;
        let slot = table.linked(line)?;
        table.empty(line, slot);
        let home = self.home(id);
        for passed in 0..k {
            table.add_overflow(self.probe_line(home, passed), -1);
        }
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(id: u64) -> PeerSlot {
        PeerSlot::admitted(id, 1)
    }

    /// Ids past the capacity chosen to share a home line, `n` of them.
    fn colliding(index: &PeerIndex, n: usize) -> Vec<u64> {
        let target = index.home(1 << 40);
        ((1 << 40)..)
            .filter(|&id| index.home(id) == target)
            .take(n)
            .collect()
    }

    #[test]
    fn inserted_ids_are_found_until_removed() {
        let table = PeerTable::anonymous(1000);
        let mut index = PeerIndex::anonymous(1000);
        // Own lines (ids 1 to 500) and hashed ones (odd multiples of 7919, all past 1000).
        let ids = |n: u64| {
            if n.is_multiple_of(2) {
                n / 2 + 1
            } else {
                n * 7919
            }
        };
        for n in 0..1000u64 {
            index.insert(&table, n as u32, &admitted(ids(n))).unwrap();
        }
        for n in 0..1000u64 {
            assert_eq!(index.get(&table, ids(n)), Some(n as u32));
            assert_eq!(table.record(n as u32).unwrap().peer_id, ids(n));
        }
        assert_eq!(index.find(&table, 1), Some((0, 0)), "its own line");
        for n in (0..1000u64).step_by(3) {
            assert_eq!(index.remove(&table, ids(n)), Some(n as u32));
        }
        for n in 0..1000u64 {
            let want = (n % 3 != 0).then_some(n as u32);
            assert_eq!(index.get(&table, ids(n)), want, "id {}", ids(n));
        }
        assert_eq!(table.adopt_links().len(), 666);
        assert_eq!(index.remove(&table, ids(0)), None);
    }

    #[test]
    fn a_full_probe_spills_over_and_back() {
        let capacity = 1000;
        let table = PeerTable::anonymous(capacity);
        let mut index = PeerIndex::anonymous(capacity);
        let ids = colliding(&index, PROBE_LINES as usize + 1);
        let (fits, over) = ids.split_at(ids.len() - 1);
        for (slot, &id) in fits.iter().enumerate() {
            index.insert(&table, slot as u32, &admitted(id)).unwrap();
        }
        assert_eq!(
            index.insert(&table, 999, &admitted(over[0])),
            Err(IndexFull)
        );
        for (slot, &id) in fits.iter().enumerate() {
            assert_eq!(index.get(&table, id), Some(slot as u32));
        }
        // Emptying the home line leaves the spilled ids reachable (the counts still say so).
        assert_eq!(index.remove(&table, fits[0]), Some(0));
        for (slot, &id) in fits.iter().enumerate().skip(1) {
            assert_eq!(index.get(&table, id), Some(slot as u32));
        }
        // Removing the rest brings every count back to zero.
        for &id in &fits[1..] {
            assert!(index.remove(&table, id).is_some());
        }
        for line in 0..table.line_count() {
            assert_eq!(table.overflow(line), 0, "line {line}");
        }
        assert!(table.adopt_links().is_empty());
    }

    /// A full table (as many peers as slots, sequential ids past the capacity, so all hashed)
    /// under random keys: every id finds room within its probe, and the kernel's function
    /// finds each where it was put.
    #[test]
    fn a_full_table_fits_under_random_keys() {
        for _ in 0..2 {
            let key = crate::kernel::index_key::random().unwrap();
            let capacity = 65_536;
            let table = PeerTable::anonymous(capacity);
            let mut index = PeerIndex::new(capacity, key);
            let first = capacity as u64 + 1;
            for n in 0..capacity as u64 {
                index
                    .insert(&table, n as u32, &admitted(first + n))
                    .unwrap();
            }
            for n in (0..capacity as u64).step_by(97) {
                assert_eq!(index.get(&table, first + n), Some(n as u32));
                assert_eq!(
                    index.home(first + n),
                    keyed_home(first + n, index.bits, &key)
                );
            }
        }
    }

    /// Ids that fill one probe under the fixed hash (what an attacker computes offline for an
    /// unkeyed table) leave room for everyone under a random key.
    #[test]
    fn ids_aimed_at_the_fixed_hash_miss_under_a_random_key() {
        let fixed = PeerIndex::anonymous(1000);
        let aimed = colliding(&fixed, 64);
        let table = PeerTable::anonymous(1000);
        let mut keyed = PeerIndex::new(1000, crate::kernel::index_key::random().unwrap());
        for (slot, &id) in aimed.iter().enumerate() {
            keyed.insert(&table, slot as u32, &admitted(id)).unwrap();
        }
    }

    /// An own line is its id's alone: ids aimed at it through the hash never take it, and it
    /// is free whenever its id comes.
    #[test]
    fn own_lines_are_never_taken_by_hashed_ids() {
        let table = PeerTable::anonymous(8);
        let mut index = PeerIndex::anonymous(8);
        for n in 0..8u32 {
            let line = index
                .insert(&table, n, &admitted((1 << 40) + n as u64))
                .unwrap();
            assert!(line >= 8, "hashed ids go past the own lines: {line}");
        }
        assert_eq!(index.remove(&table, 1 << 40), Some(0));
        assert_eq!(index.insert(&table, 0, &admitted(8)), Ok(7));
    }
}
