//! CPU per message: every process's CPU time read just before and just after the
//! measured send window, divided by the messages acknowledged (and the deliveries made)
//! in it. Herald's processes are read from their admin `/metrics`
//! (`process_cpu_seconds_total`), MariaDB and Redis from `/proc/<pid>/stat` when they run
//! on this machine (found by their command name) and Redis also from `INFO cpu` when
//! `--redis-url` is given, the load-test from its own `/proc/self/stat`, and the machine
//! as a whole from `/proc/stat`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fred::prelude::*;
use fred::types::InfoKind;
use futures::future::join_all;
use herald_shared::process_metrics::cpu_seconds_of_stat;
use serde::{Deserialize, Serialize};

use crate::cli::Measure;
use crate::sampler::{info_field, metric, AdminUrl};

mod account;
#[cfg(test)]
mod tests;

pub use account::{account, markdown, CpuReport, CpuRow};

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
                let c = herald_shared::redis::builder(url, &Default::default(), Duration::from_secs(5))?.build()?;
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
