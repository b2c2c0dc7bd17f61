//! The userspace heartbeat parser never panics, agrees with the field-wise rules the XDP
//! program applies, and round-trips what it accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_common::wire::{
    HEADER_LEN, HeartbeatHeader, split_first_word, validate_fields, validate_peer_id,
};

fuzz_target!(|data: &[u8]| {
    let parsed = HeartbeatHeader::decode(data);
    // The kernel's path: one big-endian word for the leading fields, then the same checks.
    if data.len() >= 8 {
        let word = u64::from_be_bytes(data[..8].try_into().unwrap());
        let (magic, version, flags, _) = split_first_word(word);
        // Then, as the kernel does, the peer id (id 0 is reserved).
        let kernel = validate_fields(magic, version, flags, data.len()).and_then(|()| {
            match data.get(8..16) {
                Some(id) => validate_peer_id(u64::from_be_bytes(id.try_into().unwrap())),
                None => Ok(()),
            }
        });
        assert_eq!(
            parsed.is_ok(),
            kernel.is_ok(),
            "userspace and kernel rules disagree"
        );
    }
    if let Ok(header) = parsed {
        assert_eq!(data.len(), HEADER_LEN);
        assert_eq!(&header.to_bytes()[..], data);
    }
});
