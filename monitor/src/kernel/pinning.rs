//! Surviving restarts: the XDP link, the program and every map pinned in bpffs, so the program
//! keeps recording while no agent runs (stopped, upgraded, even SIGKILLed), and the next agent
//! adopts the pinned state with every window intact. Removal is explicit (`monitor detach`).
//!
//! Layout of a pin directory: `link` (the XDP attachment), `prog`, and one file per map.

use crate::kernel::maps::KernelMaps;
use std::{
    ffi::CString,
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
        xdp::XdpLinkId,
    },
};
use aya_obj::programs::XdpAttachType;
use monitor_common::{
    last_heard::LAST_HEARD_MAP,
    maps::{
        ARRIVALS_MAP, AUTH_KEYS_MAP, COUNTERS_MAP, LAYOUT_VERSION, LOCAL_ADDRS_MAP, META_MAGIC,
        META_MAP, PEER_INDEX_MAP, PEER_STATE_MAP, PeerSlot, PinnedMeta, UNKNOWN_PEERS_MAP,
    },
};

use crate::{
    kernel::peer_index::PeerIndex, kernel::peer_table::PeerTable, kernel::program,
    kernel::registry::Registry,
};

/// Every map, in the order they are pinned.
pub const MAPS: [&str; 9] = [
    PEER_INDEX_MAP,
    PEER_STATE_MAP,
    COUNTERS_MAP,
    UNKNOWN_PEERS_MAP,
    ARRIVALS_MAP,
    AUTH_KEYS_MAP,
    META_MAP,
    LOCAL_ADDRS_MAP,
    LAST_HEARD_MAP,
];
const LINK: &str = "link";
const PROG: &str = "prog";
/// BPF_FS_MAGIC from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

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
}

fn aya_err(path: &Path, e: impl std::fmt::Display) -> PinError {
    PinError::Aya {
        path: path.into(),
        message: e.to_string(),
    }
}

fn on_bpffs(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the struct we pass.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// Makes sure `dir`'s parent is a bpffs and `dir` exists. Like bpftool, mounts bpffs on
/// /sys/fs/bpf when nothing is mounted there; anywhere else, says how to.
pub fn prepare(dir: &Path) -> Result<(), PinError> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let mut probe = parent.to_path_buf();
    while !probe.exists() {
        probe = probe.parent().unwrap_or(Path::new("/")).to_path_buf();
    }
    if !on_bpffs(&probe) {
        let sysfs_bpf = Path::new("/sys/fs/bpf");
        if probe == sysfs_bpf || probe.starts_with(sysfs_bpf) && !on_bpffs(sysfs_bpf) {
            mount_bpffs(sysfs_bpf)?;
        } else {
            return Err(PinError::NotBpffs(probe));
        }
        if !on_bpffs(sysfs_bpf) {
            return Err(PinError::NotBpffs(sysfs_bpf.into()));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| PinError::Io {
        what: "creating pin directory",
        path: dir.into(),
        source,
    })
}

fn mount_bpffs(at: &Path) -> Result<(), PinError> {
    let target = CString::new(at.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: valid C strings; mounting is what we mean to do.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(PinError::Io {
            what: "mounting bpffs on",
            path: at.into(),
            source: io::Error::last_os_error(),
        });
    }
    log::info!("mounted a bpf filesystem on {}", at.display());
    Ok(())
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
    pub program_fd: OwnedFd,
    /// Holding it keeps nothing alive that the pin does not: dropping it leaves the program
    /// attached.
    pub link: PinnedLink,
}

pub(crate) fn open(dir: &Path, name: &str) -> Result<Map, PinError> {
    let data = MapData::from_pin(dir.join(name))
        .map_err(|e| aya_err(dir, format!("opening map {name}: {e}")))?;
    Map::from_map_data(data).map_err(|e| aya_err(dir, e))
}

/// Opens pinned state after checking it is of this build's layout and of `expected`'s settings.
pub fn adopt(dir: &Path, expected: &PinnedMeta) -> Result<Adopted, PinError> {
    let meta_map: Array<MapData, PinnedMeta> = open(dir, META_MAP)?
        .try_into()
        .map_err(|e| aya_err(dir, e))?;
    let meta = meta_map.get(&0, 0).map_err(|e| aya_err(dir, e))?;
    if meta.magic != META_MAGIC
        || meta.layout_version != LAYOUT_VERSION
        || meta.slot_size as usize != size_of::<PeerSlot>()
    {
        return Err(PinError::Layout {
            path: dir.into(),
            found: meta.layout_version,
            slot: meta.slot_size,
            ours: size_of::<PeerSlot>(),
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
            format!("{:?}", meta.flow_ports),
            format!("{:?}", expected.flow_ports),
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

    let table = match (open(dir, PEER_STATE_MAP)?, open(dir, LAST_HEARD_MAP)?) {
        (Map::Array(state), Map::Array(words)) => {
            PeerTable::map(state.fd().as_fd(), words.fd().as_fd(), meta.capacity)
                .map_err(|e| aya_err(dir, e))?
        }
        _ => return Err(aya_err(dir, "PEER_STATE or LAST_HEARD is not an array")),
    };
    let index = match open(dir, PEER_INDEX_MAP)? {
        Map::Array(index) => {
            PeerIndex::map(index.fd().as_fd(), meta.capacity).map_err(|e| aya_err(dir, e))?
        }
        _ => return Err(aya_err(dir, "PEER_INDEX is not an array")),
    };
    let registry = Registry::adopt(index, meta.capacity);
    let program =
        Xdp::from_pin(dir.join(PROG), XdpAttachType::Interface).map_err(|e| aya_err(dir, e))?;
    let program_fd = program
        .fd()
        .map_err(|e| aya_err(dir, e))?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| aya_err(dir, e))?;
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
    for name in [LINK, PROG].into_iter().chain(MAPS) {
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
