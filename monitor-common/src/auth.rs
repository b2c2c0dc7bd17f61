//! Heartbeat authentication: SipHash-2-4 with a 128-bit key over the first 24 bytes of the
//! header, the tag in bytes 24..32 (little-endian, as SipHash emits it).
//!
//! Why SipHash-2-4: it is a keyed PRF designed for short inputs, needs only 64-bit adds,
//! xors and rotates (no tables, no multiplications), so the XDP program computes it in about
//! 170 straight-line instructions with no loops for the verifier to reason about. A 64-bit
//! tag is enough against online forgery at line rate: an attacker sending 10^7 forged
//! heartbeats per second needs about 2^40 s on average to hit one.
//!
//! The same function runs in the kernel and in userspace (`monitor send`, `monitor loadgen`).

/// Offset and length of the authenticated bytes, and where the tag goes.
pub const AUTHENTICATED_LEN: usize = 24;
pub const TAG_OFFSET: usize = 24;

/// A key as two little-endian u64 words (k0 = bytes 0..8, k1 = bytes 8..16).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AuthKey {
    pub k0: u64,
    pub k1: u64,
    /// Non-zero when this slot holds a key.
    pub valid: u64,
}

impl AuthKey {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        let mut i = 0;
        while i < 8 {
            lo[i] = bytes[i];
            hi[i] = bytes[i + 8];
            i += 1;
        }
        Self {
            k0: u64::from_le_bytes(lo),
            k1: u64::from_le_bytes(hi),
            valid: 1,
        }
    }
}

/// Key slots in the AUTH_KEYS map: the current key, and the previous one during a rotation.
pub const KEY_CURRENT: u32 = 0;
pub const KEY_PREVIOUS: u32 = 1;
pub const KEY_SLOTS: u32 = 2;

#[inline(always)]
const fn rotl(x: u64, b: u32) -> u64 {
    // BPF has no rotate instruction; LLVM lowers this to two shifts and an or.
    x.rotate_left(b)
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = rotl(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl(v[0], 32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = rotl(v[3], 16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = rotl(v[3], 21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = rotl(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl(v[2], 32);
}

/// SipHash-2-4 of a 24-byte message given as its three little-endian u64 words.
#[inline(always)]
pub fn siphash24_24(k0: u64, k1: u64, m: [u64; 3]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    // Three full words, then the final block: no tail bytes, the length (24) in the top byte.
    let words = [m[0], m[1], m[2], (AUTHENTICATED_LEN as u64) << 56];
    let mut i = 0;
    while i < 4 {
        v[3] ^= words[i];
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^= words[i];
        i += 1;
    }
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The tag of a header's first 24 bytes.
pub fn tag(key: &AuthKey, authenticated: &[u8; AUTHENTICATED_LEN]) -> u64 {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&authenticated[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    siphash24_24(key.k0, key.k1, [word(0), word(1), word(2)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_vector() {
        // SipHash-2-4 reference vectors (Aumasson & Bernstein, vectors.h): key 00 01 .. 0f,
        // message 00 01 .. (len-1); the entry for length 24 is 94 af 49 f6 c6 50 ad b8
        // (little-endian output). Computed for this test with an independent implementation
        // that reproduces the paper's worked example (15 bytes: a129ca6149be45e5) and
        // vectors[0] (310e0edd47db6f72).
        let key = AuthKey::from_bytes(core::array::from_fn(|i| i as u8));
        let msg: [u8; 24] = core::array::from_fn(|i| i as u8);
        let expected = u64::from_le_bytes([0x94, 0xaf, 0x49, 0xf6, 0xc6, 0x50, 0xad, 0xb8]);
        assert_eq!(tag(&key, &msg), expected);
    }
}
