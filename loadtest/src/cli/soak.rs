//! The options of `soak`: steady traffic, device churn, what is sampled and how the
//! slope test judges it.

use clap::Args;

use super::TargetArgs;
use crate::sampler::AdminUrl;

/// The Redis a soak samples when `--redis-url` is not given.
pub const SOAK_REDIS_URL: &str = "redis://127.0.0.1:6379/0";

#[derive(Debug, Clone, Args)]
pub struct Soak {
    /// Direct conversations, each with a device online for its recipient at the start.
    #[arg(long, default_value_t = 300)]
    pub conversations: usize,
    /// Sends per second in total.
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    /// Seconds of sending and churn.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub duration: f64,
    /// Message body size in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 100)]
    pub payload: usize,
    /// Seconds between churns.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub churn_every: f64,
    /// Percent of the starting devices that go away for good at each churn (never used again).
    #[arg(long, value_name = "PCT", default_value_t = 2.0)]
    pub leave_pct: f64,
    /// Percent of the starting devices added at each churn: new device ids of existing users.
    #[arg(long, value_name = "PCT", default_value_t = 2.0)]
    pub join_pct: f64,
    /// Percent of the starting devices stopped at each churn and started again at the next.
    #[arg(long, value_name = "PCT", default_value_t = 5.0)]
    pub reconnect_pct: f64,
    /// Seconds between samples of Redis, MySQL and the processes.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub sample_every: f64,
    /// Seconds of samples the slope test ignores [default: 20% of --duration].
    #[arg(long, value_name = "SECONDS")]
    pub warmup: Option<f64>,
    /// Largest fitted growth over the measured period, as a fraction of the series' mean.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.10)]
    pub max_growth: f64,
    /// Growth allowed on top of --max-growth for key and row counts.
    #[arg(long, value_name = "N", default_value_t = 20.0)]
    pub floor_count: f64,
    /// Growth allowed on top of --max-growth for memory (Redis, resident), in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 4.0)]
    pub floor_mib: f64,
    /// Series reported but not failed on (a name, or a prefix ending in `.`); repeat for more.
    /// Messages are kept `worker.retention_days` (whole days, longer than a soak); `none` checks all.
    #[arg(long, value_name = "SERIES", default_values_t = ["rows.messages".to_string()])]
    pub exempt: Vec<String>,
    /// The cluster's redis_key_prefix: keys counted are `PREFIX:*`.
    #[arg(long, value_name = "PREFIX", default_value = "hd")]
    pub redis_prefix: String,
    /// The cluster's MySQL database, for table rows and write counters.
    #[arg(long, value_name = "URL", default_value = "mysql://root@127.0.0.1:3306/herald")]
    pub mysql_url: String,
    #[command(flatten)]
    pub target: TargetArgs,
}

impl Soak {
    /// Seconds of warm-up: given, or a fifth of the run.
    pub fn warmup_s(&self) -> f64 {
        self.warmup.unwrap_or(self.duration * 0.2)
    }

    /// The Redis sampled: `--redis-url`, or the local one.
    pub fn redis_url(&self) -> &str {
        self.target.measure.redis_url.as_deref().unwrap_or(SOAK_REDIS_URL)
    }

    /// The processes whose /metrics are sampled (`--admin`).
    pub fn admins(&self) -> &[AdminUrl] {
        &self.target.measure.admins
    }
}
