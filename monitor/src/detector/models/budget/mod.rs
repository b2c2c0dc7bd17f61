//! `budget`: a mean detection budget B (ms), met per peer from its own window with the fewest
//! expected mistakes (Chen, Toueg and Aguilera 2002 configure a detector from a QoS
//! requirement; this does it on every estimate refresh, per peer).
//!
//! The rules it chooses among are deadlines after the last heartbeat,
//!
//!   d(lambda) = a - lambda o_n,   lambda in {0, 1/4, 1/2, 3/4, 1}
//!
//! (a the aim, 0.99 B over time: see [`AIM`] and below),
//! where o_n is the last arrival's offset from the sending schedule: the residual of a least
//! squares line through the window's arrivals (A_j against j; its slope is the period, as
//! Chen's expected arrival takes the window's mean interval for it). lambda = 0 is a plain
//! timeout; lambda = 1 anchors the deadline on the schedule (a late last heartbeat brings
//! the deadline closer, an early one pushes it out), which is Chen's NFD-E with its margin set
//! to the budget; the ones between follow a delay that persists only partly. The residuals sum
//! to zero over the window, so every rule's deadline averages the aim over the window's
//! heartbeats: each meets the budget as a mean detection time (the silence after a heartbeat
//! at which the peer would be convicted, had it crashed right then, averaged over heartbeats).
//! A window of fewer than [`MIN_INTERVALS`] intervals gets the timeout.
//!
//! Each rule's mistakes are counted on the window: heartbeat j would have been a mistake if
//! its interval was longer than the deadline after heartbeat j - 1, that is if
//! s_j(lambda) = x_j + lambda o_{j-1} > 0.99 B. The rule with the fewest is chosen; of rules with
//! as many, the one whose s has the least deviation (the fewest mistakes in expectation,
//! beyond what the window saw), then the lowest lambda. With independent delays the deviation
//! of s is least at lambda = 1 (offsets, not their differences); with a delay that persists
//! (a queue), at lambda = 0. Where the aim is more than a period past a rule's longest s, its
//! deviation counts as 0 ([`tie_deviation`]): on a calm path every rule is, and the timeout is
//! kept, whose deadline a queue's first delay does not bring closer.
//!
//! The aim is allocated over time ([`alloc`]): a Lagrange multiplier mu, per peer, follows a
//! credit (the budget its deadlines left unspent), and each deadline takes the aim a that
//! minimises the window's expected mistakes under the chosen rule ([`predict`]: the next
//! anchored interval exchangeable with the window's, its tail past the longest a normal's
//! with the floored deviation; with the kernel's loss counters, the chance of k losses first)
//! plus mu a / (0.99 B). No deadline spends more than the credit, so the deadlines average
//! 0.99 B or less from a peer's first heartbeat; a deadline saves only once the window is
//! full, at most [`MAX_SAVING`] of the aim (0.12: a calm peer's crash is convicted after
//! 0.87 B or more) or, where the kernel's counters have counted loss and price what the
//! window has not seen, [`MAX_SAVING_WITH_LOSS`] (0.3) or down to two of the window's
//! deviations past its longest anchored interval, whichever saves more ([`past_longest`]);
//! never below the window's longest anchored interval (with loss counted, nor below the runs
//! of losses the aim outlasts: [`losses_outlasted`]), and only while the reserve
//! ([`RESERVE_BUDGETS`] budgets) has room. mu moves its range over the reserve, or over
//! [`PRICE_SPAN_PERIODS`] periods where the reserve is shorter ([`price_span_ms`]).
//!
//! A peer whose own schedule is slower than the aim (most of its last 8 intervals longer,
//! judged from its first: [`schedule_outruns_aim`]) cannot meet the budget without being
//! convicted at most of its heartbeats. It gets the timeout, a deadline past its schedule
//! whatever the credit, every level at that deadline, and the rule says so
//! ([`BudgetRule::unmet`]).
//!
//! The window is the peer's own intervals: the first-interval estimate's two samples, which
//! every model's window starts with, are not arrivals, and only a peer heard once is judged
//! by them ([`choose_unheard`]).
//!
//! phi keeps the levels' order and puts the deadline at the top level (the `threshold`, the
//! agent's highest level): with u = t + lambda o_n the silence anchored as the rule anchors
//! it, m and s the mean and deviation (floored by `min_std_ms`) of the s_j,
//!
//!   phi(t) = top * normal_phi((u - m) / s) / normal_phi((d + lambda o_n - m) / s)
//!
//! so phi = top exactly at the deadline, and a lower level at the silence where the normal
//! phi of the anchored silence is that fraction of its value at the deadline. d here is the
//! deadline of a budget met per window (a - lambda o_n at the 0.99 B aim) or a later one the
//! allocation spends: a deadline it saves on keeps that curve, and phi steps up to the top
//! at it (a lower level that the curve puts later comes at the deadline), so the lower
//! levels do not come sooner for the credit a peer saves. The floor
//! yields where it would put the aim less than z_top deviations above m (z_top: the normal
//! deviate whose phi is the top level): s is then (d + lambda o_n - m) / z_top, or the window's own
//! deviation if wider, and phi the normal phi of the anchored silence, log10 2 at m (a fast
//! sender under a short budget; see [`BudgetRule::around`]). Where the budget is still less
//! than one deviation above m the curve is moved so that it is one: the deadline stays where
//! the budget puts it.
//!
//! Cost: the choice is made when the estimate is (a refresh: every heartbeat, as for the other
//! ring models), in five passes over the window, a sort of its anchored intervals and about
//! 50 aims tried (about 115 with loss, each then a sum over up to 16 losses in a row), each a
//! binary search and, past the window's longest, a normal tail; and one normal tail for the
//! curve (z_top is inverted once per thread and top level). In replay that is 6.0 us an
//! estimate against 2.3 before the allocation (jitter-change, no loss), 37 against 39 with
//! loss (bursty). A read of phi is one normal tail, as `normal`'s, and the sweep compares the
//! clock with the precomputed deadline. The state carried is the credit and a heartbeat count.

mod alloc;
mod curve;
mod predict;

pub use alloc::{Allocation, MU_EMPTY, MU_FULL, RESERVE_BUDGETS, multiplier};
pub use curve::BudgetRule;
use predict::Gap;

use super::{ModelInfo, ModelSpec, PhiModel, SpecKey, WindowNeeds, WindowView};
use crate::detector::model::{DetectorParams, Estimate, Shape};

use monitor_common::{
    maps::{MAX_INTERVAL_US, PeerRecord},
    slot::BURST_MEMORY,
};

/// The anchor weights the choice is among, lowest first (the tie-break order).
pub const ANCHORS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Intervals a window needs before a rule other than the plain timeout is considered: a
/// line through fewer arrivals says nothing of the schedule.
pub const MIN_INTERVALS: usize = 8;

/// The longest budget: a deadline past the longest interval a window holds could never be
/// learned from one.
pub const MAX_BUDGET_MS: f64 = MAX_INTERVAL_US as f64 / 1000.0;

/// The share of the budget the deadlines aim at. The allocation over time ([`alloc`]) counts
/// every deadline against it and none borrows, so the deadlines average the aim or less over
/// every stretch from a peer's first heartbeat; the 1% left is for the agent, which may find
/// several heartbeats at one read and counts the last deadline for those it did not see (it
/// was 0.98 while each window's deadlines averaged the aim only over the window and wandered
/// by up to 0.3 ms around it over a trace).
pub const AIM: f64 = 0.99;

/// The budget when a spec names none.
pub const DEFAULT_BUDGET_MS: f64 = 500.0;

/// Checks a budget: positive, finite, at most [`MAX_BUDGET_MS`].
pub fn check_budget_ms(ms: f64) -> Result<f64, String> {
    if !ms.is_finite() || ms < 1.0 {
        return Err(format!(
            "a detection budget must be at least 1 ms, got {ms} ms"
        ));
    }
    if ms > MAX_BUDGET_MS {
        return Err(format!(
            "a detection budget of {ms} ms is longer than the longest interval a window holds \
             ({MAX_BUDGET_MS} ms)"
        ));
    }
    Ok(ms)
}

/// What the allocation over time brings to a window's choice ([`alloc`]): the credit before
/// its deadline and the heartbeat count it is at, the peer's loss picture, and whether the
/// window is full (only a full window's deadline saves).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OverTime {
    pub allocation: Allocation,
    pub gaps: Option<GapOdds>,
    pub full: bool,
}

/// The rule for a window of intervals (ms, oldest first, every one between consecutive
/// heartbeats), a budget and a floor under the curve's scale, with phi `top` at the deadline.
/// Without `over_time`, every deadline aims at the aim (the rule of a budget met per window);
/// with it, the aim is allocated over time ([`alloc`]).
pub fn choose(
    intervals_ms: &[f64],
    budget_ms: f64,
    min_std_ms: f64,
    top: f64,
    over_time: Option<&OverTime>,
) -> BudgetRule {
    let aim = budget_ms * AIM;
    let n = intervals_ms.len();
    // The offsets o_0..o_n of the arrivals from the least squares line A_j = a + b j.
    let offsets = (n >= MIN_INTERVALS).then(|| schedule_offsets(intervals_ms));
    let period = if n == 0 {
        0.0
    } else {
        intervals_ms.iter().sum::<f64>() / n as f64
    };
    // A schedule slower than the aim is most often one that changed (a sender slowed down):
    // the line through a window of both periods says nothing of the new one, and anchored on
    // it a deadline fell to 0. The timeout alone is judged then.
    let unmet = schedule_outruns_aim(intervals_ms, aim);
    // (mistakes, deviation for ties, std, anchor, mean)
    let mut best: Option<(u32, f64, f64, f64, f64)> = None;
    for &anchor in &ANCHORS {
        if anchor > 0.0 && (offsets.is_none() || unmet) {
            break;
        }
        let s = |j: usize| intervals_ms[j] + offsets.as_ref().map_or(0.0, |o| anchor * o[j]);
        let (mut mistakes, mut sum, mut sum_sq, mut longest) = (0u32, 0.0, 0.0, 0.0f64);
        for j in 0..n {
            let v = s(j);
            mistakes += (v > aim) as u32;
            sum += v;
            sum_sq += v * v;
            longest = longest.max(v);
        }
        let (mean, std) = if n == 0 {
            (aim, 0.0)
        } else {
            let mean = sum / n as f64;
            (mean, (sum_sq / n as f64 - mean * mean).max(0.0).sqrt())
        };
        let tie = tie_deviation(std, longest, period, aim);
        let better = best.is_none_or(|(m, t, _, _, _)| mistakes < m || (mistakes == m && tie < t));
        if better {
            best = Some((mistakes, tie, std, anchor, mean));
        }
    }
    let (mistakes, _, std, anchor, mean) = best.expect("the timeout is always a candidate");
    // The last arrival's offset (o_n), by which the rule moves the deadline.
    let shift = offsets.as_ref().map_or(0.0, |o| anchor * o[n]);
    let anchored = || Anchored {
        intervals: (0..n)
            .map(|j| intervals_ms[j] + offsets.as_ref().map_or(0.0, |o| anchor * o[j]))
            .collect(),
        mean,
        tail_std: std.max(min_std_ms),
        std,
        period,
    };
    let (deadline_ms, allocation) = match over_time {
        // The timeout alone (above), so no shift: the credit passes on as it stood, held to
        // the reserve as every rule's is (found unheld by fuzz/fuzz_targets/budget_window.rs).
        _ if unmet => (
            anchored().past_schedule(budget_ms),
            over_time.map_or_else(Allocation::default, |time| {
                time.allocation.held_to(alloc::reserve_ms(budget_ms))
            }),
        ),
        Some(time) => anchored().deadline(budget_ms, shift, time),
        None => ((aim - shift).max(0.0), Allocation::default()),
    };
    // The curve is drawn for the deadline of a budget met per window, or a later one the
    // allocation spends; a deadline it saves on comes sooner on the same curve
    // ([`BudgetRule::saving`]).
    //
    // Past a schedule that outruns the aim, the deadline is a few ms past the peer's own
    // intervals: a curve graded before it would put the lower levels inside their spread
    // (scaled to fit, level 1 came 1.2 ms past the mean interval of a 150 ms sender under a
    // 100 ms budget: at most heartbeats). Every level comes at the deadline instead, a
    // timeout: the silence says nothing before it that the schedule does not.
    let unsaved_ms = (aim - shift).max(0.0);
    let mut rule = if unmet {
        BudgetRule::around(anchor, mistakes, deadline_ms, deadline_ms, 0.0, 0.0, top)
    } else {
        BudgetRule::around(
            anchor,
            mistakes,
            deadline_ms.max(unsaved_ms),
            mean - shift,
            std,
            min_std_ms,
            top,
        )
        .saving(deadline_ms)
    };
    rule.allocation = allocation;
    rule.unmet = unmet;
    rule
}

/// Intervals [`schedule_outruns_aim`] reads: the last few, so that a sender that slowed down
/// is seen within a few heartbeats rather than half a window.
pub const RECENT_INTERVALS: usize = MIN_INTERVALS;

/// The fewest intervals [`schedule_outruns_aim`] judges: a new peer's first interval over the
/// aim says so at its second heartbeat (and its first two, both over it, at its third), where
/// waiting for a window a rule can be read from (8) let a 150 ms sender under a 100 ms budget
/// be convicted and cleared at each of its first nine heartbeats, and waiting for three
/// intervals at each of its first three. Told wrongly (a first interval a delay stretched), a
/// peer gets a later deadline for a heartbeat or two, not a conviction.
pub const MIN_JUDGED_INTERVALS: usize = 1;

/// Whether the peer's own schedule is slower than the aim: most of its last
/// [`RECENT_INTERVALS`] intervals (of at least [`MIN_JUDGED_INTERVALS`]; between heartbeats
/// it sent, none spanning a loss) are longer than the aim. A deadline at the aim would then
/// convict the live peer at most of its heartbeats and clear it at the next: a sender that
/// slowed to 250 ms under a 200 ms budget was convicted 1425 times in its 1500 slow
/// heartbeats (`slowdown`, seed 1). No deadline meets such a budget without that; the
/// detector says so ([`BudgetRule::unmet`]) and sets the deadline past the schedule instead
/// ([`Anchored::past_schedule`]). Loss, jitter and queues are not this: their long intervals
/// are a minority of the recent ones, and there the budget is a trade of mistakes for
/// detection time that the allocation makes.
pub fn schedule_outruns_aim(intervals_ms: &[f64], aim: f64) -> bool {
    let n = intervals_ms.len();
    if n < MIN_JUDGED_INTERVALS {
        return false;
    }
    let recent = &intervals_ms[n - n.min(RECENT_INTERVALS)..];
    2 * recent.iter().filter(|&&x| x > aim).count() > recent.len()
}

/// A window's anchored intervals under the chosen rule, their mean, the deviation of the tail
/// past the longest (see [`predict::Window`]), and the period (the window's mean interval).
struct Anchored {
    intervals: Vec<f64>,
    mean: f64,
    tail_std: f64,
    /// The anchored intervals' own deviation, not floored.
    std: f64,
    period: f64,
}

/// The longest samples of the window, and the points past its longest, tried as aims.
const TAIL_CANDIDATES: usize = 16;
/// Points of the even grid between the least and the most an aim may be, tried as aims.
const GRID_CANDIDATES: usize = 16;

impl Anchored {
    /// The deadline after the last heartbeat, allocated over time, and what the peer carries
    /// to the next estimate: the aim that minimises the window's expected mistakes plus mu
    /// times the aim ([`alloc::allocate`]), moved by the rule's shift. It spends at most the
    /// credit (and [`MAX_BURST_PERIODS`] periods) over the aim, and saves at most what the
    /// reserve has room for and [`MAX_SAVING`] of the aim (with loss counted,
    /// [`MAX_SAVING_WITH_LOSS`] or down to [`past_longest`], whichever is more), never below
    /// the window's longest anchored interval (a deadline the window itself shows missed) or,
    /// with loss counted, inside a run of losses the aim outlasts ([`losses_outlasted`]), and
    /// only once the window is full: a partial window is the peer's first heartbeats, which
    /// say little of the path (on `bursty` most mistakes of the allocation came before the
    /// first burst, from deadlines saved on calm first windows). mu is read from the credit
    /// over [`price_span_ms`].
    fn deadline(mut self, budget_ms: f64, shift: f64, time: &OverTime) -> (f64, Allocation) {
        let aim = budget_ms * AIM;
        let reserve = alloc::reserve_ms(budget_ms);
        let allocation = time.allocation.held_to(reserve);
        let credit = allocation.credit_ms;
        let n = self.intervals.len();
        if n < MIN_INTERVALS {
            return ((aim - shift).clamp(0.0, aim + credit), allocation);
        }
        self.intervals.sort_by(f64::total_cmp);
        let longest = self.intervals[n - 1];
        let window = self.window();
        let gap = time.gaps.map(|g| Gap {
            p: g.p_next(),
            q: g.q,
            period: self.period,
        });
        // What comes rarer than once in the window is priced by the kernel's loss counters
        // where they have counted loss, by nothing where not. Where they have, the share
        // gives way to a margin past the longest interval the window shows.
        let share_floor = if time.gaps.is_some() {
            (aim * (1.0 - MAX_SAVING_WITH_LOSS)).min(past_longest(longest, self.std))
        } else {
            aim * (1.0 - MAX_SAVING)
        };
        let lo = if time.full {
            (aim - (reserve - credit))
                .max(longest.min(aim))
                .max(share_floor)
                .max(losses_outlasted(
                    aim,
                    longest,
                    self.period,
                    time.gaps.is_some(),
                ))
        } else {
            aim
        };
        let hi = (aim + credit).min(aim + MAX_BURST_PERIODS * self.period);
        let lost = if gap.is_some_and(|g| g.p > 0.0) { 2 } else { 0 };
        let a = alloc::allocate(
            |a| window.misses(a, gap.as_ref()),
            self.aims_tried(lo, hi, lost),
            alloc::multiplier(credit, price_span_ms(reserve, self.period)),
            aim,
            (lo, hi),
        );
        ((a - shift).clamp(0.0, aim + credit), allocation)
    }
}

impl Anchored {
    /// The window the expected mistakes are read from (the intervals sorted).
    fn window(&self) -> predict::Window<'_> {
        predict::Window {
            sorted: &self.intervals,
            mean: self.mean,
            tail_std: self.tail_std,
        }
    }

    /// The aims tried in `[lo, hi]` (the intervals sorted): the window's longest
    /// [`TAIL_CANDIDATES`] and as many steps of half the tail's deviation past its longest,
    /// each also 1 to `lost` periods later, and an even grid between the bounds.
    fn aims_tried(&self, lo: f64, hi: f64, lost: usize) -> impl Iterator<Item = f64> + '_ {
        let n = self.intervals.len();
        let longest = self.intervals[n - 1];
        let step = self.tail_std.max(1e-3) / 2.0;
        let period = self.period;
        self.intervals[n.saturating_sub(TAIL_CANDIDATES)..]
            .iter()
            .copied()
            .chain((1..=TAIL_CANDIDATES).map(move |j| longest + j as f64 * step))
            .flat_map(move |a| (0..=lost).map(move |k| a + k as f64 * period))
            .chain(
                (1..GRID_CANDIDATES)
                    .map(move |i| lo + (hi - lo) * i as f64 / GRID_CANDIDATES as f64),
            )
    }

    /// The deadline of a peer whose schedule outruns the aim ([`schedule_outruns_aim`]): the
    /// aim past it with the fewest expected mistakes plus the price of a millisecond with no
    /// credit ([`alloc::MU_EMPTY`]), up to [`MAX_BURST_PERIODS`] periods past the aim, spending
    /// no credit it does not have: the peer is over its budget whatever the deadline, and the
    /// least deadline its own intervals do not reach is the soonest a crash can be told from
    /// its schedule. The credit drains as these deadlines count against the aim.
    fn past_schedule(mut self, budget_ms: f64) -> f64 {
        let aim = budget_ms * AIM;
        self.intervals.sort_by(f64::total_cmp);
        let (lo, hi) = (aim, aim + MAX_BURST_PERIODS * self.period);
        alloc::allocate(
            |a| self.window().misses(a, None),
            self.aims_tried(lo, hi, 0),
            alloc::MU_EMPTY,
            aim,
            (lo, hi),
        )
    }
}

/// The rule for a peer whose window holds no interval of its own yet (one heartbeat heard):
/// the timeout at the aim, its curve around the first-interval estimate's samples
/// (`estimate_ms`, the two every model's window starts with), whose deviation is assumed,
/// as the floor is, and yields as the floor does where the budget is short for it.
pub fn choose_unheard(
    estimate_ms: &[f64],
    budget_ms: f64,
    min_std_ms: f64,
    top: f64,
) -> BudgetRule {
    let deadline_ms = budget_ms * AIM;
    let n = estimate_ms.len() as f64;
    if estimate_ms.is_empty() {
        return BudgetRule::around(0.0, 0, deadline_ms, deadline_ms, 0.0, min_std_ms, top);
    }
    let mean = estimate_ms.iter().sum::<f64>() / n;
    let var = estimate_ms
        .iter()
        .map(|x| (x - mean) * (x - mean))
        .sum::<f64>()
        / n;
    let floor = var.sqrt().max(min_std_ms);
    BudgetRule::around(0.0, 0, deadline_ms, mean, 0.0, floor, top)
}

/// The deviation by which rules of as many mistakes are told apart: their own, or 0 where the
/// aim is more than a period past the longest anchored interval of the window. There no rule
/// came near a mistake, the anchoring has nothing to buy, and what would move an anchored
/// deadline is more often a queue's first delay than a schedule's jitter (a path calm until
/// a burst of cross traffic: the late arrival would bring the deadline closer just as the
/// queue grows); so of such rules the one that moves its deadline least, the timeout first,
/// is kept.
pub fn tie_deviation(std: f64, longest: f64, period: f64, aim: f64) -> f64 {
    if aim - longest > period { 0.0 } else { std }
}

/// A peer's loss, as the kernel's counters picture it (`PeerRecord::loss_heartbeats` and the
/// rest): two states, inside a loss burst (a gap within the last `BURST_MEMORY` heartbeats)
/// and outside, each with its own chance that the next heartbeat comes after a gap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GapOdds {
    /// P(the next heartbeat comes after a gap), outside a burst and inside one.
    pub p_good: f64,
    pub p_bad: f64,
    /// P(a heartbeat is lost | the one before it was lost).
    pub q: f64,
    /// The last heartbeat left the peer inside a burst.
    pub in_burst: bool,
    /// Inside a burst, the heartbeats that arrived since the gap, that one included (1 to
    /// [`BURST_MEMORY`]); 0 outside.
    pub since_gap: u8,
}

/// How much of a burst's excess chance of a gap is left one heartbeat later. In a two-state
/// chain the chance falls back toward the calm rate with every heartbeat that arrives (the
/// belief in the bad state shrinks by about the chance of arriving there over that of
/// arriving when calm): on the generated Gilbert-Elliott traces from 0.26 one heartbeat after
/// a gap to 0.085 four later and 0.014 nine later, against 0.0097 when calm, a fall of 0.64 to
/// 0.74 a heartbeat. The counters measure only the burst's mean over its positions, so the
/// shape is assumed and its height fitted to that mean ([`GapOdds::p_next`]).
const BURST_DECAY: f64 = 0.7;

/// How much likelier a loss must be after a loss than a gap after a burst's heartbeat for the
/// chance of a gap to be taken as falling back after each gap ([`GapOdds::p_next`]): on the
/// generated Gilbert-Elliott traces 0.36 against 0.08; with independent loss the two are equal.
const CLUSTERED: f64 = 2.0;

impl GapOdds {
    /// From the record's counters; None where no gap was counted. Inside a burst the chance
    /// is the one measured inside bursts once the counters hold [`MIN_BURST_HEARTBEATS`]
    /// heartbeats there (two bursts' memory), and before that the chance over every
    /// heartbeat: one gap, with the few heartbeats after it, is no measure of the state.
    pub fn from_record(r: &PeerRecord) -> Option<Self> {
        if r.loss_heartbeats == 0 || r.loss_gaps == 0 {
            return None;
        }
        let good = r.loss_heartbeats.saturating_sub(r.burst_heartbeats);
        let good_gaps = r.loss_gaps.saturating_sub(r.burst_gaps);
        let p_bad = if r.burst_heartbeats >= MIN_BURST_HEARTBEATS {
            r.burst_gaps as f64 / r.burst_heartbeats as f64
        } else {
            r.loss_gaps as f64 / r.loss_heartbeats as f64
        };
        Some(Self {
            // Held to 1 as p_bad is: the counters are halved one by one, and a slot read
            // while the kernel writes it may hold more gaps than heartbeats outside bursts.
            p_good: if good == 0 {
                0.0
            } else {
                (good_gaps as f64 / good as f64).min(1.0)
            },
            p_bad: p_bad.min(1.0),
            q: r.loss_lost.saturating_sub(r.loss_gaps) as f64 / r.loss_lost.max(1) as f64,
            in_burst: r.burst_left != 0,
            since_gap: if r.burst_left == 0 {
                0
            } else {
                (BURST_MEMORY + 1).saturating_sub(r.burst_left).max(1)
            },
        })
    }

    /// P(the next heartbeat comes after a gap). Outside a burst, the calm rate. Inside one,
    /// `p_good + e BURST_DECAY^(m-1)` at the m-th heartbeat since the gap, with `e` such that
    /// the burst's positions, each at the share of heartbeats that reach it (a gap starts the
    /// count again), average `p_bad`, the rate the counters measured inside bursts: the chance
    /// is highest just after a gap and has fallen most of the way back by the burst's end.
    pub fn p_next(&self) -> f64 {
        if !self.in_burst {
            return self.p_good;
        }
        let memory = BURST_MEMORY as usize;
        // Losses that do not cluster (a loss followed by another no more often than twice a
        // gap follows a burst's heartbeat: independent loss, where every position is alike)
        // keep the burst's mean at every position.
        if self.p_bad <= self.p_good || self.since_gap == 0 || self.q <= CLUSTERED * self.p_bad {
            return self.p_bad;
        }
        let at = |e: f64, m: usize| (self.p_good + e * BURST_DECAY.powi(m as i32 - 1)).min(1.0);
        let mean = |e: f64| {
            let (mut reach, mut weight, mut sum) = (1.0, 0.0, 0.0);
            for m in 1..=memory {
                let p = at(e, m);
                weight += reach;
                sum += reach * p;
                reach *= 1.0 - p;
            }
            sum / weight
        };
        // The mean rises with e (every chance rises, and the weight moves to the first
        // positions, whose chances are the highest); at e = 1 the first position's chance is 1
        // and no heartbeat reaches the next, so the mean is 1 and the root lies in [0, 1].
        let (mut lo, mut hi) = (0.0, 1.0);
        if mean(hi) <= self.p_bad {
            return self.p_bad.min(1.0);
        }
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if mean(mid) < self.p_bad {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        at(0.5 * (lo + hi), (self.since_gap as usize).min(memory))
    }
}

/// Heartbeats inside a burst the counters must hold before their chance of a gap there is
/// taken: two bursts' memory ([`BURST_MEMORY`]).
pub const MIN_BURST_HEARTBEATS: u32 = 2 * BURST_MEMORY as u32;

/// The most of the aim one deadline gives up where the kernel's counters have counted no
/// loss: the expected mistakes of a short deadline are then the window's alone, which has not
/// seen what comes rarer than once in its length (a queue that builds without warning, a
/// starved CPU), so a calm peer's crash is convicted after no less than 0.88 of the aim
/// (0.87 B). Under live congestion (tests/tests/budget_congestion.rs, `--budget 400ms`) 0.3
/// of the aim convicted the killed peers after 0.76 B (the test holds the median to 0.85 B at
/// least); 0.12, after 0.87 B, with no live peer at level 3 (the curve kept: see
/// [`BudgetRule`]'s `saving`). Over 20 seeds of the generated kinds without loss it moved no
/// sum by more than a few mistakes against 0.3.
pub const MAX_SAVING: f64 = 0.12;

/// The most of the aim one deadline gives up where the counters have counted loss: there the
/// expected mistakes carry the counters' picture of the path, over a memory of a thousand
/// heartbeats and more, and what the good state saves pays for the bursts (over 20 seeds,
/// `bursty` made 888 mistakes at 150 ms with 0.3, 989 with 0.12, 924 with a budget met per
/// window; `asymmetric-loss` 3186 and 3886 against 4816). Saving more made more of the
/// mistakes the window does not see than it bought back where the budget was spent (on
/// `bursty` over 20 seeds, half the aim made 5, 2 and 1 mistakes at 750, 1000 and 1500 ms,
/// 0.3 of it 2, 1 and 0, the aim alone 1, 1 and 0).
pub const MAX_SAVING_WITH_LOSS: f64 = 0.3;

/// The least a deadline may save down to where loss is counted: the window's longest
/// interval and as many whole periods past it as the aim outlasts (a saved deadline that
/// still outlasts them turns no run of losses the aim survives into a mistake). 0 where no
/// loss is counted, or the aim is inside the longest.
///
/// [`MAX_SAVING_WITH_LOSS`] bounds the saving by a share of the aim, which under a budget of
/// several periods let a calm deadline fall inside a run of losses the aim outlasts: saving
/// 0.3 of a 396 ms aim leaves 277 ms, inside two losses in a row on a 100 ms schedule (the
/// period here is the window's mean interval, losses included: a little long, so the bound
/// errs toward saving less). Held past them,
/// over 20 seeds of every generated kind, `asymmetric-loss` went from 232 / 52 / 11 to 227 /
/// 38 / 10 at 300 / 400 / 500 ms, `bursty` from 156 / 58 / 23 / 2 to 154 / 54 / 20 / 1 at
/// 300 to 750 ms, `congested-link` from 14 / 1 to 9 / 0 at 300 / 400 and `pareto` at 400
/// from 3 to 1, and no cell made more (docs/tuning.md, "Loss-aware suspicion").
pub fn losses_outlasted(aim: f64, longest: f64, period: f64, loss_counted: bool) -> f64 {
    if !loss_counted || period <= 0.0 || aim <= longest {
        return 0.0;
    }
    (longest + ((aim - longest) / period).floor() * period).min(aim)
}

/// Where loss is counted, how far down a deadline may save where the share
/// ([`MAX_SAVING_WITH_LOSS`]) would stop it further from the window's longest anchored
/// interval: [`SAVING_MARGIN_STDS`] of the window's own deviation past that interval, the
/// deviation taken as at least [`MIN_MARGIN_STD_MS`].
///
/// The share prices what the window cannot see. Under a budget of two periods, where the aim
/// outlasts no loss ([`losses_outlasted`] gives only the longest), 0.3 of a 198 ms aim left a
/// calm deadline at 138.6 ms, 30 ms past anything a 100 ms schedule with 2 ms of jitter
/// delivers, where the bound's allocation gives such heartbeats 108 ms and spends the rest
/// inside bursts (docs/tuning.md, "Loss-aware suspicion"). Two deviations past the longest
/// (about 4.6 from the mean of a full window) is past what the window's own jitter reaches;
/// what lies beyond it, the loss counters price. A larger share instead fell off a cliff
/// (0.5 put the deadline at the longest itself, and the path's jitter reached past it); one
/// and three deviations measured within 1% of two.
pub fn past_longest(longest: f64, std: f64) -> f64 {
    longest + SAVING_MARGIN_STDS * std.max(MIN_MARGIN_STD_MS)
}

/// Deviations past the window's longest anchored interval that a saved deadline keeps where
/// loss is counted ([`past_longest`]).
pub const SAVING_MARGIN_STDS: f64 = 2.0;

/// The least deviation [`past_longest`] takes: a path whose window shows almost none (a
/// veth, a quiet LAN) still keeps 2 ms past its longest interval, about what the agent's
/// millisecond clock and a scheduler's wake-up resolve.
pub const MIN_MARGIN_STD_MS: f64 = 1.0;

/// The least credit, in periods (the window's mean interval), over which ln mu moves from
/// [`alloc::MU_EMPTY`] to [`alloc::MU_FULL`]: the reserve's [`RESERVE_BUDGETS`] budgets or
/// this many periods, whichever is longer.
///
/// A burst spends in periods (each loss it outlasts is one more), and the reserve is counted
/// in budgets: under a budget of two periods the reserve is 128 periods, so a burst of ten
/// heartbeats given 600 ms more each spent half of it and raised mu 30-fold within the burst,
/// where the bound's allocation keeps one price. Spread over 192 periods, the same burst
/// moves it 10-fold. Budgets of three periods and more (64 budgets, at least 192 periods) are
/// unchanged. On the Gilbert bound's traces that took 200 ms from 1.26 to 1.22x the bound
/// (with [`past_longest`]); over 20 seeds `jitter-change` at 150 ms went from 1114 to 884
/// mistakes, `bursty` from 774 to 722, `asymmetric-loss` at 200 ms from 1274 to 1225, and
/// `wan` and `pareto`, whose rare long delays a cheap full reserve bought, from 491 and 263
/// to 511 and 277 at 200 ms. 256 periods did more for the losses (1.19x) and cost those two
/// more (528 and 295) and a corpus cell; 384 cost `bursty` at 400 ms.
pub const PRICE_SPAN_PERIODS: f64 = 192.0;

/// The credit over which ln mu moves its range ([`alloc::multiplier`]): the reserve, or
/// [`PRICE_SPAN_PERIODS`] periods where that is longer.
pub fn price_span_ms(reserve_ms: f64, period_ms: f64) -> f64 {
    reserve_ms.max(PRICE_SPAN_PERIODS * period_ms)
}

/// Most periods a deadline may go past the aim: the allocation buys fewer mistakes with
/// longer detection where they are dear (inside loss bursts), and this bounds how much longer.
pub const MAX_BURST_PERIODS: f64 = 8.0;

/// The offsets of arrivals 0..=n from the least squares line through them (arrival j at the
/// sum of the first j intervals, against j): n + 1 residuals that sum to zero.
pub fn schedule_offsets(intervals_ms: &[f64]) -> Vec<f64> {
    let n = intervals_ms.len();
    let mut arrivals = Vec::with_capacity(n + 1);
    let mut at = 0.0;
    arrivals.push(at);
    for &x in intervals_ms {
        at += x;
        arrivals.push(at);
    }
    let count = (n + 1) as f64;
    let mean_j = n as f64 / 2.0;
    let mean_a = arrivals.iter().sum::<f64>() / count;
    let (mut cov, mut var) = (0.0, 0.0);
    for (j, &a) in arrivals.iter().enumerate() {
        let dj = j as f64 - mean_j;
        cov += dj * (a - mean_a);
        var += dj * dj;
    }
    let period = if var > 0.0 { cov / var } else { 0.0 };
    arrivals
        .iter()
        .enumerate()
        .map(|(j, &a)| a - mean_a - period * (j as f64 - mean_j))
        .collect()
}

/// The intervals the rule is chosen from (ms, oldest first): the window's own, between
/// heartbeats the peer sent. The first-interval estimate's samples, which every other model
/// starts its window with, are not arrivals: read as such, they bent the schedule's line
/// through the first `window - 2` heartbeats (a 5 ms sender's window behind samples of 75
/// and 125 ms left its last arrival 9.2 ms early on the line after 60 heartbeats, and the
/// schedule-anchored rule put the deadline 9.2 ms past the aim, at 1.21 B), and counted as
/// mistakes of every rule whose deadline is shorter than them. A window with none of its
/// own is [`choose_unheard`]'s.
pub fn arrival_intervals_ms(window: &WindowView<'_>) -> Vec<f64> {
    window.ring.iter().map(|&us| us as f64 / 1000.0).collect()
}

/// The `budget` model: its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub budget_ms: f64,
    /// phi at the deadline: the threshold (the agent's highest level).
    pub top: f64,
    pub min_std_ms: f64,
}

impl ModelInfo for Budget {
    const NAME: &'static str = "budget";
    const ABOUT: Option<&'static str> = Some(
        "a mean detection budget (`ms`) met per peer by the deadline rule with the fewest \
         mistakes on its window; phi reaches the threshold at the deadline",
    );
    const SPEC: ModelSpec = ModelSpec {
        own_kind: Some((
            "budget",
            &[
                "threshold",
                "window",
                "min_std_ms",
                "first_interval_ms",
                "max_interval_ms",
                "outage_factor",
            ],
        )),
        keys: &[SpecKey {
            name: "ms",
            parse: |params, value| {
                let ms = crate::detector::spec::positive("ms", value)?;
                params.budget_ms = check_budget_ms(ms).map_err(|e| format!("ms: {e}"))?;
                Ok(())
            },
        }],
        finish: |_, _| Ok(()),
        format: |params| {
            let mut keys = vec![
                format!("ms={}", params.budget_ms),
                format!("threshold={}", params.threshold),
                format!("window={}", params.window),
                format!("min_std_ms={}", params.min_std_ms),
                format!("first_interval_ms={}", params.first_interval_ms),
                format!("outage_factor={}", params.outage_factor),
            ];
            if let Some(max) = params.max_interval_ms {
                keys.push(format!("max_interval_ms={max}"));
            }
            keys
        },
    };

    fn from_params(params: &DetectorParams) -> Self {
        Self {
            budget_ms: params.budget_ms,
            top: params.threshold,
            min_std_ms: params.min_std_ms,
        }
    }
}

impl Budget {
    /// The rule for the window, its aim allocated from `allocation`'s credit.
    fn allocated(&self, window: &WindowView<'_>, allocation: Allocation) -> Shape {
        let allocation = Allocation {
            heartbeats: window.record.heartbeats,
            ..allocation
        };
        if window.ring.is_empty() {
            let mut rule = choose_unheard(
                &super::intervals_ms(window),
                self.budget_ms,
                self.min_std_ms,
                self.top,
            );
            rule.allocation = allocation;
            return Shape::Budget(rule);
        }
        Shape::Budget(choose(
            &arrival_intervals_ms(window),
            self.budget_ms,
            self.min_std_ms,
            self.top,
            Some(&OverTime {
                allocation,
                gaps: GapOdds::from_record(window.record),
                full: window.ring.len() + 2 >= window.window as usize,
            }),
        ))
    }
}

impl PhiModel for Budget {
    /// The window is read as the sending schedule, as `chen` reads it: an interval that spans
    /// lost heartbeats is not a late arrival.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds {
            ring: true,
            gapless: true,
        }
    }

    /// A peer's first estimate: no credit yet.
    fn shape(&self, window: &WindowView<'_>) -> Shape {
        self.allocated(window, Allocation::default())
    }

    /// The credit the last estimate left, brought to this one's heartbeat ([`alloc`]).
    fn shape_after(&self, window: &WindowView<'_>, previous: &Estimate) -> Shape {
        let Shape::Budget(last) = &previous.shape else {
            return self.shape(window);
        };
        let heartbeats = window.record.heartbeats;
        let credit_ms = last.allocation.next(
            heartbeats,
            last.deadline_ms,
            self.budget_ms * AIM,
            alloc::reserve_ms(self.budget_ms),
        );
        self.allocated(
            window,
            Allocation {
                credit_ms,
                heartbeats,
            },
        )
    }

    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        match &estimate.shape {
            Shape::Budget(rule) => rule.phi(silence_ms),
            _ => super::phi_by_shape(estimate, silence_ms),
        }
    }

    /// The level itself: the crossing comes from the rule's curve.
    fn level_constant(&self, level: f64) -> f64 {
        level
    }

    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        match &estimate.shape {
            Shape::Budget(rule) => rule.crossing_ms(k),
            _ => super::silence_by_shape(k, estimate, false),
        }
    }
}

#[cfg(test)]
mod tests;
