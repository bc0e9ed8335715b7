//! `failover`: a reconnect storm after a gateway dies. Every device holds its session on
//! the first gateway, which is killed under traffic and not restarted; the devices move
//! to the others with their jittered backoff and must catch up with nothing lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::future::join_all;
use herald_client::device::{Device, DeviceSpec};
use serde_json::json;

use super::reconnects::Reconnects;
use super::{groups, receivers, report, Finished, Window, MAX_GROUP};
use crate::cli;
use crate::cpu::CpuMeter;
use crate::engine::{self, AckLog, Recorder, SendPlan, Target};
use crate::report::ScenarioReport;
use crate::senders;

/// `failover`: `--devices` devices (in groups of `--group`) connect to the first of
/// `--gateways` and receive `--rate` messages per second, sent over HTTP through the
/// other gateways; after `--baseline` seconds `--kill` kills the first gateway. Reported:
/// the time from the kill until every device had a session again and until every one
/// had caught up, the reconnect rate, realtime latency before and during the storm, and
/// the integrity check over every message, those committed during the storm included.
pub async fn failover(args: &cli::Failover) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let cli::Failover { devices: n, group: size, rate, connect_rate, .. } = *args;
    ensure!(target.gateways.len() >= 2, "failover needs two or more --gateways: the first is killed");
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(n > 0 && rate > 0.0, "--devices and --rate must be positive");
    ensure!(
        args.baseline >= 0.0 && args.after >= 0.0 && args.limit > 0.0,
        "--baseline, --after and --limit are seconds"
    );
    let params = json!({"devices": n, "group": size, "rate": rate, "baseline_s": args.baseline, "kill": args.kill, "gateways": target.gateways.len()});

    let meter = CpuMeter::new(&args.target.measure).await?;
    let convs = groups(&target, "fo", n, size);
    engine::provision(&target, &convs, "group").await?;
    let users = receivers(&convs);
    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor("failover", Duration::from_millis(250), monitor_stop.clone());
    let board = Reconnects::new(n);
    rec.note(format!("{n} devices connect to {}", target.gateways[0]));
    let limit = Duration::from_secs_f64(args.limit);
    let devices = connect_to_first(&target, &users, &rec, &board, connect_rate, limit).await?;

    // The senders use the other gateways only: the storm is the devices', not theirs.
    let survivors = Target { gateways: target.gateways[1..].to_vec(), ..target.clone() };
    let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Window::open(&meter, &rec).await;
    let send_start = Instant::now();
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let plan = SendPlan { rate, payload: 100, cmid_prefix: "fo".into(), change_every: 0 };
    let senders = senders::spawn_http(&survivors, &convs, &plan, &rec, &acked, &stop);
    let base_from = rec.elapsed().as_secs_f64();
    rec.note(format!("baseline for {:.1} s", args.baseline));
    tokio::time::sleep(Duration::from_secs_f64(args.baseline)).await;

    let storm_from = rec.elapsed().as_secs_f64();
    rec.note(format!("kill: {}", args.kill));
    let killed = board.kill_now();
    let out = tokio::process::Command::new("sh").arg("-c").arg(&args.kill).output().await;
    let kill_status = match &out {
        Ok(o) if o.status.success() => "ok".to_string(),
        Ok(o) => format!("exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("could not run: {e}"),
    };
    let kill_took = killed.elapsed().as_secs_f64();
    rec.note(format!("kill command: {kill_status} after {kill_took:.2} s"));
    let mut all_online_noted = false;
    while board.caught_up() < n && killed.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if !all_online_noted && board.online() == n {
            all_online_noted = true;
            rec.note(format!("all {n} devices have a session again"));
        }
    }
    let storm_to = rec.elapsed().as_secs_f64();
    let summary = board.summary();
    let secs = |v: Option<f64>| v.map_or("not reached".into(), |s| format!("{s:.2} s"));
    rec.note(format!(
        "{} of {n} devices back, {} caught up: all back after {}, all caught up after {}",
        board.online(),
        board.caught_up(),
        secs(summary.all_online_s),
        secs(summary.all_caught_up_s)
    ));
    tokio::time::sleep(Duration::from_secs_f64(args.after)).await;
    let after_to = rec.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    join_all(senders).await;
    let send_window = send_start.elapsed().as_secs_f64();
    let delivered_in_window = rec.delivered.load(Ordering::Relaxed) - delivered_before;
    let cpu = window.close(&meter, &rec).await;
    let settle = engine::settle(&rec, n, Duration::from_secs(2), Duration::from_secs(120)).await;
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let (integrity, logs) = engine::finish(devices, &convs, &acked).await;
    let sessions: u32 = logs.iter().map(|(_, l)| l.sessions).sum();
    let p99 = |from, to| rec.realtime_p99_between(from, to);
    let (base_p99, storm_p99) = (p99(base_from, storm_from), p99(storm_from, storm_to));
    let extra = json!({
        "devices": n,
        "kill_status": kill_status,
        "kill_took_s": kill_took,
        "reconnected": board.online(),
        "caught_up": board.caught_up(),
        "first_reconnect_s": summary.first_online_s,
        "reconnect_all_s": summary.all_online_s,
        "catch_up_all_s": summary.all_caught_up_s,
        "reconnect_rate_per_s": summary.all_online_s.map(|s| n as f64 / s.max(1e-9)),
        "reconnect_peak_per_s": summary.peak_sessions_per_s,
        "reconnect_p50_s": summary.online.p50 / 1e3,
        "reconnect_p99_s": summary.online.p99 / 1e3,
        "caught_up_p50_s": summary.caught_up.p50 / 1e3,
        "caught_up_p99_s": summary.caught_up.p99 / 1e3,
        "sessions": sessions,
        "storm_from_s": storm_from,
        "storm_to_s": storm_to,
        "realtime_p99_baseline_ms": base_p99,
        "realtime_p99_during_storm_ms": storm_p99,
        "realtime_p99_after_ms": p99(storm_to, after_to),
        "settle_s": settle.as_secs_f64(),
    });
    let done = Finished { integrity, logs, cpu: Some(cpu), load: None };
    Ok(report("failover", params, &rec, send_window, delivered_in_window, &done, extra))
}

/// Starts one device per user on the first gateway, `rate` per second (0: all at once),
/// and waits until every one has caught up, at most `limit` after the last started (the
/// first session of a never-seen device registers it, which is slower than a reconnect).
async fn connect_to_first(
    target: &Target,
    users: &[String],
    rec: &Arc<Recorder>,
    board: &Arc<Reconnects>,
    rate: f64,
    limit: Duration,
) -> Result<Vec<(String, Device)>> {
    let started = Instant::now();
    let mut devices = Vec::with_capacity(users.len());
    for (i, u) in users.iter().enumerate() {
        if rate > 0.0 {
            tokio::time::sleep_until((started + Duration::from_secs_f64(i as f64 / rate)).into()).await;
        }
        let spec = DeviceSpec { first_gateway: 0, ..target.device_spec(i, u, "d") };
        devices.push((u.clone(), Device::spawn(spec, board.observer(i, rec))));
    }
    let limit = started.elapsed() + limit;
    while rec.caught_up.load(Ordering::Relaxed) < users.len() as u64 {
        ensure!(
            started.elapsed() < limit,
            "only {} of {} devices caught up on the first gateway",
            rec.caught_up.load(Ordering::Relaxed),
            users.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{} devices online on the first gateway in {:.1} s", users.len(), started.elapsed().as_secs_f64());
    Ok(devices)
}
