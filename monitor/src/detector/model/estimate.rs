//! What a model judges a silence by: the estimate (mean and deviation after bootstrap, pause
//! and floor, and the model's own shape), and per level the constant its crossing follows from.

use super::super::{
    loss::LossOdds,
    models::{AnyModel, PhiModel},
};
use super::{BudgetRule, EmpiricalTail, Freshness, ShortWindow};

/// Mean and standard deviation after bootstrap, pause and floor, and what else the model
/// judges a silence by.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Mean interval plus the acceptable pause.
    pub mean_ms: f64,
    pub std_ms: f64,
    /// The pause included in `mean_ms`.
    pub pause_ms: f64,
    pub shape: Shape,
}

impl Estimate {
    /// Whether the model is `budget` and the peer's own schedule is slower than its budget's
    /// aim (`BudgetRule::unmet`): no deadline meets that budget without convicting the live
    /// peer at most heartbeats.
    pub fn budget_unmet(&self) -> bool {
        matches!(&self.shape, Shape::Budget(rule) if rule.unmet)
    }
}

/// Model-specific parts of an estimate.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Mean and deviation are all the model needs.
    Plain,
    /// Loss odds of the peer (`loss` model).
    Loss(LossOdds),
    /// The freshness point (`chen`, `bertier`): expected arrival and margin.
    Freshness(Freshness),
    /// The window's intervals, sorted (`empirical`).
    Empirical(EmpiricalTail),
    /// The short window's estimate (`2w`); the long one is the estimate's mean and deviation.
    TwoWindows(ShortWindow),
    /// The deadline rule chosen for the window and its phi curve (`budget`).
    Budget(BudgetRule),
}

/// For each level, the constant k from which the crossing silence follows in a multiply-add:
/// normal and akka: mean + k std; exponential: k mean; fixed: k; 2w: the later of
/// mean + k std over its two windows. For chen, bertier and empirical k is the level itself and
/// the crossing comes from the estimate's shape (the freshness point; the first sample or point
/// of the decay where phi reaches the level). Each model says its own (`PhiModel`).
#[derive(Debug, Clone, PartialEq)]
pub struct LevelSilences {
    /// The model the constants are for, which finds the silences from them.
    pub(super) model: AnyModel,
    pub(super) k: Vec<f64>,
}

impl LevelSilences {
    pub fn len(&self) -> usize {
        self.k.len()
    }

    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    /// Silence (ms) at which phi reaches level `index`, for this estimate.
    #[inline(always)]
    pub fn silence_ms(&self, index: usize, estimate: &Estimate) -> f64 {
        self.model.silence_ms(self.k[index], estimate)
    }
}
