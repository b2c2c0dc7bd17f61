//! The agent's logic with no kernel: its peer table and index over anonymous memory
//! (`PeerTable::anonymous`, `PeerIndex::anonymous`) and a program that only counts.

use std::net::IpAddr;

use monitor_common::{
    maps::{FAMILY_IPV4, UnknownPeerReport},
    passive::SOURCE_HEARTBEAT,
};
use serde_json::Value;

use super::{Agent, AgentParts, ProgramStats};
use crate::{
    agent::admission::{AdmissionPolicy, AdmitFrom},
    detector::{levels::Levels, model::DetectorParams, tracker::DetectorConfig},
    kernel::{
        counters::CounterTotals, peer_index::PeerIndex, peer_table::PeerTable, registry::Registry,
    },
    serving::protocol::{Request, XdpRunStats},
    serving::server::{Handler, Response},
};

/// A program that has counted a few heartbeats and never ran.
struct CountedOnly;

impl ProgramStats for CountedOnly {
    fn counters(&self) -> Result<CounterTotals, String> {
        Ok(CounterTotals {
            heartbeats: 42,
            ..CounterTotals::default()
        })
    }

    fn run_stats(&self) -> XdpRunStats {
        XdpRunStats::default()
    }
}

fn agent(capacity: u32, admission: AdmissionPolicy) -> Agent {
    Agent::new(AgentParts {
        table: PeerTable::anonymous(capacity),
        registry: Registry::new(PeerIndex::anonymous(capacity), capacity),
        program: Box::new(CountedOnly),
        detector: DetectorConfig::new(DetectorParams::DEFAULT, Levels::default()),
        iface: "test0".into(),
        mode: "none".into(),
        origin: Default::default(),
        port: 9999,
        admission,
        expire_after: None,
    })
}

fn policy(from: &[&str], per_source: u32) -> AdmissionPolicy {
    AdmissionPolicy {
        auto: true,
        from: AdmitFrom::Ranges(from.iter().map(|c| c.parse().unwrap()).collect()),
        rate_per_sec: 1_000_000,
        per_source,
    }
}

/// The kernel's report of a first heartbeat of `id` from `source`.
fn first_heartbeat(id: u64, source: &str) -> UnknownPeerReport {
    let IpAddr::V4(v4) = source.parse::<IpAddr>().unwrap() else {
        panic!("an IPv4 address")
    };
    let mut src_addr = [0u8; 16];
    src_addr[12..].copy_from_slice(&v4.octets());
    UnknownPeerReport {
        peer_id: id,
        seq: 1,
        incarnation: 1,
        src_family: FAMILY_IPV4,
        src_port: 40_000,
        src_addr,
        source: SOURCE_HEARTBEAT,
        bfd_state: 0,
        dst_port: 9999,
        discriminator: 0,
    }
}

fn reply(response: Response) -> Value {
    match response {
        Response::Reply(value) => value,
        Response::List(list) => serde_json::from_str(&list.text()).expect("a JSON line"),
        _ => panic!("not a reply"),
    }
}

fn ids(reply: &Value, key: &str) -> Vec<u64> {
    reply[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {reply}"))
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn first_heartbeats_take_slots_within_the_policy_and_shares() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 2));
    let greedy: IpAddr = "10.0.0.2".parse().unwrap();
    for id in [1, 2, 3] {
        agent.on_unknown_peer(&first_heartbeat(id, "10.0.0.2"));
    }
    // Its share is two: the third is refused, and another source is not held back.
    assert_eq!(agent.admitted_from(greedy), 2);
    agent.on_unknown_peer(&first_heartbeat(4, "192.0.2.1"));
    agent.on_unknown_peer(&first_heartbeat(5, "10.0.0.3"));
    agent.on_unknown_peer(&first_heartbeat(6, "10.0.0.4"));
    // Four slots, all taken: the next one is refused as full.
    agent.on_unknown_peer(&first_heartbeat(7, "10.0.0.5"));
    // A report of an admitted peer (the kernel had not seen its index entry yet) costs nothing.
    agent.on_unknown_peer(&first_heartbeat(1, "10.0.0.2"));
    let stats = agent.stats().unwrap();
    assert_eq!((stats.peers, stats.capacity), (4, 4));
    let a = stats.admission;
    assert_eq!(
        (a.admitted, a.per_source, a.outside_ranges, a.full),
        (4, 1, 1, 1)
    );
    let peers = ids(
        &reply(agent.handle(Request::Peers {
            addr: None,
            source: None,
        })),
        "peers",
    );
    assert_eq!(peers, [1, 2, 5, 6]);
    // Forgetting one of the greedy source's peers gives it back a share and the table a slot.
    agent.forget(2).unwrap();
    assert_eq!(agent.admitted_from(greedy), 1);
    agent.on_unknown_peer(&first_heartbeat(3, "10.0.0.2"));
    assert_eq!(agent.admitted_from(greedy), 2);
    assert_eq!(agent.stats().unwrap().admission.admitted, 5);
}

#[test]
fn without_auto_admission_a_first_heartbeat_takes_no_slot() {
    let agent = agent(
        4,
        AdmissionPolicy {
            auto: false,
            ..policy(&["10.0.0.0/8"], 0)
        },
    );
    agent.on_unknown_peer(&first_heartbeat(1, "10.0.0.2"));
    let stats = agent.stats().unwrap();
    assert_eq!((stats.peers, stats.admission.disabled), (0, 1));
    // A listed peer is admitted all the same.
    agent.admit(1).unwrap();
    assert_eq!(agent.stats().unwrap().peers, 1);
}

#[test]
fn requests_are_answered_from_the_table_and_the_trackers() {
    let agent = agent(8, policy(&["10.0.0.0/8"], 0));
    for id in [7, 3, 11] {
        agent.admit(id).unwrap();
    }
    agent.sweep(crate::kernel::clock::monotonic_ns(), false);

    let peer = reply(agent.handle(Request::Peer {
        id: 7,
        window: false,
    }));
    assert_eq!(peer["ok"], true, "{peer}");
    assert_eq!(peer["peer"]["id"], 7, "{peer}");
    let unknown = reply(agent.handle(Request::Peer {
        id: 99,
        window: false,
    }));
    assert_eq!(unknown["ok"], false, "{unknown}");

    let peers = reply(agent.handle(Request::Peers {
        addr: None,
        source: None,
    }));
    assert_eq!(ids(&peers, "peers"), [3, 7, 11], "sorted by id");

    let forgotten = reply(agent.handle(Request::Forget { id: 3 }));
    assert_eq!(forgotten, serde_json::json!({"ok": true, "forgotten": 3}));
    let again = reply(agent.handle(Request::Forget { id: 3 }));
    assert_eq!(again["ok"], false, "{again}");

    let stats = reply(agent.handle(Request::Stats));
    let stats = &stats["stats"];
    assert_eq!(
        (&stats["peers"], &stats["capacity"], &stats["iface"]),
        (&Value::from(2), &Value::from(8), &Value::from("test0"))
    );
    assert_eq!(stats["kernel"]["heartbeats"], 42, "the program's counters");

    // Nobody silent for long: no suspect at the highest level.
    let suspects = reply(agent.handle(Request::Suspects { threshold: None }));
    assert_eq!(suspects["ok"], true, "{suspects}");
    assert!(ids(&suspects, "suspects").is_empty(), "{suspects}");
}

#[test]
fn one_peer_is_answered_on_the_worker_when_nothing_is_held_and_left_to_a_thread_when_it_is() {
    let agent = agent(8, policy(&["10.0.0.0/8"], 0));
    agent.admit(7).unwrap();
    agent.sweep(crate::kernel::clock::monotonic_ns(), false);
    let request = Request::Peer {
        id: 7,
        window: false,
    };
    let fast = reply(agent.try_handle(&request).expect("nothing held"));
    let patient = reply(agent.handle(request.clone()));
    assert_eq!(fast["peer"]["id"], 7, "{fast}");
    // The same view but for what moves with the clock between the two answers.
    let without_clock = |v: &Value| {
        let mut v = v["peer"].clone();
        for key in ["silence_ms", "phi", "qos"] {
            v.as_object_mut().unwrap().remove(key);
        }
        v
    };
    assert_eq!(without_clock(&fast), without_clock(&patient));
    let unknown = reply(
        agent
            .try_handle(&Request::Peer {
                id: 99,
                window: false,
            })
            .expect("nothing held"),
    );
    assert_eq!(unknown["ok"], false, "{unknown}");
    // With the window, or with a lock held by the sweep, it is left to a blocking thread.
    assert!(
        agent
            .try_handle(&Request::Peer {
                id: 7,
                window: true
            })
            .is_none()
    );
    let held = agent.trackers.lock();
    assert!(
        agent.try_handle(&request).is_none(),
        "the trackers are held"
    );
    drop(held);
    let registry = agent.registry.write().unwrap();
    assert!(agent.try_handle(&request).is_none(), "the registry is held");
    drop(registry);
    assert!(agent.try_handle(&Request::Stats).is_none());
}

#[test]
fn the_sweep_suspects_a_silent_peer_at_every_level_and_a_held_sweep_does_not() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    agent.admit(5).unwrap();
    let now = crate::kernel::clock::monotonic_ns();
    agent.sweep(now, false);
    // Held (a stall, a link down): no new suspicion however long the silence.
    agent.sweep(now + 600_000_000_000, true);
    assert_eq!(suspected(&mut events), []);
    agent.sweep(now + 600_000_000_000, false);
    let levels = agent.detector().levels.as_slice().to_vec();
    let expected: Vec<(u64, f64)> = levels.iter().map(|&level| (5, level)).collect();
    assert_eq!(
        suspected(&mut events),
        expected,
        "one event a level, lowest first"
    );
    assert_eq!(agent.stats().unwrap().sweeps, 3);
}

/// A sweep hands a pass's events over before it lets go of the trackers, all at once: every
/// silent peer's levels, lowest first for each peer, each published once and counted once.
#[test]
fn a_sweep_publishes_every_peers_levels_in_order_once() {
    use crate::serving::event::Event;
    let peers = 300u64;
    let agent = agent(peers as u32, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    for id in 1..=peers {
        agent.admit(id).unwrap();
    }
    let now = crate::kernel::clock::monotonic_ns();
    agent.sweep(now, false);
    agent.sweep(now + 600_000_000_000, false);
    let all: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    let got: Vec<(u64, f64)> = all
        .iter()
        .filter_map(|e| match e {
            Event::Suspect(s) => Some((s.id, s.level)),
            _ => None,
        })
        .collect();
    let levels = agent.detector().levels.as_slice().to_vec();
    assert_eq!(got.len() as u64, peers * levels.len() as u64);
    for id in 1..=peers {
        let of: Vec<f64> = got.iter().filter(|e| e.0 == id).map(|e| e.1).collect();
        assert_eq!(of, levels, "peer {id}: one event a level, lowest first");
    }
    let counted = |kind| {
        agent
            .metrics
            .events
            .get_or_create(&crate::serving::metrics::KindLabel { kind })
            .get()
    };
    assert_eq!(counted("suspect"), got.len() as u64);
    assert_eq!(counted("admit"), peers);
    // Every event published once: as many as the subscriber received, the admissions and
    // the correlated silence included.
    assert_eq!(agent.stats().unwrap().events, all.len() as u64);
}

/// `publish_all` keeps the order of a batch of mixed kinds, counts each kind, and leaves the
/// batch empty for the next one.
#[test]
fn a_batch_is_published_in_order_and_counted_by_kind() {
    use crate::serving::event::Event;
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let admit = |id| Event::Admit { id, at: 1 };
    let forget = |id| Event::Forget {
        id,
        reason: "request".into(),
        at: 2,
    };
    let batch = vec![
        admit(1),
        admit(2),
        forget(1),
        admit(3),
        forget(2),
        forget(3),
    ];
    let mut pending = batch.clone();
    agent.publish_all(pending.drain(..));
    assert!(pending.is_empty());
    let got: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert_eq!(got, batch);
    for kind in ["admit", "forget"] {
        let label = crate::serving::metrics::KindLabel { kind };
        assert_eq!(
            agent.metrics.events.get_or_create(&label).get(),
            3,
            "{kind}"
        );
    }
    assert_eq!(agent.stats().unwrap().events, 6);
}

/// The suspect events waiting in `events`, as (id, level).
fn suspected(
    events: &mut tokio::sync::broadcast::Receiver<crate::serving::event::Event>,
) -> Vec<(u64, f64)> {
    suspects(events).iter().map(|s| (s.id, s.level)).collect()
}

/// The suspect events published since the last call, as (level, at, crossed_at).
fn suspicions(
    events: &mut tokio::sync::broadcast::Receiver<crate::serving::event::Event>,
) -> Vec<(f64, u64, f64)> {
    suspects(events)
        .iter()
        .map(|s| (s.level, s.at, s.crossed_at))
        .collect()
}

/// The suspect events published since the last call, whole.
fn suspects(
    events: &mut tokio::sync::broadcast::Receiver<crate::serving::event::Event>,
) -> Vec<crate::detector::tracker::Suspicion> {
    std::iter::from_fn(|| events.try_recv().ok())
        .filter_map(|e| match e {
            crate::serving::event::Event::Suspect(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// An hour: a next scan that never comes within a test.
const HOUR_NS: u64 = 3_600_000_000_000;

#[test]
fn a_deadline_before_the_next_scan_raises_its_event_at_that_deadline_not_at_the_scan() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let slot = agent.admit(5).unwrap() as usize;
    let t0 = crate::kernel::clock::monotonic_ns();
    // Twice, as scans coming early would: a slot armed twice still raises each level once.
    agent.sweep_until(t0, false, t0 + HOUR_NS);
    agent.sweep_until(t0 + 1, false, t0 + HOUR_NS);
    let deadline = |agent: &Agent| agent.trackers.lock().watches[slot].deadline_ns;
    let levels = agent.detector().levels.as_slice().to_vec();
    for &level in &levels {
        let due = deadline(&agent);
        assert!(due > t0 && due < t0 + HOUR_NS, "level {level} due at {due}");
        assert_eq!(
            agent.next_due_ns(),
            Some(due.div_ceil(super::due_soon::DUE_TICK_NS) * super::due_soon::DUE_TICK_NS),
            "the sweeper wakes for it"
        );
        agent.run_due(due - 1, false);
        assert_eq!(suspicions(&mut events), [], "not before its deadline");
        // On the virtual clock the pass runs at the deadline itself: the event's crossing is
        // its detection, to the wall clock's resolution.
        agent.run_due(due, false);
        let raised = suspicions(&mut events);
        assert_eq!(raised.len(), 1, "level {level}: {raised:?}");
        let (raised_level, at, crossed_at) = raised[0];
        assert_eq!(raised_level, level);
        assert_eq!(at as f64, crossed_at.floor(), "raised as it crossed");
    }
    assert_eq!(deadline(&agent), u64::MAX, "every level crossed");
    assert_eq!(agent.next_due_ns(), None, "nothing left armed");
    // No scan ran after the first two: the due passes raised every level.
    assert_eq!(agent.stats().unwrap().sweeps, 2);
}

/// Many peers due at once (a mass failure): one due pass raises each of them, handing the
/// events over a few hundred at a time, and leaves nothing due behind.
#[test]
fn a_due_pass_over_more_peers_than_a_handover_raises_each_once() {
    let peers = 3 * super::sweep::HANDOVER_EVENTS as u64 + 7;
    let agent = agent(peers as u32, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let slots: Vec<usize> = (1..=peers)
        .map(|id| agent.admit(id).unwrap() as usize)
        .collect();
    let t0 = crate::kernel::clock::monotonic_ns();
    agent.sweep_until(t0, false, t0 + HOUR_NS);
    let due = {
        let trackers = agent.trackers.lock();
        slots
            .iter()
            .map(|&slot| trackers.watches[slot].deadline_ns)
            .max()
            .unwrap()
    };
    assert!(due < t0 + HOUR_NS, "every first level armed");
    agent.run_due(due, false);
    let mut raised: Vec<(u64, f64)> = suspected(&mut events);
    let lowest = agent.detector().levels.as_slice()[0];
    assert!(
        raised.iter().all(|&(_, level)| level == lowest),
        "{raised:?}"
    );
    raised.sort_by_key(|&(id, _)| id);
    let ids: Vec<u64> = raised.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, (1..=peers).collect::<Vec<_>>(), "each peer once");
    assert!(
        agent.next_due_ns().is_none_or(|next| next > due),
        "nothing due by then left armed"
    );
}

#[test]
fn a_held_due_pass_raises_nothing_and_leaves_the_deadline_to_the_scan() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let slot = agent.admit(5).unwrap() as usize;
    let t0 = crate::kernel::clock::monotonic_ns();
    agent.sweep_until(t0, false, t0 + HOUR_NS);
    let due = agent.trackers.lock().watches[slot].deadline_ns;
    agent.run_due(due, true);
    assert_eq!(suspicions(&mut events), [], "held");
    assert_eq!(
        agent.next_due_ns(),
        None,
        "not armed again: no spinning on a hold"
    );
    // The scan after the hold raises it, late.
    agent.sweep_until(due + 1_000_000, false, due + 2_000_000);
    let raised = suspicions(&mut events);
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert!(raised[0].1 as f64 >= raised[0].2, "{raised:?}");
}

#[test]
fn a_peer_admitted_on_its_first_packet_is_looked_at_without_waiting_for_the_scan() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    agent.on_unknown_peer(&first_heartbeat(1, "10.0.0.2"));
    assert_eq!(agent.next_due_ns(), Some(0), "armed for now");
    let now = crate::kernel::clock::monotonic_ns();
    agent.run_due(now, false);
    let trackers = agent.trackers.lock();
    assert!(
        trackers.of(0, 1).is_some(),
        "its tracker made by the due pass"
    );
    assert!(trackers.watches[0].deadline_ns > now);
    drop(trackers);
    assert_eq!(agent.stats().unwrap().sweeps, 0);
}

#[test]
fn a_detector_change_raises_only_the_levels_a_peer_is_newly_past() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    agent.admit(5).unwrap();
    let now = crate::kernel::clock::monotonic_ns();
    agent.sweep(now, false);
    let later = now + 600_000_000_000;
    agent.sweep(later, false);
    assert_eq!(suspected(&mut events), [(5, 1.0), (5, 3.0), (5, 8.0)]);
    let at = |now_ns| {
        move || crate::detector::tracker::SweepTime {
            now_ns,
            wall_ms: 0.0,
            hold: false,
        }
    };

    // A level above the others, which ten minutes of silence are past: raised once, alone.
    let wider = Levels::new(vec![1.0, 3.0, 8.0, 12.0]).unwrap();
    agent.set_detector_at(DetectorParams::DEFAULT, wider, at(later));
    assert_eq!(suspected(&mut events), [(5, 12.0)]);
    assert_eq!(agent.detector().levels.as_slice(), [1.0, 3.0, 8.0, 12.0]);
    // Levels taken away raise nothing, and neither does the next sweep: the peer is past them all.
    let narrower = Levels::new(vec![1.0, 3.0]).unwrap();
    agent.set_detector_at(DetectorParams::DEFAULT, narrower, at(later));
    agent.sweep(later + 1_000_000_000, false);
    assert_eq!(suspected(&mut events), []);
    let scrape = crate::serving::metrics::Source::scrape(&agent, &Default::default());
    assert_eq!(scrape.peers_at, [0, 0, 1], "past the new highest level");
}

/// A suspicion that begins in the same look as the recovery that ended the last one (the told
/// heartbeat lost to a full ring, so the scan saw it, already old) asks to be told again: the
/// kernel cleared the bit when it told of that heartbeat.
#[test]
fn a_suspicion_raised_in_the_look_that_saw_a_recovery_asks_to_be_told_again() {
    use crate::serving::event::Event;
    use monitor_common::maps::TELL_HEARD;
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let slot = agent.admit(5).unwrap();
    let xdp = agent.detector().params.window_config();
    let t0 = crate::kernel::clock::monotonic_ns();
    agent.sweep(t0, false);
    agent.sweep(t0 + 10_000_000_000, false);
    assert_eq!(suspected(&mut events).len(), 3);
    assert_eq!(agent.table.record(slot).map(|r| r.tell), Some(TELL_HEARD));
    // Heard; the kernel's record of it never reaches the agent.
    let told = agent.table.arrive(slot, t0 + 10_001_000_000, 1, &xdp);
    assert!(told.is_some());
    assert_eq!(agent.table.record(slot).map(|r| r.tell), Some(0));
    // The scan ten seconds later sees the heartbeat and the silence after it.
    agent.sweep(t0 + 20_000_000_000, false);
    let seen: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(matches!(seen.first(), Some(Event::Recover(_))), "{seen:?}");
    assert_eq!(seen.len(), 4, "recovered, then every level again: {seen:?}");
    assert_eq!(agent.table.record(slot).map(|r| r.tell), Some(TELL_HEARD));
}

/// A detector change that suspects a peer asks the kernel for its next heartbeat, as a sweep
/// that suspects it does: its recovery does not wait for the next scan either.
#[test]
fn a_detector_change_that_suspects_a_peer_asks_to_be_told_its_next_heartbeat() {
    let agent = agent(4, policy(&["10.0.0.0/8"], 0));
    let mut events = agent.subscribe();
    let slot = agent.admit(5).unwrap();
    let now = crate::kernel::clock::monotonic_ns();
    // 100 ms into its silence, with a first interval of 100 ms: phi about 0.3, below level 1.
    agent.sweep(now + 100_000_000, false);
    assert_eq!(suspected(&mut events), []);
    assert_eq!(agent.table.record(slot).map(|r| r.tell), Some(0));
    let lower = Levels::new(vec![0.2, 1.0, 3.0]).unwrap();
    agent.set_detector_at(DetectorParams::DEFAULT, lower, move || {
        crate::detector::tracker::SweepTime {
            now_ns: now + 100_000_000,
            wall_ms: 0.0,
            hold: false,
        }
    });
    assert_eq!(suspected(&mut events), [(5, 0.2)]);
    assert_eq!(
        agent.table.record(slot).map(|r| r.tell),
        Some(monitor_common::maps::TELL_HEARD)
    );
}

#[test]
fn a_scrape_counts_peers_by_level_and_selects_the_asked_for_first() {
    use crate::serving::metrics::{PeerSeries, Source};
    let agent = agent(8, policy(&["10.0.0.0/8"], 0));
    for id in [3, 5, 9] {
        agent.admit(id).unwrap();
    }
    let now = crate::kernel::clock::monotonic_ns();
    agent.sweep(now, false);
    let scrape = agent.scrape(&PeerSeries {
        ids: vec![9, 42],
        top: 0,
    });
    assert_eq!(scrape.levels, [1.0, 3.0, 8.0]);
    assert_eq!(scrape.peers_at, [3, 0, 0, 0], "nobody silent yet");
    let selected: Vec<u64> = scrape.selected.iter().map(|p| p.id).collect();
    assert_eq!(selected, [9], "an id the agent does not watch is left out");
    assert_eq!(scrape.stats.expect("stats").kernel.heartbeats, 42);

    agent.sweep(now + 600_000_000_000, false);
    let scrape = agent.scrape(&PeerSeries {
        ids: vec![9],
        top: 2,
    });
    assert_eq!(scrape.peers_at, [0, 0, 0, 3], "every peer past every level");
    // Silent longest, or tied and lowest id: 3, then 5.
    let selected: Vec<u64> = scrape.selected.iter().map(|p| p.id).collect();
    assert_eq!(selected, [9, 3, 5], "the asked-for peer, then the top two");
    assert!(scrape.selected.iter().all(|p| p.level == 8.0));
}

/// A measurement, not a test (ignored; it asserts nothing about time): a sweep raising every
/// level of `BURST_N` (2,000) silent peers at once, published to one subscriber over the
/// socket server; prints the sweep's own time and the time from its start to the last suspect
/// line read (stamped at the read), over `BURST_ROUNDS` (20) rounds. docs/tuning.md, "Events
/// at their deadline":
/// `cargo test --release -p monitor --lib burst_delivery_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn burst_delivery_timing() {
    use std::io::{Read, Write};
    let n: u64 = std::env::var("BURST_N").map_or(2000, |v| v.parse().unwrap());
    let rounds: usize = std::env::var("BURST_ROUNDS").map_or(20, |v| v.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut sweeps = Vec::new();
    let mut lasts = Vec::new();
    for round in 0..rounds {
        let agent = std::sync::Arc::new(agent(n as u32, policy(&["10.0.0.0/8"], 0)));
        for id in 1..=n {
            agent.admit(id).unwrap();
        }
        let now = crate::kernel::clock::monotonic_ns();
        agent.sweep(now, false);
        let path = std::env::temp_dir().join(format!(
            "delivery-burst-{}-{round}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = {
            let _in = runtime.enter();
            tokio::net::UnixListener::bind(&path).unwrap()
        };
        let server = runtime.spawn(crate::serving::server::serve(
            listener,
            agent.clone(),
            crate::serving::access::AccessPolicy::current(None),
            crate::serving::limits::Limits::default(),
        ));
        let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
        stream.write_all(b"{\"op\":\"subscribe\"}\n").unwrap();
        let mut byte = [0u8; 1];
        while byte[0] != b'\n' {
            stream.read_exact(&mut byte).unwrap();
        }
        let expected = 3 * n as usize;
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            let mut carry: Vec<u8> = Vec::new();
            let mut seen = 0;
            let mut last = std::time::Instant::now();
            while seen < expected {
                let got = stream.read(&mut buf).unwrap();
                assert!(got > 0);
                last = std::time::Instant::now();
                carry.extend_from_slice(&buf[..got]);
                let mut start = 0;
                while let Some(nl) = carry[start..].iter().position(|&b| b == b'\n') {
                    if carry[start..].starts_with(b"{\"event\":\"suspect\"") {
                        seen += 1;
                    }
                    start += nl + 1;
                }
                carry.drain(..start);
            }
            last
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t0 = std::time::Instant::now();
        agent.sweep(now + 600_000_000_000, false);
        sweeps.push(t0.elapsed().as_secs_f64() * 1e3);
        let last = reader.join().unwrap();
        lasts.push((last - t0).as_secs_f64() * 1e3);
        server.abort();
        let _ = std::fs::remove_file(&path);
    }
    let show = |name: &str, mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        eprintln!(
            "{name}: min {:.3} p50 {:.3} max {:.3} ms",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    };
    eprintln!(
        "{} suspect events a round ({n} peers x 3 levels), {rounds} rounds",
        3 * n
    );
    show("sweep (raise and publish)", sweeps);
    show("sweep start to last line read", lasts);
}

/// Peers sending every 10 ms, watched as `monitor --min-std-ms 2 --first-interval-ms 10`
/// watches them, on a virtual clock that keeps the sweeper's own schedule: a scan every
/// 50 ms (the default `--sweep-interval`) at `phase_ns` into the first, and between scans a
/// due pass at each wake the agent asks for (`next_due_ns`). Heartbeats are recorded as the
/// kernel records them (`PeerTable::arrive`).
struct TenMs {
    agent: Agent,
    xdp: monitor_common::config::XdpConfig,
    slots: Vec<u32>,
    /// Each peer's schedule (a send every 10 ms), and when its next heartbeat arrives (the
    /// schedule, late by what the run is told); None once it stopped.
    scheduled: Vec<u64>,
    arrives: Vec<Option<u64>>,
    seq: Vec<u64>,
    next_scan_ns: u64,
    now_ns: u64,
}

const SCAN_NS: u64 = 50_000_000;
const TEN_MS: u64 = 10_000_000;

impl TenMs {
    fn new(peers: u64, phase_ns: u64) -> Self {
        let params = DetectorParams {
            min_std_ms: 2.0,
            first_interval_ms: 10.0,
            ..DetectorParams::DEFAULT
        };
        let agent = Agent::new(AgentParts {
            table: PeerTable::anonymous(peers as u32),
            registry: Registry::new(PeerIndex::anonymous(peers as u32), peers as u32),
            program: Box::new(CountedOnly),
            detector: DetectorConfig::new(params.clone(), Levels::default()),
            iface: "test0".into(),
            mode: "none".into(),
            origin: Default::default(),
            port: 9999,
            admission: policy(&["10.0.0.0/8"], 0),
            expire_after: None,
        });
        let slots: Vec<u32> = (1..=peers).map(|id| agent.admit(id).unwrap()).collect();
        let now_ns = crate::kernel::clock::monotonic_ns();
        // The peers' schedules spread over one interval, as independent senders' are.
        let scheduled: Vec<u64> = (0..peers)
            .map(|i| now_ns + 1 + i * TEN_MS / peers)
            .collect();
        Self {
            xdp: params.window_config(),
            agent,
            slots,
            arrives: scheduled.iter().map(|&at| Some(at)).collect(),
            scheduled,
            seq: vec![0; peers as usize],
            next_scan_ns: now_ns + phase_ns,
            now_ns,
        }
    }

    /// Runs the clock to `until_ns`: heartbeats (each `late(peer, seq)` ns after its
    /// schedule), due passes and scans in the order of their times.
    fn run(&mut self, until_ns: u64, late: &mut impl FnMut(usize, u64) -> u64) {
        loop {
            let arrival = (self.arrives.iter().enumerate())
                .filter_map(|(peer, at)| at.map(|at| (at, peer)))
                .min();
            let due = self.agent.next_due_ns().unwrap_or(u64::MAX);
            // An arm for now (a told heartbeat) is taken at once, not in the past.
            let due = due.max(self.now_ns);
            let t = arrival
                .map_or(u64::MAX, |a| a.0)
                .min(due)
                .min(self.next_scan_ns);
            if t > until_ns {
                self.now_ns = until_ns;
                return;
            }
            self.now_ns = t;
            match arrival {
                Some((at, peer)) if at == t => {
                    self.seq[peer] += 1;
                    let seq = self.seq[peer];
                    if let Some(told) = self.agent.table.arrive(self.slots[peer], t, seq, &self.xdp)
                    {
                        self.agent.on_arrival(told);
                    }
                    self.scheduled[peer] += TEN_MS;
                    // A sender held up sends the rest late too, in order.
                    let next = self.scheduled[peer] + late(peer, seq + 1);
                    self.arrives[peer] = Some(next.max(t + 1));
                }
                _ if due == t => self.agent.run_due(t, false),
                _ => {
                    self.agent.run_due(t, false);
                    self.agent.sweep_until(t, false, t + SCAN_NS);
                    self.next_scan_ns += SCAN_NS;
                }
            }
        }
    }

    /// Stops the peers `which` (their last heartbeats are the ones already recorded).
    fn stop(&mut self, which: impl IntoIterator<Item = usize>) {
        for peer in which {
            self.arrives[peer] = None;
        }
    }
}

/// Runs 20 peers at 10 ms for 3 s (full windows, floors renewed many times over) with the
/// scans at `phase_ms` into the heartbeats' schedule, each heartbeat `late` after its schedule;
/// then stops every other one (ids 1, 3, ...). Returns the suspicions raised before the stop
/// and those raised in the 200 ms after it; every stopped peer is convicted by then.
fn stop_half_of_twenty(
    phase_ms: u64,
    late: &mut impl FnMut(usize, u64) -> u64,
) -> (usize, Vec<crate::detector::tracker::Suspicion>) {
    let peers = 20u64;
    let mut run = TenMs::new(peers, phase_ms * 1_000_000 + 123_457);
    let mut events = run.agent.subscribe();
    let start = run.now_ns;
    run.run(start + 3_000_000_000, late);
    let before = suspects(&mut events).len();
    let stopped_at = run.now_ns;
    run.stop((0..peers as usize).step_by(2));
    run.run(stopped_at + 200_000_000, late);
    let trackers = run.agent.trackers.lock();
    for peer in (0..peers as usize).step_by(2) {
        let crossed = trackers.peers[run.slots[peer] as usize]
            .as_ref()
            .map(|t| t.crossed());
        assert_eq!(
            crossed,
            Some(3),
            "phase {phase_ms} ms: peer {} convicted",
            peer + 1
        );
    }
    drop(trackers);
    (before, suspects(&mut events))
}

/// Asserts that the stopped peers' (odd ids) levels were raised once each after the stop
/// (`all`: every one of the three; else those not already raised before it), each at its
/// deadline: `at` is the wall clock's ms, `crossed_at` the same less the lateness, so under a
/// millisecond apart when the pass ran at the deadline (a tick late at most).
fn assert_raised_at_their_deadlines(
    phase_ms: u64,
    after: &[crate::detector::tracker::Suspicion],
    all: bool,
) {
    let stopped: Vec<_> = after.iter().filter(|s| s.id % 2 == 1).collect();
    let mut pairs: Vec<(u64, u64)> = stopped.iter().map(|s| (s.id, s.level as u64)).collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(
        pairs.len(),
        stopped.len(),
        "phase {phase_ms} ms: {stopped:?}"
    );
    if all {
        assert_eq!(pairs.len(), 30, "phase {phase_ms} ms: {stopped:?}");
    }
    for s in stopped {
        assert!(
            s.at as f64 - s.crossed_at < 1.0,
            "phase {phase_ms} ms: peer {} level {} raised {:.1} ms after its crossing, {:.1} ms into its silence",
            s.id,
            s.level,
            s.at as f64 - s.crossed_at,
            s.silence_ms
        );
    }
}

/// A peer that stops is suspected at each level at that level's deadline, whatever the phase
/// of the scans against the heartbeats: 10 ms heartbeats are convicted (level 8) about 21 ms
/// into their silence, where the scan alone would find them up to 50 ms later. On a clean
/// path (each heartbeat up to 2 ms late) no live peer is suspected.
#[test]
fn ten_ms_heartbeats_are_suspected_at_their_deadlines_at_every_phase() {
    for phase_ms in 0..50u64 {
        let mut rng = fastrand::Rng::with_seed(phase_ms);
        let (before, after) = stop_half_of_twenty(phase_ms, &mut |_, _| rng.u64(0..2_000_000));
        assert_eq!(before, 0, "phase {phase_ms} ms: a live peer suspected");
        assert!(
            after.iter().all(|s| s.id % 2 == 1),
            "phase {phase_ms} ms: a live peer suspected: {after:?}"
        );
        assert_raised_at_their_deadlines(phase_ms, &after, true);
    }
}

/// The same with a path that holds one heartbeat in 50 up to 30 ms (and the sender's next
/// ones behind it): live peers are suspected, even convicted, and heard again, some just
/// before they stop. A peer past its last level has no deadline left to be looked at again,
/// so before the kernel told its next heartbeat (`TELL_HEARD`) the agent saw it heard again
/// only at the next scan, and a peer that stopped in between had its levels raised there, up
/// to 20 ms late (3 of these 50 phases).
#[test]
fn peers_suspected_and_heard_again_are_suspected_at_their_deadlines_when_they_stop() {
    for phase_ms in 0..50u64 {
        let mut rng = fastrand::Rng::with_seed(phase_ms);
        let mut late = |_: usize, _: u64| {
            let held = if rng.u32(0..50) == 0 {
                rng.u64(0..30_000_000)
            } else {
                0
            };
            rng.u64(0..2_000_000) + held
        };
        let (before, after) = stop_half_of_twenty(phase_ms, &mut late);
        assert!(
            before > 0,
            "phase {phase_ms} ms: the held heartbeats suspected no peer"
        );
        // A peer suspected by a held heartbeat just before it stopped may have had a level
        // raised before the stop, and not raised again.
        assert_raised_at_their_deadlines(phase_ms, &after, false);
    }
}

/// A convicted peer heard again is looked at when the kernel tells its heartbeat, not at the
/// next scan (an hour away here): its recovery is published at once, and its next silence is
/// raised at its deadline.
#[test]
fn a_convicted_peer_heard_again_is_looked_at_when_the_kernel_tells_it() {
    use crate::serving::event::Event;
    let mut run = TenMs::new(1, 0);
    let mut events = run.agent.subscribe();
    let t0 = run.now_ns;
    run.agent.sweep_until(t0, false, t0 + HOUR_NS);
    run.next_scan_ns = u64::MAX;
    // Silent since its admission: convicted by the due passes.
    run.stop([0]);
    run.run(t0 + 100_000_000, &mut |_, _| 0);
    let levels = suspicions(&mut events);
    assert_eq!(levels.len(), 3, "{levels:?}");
    let slot = run.slots[0];
    assert_eq!(
        run.agent.table.record(slot).map(|r| r.tell),
        Some(monitor_common::maps::TELL_HEARD),
        "the kernel is asked to tell its next heartbeat"
    );
    assert_eq!(
        run.agent.next_due_ns(),
        None,
        "nothing armed: no deadline left"
    );
    // Heard again: the told arrival arms the slot for now, and the pass that takes it, at the
    // same time on this clock, raises the recovery.
    let heard_at = t0 + 100_000_000;
    run.scheduled[0] = heard_at;
    run.arrives[0] = Some(heard_at);
    run.run(heard_at, &mut |_, _| 0);
    let recovered: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(
        matches!(recovered.as_slice(), [Event::Recover(r)] if r.id == 1),
        "{recovered:?}"
    );
    assert_eq!(
        run.agent.table.record(slot).map(|r| r.tell),
        Some(0),
        "told once"
    );
    // It stops again after one more heartbeat: its levels come at their deadlines.
    run.run(heard_at + TEN_MS, &mut |_, _| 0);
    run.stop([0]);
    run.run(heard_at + 200_000_000, &mut |_, _| 0);
    let again = suspicions(&mut events);
    assert_eq!(again.len(), 3, "{again:?}");
    for (level, at, crossed_at) in again {
        assert!(
            at as f64 - crossed_at < 1.0,
            "level {level}: {at} against {crossed_at}"
        );
    }
}
