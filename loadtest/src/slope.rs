//! The slope test of `soak`: a least-squares line through each series after the
//! warm-up. A series whose fitted growth over the measured period exceeds its
//! tolerance keeps growing, which for state that should be bounded by what is pending
//! or by a window means it is bounded by history instead.

use serde::{Deserialize, Serialize};

/// How much a series may grow over the measured period and still count as flat.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// A fraction of the series' mean over the measured period.
    pub fraction: f64,
    /// Plus this much, in the series' unit, so tiny counts do not trip it.
    pub floor: f64,
}

impl Tolerance {
    pub fn of(&self, mean: f64) -> f64 {
        self.fraction * mean.abs() + self.floor
    }
}

/// The line `intercept + slope * t` nearest the points (least squares).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    pub intercept: f64,
    pub slope: f64,
}

/// The least-squares line through `points` (t, y); `None` under two distinct times.
pub fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mt = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let var: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if var <= f64::EPSILON {
        return None;
    }
    let cov: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    let slope = cov / var;
    Some(Fit { intercept: my - slope * mt, slope })
}

/// What the slope test says about one series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Its fitted growth stays within the tolerance.
    Flat,
    /// Its fitted growth exceeds the tolerance: it keeps growing.
    Grows,
    /// Fewer than three samples after the warm-up: nothing can be said.
    TooFew,
}

/// One series judged: its numbers over the measured period and the verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Judged {
    /// First value after the warm-up.
    pub start: f64,
    /// Last value.
    pub end: f64,
    pub mean: f64,
    /// The fitted line's rise from the first to the last sample after the warm-up.
    pub growth: f64,
    pub tolerance: f64,
    pub samples: usize,
    pub verdict: Verdict,
}

/// Judges the points (t, y) from `warmup` on.
pub fn judge(points: &[(f64, f64)], warmup: f64, tol: Tolerance) -> Judged {
    let measured: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0 >= warmup && p.1.is_finite()).collect();
    let n = measured.len();
    let mean = if n == 0 { 0.0 } else { measured.iter().map(|p| p.1).sum::<f64>() / n as f64 };
    let (start, end) = (measured.first().map_or(0.0, |p| p.1), measured.last().map_or(0.0, |p| p.1));
    let tolerance = tol.of(mean);
    let line = if n >= 3 { fit(&measured) } else { None };
    let Some(line) = line else {
        return Judged { start, end, mean, growth: 0.0, tolerance, samples: n, verdict: Verdict::TooFew };
    };
    let span = measured[n - 1].0 - measured[0].0;
    let growth = line.slope * span;
    let verdict = if growth > tolerance { Verdict::Grows } else { Verdict::Flat };
    Judged { start, end, mean, growth, tolerance, samples: n, verdict }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance { fraction: 0.10, floor: 20.0 };

    /// A sample every 5 s for 10 minutes.
    fn series(f: impl Fn(f64, usize) -> f64) -> Vec<(f64, f64)> {
        (0..=120).map(|k| k as f64 * 5.0).enumerate().map(|(k, t)| (t, f(t, k))).collect()
    }

    /// Deterministic noise in [-1, 1].
    fn noise(k: usize) -> f64 {
        let x = (k as u64).wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }

    #[test]
    fn a_line_is_fitted_exactly() {
        let f = fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-9 && (f.intercept - 1.0).abs() < 1e-9, "{f:?}");
        assert_eq!(fit(&[(1.0, 1.0), (1.0, 2.0)]), None, "one time only");
        assert_eq!(fit(&[(1.0, 1.0)]), None);
    }

    #[test]
    fn a_flat_series_is_flat() {
        let j = judge(&series(|_, _| 5_000.0), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Flat);
        assert!(j.growth.abs() < 1e-6 && j.mean == 5_000.0 && j.samples == 97, "{j:?}");
    }

    #[test]
    fn a_noisy_flat_series_is_flat() {
        // +-30% noise and a window's sawtooth (a TTL filling and emptying every minute).
        let j = judge(&series(|t, k| 5_000.0 + 1_500.0 * noise(k) + 800.0 * (t % 60.0) / 60.0), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Flat, "{j:?}");
    }

    #[test]
    fn a_series_that_keeps_growing_fails() {
        // 2 keys a second on top of 5 000: 960 over the measured 480 s, more than 10% of
        // the mean (about 5 700) plus the floor.
        let j = judge(&series(|t, k| 5_000.0 + 2.0 * t + 300.0 * noise(k)), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Grows, "{j:?}");
        assert!((j.growth - 960.0).abs() < 100.0, "{j:?}");
    }

    #[test]
    fn growth_during_the_warm_up_is_not_counted() {
        let j = judge(&series(|t, _| 5_000.0 * (t / 100.0).min(1.0)), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Flat, "{j:?}");
        assert_eq!(j.start, 5_000.0);
        let j = judge(&series(|t, _| 5_000.0 * (t / 100.0).min(1.0)), 0.0, TOL);
        assert_eq!(j.verdict, Verdict::Grows, "from the start it grows: {j:?}");
    }

    #[test]
    fn tiny_counts_stay_within_the_floor() {
        let j = judge(&series(|t, _| (t / 60.0).floor()), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Flat, "from 2 to 10 keys: {j:?}");
        let j = judge(&series(|t, _| (t / 6.0).floor()), 120.0, TOL);
        assert_eq!(j.verdict, Verdict::Grows, "from 20 to 100 keys: {j:?}");
    }

    #[test]
    fn a_shrinking_series_passes_and_too_few_samples_say_nothing() {
        assert_eq!(judge(&series(|t, _| 10_000.0 - 10.0 * t), 120.0, TOL).verdict, Verdict::Flat);
        let j = judge(&series(|_, _| 1.0), 595.0, TOL);
        assert_eq!((j.verdict, j.samples), (Verdict::TooFew, 2));
    }
}
