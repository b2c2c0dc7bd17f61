//! p50, p99 and max of a sample.

use serde::Serialize;

/// p50 and p99 of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if values.is_empty() {
                f64::NAN
            } else {
                values[((values.len() as f64 - 1.0) * q).round() as usize]
            }
        };
        Self {
            count: values.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}
