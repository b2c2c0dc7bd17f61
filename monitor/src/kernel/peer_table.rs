//! The peers' hot lines, their slots and their last-heard words, read and written through
//! mmaps of the three BPF_F_MMAPABLE arrays (PEER_HOT, PEER_STATE, LAST_HEARD): a full sweep
//! costs memory reads, not one or two syscalls per peer.
//!
//! A peer is a hot line (`HotLine`: the lock and the hot fields, where the kernel finds it by its
//! id, `monitor_common::index`) linked to a slot (`PeerState`: the cold lines and the ring, and
//! the last-heard word of the same index). The agent works by slot; the table keeps which line
//! each slot's peer has (`line_of`), filled as peers are inserted and rebuilt from the lines'
//! links when pinned state is adopted. Every read and write of a peer goes through its line's
//! lock (`monitor_common::maps::HotLine`).

use std::{
    io,
    mem::{offset_of, size_of},
    os::fd::{AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence},
};

use monitor_common::{
    last_heard,
    maps::{
        HotLine, LOCK_HELD, LOCK_SEQ_ONE, MAX_WINDOW, PeerHot, PeerRecord, PeerSlot, PeerState,
        TELL_ARRIVALS, TELL_HEARD, link_of, linked_slot,
    },
    slot::window_intervals,
};

/// The link half of a lock word.
const LINK_BITS: u64 = u32::MAX as u64;

/// Attempts at a consistent copy before giving up on a slot that keeps changing.
const READ_ATTEMPTS: usize = 64;
/// How long an ask to be told (`tell_when_heard`) waits out a kernel writer holding the line:
/// a heartbeat's section is well under a microsecond.
const TELL_WAIT_SPINS: usize = 4096;
/// Rounds of [`READ_ATTEMPTS`] a client's read makes before the slot is reported busy, with a
/// short pause between rounds (at most about a millisecond in all).
const BUSY_ROUNDS: u32 = 8;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_micros(100);

/// The slot kept changing while it was read: writers (the kernel recording heartbeats of its
/// peer on several CPUs) held or moved its sequence counter on every attempt. Not the same as
/// an unknown peer: the read can be repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("slot {0} kept changing while it was read")]
pub struct Busy(pub u32);

#[derive(Debug, thiserror::Error)]
pub enum PeerTableError {
    #[error("mmap of the {map} map ({bytes} bytes): {source}")]
    Mmap {
        map: &'static str,
        bytes: usize,
        source: io::Error,
    },
}

/// Shared mappings of the hot lines, the peer state array and the last-heard words
/// (`monitor_common::last_heard`), and which line each slot's peer has.
pub struct PeerTable {
    lines: NonNull<HotLine>,
    base: NonNull<PeerState>,
    words: NonNull<u64>,
    capacity: u32,
    line_count: u32,
    lines_bytes: usize,
    bytes: usize,
    words_bytes: usize,
    /// Each slot's hot line + 1 (0: the slot has no peer). Written by the registry's thread as it
    /// inserts and removes peers, read by any: a reader checks the line's link under the line's
    /// sequence counter, so a stale entry costs a retry, never a wrong read.
    line_of: Box<[AtomicU32]>,
}

/// A line whose lock a dead agent had left held, as [`PeerTable::repair_stale_locks`] found
/// and repaired it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repaired {
    pub line: u32,
    /// The peer it still linked to (its slot and id), reset to a peer admitted now; None: an
    /// empty line (or one a dead agent was filling or emptying), left empty.
    pub peer: Option<(u32, u64)>,
}

/// Anonymous memory for `count` values of `T` in place of a BPF array (unit tests: the same
/// code, no kernel); returns the mapping and its length in bytes, for the owner's munmap.
#[cfg(test)]
pub(crate) fn anonymous_array<T>(count: usize) -> (NonNull<T>, usize) {
    let bytes = (count * size_of::<T>()).next_multiple_of(4096);
    // SAFETY: a private anonymous mapping, unmapped by its owner's drop.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    (NonNull::new(ptr.cast()).unwrap(), bytes)
}

/// Maps `count` values of `T` of the BPF array whose fd is `fd`; returns the mapping and its
/// length in bytes.
pub(crate) fn map_array<T>(
    map: &'static str,
    fd: BorrowedFd<'_>,
    count: u32,
) -> Result<(NonNull<T>, usize), PeerTableError> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let bytes = (count as usize * size_of::<T>()).div_ceil(page) * page;
    // SAFETY: mapping a BPF map fd; the kernel checks size and flags.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(PeerTableError::Mmap {
            map,
            bytes,
            source: io::Error::last_os_error(),
        });
    }
    Ok((NonNull::new(ptr.cast()).expect("mmap returned null"), bytes))
}

// SAFETY: all access to the mapping goes through the sequence-counter protocol below; the
// mapping itself lives until drop.
unsafe impl Send for PeerTable {}
unsafe impl Sync for PeerTable {}

impl PeerTable {
    /// Maps the `lines` hot lines (`hot_fd`, `monitor_common::index::lines_for` the capacity),
    /// `capacity` slots of the peer state array (`state_fd`) and as many words of the
    /// last-heard array (`last_heard_fd`). No slot has a line yet: a table of pinned state
    /// learns them with [`Self::adopt_links`].
    pub fn map(
        hot_fd: BorrowedFd<'_>,
        state_fd: BorrowedFd<'_>,
        last_heard_fd: BorrowedFd<'_>,
        capacity: u32,
        lines: u32,
    ) -> Result<Self, PeerTableError> {
        let (hot, lines_bytes) = map_array::<HotLine>("hot lines", hot_fd, lines)?;
        let unmap_hot = || {
            // SAFETY: unmapping exactly what was just mapped.
            unsafe { libc::munmap(hot.as_ptr().cast(), lines_bytes) };
        };
        let (base, bytes) = match map_array::<PeerState>("peer state", state_fd, capacity) {
            Ok(mapping) => mapping,
            Err(e) => {
                unmap_hot();
                return Err(e);
            }
        };
        let (words, words_bytes) = match map_array::<u64>("last-heard", last_heard_fd, capacity) {
            Ok(mapping) => mapping,
            Err(e) => {
                unmap_hot();
                // SAFETY: unmapping exactly what was just mapped.
                unsafe { libc::munmap(base.as_ptr().cast(), bytes) };
                return Err(e);
            }
        };
        Ok(Self::from_parts(
            (hot, lines, lines_bytes),
            (base, bytes),
            (words, words_bytes),
            capacity,
        ))
    }

    fn from_parts(
        (lines, line_count, lines_bytes): (NonNull<HotLine>, u32, usize),
        (base, bytes): (NonNull<PeerState>, usize),
        (words, words_bytes): (NonNull<u64>, usize),
        capacity: u32,
    ) -> Self {
        Self {
            lines,
            base,
            words,
            capacity,
            line_count,
            lines_bytes,
            bytes,
            words_bytes,
            line_of: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Lines of PEER_HOT.
    pub fn line_count(&self) -> u32 {
        self.line_count
    }

    fn state_ptr(&self, slot: u32) -> *mut PeerState {
        assert!(slot < self.capacity, "slot {slot} out of range");
        // SAFETY: in bounds of the mapping.
        unsafe { self.base.as_ptr().add(slot as usize) }
    }

    pub(crate) fn line_ptr(&self, line: u32) -> *mut HotLine {
        assert!(line < self.line_count, "line {line} out of range");
        // SAFETY: in bounds of the mapping.
        unsafe { self.lines.as_ptr().add(line as usize) }
    }

    fn lock(&self, line: u32) -> &AtomicU64 {
        // SAFETY: `lock` is the first field, 8-byte aligned in a page-aligned mapping, and is
        // only ever accessed atomically (here and by the kernel's atomic instructions).
        unsafe { AtomicU64::from_ptr(&raw mut (*self.line_ptr(line)).lock) }
    }

    /// The hot line of the peer in `slot`, if the slot has one.
    pub fn line_of(&self, slot: u32) -> Option<u32> {
        self.line_of[slot as usize]
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// The slot `line` links to, as its lock word says now (the agent's own writes are the
    /// only ones that change it).
    pub(crate) fn linked(&self, line: u32) -> Option<u32> {
        linked_slot(self.lock(line).load(Ordering::Acquire))
    }

    /// The peer id `line` carries (meaningful while it links to a slot).
    pub(crate) fn line_id(&self, line: u32) -> u64 {
        // SAFETY: in bounds; the agent and the kernel store it whole.
        unsafe { std::ptr::read_volatile(&raw const (*self.line_ptr(line)).hot.peer_id) }
    }

    /// The line's `overflow` (`monitor_common::index`).
    pub(crate) fn overflow(&self, line: u32) -> u8 {
        // SAFETY: in bounds; a byte.
        unsafe { std::ptr::read_volatile(&raw const (*self.line_ptr(line)).hot.overflow) }
    }

    /// A consistent copy of a slot's peer (its hot line's fields, its cold lines and ring), or
    /// None if writers kept it busy. A slot without a peer reads as an empty slot.
    fn copy(&self, slot: u32) -> Option<PeerSlot> {
        let state = self.state_ptr(slot);
        for _ in 0..READ_ATTEMPTS {
            let Some(line) = self.line_of(slot) else {
                return Some(PeerSlot::admitted(0, 0));
            };
            let lock = self.lock(line);
            let before = lock.load(Ordering::Acquire);
            // Held, or the line is being given to or taken from this slot: try again.
            if before & LOCK_HELD != 0 || linked_slot(before) != Some(slot) {
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: in bounds; volatile copies of plain integers (any bit pattern is valid),
            // which may be torn: the sequence check detects it.
            let (hot, rest): (PeerHot, PeerState) = unsafe {
                (
                    std::ptr::read_volatile(&raw const (*self.line_ptr(line)).hot),
                    std::ptr::read_volatile(state),
                )
            };
            fence(Ordering::Acquire);
            if lock.load(Ordering::Relaxed) == before {
                return Some(PeerSlot {
                    hot,
                    cold: rest.cold,
                    ring_us: rest.ring_us,
                });
            }
        }
        None
    }

    /// A consistent view of a slot (`PeerSlot::record`: its fields, and the window's sums,
    /// which the kernel does not keep, taken from the ring), or None if writers kept it busy.
    /// This is where the agent reads a slot: the kernel's layout stops here.
    pub fn record(&self, slot: u32) -> Option<PeerRecord> {
        self.copy(slot).map(|copy| copy.record())
    }

    /// Every slot's last-heard word (`monitor_common::last_heard`), the dense array the kernel
    /// stores into with every accepted heartbeat: the sweep walks it in order.
    pub fn last_heard_words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping holds `capacity` aligned u64 for as long as `self`; the kernel
        // and `reset` only ever store them whole, so atomic loads see whole words.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.capacity as usize) }
    }

    /// The slot's last-heard word.
    pub fn last_heard(&self, slot: u32) -> u64 {
        self.last_heard_words()[slot as usize].load(Ordering::Relaxed)
    }

    /// A consistent copy of a slot's intervals, oldest first, in microseconds.
    pub fn intervals(&self, slot: u32) -> Option<Vec<u32>> {
        self.snapshot(slot).map(|(_, ring)| ring)
    }

    /// A consistent copy of a slot's record and its window's intervals (oldest first, µs).
    pub fn snapshot(&self, slot: u32) -> Option<(PeerRecord, Vec<u32>)> {
        let copy = self.copy(slot)?;
        let window = (copy.hot.samples as usize).clamp(1, MAX_WINDOW) as u32;
        // The ring wraps at the configured window, which the slot does not store; while the
        // window is filling (or exactly full) `samples` is that window.
        let ring = window_intervals(&copy, window).collect();
        Some((copy.record(), ring))
    }

    /// [`Self::record`] for a client: retried for a while before the slot is reported busy.
    pub fn record_patiently(&self, slot: u32) -> Result<PeerRecord, Busy> {
        self.patiently(slot, || self.record(slot))
    }

    /// [`Self::snapshot`] for a client: retried for a while before the slot is reported busy.
    pub fn snapshot_patiently(&self, slot: u32) -> Result<(PeerRecord, Vec<u32>), Busy> {
        self.patiently(slot, || self.snapshot(slot))
    }

    fn patiently<T>(&self, slot: u32, mut read: impl FnMut() -> Option<T>) -> Result<T, Busy> {
        for round in 0..BUSY_ROUNDS {
            if round > 0 {
                std::thread::sleep(BUSY_PAUSE);
            }
            if let Some(value) = read() {
                return Ok(value);
            }
        }
        Err(Busy(slot))
    }

    /// Gives `line` (empty) to a peer in `slot`: the slot and its last-heard word become
    /// `fresh`'s, then the line's fields (its `overflow` kept), and the lock is given back with
    /// the link set, so the kernel finds the peer whole or not at all. The index decides the line
    /// (`peer_index`).
    pub(crate) fn fill(&self, line: u32, slot: u32, fresh: &PeerSlot) {
        let held = self.lock_line(line, false);
        debug_assert_eq!(linked_slot(held), None, "line {line} is taken");
        // SAFETY: we hold the line's lock, and no other line links to the slot.
        unsafe { self.write(line, slot, fresh) };
        self.unlock_line(line, held, link_of(slot));
        self.line_of[slot as usize].store(line + 1, Ordering::Release);
    }

    /// Takes `line` from the peer in `slot`: the lock is taken clearing the link (from then on
    /// the kernel finds no peer there), the line and the slot are emptied (the line's
    /// `overflow` kept), and the lock given back.
    pub(crate) fn empty(&self, line: u32, slot: u32) {
        self.line_of[slot as usize].store(0, Ordering::Release);
        let held = self.lock_line(line, true);
        // SAFETY: we hold the line's lock; the slot was linked to it until now.
        unsafe { self.write(line, slot, &PeerSlot::admitted(0, 0)) };
        self.unlock_line(line, held, 0);
    }

    /// Adds `delta` to the line's `overflow`, under its lock (a kernel writer holding the line
    /// never meets a count changing under it).
    pub(crate) fn add_overflow(&self, line: u32, delta: i8) {
        let held = self.lock_line(line, false);
        // SAFETY: we hold the line's lock; a byte.
        unsafe {
            let p = &raw mut (*self.line_ptr(line)).hot.overflow;
            std::ptr::write_volatile(p, std::ptr::read_volatile(p).wrapping_add_signed(delta));
        }
        self.unlock_line(line, held, held & LINK_BITS);
    }

    /// Writes `fresh` into `line` (all its hot fields but `overflow`), into `slot` and into the
    /// slot's last-heard word, so no word of the slot's previous peer is taken for this one's.
    ///
    /// # Safety
    /// The caller holds the line's lock, and the slot is this line's or no line's.
    unsafe fn write(&self, line: u32, slot: u32, fresh: &PeerSlot) {
        let ptr = self.line_ptr(line);
        // SAFETY: the caller's; plain integer fields.
        unsafe {
            let hot = PeerHot {
                overflow: std::ptr::read_volatile(&raw const (*ptr).hot.overflow),
                ..fresh.hot
            };
            std::ptr::write_volatile(&raw mut (*ptr).hot, hot);
            std::ptr::write_volatile(self.state_ptr(slot), fresh.state());
        }
        self.last_heard_words()[slot as usize]
            .store(last_heard::of_hot(&fresh.hot), Ordering::Relaxed);
    }

    /// Turns the kernel's per-arrival trace (`monitor record`) on or off for the slot, if it
    /// still belongs to `peer_id`. Returns whether it did.
    pub fn set_traced(&self, slot: u32, peer_id: u64, on: bool) -> bool {
        self.set_tell(slot, peer_id, TELL_ARRIVALS, on)
    }

    /// Asks the kernel to tell the next accepted heartbeat of the peer in `slot`
    /// (`TELL_HEARD`: an `ArrivalRecord` with `ARRIVAL_HEARD`, once), if the slot's line is
    /// still `peer_id`'s: None if it is not. Without the line's lock: a heartbeat that found
    /// the lock held would not be recorded (`contended`), and a suspected peer's next
    /// heartbeat is the one most likely to come while it is asked. The bit is set with an
    /// atomic OR (a full fence on x86), then a kernel writer holding the line is waited out:
    /// a heartbeat whose section began before the OR may have read the bit clear, and its
    /// last-heard word is visible once its section ended. So after `Some(true)` a heartbeat
    /// is either told or shown by the word, read again by the caller; `Some(false)`: the line
    /// stayed held (a writer that died holding it), and the caller looks again anyway.
    ///
    /// The line's owner does not change under the caller: lines are given and taken under
    /// the registry's write lock, and the caller (a sweep) holds it for reading.
    pub fn tell_when_heard(&self, slot: u32, peer_id: u64) -> Option<bool> {
        let line = self.line_of(slot)?;
        (linked_slot(self.lock(line).load(Ordering::Acquire)) == Some(slot)
            && self.line_id(line) == peer_id)
            .then_some(())?;
        self.tell_bits(line).fetch_or(TELL_HEARD, Ordering::SeqCst);
        let lock = self.lock(line);
        for _ in 0..TELL_WAIT_SPINS {
            if lock.load(Ordering::Acquire) & LOCK_HELD == 0 {
                return Some(true);
            }
            std::hint::spin_loop();
        }
        Some(false)
    }

    /// The line's `PeerHot::tell`, as an atomic byte: the agent sets and clears its bits with
    /// atomic operations, so neither an ask nor a recording's bit can undo the other.
    fn tell_bits(&self, line: u32) -> &AtomicU8 {
        // SAFETY: in bounds of the mapping; a byte the agent only ever changes atomically and
        // the kernel stores whole, under the line's lock.
        unsafe { AtomicU8::from_ptr(&raw mut (*self.line_ptr(line)).hot.tell) }
    }

    /// Sets (`on`) or clears `bits` of the slot's `PeerHot::tell`, if the slot still belongs
    /// to `peer_id` (checked under the line's lock, as a recording starts or ends).
    fn set_tell(&self, slot: u32, peer_id: u64, bits: u8, on: bool) -> bool {
        let Some(line) = self.line_of(slot) else {
            return false;
        };
        let held = self.lock_line(line, false);
        let ptr = self.line_ptr(line);
        // SAFETY: we hold the line's lock; a plain integer field.
        let ours = linked_slot(held) == Some(slot)
            && unsafe { std::ptr::read_volatile(&raw const (*ptr).hot.peer_id) } == peer_id;
        if ours {
            let tell = self.tell_bits(line);
            if on {
                tell.fetch_or(bits, Ordering::Relaxed);
            } else {
                tell.fetch_and(!bits, Ordering::Relaxed);
            }
        }
        self.unlock_line(line, held, held & LINK_BITS);
        ours
    }

    /// Takes the line's lock (its sequence counter from even to odd, as the kernel's writers do),
    /// clearing its link if `clear_link`; returns the lock word as held. A counter that stays
    /// odd at one value for [`STALE_LOCK`] was left so by a writer that died holding it (only an
    /// agent can: the kernel's writers run to completion): it is taken over rather than waited
    /// on for ever.
    fn lock_line(&self, line: u32, clear_link: bool) -> u64 {
        let lock = self.lock(line);
        let keep = if clear_link { !LINK_BITS } else { u64::MAX };
        let mut current = lock.load(Ordering::Relaxed);
        let mut odd_since: Option<(u64, std::time::Instant)> = None;
        loop {
            if current & LOCK_HELD != 0 {
                match odd_since {
                    Some((value, since)) if value == current => {
                        let taken = current.wrapping_add(2 * LOCK_SEQ_ONE) & keep;
                        if since.elapsed() >= STALE_LOCK
                            && lock
                                .compare_exchange(
                                    current,
                                    taken,
                                    Ordering::Acquire,
                                    Ordering::Relaxed,
                                )
                                .is_ok()
                        {
                            log::warn!(
                                "hot line {line}: its lock was held for {STALE_LOCK:?} by a writer that is gone; taken over"
                            );
                            return taken;
                        }
                    }
                    _ => odd_since = Some((current, std::time::Instant::now())),
                }
                std::hint::spin_loop();
                current = lock.load(Ordering::Relaxed);
                continue;
            }
            let taken = current.wrapping_add(LOCK_SEQ_ONE) & keep;
            match lock.compare_exchange_weak(current, taken, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return taken,
                Err(seen) => current = seen,
            }
        }
    }

    /// Gives back a lock taken as `held`, with `link` (the low half) as the line's link: one
    /// store, since nobody else changes the word while it is held.
    fn unlock_line(&self, line: u32, held: u64, link: u64) {
        debug_assert!(held & LOCK_HELD != 0);
        let next = (held.wrapping_add(LOCK_SEQ_ONE) & !LINK_BITS) | (link & LINK_BITS);
        self.lock(line).store(next, Ordering::Release);
    }

    /// Every peer the lines link to, as (id, slot), and the line of each slot noted (pinned
    /// state: the lines are the truth, the map is rebuilt from them). A line whose slot is out
    /// of range, or already another line's, is left out and logged.
    pub fn adopt_links(&self) -> Vec<(u64, u32)> {
        let mut peers = Vec::new();
        for line in 0..self.line_count {
            let Some(slot) = self.linked(line) else {
                continue;
            };
            if slot >= self.capacity || self.line_of(slot).is_some_and(|l| l != line) {
                log::warn!(
                    "hot line {line} links to slot {slot}, which is out of range or another line's: left out"
                );
                continue;
            }
            self.line_of[slot as usize].store(line + 1, Ordering::Release);
            peers.push((self.line_id(line), slot));
        }
        peers
    }

    /// Repairs the hot lines whose lock a dead agent left odd (SIGKILLed inside a fill, an
    /// emptying, an `overflow` change or [`Self::set_traced`] under `--persist`): the kernel
    /// counts every heartbeat of such a line as `contended` and drops it, for ever. Called when
    /// pinned state is adopted, before anything else writes: a lock found odd, and odd at the
    /// same value [`STALE_LOCK`] later, has no writer. Its record may be half written, so it is
    /// reset: to a peer of the line's id admitted now (of its slot's source) if the line still
    /// links to a slot (a fill gives the link only as it gives the lock back, an emptying
    /// takes it away as it takes the lock, so a link on a held line is a live peer's), else to
    /// an empty line. `overflow`s are kept.
    pub fn repair_stale_locks(&self, now_ns: u64) -> Vec<Repaired> {
        let odd: Vec<(u32, u64)> = (0..self.line_count)
            .map(|line| (line, self.lock(line).load(Ordering::Acquire)))
            .filter(|&(_, value)| value & LOCK_HELD != 0)
            .collect();
        if odd.is_empty() {
            return Vec::new();
        }
        std::thread::sleep(STALE_LOCK);
        let mut repaired = Vec::new();
        for (line, value) in odd {
            // Taken over (odd, ours), the record rewritten, then released (even).
            let held = value.wrapping_add(2 * LOCK_SEQ_ONE);
            if self
                .lock(line)
                .compare_exchange(value, held, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let peer = linked_slot(held)
                .filter(|&slot| slot < self.capacity)
                .map(|slot| (slot, self.line_id(line)));
            match peer {
                Some((slot, id)) => {
                    // SAFETY: in bounds; a byte stored whole.
                    let source = unsafe {
                        std::ptr::read_volatile(&raw const (*self.state_ptr(slot)).cold.source)
                    };
                    let fresh = PeerSlot::admitted_passive(id, now_ns, source);
                    // SAFETY: we hold the line's lock; the slot is its.
                    unsafe { self.write(line, slot, &fresh) };
                    self.unlock_line(line, held, held & LINK_BITS);
                }
                None => {
                    // SAFETY: we hold the line's lock; the empty line's fields only.
                    unsafe {
                        let ptr = self.line_ptr(line);
                        let hot = PeerHot {
                            overflow: std::ptr::read_volatile(&raw const (*ptr).hot.overflow),
                            ..PeerSlot::admitted(0, 0).hot
                        };
                        std::ptr::write_volatile(&raw mut (*ptr).hot, hot);
                    }
                    self.unlock_line(line, held, 0);
                }
            }
            repaired.push(Repaired { line, peer });
        }
        repaired
    }
}

/// How long a hot line's lock may stay odd at one value before it is taken for a dead writer's.
/// The kernel's writers hold it for well under a microsecond and the agent's for one slot's
/// reset, so 10 ms is thousands of times either.
pub const STALE_LOCK: std::time::Duration = std::time::Duration::from_millis(10);

impl Drop for PeerTable {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe {
            libc::munmap(self.lines.as_ptr().cast(), self.lines_bytes);
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
            libc::munmap(self.words.as_ptr().cast(), self.words_bytes);
        }
    }
}

const _: () = assert!(offset_of!(HotLine, lock) == 0);

#[cfg(test)]
impl PeerTable {
    /// A table over anonymous memory instead of BPF maps: the same protocol, no kernel.
    pub(crate) fn anonymous(capacity: u32) -> PeerTable {
        let line_count = monitor_common::index::lines_for(capacity);
        let (lines, lines_bytes) = anonymous_array::<HotLine>(line_count as usize);
        let (base, bytes) = anonymous_array::<PeerState>(capacity as usize);
        let (words, words_bytes) = anonymous_array::<u64>(capacity as usize);
        PeerTable::from_parts(
            (lines, line_count, lines_bytes),
            (base, bytes),
            (words, words_bytes),
            capacity,
        )
    }

    /// A heartbeat of `slot`'s peer (sequence `seq`, incarnation 1) arriving at `now_ns`,
    /// recorded as the kernel records it (`slot::arrive` under the line's lock) with the
    /// last-heard word it stores: what lets the agent's tests drive a peer on a virtual clock.
    /// The arrival the kernel would tell the agent of, if the agent asked
    /// (`slot::what_to_tell`, the kernel's own rule).
    pub(crate) fn arrive(
        &self,
        slot: u32,
        now_ns: u64,
        seq: u64,
        config: &monitor_common::config::XdpConfig,
    ) -> Option<monitor_common::maps::ArrivalRecord> {
        let mut copy = self.copy(slot).expect("a slot no writer holds");
        let line = self.line_of(slot).expect("a peer in the slot");
        let held = self.lock_line(line, false);
        let outcome = monitor_common::slot::arrive(&mut copy, now_ns, seq, 1, config);
        let told = monitor_common::slot::what_to_tell(&mut copy.hot, outcome);
        // SAFETY: we hold the line's lock, and the line links to the slot.
        unsafe { self.write(line, slot, &copy) };
        self.unlock_line(line, held, held & LINK_BITS);
        told.map(|outcome| monitor_common::maps::ArrivalRecord {
            peer_id: copy.hot.peer_id,
            at_ns: now_ns,
            seq,
            incarnation: 1,
            outcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with peer `id` admitted at 5 in `slot`, on `line`.
    fn with_peer(capacity: u32, slot: u32, line: u32, id: u64) -> PeerTable {
        let table = PeerTable::anonymous(capacity);
        table.fill(line, slot, &PeerSlot::admitted(id, 5));
        table
    }

    /// An ask to be told sets the bit without the lock, so a writer holding the line is
    /// never kept waiting on the agent; it waits the writer out instead, and says when it
    /// could not (the caller then looks again at once). Only the line's own peer is asked for,
    /// and a recording's bit and an ask never undo each other.
    #[test]
    fn an_ask_to_be_told_sets_its_bit_without_the_lock_and_waits_out_a_writer() {
        let table = with_peer(2, 1, 4, 7);
        assert_eq!(table.tell_when_heard(1, 8), None, "another peer's");
        assert_eq!(table.tell_when_heard(0, 7), None, "an empty slot");
        let before = table.lock(4).load(Ordering::Relaxed);
        assert_eq!(table.tell_when_heard(1, 7), Some(true));
        assert_eq!(
            table.lock(4).load(Ordering::Relaxed),
            before,
            "the lock untouched"
        );
        assert_eq!(table.record(1).map(|r| r.tell), Some(TELL_HEARD));
        // A writer in its section (odd) that never leaves it: set, but not sure.
        table.lock(4).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        assert_eq!(table.tell_when_heard(1, 7), Some(false));
        table.lock(4).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        assert!(table.set_traced(1, 7, true));
        assert_eq!(
            table.record(1).map(|r| r.tell),
            Some(TELL_HEARD | TELL_ARRIVALS)
        );
        assert!(table.set_traced(1, 7, false));
        assert_eq!(
            table.record(1).map(|r| r.tell),
            Some(TELL_HEARD),
            "the ask kept"
        );
    }

    #[test]
    fn a_slot_held_by_a_writer_is_busy_and_read_once_released() {
        let table = with_peer(2, 1, 4, 7);
        assert_eq!(table.line_of(1), Some(4));
        assert_eq!(table.record_patiently(1).map(|r| r.peer_id), Ok(7));
        // A writer holds the line (odd counter) through every attempt: busy, not a record.
        table.lock(4).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        assert_eq!(table.record(1), None);
        assert_eq!(table.record_patiently(1), Err(Busy(1)));
        assert_eq!(table.snapshot_patiently(1).map(|_| ()), Err(Busy(1)));
        // A writer that lets go within the retries: the patient read gets the value.
        let mut failures = BUSY_ROUNDS - 1;
        let read = || {
            if failures == 0 {
                return Some(7);
            }
            failures -= 1;
            None
        };
        assert_eq!(table.patiently(1, read), Ok(7));
        table.lock(4).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        let (record, ring) = table.snapshot_patiently(1).expect("read after release");
        assert_eq!((record.peer_id, ring.len()), (7, 0));
    }

    #[test]
    fn the_lock_word_keeps_the_link_in_its_low_half() {
        let table = with_peer(4, 2, 9, 7);
        let word = table.lock(9).load(Ordering::Relaxed);
        assert_eq!((word & LOCK_HELD, linked_slot(word)), (0, Some(2)));
        assert!(table.set_traced(2, 7, true));
        assert!(!table.set_traced(2, 8, true), "another peer's id");
        let after = table.lock(9).load(Ordering::Relaxed);
        assert_eq!(
            after >> 32,
            (word >> 32) + 4,
            "each taken and given back once"
        );
        assert_eq!(linked_slot(after), Some(2));
        // Emptied: no link, no line for the slot, an empty slot to read; `overflow` kept.
        table.add_overflow(9, 3);
        table.empty(9, 2);
        assert_eq!(
            (table.linked(9), table.line_of(2), table.overflow(9)),
            (None, None, 3)
        );
        assert_eq!(table.record(2).map(|r| r.peer_id), Some(0));
        assert_eq!(table.lock(9).load(Ordering::Relaxed) & LOCK_HELD, 0);
    }

    #[test]
    fn a_lock_left_odd_by_a_dead_writer_is_taken_over_not_waited_on() {
        let table = with_peer(2, 1, 4, 7);
        // A writer died holding the line.
        table.lock(4).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        let started = std::time::Instant::now();
        assert!(table.set_traced(1, 7, true));
        assert!(started.elapsed() >= STALE_LOCK);
        assert_eq!(
            table.lock(4).load(Ordering::Relaxed) & LOCK_HELD,
            0,
            "released"
        );
        assert_eq!(table.record(1).map(|r| (r.peer_id, r.tell)), Some((7, 1)));
    }

    #[test]
    fn adoption_repairs_the_lines_a_dead_agent_left_locked() {
        let table = PeerTable::anonymous(4);
        for (slot, id) in [(0, 10), (1, 11), (2, 12)] {
            table.fill(4 + slot, slot, &PeerSlot::admitted_passive(id, 5, 2));
        }
        assert!(table.repair_stale_locks(0).is_empty(), "nothing odd");
        // Peer 11's line and an empty one were left odd mid-write.
        for line in [5, 7] {
            table.lock(line).fetch_add(LOCK_SEQ_ONE, Ordering::AcqRel);
        }
        let repaired = table.repair_stale_locks(99);
        assert_eq!(
            repaired,
            [
                Repaired {
                    line: 5,
                    peer: Some((1, 11))
                },
                Repaired {
                    line: 7,
                    peer: None
                }
            ]
        );
        for line in 0..table.line_count() {
            assert_eq!(
                table.lock(line).load(Ordering::Relaxed) & LOCK_HELD,
                0,
                "line {line}"
            );
        }
        let r = table.record(1).expect("readable again");
        assert_eq!(
            (r.peer_id, r.last_arrival_ns, r.heartbeats, r.source),
            (11, 99, 0, 2)
        );
        assert_eq!(table.linked(7), None);
        assert_eq!(table.record(3).map(|r| r.peer_id), Some(0));
        assert_eq!(
            table.record(0).map(|r| r.last_arrival_ns),
            Some(5),
            "untouched"
        );
    }

    #[test]
    fn adopted_links_give_every_slot_its_line_back() {
        let table = PeerTable::anonymous(4);
        table.fill(2, 0, &PeerSlot::admitted(3, 5));
        table.fill(11, 3, &PeerSlot::admitted(1 << 40, 5));
        // The same lines, mapped afresh (as an agent adopting pinned state maps them).
        let again = PeerTable::from_parts(
            (table.lines, table.line_count, 0),
            (table.base, 0),
            (table.words, 0),
            table.capacity,
        );
        assert_eq!(again.line_of(0), None);
        assert_eq!(again.adopt_links(), [(3, 0), (1 << 40, 3)]);
        assert_eq!((again.line_of(0), again.line_of(3)), (Some(2), Some(11)));
        assert_eq!(again.record(3).map(|r| r.peer_id), Some(1 << 40));
        // Its drop must not unmap what `table` owns.
        std::mem::forget(again);
    }
}
