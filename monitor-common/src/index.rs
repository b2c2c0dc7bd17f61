//! The peer index: peer id -> slot, for the kernel's hot path.
//!
//! An open-addressing table of 64-byte buckets in an ARRAY map created with BPF_F_MMAPABLE
//! (`PEER_INDEX`): the agent writes it through its mmap (no syscall per admission), the
//! kernel reads it with one cache line per lookup in the common case (no hash-map helper, no
//! bucket-then-element chain).
//!
//! - A bucket holds [`BUCKET_ENTRIES`] entries: the peer ids, then each entry's slot + 1
//!   (0: the entry is empty).
//! - An id's home bucket is [`home`], a keyed hash of the id (a multiply-shift, mixed): the top bits of
//!   `(id ^ key.xor) * key.mul` (`mul` odd), as many as the table's power-of-two size needs
//!   ([`buckets_for`]: at least twice as many entries as slots, so it is at most half full).
//!   The agent draws the [`IndexKey`] at random when it loads the program (kept with pinned
//!   state, so an agent adopting it hashes alike): multiply-shift with a random odd
//!   multiplier is universal (Dietzfelbinger et al. 1997: two distinct ids share a home with
//!   probability at most 2 / 2^bits), so a sender that does not know the key cannot choose
//!   ids that pile into one bucket and crowd a real peer's id out of its probe. An unkeyed
//!   hash let it: the ids that share a bucket were computable offline, and a probe's worth of
//!   them closed an id's probe for good.
//! - An id lives in its home bucket or in one of the next [`PROBE_BUCKETS`] - 1 (wrapping);
//!   the agent refuses an admission that finds no empty entry there (the registry reports it).
//!   Sixteen buckets: a keyed hash places ids as at random, whatever their pattern, and at a
//!   load of one half random homes overflowed a probe of four buckets for 14 to 36 ids of
//!   65,536, and one of eight for one or two (simulations, six runs each), where the farthest
//!   an id of a full table sat from its home in sixteen was seven buckets. The longer probe
//!   costs nothing in the common case: a lookup stops at the first bucket whose `overflow` is
//!   0, most often the home bucket.
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

/// The slot the kernel looks an id up in before the index: id - 1, for ids from 1 to 2^32
/// (past the capacity the map has no such slot). The registry gives an id its own slot when
/// that slot is free, so a fleet numbered 1 to N, the common case, is found in the line each
/// heartbeat writes anyway, and the index line is read only for the others.
#[inline(always)]
pub const fn own_slot(id: u64) -> Option<u32> {
    let slot = id.wrapping_sub(1);
    if slot < 1 << 32 {
        Some(slot as u32)
    } else {
        None
    }
}

/// Name of the map in the eBPF object and of its pin.
pub const PEER_INDEX_MAP: &str = "PEER_INDEX";

/// Entries in a bucket (one 64-byte line: 4 ids, 4 slots, the overflow count).
pub const BUCKET_ENTRIES: usize = 4;
/// Buckets a lookup or an insertion looks at, from the home bucket on.
pub const PROBE_BUCKETS: u32 = 16;
/// Fibonacci hashing: 2^64 divided by the golden ratio, odd: the multiplier of
/// [`IndexKey::FIXED`].
pub const HASH_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The key of [`home`]: drawn at random by the agent for each load of the program, given to
/// the kernel in `XdpConfig::index_key` and stored with pinned state (`PinnedMeta`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IndexKey {
    /// XORed into the id before the multiplication.
    pub xor: u64,
    /// The multiplier; made odd where it is used (an even one would waste a bit).
    pub mul: u64,
}

impl IndexKey {
    /// A key known to everyone (Fibonacci hashing): for tests and tools that build an index
    /// of their own, never for the agent's.
    pub const FIXED: Self = Self {
        xor: 0,
        mul: HASH_MULTIPLIER,
    };

    /// A key from 16 random bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        let mut xor = [0u8; 8];
        let mut mul = [0u8; 8];
        let mut i = 0;
        while i < 8 {
            xor[i] = bytes[i];
            mul[i] = bytes[8 + i];
            i += 1;
        }
        Self {
            xor: u64::from_le_bytes(xor),
            mul: u64::from_le_bytes(mul) | 1,
        }
    }
}

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

/// The home bucket of `id` in a table of `2^bits` buckets under `key`: the top `bits` bits of
/// the id XORed with `key.xor`, then mixed as MurmurHash3's finaliser mixes (xor-shifts and
/// multiplications), one of its multipliers `key.mul | 1`. One function for the agent and the
/// kernel. A multiply-shift alone is universal, but a structured set of ids (sequential ones)
/// under some random multipliers lands in runs of neighbouring buckets that overflow a probe;
/// after the mix, ids land as at random whatever their pattern, for two more multiplications.
#[inline(always)]
pub const fn home(id: u64, bits: u32, key: &IndexKey) -> u32 {
    if bits == 0 {
        return 0;
    }
    let mut x = id ^ key.xor;
    x ^= x >> 33;
    x = x.wrapping_mul(key.mul | 1);
    x ^= x >> 29;
    x = x.wrapping_mul(HASH_MULTIPLIER);
    x ^= x >> 32;
    (x >> (64 - bits)) as u32
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
        // A full table of sequential ids under several keys: no run of PROBE_BUCKETS buckets
        // holds more homes than it has entries, so every id fits in its probe.
        let bits = bits_for(65_536);
        assert_eq!(1 << bits, 32_768);
        for k in [IndexKey::FIXED, key(1), key(2), key(3)] {
            let mut load = [0u16; 32_768];
            for id in 0..65_536u64 {
                load[home(id, bits, &k) as usize] += 1;
            }
            let probe = PROBE_BUCKETS as usize;
            let worst = (0..load.len())
                .map(|b| {
                    (0..probe)
                        .map(|i| load[(b + i) % load.len()] as usize)
                        .sum::<usize>()
                })
                .max()
                .unwrap();
            assert!(
                worst <= probe * BUCKET_ENTRIES,
                "{worst} homes in {probe} buckets"
            );
        }
    }

    fn key(seed: u8) -> IndexKey {
        let mut bytes = [0u8; 16];
        let mut x = seed as u64 + 1;
        for b in &mut bytes {
            // A small LCG: distinct keys for distinct seeds, deterministic.
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (x >> 56) as u8;
        }
        IndexKey::from_bytes(bytes)
    }

    #[test]
    fn the_multiplier_is_always_odd() {
        assert_eq!(IndexKey::from_bytes([0; 16]).mul, 1);
        assert_eq!(IndexKey::from_bytes([0xff; 16]).mul, u64::MAX);
        // Even given an even one directly, `home` makes it odd.
        let even = IndexKey { xor: 0, mul: 2 };
        assert_eq!(
            home(1, 10, &even),
            home(1, 10, &IndexKey { xor: 0, mul: 3 })
        );
    }

    /// Ids that share a home bucket under one key are spread under another: a set aimed at one
    /// bucket (as an attacker could compute for an unkeyed hash) is no aim at all under a key
    /// it does not know.
    #[test]
    fn ids_aimed_at_one_bucket_under_one_key_scatter_under_another() {
        let bits = bits_for(65_536);
        let mut aimed = [0u64; 64];
        let mut ids = (1..).filter(|&id| home(id, bits, &IndexKey::FIXED) == 7);
        for slot in &mut aimed {
            *slot = ids.next().unwrap();
        }
        for seed in 0..8 {
            let k = key(seed);
            let mut homes = [0u32; 64];
            for (h, &id) in homes.iter_mut().zip(&aimed) {
                *h = home(id, bits, &k);
            }
            homes.sort_unstable();
            let distinct = 1 + homes.windows(2).filter(|w| w[0] != w[1]).count();
            // 64 ids in 32,768 buckets: a handful of shared homes at most.
            assert!(distinct >= 60, "key {seed}: {distinct} distinct homes");
        }
    }

    #[test]
    fn different_keys_give_different_homes() {
        let bits = bits_for(65_536);
        let (a, b) = (key(1), key(2));
        assert_ne!(a, b);
        let same = (1..=10_000u64)
            .filter(|&id| home(id, bits, &a) == home(id, bits, &b))
            .count();
        // Independent homes agree about once in 32,768.
        assert!(same < 10, "{same} of 10,000 ids kept their home");
        // And one key is one function: the same id, the same home.
        assert_eq!(home(12345, bits, &a), home(12345, bits, &a));
    }

    // The crate is no_std; this measurement prints and allocates.
    extern crate std;

    /// A measurement for the design of a one-line id lookup (docs/tuning.md, "The id
    /// lookup: one line per heartbeat"), not a check: how far ids land from their home under
    /// this hash when each line holds `per_line` entries, the table has `lines_per_slot` lines
    /// per slot of capacity and a probe looks at `probe` lines. `per_line` 4 at half a line per
    /// slot is today's index; 1 is open addressing over the hot lines themselves. Run with
    /// `cargo test -p monitor-common --lib index::tests::probe_lengths -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: prints a table"]
    fn probe_lengths() {
        use std::{println, vec};
        // (entries per line, lines per slot as a fraction, probe lines, what it is)
        let layouts: [(usize, (u64, u64), u32, &str); 5] = [
            (4, (1, 2), 16, "index today (+1: the hot line)"),
            (1, (2, 1), 16, "hot lines, 2 a slot"),
            (1, (4, 1), 16, "hot lines, 4 a slot"),
            (1, (2, 1), 32, "hot lines, 2 a slot, 32-line probe"),
            (1, (4, 1), 32, "hot lines, 4 a slot, 32-line probe"),
        ];
        println!(
            "| layout | capacity | peers | load | at home | lines the lookup reads (mean) | farthest | refused |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for (per_line, (num, den), probe, what) in layouts {
            for (capacity, peers) in [
                (1024u64, 1000u64),
                (65_536, 50_000),
                (65_536, 65_536),
                (1 << 20, 1_000_000),
            ] {
                let lines = (capacity * num / den).next_power_of_two();
                let bits = lines.trailing_zeros();
                let mut used = vec![0u8; lines as usize];
                let (mut at_home, mut read, mut farthest, mut refused) = (0u64, 0u64, 0u32, 0u64);
                let k = key(per_line as u8 + probe as u8 + num as u8);
                for id in 1..=peers {
                    let h = home(id, bits, &k);
                    let spot = (0..probe).find(|&d| {
                        (used[((h + d) as u64 & (lines - 1)) as usize] as usize) < per_line
                    });
                    match spot {
                        Some(d) => {
                            used[((h + d) as u64 & (lines - 1)) as usize] += 1;
                            at_home += (d == 0) as u64;
                            read += d as u64 + 1;
                            farthest = farthest.max(d);
                        }
                        None => refused += 1,
                    }
                }
                let placed = (peers - refused).max(1) as f64;
                println!(
                    "| {what} | {capacity} | {peers} | {:.2} | {:.1}% | {:.3} | {farthest} | {refused} |",
                    peers as f64 / (lines * per_line as u64) as f64,
                    100.0 * at_home as f64 / placed,
                    read as f64 / placed,
                );
            }
        }
    }
}
