//! The hot-line table, PEER_HOT: where the kernel finds a peer's hot line by its id.
//!
//! An ARRAY of [`crate::maps::HotLine`]s (64 bytes: the lock and `PeerHot`) created with
//! BPF_F_MMAPABLE. The agent writes it through its mmap (no syscall per admission); the kernel
//! finds a peer's line by the peer's id and reads and writes it under the line's lock. The line
//! links to the peer's slot in PEER_STATE (the lock word's low half, `crate::maps::HotLine`), so
//! a heartbeat of a known peer reads one line of per-peer state in the common case: the line it
//! was going to lock and write anyway. [`lines_for`] of a capacity is two parts:
//!
//! - **Own lines**, the first `capacity`: an id from 1 to the capacity has line `id - 1`
//!   ([`own_line`]), its own, which no other id can take; it lives there whenever it is
//!   admitted, and is looked for nowhere else. So a fleet numbered 1 to N (as `--peers` files
//!   and the load generator number peers) has its hot lines dense, one after another: 64 bytes a
//!   peer, which the TLB covers with a sixteenth of the pages that 704-byte slots took
//!   (docs/tuning.md, "The kernel's cost: the id lookup"). A stranger's id in that range reads
//!   that one line and is unknown.
//! - **Hashed lines**, the next `2^bits` ([`hashed_bits`]: at least two per slot of capacity,
//!   so the part is at most half full), open-addressed: any other id (past the capacity, a
//!   derived BFD or flow id, 0) lives at [`home`], a keyed hash of the id, or in one of the next
//!   [`PROBE_LINES`] - 1 (wrapping inside the part). The agent refuses an admission that finds
//!   no empty line there (the registry reports it).
//!
//! The key (`IndexKey`) is drawn at random when the agent loads the program and kept with pinned
//! state (an agent adopting it hashes alike). Multiply-shift with a random odd multiplier is
//! universal (Dietzfelbinger et al. 1997: two distinct ids share a home with probability at most
//! 2 / 2^bits), so a sender that does not know the key cannot choose ids that pile into one
//! probe and crowd a real peer's id out of it. An unkeyed hash let it: the ids that share a line
//! were computable offline, and a probe's worth of them closed an id's probe for good. Own lines
//! give nothing to aim at either: each can only ever hold its one id.
//!
//! A hashed line's `overflow` (`PeerHot::overflow`, the line's own, kept by resets) counts the
//! live entries whose probe passed it (their home is this line or an earlier one of the same
//! probe, and they sit further on). A lookup that does not find its id in a line whose
//! `overflow` is 0 stops there: most lookups read one line.
//!
//! Concurrency: the agent is the only writer of ids, links and counts (its registry, one thread
//! at a time), each under the line's lock; kernel readers on any CPU never wait. An insertion
//! raises the `overflow` of the lines it passes, then writes its line (the id, the fields) and
//! gives the lock back with the link set; a removal takes the lock clearing the link, empties
//! the line, then lowers the `overflow`s. So a reader never misses a fully inserted entry, and
//! the worst a reader racing with a change can see is an id on a line whose link is gone or
//! changing, which the check under the line's lock (the id again, and a link) turns away.

/// The own line of `id` in a table for `capacity` slots: `id - 1` for ids from 1 to the
/// capacity; the others are hashed.
#[inline(always)]
pub const fn own_line(id: u64, capacity: u32) -> Option<u32> {
    let line = id.wrapping_sub(1);
    if line < capacity as u64 {
        Some(line as u32)
    } else {
        None
    }
}

/// Name of the map in the eBPF object and of its pin.
pub const PEER_HOT_MAP: &str = "PEER_HOT";

/// Lines a lookup or an insertion of a hashed id looks at, from its home on. At half full (the
/// most [`hashed_bits`] allows), random homes put the farthest of 1,000,000 ids 34 to 38 lines
/// from home (linear probing simulated over two seeds; at a quarter full it was 16, and 32
/// lines refused some ids at half full in the measurement `tests::probe_lengths`), so 64
/// leaves room; the longer probe costs nothing in the common case: a lookup stops at the first
/// line whose `overflow` is 0 (a lookup reads 1.5 lines on average at half full, an unknown id
/// 2.5).
pub const PROBE_LINES: u32 = 64;
// `overflow` is a byte.
const _: () = assert!(PROBE_LINES <= u8::MAX as u32);

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

/// log2 of the hashed part's lines for `capacity` slots: the next power of two of two lines a
/// slot (at most 2^31 lines). What the kernel is given (`XdpConfig::index_bits`). Two, not
/// four: the part is memory for every slot of capacity (64 bytes a line), and a fleet numbered
/// 1 to N, the common case, never touches it; four lines a slot made the kernel's maps 38%
/// larger than the layout before 15, two make them 16-17% larger (bytes a peer at 50,000 and
/// 200,000 peers, docs/tuning.md "Layout (a), as built").
pub const fn hashed_bits(capacity: u32) -> u32 {
    let want = capacity as u64 * 2;
    let bits = if want <= 1 {
        0
    } else {
        want.next_power_of_two().trailing_zeros()
    };
    if bits > 31 { 31 } else { bits }
}

/// Lines of the hashed part for `capacity` slots.
pub const fn hashed_lines(capacity: u32) -> u32 {
    1 << hashed_bits(capacity)
}

/// Lines of PEER_HOT for `capacity` slots: the own lines, then the hashed ones.
pub const fn lines_for(capacity: u32) -> u32 {
    capacity.saturating_add(hashed_lines(capacity))
}

/// The line of PEER_HOT that is line `h` of the hashed part.
#[inline(always)]
pub const fn hashed_line(h: u32, capacity: u32) -> u32 {
    capacity + h
}

/// The home of `id` in a hashed part of `2^bits` lines under `key`: the top `bits` bits of
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
    // The crate is no_std; the tests allocate, and the measurement prints.
    extern crate std;

    #[test]
    fn the_hashed_part_is_at_most_half_full() {
        for capacity in [1, 2, 3, 4, 5, 100, 1000, 50_000, 65_536, 65_537, 1 << 20] {
            let lines = hashed_lines(capacity);
            assert!(lines.is_power_of_two());
            assert!(lines as u64 >= 2 * capacity as u64);
            assert_eq!(lines_for(capacity), capacity + lines);
            assert_eq!(hashed_line(0, capacity), capacity);
        }
    }

    #[test]
    fn ids_from_one_to_the_capacity_have_their_own_line() {
        assert_eq!(own_line(0, 8), None);
        assert_eq!(own_line(1, 8), Some(0));
        assert_eq!(own_line(8, 8), Some(7));
        assert_eq!(own_line(9, 8), None);
        assert_eq!(own_line(u64::MAX, u32::MAX), None);
        assert_eq!(own_line(1 << 32, u32::MAX), None);
    }

    #[test]
    fn sequential_ids_spread_over_the_lines() {
        // A full table of sequential ids all hashed (as ids past the capacity are), under
        // several keys: no run of PROBE_LINES lines holds more homes than it has lines, so
        // every id fits in its probe.
        let bits = hashed_bits(65_536);
        assert_eq!(1 << bits, 131_072);
        for k in [IndexKey::FIXED, key(1), key(2), key(3)] {
            let mut load = std::vec![0u16; 1 << bits];
            for id in 0..65_536u64 {
                load[home(id, bits, &k) as usize] += 1;
            }
            let probe = PROBE_LINES as usize;
            let worst = (0..load.len())
                .map(|b| {
                    (0..probe)
                        .map(|i| load[(b + i) % load.len()] as usize)
                        .sum::<usize>()
                })
                .max()
                .unwrap();
            assert!(worst <= probe, "{worst} homes in {probe} lines");
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

    /// Ids that share a home line under one key are spread under another: a set aimed at one
    /// line (as an attacker could compute for an unkeyed hash) is no aim at all under a key
    /// it does not know.
    #[test]
    fn ids_aimed_at_one_line_under_one_key_scatter_under_another() {
        let bits = hashed_bits(65_536);
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
            // 64 ids in 131,072 lines: a handful of shared homes at most.
            assert!(distinct >= 60, "key {seed}: {distinct} distinct homes");
        }
    }

    #[test]
    fn different_keys_give_different_homes() {
        let bits = hashed_bits(65_536);
        let (a, b) = (key(1), key(2));
        assert_ne!(a, b);
        let same = (1..=10_000u64)
            .filter(|&id| home(id, bits, &a) == home(id, bits, &b))
            .count();
        // Independent homes agree about once in 131,072.
        assert!(same < 10, "{same} of 10,000 ids kept their home");
        // And one key is one function: the same id, the same home.
        assert_eq!(home(12345, bits, &a), home(12345, bits, &a));
    }

    /// A measurement for the design of a one-line id lookup (docs/tuning.md, "The options,
    /// weighed"), not a check: how far ids land from their home under
    /// this hash when each line holds `per_line` entries, the table has `lines_per_slot` lines
    /// per slot of capacity and a probe looks at `probe` lines. `per_line` 4 at half a line per
    /// slot is today's index; 1 is open addressing over the hot lines themselves. Run with
    /// `cargo test -p monitor-common --lib index::tests::probe_lengths -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: prints a table"]
    fn probe_lengths() {
        use std::{println, vec};
        // (entries per line, lines per slot as a fraction, probe lines, what it is)
        let layouts: [(usize, (u64, u64), u32, &str); 6] = [
            (
                4,
                (1, 2),
                16,
                "bucket index (+1: the hot line), before layout 15",
            ),
            (1, (2, 1), 16, "hot lines, 2 a slot"),
            (1, (4, 1), 16, "hot lines, 4 a slot"),
            (1, (2, 1), 32, "hot lines, 2 a slot, 32-line probe"),
            (1, (4, 1), 32, "hot lines, 4 a slot, 32-line probe"),
            (
                1,
                (2, 1),
                64,
                "hot lines, 2 a slot, 64-line probe (layout 15)",
            ),
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
