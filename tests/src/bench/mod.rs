//! Measurements for `cargo xtask bench`, run by the `hbm-bench` binary (`probes`, and, at small
//! scale and for correctness only, by the smoke test). Each returns numbers; the xtask
//! (xtask/src/bench/) prints them.
//!
//! The kernel side: `test_run` (the monitor by BPF_PROG_TEST_RUN), `floor` (the floor
//! program), `limit` (one miss over the peers' state); the agent's: `sweep` (a full pass),
//! `socket` (query latency), `events` (event latency); `receiver`, the userspace path to
//! compare with; `percentiles` for the samples.

pub mod events;
pub mod floor;
pub mod limit;
pub mod percentiles;
pub mod probes;
pub mod receiver;
pub mod scan_floor;
pub mod socket;
pub mod sweep;
pub mod test_run;

pub use events::{EventLatency, EventProbe};
pub use floor::{
    Touch, floor_after_one_heartbeat, floor_attached, floor_test_run_ns, load_floor,
    load_floor_touching,
};
pub use percentiles::Percentiles;
pub use receiver::{ReceiverReport, cpu_seconds, udp_receiver};
pub use scan_floor::{DueScanFloor, ScanFloor, due_scan_floor, scan_floor};
pub use socket::{BucketQuantiles, SocketLatency, request_quantiles_us, socket_latency};
pub use sweep::{SweepTimings, sweep_timings};
pub use test_run::{KernelLogCost, kernel_log_cost, prog_test_run_ns};
