//! Signing heartbeats with the authentication key; the key file itself is [`crate::keys`]
//! (re-exported here, where a sender looks for it).

use monitor_common::{
    auth::{AUTHENTICATED_LEN, AuthKey, tag},
    wire::{FLAG_AUTH, HEADER_LEN, HeartbeatHeader},
};

pub use crate::keys::{KeyFileError, parse_key, read_key_file};

/// Sets the auth flag and the tag of `header` (the flag is covered by the tag).
pub fn sign(header: &mut HeartbeatHeader, key: &AuthKey) {
    header.flags |= FLAG_AUTH;
    let bytes: [u8; HEADER_LEN] = header.to_bytes();
    let authenticated: &[u8; AUTHENTICATED_LEN] =
        bytes[..AUTHENTICATED_LEN].try_into().expect("24 bytes");
    header.tag = tag(key, authenticated).to_le_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_header_carries_the_tag_of_its_first_24_bytes() {
        let key = AuthKey::from_bytes([7; 16]);
        let mut h = HeartbeatHeader::new(5, 1, 9);
        sign(&mut h, &key);
        assert_eq!(h.flags & FLAG_AUTH, FLAG_AUTH);
        let b = h.to_bytes();
        assert_eq!(
            u64::from_le_bytes(h.tag),
            tag(&key, b[..24].try_into().unwrap())
        );
        // Any change to the covered bytes changes the tag.
        let mut other = HeartbeatHeader::new(5, 1, 10);
        sign(&mut other, &key);
        assert_ne!(other.tag, h.tag);
    }
}
