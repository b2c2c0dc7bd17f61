//! The phi curve of a budget rule: where its levels come in the silence after the last
//! heartbeat, the top one at the rule's deadline ([`BudgetRule::around`] says how the curve
//! is drawn around the window's anchored intervals).

use crate::detector::tail;

/// The rule chosen for one window, and the phi curve around its deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetRule {
    /// lambda: 0 a timeout from the last arrival, 1 anchored on the schedule.
    pub anchor: f64,
    /// Silence after the last arrival at which phi reaches `top`: the deadline.
    pub deadline_ms: f64,
    /// Heartbeats of the window the rule would have suspected wrongly.
    pub mistakes: u32,
    /// The curve: phi(t) = top * normal_phi((t - center) / scale) / top_phi.
    pub center_ms: f64,
    pub scale_ms: f64,
    pub top: f64,
    top_phi: f64,
    /// What the peer carries to its next estimate: the budget allocated over time.
    pub allocation: super::Allocation,
    /// The budget cannot be met: the peer's own schedule is slower than its aim
    /// ([`super::schedule_outruns_aim`]), and the deadline is past the schedule instead.
    pub unmet: bool,
}

impl BudgetRule {
    /// phi after `silence_ms` without a heartbeat.
    pub fn phi(&self, silence_ms: f64) -> f64 {
        let z = (silence_ms - self.center_ms) / self.scale_ms;
        let phi = (self.top * tail::normal_phi(z) / self.top_phi).max(0.0);
        // Exactly the top level from the deadline on, and below it before, whatever the
        // rounding far in the tail: the deadline is the rule, the curve only grades it.
        match silence_ms.total_cmp(&self.deadline_ms) {
            std::cmp::Ordering::Less => phi.min(self.top.next_down()),
            std::cmp::Ordering::Equal => self.top,
            std::cmp::Ordering::Greater => phi.max(self.top),
        }
    }

    /// The least silence (ms) at which phi reaches `level`: the deadline itself for the top
    /// level, else the normal tail inverted and nudged up to the first float that reaches it.
    pub fn crossing_ms(&self, level: f64) -> f64 {
        if level == self.top {
            return self.deadline_ms;
        }
        if level <= 0.0 {
            return 0.0;
        }
        let z = tail::invert(tail::normal_phi, level * self.top_phi / self.top);
        let mut t = (self.center_ms + z * self.scale_ms).max(0.0);
        if !t.is_finite() {
            return t;
        }
        // A curve drawn for a later deadline ([`BudgetRule::saving`]) may reach a level below
        // the top only after this one: phi steps up to the top at the deadline.
        if level < self.top && t >= self.deadline_ms {
            return self.deadline_ms;
        }
        // The bisection's answer may sit a rounding either side of the level.
        while t > 0.0 && self.phi(t.next_down()) >= level {
            t = t.next_down();
        }
        while self.phi(t) < level {
            t = t.next_up();
        }
        t
    }
}

impl BudgetRule {
    /// The rule with its deadline brought forward to `deadline_ms` (a deadline the allocation
    /// over time saved on), its curve kept: the levels below the top come where they would
    /// for the deadline the curve was drawn for, or at the deadline if that is sooner, and
    /// the top at the deadline. The lower levels grade a silence against the peer's intervals;
    /// what the allocation saves is when the peer is convicted, not how soon a silence looks
    /// odd (drawn around a deadline saved 0.12 of the aim, level 1 of a calm 100 ms sender
    /// under a 400 ms budget came after 157 ms of silence instead of 170, and under live
    /// congestion 290 live peers crossed it, against 267 with the curve kept).
    pub(super) fn saving(mut self, deadline_ms: f64) -> Self {
        if deadline_ms < self.deadline_ms {
            self.deadline_ms = deadline_ms;
        }
        self
    }
}

/// The least scale of a curve (ms): a deadline with no room before it is a step.
const MIN_SCALE_MS: f64 = 1e-3;

impl BudgetRule {
    /// The rule of `anchor` with its deadline, and its phi curve: around `mean` (ms of
    /// silence after the last arrival, the anchored intervals' mean moved by the rule's
    /// shift), over the scale of their deviation `std`, floored by `floor_ms`, with phi
    /// `top` at the deadline.
    ///
    /// The floor yields where it would put the deadline less than z_top scales past the mean
    /// (z_top: the standard normal deviate whose phi is the top level, 5.61 for 8): there the
    /// scale is (deadline - mean) / z_top, or the window's own deviation if that is wider,
    /// and where it is (deadline - mean) / z_top the curve is the normal phi of the silence
    /// itself, log10 2 at the mean. That is a budget short for the floor: a 5 ms sender under
    /// a 40 ms budget, whose 50 ms floor would put the deadline 0.68 scales past the mean.
    /// Unyielding, the floor's scale made the curve end a scale before the deadline, centred
    /// 10.8 ms before the heartbeat: phi was 3.8 at the heartbeat itself, a suspicion at
    /// levels 1 and 3 after every one. The window's own deviation never yields: a deadline
    /// inside the spread of the peer's intervals is reached by some of them, and the levels
    /// below it come before it. Where the deadline is not a scale past the center, the center
    /// moves back to a scale before it (a deadline before the mean: a budget shorter than the
    /// interval, or only the first-interval estimate to go by; with nothing but the floor,
    /// every level within microseconds of the deadline, a plain timeout).
    pub(super) fn around(
        anchor: f64,
        mistakes: u32,
        deadline_ms: f64,
        mean: f64,
        std: f64,
        floor_ms: f64,
        top: f64,
    ) -> Self {
        let z_top = top_deviate(top);
        let room = deadline_ms - mean;
        // A top level at or below the mean's phi (log10 2) has no such deviate: the floor
        // stands.
        let floor = if z_top > 0.0 {
            floor_ms.min(room.max(0.0) / z_top)
        } else {
            floor_ms
        };
        let scale_ms = std.max(floor).max(MIN_SCALE_MS);
        let center_ms = mean.min(deadline_ms - scale_ms);
        let top_phi = tail::normal_phi((deadline_ms - center_ms) / scale_ms);
        BudgetRule {
            anchor,
            deadline_ms,
            mistakes,
            center_ms,
            scale_ms,
            top,
            top_phi,
            allocation: super::Allocation::default(),
            unmet: false,
        }
    }
}

/// The standard normal deviate at which phi is `top`: an inversion, remembered per thread
/// for the last `top` asked (a detector has one top level, and the estimate of every
/// heartbeat may ask).
fn top_deviate(top: f64) -> f64 {
    use std::cell::Cell;
    thread_local! {
        static LAST: Cell<(f64, f64)> = const { Cell::new((f64::NAN, f64::NAN)) };
    }
    LAST.with(|last| {
        let (at, z) = last.get();
        if at == top {
            return z;
        }
        let z = tail::invert(tail::normal_phi, top);
        last.set((top, z));
        z
    })
}
