//! `storm`: a reconnect storm with backlog while realtime traffic continues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use futures::future::join_all;
use herald_client::device::Device;
use serde_json::json;

use super::{connect, groups, pairs, receivers, report, Finished, Window, MAX_GROUP};
use crate::cli;
use crate::cpu::CpuMeter;
use crate::engine::{self, AckLog, Recorder, SendPlan, Target};
use crate::report::ScenarioReport;
use crate::senders;

/// `storm`: `--devices` devices (in groups of `--group`) each get `--backlog`
/// messages while offline, then all reconnect at once while `--realtime` direct
/// conversations keep receiving `--rate` messages per second. The devices were online
/// once before; `--fresh true` registers them over HTTP instead, so their first session
/// also restores its pending set from MySQL.
pub async fn storm(args: &cli::Storm) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let cli::Storm { devices: n, backlog, group: size, realtime: rt_pairs, rate, fresh, .. } = *args;
    ensure!(args.baseline >= 0.0, "--baseline must be >= 0");
    let baseline = Duration::from_secs_f64(args.baseline);
    // The senders' first requests open connections and meet the cluster's cold paths,
    // which a storm does not: a run's first second once set a baseline p99 of 147 ms
    // where the rest was 4 - 10 ms, and the storm's ratio to it read 1.6x.
    ensure!(args.warm_up >= 0.0, "--warm-up must be >= 0");
    let warm_up = Duration::from_secs_f64(args.warm_up);
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(n > 0 && backlog > 0 && rt_pairs > 0, "--devices, --backlog and --realtime must be at least 1");
    let params = json!({"devices": n, "backlog": backlog, "group": size, "realtime_conversations": rt_pairs, "realtime_rate": rate, "fresh_devices": fresh, "gateways": target.gateways.len()});

    let meter = CpuMeter::new(&args.target.measure).await?;
    let storm_convs = groups(&target, "st", n, size);
    let rt_convs = pairs(&target, rt_pairs);
    engine::provision(&target, &rt_convs, "direct").await?;
    engine::provision(&target, &storm_convs, "group").await?;
    let storm_users = receivers(&storm_convs);

    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor("storm", Duration::from_millis(250), monitor_stop.clone());
    if fresh {
        engine::register(&target, &storm_users).await?;
    } else {
        // Devices that were online before, as after a gateway restart or a network outage.
        rec.note(format!("{n} devices come online once, then go offline"));
        for (_, d) in connect(&target, &storm_users, &rec, rt_pairs).await? {
            d.stop().await;
        }
    }
    let rt_users = receivers(&rt_convs);
    let mut devices = connect(&target, &rt_users, &rec, 0).await?;
    let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Window::open(&meter, &rec).await;
    let send_start = Instant::now();
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let plan = SendPlan { rate, payload: 100, cmid_prefix: "rt".into(), change_every: 0 };
    let senders = senders::spawn_http(&target, &rt_convs, &plan, &rec, &acked, &stop);
    let sending_from = rec.elapsed().as_secs_f64();
    rec.note(format!("realtime warm-up for {warm_up:?}"));
    tokio::time::sleep(warm_up).await;
    let base_from = rec.elapsed().as_secs_f64();
    rec.note(format!("realtime baseline for {baseline:?}"));
    tokio::time::sleep(baseline).await;
    let base_to = rec.elapsed().as_secs_f64();

    rec.note(format!(
        "queueing {backlog} messages into each of {} groups ({} deliveries)",
        storm_convs.len(),
        n * backlog
    ));
    let fill = storm_convs.iter().enumerate().map(|(k, c)| {
        let clients: Vec<_> = (0..target.gateways.len()).map(|g| target.http_as(g, &c.sender, "s")).collect();
        let (acked, rec) = (acked.clone(), rec.clone());
        async move {
            for m in 0..backlog {
                let cmid = format!("bl{m}");
                let body = json!({"t0": engine::micros_now()});
                let t = Instant::now();
                match engine::send_durably(&clients, k, &cmid, &c.id, &body, Duration::from_secs(120)).await {
                    Ok(r) => {
                        rec.send_acked(t.elapsed());
                        acked.lock().expect("log").push(crate::integrity::Acked::of(&r, &c.sender, "s", cmid));
                    }
                    Err(e) => bail!("queueing backlog into {}: {e}", c.id),
                }
            }
            Ok(())
        }
    });
    for r in join_all(fill).await {
        r?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let expected = (n * backlog) as u64;
    let before = rec.backlog_delivered.load(Ordering::Relaxed);
    let storm_from = rec.elapsed().as_secs_f64();
    rec.note(format!("storm: {n} devices reconnect at once"));
    let storm_start = Instant::now();
    let caught_before = rec.caught_up.load(Ordering::Relaxed);
    let storm_devices: Vec<(String, Device)> =
        storm_users.iter().enumerate().map(|(i, u)| (u.clone(), target.device(rt_pairs + i, u, &rec))).collect();
    while rec.caught_up.load(Ordering::Relaxed) < caught_before + n as u64
        && storm_start.elapsed() < Duration::from_secs(600)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = storm_start.elapsed().as_secs_f64();
    let drained = rec.backlog_delivered.load(Ordering::Relaxed) - before;
    rec.note(format!("backlog drained in {drain:.2} s ({drained} of {expected} delivered)"));
    let storm_to = rec.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    join_all(senders).await;
    let send_window = send_start.elapsed().as_secs_f64();
    let delivered_in_window = rec.delivered.load(Ordering::Relaxed) - delivered_before;
    let cpu = window.close(&meter, &rec).await;
    devices.extend(storm_devices);
    let settle = engine::settle(&rec, rt_pairs + n, Duration::from_secs(2), Duration::from_secs(120)).await;
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let mut convs = rt_convs;
    convs.extend(storm_convs);
    let (integrity, logs) = engine::finish(devices, &convs, &acked).await;
    let (base_p99, storm_p99) =
        (rec.realtime_p99_between(base_from, base_to), rec.realtime_p99_between(storm_from, storm_to));
    let extra = json!({
        "backlog_deliveries": expected,
        "drained": drained,
        "drain_s": drain,
        "drain_rate_msg_s": drained as f64 / drain.max(1e-9),
        "storm_from_s": storm_from,
        "storm_to_s": storm_to,
        "realtime_from_s": sending_from,
        "realtime_baseline_from_s": base_from,
        "realtime_p99_baseline_ms": base_p99,
        "realtime_p99_during_storm_ms": storm_p99,
        "realtime_p99_ratio": if base_p99 > 0.0 { storm_p99 / base_p99 } else { 0.0 },
        "settle_s": settle.as_secs_f64(),
    });
    Ok(report(
        "storm",
        params,
        &rec,
        send_window,
        delivered_in_window,
        &Finished { integrity, logs, cpu: Some(cpu), load: None },
        extra,
    ))
}
