//! The interface's own count of the XDP frames it transmitted (ethtool statistics, read by the
//! SIOCETHTOOL ioctl; a veth counts them as `tx_queue_N_xdp_xmit`). A frame the generator's
//! program handed over can still be dropped: a veth whose other end takes no XDP frames (no
//! XDP program there, no GRO) drops every one, counted nowhere, and one whose ring is full
//! drops the overflow. What the interface counted as transmitted is what was sent.

use std::os::fd::{AsRawFd, BorrowedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// Offset of `n_stats` in struct ethtool_drvinfo (after cmd, five 32-byte strings and 12
/// reserved bytes, and n_priv_flags).
const DRVINFO_N_STATS: usize = 4 + 5 * 32 + 12 + 4;
const DRVINFO_LEN: usize = 196;

/// Which of an interface's ethtool statistics count transmitted XDP frames.
pub struct XmitCount {
    iface: String,
    indices: Vec<usize>,
    n_stats: usize,
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool(fd: BorrowedFd<'_>, iface: &str, buf: &mut [u8]) -> Result<(), String> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: buf.as_mut_ptr().cast(),
        _pad: [0; 16],
    };
    let name = iface.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return Err(format!("{iface}: interface name too long"));
    }
    req.name[..name.len()].copy_from_slice(name);
    // SAFETY: an ifreq whose data points at a buffer the command's struct fits in.
    if unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

impl XmitCount {
    /// The statistics of `iface` named `*_xdp_xmit`; None when it has none (then frames it
    /// dropped cannot be told from sent ones here).
    pub fn of(fd: BorrowedFd<'_>, iface: &str) -> Option<Self> {
        let mut info = [0u8; DRVINFO_LEN];
        info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
        ethtool(fd, iface, &mut info).ok()?;
        let n_stats = u32::from_ne_bytes(info[DRVINFO_N_STATS..][..4].try_into().ok()?) as usize;
        let mut strings = vec![0u8; 12 + n_stats * ETH_GSTRING_LEN];
        strings[..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
        strings[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
        strings[8..12].copy_from_slice(&(n_stats as u32).to_ne_bytes());
        ethtool(fd, iface, &mut strings).ok()?;
        let indices: Vec<usize> = strings[12..]
            .chunks(ETH_GSTRING_LEN)
            .enumerate()
            .filter(|(_, name)| {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                std::str::from_utf8(&name[..end]).is_ok_and(|n| n.ends_with("_xdp_xmit"))
            })
            .map(|(i, _)| i)
            .collect();
        (!indices.is_empty()).then(|| Self {
            iface: iface.to_string(),
            indices,
            n_stats,
        })
    }

    /// Their sum now.
    pub fn read(&self, fd: BorrowedFd<'_>) -> Result<u64, String> {
        let mut stats = vec![0u8; 8 + self.n_stats * 8];
        stats[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
        stats[4..8].copy_from_slice(&(self.n_stats as u32).to_ne_bytes());
        ethtool(fd, &self.iface, &mut stats)
            .map_err(|e| format!("reading {}'s statistics: {e}", self.iface))?;
        Ok(self
            .indices
            .iter()
            .map(|&i| u64::from_ne_bytes(stats[8 + i * 8..][..8].try_into().expect("8 bytes")))
            .sum())
    }
}
