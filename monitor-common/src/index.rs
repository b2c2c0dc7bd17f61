//! The peer index: peer id -> slot, for the kernel's hot path.
//!
//! An open-addressing table of 64-byte buckets in an ARRAY map created with BPF_F_MMAPABLE
//! (`PEER_INDEX`): the agent writes it through its mmap (no syscall per admission), the
//! kernel reads it with one cache line per lookup in the common case (no hash-map helper, no
//! bucket-then-element chain).
//!
//! - A bucket holds [`BUCKET_ENTRIES`] entries: the peer ids, then each entry's slot + 1
//!   (0: the entry is empty).
//! - An id's home bucket is [`home`], a multiplicative (Fibonacci) hash of the id: the top
//!   bits of `id * HASH_MULTIPLIER`, as many as the table's power-of-two size needs
//!   ([`buckets_for`]: at least twice as many entries as slots, so it is at most half full).
//! - An id lives in its home bucket or in one of the next [`PROBE_BUCKETS`] - 1 (wrapping);
//!   the agent refuses an admission that finds no empty entry there (never seen at a load of
//!   one half; the registry reports it).
//! - A bucket's `overflow` counts the live entries whose probe passed it (their home is this
//!   bucket or an earlier one of the same probe, and they sit further on). A lookup that does
//!   not find its id in a bucket whose `overflow` is 0 stops there: most lookups read one line.
//!
//! Concurrency: the agent is the only writer (its registry, one thread at a time); kernel
//! readers on any CPU never wait. An insertion raises the `overflow` of the buckets it passed,
//! then writes the id, then the slot (a release store); a removal clears the slot (release),
//! then lowers the `overflow`s. So a reader never misses a fully inserted entry, and the worst
//! a reader racing with a change can see is an id paired with another peer's slot, which the
//! slot's own `peer_id`, checked under the slot's lock, turns away (as it does a stale slot).

/// Name of the map in the eBPF object and of its pin.
pub const PEER_INDEX_MAP: &str = "PEER_INDEX";

/// Entries in a bucket (one 64-byte line: 4 ids, 4 slots, the overflow count).
pub const BUCKET_ENTRIES: usize = 4;
/// Buckets a lookup or an insertion looks at, from the home bucket on.
pub const PROBE_BUCKETS: u32 = 4;
/// Fibonacci hashing: 2^64 divided by the golden ratio, odd.
pub const HASH_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// One bucket of the index, one cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexBucket {
    /// Peer id of each entry (meaningless while the entry's slot is 0).
    pub ids: [u64; BUCKET_ENTRIES],
    /// Slot + 1 of each entry; 0: empty.
    pub slots: [u32; BUCKET_ENTRIES],
    /// Live entries whose probe passed this bucket (see the module docs).
    pub overflow: u32,
    pub _pad: [u32; 3],
}

const _: () = assert!(core::mem::size_of::<IndexBucket>() == 64);

impl IndexBucket {
    pub const EMPTY: Self = Self {
        ids: [0; BUCKET_ENTRIES],
        slots: [0; BUCKET_ENTRIES],
        overflow: 0,
        _pad: [0; 3],
    };
}

/// Buckets of the index for `capacity` slots: a power of two holding at least twice as many
/// entries as slots.
pub const fn buckets_for(capacity: u32) -> u32 {
    let want = capacity.div_ceil(2);
    if want <= 1 {
        1
    } else {
        want.next_power_of_two()
    }
}

/// log2 of [`buckets_for`]: what the kernel is given (`XdpConfig::index_bits`).
pub const fn bits_for(capacity: u32) -> u32 {
    buckets_for(capacity).trailing_zeros()
}

/// The home bucket of `id` in a table of `2^bits` buckets: the top `bits` bits of
/// `id * HASH_MULTIPLIER`.
#[inline(always)]
pub const fn home(id: u64, bits: u32) -> u32 {
    if bits == 0 {
        0
    } else {
        (id.wrapping_mul(HASH_MULTIPLIER) >> (64 - bits)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_at_most_half_full() {
        for capacity in [1, 2, 3, 4, 5, 100, 1000, 50_000, 65_536, 65_537, 1 << 20] {
            let buckets = buckets_for(capacity);
            assert!(buckets.is_power_of_two());
            assert!(buckets as u64 * BUCKET_ENTRIES as u64 >= 2 * capacity as u64);
        }
    }

    #[test]
    fn sequential_ids_spread_over_the_buckets() {
        let bits = bits_for(65_536);
        assert_eq!(1 << bits, 32_768);
        let mut load = [0u16; 32_768];
        for id in 0..65_536u64 {
            load[home(id, bits) as usize] += 1;
        }
        assert!(load.iter().all(|&n| n <= 4), "{:?}", load.iter().max());
    }
}
