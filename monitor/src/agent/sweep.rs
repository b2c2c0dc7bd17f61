//! The sweep: one pass over every peer a sweep interval, raising and ending suspicions, with
//! what rides on it: the BFD sessions' reported Downs, the expiry of silent peers
//! (`--expire-after`) and the check for a correlated silence (`observer_faults`).

use std::sync::atomic::Ordering;

use monitor_common::passive::{SOURCE_BFD, bfd_diag_name, bfd_state_name};

use super::{Agent, Trackers, due_soon::DueSoon, passive, wall_ms};
use crate::{
    detector::tracker::{
        DetectorConfig, LevelFloor, PeerTracker, SweepStep, SweepTime, Transition, WordWatch,
    },
    kernel::{clock::monotonic_ns, registry::Registry},
    serving::event::Event,
    serving::peer_view::ip_addr,
};

/// Slots a sweep handles per hold of the trackers lock (a few hundred microseconds at most).
const SWEEP_CHUNK: usize = 4096;

/// Events a pass raises under one hold of the trackers lock before it hands them to the
/// subscribers (`Agent::publish_all`) and lets go: a burst of thousands (a mass failure) is
/// written to the subscribers while the pass raises the rest, a few hundred at a time, each
/// batch one hand-over and one wake of each subscriber's task.
pub(super) const HANDOVER_EVENTS: usize = 256;

/// How far ahead of the scan its lines are asked for (`prefetch`): a few hundred nanoseconds
/// of scan, the time a line takes to come from the other core's cache.
const PREFETCH_SLOTS: usize = 64;

/// Slots a line of watches (and of floors) holds, 16 bytes each: the scan asks for lines
/// once every this many slots, 64 bytes apart in each array, so every line is asked for once
/// (every word line twice) and not three hints a peer.
const PREFETCH_EVERY: usize = 64 / size_of::<WordWatch>();
const _: () = assert!(size_of::<LevelFloor>() == size_of::<WordWatch>());

/// Asks for the cache line holding `*at`, to be read soon. A hint: nothing on targets
/// without one.
#[inline(always)]
fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache, never faults, and `at` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (at as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// How often silent peers are checked against `--expire-after`.
const EXPIRY_SCAN_NS: u64 = 1_000_000_000;

/// What one pass over slots (a scan, or a due pass) carries from slot to slot.
struct Pass<'a> {
    registry: &'a Registry,
    time: SweepTime,
    /// Slot reads, and floors renewed without one.
    refreshes: u64,
    refloors: u64,
    /// Peers that crossed the lowest level (for `observer_faults::CorrelatedSilence`).
    lowest_crossed: u64,
    /// Events raised under the trackers lock, published together before it is let go
    /// (`Agent::publish_all`): a burst is one hand-over to the subscribers, and a change of
    /// level made under the lock by someone else (a detector change) is never published
    /// between one of these and its publication.
    events: Vec<Event>,
}

impl<'a> Pass<'a> {
    fn new(registry: &'a Registry, now_ns: u64, hold: bool) -> Self {
        Self {
            registry,
            time: SweepTime {
                now_ns,
                wall_ms: wall_ms(),
                hold,
            },
            refreshes: 0,
            refloors: 0,
            lowest_crossed: 0,
            events: Vec::new(),
        }
    }
}

impl Trackers {
    /// Asks for the lines of `slot`'s watch and floor (`prefetch`), if it exists.
    #[inline(always)]
    fn prefetch(&self, slot: usize) {
        if let (Some(watch), Some(floor)) = (self.watches.get(slot), self.level_floors.get(slot)) {
            prefetch(watch);
            prefetch(floor);
        }
    }

    /// What a pass does for most slots without `Agent::look_at_slot`: nothing for a quiet
    /// slot (no heartbeat since, no deadline reached), and for a heartbeat its estimate's
    /// floor covers, the watch moved on to it (its word and the floor past its arrival); each
    /// armed if its deadline comes before the next scan. A steady sender's heartbeats are
    /// almost all of the second kind (half the peers at each 50 ms scan at 10 Hz), so this
    /// is the scan's inner loop: the word, the watch and the floor, in three dense arrays,
    /// and no tracker. False if the slot needs a look (`look_at_slot`, which makes the same
    /// checks first: this is only its common case, taken without the call).
    #[inline(always)]
    fn take_in_passing(&mut self, slot: usize, word: u64, time: SweepTime) -> bool {
        let Self {
            watches,
            level_floors,
            due,
            change,
            ..
        } = self;
        let watch = &mut watches[slot];
        let floor = &mut level_floors[slot];
        let taken = watch.is_quiet(word, time.now_ns)
            // A tracker a detector change has not reached yet waits for it (`look_at_slot`).
            || (change.is_none() && floor.advance_over_covered(word, watch, time));
        if taken {
            due.arm_watch(slot, watch, floor, time.now_ns);
        }
        taken
    }
}

impl Agent {
    /// One pass over every peer: new heartbeats end suspicions, passed deadlines raise them.
    /// A peer costs one load of its last-heard word (eight to a cache line) and a compare of
    /// that word and the clock with its watch (16 bytes in a dense array); only a peer heard
    /// since or at a deadline costs more, and its slot is read only when its tracker asks
    /// (see `PeerTracker::step`): about once a window of heartbeats for a steady sender (its
    /// floor renewed from the words in between), or when its silence nears a level. Nothing
    /// is armed for before the next scan (see `sweep_until`).
    pub fn sweep(&self, now_ns: u64, hold: bool) {
        self.sweep_until(now_ns, hold, now_ns);
    }

    /// [`Self::sweep`], the next scan starting at `next_scan_ns`: a slot whose deadline falls
    /// before it is armed in the due-soon heap (`due_soon`), for `run_due` to look at it again
    /// at that deadline.
    pub fn sweep_until(&self, now_ns: u64, hold: bool, next_scan_ns: u64) {
        let started = std::time::Instant::now();
        let registry = self.registry.read().expect("registry lock");
        self.stop_unwanted_tracing(&registry);
        self.link.lock().expect("link lock").holding = hold;
        let mut pass = Pass::new(&registry, now_ns, hold);
        let used = registry.slots_in_use() as usize;
        // Read before any word is loaded: a word stored after this read moves the count the
        // next scan compares (`scan_skip`).
        let stored = self.program.words_stored();
        let skip = {
            let mut trackers = self.trackers.lock();
            let skip = trackers.skip.may_skip(
                stored,
                now_ns,
                next_scan_ns,
                trackers.due.earliest_unarmed(),
                hold || trackers.change.is_some(),
            );
            trackers.due.set_horizon(next_scan_ns);
            if !skip {
                trackers.due.begin_scan();
                trackers.skip.begin();
            }
            skip
        };
        // Left alone, the words are passed over whole; a full scan notes what it ran on.
        let used = if skip { 0 } else { used };
        let mut clean = true;
        let words = &self.table.last_heard_words()[..used];
        // In chunks, each under the trackers lock: a query that needs the trackers (`suspects`,
        // `peers`' QoS, a metrics scrape) waits for one chunk, not for the whole sweep.
        // A chunk also ends once it raised `HANDOVER_EVENTS`: a mass failure's events reach
        // the subscribers' tasks while the scan goes on, not all at its end.
        let mut start = 0;
        while start < used {
            let end = (start + SWEEP_CHUNK).min(used);
            let mut trackers = self.trackers.lock();
            trackers.due.set_horizon(next_scan_ns);
            clean &= trackers.change.is_none();
            // Under the trackers lock: the levels cannot change during a chunk (`set_detector`
            // takes it to re-level every peer).
            let detector = self.detector();
            let mut slot = start;
            while slot < end && pass.events.len() < HANDOVER_EVENTS {
                // The lines a few dozen slots on, asked for now: the words' lines are written
                // by the kernel on another core (each a transfer between caches), and the
                // floors are read only for heard peers, a pattern the prefetchers miss.
                if slot % PREFETCH_EVERY == 0
                    && let Some(ahead) = words.get(slot + PREFETCH_SLOTS)
                {
                    prefetch(ahead);
                    trackers.prefetch(slot + PREFETCH_SLOTS);
                }
                let word = words[slot].load(Ordering::Relaxed);
                if !trackers.take_in_passing(slot, word, pass.time) {
                    self.look_at_slot(&mut pass, &mut trackers, &detector, slot, word);
                }
                slot += 1;
            }
            start = slot;
            // Slots armed for now are not kept waiting for the rest of the scan: a scan that
            // reads many slots (200,000 peers at 1 Hz) takes milliseconds, and crossings due
            // meanwhile were raised that late (the p99 of 5.6 ms at 200,000 peers).
            let now = monotonic_ns();
            let due_now = trackers.due.earliest().is_some_and(|due| due <= now);
            // This chunk's events, under the lock that raised them: whatever else changes a
            // peer's level under it (a detector change re-levelling every peer) publishes
            // its events before or after these, never between a raise and its publication.
            self.publish_all(pass.events.drain(..));
            // Handed to a waiting query, if any: an unfair unlock lets this loop take the lock
            // straight back, chunk after chunk, while the query waits out the whole sweep.
            parking_lot::MutexGuard::unlock_fair(trackers);
            if due_now {
                self.run_due_under(&registry, now, hold, &mut || false);
            }
        }
        let mut trackers = self.trackers.lock();
        if skip {
            self.scans_skipped.fetch_add(1, Ordering::Relaxed);
        } else {
            trackers.skip.scanned(stored, now_ns, clean);
        }
        let expired = self.expired(&registry, &trackers, now_ns);
        drop(trackers);
        self.look_at_bfd_sessions(&registry);
        self.end_pass(pass, registry.len() as u64);
        drop(registry);
        for id in expired {
            log::info!("forgetting peer {id}: silent longer than the expiry bound");
            if let Err(e) = self.forget_because(id, "expired") {
                log::warn!("expiring peer {id}: {e}");
            }
        }
        self.tell_refusals();
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let took = started.elapsed();
        self.pass_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        self.metrics.sweep_seconds.observe(took.as_secs_f64());
    }

    /// The slots armed for `now_ns` or earlier, each looked at as the scan would (the same
    /// `look_at_slot`) and armed again if its next deadline also comes before the next scan.
    /// A slot whose word and deadline have not moved since it was armed (a heartbeat pushed
    /// the deadline out) costs the compare a scan would have made.
    pub fn run_due(&self, now_ns: u64, hold: bool) {
        self.run_due_asking(now_ns, hold, &mut || false);
    }

    /// [`Self::run_due`], where new suspicions are also held if `hold_after_all` says so when
    /// asked: once, before the pass's first look at a slot whose deadline came with no
    /// heartbeat since its watch, which is before anything can be raised (a pass that only
    /// moves heard peers on asks nothing). The sweeper asks whether the link's carrier was
    /// lost since its last read (one reread of an open file): a link lost just after a scan
    /// silences every peer at once, and a fast sender's deadlines come before the next scan
    /// would read the link.
    pub fn run_due_asking(
        &self,
        now_ns: u64,
        hold: bool,
        hold_after_all: &mut dyn FnMut() -> bool,
    ) {
        if !self.anything_due(now_ns) {
            return;
        }
        // Timed here, not in `run_due_under`, which a scan also runs (inside its own time).
        let started = std::time::Instant::now();
        let registry = self.registry.read().expect("registry lock");
        self.run_due_under(&registry, now_ns, hold, hold_after_all);
        drop(registry);
        self.pass_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Whether a slot is armed for `now_ns` or earlier.
    fn anything_due(&self, now_ns: u64) -> bool {
        self.trackers
            .lock()
            .due
            .earliest()
            .is_some_and(|due| due <= now_ns)
    }

    /// [`Self::run_due`] with the registry's read lock already held: by the sweeper between
    /// scans, and by a scan between its chunks.
    fn run_due_under(
        &self,
        registry: &Registry,
        now_ns: u64,
        hold: bool,
        hold_after_all: &mut dyn FnMut() -> bool,
    ) {
        let mut pass = Pass::new(registry, now_ns, hold);
        let mut asked = false;
        let words = &self.table.last_heard_words()[..registry.slots_in_use() as usize];
        let mut looks = 0u64;
        // In chunks, as the scan (a silence shared by many peers arms them all at once).
        loop {
            let mut trackers = self.trackers.lock();
            let detector = self.detector();
            let mut taken = 0;
            while taken < SWEEP_CHUNK
                && pass.events.len() < HANDOVER_EVENTS
                && let Some(slot) = trackers.due.pop_due(now_ns)
            {
                taken += 1;
                let slot = slot as usize;
                let Some(word) = words.get(slot) else {
                    continue;
                };
                let word = word.load(Ordering::Relaxed);
                if !trackers.take_in_passing(slot, word, pass.time) {
                    // Only a slot not heard since its watch can have a level raised.
                    if !pass.time.hold
                        && !asked
                        && trackers.watches.get(slot).is_some_and(|w| w.word == word)
                    {
                        asked = true;
                        pass.time.hold = hold_after_all();
                    }
                    self.look_at_slot(&mut pass, &mut trackers, &detector, slot, word);
                }
            }
            looks += taken as u64;
            // Stopped short for a hand-over (more may be due), or out of due slots.
            let handed_over = pass.events.len() >= HANDOVER_EVENTS;
            // Under the lock, as the scan's (see there).
            self.publish_all(pass.events.drain(..));
            parking_lot::MutexGuard::unlock_fair(trackers);
            if taken < SWEEP_CHUNK && !handed_over {
                break;
            }
        }
        self.end_pass(pass, registry.len() as u64);
        self.due_passes.fetch_add(1, Ordering::Relaxed);
        self.due_looks.fetch_add(looks, Ordering::Relaxed);
    }

    /// When the sweeper should next wake for a due slot (monotonic ns), if any is armed.
    pub(super) fn next_due_ns(&self) -> Option<u64> {
        self.trackers.lock().due.wake_ns()
    }

    /// A slot whose watch was not quiet (a heartbeat since, or a deadline reached): the one
    /// place a scan and a due pass act on a peer. New heartbeats end suspicions, passed
    /// deadlines raise them, and the next deadline is armed if it comes before the next scan.
    fn look_at_slot(
        &self,
        pass: &mut Pass,
        trackers: &mut Trackers,
        detector: &DetectorConfig,
        slot: usize,
        word: u64,
    ) {
        let lowest = detector.levels.as_slice()[0];
        let time = pass.time;
        let Trackers {
            watches,
            level_floors,
            peers,
            change,
            due,
            ..
        } = trackers;
        // A detector change under way: a tracker it has not reached yet waits for it (a
        // chunk's worth of milliseconds), rather than be judged under a detector its
        // estimate was not made for, or hold the lock while the sweep re-estimates it.
        if change.as_ref().is_some_and(|c| c.pending()[slot]) {
            return;
        }
        let (watch, floor) = (&mut watches[slot], &mut level_floors[slot]);
        // Whether this look raises the first level (`tell_when_heard` after it).
        let lowest_before = pass.lowest_crossed;
        let mut emit = |t: Transition| {
            if matches!(&t, Transition::Suspect(s) if s.level == lowest) {
                pass.lowest_crossed += 1;
            }
            pass.events.push(t.into())
        };
        // A heartbeat the estimate's floor covers: no tracker, no slot.
        if floor.advance_over_covered(word, watch, time) {
            due.arm_watch(slot, watch, floor, time.now_ns);
            return;
        }
        let tracker = &mut peers[slot];
        let Some(id) = pass.registry.owner(slot as u32) else {
            // No peer: nothing to do until an admission resets the slot (and its word).
            *tracker = None;
            *watch = WordWatch::vacant(word);
            *floor = LevelFloor::NONE;
            return;
        };
        let with_ring = detector.params.needs_ring();
        if let Some(t) = tracker.as_mut().filter(|t| t.peer_id == id) {
            match t.step(word, watch, floor, detector, time, &mut emit) {
                SweepStep::Done => {}
                SweepStep::Refloored => pass.refloors += 1,
                SweepStep::Refresh => {
                    pass.refreshes += 1;
                    if let Some((record, ring)) = self.read(slot as u32, with_ring)
                        && record.peer_id == id
                    {
                        t.observe(&record, &ring, watch, floor, detector, time, &mut emit);
                    }
                }
            }
            due.arm_watch(slot, watch, floor, time.now_ns);
            // A new suspicion, also one that began in the look that ended the last (a
            // heartbeat seen late, its kernel's word lost to a full ring, and already old).
            if pass.lowest_crossed > lowest_before {
                self.tell_when_heard(due, slot, id, word);
            }
            return;
        }
        // A peer this slot's tracker has not seen yet.
        pass.refreshes += 1;
        let Some((record, ring)) = self.read(slot as u32, with_ring) else {
            return;
        };
        if record.peer_id != id {
            return;
        }
        if record.source == SOURCE_BFD {
            let mut sessions = self.bfd_sessions.lock().expect("bfd sessions lock");
            sessions.retain(|s| s.slot != slot as u32);
            sessions.push(passive::BfdSeen::new(slot as u32, id, &record));
        }
        let (mut t, new_watch, new_floor) = PeerTracker::new(&record, &ring, detector);
        (*watch, *floor) = (new_watch, new_floor);
        t.observe(&record, &ring, watch, floor, detector, time, &mut emit);
        *tracker = Some(t);
        due.arm_watch(slot, watch, floor, time.now_ns);
        if pass.lowest_crossed > lowest_before {
            self.tell_when_heard(due, slot, id, word);
        }
    }

    /// `id`, in `slot`, was just suspected at its first level (by a look at the slot's `word`,
    /// or by a detector change, `word` being the one its estimate accounts for): the kernel is
    /// asked to tell its next heartbeat (`PeerTable::tell_when_heard`), so its recovery, and
    /// the deadlines that count from it, do not wait for the next scan
    /// (a peer past its last level has no deadline left to be looked at again before). A
    /// heartbeat recorded before the kernel saw the ask is not told, but its word is visible
    /// once the ask returns: read again, it shows the heartbeat, and the slot is looked at
    /// again at once (as it is when the ask could not be sure).
    pub(super) fn tell_when_heard(&self, due: &mut DueSoon, slot: usize, id: u64, word: u64) {
        let Some(settled) = self.table.tell_when_heard(slot as u32, id) else {
            return;
        };
        if !settled || self.table.last_heard(slot as u32) != word {
            due.arm_now(slot as u32);
        }
    }

    /// After a pass, the trackers let go: the correlated-silence check and the pass's counts.
    fn end_pass(&self, mut pass: Pass, watched: u64) {
        // Published at each let-go of the trackers; none is left, and none is lost if one is.
        self.publish_all(pass.events.drain(..));
        self.refreshes.fetch_add(pass.refreshes, Ordering::Relaxed);
        self.refloors.fetch_add(pass.refloors, Ordering::Relaxed);
        let lowest = self.detector().levels.as_slice()[0];
        let correlated = self.correlated.lock().expect("correlated lock").note(
            pass.lowest_crossed,
            watched,
            lowest,
            pass.time.now_ns,
            pass.time.wall_ms as u64,
        );
        if let Some(event) = correlated {
            if let Event::CorrelatedSilence { peers, .. } = &event {
                log::warn!(
                    "{peers} of {watched} peers crossed level {lowest} within a second: a shared fault (this host, its link, a switch) is likelier than {peers} failures"
                );
            }
            self.publish(event);
        }
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
