//! Reports: each scenario's JSON, a Markdown summary and SVG charts (latency
//! percentiles over time, throughput, backlog drain), and the capacity report that
//! sets a suite's numbers next to the targets of docs/architecture.md section 6.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cpu::CpuReport;
use crate::engine::{Pct, Tick};
use crate::integrity::IntegrityReport;
use crate::load::LoadReport;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub params: Value,
    pub duration_s: f64,
    /// From the first send to the last acknowledgement.
    pub send_window_s: f64,
    pub acknowledged_sends: u64,
    pub send_errors: u64,
    pub sends_per_s: f64,
    /// Send to ack, from when the sender's open-loop schedule had the send due (no
    /// coordinated omission: a send held back by a slow server counts its wait).
    pub send_ack_ms: Pct,
    /// Send to ack, from when the send went out (absent from older reports).
    #[serde(default)]
    pub send_ack_from_actual_ms: Pct,
    pub deliveries: u64,
    /// Deliveries (each acked by its device) per second of the send window.
    pub deliveries_per_s: f64,
    /// Send to device, from when the send was due.
    pub delivery_realtime_ms: Pct,
    /// Send to device, from when the send went out (absent from older reports).
    #[serde(default)]
    pub delivery_realtime_from_actual_ms: Pct,
    pub delivery_backlog_ms: Pct,
    /// Every session: upgrade to `caught_up`.
    pub catch_up_ms: Pct,
    /// Sessions after a device's first (reconnects after a fault).
    pub reconnect_catch_up_ms: Pct,
    pub integrity: IntegrityReport,
    /// What each process spent over the send window, per message (absent from older reports).
    #[serde(default)]
    pub cpu: Option<CpuReport>,
    /// Offered against achieved, the send lag and which side was the limit (absent from
    /// older reports and from scenarios without paced senders).
    #[serde(default)]
    pub load: Option<LoadReport>,
    pub series: Vec<Tick>,
    pub extra: Value,
}

/// Writes `<scenario>.json`, `<scenario>.md` and the charts into `dir`.
pub fn write(dir: &Path, r: &ScenarioReport) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = &r.scenario;
    std::fs::write(dir.join(format!("{name}.json")), serde_json::to_string_pretty(r)?)?;
    for (file, svg) in charts(r) {
        std::fs::write(dir.join(file), svg)?;
    }
    std::fs::write(dir.join(format!("{name}.md")), markdown(r, ""))?;
    eprintln!("report written to {}/{name}.{{json,md}} and charts", dir.display());
    Ok(())
}

fn pct_row(name: &str, p: &Pct) -> String {
    if p.count == 0 {
        return format!("| {name} | 0 | | | | |\n");
    }
    format!("| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n", p.count, p.p50, p.p95, p.p99, p.max)
}

/// A scenario's section; `prefix` is the path prefix of its chart files.
pub fn markdown(r: &ScenarioReport, prefix: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### `{}`\n", r.scenario);
    let _ = writeln!(s, "Parameters: `{}`\n", r.params);
    let _ = writeln!(
        s,
        "{} sends acknowledged in {:.1} s ({:.0} msg/s, {} gave up), {} deliveries acked by devices ({:.0}/s over the send window); run {:.1} s.\n",
        r.acknowledged_sends, r.send_window_s, r.sends_per_s, r.send_errors, r.deliveries, r.deliveries_per_s, r.duration_s
    );
    if let Some(l) = &r.load {
        s.push_str(&crate::load::markdown(l));
    }
    s.push_str("Latencies count from when each send was due by its sender's open-loop schedule (the \"from the actual send\" rows: from when it went out).\n\n");
    s.push_str("| latency (ms) | count | p50 | p95 | p99 | max |\n|---|---|---|---|---|---|\n");
    let via = match r.load.as_ref().map(|l| l.via.as_str()) {
        Some("ws") => "`sent`",
        _ => "HTTP 200",
    };
    s.push_str(&pct_row(&format!("send to ack ({via}), from the due time"), &r.send_ack_ms));
    s.push_str(&pct_row(&format!("send to ack ({via}), from the actual send"), &r.send_ack_from_actual_ms));
    s.push_str(&pct_row("delivery, realtime (send to device), from the due time", &r.delivery_realtime_ms));
    s.push_str(&pct_row(
        "delivery, realtime (send to device), from the actual send",
        &r.delivery_realtime_from_actual_ms,
    ));
    if let Some(l) = &r.load {
        s.push_str(&pct_row("send lag (actual send after its due time)", &l.send_lag_ms));
        s.push_str(&pct_row("send lag the load generator caused (a send slot was free)", &l.own_lag_ms));
    }
    s.push_str(&pct_row("delivery, backlog (reconnect to device)", &r.delivery_backlog_ms));
    s.push_str(&pct_row("session catch-up (upgrade to caught_up)", &r.catch_up_ms));
    s.push_str(&pct_row("catch-up after a reconnect", &r.reconnect_catch_up_ms));
    let i = &r.integrity;
    let _ = writeln!(
        s,
        "\nIntegrity: {} acknowledged; **{} lost, {} shown twice, {} out of order**; {} repeats on the wire (dropped by id), {} recovered by `sync`.\n",
        i.acknowledged, i.lost, i.shown_twice, i.out_of_order, i.repeats_on_wire, i.recovered_by_sync
    );
    if let Some(cpu) = &r.cpu {
        s.push_str(&crate::cpu::markdown(cpu));
    }
    if let Some(map) = r.extra.as_object() {
        let mut extra: Vec<String> = Vec::new();
        for (k, v) in map {
            if k != "actions" && k != "soak" {
                extra.push(format!("{k} = {}", short(v)));
            }
        }
        let _ = writeln!(s, "Details: {}.\n", extra.join(", "));
        if let Some(actions) = map.get("actions").and_then(Value::as_array).filter(|a| !a.is_empty()) {
            s.push_str("| at (s) | action | status |\n|---|---|---|\n");
            for a in actions {
                let _ = writeln!(
                    s,
                    "| {} | `{}` | {} |",
                    a["at_s"],
                    a["command"].as_str().unwrap_or_default(),
                    a["status"].as_str().unwrap_or_default()
                );
            }
            s.push('\n');
        }
        s.push_str(&crate::soak_report::markdown(&r.extra["soak"]));
    }
    for (file, _) in charts(r) {
        let _ = writeln!(s, "![{file}]({prefix}{file})");
    }
    s.push('\n');
    s
}

fn short(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() != 0.0 => format!("{f:.2}"),
        _ => v.to_string(),
    }
}

/// The charts of one report: (file name, SVG).
pub fn charts(r: &ScenarioReport) -> Vec<(String, String)> {
    let name = &r.scenario;
    let pts = |f: &dyn Fn(&Tick) -> f64| r.series.iter().map(|t| (t.t_s, f(t))).collect::<Vec<_>>();
    let marks: Vec<(f64, String)> = r.series.iter().filter_map(|t| t.note.clone().map(|n| (t.t_s, n))).collect();
    let mut out = vec![
        (
            format!("{name}-latency.svg"),
            line_chart(
                &format!("{name}: latency per tick"),
                "ms",
                &[
                    ("send-ack p99", "#d62728", pts(&|t| t.send_ack_p99_ms)),
                    ("send lag p99", "#7f7f7f", pts(&|t| t.send_lag_p99_ms)),
                    ("realtime delivery p50", "#1f77b4", pts(&|t| t.realtime_p50_ms)),
                    ("realtime delivery p99", "#ff7f0e", pts(&|t| t.realtime_p99_ms)),
                ],
                &marks,
            ),
        ),
        (
            format!("{name}-throughput.svg"),
            line_chart(
                &format!("{name}: throughput"),
                "per second",
                &[
                    ("sends acked/s", "#2ca02c", pts(&|t| t.sends_per_s)),
                    ("deliveries acked/s", "#9467bd", pts(&|t| t.deliveries_per_s)),
                ],
                &marks,
            ),
        ),
    ];
    if let (Some(total), Some(from)) = (r.extra["backlog_deliveries"].as_f64(), r.extra["storm_from_s"].as_f64()) {
        let start = r.series.iter().take_while(|t| t.t_s < from).last().map_or(0, |t| t.backlog_delivered) as f64;
        let curve: Vec<(f64, f64)> = r
            .series
            .iter()
            .filter(|t| t.t_s >= from)
            .map(|t| (t.t_s - from, (total - (t.backlog_delivered as f64 - start)).max(0.0)))
            .collect();
        out.push((
            format!("{name}-drain.svg"),
            line_chart(
                &format!("{name}: backlog left after the reconnect"),
                "messages",
                &[("backlog left", "#8c564b", curve)],
                &[],
            ),
        ));
    }
    out.extend(crate::soak_report::charts(name, &r.extra["soak"]));
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A chart's line: label, colour, (x, y) points.
pub type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A line chart: x in seconds, one polyline per series, vertical marks for notes.
pub fn line_chart(title: &str, y_label: &str, series: &[Series], marks: &[(f64, String)]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 320.0, 64.0, 16.0, 40.0, 44.0);
    let all = series.iter().flat_map(|s| s.2.iter());
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = nice(all.map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max));
    let x = |v: f64| left + (w - left - right) * v / x_max;
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / y_max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{left}" y="18" font-size="14" font-weight="bold">{}</text>"#, esc(title));
    for k in 0..=4 {
        let v = y_max * k as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(s, r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, w - right);
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, left - 4.0, yy + 4.0, fmt_num(v));
    }
    for k in 0..=5 {
        let v = x_max * k as f64 / 5.0;
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.0} s</text>"#, x(v), h - bottom + 16.0, v);
    }
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        top + (h - top - bottom) / 2.0,
        top + (h - top - bottom) / 2.0,
        esc(y_label)
    );
    for (t, note) in marks {
        let xx = x(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="3,3"><title>{}</title></line>"##,
            h - bottom,
            esc(note)
        );
    }
    for (k, (label, color, pts)) in series.iter().enumerate() {
        if !pts.is_empty() {
            let path: Vec<String> =
                pts.iter().filter(|p| p.1.is_finite()).map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b))).collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                path.join(" ")
            );
        }
        let lx = left + 10.0 + (200.0f64).min((w - left - right) / series.len() as f64) * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            h - 14.0,
            lx + 16.0,
            h - 10.0,
            esc(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|v| *v >= max).unwrap_or(10.0 * mag)
}

fn fmt_num(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Reads every `<scenario>.json` in `dir` and writes the capacity report to `out`,
/// with chart links relative to `out`'s folder.
pub fn capacity(dir: &Path, out: &Path, machine: &str) -> Result<()> {
    let mut reports: Vec<ScenarioReport> = Vec::new();
    for name in ["steady", "fanout", "storm", "idle", "chaos", "soak", "sends"] {
        let path = dir.join(format!("{name}.json"));
        if let Ok(text) = std::fs::read_to_string(&path) {
            reports.push(serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?);
        }
    }
    anyhow::ensure!(!reports.is_empty(), "no scenario reports in {}", dir.display());
    let get = |n: &str| reports.iter().find(|r| r.scenario == n);
    let rel = pathdiff(out, dir);
    let mut s = String::new();
    s.push_str("# Capacity report\n\nGenerated by `scripts/capacity.sh` (see docs/benchmarks.md): one worker and two\ngateways started locally, release build, the load-test on the same machine.\n\n");
    let _ = writeln!(s, "Machine: {machine}.\n");
    s.push_str(
        "## Targets (docs/architecture.md section 6)\n\n| what | floor | goal | measured | verdict |\n|---|---|---|---|---|\n",
    );
    let verdict = |floor: bool, goal: bool| {
        if goal {
            "goal met"
        } else if floor {
            "floor met"
        } else {
            "below floor"
        }
    };
    if let Some(r) = get("steady") {
        let (rate, p99) = (r.sends_per_s, r.send_ack_ms.p99);
        let _ = writeln!(s, "| durable sends, 1:1, send-ack p99 | 5 000 msg/s, p99 <= 50 ms | 20 000 msg/s, p99 <= 10 ms | {rate:.0} msg/s at p99 {p99:.1} ms (`steady`, target rate {}) | {} |", r.params["rate"], verdict(rate >= 4750.0 && p99 <= 50.0, rate >= 19_000.0 && p99 <= 10.0));
    }
    if let Some(r) = get("fanout") {
        let d = r.deliveries_per_s;
        let _ = writeln!(s, "| deliveries + acks per second (groups) | 50 000 /s | 100 000 /s | {d:.0} /s (`fanout`, groups of {}) | {} |", r.params["group"], verdict(d >= 50_000.0, d >= 100_000.0));
    }
    if let Some(r) = get("idle") {
        let (n, per) =
            (r.extra["connections"].as_f64().unwrap_or(0.0), r.extra["rss_kib_per_connection"].as_f64().unwrap_or(0.0));
        let _ = writeln!(s, "| idle connections on one gateway, RSS per connection | 50 000, <= 16 KiB | 200 000, <= 8 KiB | {n:.0} held, {per:.1} KiB each (`idle`) | {} |", verdict(n >= 50_000.0 && per <= 16.0, n >= 200_000.0 && per <= 8.0));
    }
    if let Some(r) = get("storm") {
        let (drain, ratio) =
            (r.extra["drain_s"].as_f64().unwrap_or(f64::MAX), r.extra["realtime_p99_ratio"].as_f64().unwrap_or(0.0));
        let _ = writeln!(s, "| login storm: {} devices x {} backlog | drained <= 60 s | drained <= 15 s, realtime p99 within 2x | drained in {drain:.1} s; realtime p99 {:.1} ms -> {:.1} ms ({ratio:.1}x) | {} |", r.params["devices"], r.params["backlog"], r.extra["realtime_p99_baseline_ms"].as_f64().unwrap_or(0.0), r.extra["realtime_p99_during_storm_ms"].as_f64().unwrap_or(0.0), verdict(drain <= 60.0, drain <= 15.0 && ratio <= 2.0));
    }
    if let Some(row) = get("soak").and_then(crate::soak_report::capacity_row) {
        let _ = writeln!(s, "{row}");
    }
    let mut all = IntegrityReport::default();
    for r in &reports {
        all.add(&r.integrity);
    }
    let _ = writeln!(s, "| lost / shown twice / out of order, every scenario incl. chaos | 0 / 0 / 0 | 0 / 0 / 0 | {} / {} / {} over {} acknowledged | {} |\n", all.lost, all.shown_twice, all.out_of_order, all.acknowledged, if all.is_clean() { "met" } else { "FAILED" });
    s.push_str("## Integrity per scenario\n\n| scenario | acknowledged | lost | shown twice | out of order | repeats on the wire | recovered by sync | catch-up after reconnect p99 (ms) |\n|---|---|---|---|---|---|---|---|\n");
    for r in &reports {
        let i = &r.integrity;
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            i.acknowledged,
            i.lost,
            i.shown_twice,
            i.out_of_order,
            i.repeats_on_wire,
            i.recovered_by_sync,
            if r.reconnect_catch_up_ms.count > 0 { format!("{:.0}", r.reconnect_catch_up_ms.p99) } else { "-".into() }
        );
    }
    if reports.iter().any(|r| r.load.is_some()) {
        s.push_str("\n## Offered against achieved\n\n| scenario | offered msg/s | achieved msg/s | senders | send lag p99 (ms) | load generator CPU (cores) | verdict |\n|---|---|---|---|---|---|---|\n");
        for r in reports.iter().filter(|r| r.load.is_some()) {
            let l = r.load.as_ref().expect("filtered");
            let _ = writeln!(
                s,
                "| `{}` | {} | {:.0} | {} over {}, {} in flight each | {:.0} | {} | {} |",
                r.scenario,
                l.offered_per_s.map_or("closed loop".into(), |o| format!("{o:.0}")),
                l.achieved_per_s,
                l.senders,
                l.via,
                l.in_flight,
                l.send_lag_ms.p99,
                l.generator_cores.map_or("-".into(), |c| format!("{c:.2}")),
                l.verdict
            );
        }
    }
    if reports.iter().any(|r| r.cpu.is_some()) {
        s.push_str("\n## CPU per acknowledged message (µs, over each send window)\n\n| scenario | server | gateways | workers | mariadb | redis | load-test |\n|---|---|---|---|---|---|---|\n");
        for r in reports.iter().filter(|r| r.cpu.is_some()) {
            let per = &r.cpu.as_ref().expect("filtered").us_per_message;
            let us = |n: &str| per.get(n).map_or("-".into(), |v| format!("{v:.0}"));
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} | {} | {} | {} |",
                r.scenario,
                us("server"),
                us("gateways"),
                us("workers"),
                us("mariadb"),
                us("redis"),
                us("loadtest")
            );
        }
    }
    s.push_str("\n## Scenarios\n\n");
    for r in &reports {
        s.push_str(&markdown(r, &rel));
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, s).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("capacity report written to {}", out.display());
    Ok(())
}

/// `dir` relative to `out`'s folder, as a link prefix ending in `/`.
fn pathdiff(out: &Path, dir: &Path) -> String {
    let base = out.parent().unwrap_or(Path::new("."));
    match dir.strip_prefix(base) {
        Ok(rel) if rel.as_os_str().is_empty() => String::new(),
        Ok(rel) => format!("{}/", rel.display()),
        Err(_) => format!("{}/", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_one_line_per_series() {
        let svg = line_chart(
            "t <x>",
            "ms",
            &[("a", "#000", vec![(0.0, 1.0), (1.0, 3.0)]), ("b", "#111", vec![(0.0, 2.0)])],
            &[(0.5, "kill".into())],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;"), "titles are escaped");
        assert!(svg.contains("<title>kill</title>"));
    }

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice(7.3), 10.0);
        assert_eq!(nice(180.0), 200.0);
        assert_eq!(nice(0.0), 1.0);
    }

    #[test]
    fn chart_links_are_relative_to_the_report() {
        assert_eq!(pathdiff(Path::new("docs/capacity-report.md"), Path::new("docs/capacity")), "capacity/");
        assert_eq!(pathdiff(Path::new("docs/r.md"), Path::new("docs")), "");
    }
}
