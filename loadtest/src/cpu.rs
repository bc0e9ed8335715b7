//! CPU per message: every process's CPU time read just before and just after the
//! measured send window, divided by the messages acknowledged (and the deliveries made)
//! in it. Herald's processes are read from their admin `/metrics`
//! (`process_cpu_seconds_total`), MariaDB and Redis from `/proc/<pid>/stat` when they run
//! on this machine (found by their command name) and Redis also from `INFO cpu` when
//! `--redis-url` is given, the load-test from its own `/proc/self/stat`, and the machine
//! as a whole from `/proc/stat`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fred::prelude::*;
use fred::types::InfoKind;
use futures::future::join_all;
use herald_shared::process_metrics::cpu_seconds_of_stat;
use serde::{Deserialize, Serialize};

use crate::cli::Measure;
use crate::sampler::{info_field, metric, AdminUrl};

/// What a process is, for the totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    Gateway,
    Worker,
    Mariadb,
    Redis,
    /// A Herald process that is neither (named so by its admin URL only).
    Other,
    Loadtest,
}

impl Group {
    /// The name of the group's total.
    fn total_name(self) -> &'static str {
        match self {
            Group::Gateway => "gateways",
            Group::Worker => "workers",
            Group::Mariadb => "mariadb",
            Group::Redis => "redis",
            Group::Other => "other",
            Group::Loadtest => "loadtest",
        }
    }
}

/// Local processes read from `/proc` by their command name.
const LOCAL: [(&str, Group); 3] =
    [("mariadbd", Group::Mariadb), ("mysqld", Group::Mariadb), ("redis-server", Group::Redis)];

/// One process's CPU seconds so far (`None`: it could not be read).
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub name: String,
    pub group: Group,
    pub cpu_s: Option<f64>,
    /// Counted in its group's total (Redis read twice, from `/proc` and `INFO`, counts once).
    pub counted: bool,
}

/// Every reading at one moment, and the machine's CPU ticks (busy, total) from `/proc/stat`.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at: Instant,
    pub readings: Vec<Reading>,
    pub machine: Option<(f64, f64)>,
    pub errors: Vec<String>,
}

/// Reads the CPU of the processes a scenario measures.
pub struct CpuMeter {
    http: reqwest::Client,
    admins: Vec<(AdminUrl, Group)>,
    local: Vec<(u32, String, Group)>,
    redis: Option<Client>,
}

impl CpuMeter {
    /// Finds the local MariaDB and Redis, tells gateways from workers by their metrics,
    /// and connects to Redis; an admin listener or Redis that does not answer fails here,
    /// before the run.
    pub async fn new(measure: &Measure) -> Result<CpuMeter> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        let mut admins = Vec::new();
        for a in &measure.admins {
            let text = scrape(&http, a).await?;
            admins.push((a.clone(), group_of(&a.name, &text)));
        }
        let redis = match &measure.redis_url {
            Some(url) => {
                let c = herald_shared::redis::builder(url, Duration::from_secs(5))?.build()?;
                c.init().await.with_context(|| format!("connecting to Redis at {url}"))?;
                Some(c)
            }
            None => None,
        };
        let local = local_processes();
        Ok(CpuMeter { http, admins, local, redis })
    }

    /// Every process's CPU seconds now.
    pub async fn snapshot(&self) -> Snapshot {
        let mut errors = Vec::new();
        let scrapes = join_all(self.admins.iter().map(|(a, _)| scrape(&self.http, a))).await;
        let mut readings: Vec<Reading> = Vec::new();
        for ((a, group), text) in self.admins.iter().zip(scrapes) {
            let cpu_s = match text {
                Ok(t) => metric(&t, "process_cpu_seconds_total"),
                Err(e) => {
                    errors.push(format!("{e:#}"));
                    None
                }
            };
            readings.push(Reading { name: a.name.clone(), group: *group, cpu_s, counted: true });
        }
        let redis_info = match &self.redis {
            Some(c) => match c.info::<String>(Some(InfoKind::Cpu)).await {
                Ok(info) => {
                    Some(info_field(&info, "used_cpu_sys").zip(info_field(&info, "used_cpu_user")).map(|(s, u)| s + u))
                }
                Err(e) => {
                    errors.push(format!("Redis INFO cpu: {e}"));
                    Some(None)
                }
            },
            None => None,
        };
        for (pid, comm, group) in &self.local {
            let cpu_s = proc_cpu_seconds(&format!("/proc/{pid}/stat"));
            // The cluster's Redis is counted from INFO when it was given.
            let counted = !(*group == Group::Redis && redis_info.is_some());
            readings.push(Reading { name: format!("{comm} (pid {pid})"), group: *group, cpu_s, counted });
        }
        if let Some(cpu_s) = redis_info {
            readings.push(Reading { name: "redis (INFO cpu)".into(), group: Group::Redis, cpu_s, counted: true });
        }
        readings.push(Reading {
            name: "herald-loadtest (this process)".into(),
            group: Group::Loadtest,
            cpu_s: proc_cpu_seconds("/proc/self/stat"),
            counted: true,
        });
        let machine = std::fs::read_to_string("/proc/stat").ok().and_then(|s| machine_ticks(&s));
        Snapshot { at: Instant::now(), readings, machine, errors }
    }
}

async fn scrape(http: &reqwest::Client, a: &AdminUrl) -> Result<String> {
    let text = http
        .get(format!("{}/metrics", a.url))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("{}/metrics", a.url))?
        .text()
        .await?;
    Ok(text)
}

/// A gateway exports its sessions, a worker its shards; otherwise the name says.
fn group_of(name: &str, metrics: &str) -> Group {
    let has = |m: &str| metrics.lines().any(|l| l.starts_with(m));
    let name = name.to_ascii_lowercase();
    if has("herald_gateway_sessions") {
        Group::Gateway
    } else if has("herald_worker_owned_shards") || has("herald_messages_committed_total") {
        Group::Worker
    } else if name.starts_with("gw") || name.contains("gateway") {
        Group::Gateway
    } else if name.starts_with("wk") || name.contains("worker") {
        Group::Worker
    } else {
        Group::Other
    }
}

fn proc_cpu_seconds(path: &str) -> Option<f64> {
    cpu_seconds_of_stat(&std::fs::read_to_string(path).ok()?)
}

/// MariaDB and Redis processes on this machine, by command name.
fn local_processes() -> Vec<(u32, String, Group)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        if let Some((name, group)) = LOCAL.iter().find(|(n, _)| *n == comm.trim()) {
            out.push((pid, (*name).to_owned(), *group));
        }
    }
    out.sort();
    out
}

/// (busy, total) ticks of all cores from `/proc/stat`'s `cpu` line; idle and iowait are not busy.
fn machine_ticks(stat: &str) -> Option<(f64, f64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0.0);
    Some((total - idle, total))
}

/// The cores this machine has.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(name: &str, group: Group, cpu_s: Option<f64>) -> Reading {
        Reading { name: name.into(), group, cpu_s, counted: true }
    }

    fn snapshot(at: Instant, readings: Vec<Reading>, machine: (f64, f64)) -> Snapshot {
        Snapshot { at, readings, machine: Some(machine), errors: Vec::new() }
    }

    #[test]
    fn cpu_per_message_is_the_difference_over_the_messages() {
        let t0 = Instant::now();
        let before = snapshot(
            t0,
            vec![
                reading("gw-1", Group::Gateway, Some(10.0)),
                reading("gw-2", Group::Gateway, Some(5.0)),
                reading("wk-1", Group::Worker, Some(20.0)),
                reading("mariadbd (pid 1)", Group::Mariadb, Some(100.0)),
                Reading { counted: false, ..reading("redis-server (pid 2)", Group::Redis, Some(50.0)) },
                reading("redis (INFO cpu)", Group::Redis, Some(49.0)),
                reading("herald-loadtest (this process)", Group::Loadtest, Some(1.0)),
            ],
            (1000.0, 4000.0),
        );
        let after = snapshot(
            t0 + Duration::from_secs(10),
            vec![
                reading("gw-1", Group::Gateway, Some(12.0)),
                reading("gw-2", Group::Gateway, Some(6.0)),
                reading("wk-1", Group::Worker, Some(24.0)),
                reading("mariadbd (pid 1)", Group::Mariadb, Some(108.0)),
                Reading { counted: false, ..reading("redis-server (pid 2)", Group::Redis, Some(52.5)) },
                reading("redis (INFO cpu)", Group::Redis, Some(51.0)),
                reading("herald-loadtest (this process)", Group::Loadtest, Some(2.5)),
            ],
            (2500.0, 6000.0),
        );
        let c = account(&before, &after, 10_000, 20_000, 2);
        assert!((c.window_s - 10.0).abs() < 1e-6);
        let per = |n: &str| c.us_per_message[n];
        // 3 s of gateways over 10 000 messages: 300 us each.
        assert!((per("gateways") - 300.0).abs() < 1e-6);
        assert!((per("workers") - 400.0).abs() < 1e-6);
        assert!((per("mariadb") - 800.0).abs() < 1e-6);
        // Redis counted once, from INFO (2 s), not from /proc (2.5 s).
        assert!((per("redis") - 200.0).abs() < 1e-6);
        assert!((per("server") - 1700.0).abs() < 1e-6);
        assert!((per("loadtest") - 150.0).abs() < 1e-6);
        let gw1 = c.processes.iter().find(|r| r.name == "gw-1").unwrap();
        assert_eq!((gw1.cpu_s, gw1.us_per_message, gw1.us_per_delivery), (Some(2.0), Some(200.0), Some(100.0)));
        assert!((gw1.cores.unwrap() - 0.2).abs() < 1e-9);
        let redis_proc = c.processes.iter().find(|r| r.name.starts_with("redis-server")).unwrap();
        assert!(!redis_proc.counted);
        assert!((c.machine_busy.unwrap() - 0.75).abs() < 1e-9);
        let md = markdown(&c);
        assert!(md.contains("| **server** | 17.00 | 1.70 | **1700** | 850.0 |"), "{md}");
        assert!(md.contains("(not in the totals)"));
    }

    #[test]
    fn unreadable_or_restarted_processes_are_left_out_and_said() {
        let t0 = Instant::now();
        let before = snapshot(
            t0,
            vec![reading("gw-1", Group::Gateway, Some(10.0)), reading("wk-1", Group::Worker, Some(20.0))],
            (0.0, 0.0),
        );
        let after = snapshot(
            t0 + Duration::from_secs(1),
            vec![reading("gw-1", Group::Gateway, None), reading("wk-1", Group::Worker, Some(1.0))],
            (0.0, 0.0),
        );
        let c = account(&before, &after, 0, 0, 2);
        assert!(c.processes.iter().all(|r| r.cpu_s.is_none()));
        assert!(c.total("server").is_none(), "nothing measured, no total");
        assert!(c.us_per_message.is_empty(), "no messages, nothing per message");
        assert!(c.notes.iter().any(|n| n.contains("wk-1") && n.contains("restarted")), "{:?}", c.notes);
        assert!(c.notes.iter().any(|n| n.starts_with("mariadb not measured")), "{:?}", c.notes);
        assert_eq!(c.machine_busy, None);
    }

    #[test]
    fn gateways_and_workers_are_told_apart() {
        assert_eq!(group_of("a", "# TYPE x\nherald_gateway_sessions 3\n"), Group::Gateway);
        assert_eq!(group_of("a", "herald_worker_owned_shards 8\n"), Group::Worker);
        assert_eq!(group_of("gw-9", "process_cpu_seconds_total 1\n"), Group::Gateway);
        assert_eq!(group_of("wk-2", ""), Group::Worker);
        assert_eq!(group_of("127.0.0.1:9190", ""), Group::Other);
    }

    #[test]
    fn the_machine_s_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n";
        assert_eq!(machine_ticks(stat), Some((150.0, 1000.0)));
        assert_eq!(machine_ticks("intr 1"), None);
    }

    #[test]
    fn this_process_is_found_in_proc() {
        assert!(proc_cpu_seconds("/proc/self/stat").is_some());
        assert!(cores() >= 1);
    }
}
