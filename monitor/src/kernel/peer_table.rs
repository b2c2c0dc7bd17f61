//! The peer slots and their last-heard words, read and written through mmaps of the two
//! BPF_F_MMAPABLE arrays: a full sweep costs memory reads, not one or two syscalls per peer.

use std::{
    io,
    mem::{offset_of, size_of},
    os::fd::{AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering, fence},
};

use monitor_common::{
    last_heard,
    maps::{MAX_WINDOW, PeerRecord, PeerSlot},
    slot::window_intervals,
};

/// Attempts at a consistent copy before giving up on a slot that keeps changing.
const READ_ATTEMPTS: usize = 64;
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

/// Shared mappings of the peer state array and of the last-heard words
/// (`monitor_common::last_heard`).
pub struct PeerTable {
    base: NonNull<PeerSlot>,
    words: NonNull<u64>,
    capacity: u32,
    bytes: usize,
    words_bytes: usize,
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
    /// Maps `capacity` slots of the peer state array (`state_fd`) and as many words of the
    /// last-heard array (`last_heard_fd`).
    pub fn map(
        state_fd: BorrowedFd<'_>,
        last_heard_fd: BorrowedFd<'_>,
        capacity: u32,
    ) -> Result<Self, PeerTableError> {
        let (base, bytes) = map_array::<PeerSlot>("peer state", state_fd, capacity)?;
        let (words, words_bytes) = match map_array::<u64>("last-heard", last_heard_fd, capacity) {
            Ok(mapping) => mapping,
            Err(e) => {
                // SAFETY: unmapping exactly what was just mapped.
                unsafe { libc::munmap(base.as_ptr().cast(), bytes) };
                return Err(e);
            }
        };
        Ok(Self {
            base,
            words,
            capacity,
            bytes,
            words_bytes,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    fn slot_ptr(&self, slot: u32) -> *mut PeerSlot {
        assert!(slot < self.capacity, "slot {slot} out of range");
        // SAFETY: in bounds of the mapping.
        unsafe { self.base.as_ptr().add(slot as usize) }
    }

    fn lock(&self, slot: u32) -> &AtomicU64 {
        // SAFETY: `lock` is the first field, 8-byte aligned in a page-aligned mapping, and is
        // only ever accessed atomically (here and by the kernel's atomic instructions).
        unsafe { AtomicU64::from_ptr(&raw mut (*self.slot_ptr(slot)).lock) }
    }

    /// A consistent copy of a slot, or None if writers kept it busy.
    fn copy(&self, slot: u32) -> Option<PeerSlot> {
        let lock = self.lock(slot);
        let src = self.slot_ptr(slot);
        for _ in 0..READ_ATTEMPTS {
            let before = lock.load(Ordering::Acquire);
            if before & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: in bounds; a volatile copy of plain integers (any bit pattern is valid),
            // which may be torn: the sequence check detects it.
            let copy: PeerSlot = unsafe { std::ptr::read_volatile(src) };
            fence(Ordering::Acquire);
            if lock.load(Ordering::Relaxed) == before {
                return Some(copy);
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

    /// Resets a slot to `fresh` (all but its lock) under the slot's lock, so a kernel writer
    /// still holding a stale pointer never interleaves with the reset; its last-heard word
    /// becomes the fresh slot's, so no word of the slot's previous peer is taken for this one's.
    pub fn reset(&self, slot: u32, fresh: &PeerSlot) {
        self.locked(slot, |ptr| {
            // SAFETY: we hold the slot's lock; the fields written are plain integers.
            unsafe { write_all_but_lock(ptr, fresh) };
            self.last_heard_words()[slot as usize]
                .store(last_heard::of_hot(&fresh.hot), Ordering::Relaxed);
        });
    }

    /// Turns the kernel's per-arrival trace (`monitor record`) on or off for the slot, if it
    /// still belongs to `peer_id`. Returns whether it did.
    pub fn set_traced(&self, slot: u32, peer_id: u64, on: bool) -> bool {
        self.locked(slot, |ptr| {
            // SAFETY: we hold the slot's lock; plain integer fields.
            unsafe {
                if std::ptr::read_volatile(&raw const (*ptr).hot.peer_id) != peer_id {
                    return false;
                }
                std::ptr::write_volatile(&raw mut (*ptr).hot.traced, on as u8);
                true
            }
        })
    }

    /// Runs `f` on the slot with its sequence counter held (odd), as the kernel's writers do.
    /// A counter that stays odd at one value for [`STALE_LOCK`] was left so by a writer that
    /// died holding it (only an agent can: the kernel's writers run to completion): it is
    /// taken over rather than waited on for ever.
    fn locked<T>(&self, slot: u32, f: impl FnOnce(*mut PeerSlot) -> T) -> T {
        let lock = self.lock(slot);
        let mut current = lock.load(Ordering::Relaxed);
        let mut odd_since: Option<(u64, std::time::Instant)> = None;
        loop {
            if current & 1 != 0 {
                match odd_since {
                    Some((value, since)) if value == current => {
                        if since.elapsed() >= STALE_LOCK
                            && lock
                                .compare_exchange(
                                    current,
                                    current + 2,
                                    Ordering::Acquire,
                                    Ordering::Relaxed,
                                )
                                .is_ok()
                        {
                            log::warn!(
                                "slot {slot}: its lock was held for {STALE_LOCK:?} by a writer that is gone; taken over"
                            );
                            break;
                        }
                    }
                    _ => odd_since = Some((current, std::time::Instant::now())),
                }
                std::hint::spin_loop();
                current = lock.load(Ordering::Relaxed);
                continue;
            }
            match lock.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        let result = f(self.slot_ptr(slot));
        lock.fetch_add(1, Ordering::Release);
        result
    }

    /// Repairs the slots whose lock a dead agent left odd (SIGKILLed inside [`Self::reset`] or
    /// [`Self::set_traced`] under `--persist`): the kernel counts every heartbeat of such a
    /// slot as `contended` and drops it, for ever. Called when pinned state is adopted, before
    /// anything else writes: a lock found odd, and odd at the same value [`STALE_LOCK`] later,
    /// has no writer. Its record may be half written, so it is reset: to a peer admitted now
    /// if the index still gives it an owner (`owner`), else to an empty slot. Returns the
    /// repaired slots with their owners.
    pub fn repair_stale_locks(
        &self,
        owner: impl Fn(u32) -> Option<u64>,
        now_ns: u64,
    ) -> Vec<(u32, Option<u64>)> {
        let odd: Vec<(u32, u64)> = (0..self.capacity)
            .map(|slot| (slot, self.lock(slot).load(Ordering::Acquire)))
            .filter(|&(_, value)| value & 1 != 0)
            .collect();
        if odd.is_empty() {
            return Vec::new();
        }
        std::thread::sleep(STALE_LOCK);
        let mut repaired = Vec::new();
        for (slot, value) in odd {
            let lock = self.lock(slot);
            // Taken over (odd, ours), the record rewritten, then released (even).
            if lock
                .compare_exchange(value, value + 2, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let id = owner(slot);
            let fresh = PeerSlot::admitted(id.unwrap_or(0), if id.is_some() { now_ns } else { 0 });
            // SAFETY: we hold the slot's lock; the fields written are plain integers.
            unsafe { write_all_but_lock(self.slot_ptr(slot), &fresh) };
            self.last_heard_words()[slot as usize]
                .store(last_heard::of_hot(&fresh.hot), Ordering::Relaxed);
            lock.fetch_add(1, Ordering::Release);
            repaired.push((slot, id));
        }
        repaired
    }
}

/// How long a slot's lock may stay odd at one value before it is taken for a dead writer's.
/// The kernel's writers hold it for well under a microsecond and the agent's for one slot's
/// reset, so 10 ms is thousands of times either.
pub const STALE_LOCK: std::time::Duration = std::time::Duration::from_millis(10);

impl Drop for PeerTable {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
            libc::munmap(self.words.as_ptr().cast(), self.words_bytes);
        }
    }
}

const _: () = assert!(offset_of!(PeerSlot, lock) == 0);

/// Writes every field of `fresh` but the lock into the slot at `ptr`.
///
/// # Safety
/// `ptr` is a slot of the mapping whose lock the caller holds.
unsafe fn write_all_but_lock(ptr: *mut PeerSlot, fresh: &PeerSlot) {
    // SAFETY: the caller's; plain integer fields.
    unsafe {
        std::ptr::write_volatile(&raw mut (*ptr).hot, fresh.hot);
        std::ptr::write_volatile(&raw mut (*ptr).cold, fresh.cold);
        std::ptr::write_volatile(&raw mut (*ptr).ring_us, fresh.ring_us);
    }
}

#[cfg(test)]
impl PeerTable {
    /// A table over anonymous memory instead of BPF maps: the same protocol, no kernel.
    pub(crate) fn anonymous(capacity: u32) -> PeerTable {
        let (base, bytes) = anonymous_array::<PeerSlot>(capacity as usize);
        let (words, words_bytes) = anonymous_array::<u64>(capacity as usize);
        PeerTable {
            base,
            words,
            capacity,
            bytes,
            words_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_held_by_a_writer_is_busy_and_read_once_released() {
        let table = PeerTable::anonymous(2);
        table.reset(1, &PeerSlot::admitted(7, 5));
        assert_eq!(table.record_patiently(1).map(|r| r.peer_id), Ok(7));
        // A writer holds the slot (odd counter) through every attempt: busy, not a record.
        table.lock(1).fetch_add(1, Ordering::AcqRel);
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
        table.lock(1).fetch_add(1, Ordering::AcqRel);
        let (record, ring) = table.snapshot_patiently(1).expect("read after release");
        assert_eq!((record.peer_id, ring.len()), (7, 0));
    }

    #[test]
    fn a_lock_left_odd_by_a_dead_writer_is_taken_over_not_waited_on() {
        let table = PeerTable::anonymous(2);
        table.reset(1, &PeerSlot::admitted(7, 5));
        // A writer died holding the slot.
        table.lock(1).fetch_add(1, Ordering::AcqRel);
        let started = std::time::Instant::now();
        assert!(table.set_traced(1, 7, true));
        assert!(started.elapsed() >= STALE_LOCK);
        assert_eq!(table.lock(1).load(Ordering::Relaxed) & 1, 0, "released");
        assert_eq!(table.record(1).map(|r| (r.peer_id, r.traced)), Some((7, 1)));
    }

    #[test]
    fn adoption_repairs_the_slots_a_dead_agent_left_locked() {
        let table = PeerTable::anonymous(4);
        for (slot, id) in [(0, 10), (1, 11), (2, 12)] {
            table.reset(slot, &PeerSlot::admitted(id, 5));
        }
        assert!(
            table.repair_stale_locks(|_| None, 0).is_empty(),
            "nothing odd"
        );
        // Slot 1 (peer 11) and slot 3 (free) were left odd mid-write.
        for slot in [1, 3] {
            table.lock(slot).fetch_add(1, Ordering::AcqRel);
        }
        let owner = |slot| [Some(10), Some(11), Some(12), None][slot as usize];
        let repaired = table.repair_stale_locks(owner, 99);
        assert_eq!(repaired, [(1, Some(11)), (3, None)]);
        for slot in 0..4 {
            assert_eq!(
                table.lock(slot).load(Ordering::Relaxed) & 1,
                0,
                "slot {slot}"
            );
        }
        let r = table.record(1).expect("readable again");
        assert_eq!((r.peer_id, r.last_arrival_ns, r.heartbeats), (11, 99, 0));
        assert_eq!(table.record(3).map(|r| r.peer_id), Some(0));
        assert_eq!(
            table.record(0).map(|r| r.last_arrival_ns),
            Some(5),
            "untouched"
        );
    }
}
