//! The kernel's peer index (`monitor_common::index`), written through an mmap of the
//! PEER_INDEX array: admitting or forgetting a peer costs a few stores, no syscall.
//!
//! The agent is the only writer; the kernel reads concurrently on any CPU. The order of the
//! stores below is what makes that safe (see `monitor_common::index`).

use std::{
    os::fd::BorrowedFd,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

use monitor_common::index::{
    BUCKET_ENTRIES, IndexBucket, IndexKey, PROBE_BUCKETS, bits_for, home as keyed_home,
};

use crate::kernel::peer_table::{PeerTableError, map_array};

/// No empty entry in the buckets an id may live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the peer index has no room for this id within {PROBE_BUCKETS} buckets of its hash")]
pub struct IndexFull;

/// A shared mapping of the PEER_INDEX array.
pub struct PeerIndex {
    base: NonNull<IndexBucket>,
    bits: u32,
    bytes: usize,
    /// The hash key the kernel's program was loaded with (`XdpConfig::index_key`).
    key: IndexKey,
}

// SAFETY: the mapping lives until drop; writes need `&mut self` (one writer), and the kernel's
// concurrent reads are what the store order below is for.
unsafe impl Send for PeerIndex {}
unsafe impl Sync for PeerIndex {}

impl PeerIndex {
    /// Maps the index of a program loaded for `capacity` slots with hash key `key`.
    pub fn map(fd: BorrowedFd<'_>, capacity: u32, key: IndexKey) -> Result<Self, PeerTableError> {
        let bits = bits_for(capacity);
        let (base, bytes) = map_array::<IndexBucket>("peer index", fd, 1 << bits)?;
        Ok(Self {
            base,
            bits,
            bytes,
            key,
        })
    }

    /// An index over anonymous memory (unit tests: the same code, no kernel).
    #[cfg(test)]
    pub(crate) fn anonymous(capacity: u32) -> Self {
        Self::anonymous_keyed(capacity, IndexKey::FIXED)
    }

    #[cfg(test)]
    pub(crate) fn anonymous_keyed(capacity: u32, key: IndexKey) -> Self {
        let bits = bits_for(capacity);
        let (base, bytes) = crate::kernel::peer_table::anonymous_array(1 << bits);
        Self {
            base,
            bits,
            bytes,
            key,
        }
    }

    /// The home bucket of `id`, as the kernel computes it.
    fn home(&self, id: u64) -> u32 {
        keyed_home(id, self.bits, &self.key)
    }

    fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    fn bucket(&self, b: u32) -> *mut IndexBucket {
        debug_assert!(b <= self.mask());
        // SAFETY: `b` is masked to the table, which the mapping covers.
        unsafe { self.base.as_ptr().add(b as usize) }
    }

    fn slot_word(&self, b: u32, e: usize) -> &AtomicU32 {
        // SAFETY: in bounds, 4-aligned; the kernel only reads it.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.bucket(b)).slots[e]) }
    }

    fn id(&self, b: u32, e: usize) -> u64 {
        // SAFETY: in bounds; only this (single) writer stores ids.
        unsafe { std::ptr::read_volatile(&raw const (*self.bucket(b)).ids[e]) }
    }

    fn add_overflow(&self, b: u32, delta: i32) {
        // SAFETY: in bounds; only this writer stores it.
        unsafe {
            let p = &raw mut (*self.bucket(b)).overflow;
            std::ptr::write_volatile(p, std::ptr::read_volatile(p).wrapping_add_signed(delta));
        }
    }

    /// Where `id` is: (bucket, entry, buckets probed before it).
    fn find(&self, id: u64) -> Option<(u32, usize, u32)> {
        let mut b = self.home(id);
        for k in 0..PROBE_BUCKETS {
            for e in 0..BUCKET_ENTRIES {
                if self.slot_word(b, e).load(Ordering::Relaxed) != 0 && self.id(b, e) == id {
                    return Some((b, e, k));
                }
            }
            // SAFETY: in bounds.
            if unsafe { std::ptr::read_volatile(&raw const (*self.bucket(b)).overflow) } == 0 {
                return None;
            }
            b = (b + 1) & self.mask();
        }
        None
    }

    /// The slot of `id` as the kernel would find it.
    pub fn get(&self, id: u64) -> Option<u32> {
        self.find(id)
            .map(|(b, e, _)| self.slot_word(b, e).load(Ordering::Relaxed) - 1)
    }

    /// Adds `id` -> `slot`; `id` must not be in the index (the registry checks).
    pub fn insert(&mut self, id: u64, slot: u32) -> Result<(), IndexFull> {
        debug_assert!(self.find(id).is_none(), "peer {id} is already indexed");
        let start = self.home(id);
        let mut b = start;
        for k in 0..PROBE_BUCKETS {
            if let Some(e) =
                (0..BUCKET_ENTRIES).find(|&e| self.slot_word(b, e).load(Ordering::Relaxed) == 0)
            {
                // Buckets passed first, so a reader that sees the entry can reach it.
                let mut passed = start;
                for _ in 0..k {
                    self.add_overflow(passed, 1);
                    passed = (passed + 1) & self.mask();
                }
                // SAFETY: in bounds; the entry is empty, so readers skip it until the slot
                // store below (a release: the id is visible first).
                unsafe { std::ptr::write_volatile(&raw mut (*self.bucket(b)).ids[e], id) };
                self.slot_word(b, e).store(slot + 1, Ordering::Release);
                return Ok(());
            }
            b = (b + 1) & self.mask();
        }
        Err(IndexFull)
    }

    /// Removes `id`; returns whether it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some((b, e, k)) = self.find(id) else {
            return false;
        };
        // The entry first, so no reader is sent on past a lowered count to an entry still live.
        self.slot_word(b, e).store(0, Ordering::Release);
        let mut passed = self.home(id);
        for _ in 0..k {
            self.add_overflow(passed, -1);
            passed = (passed + 1) & self.mask();
        }
        true
    }

    /// Every (id, slot) in the index, in table order.
    pub fn entries(&self) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        for b in 0..=self.mask() {
            for e in 0..BUCKET_ENTRIES {
                let slot = self.slot_word(b, e).load(Ordering::Acquire);
                if slot != 0 {
                    out.push((self.id(b, e), slot - 1));
                }
            }
        }
        out
    }
}

impl Drop for PeerIndex {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what was mapped.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids chosen to share a home bucket, `n` of them.
    fn colliding(index: &PeerIndex, n: usize) -> Vec<u64> {
        let target = index.home(1);
        (1..)
            .filter(|&id| index.home(id) == target)
            .take(n)
            .collect()
    }

    #[test]
    fn inserted_ids_are_found_until_removed() {
        let mut index = PeerIndex::anonymous(1000);
        for id in 0..1000u64 {
            index.insert(id * 7919, id as u32).unwrap();
        }
        for id in 0..1000u64 {
            assert_eq!(index.get(id * 7919), Some(id as u32));
        }
        for id in (0..1000u64).step_by(2) {
            assert!(index.remove(id * 7919));
        }
        for id in 0..1000u64 {
            let want = (id % 2 == 1).then_some(id as u32);
            assert_eq!(index.get(id * 7919), want, "id {}", id * 7919);
        }
        assert_eq!(index.entries().len(), 500);
        assert!(!index.remove(0));
    }

    #[test]
    fn a_full_home_bucket_spills_over_and_back() {
        let mut index = PeerIndex::anonymous(1000);
        let ids = colliding(&index, BUCKET_ENTRIES * PROBE_BUCKETS as usize + 1);
        let (fits, over) = ids.split_at(ids.len() - 1);
        for (slot, &id) in fits.iter().enumerate() {
            index.insert(id, slot as u32).unwrap();
        }
        assert_eq!(index.insert(over[0], 99), Err(IndexFull));
        for (slot, &id) in fits.iter().enumerate() {
            assert_eq!(index.get(id), Some(slot as u32));
        }
        // Emptying the home bucket leaves the spilled ids reachable (the counts still say so).
        for &id in &fits[..BUCKET_ENTRIES] {
            assert!(index.remove(id));
        }
        for (slot, &id) in fits.iter().enumerate().skip(BUCKET_ENTRIES) {
            assert_eq!(index.get(id), Some(slot as u32));
        }
        // Removing the rest brings every count back to zero.
        for &id in &fits[BUCKET_ENTRIES..] {
            assert!(index.remove(id));
        }
        for b in 0..=index.mask() {
            // SAFETY: in bounds.
            assert_eq!(unsafe { (*index.bucket(b)).overflow }, 0, "bucket {b}");
        }
        assert!(index.entries().is_empty());
    }

    /// A full table (as many peers as slots, sequential ids) under random keys: every id
    /// finds room within its probe, and the kernel's function finds each where it was put.
    #[test]
    fn a_full_table_fits_under_random_keys() {
        for _ in 0..4 {
            let key = crate::kernel::index_key::random().unwrap();
            let mut index = PeerIndex::anonymous_keyed(65_536, key);
            for id in 1..=65_536u64 {
                index.insert(id, id as u32).unwrap();
            }
            for id in (1..=65_536u64).step_by(97) {
                assert_eq!(index.get(id), Some(id as u32));
                assert_eq!(index.home(id), keyed_home(id, index.bits, &key));
            }
        }
    }

    /// Ids that fill one probe under the fixed hash (what an attacker computes offline for an
    /// unkeyed index) leave room for everyone under a random key.
    #[test]
    fn ids_aimed_at_the_fixed_hash_miss_under_a_random_key() {
        let fixed = PeerIndex::anonymous(1000);
        let aimed = colliding(&fixed, 64);
        let mut keyed =
            PeerIndex::anonymous_keyed(1000, crate::kernel::index_key::random().unwrap());
        for (slot, &id) in aimed.iter().enumerate() {
            keyed.insert(id, slot as u32).unwrap();
        }
    }
}
