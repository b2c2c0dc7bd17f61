//! Passive sources through the real program (BPF_PROG_TEST_RUN, both hooks): BFD control
//! packets (`--bfd`) and datagrams of watched UDP flows (`--udp-port`) are recorded under the
//! id derived from them and always passed on.

use integration_tests::{
    fixture::{Fixture, XDP_PASS},
    packet::{IPPROTO_UDP, Ip, Packet, SRC_PORT, SRC_V4, SRC_V6},
};
use monitor::kernel::program::Hook;
use monitor_common::{
    config::{XDP_FLAG_BFD, XdpConfig},
    passive::{
        self, BFD_DOWN, BFD_INIT, BFD_MULTIHOP_PORT, BFD_SINGLE_HOP_PORT, BFD_UP, BfdControl,
        SOURCE_BFD, SOURCE_FLOW, SOURCE_HEARTBEAT,
    },
};

const DISCRIMINATOR: u32 = 0x5eed_0001;
const FLOW_PORT: u16 = 5353;

fn control(state: u8, desired_min_tx_us: u32) -> BfdControl {
    BfdControl {
        diag: 0,
        state,
        poll: false,
        final_: false,
        detect_mult: 3,
        my_discriminator: DISCRIMINATOR,
        your_discriminator: 77,
        desired_min_tx_us,
        required_min_rx_us: 100_000,
    }
}

fn bfd_packet(c: &BfdControl, v6: bool, port: u16) -> Vec<u8> {
    let mut p = Packet::heartbeat_v4(1, 1);
    if v6 {
        p.ip = Ip::V6 {
            next_hdr: IPPROTO_UDP,
        };
    }
    p.src_port = 49152;
    p.dst_port = port;
    // What bfdd sends, and what single hop requires (RFC 5881 section 5).
    p.ttl = 255;
    p.payload = passive::encode_bfd(c).to_vec();
    p.build()
}

fn v4_words() -> [u64; 2] {
    passive::addr_words(std::net::Ipv4Addr::from(SRC_V4).to_ipv6_mapped().octets())
}

fn bfd_id(v6: bool) -> u64 {
    let words = if v6 {
        passive::addr_words(SRC_V6)
    } else {
        v4_words()
    };
    passive::bfd_peer_id(words, DISCRIMINATOR)
}

fn bfd_fixture(hook: Hook) -> Fixture {
    Fixture::new_hook(
        XdpConfig {
            flags: XDP_FLAG_BFD,
            ..XdpConfig::DEFAULT
        },
        &[],
        hook,
    )
}

#[test]
fn bfd_sessions_are_recorded_under_their_derived_id_and_passed_on() {
    for hook in [Hook::Xdp, Hook::Tc] {
        for (v6, port) in [(false, BFD_SINGLE_HOP_PORT), (true, BFD_MULTIHOP_PORT)] {
            let mut fx = bfd_fixture(hook);
            let id = bfd_id(v6);
            fx.admit_as(id, SOURCE_BFD);
            for _ in 0..3 {
                assert_eq!(
                    fx.run(&bfd_packet(&control(BFD_UP, 100_000), v6, port)),
                    XDP_PASS
                );
            }
            let r = fx.record(id);
            assert_eq!(
                (r.heartbeats, r.last_seq, r.lost),
                (3, 3, 0),
                "{hook:?} v6={v6}"
            );
            assert_eq!((r.samples, r.source), (2, SOURCE_BFD));
            assert_eq!(
                (
                    r.bfd_state,
                    r.bfd_detect_mult,
                    r.bfd_my_discriminator,
                    r.bfd_your_discriminator
                ),
                (BFD_UP, 3, DISCRIMINATOR, 77)
            );
            assert_eq!(
                (r.bfd_desired_min_tx_us, r.bfd_required_min_rx_us),
                (100_000, 100_000)
            );
            assert_eq!((r.src_port, r.bfd_transitions), (49152, 0));
            let c = fx.counters();
            assert_eq!((c.bfd, c.heartbeats, c.malformed), (3, 0, 0), "{hook:?}");
        }
    }
}

#[test]
fn an_unknown_session_is_reported_with_its_key_and_given_no_state() {
    let mut fx = bfd_fixture(Hook::Xdp);
    assert_eq!(
        fx.run(&bfd_packet(
            &control(BFD_DOWN, 1_000_000),
            false,
            BFD_SINGLE_HOP_PORT
        )),
        XDP_PASS
    );
    let c = fx.counters();
    assert_eq!((c.unknown_peer, c.unknown_reported, c.bfd), (1, 1, 0));
    let reports = fx.unknown_reports();
    assert_eq!(reports.len(), 1);
    let r = reports[0];
    assert_eq!(
        (r.peer_id, r.source, r.discriminator),
        (bfd_id(false), SOURCE_BFD, DISCRIMINATOR)
    );
    assert_eq!(
        (r.bfd_state, r.dst_port, r.src_port),
        (BFD_DOWN, BFD_SINGLE_HOP_PORT, 49152)
    );
    assert_eq!(fx.kernel_index(), vec![]);
}

#[test]
fn new_timers_start_a_fresh_window_and_state_changes_are_counted() {
    let mut fx = bfd_fixture(Hook::Xdp);
    let id = bfd_id(false);
    fx.admit_as(id, SOURCE_BFD);
    let send = |fx: &mut Fixture, state, tx| {
        fx.run(&bfd_packet(&control(state, tx), false, BFD_SINGLE_HOP_PORT))
    };
    // Down at 1 s, as RFC 5880 requires before Up: its intervals are a window of their own.
    send(&mut fx, BFD_DOWN, 1_000_000);
    send(&mut fx, BFD_DOWN, 1_000_000);
    send(&mut fx, BFD_DOWN, 1_000_000);
    assert_eq!(fx.record(id).samples, 2);
    // Init: another state, a fresh window.
    send(&mut fx, BFD_INIT, 1_000_000);
    assert_eq!(fx.record(id).samples, 0);
    // Up at 100 ms: the slow intervals are not this rate's.
    send(&mut fx, BFD_UP, 100_000);
    let r = fx.record(id);
    assert_eq!((r.samples, r.interval_sum_us, r.restarts), (0, 0, 2));
    send(&mut fx, BFD_UP, 100_000);
    send(&mut fx, BFD_UP, 100_000);
    assert_eq!(fx.record(id).samples, 2);
    // Down again, still announcing 100 ms: the state change alone starts a fresh window (a
    // session that is not Up sends once a second at most).
    send(&mut fx, BFD_DOWN, 100_000);
    let r = fx.record(id);
    assert_eq!(
        (r.samples, r.bfd_state, r.bfd_transitions, r.restarts),
        (0, BFD_DOWN, 3, 3)
    );
    assert_eq!(r.heartbeats, 8);
}

#[test]
fn a_heartbeat_peers_slot_is_never_written_by_a_bfd_packet_with_its_id() {
    let mut fx = bfd_fixture(Hook::Xdp);
    let id = bfd_id(false);
    // The registry refuses such a peer while passive sources are on (the next tests); the
    // kernel's source check stands behind it all the same.
    fx.registry().reserve_derived_ids(false);
    fx.admit_as(id, SOURCE_HEARTBEAT);
    assert_eq!(
        fx.run(&bfd_packet(
            &control(BFD_UP, 100_000),
            false,
            BFD_SINGLE_HOP_PORT
        )),
        XDP_PASS
    );
    let r = fx.record(id);
    assert_eq!(
        (r.heartbeats, r.bfd_state, r.source),
        (0, 0, SOURCE_HEARTBEAT)
    );
    assert_eq!((fx.counters().unknown_peer, fx.counters().bfd), (1, 0));
}

#[test]
fn bfd_packets_are_foreign_without_the_flag_and_malformed_ones_pass() {
    let mut fx = Fixture::new(XdpConfig::DEFAULT, &[]);
    assert_eq!(
        fx.run(&bfd_packet(
            &control(BFD_UP, 100_000),
            false,
            BFD_SINGLE_HOP_PORT
        )),
        XDP_PASS
    );
    assert_eq!(
        (fx.counters().not_heartbeat, fx.counters().unknown_peer),
        (1, 0)
    );

    let mut fx = bfd_fixture(Hook::Xdp);
    let good = passive::encode_bfd(&control(BFD_UP, 100_000));
    let mut bad_version = good;
    bad_version[0] = 0;
    let mut no_discriminator = good;
    no_discriminator[4..8].fill(0);
    for payload in [&bad_version[..], &no_discriminator[..], &good[..20]] {
        let mut p = Packet::heartbeat_v4(1, 1);
        p.dst_port = BFD_SINGLE_HOP_PORT;
        p.ttl = 255;
        p.payload = payload.to_vec();
        assert_eq!(fx.run(&p.build()), XDP_PASS);
    }
    let c = fx.counters();
    assert_eq!((c.malformed, c.unknown_peer, c.bfd), (3, 0, 0));
}

#[test]
fn single_hop_bfd_that_crossed_a_router_is_not_recorded_but_passes() {
    for hook in [Hook::Xdp, Hook::Tc] {
        for v6 in [false, true] {
            let mut fx = bfd_fixture(hook);
            let id = bfd_id(v6);
            fx.admit_as(id, SOURCE_BFD);
            let mut packet = bfd_packet(&control(BFD_UP, 100_000), v6, BFD_SINGLE_HOP_PORT);
            // The TTL (IPv4, byte 8 of the header) or Hop Limit (IPv6, byte 7) after Ethernet.
            packet[14 + if v6 { 7 } else { 8 }] = 254;
            assert_eq!(fx.run(&packet), XDP_PASS, "{hook:?} v6={v6}");
            let c = fx.counters();
            assert_eq!(
                (c.malformed, c.bfd, c.unknown_peer),
                (1, 0, 0),
                "{hook:?} v6={v6}"
            );
            assert_eq!(fx.record(id).heartbeats, 0);
            // Multihop sessions cross routers by design: no TTL rule (RFC 5883).
            let mut packet = bfd_packet(&control(BFD_UP, 100_000), v6, BFD_MULTIHOP_PORT);
            packet[14 + if v6 { 7 } else { 8 }] = 250;
            assert_eq!(fx.run(&packet), XDP_PASS);
            assert_eq!(fx.record(id).heartbeats, 1, "{hook:?} v6={v6}");
        }
    }
}

#[test]
fn with_passive_sources_heartbeat_ids_keep_out_of_the_derived_half() {
    let derived = bfd_id(false);
    assert!(passive::is_derived_id(derived));
    // A heartbeat naming a BFD session's id: refused before any lookup, so it can neither
    // land in the session's slot nor be reported for admission.
    let mut fx = bfd_fixture(Hook::Xdp);
    fx.admit_as(derived, SOURCE_BFD);
    fx.run(&Packet::heartbeat_v4(derived, 1).build());
    fx.run(&Packet::heartbeat_v4(passive::DERIVED_ID_BIT | 5, 1).build());
    let c = fx.counters();
    assert_eq!((c.malformed, c.heartbeats, c.unknown_peer), (2, 0, 0));
    assert_eq!(fx.record(derived).heartbeats, 0);
    assert!(fx.unknown_reports().is_empty());
    // And the agent does not admit one.
    let err = fx
        .try_admit_as(passive::DERIVED_ID_BIT | 5, SOURCE_HEARTBEAT)
        .expect_err("a heartbeat peer in the derived half");
    assert!(err.to_string().contains("below 2^63"), "{err}");
    fx.try_admit_as(5, SOURCE_HEARTBEAT)
        .expect("a heartbeat peer");
    fx.run(&Packet::heartbeat_v4(5, 1).build());
    assert_eq!(fx.counters().heartbeats, 1);

    // Without passive sources the whole id space is the heartbeat peers'.
    let mut fx = Fixture::new(XdpConfig::DEFAULT, &[]);
    fx.try_admit_as(derived, SOURCE_HEARTBEAT).expect("any id");
    fx.run(&Packet::heartbeat_v4(derived, 1).build());
    assert_eq!((fx.counters().heartbeats, fx.counters().malformed), (1, 0));
}

fn flow_packet(src_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = Packet::heartbeat_v4(1, 1);
    p.src_port = src_port;
    p.dst_port = FLOW_PORT;
    p.payload = payload.to_vec();
    p.build()
}

#[test]
fn any_datagram_to_a_watched_port_is_a_heartbeat_of_its_flow() {
    for hook in [Hook::Xdp, Hook::Tc] {
        let mut fx = Fixture::new_hook(
            XdpConfig {
                flow_ports: [9, FLOW_PORT, 0, 0],
                ..XdpConfig::DEFAULT
            },
            &[],
            hook,
        );
        let id = passive::flow_peer_id(v4_words(), SRC_PORT);
        fx.admit_as(id, SOURCE_FLOW);
        for payload in [&b"query"[..], &[][..], &[0u8; 300][..]] {
            assert_eq!(fx.run(&flow_packet(SRC_PORT, payload)), XDP_PASS);
        }
        let r = fx.record(id);
        assert_eq!(
            (r.heartbeats, r.samples, r.lost, r.source),
            (3, 2, 0, SOURCE_FLOW)
        );
        // Another source port of the same host is another flow, reported for admission.
        assert_eq!(fx.run(&flow_packet(SRC_PORT + 1, b"x")), XDP_PASS);
        let reports = fx.unknown_reports();
        assert_eq!(reports.len(), 1, "{hook:?}");
        assert_eq!(
            (
                reports[0].peer_id,
                reports[0].source,
                reports[0].dst_port,
                reports[0].src_port
            ),
            (
                passive::flow_peer_id(v4_words(), SRC_PORT + 1),
                SOURCE_FLOW,
                FLOW_PORT,
                SRC_PORT + 1
            )
        );
        let c = fx.counters();
        assert_eq!(
            (c.flow, c.unknown_peer, c.heartbeats),
            (3, 1, 0),
            "{hook:?}"
        );
        // A heartbeat to the heartbeat port is still a heartbeat, and a port 0 datagram (an
        // unused entry is 0) is nobody's.
        assert_eq!(fx.run(&flow_packet_to(0)), XDP_PASS);
        assert_eq!(fx.counters().not_heartbeat, 1);
    }
}

fn flow_packet_to(port: u16) -> Vec<u8> {
    let mut p = Packet::heartbeat_v4(1, 1);
    p.dst_port = port;
    p.payload = b"x".to_vec();
    p.build()
}
