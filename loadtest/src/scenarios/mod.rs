//! The scenarios: `steady` (direct conversations at a target rate), `fanout` (groups),
//! `storm` (a reconnect storm with backlog while realtime continues), `chaos` (steady
//! load while given commands kill and restart processes), `failover` (the devices of a
//! killed gateway move to the others), `idle` (memory per idle connection), `soak`
//! (steady load with device churn while kept state is sampled) and `typing` (what
//! typing indicators and presence cost).
//! Each ends with the integrity check and returns a [`ScenarioReport`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::future::join_all;
use herald_client::device::{Device, DeviceLog};
use serde_json::{json, Value};

use crate::cli::{self, Action, Measure, SendVia, Traffic};
use crate::cpu::{self, CpuMeter, CpuReport, Snapshot};
use crate::engine::{self, histogram, AckLog, Conv, Pct, Recorder, SendPlan, Target};
use crate::integrity::IntegrityReport;
use crate::load::{self, LoadReport, Observed};
use crate::report::ScenarioReport;
use crate::senders::{self, SenderOptions};

mod churn;
mod ephemeral;
mod failover;
mod idle;
mod reconnects;
mod soak;
mod storm;

pub use ephemeral::typing;
pub use failover::failover;
pub use idle::idle;
pub use soak::soak;
pub use storm::storm;

/// The most members a `fanout` group may have.
const MAX_GROUP: usize = 1000;

fn pairs(target: &Target, n: usize) -> Vec<Conv> {
    (0..n)
        .map(|k| Conv {
            id: target.user(&format!("c{k}")),
            sender: target.user(&format!("a{k}")),
            receivers: vec![target.user(&format!("b{k}"))],
        })
        .collect()
}

fn groups(target: &Target, tag: &str, members: usize, size: usize) -> Vec<Conv> {
    (0..members.div_ceil(size))
        .map(|g| Conv {
            id: target.user(&format!("{tag}g{g}")),
            sender: target.user(&format!("{tag}s{g}")),
            receivers: (g * size..((g + 1) * size).min(members)).map(|i| target.user(&format!("{tag}r{i}"))).collect(),
        })
        .collect()
}

fn receivers(convs: &[Conv]) -> Vec<String> {
    convs.iter().flat_map(|c| c.receivers.iter().cloned()).collect()
}

/// Connects one device per user and waits until all of them are caught up.
async fn connect(
    target: &Target,
    users: &[String],
    rec: &Arc<Recorder>,
    offset: usize,
) -> Result<Vec<(String, Device)>> {
    let before = rec.caught_up.load(Ordering::Relaxed);
    let devices: Vec<(String, Device)> =
        users.iter().enumerate().map(|(i, u)| (u.clone(), target.device(offset + i, u, rec))).collect();
    let started = Instant::now();
    while rec.caught_up.load(Ordering::Relaxed) < before + users.len() as u64 {
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "only {} of {} devices caught up within 120 s",
            rec.caught_up.load(Ordering::Relaxed) - before,
            users.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(devices)
}

/// Catch-up times of every session after a device's first (its reconnects).
fn reconnect_catch_ups(logs: &[(String, DeviceLog)]) -> Pct {
    let mut h = histogram();
    for (_, l) in logs {
        for d in l.catch_ups.iter().skip(1) {
            let _ = h.record((d.as_micros() as u64).max(1));
        }
    }
    Pct::of(&h)
}

struct Finished {
    integrity: IntegrityReport,
    logs: Vec<(String, DeviceLog)>,
    /// What the send window cost (`None`: not measured).
    cpu: Option<CpuReport>,
    /// Offered against achieved, and the limit (`None`: the scenario has no such senders).
    load: Option<LoadReport>,
}

/// How the senders of a scenario sent, for [`load_report`].
struct Offer {
    via: SendVia,
    senders: usize,
    in_flight: usize,
    /// msg/s (`None`: closed loop).
    rate: Option<f64>,
}

/// Offered against achieved over the send window, and the verdict on which side was the limit.
fn load_report(rec: &Recorder, offer: Offer, achieved: f64, cpu: &CpuReport) -> LoadReport {
    let (lag, own) = (rec.send_lag(), rec.own_lag());
    let generator_cores = cpu.total("loadtest").and_then(|r| r.cores);
    let observed = Observed {
        offered: offer.rate,
        achieved,
        lag_p99_ms: lag.p99,
        own_lag_p99_ms: own.p99,
        generator_cores,
        server_cores: cpu.total("server").and_then(|r| r.cores),
        cores: cpu.cores,
        machine_busy: cpu.machine_busy,
    };
    let (limit, verdict) = load::verdict(&observed);
    rec.note(verdict.clone());
    LoadReport {
        via: offer.via.name().into(),
        senders: offer.senders,
        in_flight: offer.in_flight,
        offered_per_s: offer.rate,
        achieved_per_s: achieved,
        sent: rec.sent.load(Ordering::Relaxed),
        unsent_due: rec.unsent_due.load(Ordering::Relaxed),
        send_lag_ms: lag,
        own_lag_ms: own,
        generator_cores,
        generator_share: generator_cores.map(|c| c / cpu.cores.max(1) as f64),
        machine_busy: cpu.machine_busy,
        limit: Some(limit),
        verdict,
    }
}

/// The CPU readings and counters at the start of the measured send window.
struct Window {
    cpu: Snapshot,
    sends: u64,
    delivered: u64,
}

impl Window {
    async fn open(meter: &CpuMeter, rec: &Recorder) -> Window {
        let cpu = meter.snapshot().await;
        Window { cpu, sends: rec.sends.load(Ordering::Relaxed), delivered: rec.delivered.load(Ordering::Relaxed) }
    }

    /// What the window cost, per message acknowledged and delivery made in it.
    async fn close(self, meter: &CpuMeter, rec: &Recorder) -> CpuReport {
        let after = meter.snapshot().await;
        let sends = rec.sends.load(Ordering::Relaxed) - self.sends;
        let delivered = rec.delivered.load(Ordering::Relaxed) - self.delivered;
        let c = cpu::account(&self.cpu, &after, sends, delivered, cpu::cores());
        let us = |n: &str| c.us_per_message.get(n).map_or("-".into(), |v| format!("{v:.0}"));
        rec.note(format!(
            "CPU per message: server {} us (gateways {}, workers {}, mariadb {}, redis {}), load-test {} us",
            us("server"),
            us("gateways"),
            us("workers"),
            us("mariadb"),
            us("redis"),
            us("loadtest")
        ));
        c
    }
}

fn report(
    name: &str,
    params: Value,
    rec: &Recorder,
    send_window: f64,
    deliveries_in_window: u64,
    done: &Finished,
    extra: Value,
) -> ScenarioReport {
    let sends = rec.sends.load(Ordering::Relaxed);
    ScenarioReport {
        scenario: name.into(),
        params,
        duration_s: rec.elapsed().as_secs_f64(),
        send_window_s: send_window,
        acknowledged_sends: sends,
        send_errors: rec.send_errors.load(Ordering::Relaxed),
        sends_per_s: sends as f64 / send_window.max(1e-9),
        send_ack_ms: rec.send_ack(),
        send_ack_from_actual_ms: rec.send_ack_from_actual(),
        deliveries: rec.delivered.load(Ordering::Relaxed),
        deliveries_per_s: deliveries_in_window as f64 / send_window.max(1e-9),
        delivery_realtime_ms: rec.realtime(),
        delivery_realtime_from_actual_ms: rec.realtime_from_actual(),
        delivery_backlog_ms: rec.backlog(),
        catch_up_ms: rec.catch_up(),
        reconnect_catch_up_ms: reconnect_catch_ups(&done.logs),
        integrity: done.integrity.clone(),
        cpu: done.cpu.clone(),
        load: done.load.clone(),
        series: rec.series(),
        extra,
    }
}

/// Live traffic into `convs` for `duration`, then settle and check; `actions` run on
/// their time. Shared by `steady`, `fanout` and `chaos`.
#[allow(clippy::too_many_arguments)]
async fn live(
    name: &'static str,
    traffic: &Traffic,
    actions: Vec<Action>,
    target: &Target,
    measure: &Measure,
    convs: Vec<Conv>,
    kind: &str,
    params: Value,
) -> Result<ScenarioReport> {
    let Traffic { rate, payload, via, in_flight, change_every, .. } = *traffic;
    ensure!(rate >= 0.0, "--rate must be >= 0 (0: as fast as acks come back)");
    ensure!(traffic.duration >= 0.0, "--duration must be >= 0");
    let duration = Duration::from_secs_f64(traffic.duration);
    let meter = CpuMeter::new(measure).await?;

    engine::provision(target, &convs, kind).await?;
    let users = receivers(&convs);
    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor(name, Duration::from_secs(1), monitor_stop.clone());
    eprintln!("connecting {} devices ...", users.len());
    let devices = connect(target, &users, &rec, 0).await?;
    rec.note(format!("{} devices online; sending for {duration:?} at {rate} msg/s", users.len()));

    let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let plan = SendPlan { rate, payload, cmid_prefix: "m".into(), change_every };
    let in_flight = in_flight as usize;
    let ready = senders::connect(target, &convs, via).await?;
    let window = Window::open(&meter, &rec).await;
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let send_start = Instant::now();
    let opts = SenderOptions { in_flight, until: Some(send_start + duration) };
    let senders = senders::spawn(ready, &convs, &plan, opts, &rec, &acked, &stop);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let chaos = {
        let (rec, outcomes) = (rec.clone(), outcomes.clone());
        tokio::spawn(async move {
            for a in actions {
                tokio::time::sleep_until((send_start + Duration::from_secs_f64(a.at)).into()).await;
                rec.note(format!("action: {}", a.command));
                let t = Instant::now();
                let out = tokio::process::Command::new("sh").arg("-c").arg(&a.command).output().await;
                let status = match &out {
                    Ok(o) if o.status.success() => "ok".to_string(),
                    Ok(o) => format!("exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr).trim()),
                    Err(e) => format!("could not run: {e}"),
                };
                if status != "ok" {
                    rec.note(format!("action failed: {status}"));
                }
                outcomes.lock().expect("outcomes").push(
                    json!({"at_s": a.at, "command": a.command, "status": status, "took_s": t.elapsed().as_secs_f64()}),
                );
            }
        })
    };
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    rec.note("sending stopped; waiting for retries and deliveries to settle");
    join_all(senders).await;
    let send_window = send_start.elapsed().as_secs_f64();
    let delivered_in_window = rec.delivered.load(Ordering::Relaxed) - delivered_before;
    let cpu = window.close(&meter, &rec).await;
    let offer = Offer { via, senders: convs.len(), in_flight, rate: (rate > 0.0).then_some(rate) };
    let load = load_report(&rec, offer, rec.sends.load(Ordering::Relaxed) as f64 / send_window.max(1e-9), &cpu);
    chaos.await?;
    let settle = engine::settle(&rec, users.len(), Duration::from_secs(3), Duration::from_secs(180)).await;
    rec.note(format!("settled in {:.1} s", settle.as_secs_f64()));
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let (integrity, logs) = engine::finish(devices, &convs, &acked).await;
    let sessions: u32 = logs.iter().map(|(_, l)| l.sessions).sum();
    let extra = json!({
        "devices": users.len(),
        "sessions": sessions,
        "settle_s": settle.as_secs_f64(),
        "actions": *outcomes.lock().expect("outcomes"),
    });
    let done = Finished { integrity, logs, cpu: Some(cpu), load: Some(load) };
    Ok(report(name, params, &rec, send_window, delivered_in_window, &done, extra))
}

/// `steady`: `--conversations` direct conversations, a device online for each
/// recipient, `--rate` sends per second (over HTTP, or WebSocket with `--via ws`).
pub async fn steady(args: &cli::Steady) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, t) = (args.conversations, &args.traffic);
    ensure!(n > 0, "--conversations must be at least 1");
    let params = json!({"conversations": n, "rate": t.rate, "duration_s": t.duration, "payload_bytes": t.payload, "gateways": target.gateways.len()});
    live("steady", t, args.action.clone(), &target, &args.target.measure, pairs(&target, n), "direct", params).await
}

/// `fanout`: `--receivers` devices in groups of `--group` (up to 1 000), one sender
/// per group, `--rate` sends per second in total.
pub async fn fanout(args: &cli::Fanout) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, size, t) = (args.receivers, args.group, &args.traffic);
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(n > 0, "--receivers must be at least 1");
    let params = json!({"receivers": n, "group": size, "rate": t.rate, "duration_s": t.duration, "payload_bytes": t.payload, "gateways": target.gateways.len()});
    live("fanout", t, args.action.clone(), &target, &args.target.measure, groups(&target, "", n, size), "group", params)
        .await
}

/// `chaos`: `steady` while each `--action SECONDS=COMMAND` runs at its time (kill a
/// gateway, restart it, kill the worker, ...); the check waits for everyone to catch up.
pub async fn chaos(args: &cli::Chaos) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, t) = (args.conversations, &args.traffic);
    ensure!(!args.action.is_empty(), "chaos needs at least one --action SECONDS=COMMAND");
    let actions: Vec<String> = args.action.iter().map(|a| format!("{}={}", a.at, a.command)).collect();
    let params = json!({"conversations": n, "rate": t.rate, "duration_s": t.duration, "actions": actions, "gateways": target.gateways.len()});
    live("chaos", t, args.action.clone(), &target, &args.target.measure, pairs(&target, n), "direct", params).await
}
