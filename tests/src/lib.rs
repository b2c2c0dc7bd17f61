//! Shared helpers for the integration tests. They need root (CAP_BPF, CAP_NET_ADMIN): they
//! load the real XDP program into the running kernel and make real network namespaces.

pub mod agent_process;
pub mod attack;
pub mod batches;
pub mod bench;
pub mod cgroup;
pub mod cross_traffic;
pub mod daemon;
pub mod fixture;
pub mod fleet_net;
pub mod frr;
pub mod haproxy;
pub mod http;
pub mod netns;
pub mod packet;
pub mod soak;

use std::path::PathBuf;

/// The `monitor` binary under test: $MONITOR_BIN, else the one cargo built beside this test.
pub fn monitor_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("MONITOR_BIN") {
        return path.into();
    }
    // target/<profile>/deps/<test-binary> -> target/<profile>/monitor
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("monitor"))
        .expect("test binary lives in target/<profile>/deps");
    assert!(
        bin.is_file(),
        "{} not found: build it first (`cargo xtask test` does), or set MONITOR_BIN",
        bin.display()
    );
    bin
}

/// The `hbm-bench` probe binary: $HBM_BENCH_BIN, else the one cargo built beside this test.
pub fn bench_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("HBM_BENCH_BIN") {
        return path.into();
    }
    monitor_bin().with_file_name("hbm-bench")
}

/// Fails loudly, rather than skipping, when the tests cannot do what they claim.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests load XDP programs and create namespaces: run them as root (cargo xtask test)"
    );
}

/// A name unique to this process and call (short prefixes keep it within the 15 bytes of an
/// interface name).
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id() % 100_000)
}

/// Polls `check` every 20 ms until it says `Ok`, and returns that; if `limit` passes first,
/// the last `Err` it gave, for the caller's assertion to show what was seen.
pub fn poll_until<T, E>(
    limit: std::time::Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last) if std::time::Instant::now() >= deadline => return Err(last),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Polls `check` every 20 ms until it gives a value, and returns it; panics naming `what` if
/// `limit` passes first. For waiting on an observable condition instead of sleeping.
pub fn wait_for<T>(
    limit: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
