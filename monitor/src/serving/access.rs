//! Who may talk to the agent's socket. The socket file is mode 0660, owned by the agent's user
//! and the configured group, so the kernel already refuses `connect` to anyone else; each
//! accepted client is checked again by its credentials (SO_PEERCRED, and SO_PEERGROUPS for its
//! supplementary groups: both as they were at `connect`, from the socket itself, so no process
//! that took the client's PID since can lend it its groups), so a socket file whose mode was
//! loosened, or a descriptor handed to another process, grants nothing more.

use std::{io, os::fd::AsRawFd};

/// Who is allowed: root, the agent's own user, and members of the socket's group.
#[derive(Debug, Clone, Copy)]
pub struct AccessPolicy {
    pub agent_uid: u32,
    pub group: Option<u32>,
}

impl AccessPolicy {
    pub fn current(group: Option<u32>) -> Self {
        // SAFETY: geteuid has no preconditions.
        Self {
            agent_uid: unsafe { libc::geteuid() },
            group,
        }
    }

    /// Whether a peer with these credentials (`groups`: its supplementary groups) may send
    /// requests.
    pub fn allows(&self, uid: u32, gid: u32, groups: &[u32]) -> bool {
        if uid == 0 || uid == self.agent_uid {
            return true;
        }
        let Some(group) = self.group else {
            return false;
        };
        gid == group || groups.contains(&group)
    }

    pub fn describe(&self) -> String {
        match self.group {
            Some(g) => format!("root, uid {}, or group {g}", self.agent_uid),
            None => format!("root or uid {}", self.agent_uid),
        }
    }
}

/// The supplementary groups of the process that connected `socket`, as they were when it
/// connected (SO_PEERGROUPS, Linux 4.13); empty if the kernel cannot tell.
pub fn peer_groups(socket: &impl AsRawFd) -> Vec<u32> {
    // Room for the usual few groups first; the kernel says how many if there are more.
    let mut groups = vec![0 as libc::gid_t; 16];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` has room for `len` bytes; the kernel writes at most that many and
        // sets `len` to what it wrote (or, with ERANGE, to what it needs).
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return groups;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) || count <= groups.len()
        {
            return Vec::new();
        }
        groups.resize(count, 0);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("--socket-group {0:?}: no such group")]
    Unknown(String),
    #[error("--socket-group {0:?}: {1}")]
    Lookup(String, io::Error),
}

/// A group name (or a numeric gid) to its gid.
pub fn group_id(name: &str) -> Result<u32, GroupError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) | Err(nix::errno::Errno::ENOENT) => Err(GroupError::Unknown(name.into())),
        Err(e) => Err(GroupError::Lookup(name.into(), e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy() {
        let p = AccessPolicy {
            agent_uid: 1000,
            group: Some(50),
        };
        assert!(p.allows(0, 0, &[]));
        assert!(p.allows(1000, 1000, &[]));
        assert!(p.allows(2000, 50, &[]));
        assert!(p.allows(2000, 2000, &[7, 50]));
        assert!(!p.allows(2000, 2000, &[]));
        let strict = AccessPolicy {
            agent_uid: 1000,
            group: None,
        };
        assert!(!strict.allows(2000, 50, &[50]));
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(group_id("root").unwrap(), 0);
        assert_eq!(group_id("4242").unwrap(), 4242);
        assert!(matches!(
            group_id("no-such-group-hbm"),
            Err(GroupError::Unknown(_))
        ));
    }
}
