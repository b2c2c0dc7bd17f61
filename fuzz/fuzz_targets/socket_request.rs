//! The socket's request parser never panics on any line, and what it accepts survives a
//! round trip through its own JSON form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor::serving::protocol::parse_request;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(request) = parse_request(line) {
        let again = serde_json::to_string(&request).unwrap();
        assert_eq!(parse_request(&again).unwrap(), request);
    }
});
