//! Suspicion levels: several thresholds on the one phi signal (warn, route away, evict...).

use std::{fmt, str::FromStr};

/// At most this many levels; each costs one deadline per peer.
pub const MAX_LEVELS: usize = 8;

/// Strictly ascending, positive, finite phi thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct Levels(Vec<f64>);

impl Levels {
    pub fn new(levels: Vec<f64>) -> Result<Self, String> {
        if levels.is_empty() {
            return Err("at least one level is needed".into());
        }
        if levels.len() > MAX_LEVELS {
            return Err(format!("at most {MAX_LEVELS} levels, got {}", levels.len()));
        }
        for &l in &levels {
            if !l.is_finite() || l <= 0.0 {
                return Err(format!("level {l} is not a positive finite number"));
            }
        }
        if levels.windows(2).any(|w| w[0] >= w[1]) {
            return Err("levels must be strictly ascending, e.g. 1,3,8".into());
        }
        Ok(Self(levels))
    }

    pub fn as_slice(&self) -> &[f64] {
        &self.0
    }

    pub fn highest(&self) -> f64 {
        *self.0.last().expect("never empty")
    }

    /// The highest level that `phi` has reached, if any.
    pub fn reached(&self, phi: f64) -> Option<f64> {
        self.0.iter().rev().find(|&&l| phi >= l).copied()
    }
}

impl Default for Levels {
    /// 1: about a 10% chance a live peer is this late (log it); 3: 0.1% (route around it);
    /// 8: 1e-8 (evict), the conviction threshold of Akka and Cassandra.
    fn default() -> Self {
        Self(vec![1.0, 3.0, 8.0])
    }
}

impl FromStr for Levels {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let values = text
            .split(',')
            .map(|part| {
                let part = part.trim();
                part.parse::<f64>()
                    .map_err(|_| format!("{part:?} is not a number"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(values)
    }
}

impl fmt::Display for Levels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|l| l.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        assert_eq!(
            "1,3,8".parse::<Levels>().unwrap().as_slice(),
            &[1.0, 3.0, 8.0]
        );
        assert_eq!(
            " 0.5 , 12 ".parse::<Levels>().unwrap().as_slice(),
            &[0.5, 12.0]
        );
        for bad in [
            "",
            "3,1",
            "1,1",
            "0",
            "-1,2",
            "1,x",
            "inf",
            "NaN",
            "1,2,3,4,5,6,7,8,9",
        ] {
            assert!(bad.parse::<Levels>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reached_is_the_highest_crossed() {
        let l = Levels::default();
        assert_eq!(l.reached(0.5), None);
        assert_eq!(l.reached(3.0), Some(3.0));
        assert_eq!(l.reached(f64::INFINITY), Some(8.0));
        assert_eq!(l.highest(), 8.0);
    }
}
