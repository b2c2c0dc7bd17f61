//! Which peer owns which slot. Userspace owns slot allocation: the kernel only ever finds a
//! peer id's hot line in PEER_HOT (written here, through its mmap, `peer_index`) and writes the
//! line and the slot it links to. An id of 1 to the capacity gets slot `id - 1` whenever that
//! slot is free, the index of its own hot line (`index::own_line`), so a fleet numbered 1 to N
//! has its lines and its slots dense and in the same order. Adoption rebuilds the registry from
//! the lines' links.

use std::collections::HashMap;

use monitor_common::{
    index::own_line,
    maps::PeerSlot,
    passive::{SOURCE_HEARTBEAT, is_derived_id},
};

use crate::{
    kernel::peer_index::{IndexFull, PeerIndex},
    kernel::peer_table::PeerTable,
};

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("peer {0} is already admitted")]
    Exists(u64),
    #[error("no free slot: all {0} slots are in use (raise --capacity)")]
    Full(u32),
    #[error("writing peer {id} into the kernel's hot-line table: {source}")]
    Index { id: u64, source: IndexFull },
    #[error(
        "peer id {0:#x} has its top bit set: with --bfd or --udp-port that half of the id space names BFD sessions and UDP flows (docs/passive.md); give the sender an id below 2^63"
    )]
    Reserved(u64),
}

#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("unknown peer {0}")]
    Unknown(u64),
}

/// Slot allocation and the peer id -> slot index, kept identical in userspace and the kernel.
pub struct Registry {
    index: PeerIndex,
    slots: HashMap<u64, u32>,
    /// The owner of each slot up to the highest handed out (None: free), for dense sweeps.
    owners: Vec<Option<u64>>,
    /// Slots given back, to hand out again; one an id has since taken as its own is passed
    /// over when popped.
    free: Vec<u32>,
    /// No slot below it was never handed out (but those ids took as their own, at or above it).
    next_unused: u32,
    capacity: u32,
    /// Passive sources are watched: heartbeat ids in the derived half are refused
    /// (`monitor_common::passive::DERIVED_ID_BIT`), as the kernel refuses their heartbeats.
    derived_ids_reserved: bool,
}

impl Registry {
    pub fn new(index: PeerIndex, capacity: u32) -> Self {
        Self {
            index,
            slots: HashMap::new(),
            owners: Vec::new(),
            free: Vec::new(),
            next_unused: 0,
            capacity,
            derived_ids_reserved: false,
        }
    }

    /// Refuse heartbeat peers whose id lies in the half that derived ids use; on when
    /// passive sources are watched.
    pub fn reserve_derived_ids(&mut self, on: bool) {
        self.derived_ids_reserved = on;
    }

    /// The registry of pinned state: every (id, slot) the kernel's hot lines link to
    /// (`PeerTable::adopt_links`).
    pub fn adopt(index: PeerIndex, capacity: u32, peers: &[(u64, u32)]) -> Self {
        let mut registry = Self::new(index, capacity);
        let used = peers.iter().map(|&(_, slot)| slot + 1).max().unwrap_or(0);
        registry.owners = vec![None; used as usize];
        for &(id, slot) in peers {
            registry.slots.insert(id, slot);
            registry.owners[slot as usize] = Some(id);
        }
        registry.next_unused = used;
        registry.free = (0..used)
            .filter(|&s| registry.owners[s as usize].is_none())
            .rev()
            .collect();
        registry
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn slot_of(&self, id: u64) -> Option<u32> {
        self.slots.get(&id).copied()
    }

    /// Slots handed out so far (free or not): every admitted peer's slot is below this.
    pub fn slots_in_use(&self) -> u32 {
        self.owners.len() as u32
    }

    /// The peer that owns `slot`, if any.
    pub fn owner(&self, slot: u32) -> Option<u64> {
        self.owners.get(slot as usize).copied().flatten()
    }

    /// Every admitted peer as (id, slot), in slot order: a dense walk of the array.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.owners
            .iter()
            .enumerate()
            .filter_map(|(slot, owner)| owner.map(|id| (id, slot as u32)))
    }

    /// Gives `id` a slot whose silence starts at `now_ns`. The slot and its hot line are filled
    /// before the line links to the slot, so the kernel never sees a half-made peer.
    pub fn admit(&mut self, table: &PeerTable, id: u64, now_ns: u64) -> Result<u32, AdmitError> {
        self.admit_as(table, id, now_ns, SOURCE_HEARTBEAT)
    }

    /// [`Self::admit`] for a peer of `source` (`monitor_common::passive`): the kernel records
    /// a passive source's packets only into a slot stamped with their source.
    pub fn admit_as(
        &mut self,
        table: &PeerTable,
        id: u64,
        now_ns: u64,
        source: u8,
    ) -> Result<u32, AdmitError> {
        if self.derived_ids_reserved && source == SOURCE_HEARTBEAT && is_derived_id(id) {
            return Err(AdmitError::Reserved(id));
        }
        self.admit_slot(table, PeerSlot::admitted_passive(id, now_ns, source))
    }

    fn admit_slot(&mut self, table: &PeerTable, fresh: PeerSlot) -> Result<u32, AdmitError> {
        let id = fresh.hot.peer_id;
        if self.slots.contains_key(&id) {
            return Err(AdmitError::Exists(id));
        }
        let slot = self.pick_slot(id)?;
        if let Err(source) = self.index.insert(table, slot, &fresh) {
            self.free.push(slot);
            return Err(AdmitError::Index { id, source });
        }
        self.slots.insert(id, slot);
        if slot as usize >= self.owners.len() {
            self.owners.resize(slot as usize + 1, None);
        }
        self.owners[slot as usize] = Some(id);
        Ok(slot)
    }
}

impl Registry {
    /// A free slot for `id`: its own if free, else one given back, else the lowest never
    /// handed out.
    fn pick_slot(&mut self, id: u64) -> Result<u32, AdmitError> {
        if self.slots.len() >= self.capacity as usize {
            return Err(AdmitError::Full(self.capacity));
        }
        if let Some(own) = own_line(id, self.capacity).filter(|&s| self.is_free(s)) {
            return Ok(own);
        }
        while let Some(slot) = self.free.pop() {
            if self.is_free(slot) {
                return Ok(slot);
            }
        }
        while !self.is_free(self.next_unused) {
            self.next_unused += 1;
        }
        // Below the capacity: fewer peers than slots, and none free below `next_unused`.
        Ok(self.next_unused)
    }

    fn is_free(&self, slot: u32) -> bool {
        self.owners.get(slot as usize).is_none_or(Option::is_none)
    }
}

impl Registry {
    /// Stops watching `id` and frees its slot; returns the slot. Its hot line loses its link as
    /// its lock is taken, so the kernel stops finding the peer, and a CPU that found the line
    /// just before sees no link under the lock and leaves it alone; line and slot are then
    /// emptied.
    pub fn forget(&mut self, table: &PeerTable, id: u64) -> Result<u32, ForgetError> {
        let slot = *self.slots.get(&id).ok_or(ForgetError::Unknown(id))?;
        let removed = self.index.remove(table, id);
        debug_assert_eq!(
            removed,
            Some(slot),
            "peer {id} was not in the kernel's lines"
        );
        self.slots.remove(&id);
        self.owners[slot as usize] = None;
        self.free.push(slot);
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(capacity: u32) -> (Registry, PeerTable) {
        (
            Registry::new(PeerIndex::anonymous(capacity), capacity),
            PeerTable::anonymous(capacity),
        )
    }

    fn admit(r: &mut Registry, t: &PeerTable, id: u64) -> u32 {
        r.admit(t, id, 1)
            .unwrap_or_else(|e| panic!("admit {id}: {e}"))
    }

    #[test]
    fn an_id_from_one_to_the_capacity_gets_its_own_slot_in_any_order() {
        let (mut r, t) = registry(8);
        for id in [5, 1, 8, 3] {
            assert_eq!(admit(&mut r, &t, id), id as u32 - 1);
        }
        // The others take the lowest slots no id has taken.
        assert_eq!(admit(&mut r, &t, 1 << 40), 1);
        assert_eq!(
            admit(&mut r, &t, 9),
            3,
            "past the capacity: no slot of its own"
        );
        assert_eq!(r.slots_in_use(), 8, "the sweep covers the highest own slot");
        let owned: Vec<(u64, u32)> = r.iter().collect();
        assert_eq!(
            owned,
            [(1, 0), (1 << 40, 1), (3, 2), (9, 3), (5, 4), (8, 7)]
        );
        // And the kernel finds each through its hot line, linked to that slot.
        for (id, slot) in owned {
            assert_eq!(r.slot_of(id), Some(slot));
            assert_eq!(r.index.get(&t, id), Some(slot));
            assert_eq!(t.record(slot).unwrap().peer_id, id);
        }
    }

    #[test]
    fn a_taken_own_slot_falls_back_and_every_slot_is_used_before_full() {
        let (mut r, t) = registry(4);
        assert_eq!(admit(&mut r, &t, 100), 0);
        assert_eq!(admit(&mut r, &t, 1), 1, "its own slot 0 is taken");
        assert_eq!(admit(&mut r, &t, 3), 2);
        assert_eq!(admit(&mut r, &t, 2), 3, "its own slot 1 is taken");
        assert!(matches!(r.admit(&t, 4, 1), Err(AdmitError::Full(4))));
        // A slot given back is its owner's again if the id comes back...
        assert_eq!(r.forget(&t, 3).unwrap(), 2);
        assert_eq!(admit(&mut r, &t, 3), 2);
        // ...and anyone's otherwise; a freed slot an id took as its own is passed over.
        assert_eq!(r.forget(&t, 1).unwrap(), 1);
        assert_eq!(r.forget(&t, 100).unwrap(), 0);
        assert_eq!(admit(&mut r, &t, 1), 0, "its own slot is free now");
        assert_eq!(
            admit(&mut r, &t, 7),
            1,
            "given back by 1, not by 100: 1's own was taken"
        );
        assert!(matches!(r.admit(&t, 8, 1), Err(AdmitError::Full(4))));
    }

    #[test]
    fn an_adopted_registry_hands_out_the_gaps_first() {
        let (mut r, t) = registry(8);
        for id in [2, 6] {
            admit(&mut r, &t, id);
        }
        let adopted = Registry::adopt(r.index, 8, &t.adopt_links());
        let mut r = adopted;
        assert_eq!(r.len(), 2);
        assert_eq!(admit(&mut r, &t, 1 << 40), 0);
        assert_eq!(admit(&mut r, &t, 1 << 41), 2);
        assert_eq!(admit(&mut r, &t, 4), 3);
        assert_eq!(
            admit(&mut r, &t, 1 << 42),
            4,
            "the last gap below the highest adopted slot"
        );
    }
}
