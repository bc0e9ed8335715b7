//! Tracing and the Prometheus recorder, set up once per process.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// How log lines are written (`log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One readable line per event, for people.
    #[default]
    Text,
    /// One JSON object per line, for log collectors: `timestamp`, `level`, `target`,
    /// `message` and the event's fields at the top level, the innermost span's fields
    /// under `span`.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("expected text or json, got {s:?}")),
        }
    }
}

/// Logs to stderr in `format`; `RUST_LOG` wins over the configured filter.
pub fn init_tracing(default_filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        // The span list would repeat the session's fields on every line; the innermost
        // span (with its parents' fields recorded on it) is enough.
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).with_span_list(false).try_init(),
    };
}

/// Installs the global metrics recorder; the handle renders `/metrics`.
pub fn init_metrics() -> PrometheusHandle {
    // Seconds by default; counts get buckets of their own.
    let counts = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0];
    let recorder = PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("herald_worker_batch_size".into()), &counts))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("herald_pending_at_connect".into()), &counts))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("herald_device_registration_batch".into()), &counts))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("herald_worker_group_batches".into()), &counts))
        .expect("static buckets are valid")
        .build_recorder();
    let handle = recorder.handle();
    // A second install (tests start several servers in one process) keeps the first.
    let installed = metrics::set_global_recorder(recorder).is_ok();
    crate::metric_catalog::describe_all();
    crate::metric_catalog::record_build_info();
    if installed {
        // Histograms keep every sample until they are folded into their buckets, which
        // a scrape does; without this a process nobody scrapes grows with its traffic.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let upkeep = handle.clone();
            runtime.spawn(async move {
                let mut every = tokio::time::interval(UPKEEP_EVERY);
                loop {
                    every.tick().await;
                    upkeep.run_upkeep();
                }
            });
        }
    }
    handle
}

/// How often histogram samples are folded into their buckets when nobody scrapes.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Completes on SIGTERM or Ctrl-C: the shutdown future every binary hands to `run`.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn log_formats_parse_and_others_are_refused() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!(" text".parse(), Ok(LogFormat::Text));
        assert!("JSON-lines".parse::<LogFormat>().unwrap_err().contains("text or json"));
    }
}
