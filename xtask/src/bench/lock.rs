//! One bench at a time on a machine: they share namespace names (a second one would remove
//! the first one's), and two at once would measure each other.

use anyhow::{Context, Result};

/// An exclusive lock on a file in /run for as long as a bench runs; a second bench waits.
pub(super) struct BenchLock {
    /// Held (and the lock with it) until dropped.
    _file: std::fs::File,
}

impl BenchLock {
    const PATH: &'static str = "/run/heartbeat-monitor-bench.lock";

    pub fn acquire() -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::PATH)
            .with_context(|| format!("opening {}", Self::PATH))?;
        if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock() {
            println!("==> another `cargo xtask bench` is running; waiting for it to finish");
        }
        file.lock()
            .with_context(|| format!("locking {}", Self::PATH))?;
        Ok(Self { _file: file })
    }
}
