//! `herald-loadtest`: the command line of the load-test suite (see the crate docs,
//! docs/benchmarks.md and `herald-loadtest --help`).

use anyhow::Result;
use clap::Parser;
use herald_loadtest::cli::{Cli, Command};
use herald_loadtest::{probe, report, scenarios, sends};
use serde_json::json;

/// mimalloc: glibc malloc took a fifth of the gateway's CPU under load (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn run(command: Command) -> Result<i32> {
    let (scenario, out) = match command {
        Command::Steady(a) => (scenarios::steady(&a).await?, a.target.out),
        Command::Fanout(a) => (scenarios::fanout(&a).await?, a.target.out),
        Command::Typing(a) => (scenarios::typing(&a).await?, a.target.out),
        Command::Storm(a) => (scenarios::storm(&a).await?, a.target.out),
        Command::Chaos(a) => (scenarios::chaos(&a).await?, a.target.out),
        Command::Failover(a) => (scenarios::failover(&a).await?, a.target.out),
        Command::Idle(a) => (scenarios::idle(&a).await?, a.target.out),
        Command::Soak(a) => (scenarios::soak(&a).await?, a.target.out),
        Command::Sends(a) => {
            sends::sends(&a).await?;
            return Ok(0);
        }
        Command::Probe(a) => {
            probe::probe(&a).await?;
            return Ok(0);
        }
        Command::Report(a) => {
            report::capacity(&a.dir, &a.out, &a.machine)?;
            return Ok(0);
        }
        Command::ServiceToken(a) => {
            println!("{}", a.mint()?);
            return Ok(0);
        }
        Command::Token(a) => {
            let now = herald_shared::ids::now_ms() / 1000;
            let claims = herald_shared::auth::Claims {
                tid: a.tenant.clone(),
                sub: a.user.clone(),
                dev: a.device.clone(),
                plat: a.platform,
                exp: now + a.ttl_s,
                iat: Some(now),
            };
            let secret = a.secret.get()?;
            println!("{}", herald_shared::auth::sign_typed("JWT", a.kid.as_deref(), &claims, secret.as_bytes()));
            return Ok(0);
        }
    };
    report::write(&out, &scenario)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "scenario": scenario.scenario,
            "sends_per_s": scenario.sends_per_s,
            "send_ack_ms": scenario.send_ack_ms,
            "deliveries_per_s": scenario.deliveries_per_s,
            "delivery_realtime_ms": scenario.delivery_realtime_ms,
            "delivery_backlog_ms": scenario.delivery_backlog_ms,
            "integrity": scenario.integrity,
            "cpu_us_per_message": scenario.cpu.as_ref().map(|c| &c.us_per_message),
            "offered_per_s": scenario.load.as_ref().and_then(|l| l.offered_per_s),
            "send_lag_ms": scenario.load.as_ref().map(|l| &l.send_lag_ms),
            "verdict": scenario.load.as_ref().map(|l| &l.verdict),
            "extra": without_samples(&scenario.extra),
        }))?
    );
    let mut code = 0;
    if !scenario.integrity.is_clean() {
        eprintln!("integrity check FAILED: {:?}", scenario.integrity);
        code = 1;
    }
    if scenario.extra["soak"]["bounded"] == false {
        eprintln!("bounded-state check FAILED: {} keep growing", scenario.extra["soak"]["growing"]);
        code = 1;
    }
    Ok(code)
}

/// The scenario's details for the terminal: a soak's samples and series stay in its report.
fn without_samples(extra: &serde_json::Value) -> serde_json::Value {
    let mut extra = extra.clone();
    if let Some(soak) = extra.get_mut("soak").and_then(|s| s.as_object_mut()) {
        soak.remove("samples");
        soak.remove("series");
    }
    extra
}
