//! Peer-side tools: sending heartbeats (one, or a loop), the load generator, and the keys that
//! sign them.

pub mod auth_key;
pub mod loadgen;
pub mod sender;
