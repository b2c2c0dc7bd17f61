//! The sweep: one pass over every peer a sweep interval, raising and ending suspicions, with
//! what rides on it: the BFD sessions' reported Downs, the expiry of silent peers
//! (`--expire-after`) and the check for a correlated silence (`observer_faults`).

use std::sync::atomic::Ordering;

use monitor_common::passive::{SOURCE_BFD, bfd_diag_name, bfd_state_name};

use super::{Agent, Trackers, passive, wall_ms};
use crate::{
    detector::tracker::{LevelFloor, PeerTracker, SweepStep, SweepTime, Transition, WordWatch},
    kernel::registry::Registry,
    serving::event::Event,
    serving::peer_view::ip_addr,
};

/// Slots a sweep handles per hold of the trackers lock (a few hundred microseconds at most).
const SWEEP_CHUNK: usize = 4096;

/// How often silent peers are checked against `--expire-after`.
const EXPIRY_SCAN_NS: u64 = 1_000_000_000;

impl Agent {
    /// One pass over every peer: new heartbeats end suspicions, passed deadlines raise them.
    /// A peer costs one load of its last-heard word (eight to a cache line) and a compare of
    /// that word and the clock with its watch (16 bytes in a dense array); only a peer heard
    /// since or at a deadline costs more, and its slot is read only when its tracker asks
    /// (see `PeerTracker::step`): about once a window of heartbeats for a steady sender (its
    /// floor renewed from the words in between), or when its silence nears a level.
    pub fn sweep(&self, now_ns: u64, hold: bool) {
        let started = std::time::Instant::now();
        let time = SweepTime {
            now_ns,
            wall_ms: wall_ms(),
            hold,
        };
        let registry = self.registry.read().expect("registry lock");
        self.stop_unwanted_tracing(&registry);
        self.link.lock().expect("link lock").holding = hold;
        let lowest = self.detector().levels.as_slice()[0];
        let mut lowest_crossed = 0u64;
        let mut emit = |t: Transition| {
            if matches!(&t, Transition::Suspect(s) if s.level == lowest) {
                lowest_crossed += 1;
            }
            self.publish(t.into())
        };
        let (mut refreshes, mut refloors) = (0u64, 0u64);
        let used = registry.slots_in_use() as usize;
        let words = &self.table.last_heard_words()[..used];
        // In chunks, each under the trackers lock: a query that needs the trackers (`suspects`,
        // `peers`' QoS, a metrics scrape) waits for one chunk, not for the whole sweep.
        for start in (0..used).step_by(SWEEP_CHUNK) {
            let end = (start + SWEEP_CHUNK).min(used);
            let mut trackers = self.trackers.lock();
            // Under the trackers lock: the levels cannot change during a chunk (`set_detector`
            // takes it to re-level every peer).
            let detector = self.detector();
            let with_ring = detector.params.needs_ring();
            // A detector change under way: a tracker it has not reached yet waits for it (a
            // chunk's worth of milliseconds), rather than be judged under a detector its
            // estimate was not made for, or hold the lock while the sweep re-estimates it.
            let Trackers {
                watches,
                level_floors: floors,
                peers,
                change,
            } = &mut *trackers;
            let pending = change.as_ref().map(|c| c.pending());
            let chunk = watches[start..end].iter_mut().zip(&words[start..end]);
            for (slot, (watch, word)) in (start..end).zip(chunk) {
                let word = word.load(Ordering::Relaxed);
                if watch.is_quiet(word, now_ns) || pending.is_some_and(|p| p[slot]) {
                    continue;
                }
                let floor = &mut floors[slot];
                // A heartbeat the estimate's floor covers: no tracker, no slot.
                if floor.advance_over_covered(word, watch, time) {
                    continue;
                }
                let tracker = &mut peers[slot];
                let Some(id) = registry.owner(slot as u32) else {
                    // No peer: nothing to do until an admission resets the slot (and its word).
                    *tracker = None;
                    *watch = WordWatch::vacant(word);
                    *floor = LevelFloor::NONE;
                    continue;
                };
                if let Some(t) = tracker.as_mut().filter(|t| t.peer_id == id) {
                    match t.step(word, watch, floor, &detector, time, &mut emit) {
                        SweepStep::Done => {}
                        SweepStep::Refloored => refloors += 1,
                        SweepStep::Refresh => {
                            refreshes += 1;
                            if let Some((record, ring)) = self.read(slot as u32, with_ring)
                                && record.peer_id == id
                            {
                                t.observe(&record, &ring, watch, floor, &detector, time, &mut emit);
                            }
                        }
                    }
                    continue;
                }
                // A peer this slot's tracker has not seen yet.
                refreshes += 1;
                let Some((record, ring)) = self.read(slot as u32, with_ring) else {
                    continue;
                };
                if record.peer_id != id {
                    continue;
                }
                if record.source == SOURCE_BFD {
                    let mut sessions = self.bfd_sessions.lock().expect("bfd sessions lock");
                    sessions.retain(|s| s.slot != slot as u32);
                    sessions.push(passive::BfdSeen::new(slot as u32, id, &record));
                }
                let (mut t, new_watch, new_floor) = PeerTracker::new(&record, &ring, &detector);
                (*watch, *floor) = (new_watch, new_floor);
                t.observe(&record, &ring, watch, floor, &detector, time, &mut emit);
                *tracker = Some(t);
            }
            // Handed to a waiting query, if any: an unfair unlock lets this loop take the lock
            // straight back, chunk after chunk, while the query waits out the whole sweep.
            parking_lot::MutexGuard::unlock_fair(trackers);
        }
        let trackers = self.trackers.lock();
        let expired = self.expired(&registry, &trackers, now_ns);
        drop(trackers);
        self.look_at_bfd_sessions(&registry);
        let watched = registry.len() as u64;
        drop(registry);
        let correlated = self.correlated.lock().expect("correlated lock").note(
            lowest_crossed,
            watched,
            lowest,
            now_ns,
            time.wall_ms as u64,
        );
        if let Some(event) = correlated {
            if let Event::CorrelatedSilence { peers, .. } = &event {
                log::warn!(
                    "{peers} of {watched} peers crossed level {lowest} within a second: a shared fault (this host, its link, a switch) is likelier than {peers} failures"
                );
            }
            self.publish(event);
        }
        self.refreshes.fetch_add(refreshes, Ordering::Relaxed);
        self.refloors.fetch_add(refloors, Ordering::Relaxed);
        for id in expired {
            log::info!("forgetting peer {id}: silent longer than the expiry bound");
            if let Err(e) = self.forget_because(id, "expired") {
                log::warn!("expiring peer {id}: {e}");
            }
        }
        self.tell_refusals();
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .sweep_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// Peers silent for longer than `--expire-after`, checked once a second (the bound is
    /// minutes in practice; a scan of every tracker per sweep would cost more than the sweep).
    fn expired(&self, registry: &Registry, trackers: &Trackers, now_ns: u64) -> Vec<u64> {
        let Some(bound) = self.expire_after_ns else {
            return Vec::new();
        };
        if now_ns < self.next_expiry_scan_ns.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.next_expiry_scan_ns
            .store(now_ns + EXPIRY_SCAN_NS, Ordering::Relaxed);
        registry
            .iter()
            .filter(|&(id, slot)| {
                trackers.of(slot, id).is_some_and(|t| {
                    let last = t.last_arrival_ns(&trackers.watches[slot as usize], now_ns);
                    now_ns.saturating_sub(last) > bound
                })
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// Raises `bfd_down` for each BFD session that reported Down or AdminDown since the last
    /// sweep: a look at the record of each session heard since (its last-heard word moved).
    /// Sessions whose slot went to another peer are dropped.
    fn look_at_bfd_sessions(&self, registry: &Registry) {
        let mut sessions = self.bfd_sessions.lock().expect("bfd sessions lock");
        if sessions.is_empty() {
            return;
        }
        sessions.retain(|s| registry.owner(s.slot) == Some(s.id));
        let words = self.table.last_heard_words();
        for session in sessions.iter_mut() {
            let word = words[session.slot as usize].load(Ordering::Relaxed);
            if word == session.word {
                continue;
            }
            let Some(record) = self.table.record(session.slot) else {
                continue;
            };
            if record.peer_id != session.id {
                continue;
            }
            session.word = word;
            if let Some(fall) = session.look(&record) {
                log::info!(
                    "BFD session {:#x} reports {} ({})",
                    session.id,
                    bfd_state_name(fall.state),
                    bfd_diag_name(fall.diag)
                );
                self.publish(Event::BfdDown {
                    id: session.id,
                    state: bfd_state_name(fall.state).into(),
                    diag: fall.diag,
                    diagnostic: bfd_diag_name(fall.diag).into(),
                    addr: ip_addr(record.src_family, &record.src_addr).map(|a| a.to_string()),
                    discriminator: record.bfd_my_discriminator,
                    at: wall_ms() as u64,
                });
            }
        }
    }
}
