//! `herald-gateway [check-config] [--config FILE] [--set key=value ...]`; `--help` lists
//! every option, `--version` names the build.

use std::process::ExitCode;

use herald_shared::config::cli::{
    check_config_report, help_requested, usage, version, version_requested, Command, CHECK_CONFIG,
};
use herald_shared::config::{load, ProcessEnv, Role};

/// mimalloc: glibc malloc took a fifth of the gateway's CPU under load (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const COMMANDS: &[Command] = &[Command { usage: "run", about: "Serve clients (the default)." }, CHECK_CONFIG];

const ABOUT: &str = "serves clients over HTTP and WebSocket: sends, sessions, backlog and pushes.";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if help_requested(&argv) {
        print!("{}", usage("herald-gateway", Role::Gateway, ABOUT, COMMANDS));
        return ExitCode::SUCCESS;
    }
    if version_requested(&argv) {
        print!("{}", version("herald-gateway"));
        return ExitCode::SUCCESS;
    }
    let (cfg, cli) = match load(Role::Gateway, &argv, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    match cli.args.first().map(String::as_str) {
        None | Some("run") => {}
        Some("check-config") => {
            print!("{}", check_config_report("herald-gateway", Role::Gateway, &cli));
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("unknown command {other:?}; expected `run` or `check-config` (see herald-gateway --help)");
            return ExitCode::from(2);
        }
    }
    let runtime = match herald_shared::runtime::start("herald-gateway", &cfg, &cli) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        match herald_gateway::run(cfg, herald_shared::telemetry::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("herald-gateway: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
