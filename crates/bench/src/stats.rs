//! Percentiles and latency summaries.
//!
//! Percentiles use linear interpolation between closest ranks (Hyndman & Fan type 7, the default of
//! `numpy.percentile` and of R's `quantile`): for `n` sorted samples `x[0..n]` and a fraction `p` in `[0, 1]`, the
//! rank is `h = (n - 1) * p` and the percentile is `x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])`.
//! It is continuous in `p`, returns the minimum at `p = 0` and the maximum at `p = 1`, and never leaves the range
//! of the samples, so `p50 <= p90 <= p95 <= p99 <= max` always holds.

use serde::{Deserialize, Serialize};

use crate::BenchError;

/// The `p`-th quantile (`p` in `[0, 1]`) of `sorted`, which must be sorted ascending and free of NaN.
///
/// Returns `None` for an empty slice or a `p` outside `[0, 1]`.
pub fn quantile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&p) {
        return None;
    }
    let h = (sorted.len() - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    Some(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

/// Sorts a copy of `samples` ascending, refusing NaN (a NaN timing means a broken clock, not a fast run).
pub fn sorted_samples(samples: &[f64]) -> Result<Vec<f64>, BenchError> {
    if samples.iter().any(|x| x.is_nan()) {
        return Err(BenchError::InvalidSamples("a sample is NaN".into()));
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Ok(sorted)
}

/// The latency distribution the reports carry: `p50 p90 p95 p99 max`, in the unit of the samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Summarises `samples` (any order). Errors on an empty slice or a NaN.
    pub fn from_samples(samples: &[f64]) -> Result<Self, BenchError> {
        let sorted = sorted_samples(samples)?;
        let q = |p| {
            quantile_sorted(&sorted, p)
                .ok_or_else(|| BenchError::InvalidSamples("no samples".into()))
        };
        Ok(Self {
            p50: q(0.50)?,
            p90: q(0.90)?,
            p95: q(0.95)?,
            p99: q(0.99)?,
            max: q(1.0)?,
        })
    }

    /// The five figures with their names, in report order.
    pub fn named(&self) -> [(&'static str, f64); 5] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("max", self.max),
        ]
    }
}

/// The median of `samples` (any order); errors on an empty slice or a NaN.
pub fn median(samples: &[f64]) -> Result<f64, BenchError> {
    Ok(Percentiles::from_samples(samples)?.p50)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values were computed with `numpy.percentile(x, [50, 90, 95, 99, 100])` (numpy 2, default
    /// method "linear"); they are exact decimal fractions, so the 1e-12 tolerance only absorbs f64 rounding.
    #[test]
    fn percentiles_match_numpy_linear_method() {
        let cases: [(&[f64], [f64; 5]); 4] = [
            (
                &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10.],
                [5.5, 9.1, 9.55, 9.91, 10.0],
            ),
            // Unsorted with ties: sorted it is [1, 2, 2, 3, 7, 7, 40].
            (
                &[7., 2., 40., 1., 7., 3., 2.],
                [3.0, 20.2, 30.1, 38.02, 40.0],
            ),
            (&[42.], [42.0, 42.0, 42.0, 42.0, 42.0]),
            (&[0.5, 0.25], [0.375, 0.475, 0.4875, 0.4975, 0.5]),
        ];
        for (samples, want) in cases {
            let got = Percentiles::from_samples(samples).unwrap();
            for ((name, g), w) in got.named().into_iter().zip(want) {
                assert!(
                    (g - w).abs() < 1e-12,
                    "{name} of {samples:?}: got {g}, numpy says {w}"
                );
            }
        }
    }

    #[test]
    fn hundred_samples_hit_exact_ranks() {
        // For 0..=100, rank h = 100 p lands on an integer, so each percentile is the sample itself.
        let samples: Vec<f64> = (0..=100).rev().map(f64::from).collect();
        let p = Percentiles::from_samples(&samples).unwrap();
        assert_eq!(
            (p.p50, p.p90, p.p95, p.p99, p.max),
            (50.0, 90.0, 95.0, 99.0, 100.0)
        );
    }

    #[test]
    fn quantile_endpoints_are_min_and_max_and_out_of_range_is_none() {
        let sorted = [1.0, 4.0, 9.0];
        assert_eq!(quantile_sorted(&sorted, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&sorted, 1.0), Some(9.0));
        assert_eq!(quantile_sorted(&sorted, 1.5), None);
        assert_eq!(quantile_sorted(&[], 0.5), None);
    }

    #[test]
    fn empty_or_nan_samples_are_errors() {
        assert!(Percentiles::from_samples(&[]).is_err());
        assert!(Percentiles::from_samples(&[1.0, f64::NAN]).is_err());
    }
}
