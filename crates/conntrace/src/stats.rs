//! Millisecond conversion, percentiles and distributions.

use std::time::Duration;

use serde::Serialize;

/// A duration in milliseconds, rounded to microseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    round3(d.as_secs_f64() * 1000.0)
}

/// Rounds to 3 decimals (microseconds when the unit is ms); `-0.0` (e.g.
/// the sum of nothing) becomes `0.0`.
pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0 + 0.0
}

/// `part / whole`, 0 when `whole` is 0, rounded to 4 decimals.
pub(crate) fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        (part / whole * 10_000.0).round() / 10_000.0 + 0.0
    } else {
        0.0
    }
}

/// Nearest-rank percentile (`p` in 0..=1) of ascending `sorted` values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Summary of a set of millisecond values.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Distribution {
    /// Number of values.
    pub(crate) count: usize,
    /// Smallest value.
    pub(crate) min: f64,
    /// Median (nearest rank).
    pub(crate) p50: f64,
    /// 90th percentile (nearest rank).
    pub(crate) p90: f64,
    /// 99th percentile (nearest rank).
    pub(crate) p99: f64,
    /// Largest value.
    pub(crate) max: f64,
    /// Arithmetic mean.
    pub(crate) mean: f64,
}

impl Distribution {
    /// The distribution of `values`; `None` when empty.
    pub(crate) fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        let count = sorted.len();
        let first = *sorted.first()?;
        let last = *sorted.last()?;
        Some(Self {
            count,
            min: first,
            p50: percentile(&sorted, 0.50)?,
            p90: percentile(&sorted, 0.90)?,
            p99: percentile(&sorted, 0.99)?,
            max: last,
            mean: round3(sorted.iter().sum::<f64>() / count as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
