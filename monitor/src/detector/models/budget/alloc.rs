//! The budget allocated over time, per peer: a Lagrange multiplier mu prices a millisecond of
//! deadline in expected mistakes, and each deadline takes the aim that minimises its window's
//! expected mistakes plus mu times the aim ([`allocate`]). A calm window, whose expected
//! mistakes are flat past its longest interval, gets a deadline near it; a jittery or lossy
//! one, where a millisecond more still buys fewer mistakes, gets more.
//!
//! mu follows a credit, the budget the peer's deadlines have left unspent: every deadline adds
//! the aim less itself. That is dual ascent (mu rises with every deadline over the aim and
//! falls with every one under it), with ln mu linear in the credit between [`MU_EMPTY`] (no
//! credit) and [`MU_FULL`] (the reserve full). Two bounds make it a budget met, not a
//! tendency: a deadline spends at most the credit there is (no deadline borrows, so over
//! every stretch from the peer's first heartbeat its deadlines average the aim or less), and
//! saves at most the room left in the reserve ([`RESERVE_BUDGETS`] budgets), so a calm peer
//! whose reserve is full gets the aim, and its mean detection time is the aim less what the
//! reserve holds, over the heartbeats seen.
//!
//! The state is two numbers a peer (the credit and the heartbeat count of the estimate),
//! carried from one estimate to the next in the rule ([`super::BudgetRule::allocation`]).

/// The reserve, in budgets: the most credit a peer keeps. A deadline after each heartbeat of
/// `RESERVE_BUDGETS` heartbeats could be twice the budget on it. It bounds how far below the
/// budget a trace's mean detection time may end (the reserve held at its end, over its
/// heartbeats: 64 budgets over 1700 heartbeats is 0.038 of the budget) and how long a
/// stretch a calm spell pays for (128 budgets put the recorded corpus's mean detection at
/// 0.916 B, and made more mistakes on it than 64: a larger reserve is filled by more
/// heartbeats given short deadlines).
pub const RESERVE_BUDGETS: f64 = 64.0;

/// The reserve under a budget, ms of deadline: [`RESERVE_BUDGETS`] budgets.
pub fn reserve_ms(budget_ms: f64) -> f64 {
    RESERVE_BUDGETS * budget_ms
}

/// mu, in expected mistakes a heartbeat per aim's worth of deadline, with no credit: a
/// deadline gives up 1% of the aim where that costs less than 0.0015 expected mistakes.
/// Priced in aims rather than milliseconds, a millisecond is dearer under a short budget,
/// where it is a larger share of what every deadline has.
pub const MU_EMPTY: f64 = 0.15;
/// mu with a full reserve. The range sets how far mu swings as a burst spends the credit:
/// ln mu moves by ln(MU_EMPTY / MU_FULL) over the reserve, so a burst that spends 30 of its 64
/// budgets moved mu 650-fold with the 1.5e-7 this was (13.8 over the reserve) and moves it
/// 30-fold now (7.3), closer to the one price of a millisecond the bound's allocation keeps.
/// On the Gilbert bound's traces (docs/tuning.md, "Loss-aware suspicion") that took the budget
/// detector from 1.47 / 1.31 / 1.27x the bound at 200 / 250 / 300 ms to 1.34 / 1.20 / 1.16x;
/// 1e-2 left too little room to spend at 350 ms and up (1.48 to 2.10x there). Under budgets
/// of less than three periods the range is spread over more credit than the reserve holds
/// ([`super::PRICE_SPAN_PERIODS`]), so there a full reserve prices above this. 3e-4 with the
/// margin of [`super::past_longest`] measured 1.24x at 200 ms, but made more of `bursty`'s
/// first bursts mistakes (54 and 20 to 63 and 24 at 400 and 500 ms over 20 seeds).
pub const MU_FULL: f64 = 1e-4;

/// What a peer carries from one estimate to the next.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Allocation {
    /// The budget left unspent before this estimate's deadline (ms of deadline, summed over
    /// heartbeats), 0 to the reserve.
    pub credit_ms: f64,
    /// The peer's heartbeat count (`PeerRecord::heartbeats`) at this estimate.
    pub heartbeats: u64,
}

impl Allocation {
    /// The same, its credit held to 0 to the reserve: what a rule is handed may come from an
    /// estimate made under a longer budget (a reload re-estimates a heartbeat with the
    /// credit it had).
    pub fn held_to(self, reserve_ms: f64) -> Self {
        Self {
            credit_ms: self.credit_ms.clamp(0.0, reserve_ms.max(0.0)),
            ..self
        }
    }

    /// The credit before the deadline of an estimate at `heartbeats`, this one's deadline
    /// `deadline_ms` having stood for every heartbeat since (one in replay, which sees each;
    /// the agent reads a peer at its sweeps and may find more), each spending it against
    /// `aim_ms`; the same credit for an estimate of the same heartbeat made again (a reload).
    pub fn next(&self, heartbeats: u64, deadline_ms: f64, aim_ms: f64, reserve_ms: f64) -> f64 {
        if heartbeats == self.heartbeats {
            return self.credit_ms;
        }
        // A count that went back (a new slot) counts as one heartbeat.
        let stood = heartbeats.checked_sub(self.heartbeats).unwrap_or(1);
        let spent = stood.min(1 << 20) as f64 * (deadline_ms - aim_ms);
        (self.credit_ms - spent).clamp(0.0, reserve_ms.max(0.0))
    }
}

/// mu for a credit: ln mu linear in the credit, from [`MU_EMPTY`] at none to [`MU_FULL`] at
/// `span_ms` (the reserve, or longer where the reserve is short against the period:
/// [`super::PRICE_SPAN_PERIODS`]), and [`MU_FULL`] past it.
pub fn multiplier(credit_ms: f64, span_ms: f64) -> f64 {
    let full = if span_ms > 0.0 {
        (credit_ms / span_ms).clamp(0.0, 1.0)
    } else {
        0.0
    };
    (MU_EMPTY.ln() + full * (MU_FULL / MU_EMPTY).ln()).exp()
}

/// The aim in `[lo, hi]` among `candidates` (and `lo` and `hi` themselves) with the least
/// expected mistakes (`misses`) plus `mu` times itself in units of `unit` (the aim); of
/// equal costs, the lowest.
pub fn allocate(
    misses: impl Fn(f64) -> f64,
    candidates: impl IntoIterator<Item = f64>,
    mu: f64,
    unit: f64,
    (lo, hi): (f64, f64),
) -> f64 {
    let hi = hi.max(lo);
    let cost = |a: f64| misses(a) + mu * a / unit;
    let mut best = (lo, cost(lo));
    for a in candidates.into_iter().chain([hi]) {
        if !(a > lo && a <= hi) {
            continue;
        }
        let c = cost(a);
        if c < best.1 || (c == best.1 && a < best.0) {
            best = (a, c);
        }
    }
    best.0
}
