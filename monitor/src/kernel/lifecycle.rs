//! The program's lifecycle: loaded and attached (and pinned, with `--pin-path`), or adopted
//! from pinned state, where another build's program is swapped for this build's through the
//! pinned link without detaching.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use monitor_common::{
    config::XdpConfig,
    maps::{LAYOUT_VERSION, META_MAGIC, PeerState, PinnedMeta},
};

use crate::kernel::{
    bpffs,
    loaded::LoadedProgram,
    maps::KernelMaps,
    pinning,
    program::{self, AttachMode, Hook, KernelLog, Tag},
};

/// How to load the program, from the agent's configuration.
pub struct Load<'a> {
    pub iface: &'a str,
    pub mode: AttachMode,
    pub hook: Hook,
    pub capacity: u32,
    pub kernel_log: KernelLog,
    /// Pin the program and maps here, and adopt what is pinned here.
    pub pin_path: Option<&'a Path>,
}

/// How the running program came to run.
#[derive(Debug, Clone, Copy)]
pub enum Origin {
    /// This agent loaded and attached it.
    Loaded { tag: Tag },
    /// Pinned state whose program is this build's.
    Adopted { tag: Tag },
    /// Pinned state whose program was another build's (`previous`), replaced by this build's.
    Upgraded { tag: Tag, previous: Tag },
}

/// Adopts the state pinned at `load.pin_path` if there is any, or loads, attaches (and pins)
/// the program. `xdp` is the configuration of a new load; adopted state keeps its index key.
pub fn start(load: &Load, xdp: &XdpConfig) -> Result<Kernel> {
    let expected = PinnedMeta {
        magic: META_MAGIC,
        layout_version: LAYOUT_VERSION,
        slot_size: size_of::<PeerState>() as u32,
        capacity: load.capacity,
        window: xdp.window,
        port: xdp.port,
        flags: xdp.flags,
        max_interval_us: xdp.max_interval_us,
        outage_factor: xdp.outage_factor,
        flow_ports: xdp.flow_ports,
        index_key: xdp.index_key,
        ..PinnedMeta::default()
    };
    match load.pin_path {
        Some(dir) if pinning::has_state(dir) => adopt(dir, &expected, xdp, load),
        _ => load_and_attach(load, xdp, expected),
    }
}

/// What the agent runs on: a freshly loaded program or adopted pinned state.
pub struct Kernel {
    pub maps: KernelMaps,
    pub program_fd: OwnedFd,
    /// "native", "skb", "tc", or "adopted".
    pub mode: String,
    /// How the running program came to run: loaded here, adopted, or swapped in by an upgrade.
    pub origin: Origin,
    /// Owns the program when it was loaded here; dropping it detaches an unpinned program.
    pub ebpf: Option<aya::Ebpf>,
    /// Where the state is pinned, if it is.
    pub pinned: Option<PathBuf>,
}

/// Adopts the state pinned at `dir`. When the pinned link runs another build's program (the
/// kernel's tags differ), this build's program is loaded on the pinned maps and swapped into
/// the link (`pinning::replace_program`): heartbeats keep being recorded throughout, and every
/// map, windows and counters, is kept. Pinned state of other settings or another map layout is
/// refused before anything changes.
fn adopt(dir: &Path, expected: &PinnedMeta, xdp: &XdpConfig, load: &Load) -> Result<Kernel> {
    let a = pinning::adopt(dir, expected)?;
    // The pinned program hashes ids with the key it was loaded with, and the pinned index is
    // laid out by it: the registry (`pinning::adopt`) and any program of ours use it too.
    let xdp = &XdpConfig {
        index_key: a.meta.index_key,
        ..*xdp
    };
    // This build's program on the pinned maps, attached nowhere yet: its tag is what the link
    // would run if this build had loaded it.
    let mut ebpf = program::load_on_pins(xdp, load.capacity, load.kernel_log, dir)
        .with_context(|| {
            format!(
                "loading this build's program on the maps pinned at {} (to compare it with the pinned one)",
                dir.display()
            )
        })?;
    let ours = program::tag(program::program_fd(&mut ebpf, Hook::Xdp)?.as_fd())
        .context("reading the tag of this build's program")?;
    // The pin holds the attachment; the handle is not needed.
    drop(a.link);
    if ours == a.tag {
        // The pinned program is this build's: it keeps running; ours is unloaded unused.
        drop(ebpf);
        log::info!(
            "adopted the program pinned at {} (tag {}, this build's): {} peers, their windows kept",
            dir.display(),
            a.tag,
            a.maps.registry.len()
        );
        return Ok(Kernel {
            maps: a.maps,
            program_fd: a.program_fd,
            mode: "adopted".into(),
            origin: Origin::Adopted { tag: a.tag },
            ebpf: None,
            pinned: Some(dir.into()),
        });
    }
    let program_fd = pinning::replace_program(dir, &mut ebpf).with_context(|| {
        format!(
            "upgrading the program pinned at {} (tag {}) to this build's (tag {ours})",
            dir.display(),
            a.tag
        )
    })?;
    log::info!(
        "upgraded the program pinned at {}: tag {} -> {ours}, swapped in through the pinned link \
         without detaching; {} peers, every map and window kept",
        dir.display(),
        a.tag,
        a.maps.registry.len()
    );
    Ok(Kernel {
        maps: a.maps,
        program_fd,
        mode: "adopted".into(),
        origin: Origin::Upgraded {
            tag: ours,
            previous: a.tag,
        },
        // Owns this build's program (its log, LOCAL_ADDRS); the pins keep it attached when it
        // is dropped.
        ebpf: Some(ebpf),
        pinned: Some(dir.into()),
    })
}

fn load_and_attach(load: &Load, xdp: &XdpConfig, meta: PinnedMeta) -> Result<Kernel> {
    if load.hook == Hook::Tc && load.pin_path.is_some() {
        anyhow::bail!(
            "--persist and --pin-path need --hook xdp: with --hook tc the attachment ends with the agent"
        );
    }
    if let Some(dir) = load.pin_path {
        bpffs::prepare(dir)?;
    }
    let loaded = LoadedProgram::load_hook(
        xdp,
        load.capacity,
        load.pin_path,
        load.kernel_log,
        load.hook,
    );
    let result = (|| {
        let LoadedProgram {
            mut ebpf,
            maps,
            meta: mut meta_map,
        } = loaded?;
        let mode = match load.hook {
            Hook::Xdp => {
                let (link, mode) = program::attach(&mut ebpf, load.iface, load.mode)?;
                if let Some(dir) = load.pin_path {
                    pinning::pin_program(dir, &mut ebpf, link, meta, &mut meta_map)?;
                }
                mode.to_string()
            }
            Hook::Tc => {
                // The link is owned by `ebpf`: dropping it detaches.
                program::attach_tc(&mut ebpf, load.iface)?;
                "tc".to_string()
            }
        };
        // The attached program's: its run statistics are the agent's `xdp` stats.
        let program_fd = program::program_fd(&mut ebpf, load.hook)?;
        let tag = program::tag(program_fd.as_fd()).context("reading the program's tag")?;
        Ok(Kernel {
            maps,
            program_fd,
            origin: Origin::Loaded { tag },
            mode,
            ebpf: Some(ebpf),
            pinned: load.pin_path.map(Path::to_path_buf),
        })
    })();
    if result.is_err()
        && let Some(dir) = &load.pin_path
    {
        // Half-pinned state is worse than none: the next start would try to adopt it.
        let _ = pinning::remove(dir);
    }
    result
}
