//! `herald-loadtest`: the command line of the load-test suite (see the crate docs and
//! docs/benchmarks.md).

use std::path::PathBuf;

use anyhow::{Context, Result};
use herald_client::token;
use herald_loadtest::{probe, report, scenarios, sends, Args};
use herald_shared::auth::Platform;
use serde_json::json;

const USAGE: &str = "usage: herald-loadtest COMMAND [--option value ...]

Scenarios (each shows progress, ends with the integrity check and writes
<out>/<scenario>.json, .md and SVG charts; exit status 1 when integrity fails):
  steady  [--conversations 500] [--rate 2000] [--duration 20] [--payload 100]
  fanout  [--receivers 2000] [--group 100 (<= 1000)] [--rate 2000] [--duration 20] [--payload 100]
  storm   [--devices 5000] [--backlog 200] [--group 50] [--realtime 100] [--rate 200] [--baseline 5]
          [--fresh false (true: devices never connected before, registered over HTTP)]
  chaos   --action SECONDS=COMMAND [--action ...] [--conversations 300] [--rate 2000] [--duration 20]
  idle    --gateway-pid PID [--connections 10000] [--group 500] [--connect-rate 2000] [--hold 10]
          [--local-ips 127.0.0.1,127.0.0.2 (connect from several loopback addresses)]
Common: [--gateways http://127.0.0.1:8080,http://127.0.0.1:8081] [--tenant bench]
        [--secret S | HERALD_JWT_SECRET] [--out loadtest-reports] [--local-ips ...]
  (--rate 0 sends as fast as acknowledgements come back)

Others:
  sends   [--conversations 200] [--senders 200] [--duration 20] [--payload 100] [--json FILE]
  probe   [--tenant probe] [--name canary] [--interval-ms 1000] [--loss-after-ms 30000]
          [--listen 127.0.0.1:9099] [--duration 0 = forever]
  report  --dir DIR --out docs/capacity-report.md [--machine TEXT]: the capacity report from
          the scenario reports in DIR, next to the targets of DESIGN.md section 6
  token   --user U --device D [--tenant acme] [--platform ios] [--secret S]";

const COMMON: &[&str] = &["gateways", "tenant", "secret", "out", "local-ips"];

fn options(args: &Args, own: &[&str]) -> Result<()> {
    let known: Vec<&str> = COMMON.iter().chain(own).copied().collect();
    args.check_known(&known)
}

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = match run(&argv).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn run(argv: &[String]) -> Result<i32> {
    let (cmd, args) = Args::parse(argv)?;
    let scenario = match cmd.as_str() {
        "steady" => {
            options(&args, &["conversations", "rate", "duration", "payload"])?;
            scenarios::steady(&args).await?
        }
        "fanout" => {
            options(&args, &["receivers", "group", "rate", "duration", "payload"])?;
            scenarios::fanout(&args).await?
        }
        "storm" => {
            options(&args, &["devices", "backlog", "group", "realtime", "rate", "baseline", "fresh"])?;
            scenarios::storm(&args).await?
        }
        "chaos" => {
            options(&args, &["action", "conversations", "rate", "duration", "payload"])?;
            scenarios::chaos(&args).await?
        }
        "idle" => {
            options(&args, &["gateway-pid", "connections", "group", "connect-rate", "hold"])?;
            scenarios::idle(&args).await?
        }
        "sends" => {
            options(&args, &["conversations", "senders", "duration", "payload", "json"])?;
            sends::sends(&args).await?;
            return Ok(0);
        }
        "probe" => {
            options(&args, &["name", "interval-ms", "loss-after-ms", "listen", "duration"])?;
            probe::probe(&args).await?;
            return Ok(0);
        }
        "report" => {
            args.check_known(&["dir", "out", "machine"])?;
            let dir = PathBuf::from(args.opt("dir").context("--dir is required")?);
            let out = PathBuf::from(args.text("out", "docs/capacity-report.md"));
            report::capacity(&dir, &out, &args.text("machine", "not recorded"))?;
            return Ok(0);
        }
        "token" => {
            let plat: Platform = serde_json::from_value(json!(args.text("platform", "ios"))).context("--platform")?;
            let user = args.opt("user").context("--user is required")?;
            let device = args.opt("device").context("--device is required")?;
            println!("{}", token(&args.secret()?, &args.text("tenant", "acme"), user, device, plat));
            return Ok(0);
        }
        _ => {
            eprintln!("{USAGE}");
            return Ok(2);
        }
    };
    report::write(&PathBuf::from(args.text("out", "loadtest-reports")), &scenario)?;
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
            "extra": scenario.extra,
        }))?
    );
    if scenario.integrity.is_clean() {
        Ok(0)
    } else {
        eprintln!("integrity check FAILED: {:?}", scenario.integrity);
        Ok(1)
    }
}
