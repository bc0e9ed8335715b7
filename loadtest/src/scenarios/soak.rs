//! `soak`: `steady` for a long while with devices leaving for good, joining and
//! reconnecting, while what Herald keeps is sampled (Redis memory and keys, MySQL rows,
//! the processes' memory); it fails when any of that keeps growing after the warm-up
//! (the slope test, [`crate::slope`]) as well as when the integrity check fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::future::join_all;
use serde_json::json;

use super::churn::Fleet;
use super::{load_report, pairs, receivers, report, Finished, Offer, Window};
use crate::cli::{self, SendVia};
use crate::cpu::CpuMeter;
use crate::engine::{self, AckLog, Recorder, SendPlan, Target};
use crate::report::ScenarioReport;
use crate::sampler::Sampler;
use crate::senders;
use crate::soak_report::{self, Limits};

/// A gap a device sees is synced 5 s after it opened (the client's `gap_sync_after`):
/// this long without deliveries or `history` answers means no gap is left to fill.
const QUIET: Duration = Duration::from_secs(7);

fn validate(a: &cli::Soak) -> Result<()> {
    ensure!(a.conversations > 0, "--conversations must be at least 1");
    ensure!(a.rate > 0.0, "--rate must be > 0 (a soak sends at a steady rate)");
    for (name, v) in [("--duration", a.duration), ("--churn-every", a.churn_every), ("--sample-every", a.sample_every)]
    {
        ensure!(v > 0.0, "{name} must be > 0");
    }
    for (name, pct) in [("--leave-pct", a.leave_pct), ("--join-pct", a.join_pct), ("--reconnect-pct", a.reconnect_pct)]
    {
        ensure!((0.0..=100.0).contains(&pct), "{name} must be 0..=100");
    }
    ensure!(a.leave_pct + a.reconnect_pct <= 100.0, "--leave-pct and --reconnect-pct add up to more than 100");
    ensure!((0.0..a.duration).contains(&a.warmup_s()), "--warmup must be below --duration");
    ensure!(a.max_growth >= 0.0 && a.floor_count >= 0.0 && a.floor_mib >= 0.0, "growth limits must be >= 0");
    Ok(())
}

/// `soak`: `--conversations` direct conversations at `--rate` msg/s for `--duration`
/// seconds; every `--churn-every` seconds some devices leave for good, new ones join and
/// some reconnect; every `--sample-every` seconds Redis, MySQL and the `--admin`
/// processes are sampled, and after `--warmup` every kept series must stay flat.
pub async fn soak(args: &cli::Soak) -> Result<ScenarioReport> {
    validate(args)?;
    let target = Target::from_args(&args.target)?;
    let n = args.conversations;
    let warmup = args.warmup_s();
    let per_churn = |pct: f64| if pct > 0.0 { ((n as f64 * pct / 100.0).round() as usize).max(1) } else { 0 };
    let (leave, join, reconnect) = (per_churn(args.leave_pct), per_churn(args.join_pct), per_churn(args.reconnect_pct));
    let params = json!({
        "conversations": n, "rate": args.rate, "duration_s": args.duration, "payload_bytes": args.payload,
        "gateways": target.gateways.len(), "churn_every_s": args.churn_every,
        "per_churn": {"leave": leave, "join": join, "reconnect": reconnect},
        "sample_every_s": args.sample_every, "warmup_s": warmup, "max_growth": args.max_growth,
        "floor_count": args.floor_count, "floor_mib": args.floor_mib, "exempt": args.exempt,
        "redis_prefix": args.redis_prefix, "processes": args.admins().iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
    });
    let sampler = Sampler::connect(args.redis_url(), &args.redis_prefix, &args.mysql_url, args.admins()).await?;
    let measure = cli::Measure { redis_url: Some(args.redis_url().to_owned()), ..args.target.measure.clone() };
    let meter = CpuMeter::new(&measure).await?;

    let convs = pairs(&target, n);
    engine::provision(&target, &convs, "direct").await?;
    let users = receivers(&convs);
    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor("soak", Duration::from_secs(1), monitor_stop.clone());
    eprintln!("connecting {} devices ...", users.len());
    let mut fleet = Fleet::start(&target, &rec, &users).await?;
    let duration = Duration::from_secs_f64(args.duration);
    rec.note(format!(
        "{n} devices online; sending {} msg/s for {duration:?}; every {} s {leave} leave, {join} join, {reconnect} reconnect",
        args.rate, args.churn_every
    ));

    let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Window::open(&meter, &rec).await;
    let send_start = Instant::now();
    let (sampling_stop, stopped) = tokio::sync::watch::channel(false);
    let sampling = tokio::spawn(sampler.run(Duration::from_secs_f64(args.sample_every), send_start, stopped));
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let plan = SendPlan { rate: args.rate, payload: args.payload, cmid_prefix: "m".into(), change_every: 0 };
    let senders = senders::spawn_http(&target, &convs, &plan, &rec, &acked, &stop);
    let (every, end) = (Duration::from_secs_f64(args.churn_every), send_start + duration);
    let mut next = send_start + every;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        fleet.churn(leave, join, reconnect).await;
        let c = fleet.churned;
        eprintln!(
            "[{:>6.1}s] churn {}: {} devices live; {} left, {} joined, {} reconnected so far",
            rec.elapsed().as_secs_f64(),
            c.churns,
            fleet.live(),
            c.left,
            c.joined,
            c.reconnected
        );
        next += every;
    }
    tokio::time::sleep_until(end.into()).await;
    let _ = sampling_stop.send(true);
    stop.store(true, Ordering::Relaxed);
    rec.note("sending stopped; offline devices come back; waiting for deliveries and syncs to settle");
    join_all(senders).await;
    let send_window = send_start.elapsed().as_secs_f64();
    let delivered_in_window = rec.delivered.load(Ordering::Relaxed) - delivered_before;
    let cpu = window.close(&meter, &rec).await;
    let offer = Offer { via: SendVia::Http, senders: n, in_flight: 1, rate: Some(args.rate) };
    let load = load_report(&rec, offer, rec.sends.load(Ordering::Relaxed) as f64 / send_window.max(1e-9), &cpu);
    fleet.bring_back();
    let settle = engine::settle(&rec, fleet.live(), QUIET, Duration::from_secs(300)).await;
    rec.note(format!("settled in {:.1} s", settle.as_secs_f64()));
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let sampler = sampling.await?;
    let (churned, live) = (fleet.churned, fleet.live());
    let (integrity, logs) = fleet.finish(&convs, &acked).await;

    let limits = Limits {
        max_growth: args.max_growth,
        floor_count: args.floor_count,
        floor_bytes: args.floor_mib * 1_048_576.0,
    };
    let mut soak = soak_report::judge(sampler.samples, warmup, limits, &args.exempt);
    (soak.sample_failures, soak.sample_errors) = (sampler.failures, sampler.errors);
    if soak.bounded {
        eprintln!("bounded: every checked series is flat after {warmup:.0} s");
    } else {
        eprintln!("NOT bounded: {} keep growing", soak.growing.join(", "));
    }
    let extra = json!({
        "devices_at_start": n,
        "devices_at_end": live,
        "churns": churned.churns,
        "left": churned.left,
        "joined": churned.joined,
        "reconnected": churned.reconnected,
        "join_errors": churned.join_errors,
        "sessions": logs.iter().map(|(_, l)| u64::from(l.sessions)).sum::<u64>(),
        "settle_s": settle.as_secs_f64(),
        "soak": soak,
    });
    Ok(report(
        "soak",
        params,
        &rec,
        send_window,
        delivered_in_window,
        &Finished { integrity, logs, cpu: Some(cpu), load: Some(load) },
        extra,
    ))
}
