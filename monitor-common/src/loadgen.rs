//! The boundary of `monitor loadgen --kernel`: the plan the generator's XDP program
//! (`monitor-ebpf/src/loadgen.rs`) stamps frames by, and the counters it keeps. Not part of the
//! monitor; lives here because it is a kernel/user boundary type like the others.
//!
//! Heartbeat n of a run (counting over all peers) is peer `n mod peers`, sequence
//! `n / peers`: the same schedule as the userspace generator, so both send the same stream.

/// What every frame of a run is stamped from. Set before load (aya `override_global`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadgenPlan {
    /// The Ethernet source of every generated frame: the sending interface's own address.
    /// The program is also attached to that interface (so BPF_PROG_RUN finds it in the
    /// kernel's XDP dispatcher and skips two RCU grace periods a run), and a frame received
    /// there, which never carries the interface's own address as its source, passes untouched.
    pub src_mac: [u8; 6],
    pub _pad: [u8; 2],
    pub first_id: u64,
    pub peers: u64,
    /// Bytes 0..8 of the header (magic, version, flags, incarnation) read as a little-endian
    /// u64: the first word SipHash takes, the same in every frame.
    pub first_word_le: u64,
    /// The SipHash key (`auth::AuthKey`'s words); `signed` non-zero to sign.
    pub k0: u64,
    pub k1: u64,
    pub signed: u64,
    /// From heartbeat `kill_at_n` on, peers with index below `killed` send nothing.
    pub kill_at_n: u64,
    pub killed: u64,
    /// The highest `churners` peers churn: split into `churn_groups` groups, group
    /// `e mod churn_groups` is silent throughout period e, a period being
    /// `churn_n_per_period` heartbeats of the whole stream.
    pub churners: u64,
    pub churn_groups: u64,
    pub churn_n_per_period: u64,
}

impl LoadgenPlan {
    /// A plan that sends nothing (what the program holds before the loader sets it).
    pub const NONE: Self = Self {
        src_mac: [0; 6],
        _pad: [0; 2],
        first_id: 0,
        peers: 0,
        first_word_le: 0,
        k0: 0,
        k1: 0,
        signed: 0,
        kill_at_n: u64::MAX,
        killed: 0,
        churners: 0,
        churn_groups: 1,
        churn_n_per_period: u64::MAX,
    };

    /// Whether heartbeat `n` is one the schedule leaves out (a killed or a churning peer's).
    /// The XDP program and userspace decide with this one function.
    /// Checked arithmetic throughout: a division the compiler cannot prove safe would bring
    /// in a panic path the BPF verifier refuses.
    #[inline(always)]
    pub fn silent(&self, n: u64) -> bool {
        let Some(index) = n.checked_rem(self.peers) else {
            return false;
        };
        if n >= self.kill_at_n && index < self.killed {
            return true;
        }
        let Some(churner) = index.checked_sub(self.peers.saturating_sub(self.churners)) else {
            return false;
        };
        let (Some(epoch), Some(group)) = (
            n.checked_div(self.churn_n_per_period),
            churner.checked_rem(self.churn_groups),
        ) else {
            return false;
        };
        self.churners > 0 && epoch.checked_rem(self.churn_groups) == Some(group)
    }
}

/// Offset of the heartbeat in a generated frame: Ethernet, IPv4 without options, UDP.
pub const PAYLOAD_OFFSET: usize = 14 + 20 + 8;

/// Index of each u64 in the program's `LOADGEN_STATE` array. The generator runs on one CPU
/// at a time (BPF_PROG_RUN runs on the caller's), so plain increments are exact.
/// The next heartbeat number to stamp; userspace sets it before the first run.
pub const LG_NEXT_N: u32 = 0;
/// Frames stamped and handed back for transmission (XDP_TX).
pub const LG_SENT: u32 = 1;
/// Frames the schedule left out (dropped, not sent).
pub const LG_SILENT: u32 = 2;
pub const LG_STATE_LEN: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_and_churn_silence_the_peers_they_name() {
        let plan = LoadgenPlan {
            peers: 10,
            kill_at_n: 100,
            killed: 2,
            churners: 4,
            churn_groups: 4,
            churn_n_per_period: 50,
            ..LoadgenPlan::NONE
        };
        // Before the kill, in period 0: churner 0 (index 6) is silent, the others send.
        let silent: [bool; 10] = core::array::from_fn(|i| plan.silent(i as u64));
        assert_eq!(
            silent,
            [
                false, false, false, false, false, false, true, false, false, false
            ]
        );
        // Period 2 (n 100..150), after the kill: indices 0, 1 and churner 2 (index 8).
        let silent: [bool; 10] = core::array::from_fn(|i| plan.silent(100 + i as u64));
        assert_eq!(
            silent,
            [
                true, true, false, false, false, false, false, false, true, false
            ]
        );
        let quiet = LoadgenPlan {
            peers: 3,
            ..LoadgenPlan::NONE
        };
        assert!((0..1000).all(|n| !quiet.silent(n)));
    }
}
