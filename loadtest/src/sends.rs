//! `sends`: durable 1:1 sends over HTTP, closed loop, at full speed: throughput and
//! send-ack latency, with a progress line every second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use hdrhistogram::Histogram;
use herald_client::{token, HttpClient};
use herald_shared::auth::Platform;
use serde_json::json;

use crate::cli;

/// Durable 1:1 sends: `conversations` direct conversations between pairs of users;
/// `senders` concurrent devices each sending in a closed loop (next send after the
/// `200`), spread over the gateways.
pub async fn sends(args: &cli::Sends) -> Result<()> {
    let gateways = &args.gateways.urls;
    let tenant = &args.tenant;
    let cli::Sends { conversations, senders, payload, .. } = *args;
    ensure!(conversations > 0 && senders > 0, "--conversations and --senders must be at least 1");
    let duration = Duration::from_secs(args.duration);
    let secret = args.secret.get()?;
    let run = format!("{:x}", herald_shared::ids::now_ms());
    let http =
        args.gateways.tls()?.http().pool_max_idle_per_host(senders + 16).timeout(Duration::from_secs(30)).build()?;
    let client = |gw: usize, user: &str, dev: &str| {
        HttpClient::with_http(
            http.clone(),
            gateways[gw % gateways.len()].clone(),
            token(&secret, tenant, user, dev, Platform::Server),
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
                    Err(_) => {
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
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(())
}
