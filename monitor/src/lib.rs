//! The heartbeat monitor agent as a library: loading the XDP program, reading peer slots
//! through an mmap, admitting peers, and serving the socket protocol. The `monitor` binary is
//! a thin CLI over this.
//!
//! A service that only sends heartbeats needs [`peer::sender`] (a sending loop, or the bytes of
//! one heartbeat) and [`peer::auth_key`] (reading a key file, signing); one that asks the agent
//! about its peers needs [`serving::client`] and the reply types in [`serving::protocol`].

// The one-way flow: the kernel side feeds the agent, the detector is maths the agent (and the
// offline tools) apply, serving answers from the agent, the offline tools replay what serving
// recorded; peers and the fleet sit at either end.
pub mod agent;
pub mod detector;
pub mod fleet;
pub mod kernel;
pub mod keys;
pub mod offline;
pub mod peer;
pub mod serving;

/// Default path of the agent's Unix socket.
pub const DEFAULT_SOCKET: &str = "/run/heartbeat-monitor.sock";
