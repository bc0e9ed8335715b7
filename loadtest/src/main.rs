//! `herald-loadtest`: measures Herald from the outside, through its public API.
//!
//! Commands:
//! - `token --user U --device D [--tenant T] [--platform P]`: prints a client token
//!   (secret from `HERALD_JWT_SECRET` or `--secret`).
//! - `sends [options]`: durable sends over HTTP, closed loop; prints throughput and
//!   send-ack latency percentiles, with a progress line every second.
//! - `deliver [options]`: receivers on WebSocket acking every message, senders into
//!   groups; deliveries+acks per second, delivery latency (send to receipt), then a
//!   backlog phase (all receivers offline, then reconnecting at once): drain time.
//! - `idle --gateway-pid PID [--connections N]`: idle WebSocket sessions and the
//!   gateway's resident memory per connection.
//! - `probe [--listen 127.0.0.1:9099] [--interval-ms 1000] [--duration S]`: the canary
//!   between two probe accounts, with `herald_probe_*` metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use herald_shared::auth::Platform;
use herald_shared::client::{token, ClientError, HttpClient};
use serde_json::json;

mod integrity;
mod probe;
mod scenarios;

pub struct Args(HashMap<String, String>);

impl Args {
    fn parse(argv: &[String]) -> Result<(String, Args)> {
        let mut it = argv.iter();
        let cmd = it.next().cloned().unwrap_or_default();
        let mut map = HashMap::new();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else { bail!("unexpected argument {a:?}") };
            let value = it.next().with_context(|| format!("--{name} needs a value"))?;
            map.insert(name.to_string(), value.clone());
        }
        Ok((cmd, Args(map)))
    }

    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| anyhow::anyhow!("--{name}: cannot parse {v:?}")),
        }
    }

    pub fn text(&self, name: &str, default: &str) -> String {
        self.0.get(name).cloned().unwrap_or_else(|| default.to_string())
    }

    pub fn secret(&self) -> Result<String> {
        self.0
            .get("secret")
            .cloned()
            .or_else(|| std::env::var("HERALD_JWT_SECRET").ok())
            .context("--secret or HERALD_JWT_SECRET is required")
    }
}

const USAGE: &str = "usage:
  herald-loadtest token --user U --device D [--tenant acme] [--platform ios] [--secret S]
  herald-loadtest sends [--gateways http://127.0.0.1:8080,...] [--tenant bench] [--conversations 200]
                        [--senders 200] [--duration 20] [--payload 100] [--secret S] [--json FILE]
  herald-loadtest deliver [--gateways ...] [--receivers 1000] [--group 10] [--duration 20] [--backlog 50] [--json FILE]
  herald-loadtest idle --gateway-pid PID [--gateways ...] [--connections 10000] [--json FILE]
  herald-loadtest probe [--gateways ...] [--tenant probe] [--name canary] [--interval-ms 1000]
                        [--loss-after-ms 30000] [--listen 127.0.0.1:9099] [--duration 0 = forever]";

#[tokio::main]
async fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, args) = Args::parse(&argv)?;
    match cmd.as_str() {
        "token" => {
            let plat: Platform = serde_json::from_value(json!(args.text("platform", "ios"))).context("--platform")?;
            let user = args.0.get("user").context("--user is required")?;
            let device = args.0.get("device").context("--device is required")?;
            println!("{}", token(&args.secret()?, &args.text("tenant", "acme"), user, device, plat));
            Ok(())
        }
        "sends" => sends(&args).await,
        "deliver" => scenarios::deliver(&args).await,
        "idle" => scenarios::idle(&args).await,
        "probe" => probe::probe(&args).await,
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Durable 1:1 sends: `conversations` direct conversations between pairs of users;
/// `senders` concurrent devices each sending in a closed loop (next send after the
/// `200`), spread over the gateways.
async fn sends(args: &Args) -> Result<()> {
    let gateways: Vec<String> = args.text("gateways", "http://127.0.0.1:8080").split(',').map(str::to_owned).collect();
    let tenant = args.text("tenant", "bench");
    let conversations: usize = args.get("conversations", 200)?;
    let senders: usize = args.get("senders", 200)?;
    let duration = Duration::from_secs(args.get("duration", 20)?);
    let payload: usize = args.get("payload", 100)?;
    let secret = args.secret()?;
    let run = format!("{:x}", herald_shared::ids::now_ms());
    let http =
        reqwest::Client::builder().pool_max_idle_per_host(senders + 16).timeout(Duration::from_secs(30)).build()?;
    let client = |gw: usize, user: &str, dev: &str| {
        HttpClient::with_http(
            http.clone(),
            gateways[gw % gateways.len()].clone(),
            token(&secret, &tenant, user, dev, Platform::Server),
        )
    };

    eprintln!("provisioning {conversations} direct conversations ({} users) ...", conversations * 2);
    for k in 0..conversations {
        let (a, b) = (format!("{run}-a{k}"), format!("{run}-b{k}"));
        client(k, &a, "d").create_conversation(Some(&format!("{run}-c{k}")), "direct", &[&a, &b]).await?;
        client(k, &b, "d").register_device().await?;
    }

    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let body = json!({ "text": "x".repeat(payload.saturating_sub(12)) });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..senders {
        let k = s % conversations;
        let c = client(s, &format!("{run}-a{k}"), &format!("s{s}"));
        let conv = format!("{run}-c{k}");
        let (hist, done, errors, stop, body) = (hist.clone(), done.clone(), errors.clone(), stop.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                match c.send(&format!("s{s}-{n}"), &conv, &body).await {
                    Ok(_) => {
                        let _ = local.record(t.elapsed().as_micros() as u64);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(ClientError::Api { .. }) | Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                n += 1;
            }
            hist.lock().expect("histogram").add(&local).expect("same bounds");
        }));
    }
    let mut last = 0;
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = done.load(Ordering::Relaxed);
        eprintln!(
            "[{:>4.0}s] {:>7} msg/s  total {:>8}  errors {}",
            started.elapsed().as_secs_f64(),
            now - last,
            now,
            errors.load(Ordering::Relaxed)
        );
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let h = hist.lock().expect("histogram");
    let total = done.load(Ordering::Relaxed);
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let summary = json!({
        "scenario": "sends",
        "gateways": gateways.len(),
        "conversations": conversations,
        "senders": senders,
        "payload_bytes": payload,
        "duration_s": elapsed,
        "acknowledged": total,
        "errors": errors.load(Ordering::Relaxed),
        "throughput_msg_s": total as f64 / elapsed,
        "send_ack_ms": { "p50": ms(0.5), "p95": ms(0.95), "p99": ms(0.99), "max": h.max() as f64 / 1000.0 },
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if let Some(path) = args.0.get("json") {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(())
}
