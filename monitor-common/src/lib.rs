//! The kernel/user boundary of the heartbeat monitor, in one small crate.
//!
//! Everything both the XDP program (`monitor-ebpf`) and the agent (`monitor`) must agree on
//! lives here and nowhere else: the heartbeat wire format, the layout of every BPF map value,
//! and the load-time configuration of the XDP program. `no_std`, no allocation; the `user`
//! feature adds `aya::Pod` so the agent can read and write these types through aya.
#![no_std]

pub mod auth;
pub mod config;
pub mod impair;
pub mod index;
pub mod last_heard;
pub mod loadgen;
pub mod maps;
pub mod passive;
pub mod slot;
pub mod wire;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type below is `repr(C)`, `Copy`, has no padding that carries meaning and
    // is valid for any bit pattern (integers and byte arrays only).
    unsafe impl aya::Pod for crate::config::XdpConfig {}
    unsafe impl aya::Pod for crate::auth::AuthKey {}
    unsafe impl aya::Pod for crate::maps::PinnedMeta {}
    unsafe impl aya::Pod for crate::maps::PeerSlot {}
    unsafe impl aya::Pod for crate::maps::PeerState {}
    unsafe impl aya::Pod for crate::maps::HotLine {}
    unsafe impl aya::Pod for crate::maps::Counters {}
    unsafe impl aya::Pod for crate::maps::UnknownPeerReport {}
    unsafe impl aya::Pod for crate::maps::ArrivalRecord {}
    unsafe impl aya::Pod for crate::impair::GilbertElliott {}
    unsafe impl aya::Pod for crate::loadgen::LoadgenPlan {}
    unsafe impl aya::Pod for crate::maps::LocalFast {}
}
