//! A CPU quota on a cgroup of our own: for an agent on a host that starves it (the tests) and
//! for a starved sender (`cargo xtask traces`, which includes this file by path, having no
//! dependency on this crate).

use std::{
    io,
    path::{Path, PathBuf},
};

/// A cgroup with a CPU quota (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` where the cpu controller
/// is mounted as v1, as on this project's machines); removed on drop, its tasks moved back to
/// the root first.
pub struct CpuLimit {
    dir: PathBuf,
    root: PathBuf,
}

impl CpuLimit {
    /// A cgroup named `name` whose tasks together get `quota_us` of CPU per `period_us`.
    pub fn create(name: &str, quota_us: u64, period_us: u64) -> io::Result<Self> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let v2_cpu =
            std::fs::read_to_string(v2).is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"));
        let root = if v2_cpu {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu")
        };
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        let limit = Self { dir, root };
        if v2_cpu {
            limit.write("cpu.max", &format!("{quota_us} {period_us}"))?;
        } else {
            limit.write("cpu.cfs_period_us", &period_us.to_string())?;
            limit.write("cpu.cfs_quota_us", &quota_us.to_string())?;
        }
        Ok(limit)
    }

    /// Where the cgroup is.
    #[allow(dead_code)] // used by xtask's copy of this file
    pub fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Periods in which the cgroup's tasks were throttled (ran out of quota), from `cpu.stat`.
    #[allow(dead_code)] // used by the tests, not by xtask
    pub fn throttled_periods(&self) -> io::Result<u64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat"))?;
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| io::Error::other("no nr_throttled in cpu.stat"))
    }

    fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing {value:?} to {}: {e}", path.display()),
            )
        })
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // Whatever is left (our own children, by pid) goes back to the root before rmdir.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
