//! Serving: the Unix socket and its line protocol, who may use it, the peer views and events it
//! carries, recordings of arrivals, the Prometheus endpoint, and the client side of the socket.

pub mod access;
pub mod client;
pub mod event;
pub mod limits;
pub mod metrics;
pub mod peer_view;
pub mod protocol;
pub mod recording;
pub mod server;
