//! What other monitors write to NATS never panics the fleet's reader: any bucket contents are
//! parsed, bad keys and values refused, and the view, its judgements and the convictions
//! answer whatever it holds; any event message is parsed or refused. A key that is accepted
//! has one spelling: written back, it is the same string.
//!
//! Input: records separated by 0xff, each `KEY` (a delete) or `KEY 0x00 VALUE`; the record's
//! index is its write time in seconds. Each record is also tried as an event (KEY as the
//! subject, VALUE as the payload).
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor::fleet::{
    quorum::{Convictions, FleetView, Quorum, Rule},
    wire::{FleetEvent, Key},
};

fuzz_target!(|data: &[u8]| {
    let mut view = FleetView::default();
    let mut convictions = Convictions::default();
    let rule = Rule {
        quorum: Quorum::Majority,
        level: 3.0,
    };
    let mut now_ms = 0.0;
    for (i, record) in data.split(|&b| b == 0xff).enumerate() {
        let (key, value) = match record.iter().position(|&b| b == 0) {
            Some(at) => (&record[..at], Some(&record[at + 1..])),
            None => (record, None),
        };
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        match Key::parse(key) {
            Ok(Key::Verdict { peer, observer }) => assert_eq!(Key::verdict(peer, &observer), key),
            Ok(Key::Observer(observer)) => assert_eq!(Key::observer(&observer), key),
            Err(_) => {}
        }
        now_ms = 1000.0 * i as f64;
        if view.apply(key, value, now_ms).is_ok() {
            convictions.update_all(&view, now_ms, rule);
        }
        let _ = FleetEvent::parse(key, value.unwrap_or_default());
    }
    for quorum in [Quorum::Majority, Quorum::AtLeast(1), Quorum::AtLeast(3)] {
        let rule = Rule { quorum, level: 1.0 };
        for suspect in view.suspects(now_ms, rule) {
            assert!(!suspect.observers.is_empty());
        }
    }
    let ids: Vec<u64> = view.peers().collect();
    for id in ids {
        let _ = view.peer(id, now_ms);
    }
    let _ = view.observers(now_ms);
    let _ = convictions.update_all(&view, now_ms + 10_000.0, rule);
});
