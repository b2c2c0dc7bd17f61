//! From inter-arrival statistics to suspicion: phi models, levels, per-peer tracking for
//! events, and offline replay with QoS metrics. Everything here is pure computation on
//! numbers; the kernel and the socket live elsewhere.

pub mod frontier;
pub mod generate;
pub mod levels;
pub mod loss;
pub mod model;
pub mod qos;
pub mod replay;
pub mod spec;
pub mod tail;
pub mod trace;
pub mod tracker;
pub mod window;
