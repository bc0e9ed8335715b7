//! `soak`'s part of the report: every sampled series judged by the slope test, the
//! table of series and verdicts, and the charts of Redis memory, key counts by kind,
//! table rows, the processes' memory and CPU, and the write rates.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chart::{line_chart, Series};
use crate::sampler::Sample;
use crate::slope::{self, Judged, Tolerance, Verdict};

const MIB: f64 = 1024.0 * 1024.0;
const COLORS: [&str; 3] = ["#1f77b4", "#ff7f0e", "#2ca02c"];

/// The slope test's limits (see `herald-loadtest soak --help`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_growth: f64,
    pub floor_count: f64,
    pub floor_bytes: f64,
}

/// One series over the run, judged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeriesRow {
    pub name: String,
    /// `bytes`, `count`, `cores` or `per s`.
    pub unit: String,
    /// State that must stay bounded (memory, keys, rows); rates are only reported.
    pub checked: bool,
    /// Checked, but its growth is expected (`--exempt`): reported, never failed on.
    pub exempt: bool,
    #[serde(flatten)]
    pub judged: Judged,
}

impl SeriesRow {
    pub fn fails(&self) -> bool {
        self.checked && !self.exempt && self.judged.verdict != Verdict::Flat
    }
}

/// What `soak` found, in its report's `extra.soak`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SoakResult {
    pub warmup_s: f64,
    pub max_growth: f64,
    /// No checked series grows.
    pub bounded: bool,
    /// The checked series that grow (or had too few samples).
    pub growing: Vec<String>,
    pub series: Vec<SeriesRow>,
    pub samples: Vec<Sample>,
    pub sample_failures: u64,
    pub sample_errors: Vec<String>,
}

/// A series' unit, and whether it is state the slope test holds.
fn class(name: &str) -> (&'static str, bool) {
    match name.split('.').next() {
        Some("redis" | "rss") => ("bytes", true),
        Some("keys" | "rows") => ("count", true),
        Some("cpu") => ("cores", false),
        _ => ("per s", false),
    }
}

fn is_exempt(name: &str, exempt: &[String]) -> bool {
    exempt.iter().any(|e| e == name || (e.ends_with('.') && name.starts_with(e.as_str())))
}

/// The points of one series; a key kind absent from a sample had no keys then.
fn points(samples: &[Sample], name: &str) -> Vec<(f64, f64)> {
    let zero = name.starts_with("keys.").then_some(0.0);
    samples.iter().filter_map(|s| s.values.get(name).copied().or(zero).map(|v| (s.t_s, v))).collect()
}

/// Judges every series of `samples` from `warmup_s` on.
pub fn judge(samples: Vec<Sample>, warmup_s: f64, limits: Limits, exempt: &[String]) -> SoakResult {
    let names: BTreeSet<&String> = samples.iter().flat_map(|s| s.values.keys()).collect();
    let series: Vec<SeriesRow> = names
        .into_iter()
        .map(|name| {
            let (unit, checked) = class(name);
            let floor = match unit {
                "bytes" => limits.floor_bytes,
                "count" => limits.floor_count,
                _ => 0.0,
            };
            let tol = Tolerance { fraction: limits.max_growth, floor };
            SeriesRow {
                name: name.clone(),
                unit: unit.into(),
                checked,
                exempt: checked && is_exempt(name, exempt),
                judged: slope::judge(&points(&samples, name), warmup_s, tol),
            }
        })
        .collect();
    let growing: Vec<String> = series.iter().filter(|s| s.fails()).map(|s| s.name.clone()).collect();
    SoakResult {
        warmup_s,
        max_growth: limits.max_growth,
        bounded: growing.is_empty(),
        growing,
        series,
        samples,
        sample_failures: 0,
        sample_errors: Vec::new(),
    }
}

fn parse(soak: &Value) -> Option<SoakResult> {
    serde_json::from_value(soak.clone()).ok()
}

fn num(v: f64, unit: &str) -> String {
    match unit {
        "bytes" => format!("{:.1} MiB", v / MIB),
        "count" => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

fn verdict(s: &SeriesRow) -> &'static str {
    match (s.checked, s.exempt, s.judged.verdict) {
        (false, ..) => "not checked",
        (true, true, Verdict::Grows) => "grows (exempt)",
        (true, true, _) => "flat (exempt)",
        (true, false, Verdict::Flat) => "flat",
        (true, false, Verdict::Grows) => "**GROWS**",
        (true, false, Verdict::TooFew) => "**too few samples**",
    }
}

/// The bounded-state section of the scenario's Markdown: verdict and table.
pub fn markdown(soak: &Value) -> String {
    let Some(r) = parse(soak) else { return String::new() };
    let mut s = String::new();
    let checked = r.series.iter().filter(|x| x.checked && !x.exempt).count();
    let _ = writeln!(
        s,
        "Bounded state: **{}** ({} of {checked} checked series flat after a warm-up of {:.0} s; a series fails when its fitted growth exceeds {:.0}% of its mean plus a floor){}.\n",
        if r.bounded { "every checked series is flat" } else { "FAILED" },
        checked - r.growing.len(),
        r.warmup_s,
        r.max_growth * 100.0,
        if r.growing.is_empty() { String::new() } else { format!("; growing: {}", r.growing.join(", ")) }
    );
    if r.sample_failures > 0 {
        let _ = writeln!(s, "{} sample reads failed; first: {}.\n", r.sample_failures, r.sample_errors.join("; "));
    }
    s.push_str(
        "| series | start | end | mean | fitted growth | tolerance | verdict |\n|---|---|---|---|---|---|---|\n",
    );
    for x in &r.series {
        let (j, u) = (&x.judged, x.unit.as_str());
        let _ = writeln!(
            s,
            "| `{}` ({u}) | {} | {} | {} | {} | {} | {} |",
            x.name,
            num(j.start, u),
            num(j.end, u),
            num(j.mean, u),
            num(j.growth, u),
            if x.checked { num(j.tolerance, u) } else { "-".into() },
            verdict(x)
        );
    }
    s.push('\n');
    s
}

/// Charts of up to three lines each, the largest series first: (file, SVG).
fn charts_of(
    stem: &str,
    title: &str,
    unit: &str,
    scale: f64,
    mut lines: Vec<(String, Vec<(f64, f64)>)>,
    marks: &[(f64, String)],
) -> Vec<(String, String)> {
    let mean = |p: &[(f64, f64)]| p.iter().map(|x| x.1).sum::<f64>() / p.len().max(1) as f64;
    lines.sort_by(|a, b| mean(&b.1).total_cmp(&mean(&a.1)));
    lines
        .chunks(COLORS.len())
        .enumerate()
        .map(|(k, chunk)| {
            let series: Vec<Series> = chunk
                .iter()
                .zip(COLORS)
                .map(|((label, pts), color)| (label.as_str(), color, pts.iter().map(|p| (p.0, p.1 / scale)).collect()))
                .collect();
            let file = if k == 0 { format!("{stem}.svg") } else { format!("{stem}-{}.svg", k + 1) };
            (file, line_chart(title, unit, &series, marks))
        })
        .collect()
}

/// The soak's charts; none when the report has no soak section.
pub fn charts(name: &str, soak: &Value) -> Vec<(String, String)> {
    let Some(r) = parse(soak) else { return Vec::new() };
    let marks = [(r.warmup_s, "warm-up ends".to_string())];
    let of = |prefix: &str, only: &dyn Fn(&str) -> bool| -> Vec<(String, Vec<(f64, f64)>)> {
        r.series
            .iter()
            .filter(|s| s.name.starts_with(prefix) && only(&s.name))
            .map(|s| (s.name.trim_start_matches(prefix).to_owned(), points(&r.samples, &s.name)))
            .collect()
    };
    let all = |_: &str| true;
    let mut out = Vec::new();
    for (stem, title, unit, scale, lines) in [
        ("redis-memory", "Redis used_memory above its level before the run", "MiB", MIB, of("redis.", &all)),
        ("keys", "keys by kind", "keys", 1.0, of("keys.", &all)),
        ("rows", "MySQL rows", "rows", 1.0, of("rows.", &|n| n != "rows.messages")),
        ("messages", "MySQL rows", "rows", 1.0, of("rows.", &|n| n == "rows.messages")),
        ("rss", "resident memory per process", "MiB", MIB, of("rss.", &all)),
        ("cpu", "CPU per process", "cores", 1.0, of("cpu.", &all)),
        ("mysql-writes", "MySQL statements", "per second", 1.0, of("writes.mysql_", &all)),
        ("redis-commands", "Redis commands", "per second", 1.0, of("writes.redis_", &all)),
    ] {
        let title = format!("{name}: {title}");
        out.extend(charts_of(&format!("{name}-{stem}"), &title, unit, scale, lines, &marks));
    }
    out
}

/// The capacity report's target row of a soak run of `duration_s` with the report's
/// `soak` section.
pub fn capacity_row(duration_s: f64, soak: &Value) -> Option<String> {
    let soak = parse(soak)?;
    let checked = soak.series.iter().filter(|x| x.checked && !x.exempt).count();
    Some(format!(
        "| kept state bounded by windows, not history (`soak`, {:.0} min with churn) | every kept series flat after the warm-up | the same | {} of {checked} series flat{} | {} |",
        duration_s / 60.0,
        checked - soak.growing.len(),
        if soak.growing.is_empty() { String::new() } else { format!("; growing: {}", soak.growing.join(", ")) },
        if soak.bounded { "met" } else { "FAILED" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, values: &[(&str, f64)]) -> Sample {
        Sample { t_s: t, values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect() }
    }

    #[test]
    fn growing_state_fails_growing_history_and_rates_do_not() {
        let limits = Limits { max_growth: 0.1, floor_count: 20.0, floor_bytes: 4.0 * MIB };
        let samples: Vec<Sample> = (0..60)
            .map(|k| {
                let t = k as f64 * 5.0;
                let mut s = sample(
                    t,
                    &[("keys.m", 500.0), ("rows.messages", 10.0 * t), ("writes.mysql_insert", t), ("rss.gw", 3e7)],
                );
                if k % 2 == 0 {
                    s.values.insert("keys.pend".into(), 100.0 + 3.0 * t);
                }
                s
            })
            .collect();
        let exempt = ["rows.messages".to_string()];
        let r = judge(samples, 60.0, limits, &exempt);
        assert_eq!(r.growing, ["keys.pend"], "{:#?}", r.series);
        assert!(!r.bounded);
        let row = |n: &str| r.series.iter().find(|s| s.name == n).unwrap();
        assert_eq!(verdict(row("rows.messages")), "grows (exempt)");
        assert_eq!(verdict(row("writes.mysql_insert")), "not checked");
        assert_eq!(verdict(row("keys.m")), "flat");
        assert_eq!(row("keys.pend").judged.samples, 48, "a kind absent from a sample counts 0 there");
        let v = serde_json::to_value(&r).unwrap();
        assert!(markdown(&v).contains("| `keys.pend` (count) |"));
        let files: Vec<String> = charts("soak", &v).into_iter().map(|c| c.0).collect();
        for f in ["soak-redis-memory.svg", "soak-keys.svg", "soak-messages.svg", "soak-rss.svg"] {
            assert_eq!(files.contains(&f.to_string()), f != "soak-redis-memory.svg", "{f}: {files:?}");
        }
    }
}
