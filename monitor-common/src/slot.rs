//! What one heartbeat does to its peer's slot: the only implementation of the window rules.
//!
//! The XDP program calls [`arrive`] under the slot's sequence counter; offline replay calls
//! the very same function on a slot of its own, so a trace replayed in userspace builds
//! exactly the window the kernel built from the same arrivals (tests/tests/record.rs checks
//! it against the kernel). Integers only, no loops, no calls: it must pass the BPF verifier.
//!
//! The rules, in order:
//! 1. Classification by (incarnation, sequence): a first heartbeat or a higher incarnation
//!    (the sender restarted) starts a new sequence; an older incarnation or a lower sequence
//!    number is out of order; the same one a duplicate. Neither of the last two is an arrival.
//! 2. An interval that spans a restart is not an inter-arrival time: not counted.
//! 3. `max_interval_us` (Cassandra's absolute cap), if set: longer intervals are not counted.
//! 4. With [`XDP_FLAG_GAPLESS_WINDOW`], an interval that spans lost heartbeats is not counted
//!    (the loss-aware model weighs loss through the loss counters instead).
//! 5. Outages: with `outage_factor` K, once the window holds [`OUTAGE_MIN_SAMPLES`], an
//!    interval longer than K times the window's mean is an outage (a crash, a partition, a
//!    pause), not a sample of the path: not counted, so one outage does not teach the detector
//!    to wait out the next one. A run of more than [`OUTAGE_RUN`] such intervals in a row is
//!    the path itself (the sender slowed down, the route changed): from then on they count,
//!    until an ordinary interval ends the run.

use crate::{
    config::{XDP_FLAG_GAPLESS_WINDOW, XdpConfig},
    maps::{MAX_INTERVAL_US, MAX_WINDOW, PeerSlot},
};

/// The outage rule applies once the window holds this many samples (a mean of fewer is noise).
pub const OUTAGE_MIN_SAMPLES: u32 = 4;
/// Consecutive outages left out before long intervals are taken as the path's new normal.
pub const OUTAGE_RUN: u16 = 3;
/// A peer is inside a loss burst until this many heartbeats have arrived without a gap since
/// the last gap. Long enough to span the good stretches inside a burst (a path that loses 40%
/// delivers runs of a few), short enough that one stray loss is forgotten within seconds.
pub const BURST_MEMORY: u8 = 16;
/// The loss counters are halved together when `loss_heartbeats` reaches this.
pub const LOSS_MEMORY: u32 = 1024;

const RING_MASK: u32 = (MAX_WINDOW as u32) - 1;

/// What the slot made of a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An arrival: `lost` sequence numbers were skipped since the previous one.
    Accepted { lost: u64 },
    /// Repeats the last accepted sequence number.
    Duplicate,
    /// Older than the last accepted heartbeat (or from an older incarnation).
    OutOfOrder,
}

impl Outcome {
    /// The number `ArrivalRecord::outcome` carries.
    pub const fn code(self) -> u32 {
        match self {
            Outcome::Accepted { .. } => 0,
            Outcome::Duplicate => 1,
            Outcome::OutOfOrder => 2,
        }
    }
}

/// Records a heartbeat with sequence `seq` of `incarnation` that arrived at `now_ns` into
/// `slot` (whose peer id the caller has checked). Source address and port are the caller's.
#[inline(always)]
pub fn arrive(
    slot: &mut PeerSlot,
    now_ns: u64,
    seq: u64,
    incarnation: u32,
    config: &XdpConfig,
) -> Outcome {
    let record = &mut slot.record;
    let first = record.heartbeats == 0;
    let restarted = !first && incarnation > record.incarnation;
    let lost = if first || restarted {
        0
    } else if incarnation < record.incarnation || seq < record.last_seq {
        record.out_of_order += 1;
        // A late heartbeat fills a gap that was counted as lost.
        if record.lost > 0 {
            record.lost -= 1;
        }
        return Outcome::OutOfOrder;
    } else if seq == record.last_seq {
        record.duplicates += 1;
        return Outcome::Duplicate;
    } else {
        seq - record.last_seq - 1
    };

    record.lost += lost;
    if restarted {
        record.restarts += 1;
        record.burst_left = 0;
    } else if !first {
        count_loss(slot, lost);
        push_interval(slot, now_ns, lost, config);
    }
    let record = &mut slot.record;
    record.heartbeats += 1;
    record.last_arrival_ns = now_ns;
    record.last_seq = seq;
    record.incarnation = incarnation;
    Outcome::Accepted { lost }
}

#[inline(always)]
fn count_loss(slot: &mut PeerSlot, lost: u64) {
    let r = &mut slot.record;
    let gapped = lost > 0;
    r.loss_heartbeats += 1;
    if r.burst_left != 0 {
        r.burst_heartbeats += 1;
        if gapped {
            r.burst_gaps += 1;
        }
    }
    if gapped {
        r.loss_gaps += 1;
        let lost = if lost > u16::MAX as u64 {
            u16::MAX as u32
        } else {
            lost as u32
        };
        r.loss_lost = r.loss_lost.saturating_add(lost);
    }
    r.burst_left = if gapped {
        BURST_MEMORY
    } else {
        r.burst_left.saturating_sub(1)
    };
    if r.loss_heartbeats >= LOSS_MEMORY {
        r.loss_heartbeats >>= 1;
        r.loss_gaps >>= 1;
        r.loss_lost >>= 1;
        r.burst_heartbeats >>= 1;
        r.burst_gaps >>= 1;
    }
}

/// Rules 3-5 (see the module docs), then the ring and its running sums.
#[inline(always)]
fn push_interval(slot: &mut PeerSlot, now_ns: u64, lost: u64, config: &XdpConfig) {
    let mut interval = now_ns.saturating_sub(slot.record.last_arrival_ns) / 1000;
    if interval > MAX_INTERVAL_US {
        interval = MAX_INTERVAL_US;
    }
    if config.max_interval_us != 0 && interval > config.max_interval_us as u64 {
        return;
    }
    if config.flags & XDP_FLAG_GAPLESS_WINDOW != 0 && lost > 0 {
        return;
    }
    let samples = slot.record.samples;
    if config.outage_factor != 0
        && samples >= OUTAGE_MIN_SAMPLES
        // interval > K * (sum / samples), without a division. At most 2^28 * 2^7 on the
        // left and 2^10 * 2^35 on the right (outage_factor is at most 1024): no overflow.
        && interval * samples as u64 > config.outage_factor as u64 * slot.record.interval_sum_us
    {
        if slot.record.outage_run < OUTAGE_RUN {
            slot.record.outage_run += 1;
            slot.record.outages += 1;
            return;
        }
    } else {
        slot.record.outage_run = 0;
    }

    let window = config.window;
    let head = slot.record.ring_head & RING_MASK;
    if samples >= window {
        let old = slot.ring_us[head as usize] as u64;
        slot.record.interval_sum_us -= old;
        slot.record.interval_sum_sq_us -= old * old;
    } else {
        slot.record.samples = samples + 1;
    }
    slot.ring_us[head as usize] = interval as u32;
    slot.record.interval_sum_us += interval;
    slot.record.interval_sum_sq_us += interval * interval;
    let next = head + 1;
    slot.record.ring_head = if next >= window { 0 } else { next };
}

/// Largest accepted `XdpConfig::outage_factor` (keeps the rule's products inside a u64).
pub const MAX_OUTAGE_FACTOR: u32 = 1024;

/// The slot's window, oldest interval first (userspace helper; the kernel never needs it).
pub fn window_intervals(slot: &PeerSlot, window: u32) -> impl Iterator<Item = u32> + '_ {
    let samples = slot.record.samples.min(window);
    let head = slot.record.ring_head;
    // The oldest sample sits at `head` when the ring is full, at 0 before.
    let start = if samples >= window { head } else { 0 };
    (0..samples).map(move |i| slot.ring_us[((start + i) % window) as usize])
}
