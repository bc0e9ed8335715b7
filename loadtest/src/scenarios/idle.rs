//! `idle`: memory per idle connection on one gateway, and that idle sessions still deliver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures::future::join_all;
use serde_json::json;

use super::{groups, receivers, report, Finished, MAX_GROUP};
use crate::cli;
use crate::engine::{self, AckLog, Recorder, Target};
use crate::report::ScenarioReport;

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("no process {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()))
        .context("VmRSS missing")
}

/// `idle`: `--connections` idle sessions on one gateway (`--gateway-pid` is measured),
/// held for `--hold` seconds; then one message into every group of `--group` checks
/// that every idle session still delivers.
pub async fn idle(args: &cli::Idle) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let cli::Idle { connections: n, gateway_pid: pid, group: size, connect_rate: rate, .. } = *args;
    ensure!(args.hold >= 0.0, "--hold must be >= 0");
    let hold = Duration::from_secs_f64(args.hold);
    ensure!(pid > 0, "--gateway-pid is required (the gateway whose memory is measured)");
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(rate > 0.0, "--connect-rate must be > 0");
    let target = Target { gateways: vec![target.gateways[0].clone()], ..target };
    let params = json!({"connections": n, "group": size, "connect_rate": rate, "hold_s": hold.as_secs_f64(), "local_ips": target.local_ips.len()});

    let convs = groups(&target, "i", n, size);
    engine::provision(&target, &convs, "group").await?;
    let users = receivers(&convs);
    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor("idle", Duration::from_secs(1), monitor_stop.clone());
    let before = rss_kib(pid)?;
    let open_start = Instant::now();
    let mut devices = Vec::with_capacity(n);
    for (i, u) in users.iter().enumerate() {
        devices.push((u.clone(), target.device(i, u, &rec)));
        tokio::time::sleep_until((open_start + Duration::from_secs_f64((i + 1) as f64 / rate)).into()).await;
    }
    // However slowly the sessions come up, they must keep coming.
    let (mut up, mut progress) = (0, Instant::now());
    while up < n as u64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rec.caught_up.load(Ordering::Relaxed);
        if now > up {
            (up, progress) = (now, Instant::now());
        }
        ensure!(progress.elapsed() < Duration::from_secs(30), "only {up} of {n} sessions came up (none for 30 s)");
    }
    let open_s = open_start.elapsed().as_secs_f64();
    rec.note(format!("{n} idle sessions open in {open_s:.1} s; holding for {hold:?}"));
    tokio::time::sleep(hold).await;
    let after = rss_kib(pid)?;
    let online = rec.online.load(Ordering::Relaxed);
    let sessions_before = rec.caught_up.load(Ordering::Relaxed);

    rec.note("one message into every group");
    let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
    let send_start = Instant::now();
    let sends = convs.iter().enumerate().map(|(k, c)| {
        let clients = vec![target.http_as(k, &c.sender, "s")];
        let (acked, rec) = (acked.clone(), rec.clone());
        async move {
            let t = Instant::now();
            let r = engine::send_durably(
                &clients,
                0,
                "idle-check",
                &c.id,
                &json!({"t0": engine::micros_now()}),
                Duration::from_secs(60),
            )
            .await?;
            rec.send_acked(t.elapsed());
            acked.lock().expect("log").push(crate::integrity::Acked::of(&r, &c.sender, "s", "idle-check".into()));
            Ok::<_, herald_client::ClientError>(())
        }
    });
    for r in join_all(sends).await {
        r?;
    }
    let settle = engine::settle(&rec, n, Duration::from_secs(2), Duration::from_secs(60)).await;
    let send_window = send_start.elapsed().as_secs_f64();
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let reconnects = rec.caught_up.load(Ordering::Relaxed) - sessions_before;
    let (integrity, logs) = engine::finish(devices, &convs, &acked).await;
    let per = after.saturating_sub(before) as f64 / n.max(1) as f64;
    eprintln!("{n} idle connections: gateway RSS {before} -> {after} KiB, {per:.1} KiB per connection");
    let extra = json!({
        "connections": n,
        "online_after_hold": online,
        "sessions_lost_during_hold": reconnects,
        "open_s": open_s,
        "gateway_rss_kib_before": before,
        "gateway_rss_kib_after": after,
        "rss_kib_per_connection": per,
        "settle_s": settle.as_secs_f64(),
    });
    let delivered = rec.delivered.load(Ordering::Relaxed);
    Ok(report(
        "idle",
        params,
        &rec,
        send_window,
        delivered,
        &Finished { integrity, logs, cpu: None, load: None },
        extra,
    ))
}
