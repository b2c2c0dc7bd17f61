//! Loading the XDP program into the kernel and attaching it to an interface, at the XDP hook
//! or (`--hook tc`) at TC ingress.

use std::{ffi::CString, fmt, io};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        ProgramError, SchedClassifier, TcAttachType, Xdp, tc::SchedClassifierLinkId, xdp::XdpLinkId,
    },
};
use monitor_common::{
    config::{CONFIG_SYMBOL, XdpConfig},
    index,
    last_heard::LAST_HEARD_MAP,
    maps::{MAX_WINDOW, PEER_HOT_MAP, PEER_STATE_MAP},
};

/// The XDP object built by build.rs (empty when bpf-linker was missing at build time).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/monitor"));

/// The floor program (`monitor-ebpf/src/floor.rs`): parse to the UDP port and drop. Never
/// loaded by the agent; `cargo xtask bench` measures the monitor against it.
pub static FLOOR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor"));

/// The Gilbert-Elliott dropper (`monitor-ebpf/src/impair.rs`) that `cargo xtask traces` puts on
/// a sender's interface. Never loaded by the agent; it lives here because the one eBPF build
/// makes every program, and the trace tooling reaches it through this crate.
pub static IMPAIR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/impair"));

/// Name of the XDP function in the object.
pub const PROGRAM_NAME: &str = "monitor";

/// Name of the TC classifier in the object: the same parser and record path as `monitor`, on
/// the same maps, for `--hook tc`.
pub const TC_PROGRAM_NAME: &str = "monitor_tc";

/// The programs each hook hands a packet of several heartbeats to (a datagram of whole
/// heartbeats, or a UDP GSO batch of them: a veth without an XDP program passes a sender's
/// batch on uncut, and XDP in skb mode runs after GRO), through a program array at index 0:
/// `monitor_tc_batch` for `monitor_tc` in `BATCH_PROGRAMS`, `monitor_xdp_batch` for `monitor`
/// in `XDP_BATCH_PROGRAMS` (an array takes programs of one type).
pub const TC_BATCH_PROGRAM_NAME: &str = "monitor_tc_batch";
pub const BATCH_PROGRAMS_MAP: &str = "BATCH_PROGRAMS";
pub const XDP_BATCH_PROGRAM_NAME: &str = "monitor_xdp_batch";
pub const XDP_BATCH_PROGRAMS_MAP: &str = "XDP_BATCH_PROGRAMS";

/// Where heartbeats are caught: the XDP hook (first, cheapest), or TC ingress (a TCX link
/// where the kernel has TCX, 6.6+), which runs beside any XDP program on the interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Hook {
    #[default]
    Xdp,
    Tc,
}

impl Hook {
    /// The program of this hook in the object.
    pub fn program_name(self) -> &'static str {
        match self {
            Hook::Xdp => PROGRAM_NAME,
            Hook::Tc => TC_PROGRAM_NAME,
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::Xdp => "xdp",
            Hook::Tc => "tc",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProgramLoadError {
    #[error(
        "this binary was built without the XDP program (bpf-linker was not on PATH at build \
         time); build it with `cargo xtask build`"
    )]
    NotBuilt,
    #[error("window must be between 2 and {MAX_WINDOW}, got {0}")]
    Window(u32),
    #[error("capacity must be at least 1")]
    Capacity,
    #[error(
        "permission denied loading the XDP program: run as root, or with CAP_BPF, CAP_NET_ADMIN \
         and CAP_PERFMON ({0})"
    )]
    Permission(String),
    #[error("loading the XDP program: {0}")]
    Load(String),
    #[error("interface {0:?} does not exist (see `ip link`)")]
    NoSuchInterface(String),
    #[error("attaching XDP to {iface} in {mode} mode: {reason}")]
    Attach {
        iface: String,
        mode: AttachMode,
        reason: String,
    },
    #[error("attaching at TC ingress of {iface}: {reason}")]
    AttachTc { iface: String, reason: String },
}

/// How to attach. `Auto` tries the driver's native mode and falls back to generic (skb) mode,
/// which every interface supports but which runs after the skb is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    Auto,
    Native,
    Skb,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachMode::Auto => "auto",
            AttachMode::Native => "native",
            AttachMode::Skb => "skb",
        })
    }
}

/// What the XDP program logs on its cold paths (aya-log), fixed at load: `off` compiles every
/// log statement out at verification, so the hot path pays nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelLog {
    /// Nothing.
    #[default]
    Off,
    /// Malformed heartbeats and authentication failures.
    Warn,
    /// Also heartbeats of unknown peers and slots busy on another CPU.
    Debug,
}

impl KernelLog {
    /// The value of aya-log's `AYA_LOG_LEVEL` (its `Level` numbering: error 1 .. trace 5).
    pub fn aya_level(self) -> u8 {
        match self {
            KernelLog::Off => 0,
            KernelLog::Warn => 2,
            KernelLog::Debug => 4,
        }
    }
}

/// Validates `config`, loads the object with `capacity` peer slots and loads (verifies) the
/// XDP program. Nothing is attached yet. Kernel logging off.
pub fn load(config: &XdpConfig, capacity: u32) -> Result<Ebpf, ProgramLoadError> {
    load_with_log(config, capacity, KernelLog::Off)
}

/// As `load`, with the program's cold-path logging at `log`.
pub fn load_with_log(
    config: &XdpConfig,
    capacity: u32,
    log: KernelLog,
) -> Result<Ebpf, ProgramLoadError> {
    load_hook(config, capacity, log, Hook::Xdp)
}

/// As `load_with_log`, loading (verifying) the program of `hook` only.
pub fn load_hook(
    config: &XdpConfig,
    capacity: u32,
    log: KernelLog,
    hook: Hook,
) -> Result<Ebpf, ProgramLoadError> {
    load_object(config, capacity, log, hook, None)
}

/// As `load_hook` for the XDP hook, with every map of `pinning::MAPS` opened from its pin
/// under `pins` instead of created: this build's program on pinned state's maps, ready to be
/// swapped into the pinned link (see `pinning::replace_program`). Nothing is attached. The
/// pinned maps must exist and be laid out as this build's (`pinning::check_layouts`): aya
/// would create and pin a missing one, and does not compare an existing one's layout.
pub fn load_on_pins(
    config: &XdpConfig,
    capacity: u32,
    log: KernelLog,
    pins: &std::path::Path,
) -> Result<Ebpf, ProgramLoadError> {
    load_object(config, capacity, log, Hook::Xdp, Some(pins))
}

fn load_object(
    config: &XdpConfig,
    capacity: u32,
    log: KernelLog,
    hook: Hook,
    pins: Option<&std::path::Path>,
) -> Result<Ebpf, ProgramLoadError> {
    if OBJECT.is_empty() {
        return Err(ProgramLoadError::NotBuilt);
    }
    if !(2..=MAX_WINDOW as u32).contains(&config.window) {
        return Err(ProgramLoadError::Window(config.window));
    }
    if capacity == 0 {
        return Err(ProgramLoadError::Capacity);
    }
    let level = log.aya_level();
    // The hot lines are sized for the capacity; the program is told their parts' sizes in the
    // same config.
    let config = XdpConfig {
        index_bits: index::hashed_bits(capacity),
        capacity,
        tai_offset_s: crate::kernel::clock::tai_offset_s(),
        ..*config
    };
    let pinned: Vec<(&str, std::path::PathBuf)> = pins
        .map(|dir| {
            crate::kernel::pinning::MAPS
                .iter()
                .map(|&name| (name, dir.join(name)))
                .collect()
        })
        .unwrap_or_default();
    let mut loader = EbpfLoader::new();
    loader
        .override_global(CONFIG_SYMBOL, &config, true)
        .override_global(aya_log::LEVEL, &level, false)
        .map_max_entries(PEER_HOT_MAP, index::lines_for(capacity))
        .map_max_entries(PEER_STATE_MAP, capacity)
        .map_max_entries(LAST_HEARD_MAP, capacity);
    for (name, path) in &pinned {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader
        .load(OBJECT)
        .map_err(|e| classify(&e, e.to_string()))?;
    match hook {
        Hook::Xdp => xdp_mut(&mut ebpf)?.load(),
        Hook::Tc => tc_mut(&mut ebpf)?.load(),
    }
    .map_err(|e| classify(&e, e.to_string()))?;
    if let Err(e) = load_batch(&mut ebpf, hook) {
        // Kernels before 5.17 have no bpf_loop (5.18 for bpf_xdp_load_bytes). The hook still
        // works; only a packet of several heartbeats (a sender's UDP GSO batch crossing a
        // veth, GRO, a datagram of whole heartbeats) loses all but its first, counted as
        // malformed.
        log::warn!(
            "{e}: a packet of several heartbeats (UDP GSO, GRO) counts only its first; the \
             rest are counted as malformed"
        );
    }
    Ok(ebpf)
}

/// Loads `hook`'s batch program and puts it where the hook calls it for a packet of several
/// heartbeats.
fn load_batch(ebpf: &mut Ebpf, hook: Hook) -> Result<(), ProgramLoadError> {
    let (name, array) = match hook {
        Hook::Xdp => (XDP_BATCH_PROGRAM_NAME, XDP_BATCH_PROGRAMS_MAP),
        Hook::Tc => (TC_BATCH_PROGRAM_NAME, BATCH_PROGRAMS_MAP),
    };
    let fail =
        |what: &str, e: &dyn fmt::Display| ProgramLoadError::Load(format!("{name}: {what}: {e}"));
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| fail("loading", &"not in the object"))?;
    let fd = match hook {
        Hook::Xdp => {
            let xdp: &mut Xdp = program
                .try_into()
                .map_err(|e: ProgramError| fail("loading", &e))?;
            xdp.load().map_err(|e| classify(&e, e.to_string()))?;
            xdp.fd().map_err(|e| fail("its fd", &e))?.try_clone()
        }
        Hook::Tc => {
            let tc: &mut SchedClassifier = program
                .try_into()
                .map_err(|e: ProgramError| fail("loading", &e))?;
            tc.load().map_err(|e| classify(&e, e.to_string()))?;
            tc.fd().map_err(|e| fail("its fd", &e))?.try_clone()
        }
    }
    .map_err(|e| fail("its fd", &e))?;
    let mut programs: aya::maps::ProgramArray<_> = ebpf
        .map_mut(array)
        .ok_or_else(|| fail(array, &"not in the object"))?
        .try_into()
        .map_err(|e: aya::maps::MapError| fail(array, &e))?;
    programs.set(0, &fd, 0).map_err(|e| fail(array, &e))
}

/// The TC classifier inside a loaded object.
pub fn tc_mut(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, ProgramLoadError> {
    ebpf.program_mut(TC_PROGRAM_NAME)
        .ok_or_else(|| {
            ProgramLoadError::Load(format!("no program {TC_PROGRAM_NAME} in the object"))
        })?
        .try_into()
        .map_err(|e: ProgramError| ProgramLoadError::Load(e.to_string()))
}

/// The fd of `hook`'s program in a loaded object (for its run statistics).
pub fn program_fd(ebpf: &mut Ebpf, hook: Hook) -> Result<std::os::fd::OwnedFd, ProgramLoadError> {
    use std::os::fd::AsFd;
    let fd = match hook {
        Hook::Xdp => xdp_mut(ebpf)?.fd(),
        Hook::Tc => tc_mut(ebpf)?.fd(),
    }
    .map_err(|e| ProgramLoadError::Load(e.to_string()))?;
    fd.as_fd()
        .try_clone_to_owned()
        .map_err(|e| ProgramLoadError::Load(format!("duplicating the program fd: {e}")))
}

/// Attaches the loaded TC classifier at `iface`'s ingress: a TCX link on kernels with TCX
/// (6.6+), appended after any program already there; on older kernels a cls_bpf filter under
/// a clsact qdisc (added if missing). Dropping the object (or the link) detaches it.
pub fn attach_tc(ebpf: &mut Ebpf, iface: &str) -> Result<SchedClassifierLinkId, ProgramLoadError> {
    let c_iface =
        CString::new(iface).map_err(|_| ProgramLoadError::NoSuchInterface(iface.into()))?;
    // SAFETY: a valid NUL-terminated string.
    if unsafe { libc::if_nametoindex(c_iface.as_ptr()) } == 0 {
        return Err(ProgramLoadError::NoSuchInterface(iface.into()));
    }
    let tcx = aya::util::KernelVersion::current()
        .is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0));
    if !tcx {
        // Already there is fine (EEXIST); anything else shows up in the attach below.
        let _ = aya::programs::tc::qdisc_add_clsact(iface);
    }
    tc_mut(ebpf)?
        .attach(iface, TcAttachType::Ingress)
        .map_err(|e| {
            let mut reason = e.to_string();
            if let Some(io) = find_io_error(&e) {
                reason.push_str(&format!(": {io}"));
            }
            ProgramLoadError::AttachTc {
                iface: iface.into(),
                reason,
            }
        })
}

/// The XDP program inside a loaded object.
pub fn xdp_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, ProgramLoadError> {
    ebpf.program_mut(PROGRAM_NAME)
        .ok_or_else(|| ProgramLoadError::Load(format!("no program {PROGRAM_NAME} in the object")))?
        .try_into()
        .map_err(|e: ProgramError| ProgramLoadError::Load(e.to_string()))
}

/// The kernel's own accounting of a program: runs and total run time. Both stay zero unless
/// `kernel.bpf_stats_enabled` is 1 (the accounting itself costs two clock reads per run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunStats {
    pub run_count: u64,
    pub run_time_ns: u64,
    /// The kernel's id of the program (for finding its maps).
    #[serde(skip)]
    pub id: u32,
}

/// Reads run statistics with BPF_OBJ_GET_INFO_BY_FD (aya 0.14 does not expose them).
pub fn run_stats(program_fd: std::os::fd::BorrowedFd<'_>) -> io::Result<RunStats> {
    let info: aya_obj::generated::bpf_prog_info = object_info(program_fd)?;
    Ok(RunStats {
        run_count: info.run_cnt,
        run_time_ns: info.run_time_ns,
        id: info.id,
    })
}

/// A program's tag: the kernel's hash of its instructions (map references and global data
/// left out), the same for every load of the same code whatever its maps and settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag(pub [u8; 8]);

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As bpftool prints it.
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The tag of the program behind `program_fd`.
pub fn tag(program_fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Tag> {
    let info: aya_obj::generated::bpf_prog_info = object_info(program_fd)?;
    Ok(Tag(info.tag))
}

/// BPF_OBJ_GET_INFO_BY_FD of a program, map or link: `T` is its bpf_*_info struct.
pub(crate) fn object_info<T: Copy>(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<T> {
    use std::os::fd::AsRawFd;

    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // SAFETY: the bpf_*_info structs are plain integers (and unions of them); all-zero is their
    // documented initial state.
    let mut info: T = unsafe { std::mem::zeroed() };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<T>() as u32,
        info: &raw mut info as u64,
    };
    // SAFETY: attr points at a live, correctly sized info buffer for the call's duration.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

/// The bpf() syscall with command `cmd` on `attr`; its non-negative result, or the error.
///
/// # Safety
/// `attr` must be the attribute struct `cmd` expects, and any pointers in it valid for the
/// call's duration.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: the caller's promise about `attr`; the size is its own.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, std::mem::size_of::<A>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A new fd on the loaded program with kernel id `id` (BPF_PROG_GET_FD_BY_ID).
pub(crate) fn program_fd_by_id(id: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;

    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    #[repr(C)]
    struct IdAttr {
        id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = IdAttr {
        id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: attr is the id struct the command takes, with no pointers in it.
    let fd = unsafe { bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) }?;
    // SAFETY: a fresh fd the kernel handed us and nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches the loaded program to `iface`; returns the link and the mode that worked.
pub fn attach(
    ebpf: &mut Ebpf,
    iface: &str,
    mode: AttachMode,
) -> Result<(XdpLinkId, AttachMode), ProgramLoadError> {
    let c_iface =
        CString::new(iface).map_err(|_| ProgramLoadError::NoSuchInterface(iface.into()))?;
    // SAFETY: a valid NUL-terminated string.
    if unsafe { libc::if_nametoindex(c_iface.as_ptr()) } == 0 {
        return Err(ProgramLoadError::NoSuchInterface(iface.into()));
    }
    let program = xdp_mut(ebpf)?;
    let attempt = |program: &mut Xdp, mode: AttachMode| {
        let flags = match mode {
            AttachMode::Skb => aya::programs::XdpMode::Skb,
            AttachMode::Native => aya::programs::XdpMode::Driver,
            AttachMode::Auto => aya::programs::XdpMode::Default,
        };
        program
            .attach(iface, flags)
            .map_err(|e| ProgramLoadError::Attach {
                iface: iface.into(),
                mode,
                reason: describe_attach_error(&e),
            })
    };
    match mode {
        AttachMode::Auto => match attempt(program, AttachMode::Native) {
            Ok(link) => Ok((link, AttachMode::Native)),
            Err(native) => {
                log::info!("{native}; falling back to skb (generic) mode");
                attempt(program, AttachMode::Skb).map(|link| (link, AttachMode::Skb))
            }
        },
        mode => attempt(program, mode).map(|link| (link, mode)),
    }
}

fn describe_attach_error(e: &ProgramError) -> String {
    let mut text = e.to_string();
    if let Some(io) = find_io_error(e) {
        match io.raw_os_error() {
            Some(libc::EBUSY) | Some(libc::EEXIST) => text.push_str(
                " (another XDP program is attached: run beside it with `--hook tc`, which \
                     attaches at TC ingress, or detach it or stop its owner)",
            ),
            Some(libc::EOPNOTSUPP) => {
                text.push_str(" (the driver or kernel does not support this XDP mode)")
            }
            Some(libc::EPERM) | Some(libc::EACCES) => {
                text.push_str(" (needs root or CAP_NET_ADMIN)")
            }
            _ => {}
        }
        text.push_str(&format!(": {io}"));
    }
    text
}

fn classify(e: &(dyn std::error::Error + 'static), text: String) -> ProgramLoadError {
    match find_io_error(e).and_then(io::Error::raw_os_error) {
        Some(libc::EPERM) | Some(libc::EACCES) => ProgramLoadError::Permission(text),
        _ => {
            let detail = find_io_error(e)
                .map(|io| format!(": {io}"))
                .unwrap_or_default();
            ProgramLoadError::Load(format!("{text}{detail}"))
        }
    }
}

fn find_io_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io);
        }
        current = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_prints_as_bpftool_prints_it() {
        let tag = Tag([0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71]);
        assert_eq!(tag.to_string(), "0a1b2c3d4e5f6071");
    }
}
