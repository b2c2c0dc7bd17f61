//! The bpf filesystem pins live on: whether a directory is on one, and mounting one on
//! /sys/fs/bpf (as bpftool does) when nothing is there and the mount would outlive the agent.

use std::{ffi::CString, io, path::Path};

use super::pinning::PinError;

/// BPF_FS_MAGIC from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether `dir` is on a bpf filesystem.
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
            match own_mount_namespace() {
                Ok(false) => {}
                Ok(true) => {
                    return Err(PinError::PrivateMountNamespace {
                        at: sysfs_bpf.into(),
                    });
                }
                Err(e) => log::warn!(
                    "cannot tell whether this agent shares the mount namespace of PID 1 ({e}); \
                     if it does not, the bpffs mounted on {} and the pins in it end with it",
                    sysfs_bpf.display()
                ),
            }
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

/// Whether this process's mount namespace is one of its own, not that of PID 1 and of every
/// ancestor: a mount made here is not seen by the rest of the system and goes away with the
/// namespace's last process. Ancestors count because PID 1's namespace cannot always be read
/// (a PID 1 holding capabilities this process lacks, as in some sandboxes, refuses it); an
/// ancestor that cannot be read is skipped, and an error means none could be.
fn own_mount_namespace() -> io::Result<bool> {
    let ours = std::fs::read_link("/proc/self/ns/mnt")?;
    let mut pid = std::process::id();
    let mut compared = false;
    let mut last_error = None;
    while pid > 1 {
        pid = parent_pid(pid)?;
        if pid == 0 {
            break;
        }
        match std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            Ok(theirs) if theirs != ours => return Ok(true),
            Ok(_) => compared = true,
            Err(e) => last_error = Some(e),
        }
    }
    match (compared, last_error) {
        (false, Some(e)) => Err(e),
        _ => Ok(false),
    }
}

/// The parent of `pid`, from /proc/PID/stat (0 for PID 1).
fn parent_pid(pid: u32) -> io::Result<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so from the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat")))
}

/// Mounts a bpf filesystem on `at`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pid_reads_proc() {
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        assert_eq!(parent_pid(std::process::id()).unwrap(), ppid);
    }
}
