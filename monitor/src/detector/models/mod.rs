//! The phi models, one type per file behind one trait ([`PhiModel`]), and the registry that
//! names them ([`Model`]).
//!
//! A model says what its window needs (its intervals, or only their sums; whether an interval
//! that spans lost heartbeats enters it), what it reads from the window besides the common
//! mean and deviation (its [`Shape`]), its phi, and the inversions the tracker needs: the
//! silence at which phi reaches a level, and a floor under it that holds over the next
//! heartbeats. Its parameters are its own type, taken from [`DetectorParams`] (the flat
//! record the spec, the config file and a reload compare), and its spec keys are its own
//! ([`ModelSpec`]).
//!
//! A new model is one file here and one line in `registry!` below.

use monitor_common::maps::PeerRecord;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    model::{DetectorParams, Estimate, Shape},
    window::bootstrap_samples,
};

pub mod akka;
pub mod bertier;
pub mod budget;
pub mod chen;
pub mod empirical;
pub mod exponential;
pub mod fixed;
pub mod loss;
pub mod normal;
pub mod two_windows;

/// What a model needs of its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowNeeds {
    /// The window's intervals themselves, not only their sums: a read copies them.
    pub ring: bool,
    /// Only intervals between consecutive heartbeats: one that spans lost heartbeats is
    /// counted as loss, not as a sample.
    pub gapless: bool,
}

/// A peer's window as a model's estimate reads it.
#[derive(Debug, Clone, Copy)]
pub struct WindowView<'a> {
    pub record: &'a PeerRecord,
    /// The window's intervals (µs, oldest first) for a model whose window needs them
    /// ([`WindowNeeds::ring`]); else empty.
    pub ring: &'a [u32],
    /// The window's length in intervals (`DetectorParams::window`).
    pub window: u32,
    /// The interval the bootstrap samples stand around (µs).
    pub first_us: u64,
    /// The window's moments (ms), bootstrap samples included, before pause and floor: what
    /// stands in for an empty ring.
    pub mean_ms: f64,
    pub std_ms: f64,
}

impl WindowView<'_> {
    /// The window as the ring models see it (µs, oldest first): the bootstrap samples that are
    /// still in a window of `window` (the rule of `WindowSums::with_bootstrap`), then `ring`.
    pub fn intervals_us(&self) -> Vec<u64> {
        intervals_us(self.window, self.ring, self.first_us)
    }
}

/// See [`WindowView::intervals_us`].
pub(crate) fn intervals_us(window: u32, ring: &[u32], first_us: u64) -> Vec<u64> {
    let samples = u32::try_from(ring.len()).unwrap_or(u32::MAX);
    bootstrap_samples(window, samples, first_us)
        .chain(ring.iter().map(|&us| us as u64))
        .collect()
}

/// One phi model. Every estimate it is given was made by its own `shape` (an estimate of
/// another shape is judged as `normal` would judge it).
pub trait PhiModel {
    /// What the model's window needs from the kernel and the reader.
    fn window_needs(&self) -> WindowNeeds {
        WindowNeeds::default()
    }

    /// What the model reads from the window beyond the common mean and deviation.
    fn shape(&self, _window: &WindowView<'_>) -> Shape {
        Shape::Plain
    }

    /// The shape of a peer's next estimate, made after `previous` (the peer's last): for a
    /// model that carries state from one estimate to the next (`budget`'s allocation over
    /// time). By default the window alone says it.
    fn shape_after(&self, window: &WindowView<'_>, _previous: &Estimate) -> Shape {
        self.shape(window)
    }

    /// phi after `silence_ms` without a heartbeat. By default, as the ring models judge it:
    /// by the estimate's shape (`phi_by_shape`).
    fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
        phi_by_shape(estimate, silence_ms)
    }

    /// The per-level constant from which `silence_ms` finds, without evaluating phi, the
    /// silence at which phi reaches `level`. By default the level itself, for the models whose
    /// crossing comes from the estimate's shape (the freshness point of `chen` and `bertier`,
    /// a sample or a point of the decay of `empirical`).
    fn level_constant(&self, level: f64) -> f64 {
        level
    }

    /// The silence (ms) at which phi reaches the level whose constant is `k`, for this
    /// estimate; for a model without a closed form (`loss`), a lower bound of it. By default
    /// from the estimate's shape, `k` being the level (`silence_by_shape`).
    fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
        silence_by_shape(k, estimate, false)
    }

    /// The silence (ms) at which phi reaches `level` (constant `k`), exact for every model.
    fn crossing_ms(&self, k: f64, _level: f64, estimate: &Estimate) -> f64 {
        self.silence_ms(k, estimate)
    }

    /// The least silence (ms) at which phi can reach the level of constant `k` for any
    /// estimate whose window mean (before pause) is at least `mean_floor_ms` and whose
    /// window deviation is at least `std_floor_ms` (0 where nothing is known of it). None
    /// where no such bound is cheap.
    fn crossing_floor_ms(&self, _k: f64, _mean_floor_ms: f64, _std_floor_ms: f64) -> Option<f64> {
        None
    }
}

/// A question put to whichever model the parameters name (`Model::apply`), answered by a
/// static call into its type.
pub trait ModelFn {
    type Out;
    fn call<M: PhiModel>(self, model: M) -> Self::Out;
}

/// What the registry knows of a model besides its maths: its name, its help line, its
/// spec keys, and how it takes its parameters.
pub trait ModelInfo: PhiModel + Sized {
    /// Its name on the command line, in specs and in replies.
    const NAME: &'static str;
    /// One line on what the model is, for help texts (none for the plain ones).
    const ABOUT: Option<&'static str> = None;
    /// How a spec names it and the keys of its own it takes.
    const SPEC: ModelSpec = ModelSpec::PHI;
    /// The safety margin `alpha_ms` takes when not given, for the models that have one.
    const DEFAULT_ALPHA_MS: Option<f64> = None;

    /// Its parameters, from the flat record.
    fn from_params(params: &DetectorParams) -> Self;
}

/// How a spec (`detector/spec.rs`) names a model, and the keys of its own.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    /// A spec kind of its own (`fixed:...`), taking only its own keys and these common ones;
    /// None: `phi:model=NAME,...`, with every common key.
    pub own_kind: Option<(&'static str, &'static [&'static str])>,
    /// Its own keys, parsed into [`DetectorParams`].
    pub keys: &'static [SpecKey],
    /// Checks and completes its keys once the whole spec is read (keys come in any order):
    /// the keys given, by name.
    pub finish: fn(&mut DetectorParams, &[&str]) -> Result<(), String>,
    /// Its own keys' `key=value` parts of the canonical spec.
    pub format: fn(&DetectorParams) -> Vec<String>,
}

impl ModelSpec {
    /// A `phi:` model with no key of its own.
    pub const PHI: Self = Self {
        own_kind: None,
        keys: &[],
        finish: |_, _| Ok(()),
        format: |_| Vec::new(),
    };
}

/// A model's own spec key.
#[derive(Debug, Clone, Copy)]
pub struct SpecKey {
    pub name: &'static str,
    /// Parses a value into the parameters; the error names the key.
    pub parse: fn(&mut DetectorParams, &str) -> Result<(), String>,
}

/// The registry: each line names a model's variant and its type. It makes [`Model`] (how
/// phi is computed, named as each type's [`ModelInfo::NAME`] says) and [`AnyModel`] (one
/// model with its parameters, delegating to its type: one `match`, no indirect call).
macro_rules! registry {
    ($($variant:ident => $ty:ty,)*) => {
        /// How phi is computed; [`Model::about`] says what each model is. Named on the command
        /// line as [`Model::name`] spells it (the clap glue is the CLI's: `cli/run.rs`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Model {
            $($variant,)*
        }

        impl Model {
            /// Every model, in the order help texts list them.
            pub const ALL: [Model; [$(stringify!($variant)),*].len()] = [$(Model::$variant),*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Model::$variant => <$ty as ModelInfo>::NAME,)*
                }
            }

            /// One line on what the model is, for help texts (none for the plain ones).
            pub fn about(self) -> Option<&'static str> {
                match self {
                    $(Model::$variant => <$ty as ModelInfo>::ABOUT,)*
                }
            }

            /// The safety margin `alpha_ms` takes when not given, for the models that have
            /// one: `chen` 150 ms (docs/tuning.md), `bertier` 0 (its margin is Jacobson's, as
            /// published).
            pub fn default_alpha_ms(self) -> Option<f64> {
                match self {
                    $(Model::$variant => <$ty as ModelInfo>::DEFAULT_ALPHA_MS,)*
                }
            }

            /// How a spec names the model and its own keys.
            pub fn spec(self) -> &'static ModelSpec {
                match self {
                    $(Model::$variant => &<$ty as ModelInfo>::SPEC,)*
                }
            }

            /// The model with its parameters from `params`.
            #[inline]
            pub fn with_params(self, params: &DetectorParams) -> AnyModel {
                match self {
                    $(Model::$variant => AnyModel::$variant(<$ty as ModelInfo>::from_params(params)),)*
                }
            }

            /// `f` applied to the model with its parameters from `params`: one `match`, and
            /// a static call into the model's type (the per-read path: phi, the floors).
            #[inline(always)]
            pub fn apply<F: ModelFn>(self, params: &DetectorParams, f: F) -> F::Out {
                match self {
                    $(Model::$variant => f.call(<$ty as ModelInfo>::from_params(params)),)*
                }
            }
        }

        /// One model with its parameters.
        #[derive(Debug, Clone, PartialEq)]
        pub enum AnyModel {
            $($variant($ty),)*
        }

        impl PhiModel for AnyModel {
            #[inline]
            fn window_needs(&self) -> WindowNeeds {
                match self {
                    $(AnyModel::$variant(m) => m.window_needs(),)*
                }
            }

            #[inline]
            fn shape(&self, window: &WindowView<'_>) -> Shape {
                match self {
                    $(AnyModel::$variant(m) => m.shape(window),)*
                }
            }

            #[inline]
            fn shape_after(&self, window: &WindowView<'_>, previous: &Estimate) -> Shape {
                match self {
                    $(AnyModel::$variant(m) => m.shape_after(window, previous),)*
                }
            }

            #[inline]
            fn phi(&self, estimate: &Estimate, silence_ms: f64) -> f64 {
                match self {
                    $(AnyModel::$variant(m) => m.phi(estimate, silence_ms),)*
                }
            }

            #[inline]
            fn level_constant(&self, level: f64) -> f64 {
                match self {
                    $(AnyModel::$variant(m) => m.level_constant(level),)*
                }
            }

            #[inline(always)]
            fn silence_ms(&self, k: f64, estimate: &Estimate) -> f64 {
                match self {
                    $(AnyModel::$variant(m) => m.silence_ms(k, estimate),)*
                }
            }

            #[inline]
            fn crossing_ms(&self, k: f64, level: f64, estimate: &Estimate) -> f64 {
                match self {
                    $(AnyModel::$variant(m) => m.crossing_ms(k, level, estimate),)*
                }
            }

            #[inline]
            fn crossing_floor_ms(&self, k: f64, mean_floor_ms: f64, std_floor_ms: f64) -> Option<f64> {
                match self {
                    $(AnyModel::$variant(m) => m.crossing_floor_ms(k, mean_floor_ms, std_floor_ms),)*
                }
            }
        }
    };
}

registry! {
    Normal => normal::Normal,
    Akka => akka::Akka,
    Exponential => exponential::Exponential,
    Fixed => fixed::Fixed,
    Loss => loss::Loss,
    Chen => chen::Chen,
    Bertier => bertier::Bertier,
    Empirical => empirical::Empirical,
    TwoWindows => two_windows::TwoWindows,
    Budget => budget::Budget,
}

impl Model {
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl Serialize for Model {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Model {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Model::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = Model::ALL.iter().map(|m| m.name()).collect();
            serde::de::Error::custom(format!("model {name:?}: one of {}", names.join(", ")))
        })
    }
}

/// phi of a standardised deviate `(silence - mean) / std` by `phi_of`, for the models that
/// judge by mean and deviation.
#[inline(always)]
pub fn standardised(silence: f64, mean: f64, std: f64, phi_of: fn(f64) -> f64) -> f64 {
    if std <= 0.0 {
        // Only reachable with a zero floor and identical intervals: a step at the mean.
        return if silence > mean { f64::INFINITY } else { 0.0 };
    }
    phi_of((silence - mean) / std).max(0.0)
}

/// The crossing of a model that judges by mean and deviation: `mean + k std` (the mean itself
/// for a zero deviation, where phi steps there).
#[inline(always)]
pub fn mean_plus_k_std(k: f64, mean_ms: f64, std_ms: f64) -> f64 {
    if std_ms <= 0.0 {
        mean_ms
    } else {
        mean_ms + k * std_ms
    }
}

/// An estimate made for another model, judged as `normal` would: what the ring models fall
/// back to.
pub(crate) fn phi_as_normal(estimate: &Estimate, silence_ms: f64) -> f64 {
    standardised(
        silence_ms,
        estimate.mean_ms,
        estimate.std_ms,
        super::tail::normal_phi,
    )
}

/// The deviation floor and pause, which every mean-and-deviation model's floor needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PauseAndFloor {
    pub pause_ms: f64,
    pub min_std_ms: f64,
}

impl PauseAndFloor {
    pub fn of(params: &DetectorParams) -> Self {
        Self {
            pause_ms: params.pause_ms,
            min_std_ms: params.min_std_ms,
        }
    }

    /// The floor under the crossing of a model whose phi is a function of the standardised
    /// deviate (`normal`, `akka`, `loss`: `PhiModel::crossing_floor_ms`): the deviation is at
    /// least its floor `min_std_ms`, and at least `std_floor_ms`, what is known of the
    /// window's own.
    pub(crate) fn standardised_floor(
        &self,
        k: f64,
        mean_floor_ms: f64,
        std_floor_ms: f64,
    ) -> Option<f64> {
        (k >= 0.0)
            .then(|| mean_floor_ms + self.pause_ms + k * self.min_std_ms.max(std_floor_ms).max(0.0))
    }
}

/// phi of an estimate by its ring shape, whichever ring model (`chen`, `bertier`,
/// `empirical`, `2w`) made it: after a reload an estimate stays until the peer's slot is read
/// again, so a ring model may be given another's.
pub(crate) fn phi_by_shape(estimate: &Estimate, silence_ms: f64) -> f64 {
    match &estimate.shape {
        Shape::Freshness(freshness) => freshness.phi(silence_ms),
        Shape::Empirical(tail) => tail.phi(silence_ms),
        Shape::TwoWindows(short) => {
            two_windows::phi(estimate.mean_ms, estimate.std_ms, short, silence_ms)
        }
        _ => phi_as_normal(estimate, silence_ms),
    }
}

/// The crossing of an estimate by its ring shape (see `phi_by_shape`). `k` is the level
/// (`chen`, `bertier`, `empirical`) or, `k_is_deviate`, the normal deviate (`2w`).
#[inline(always)]
pub(crate) fn silence_by_shape(k: f64, estimate: &Estimate, k_is_deviate: bool) -> f64 {
    match &estimate.shape {
        // Binary: phi is 0 before the freshness point, so only a level <= 0 is reached
        // earlier (at once).
        Shape::Freshness(freshness) => {
            if k <= 0.0 {
                0.0
            } else {
                freshness.at_ms()
            }
        }
        Shape::Empirical(tail) => tail.crossing_ms(k),
        Shape::TwoWindows(short) => {
            two_windows::crossing_ms(k, estimate.mean_ms, estimate.std_ms, short)
        }
        // An estimate made for another model: `phi` judges it as `normal` would.
        _ => {
            let z = if k_is_deviate {
                k
            } else {
                super::tail::invert(super::tail::normal_phi, k)
            };
            mean_plus_k_std(z, estimate.mean_ms, estimate.std_ms)
        }
    }
}

/// A window's intervals in ms (oldest first), as the ring models judge them.
pub(crate) fn intervals_ms(window: &WindowView<'_>) -> Vec<f64> {
    window
        .intervals_us()
        .iter()
        .map(|&us| us as f64 / 1000.0)
        .collect()
}
