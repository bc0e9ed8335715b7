//! `herald-worker [run | migrate | rebuild-projections [--dry-run] | check-config] [--config FILE]
//! [--set key=value ...]`; `--help` lists every option, `--version` names the build.

use std::process::ExitCode;

use herald_shared::config::cli::{
    check_config_report, help_requested, usage, version, version_requested, Command, CHECK_CONFIG,
};
use herald_shared::config::{load, ProcessEnv, Role};

/// mimalloc: glibc malloc took a fifth of the gateway's CPU under load (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ABOUT: &str = "commits sends to MySQL in batches, fans them out into Redis and runs the outbox.";

const COMMANDS: &[Command] = &[
    Command { usage: "run", about: "Own ingress shards, commit, fan out and dispatch the outbox (the default)." },
    Command { usage: "migrate", about: "Apply the MySQL schema, then exit." },
    Command {
        usage: "rebuild-projections [--dry-run]",
        about: "Recompute conversation positions from the messages and repair drift; --dry-run only reports it.",
    },
    CHECK_CONFIG,
];

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if help_requested(&argv) {
        print!("{}", usage("herald-worker", Role::Worker, ABOUT, COMMANDS));
        return ExitCode::SUCCESS;
    }
    if version_requested(&argv) {
        print!("{}", version("herald-worker"));
        return ExitCode::SUCCESS;
    }
    let (cfg, cli) = match load(Role::Worker, &argv, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.args.first().is_some_and(|a| a == "check-config") {
        print!("{}", check_config_report("herald-worker", Role::Worker, &cli));
        return ExitCode::SUCCESS;
    }
    let runtime = match herald_shared::runtime::start("herald-worker", &cfg, &cli) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let result = match cli.args.first().map(String::as_str) {
            None | Some("run") => herald_worker::run(cfg, herald_shared::telemetry::shutdown_signal()).await,
            Some("migrate") => herald_worker::migrate(&cfg).await.map(|()| tracing::info!("migrations applied")),
            Some("rebuild-projections") => {
                let dry_run = cli.args.iter().any(|a| a == "--dry-run");
                herald_worker::rebuild_projections(&cfg, dry_run).await.map(|_| ())
            }
            Some(other) => {
                eprintln!("unknown command {other:?}; expected `run`, `migrate`, `rebuild-projections [--dry-run]` or `check-config` (see herald-worker --help)");
                return ExitCode::from(2);
            }
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "worker failed");
                eprintln!("herald-worker: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
