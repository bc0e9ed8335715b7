//! `herald-gateway [--config FILE] [--set key=value ...]`; `--help` lists every option.

use std::process::ExitCode;

use herald_shared::config::cli::{help_requested, usage};
use herald_shared::config::{load, ProcessEnv, Role};

/// mimalloc: glibc malloc took a fifth of the gateway's CPU under load (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ABOUT: &str = "serves clients over HTTP and WebSocket: sends, sessions, backlog and pushes.";

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if help_requested(&argv) {
        print!("{}", usage("herald-gateway", Role::Gateway, ABOUT, &[]));
        return ExitCode::SUCCESS;
    }
    let (cfg, cli) = match load(Role::Gateway, &argv, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(extra) = cli.args.first() {
        eprintln!("herald-gateway takes no command, got {extra:?} (see herald-gateway --help)");
        return ExitCode::from(2);
    }
    herald_shared::telemetry::init_tracing(&cfg.log, cfg.log_format);
    for var in &cli.ignored_env {
        tracing::warn!(variable = %var, "environment variable names no configuration key; ignored");
    }
    for old in &cli.deprecated {
        tracing::warn!(key = %old.given, replacement = old.replacement, "deprecated configuration key; applied to its replacement");
    }
    match herald_gateway::run(cfg, herald_shared::telemetry::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
