//! A daemon the tests start (HAProxy, keepalived, a backend, a responder): stopped with
//! SIGTERM, then SIGKILL, on drop, with the children it left behind.

use std::{
    os::fd::AsRawFd,
    path::PathBuf,
    process::Child,
    thread,
    time::{Duration, Instant},
};

/// Moves the calling thread into network namespace `ns` (only this thread).
pub fn enter_netns(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open the namespace");
    // SAFETY: setns on a valid descriptor; it changes this thread's network namespace only.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// A process stopped with SIGTERM, then SIGKILL, on drop; `extra_pids` (files holding pids,
/// such as keepalived's child's) are killed too if still there.
pub struct Daemon {
    pub child: Child,
    pub extra_pids: Vec<PathBuf>,
    /// The program name (`/proc/PID/comm`) the extra pids must still have.
    pub child_name: Option<String>,
}

impl Daemon {
    /// A daemon with no children of its own to clean up after.
    pub fn new(child: Child) -> Self {
        Self {
            child,
            extra_pids: vec![],
            child_name: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let extra: Vec<i32> = self
            .extra_pids
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
            .collect();
        // Already reaped (killed by the test): its pid may be another process's by now.
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            // SAFETY: signalling our own child, not yet reaped, by pid.
            unsafe { libc::kill(self.pid(), libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let name = self.child_name.as_deref().unwrap_or_default().to_string();
        for pid in extra {
            // The daemon's own child, left behind if the daemon was killed: by the pid it wrote,
            // and only while that pid still runs the same program.
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !name.is_empty() && comm.trim() == name {
                // SAFETY: a pid the daemon wrote for its child, still running that program.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}
