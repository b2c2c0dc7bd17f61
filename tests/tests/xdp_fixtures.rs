//! Packet fixtures through the real XDP program (BPF_PROG_TEST_RUN): verdicts, counters and
//! the peer slot, for every header layout and every way a packet can be cut or bent.

use integration_tests::{
    fixture::{Fixture, XDP_DROP, XDP_PASS},
    packet::*,
};
use monitor::kernel::counters::CounterTotals;
use monitor_common::{
    config::{XDP_FLAG_PASS_HEARTBEATS, XdpConfig},
    maps::{FAMILY_IPV4, FAMILY_IPV6},
    wire::{DEFAULT_PORT, FLAG_AUTH, HeartbeatHeader},
};

const PEER: u64 = 7;

fn layouts() -> Vec<(&'static str, Packet)> {
    vec![
        ("ipv4", Packet::heartbeat_v4(PEER, 1)),
        ("ipv6", Packet::heartbeat_v6(PEER, 1)),
        (
            "802.1Q ipv4",
            Packet::heartbeat_v4(PEER, 1).with_vlans(&[(ETH_P_8021Q, 10)]),
        ),
        (
            "802.1Q ipv6",
            Packet::heartbeat_v6(PEER, 1).with_vlans(&[(ETH_P_8021Q, 10)]),
        ),
        (
            "802.1ad+802.1Q ipv4",
            Packet::heartbeat_v4(PEER, 1).with_vlans(&[(ETH_P_8021AD, 100), (ETH_P_8021Q, 10)]),
        ),
        (
            "802.1ad+802.1Q ipv6",
            Packet::heartbeat_v6(PEER, 1).with_vlans(&[(ETH_P_8021AD, 100), (ETH_P_8021Q, 10)]),
        ),
        (
            "802.1ad ipv4",
            Packet::heartbeat_v4(PEER, 1).with_vlans(&[(ETH_P_8021AD, 100)]),
        ),
        (
            "ipv4 with 4 bytes of options",
            Packet {
                ip: Ip::V4 {
                    options: vec![1, 1, 1, 0],
                    frags: 0,
                    ihl: None,
                    proto: IPPROTO_UDP,
                },
                ..Packet::heartbeat_v4(PEER, 1)
            },
        ),
        (
            "ipv4 with 40 bytes of options",
            Packet {
                ip: Ip::V4 {
                    options: vec![1; 40],
                    frags: 0,
                    ihl: None,
                    proto: IPPROTO_UDP,
                },
                ..Packet::heartbeat_v4(PEER, 1)
            },
        ),
    ]
}

fn only(f: impl FnOnce(&mut CounterTotals)) -> CounterTotals {
    let mut c = CounterTotals::default();
    f(&mut c);
    c
}

#[test]
fn every_layout_is_recorded_and_consumed() {
    for (name, packet) in layouts() {
        let mut fx = Fixture::with_peers(&[PEER]);
        assert_eq!(fx.run(&packet.build()), XDP_DROP, "{name}");
        assert_eq!(fx.counters(), only(|c| c.heartbeats = 1), "{name}");
        let record = fx.record(PEER);
        assert_eq!(
            (record.heartbeats, record.last_seq, record.incarnation),
            (1, 1, 1),
            "{name}"
        );
        assert_eq!(record.src_port, SRC_PORT, "{name}");
        if matches!(packet.ip, Ip::V4 { .. }) {
            assert_eq!(record.src_family, FAMILY_IPV4, "{name}");
            assert_eq!(&record.src_addr[12..], &SRC_V4, "{name}");
        } else {
            assert_eq!(record.src_family, FAMILY_IPV6, "{name}");
            assert_eq!(record.src_addr, SRC_V6, "{name}");
        }
    }
}

#[test]
fn truncation_at_every_byte_is_never_recorded() {
    for (name, packet) in layouts() {
        let frame = packet.build();
        let [_, _, payload_start, _] = packet.boundaries()[..] else {
            unreachable!()
        };
        let mut fx = Fixture::with_peers(&[PEER]);
        let mut expected = CounterTotals::default();
        // The kernel refuses test frames shorter than an Ethernet header (EINVAL): such frames
        // never reach XDP, so start at 14.
        for len in 14..frame.len() {
            assert_eq!(fx.run(&frame[..len]), XDP_PASS, "{name} cut at {len}");
            // Cut inside the heartbeat: addressed to us but broken. Before: not ours to judge.
            if len >= payload_start {
                expected.malformed += 1;
            } else {
                expected.not_heartbeat += 1;
            }
            assert_eq!(fx.counters(), expected, "{name} cut at {len}");
        }
        assert_eq!(fx.record(PEER).heartbeats, 0, "{name}");
    }
}

#[test]
fn frames_shorter_than_ethernet_never_reach_xdp() {
    let mut fx = Fixture::with_peers(&[PEER]);
    for len in [0usize, 1, 13] {
        assert!(
            fx.try_run(&vec![0u8; len]).is_err(),
            "kernel accepted a {len}-byte frame"
        );
    }
}

#[test]
fn bad_heartbeat_headers_are_malformed_and_passed() {
    let good = HeartbeatHeader::new(PEER, 1, 1);
    let mut cases: Vec<(&str, Packet)> = Vec::new();
    let mut h = good;
    h.magic = [0x48, 0x43];
    cases.push(("wrong magic", Packet::heartbeat_v4(PEER, 1).with_header(h)));
    let mut h = good;
    h.version = 2;
    cases.push((
        "wrong version",
        Packet::heartbeat_v4(PEER, 1).with_header(h),
    ));
    let mut h = good;
    h.version = 0;
    cases.push(("version zero", Packet::heartbeat_v4(PEER, 1).with_header(h)));
    let mut h = good;
    h.flags = 0x02;
    cases.push((
        "reserved flag",
        Packet::heartbeat_v6(PEER, 1).with_header(h),
    ));
    let mut long = Packet::heartbeat_v4(PEER, 1);
    long.payload.push(0);
    cases.push(("payload 33 bytes", long));
    let mut short = Packet::heartbeat_v4(PEER, 1);
    short.payload.pop();
    cases.push(("payload 31 bytes", short));
    let mut lying = Packet::heartbeat_v4(PEER, 1);
    lying.udp_len = Some(8 + 31);
    cases.push(("udp length says 31", lying));
    let mut lying = Packet::heartbeat_v4(PEER, 1);
    lying.udp_len = Some(4);
    cases.push(("udp length below header", lying));
    let mut lying = Packet::heartbeat_v6(PEER, 1);
    lying.udp_len = Some(0xffff);
    cases.push(("udp length 65535", lying));
    cases.push((
        "empty payload",
        Packet {
            payload: vec![],
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    let mut zero = Packet::heartbeat_v4(PEER, 1);
    zero.udp_len = Some(0);
    cases.push(("udp length zero", zero));
    let mut header_only = Packet::heartbeat_v6(PEER, 1);
    header_only.udp_len = Some(8);
    cases.push(("udp length says no payload, 32 bytes follow", header_only));
    let mut h = good;
    h.version = 0xff;
    cases.push(("version 255", Packet::heartbeat_v6(PEER, 1).with_header(h)));
    let mut h = good;
    h.flags = 0xff;
    cases.push((
        "every flag bit",
        Packet::heartbeat_v4(PEER, 1).with_header(h),
    ));
    let mut h = good;
    h.magic = [0x42, 0x48];
    cases.push((
        "magic byte-swapped",
        Packet::heartbeat_v4(PEER, 1).with_header(h),
    ));
    cases.push((
        "two bytes of magic only",
        Packet {
            payload: vec![0x48, 0x42],
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    for (name, packet) in cases {
        let mut fx = Fixture::with_peers(&[PEER]);
        assert_eq!(fx.run(&packet.build()), XDP_PASS, "{name}");
        assert_eq!(fx.counters(), only(|c| c.malformed = 1), "{name}");
        assert_eq!(fx.record(PEER).heartbeats, 0, "{name}");
    }
}

#[test]
fn authenticated_flag_is_a_known_flag() {
    let mut h = HeartbeatHeader::new(PEER, 1, 1);
    h.flags = FLAG_AUTH;
    let mut fx = Fixture::with_peers(&[PEER]);
    assert_eq!(
        fx.run(&Packet::heartbeat_v4(PEER, 1).with_header(h).build()),
        XDP_DROP
    );
    assert_eq!(fx.counters(), only(|c| c.heartbeats = 1));
}

#[test]
fn foreign_traffic_passes_untouched() {
    let mut cases: Vec<(&str, Packet)> = Vec::new();
    cases.push((
        "other port",
        Packet {
            dst_port: DEFAULT_PORT + 1,
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "tcp",
        Packet {
            ip: Ip::V4 {
                options: vec![],
                frags: 0,
                ihl: None,
                proto: IPPROTO_TCP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "ipv6 tcp",
        Packet {
            ip: Ip::V6 {
                next_hdr: IPPROTO_TCP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    // Hop-by-hop options: extension headers are not walked.
    cases.push((
        "ipv6 extension header",
        Packet {
            ip: Ip::V6 { next_hdr: 0 },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "arp ethertype",
        Packet {
            ether_type: Some(ETH_P_ARP),
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "three vlan tags",
        Packet::heartbeat_v4(PEER, 1).with_vlans(&[
            (ETH_P_8021AD, 1),
            (ETH_P_8021Q, 2),
            (ETH_P_8021Q, 3),
        ]),
    ));
    cases.push((
        "ipv4 first fragment (MF)",
        Packet {
            ip: Ip::V4 {
                options: vec![],
                frags: 0x2000,
                ihl: None,
                proto: IPPROTO_UDP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "ipv4 later fragment (offset)",
        Packet {
            ip: Ip::V4 {
                options: vec![],
                frags: 0x0010,
                ihl: None,
                proto: IPPROTO_UDP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "ipv4 IHL below 5",
        Packet {
            ip: Ip::V4 {
                options: vec![],
                frags: 0,
                ihl: Some(4),
                proto: IPPROTO_UDP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    cases.push((
        "ipv4 IHL beyond the frame",
        Packet {
            ip: Ip::V4 {
                options: vec![],
                frags: 0,
                ihl: Some(15),
                proto: IPPROTO_UDP,
            },
            ..Packet::heartbeat_v4(PEER, 1)
        },
    ));
    for (name, packet) in cases {
        let mut fx = Fixture::with_peers(&[PEER]);
        assert_eq!(fx.run(&packet.build()), XDP_PASS, "{name}");
        assert_eq!(fx.counters(), only(|c| c.not_heartbeat = 1), "{name}");
        assert_eq!(fx.record(PEER).heartbeats, 0, "{name}");
    }
}

#[test]
fn ipv4_header_with_wrong_version_nibble_is_not_a_heartbeat() {
    let mut frame = Packet::heartbeat_v4(PEER, 1).build();
    frame[14] = 0x65; // version 6 inside an IPv4 ethertype
    let mut fx = Fixture::with_peers(&[PEER]);
    assert_eq!(fx.run(&frame), XDP_PASS);
    assert_eq!(fx.counters(), only(|c| c.not_heartbeat = 1));
}

#[test]
fn sequence_tracking_counts_lost_duplicates_and_late_arrivals() {
    let mut fx = Fixture::with_peers(&[PEER]);
    for seq in [10, 11, 11, 14, 12, 15] {
        assert_eq!(
            fx.run(&Packet::heartbeat_v4(PEER, seq).build()),
            XDP_DROP,
            "seq {seq}"
        );
    }
    let r = fx.record(PEER);
    // 10, 11 accepted; 11 again duplicate; 14 accepted (12, 13 lost); 12 late (fills one
    // gap); 15 accepted.
    assert_eq!(r.heartbeats, 4);
    assert_eq!(r.duplicates, 1);
    assert_eq!(r.out_of_order, 1);
    assert_eq!(r.lost, 1);
    assert_eq!(r.last_seq, 15);
    assert_eq!(
        r.samples, 3,
        "one interval per accepted heartbeat after the first"
    );
    let c = fx.counters();
    assert_eq!((c.heartbeats, c.duplicates, c.out_of_order), (4, 1, 1));

    // Only a late heartbeat that fills a counted gap takes one off `lost`: 12 again (a second
    // copy of a late one), 10 and 14 (replays of accepted ones) change nothing; 13 does.
    for seq in [12, 10, 14] {
        fx.run(&Packet::heartbeat_v4(PEER, seq).build());
        let r = fx.record(PEER);
        assert_eq!((r.lost, r.missing), (1, 0b10), "after {seq}");
    }
    fx.run(&Packet::heartbeat_v4(PEER, 13).build());
    let r = fx.record(PEER);
    assert_eq!((r.lost, r.missing, r.out_of_order), (0, 0, 5));
    // A gap that has fallen out of the tracked span is not filled: 16 is lost, then 17..=80,
    // and 16 is 80 - 1 - 16 = 63 below: still tracked; after 81 it is not.
    for seq in 17..=81 {
        fx.run(&Packet::heartbeat_v4(PEER, seq).build());
    }
    assert_eq!(fx.record(PEER).lost, 1);
    fx.run(&Packet::heartbeat_v4(PEER, 16).build());
    assert_eq!(fx.record(PEER).lost, 1, "below the span: no decrement");
}

/// Every accepted heartbeat stores the slot's last-heard word (what the agent's sweep scans
/// instead of the slots), with the record's own arrival and count, on both hooks; refused
/// heartbeats leave it; an admission resets it with the slot.
#[test]
fn accepted_heartbeats_store_the_last_heard_word() {
    use monitor_common::last_heard;
    for hook in [
        monitor::kernel::program::Hook::Xdp,
        monitor::kernel::program::Hook::Tc,
    ] {
        let mut fx = Fixture::new_hook(XdpConfig::DEFAULT, &[PEER], hook);
        let slot = fx.loaded.maps.registry.slot_of(PEER).unwrap();
        let admitted = fx.record(PEER);
        assert_eq!(
            fx.loaded.maps.table.last_heard(slot),
            last_heard::word(admitted.last_arrival_ns, 0),
            "{hook:?}: admission"
        );
        for seq in [1, 2, 5] {
            assert_eq!(fx.run(&Packet::heartbeat_v4(PEER, seq).build()), XDP_DROP);
            let r = fx.record(PEER);
            assert_eq!(
                fx.loaded.maps.table.last_heard(slot),
                last_heard::of_record(&r),
                "{hook:?}: after seq {seq}"
            );
        }
        let word = fx.loaded.maps.table.last_heard(slot);
        // A duplicate and a late one are not arrivals.
        for seq in [5, 3] {
            fx.run(&Packet::heartbeat_v4(PEER, seq).build());
        }
        assert_eq!(fx.loaded.maps.table.last_heard(slot), word, "{hook:?}");
        assert_eq!(fx.record(PEER).heartbeats, 3);
        // A restart: its interval is left out of the window, and the word's count says so.
        let restart = HeartbeatHeader::new(PEER, 2, 1);
        assert_eq!(
            fx.run(&Packet::heartbeat_v4(PEER, 1).with_header(restart).build()),
            XDP_DROP
        );
        let r = fx.record(PEER);
        assert_eq!((r.heartbeats, r.left_out, r.samples), (4, 1, 2), "{hook:?}");
        let after = fx.loaded.maps.table.last_heard(slot);
        assert_eq!(
            after,
            last_heard::of_record(&r),
            "{hook:?}: after a restart"
        );
        assert_eq!(
            last_heard::heartbeats_since(word, after),
            Some(1 + last_heard::LEFT_OUT_STEP),
            "{hook:?}"
        );
    }
}

/// Peer id 0 is reserved (free slots carry it): a heartbeat with it is malformed and passed,
/// even if something put id 0 in the index, and is never reported as an unknown peer.
#[test]
fn peer_id_zero_is_malformed() {
    let mut fx = Fixture::with_peers(&[0, PEER]);
    for packet in [Packet::heartbeat_v4(0, 1), Packet::heartbeat_v6(0, 2)] {
        assert_eq!(fx.run(&packet.build()), XDP_PASS);
    }
    let c = fx.counters();
    assert_eq!((c.malformed, c.heartbeats, c.unknown_peer), (2, 0, 0));
    assert_eq!(
        fx.record(0).heartbeats,
        0,
        "nothing recorded in id 0's slot"
    );
    assert!(fx.unknown_reports().is_empty());
    // The userspace parser agrees byte for byte.
    let payload = HeartbeatHeader::new(0, 1, 1).to_bytes();
    assert_eq!(
        HeartbeatHeader::decode(&payload),
        Err(monitor_common::wire::WireError::PeerId)
    );
    // And the id next to it is a heartbeat like any other.
    assert_eq!(fx.run(&Packet::heartbeat_v4(PEER, 1).build()), XDP_DROP);
    assert_eq!(fx.record(PEER).heartbeats, 1);
}

#[test]
fn a_new_incarnation_restarts_the_sequence_and_an_old_one_is_refused() {
    let mut fx = Fixture::with_peers(&[PEER]);
    let hb = |inc: u32, seq: u64| {
        Packet::heartbeat_v4(PEER, seq)
            .with_header(HeartbeatHeader::new(PEER, inc, seq))
            .build()
    };
    fx.run(&hb(5, 100));
    fx.run(&hb(6, 0)); // restarted sender: sequence starts over, not a late arrival
    fx.run(&hb(6, 1));
    fx.run(&hb(5, 101)); // a straggler (or replay) from the old incarnation
    let r = fx.record(PEER);
    assert_eq!((r.heartbeats, r.incarnation, r.last_seq), (3, 6, 1));
    assert_eq!((r.out_of_order, r.lost, r.duplicates), (1, 0, 0));
}

#[test]
fn intervals_fill_a_ring_of_the_configured_window_with_exact_sums() {
    let window = 4;
    let mut fx = Fixture::new(
        XdpConfig {
            window,
            ..XdpConfig::DEFAULT
        },
        &[PEER],
    );
    for seq in 0..10 {
        fx.run(&Packet::heartbeat_v4(PEER, seq).build());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let r = fx.record(PEER);
    let ring = fx.intervals(PEER);
    assert_eq!(r.samples, window);
    assert_eq!(ring.len(), window as usize);
    assert_eq!(
        r.interval_sum_us,
        ring.iter().map(|&i| i as u64).sum::<u64>()
    );
    assert_eq!(
        r.interval_sum_sq_us,
        ring.iter().map(|&i| (i as u64).pow(2)).sum::<u64>()
    );
    for &i in &ring {
        assert!(i >= 2_000, "slept 2 ms between heartbeats, recorded {i} us");
    }
}

#[test]
fn unknown_peers_are_counted_reported_and_never_given_state() {
    let mut fx = Fixture::with_peers(&[PEER]);
    assert_eq!(fx.run(&Packet::heartbeat_v6(99, 5).build()), XDP_DROP);
    assert_eq!(
        fx.counters(),
        only(|c| {
            c.unknown_peer = 1;
            c.unknown_reported = 1;
        })
    );
    let reports = fx.unknown_reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (reports[0].peer_id, reports[0].seq, reports[0].src_addr),
        (99, 5, SRC_V6)
    );
    // The kernel never admits by itself: its own index still holds only PEER, no slot but
    // PEER's was written, and PEER's record is as admitted.
    let slot = fx.loaded.maps.registry.slot_of(PEER).unwrap();
    assert_eq!(fx.kernel_index(), vec![(PEER, slot)]);
    for other in (0..fx.loaded.maps.table.capacity()).filter(|&s| s != slot) {
        let r = fx.loaded.maps.table.record(other).expect("consistent read");
        assert_eq!(
            (r.peer_id, r.heartbeats, r.last_seq),
            (0, 0, 0),
            "slot {other}"
        );
    }
    let r = fx.record(PEER);
    assert_eq!((r.heartbeats, r.last_seq, r.lost), (0, 0, 0));
}

#[test]
fn unknown_peer_reports_are_rate_limited_in_the_kernel() {
    let rate = 5;
    let mut fx = Fixture::new(
        XdpConfig {
            unknown_reports_per_sec: rate,
            ..XdpConfig::DEFAULT
        },
        &[],
    );
    for id in 1000..1100u64 {
        fx.run(&Packet::heartbeat_v4(id, 0).build());
    }
    let c = fx.counters();
    assert_eq!(c.unknown_peer, 100);
    // Test runs may land on either CPU: at most `rate` per CPU in one second.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        c.unknown_reported >= rate as u64 && c.unknown_reported <= rate as u64 * cpus,
        "{c:?}"
    );
    assert_eq!(c.unknown_reported + c.unknown_suppressed, 100);
    assert_eq!(fx.unknown_reports().len() as u64, c.unknown_reported);
}

#[test]
fn pass_flag_records_and_passes() {
    let mut fx = Fixture::new(
        XdpConfig {
            flags: XDP_FLAG_PASS_HEARTBEATS,
            ..XdpConfig::DEFAULT
        },
        &[PEER],
    );
    assert_eq!(fx.run(&Packet::heartbeat_v4(PEER, 1).build()), XDP_PASS);
    assert_eq!(fx.record(PEER).heartbeats, 1);
}

#[test]
fn configured_port_is_the_one_matched() {
    let mut fx = Fixture::new(
        XdpConfig {
            port: 9999,
            ..XdpConfig::DEFAULT
        },
        &[PEER],
    );
    assert_eq!(fx.run(&Packet::heartbeat_v4(PEER, 1).build()), XDP_PASS);
    assert_eq!(fx.counters(), only(|c| c.not_heartbeat = 1));
    let packet = Packet {
        dst_port: 9999,
        ..Packet::heartbeat_v4(PEER, 1)
    };
    assert_eq!(fx.run(&packet.build()), XDP_DROP);
    assert_eq!(fx.record(PEER).heartbeats, 1);
}

#[test]
fn intervals_over_the_cap_are_not_counted_but_still_heard() {
    let mut fx = Fixture::new(
        XdpConfig {
            max_interval_us: 20_000,
            ..XdpConfig::DEFAULT
        },
        &[PEER],
    );
    fx.run(&Packet::heartbeat_v4(PEER, 0).build());
    std::thread::sleep(std::time::Duration::from_millis(40));
    fx.run(&Packet::heartbeat_v4(PEER, 1).build());
    fx.run(&Packet::heartbeat_v4(PEER, 2).build());
    let r = fx.record(PEER);
    assert_eq!(r.heartbeats, 3);
    assert_eq!(r.samples, 1, "the 40 ms interval is over the 20 ms cap");
    assert!(r.interval_sum_us < 20_000);
}

#[test]
fn a_forgotten_peer_is_unknown_and_its_slot_is_left_alone() {
    let mut fx = Fixture::with_peers(&[PEER, 8]);
    fx.run(&Packet::heartbeat_v4(PEER, 1).build());
    let slot = fx.loaded.maps.registry.slot_of(PEER).unwrap();
    fx.loaded
        .maps
        .registry
        .forget(&fx.loaded.maps.table, PEER)
        .unwrap();
    assert_eq!(fx.run(&Packet::heartbeat_v4(PEER, 2).build()), XDP_DROP);
    assert_eq!(fx.counters().unknown_peer, 1);
    let cleared = fx.loaded.maps.table.record(slot).unwrap();
    assert_eq!((cleared.peer_id, cleared.heartbeats), (0, 0));
    // The freed slot goes to the next peer admitted, clean.
    let now = monitor::kernel::clock::monotonic_ns();
    assert_eq!(
        fx.loaded
            .maps
            .registry
            .admit(&fx.loaded.maps.table, 99, now)
            .unwrap(),
        slot
    );
    fx.run(&Packet::heartbeat_v4(99, 1).build());
    assert_eq!(fx.record(99).heartbeats, 1);
}

mod authentication {
    use monitor::peer::auth_key::sign;
    use monitor_common::{
        auth::{AuthKey, KEY_CURRENT, KEY_PREVIOUS},
        config::XDP_FLAG_REQUIRE_AUTH,
    };

    use super::*;

    const KEY: AuthKey = AuthKey::from_bytes([0x11; 16]);
    const OLD: AuthKey = AuthKey::from_bytes([0x22; 16]);

    fn fixture(peers: &[u64]) -> Fixture {
        let mut fx = Fixture::new(
            XdpConfig {
                flags: XDP_FLAG_REQUIRE_AUTH,
                ..XdpConfig::DEFAULT
            },
            peers,
        );
        fx.loaded.maps.auth_keys.set(KEY_CURRENT, KEY, 0).unwrap();
        fx
    }

    fn signed(id: u64, seq: u64, key: &AuthKey) -> Vec<u8> {
        let mut h = HeartbeatHeader::new(id, 1, seq);
        sign(&mut h, key);
        Packet::heartbeat_v4(id, seq).with_header(h).build()
    }

    #[test]
    fn a_signed_heartbeat_is_recorded() {
        let mut fx = fixture(&[PEER]);
        assert_eq!(fx.run(&signed(PEER, 1, &KEY)), XDP_DROP);
        assert_eq!(fx.counters(), only(|c| c.heartbeats = 1));
        assert_eq!(fx.record(PEER).heartbeats, 1);
    }

    #[test]
    fn unsigned_forged_and_tampered_heartbeats_are_failures_not_arrivals() {
        let mut fx = fixture(&[PEER]);
        let unsigned = Packet::heartbeat_v4(PEER, 1).build();
        let forged = signed(PEER, 2, &AuthKey::from_bytes([0x33; 16]));
        let mut tampered = signed(PEER, 3, &KEY);
        let seq_byte = tampered.len() - 32 + 23; // last byte of the sequence number
        tampered[seq_byte] ^= 1;
        let mut bad_tag = signed(PEER, 4, &KEY);
        let last = bad_tag.len() - 1;
        bad_tag[last] ^= 0x80;
        for (name, packet) in [
            ("unsigned", unsigned),
            ("forged", forged),
            ("tampered", tampered),
            ("bad tag", bad_tag),
        ] {
            assert_eq!(fx.run(&packet), XDP_DROP, "{name}");
        }
        assert_eq!(fx.counters(), only(|c| c.auth_failures = 4));
        let r = fx.record(PEER);
        assert_eq!((r.heartbeats, r.auth_failures), (0, 4));
    }

    #[test]
    fn a_forged_unknown_peer_is_not_reported() {
        let mut fx = fixture(&[]);
        fx.run(&signed(500, 1, &OLD));
        assert_eq!(fx.counters(), only(|c| c.auth_failures = 1));
        assert!(
            fx.unknown_reports().is_empty(),
            "a forged id must not reach admission"
        );
        fx.run(&signed(501, 1, &KEY));
        assert_eq!(
            fx.unknown_reports().len(),
            1,
            "a genuine unknown peer is reported"
        );
    }

    /// The attack: a flood of forged heartbeats carrying a victim's id, on one CPU, while its
    /// signed heartbeats arrive on the other. A failure that took the slot's lock to count
    /// itself made signed heartbeats meet a busy lock and be dropped as `contended` (12,039 of
    /// 4.2 million beside 2.1 million forgeries, once, here).
    #[test]
    fn forgeries_on_another_cpu_never_make_a_signed_heartbeat_meet_a_busy_lock() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(
            cpus >= 2,
            "the attack needs two CPUs, this machine has {cpus}"
        );
        let mut fx = fixture(&[PEER]);
        let forged = signed(PEER, 1_000_000, &AuthKey::from_bytes([0x33; 16]));
        const BATCHES: u64 = 64;
        const BATCH: u32 = 8192;
        let done = AtomicBool::new(false);
        let xdp = &*monitor::kernel::program::xdp_mut(&mut fx.loaded.ebpf).expect("xdp");
        let on_cpu = |cpu: usize| unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, size_of_val(&set), &set), 0);
        };
        let run = |packet: &[u8], repeat: u32| {
            let options = aya::programs::TestRunOptions {
                data_in: Some(packet),
                repeat,
                ..Default::default()
            };
            aya::programs::TestRun::test_run(xdp, options).expect("test run");
        };
        let sent = std::thread::scope(|scope| {
            scope.spawn(|| {
                on_cpu(0);
                for _ in 0..BATCHES {
                    run(&forged, BATCH);
                }
                done.store(true, Ordering::Relaxed);
            });
            on_cpu(1);
            // Signed heartbeats for as long as the flood lasts.
            let mut seq = 0;
            while !done.load(Ordering::Relaxed) {
                seq += 1;
                run(&signed(PEER, seq, &KEY), 1);
            }
            seq
        });
        let c = fx.counters();
        let forgeries = BATCHES * BATCH as u64;
        assert_eq!(c.contended, 0, "signed heartbeats met a busy lock: {c:?}");
        assert_eq!((c.heartbeats, c.auth_failures), (sent, forgeries), "{c:?}");
        let r = fx.record(PEER);
        assert_eq!((r.heartbeats, r.last_seq), (sent, sent));
        assert_eq!(
            r.auth_failures, forgeries,
            "each forgery counted against the peer"
        );
        integration_tests::attack::AttackRow {
            attack: "forged heartbeats for a victim's id on another CPU",
            load: format!("{forgeries} forgeries beside {sent} signed (BPF_PROG_TEST_RUN, 2 CPUs)"),
            heartbeats_lost: Some(sent - r.heartbeats + c.contended),
            ..Default::default()
        }
        .report();
    }

    #[test]
    fn the_previous_key_is_accepted_during_a_rotation_only() {
        let mut fx = fixture(&[PEER]);
        assert_eq!(fx.run(&signed(PEER, 1, &OLD)), XDP_DROP);
        assert_eq!(fx.record(PEER).heartbeats, 0, "OLD is not a key yet");
        fx.loaded.maps.auth_keys.set(KEY_PREVIOUS, OLD, 0).unwrap();
        fx.run(&signed(PEER, 2, &OLD));
        fx.run(&signed(PEER, 3, &KEY));
        assert_eq!(
            fx.record(PEER).heartbeats,
            2,
            "both keys during the grace period"
        );
        fx.loaded
            .maps
            .auth_keys
            .set(KEY_PREVIOUS, AuthKey::default(), 0)
            .unwrap();
        fx.run(&signed(PEER, 4, &OLD));
        assert_eq!(fx.record(PEER).heartbeats, 2, "the old key expired");
        assert_eq!(fx.counters().auth_failures, 2);
    }
}

/// One parser, two hooks: every layout, whole and cut at every byte, to another port, a bad
/// magic, an unknown peer, through the TC classifier (`--hook tc`) give the XDP program's
/// verdicts, counters and peer record, packet by packet.
#[test]
fn the_tc_hook_judges_every_packet_as_xdp_does() {
    use monitor::kernel::program::Hook;
    let mut packets: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, packet) in layouts() {
        let frame = packet.build();
        for len in 14..=frame.len() {
            packets.push((format!("{name} cut at {len}"), frame[..len].to_vec()));
        }
        let wrong_port = Packet {
            dst_port: DEFAULT_PORT + 1,
            ..packet.clone()
        };
        packets.push((format!("{name} to another port"), wrong_port.build()));
    }
    let mut bad_magic = Packet::heartbeat_v4(PEER, 1).build();
    let header_at = bad_magic.len() - size_of::<HeartbeatHeader>();
    bad_magic[header_at] ^= 0xff;
    packets.push(("bad magic".into(), bad_magic));
    packets.push((
        "unknown peer".into(),
        Packet::heartbeat_v6(PEER + 1, 1).build(),
    ));
    packets.push((
        "next heartbeat".into(),
        Packet::heartbeat_v4(PEER, 2).build(),
    ));
    // The same sequence through both: their state must stay the same after every packet.
    let mut xdp = Fixture::new_hook(XdpConfig::DEFAULT, &[PEER], Hook::Xdp);
    let mut tc = Fixture::new_hook(XdpConfig::DEFAULT, &[PEER], Hook::Tc);
    for (name, frame) in &packets {
        // The kernel's skb test run refuses a frame whose EtherType is IPv4 or IPv6 but which
        // is shorter than that IP header (EINVAL; such a frame is cut at ip_rcv anyway).
        let ether_type = u16::from_be_bytes([frame[12], frame[13]]);
        let ip_header = match ether_type {
            0x0800 => 20,
            0x86dd => 40,
            _ => 0,
        };
        if frame.len() < 14 + ip_header {
            assert!(
                tc.try_run(frame).is_err(),
                "{name}: accepted by the skb test run"
            );
            continue;
        }
        assert_eq!(tc.run(frame), xdp.run(frame), "{name}: verdict");
        assert_eq!(tc.counters(), xdp.counters(), "{name}: counters");
        let (t, x) = (tc.record(PEER), xdp.record(PEER));
        assert_eq!(
            (
                t.heartbeats,
                t.last_seq,
                t.src_family,
                t.src_port,
                t.src_addr
            ),
            (
                x.heartbeats,
                x.last_seq,
                x.src_family,
                x.src_port,
                x.src_addr
            ),
            "{name}: record"
        );
    }
}

/// The peers' heartbeats `seq` back to back in one datagram, the magic of the `broken`-th (if
/// any) flipped.
fn several(peers: &[u64], ip: Ip, seq: u64, broken: Option<usize>) -> Vec<u8> {
    let mut payload = Vec::new();
    for (i, &id) in peers.iter().enumerate() {
        let mut header = HeartbeatHeader::new(id, 1, seq).to_bytes();
        if broken == Some(i) {
            header[0] ^= 0xff;
        }
        payload.extend_from_slice(&header);
    }
    Packet {
        payload,
        ip,
        ..Packet::heartbeat_v4(peers[0], seq)
    }
    .build()
}

/// Runs the packets of several heartbeats every hook meets through `run` (a GSO batch at TC,
/// or one frame at XDP in skb mode, where the kernel's GRO and a sender's UDP GSO leave them
/// whole): each heartbeat checked and recorded on its own, the packet consumed only if all
/// were heartbeats.
fn each_heartbeat_of_several_is_recorded(
    hook: monitor::kernel::program::Hook,
    run: impl Fn(&mut Fixture, &[u8]) -> u32,
) {
    let peers = [PEER, PEER + 1, PEER + 2];
    for ip in [
        Packet::heartbeat_v4(PEER, 1).ip,
        Packet::heartbeat_v6(PEER, 1).ip,
    ] {
        let mut f = Fixture::new_hook(XdpConfig::DEFAULT, &peers, hook);
        // Three heartbeats in one packet: three arrivals, the packet consumed.
        assert_eq!(run(&mut f, &several(&peers, ip.clone(), 1, None)), XDP_DROP);
        assert_eq!(f.counters(), only(|c| c.heartbeats = 3), "three in one");
        for id in peers {
            assert_eq!(
                (f.record(id).heartbeats, f.record(id).last_seq),
                (1, 1),
                "peer {id}"
            );
        }
        // The second one's magic broken: the first and third recorded, the packet passed.
        assert_eq!(
            run(&mut f, &several(&peers, ip.clone(), 2, Some(1))),
            XDP_PASS
        );
        assert_eq!(
            f.counters(),
            only(|c| {
                c.heartbeats = 5;
                c.malformed = 1;
            }),
            "a packet with a bad heartbeat"
        );
        let seqs: Vec<u64> = peers.iter().map(|&id| f.record(id).last_seq).collect();
        assert_eq!(seqs, [2, 1, 2]);
        // Not whole heartbeats (the last cut to 16 bytes, the UDP length saying so), and a
        // UDP length past the frame's end (three present, four claimed): one malformed packet
        // each, nothing recorded.
        let mut cut = several(&peers, ip.clone(), 3, None);
        cut.truncate(cut.len() - 16);
        set_udp_len(&mut cut, &ip, 8 + 80);
        assert_eq!(run(&mut f, &cut), XDP_PASS);
        let mut long = several(&peers, ip.clone(), 3, None);
        set_udp_len(&mut long, &ip, 8 + 128);
        assert_eq!(run(&mut f, &long), XDP_PASS);
        assert_eq!(
            f.counters(),
            only(|c| {
                c.heartbeats = 5;
                c.malformed = 3;
            }),
            "packets of something else"
        );
        let seqs: Vec<u64> = peers.iter().map(|&id| f.record(id).last_seq).collect();
        assert_eq!(seqs, [2, 1, 2]);
    }
}

/// Rewrites the UDP length of a frame `several` built (no VLAN tags), and the IP length to
/// match (the parser reads the UDP one; a kernel would have checked the IP one).
fn set_udp_len(frame: &mut [u8], ip: &Ip, udp_len: u16) {
    let (ip_len_at, ip_len, udp_at) = match ip {
        Ip::V4 { .. } => (14 + 2, 20 + udp_len, 14 + 20),
        Ip::V6 { .. } => (14 + 4, udp_len, 14 + 40),
    };
    frame[ip_len_at..ip_len_at + 2].copy_from_slice(&ip_len.to_be_bytes());
    frame[udp_at + 4..udp_at + 6].copy_from_slice(&udp_len.to_be_bytes());
}

#[test]
fn the_xdp_hook_records_each_heartbeat_of_a_frame_of_several() {
    each_heartbeat_of_several_is_recorded(monitor::kernel::program::Hook::Xdp, |f, frame| {
        f.run(frame)
    });
}

#[test]
fn the_tc_hook_records_each_heartbeat_of_a_batch() {
    use monitor::kernel::program::Hook;
    // As a GSO batch of three datagrams, and as one datagram of three heartbeats.
    each_heartbeat_of_several_is_recorded(Hook::Tc, |f, frame| f.run_batch(frame, 3, 32));
    each_heartbeat_of_several_is_recorded(Hook::Tc, |f, frame| f.run(frame));
    // A GSO batch whose datagrams are not whole heartbeats (6 of 16 bytes), or not as many as
    // its UDP length makes (4 of 32 bytes claimed, 3 present): one malformed packet each.
    let peers = [PEER, PEER + 1, PEER + 2];
    let mut tc = Fixture::new_hook(XdpConfig::DEFAULT, &peers, Hook::Tc);
    let frame = several(&peers, Packet::heartbeat_v4(PEER, 1).ip, 1, None);
    assert_eq!(tc.run_batch(&frame, 6, 16), XDP_PASS);
    assert_eq!(tc.run_batch(&frame, 4, 32), XDP_PASS);
    assert_eq!(
        tc.counters(),
        only(|c| c.malformed = 2),
        "batches of something else"
    );
}

/// The frame with its IP destination address replaced (IPv4 as `a.b.c.d`, IPv6 in full).
fn to_destination(packet: &Packet, dst: std::net::IpAddr) -> Vec<u8> {
    let mut frame = packet.build();
    let ip_at = 14 + 4 * packet.vlans.len();
    match (&packet.ip, dst) {
        (Ip::V4 { .. }, std::net::IpAddr::V4(v4)) => {
            frame[ip_at + 16..ip_at + 20].copy_from_slice(&v4.octets())
        }
        (Ip::V6 { .. }, std::net::IpAddr::V6(v6)) => {
            frame[ip_at + 24..ip_at + 40].copy_from_slice(&v6.octets())
        }
        _ => panic!("address family does not match the packet"),
    }
    frame
}

/// A fixture that checks destinations, accepting heartbeats at `addrs` only.
fn checking_destinations(hook: monitor::kernel::program::Hook, addrs: &[&str]) -> Fixture {
    use monitor_common::config::XDP_FLAG_CHECK_DESTINATION;
    let mut fx = Fixture::new_hook(
        XdpConfig {
            flags: XDP_FLAG_CHECK_DESTINATION,
            ..XdpConfig::DEFAULT
        },
        &[PEER],
        hook,
    );
    set_local(&mut fx, addrs);
    fx
}

fn set_local(fx: &mut Fixture, addrs: &[&str]) {
    let mut map =
        monitor::kernel::destination::LocalAddrs::take(&mut fx.loaded.ebpf).expect("LOCAL_ADDRS");
    let set = addrs.iter().map(|a| a.parse().unwrap()).collect();
    map.set(&set).expect("fill LOCAL_ADDRS");
    // The map stays in the kernel with the program; the userspace handle may go.
}

const NOT_LOCAL_V4: &str = "192.0.2.99";
const NOT_LOCAL_V6: &str = "2001:db8::99";

fn local_of(packet: &Packet) -> std::net::IpAddr {
    match packet.ip {
        Ip::V4 { .. } => std::net::IpAddr::from(DST_V4),
        Ip::V6 { .. } => std::net::IpAddr::from(DST_V6),
    }
}

fn not_local_of(packet: &Packet) -> std::net::IpAddr {
    match packet.ip {
        Ip::V4 { .. } => NOT_LOCAL_V4.parse().unwrap(),
        Ip::V6 { .. } => NOT_LOCAL_V6.parse().unwrap(),
    }
}

/// With the destination check, a heartbeat to another host's address (this one routes it) is
/// passed untouched and not recorded, counted as `not_local`; one to a local address is
/// recorded and consumed: every layout, both hooks.
#[test]
fn heartbeats_to_another_host_pass_and_are_not_recorded() {
    use monitor::kernel::program::Hook;
    let local = ["192.0.2.1", "2001:db8::1"];
    for hook in [Hook::Xdp, Hook::Tc] {
        for (name, packet) in layouts() {
            let mut fx = checking_destinations(hook, &local);
            let foreign = to_destination(&packet, not_local_of(&packet));
            assert_eq!(fx.run(&foreign), XDP_PASS, "{hook} {name}");
            assert_eq!(fx.counters(), only(|c| c.not_local = 1), "{hook} {name}");
            assert_eq!(fx.record(PEER).heartbeats, 0, "{hook} {name}");
            let ours = to_destination(&packet, local_of(&packet));
            assert_eq!(fx.run(&ours), XDP_DROP, "{hook} {name}");
            assert_eq!(
                fx.counters(),
                only(|c| {
                    c.not_local = 1;
                    c.heartbeats = 1
                }),
                "{hook} {name}"
            );
            assert_eq!(fx.record(PEER).heartbeats, 1, "{hook} {name}");
        }
    }
}

/// The first four addresses are compared inline (LOCAL_FAST), the rest are looked up in
/// LOCAL_ADDRS: an address in either place is local, whichever place it is in.
#[test]
fn every_local_address_counts_past_the_first_four() {
    // Sorted, as the agent writes them: the four IPv4 addresses go inline, the IPv6 ones not.
    let local = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "2001:db8::1",
        "2001:db8::2",
    ];
    let mut fx = checking_destinations(monitor::kernel::program::Hook::Xdp, &local);
    let mut seq = 0;
    for addr in local {
        seq += 1;
        let packet = match addr.parse::<std::net::IpAddr>().unwrap() {
            std::net::IpAddr::V4(_) => Packet::heartbeat_v4(PEER, seq),
            std::net::IpAddr::V6(_) => Packet::heartbeat_v6(PEER, seq),
        };
        let frame = to_destination(&packet, addr.parse().unwrap());
        assert_eq!(fx.run(&frame), XDP_DROP, "{addr}");
    }
    assert_eq!(fx.record(PEER).heartbeats, 6);
    for foreign in [NOT_LOCAL_V4, NOT_LOCAL_V6, "192.0.2.5"] {
        let packet = if foreign.contains(':') {
            Packet::heartbeat_v6(PEER, 99)
        } else {
            Packet::heartbeat_v4(PEER, 99)
        };
        assert_eq!(
            fx.run(&to_destination(&packet, foreign.parse().unwrap())),
            XDP_PASS
        );
    }
    assert_eq!(fx.counters().not_local, 3);
    // Fewer addresses: the ones that left are not local any more, inline or not.
    let fewer = ["2001:db8::2".parse().unwrap()].into_iter().collect();
    local_addrs_of(&fx).set(&fewer).expect("update LOCAL_ADDRS");
    let gone = to_destination(
        &Packet::heartbeat_v4(PEER, 100),
        "192.0.2.1".parse().unwrap(),
    );
    assert_eq!(fx.run(&gone), XDP_PASS);
    let kept = to_destination(
        &Packet::heartbeat_v6(PEER, 101),
        "2001:db8::2".parse().unwrap(),
    );
    assert_eq!(fx.run(&kept), XDP_DROP);
    assert_eq!(fx.counters().not_local, 4);
}

/// Not ours means not ours: a broken heartbeat to another host is not_local, not malformed,
/// and traffic to other ports is untouched by the check.
#[test]
fn the_check_comes_after_the_port_and_before_validation() {
    let mut fx = checking_destinations(monitor::kernel::program::Hook::Xdp, &["192.0.2.1"]);
    let mut broken = Packet::heartbeat_v4(PEER, 1);
    broken.payload[0] ^= 0xff;
    let frame = to_destination(&broken, NOT_LOCAL_V4.parse().unwrap());
    assert_eq!(fx.run(&frame), XDP_PASS);
    assert_eq!(fx.counters(), only(|c| c.not_local = 1));
    let other_port = Packet {
        dst_port: DEFAULT_PORT + 1,
        ..Packet::heartbeat_v4(PEER, 1)
    };
    let frame = to_destination(&other_port, NOT_LOCAL_V4.parse().unwrap());
    assert_eq!(fx.run(&frame), XDP_PASS);
    assert_eq!(
        fx.counters(),
        only(|c| {
            c.not_local = 1;
            c.not_heartbeat = 1
        })
    );
}

/// The map is read per packet: an address added while the program runs is accepted at once;
/// one removed is not. A multicast group counts when listed.
#[test]
fn local_addresses_change_under_the_running_program() {
    let mut fx = checking_destinations(monitor::kernel::program::Hook::Xdp, &[]);
    let packet = Packet::heartbeat_v4(PEER, 1);
    let frame = to_destination(&packet, NOT_LOCAL_V4.parse().unwrap());
    assert_eq!(fx.run(&frame), XDP_PASS);
    assert_eq!(fx.record(PEER).heartbeats, 0);
    // Reach the map again through the kernel: the fixture's handle was taken and dropped.
    let mut map = local_addrs_of(&fx);
    map.set(&[NOT_LOCAL_V4.parse().unwrap()].into()).unwrap();
    assert_eq!(fx.run(&frame), XDP_DROP);
    assert_eq!(fx.record(PEER).heartbeats, 1);
    map.set(&["239.1.2.3".parse().unwrap()].into()).unwrap();
    let next = to_destination(
        &Packet::heartbeat_v4(PEER, 2),
        NOT_LOCAL_V4.parse().unwrap(),
    );
    assert_eq!(fx.run(&next), XDP_PASS);
    let group = to_destination(&Packet::heartbeat_v4(PEER, 2), "239.1.2.3".parse().unwrap());
    assert_eq!(fx.run(&group), XDP_DROP);
    assert_eq!(fx.record(PEER).heartbeats, 2);
    assert_eq!(fx.counters().not_local, 2);
}

/// Without the flag (`--listen-addr any`, and every fixture above) the map is not read:
/// any destination is recorded, as before the check existed.
#[test]
fn without_the_check_every_destination_counts() {
    let mut fx = Fixture::with_peers(&[PEER]);
    let frame = to_destination(
        &Packet::heartbeat_v6(PEER, 1),
        NOT_LOCAL_V6.parse().unwrap(),
    );
    assert_eq!(fx.run(&frame), XDP_DROP);
    assert_eq!(fx.counters(), only(|c| c.heartbeats = 1));
}

/// The fixture's LOCAL_ADDRS and LOCAL_FAST, found through the program's map ids.
fn local_addrs_of(fx: &Fixture) -> monitor::kernel::destination::LocalAddrs {
    use aya::maps::MapData;
    use monitor_common::maps::{LOCAL_ADDRS_MAP, LOCAL_FAST_MAP};
    let info = fx
        .loaded
        .ebpf
        .program(monitor::kernel::program::PROGRAM_NAME)
        .expect("the program")
        .info()
        .expect("program info");
    let (mut addrs, mut fast) = (None, None);
    for id in info.map_ids().expect("map ids").expect("map ids reported") {
        let data = MapData::from_id(id).expect("map by id");
        let name = data.info().expect("map info").name().to_vec();
        if name == LOCAL_ADDRS_MAP.as_bytes() {
            addrs = Some(data);
        } else if name == LOCAL_FAST_MAP.as_bytes() {
            fast = Some(data);
        }
    }
    monitor::kernel::destination::LocalAddrs::from_map_data(
        addrs.expect("the program uses LOCAL_ADDRS"),
        fast.expect("the program uses LOCAL_FAST"),
    )
    .expect("the destination maps")
}

/// An id of 1 to the capacity has its own hot line (`index::own_line`), whatever slot the
/// registry gave it (its own, `id - 1`, when free): found there, one line read. Any other id is
/// found through the keyed hash. And an unknown id whose own slot holds another peer is
/// unknown, not that peer: the lookup is by line, and its own line is empty.
#[test]
fn ids_are_found_in_their_own_line_or_through_the_hash() {
    const SPARSE: u64 = 1 << 40;
    // SPARSE takes slot 0 first, so peer 1 is in slot 1, peer 2's own slot.
    let mut fx = Fixture::with_peers(&[SPARSE, 1, 3]);
    assert_eq!(fx.slot(SPARSE), 0);
    assert_eq!(fx.slot(1), 1, "its own slot was taken");
    assert_eq!(fx.slot(3), 2, "its own slot");
    assert_eq!(
        fx.kernel_index(),
        vec![(1, 1), (3, 2), (SPARSE, 0)],
        "each line links to its peer's slot"
    );
    for (seq, id) in [(1, 1), (1, 3), (1, SPARSE), (2, 1), (2, 3)] {
        assert_eq!(
            fx.run(&Packet::heartbeat_v4(id, seq).build()),
            XDP_DROP,
            "peer {id}"
        );
    }
    assert_eq!(fx.record(1).heartbeats, 2);
    assert_eq!(fx.record(3).heartbeats, 2);
    assert_eq!(fx.record(SPARSE).heartbeats, 1);
    // Peer 2 is unknown: its own line is empty, and slot 1, its own, is peer 1's and stays as
    // it was.
    assert_eq!(fx.run(&Packet::heartbeat_v4(2, 1).build()), XDP_DROP);
    let c = fx.counters();
    assert_eq!((c.heartbeats, c.unknown_peer), (5, 1));
    assert_eq!(fx.record(1).heartbeats, 2);
    assert_eq!(fx.unknown_reports().len(), 1);
}

/// A suspected peer's next heartbeat is told (`TELL_HEARD`): the first accepted one writes an
/// arrival marked `ARRIVAL_HEARD` to the ring and clears the bit, once; a duplicate is not the
/// heartbeat asked for and leaves it; a recording's bit (`TELL_ARRIVALS`) is kept and still
/// traces every arrival; a peer asked nothing costs the ring nothing. Both hooks.
#[test]
fn a_suspected_peers_next_heartbeat_is_told_once() {
    use monitor_common::maps::{ARRIVAL_CODE, ARRIVAL_HEARD, TELL_ARRIVALS, TELL_HEARD};
    for hook in [
        monitor::kernel::program::Hook::Xdp,
        monitor::kernel::program::Hook::Tc,
    ] {
        let mut fx = Fixture::new_hook(XdpConfig::DEFAULT, &[PEER, PEER + 1], hook);
        fx.run(&Packet::heartbeat_v4(PEER, 1).build());
        fx.run(&Packet::heartbeat_v4(PEER + 1, 1).build());
        assert_eq!(fx.arrivals(), [], "{hook:?}: nobody asked");
        let slot = fx.slot(PEER);
        assert_eq!(fx.loaded.maps.table.tell_when_heard(slot, PEER), Some(true));
        assert_eq!(
            fx.loaded.maps.table.tell_when_heard(slot, PEER + 7),
            None,
            "{hook:?}: another peer's slot is left alone"
        );
        // A duplicate is not a heartbeat heard.
        fx.run(&Packet::heartbeat_v4(PEER, 1).build());
        assert_eq!(fx.arrivals(), [], "{hook:?}: a duplicate");
        assert_eq!(fx.record(PEER).tell, TELL_HEARD, "{hook:?}");
        fx.run(&Packet::heartbeat_v4(PEER + 1, 2).build());
        fx.run(&Packet::heartbeat_v4(PEER, 2).build());
        let told = fx.arrivals();
        assert_eq!(told.len(), 1, "{hook:?}: {told:?}");
        let record = fx.record(PEER);
        assert_eq!(
            (told[0].peer_id, told[0].seq, told[0].at_ns),
            (PEER, 2, record.last_arrival_ns),
            "{hook:?}"
        );
        assert_eq!(told[0].outcome, ARRIVAL_HEARD, "{hook:?}: accepted, heard");
        assert_eq!(record.tell, 0, "{hook:?}: told once");
        fx.run(&Packet::heartbeat_v4(PEER, 3).build());
        assert_eq!(fx.arrivals(), [], "{hook:?}: not again");
        // Recorded and suspected: one line an arrival, the told one marked, the trace kept.
        assert!(fx.loaded.maps.table.set_traced(slot, PEER, true));
        assert_eq!(fx.loaded.maps.table.tell_when_heard(slot, PEER), Some(true));
        for seq in [3, 4, 5] {
            fx.run(&Packet::heartbeat_v4(PEER, seq).build());
        }
        let traced: Vec<(u64, u32, u32)> = fx
            .arrivals()
            .iter()
            .map(|a| (a.seq, a.outcome & ARRIVAL_CODE, a.outcome & ARRIVAL_HEARD))
            .collect();
        assert_eq!(
            traced,
            [(3, 1, 0), (4, 0, ARRIVAL_HEARD), (5, 0, 0)],
            "{hook:?}"
        );
        assert_eq!(fx.record(PEER).tell, TELL_ARRIVALS, "{hook:?}");
    }
}
