//! From inter-arrival statistics to suspicion: phi models, levels, per-peer tracking for
//! events, QoS metrics, and the detector spec grammar. Everything here is pure computation on
//! numbers, the part the agent runs live; the kernel, the socket and the offline tools (replay,
//! traces: [`crate::offline`]) live elsewhere.

pub mod levels;
pub mod loss;
pub mod model;
pub mod models;
pub mod qos;
pub mod spec;
pub mod tail;
pub mod tracker;
pub mod window;
