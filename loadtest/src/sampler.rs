//! What `soak` samples every few seconds: Redis memory (above its level before the
//! run) and the run's keys counted by kind (a SCAN of its prefix), MySQL table rows, each process's resident memory and
//! CPU from its admin `/metrics`, and write rates: MySQL's statement counters and
//! Redis's commands, per second since the previous sample.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use fred::prelude::*;
use fred::types::InfoKind;
use futures::StreamExt;
use herald_shared::db::TextColumns;
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPool;

/// MySQL's statement counters (`SHOW GLOBAL STATUS`), server-wide, reported per second.
const MYSQL_COUNTERS: [&str; 4] = ["Com_insert", "Com_update", "Com_delete", "Com_insert_select"];

/// One sample: named values, at `t_s` seconds since sending started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    pub t_s: f64,
    pub values: BTreeMap<String, f64>,
}

/// The connections a sample is read through.
pub struct Sampler {
    redis: Client,
    prefix: String,
    db: MySqlPool,
    http: reqwest::Client,
    admins: Vec<AdminUrl>,
    /// Redis's `used_memory` before the run: a shared Redis's other data would hide the
    /// run's own growth in the mean the tolerance is a fraction of.
    memory_base: f64,
    /// Cumulative counters of the previous sample, for rates.
    last: Option<(Instant, BTreeMap<String, f64>)>,
    pub samples: Vec<Sample>,
    /// What went wrong, the first few times.
    pub errors: Vec<String>,
    pub failures: u64,
}

impl Sampler {
    /// Connects to Redis and MySQL and reads one sample, so that a wrong URL fails the
    /// run before it starts.
    pub async fn connect(redis_url: &str, prefix: &str, mysql_url: &str, admins: &[AdminUrl]) -> Result<Sampler> {
        let redis = herald_shared::redis::builder(redis_url, &Default::default(), Duration::from_secs(10))?.build()?;
        redis.init().await.with_context(|| format!("connecting to Redis at {redis_url}"))?;
        let db = herald_shared::db::pool(mysql_url, 2, Some(Duration::from_secs(20)))?;
        let mut s = Sampler {
            redis,
            prefix: prefix.to_owned(),
            db,
            http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?,
            admins: admins.to_vec(),
            memory_base: 0.0,
            last: None,
            samples: Vec::new(),
            errors: Vec::new(),
            failures: 0,
        };
        s.memory_base = s.redis_values(&mut BTreeMap::new()).await?["redis.used_memory"];
        s.mysql_values(&mut BTreeMap::new()).await.with_context(|| format!("reading MySQL at {mysql_url}"))?;
        for a in &s.admins {
            s.admin_values(a, &mut BTreeMap::new()).await?;
        }
        Ok(s)
    }

    /// Samples every `every` from now until `stop` (into `samples`); `origin` is time 0.
    pub async fn run(mut self, every: Duration, origin: Instant, stop: tokio::sync::watch::Receiver<bool>) -> Sampler {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = stop;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let s = self.sample(origin).await;
            self.samples.push(s);
        }
        self
    }

    /// One sample; a source that fails is left out of it (and counted).
    pub async fn sample(&mut self, origin: Instant) -> Sample {
        let now = Instant::now();
        let mut values = BTreeMap::new();
        let mut cumulative = BTreeMap::new();
        let redis = self.redis_values(&mut cumulative).await.map(|v| values.extend(v));
        if let Some(m) = values.get_mut("redis.used_memory") {
            *m -= self.memory_base;
        }
        let mysql = self.mysql_values(&mut cumulative).await.map(|v| values.extend(v));
        let mut results = vec![redis, mysql];
        for a in self.admins.clone() {
            results.push(self.admin_values(&a, &mut cumulative).await.map(|v| values.extend(v)));
        }
        for e in results.into_iter().filter_map(Result::err) {
            self.failures += 1;
            if self.errors.len() < 10 {
                eprintln!("sample failed: {e:#}");
                self.errors.push(format!("{:.0} s: {e:#}", origin.elapsed().as_secs_f64()));
            }
        }
        if let Some((then, before)) = &self.last {
            let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
            for (name, v) in &cumulative {
                if let Some(b) = before.get(name) {
                    values.insert(name.clone(), (v - b).max(0.0) / secs);
                }
            }
        }
        self.last = Some((now, cumulative));
        Sample { t_s: now.duration_since(origin).as_secs_f64(), values }
    }

    /// `redis.used_memory` (as INFO says), `keys.KIND`; the command counter into `cumulative`.
    async fn redis_values(&self, cumulative: &mut BTreeMap<String, f64>) -> Result<BTreeMap<String, f64>> {
        let info: String = self.redis.info(Some(InfoKind::Memory)).await.context("Redis INFO memory")?;
        let mut out = BTreeMap::new();
        out.insert("redis.used_memory".into(), info_field(&info, "used_memory").context("no used_memory")?);
        let stats: String = self.redis.info(Some(InfoKind::Stats)).await.context("Redis INFO stats")?;
        let commands = info_field(&stats, "total_commands_processed").context("no total_commands_processed")?;
        cumulative.insert("writes.redis_commands".into(), commands);
        let mut keys = self.redis.scan_buffered(format!("{}:*", self.prefix), Some(1000), None);
        while let Some(key) = keys.next().await {
            let key = key.context("Redis SCAN")?;
            if let Some(kind) = key.as_str().and_then(|k| kind_of(k, &self.prefix)) {
                *out.entry(format!("keys.{kind}")).or_insert(0.0) += 1.0;
            }
        }
        Ok(out)
    }

    /// `rows.TABLE`; MySQL's statement counters into `cumulative`.
    async fn mysql_values(&self, cumulative: &mut BTreeMap<String, f64>) -> Result<BTreeMap<String, f64>> {
        let (outbox, live, devices, messages): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM outbox_events), (SELECT COUNT(*) FROM devices WHERE expired_at IS NULL), \
             (SELECT COUNT(*) FROM devices), (SELECT COUNT(*) FROM messages)",
        )
        .fetch_one(&self.db)
        .await
        .context("MySQL row counts")?;
        let mut out = BTreeMap::new();
        for (name, n) in
            [("outbox_events", outbox), ("devices_live", live), ("devices_total", devices), ("messages", messages)]
        {
            out.insert(format!("rows.{name}"), n as f64);
        }
        let names = MYSQL_COUNTERS.map(|n| format!("'{n}'")).join(", ");
        let rows = sqlx::query(&format!("SHOW GLOBAL STATUS WHERE Variable_name IN ({names})"))
            .fetch_all(&self.db)
            .await
            .context("MySQL SHOW GLOBAL STATUS")?;
        for r in rows {
            let (name, value) = (r.text(0)?, r.text(1)?);
            if let Ok(v) = value.parse::<f64>() {
                cumulative.insert(format!("writes.mysql_{}", name.to_lowercase().trim_start_matches("com_")), v);
            }
        }
        Ok(out)
    }

    /// `rss.NAME`; its CPU seconds into `cumulative` (`cpu.NAME`, cores once a rate).
    async fn admin_values(
        &self,
        a: &AdminUrl,
        cumulative: &mut BTreeMap<String, f64>,
    ) -> Result<BTreeMap<String, f64>> {
        let text = self
            .http
            .get(format!("{}/metrics", a.url))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("{}/metrics", a.url))?
            .text()
            .await?;
        let rss = metric(&text, "process_resident_memory_bytes")
            .with_context(|| format!("{}: no process_resident_memory_bytes", a.name))?;
        if let Some(cpu) = metric(&text, "process_cpu_seconds_total") {
            cumulative.insert(format!("cpu.{}", a.name), cpu);
        }
        Ok(BTreeMap::from([(format!("rss.{}", a.name), rss)]))
    }
}

/// A process's admin listener, named in the report by NAME or by its host and port.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminUrl {
    pub name: String,
    pub url: String,
}

impl std::str::FromStr for AdminUrl {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<AdminUrl> {
        let (name, url) = match s.split_once('=') {
            Some((name, url)) if !name.contains("://") => (name.trim().to_owned(), url.trim()),
            _ => (String::new(), s.trim()),
        };
        let host = url.split_once("://").map(|(_, rest)| rest).context("an admin URL is http://HOST:PORT")?;
        let host = host.trim_end_matches('/');
        ensure!(!host.is_empty() && !host.contains('/'), "an admin URL is http://HOST:PORT, not {url:?}");
        let name = if name.is_empty() { host.to_owned() } else { name };
        Ok(AdminUrl { name, url: url.trim_end_matches('/').to_owned() })
    }
}

/// The kind of one of Herald's keys under `prefix`: the segment after the prefix, or
/// after a user's `{tenant:user}` hash tag (`m`, `pend`, `presence`, `fo`, `ingress` ...).
pub fn kind_of<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(':')?;
    let rest = if rest.starts_with('{') { &rest[rest.find("}:")? + 2..] } else { rest };
    rest.split(':').next().filter(|k| !k.is_empty())
}

/// A `name:value` field of Redis's INFO.
pub(crate) fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':')?.parse().ok())
}

/// The first value of a metric in Prometheus's text format (labelled or not).
pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once('}')?.1,
            None if rest.starts_with(' ') => rest,
            None => return None,
        };
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_grouped_by_their_kind() {
        for (key, kind) in [
            ("cap:m:123456", Some("m")),
            ("cap:{bench:u-1}:pend:d", Some("pend")),
            ("cap:{bench:u-1}:presence", Some("presence")),
            ("cap:{bench:u-1}:devs", Some("devs")),
            ("cap:{bench:u-1}:reads:n3", Some("reads")),
            ("cap:{bench:u-1}:ovf", Some("ovf")),
            ("cap:fo:99", Some("fo")),
            ("cap:ingress:{3}", Some("ingress")),
            ("cap:lease:shard:1", Some("lease")),
            ("cap:epoch", Some("epoch")),
            ("capx:m:1", None),
            ("hd:m:1", None),
        ] {
            assert_eq!(kind_of(key, "cap"), kind, "{key}");
        }
    }

    #[test]
    fn info_fields_and_metrics_are_read() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:2000\r\n";
        assert_eq!(info_field(info, "used_memory"), Some(1_048_576.0));
        assert_eq!(info_field(info, "maxmemory"), None);
        let text = "# TYPE process_cpu_seconds_total gauge\nprocess_cpu_seconds_total 12.5\n\
                    process_resident_memory_bytes_max 1\nprocess_resident_memory_bytes{node=\"gw-1\"} 3.2e7\n";
        assert_eq!(metric(text, "process_cpu_seconds_total"), Some(12.5));
        assert_eq!(metric(text, "process_resident_memory_bytes"), Some(3.2e7));
        assert_eq!(metric(text, "process_open_fds"), None);
    }
}
