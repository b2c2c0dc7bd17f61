//! The kernel side: loading and attaching the XDP (or TC) program, pinning its state, and the
//! agent's handles on its maps: the peer table and its last-heard words, the id index and the
//! slot registry, the counters, the keys, the destination addresses, the program's log and ring
//! buffers, the clock the program stamps arrivals with, and a detector's window rules as the
//! program's load-time config.

pub mod bpffs;
pub mod clock;
pub mod counters;
pub mod destination;
pub mod index_key;
pub mod kernel_log;
pub mod keyring;
pub mod lifecycle;
pub mod loaded;
pub mod maps;
pub mod peer_index;
pub mod peer_table;
pub mod pinning;
pub mod program;
pub mod registry;
pub mod ring_reader;
pub mod window_rules;
