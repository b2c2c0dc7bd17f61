//! Surviving restarts: the XDP link, the program and every map pinned in bpffs, so the program
//! keeps recording while no agent runs (stopped, upgraded, even SIGKILLed), and the next agent
//! adopts the pinned state with every window intact. Removal is explicit (`monitor detach`).
//!
//! Layout of a pin directory: `link` (the XDP attachment), `prog`, one file per map, and
//! `batch-programs`, the program array through which `prog` hands a packet of several
//! heartbeats to its batch program (`program::XDP_BATCH_PROGRAMS_MAP`).
//!
//! Upgrades: an agent of a newer build adopting pinned state whose program is another build's
//! (the kernel's tags differ) loads its own program on the pinned maps and swaps it into the
//! pinned link with BPF_LINK_UPDATE, one atomic step with no detach: every packet runs the old
//! program or the new one, both recording into the same maps (`replace_program`). That needs
//! every pinned map laid out as this build's object declares it (`check_layouts`); pinned state
//! of another layout is refused, with what to do.

use crate::kernel::maps::KernelMaps;
use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{Array, Map, MapData},
    programs::{
        Xdp,
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
    },
};
use aya_obj::programs::XdpAttachType;
use monitor_common::{
    last_heard::LAST_HEARD_MAP,
    maps::{
        ARRIVALS_MAP, AUTH_KEYS_MAP, COUNTERS_MAP, LAYOUT_VERSION, LOCAL_ADDRS_MAP, LOCAL_FAST_MAP,
        META_MAGIC, META_MAP, PEER_HOT_MAP, PEER_STATE_MAP, PeerState, PinnedMeta,
        UNKNOWN_PEERS_MAP,
    },
};

use crate::{
    kernel::peer_index::PeerIndex, kernel::peer_table::PeerTable, kernel::program,
    kernel::registry::Registry,
};

/// Every map, in the order they are pinned.
pub const MAPS: [&str; 10] = [
    PEER_HOT_MAP,
    PEER_STATE_MAP,
    COUNTERS_MAP,
    UNKNOWN_PEERS_MAP,
    ARRIVALS_MAP,
    AUTH_KEYS_MAP,
    META_MAP,
    LOCAL_ADDRS_MAP,
    LOCAL_FAST_MAP,
    LAST_HEARD_MAP,
];
const LINK: &str = "link";
const PROG: &str = "prog";
/// Where an upgrade pins the new program before renaming it over `prog`.
const PROG_NEXT: &str = "prog-next"; // bpffs refuses names with dots
/// The pinned program's batch program array. Not one of `MAPS`: every load has its own (an
/// upgrade's program calls its own build's batch program, never the old one's), pinned here in
/// place of the last. Pinned because the kernel empties a program array when its last user
/// reference closes: the agent's exit would leave the program recording only the first
/// heartbeat of such a packet.
const BATCH_PROGRAMS: &str = "batch-programs";
const BATCH_PROGRAMS_NEXT: &str = "batch-programs-next";

/// Where the agent pins its state unless told otherwise.
pub fn default_pin_path(iface: &str) -> PathBuf {
    PathBuf::from("/sys/fs/bpf/heartbeat-monitor").join(iface)
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{0} is not on a bpf filesystem; mount one (`mount -t bpf bpf DIR`) and pin below it")]
    NotBpffs(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("pinned state at {path}: {message}")]
    Aya { path: PathBuf, message: String },
    #[error(
        "pinned state at {path} was written by a build with map layout v{found} (slot size {slot}); \
         this build reads v{LAYOUT_VERSION} (slot size {ours}). Remove it with `monitor detach` \
         (the pinned windows are lost) or run the matching build"
    )]
    Layout {
        path: PathBuf,
        found: u32,
        slot: u32,
        ours: usize,
    },
    #[error(
        "the pinned program at {path} runs with {setting} = {pinned}, but this agent was started \
         with {wanted}; start it with the same settings, or `monitor detach` first"
    )]
    Mismatch {
        path: PathBuf,
        setting: &'static str,
        pinned: String,
        wanted: String,
    },
    #[error(
        "cannot upgrade the pinned state at {path}: its map {map} is {pinned}, this build's is \
         {ours}, so this build's program cannot run on it. Keep running the build that pinned \
         it, or stop it and remove the pinned state with `monitor detach --pin-path {path}` \
         (its windows and counters are lost), then start this build"
    )]
    MapLayout {
        path: PathBuf,
        map: &'static str,
        pinned: MapLayout,
        ours: MapLayout,
    },
    #[error(
        "{at} has no bpf filesystem and this agent runs in a mount namespace of its own (not \
         the one of PID 1 or of its parent, e.g. under `ip netns exec` or a unit with \
         PrivateMounts=): a bpffs \
         it mounted, and every pin in it, would end with the agent, so --persist would keep \
         nothing. Mount bpffs where the namespace of PID 1 sees it (`mount -t bpf bpf \
         /sys/fs/bpf` on the host) and pass it in, or pin with --pin-path on a bpffs that \
         outlives the agent, or run without --persist"
    )]
    PrivateMountNamespace { at: PathBuf },
}

/// How a map is laid out, as BPF_MAP_CREATE took it: what a program loaded on it relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLayout {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

impl std::fmt::Display for MapLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "type {}, key {} B, value {} B, {} entries, flags {:#x}",
            self.map_type, self.key_size, self.value_size, self.max_entries, self.flags
        )
    }
}

fn aya_err(path: &Path, e: impl std::fmt::Display) -> PinError {
    PinError::Aya {
        path: path.into(),
        message: e.to_string(),
    }
}

/// Whether `dir` holds pinned state to adopt.
pub fn has_state(dir: &Path) -> bool {
    dir.join(LINK).exists()
}

/// Pins every map of a freshly loaded object (before the maps are taken out of it).
pub fn pin_maps(dir: &Path, ebpf: &Ebpf) -> Result<(), PinError> {
    for name in MAPS {
        let map = ebpf
            .map(name)
            .ok_or_else(|| aya_err(dir, format!("no map {name}")))?;
        map.pin(dir.join(name))
            .map_err(|e| aya_err(dir, format!("pinning map {name}: {e}")))?;
    }
    Ok(())
}

/// Pins `ebpf`'s batch program array as `BATCH_PROGRAMS` in place of any before it: pinned
/// beside it, then renamed over it, so the pin is always one whole array or the other.
fn pin_batch_programs(dir: &Path, ebpf: &Ebpf) -> Result<(), String> {
    let map = ebpf
        .map(program::XDP_BATCH_PROGRAMS_MAP)
        .ok_or_else(|| format!("no map {}", program::XDP_BATCH_PROGRAMS_MAP))?;
    let next = dir.join(BATCH_PROGRAMS_NEXT);
    let _ = std::fs::remove_file(&next);
    map.pin(&next)
        .map_err(|e| format!("pinning the batch program array: {e}"))?;
    std::fs::rename(&next, dir.join(BATCH_PROGRAMS))
        .map_err(|e| format!("pinning the batch program array: {e}"))
}

/// Records what the pinned state is, then pins the program and its XDP link: from here on
/// the program outlives the agent.
pub fn pin_program(
    dir: &Path,
    ebpf: &mut Ebpf,
    link_id: XdpLinkId,
    meta: PinnedMeta,
    meta_map: &mut Array<MapData, PinnedMeta>,
) -> Result<PinnedLink, PinError> {
    meta_map.set(0, meta, 0).map_err(|e| aya_err(dir, e))?;
    pin_batch_programs(dir, ebpf).map_err(|e| aya_err(dir, e))?;
    let xdp = program::xdp_mut(ebpf).map_err(|e| aya_err(dir, e))?;
    xdp.pin(dir.join(PROG))
        .map_err(|e| aya_err(dir, format!("pinning the program: {e}")))?;
    let link = xdp.take_link(link_id).map_err(|e| aya_err(dir, e))?;
    let fd_link: FdLink = link.try_into().map_err(|e| {
        aya_err(
            dir,
            format!("the XDP attachment is not a bpf_link ({e}); pinning needs kernel 5.9+"),
        )
    })?;
    fd_link
        .pin(dir.join(LINK))
        .map_err(|e| aya_err(dir, format!("pinning the link: {e}")))
}

/// Pinned state, opened.
pub struct Adopted {
    pub maps: KernelMaps,
    pub meta: PinnedMeta,
    /// The program the pinned link runs now.
    pub program_fd: OwnedFd,
    /// Its tag.
    pub tag: program::Tag,
    /// Holding it keeps nothing alive that the pin does not: dropping it leaves the program
    /// attached.
    pub link: PinnedLink,
}

/// The layout of every map of `pinning::MAPS` as this build's object declares it, sized for
/// `capacity` as the loader sizes it.
pub fn object_layouts(capacity: u32) -> Result<Vec<(&'static str, MapLayout)>, String> {
    let object = aya_obj::Object::parse(program::OBJECT)
        .map_err(|e| format!("parsing this build's eBPF object: {e}"))?;
    MAPS.iter()
        .map(|&name| {
            let map = object
                .maps
                .get(name)
                .ok_or_else(|| format!("this build's eBPF object has no map {name}"))?;
            let max_entries = match name {
                PEER_HOT_MAP => monitor_common::index::lines_for(capacity),
                PEER_STATE_MAP | LAST_HEARD_MAP => capacity,
                _ => map.max_entries(),
            };
            Ok((
                name,
                MapLayout {
                    map_type: map.map_type(),
                    key_size: map.key_size(),
                    value_size: map.value_size(),
                    max_entries,
                    flags: map.map_flags(),
                },
            ))
        })
        .collect()
}

/// The layout of the map pinned as `name` under `dir`.
fn pinned_layout(dir: &Path, name: &str) -> Result<MapLayout, PinError> {
    let map = MapData::from_pin(dir.join(name))
        .map_err(|e| aya_err(dir, format!("opening map {name}: {e}")))?;
    let info: aya_obj::generated::bpf_map_info = program::object_info(map.fd().as_fd())
        .map_err(|e| aya_err(dir, format!("reading map {name}'s info: {e}")))?;
    Ok(MapLayout {
        map_type: info.type_,
        key_size: info.key_size,
        value_size: info.value_size,
        max_entries: info.max_entries,
        flags: info.map_flags,
    })
}

/// Refuses pinned state any map of which is laid out otherwise than this build's object
/// declares it (type, key and value sizes, entries, flags): this build's program could not
/// run on it. The meta record's layout version says the same of the peer slot; this also
/// catches a map changed without it.
pub fn check_layouts(dir: &Path, capacity: u32) -> Result<(), PinError> {
    for (name, ours) in object_layouts(capacity).map_err(|e| aya_err(dir, e))? {
        let pinned = pinned_layout(dir, name)?;
        if pinned != ours {
            return Err(PinError::MapLayout {
                path: dir.into(),
                map: name,
                pinned,
                ours,
            });
        }
    }
    Ok(())
}

/// The program the link pinned under `dir` runs now, and its tag. It is the one pinned as
/// `prog` (an upgrade renames the new program's pin over it), opened through that pin:
/// opening a program by its id (BPF_PROG_GET_FD_BY_ID) needs CAP_SYS_ADMIN, which the
/// service does not have. Only if `prog` is another program (an upgrade that could not re-pin)
/// is the link's own program opened by id.
pub fn linked_program(dir: &Path) -> Result<(OwnedFd, program::Tag), PinError> {
    let link = PinnedLink::from_pin(dir.join(LINK)).map_err(|e| aya_err(dir, e))?;
    let fd_link: FdLink = link.into();
    let linked = fd_link.info().map_err(|e| aya_err(dir, e))?.program_id();
    let pinned = Xdp::from_pin(dir.join(PROG), XdpAttachType::Interface)
        .map_err(|e| aya_err(dir, e))
        .and_then(|program| {
            program
                .fd()
                .map_err(|e| aya_err(dir, e))?
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| aya_err(dir, e))
        });
    let fd = match pinned {
        Ok(fd)
            if program::run_stats(fd.as_fd())
                .map(|info| info.id == linked)
                .unwrap_or(false) =>
        {
            fd
        }
        _ => program::program_fd_by_id(linked).map_err(|e| {
            aya_err(
                dir,
                format!(
                    "the pinned link runs program {linked}, which is not the one pinned as \
                     {PROG}, and opening it by id failed ({e}; that needs CAP_SYS_ADMIN)"
                ),
            )
        })?,
    };
    let tag = program::tag(fd.as_fd())
        .map_err(|e| aya_err(dir, format!("reading the linked program's tag: {e}")))?;
    Ok((fd, tag))
}

/// Swaps the XDP program of `ebpf` (loaded on the pinned maps, see `program::load_on_pins`)
/// into the link pinned under `dir` with BPF_LINK_UPDATE: atomic, the interface is never
/// without a program. Then pins it as `prog` in place of the old one (pinned beside it and
/// renamed over it, so `prog` is always one or the other), which unloads the old program; if
/// that fails the swap stands (adoption follows the link, not `prog`) and it is logged.
/// Returns the new program's fd.
pub fn replace_program(dir: &Path, ebpf: &mut Ebpf) -> Result<OwnedFd, PinError> {
    let link = PinnedLink::from_pin(dir.join(LINK)).map_err(|e| aya_err(dir, e))?;
    let link: XdpLink = FdLink::from(link)
        .try_into()
        .map_err(|e| aya_err(dir, format!("the pinned link is not an XDP link: {e}")))?;
    let xdp = program::xdp_mut(ebpf).map_err(|e| aya_err(dir, e))?;
    let id = xdp.attach_to_link(link).map_err(|e| {
        aya_err(
            dir,
            format!("replacing the program in the pinned link: {e}"),
        )
    })?;
    // Swapped. The pin holds the attachment; our fd on it is not needed (closing it detaches
    // nothing).
    if let Ok(link) = xdp.take_link(id) {
        drop(link);
    }
    let next = dir.join(PROG_NEXT);
    let _ = std::fs::remove_file(&next);
    let repinned = xdp
        .pin(&next)
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::rename(&next, dir.join(PROG)).map_err(|e| e.to_string()));
    if let Err(e) = repinned {
        log::warn!(
            "the new program runs in the pinned link, but pinning it as {} failed ({e}); the old \
             program stays loaded under that pin until `monitor detach`",
            dir.join(PROG).display()
        );
    }
    let fd = xdp
        .fd()
        .map_err(|e| aya_err(dir, e))?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| aya_err(dir, e))?;
    if let Err(e) = pin_batch_programs(dir, ebpf) {
        log::warn!(
            "the new program runs in the pinned link, but pinning its batch program array failed \
             ({e}): while no agent runs, it records only the first heartbeat of a packet of \
             several (a UDP GSO batch, GRO)"
        );
    }
    Ok(fd)
}

pub(crate) fn open(dir: &Path, name: &str) -> Result<Map, PinError> {
    let data = MapData::from_pin(dir.join(name))
        .map_err(|e| aya_err(dir, format!("opening map {name}: {e}")))?;
    Map::from_map_data(data).map_err(|e| aya_err(dir, e))
}

/// `--udp-port`'s ports as the flag spells them (`53,514`; `(none)` without the flag).
fn ports_text(ports: &[u16]) -> String {
    let set: Vec<String> = ports
        .iter()
        .filter(|&&p| p != 0)
        .map(u16::to_string)
        .collect();
    if set.is_empty() {
        "(none)".into()
    } else {
        set.join(",")
    }
}

/// Refuses a META record of another size than this build's, naming the layout that wrote it
/// where it can be read (layouts up to 11 had a 48-byte record, without the index key).
fn refuse_other_meta_size(dir: &Path) -> Result<(), PinError> {
    let size = pinned_layout(dir, META_MAP)?.value_size;
    if size as usize == size_of::<PinnedMeta>() {
        return Ok(());
    }
    let (found, slot) = if size == 48 {
        let old: Array<MapData, [u8; 48]> = open(dir, META_MAP)?
            .try_into()
            .map_err(|e| aya_err(dir, e))?;
        let bytes = old.get(&0, 0).map_err(|e| aya_err(dir, e))?;
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        (word(8), word(12))
    } else {
        (0, 0)
    };
    Err(PinError::Layout {
        path: dir.into(),
        found,
        slot,
        ours: size_of::<PeerState>(),
    })
}

/// Opens pinned state after checking it is of this build's layout and of `expected`'s settings.
pub fn adopt(dir: &Path, expected: &PinnedMeta) -> Result<Adopted, PinError> {
    refuse_other_meta_size(dir)?;
    let meta_map: Array<MapData, PinnedMeta> = open(dir, META_MAP)?
        .try_into()
        .map_err(|e| aya_err(dir, e))?;
    let meta = meta_map.get(&0, 0).map_err(|e| aya_err(dir, e))?;
    if meta.magic != META_MAGIC
        || meta.layout_version != LAYOUT_VERSION
        || meta.slot_size as usize != size_of::<PeerState>()
    {
        return Err(PinError::Layout {
            path: dir.into(),
            found: meta.layout_version,
            slot: meta.slot_size,
            ours: size_of::<PeerState>(),
        });
    }
    // (setting, how the command line says it, pinned value, this agent's value): the first that
    // differs is refused.
    let settings = [
        (
            "port",
            "--port ",
            meta.port.to_string(),
            expected.port.to_string(),
        ),
        (
            "window",
            "--window ",
            meta.window.to_string(),
            expected.window.to_string(),
        ),
        (
            "capacity",
            "--capacity ",
            meta.capacity.to_string(),
            expected.capacity.to_string(),
        ),
        (
            "UDP flow ports",
            "--udp-port ",
            ports_text(&meta.flow_ports),
            ports_text(&expected.flow_ports),
        ),
        (
            "flags (authentication, pass-through, gapless window, destination check, BFD)",
            "",
            format!("{:#x}", meta.flags),
            format!("{:#x}", expected.flags),
        ),
        (
            "max interval (us)",
            "",
            meta.max_interval_us.to_string(),
            expected.max_interval_us.to_string(),
        ),
        (
            "outage factor",
            "--outage-factor ",
            meta.outage_factor.to_string(),
            expected.outage_factor.to_string(),
        ),
    ];
    if let Some((setting, flag, pinned, wanted)) = settings.into_iter().find(|(_, _, p, w)| p != w)
    {
        return Err(PinError::Mismatch {
            path: dir.into(),
            setting,
            pinned,
            wanted: format!("{flag}{wanted}"),
        });
    }
    check_layouts(dir, meta.capacity)?;

    let table = match (
        open(dir, PEER_HOT_MAP)?,
        open(dir, PEER_STATE_MAP)?,
        open(dir, LAST_HEARD_MAP)?,
    ) {
        (Map::Array(hot), Map::Array(state), Map::Array(words)) => PeerTable::map(
            hot.fd().as_fd(),
            state.fd().as_fd(),
            words.fd().as_fd(),
            meta.capacity,
            monitor_common::index::lines_for(meta.capacity),
        )
        .map_err(|e| aya_err(dir, e))?,
        _ => {
            return Err(aya_err(
                dir,
                "PEER_HOT, PEER_STATE or LAST_HEARD is not an array",
            ));
        }
    };
    // Before anything writes a line: a dead agent's odd lock would drop its peer's heartbeats.
    let repaired = table.repair_stale_locks(crate::kernel::clock::monotonic_ns());
    let free = repaired.iter().filter(|r| r.peer.is_none()).count();
    for (slot, id) in repaired.iter().filter_map(|r| r.peer) {
        log::warn!(
            "slot {slot} of peer {id} was left locked by the agent before (killed while writing it): reset, its window starts again"
        );
    }
    if free > 0 {
        log::warn!("{free} empty hot lines were left locked by the agent before: reset");
    }
    // The lines are the truth: the registry, and which line each slot has, come from their links.
    let peers = table.adopt_links();
    let mut registry = Registry::adopt(
        PeerIndex::new(meta.capacity, meta.index_key),
        meta.capacity,
        &peers,
    );
    // The pinned program's sources: adoption has checked that they are this agent's.
    registry.reserve_derived_ids(monitor_common::config::passive_sources_on(
        meta.flags,
        &meta.flow_ports,
    ));
    let (program_fd, tag) = linked_program(dir)?;
    let link = PinnedLink::from_pin(dir.join(LINK)).map_err(|e| aya_err(dir, e))?;
    Ok(Adopted {
        maps: KernelMaps {
            table,
            registry,
            counters: open(dir, COUNTERS_MAP)?
                .try_into()
                .map_err(|e| aya_err(dir, e))?,
            unknown_reports: open(dir, UNKNOWN_PEERS_MAP)?
                .try_into()
                .map_err(|e| aya_err(dir, e))?,
            arrivals: open(dir, ARRIVALS_MAP)?
                .try_into()
                .map_err(|e| aya_err(dir, e))?,
            auth_keys: open(dir, AUTH_KEYS_MAP)?
                .try_into()
                .map_err(|e| aya_err(dir, e))?,
        },
        meta,
        program_fd,
        tag,
        link,
    })
}

/// Unpins everything under `dir` and removes it: the link pin is the last reference to the
/// attachment, so the program detaches. Returns whether there was anything to remove.
pub fn remove(dir: &Path) -> Result<bool, PinError> {
    if !dir.exists() {
        return Ok(false);
    }
    let mut removed = false;
    for name in [LINK, PROG, PROG_NEXT, BATCH_PROGRAMS, BATCH_PROGRAMS_NEXT]
        .into_iter()
        .chain(MAPS)
    {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PinError::Io {
                    what: "unpinning",
                    path: dir.join(name),
                    source,
                });
            }
        }
    }
    std::fs::remove_dir(dir).map_err(|source| PinError::Io {
        what: "removing",
        path: dir.into(),
        source,
    })?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_declares_every_pinned_map() {
        if program::OBJECT.is_empty() {
            return; // built without the eBPF toolchain (AYA_BUILD_SKIP)
        }
        let layouts = object_layouts(1000).unwrap();
        assert_eq!(layouts.len(), MAPS.len());
        let of = |name| layouts.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(
            of(PEER_STATE_MAP).value_size as usize,
            size_of::<PeerState>()
        );
        assert_eq!(
            of(PEER_HOT_MAP).value_size as usize,
            size_of::<monitor_common::maps::HotLine>()
        );
        assert_eq!(of(PEER_STATE_MAP).max_entries, 1000);
        assert_eq!(of(LAST_HEARD_MAP).max_entries, 1000);
        assert_eq!(
            of(PEER_HOT_MAP).max_entries,
            monitor_common::index::lines_for(1000)
        );
        assert_eq!(of(META_MAP).value_size as usize, size_of::<PinnedMeta>());
    }
}
