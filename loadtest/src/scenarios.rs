//! The scenarios: `steady` (direct conversations at a target rate), `fanout` (groups),
//! `storm` (a reconnect storm with backlog while realtime continues), `chaos` (steady
//! load while given commands kill and restart processes) and `idle` (memory per idle
//! connection). Each ends with the integrity check and returns a [`ScenarioReport`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures::future::join_all;
use herald_shared::device::{Device, DeviceLog};
use serde_json::{json, Value};

use crate::cli::{self, Traffic};
use crate::engine::{self, histogram, AckLog, Conv, Pct, Recorder, SendPlan, Target};
use crate::integrity::IntegrityReport;
use crate::report::ScenarioReport;

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
        deliveries: rec.delivered.load(Ordering::Relaxed),
        deliveries_per_s: deliveries_in_window as f64 / send_window.max(1e-9),
        delivery_realtime_ms: rec.realtime(),
        delivery_backlog_ms: rec.backlog(),
        catch_up_ms: rec.catch_up(),
        reconnect_catch_up_ms: reconnect_catch_ups(&done.logs),
        integrity: done.integrity.clone(),
        series: rec.series(),
        extra,
    }
}

/// A chaos action: a shell command run `at` seconds after sending starts.
#[derive(Clone, Debug)]
pub struct Action {
    pub at: f64,
    pub command: String,
}

impl std::str::FromStr for Action {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Action> {
        let (at, command) = s.split_once('=').context("an action is SECONDS=COMMAND")?;
        let at: f64 = at.trim().parse().with_context(|| format!("action time {at:?} is not a number of seconds"))?;
        ensure!(!command.trim().is_empty(), "action at {at} s has no command");
        Ok(Action { at, command: command.trim().to_owned() })
    }
}

/// Live traffic into `convs` for `duration`, then settle and check; `actions` run on
/// their time. Shared by `steady`, `fanout` and `chaos`.
async fn live(
    name: &'static str,
    traffic: &Traffic,
    actions: Vec<Action>,
    target: &Target,
    convs: Vec<Conv>,
    kind: &str,
    params: Value,
) -> Result<ScenarioReport> {
    let Traffic { rate, payload, .. } = *traffic;
    ensure!(rate >= 0.0, "--rate must be >= 0 (0: as fast as acks come back)");
    ensure!(traffic.duration >= 0.0, "--duration must be >= 0");
    let duration = Duration::from_secs_f64(traffic.duration);

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
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let send_start = Instant::now();
    let plan = SendPlan { rate, payload, cmid_prefix: "m".into() };
    let senders = engine::spawn_senders(target, &convs, &plan, &rec, &acked, &stop);
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
    let done = Finished { integrity, logs };
    Ok(report(name, params, &rec, send_window, delivered_in_window, &done, extra))
}

/// `steady`: `--conversations` direct conversations, a device online for each
/// recipient, `--rate` sends per second over HTTP.
pub async fn steady(args: &cli::Steady) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, t) = (args.conversations, &args.traffic);
    ensure!(n > 0, "--conversations must be at least 1");
    let params = json!({"conversations": n, "rate": t.rate, "duration_s": t.duration, "payload_bytes": t.payload, "gateways": target.gateways.len()});
    live("steady", t, Vec::new(), &target, pairs(&target, n), "direct", params).await
}

/// `fanout`: `--receivers` devices in groups of `--group` (up to 1 000), one sender
/// per group, `--rate` sends per second in total.
pub async fn fanout(args: &cli::Fanout) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, size, t) = (args.receivers, args.group, &args.traffic);
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(n > 0, "--receivers must be at least 1");
    let params = json!({"receivers": n, "group": size, "rate": t.rate, "duration_s": t.duration, "payload_bytes": t.payload, "gateways": target.gateways.len()});
    live("fanout", t, Vec::new(), &target, groups(&target, "", n, size), "group", params).await
}

/// `chaos`: `steady` while each `--action SECONDS=COMMAND` runs at its time (kill a
/// gateway, restart it, kill the worker, ...); the check waits for everyone to catch up.
pub async fn chaos(args: &cli::Chaos) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, t) = (args.conversations, &args.traffic);
    ensure!(!args.action.is_empty(), "chaos needs at least one --action SECONDS=COMMAND");
    let actions: Vec<String> = args.action.iter().map(|a| format!("{}={}", a.at, a.command)).collect();
    let params = json!({"conversations": n, "rate": t.rate, "duration_s": t.duration, "actions": actions, "gateways": target.gateways.len()});
    live("chaos", t, args.action.clone(), &target, pairs(&target, n), "direct", params).await
}

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
    ensure!((1..=MAX_GROUP).contains(&size), "--group must be 1..={MAX_GROUP}");
    ensure!(n > 0 && backlog > 0 && rt_pairs > 0, "--devices, --backlog and --realtime must be at least 1");
    let params = json!({"devices": n, "backlog": backlog, "group": size, "realtime_conversations": rt_pairs, "realtime_rate": rate, "fresh_devices": fresh, "gateways": target.gateways.len()});

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
    let send_start = Instant::now();
    let delivered_before = rec.delivered.load(Ordering::Relaxed);
    let plan = SendPlan { rate, payload: 100, cmid_prefix: "rt".into() };
    let senders = engine::spawn_senders(&target, &rt_convs, &plan, &rec, &acked, &stop);
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
        "realtime_p99_baseline_ms": base_p99,
        "realtime_p99_during_storm_ms": storm_p99,
        "realtime_p99_ratio": if base_p99 > 0.0 { storm_p99 / base_p99 } else { 0.0 },
        "settle_s": settle.as_secs_f64(),
    });
    Ok(report("storm", params, &rec, send_window, delivered_in_window, &Finished { integrity, logs }, extra))
}

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
            Ok::<_, herald_shared::client::ClientError>(())
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
    Ok(report("idle", params, &rec, send_window, delivered, &Finished { integrity, logs }, extra))
}
