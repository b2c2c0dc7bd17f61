//! The boundary of the path impairment used to record real traces (`cargo xtask traces`): a
//! TC egress program on a sender's interface that drops heartbeats per a Gilbert-Elliott
//! model, since this kernel has no netem. Not part of the monitor; lives here because it is a
//! kernel/user boundary type like the others.

/// Probabilities are fractions of 2^32: an event of probability p happens when a random u32
/// is below `p * 2^32` (so 0 never, `u32::MAX` all but 2^-32 of the time).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GilbertElliott {
    /// UDP destination port whose datagrams the model applies to (others pass untouched).
    pub port: u16,
    pub _pad: u16,
    /// P(good -> bad) per matching datagram.
    pub to_bad: u32,
    /// P(bad -> good) per matching datagram.
    pub to_good: u32,
    /// P(drop) in the good state.
    pub loss_good: u32,
    /// P(drop) in the bad state.
    pub loss_bad: u32,
}

impl GilbertElliott {
    /// A model that never drops (what the program runs with before the loader sets it).
    pub const NONE: Self = Self {
        port: 0,
        _pad: 0,
        to_bad: 0,
        to_good: 0,
        loss_good: 0,
        loss_bad: 0,
    };

    /// `p` in [0, 1] as a fraction of 2^32 (see the type's docs).
    pub fn fraction(p: f64) -> u32 {
        if p <= 0.0 {
            0
        } else if p >= 1.0 {
            u32::MAX
        } else {
            (p * 4_294_967_296.0) as u32
        }
    }
}

/// Index of each u64 in the program's `GE_STATE` array.
pub const GE_BAD: u32 = 0;
pub const GE_PASSED: u32 = 1;
pub const GE_DROPPED: u32 = 2;
pub const GE_STATE_LEN: u32 = 3;
