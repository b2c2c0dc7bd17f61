//! Heartbeat wire format, version 1 (documented in docs/wire-format.md).
//!
//! A heartbeat is one UDP datagram whose payload is exactly [`HEADER_LEN`] bytes, all integers
//! big-endian (network order):
//!
//! | offset | size | field        | meaning                                               |
//! |--------|------|--------------|-------------------------------------------------------|
//! | 0      | 2    | magic        | `0x4842` ("HB")                                       |
//! | 2      | 1    | version      | `1`                                                   |
//! | 3      | 1    | flags        | bit 0: `auth` tag present; other bits must be zero    |
//! | 4      | 4    | incarnation  | sender epoch, raised when the sender restarts         |
//! | 8      | 8    | peer id      | who is alive; never 0 (reserved)                      |
//! | 16     | 8    | sequence     | per incarnation, starts anywhere, +1 per heartbeat    |
//! | 24     | 8    | auth tag     | MAC over bytes 0..24 when `auth` is set, else zero    |
//!
//! The same [`HeartbeatHeader::validate`] runs in the XDP program and in userspace, so both
//! sides agree byte for byte on what a heartbeat is.

/// `"HB"` in ASCII.
pub const MAGIC: u16 = 0x4842;
/// The only version this build understands.
pub const VERSION: u8 = 1;
/// Bytes in a v1 heartbeat; the UDP payload must be exactly this long.
pub const HEADER_LEN: usize = 32;
/// The authentication tag is present and covers bytes `0..24`.
pub const FLAG_AUTH: u8 = 0x01;
/// Flags this version defines; any other bit set makes the datagram malformed.
pub const KNOWN_FLAGS: u8 = FLAG_AUTH;
/// Default UDP port for heartbeats: 18498 is 0x4842, the magic "HB". Unassigned in IANA's
/// registry (inside 18464-18515) and not used by well-known software; until 0.1 the default
/// was 7946, the gossip port of memberlist, Serf, Consul and Docker swarm.
pub const DEFAULT_PORT: u16 = 18498;
/// No peer has this id: a heartbeat carrying it is malformed. A slot nobody owns carries it,
/// so no heartbeat can ever match a free slot.
pub const RESERVED_PEER_ID: u64 = 0;

/// Why a datagram is not a valid heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The UDP payload is not exactly [`HEADER_LEN`] bytes.
    Length,
    /// The first two bytes are not [`MAGIC`].
    Magic,
    /// A version this build does not speak.
    Version,
    /// A flag bit that version 1 does not define.
    Flags,
    /// Peer id 0, which is reserved ([`RESERVED_PEER_ID`]).
    PeerId,
}

impl WireError {
    pub const fn as_str(self) -> &'static str {
        match self {
            WireError::Length => "payload is not 32 bytes",
            WireError::Magic => "bad magic (expected 0x4842)",
            WireError::Version => "unsupported version (expected 1)",
            WireError::Flags => "reserved flag bits set",
            WireError::PeerId => "peer id 0 is reserved",
        }
    }
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rules of [`HeartbeatHeader::validate`], on fields already decoded: the XDP program
/// decodes them from one 8-byte load and applies exactly these checks.
#[inline(always)]
pub fn validate_fields(
    magic: u16,
    version: u8,
    flags: u8,
    payload_len: usize,
) -> Result<(), WireError> {
    if payload_len != HEADER_LEN {
        return Err(WireError::Length);
    }
    if magic != MAGIC {
        return Err(WireError::Magic);
    }
    if version != VERSION {
        return Err(WireError::Version);
    }
    if flags & !KNOWN_FLAGS != 0 {
        return Err(WireError::Flags);
    }
    Ok(())
}

/// The peer id rule of [`HeartbeatHeader::validate`]: any id but [`RESERVED_PEER_ID`]. The
/// XDP program applies it to the id it decoded, right after [`validate_fields`].
#[inline(always)]
pub fn validate_peer_id(peer_id: u64) -> Result<(), WireError> {
    if peer_id == RESERVED_PEER_ID {
        return Err(WireError::PeerId);
    }
    Ok(())
}

/// Splits the first 8 bytes of a header, read as one big-endian u64, into
/// (magic, version, flags, incarnation).
#[inline(always)]
pub const fn split_first_word(word: u64) -> (u16, u8, u8, u32) {
    (
        (word >> 48) as u16,
        (word >> 40) as u8,
        (word >> 32) as u8,
        word as u32,
    )
}

/// The header exactly as it sits in the packet: byte arrays only, so it has alignment 1 and
/// can be overlaid on packet memory at any offset.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatHeader {
    pub magic: [u8; 2],
    pub version: u8,
    pub flags: u8,
    pub incarnation: [u8; 4],
    pub peer_id: [u8; 8],
    pub seq: [u8; 8],
    pub tag: [u8; 8],
}

const _: () = assert!(core::mem::size_of::<HeartbeatHeader>() == HEADER_LEN);

impl HeartbeatHeader {
    /// Builds an unauthenticated header.
    pub const fn new(peer_id: u64, incarnation: u32, seq: u64) -> Self {
        Self {
            magic: MAGIC.to_be_bytes(),
            version: VERSION,
            flags: 0,
            incarnation: incarnation.to_be_bytes(),
            peer_id: peer_id.to_be_bytes(),
            seq: seq.to_be_bytes(),
            tag: [0; 8],
        }
    }

    /// The checks every receiver applies. `payload_len` is the UDP payload length claimed by
    /// the UDP header; the caller has already made sure that many bytes are readable.
    #[inline(always)]
    pub fn validate(&self, payload_len: usize) -> Result<(), WireError> {
        validate_fields(
            u16::from_be_bytes(self.magic),
            self.version,
            self.flags,
            payload_len,
        )?;
        validate_peer_id(self.peer_id())
    }

    #[inline(always)]
    pub fn peer_id(&self) -> u64 {
        u64::from_be_bytes(self.peer_id)
    }

    #[inline(always)]
    pub fn seq(&self) -> u64 {
        u64::from_be_bytes(self.seq)
    }

    #[inline(always)]
    pub fn incarnation(&self) -> u32 {
        u32::from_be_bytes(self.incarnation)
    }

    /// Parses a UDP payload (userspace side of the same rules the kernel applies).
    pub fn decode(payload: &[u8]) -> Result<Self, WireError> {
        let bytes: &[u8; HEADER_LEN] = payload
            .get(..HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(WireError::Length)?;
        let header = Self::from_bytes(bytes);
        header.validate(payload.len())?;
        Ok(header)
    }

    pub fn from_bytes(b: &[u8; HEADER_LEN]) -> Self {
        let mut h = Self::new(0, 0, 0);
        h.magic.copy_from_slice(&b[0..2]);
        h.version = b[2];
        h.flags = b[3];
        h.incarnation.copy_from_slice(&b[4..8]);
        h.peer_id.copy_from_slice(&b[8..16]);
        h.seq.copy_from_slice(&b[16..24]);
        h.tag.copy_from_slice(&b[24..32]);
        h
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&self.magic);
        b[2] = self.version;
        b[3] = self.flags;
        b[4..8].copy_from_slice(&self.incarnation);
        b[8..16].copy_from_slice(&self.peer_id);
        b[16..24].copy_from_slice(&self.seq);
        b[24..32].copy_from_slice(&self.tag);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_word_splits_into_the_leading_fields() {
        let b = HeartbeatHeader::new(1, 0xdead_beef, 2).to_bytes();
        let word = u64::from_be_bytes(b[0..8].try_into().unwrap());
        assert_eq!(split_first_word(word), (MAGIC, VERSION, 0, 0xdead_beef));
    }

    #[test]
    fn round_trip() {
        let h = HeartbeatHeader::new(0x0102_0304_0506_0708, 9, 42);
        let b = h.to_bytes();
        assert_eq!(&b[0..4], &[0x48, 0x42, 1, 0]);
        assert_eq!(&b[4..8], &[0, 0, 0, 9]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let d = HeartbeatHeader::decode(&b).unwrap();
        assert_eq!(d, h);
        assert_eq!(
            (d.peer_id(), d.incarnation(), d.seq()),
            (0x0102_0304_0506_0708, 9, 42)
        );
    }

    #[test]
    fn rejects_each_bad_field() {
        let good = HeartbeatHeader::new(7, 1, 1).to_bytes();
        assert_eq!(HeartbeatHeader::decode(&good[..31]), Err(WireError::Length));
        let mut long = [0u8; 33];
        long[..32].copy_from_slice(&good);
        assert_eq!(HeartbeatHeader::decode(&long), Err(WireError::Length));
        let mut b = good;
        b[0] = 0;
        assert_eq!(HeartbeatHeader::decode(&b), Err(WireError::Magic));
        let mut b = good;
        b[2] = 2;
        assert_eq!(HeartbeatHeader::decode(&b), Err(WireError::Version));
        let mut b = good;
        b[3] = 0x80;
        assert_eq!(HeartbeatHeader::decode(&b), Err(WireError::Flags));
        let mut b = good;
        b[3] = FLAG_AUTH;
        assert!(HeartbeatHeader::decode(&b).is_ok());
        let zero = HeartbeatHeader::new(0, 1, 1).to_bytes();
        assert_eq!(HeartbeatHeader::decode(&zero), Err(WireError::PeerId));
        assert!(HeartbeatHeader::decode(&HeartbeatHeader::new(1, 1, 1).to_bytes()).is_ok());
        assert!(HeartbeatHeader::decode(&HeartbeatHeader::new(u64::MAX, 1, 1).to_bytes()).is_ok());
    }
}
