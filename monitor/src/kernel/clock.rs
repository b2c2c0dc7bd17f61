//! The kernel's clock for heartbeats: bpf_ktime_get_ns reads CLOCK_MONOTONIC, so silences are
//! measured against the same clock in userspace.

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_TAI minus CLOCK_REALTIME, in whole seconds (0 where the host's TAI offset was never
/// set, 37 where the NTP daemon set it): what the kernel takes off its TAI clock to read Unix
/// time (`XdpConfig::tai_offset_s`).
pub fn tai_offset_s() -> i32 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec to write into.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    };
    let (tai, real) = (read(libc::CLOCK_TAI), read(libc::CLOCK_REALTIME));
    (tai - real).round() as i32
}
