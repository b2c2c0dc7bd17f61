#![no_std]
//! Empty library target: lets `monitor` name this crate as a build dependency so cargo rebuilds
//! the agent when the XDP program changes (as aya-template does).
