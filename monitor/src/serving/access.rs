//! Who may talk to the agent's socket. The socket file is mode 0660, owned by the agent's user
//! and the configured group, so the kernel already refuses `connect` to anyone else; each
//! accepted client is checked again by its credentials (SO_PEERCRED), so a socket file whose
//! mode was loosened, or a descriptor handed to another process, grants nothing more.

use std::{ffi::CString, io};

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

    /// Whether a peer with these credentials may send requests.
    pub fn allows(&self, uid: u32, gid: u32, pid: Option<i32>) -> bool {
        if uid == 0 || uid == self.agent_uid {
            return true;
        }
        let Some(group) = self.group else {
            return false;
        };
        gid == group || pid.is_some_and(|pid| supplementary_groups(pid).contains(&group))
    }

    pub fn describe(&self) -> String {
        match self.group {
            Some(g) => format!("root, uid {}, or group {g}", self.agent_uid),
            None => format!("root or uid {}", self.agent_uid),
        }
    }
}

/// The peer process's supplementary groups, from /proc (empty if it is gone).
fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|groups| {
                    groups
                        .split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect()
                })
        })
        .unwrap_or_default()
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
    let c = CString::new(name).map_err(|_| GroupError::Unknown(name.into()))?;
    // SAFETY: getgrnam returns a pointer to static storage or null; read before any other call.
    let entry = unsafe { libc::getgrnam(c.as_ptr()) };
    if entry.is_null() {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            None | Some(0) | Some(libc::ENOENT) => GroupError::Unknown(name.into()),
            _ => GroupError::Lookup(name.into(), err),
        });
    }
    Ok(unsafe { (*entry).gr_gid })
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
        assert!(p.allows(0, 0, None));
        assert!(p.allows(1000, 1000, None));
        assert!(p.allows(2000, 50, None));
        assert!(!p.allows(2000, 2000, None));
        let strict = AccessPolicy {
            agent_uid: 1000,
            group: None,
        };
        assert!(!strict.allows(2000, 50, None));
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
