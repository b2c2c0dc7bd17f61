//! The heartbeat monitor agent as a library: loading the XDP program, reading peer slots
//! through an mmap, admitting peers, and serving the socket protocol. The `monitor` binary is
//! a thin CLI over this.
//!
//! A service that only sends heartbeats needs [`sender`] (a sending loop, or the bytes of
//! one heartbeat) and [`auth_key`] (reading a key file, signing); one that asks the agent
//! about its peers needs [`client`] and the reply types in [`protocol`].

pub mod access;
pub mod admission;
pub mod agent;
pub mod auth_key;
pub mod client;
pub mod clock;
pub mod counters;
pub mod destination;
pub mod detector;
pub mod fleet;
pub mod kernel_log;
pub mod keyring;
pub mod loaded;
pub mod loadgen;
pub mod metrics;
pub mod peer_index;
pub mod peer_table;
pub mod peer_view;
pub mod pinning;
pub mod plot;
pub mod program;
pub mod protocol;
pub mod recording;
pub mod registry;
pub mod ring_reader;
pub mod sender;
pub mod server;

/// Default path of the agent's Unix socket.
pub const DEFAULT_SOCKET: &str = "/run/heartbeat-monitor.sock";
