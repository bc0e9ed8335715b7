//! What a measured window cost: each process's CPU seconds, per message and per
//! delivery, the totals by kind of process, and the report's table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{Group, Snapshot};

/// One line of the CPU table: CPU seconds in the window, cores busy on average, and
/// per message and per delivery.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuRow {
    pub name: String,
    pub cpu_s: Option<f64>,
    /// Average cores busy over the window (1.0: one core all the time).
    pub cores: Option<f64>,
    pub us_per_message: Option<f64>,
    pub us_per_delivery: Option<f64>,
    /// In the totals (false for Redis read from `/proc` when `INFO cpu` counts it).
    #[serde(default = "yes")]
    pub counted: bool,
}

fn yes() -> bool {
    true
}

/// CPU spent in the measured window, per process, per group and in total.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    pub window_s: f64,
    /// Sends acknowledged in the window.
    pub messages: u64,
    /// Deliveries (acked by devices) in the window.
    pub deliveries: u64,
    pub cores: usize,
    /// Busy fraction of all the machine's cores over the window (`/proc/stat`).
    pub machine_busy: Option<f64>,
    pub processes: Vec<CpuRow>,
    /// `gateways`, `workers`, `mariadb`, `redis` (those measured), `server` (their sum)
    /// and `loadtest`.
    pub totals: Vec<CpuRow>,
    /// CPU microseconds per acknowledged message of each total, by its name.
    pub us_per_message: BTreeMap<String, f64>,
    pub notes: Vec<String>,
}

impl CpuReport {
    /// A total's row by name (`gateways`, `server`, `loadtest` ...).
    pub fn total(&self, name: &str) -> Option<&CpuRow> {
        self.totals.iter().find(|r| r.name == name)
    }
}

/// What the window cost: each reading's difference, per message and per delivery.
pub fn account(before: &Snapshot, after: &Snapshot, messages: u64, deliveries: u64, cores: usize) -> CpuReport {
    let window = after.at.saturating_duration_since(before.at).as_secs_f64().max(1e-9);
    let row = |name: String, cpu_s: Option<f64>, counted: bool| CpuRow {
        name,
        cpu_s,
        cores: cpu_s.map(|c| c / window),
        us_per_message: cpu_s.filter(|_| messages > 0).map(|c| c * 1e6 / messages as f64),
        us_per_delivery: cpu_s.filter(|_| deliveries > 0).map(|c| c * 1e6 / deliveries as f64),
        counted,
    };
    let mut notes: Vec<String> = before.errors.iter().chain(&after.errors).cloned().collect();
    let mut processes = Vec::new();
    let mut sums: BTreeMap<Group, f64> = BTreeMap::new();
    let mut missing: BTreeMap<Group, bool> = BTreeMap::new();
    for a in &after.readings {
        let b = before.readings.iter().find(|b| b.name == a.name);
        let delta = match (b.and_then(|b| b.cpu_s), a.cpu_s) {
            (Some(b), Some(a)) if a >= b => Some(a - b),
            (Some(_), Some(_)) => {
                notes.push(format!("{}: its CPU went down (restarted in the window?): not counted", a.name));
                None
            }
            _ => None,
        };
        if a.counted {
            match delta {
                Some(d) => *sums.entry(a.group).or_default() += d,
                None => {
                    missing.insert(a.group, true);
                }
            }
        }
        processes.push(row(a.name.clone(), delta, a.counted));
    }
    let mut totals = Vec::new();
    let mut server = 0.0;
    let mut parts = Vec::new();
    for (group, sum) in &sums {
        if *group == Group::Loadtest {
            continue;
        }
        server += sum;
        parts.push(group.total_name());
        totals.push(row(group.total_name().into(), Some(*sum), true));
    }
    for group in [Group::Gateway, Group::Worker, Group::Mariadb, Group::Redis] {
        if !sums.contains_key(&group) {
            notes.push(format!("{} not measured: not in the server total", group.total_name()));
        } else if missing.contains_key(&group) {
            notes.push(format!("{}: some processes could not be read: the total is short", group.total_name()));
        }
    }
    if !parts.is_empty() {
        totals.push(row("server".into(), Some(server), true));
    }
    totals.push(row("loadtest".into(), sums.get(&Group::Loadtest).copied(), true));
    let us_per_message =
        totals.iter().filter_map(|r| r.us_per_message.map(|us| (r.name.clone(), us))).collect::<BTreeMap<_, _>>();
    let machine_busy = match (before.machine, after.machine) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => Some(((b1 - b0) / (t1 - t0)).clamp(0.0, 1.0)),
        _ => None,
    };
    if !parts.is_empty() {
        notes.push(format!("server = {}", parts.join(" + ")));
    }
    if after.readings.iter().any(|r| matches!(r.group, Group::Mariadb | Group::Redis)) {
        notes.push("MariaDB and Redis count whatever else used them in the window".into());
    }
    CpuReport { window_s: window, messages, deliveries, cores, machine_busy, processes, totals, us_per_message, notes }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

/// The CPU table of a scenario's Markdown report.
pub fn markdown(c: &CpuReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "CPU over the send window ({:.1} s, {} messages acknowledged, {} deliveries; {} cores{}):\n",
        c.window_s,
        c.messages,
        c.deliveries,
        c.cores,
        c.machine_busy.map_or(String::new(), |b| format!(", the machine {:.0} % busy", b * 100.0)),
    );
    s.push_str("| process | CPU s | cores busy | µs per message | µs per delivery |\n|---|---|---|---|---|\n");
    for r in &c.processes {
        let name = if r.counted { r.name.clone() } else { format!("{} (not in the totals)", r.name) };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} |",
            opt(r.cpu_s, 2),
            opt(r.cores, 2),
            opt(r.us_per_message, 0),
            opt(r.us_per_delivery, 1)
        );
    }
    for r in &c.totals {
        let _ = writeln!(
            s,
            "| **{}** | {} | {} | **{}** | {} |",
            r.name,
            opt(r.cpu_s, 2),
            opt(r.cores, 2),
            opt(r.us_per_message, 0),
            opt(r.us_per_delivery, 1)
        );
    }
    if !c.notes.is_empty() {
        let _ = writeln!(s, "\n{}.", c.notes.join("; "));
    }
    s.push('\n');
    s
}
