//! `herald-gateway [--config FILE] [--set key=value ...]`

use std::process::ExitCode;

use herald_shared::config::{load, ProcessEnv, Role};

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (cfg, cli) = match load(Role::Gateway, &argv, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(extra) = cli.args.first() {
        eprintln!("herald-gateway takes no command, got {extra:?}");
        return ExitCode::from(2);
    }
    herald_shared::telemetry::init_tracing(&cfg.log);
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
