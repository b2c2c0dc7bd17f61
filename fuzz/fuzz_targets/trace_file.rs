//! `monitor replay` and `monitor record`'s trace format: the parser never panics on any text,
//! and what it accepts is in time order and survives a round trip through the writer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor::offline::trace::{format_trace, parse_trace};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(arrivals) = parse_trace(text) {
        assert!(arrivals.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        let again = parse_trace(&format_trace("fuzz", &arrivals)).expect("the writer's own text");
        assert_eq!(again, arrivals);
    }
});
