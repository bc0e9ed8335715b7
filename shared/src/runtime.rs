//! The async runtime a gateway or a worker runs on: tokio's multi-threaded scheduler
//! with `runtime_threads` worker threads (0: one per CPU the process may use).
//!
//! Each worker thread that has nothing to do sleeps, and tokio wakes an idle one
//! whenever a task becomes ready while another runs, to steal it; at low load most such
//! wakeups find nothing and go back to sleep. With fewer threads than the CPUs of the
//! machine a process is given fewer of these context switches per message
//! (docs/benchmarks.md, change 17); a process then uses at most that many cores.

use std::process::ExitCode;

use tokio::runtime::{Builder, Runtime};

use crate::config::{Cli, Config};

/// A multi-threaded runtime with `threads` worker threads (0: tokio's default, one per
/// CPU available to the process, its cgroup quota included).
pub fn build(threads: usize) -> std::io::Result<Runtime> {
    let mut builder = Builder::new_multi_thread();
    builder.enable_all();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    builder.build()
}

/// What `binary` does once its configuration is loaded, before its own work: the
/// runtime of `cfg.runtime_threads` threads, logging, and the log lines of the start
/// (the threads it runs, the orchestrator's variables ignored, the deprecated keys
/// applied). A runtime that cannot start is an error on stderr and a failed exit.
pub fn start(binary: &str, cfg: &Config, cli: &Cli) -> Result<Runtime, ExitCode> {
    let runtime = build(cfg.runtime_threads).map_err(|e| {
        eprintln!("{binary}: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })?;
    crate::telemetry::init_tracing(&cfg.log, cfg.log_format);
    let threads = runtime.metrics().num_workers();
    tracing::info!(threads, "async runtime started (runtime_threads)");
    for var in &cli.ignored_env {
        tracing::debug!(variable = %var, "an orchestrator's environment variable, not a configuration key; ignored");
    }
    for old in &cli.deprecated {
        tracing::warn!(key = %old.given, replacement = old.replacement, "deprecated configuration key; applied to its replacement");
    }
    Ok(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_runs_the_threads_it_was_given() {
        let rt = build(3).expect("runtime");
        assert_eq!(rt.metrics().num_workers(), 3);
        let rt = build(1).expect("runtime");
        assert_eq!(rt.metrics().num_workers(), 1);
        let default = build(0).expect("runtime");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(default.metrics().num_workers(), cpus);
    }
}
