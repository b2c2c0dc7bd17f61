//! The tracker against an eager reader, on generated streams and hand-made slots.

use super::*;
use crate::detector::{levels::Levels, model::Model};

const MS: u64 = 1_000_000;

/// A tracker with its watch and level floor, as the agent keeps them.
#[derive(Clone)]
struct Tracked {
    t: PeerTracker,
    watch: WordWatch,
    level_floor: LevelFloor,
}

impl Tracked {
    fn new(record: &PeerRecord, cfg: &DetectorConfig) -> Self {
        let (t, watch, level_floor) = PeerTracker::new(record, &[], cfg);
        Self {
            t,
            watch,
            level_floor,
        }
    }

    fn observe(
        &mut self,
        record: &PeerRecord,
        ring: &[u32],
        cfg: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) {
        self.t.observe(
            record,
            ring,
            &mut self.watch,
            &mut self.level_floor,
            cfg,
            time,
            emit,
        );
    }

    /// A sweep from the slot's word: the quiet check, then the tracker's step.
    fn step(
        &mut self,
        word: u64,
        cfg: &DetectorConfig,
        time: SweepTime,
        emit: &mut impl FnMut(Transition),
    ) -> SweepStep {
        if self.watch.is_quiet(word, time.now_ns) {
            return SweepStep::Done;
        }
        self.t.step(
            word,
            &mut self.watch,
            &mut self.level_floor,
            cfg,
            time,
            emit,
        )
    }

    fn qos(&self, now_ns: u64) -> QosReport {
        self.t.qos(now_ns)
    }
}

/// A sender every 100-120 ms, each heartbeat 0-5 ms late, 2% lost, a silence of 1-3 s
/// every 500 heartbeats or so, and a restart (its interval left out of the window, however
/// short) every 700 or so, recorded by `slot::arrive` as the kernel would, with the
/// last-heard word the kernel would store.
struct Stream {
    rng: fastrand::Rng,
    slot: monitor_common::maps::PeerSlot,
    xdp: monitor_common::config::XdpConfig,
    word: u64,
    next_send: u64,
    seq: u64,
    incarnation: u32,
    /// Its own, so that the rest of the stream is as it was without restarts.
    restarts: fastrand::Rng,
}

impl Stream {
    fn new(seed: u64, xdp: monitor_common::config::XdpConfig) -> Self {
        Self {
            rng: fastrand::Rng::with_seed(seed),
            slot: monitor_common::maps::PeerSlot::admitted(5, 0),
            xdp,
            word: last_heard::word(0, 0),
            next_send: 100 * MS,
            seq: 0,
            incarnation: 1,
            restarts: fastrand::Rng::with_seed(seed + 1),
        }
    }

    /// Every heartbeat sent up to `now_ns`.
    fn until(&mut self, now_ns: u64) {
        let rng = &mut self.rng;
        while self.next_send <= now_ns {
            self.seq += 1;
            if self.restarts.u16(0..700) == 0 {
                (self.incarnation, self.seq) = (self.incarnation + 1, 1);
            }
            let lost = rng.u8(0..50) == 0;
            if !lost {
                let at = self.next_send + rng.u64(0..5 * MS);
                if let monitor_common::slot::Outcome::Accepted { .. } = monitor_common::slot::arrive(
                    &mut self.slot,
                    at,
                    self.seq,
                    self.incarnation,
                    &self.xdp,
                ) {
                    self.word = last_heard::of_hot(&self.slot.hot);
                }
            }
            self.next_send += if rng.u16(0..500) == 0 {
                rng.u64(1000..3000) * MS
            } else {
                100 * MS + rng.u64(0..20 * MS)
            };
        }
    }
}

/// The models whose sweep keeps floors, each with levels 1, 3 and 8 and its window rules.
fn models_with_floors() -> Vec<(Model, DetectorConfig, monitor_common::config::XdpConfig)> {
    [Model::Normal, Model::Loss, Model::Exponential, Model::Akka]
        .into_iter()
        .map(|model| {
            let params = DetectorParams {
                model,
                ..DetectorParams::DEFAULT
            };
            let xdp = params.window_config();
            let levels = Levels::new(vec![1.0, 3.0, 8.0]).unwrap();
            (model, DetectorConfig::new(params, levels), xdp)
        })
        .collect()
}

fn at(now_ns: u64, wall_ms: f64, hold: bool) -> SweepTime {
    SweepTime {
        now_ns,
        wall_ms,
        hold,
    }
}

/// The default detector with levels 1, 3 and 8, and its window rules.
fn defaults() -> (DetectorConfig, monitor_common::config::XdpConfig) {
    let params = DetectorParams::DEFAULT;
    let xdp = params.window_config();
    let levels = Levels::new(vec![1.0, 3.0, 8.0]).unwrap();
    (DetectorConfig::new(params, levels), xdp)
}

fn config() -> DetectorConfig {
    let params = DetectorParams {
        model: Model::Fixed,
        timeout_ms: 100.0,
        ..DetectorParams::DEFAULT
    };
    DetectorConfig::new(params, Levels::new(vec![1.0, 3.0]).unwrap())
}

fn heard(record: &mut PeerRecord, at_ns: u64) {
    record.heartbeats += 1;
    record.last_arrival_ns = at_ns;
}

#[test]
fn suspects_in_level_order_then_recovers() {
    let cfg = DetectorConfig::new(
        DetectorParams {
            model: Model::Exponential,
            first_interval_ms: 100.0,
            ..DetectorParams::DEFAULT
        },
        Levels::new(vec![1.0, 3.0, 8.0]).unwrap(),
    );
    let mut record = PeerRecord::admitted(9, 1000 * MS);
    let mut t = Tracked::new(&record, &cfg);
    let mut events = Vec::new();
    // Bootstrap mean 100 ms: exponential crossings at 230, 691, 1842 ms of silence.
    t.observe(&record, &[], &cfg, at(1200 * MS, 0.0, false), &mut |e| {
        events.push(e)
    });
    assert!(events.is_empty());
    t.observe(&record, &[], &cfg, at(3000 * MS, 0.0, false), &mut |e| {
        events.push(e)
    });
    let levels: Vec<f64> = events
        .iter()
        .map(|e| match e {
            Transition::Suspect(Suspicion {
                level,
                phi,
                crossed_at,
                ..
            }) => {
                assert!(phi >= level);
                // Crossing at 1000 ms + level * 100 ln 10 ms, seen at 3000 ms, wall 0.
                let expected = 1000.0 + level * 100.0 * std::f64::consts::LN_10 - 3000.0;
                assert!(
                    (crossed_at - expected).abs() < 1e-3,
                    "{crossed_at} vs {expected}"
                );
                *level
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        levels,
        vec![1.0, 3.0, 8.0],
        "all crossed levels, lowest first"
    );
    events.clear();
    heard(&mut record, 3100 * MS);
    t.observe(&record, &[], &cfg, at(3100 * MS, 0.0, false), &mut |e| {
        events.push(e)
    });
    assert_eq!(
        events,
        vec![Transition::Recover(Recovery {
            id: 9,
            level: 8.0,
            silence_ms: 2100.0,
            at: 0
        })]
    );
    let q = t.qos(3100 * MS);
    assert_eq!((q.s_transitions, q.mistakes), (1, 1));
}

#[test]
fn a_stall_holds_suspicions_but_not_recoveries() {
    let cfg = config();
    let mut record = PeerRecord::admitted(1, 0);
    let mut t = Tracked::new(&record, &cfg);
    let mut events = Vec::new();
    t.observe(&record, &[], &cfg, at(500 * MS, 0.0, true), &mut |e| {
        events.push(e)
    });
    assert!(events.is_empty(), "held");
    t.observe(&record, &[], &cfg, at(510 * MS, 0.0, false), &mut |e| {
        events.push(e)
    });
    assert_eq!(events.len(), 2);
    events.clear();
    heard(&mut record, 520 * MS);
    t.observe(&record, &[], &cfg, at(520 * MS, 0.0, true), &mut |e| {
        events.push(e)
    });
    assert!(matches!(events[..], [Transition::Recover(_)]));
}

#[test]
fn no_repeat_events_while_silence_continues() {
    let cfg = config();
    let record = PeerRecord::admitted(1, 0);
    let mut t = Tracked::new(&record, &cfg);
    let mut n = 0;
    for ms in (0..2000).step_by(50) {
        t.observe(&record, &[], &cfg, at(ms * MS, 0.0, false), &mut |_| n += 1);
    }
    assert_eq!(n, 2);
}

/// The lazy sweep (last-heard words, estimates refreshed only when asked) raises exactly
/// the events of a tracker that reads the slot at every sweep, on a stream with jitter,
/// losses, late heartbeats, silences past every level and recoveries; and it reads the
/// slot far less often.
#[test]
fn the_lazy_sweep_raises_what_reading_every_sweep_raises() {
    for (model, cfg, xdp) in models_with_floors() {
        let mut stream = Stream::new(11, xdp);
        let (mut eager_events, mut lazy_events) = (Vec::new(), Vec::new());
        let mut eager = Tracked::new(&stream.slot.record(), &cfg);
        let mut lazy = eager.clone();
        let mut reads = 0;
        let sweeps = 60_000u64;
        for step in 1..=sweeps {
            let now = step * 10 * MS;
            stream.until(now);
            let (record, word) = (&stream.slot.record(), stream.word);
            let time = at(now, now as f64 / 1e6, false);
            eager.observe(record, &[], &cfg, time, &mut |e| eager_events.push(e));
            if lazy.step(word, &cfg, time, &mut |e| lazy_events.push(e)) == SweepStep::Refresh {
                reads += 1;
                lazy.observe(record, &[], &cfg, time, &mut |e| lazy_events.push(e));
            }
        }
        assert!(
            eager_events
                .iter()
                .filter(|e| matches!(e, Transition::Suspect(_)))
                .count()
                > 20,
            "{model:?}: the stream crossed levels"
        );
        assert_eq!(lazy_events, eager_events, "{model:?}");
        let heartbeats = stream.slot.record().heartbeats;
        // 211 of 5209 with refloors, 449 without (for normal).
        assert!(
            reads * 16 < heartbeats,
            "{model:?}: {reads} slot reads for {heartbeats} heartbeats"
        );
    }
}

/// A detector set live (SIGHUP) raises, from then on, exactly what a tracker that had it
/// all along raises; at the switch it raises the levels the peer is now past and was not
/// before, and nothing else. For each model with floors, from the default to a lower
/// deviation floor, a pause and another first interval (the same window rules), switched
/// in the middle of a silence, where the two detectors disagree on the levels passed.
#[test]
fn a_detector_set_live_raises_what_it_would_have_raised_all_along() {
    let mut raised_at_switches = 0;
    for (model, old, xdp) in models_with_floors() {
        let new = DetectorConfig::new(
            DetectorParams {
                min_std_ms: 5.0,
                pause_ms: 20.0,
                first_interval_ms: 110.0,
                ..old.params.clone()
            },
            old.levels.clone(),
        );
        assert_eq!(new.params.window_config(), xdp);
        let mut stream = Stream::new(13, xdp);
        let mut live = Tracked::new(&stream.slot.record(), &old);
        let mut all_along = Tracked::new(&stream.slot.record(), &new);
        let (mut live_events, mut all_along_events) = (Vec::new(), Vec::new());
        let mut switched = None;
        for step in 1..=60_000u64 {
            let now = step * 10 * MS;
            stream.until(now);
            let (record, word) = (&stream.slot.record(), stream.word);
            let time = at(now, now as f64 / 1e6, false);
            let silent = now.saturating_sub(record.last_arrival_ns) >= 300 * MS;
            if switched.is_none() && step >= 20_000 && silent {
                let (before, mut raised) = (live.t.crossed, Vec::new());
                live.t.redetect(
                    Some((record, &[])),
                    &mut live.watch,
                    &mut live.level_floor,
                    &old,
                    &new,
                    time,
                    &mut |e| raised.push(e),
                );
                // Only the levels past now and not before, lowest first.
                for (n, e) in raised.iter().enumerate() {
                    let Transition::Suspect(s) = e else {
                        panic!("{model:?}: {e:?} at the switch")
                    };
                    assert_eq!(s.level, new.levels.as_slice()[before as usize + n]);
                }
                raised_at_switches += raised.len();
                switched = Some(step);
            }
            let cfg = if switched.is_some() { &new } else { &old };
            let sink = if switched.is_some() {
                &mut live_events
            } else {
                &mut Vec::new()
            };
            if live.step(word, cfg, time, &mut |e| sink.push(e)) == SweepStep::Refresh {
                live.observe(record, &[], cfg, time, &mut |e| sink.push(e));
            }
            let sink = if switched.is_some() {
                &mut all_along_events
            } else {
                &mut Vec::new()
            };
            if all_along.step(word, &new, time, &mut |e| sink.push(e)) == SweepStep::Refresh {
                all_along.observe(record, &[], &new, time, &mut |e| sink.push(e));
            }
            if switched == Some(step) {
                assert_eq!(
                    live.t.crossed, all_along.t.crossed,
                    "{model:?} at the switch"
                );
            }
        }
        assert!(switched.is_some(), "{model:?}: no silence to switch in");
        assert!(live_events.len() > 20, "{model:?}: events after the switch");
        assert_eq!(live_events, all_along_events, "{model:?}");
    }
    // The switches fell where the detectors disagree: the new one was past more levels.
    assert!(raised_at_switches > 0);
}

/// `suspects` passes over a peer when its dense state says phi is below the first level:
/// checked against the exact phi of the slot's current record, at query times between
/// sweeps, with heartbeats the last sweep has not seen yet among them.
#[test]
fn below_first_level_is_never_wrong_and_usually_answers() {
    for (model, cfg, xdp) in models_with_floors() {
        let mut stream = Stream::new(12, xdp);
        let mut tracked = Tracked::new(&stream.slot.record(), &cfg);
        let (mut asked, mut passed) = (0u64, 0u64);
        for step in 1..=30_000u64 {
            let now = step * 10 * MS;
            stream.until(now);
            let (slot, word) = (&stream.slot, stream.word);
            // A query between two sweeps, a little after this tick's heartbeats.
            let query = now + stream.rng.u64(0..10 * MS);
            asked += 1;
            if tracked
                .level_floor
                .below_first_level(&tracked.watch, word, query)
            {
                passed += 1;
                let estimate = cfg.estimate(&slot.record(), &[]);
                let silence = query.saturating_sub(slot.record().last_arrival_ns) as f64 / 1e6;
                let phi = cfg.params.phi(&estimate, silence);
                assert!(phi < 1.0, "{model:?} at {query}: phi {phi} passed over");
            }
            let time = at(now, now as f64 / 1e6, false);
            if tracked.step(word, &cfg, time, &mut |_| {}) == SweepStep::Refresh {
                tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
            }
        }
        assert!(
            passed * 2 > asked,
            "{model:?}: only {passed} of {asked} queries passed over"
        );
    }
}

/// A peer whose window is too short for a floor (the first seconds after a start at 1 Hz)
/// is still passed over by `suspects` while its word is the one the sweep accounted for and
/// its first level's exact crossing has not come; once a level is crossed, or a heartbeat
/// came that the sweep has not seen, it is not.
#[test]
fn below_first_level_answers_from_the_exact_crossing_without_a_floor() {
    let (cfg, xdp) = defaults();
    // Three intervals: fewer than any floor takes (`DetectorParams::mean_floor`).
    let mut slot = crate::detector::window::slot_with_intervals(
        (0..3).map(|i| 1_000_000 + i % 3 * 20_000),
        &xdp,
    );
    let record = slot.record();
    let mut tracked = Tracked::new(&record, &cfg);
    let arrival = record.last_arrival_ns;
    tracked.observe(
        &record,
        &[],
        &cfg,
        at(arrival + MS, 0.0, false),
        &mut |_| {},
    );
    assert_eq!(
        tracked.level_floor.floor_ns, NO_FLOOR,
        "a window too short for a floor"
    );
    let word = last_heard::of_record(&record);
    let crossing = tracked.watch.deadline_ns;
    let estimate = cfg.estimate(&record, &[]);
    for query in (arrival..crossing + 500 * MS).step_by(7 * MS as usize) {
        let below = tracked
            .level_floor
            .below_first_level(&tracked.watch, word, query);
        let phi = cfg.params.phi(&estimate, (query - arrival) as f64 / 1e6);
        assert_eq!(below, query < crossing, "at {query}: phi {phi}");
        assert!(!below || phi < 1.0, "at {query}: phi {phi} passed over");
    }
    // A heartbeat the sweep has not seen: the slot decides.
    monitor_common::slot::arrive(&mut slot, arrival + 1_000 * MS, 8, 1, &xdp);
    let newer = last_heard::of_record(&slot.record());
    assert!(
        !tracked
            .level_floor
            .below_first_level(&tracked.watch, newer, arrival + 1_001 * MS)
    );
    // Past the first level: no longer below it.
    let mut raised = 0;
    tracked.step(word, &cfg, at(crossing, 0.0, false), &mut |_| raised += 1);
    assert_eq!(raised, 1);
    assert!(
        !tracked
            .level_floor
            .below_first_level(&tracked.watch, word, crossing)
    );
}

/// A steady sender with a full window is read once a window of heartbeats (refloors carry
/// it between), not once a span; a heartbeat whose interval the window left out (across a
/// restart, however short) is read at once.
#[test]
fn a_steady_full_window_is_read_once_a_window() {
    let (cfg, xdp) = defaults();
    let mut slot = crate::detector::window::slot_with_intervals(
        (0..200).map(|i| 100_000 + i % 7 * 1000),
        &xdp,
    );
    let mut tracked = Tracked::new(&slot.record(), &cfg);
    let (mut arrival, mut seq, mut incarnation) = (slot.record().last_arrival_ns, 201, 1);
    let mut reads = 0;
    let sweep = |slot: &monitor_common::maps::PeerSlot, tracked: &mut Tracked| {
        let word = last_heard::of_record(&slot.record());
        let time = at(slot.record().last_arrival_ns + MS, 0.0, false);
        let read = tracked.step(word, &cfg, time, &mut |_| {}) == SweepStep::Refresh;
        if read {
            tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
        }
        read
    };
    for i in 0..1280u64 {
        arrival += (100 + i % 7) * MS;
        seq += 1;
        monitor_common::slot::arrive(&mut slot, arrival, seq, incarnation, &xdp);
        reads += sweep(&slot, &mut tracked) as u32;
    }
    assert_eq!(slot.record().left_out, 0);
    // Once every 128 heartbeats, or 129 where the last floor is a span of 0 (32 with a read
    // at the end of every span).
    assert!((9..=12).contains(&reads), "{reads} reads");
    arrival += 100 * MS;
    incarnation += 1;
    monitor_common::slot::arrive(&mut slot, arrival, 1, incarnation, &xdp);
    assert!(sweep(&slot, &mut tracked), "a restart is read");
}

/// A BFD session whose timers change starts a fresh window (a new epoch), and its next
/// deadline must come from the new rate: the packet that starts the epoch is read from the
/// slot, never passed over under a floor of the old rate (which held the deadline more than
/// half a second late here, before the word counted intervals left out).
#[test]
fn a_bfd_timer_change_is_read() {
    use monitor_common::{
        maps::PeerSlot,
        passive::{BFD_UP, SOURCE_BFD},
        slot::arrive_passive,
    };
    let (cfg, xdp) = defaults();
    let mut slot = PeerSlot::admitted_passive(9, 0, SOURCE_BFD);
    slot.cold.bfd_state = BFD_UP;
    slot.cold.bfd_desired_min_tx_us = 1_000_000;
    let mut arrival = 0;
    for _ in 0..200 {
        arrival += 1000 * MS;
        arrive_passive(&mut slot.parts(), arrival, false, &xdp);
    }
    let mut tracked = Tracked::new(&slot.record(), &cfg);
    assert_ne!(
        tracked.level_floor.floor_ns, NO_FLOOR,
        "a 1 s session has a floor"
    );
    // The session now sends every 300 ms: a new epoch, its window emptied.
    slot.cold.bfd_desired_min_tx_us = 300_000;
    arrival += 300 * MS;
    arrive_passive(&mut slot.parts(), arrival, true, &xdp);
    let time = at(arrival + MS, 0.0, false);
    let word = last_heard::of_record(&slot.record());
    assert_eq!(
        tracked.step(word, &cfg, time, &mut |_| {}),
        SweepStep::Refresh
    );
    tracked.observe(&slot.record(), &[], &cfg, time, &mut |_| {});
    // 300 ms and a deviation of 75 (the bootstrap): the first level at about 396 ms.
    let deadline_ms = (tracked.watch.deadline_ns - arrival) as f64 / 1e6;
    assert!(
        deadline_ms < 400.0,
        "first level {deadline_ms} ms after the packet"
    );
}

/// A word whose count does not read as advanced (it moved by more than half its range,
/// as 512 intervals left out between two sweeps would move it) is read from the slot, not
/// taken for an older word and ignored.
#[test]
fn a_word_that_reads_older_is_read() {
    let (cfg, xdp) = defaults();
    let slot = crate::detector::window::slot_with_intervals([100_000; 200], &xdp);
    let mut tracked = Tracked::new(&slot.record(), &cfg);
    let word = last_heard::of_record(&slot.record());
    let arrival = slot.record().last_arrival_ns + 100 * MS;
    let count = last_heard::count_of(word) + (1 << (last_heard::COUNT_BITS - 1)) + 1;
    let later = last_heard::word(arrival, count);
    assert_eq!(last_heard::heartbeats_since(word, later), None);
    let time = at(arrival + MS, 0.0, false);
    assert_eq!(
        tracked.step(later, &cfg, time, &mut |_| {}),
        SweepStep::Refresh
    );
}

#[test]
fn what_every_sweep_reads_is_small() {
    assert_eq!(std::mem::size_of::<WordWatch>(), 16);
    assert_eq!(std::mem::size_of::<LevelFloor>(), 16);
}

/// Where the sweep arms a floor (`LevelFloor::predicted_crossing_ns`): on a steady sender's
/// full window, every heartbeat passed over under a floor or renewed without a read, the
/// crossing predicted from the floor is within a hair of the exact crossing that reading the
/// slot gives, and never before the floor itself.
#[test]
fn a_floor_predicts_a_steady_senders_crossing() {
    let (cfg, xdp) = defaults();
    let mut slot = crate::detector::window::slot_with_intervals(
        (0..200).map(|i| 100_000 + i % 7 * 1000),
        &xdp,
    );
    let mut lazy = Tracked::new(&slot.record(), &cfg);
    let mut eager = lazy.clone();
    let (mut arrival, mut seq) = (slot.record().last_arrival_ns, 201);
    let (mut floors, mut worst_ms) = (0, 0.0f64);
    for i in 0..1280u64 {
        arrival += (100 + i % 7) * MS;
        seq += 1;
        monitor_common::slot::arrive(&mut slot, arrival, seq, 1, &xdp);
        let (record, word) = (slot.record(), last_heard::of_record(&slot.record()));
        let time = at(arrival + MS, 0.0, false);
        eager.observe(&record, &[], &cfg, time, &mut |_| {});
        if lazy.step(word, &cfg, time, &mut |_| {}) == SweepStep::Refresh {
            lazy.observe(&record, &[], &cfg, time, &mut |_| {});
        }
        if lazy.level_floor.exact() {
            continue;
        }
        floors += 1;
        let exact = eager.watch.deadline_ns;
        let predicted = lazy.level_floor.predicted_crossing_ns(&lazy.watch);
        assert!(lazy.watch.deadline_ns <= exact, "a floor at heartbeat {i}");
        assert!(predicted >= lazy.watch.deadline_ns, "heartbeat {i}");
        worst_ms = worst_ms.max((predicted as f64 - exact as f64).abs() / 1e6);
    }
    assert!(floors > 1000, "{floors} heartbeats under a floor");
    assert!(
        worst_ms < 0.5,
        "predicted up to {worst_ms:.3} ms from the crossing"
    );
}
