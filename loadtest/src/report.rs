//! Reports: each scenario's JSON, a Markdown summary and SVG charts (latency
//! percentiles over time, throughput, backlog drain), and the capacity report that
//! sets a suite's numbers next to the targets of docs/architecture.md section 6.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chart::line_chart;
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
    if let Some(from) = r.extra["storm_from_s"].as_f64().filter(|_| r.extra["reconnect_all_s"].is_number()) {
        let online: Vec<(f64, f64)> = r.series.iter().map(|t| (t.t_s, t.online as f64)).collect();
        out.push((
            format!("{name}-sessions.svg"),
            line_chart(
                &format!("{name}: devices online"),
                "devices",
                &[("devices online", "#17becf", online)],
                &[(from, "gateway killed".into())],
            ),
        ));
    }
    out.extend(crate::soak_report::charts(name, &r.extra["soak"]));
    out
}

/// Reads every `<scenario>.json` in `dir` and writes the capacity report to `out`,
/// with chart links relative to `out`'s folder.
pub fn capacity(dir: &Path, out: &Path, machine: &str) -> Result<()> {
    let mut reports: Vec<ScenarioReport> = Vec::new();
    for name in ["steady", "fanout", "storm", "idle", "chaos", "failover", "soak", "sends"] {
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
    if let Some(r) = get("failover") {
        let (e, secs) = (&r.extra, |k: &str| r.extra[k].as_f64().map_or("not reached".into(), |s| format!("{s:.1} s")));
        let _ = writeln!(s, "| gateway killed: its {} devices move to the others | no target | no target | all back after {}, all caught up after {}; realtime p99 {:.1} ms -> {:.1} ms | - |", r.params["devices"], secs("reconnect_all_s"), secs("catch_up_all_s"), e["realtime_p99_baseline_ms"].as_f64().unwrap_or(0.0), e["realtime_p99_during_storm_ms"].as_f64().unwrap_or(0.0));
    }
    if let Some(row) = get("soak").and_then(|r| {
        crate::soak_report::capacity_row(r.params["duration_s"].as_f64().unwrap_or(0.0), &r.extra["soak"])
    }) {
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
    fn chart_links_are_relative_to_the_report() {
        assert_eq!(pathdiff(Path::new("docs/capacity-report.md"), Path::new("docs/capacity")), "capacity/");
        assert_eq!(pathdiff(Path::new("docs/r.md"), Path::new("docs")), "");
    }
}
